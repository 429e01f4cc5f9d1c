//! What a packed model is: its layers' packed linears and float32 vectors (the decoder
//! runs them; every build path produces them, [`Built`]), their sizes, and the names of
//! their entries in a pack-cache section.

use super::cache::PackOutcome;
use crate::format::PackedLinear;
use crate::model::{PostNorms, Tensor};
use crate::threads::ThreadPool;

pub(crate) struct PackedMlp {
    pub gate: Box<dyn PackedLinear>,
    pub up: Box<dyn PackedLinear>,
    pub down: Box<dyn PackedLinear>,
}

pub(crate) struct PackedMoe {
    /// `[n_experts, d]`, float32 in every format.
    pub router: Tensor,
    pub experts: Vec<PackedMlp>,
    pub shared: Option<PackedMlp>,
    /// `[d]`: the shared expert's output is scaled by `sigmoid(shared_gate · x)`.
    pub shared_gate: Option<Vec<f32>>,
    pub top_k: usize,
    /// Divide the chosen experts' probabilities by their sum.
    pub renormalize: bool,
}

pub(crate) enum PackedFfn {
    Dense(PackedMlp),
    Moe(PackedMoe),
}

pub(crate) struct Layer {
    pub attn_norm: Vec<f32>,
    pub q: Box<dyn PackedLinear>,
    pub k: Box<dyn PackedLinear>,
    pub v: Box<dyn PackedLinear>,
    pub o: Box<dyn PackedLinear>,
    pub q_bias: Option<Vec<f32>>,
    pub k_bias: Option<Vec<f32>>,
    pub v_bias: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn: PackedFfn,
    /// Gemma 3: the norms on the attention and FFN outputs, before the residual add
    /// (float32 in every format; `None` for the Llama family).
    pub post_norms: Option<PostNorms>,
}

impl PackedMlp {
    pub fn bytes(&self) -> u64 {
        (self.gate.bytes() + self.up.bytes() + self.down.bytes()) as u64
    }
}

impl PackedMlp {
    pub fn linears(&self) -> [&dyn PackedLinear; 3] {
        [self.gate.as_ref(), self.up.as_ref(), self.down.as_ref()]
    }
}

impl Layer {
    /// Every packed linear of the layer (experts included).
    pub fn linears(&self) -> Vec<&dyn PackedLinear> {
        let mut v: Vec<&dyn PackedLinear> = vec![
            self.q.as_ref(),
            self.k.as_ref(),
            self.v.as_ref(),
            self.o.as_ref(),
        ];
        match &self.ffn {
            PackedFfn::Dense(m) => v.extend(m.linears()),
            PackedFfn::Moe(m) => {
                for e in m.experts.iter().chain(m.shared.iter()) {
                    v.extend(e.linears());
                }
            }
        }
        v
    }

    /// Packed bytes of the layer (float32 vectors at 4 bytes each).
    pub fn bytes(&self) -> u64 {
        let vec = |v: &Option<Vec<f32>>| 4 * v.as_ref().map(|v| v.len()).unwrap_or(0) as u64;
        let mut b = (self.q.bytes() + self.k.bytes() + self.v.bytes() + self.o.bytes()) as u64;
        b += 4 * (self.attn_norm.len() + self.ffn_norm.len()) as u64;
        b += vec(&self.q_bias) + vec(&self.k_bias) + vec(&self.v_bias);
        b += vec(&self.q_norm) + vec(&self.k_norm);
        b += self
            .post_norms
            .as_ref()
            .map_or(0, |p| 4 * (p.attn.len() + p.ffn.len()) as u64);
        b += match &self.ffn {
            PackedFfn::Dense(m) => m.bytes(),
            PackedFfn::Moe(m) => {
                4 * m.router.data.len() as u64
                    + m.experts.iter().map(PackedMlp::bytes).sum::<u64>()
                    + m.shared.as_ref().map(PackedMlp::bytes).unwrap_or(0)
                    + vec(&m.shared_gate)
            }
        };
        b
    }

    /// Bytes one token reads from this layer: all of it but the experts it is not routed
    /// to (the routed ones counted as `top_k / n_experts` of all experts).
    pub fn bytes_read_per_token(&self) -> f64 {
        match &self.ffn {
            PackedFfn::Dense(_) => self.bytes() as f64,
            PackedFfn::Moe(m) => {
                let experts: u64 = m.experts.iter().map(PackedMlp::bytes).sum();
                let share = m.top_k as f64 / m.experts.len().max(1) as f64;
                (self.bytes() - experts) as f64 + experts as f64 * share
            }
        }
    }
}

/// The packed parts a decoder runs on.
pub(crate) struct PackedModel {
    pub embed: Box<dyn PackedLinear>,
    pub lm_head: Option<Box<dyn PackedLinear>>,
    pub final_norm: Vec<f32>,
    pub layers: Vec<Layer>,
}

/// A packed model and how it was obtained.
pub(crate) struct Built {
    pub model: PackedModel,
    pub n_params: u64,
    /// What the pack cache did (`None`: not used for this format).
    pub pack_cache: Option<PackOutcome>,
    /// Seconds spent on calibration (0 when none ran).
    pub calibration_s: f64,
    /// The thread pool the build packed on, for the decoder to keep (`None`: none made).
    pub pool: Option<ThreadPool>,
}

/// Names of the entries of a pack-cache section.
pub(crate) mod names {
    /// The embedding table (the output projection too when tied).
    pub const EMBED: &str = "embed";
    pub const LM_HEAD: &str = "lm_head";
    pub const FINAL_NORM: &str = "final_norm";
    /// Gemma 3's norm on the attention output (a layer entry: [`layer`]).
    pub const POST_ATTN_NORM: &str = "post_attn_norm";
    /// Gemma 3's norm on the FFN output (a layer entry: [`layer`]).
    pub const POST_FFN_NORM: &str = "post_ffn_norm";
    /// `blk.I.WHAT` (q, k, v, o, attn_norm, ffn_norm, biases, q/k norms, router, Gemma 3's
    /// [`POST_ATTN_NORM`] and [`POST_FFN_NORM`]).
    pub fn layer(i: usize, what: &str) -> String {
        format!("blk.{i}.{what}")
    }
    /// `blk.I.mlp.J.WHAT`: MLP `J` of layer `I` (0 when dense; experts, then the shared
    /// expert).
    pub fn mlp(i: usize, j: usize, what: &str) -> String {
        format!("blk.{i}.mlp.{j}.{what}")
    }
}

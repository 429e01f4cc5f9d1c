//! The sources a build takes a model's packed parts from, and the one outer build over
//! them. Three sources implement [`ModelParts`] (the embedding, `lm_head`, the final norm)
//! and [`LayerSource`] (each layer's packed linears and float vectors): the whole model in
//! memory (`build`), a file streamed one layer at a time (`stream`) and the pack cache
//! (`cached`). [`assemble`] is the one outer build (the tables, the norm, the per-layer
//! loop) and [`build_layer`] the one place a packed layer is put together, whichever the
//! source; [`Packer`] is the one place a float32 tensor becomes a packed one (through the
//! pack cache's session when there is one).

use crate::error::Result;
use crate::format::quantized::{quantize_on, Grid, QuantizedTensor};
use crate::format::{self, PackedLinear, Precision, TensorPlace, TensorRole};
use crate::model::{Architecture, FeedForward, LayerWeights, Mlp, ModelConfig, PostNorms, Tensor};
use crate::pack::cache::{PackSession, TensorToPack};
use crate::pack::calibrate::GptqKey;
use crate::pack::model::{names, Layer, PackedFfn, PackedMlp, PackedModel, PackedMoe};
use crate::threads::ThreadPool;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// One linear of layer `layer`: its role and its MLP (0 outside the feed-forward and in a
/// dense layer; experts in order, then the shared expert).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LinearId {
    pub role: TensorRole,
    pub layer: usize,
    pub mlp: usize,
}

impl LinearId {
    /// Its entry's name in a pack-cache section.
    pub fn name(&self) -> String {
        let i = self.layer;
        let what = match self.role {
            TensorRole::AttnQ => "q",
            TensorRole::AttnK => "k",
            TensorRole::AttnV => "v",
            TensorRole::AttnOutput => "o",
            TensorRole::FfnGate => return names::mlp(i, self.mlp, "gate"),
            TensorRole::FfnUp => return names::mlp(i, self.mlp, "up"),
            TensorRole::FfnDown => return names::mlp(i, self.mlp, "down"),
            TensorRole::Embedding | TensorRole::LmHead | TensorRole::Router => {
                unreachable!("{:?} is not a packed linear of a layer", self.role)
            }
        };
        names::layer(i, what)
    }

    /// The float32 tensor of this linear in `l` (`None`: no such MLP).
    pub fn of<'a>(&self, l: &'a LayerWeights) -> Option<&'a Tensor> {
        let mlp = |m: &'a Mlp| match self.role {
            TensorRole::FfnGate => &m.gate,
            TensorRole::FfnUp => &m.up,
            _ => &m.down,
        };
        match self.role {
            TensorRole::AttnQ => Some(&l.q),
            TensorRole::AttnK => Some(&l.k),
            TensorRole::AttnV => Some(&l.v),
            TensorRole::AttnOutput => Some(&l.o),
            TensorRole::FfnGate | TensorRole::FfnUp | TensorRole::FfnDown => match &l.ffn {
                FeedForward::Dense(m) => (self.mlp == 0).then_some(mlp(m)),
                FeedForward::Moe(m) => m
                    .experts
                    .get(self.mlp)
                    .or(m
                        .shared_expert
                        .as_ref()
                        .filter(|_| self.mlp == m.experts.len()))
                    .map(mlp),
            },
            TensorRole::Embedding | TensorRole::LmHead | TensorRole::Router => None,
        }
    }
}

/// The float32 vectors of one layer (norms, biases, q/k norms, Gemma 3's post norms; the
/// router and shared gate of a mixture of experts), and the shape of its feed-forward.
pub(crate) struct LayerFloats {
    pub attn_norm: Vec<f32>,
    pub q_bias: Option<Vec<f32>>,
    pub k_bias: Option<Vec<f32>>,
    pub v_bias: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    /// `None`: a dense MLP.
    pub moe: Option<MoeFloats>,
    /// Gemma 3's norms after attention and the FFN (`None` for the Llama family).
    pub post_norms: Option<PostNorms>,
}

/// A mixture of experts' float32 parts and its number of MLPs.
pub(crate) struct MoeFloats {
    pub router: Tensor,
    pub n_experts: usize,
    pub shared_expert: bool,
    pub shared_gate: Option<Vec<f32>>,
}

impl LayerFloats {
    /// The float vectors of `l` and its post norms `post` (Gemma 3; they sit beside the
    /// layers in [`crate::model::ModelWeights`]).
    pub fn of(l: &LayerWeights, post: Option<&PostNorms>) -> LayerFloats {
        LayerFloats {
            attn_norm: l.attn_norm.clone(),
            q_bias: l.q_bias.clone(),
            k_bias: l.k_bias.clone(),
            v_bias: l.v_bias.clone(),
            q_norm: l.q_norm.clone(),
            k_norm: l.k_norm.clone(),
            ffn_norm: l.ffn_norm.clone(),
            moe: match &l.ffn {
                FeedForward::Dense(_) => None,
                FeedForward::Moe(m) => Some(MoeFloats {
                    router: m.router.clone(),
                    n_experts: m.experts.len(),
                    shared_expert: m.shared_expert.is_some(),
                    shared_gate: m.shared_expert_gate.as_ref().map(|g| g.data.clone()),
                }),
            },
            post_norms: post.cloned(),
        }
    }
}

/// Where a build takes each layer from (see the module doc).
pub(crate) trait LayerSource {
    /// Layer `i`'s float vectors and feed-forward shape; asked first, once per layer.
    fn layer_floats(&mut self, i: usize) -> Result<LayerFloats>;
    /// The packed linear `id` of the layer [`LayerSource::layer_floats`] was last asked for.
    fn linear(&mut self, id: LinearId) -> Result<Box<dyn PackedLinear>>;
    /// Layer `i` is complete (a streamed source drops its float32 copy here).
    fn layer_done(&mut self, _i: usize) -> Result<()> {
        Ok(())
    }
}

/// The packed parts of a model, as one source gives them ([`assemble`] asks for each once,
/// the embedding first, then `lm_head`, the layers in any order, the final norm last).
pub(crate) trait ModelParts: Sync {
    /// The embedding table (the output projection too when tied).
    fn embed(&self) -> Result<Box<dyn PackedLinear>>;
    /// The untied output projection.
    fn lm_head(&self) -> Result<Option<Box<dyn PackedLinear>>>;
    /// The final norm's weights.
    fn final_norm(&self) -> Result<Vec<f32>>;
    /// The source of layer `i`.
    fn layer(&self, i: usize) -> Box<dyn LayerSource + '_>;
}

/// The role the embedding table is packed for: a tied table is packed once, as the
/// `lm_head` (the larger consumer; embedding lookups dequantize its rows).
pub(crate) fn embed_role(untied: bool) -> TensorRole {
    if untied {
        TensorRole::Embedding
    } else {
        TensorRole::LmHead
    }
}

/// The packed model from `parts`: jobs (the embedding, the untied `lm_head`, then each
/// layer) taken from a shared counter by `pool`'s threads when one is given (the embedding
/// costs about as much as 8 layers of a small model, so a queue balances better than a
/// static split), else in that order on this thread.
pub(crate) fn assemble(
    parts: &dyn ModelParts,
    config: &ModelConfig,
    pool: Option<&ThreadPool>,
) -> Result<PackedModel> {
    let n_layers = config.n_layers;
    let n_jobs = 2 + n_layers;
    let next_job = AtomicUsize::new(0);
    let embed_slot = Mutex::new(None);
    let head_slot = Mutex::new(None);
    let layer_slots: Vec<Mutex<Option<Result<Layer>>>> =
        (0..n_layers).map(|_| Mutex::new(None)).collect();
    let run_jobs = || loop {
        let job = next_job.fetch_add(1, Ordering::Relaxed);
        match job {
            0 => *lock(&embed_slot) = Some(parts.embed()),
            1 => *lock(&head_slot) = Some(parts.lm_head()),
            j if j < n_jobs => {
                let i = j - 2;
                *lock(&layer_slots[i]) = Some(build_layer(parts.layer(i).as_mut(), config, i))
            }
            _ => break,
        }
    };
    match pool {
        Some(pool) => pool.run(|_, _| run_jobs()),
        None => run_jobs(),
    }
    let embed = lock(&embed_slot).take().expect("the embedding job ran")?;
    let lm_head = lock(&head_slot).take().expect("the lm_head job ran")?;
    let layers = layer_slots
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every layer job ran")
        })
        .collect::<Result<Vec<Layer>>>()?;
    Ok(PackedModel {
        embed,
        lm_head,
        final_norm: parts.final_norm()?,
        layers,
    })
}

/// Packed layer `i` from `src`: the feed-forward's MLPs (gate, up, down each), then q, k,
/// v, o.
pub(crate) fn build_layer(
    src: &mut dyn LayerSource,
    config: &ModelConfig,
    i: usize,
) -> Result<Layer> {
    let f = src.layer_floats(i)?;
    let mlp = |src: &mut dyn LayerSource, j: usize| -> Result<PackedMlp> {
        let id = |role| LinearId {
            role,
            layer: i,
            mlp: j,
        };
        Ok(PackedMlp {
            gate: src.linear(id(TensorRole::FfnGate))?,
            up: src.linear(id(TensorRole::FfnUp))?,
            down: src.linear(id(TensorRole::FfnDown))?,
        })
    };
    let ffn = match f.moe {
        None => PackedFfn::Dense(mlp(src, 0)?),
        Some(m) => PackedFfn::Moe(PackedMoe {
            router: m.router,
            experts: (0..m.n_experts)
                .map(|j| mlp(src, j))
                .collect::<Result<_>>()?,
            shared: if m.shared_expert {
                Some(mlp(src, m.n_experts)?)
            } else {
                None
            },
            shared_gate: m.shared_gate,
            top_k: config.experts_per_token,
            renormalize: config.architecture == Architecture::Mixtral || config.norm_topk_prob,
        }),
    };
    let id = |role| LinearId {
        role,
        layer: i,
        mlp: 0,
    };
    let layer = Layer {
        attn_norm: f.attn_norm,
        q: src.linear(id(TensorRole::AttnQ))?,
        k: src.linear(id(TensorRole::AttnK))?,
        v: src.linear(id(TensorRole::AttnV))?,
        o: src.linear(id(TensorRole::AttnOutput))?,
        q_bias: f.q_bias,
        k_bias: f.k_bias,
        v_bias: f.v_bias,
        q_norm: f.q_norm,
        k_norm: f.k_norm,
        ffn_norm: f.ffn_norm,
        ffn,
        post_norms: f.post_norms,
    };
    src.layer_done(i)?;
    Ok(layer)
}

/// Turns float32 tensors into packed ones in one format: through the pack cache's session
/// when there is one (reused from an older file when the key is unchanged, else quantized
/// and written), else quantized (or, for float formats, converted) here. A tensor GPTQ
/// made is taken as made.
pub(crate) struct Packer<'a> {
    pub precision: &'a Precision,
    pub place: &'a (dyn Fn(TensorRole, Option<usize>) -> TensorPlace + Sync),
    pub grid: &'a (dyn Fn(TensorRole, Option<usize>) -> Option<Grid> + Sync),
    pub session: Option<&'a Mutex<PackSession>>,
    /// Tensors the GPTQ pass made, taken as they are packed.
    pub gptq_done: Option<&'a Mutex<HashMap<GptqKey, QuantizedTensor>>>,
}

impl Packer<'_> {
    /// `t`, stored as `name`, packed for its place (`role`, `layer`, MLP `which`), its
    /// rounding weighted by `imp`.
    pub fn pack(
        &self,
        name: &str,
        t: &Tensor,
        (role, layer, which): (TensorRole, Option<usize>, usize),
        imp: Option<&[f32]>,
    ) -> Result<Box<dyn PackedLinear>> {
        let precision = self.precision;
        let place = (self.place)(role, layer);
        let grid = (self.grid)(role, layer);
        // A tensor GPTQ made is handed to the session as made (its bytes depend on the
        // Hessian, which its key does not hold: never reused from an older file).
        let done = match (self.gptq_done, layer) {
            (Some(g), Some(l)) => lock(g).remove(&(role, l, which)),
            _ => None,
        };
        match (self.session, done) {
            (Some(s), done) => {
                let t = TensorToPack {
                    name,
                    tensor: t,
                    place,
                    grid,
                    importance: imp,
                    precision,
                };
                lock(s).pack_with(t, done)
            }
            (None, Some(q)) => Ok(q.into_packed()),
            (None, None) if precision.is_quantized() => {
                Ok(quantize_on(t, precision, place, grid, imp)?.into_packed())
            }
            (None, None) => format::pack_linear(t, precision, place),
        }
    }
}

/// Locks `m`, ignoring poisoning (a panicking job re-raises its panic in `run` anyway).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

//! Models as the decoder sees them: a [`ModelConfig`] (architecture and hyper-parameters,
//! whatever the source), float32 master weights arranged by layer ([`ModelWeights`]), and
//! a tokenizer. Every source (Hugging Face folder, hub id, GGUF file) is turned into this
//! one shape by [`load_model`], so the decoder and the weight formats never see file
//! layouts, tensor names or GGUF permutations.
//!
//! Conventions: a linear weight is row-major `[out_features, in_features]` (Hugging Face's
//! layout: `y = W x`); q/k rows are in Hugging Face's rotate-half (NeoX) rope order.

mod assemble;
pub mod config;
pub mod cost;
pub mod gguf_loader;
pub mod hub;
pub mod lazy;
pub mod memory;
mod names;
pub mod safetensors_loader;
pub mod source;

pub use config::{Architecture, Gemma3Params, ModelConfig, RopeScaling};
pub use source::{load_model, load_model_header, ModelHeader, ModelSource};

use crate::format::ggml_blocks::SourceBlocks;
use crate::tokenizer::Tokenizer;
use std::sync::Arc;

/// A dense float32 tensor, row-major.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
    /// The GGUF blocks `data` was dequantized from, when it was (a hint: packing copies
    /// them only after checking that they still dequantize to `data` bit for bit, so code
    /// that changes `data` need not clear it). Not part of equality.
    pub source: Option<Arc<SourceBlocks>>,
}

impl PartialEq for Tensor {
    fn eq(&self, other: &Self) -> bool {
        self.shape == other.shape && self.data == other.data
    }
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor {
            shape,
            data,
            source: None,
        }
    }
    /// This tensor with the GGUF blocks it was dequantized from.
    pub fn with_source(mut self, source: SourceBlocks) -> Self {
        self.source = Some(Arc::new(source));
        self
    }
    /// Rows of a 2-D weight (`out_features`).
    pub fn rows(&self) -> usize {
        self.shape[0]
    }
    /// Columns of a 2-D weight (`in_features`).
    pub fn cols(&self) -> usize {
        self.shape[1..].iter().product()
    }
    pub fn row(&self, r: usize) -> &[f32] {
        let c = self.cols();
        &self.data[r * c..(r + 1) * c]
    }
}

/// The feed-forward block of one layer.
#[derive(Debug, Clone)]
pub enum FeedForward {
    /// SwiGLU: `down(silu(gate x) * up x)`.
    Dense(Mlp),
    /// Mixture of experts: a router picks `experts_per_token` experts per token.
    Moe(MoeBlock),
}

#[derive(Debug, Clone)]
pub struct Mlp {
    pub gate: Tensor, // [ffn, d]
    pub up: Tensor,   // [ffn, d]
    pub down: Tensor, // [d, ffn]
}

#[derive(Debug, Clone)]
pub struct MoeBlock {
    pub router: Tensor, // [n_experts, d]
    pub experts: Vec<Mlp>,
    /// qwen2_moe: an always-on expert whose output is scaled by `sigmoid(shared_gate x)`.
    pub shared_expert: Option<Mlp>,
    pub shared_expert_gate: Option<Tensor>, // [1, d]
}

#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub q: Tensor, // [n_heads*head_dim, d]
    pub k: Tensor, // [n_kv_heads*head_dim, d]
    pub v: Tensor, // [n_kv_heads*head_dim, d]
    pub o: Tensor, // [d, n_heads*head_dim]
    /// qwen2: q/k/v biases.
    pub q_bias: Option<Vec<f32>>,
    pub k_bias: Option<Vec<f32>>,
    pub v_bias: Option<Vec<f32>>,
    /// qwen3: RMSNorm over each head of q and k (weights of length head_dim).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn: FeedForward,
}

#[derive(Debug, Clone)]
pub struct ModelWeights {
    pub embed: Tensor, // [vocab, d]
    pub layers: Vec<LayerWeights>,
    pub final_norm: Vec<f32>,
    /// `None` when the output projection is tied to `embed`.
    pub lm_head: Option<Tensor>, // [vocab, d]
    /// Gemma 3: per layer, the norms after attention and after the FFN (empty for the
    /// Llama family). Kept beside the layers, not in [`LayerWeights`]: float32 in every
    /// format and no pair of channel equalization; the packing pipeline hands them to each
    /// packed layer (and the pack cache stores them with the layer's float vectors).
    pub post_norms: Vec<PostNorms>,
}

/// Gemma 3's norms on a block's output, before the residual add (weights of length
/// `hidden_size`, the multiplier itself: `1 + w` of a Hugging Face checkpoint).
#[derive(Debug, Clone, PartialEq)]
pub struct PostNorms {
    pub attn: Vec<f32>,
    pub ffn: Vec<f32>,
}

impl ModelWeights {
    /// The output projection (`lm_head`, or the embedding when tied).
    pub fn output(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}

/// What the loader knows about where the weights came from, for reports.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LoadInfo {
    /// The `--llm` value as given and what it resolved to.
    pub requested: String,
    pub resolved_path: std::path::PathBuf,
    /// Bytes of weight data in the source files.
    pub source_bytes: u64,
    /// Storage types seen in the source, e.g. {"Q4_1": 211, "F32": 61}.
    pub source_types: std::collections::BTreeMap<String, usize>,
    pub read_s: f64,
}

/// A loaded model: config, float32 master weights and tokenizer.
pub struct Model {
    pub config: ModelConfig,
    pub weights: ModelWeights,
    pub tokenizer: Tokenizer,
    pub info: LoadInfo,
}

impl Model {
    /// Parameter count (embedding counted once when tied), as llama.cpp reports it.
    pub fn n_params(&self) -> u64 {
        fn moe_params(m: &MoeBlock) -> usize {
            let mlp = |x: &Mlp| x.gate.data.len() + x.up.data.len() + x.down.data.len();
            m.router.data.len()
                + m.experts.iter().map(mlp).sum::<usize>()
                + m.shared_expert.as_ref().map(mlp).unwrap_or(0)
                + m.shared_expert_gate
                    .as_ref()
                    .map(|t| t.data.len())
                    .unwrap_or(0)
        }
        let w = &self.weights;
        let opt = |v: &Option<Vec<f32>>| v.as_ref().map(|x| x.len()).unwrap_or(0);
        let mut n = w.embed.data.len() + w.final_norm.len();
        n += w.lm_head.as_ref().map(|t| t.data.len()).unwrap_or(0);
        for l in &w.layers {
            n += l.attn_norm.len() + l.ffn_norm.len();
            n += l.q.data.len() + l.k.data.len() + l.v.data.len() + l.o.data.len();
            n += opt(&l.q_bias) + opt(&l.k_bias) + opt(&l.v_bias);
            n += opt(&l.q_norm) + opt(&l.k_norm);
            n += match &l.ffn {
                FeedForward::Dense(m) => m.gate.data.len() + m.up.data.len() + m.down.data.len(),
                FeedForward::Moe(m) => moe_params(m),
            };
        }
        n as u64
    }
}

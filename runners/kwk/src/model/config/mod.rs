//! ModelConfig: the hyper-parameters of a Llama-family model, read from a Hugging Face
//! `config.json` or from GGUF metadata (`<arch>.block_count`, ...), and the checks that say
//! whether this decoder can run it.
//!
//! [`ModelConfig::from_hf_config_json`] reads the keys of `transformers`' `LlamaConfig`,
//! `MistralConfig`, `Qwen2Config`, `Qwen3Config`, `MixtralConfig`, `Qwen2MoeConfig` and
//! `Qwen3MoeConfig`, with the same defaults those classes use where a key may be absent.
//! Anything this decoder could not run (an unknown rope scaling, dense layers inside a MoE
//! stack) is kept representable or rejected here with a message naming the key, so the
//! decoder's `runner_unsupported` can say why instead of computing something else.
//!
//! The rooms: this file holds the config itself and its size checks
//! ([`ModelConfig::check_sizes`]); `architecture.rs` the architectures and their names in
//! each source (HF `model_type`, GGUF `general.architecture`, the size keys): the one
//! place a new architecture's config mapping starts; `from_hf.rs` reads a `config.json`;
//! `from_gguf.rs` reads GGUF metadata ([`config_from_gguf`]).

mod architecture;
mod from_gguf;
mod from_hf;
#[cfg(test)]
mod tests;

pub use architecture::{Architecture, SizeKey};
pub use from_gguf::config_from_gguf;
#[cfg(test)]
pub(crate) use from_gguf::llama3_rope_factors;

use crate::error::{KwkError, Result};
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum RopeScaling {
    None,
    /// Llama 3.x "llama3" rope scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
    /// A rope scaling this decoder does not implement ("linear", "dynamic", "yarn", ...),
    /// kept by name so `runner_unsupported` can reject the model with a reason.
    Other(String),
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// MoE: experts in total and per token (0 for dense models).
    pub n_experts: usize,
    pub experts_per_token: usize,
    /// MoE: intermediate size of each expert (qwen2/3_moe `moe_intermediate_size`; for
    /// mixtral, whose experts use `intermediate_size`, the same value).
    pub moe_intermediate_size: usize,
    /// qwen2_moe: intermediate size of the shared expert.
    pub shared_expert_intermediate_size: usize,
    /// Renormalise the top-k routing weights to sum to 1 (mixtral always; qwen per config).
    pub norm_topk_prob: bool,
    /// A sliding window the model needs (Mistral v0.1); `None` when full attention.
    pub sliding_window: Option<usize>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Gemma 3's attention and output details; `None` for every other architecture.
    pub gemma3: Option<Gemma3Params>,
}

/// What Gemma 3 adds to the Llama-family config. Its sliding window is here, not in
/// [`ModelConfig::sliding_window`] (a window on every layer, which this decoder refuses):
/// only the layers [`Gemma3Params::sliding_layers`] marks are local.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gemma3Params {
    /// Queries are scaled by `query_pre_attn_scalar^-1/2` (not `head_dim^-1/2`).
    pub query_pre_attn_scalar: f32,
    /// Keys a local layer's query sees, itself included (positions `p - window + 1..=p`).
    pub sliding_window: usize,
    /// RoPE base of the local layers (`rope_local_base_freq`); the global layers use
    /// [`ModelConfig::rope_theta`].
    pub rope_local_theta: f32,
    /// Per layer: true for a local (sliding-window) layer, false for a global one.
    pub sliding_layers: Vec<bool>,
    /// `cap * tanh(logits / cap)` on the output logits when set.
    pub final_logit_softcapping: Option<f32>,
}

impl Gemma3Params {
    /// The layer pattern of `sliding_window_pattern` = `pattern`: every `pattern`-th layer
    /// (1-based) is global, the others local (transformers' `layer_types` default and
    /// llama.cpp's `set_swa_pattern`): a pattern of 1 makes every layer global, and 0
    /// every layer local (as llama.cpp reads it).
    pub fn pattern_layers(n_layers: usize, pattern: usize) -> Vec<bool> {
        (0..n_layers)
            .map(|l| pattern == 0 || (l + 1) % pattern != 0)
            .collect()
    }
}

/// The most parameters a config may imply (2^44, about 17.6 trillion).
pub const MAX_PARAMS: u64 = 1 << 44;
/// The most bytes a float32 KV cache over the whole context may take (2^56).
pub const MAX_KV_CACHE_BYTES: u64 = 1 << 56;
/// The largest `config.json` read (real ones are a few kilobytes).
pub const MAX_CONFIG_JSON_BYTES: u64 = 16 << 20;

impl ModelConfig {
    /// Checks every size against [`SizeKey::max`], the context length against 0, and the
    /// products the loaders and the decoder form (attention widths, parameter count, KV
    /// cache bytes over the whole context) with checked arithmetic, so no later
    /// multiplication of these sizes can overflow. `key` names a size's key in the source
    /// (e.g. "config key 'hidden_size'"); errors are `BadModel` naming `path` and the key.
    pub fn check_sizes(&self, path: &Path, key: &dyn Fn(SizeKey) -> String) -> Result<()> {
        use SizeKey as K;
        let moe = self.architecture.is_moe();
        let mut sizes = vec![
            (K::HiddenSize, self.hidden_size),
            (K::Layers, self.n_layers),
            (K::Heads, self.n_heads),
            (K::KvHeads, self.n_kv_heads),
            (K::HeadDim, self.head_dim),
            (K::VocabSize, self.vocab_size),
            (K::MaxPositions, self.max_position_embeddings),
        ];
        if moe {
            sizes.extend([
                (K::Experts, self.n_experts),
                (K::ExpertsPerToken, self.experts_per_token),
                (K::ExpertFfn, self.moe_intermediate_size),
            ]);
            if self.shared_expert_intermediate_size > 0 {
                sizes.push((K::SharedExpertFfn, self.shared_expert_intermediate_size));
            }
        } else {
            sizes.push((K::IntermediateSize, self.intermediate_size));
        }
        for (k, v) in sizes {
            if v == 0 {
                let why = if k == K::MaxPositions {
                    "; the context length bounds the KV cache, so it must be positive (set it \
                     to the context the model was trained for)"
                } else {
                    "; it must be positive"
                };
                return Err(KwkError::bad_model(path, format!("{} is 0{why}", key(k))));
            }
            if v > k.max() {
                return Err(KwkError::bad_model(
                    path,
                    format!(
                        "{} is {v}, more than kwk's limit of {}; the file is corrupt",
                        key(k),
                        k.max()
                    ),
                ));
            }
        }
        // Every factor is below 2^27 here, so these u64 products cannot overflow; the
        // sums and the products with the layer count are checked all the same.
        let u = |x: usize| x as u64;
        let d = u(self.hidden_size);
        let q_dim = u(self.n_heads) * u(self.head_dim);
        let kv_dim = u(self.n_kv_heads) * u(self.head_dim);
        let ffn = if moe {
            let experts = u(self.n_experts) * 3 * d * u(self.moe_intermediate_size);
            experts + u(self.n_experts) * d + 3 * d * u(self.shared_expert_intermediate_size) + d
        } else {
            3 * d * u(self.intermediate_size)
        };
        let per_layer = d * (2 * q_dim + 2 * kv_dim) + ffn + 2 * d;
        let embeddings = u(self.vocab_size) * d * if self.tie_word_embeddings { 1 } else { 2 };
        let params = u(self.n_layers)
            .checked_mul(per_layer)
            .and_then(|p| p.checked_add(embeddings));
        let names = [K::HiddenSize, K::Layers, K::VocabSize].map(key).join(", ");
        if params.is_none_or(|p| p > MAX_PARAMS) {
            return Err(KwkError::bad_model(
                path,
                format!(
                    "the sizes ({names}, ...) imply more than 2^44 parameters (kwk's limit); \
                     the file is corrupt"
                ),
            ));
        }
        let kv_bytes =
            (2 * 4 * u(self.n_layers) * kv_dim).checked_mul(u(self.max_position_embeddings));
        if kv_bytes.is_none_or(|b| b > MAX_KV_CACHE_BYTES) {
            return Err(KwkError::bad_model(
                path,
                format!(
                    "{} is {}: a KV cache that long would take more than 2^56 bytes; the file \
                     is corrupt",
                    key(K::MaxPositions),
                    self.max_position_embeddings
                ),
            ));
        }
        Ok(())
    }

    /// Query heads sharing one key/value head.
    pub fn group_size(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// Intermediate size of the routed experts (0 for dense models).
    pub fn expert_ffn_size(&self) -> usize {
        self.moe_intermediate_size
    }
}

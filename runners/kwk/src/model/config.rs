//! ModelConfig: the hyper-parameters of a Llama-family model, read from a Hugging Face
//! `config.json` or from GGUF metadata (`<arch>.block_count`, ...), and the checks that say
//! whether this decoder can run it.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Mixtral,
    Qwen2Moe,
    Qwen3Moe,
}

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
    /// MoE: intermediate size of each expert (qwen2/3_moe `moe_intermediate_size`).
    pub moe_intermediate_size: usize,
    /// qwen2_moe: intermediate size of the shared expert.
    pub shared_expert_intermediate_size: usize,
    /// Renormalise the top-k routing weights to sum to 1 (mixtral always; qwen per config).
    pub norm_topk_prob: bool,
    /// A sliding window the model needs (Mistral v0.1); `None` when full attention.
    pub sliding_window: Option<usize>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

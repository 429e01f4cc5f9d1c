//! The architectures kwk runs and what each source calls them: the Hugging Face
//! `model_type`, the GGUF `general.architecture`, and the config keys of each size
//! ([`SizeKey`]). A new architecture starts here (a variant; the exhaustive matches below
//! and in the loaders then list every place that must say how to read it).

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
    /// Gemma 3 (text): scaled embedding, (1 + w) norms before and after attention and the
    /// FFN, per-head q/k norms, GeGLU, sliding-window attention on most layers
    /// ([`super::Gemma3Params`]).
    Gemma3,
}

impl Architecture {
    /// From a Hugging Face `model_type`.
    pub fn from_hf_model_type(model_type: &str) -> Option<Architecture> {
        Some(match model_type {
            "llama" => Architecture::Llama,
            "mistral" => Architecture::Mistral,
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            "mixtral" => Architecture::Mixtral,
            "qwen2_moe" => Architecture::Qwen2Moe,
            "qwen3_moe" => Architecture::Qwen3Moe,
            "gemma3_text" => Architecture::Gemma3,
            _ => return None,
        })
    }

    /// From a GGUF `general.architecture` (llama.cpp's names). Mistral's GGUFs say `llama`;
    /// Mixtral's say `llama` too, with `llama.expert_count` set (`has_experts`).
    pub fn from_gguf_arch(arch: &str, has_experts: bool) -> Option<Architecture> {
        Some(match arch {
            "llama" if has_experts => Architecture::Mixtral,
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            "qwen2moe" => Architecture::Qwen2Moe,
            "qwen3moe" => Architecture::Qwen3Moe,
            "gemma3" => Architecture::Gemma3,
            _ => return None,
        })
    }

    /// The Hugging Face `model_type` of this architecture.
    pub fn hf_model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Mixtral => "mixtral",
            Architecture::Qwen2Moe => "qwen2_moe",
            Architecture::Qwen3Moe => "qwen3_moe",
            Architecture::Gemma3 => "gemma3_text",
        }
    }

    /// Whether the feed-forward blocks are mixtures of experts.
    pub fn is_moe(self) -> bool {
        matches!(
            self,
            Architecture::Mixtral | Architecture::Qwen2Moe | Architecture::Qwen3Moe
        )
    }
}

/// The sizes a config declares, by role, for [`ModelConfig::check_sizes`] to name the key
/// each came from in the source's own terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeKey {
    HiddenSize,
    IntermediateSize,
    Layers,
    Heads,
    KvHeads,
    HeadDim,
    VocabSize,
    MaxPositions,
    Experts,
    ExpertsPerToken,
    ExpertFfn,
    SharedExpertFfn,
}

impl SizeKey {
    /// The `config.json` key (`architecture` tells Mixtral's expert count key apart).
    pub fn hf_key(self, architecture: Architecture) -> &'static str {
        match self {
            SizeKey::HiddenSize => "hidden_size",
            SizeKey::IntermediateSize => "intermediate_size",
            SizeKey::Layers => "num_hidden_layers",
            SizeKey::Heads => "num_attention_heads",
            SizeKey::KvHeads => "num_key_value_heads",
            SizeKey::HeadDim => "head_dim",
            SizeKey::VocabSize => "vocab_size",
            SizeKey::MaxPositions => "max_position_embeddings",
            SizeKey::Experts if architecture == Architecture::Mixtral => "num_local_experts",
            SizeKey::Experts => "num_experts",
            SizeKey::ExpertsPerToken => "num_experts_per_tok",
            SizeKey::ExpertFfn if architecture == Architecture::Mixtral => "intermediate_size",
            SizeKey::ExpertFfn => "moe_intermediate_size",
            SizeKey::SharedExpertFfn => "shared_expert_intermediate_size",
        }
    }

    /// The GGUF metadata key without the `<arch>.` prefix (llama.cpp's `llama-arch.cpp`).
    pub fn gguf_key(self, architecture: Architecture) -> &'static str {
        match self {
            SizeKey::HiddenSize => "embedding_length",
            SizeKey::IntermediateSize => "feed_forward_length",
            SizeKey::Layers => "block_count",
            SizeKey::Heads => "attention.head_count",
            SizeKey::KvHeads => "attention.head_count_kv",
            SizeKey::HeadDim => "attention.key_length",
            SizeKey::VocabSize => "vocab_size",
            SizeKey::MaxPositions => "context_length",
            SizeKey::Experts => "expert_count",
            SizeKey::ExpertsPerToken => "expert_used_count",
            SizeKey::ExpertFfn if architecture == Architecture::Mixtral => "feed_forward_length",
            SizeKey::ExpertFfn => "expert_feed_forward_length",
            SizeKey::SharedExpertFfn => "expert_shared_feed_forward_length",
        }
    }

    /// The largest value kwk accepts. Far above every released model (hidden 16384,
    /// 126 layers, 128 heads, head size 256, vocabulary 262144, context 10M, 384 experts)
    /// and low enough that every product the loader and decoder form from them fits in
    /// 64 bits; a larger value is a corrupt or hostile file.
    pub fn max(self) -> usize {
        match self {
            SizeKey::HiddenSize => 1 << 20,
            SizeKey::IntermediateSize | SizeKey::ExpertFfn | SizeKey::SharedExpertFfn => 1 << 22,
            SizeKey::Layers | SizeKey::Heads | SizeKey::KvHeads => 1 << 12,
            SizeKey::HeadDim => 1 << 14,
            SizeKey::VocabSize => 1 << 24,
            SizeKey::MaxPositions => 1 << 27,
            SizeKey::Experts | SizeKey::ExpertsPerToken => 1 << 14,
        }
    }
}

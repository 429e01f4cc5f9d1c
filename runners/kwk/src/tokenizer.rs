//! Tokenizer: Hugging Face `tokenizer.json` (through the `tokenizers` crate) and tokenizers
//! rebuilt from GGUF metadata so that their ids equal llama.cpp's.
//!
//! SKELETON: the type and constructors' signatures are fixed; bodies land with the decoder issue.

use crate::error::{KwkError, Result};

/// The tokenizer fields of a GGUF file (`tokenizer.ggml.*`), as the GGUF loader reads them.
#[derive(Debug, Clone, Default)]
pub struct GgufTokenizerMetadata {
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama" (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer ("default", "gpt-2", "llama-bpe", "smollm", "qwen2", ...).
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub scores: Option<Vec<f32>>,
    pub token_types: Option<Vec<i32>>,
    pub merges: Option<Vec<String>>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
}

pub struct Tokenizer {
    _private: (),
}

impl Tokenizer {
    pub fn from_gguf(meta: &GgufTokenizerMetadata) -> Result<Self> {
        let _ = meta;
        Err(KwkError::Tokenizer("not implemented yet".into()))
    }

    /// From a Hugging Face folder: `tokenizer.json`, plus `tokenizer_config.json` for the
    /// BOS policy when present.
    pub fn from_hf_folder(dir: &std::path::Path) -> Result<Self> {
        let _ = dir;
        Err(KwkError::Tokenizer("not implemented yet".into()))
    }

    /// Token ids of `text`; with `add_special`, a BOS first when [`Self::add_bos`]
    /// (llama.cpp's `add_special=true, parse_special=false`).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let _ = (text, add_special);
        Err(KwkError::Tokenizer("not implemented yet".into()))
    }

    /// Text of `ids` (for streaming, decode the whole sequence and print the new suffix).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let _ = ids;
        Err(KwkError::Tokenizer("not implemented yet".into()))
    }

    /// Whether the model wants a BOS at the start (and as the first token of every
    /// perplexity chunk).
    pub fn add_bos(&self) -> bool {
        false
    }

    pub fn bos_id(&self) -> Option<u32> {
        None
    }

    pub fn eos_ids(&self) -> &[u32] {
        &[]
    }

    pub fn vocab_size(&self) -> usize {
        0
    }
}

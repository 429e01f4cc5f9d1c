//! KwkDecoder: packs a [`Model`]'s master weights into one weight format and runs the
//! transformer on the CPU: batched prompt processing, single-token generation, a KV cache
//! reused across calls, and sampling.
//!
//! SKELETON: signatures fixed for the harness; bodies land with the decoder issue.

use crate::error::{KwkError, Result};
use crate::model::Model;
use std::path::PathBuf;

/// Options of the `int4` format: `int4[:gG][:mixB][:calib][:gptq]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int4Options {
    /// Weights per scale group: 32, 64 or 128.
    pub group_size: usize,
    /// Bits of the sensitive tensors (6 or 8); `None` picks by model size
    /// (6 from 1e9 parameters, 8 below).
    pub mix_bits: Option<u8>,
    /// Fit scales to activations of the calibration text.
    pub calibrate: bool,
    /// GPTQ rounding on top of calibration.
    pub gptq: bool,
}

/// The weight format a decoder runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    Float32,
    Bf16,
    Int8,
    Int4(Int4Options),
}

impl Precision {
    /// Parses a format name as users type it: `float32`, `bf16`, `int8` (`balanced`),
    /// `int4`, `int4:g64`, `int4:mix8`, `int4:calib`, `int4:gptq` (options combine).
    pub fn parse(spec: &str) -> Result<Precision> {
        let _ = spec;
        Err(KwkError::InvalidArgument("not implemented yet".into()))
    }
}

/// Sampling for [`KwkDecoder::generate`]. `temperature == 0` is greedy.
#[derive(Debug, Clone)]
pub struct Sampling {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub seed: u64,
}

#[derive(Debug, Clone)]
pub struct DecoderOptions {
    /// Longest sequence (prompt + generated) the KV cache holds.
    pub max_cache_len: usize,
    pub precision: Precision,
    pub threads: usize,
    /// Token ids of calibration text (int4:calib / int4:gptq).
    pub calibration_tokens: Option<Vec<u32>>,
    /// Where packed weights are kept between runs; `None` disables the pack cache.
    pub pack_cache_dir: Option<PathBuf>,
}

/// Timings of one `generate` call.
#[derive(Debug, Clone, Default)]
pub struct GenerateStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prompt_s: f64,
    pub generate_s: f64,
}

pub struct KwkDecoder {
    _private: (),
}

/// Why `model` cannot run in this decoder with a cache of `max_cache_len` tokens
/// (architecture, rope scaling, sliding window, cache longer than the model allows), or
/// `None` when it can.
pub fn runner_unsupported(model: &Model, max_cache_len: usize) -> Option<String> {
    let _ = (model, max_cache_len);
    Some("decoder not implemented yet".into())
}

/// Whether this CPU can run the decoder (`Err` says why not).
pub fn decoder_available() -> std::result::Result<(), String> {
    Ok(())
}

impl KwkDecoder {
    pub fn new(model: &Model, options: DecoderOptions) -> Result<Self> {
        let _ = (model, options);
        Err(KwkError::Unsupported("decoder not implemented yet".into()))
    }

    /// Empties the KV cache; the next `forward` starts at position 0.
    pub fn reset(&mut self) {}

    /// Tokens currently in the KV cache.
    pub fn position(&self) -> usize {
        0
    }

    /// Appends `tokens` at the current position and returns the logits of positions
    /// `logits_from..tokens.len()` of this call, row-major `[tokens.len() - logits_from][vocab]`.
    /// Perplexity asks for the second half of a window, generation for the last token only.
    pub fn forward(&mut self, tokens: &[u32], logits_from: usize) -> Result<Vec<f32>> {
        let _ = (tokens, logits_from);
        Err(KwkError::Unsupported("decoder not implemented yet".into()))
    }

    /// Bytes of packed weights the decoder holds (what a user pays in memory).
    pub fn weight_bytes(&self) -> u64 {
        0
    }

    /// Bits per weight over all parameters, embeddings and norms included.
    pub fn bits_per_weight(&self) -> f64 {
        0.0
    }

    /// Seconds spent packing weights (quantizing, or reading the pack cache) in `new`.
    pub fn pack_s(&self) -> f64 {
        0.0
    }

    /// Runs `prompt` then samples up to `max_new_tokens`, stopping at EOS; `on_token` sees
    /// each new id and returns false to stop early.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_new_tokens: usize,
        sampling: &Sampling,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<GenerateStats> {
        let _ = (prompt, max_new_tokens, sampling, on_token);
        Err(KwkError::Unsupported("decoder not implemented yet".into()))
    }
}

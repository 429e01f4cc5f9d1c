//! kwk: a CPU decoder for Llama-family language models (Llama, Mistral, Qwen2/3 and the
//! mixture-of-experts Mixtral, Qwen2-MoE, Qwen3-MoE).
//!
//! A model is loaded as users have it ([`model::load_model`]: a Hugging Face folder, a hub
//! id, or a GGUF file; or tensors held in memory under their Hugging Face names,
//! [`model::memory`], as the Python package passes a `transformers` model) into float32
//! master weights, then packed into one weight format
//! ([`Precision`]) by [`decoder::KwkDecoder::new`]. The crate knows nothing of the
//! evaluation harness; it exposes weights, tokenizer, forward passes and generation.
//!
//! Layout: `gguf` (the GGUF container), `model/` (configs, sources, architectures),
//! `tokenizer` (HF tokenizer.json and GGUF-metadata tokenizers), `format/` (weight formats,
//! their names and options, [`Precision`], and GGUF block types), `kernels/` (the float
//! kernels' specification in `scalar.rs`, their SIMD twins in `x86_64/`; the quantized
//! kernels by tier in `quant/`), `roofline/` (this machine's peaks: the roofline's
//! ceilings), `quantize/` (rounding, equalization, the int4 mix search, GPTQ's rounding),
//! `pack/` (the one packing pipeline: a layer source, whole model in memory, streamed file
//! or pack cache, through calibration, equalization and rounding into the packed parts;
//! `pack/cache/` the pack cache), `decoder/` (the runtime: forward, KV cache, generate, and
//! the activation sink calibration runs on), `threads` (the persistent worker pool),
//! `notices` (warnings handed to the program, never printed).
//!
//! `unsafe` lives in `kernels/` (the SIMD tier files: `x86_64/`, `quant/`'s tier files and
//! the SIMD halves of `q8_activations.rs`; the output pointers in `mod.rs`, the worker
//! pool's job hand-off in `broadcast.rs`), in `roofline/` (its SIMD loops in `x86_64.rs` and
//! their safe wrappers in `mod.rs`) and in the file maps (`gguf/map.rs`,
//! `pack/cache/file.rs`).

pub mod decoder;
pub mod error;
pub mod files;
pub mod format;
pub mod gguf;
pub mod interrupt;
pub mod kernels;
pub mod model;
pub mod notices;
pub mod pack;
pub mod paths;
pub mod quantize;
pub mod roofline;
#[cfg(test)]
mod test_values;
pub mod threads;
pub mod tokenizer;

pub use decoder::{DecoderOptions, KvPrecision, KwkDecoder, Sampling};
pub use error::{KwkError, Result};
pub use format::Precision;
pub use model::{load_model, Model, ModelConfig};
/// The pack cache's old path (it lives in [`pack::cache`]).
pub use pack::cache as pack_cache;

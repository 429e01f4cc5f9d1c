//! Packing: the one pipeline that turns a model's float32 weights into the packed parts the
//! decoder runs, and keeps them.
//!
//! - `build`: the pipeline for a model in memory (cache look-up, equalization, calibration,
//!   the int4 mix plan, GPTQ, packing), `stream`: the same for a file streamed one layer at
//!   a time, `cached`: a warm start from the pack cache.
//! - `source`: the layer-source trait those three implement, the one function that puts a
//!   packed layer together from a source, and the one [`source::Packer`] every tensor is
//!   packed through.
//! - `calibrate`: activation statistics, Hessians and GPTQ passes (the decoder is the
//!   activation sink); `plan`: the int4 mix plan; `model`: what a packed model is.
//! - `cache/`: the pack cache (identity and keys, the file format, sessions, the folder).
//!
//! Data flows one way: decoder → pack → format, quantize.

pub(crate) mod build;
pub mod cache;
pub(crate) mod cached;
pub mod calibrate;
pub(crate) mod model;
pub(crate) mod plan;
pub(crate) mod source;
pub(crate) mod stream;

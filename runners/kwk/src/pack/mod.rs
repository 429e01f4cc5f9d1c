//! Packing: the one pipeline that turns a model's float32 weights into the packed parts the
//! decoder runs, and keeps them.
//!
//! - `pipeline`: the one pipeline for a float32 model (parameters, cache look-up, "equalize
//!   and plan", packing, the warm start's float vectors) over its two sources, `build` (a
//!   model in memory: whole-model equalization, calibration, GPTQ) and `stream` (a file
//!   streamed one layer at a time); `cached`: the third source, a warm start from the pack
//!   cache.
//! - `source`: the traits the sources implement (the model's parts, each layer's), the one
//!   outer build over them (`assemble`: tables, final norm, the per-layer loop), the one
//!   function that puts a packed layer together, and the one [`source::Packer`] every
//!   tensor is packed through.
//! - `calibrate`: activation statistics, Hessians and GPTQ passes (the decoder is the
//!   activation sink); `plan`: the grid plan (the int3..int6 mix, `bpw:X`), built one way for every
//!   source; `model`: what a packed model is.
//! - `cache/`: the pack cache (identity and keys, the file format, sessions, the folder).
//!
//! Data flows one way: decoder → pack → format, quantize.

pub(crate) mod build;
pub mod cache;
pub(crate) mod cached;
pub mod calibrate;
pub(crate) mod model;
pub(crate) mod pipeline;
pub(crate) mod plan;
pub(crate) mod source;
pub(crate) mod stream;

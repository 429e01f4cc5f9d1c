//! kwk-eval: what a weight format costs in quality and buys in speed, measured on the same
//! tokens for kwk's in-tree decoder and for llama.cpp.
#![forbid(unsafe_code)]

pub mod runner;

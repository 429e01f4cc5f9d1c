//! kwk-eval: what a weight format costs in quality and buys in speed, measured on the same
//! tokens for kwk's in-tree decoder and for llama.cpp.
//!
//! `cli` turns arguments into a config; `session` runs an evaluation (`text` reads the
//! text, `runner` builds the runners, `eval` measures, `report` writes and gates);
//! `generate` streams a completion; `cache` lists and prunes the pack cache. `main.rs` maps the outcome to an exit code.
#![forbid(unsafe_code)]

pub mod cache;
pub mod cli;
pub mod eval;
pub mod generate;
pub mod machine;
pub mod progress;
pub mod report;
pub mod runner;
pub mod session;
pub mod stats;
pub mod text;

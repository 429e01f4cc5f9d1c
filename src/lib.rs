//! kwk-eval: what a weight format costs in quality and buys in speed, measured on the same
//! tokens for kwk's in-tree decoder and for llama.cpp.
//!
//! Data flows one way: `cli` (clap: flags into typed values) → `plan` (an immutable,
//! checked run plan, nothing loaded) → `prepare` (model, tokens, chunk plan, identity) →
//! `measure` (runners from `runner`, measurements from `eval`) → `report` (exporters,
//! `compare`, the gate). `protocol` holds the types they pass along and imports nothing
//! from the crate. `session` drives a run; `generate` streams a completion; `cache` lists and prunes the pack
//! cache. `main.rs` maps
//! the outcome to an exit code.
#![forbid(unsafe_code)]

pub mod cache;
pub mod cli;
pub mod eval;
pub mod generate;
pub mod machine;
pub mod measure;
pub mod plan;
pub mod prepare;
pub mod progress;
pub mod protocol;
pub mod report;
pub mod runner;
pub mod session;
pub mod stats;
pub mod text;

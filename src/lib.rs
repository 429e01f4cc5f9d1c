//! kwk-eval: what a weight format costs in quality and buys in speed, measured on the same
//! tokens for kwk's in-tree decoder and for llama.cpp.
//!
//! Data flows one way: each layer uses only the layers below it (`tests/house.rs` fails on
//! a module cycle).
//! 1. `cli`: the flags parsed into plain options defined below it; it prints and runs
//!    nothing.
//! 2. The commands, none calling another: `session` (an evaluation run), `compare`,
//!    `generate`, `cache`, `merge` (run folders into one report) and `sweep` (many runs
//!    from a sweep file, each a kwk-eval process of its own, merged by another).
//! 3. The evaluation's stages, each using the next (a run meets them the other way round):
//!    `measure` (the runners' quality, then interleaved speed) → `prepare` (model header,
//!    tokens, chunk plan, identity) → `plan` (the options checked into an immutable run
//!    plan, nothing loaded); and `run_folder` (the folder a run claims).
//! 4. `runner` (kwk's decoder and llama.cpp behind one trait) → `eval` (the measurements
//!    every runner shares).
//! 5. `report`: the exporters, `compare` and the `--baseline` gate.
//! 6. The leaves any layer may use: `protocol` (the types the stages pass along),
//!    `limits` (the bounds of every number), `cache_dir` (the pack cache folder), `ui` (the
//!    reporting interface), `machine`, `text`, `scratch`, `stats`, `digest`, `interrupt`.
//!
//! Above them all, `console`, the program: [`run`] is the whole command line (the binary
//! and the Python package's `python -m kwk.bench` call it): it parses, runs the command,
//! renders what the library reports through [`ui::Reporter`] on the terminal (progress
//! bars, status, notes and warnings on stderr, the output on stdout) and maps the outcome
//! to an exit code. Libraries never print: no module but `console` writes to the process's
//! streams, and none refers to it (`tests/house.rs`).
#![forbid(unsafe_code)]

pub mod cache;
pub mod cache_dir;
pub mod cli;
pub mod compare;
pub mod console;
pub mod depth;
pub mod digest;
pub mod eval;
pub mod generate;
pub mod interrupt;
pub mod ladder;
pub mod limits;
pub mod machine;
pub mod measure;
pub mod merge;
pub mod plan;
pub mod prepare;
pub mod protocol;
pub mod report;
pub mod run_folder;
pub mod runner;
pub mod scratch;
pub mod session;
pub mod stats;
pub mod sweep;
pub mod text;
pub mod ui;

pub use console::run;

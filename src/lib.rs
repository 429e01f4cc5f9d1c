//! kwk-eval: what a weight format costs in quality and buys in speed, measured on the same
//! tokens for kwk's in-tree decoder and for llama.cpp.
//!
//! `cli` turns arguments into a config; `session` runs an evaluation (`text` reads the
//! text, `runner` builds the runners, `eval` measures, `report` writes and gates);
//! `generate` streams a completion. `main.rs` maps the outcome to an exit code.
#![forbid(unsafe_code)]

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

/// `../shared/fixtures` of the repository: the first ancestor of the crate folder holding
/// `shared/fixtures` (a worktree sits one level deeper than the main checkout).
#[cfg(test)]
pub(crate) fn test_fixtures_dir() -> std::path::PathBuf {
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .map(|a| a.join("shared").join("fixtures"))
        .find(|p| p.is_dir())
        .expect("../shared/fixtures not found above the repository")
}

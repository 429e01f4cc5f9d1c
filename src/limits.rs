//! The bounds every command checks its numbers against: tokens, chunks, repetitions and
//! threads, each with the one-line refusal that names the flag and the range; and the label
//! and hint of the memory refusal. A leaf: it reads only [`crate::machine`] (the cores
//! available), so every command and stage (`plan`, `prepare`, `measure`, `generate`, the
//! Python package) checks against the same numbers.

use crate::machine;
use anyhow::{ensure, Result};
use std::path::Path;

/// Largest `--ctx`, and the longest sequence (`--pp` + `--tg`) a speed test runs: 2^20
/// tokens, far past what the in-tree decoder or llama.cpp's tools are run with here and small
/// enough that every size derived from it (`chunks × ctx`, the KV cache length) stays well
/// inside `usize`. The model's own context length bounds these again once it is loaded.
pub const MAX_TOKENS: usize = 1 << 20;

/// Largest `--chunks` count (2^20; the count is also capped by the text's whole chunks).
pub const MAX_CHUNKS: usize = 1 << 20;

/// Largest `--reps` (timed repetitions of each speed test).
pub const MAX_REPS: usize = 1000;

/// `--threads` may be at most this many times the cores available to the process
/// (`std::thread::available_parallelism`): more only makes spinning workers wait on each other.
pub const THREADS_PER_CORE: usize = 4;

/// Largest `--threads` on this machine: [`THREADS_PER_CORE`] × the available cores.
pub fn max_threads() -> usize {
    machine::available_threads().saturating_mul(THREADS_PER_CORE)
}

/// `flag value` must lie in `min..=max`; otherwise one line naming the flag and the range.
pub fn check_range(flag: &str, value: usize, min: usize, max: usize, what: &str) -> Result<()> {
    ensure!(
        (min..=max).contains(&value),
        "{flag} {value} is out of range: pass {min} to {max} ({what})"
    );
    Ok(())
}

/// `--threads`: 1 to [`max_threads`].
pub fn check_threads(threads: usize) -> Result<()> {
    check_range(
        "--threads",
        threads,
        1,
        max_threads(),
        &format!(
            "at most {THREADS_PER_CORE} × the {} cores available",
            machine::available_threads()
        ),
    )
}

/// What the memory refusal suggests.
pub const MEMORY_HINT: &str =
    "use a smaller model or fewer formats (KWK_MEMORY_CHECK=0 skips this check)";

/// The label of row `name` of the model in a memory refusal: `int4 of model.gguf`.
pub fn row_label(name: &str, llm: &str) -> String {
    let file = Path::new(llm)
        .file_name()
        .map_or_else(|| llm.to_string(), |f| f.to_string_lossy().into_owned());
    format!("{name} of {file}")
}

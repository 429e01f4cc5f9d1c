//! The one error type of this crate. Every variant names the tool or file involved and,
//! where a process ran, carries the last lines of its stderr and a hint at the fix, so a
//! caller can print `{error}` and the user knows what to do next.

use crate::engine::Engine;
use std::path::PathBuf;
use std::time::Duration;

/// How a user gets llama.cpp's tools; repeated in every "not found" and "too old" error.
pub const SETUP_HINT: &str = "build them with `scripts/setup-llama-cpp.sh` (it prints the bin \
directory) and pass that directory with `--llama-cpp-dir DIR` or set KWK_LLAMA_CPP_DIR=DIR";

/// How a user gets llama.cpp's converter and its Python (`crate::convert`); in every
/// "converter not found" error.
pub const CONVERT_SETUP_HINT: &str = "run `scripts/setup-convert.sh` (it installs numpy, torch, \
transformers and safetensors into $KWK_CACHE/python-venv), or set KWK_PYTHON to a Python that \
has them and KWK_LLAMA_CPP_SRC to a llama.cpp source folder";

/// The oldest llama.cpp build whose tools accept every flag this crate passes (see the
/// [`crate::tools`] module docs for how it was chosen). It lives here, beside
/// [`SETUP_HINT`], because the "too old" error names it; `tools` re-exports it.
pub const MIN_BUILD_NUMBER: u64 = 6343;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A required tool was not in any of the places searched.
    #[error("{} tool `{tool}` not found; searched: {}. Fix: {}", engine.project(), searched.join("; "), engine.setup_hint())]
    ToolNotFound {
        engine: Engine,
        tool: &'static str,
        searched: Vec<String>,
    },

    /// The tools found are the other engine's (told apart by their own `--help`,
    /// [`Engine::identify`]): ik_llama.cpp's where llama.cpp's were wanted, or the reverse
    /// (which is also what an ik_llama.cpp too old to list its own options looks like).
    #[error(
        "{} is not {} but {} (its --help {}; found {version}). Fix: {}",
        path.display(), wanted.project(), found.project(),
        if *found == Engine::Ik { "lists ik_llama.cpp's own options" } else { "lacks ik_llama.cpp's own options such as --run-time-repack" },
        wanted.setup_hint()
    )]
    WrongEngine {
        path: PathBuf,
        wanted: Engine,
        found: Engine,
        version: String,
    },

    /// llama.cpp's converter script, or a Python that can run it, was not found.
    #[error("{what} not found for llama.cpp's convert_hf_to_gguf.py; looked at: {}. Fix: {}", searched.join("; "), CONVERT_SETUP_HINT)]
    ConverterNotFound { what: String, searched: Vec<String> },

    /// The tool exists but lacks a flag this crate passes (the build is too old).
    #[error(
        "{} tool {} is too old: its --help lacks {} ({}; found {version}). Fix: {}",
        engine.project(), path.display(), missing.join(", "), needed_build(*engine), engine.setup_hint()
    )]
    ToolTooOld {
        engine: Engine,
        path: PathBuf,
        missing: Vec<String>,
        version: String,
    },

    /// The process could not be started at all.
    #[error("could not start {}: {source}. Fix: check the file is an executable llama.cpp tool, or {SETUP_HINT}", path.display())]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The process ran longer than allowed and was killed.
    #[error(
        "{tool} timed out after {} s and was killed{}\n{}Hint: raise the timeout (--tool-timeout SECONDS), use fewer chunks/repetitions, or check the machine is not overloaded",
        seconds(after), command_line(command), tail_block(stderr_tail)
    )]
    Timeout {
        tool: String,
        after: Duration,
        command: String,
        stderr_tail: String,
    },

    /// The run was interrupted ([`crate::process::interrupt_flag`] was set: SIGINT or
    /// SIGTERM); the tool's process group was killed.
    #[error("{tool} was stopped: the run was interrupted{}", command_line(command))]
    Interrupted { tool: String, command: String },

    /// The process exited unsuccessfully (non-zero status or a signal).
    #[error(
        "{tool} failed ({status}){}\n{}Hint: {hint}",
        command_line(command),
        tail_block(stderr_tail)
    )]
    Failed {
        tool: String,
        status: String,
        command: String,
        stderr_tail: String,
        hint: String,
    },

    /// The process exited 0 but did not print what it must print (e.g. no `Final estimate`).
    #[error(
        "{tool}: {what}{}\n{}Hint: {hint}",
        command_line(command),
        tail_block(stderr_tail)
    )]
    BadOutput {
        tool: String,
        what: String,
        command: String,
        stderr_tail: String,
        hint: String,
    },

    /// llama-perplexity said the text has fewer than `2*ctx` tokens.
    #[error(
        "{}: the text tokenizes to {} but a context of {ctx} needs at least {needed}. \
         Fix: use a longer text or a smaller --ctx",
        text.display(), got.map_or("too few tokens".to_string(), |g| format!("only {g} tokens"))
    )]
    TextTooShort {
        text: PathBuf,
        ctx: usize,
        needed: usize,
        got: Option<usize>,
    },

    /// A file this crate reads or writes could not be.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A caller passed settings llama.cpp would reject or misread.
    #[error("invalid llama.cpp settings: {0}")]
    InvalidSettings(String),
}

/// The oldest build of `engine` that has every flag this crate passes, in words.
fn needed_build(engine: Engine) -> String {
    match engine {
        Engine::LlamaCpp => {
            format!("needs llama.cpp b{MIN_BUILD_NUMBER} or newer, September 2025")
        }
        Engine::Ik => format!(
            "needs the ik_llama.cpp of ik-llama-cpp-python {} or newer",
            crate::ik::PINNED_PYPI_VERSION
        ),
    }
}

/// Whole seconds, or one decimal below 10 s.
fn seconds(d: &Duration) -> String {
    let s = d.as_secs_f64();
    if s < 10.0 && s.fract() != 0.0 {
        format!("{s:.1}")
    } else {
        format!("{s:.0}")
    }
}

fn command_line(command: &str) -> String {
    if command.is_empty() {
        String::new()
    } else {
        format!("\ncommand: {command}")
    }
}

fn tail_block(tail: &str) -> String {
    if tail.trim().is_empty() {
        "stderr: (empty)\n".to_string()
    } else {
        format!("stderr (last lines):\n{}\n", tail.trim_end())
    }
}

pub type Result<T> = std::result::Result<T, Error>;

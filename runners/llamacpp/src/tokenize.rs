//! llama-tokenize: the token ids llama.cpp gives a text, so a caller can check that its own
//! ids are the ones llama-perplexity scores.
//!
//! llama-tokenize and llama-perplexity read `-f` differently (llama-cpp-python 0.3.36 tree):
//! - llama-perplexity: common's `-f` handler reads the file and strips exactly one trailing
//!   `\n` (common/arg.cpp:1801-1808); escapes are off (`params.escape = false`, P:1994);
//!   `common_tokenize(ctx, text, add_special=true, parse_special=false)` (P:473).
//! - llama-tokenize: re-reads the file verbatim, *keeping* the trailing `\n`, and processes
//!   escapes (`\n`, `\t`, `\\` ...) unless `--no-escape` (tools/tokenize/tokenize.cpp);
//!   special tokens are parsed unless `--no-parse-special` (defaults differ between builds);
//!   BOS is added when the vocabulary says so, as in llama-perplexity.
//!
//! So we write the text minus one trailing `\n` to a temporary file and pass `--ids
//! --no-escape --no-parse-special`: both tools then tokenize the same string the same way.
//! The ids are printed with `printf` (not the asynchronous logger) as `[1, 2, 3]`.

use crate::error::{Error, Result};
use crate::process::{self, ToolCommand};
use crate::tools::{Engine, LlamaCppTools, TOKENIZE};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Tokenize `text` with `model`'s vocabulary as llama-perplexity does.
#[derive(Debug, Clone)]
pub struct TokenizeRequest {
    pub model: PathBuf,
    pub text: PathBuf,
    pub timeout: Duration,
}

/// Parses `--ids` output: the last line of the form `[1, 2, 3]`.
pub fn parse_ids(stdout: &str) -> std::result::Result<Vec<u32>, String> {
    let line = stdout
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('[') && l.ends_with(']'))
        .ok_or("no `[id, id, ...]` line on stdout")?;
    let inner = &line[1..line.len() - 1];
    if inner.trim().is_empty() {
        return Ok(Vec::new());
    }
    inner
        .split(',')
        .map(|s| {
            let s = s.trim();
            s.parse::<u32>()
                .map_err(|_| format!("not a token id: `{s}`"))
        })
        .collect()
}

/// The text as llama-perplexity sees it: the file's bytes minus one trailing `\n`.
pub fn perplexity_text(bytes: &[u8]) -> &[u8] {
    bytes.strip_suffix(b"\n").unwrap_or(bytes)
}

/// A finished tokenization.
#[derive(Debug, Clone)]
pub struct TokenizeRun {
    pub ids: Vec<u32>,
    pub command: String,
    pub elapsed: Duration,
}

/// Runs llama-tokenize on the text as llama-perplexity would read it.
pub fn run_tokenize(tools: &LlamaCppTools, req: &TokenizeRequest) -> Result<TokenizeRun> {
    let tool = tools.tokenize_path().ok_or_else(|| Error::ToolNotFound {
        engine: tools.engine(),
        tool: TOKENIZE,
        searched: vec![format!(
            "beside {} (or it lacks --ids/--no-escape/--no-parse-special)",
            tools.perplexity_path().display()
        )],
    })?;
    let bytes = std::fs::read(&req.text).map_err(|source| Error::Io {
        path: req.text.clone(),
        source,
    })?;
    let io_err = |path: PathBuf| move |source| Error::Io { path, source };
    let mut tmp = tempfile::Builder::new()
        .prefix("kwk-tokenize-")
        .suffix(".txt")
        .tempfile()
        .map_err(io_err(std::env::temp_dir()))?;
    let tmp_path = tmp.path().to_path_buf();
    tmp.write_all(perplexity_text(&bytes))
        .and_then(|_| tmp.flush())
        .map_err(io_err(tmp_path.clone()))?;

    let mut cmd = ToolCommand::new(
        &tools.tool_label(TOKENIZE),
        tool,
        req.timeout,
        "check the GGUF has a vocabulary llama.cpp can load",
    );
    cmd.arg("-m").arg(&req.model).arg("-f").arg(&tmp_path);
    match tools.engine() {
        Engine::LlamaCpp => cmd.args(["--ids", "--no-escape", "--no-parse-special"]),
        // ik_llama.cpp's processes no escapes and has no --no-escape.
        Engine::Ik => cmd.args(crate::ik::TOKENIZE_ARGS),
    };
    let out = process::run(&cmd, |_, _| {})?;
    let ids = parse_ids(&out.stdout).map_err(|what| Error::BadOutput {
        tool: tools.tool_label(TOKENIZE),
        what,
        command: out.command.clone(),
        stderr_tail: out.stderr_tail(),
        hint: "llama-tokenize printed something the parser does not expect; check its version"
            .to_string(),
    })?;
    Ok(TokenizeRun {
        ids,
        command: out.command,
        elapsed: out.elapsed,
    })
}

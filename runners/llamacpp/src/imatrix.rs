//! llama-imatrix: the importance matrix (per-column sums of squared activations of every
//! linear's input) llama-quantize's `--imatrix` weighs rounding errors with, computed from a
//! calibration text.
//!
//! Flags (llama-cpp-python 0.3.36 tree, `tools/imatrix`): `-m MODEL -f TEXT -o OUT
//! -c CTX --chunks N -t THREADS`; the text is tokenized whole (BOS per chunk as the model
//! says) and cut into `CTX`-token chunks from the start; the output is a GGUF file by
//! default (`--output-format gguf`), which llama-quantize reads by its magic.
//!
//! ik_llama.cpp's llama-quantize (0.1.5, `examples/quantize/quantize.cpp`, `load_imatrix`)
//! reads only the legacy binary format, so [`run_imatrix_to_legacy`] rewrites a GGUF
//! importance matrix as one: mainline's llama-imatrix with `--in-file` and no text saves
//! what it loaded without loading a model (`tools/imatrix/imatrix.cpp`, "combining
//! precomputed matrices only"), in the format `--output-format dat` names.

use crate::error::{Error, Result};
use crate::process::{self, ToolCommand};
use crate::tools::{LlamaCppTools, IMATRIX};
use std::path::PathBuf;
use std::time::Duration;

/// Compute the importance matrix of `model` on the first `chunks` chunks of `text`.
#[derive(Debug, Clone)]
pub struct ImatrixRequest {
    pub model: PathBuf,
    pub text: PathBuf,
    pub output: PathBuf,
    pub ctx: usize,
    pub chunks: usize,
    pub threads: usize,
    pub timeout: Duration,
}

/// A finished importance matrix.
#[derive(Debug, Clone)]
pub struct ImatrixRun {
    /// stdout and stderr as printed.
    pub text: String,
    pub command: String,
    pub elapsed: Duration,
}

/// The importance matrix `input` (llama-imatrix's GGUF format) rewritten as `output` in
/// the legacy binary format (the same sums, for ik_llama.cpp's llama-quantize); the output
/// file exists when this returns `Ok`.
pub fn run_imatrix_to_legacy(
    tools: &LlamaCppTools,
    input: &std::path::Path,
    output: &std::path::Path,
    timeout: Duration,
) -> Result<ImatrixRun> {
    let tool = imatrix_tool(tools)?;
    let mut cmd = ToolCommand::new(
        &tools.tool_label(IMATRIX),
        tool,
        timeout,
        "check the importance matrix file is one llama-imatrix wrote",
    );
    cmd.arg("--in-file")
        .arg(input)
        .arg("-o")
        .arg(output)
        .args(["--output-format", "dat"]);
    finish(tools, cmd, output)
}

fn imatrix_tool(tools: &LlamaCppTools) -> Result<&std::path::Path> {
    tools.imatrix_path().ok_or_else(|| Error::ToolNotFound {
        engine: tools.engine(),
        tool: IMATRIX,
        searched: vec![format!("beside {}", tools.perplexity_path().display())],
    })
}

/// Runs `cmd` and checks it wrote `output`.
fn finish(tools: &LlamaCppTools, cmd: ToolCommand, output: &std::path::Path) -> Result<ImatrixRun> {
    let out = process::run(&cmd, |_, _| {})?;
    if !output.is_file() {
        return Err(Error::BadOutput {
            tool: tools.tool_label(IMATRIX),
            what: format!("it exited 0 but wrote no '{}'", output.display()),
            command: out.command.clone(),
            stderr_tail: out.stderr_tail(),
            hint: "check the llama.cpp build".to_string(),
        });
    }
    Ok(ImatrixRun {
        text: format!("{}\n{}", out.stdout, out.stderr),
        command: out.command,
        elapsed: out.elapsed,
    })
}

/// Runs llama-imatrix; the output file exists when this returns `Ok`.
pub fn run_imatrix(tools: &LlamaCppTools, req: &ImatrixRequest) -> Result<ImatrixRun> {
    let tool = imatrix_tool(tools)?;
    let mut cmd = ToolCommand::new(
        &tools.tool_label(IMATRIX),
        tool,
        req.timeout,
        "check the calibration text has at least one chunk of --ctx tokens",
    );
    cmd.arg("-m")
        .arg(&req.model)
        .arg("-f")
        .arg(&req.text)
        .arg("-o")
        .arg(&req.output)
        .args(["-c", &req.ctx.to_string()])
        .args(["--chunks", &req.chunks.max(1).to_string()])
        .args(["-t", &req.threads.max(1).to_string()])
        .args(["-ngl", "0"]);
    finish(tools, cmd, &req.output)
}

//! llama-quantize: makes a GGUF of one quantization type from a float GGUF, and reads what
//! it did from its log: the tensors whose row length forced a fallback type, the file's
//! bits per weight as llama.cpp counts them, and whether the type needed an importance
//! matrix it was not given.
//!
//! What the tool prints (llama-cpp-python 0.3.36 tree, `src/llama-quant.cpp`):
//! - one warning per fallback (`llama_tensor_get_type_impl`, l. 410-441):
//!   `warning: blk.0.attn_k.weight - ncols 576 not divisible by 256 (required for type iq2_s)
//!   -> falling back to iq4_nl` (columns padded with spaces);
//! - the totals (l. 1380-1391): `quant size = 82.75 MiB (5.16 BPW)` and
//!   `WARNING: 180 of 272 tensor(s) required fallback quantization`;
//! - a type whose tensors need an importance matrix (IQ1/IQ2 types, IQ3_XXS, Q2_K in Q2_K_S;
//!   `tensor_requires_imatrix`, l. 856) and none given: `this quantization requires an
//!   importance matrix!` and a nonzero exit.
//!
//! The type names a build accepts are read from its `--help` ("allowed quantization types":
//! `  12  or  Q3_K_M  :  3.74G, ...`), so a name is checked against the tool that will run it.

use crate::error::{Error, Result};
use crate::process::{self, ToolCommand};
use crate::tools::{LlamaCppTools, QUANTIZE};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Quantize `input` to `output` as `qtype`.
#[derive(Debug, Clone)]
pub struct QuantizeRequest {
    pub input: PathBuf,
    pub output: PathBuf,
    /// A type name as llama-quantize's help lists it (`Q4_K_M`, `IQ4_XS`, `F32`).
    pub qtype: String,
    /// `--imatrix FILE`.
    pub imatrix: Option<PathBuf>,
    /// `--allow-requantize`: the input holds quantized tensors (a GGUF source).
    pub allow_requantize: bool,
    pub threads: usize,
    pub timeout: Duration,
}

/// One tensor llama-quantize could not give the requested type, and what it used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fallback {
    pub tensor: String,
    /// The type the mix asked for (`q4_K`).
    pub wanted: String,
    /// The type it fell back to (`q5_0`).
    pub used: String,
}

/// What one llama-quantize run did.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeLog {
    pub fallbacks: Vec<Fallback>,
    /// `(n, of)` from `WARNING: n of of tensor(s) required fallback quantization`.
    pub fallback_count: Option<(usize, usize)>,
    /// The quantized size's bits per weight as llama-quantize prints it (two decimals).
    pub bits_per_weight: Option<f64>,
}

/// A finished quantization.
#[derive(Debug, Clone)]
pub struct QuantizeRun {
    pub log: QuantizeLog,
    /// stdout and stderr as printed, for the cache's record.
    pub text: String,
    pub command: String,
    pub elapsed: Duration,
}

/// The fallback lines and totals of a llama-quantize log.
pub fn parse_log(text: &str) -> QuantizeLog {
    let mut fallbacks = Vec::new();
    let mut fallback_count = None;
    let mut bits_per_weight = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(f) = parse_fallback(line) {
            fallbacks.push(f);
        } else if let Some(rest) = after(line, "quant size") {
            bits_per_weight = rest
                .rsplit_once('(')
                .and_then(|(_, r)| r.split_whitespace().next())
                .and_then(|v| v.parse::<f64>().ok());
        } else if line.contains("required fallback quantization") {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let Some(i) = words.iter().position(|w| *w == "of") {
                let n = i.checked_sub(1).and_then(|j| words[j].parse().ok());
                let of = words.get(i + 1).and_then(|w| w.parse().ok());
                if let (Some(n), Some(of)) = (n, of) {
                    fallback_count = Some((n, of));
                }
            }
        }
    }
    QuantizeLog {
        fallbacks,
        fallback_count,
        bits_per_weight,
    }
}

fn after<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.find(key).map(|i| &line[i + key.len()..])
}

/// `warning: NAME - ncols N not divisible by B (required for type T) -> falling back to U`.
fn parse_fallback(line: &str) -> Option<Fallback> {
    let rest = line.strip_prefix("warning:")?.trim_start();
    let (tensor, rest) = rest.split_once(char::is_whitespace)?;
    let wanted = after(rest, "(required for type")?
        .split(')')
        .next()?
        .trim()
        .to_string();
    let used = after(rest, "falling back to")?
        .split_whitespace()
        .next()?
        .to_string();
    (!wanted.is_empty()).then(|| Fallback {
        tensor: tensor.to_string(),
        wanted,
        used,
    })
}

/// Whether a failed run's log says the type needs an importance matrix.
pub fn needs_imatrix(text: &str) -> bool {
    text.contains("requires an importance matrix") || text.contains("requires an imatrix")
}

/// The type names listed under "allowed quantization types" in llama-quantize's help.
pub fn parse_allowed_types(help: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_list = false;
    for line in help.lines() {
        // Mainline: "allowed quantization types"; ik_llama.cpp: "Allowed quantization types:".
        if line
            .to_ascii_lowercase()
            .contains("allowed quantization types")
        {
            in_list = true;
            continue;
        }
        if !in_list {
            continue;
        }
        // `  12  or  Q3_K_M  :  3.74G, ...` (also `  32  or  BF16    : ...`).
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.len() >= 3 && words[0].parse::<u32>().is_ok() && words[1] == "or" {
            let name = words[2].trim_end_matches(':');
            if !name.is_empty() && !out.iter().any(|n: &String| n == name) {
                out.push(name.to_string());
            }
        }
    }
    out
}

fn quantize_tool(tools: &LlamaCppTools) -> Result<&Path> {
    tools.quantize_path().ok_or_else(|| Error::ToolNotFound {
        engine: tools.engine(),
        tool: QUANTIZE,
        searched: vec![format!("beside {}", tools.perplexity_path().display())],
    })
}

/// The types this build of llama-quantize accepts.
pub fn allowed_types(tools: &LlamaCppTools, timeout: Duration) -> Result<Vec<String>> {
    let tool = quantize_tool(tools)?;
    let mut cmd = ToolCommand::new(
        &tools.tool_label(QUANTIZE),
        tool,
        timeout,
        "rebuild llama.cpp's tools",
    );
    cmd.arg("--help");
    // llama-quantize exits 1 after printing its usage: keep what it printed either way.
    let mut out = String::new();
    match process::run(&cmd, |o, e| out = format!("{o}\n{e}")) {
        Ok(_) | Err(Error::Failed { .. }) => {}
        Err(e) => return Err(e),
    }
    let types = parse_allowed_types(&out);
    if types.is_empty() {
        return Err(Error::BadOutput {
            tool: tools.tool_label(QUANTIZE),
            what: "its --help lists no \"allowed quantization types\"".to_string(),
            command: cmd.display(),
            stderr_tail: process::tail_lines(&out, 10),
            hint: "check the llama.cpp build".to_string(),
        });
    }
    Ok(types)
}

/// Runs llama-quantize. A type that needs an importance matrix it was not given is
/// [`Error::Failed`] whose hint says so ([`needs_imatrix`] on its tail tells it apart).
pub fn run_quantize(tools: &LlamaCppTools, req: &QuantizeRequest) -> Result<QuantizeRun> {
    let tool = quantize_tool(tools)?;
    let mut cmd = ToolCommand::new(
        &tools.tool_label(QUANTIZE),
        tool,
        req.timeout,
        "check the input GGUF loads in llama.cpp and the type name is one llama-quantize lists",
    );
    if req.allow_requantize {
        cmd.arg("--allow-requantize");
    }
    if let Some(m) = &req.imatrix {
        cmd.arg("--imatrix").arg(m);
    }
    cmd.arg(&req.input)
        .arg(&req.output)
        .arg(&req.qtype)
        .arg(req.threads.max(1).to_string());
    let mut printed = String::new();
    let out = match process::run(&cmd, |o, e| printed = format!("{o}\n{e}")) {
        Err(Error::Failed {
            tool,
            status,
            command,
            stderr_tail,
            ..
        }) if needs_imatrix(&printed) => {
            return Err(Error::Failed {
                tool,
                status,
                command,
                stderr_tail,
                hint: format!(
                    "{} needs an importance matrix; pass --calib-text so one is made",
                    req.qtype
                ),
            })
        }
        r => r?,
    };
    let text = format!("{}\n{}", out.stdout, out.stderr);
    Ok(QuantizeRun {
        log: parse_log(&text),
        text,
        command: out.command,
        elapsed: out.elapsed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as llama-quantize (0.3.36 tree) printed them quantizing SmolLM2-135M's F32
    /// GGUF to IQ3_XXS.
    const LOG: &str = "\
llama_model_loader: - type  f32:  272 tensors
warning: blk.0.attn_k.weight                  - ncols    576 not divisible by 256 (required for type   iq2_s) -> falling back to  iq4_nl
warning: blk.0.ffn_gate.weight                - ncols    576 not divisible by 256 (required for type iq3_xxs) -> falling back to  iq4_nl
[   2/ 272] token_embd.weight                    - [   576,  49152,      1,      1], type =    f32, converting to q8_0 .. size =   108.00 MiB ->    28.69 MiB
llama_model_quantize_impl: model size  =   513.13 MiB (32.00 BPW)
llama_model_quantize_impl: quant size  =    82.75 MiB (5.16 BPW)
llama_model_quantize_impl: WARNING: 180 of 272 tensor(s) required fallback quantization
";

    #[test]
    fn the_log_names_each_fallback_and_the_totals() {
        let log = parse_log(LOG);
        assert_eq!(
            log.fallbacks,
            vec![
                Fallback {
                    tensor: "blk.0.attn_k.weight".into(),
                    wanted: "iq2_s".into(),
                    used: "iq4_nl".into()
                },
                Fallback {
                    tensor: "blk.0.ffn_gate.weight".into(),
                    wanted: "iq3_xxs".into(),
                    used: "iq4_nl".into()
                },
            ]
        );
        assert_eq!(log.fallback_count, Some((180, 272)));
        assert_eq!(log.bits_per_weight, Some(5.16));
    }

    #[test]
    fn a_log_without_fallbacks_has_none() {
        let log = parse_log("llama_model_quantize_impl: quant size  =    40.10 MiB (8.50 BPW)\n");
        assert!(log.fallbacks.is_empty());
        assert_eq!(log.fallback_count, None);
        assert_eq!(log.bits_per_weight, Some(8.5));
    }

    #[test]
    fn the_missing_imatrix_error_is_recognised() {
        let text = " ERROR: this quantization requires an importance matrix!\n        - offending tensor: blk.0.attn_q.weight\n";
        assert!(needs_imatrix(text));
        assert!(!needs_imatrix(LOG));
    }

    #[test]
    fn allowed_types_are_read_from_the_help() {
        let help = "usage: ...\n  --pure\n\
-----\n allowed quantization types\n-----\n\n\
  40  or  Q1_0    :  1.125 bpw quantization\n\
   2  or  Q4_0    :  4.34G, +0.4685 ppl @ Llama-3-8B\n\
  12  or  Q3_K    : alias for Q3_K_M\n\
  12  or  Q3_K_M  :  3.74G, +0.6569 ppl @ Llama-3-8B\n\
  30  or  IQ4_XS  :  4.25 bpw non-linear quantization\n\
   0  or  F32     : 26.00G              @ 7B\n\
          COPY    : only copy tensors, no quantizing\n";
        assert_eq!(
            parse_allowed_types(help),
            ["Q1_0", "Q4_0", "Q3_K", "Q3_K_M", "IQ4_XS", "F32"]
        );
        assert!(parse_allowed_types("no list here").is_empty());
        // ik_llama.cpp 0.1.5's heading and its own types.
        let ik = "Allowed quantization types:\n\
  145  or  IQ4_KS  :  4.25 bpw non-linear quantization\n\
  345  or  IQ4_KS_R4 : IQ4_KS repacked\n\
    0  or  F32     : 26.00G              @ 7B\n";
        assert_eq!(parse_allowed_types(ik), ["IQ4_KS", "IQ4_KS_R4", "F32"]);
    }
}

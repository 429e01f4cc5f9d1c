//! llama-perplexity in KL-divergence mode (`--kl-divergence-base FILE --kl-divergence`): the
//! command and the parser for its statistics block (tools/perplexity/perplexity.cpp
//! P:1892-1982; docs/protocol.md §2.4-2.5).
//!
//! Everything is printed with `LOG()` to stdout; the anchors contain UTF-8 `±` (U+00B1) and
//! `Δ` (U+0394). The blocks appear only when at least 100 tokens were scored (P:1887), and a
//! run whose output stops early (llama.cpp's logger losing its last lines at exit, see
//! [`crate::perplexity`]) is retried. The text (`-f`) and `--chunks` are ignored in this mode:
//! tokens and chunk count come from the base file (P:1697-1720), so neither is passed.

use crate::error::{Error, Result};
use crate::perplexity::{error_lines, ready_seconds, MAX_UBATCH};
use crate::process::{self, ToolCommand};
use crate::settings::ComputeSettings;
use crate::tools::{LlamaCppTools, PERPLEXITY};
use regex::Regex;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

/// The header of the block this parser requires (P:1921).
pub const KLD_BLOCK: &str = "====== KL divergence statistics";

/// A printed `value ± uncertainty`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ValueErr {
    pub value: f64,
    pub err: f64,
}

/// The statistics block of one KL-divergence run. Fields ending in `_pct` are printed in
/// percent (as llama.cpp prints them).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KlDivergenceStats {
    /// `Mean PPL(Q)`: this model's PPL on the base file's tokens.
    pub ppl_q: ValueErr,
    /// `Mean PPL(base)`: the base model's PPL, from the stored log-probs.
    pub ppl_base: ValueErr,
    /// `Cor(ln(PPL(Q)), ln(PPL(base)))` in percent.
    pub cor_ln_ppl_pct: f64,
    pub mean_ln_ppl_ratio: ValueErr,
    pub ppl_ratio: ValueErr,
    pub ppl_diff: ValueErr,
    pub kld_mean: ValueErr,
    pub kld_max: f64,
    pub kld_p99_9: f64,
    pub kld_p99: f64,
    pub kld_p95: f64,
    pub kld_p90: f64,
    pub kld_median: f64,
    pub kld_p10: f64,
    pub kld_p5: f64,
    pub kld_p1: f64,
    pub kld_p0_1: f64,
    pub kld_min: f64,
    /// `Mean Δp`: mean change in the probability of the correct token, percent.
    pub delta_p_mean_pct: ValueErr,
    pub delta_p_max_pct: f64,
    pub delta_p_p99_9_pct: f64,
    pub delta_p_p99_pct: f64,
    pub delta_p_p95_pct: f64,
    pub delta_p_p90_pct: f64,
    pub delta_p_p75_pct: f64,
    pub delta_p_median_pct: f64,
    pub delta_p_p25_pct: f64,
    pub delta_p_p10_pct: f64,
    pub delta_p_p5_pct: f64,
    pub delta_p_p1_pct: f64,
    pub delta_p_p0_1_pct: f64,
    pub delta_p_min_pct: f64,
    /// `RMS Δp` in percent.
    pub rms_delta_p_pct: ValueErr,
    /// `Same top p`: share of tokens whose top-1 matches the base's, percent.
    pub same_top_pct: ValueErr,
    /// From `kl_divergence: computing over N chunks, n_ctx=C, ...` (stderr).
    pub chunks: Option<usize>,
    pub n_ctx: Option<usize>,
    /// Seconds to the `system_info:` line (model loaded and warmed up).
    pub ready_s: Option<f64>,
}

fn number(s: &str) -> std::result::Result<f64, String> {
    s.parse::<f64>().map_err(|_| format!("not a number: `{s}`"))
}

/// Parses the statistics printed by a KL-divergence run. Every line of the Perplexity, KL
/// divergence and token probability blocks is required, and error-level lines on stderr
/// (an inconsistent vocabulary, a base file from a larger context) make it fail.
pub fn parse_kl_divergence(
    stdout: &str,
    stderr: &str,
) -> std::result::Result<KlDivergenceStats, String> {
    let errors = error_lines(stderr);
    if !errors.is_empty() {
        return Err(format!("reported errors: {}", errors.join(" | ")));
    }
    if !stdout.contains(KLD_BLOCK) {
        return Err(format!("no `{KLD_BLOCK}` block"));
    }
    let grab = |pattern: &str, what: &str| -> std::result::Result<Vec<f64>, String> {
        let r = Regex::new(&format!("(?m){pattern}")).expect("parser regex");
        let c = r
            .captures(stdout)
            .ok_or_else(|| format!("no `{what}` line"))?;
        (1..c.len()).map(|i| number(&c[i])).collect()
    };
    // "%10.6lf ± %10.6lf" and similar: value, optional spaces, ±, spaces, value.
    const PM: &str = r"\s*(\S+)\s*±\s*(\S+)";
    let pm = |label: &str, what: &str| -> std::result::Result<ValueErr, String> {
        let v = grab(&format!("^{label}{PM}"), what)?;
        Ok(ValueErr {
            value: v[0],
            err: v[1],
        })
    };
    let one = |label: &str, what: &str| -> std::result::Result<f64, String> {
        Ok(grab(&format!(r"^{label}\s*(\S+?)%?\s*$"), what)?[0])
    };
    let kld = |p: &str| one(&format!(r"\s*{p}\s+KLD:"), &format!("{p} KLD"));
    let dp = |p: &str| one(&format!(r"\s*{p}\s+Δp:"), &format!("{p} Δp"));

    let header = |re_cell: &'static OnceLock<Regex>, pattern: &str| {
        re_cell
            .get_or_init(|| Regex::new(pattern).expect("static regex"))
            .captures(stderr)
            .map(|c| (c[1].parse::<usize>().ok(), c[2].parse::<usize>().ok()))
    };
    static OVER: OnceLock<Regex> = OnceLock::new();
    let (chunks, n_ctx) = header(
        &OVER,
        r"kl_divergence: computing over (\d+) chunks, n_ctx=(\d+)",
    )
    .unwrap_or((None, None));

    Ok(KlDivergenceStats {
        ppl_q: pm(r"Mean PPL\(Q\)\s+:", "Mean PPL(Q)")?,
        ppl_base: pm(r"Mean PPL\(base\)\s+:", "Mean PPL(base)")?,
        cor_ln_ppl_pct: one(
            r"Cor\(ln\(PPL\(Q\)\), ln\(PPL\(base\)\)\):",
            "Cor(ln(PPL(Q)), ln(PPL(base)))",
        )?,
        mean_ln_ppl_ratio: pm(
            r"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s+:",
            "Mean ln(PPL(Q)/PPL(base))",
        )?,
        ppl_ratio: pm(r"Mean PPL\(Q\)/PPL\(base\)\s+:", "Mean PPL(Q)/PPL(base)")?,
        ppl_diff: pm(r"Mean PPL\(Q\)-PPL\(base\)\s+:", "Mean PPL(Q)-PPL(base)")?,
        kld_mean: pm(r"Mean\s+KLD:", "Mean KLD")?,
        kld_max: kld("Maximum")?,
        kld_p99_9: kld(r"99\.9%")?,
        kld_p99: kld(r"99\.0%")?,
        kld_p95: kld(r"95\.0%")?,
        kld_p90: kld(r"90\.0%")?,
        kld_median: kld("Median")?,
        kld_p10: kld(r"10\.0%")?,
        kld_p5: kld(r"5\.0%")?,
        kld_p1: kld(r"1\.0%")?,
        kld_p0_1: kld(r"0\.1%")?,
        kld_min: kld("Minimum")?,
        delta_p_mean_pct: {
            let v = grab(&format!(r"^Mean\s+Δp:{PM}\s*%"), "Mean Δp")?;
            ValueErr {
                value: v[0],
                err: v[1],
            }
        },
        delta_p_max_pct: dp("Maximum")?,
        delta_p_p99_9_pct: dp(r"99\.9%")?,
        delta_p_p99_pct: dp(r"99\.0%")?,
        delta_p_p95_pct: dp(r"95\.0%")?,
        delta_p_p90_pct: dp(r"90\.0%")?,
        delta_p_p75_pct: dp(r"75\.0%")?,
        delta_p_median_pct: dp("Median")?,
        delta_p_p25_pct: dp(r"25\.0%")?,
        delta_p_p10_pct: dp(r"10\.0%")?,
        delta_p_p5_pct: dp(r"5\.0%")?,
        delta_p_p1_pct: dp(r"1\.0%")?,
        delta_p_p0_1_pct: dp(r"0\.1%")?,
        delta_p_min_pct: dp("Minimum")?,
        rms_delta_p_pct: {
            let v = grab(&format!(r"^RMS Δp\s*:{PM}\s*%"), "RMS Δp")?;
            ValueErr {
                value: v[0],
                err: v[1],
            }
        },
        same_top_pct: {
            let v = grab(&format!(r"^Same top p:{PM}\s*%"), "Same top p")?;
            ValueErr {
                value: v[0],
                err: v[1],
            }
        },
        chunks,
        n_ctx,
        ready_s: ready_seconds(stderr),
    })
}

/// Chunk rows of the running table printed so far (for progress).
pub fn count_rows(stdout: &str) -> usize {
    static ROW: OnceLock<Regex> = OnceLock::new();
    ROW.get_or_init(|| Regex::new(r"(?m)^\s*\d+\s+\S+\s*±").expect("static regex"))
        .find_iter(stdout)
        .count()
}

/// One KL-divergence run of `model` against a base file.
#[derive(Debug, Clone)]
pub struct KlDivergenceRequest {
    pub model: PathBuf,
    /// The file written by `--kl-divergence-base` (by llama.cpp or by kwk-eval).
    pub base: PathBuf,
    /// Must be the context the base file was written with (it is stored in the file).
    pub ctx: usize,
    pub compute: ComputeSettings,
    pub timeout: Duration,
    pub attempts: u32,
}

impl KlDivergenceRequest {
    pub fn command(&self, tools: &LlamaCppTools) -> Result<ToolCommand> {
        self.compute.validate()?;
        if self.ctx < 8 || self.ctx & 1 != 0 {
            return Err(Error::InvalidSettings(format!(
                "context {} must be even and at least 8",
                self.ctx
            )));
        }
        let mut cmd = ToolCommand::new(
            &tools.tool_label(PERPLEXITY),
            tools.perplexity_path(),
            self.timeout,
            "check the base file was written for this model's vocabulary with the same context",
        );
        let ctx = self.ctx.to_string();
        cmd.arg("-m").arg(&self.model);
        cmd.arg("--kl-divergence-base").arg(&self.base);
        cmd.arg("--kl-divergence");
        cmd.args(["-c", &ctx, "-b", &ctx, "-ub"]);
        cmd.arg(self.ctx.min(MAX_UBATCH).to_string());
        cmd.args(self.compute.common_args());
        Ok(cmd)
    }
}

/// A finished KL-divergence run.
#[derive(Debug, Clone)]
pub struct KlDivergenceRun {
    pub stats: KlDivergenceStats,
    pub command: String,
    pub attempts: u32,
    pub elapsed: Duration,
    pub stdout: String,
    pub stderr: String,
}

/// Runs llama-perplexity in KL-divergence mode. `progress(done)` gets the chunk rows
/// printed so far.
pub fn run_kl_divergence(
    tools: &LlamaCppTools,
    req: &KlDivergenceRequest,
    mut progress: impl FnMut(usize),
) -> Result<KlDivergenceRun> {
    if !req.base.is_file() {
        return Err(Error::Io {
            path: req.base.clone(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "KL-divergence base file not found",
            ),
        });
    }
    let cmd = req.command(tools)?;
    let attempts = req.attempts.max(1);
    let mut failure = String::new();
    let mut last = None;
    for attempt in 1..=attempts {
        let out = process::run(&cmd, |so, _| progress(count_rows(so)))?;
        match parse_kl_divergence(&out.stdout, &out.stderr) {
            Ok(stats) => {
                return Ok(KlDivergenceRun {
                    stats,
                    command: out.command,
                    attempts: attempt,
                    elapsed: out.elapsed,
                    stdout: out.stdout,
                    stderr: out.stderr,
                })
            }
            Err(why) => {
                // Errors llama.cpp reported are final; output that merely stops is retried.
                let reported = !error_lines(&out.stderr).is_empty();
                failure = why;
                last = Some(out);
                if reported {
                    break;
                }
            }
        }
    }
    let out = last.expect("at least one attempt ran");
    Err(Error::BadOutput {
        tool: PERPLEXITY.to_string(),
        what: format!("KL-divergence run gave no statistics: {failure}"),
        command: out.command.clone(),
        stderr_tail: out.stderr_tail(),
        hint: "llama.cpp prints the statistics only when at least 100 tokens were scored, and its \
               logger can drop the last lines at exit on a loaded machine (llama.cpp issue \
               22142); check the base file and rerun"
            .to_string(),
    })
}

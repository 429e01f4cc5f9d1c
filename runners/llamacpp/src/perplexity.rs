//! llama-perplexity in its default mode: the command we run and the parser for what it
//! prints (tools/perplexity/perplexity.cpp, "P:" line numbers from the llama-cpp-python
//! 0.3.36 tree; see docs/protocol.md §1 and §3).
//!
//! The command pins `-c CTX -b CTX -ub min(CTX,512)`: with `-b` equal to the context,
//! `n_seq = n_batch/n_ctx = 1`, so every chunk is decoded alone in one batch from an empty
//! KV cache (P:503, P:2012), the same shape an in-tree decoder uses, and `-ub` is llama.cpp's
//! default 512 (one ubatch per chunk up to a context of 512).
//!
//! Where things are printed (common/log.cpp): `LOG()` to stdout without prefix, `LOG_INF`/
//! `LOG_ERR` to stderr with a `M.SS.mmm.uuu I|W|E ` prefix. So:
//! - `[k]x,` running values (P:625): stdout;
//! - `Final estimate: PPL = X +/- Y` (P:646): stderr, and on the same line as the
//!   preceding `... seconds per pass - ETA ` because the ETA's minutes went to stdout;
//! - a too-short text: two `E` lines (P:479-481), no Final line, exit code 0.
//!
//! llama.cpp's logger is asynchronous and deliberately leaked at exit (common/log.cpp
//! `common_log_main`, llama.cpp issue 22142), so the last lines can be lost when the process
//! exits before the log thread runs: seen here in 6 of 30 runs on a loaded machine, where
//! the `Final estimate` line and the last `[k]` value were missing with exit code 0. A run
//! whose output just stops (no Final line, no error line) is therefore retried
//! ([`PerplexityRequest::attempts`]); a missing Final line is never read as a result.
//! `scripts/setup-llama-cpp.sh` also patches llama-perplexity to call `common_log_flush()`
//! before it exits (as common/log.h advises; 0 losses in 20 runs after, against 6 of 10 KL
//! runs before), so the retries matter only for llama.cpp builds from elsewhere.

use crate::error::{Error, Result};
use crate::process::{self, ToolCommand};
use crate::settings::ComputeSettings;
use crate::tools::{Engine, LlamaCppTools, PERPLEXITY};
use regex::Regex;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

/// llama.cpp's default `-ub`, kept as the cap of our ubatch.
pub const MAX_UBATCH: usize = 512;

/// One llama-perplexity run in default mode.
#[derive(Debug, Clone)]
pub struct PerplexityRequest {
    pub model: PathBuf,
    /// Read by llama-perplexity with `-f` (one trailing `\n` stripped, A:1801-1808).
    pub text: PathBuf,
    pub ctx: usize,
    /// `--chunks`; `None` scores every whole chunk.
    pub chunks: Option<usize>,
    pub compute: ComputeSettings,
    pub timeout: Duration,
    /// Runs whose output stops without a Final line or an error are retried this many
    /// times in all (see the module docs). At least 1.
    pub attempts: u32,
    /// Also write llama.cpp's KL-divergence base file (`--kl-divergence-base FILE`). In that
    /// mode llama-perplexity computes each NLL in float (P:91), so the PPL can differ from
    /// the default mode's in the last digits.
    pub save_logits: Option<PathBuf>,
}

impl PerplexityRequest {
    pub fn new(model: PathBuf, text: PathBuf, ctx: usize, compute: ComputeSettings) -> Self {
        Self {
            model,
            text,
            ctx,
            chunks: None,
            compute,
            timeout: Duration::from_secs(3600),
            attempts: 4,
            save_logits: None,
        }
    }

    fn validate(&self) -> Result<()> {
        self.compute.validate()?;
        if self.ctx < 8 || self.ctx & 1 != 0 {
            return Err(Error::InvalidSettings(format!(
                "context {} must be even and at least 8",
                self.ctx
            )));
        }
        if self.chunks == Some(0) {
            return Err(Error::InvalidSettings("--chunks must be at least 1".into()));
        }
        Ok(())
    }

    /// The command that runs.
    pub fn command(&self, tools: &LlamaCppTools) -> Result<ToolCommand> {
        self.validate()?;
        let mut cmd = ToolCommand::new(
            &tools.tool_label(PERPLEXITY),
            tools.perplexity_path(),
            self.timeout,
            "check the GGUF loads in llama.cpp (the stderr above says why not) and that the text \
             file exists and is readable",
        );
        let ctx = self.ctx.to_string();
        cmd.arg("-m").arg(&self.model).arg("-f").arg(&self.text);
        cmd.args(["-c", &ctx, "-b", &ctx, "-ub"]);
        cmd.arg(self.ctx.min(MAX_UBATCH).to_string());
        if let Some(n) = self.chunks {
            cmd.arg("--chunks").arg(n.to_string());
        }
        cmd.args(self.compute.common_args());
        if tools.engine() == Engine::Ik {
            cmd.args(crate::ik::PERPLEXITY_SPEED_ARGS);
        }
        if let Some(f) = &self.save_logits {
            cmd.arg("--kl-divergence-base").arg(f);
        }
        Ok(cmd)
    }
}

/// What llama-perplexity printed, parsed.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PerplexityOutput {
    /// `Final estimate: PPL = X`.
    pub ppl: f64,
    /// `+/- Y`: llama.cpp's standard error of the PPL.
    pub ppl_err: f64,
    /// The cumulative PPL after chunk k at index k-1 (`[k]x,`).
    pub running: Vec<f64>,
    /// From `calculating perplexity over N chunks, n_ctx=C, batch_size=B, n_seq=S`.
    pub chunks: Option<usize>,
    pub n_ctx: Option<usize>,
    pub batch_size: Option<usize>,
    pub n_seq: Option<usize>,
    /// Seconds from start to the `system_info:` line: model loaded, context made, llama.cpp's
    /// warm-up decode done (from the log timestamps).
    pub ready_s: Option<f64>,
    /// `perplexity: X seconds per pass`.
    pub seconds_per_pass: Option<f64>,
    /// The CPU features this llama.cpp build was compiled with, as its `system_info:` line
    /// names them (`CPU : SSE3 = 1 | AVX2 = 1 | ...`, the ones set to 1, in its order): the
    /// kernels it can run.
    pub cpu_features: Option<Vec<String>>,
}

/// Why a llama-perplexity output holds no result.
#[derive(Debug, Clone, PartialEq)]
pub enum PerplexityProblem {
    /// `you need at least N tokens ... tokenizes to only M tokens` (P:479-481).
    TooShort {
        needed: usize,
        ctx: usize,
        got: Option<usize>,
    },
    /// Error-level lines (`E`), e.g. a failed decode or `Unexpected negative standard
    /// deviation of log(prob)` (P:649).
    Reported(Vec<String>),
    /// No Final line and no error: the output stops (the logger lost its last lines).
    Truncated,
    /// Something is there but not in the form expected.
    Malformed(String),
}

fn re(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).expect("static regex"))
}

/// `M.SS.mmm.uuu` (common/log.cpp: minutes, seconds, milliseconds, microseconds).
pub(crate) fn timestamp_seconds(m: &str, s: &str, ms: &str, us: &str) -> Option<f64> {
    let m: f64 = m.parse().ok()?;
    let s: f64 = s.parse().ok()?;
    let ms: f64 = ms.parse().ok()?;
    let us: f64 = us.parse().ok()?;
    Some(m * 60.0 + s + ms / 1e3 + us / 1e6)
}

/// Error-level log lines (`M.SS.mmm.uuu E msg`), message only. Not anchored at the line
/// start: a line can follow the unterminated `... ETA ` text, as `Final estimate` does.
pub(crate) fn error_lines(stderr: &str) -> Vec<String> {
    static E: OnceLock<Regex> = OnceLock::new();
    re(&E, r"(?m)(?:^|\s)\d+\.\d{2}\.\d{3}\.\d{3} E (.*)$")
        .captures_iter(stderr)
        .map(|c| c[1].trim_end().to_string())
        .collect()
}

/// Seconds to the `system_info:` line.
pub(crate) fn ready_seconds(stderr: &str) -> Option<f64> {
    static READY: OnceLock<Regex> = OnceLock::new();
    let c = re(&READY, r"(?m)^(\d+)\.(\d+)\.(\d+)\.(\d+) I system_info:").captures(stderr)?;
    timestamp_seconds(&c[1], &c[2], &c[3], &c[4])
}

/// The `[k]x,` values in order; an error if the numbering is not 1, 2, 3, ...
pub fn parse_running(stdout: &str) -> std::result::Result<Vec<f64>, PerplexityProblem> {
    static RUNNING: OnceLock<Regex> = OnceLock::new();
    let mut values = Vec::new();
    for c in re(&RUNNING, r"\[(\d+)\]([0-9A-Za-z.+-]+),").captures_iter(stdout) {
        let k: usize = c[1]
            .parse()
            .map_err(|_| PerplexityProblem::Malformed(format!("chunk number `{}`", &c[1])))?;
        if k != values.len() + 1 {
            return Err(PerplexityProblem::Malformed(format!(
                "running values out of order: [{k}] after {} values",
                values.len()
            )));
        }
        let v: f64 = c[2].parse().map_err(|_| {
            PerplexityProblem::Malformed(format!("running value `{}` of chunk {k}", &c[2]))
        })?;
        values.push(v);
    }
    Ok(values)
}

/// Number of `[k]x,` values printed so far (for progress while the tool runs).
pub fn count_running(stdout: &str) -> usize {
    parse_running(stdout).map(|v| v.len()).unwrap_or(0)
}

/// The features set to 1 in the `CPU :` part of the `system_info:` line
/// (`llama_print_system_info`: `BACKEND : NAME = 1 | NAME = 1 | ...` per backend), in
/// order; `None` without that line or part.
pub(crate) fn cpu_features(stderr: &str) -> Option<Vec<String>> {
    let line = stderr.lines().find(|l| l.contains("system_info:"))?;
    let cpu = line.split_once("CPU :")?.1;
    // The next backend's part (`| NAME : ...`) ends the CPU's.
    let features = cpu
        .split('|')
        .take_while(|part| !part.contains(':'))
        .filter_map(|part| {
            let (name, value) = part.split_once('=')?;
            let name = name.trim();
            (value.trim() == "1" && !name.is_empty() && !name.contains(' '))
                .then(|| name.to_string())
        })
        .collect();
    Some(features)
}

/// The too-short problem when stderr says the text is too short (P:479-481; the same words
/// in ik_llama.cpp).
pub(crate) fn too_short(stderr: &str) -> Option<PerplexityProblem> {
    static NEED: OnceLock<Regex> = OnceLock::new();
    static ONLY: OnceLock<Regex> = OnceLock::new();
    let c = re(
        &NEED,
        r"you need at least (\d+) tokens to evaluate perplexity with a context of (\d+)",
    )
    .captures(stderr)?;
    let got = re(
        &ONLY,
        r"the data file you provided tokenizes to only (\d+) tokens",
    )
    .captures(stderr)
    .and_then(|g| g[1].parse().ok());
    Some(PerplexityProblem::TooShort {
        needed: c[1].parse().unwrap_or(0),
        ctx: c[2].parse().unwrap_or(0),
        got,
    })
}

/// Parses a run of `engine`'s llama-perplexity: [`parse_perplexity`] for llama.cpp,
/// [`parse_perplexity_ik`] for ik_llama.cpp.
pub fn parse_perplexity_of(
    engine: Engine,
    stdout: &str,
    stderr: &str,
) -> std::result::Result<PerplexityOutput, PerplexityProblem> {
    match engine {
        Engine::LlamaCpp => parse_perplexity(stdout, stderr),
        Engine::Ik => parse_perplexity_ik(stdout, stderr),
    }
}

/// Parses a default-mode run of mainline llama.cpp. `Final estimate` is required; the
/// running values must number exactly the chunks llama-perplexity announced.
pub fn parse_perplexity(
    stdout: &str,
    stderr: &str,
) -> std::result::Result<PerplexityOutput, PerplexityProblem> {
    static FINAL: OnceLock<Regex> = OnceLock::new();
    static OVER: OnceLock<Regex> = OnceLock::new();
    static PASS: OnceLock<Regex> = OnceLock::new();

    if let Some(short) = too_short(stderr) {
        return Err(short);
    }
    let errors = error_lines(stderr);
    // P:646: LOG_INF("Final estimate: PPL = %.4lf +/- %.5lf\n", ...). Searched, not
    // anchored: it follows the timestamp and usually the ETA text on the same line.
    let fin = re(
        &FINAL,
        r"Final estimate: PPL = ([0-9A-Za-z.+-]+) \+/- ([0-9A-Za-z.+-]+)",
    )
    .captures(stderr);
    let Some(fin) = fin else {
        return Err(if errors.is_empty() {
            PerplexityProblem::Truncated
        } else {
            PerplexityProblem::Reported(errors)
        });
    };
    if !errors.is_empty() {
        return Err(PerplexityProblem::Reported(errors));
    }
    let (ppl, ppl_err) = final_estimate(&fin[1], &fin[2])?;
    let running = parse_running(stdout)?;
    // P:515.
    let over = re(
        &OVER,
        r"calculating perplexity over (\d+) chunks, n_ctx=(\d+), batch_size=(\d+), n_seq=(\d+)",
    )
    .captures(stderr);
    let field = |i: usize| over.as_ref().and_then(|c| c[i].parse::<usize>().ok());
    let chunks = field(1);
    if let Some(n) = chunks {
        if running.len() != n {
            return Err(PerplexityProblem::Malformed(format!(
                "{} running values for {n} chunks",
                running.len()
            )));
        }
    }
    if let Some(last) = running.last() {
        // The last running value is the Final PPL printed with the same %.4lf.
        if (last - ppl).abs() > 1e-4 * ppl.abs().max(1.0) {
            return Err(PerplexityProblem::Malformed(format!(
                "last running value {last} differs from Final estimate {ppl}"
            )));
        }
    }
    let seconds_per_pass = re(&PASS, r"perplexity: ([0-9.]+) seconds per pass")
        .captures(stderr)
        .and_then(|c| c[1].parse().ok());
    Ok(PerplexityOutput {
        ppl,
        ppl_err,
        running,
        chunks,
        n_ctx: field(2),
        batch_size: field(3),
        n_seq: field(4),
        ready_s: ready_seconds(stderr),
        seconds_per_pass,
        cpu_features: cpu_features(stderr),
    })
}

/// The Final estimate's PPL and uncertainty from their printed text: both must parse and
/// be finite (both engines' parsers).
fn final_estimate(ppl: &str, err: &str) -> std::result::Result<(f64, f64), PerplexityProblem> {
    let number = |s: &str, what: &str| {
        s.parse::<f64>()
            .map_err(|_| PerplexityProblem::Malformed(format!("{what} `{s}`")))
    };
    let (ppl, ppl_err) = (
        number(ppl, "Final estimate PPL")?,
        number(err, "Final estimate uncertainty")?,
    );
    if !ppl.is_finite() || !ppl_err.is_finite() {
        return Err(PerplexityProblem::Malformed(format!(
            "Final estimate is not finite: PPL = {ppl} +/- {ppl_err}"
        )));
    }
    Ok((ppl, ppl_err))
}

/// Parses an ik_llama.cpp llama-perplexity run ([`crate::ik`] says how its output differs) (default mode, or the one writing a
/// KL-divergence base file). The Final line is required; the running values must number
/// the chunks announced, and the last one must be the Final PPL.
pub fn parse_perplexity_ik(
    stdout: &str,
    stderr: &str,
) -> std::result::Result<PerplexityOutput, PerplexityProblem> {
    static FINAL: OnceLock<Regex> = OnceLock::new();
    static OVER: OnceLock<Regex> = OnceLock::new();
    static PASS: OnceLock<Regex> = OnceLock::new();
    if let Some(short) = too_short(stderr) {
        return Err(short);
    }
    let errors = crate::ik::error_lines(stdout, stderr);
    let fin = re(
        &FINAL,
        r"Final estimate: PPL over (\d+) chunks for n_ctx=(\d+) = ([0-9A-Za-z.+-]+) \+/- ([0-9A-Za-z.+-]+)",
    )
    .captures(stdout);
    let Some(fin) = fin else {
        return Err(if errors.is_empty() {
            PerplexityProblem::Truncated
        } else {
            PerplexityProblem::Reported(errors)
        });
    };
    if !errors.is_empty() {
        return Err(PerplexityProblem::Reported(errors));
    }
    let (ppl, ppl_err) = final_estimate(&fin[3], &fin[4])?;
    let final_chunks: usize = fin[1]
        .parse()
        .map_err(|_| PerplexityProblem::Malformed(format!("chunk count `{}`", &fin[1])))?;
    let final_ctx: usize = fin[2]
        .parse()
        .map_err(|_| PerplexityProblem::Malformed(format!("n_ctx `{}`", &fin[2])))?;
    let running = parse_running(stdout)?;
    if running.len() != final_chunks {
        return Err(PerplexityProblem::Malformed(format!(
            "{} running values for the {final_chunks} chunks of the Final estimate",
            running.len()
        )));
    }
    let over = re(
        &OVER,
        r"calculating perplexity over (\d+) chunks, n_ctx=(\d+), batch_size=(\d+), n_seq=(\d+)",
    )
    .captures(stderr);
    let field = |i: usize| over.as_ref().and_then(|c| c[i].parse::<usize>().ok());
    if field(1).is_some_and(|n| n != final_chunks) || field(2).is_some_and(|c| c != final_ctx) {
        return Err(PerplexityProblem::Malformed(format!(
            "the Final estimate is over {final_chunks} chunks of {final_ctx}, the run announced {:?} of {:?}",
            field(1),
            field(2)
        )));
    }
    if let Some(last) = running.last() {
        if (last - ppl).abs() > 1e-4 * ppl.abs().max(1.0) {
            return Err(PerplexityProblem::Malformed(format!(
                "last running value {last} differs from Final estimate {ppl}"
            )));
        }
    }
    let seconds_per_pass = re(&PASS, r"perplexity: ([0-9.]+) seconds per pass")
        .captures(stderr)
        .and_then(|c| c[1].parse().ok());
    Ok(PerplexityOutput {
        ppl,
        ppl_err,
        running,
        chunks: Some(final_chunks),
        n_ctx: Some(final_ctx),
        batch_size: field(3),
        n_seq: field(4),
        // Its log lines carry no timestamps.
        ready_s: None,
        seconds_per_pass,
        cpu_features: crate::ik::cpu_features(stderr),
    })
}

/// A finished run: the parsed output and how it was obtained.
#[derive(Debug, Clone)]
pub struct PerplexityRun {
    pub output: PerplexityOutput,
    /// The command line.
    pub command: String,
    /// Runs it took (more than 1 when llama.cpp's logger lost the end of the output).
    pub attempts: u32,
    pub elapsed: Duration,
    pub stdout: String,
    pub stderr: String,
    /// Peak RSS of the llama-perplexity process that gave the result (`ToolOutput`).
    pub max_rss_bytes: Option<u64>,
}

const LOST_OUTPUT_HINT: &str = "llama.cpp's logger drops its last lines when the process exits \
before its log thread runs (llama.cpp issue 22142), more often on a loaded machine; rerun, or \
raise the number of attempts";

/// Runs llama-perplexity and parses its result. `progress(done, total)` is called with the
/// chunks finished so far (`total` once llama-perplexity announced it).
pub fn run_perplexity(
    tools: &LlamaCppTools,
    req: &PerplexityRequest,
    mut progress: impl FnMut(usize),
) -> Result<PerplexityRun> {
    let cmd = req.command(tools)?;
    let attempts = req.attempts.max(1);
    let mut last = None;
    for attempt in 1..=attempts {
        let out = process::run(&cmd, |so, _| progress(count_running(so)))?;
        match parse_perplexity_of(tools.engine(), &out.stdout, &out.stderr) {
            Ok(output) => {
                return Ok(PerplexityRun {
                    output,
                    command: out.command,
                    attempts: attempt,
                    elapsed: out.elapsed,
                    stdout: out.stdout,
                    stderr: out.stderr,
                    max_rss_bytes: out.max_rss_bytes,
                })
            }
            Err(PerplexityProblem::Truncated) => last = Some(out),
            Err(problem) => return Err(problem_error(problem, req, &out, tools)),
        }
    }
    let out = last.expect("at least one attempt ran");
    Err(Error::BadOutput {
        tool: tools.tool_label(PERPLEXITY),
        what: format!(
            "no `Final estimate` line and no error in {attempts} run(s) (exit code 0); a result \
             is never guessed from partial output"
        ),
        command: out.command.clone(),
        stderr_tail: out.stderr_tail(),
        hint: format!(
            "{LOST_OUTPUT_HINT}. If the text is short, check it has at least 2*ctx = {} tokens",
            2 * req.ctx
        ),
    })
}

fn problem_error(
    problem: PerplexityProblem,
    req: &PerplexityRequest,
    out: &process::ToolOutput,
    tools: &LlamaCppTools,
) -> Error {
    let (what, hint) = match problem {
        PerplexityProblem::TooShort { needed, ctx, got } => {
            return Error::TextTooShort {
                text: req.text.clone(),
                ctx,
                needed,
                got,
            }
        }
        PerplexityProblem::Reported(lines) => (
            format!("reported errors and no result: {}", lines.join(" | ")),
            "see the error lines; a failed decode usually means the GGUF or the settings \
             (context, KV type) are not supported by this llama.cpp build"
                .to_string(),
        ),
        PerplexityProblem::Truncated => (
            "output ended without a Final estimate".to_string(),
            LOST_OUTPUT_HINT.to_string(),
        ),
        PerplexityProblem::Malformed(m) => (
            format!("unexpected output: {m}"),
            format!(
                "this {} prints something the parser does not know; check its version ({})",
                tools.engine().project(),
                tools.engine().setup_script()
            ),
        ),
    };
    Error::BadOutput {
        tool: tools.tool_label(PERPLEXITY),
        what,
        command: out.command.clone(),
        stderr_tail: out.stderr_tail(),
        hint,
    }
}

#[cfg(test)]
mod tests {
    use super::cpu_features;

    #[test]
    fn cpu_features_keep_the_cpu_part_set_to_one() {
        let line = "0.01.080.072 I system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : \
                    SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 0 | FMA = 1 | REPACK = 1 | \
                    Metal : EMBED_LIBRARY = 1 | BF16 = 1 | ";
        let stderr = format!("load: something\n{line}\nmain: done\n");
        assert_eq!(
            cpu_features(&stderr).unwrap(),
            ["SSE3", "AVX", "AVX2", "FMA", "REPACK"]
        );
        assert_eq!(cpu_features("no such line\n"), None);
        assert_eq!(
            cpu_features("system_info: n_threads = 2 | CPU : | \n"),
            Some(vec![])
        );
    }
}

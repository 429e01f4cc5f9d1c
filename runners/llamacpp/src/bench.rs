//! llama-bench: the command (every result-changing setting pinned) and the parser for its
//! `-o json` output (tools/llama-bench/llama-bench.cpp B:1598-1635, B:1799-1830;
//! docs/protocol.md §4).
//!
//! Definitions (B:2168-2222, B:1564-1572): pp = `-p N` random tokens from an empty cache,
//! tg = `-n N` single-token decodes from an empty cache; at a depth `-d D` (B:2441-2478)
//! each repetition first prefills D tokens, untimed (the JSON's `n_depth`; `-d` is passed
//! only when D is not 0, so a run at depth 0 is the command it always was); one untimed
//! warm-up, then `-r`
//! repetitions; `avg_ts` is the mean of the per-repetition tokens/s and `stddev_ts` their
//! sample (n−1) standard deviation. Both tests run in one invocation (`-p PP -n TG`: every pp
//! test, then every tg test, B:1355-1467), at each flash-attention setting asked for: `-fa`
//! takes a list (`-fa 0,1`, in both llama-benches' `--help`: "Multiple values can be given
//! for each parameter by separating them with ','"), each object's `flash_attn` says which
//! (mainline prints it as a number, 0.3.36's `-fa 0,1` gives 0 and 1; ik_llama.cpp as a
//! boolean).
//!
//! The JSON is printed with `printf` (not llama.cpp's asynchronous logger), so it is
//! complete when the process exits. It is parsed tolerantly: unknown fields are ignored, and
//! each object is kept whole as a `serde_json::Value` for the report.

use crate::error::{Error, Result};
use crate::process::{self, ToolCommand};
use crate::settings::{fa_list, ComputeSettings, KvType};
use crate::tools::{Engine, LlamaCppTools, BENCH};
use regex::Regex;
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

/// llama-bench's default `-b`, pinned.
pub const BENCH_BATCH: usize = 2048;
/// llama-bench's default `-ub`, pinned.
pub const BENCH_UBATCH: usize = 512;

/// One llama-bench run.
#[derive(Debug, Clone)]
pub struct BenchRequest {
    pub model: PathBuf,
    /// `-p`: prompt tokens (0 = no pp test).
    pub pp: usize,
    /// `-n`: generated tokens (0 = no tg test).
    pub tg: usize,
    /// `-d`: tokens prefilled, untimed, before each repetition (0 = none, no `-d` passed).
    pub depth: usize,
    /// `-r`.
    pub reps: usize,
    /// llama-bench's `-ctk/-ctv` accept f16, bf16, q8_0 (and smaller), **not f32**
    /// (B:496-523 `ggml_type_from_name`); an f32 KV type is rejected here.
    pub compute: ComputeSettings,
    /// The `-fa` values measured, in one invocation, each test once per value
    /// ([`crate::settings::BenchFlashAttn::settings`]); empty: `compute.flash_attn` alone.
    pub flash_attn: Vec<bool>,
    pub timeout: Duration,
}

impl BenchRequest {
    /// The `-fa` values this run measures, in order.
    pub fn fa_settings(&self) -> Vec<bool> {
        if self.flash_attn.is_empty() {
            vec![self.compute.flash_attn]
        } else {
            self.flash_attn.clone()
        }
    }

    pub fn command(&self, tools: &LlamaCppTools) -> Result<ToolCommand> {
        self.compute.validate()?;
        let fa = self.fa_settings();
        if (1..fa.len()).any(|i| fa[..i].contains(&fa[i])) {
            return Err(Error::InvalidSettings(format!(
                "-fa {} names a setting twice",
                fa_list(&fa)
            )));
        }
        if fa.contains(&false) && !self.compute.kv_type.allows_flash_attn_off() {
            return Err(Error::InvalidSettings(format!(
                "a {} KV cache needs flash attention on; llama-bench cannot run it with -fa 0",
                self.compute.kv_type
            )));
        }
        if self.compute.kv_type == KvType::F32 {
            return Err(Error::InvalidSettings(
                "llama-bench does not accept an f32 KV cache (-ctk f32); use f16".into(),
            ));
        }
        if self.pp == 0 && self.tg == 0 {
            return Err(Error::InvalidSettings(
                "llama-bench needs a prompt (pp) or a generation (tg) length above 0".into(),
            ));
        }
        if self.reps == 0 {
            return Err(Error::InvalidSettings(
                "repetitions must be at least 1".into(),
            ));
        }
        let mut cmd = ToolCommand::new(
            &tools.tool_label(BENCH),
            tools.bench_path(),
            self.timeout,
            "check the GGUF loads in llama.cpp (the stderr above says why not)",
        );
        let kv = self.compute.kv_type.as_str();
        cmd.arg("-m").arg(&self.model);
        cmd.args(["-p", &self.pp.to_string(), "-n", &self.tg.to_string()]);
        if self.depth > 0 {
            // Never a run at depth 0 recorded as one at depth D.
            if !tools.bench_knows_depth() {
                return Err(Error::InvalidSettings(format!(
                    "{} has no -d (--n-depth), so it cannot time a test at depth {}",
                    tools.tool_label(BENCH),
                    self.depth
                )));
            }
            cmd.args(["-d", &self.depth.to_string()]);
        }
        cmd.args(["-r", &self.reps.to_string()]);
        cmd.args(["-t", &self.compute.threads.to_string(), "-ngl", "0"]);
        // `-fa 1|0` (or the list `0,1`): accepted by every llama-bench (older ones take only
        // 0/1; newer ones also on/off/auto, via common_arg_utils::is_truthy/is_falsey,
        // B:865-890).
        cmd.args(["-fa", &fa_list(&fa)]);
        cmd.args(["-ctk", kv, "-ctv", kv]);
        cmd.args([
            "-b",
            &BENCH_BATCH.to_string(),
            "-ub",
            &BENCH_UBATCH.to_string(),
        ]);
        match tools.engine() {
            Engine::LlamaCpp => {
                cmd.args(["-o", "json", "--progress"]);
            }
            // ik_llama.cpp's llama-bench has no --progress; its speed settings.
            Engine::Ik => {
                cmd.args(crate::ik::BENCH_SPEED_ARGS);
                cmd.args(["-o", "json"]);
            }
        }
        Ok(cmd)
    }
}

/// The fields of one llama-bench JSON object this crate reads; everything else is kept in
/// [`BenchTest::raw`].
#[derive(Debug, Clone, Deserialize)]
struct BenchRecord {
    n_prompt: u64,
    n_gen: u64,
    #[serde(default)]
    n_depth: u64,
    avg_ts: f64,
    stddev_ts: f64,
    samples_ts: Vec<f64>,
    #[serde(default)]
    samples_ns: Vec<u64>,
}

/// One test (pp or tg) of a llama-bench run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BenchTest {
    pub n_prompt: u64,
    pub n_gen: u64,
    /// Tokens in the cache before the timed test (`n_depth`; 0 when the field is absent).
    pub n_depth: u64,
    /// Its flash-attention setting (`flash_attn`: 0/1 in mainline's JSON, a boolean in
    /// ik_llama.cpp's; `None` when the field is absent).
    pub flash_attn: Option<bool>,
    /// Mean tokens/s over repetitions (llama-bench's `avg_ts`).
    pub avg_ts: f64,
    /// Sample standard deviation of tokens/s (`stddev_ts`).
    pub stddev_ts: f64,
    /// Tokens/s of each repetition (`samples_ts`, printed to 6 significant digits).
    pub samples_ts: Vec<f64>,
    /// Nanoseconds of each repetition (`samples_ns`).
    pub samples_ns: Vec<u64>,
    /// The whole JSON object as printed.
    pub raw: serde_json::Value,
}

/// A parsed llama-bench run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BenchOutput {
    /// The prompt-processing tests (`n_prompt > 0, n_gen == 0`), one per flash-attention
    /// setting, in order.
    pub pp: Vec<BenchTest>,
    /// The generation tests (`n_prompt == 0, n_gen > 0`), likewise.
    pub tg: Vec<BenchTest>,
    /// Every object as printed, in order.
    pub raw: Vec<serde_json::Value>,
}

impl BenchOutput {
    /// The pp test at flash-attention setting `fa` (`None`: the only pp test).
    pub fn pp_at(&self, fa: Option<bool>) -> Option<&BenchTest> {
        at(&self.pp, fa)
    }

    /// The tg test at flash-attention setting `fa` (`None`: the only tg test).
    pub fn tg_at(&self, fa: Option<bool>) -> Option<&BenchTest> {
        at(&self.tg, fa)
    }
}

fn at(tests: &[BenchTest], fa: Option<bool>) -> Option<&BenchTest> {
    match (fa, tests) {
        (None, [t]) => Some(t),
        (None, _) => None,
        (Some(fa), _) => tests.iter().find(|t| t.flash_attn == Some(fa)),
    }
}

/// `flash_attn` as either llama-bench prints it: a boolean, or the number 0 or 1.
fn flash_attn_of(obj: &serde_json::Value) -> std::result::Result<Option<bool>, String> {
    match obj.get("flash_attn") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => match v.as_i64() {
            Some(0) => Ok(Some(false)),
            Some(1) => Ok(Some(true)),
            _ => Err(format!("`flash_attn` is {v}, not 0, 1, true or false")),
        },
    }
}

/// Parses `llama-bench -o json` stdout.
pub fn parse_bench_json(stdout: &str) -> std::result::Result<BenchOutput, String> {
    let start = stdout.find('[').ok_or("no JSON array on stdout")?;
    let end = stdout.rfind(']').ok_or("the JSON array is not closed")?;
    if end < start {
        return Err("the JSON array is not closed".into());
    }
    let raw: Vec<serde_json::Value> =
        serde_json::from_str(&stdout[start..=end]).map_err(|e| format!("invalid JSON: {e}"))?;
    let mut pp: Vec<BenchTest> = Vec::new();
    let mut tg: Vec<BenchTest> = Vec::new();
    for (i, obj) in raw.iter().enumerate() {
        let r: BenchRecord = serde_json::from_value(obj.clone())
            .map_err(|e| format!("object {i} lacks a field this parser needs: {e}"))?;
        if !r.avg_ts.is_finite() || !r.stddev_ts.is_finite() {
            return Err(format!("object {i} has a non-finite avg_ts/stddev_ts"));
        }
        let test = BenchTest {
            n_prompt: r.n_prompt,
            n_gen: r.n_gen,
            n_depth: r.n_depth,
            flash_attn: flash_attn_of(obj).map_err(|e| format!("object {i}: {e}"))?,
            avg_ts: r.avg_ts,
            stddev_ts: r.stddev_ts,
            samples_ts: r.samples_ts,
            samples_ns: r.samples_ns,
            raw: obj.clone(),
        };
        let slot = match (r.n_prompt > 0, r.n_gen > 0) {
            (true, false) => &mut pp,
            (false, true) => &mut tg,
            _ => {
                return Err(format!(
                    "object {i} is a combined or empty test (n_prompt {}, n_gen {})",
                    r.n_prompt, r.n_gen
                ))
            }
        };
        if slot.iter().any(|t| t.flash_attn == test.flash_attn) {
            return Err(format!("more than one test like object {i}"));
        }
        slot.push(test);
    }
    Ok(BenchOutput { pp, tg, raw })
}

/// Checks the parsed output is the run that was asked for, by `engine`'s llama-bench (for
/// ik_llama.cpp also its speed settings, [`crate::ik::check_bench_settings`]).
pub fn check_matches(
    out: &BenchOutput,
    req: &BenchRequest,
    engine: Engine,
) -> std::result::Result<(), String> {
    let settings = req.fa_settings();
    for (want, got, name) in [(req.pp, &out.pp, "pp"), (req.tg, &out.tg, "tg")] {
        if want == 0 {
            if !got.is_empty() {
                return Err(format!("an unexpected {name} test"));
            }
            continue;
        }
        if got.len() > settings.len() {
            return Err(format!(
                "{} {name} tests, asked for -fa {}",
                got.len(),
                fa_list(&settings)
            ));
        }
        for &fa in &settings {
            // A run of one setting may print no `flash_attn`; several must say which is which.
            let found = at(got, Some(fa)).or_else(|| {
                (settings.len() == 1)
                    .then(|| at(got, None).filter(|t| t.flash_attn.is_none()))
                    .flatten()
            });
            match (want, found) {
                (_, None) => return Err(format!("no {name}{want} test at -fa {}", fa_list(&[fa]))),
                (n, Some(t)) => {
                    let len = if name == "pp" { t.n_prompt } else { t.n_gen };
                    if len != n as u64 {
                        return Err(format!("{name} test of {len} tokens, asked for {n}"));
                    }
                    if t.n_depth != req.depth as u64 {
                        return Err(format!(
                            "{name} test at depth {}, asked for depth {}",
                            t.n_depth, req.depth
                        ));
                    }
                    if t.samples_ts.len() != req.reps {
                        return Err(format!(
                            "{name} test has {} samples, asked for {} repetitions",
                            t.samples_ts.len(),
                            req.reps
                        ));
                    }
                    let threads = t.raw.get("n_threads").and_then(|v| v.as_u64());
                    if threads.is_some_and(|th| th != req.compute.threads as u64) {
                        return Err(format!(
                            "{name} test ran with {threads:?} threads, asked for {}",
                            req.compute.threads
                        ));
                    }
                    if engine == Engine::Ik {
                        crate::ik::check_bench_settings(&t.raw, fa)
                            .map_err(|e| format!("{name} test: {e}"))?;
                    }
                    let type_k = t.raw.get("type_k").and_then(|v| v.as_str());
                    if type_k.is_some_and(|k| k != req.compute.kv_type.as_str()) {
                        return Err(format!(
                            "{name} test used KV type {type_k:?}, asked for {}",
                            req.compute.kv_type
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Repetitions started so far, from `--progress` lines on stderr (`llama-bench: benchmark
/// 1/2: prompt run 2/3`).
pub fn count_progress(stderr: &str) -> usize {
    static RUN: OnceLock<Regex> = OnceLock::new();
    RUN.get_or_init(|| {
        Regex::new(r"(?m)benchmark \d+/\d+: (?:prompt|generation) run \d+/\d+")
            .expect("static regex")
    })
    .find_iter(stderr)
    .count()
}

/// A finished llama-bench run.
#[derive(Debug, Clone)]
pub struct BenchRun {
    pub output: BenchOutput,
    pub command: String,
    pub elapsed: Duration,
}

/// Runs llama-bench. `progress(started, total)` gets repetitions started / total.
pub fn run_bench(
    tools: &LlamaCppTools,
    req: &BenchRequest,
    mut progress: impl FnMut(usize, usize),
) -> Result<BenchRun> {
    let cmd = req.command(tools)?;
    let total =
        req.reps * (usize::from(req.pp > 0) + usize::from(req.tg > 0)) * req.fa_settings().len();
    let out = process::run(&cmd, |_, se| progress(count_progress(se), total))?;
    let bad = |what: String| Error::BadOutput {
        tool: tools.tool_label(BENCH),
        what,
        command: out.command.clone(),
        stderr_tail: out.stderr_tail(),
        hint: format!(
            "this {} llama-bench printed something the parser does not expect; check its \
             version ({})",
            tools.engine().project(),
            tools.engine().setup_script()
        ),
    };
    let output = parse_bench_json(&out.stdout).map_err(&bad)?;
    check_matches(&output, req, tools.engine()).map_err(&bad)?;
    Ok(BenchRun {
        output,
        command: out.command.clone(),
        elapsed: out.elapsed,
    })
}

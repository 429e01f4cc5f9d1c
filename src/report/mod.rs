//! The one result type every exporter reads ([`Results`], written as results.json) and the
//! exporters: JSON, CSV, Markdown, plots, the terminal table, and the regression gate.
//!
//! Every runner row has the same fields; a figure that was not measured is `null`, never
//! a made-up value. Units are in the field names. `complete` is false until the last
//! runner has finished, so a run that was interrupted says so in every file it left.
//! Files are written to a temporary name and renamed, so a reader never sees half a file.

pub mod csv;
pub mod json;
pub mod markdown;
pub mod plot;
pub mod regress;
pub mod terminal;

use crate::runner::{PerplexityResult, RunnerInfo, SpeedResult};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Bumped when a field changes meaning.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Results {
    pub schema_version: u32,
    /// False while the run is going (or if it was interrupted).
    pub complete: bool,
    /// UTC start time, RFC 3339.
    pub started_utc: String,
    /// The model as given to `--llm`.
    pub model: String,
    pub machine: Machine,
    pub versions: Versions,
    pub protocol: Protocol,
    /// The runner the `ppl_delta_pct` column is relative to (float32 when it ran).
    pub ppl_delta_reference: Option<String>,
    pub runners: Vec<RunnerRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    pub cpu: String,
    /// CPU features the in-tree kernels care about that this CPU has.
    pub isa: Vec<String>,
    /// The kernel tier the in-tree decoder ran with (`KWK_ISA` respected) and what each
    /// kind of weight runs on it, e.g. "avx512bw: float32 avx512f, bf16 avx512f (convert),
    /// int8/int4 avx512bw" (each kwk row's `kernels` says which its matmuls ran).
    #[serde(default)]
    pub kernels: Option<String>,
    pub threads: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Versions {
    /// Git commit of the kwk tree the harness was built from (null when unknown).
    pub kwk: Option<String>,
    pub kwk_eval: String,
    /// llama.cpp build number of the tools used (null when no GGUF runner ran, or when
    /// the tools were built outside a git checkout and report build 0).
    pub llama_cpp: Option<u64>,
    /// The tools' `--version` line as printed (null when no GGUF runner ran).
    #[serde(default)]
    pub llama_cpp_version: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Protocol {
    pub ctx: usize,
    pub chunks: usize,
    pub scored_tokens: usize,
    /// Tokens of the whole text (BOS included).
    pub text_tokens: usize,
    pub add_bos: bool,
    /// The text file's name and the SHA-256 of its bytes.
    pub text: String,
    pub text_sha256: String,
    pub pp: usize,
    pub tg: usize,
    pub reps: usize,
    /// Whether KL divergence against the float32 reference was computed.
    pub kld: bool,
    /// Whether speed was measured (false with `--no-speed`).
    #[serde(default = "default_true")]
    pub speed: bool,
    /// The calibration text of `int4:calib` / `int4:gptq` rows (null when none ran).
    #[serde(default)]
    pub calibration: Option<Calibration>,
}

/// What the calibrated formats were fitted on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Calibration {
    /// The `--calib-text` file's name and the SHA-256 of its bytes.
    pub text: String,
    pub text_sha256: String,
    /// `--calib-range START:END` (tokens of the calibration text), when given.
    pub range: Option<String>,
    /// Tokens passed to the decoder (after the range and the cap).
    pub tokens: usize,
    /// Tokens the decoder's calibration passes read (at most its own cap).
    pub tokens_used: usize,
    /// Calibrated on the scored text (`--calib-on-eval`): those rows are flattered.
    pub on_eval: bool,
}

fn default_true() -> bool {
    true
}

/// One row: what the runner is and what was measured. `null` where not measured.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct RunnerRecord {
    pub name: String,
    pub engine: String,
    pub bytes: Option<u64>,
    pub bits_per_weight: Option<f64>,
    pub params: Option<u64>,
    pub type_mix: BTreeMap<String, usize>,
    pub kv_type: Option<String>,
    /// The kernels this row's weight matmuls ran (kwk rows, e.g. `avx512bw`; null for
    /// llama.cpp rows, which use their own best kernels for the CPU).
    #[serde(default)]
    pub kernels: Option<String>,
    pub ppl: Option<f64>,
    pub ppl_err: Option<f64>,
    pub ppl_delta_pct: Option<f64>,
    pub running_ppl: Vec<f64>,
    pub scored_tokens: Option<usize>,
    /// Whether the engine tokenized the text to the harness's ids (null: not checked).
    pub tokens_match: Option<bool>,
    pub kld_mean: Option<f64>,
    pub kld_mean_err: Option<f64>,
    pub kld_p99: Option<f64>,
    pub top1_agreement: Option<f64>,
    pub delta_p_rms: Option<f64>,
    pub pp_tokens_per_s: Option<f64>,
    pub pp_tokens_per_s_std: Option<f64>,
    pub pp_samples_tokens_per_s: Vec<f64>,
    pub tg_tokens_per_s: Option<f64>,
    pub tg_tokens_per_s_std: Option<f64>,
    pub tg_samples_tokens_per_s: Vec<f64>,
    pub load_s: Option<f64>,
    pub load_read_s: Option<f64>,
    pub load_pack_s: Option<f64>,
    /// Seconds of `load_pack_s` spent on calibration (statistics passes, GPTQ's Hessians and
    /// rounding); null for rows without calibration.
    #[serde(default)]
    pub calibration_s: Option<f64>,
    /// llama-bench's own JSON objects, as it printed them.
    pub llama_bench: Option<serde_json::Value>,
    /// Why the runner has no figures (its error), when it failed.
    pub error: Option<String>,
}

impl RunnerRecord {
    /// A row for a runner that could not be built (no info).
    pub fn failed(name: &str, engine: &str, error: String) -> Self {
        RunnerRecord {
            name: name.into(),
            engine: engine.into(),
            error: Some(error),
            ..Default::default()
        }
    }

    pub fn from_info(info: &RunnerInfo) -> Self {
        RunnerRecord {
            name: info.name.clone(),
            engine: info.engine.clone(),
            bytes: Some(info.bytes),
            bits_per_weight: Some(info.bits_per_weight).filter(|b| b.is_finite() && *b > 0.0),
            params: Some(info.params),
            type_mix: info.type_mix.clone(),
            kv_type: Some(info.kv_type.clone()),
            kernels: info.kernels.clone(),
            load_s: info.load_s,
            load_read_s: info.load_read_s,
            load_pack_s: info.load_pack_s,
            calibration_s: info.calibration_s,
            ..Default::default()
        }
    }

    pub fn set_perplexity(&mut self, p: &PerplexityResult) {
        self.ppl = Some(p.ppl);
        self.ppl_err = Some(p.ppl_err);
        self.running_ppl = p.running.clone();
        self.scored_tokens = Some(p.scored_tokens);
        self.tokens_match = p.tokens_match;
        if let Some(r) = &p.reference {
            self.kld_mean = Some(r.kld_mean);
            self.kld_mean_err = Some(r.kld_mean_err);
            self.kld_p99 = Some(r.kld_p99);
            self.top1_agreement = Some(r.top1_agreement);
            self.delta_p_rms = Some(r.delta_p_rms);
        }
    }

    pub fn set_speed(&mut self, s: &SpeedResult) {
        if let Some(pp) = &s.pp {
            self.pp_tokens_per_s = Some(pp.tokens_per_s);
            self.pp_tokens_per_s_std = Some(pp.tokens_per_s_std);
            self.pp_samples_tokens_per_s = pp.samples_tokens_per_s.clone();
        }
        if let Some(tg) = &s.tg {
            self.tg_tokens_per_s = Some(tg.tokens_per_s);
            self.tg_tokens_per_s_std = Some(tg.tokens_per_s_std);
            self.tg_samples_tokens_per_s = tg.samples_tokens_per_s.clone();
        }
        self.llama_bench = s.raw.clone();
    }
}

impl Results {
    /// Recomputes `ppl_delta_pct` of every row against the float32 in-tree row, or the first
    /// row with a perplexity when there is none.
    pub fn update_deltas(&mut self) {
        let reference = self
            .runners
            .iter()
            .find(|r| r.engine == "kwk" && r.name == "float32" && r.ppl.is_some())
            .or_else(|| self.runners.iter().find(|r| r.ppl.is_some()))
            .map(|r| (r.name.clone(), r.ppl.unwrap_or(f64::NAN)));
        self.ppl_delta_reference = reference.as_ref().map(|r| r.0.clone());
        for row in &mut self.runners {
            row.ppl_delta_pct = match (&reference, row.ppl) {
                (Some((_, base)), Some(p)) => Some((p / base - 1.0) * 100.0),
                _ => None,
            };
        }
    }

    /// Rows that failed.
    pub fn failures(&self) -> impl Iterator<Item = &RunnerRecord> {
        self.runners.iter().filter(|r| r.error.is_some())
    }
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .with_context(|| format!("'{}' has no file name", path.display()))?;
    let tmp = path.with_file_name(format!(".{}.tmp", name.to_string_lossy()));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing '{}'", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming '{}' to '{}'", tmp.display(), path.display()))?;
    Ok(())
}

/// Writes every report file of `results` into `dir`: results.json, results.csv,
/// report.md and the plots.
pub fn write_all(dir: &Path, results: &Results) -> Result<()> {
    json::write(&dir.join("results.json"), results)?;
    csv::write(&dir.join("results.csv"), results)?;
    let plots = plot::write_plots(dir, results)?;
    markdown::write(&dir.join("report.md"), results, &plots)?;
    Ok(())
}

/// Formats an optional figure with `decimals`, or `-`.
pub(crate) fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{x:.decimals$}"))
}

/// `mean ± std`, or `-`.
pub(crate) fn fmt_pm(v: Option<f64>, err: Option<f64>, decimals: usize) -> String {
    match (v, err) {
        (Some(v), Some(e)) => format!("{v:.decimals$} ± {e:.decimals$}"),
        (Some(v), None) => format!("{v:.decimals$}"),
        _ => "-".into(),
    }
}

/// The table every human-readable exporter shows: header and one row of cells per runner.
pub(crate) fn table_rows(results: &Results) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let header = vec![
        "runner", "engine", "size MiB", "bpw", "PPL", "ΔPPL %", "KLD", "top-1 %", "pp t/s",
        "tg t/s", "load s",
    ];
    let rows = results
        .runners
        .iter()
        .map(|r| {
            if r.error.is_some() {
                // The error itself is printed under the table.
                let mut cells = vec![r.name.clone(), r.engine.clone(), "FAILED".to_string()];
                cells.resize(header.len(), "-".to_string());
                return cells;
            }
            vec![
                r.name.clone(),
                r.engine.clone(),
                fmt_opt(r.bytes.map(|b| b as f64 / (1024.0 * 1024.0)), 1),
                fmt_opt(r.bits_per_weight, 2),
                fmt_pm(r.ppl, r.ppl_err, 4),
                r.ppl_delta_pct.map_or("-".into(), |d| format!("{d:+.3}")),
                fmt_opt(r.kld_mean, 5),
                fmt_opt(r.top1_agreement.map(|t| t * 100.0), 2),
                fmt_pm(r.pp_tokens_per_s, r.pp_tokens_per_s_std, 1),
                fmt_pm(r.tg_tokens_per_s, r.tg_tokens_per_s_std, 1),
                fmt_opt(r.load_s, 2),
            ]
        })
        .collect();
    (header, rows)
}

#[cfg(test)]
pub(crate) mod testdata {
    use super::*;

    /// A fabricated results file with two rows, for exporter tests.
    pub fn sample_results() -> Results {
        let mut r = Results {
            schema_version: SCHEMA_VERSION,
            complete: true,
            started_utc: "2026-11-29T14:00:00Z".into(),
            model: "tiny".into(),
            machine: Machine {
                cpu: "Test CPU".into(),
                isa: vec!["avx2".into()],
                kernels: Some("avx2".into()),
                threads: 2,
            },
            versions: Versions {
                kwk: Some("abc".into()),
                kwk_eval: "0.1.0".into(),
                llama_cpp: Some(1),
                llama_cpp_version: Some("version: 1 (abc)".into()),
            },
            protocol: Protocol {
                ctx: 64,
                chunks: 2,
                scored_tokens: 62,
                text_tokens: 200,
                add_bos: false,
                text: "eval.txt".into(),
                text_sha256: "00".into(),
                pp: 16,
                tg: 4,
                reps: 2,
                kld: true,
                speed: true,
                calibration: None,
            },
            ppl_delta_reference: None,
            runners: vec![
                RunnerRecord {
                    name: "float32".into(),
                    engine: "kwk".into(),
                    bytes: Some(4_000_000),
                    bits_per_weight: Some(32.0),
                    params: Some(1_000_000),
                    ppl: Some(20.0),
                    ppl_err: Some(0.5),
                    pp_tokens_per_s: Some(1000.0),
                    pp_tokens_per_s_std: Some(10.0),
                    pp_samples_tokens_per_s: vec![990.0, 1010.0],
                    tg_tokens_per_s: Some(100.0),
                    tg_tokens_per_s_std: Some(2.0),
                    tg_samples_tokens_per_s: vec![98.0, 102.0],
                    load_s: Some(0.1),
                    ..Default::default()
                },
                RunnerRecord {
                    name: "int4".into(),
                    engine: "kwk".into(),
                    bytes: Some(600_000),
                    bits_per_weight: Some(4.8),
                    params: Some(1_000_000),
                    ppl: Some(20.5),
                    ppl_err: Some(0.51),
                    kld_mean: Some(0.01),
                    top1_agreement: Some(0.95),
                    pp_tokens_per_s: Some(1500.0),
                    pp_tokens_per_s_std: Some(20.0),
                    tg_tokens_per_s: Some(300.0),
                    tg_tokens_per_s_std: Some(5.0),
                    load_s: Some(0.3),
                    ..Default::default()
                },
            ],
        };
        r.update_deltas();
        r
    }

    #[test]
    fn deltas_are_relative_to_float32() {
        let r = sample_results();
        assert_eq!(r.ppl_delta_reference.as_deref(), Some("float32"));
        assert_eq!(r.runners[0].ppl_delta_pct, Some(0.0));
        assert!((r.runners[1].ppl_delta_pct.unwrap() - 2.5).abs() < 1e-9);
    }
}

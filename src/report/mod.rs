//! The exporters of [`Results`] (the type lives in [`crate::protocol::results`]): JSON,
//! CSV, Markdown, plots and the terminal table; and the comparisons of two results files,
//! `compare` and the `--baseline` gate built on it.
//!
//! `complete` is false until the last runner has finished, so a run that was interrupted
//! says so in every file it left. Files are written to a temporary name and renamed, so a
//! reader never sees half a file.

pub mod compare;
pub mod csv;
pub mod gate;
pub mod json;
pub mod markdown;
pub mod plot;
pub mod terminal;

pub use crate::protocol::results::{
    Machine, PairedChange, Protocol, Results, RunnerRecord, Versions, SCHEMA_VERSION,
};
use anyhow::{Context, Result};
use std::path::Path;

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

/// `value ± err` with `decimals`, `value` alone without an error, or `-`.
fn pm(v: Option<f64>, err: Option<f64>, decimals: usize, signed: bool) -> String {
    match (v, signed) {
        (None, _) => "-".into(),
        (Some(v), true) => match err {
            Some(e) => format!("{v:+.decimals$} ± {e:.decimals$}"),
            None => format!("{v:+.decimals$}"),
        },
        (Some(_), false) => fmt_pm(v, err, decimals),
    }
}

/// `median [min–max]` of speed samples, or `-`.
pub(crate) fn spread(samples: &[f64]) -> String {
    if samples.is_empty() {
        return "-".into();
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    format!("{median:.1} [{:.1}–{:.1}]", s[0], s[n - 1])
}

/// Whether a row differs from the reference (`≠`) or the `--compare-to` row (`≠c`) beyond
/// two standard errors.
fn differs_cell(r: &RunnerRecord) -> String {
    let mut marks = Vec::new();
    if r.differs_from_reference() == Some(true) {
        marks.push("≠ref");
    }
    if r.compare_to.as_ref().is_some_and(PairedChange::beyond_2se) {
        marks.push("≠cmp");
    }
    marks.join(" ")
}

/// One line on the roofline's ceilings (`None` without measured peaks).
pub(crate) fn peaks_line(results: &Results) -> Option<String> {
    let p = results.machine.peaks.as_ref()?;
    let bf16 = p
        .bf16_gflops
        .map_or("bf16 converted to f32".to_string(), |b| {
            format!("bf16 {b:.0} GFLOP/s")
        });
    let mut line = format!(
        "Roofline ceilings measured with {} threads on tier {}: fp32 {:.0} GFLOP/s ({}), int8 {:.0} GOP/s ({}), {bf16}, read {:.1} GB/s",
        p.threads, p.isa, p.fp32_gflops, p.fp32_instruction, p.int8_gops, p.int8_instruction, p.read_gbps
    );
    if let Some(b) = &results.machine.peaks_best_tier {
        line.push_str(&format!(
            "; llama.cpp rows against the best tier {}: fp32 {:.0}, int8 {:.0}, read {:.1} GB/s",
            b.isa, b.fp32_gflops, b.int8_gops, b.read_gbps
        ));
    }
    line.push_str(". pp % roof = pp t/s x operations per prompt token / the peak of the row's arithmetic (fp32, bf16 or int8 dot); tg % roof = tg t/s x bytes read per token (weights used + KV cache) / read bandwidth.");
    Some(line)
}

/// The table every human-readable exporter shows: header and one row of cells per runner.
pub(crate) fn table_rows(results: &Results) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let header = vec![
        "runner",
        "engine",
        "tensor MiB",
        "bpw",
        "PPL",
        "Δln PPL vs ref",
        "KLD",
        "top-1 %",
        ">2SE",
        "pp t/s",
        "pp % roof",
        "tg t/s",
        "tg % roof",
        "load s",
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
                fmt_opt(r.tensor_bytes.map(|b| b as f64 / (1024.0 * 1024.0)), 1),
                fmt_opt(r.bits_per_weight, 2),
                fmt_pm(r.ppl, r.ppl_err, 4),
                pm(r.ln_ppl_ratio, r.ln_ppl_ratio_err, 5, true),
                pm(r.kld_mean, r.kld_mean_err, 5, false),
                pm(
                    r.top1_agreement.map(|t| t * 100.0),
                    r.top1_agreement_err.map(|t| t * 100.0),
                    2,
                    false,
                ),
                differs_cell(r),
                fmt_pm(r.pp_tokens_per_s, r.pp_tokens_per_s_std, 1),
                fmt_opt(r.pp_roofline_pct, 0),
                fmt_pm(r.tg_tokens_per_s, r.tg_tokens_per_s_std, 1),
                fmt_opt(r.tg_roofline_pct, 0),
                fmt_opt(r.load_s, 2),
            ]
        })
        .collect();
    (header, rows)
}

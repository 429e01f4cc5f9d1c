//! The table every human-readable export shares: the cells of each row, the protocol in one
//! line, the calibration in one line, the notes under the table (rows beyond 2 SE, `--compare-to`, failures, token
//! warnings) and column alignment for a terminal. A leaf of `report`: it reads
//! [`Results`] and writes strings.

use crate::protocol::results::{PairedChange, Results, RowStatus, RunnerRecord};
use crate::protocol::speed_ratios::SpeedRatio;
use std::collections::BTreeMap;

/// Formats an optional figure with `decimals`, or `-`.
pub fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{x:.decimals$}"))
}

/// `mean ± std`, or `-`.
pub fn fmt_pm(v: Option<f64>, err: Option<f64>, decimals: usize) -> String {
    match (v, err) {
        (Some(v), Some(e)) => format!("{v:.decimals$} ± {e:.decimals$}"),
        (Some(v), None) => format!("{v:.decimals$}"),
        _ => "-".into(),
    }
}

/// `value ± err` with `decimals`, `value` alone without an error, or `-`.
pub fn pm(v: Option<f64>, err: Option<f64>, decimals: usize, signed: bool) -> String {
    match (v, signed) {
        (None, _) => "-".into(),
        (Some(v), true) => match err {
            Some(e) => format!("{v:+.decimals$} ± {e:.decimals$}"),
            None => format!("{v:+.decimals$}"),
        },
        (Some(_), false) => fmt_pm(v, err, decimals),
    }
}

/// A standard deviation worth printing: only from two samples or more (one repetition
/// has none, and "± 0.0" would claim a perfectly steady rate).
fn spread_of(std: Option<f64>, samples: &[f64]) -> Option<f64> {
    std.filter(|_| samples.len() > 1)
}

/// `median [min–max]` of speed samples, or `-`.
pub fn spread(samples: &[f64]) -> String {
    let Some(median) = crate::stats::median(samples) else {
        return "-".into();
    };
    let lo = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if samples.len() == 1 {
        return format!("{median:.1}");
    }
    format!("{median:.1} [{lo:.1}–{hi:.1}]")
}

/// Whether a row differs from the reference (`≠`) or the `--compare-to` row (`≠c`) beyond
/// two standard errors.
pub fn differs_cell(r: &RunnerRecord) -> String {
    let mut marks = Vec::new();
    if r.differs_from_reference() == Some(true) {
        marks.push("≠ref");
    }
    if r.compare_to.as_ref().is_some_and(PairedChange::beyond_2se) {
        marks.push("≠cmp");
    }
    marks.join(" ")
}

/// tg % roof, with ` llc` when its ceiling is the last-level cache's read bandwidth.
fn tg_roof_cell(r: &RunnerRecord) -> String {
    let pct = fmt_opt(r.tg_roofline_pct, 0);
    match (r.tg_roofline_pct, r.tg_ceiling.as_deref()) {
        (Some(_), Some("llc")) => format!("{pct} llc"),
        _ => pct,
    }
}

/// Why a row's tg share of its roofline is over 100 % (one note per such row): the bytes
/// per token against the last-level cache, the ceiling it was put against.
pub fn over_roofline_notes(r: &Results) -> Vec<String> {
    let llc = r.machine.peaks.as_ref().and_then(|p| p.llc_bytes);
    let mib = |b: f64| b / (1024.0 * 1024.0);
    r.runners
        .iter()
        .filter_map(|x| {
            let pct = [x.tg_roofline_pct, x.tg_roofline_paired_pct]
                .into_iter()
                .flatten()
                .fold(f64::NAN, f64::max);
            if pct.is_nan() || pct <= 100.0 {
                return None;
            }
            let bytes = x.tg_bytes_per_token.unwrap_or(f64::NAN);
            let why = match (x.tg_ceiling.as_deref(), llc) {
                (Some("llc"), _) => "its bytes per token fit in the last-level cache and it \
                     read them faster than the cache's read bandwidth was probed at (the \
                     probe met a busier moment)"
                    .to_string(),
                (_, Some(llc)) => format!(
                    "it was put against memory's read bandwidth, but its {:.1} MiB per token \
                     are {:.1}x the {:.0} MiB last-level cache, so part of them is read from \
                     the cache, faster than memory",
                    mib(bytes),
                    bytes / llc as f64,
                    mib(llc as f64)
                ),
                (_, None) => "it was put against memory's read bandwidth; the last-level cache's \
                     size is unknown here (sysfs), and part of its bytes per token is likely \
                     read from that cache, faster than memory"
                    .to_string(),
            };
            Some(format!(
                "tg % roof of {} is over 100 % ({pct:.0} %): {why}",
                x.name
            ))
        })
        .collect()
}

/// The table every human-readable exporter shows: header and one row of cells per runner.
pub fn table_rows(results: &Results) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let header = vec![
        "runner",
        "engine",
        "status",
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
        "tg % roof paired",
        "load s",
        "peak RSS MiB",
    ];
    let rows = results
        .runners
        .iter()
        .map(|r| {
            if r.status != RowStatus::Ok || r.error.is_some() {
                // Why is printed under the table.
                let status = match r.status {
                    RowStatus::Skipped => "SKIPPED",
                    _ => "FAILED",
                };
                let mut cells = vec![r.name.clone(), r.engine.to_string(), status.to_string()];
                cells.resize(header.len(), "-".to_string());
                return cells;
            }
            vec![
                r.name.clone(),
                r.engine.to_string(),
                r.status.as_str().to_string(),
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
                fmt_pm(
                    r.pp_tokens_per_s,
                    spread_of(r.pp_tokens_per_s_std, &r.pp_samples_tokens_per_s),
                    1,
                ),
                fmt_opt(r.pp_roofline_pct, 0),
                fmt_pm(
                    r.tg_tokens_per_s,
                    spread_of(r.tg_tokens_per_s_std, &r.tg_samples_tokens_per_s),
                    1,
                ),
                tg_roof_cell(r),
                fmt_opt(r.tg_roofline_paired_pct, 0),
                fmt_opt(r.load_s, 2),
                fmt_opt(r.peak_rss_bytes.map(|b| b as f64 / (1024.0 * 1024.0)), 0),
            ]
        })
        .collect();
    (header, rows)
}

/// The protocol in one line (also printed under the terminal table).
pub fn protocol_line(r: &Results) -> String {
    let p = &r.protocol;
    let sha = &p.text_sha256[..p.text_sha256.len().min(12)];
    let speed = if p.speed {
        let (pp, tg, sweep) = match &p.speed_axes {
            None => (p.pp.to_string(), p.tg.to_string(), String::new()),
            Some(a) => {
                let list =
                    |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
                let threads = match a.threads.len() {
                    1 => String::new(),
                    _ => format!(" threads {}", list(&a.threads)),
                };
                (
                    list(&a.pp),
                    list(&a.tg),
                    format!(" at depth {}{threads}", list(&a.depth)),
                )
            }
        };
        format!(
            "speed pp{pp} / tg{tg}{sweep} × {} reps in {} interleaved rounds",
            p.reps,
            if r.cells.is_empty() {
                r.speed_rounds.len().to_string()
            } else {
                "each cell's own".into()
            }
        )
    } else {
        "speed not measured (--no-speed)".to_string()
    };
    format!(
        "ctx {} × {} chunks = {} scored tokens of '{}' (sha256 {sha}…, {} tokens, BOS {}); \
         {speed}; {} threads; KLD vs float32: {}",
        p.ctx,
        p.chunks,
        p.scored_tokens,
        p.text,
        p.text_tokens,
        if p.add_bos { "added" } else { "none" },
        r.machine.threads_label(),
        if p.kld { "yes" } else { "no" },
    )
}

/// The calibration in one line (`None` when no calibrated format ran): the text, the
/// tokens, whether it is the scored text, and per calibrated row the calibration and
/// packing seconds.
pub fn calibration_line(r: &Results) -> Option<String> {
    let c = r.protocol.calibration.as_ref()?;
    let sha = &c.text_sha256[..c.text_sha256.len().min(12)];
    let range = c
        .range
        .as_deref()
        .map(|x| format!(", tokens {x}"))
        .unwrap_or_default();
    let times: Vec<String> = r
        .runners
        .iter()
        .filter_map(|row| {
            let cal = row.calibration_s?;
            let pack = row
                .load_pack_s
                .map(|p| format!(" of {p:.1} s packing"))
                .unwrap_or_default();
            Some(format!("{} {cal:.1} s{pack}", row.name))
        })
        .collect();
    let on_eval = if c.on_eval {
        " **CALIBRATED ON THE SCORED TEXT (--calib-on-eval): the calibrated rows are flattered.**"
    } else {
        " (no run of 64 tokens shared with the scored text)"
    };
    Some(format!(
        "'{}' (sha256 {sha}…{range}): {} tokens given, {} used{on_eval}; calibration time: {}",
        c.text,
        c.tokens,
        c.tokens_used,
        if times.is_empty() {
            "-".to_string()
        } else {
            times.join(", ")
        }
    ))
}

/// The paired speed ratio of `row` over `vs` for `test` as `median [lowest–highest]`,
/// or `-` when that pair was not measured.
pub fn ratio_cell(r: &Results, row: &str, vs: &str, test: &str) -> String {
    r.speed_ratios
        .iter()
        .find(|x| x.row == row && x.vs == vs && x.test == test)
        .map_or_else(
            || "-".into(),
            |x| {
                if x.rounds > 1 {
                    format!("{:.2} [{:.2}–{:.2}]", x.median, x.min, x.max)
                } else {
                    // One round has no spread to show.
                    format!("{:.2}", x.median)
                }
            },
        )
}

/// The distinct values of `key` over `ratios`, in first-seen order.
pub fn distinct<'a, T: PartialEq>(
    ratios: impl Iterator<Item = &'a SpeedRatio>,
    key: impl Fn(&'a SpeedRatio) -> T,
) -> Vec<T> {
    let mut out = Vec::new();
    for x in ratios {
        let k = key(x);
        if !out.contains(&k) {
            out.push(k);
        }
    }
    out
}

/// At most this many test columns in the terminal's ratio table (each cell takes up to 17
/// columns; the table stays within 100); a sweep with more shows its primary point's pp and
/// tg there, and [`ratio_note`] points to the files with every point.
pub const MAX_RATIO_COLUMNS: usize = 4;

/// The tests of the ratio table's columns: every test of `speed_ratios` when there are at
/// most [`MAX_RATIO_COLUMNS`], else the primary point's.
fn ratio_columns(r: &Results) -> Vec<String> {
    let tests: Vec<String> = distinct(r.speed_ratios.iter(), |x| x.test.clone());
    if tests.len() <= MAX_RATIO_COLUMNS {
        return tests;
    }
    ["pp", "tg"]
        .map(|k| r.protocol.primary_ratio_test(k))
        .into_iter()
        .filter(|t| tests.contains(t))
        .collect()
}

/// The paired speed ratios (`results.speed_ratios`) one pair per line, `row / vs`, then
/// one cell per test ([`ratio_columns`]); `None` when there are none.
pub fn ratio_rows(r: &Results) -> Option<(Vec<String>, Vec<Vec<String>>)> {
    let pairs = distinct(r.speed_ratios.iter(), |x| (x.row.as_str(), x.vs.as_str()));
    if pairs.is_empty() {
        return None;
    }
    let tests = ratio_columns(r);
    let mut header = vec!["speed ratio, paired by round".to_string()];
    header.extend(tests.iter().map(|t| match t.as_str() {
        "pp" | "tg" => r.protocol.primary_test_label(t),
        _ => t.clone(),
    }));
    let rows = pairs
        .iter()
        .map(|(row, vs)| {
            let mut cells = vec![format!("{row} / {vs}")];
            cells.extend(tests.iter().map(|t| ratio_cell(r, row, vs, t)));
            cells
        })
        .collect();
    Some((header, rows))
}

/// The line under the ratio table when it leaves points out ([`ratio_columns`]).
pub fn ratio_note(r: &Results) -> Option<String> {
    let all = distinct(r.speed_ratios.iter(), |x| x.test.as_str()).len();
    let shown = ratio_columns(r).len();
    (all > shown).then(|| {
        format!(
            "({} more tests of the speed sweep: every point's ratios in speed_ratios.csv, every figure in speed_points.csv)",
            all - shown
        )
    })
}

/// `s` on one terminal line: control characters (newlines, tabs, escapes) and the
/// bidirectional-text controls (which reorder what follows them) shown escaped (`\n`,
/// `\u{202e}`); everything else as is.
pub fn one_line(s: &str) -> String {
    let bidi = |c: char| matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() || bidi(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The columns `s` takes on a terminal ([`one_line`] first): wide (CJK, emoji) characters
/// count two, combining marks none.
pub fn display_width(s: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(one_line(s).as_str())
}

/// `header` and `rows` as aligned columns (the first two left-aligned, the rest right), by
/// display width; each cell on one line ([`one_line`]).
pub fn aligned(header: &[String], rows: &[Vec<String>]) -> String {
    let header: Vec<String> = header.iter().map(|c| one_line(c)).collect();
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| one_line(c)).collect())
        .collect();
    let width = |c: &str| unicode_width::UnicodeWidthStr::width(c);
    let mut widths: Vec<usize> = header.iter().map(|h| width(h)).collect();
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(width(c));
        }
    }
    let line = |cells: &[String]| -> String {
        let cells: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                let pad = " ".repeat(w.saturating_sub(width(c)));
                if i < 2 {
                    format!("{c}{pad}")
                } else {
                    format!("{pad}{c}")
                }
            })
            .collect();
        cells.join("  ").trim_end().to_string()
    };
    let mut out = line(&header);
    out.push('\n');
    out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len().max(1) - 1)));
    out.push('\n');
    for row in &rows {
        out.push_str(&line(row));
        out.push('\n');
    }
    out
}

/// One line on the roofline's ceilings (`None` without measured peaks).
pub fn peaks_line(results: &Results) -> Option<String> {
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
    if p.read_gbps_probes.len() > 1 {
        let lo = p
            .read_gbps_probes
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min);
        line.push_str(&format!(
            " (best of {} probes: with the peaks, before every speed round and around every repetition; lowest {lo:.1})",
            p.read_gbps_probes.len()
        ));
    }
    if let (Some(b), Some(g)) = (p.llc_bytes, p.llc_read_gbps) {
        line.push_str(&format!(
            ", last-level cache ({:.0} MiB) read {g:.1} GB/s",
            b as f64 / (1024.0 * 1024.0)
        ));
    }
    if p.compute_probes > 1 {
        line.push_str(&format!(
            "; compute ceilings the best of {} measurements",
            p.compute_probes
        ));
    }
    if let Some(b) = &results.machine.peaks_best_tier {
        line.push_str(&format!(
            "; llama.cpp rows against the best tier {}: fp32 {:.0}, int8 {:.0}, read {:.1} GB/s",
            b.isa, b.fp32_gflops, b.int8_gops, b.read_gbps
        ));
    }
    line.push_str(". pp % roof = pp t/s x operations per prompt token / the peak of the row's arithmetic (fp32, bf16 or int8 dot); tg % roof = tg t/s x bytes read per token (weights used + KV cache) / read bandwidth (memory's; the last-level cache's, marked llc, where the bytes per token fit in it); tg % roof paired = the same against the read bandwidth probed just before and just after each repetition, the median of the repetitions (the host's drift taken out).");
    Some(line)
}

/// The lines under the table: which rows differ beyond 2 SE, failures, token warnings.
pub fn notes(r: &Results) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(w) = r.machine.steadiness.as_ref().and_then(|x| x.warning()) {
        out.push(format!("SPEED UNRELIABLE: {w}"));
    }
    let reference = r.ppl_delta_reference.as_deref().unwrap_or("the reference");
    let differ: Vec<&str> = r
        .runners
        .iter()
        .filter(|x| x.differs_from_reference() == Some(true))
        .map(|x| x.name.as_str())
        .collect();
    if r.runners.iter().any(|x| x.ln_ppl_ratio.is_some()) {
        out.push(format!(
            "PPL differs from {reference} beyond 2 SE (ln PPL/PPL_ref, paired on the same tokens): {}",
            if differ.is_empty() { "none".into() } else { differ.join(", ") }
        ));
    }
    if let Some(row) = &r.compare_to {
        for x in &r.runners {
            if let Some(c) = &x.compare_to {
                out.push(format!(
                    "{} vs {row}: Δln PPL {:+.5} ± {:.5}, ΔKLD {:+.5} ± {:.5}, Δtop-1 {:+.2} ± {:.2} pts{}",
                    x.name,
                    c.ln_ppl_ratio,
                    c.ln_ppl_ratio_err,
                    c.kld_diff,
                    c.kld_diff_err,
                    100.0 * c.top1_diff,
                    100.0 * c.top1_diff_err,
                    if c.beyond_2se() { " (differs beyond 2 SE)" } else { "" }
                ));
            }
        }
    }
    if let Some(line) = peaks_line(r) {
        out.push(line);
    }
    out.extend(over_roofline_notes(r));
    for row in r.failures() {
        out.push(format!(
            "FAILED {}: {}",
            row.name,
            row.error.as_deref().unwrap_or_default()
        ));
    }
    for row in r.skipped() {
        out.push(format!(
            "SKIPPED {}: {}",
            row.name,
            row.status_reason.as_deref().unwrap_or_default()
        ));
    }
    for line in &r.not_made {
        out.push(format!("NOT MADE {line}"));
    }
    out.extend(r.runners.iter().filter_map(source_copy_line));
    if let Some(from) = r
        .runners
        .iter()
        .find_map(|x| x.made.as_ref())
        .map(|m| &m.from)
    {
        out.push(format!("ladder: {from}"));
    }
    for row in r.runners.iter().filter(|x| !x.stands_for.is_empty()) {
        out.push(format!(
            "{}: added at the ladder's sizes, for {} (kwk's rows without --formats)",
            row.name,
            row.stands_for.join(", ")
        ));
    }
    for row in &r.runners {
        let Some(m) = &row.made else { continue };
        if let Some(line) = m.fallback_line() {
            out.push(format!(
                "{}: {line}; {} bpw counted over every tensor",
                row.name,
                row.bits_per_weight
                    .map_or("-".into(), |b| format!("{b:.2}"))
            ));
        }
    }
    for row in r.runners.iter().filter(|x| x.tokens_match == Some(false)) {
        out.push(format!(
            "WARNING: {} tokenized the text to other ids than kwk-eval; its perplexity is not comparable",
            row.name
        ));
    }
    out
}

/// How many of a kwk row's tensors were copied from the GGUF source's own blocks, not
/// rounded (their `type_mix` layouts end in `(Q4_K copy)`; `format::source_grid`), and how
/// many near copied with fitted scales (`(Q5_0 near copy)`; `format::near_copy`), so a
/// reader knows why the row loses little; `None` when none were.
fn source_copy_line(row: &RunnerRecord) -> Option<String> {
    let total: usize = row.type_mix.values().sum();
    let (mut exact, mut near) = (BTreeMap::new(), BTreeMap::new());
    for (layout, n) in &row.type_mix {
        let Some(ty) = layout
            .strip_suffix(" copy)")
            .and_then(|l| l.rsplit_once(" ("))
            .map(|(_, ty)| ty)
        else {
            continue;
        };
        match ty.strip_suffix(" near") {
            Some(ty) => *near.entry(ty).or_insert(0) += n,
            None => *exact.entry(ty).or_insert(0) += n,
        }
    }
    let count = |m: &BTreeMap<&str, usize>| -> (usize, String) {
        let types: Vec<String> = m.iter().map(|(t, n)| format!("{t} {n}")).collect();
        (m.values().sum(), types.join(", "))
    };
    let ((n, types), (n_near, near_types)) = (count(&exact), count(&near));
    (n + n_near > 0).then(|| {
        let mut parts = Vec::new();
        if n > 0 {
            parts.push(format!(
                "{n} copied exactly from the GGUF's own blocks ({types})"
            ));
        }
        if n_near > 0 {
            parts.push(format!(
                "{n_near} near copied from them (their codes, scales fitted: {near_types})"
            ));
        }
        format!(
            "{}: of {total} tensors {}; the other {} rounded by kwk (no layout holds their \
             source grid, or it is wider than the tensor's slot)",
            row.name,
            parts.join(", "),
            total - n - n_near
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::results::testdata::sample_results;

    /// Exact and near copies are counted apart, each by source type, and the rest as
    /// rounded; a row with neither gets no line.
    #[test]
    fn copy_line_counts_exact_and_near_copies_apart() {
        let mut row = sample_results().runners[0].clone();
        row.type_mix = [
            ("4-bit g32 (Q4_K copy)", 27),
            ("5-bit g32 (Q5_0 near copy)", 76),
            ("int8 sym g32 (Q8_0 copy)", 1),
            ("6-bit g64", 18),
            ("4-bit g32", 5),
        ]
        .into_iter()
        .map(|(k, n)| (k.to_string(), n))
        .collect();
        let line = source_copy_line(&row).unwrap();
        assert!(
            line.contains(
                "of 127 tensors 28 copied exactly from the GGUF's own blocks (Q4_K 27, Q8_0 1)"
            ),
            "{line}"
        );
        assert!(
            line.contains("76 near copied from them (their codes, scales fitted: Q5_0 76)"),
            "{line}"
        );
        assert!(line.contains("the other 23 rounded"), "{line}");
        row.type_mix = [("4-bit g32".to_string(), 3)].into_iter().collect();
        assert_eq!(source_copy_line(&row), None);
    }

    /// One repetition has no spread: no "± 0.0", no "[1.75–1.75]".
    #[test]
    fn a_single_repetition_shows_no_spread() {
        let mut r = sample_results();
        for row in &mut r.runners {
            row.pp_samples_tokens_per_s.truncate(1);
            row.pp_tokens_per_s_std = Some(0.0);
        }
        for x in &mut r.speed_ratios {
            x.rounds = 1;
            x.min = x.median;
            x.max = x.median;
        }
        let (header, rows) = table_rows(&r);
        let pp = header.iter().position(|h| *h == "pp t/s").unwrap();
        assert!(!rows[0][pp].contains('±'), "{}", rows[0][pp]);
        let ratio = &r.speed_ratios[0];
        let cell = ratio_cell(&r, &ratio.row, &ratio.vs, &ratio.test);
        assert!(!cell.contains('['), "{cell}");
        assert!(!spread(&[1.75]).contains('['));
        assert_eq!(spread(&[1.0, 2.0, 3.0]), "2.0 [1.0–3.0]");
    }

    fn peaks(llc: Option<u64>) -> kwk::roofline::Peaks {
        kwk::roofline::Peaks {
            threads: 2,
            isa: "avx2".into(),
            fp32_gflops: 100.0,
            fp32_instruction: "fma".into(),
            int8_gops: 200.0,
            int8_instruction: "dot".into(),
            bf16_gflops: None,
            read_gbps: 50.0,
            read_gbps_probes: vec![50.0],
            read_buffer_bytes: 1 << 28,
            llc_bytes: llc,
            llc_read_gbps: llc.map(|_| 400.0),
            compute_probes: 1,
            seconds: 1.0,
        }
    }

    /// No tg share over 100 % without a note saying why; the ceiling is named in the cell.
    #[test]
    fn a_share_over_100_percent_comes_with_its_reason() {
        let mut r = sample_results();
        r.machine.peaks = Some(peaks(Some(32 << 20)));
        r.runners[0].tg_roofline_pct = Some(95.0);
        r.runners[0].tg_ceiling = Some("dram".into());
        r.runners[1].tg_roofline_pct = Some(106.0);
        r.runners[1].tg_ceiling = Some("dram".into());
        r.runners[1].tg_bytes_per_token = Some(48.0 * 1024.0 * 1024.0);
        let notes = over_roofline_notes(&r);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with("tg % roof of int4 is over 100 % (106 %)")
                && notes[0].contains("48.0 MiB per token are 1.5x the 32 MiB last-level cache"),
            "{}",
            notes[0]
        );
        assert!(super::notes(&r).contains(&notes[0]));
        // Against the cache's ceiling: the cell says llc; over 100 % there is noted too.
        r.runners[1].tg_ceiling = Some("llc".into());
        r.runners[1].tg_roofline_pct = Some(97.0);
        assert!(over_roofline_notes(&r).is_empty());
        let (_, rows) = table_rows(&r);
        assert!(rows[1].contains(&"97 llc".to_string()), "{:?}", rows[1]);
        assert!(rows[0].contains(&"95".to_string()), "{:?}", rows[0]);
        r.runners[1].tg_roofline_pct = Some(101.0);
        assert!(over_roofline_notes(&r)[0].contains("fit in the last-level cache"));
        // The paired share counts too; an unknown cache size still gets its note.
        r.machine.peaks = Some(peaks(None));
        r.runners[1].tg_ceiling = Some("dram".into());
        r.runners[1].tg_roofline_pct = Some(90.0);
        r.runners[1].tg_roofline_paired_pct = Some(104.0);
        let n = over_roofline_notes(&r);
        assert!(n.len() == 1 && n[0].contains("size is unknown"), "{n:?}");
        assert!(peaks_line(&r).is_some());
    }

    /// A sweep with few tests gets one ratio column per test; with more than
    /// MAX_RATIO_COLUMNS the primary point's pp and tg and a line naming the files, so the
    /// table stays within 100 columns.
    #[test]
    fn ratio_columns_per_point_only_when_few() {
        use crate::protocol::points::SpeedAxes;
        let mut r = sample_results();
        let mut axes = SpeedAxes::single(r.protocol.pp, r.protocol.tg, 2);
        axes.depth = vec![0, 64];
        r.protocol.speed_axes = Some(axes.clone());
        let base = r.speed_ratios.clone();
        for d in [64] {
            for x in &base {
                let n = if x.test == "pp" {
                    r.protocol.pp
                } else {
                    r.protocol.tg
                };
                let mut y = x.clone();
                y.test = axes.test_name(&x.test, n, d, 2);
                r.speed_ratios.push(y);
            }
        }
        let (header, rows) = ratio_rows(&r).unwrap();
        assert_eq!(header[1..], ["pp16", "tg4", "pp16@d64", "tg4@d64"]);
        assert!(ratio_note(&r).is_none());
        assert!(aligned(&header, &rows)
            .lines()
            .all(|l| l.chars().count() <= 100));
        axes.depth = vec![0, 64, 128];
        r.protocol.speed_axes = Some(axes.clone());
        for x in &base {
            let n = if x.test == "pp" {
                r.protocol.pp
            } else {
                r.protocol.tg
            };
            let mut y = x.clone();
            y.test = axes.test_name(&x.test, n, 128, 2);
            r.speed_ratios.push(y);
        }
        let (header, rows) = ratio_rows(&r).unwrap();
        assert_eq!(header[1..], ["pp16", "tg4"]);
        assert!(aligned(&header, &rows)
            .lines()
            .all(|l| l.chars().count() <= 100));
        let note = ratio_note(&r).unwrap();
        assert!(
            note.starts_with("(4 more tests") && note.contains("speed_points.csv"),
            "{note}"
        );
    }
}

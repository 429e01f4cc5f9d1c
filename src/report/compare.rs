//! `kwk-eval compare OLD.json NEW.json`: per-row changes between two runs in PPL, KLD, top-1
//! and speed, each with its uncertainty, and a verdict against the regression limits; as a
//! terminal table, Markdown or CSV. The `--baseline` gate runs the same comparison.
//!
//! Rows are matched by name. Quality is compared only when both runs scored the same tokens
//! of the same model (see [`quality_mismatches`]); speed only when both ran the same speed
//! test on the same CPU (features and threads included) unless speed across machines is
//! allowed. Errors across runs are unpaired (per-token values are not stored):
//! ln(PPL_new/PPL_old) ± sqrt((σ_old/PPL_old)² + (σ_new/PPL_new)²), KLD and top-1 alike,
//! speed from each run's repetitions (standard error of each mean).

use crate::protocol::results::{Protocol, Results, RowStatus, RunnerRecord};
use std::fmt::Write as _;

/// The regression limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateLimits {
    pub max_ppl_pct: f64,
    pub max_kld_pct: f64,
    pub max_top1_points: f64,
    pub max_speed_pct: f64,
    pub speed_across_machines: bool,
}

impl Default for GateLimits {
    fn default() -> Self {
        GateLimits {
            max_ppl_pct: 0.5,
            max_kld_pct: 10.0,
            max_top1_points: 0.5,
            max_speed_pct: 25.0,
            speed_across_machines: false,
        }
    }
}

impl GateLimits {
    /// Each limit must be a finite, non-negative number (NaN would pass every change,
    /// a negative limit fail an unchanged row); the error names the flag.
    pub fn check(&self) -> anyhow::Result<()> {
        for (flag, v) in [
            ("--max-ppl-regression", self.max_ppl_pct),
            ("--max-kld-regression", self.max_kld_pct),
            ("--max-top1-regression", self.max_top1_points),
            ("--max-speed-regression", self.max_speed_pct),
        ] {
            anyhow::ensure!(
                v.is_finite() && v >= 0.0,
                "{flag} {v}: pass a non-negative number"
            );
        }
        Ok(())
    }

    /// The figures of `row` beyond these limits, e.g. `ppl +0.8% > 0.5%`.
    pub fn regressions(&self, row: &RowComparison) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(c) = row.ppl {
            let pct = (c.change.exp() - 1.0) * 100.0;
            if pct > self.max_ppl_pct {
                out.push(format!("ppl {pct:+.3}% > {}%", self.max_ppl_pct));
            }
        }
        if let Some(c) = row.kld {
            let pct = if c.old > 0.0 {
                c.change / c.old * 100.0
            } else {
                0.0
            };
            if pct > self.max_kld_pct {
                out.push(format!("kld {pct:+.1}% > {}%", self.max_kld_pct));
            }
        }
        if let Some(c) = row.top1 {
            if -c.change > self.max_top1_points {
                out.push(format!(
                    "top1 {:+.2} pts < -{}",
                    c.change, self.max_top1_points
                ));
            }
        }
        for (what, c) in [("pp", row.pp), ("tg", row.tg)] {
            if let Some(c) = c {
                if -c.change > self.max_speed_pct {
                    out.push(format!(
                        "{what} {:+.1}% < -{}%",
                        c.change, self.max_speed_pct
                    ));
                }
            }
        }
        out
    }
}

/// How `compare` prints its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TableFormat {
    Terminal,
    Markdown,
    Csv,
}

/// A figure in both runs: old, new, the change and its standard error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Change {
    pub old: f64,
    pub new: f64,
    pub change: f64,
    pub err: f64,
}

impl Change {
    fn beyond_2se(&self) -> bool {
        self.change != 0.0 && self.change.abs() > 2.0 * self.err
    }
}

/// One row present in both runs.
#[derive(Debug, Clone, PartialEq)]
pub struct RowComparison {
    pub name: String,
    /// ln(PPL_new/PPL_old).
    pub ppl: Option<Change>,
    /// Mean KLD against each run's reference, absolute change.
    pub kld: Option<Change>,
    /// Top-1 agreement, change in percentage points.
    pub top1: Option<Change>,
    /// Mean tokens/s, change in percent.
    pub pp: Option<Change>,
    pub tg: Option<Change>,
    /// Why the row regressed beyond the limits (empty: it did not).
    pub regressions: Vec<String>,
}

impl RowComparison {
    /// `REGRESSED (…)`, `changed (…)` for differences beyond 2 SE within the limits, or `same`.
    pub fn verdict(&self) -> String {
        if !self.regressions.is_empty() {
            return format!("REGRESSED ({})", self.regressions.join(", "));
        }
        let moved: Vec<&str> = [
            ("ppl", self.ppl),
            ("kld", self.kld),
            ("top1", self.top1),
            ("pp", self.pp),
            ("tg", self.tg),
        ]
        .iter()
        .filter(|(_, c)| c.is_some_and(|c| c.beyond_2se()))
        .map(|(n, _)| *n)
        .collect();
        if moved.is_empty() {
            "same".into()
        } else {
            format!("changed >2SE ({})", moved.join(", "))
        }
    }
}

/// Two runs compared.
#[derive(Debug, Clone, Default)]
pub struct Comparison {
    /// Identity differences and rows in one run only, one line each.
    pub notes: Vec<String>,
    pub quality_compared: bool,
    pub speed_compared: bool,
    pub rows: Vec<RowComparison>,
}

impl Comparison {
    pub fn regressions(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| !r.regressions.is_empty())
            .count()
    }
}

/// Differences that make two runs' quality figures incomparable: other tokens, model,
/// text or protocol.
pub fn quality_mismatches(old: &Protocol, new: &Protocol) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |what: &str, a: String, b: String| {
        if a != b {
            out.push(format!("{what}: baseline {a}, this run {b}"));
        }
    };
    check(
        "model sha256",
        old.model_sha256.clone(),
        new.model_sha256.clone(),
    );
    check(
        "text sha256",
        old.text_sha256.clone(),
        new.text_sha256.clone(),
    );
    check(
        "token ids sha256 (tokenizer/BOS)",
        old.tokens_sha256.clone(),
        new.tokens_sha256.clone(),
    );
    check(
        "BOS",
        format!("{}/{:?}", old.add_bos, old.bos_id),
        format!("{}/{:?}", new.add_bos, new.bos_id),
    );
    check("ctx", old.ctx.to_string(), new.ctx.to_string());
    check("chunks", old.chunks.to_string(), new.chunks.to_string());
    check(
        "llama.cpp KV type",
        old.llama_kv_type.clone(),
        new.llama_kv_type.clone(),
    );
    out
}

/// Differences that make two runs' speeds incomparable: the machine (CPU, its features,
/// threads) unless `across_machines`, and the speed test itself (pp, tg, reps).
pub fn speed_mismatches(old: &Results, new: &Results, across_machines: bool) -> Vec<String> {
    let mut out = Vec::new();
    let (a, b) = (&old.protocol, &new.protocol);
    if !(a.speed && b.speed) {
        out.push("speed was not measured in both runs".into());
    }
    // The row figures compared are the primary point's: at depth its test is another.
    let (ta, tb) = (
        (a.primary_test_label("pp"), a.primary_test_label("tg")),
        (b.primary_test_label("pp"), b.primary_test_label("tg")),
    );
    if (&ta, a.reps) != (&tb, b.reps) {
        out.push(format!(
            "speed test: baseline {}/{} × {}, this run {}/{} × {}",
            ta.0, ta.1, a.reps, tb.0, tb.1, b.reps
        ));
    }
    let (m, n) = (&old.machine, &new.machine);
    for (which, run) in [("the baseline", m), ("this run", n)] {
        if let Some(w) = run.steadiness.as_ref().filter(|s| s.noisy) {
            out.push(format!(
                "{which} measured speed on a busy machine ({})",
                w.reasons.join("; ")
            ));
        }
    }
    if !across_machines && (m.cpu != n.cpu || m.isa != n.isa || m.threads != n.threads) {
        out.push(format!(
            "machine: baseline '{}' [{}] {} threads, this run '{}' [{}] {} threads (pass --speed-across-machines to compare anyway)",
            m.cpu, m.isa.join(","), m.threads, n.cpu, n.isa.join(","), n.threads
        ));
    }
    out
}

/// Relative error of a figure with an absolute error.
fn rel(v: f64, e: f64) -> f64 {
    e / v
}

fn ppl_change(o: &RunnerRecord, n: &RunnerRecord) -> Option<Change> {
    let (po, pn) = (o.ppl?, n.ppl?);
    let err = rel(po, o.ppl_err?).hypot(rel(pn, n.ppl_err?));
    Some(Change {
        old: po,
        new: pn,
        change: (pn / po).ln(),
        err,
    })
}

fn kld_change(o: &RunnerRecord, n: &RunnerRecord) -> Option<Change> {
    let (ko, kn) = (o.kld_mean?, n.kld_mean?);
    let err = o
        .kld_mean_err
        .unwrap_or(0.0)
        .hypot(n.kld_mean_err.unwrap_or(0.0));
    Some(Change {
        old: ko,
        new: kn,
        change: kn - ko,
        err,
    })
}

fn top1_change(o: &RunnerRecord, n: &RunnerRecord) -> Option<Change> {
    let (to, tn) = (o.top1_agreement? * 100.0, n.top1_agreement? * 100.0);
    let err = 100.0
        * o.top1_agreement_err
            .unwrap_or(0.0)
            .hypot(n.top1_agreement_err.unwrap_or(0.0));
    Some(Change {
        old: to,
        new: tn,
        change: tn - to,
        err,
    })
}

/// Mean of samples and the standard error of that mean (0 for one sample).
fn mean_se(samples: &[f64]) -> Option<(f64, f64)> {
    if samples.is_empty() {
        return None;
    }
    let n = samples.len() as f64;
    let mean = samples.iter().sum::<f64>() / n;
    if samples.len() < 2 {
        return Some((mean, 0.0));
    }
    let var = samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    Some((mean, (var / n).sqrt()))
}

fn speed_change(old: &[f64], new: &[f64]) -> Option<Change> {
    let ((mo, so), (mn, sn)) = (mean_se(old)?, mean_se(new)?);
    let err = 100.0 * (mn / mo) * rel(mo, so).hypot(rel(mn, sn));
    Some(Change {
        old: mo,
        new: mn,
        change: (mn / mo - 1.0) * 100.0,
        err,
    })
}

/// One row of both runs, and its regressions beyond `limits`.
fn compare_row(
    o: &RunnerRecord,
    n: &RunnerRecord,
    quality: bool,
    speed: bool,
    limits: &GateLimits,
) -> RowComparison {
    let mut row = RowComparison {
        name: n.name.clone(),
        ppl: None,
        kld: None,
        top1: None,
        pp: None,
        tg: None,
        regressions: Vec::new(),
    };
    if let Some(e) = &n.error {
        row.regressions.push(format!("failed: {e}"));
        return row;
    }
    if n.status == RowStatus::Skipped {
        row.regressions.push(format!(
            "skipped: {}",
            n.status_reason.as_deref().unwrap_or("not measured")
        ));
        return row;
    }
    if quality {
        row.ppl = ppl_change(o, n);
        row.kld = kld_change(o, n);
        row.top1 = top1_change(o, n);
        if o.ppl.is_some() && n.ppl.is_none() {
            row.regressions.push("no PPL in this run".into());
        }
    }
    if speed {
        row.pp = speed_change(&o.pp_samples_tokens_per_s, &n.pp_samples_tokens_per_s);
        row.tg = speed_change(&o.tg_samples_tokens_per_s, &n.tg_samples_tokens_per_s);
    }
    row.regressions.extend(limits.regressions(&row));
    row
}

/// Compares `new` with `old` row by row.
pub fn compare(old: &Results, new: &Results, limits: &GateLimits) -> Comparison {
    let mut c = Comparison::default();
    let q = quality_mismatches(&old.protocol, &new.protocol);
    c.quality_compared = q.is_empty();
    c.notes
        .extend(q.into_iter().map(|m| format!("quality not compared: {m}")));
    let s = speed_mismatches(old, new, limits.speed_across_machines);
    c.speed_compared = s.is_empty();
    c.notes
        .extend(s.into_iter().map(|m| format!("speed not compared: {m}")));
    if !old.complete || !new.complete {
        c.notes.push("a run is incomplete (complete: false)".into());
    }
    for o in &old.runners {
        if o.status != RowStatus::Ok {
            c.notes.push(format!(
                "{}: {} in the baseline, not compared",
                o.name,
                o.status.as_str()
            ));
            continue;
        }
        match new.runners.iter().find(|n| n.name == o.name) {
            Some(n) => c.rows.push(compare_row(
                o,
                n,
                c.quality_compared,
                c.speed_compared,
                limits,
            )),
            None => c.notes.push(format!("{}: in the baseline only", o.name)),
        }
    }
    for n in new
        .runners
        .iter()
        .filter(|n| !old.runners.iter().any(|o| o.name == n.name))
    {
        c.notes.push(format!("{}: in this run only", n.name));
    }
    c
}

fn cell(c: Option<Change>, decimals: usize, unit: &str) -> String {
    c.map_or("-".into(), |c| {
        format!("{:+.decimals$}{unit} ± {:.decimals$}", c.change, c.err)
    })
}

fn cells(r: &RowComparison) -> Vec<String> {
    let old_new = |c: Option<Change>, d: usize| {
        c.map_or("-".into(), |c| format!("{:.d$} → {:.d$}", c.old, c.new))
    };
    vec![
        r.name.clone(),
        old_new(r.ppl, 4),
        cell(r.ppl, 5, ""),
        cell(r.kld, 5, ""),
        cell(r.top1, 2, ""),
        cell(r.pp, 1, "%"),
        cell(r.tg, 1, "%"),
        r.verdict(),
    ]
}

const HEADER: [&str; 8] = [
    "runner",
    "PPL old → new",
    "Δln PPL",
    "ΔKLD",
    "Δtop-1 pts",
    "Δpp",
    "Δtg",
    "verdict",
];

/// The comparison as a table in `format`, notes first.
pub fn render(c: &Comparison, format: TableFormat) -> String {
    let rows: Vec<Vec<String>> = c.rows.iter().map(cells).collect();
    let header: Vec<String> = HEADER.iter().map(|h| h.to_string()).collect();
    match format {
        TableFormat::Csv => render_csv(&header, &rows),
        TableFormat::Markdown => {
            let mut s = String::new();
            for n in &c.notes {
                let _ = writeln!(s, "> {n}\n");
            }
            let _ = writeln!(s, "| {} |", header.join(" | "));
            let _ = writeln!(
                s,
                "|---|{}|",
                vec!["---:"; header.len() - 2].join("|") + "|---"
            );
            for r in &rows {
                let _ = writeln!(s, "| {} |", r.join(" | ").replace('\n', " "));
            }
            s
        }
        TableFormat::Terminal => {
            let mut s: String = c.notes.iter().map(|n| format!("note: {n}\n")).collect();
            s.push_str(&super::table::aligned(&header, &rows));
            s
        }
    }
}

fn render_csv(header: &[String], rows: &[Vec<String>]) -> String {
    let mut w = ::csv::Writer::from_writer(Vec::new());
    let _ = w.write_record(header);
    for r in rows {
        let _ = w.write_record(r);
    }
    w.into_inner()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::results::testdata::sample_results;

    #[test]
    fn same_run_is_same_and_a_slower_row_regresses() {
        let old = sample_results();
        let limits = GateLimits::default();
        let c = compare(&old, &old, &limits);
        assert!(c.quality_compared && c.speed_compared);
        assert_eq!(c.regressions(), 0);
        assert!(c.rows.iter().all(|r| r.verdict() == "same"), "{:?}", c.rows);
        let mut new = old.clone();
        new.runners[1].tg_samples_tokens_per_s = vec![150.0, 151.0];
        new.runners[1].ppl = Some(21.0);
        let c = compare(&old, &new, &limits);
        let v = c.rows[1].verdict();
        assert!(
            v.starts_with("REGRESSED") && v.contains("tg") && v.contains("ppl"),
            "{v}"
        );
        let csv = render(&c, TableFormat::Csv);
        assert_eq!(csv.lines().count(), 3);
        assert!(render(&c, TableFormat::Markdown).contains("| int4 |"));
    }

    #[test]
    fn other_machine_skips_speed_and_other_tokens_skip_quality() {
        let old = sample_results();
        let mut new = old.clone();
        new.machine.cpu = "Other CPU".into();
        new.protocol.tokens_sha256 = "33".into();
        let c = compare(&old, &new, &GateLimits::default());
        assert!(!c.quality_compared && !c.speed_compared);
        assert!(c
            .notes
            .iter()
            .any(|n| n.contains("--speed-across-machines")));
        assert!(c.rows.iter().all(|r| r.ppl.is_none() && r.tg.is_none()));
        let across = GateLimits {
            speed_across_machines: true,
            ..GateLimits::default()
        };
        assert!(compare(&old, &new, &across).speed_compared);
    }

    /// A run whose primary point is at a depth does not compare its speed with one at
    /// depth 0: the tests differ, and the mismatch names both.
    #[test]
    fn speed_at_another_depth_is_not_compared() {
        let old = sample_results();
        assert!(speed_mismatches(&old, &old, false).is_empty());
        let mut new = sample_results();
        let mut axes = crate::protocol::points::SpeedAxes::single(16, 4, 2);
        axes.depth = vec![64];
        new.protocol.speed_axes = Some(axes);
        let m = speed_mismatches(&old, &new, false);
        assert_eq!(
            m,
            ["speed test: baseline pp16/tg4 × 2, this run pp16@d64/tg4@d64 × 2"]
        );
    }
}

//! The regression gate: this run's results against a baseline results.json, runner by
//! runner (matched by name). A runner regresses when its perplexity rises by more than
//! `max_ppl_regression_pct` (relative) or its pp or tg speed falls by more than
//! `max_speed_regression_pct`. Perplexity is deterministic for a build, so its threshold
//! can be tight; speeds on a shared machine drift by ±20%, hence a wide default.
//!
//! Runners of the baseline missing from this run, and new runners, are listed but do not
//! fail the gate (a CI job that changes its `--formats` should update its baseline, and the
//! summary says so). A runner that failed in this run counts as a regression. Comparing
//! perplexities measured on different protocols (ctx, chunks, text) is meaningless, so a
//! protocol mismatch is an error; different pp/tg/reps only skip the speed comparison.

use super::{Results, RunnerRecord};
use anyhow::{ensure, Result};

#[derive(Debug, Clone, Copy)]
pub struct GateThresholds {
    pub max_ppl_regression_pct: f64,
    pub max_speed_regression_pct: f64,
}

#[derive(Debug, Clone, Default)]
pub struct GateReport {
    /// One line per comparison, regressions marked.
    pub lines: Vec<String>,
    pub regressions: usize,
    pub compared: usize,
}

impl GateReport {
    pub fn passed(&self) -> bool {
        self.regressions == 0
    }

    pub fn summary(&self, baseline_name: &str) -> String {
        let mut s = format!(
            "regression gate against '{baseline_name}': {} runner(s) compared, {} regression(s)\n",
            self.compared, self.regressions
        );
        for l in &self.lines {
            s.push_str("  ");
            s.push_str(l);
            s.push('\n');
        }
        s.push_str(if self.passed() {
            "gate: PASSED\n"
        } else {
            "gate: FAILED\n"
        });
        s
    }
}

fn pct_change(new: f64, old: f64) -> f64 {
    (new / old - 1.0) * 100.0
}

fn compare_speed(
    what: &str,
    new: Option<f64>,
    old: Option<f64>,
    t: &GateThresholds,
    out: &mut Vec<String>,
) -> bool {
    match (new, old) {
        (Some(n), Some(o)) if o > 0.0 => {
            let c = pct_change(n, o);
            let bad = c < -t.max_speed_regression_pct;
            out.push(format!(
                "{} {what} {o:.1} -> {n:.1} t/s ({c:+.1}%, limit -{}%)",
                if bad { "REGRESSED" } else { "ok" },
                t.max_speed_regression_pct
            ));
            bad
        }
        (None, Some(_)) => {
            out.push(format!(
                "note {what}: measured in the baseline, not in this run"
            ));
            false
        }
        _ => false,
    }
}

fn compare_runner(
    new: &RunnerRecord,
    old: &RunnerRecord,
    speed: bool,
    t: &GateThresholds,
) -> (Vec<String>, bool) {
    let mut lines = Vec::new();
    let mut regressed = false;
    if let Some(e) = &new.error {
        lines.push(format!("REGRESSED: failed in this run: {e}"));
        return (lines, true);
    }
    match (new.ppl, old.ppl) {
        (Some(n), Some(o)) => {
            let c = pct_change(n, o);
            let bad = c > t.max_ppl_regression_pct;
            regressed |= bad;
            lines.push(format!(
                "{} PPL {o:.4} -> {n:.4} ({c:+.3}%, limit +{}%)",
                if bad { "REGRESSED" } else { "ok" },
                t.max_ppl_regression_pct
            ));
        }
        (None, Some(_)) => {
            regressed = true;
            lines.push("REGRESSED: PPL measured in the baseline but not in this run".into());
        }
        _ => {}
    }
    if speed {
        regressed |= compare_speed(
            "pp",
            new.pp_tokens_per_s,
            old.pp_tokens_per_s,
            t,
            &mut lines,
        );
        regressed |= compare_speed(
            "tg",
            new.tg_tokens_per_s,
            old.tg_tokens_per_s,
            t,
            &mut lines,
        );
    }
    (lines, regressed)
}

/// Compares `current` with `baseline`.
pub fn compare(baseline: &Results, current: &Results, t: &GateThresholds) -> Result<GateReport> {
    let (b, c) = (&baseline.protocol, &current.protocol);
    ensure!(
        b.ctx == c.ctx && b.chunks == c.chunks && b.text_sha256 == c.text_sha256,
        "the baseline was measured with ctx {} × {} chunks on a text with sha256 {}, this run with ctx {} × {} chunks on {}; \
         perplexities are only comparable on the same protocol. Run with the baseline's --ctx/--chunks/--text, or make a new baseline",
        b.ctx, b.chunks, b.text_sha256, c.ctx, c.chunks, c.text_sha256
    );
    let same_speed_protocol = b.pp == c.pp && b.tg == c.tg && b.speed && c.speed;
    let mut report = GateReport::default();
    if !same_speed_protocol {
        report.lines.push(format!(
            "note: speeds not compared (baseline pp{}/tg{}{}, this run pp{}/tg{}{})",
            b.pp,
            b.tg,
            if b.speed { "" } else { " not measured" },
            c.pp,
            c.tg,
            if c.speed { "" } else { " not measured" }
        ));
    }
    for old in &baseline.runners {
        match current.runners.iter().find(|r| r.name == old.name) {
            None => report.lines.push(format!(
                "missing: '{}' is in the baseline but not in this run (not a failure; update the baseline if it was dropped on purpose)",
                old.name
            )),
            Some(new) => {
                report.compared += 1;
                let (lines, regressed) = compare_runner(new, old, same_speed_protocol, t);
                if regressed {
                    report.regressions += 1;
                }
                for l in lines {
                    report.lines.push(format!("{}: {l}", new.name));
                }
            }
        }
    }
    for new in &current.runners {
        if !baseline.runners.iter().any(|r| r.name == new.name) {
            report
                .lines
                .push(format!("new: '{}' has no baseline row", new.name));
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::testdata::sample_results;

    const T: GateThresholds = GateThresholds {
        max_ppl_regression_pct: 0.5,
        max_speed_regression_pct: 25.0,
    };

    #[test]
    fn identical_runs_pass() {
        let r = sample_results();
        let g = compare(&r, &r, &T).unwrap();
        assert!(g.passed());
        assert_eq!(g.compared, 2);
    }

    #[test]
    fn ppl_rise_beyond_the_limit_fails_and_within_passes() {
        let base = sample_results();
        let mut cur = base.clone();
        cur.runners[1].ppl = Some(20.5 * 1.004);
        assert!(compare(&base, &cur, &T).unwrap().passed());
        cur.runners[1].ppl = Some(20.5 * 1.006);
        let g = compare(&base, &cur, &T).unwrap();
        assert!(!g.passed());
        assert!(
            g.summary("b.json").contains("int4: REGRESSED PPL"),
            "{}",
            g.summary("b")
        );
        // Lower perplexity is never a regression.
        cur.runners[1].ppl = Some(10.0);
        assert!(compare(&base, &cur, &T).unwrap().passed());
    }

    #[test]
    fn speed_drop_beyond_the_limit_fails() {
        let base = sample_results();
        let mut cur = base.clone();
        cur.runners[0].tg_tokens_per_s = Some(80.0);
        assert!(compare(&base, &cur, &T).unwrap().passed());
        cur.runners[0].tg_tokens_per_s = Some(70.0);
        assert!(!compare(&base, &cur, &T).unwrap().passed());
        cur.protocol.tg = 8;
        let g = compare(&base, &cur, &T).unwrap();
        assert!(g.passed(), "different tg: speeds not compared");
    }

    #[test]
    fn missing_runners_are_reported_not_fatal_and_failures_regress() {
        let base = sample_results();
        let mut cur = base.clone();
        cur.runners.pop();
        let g = compare(&base, &cur, &T).unwrap();
        assert!(g.passed());
        assert!(g.lines.iter().any(|l| l.starts_with("missing: 'int4'")));
        let mut cur = base.clone();
        cur.runners[1] = RunnerRecord::failed("int4", "kwk", "NaN".into());
        assert!(!compare(&base, &cur, &T).unwrap().passed());
        let mut cur = base.clone();
        cur.protocol.ctx = 128;
        assert!(compare(&base, &cur, &T).is_err());
    }
}

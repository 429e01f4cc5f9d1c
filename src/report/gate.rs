//! The `--baseline` regression gate. Identity first: before anything is loaded the baseline
//! must be complete, have a positive PPL in every measured row, share at least one row with
//! this run and match its text, ctx, chunk limit and llama.cpp KV type
//! ([`check_before_load`]); once the model is loaded and the text tokenized, its model
//! content hash, token ids (tokenizer and BOS) and chunk count must match too
//! ([`check_after_load`]). A mismatch is an error (exit 2) before any runner runs. Then the
//! rows are compared by [`super::compare::compare`] (the code `kwk-eval compare` uses): a
//! row regresses when PPL rises by more than `max_ppl_pct`, mean KLD by more than
//! `max_kld_pct`, top-1 agreement drops by more than `max_top1_points`, or pp/tg speed
//! drops by more than `max_speed_pct`. Speed is skipped, with a line saying why, on another
//! machine unless `--speed-across-machines`.

pub use super::compare::GateLimits;
use super::compare::{compare, render, Comparison, TableFormat};
use crate::protocol::results::{Protocol, Results};
use anyhow::{bail, ensure, Result};

/// What a run plan knows of its identity before loading the model.
#[derive(Debug, Clone)]
pub struct PlannedIdentity {
    pub text_sha256: String,
    pub ctx: usize,
    /// `--chunks` (`None`: every whole chunk).
    pub max_chunks: Option<usize>,
    pub llama_kv_type: String,
    pub rows: Vec<String>,
}

/// Checks a baseline against the plan before anything loads.
pub fn check_before_load(base: &Results, id: &PlannedIdentity) -> Result<()> {
    ensure!(
        base.complete,
        "the baseline is an incomplete run (complete: false); make a new baseline"
    );
    for r in &base.runners {
        if let Some(p) = r.ppl {
            ensure!(
                p.is_finite() && p > 0.0,
                "the baseline's row {} has PPL {p}; a perplexity must be positive. Make a new baseline",
                r.name
            );
        }
    }
    let b = &base.protocol;
    let mut m = Vec::new();
    if b.text_sha256 != id.text_sha256 {
        m.push(format!(
            "text sha256 {} vs {}",
            b.text_sha256, id.text_sha256
        ));
    }
    if b.ctx != id.ctx {
        m.push(format!("ctx {} vs {}", b.ctx, id.ctx));
    }
    if id.max_chunks.is_some_and(|n| n < b.chunks) {
        m.push(format!(
            "chunks {} vs --chunks {}",
            b.chunks,
            id.max_chunks.unwrap_or(0)
        ));
    }
    if b.llama_kv_type != id.llama_kv_type {
        m.push(format!(
            "llama.cpp KV type {} vs {}",
            b.llama_kv_type, id.llama_kv_type
        ));
    }
    if !m.is_empty() {
        bail!(
            "measured on another protocol than this run ({}); run with the baseline's --text/--ctx/--chunks/--llama-kv, or make a new baseline",
            m.join("; ")
        );
    }
    let shared = base
        .runners
        .iter()
        .filter(|r| r.error.is_none() && id.rows.contains(&r.name))
        .count();
    ensure!(
        shared > 0,
        "no row of the baseline ({}) is in this run ({}); nothing could be compared. Run the baseline's formats, or make a new baseline",
        base.runners.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(", "),
        id.rows.join(", ")
    );
    Ok(())
}

/// Checks a baseline against this run's protocol once the model is loaded and the text
/// tokenized (model content, token ids, BOS, chunks), still before any runner runs.
pub fn check_after_load(base: &Results, protocol: &Protocol) -> Result<()> {
    let m = super::compare::quality_mismatches(&base.protocol, protocol);
    if !m.is_empty() {
        bail!(
            "the baseline scored other tokens or another model than this run ({}); perplexities are only comparable on the same tokens of the same model. Make a new baseline",
            m.join("; ")
        );
    }
    Ok(())
}

/// `kwk-eval compare`'s identity check of two results files, the gate's applied to both:
/// the same model content, text, token ids, BOS, ctx, chunks and llama.cpp KV type
/// ([`super::compare::quality_mismatches`]), every measured PPL positive and finite, and at
/// least one row in common; otherwise an error naming what differs.
pub fn check_comparable(old: &Results, new: &Results) -> Result<()> {
    for (which, r) in [("the first file", old), ("this file", new)] {
        for row in &r.runners {
            if let Some(p) = row.ppl {
                ensure!(
                    p.is_finite() && p > 0.0,
                    "{which}'s row {} has PPL {p}; a perplexity must be positive",
                    row.name
                );
            }
        }
    }
    let m = super::compare::quality_mismatches(&old.protocol, &new.protocol);
    if !m.is_empty() {
        bail!(
            "they scored other tokens, another model or another protocol ({}); compare runs of the same model, text, --ctx, --chunks and --llama-kv",
            m.join("; ")
                .replace("baseline ", "first ")
                .replace("this run ", "this file ")
        );
    }
    let measured = |r: &Results| -> Vec<String> {
        r.runners
            .iter()
            .filter(|x| x.status == crate::protocol::results::RowStatus::Ok)
            .map(|x| x.name.clone())
            .collect()
    };
    let (a, b) = (measured(old), measured(new));
    ensure!(
        a.iter().any(|n| b.contains(n)),
        "no measured row is in both ({} vs {}); nothing could be compared",
        a.join(", "),
        b.join(", ")
    );
    Ok(())
}

/// The gate's verdict and what it prints.
pub struct GateOutcome {
    pub comparison: Comparison,
}

impl GateOutcome {
    pub fn passed(&self) -> bool {
        self.comparison.regressions() == 0
    }

    pub fn summary(&self, baseline_name: &str) -> String {
        let c = &self.comparison;
        let mut s = format!(
            "regression gate against '{baseline_name}': {} row(s) compared, {} regression(s)\n",
            c.rows.len(),
            c.regressions()
        );
        s.push_str(&render(c, TableFormat::Terminal));
        s.push_str(if self.passed() {
            "gate: PASSED\n"
        } else {
            "gate: FAILED\n"
        });
        s
    }
}

/// Runs the gate on a finished run.
pub fn run(base: &Results, current: &Results, limits: &GateLimits) -> GateOutcome {
    GateOutcome {
        comparison: compare(base, current, limits),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::results::testdata::sample_results;

    fn planned(r: &Results) -> PlannedIdentity {
        PlannedIdentity {
            text_sha256: r.protocol.text_sha256.clone(),
            ctx: r.protocol.ctx,
            max_chunks: Some(r.protocol.chunks),
            llama_kv_type: r.protocol.llama_kv_type.clone(),
            rows: r.runners.iter().map(|x| x.name.clone()).collect(),
        }
    }

    fn err_before(base: &Results, id: &PlannedIdentity) -> String {
        format!("{:#}", check_before_load(base, id).unwrap_err())
    }

    #[test]
    fn each_identity_mismatch_before_load_is_an_error() {
        let base = sample_results();
        let id = planned(&base);
        check_before_load(&base, &id).unwrap();
        let mut x = id.clone();
        x.text_sha256 = "ff".into();
        assert!(err_before(&base, &x).contains("text sha256"));
        let mut x = id.clone();
        x.ctx = 128;
        assert!(err_before(&base, &x).contains("ctx 64 vs 128"));
        let mut x = id.clone();
        x.max_chunks = Some(1);
        assert!(err_before(&base, &x).contains("chunks 2 vs --chunks 1"));
        let mut x = id.clone();
        x.llama_kv_type = "f32".into();
        assert!(err_before(&base, &x).contains("KV type f16 vs f32"));
        let mut x = id.clone();
        x.rows = vec!["bf16".into()];
        assert!(err_before(&base, &x).contains("no row of the baseline"));
        let mut b = base.clone();
        b.complete = false;
        assert!(err_before(&b, &id).contains("incomplete"));
        let mut b = base.clone();
        b.runners[0].ppl = Some(0.0);
        assert!(err_before(&b, &id).contains("must be positive"));
    }

    #[test]
    fn each_identity_mismatch_after_load_is_an_error() {
        let base = sample_results();
        check_after_load(&base, &base.protocol).unwrap();
        type Edit = fn(&mut Protocol);
        let edits: [(Edit, &str); 5] = [
            (|p| p.model_sha256 = "x".into(), "model sha256"),
            (|p| p.tokens_sha256 = "x".into(), "token ids"),
            (|p| p.add_bos = true, "BOS"),
            (|p| p.bos_id = Some(1), "BOS"),
            (|p| p.chunks = 3, "chunks"),
        ];
        for (edit, want) in edits {
            let mut p = base.protocol.clone();
            edit(&mut p);
            let e = format!("{:#}", check_after_load(&base, &p).unwrap_err());
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn gate_limits_on_kld_top1_and_threads() {
        let base = sample_results();
        assert!(run(&base, &base, &GateLimits::default()).passed());
        let mut new = base.clone();
        new.runners[1].kld_mean = Some(0.02);
        let g = run(&base, &new, &GateLimits::default());
        assert!(!g.passed());
        assert!(
            g.summary("b").contains("kld +100.0% > 10%"),
            "{}",
            g.summary("b")
        );
        let mut new = base.clone();
        new.runners[1].top1_agreement = Some(0.90);
        assert!(!run(&base, &new, &GateLimits::default()).passed());
        // Other thread count: speed skipped with a line, even when much slower.
        let mut new = base.clone();
        new.machine.threads = 4;
        new.runners[1].tg_samples_tokens_per_s = vec![10.0, 11.0];
        let g = run(&base, &new, &GateLimits::default());
        assert!(g.passed());
        assert!(g.summary("b").contains("speed not compared: machine"));
        let across = GateLimits {
            speed_across_machines: true,
            ..GateLimits::default()
        };
        assert!(!run(&base, &new, &across).passed());
        // A failed row regresses.
        let mut new = base.clone();
        new.runners[1].error = Some("boom".into());
        assert!(!run(&base, &new, &GateLimits::default()).passed());
    }

    /// Speed measured on a busy machine is not gated, with a line saying why; quality is.
    #[test]
    fn gate_skips_speed_of_a_noisy_run() {
        use crate::protocol::steadiness::{Snapshot, Steadiness};
        let base = sample_results();
        let mut new = base.clone();
        new.runners[1].tg_samples_tokens_per_s = vec![10.0, 11.0];
        assert!(!run(&base, &new, &GateLimits::default()).passed());
        let snap = |total, own| Snapshot {
            total,
            idle: 0,
            steal: 0,
            own,
            load1: 4.0,
        };
        new.machine.steadiness = Some(Steadiness::judge(&snap(0, 0), &snap(1000, 500), &[], 2));
        let g = run(&base, &new, &GateLimits::default());
        assert!(g.passed(), "{}", g.summary("b"));
        assert!(
            g.summary("b")
                .contains("speed not compared: this run measured speed on a busy machine"),
            "{}",
            g.summary("b")
        );
        new.runners[1].kld_mean = Some(0.02);
        assert!(!run(&base, &new, &GateLimits::default()).passed());
    }
}

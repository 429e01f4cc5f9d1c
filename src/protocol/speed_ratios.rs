//! Paired speed ratios: each in-tree row's tokens/s over a comparison row's, round by
//! round. The speed repetitions of all runners interleave (one per runner per round), so
//! both samples of a round saw the same state of the host; on a shared machine whose speed
//! drifts by tens of per cent between minutes, the median of these per-round ratios is a
//! steadier figure than the ratio of two means (`results.json` `speed_ratios`, report.md's
//! ratio tables, `speed_ratios.csv`).
//!
//! Compared: every kwk row against the reference row (kwk `float32`: what a format buys
//! over the model's own weights) and every llama.cpp row; the reference itself against
//! the llama.cpp rows.
//! One set per test of the speed sweep (`speed_points`, each sample with its round; the
//! primary point's plain tests keep the names `pp`/`tg`, [`super::points::ratio_test`]);
//! rows without points (files written before the sweep) pair `pp_*`/`tg_*` with
//! `speed_rounds`.

/// The record this module computes; it is part of results.json's shape, so it is defined
/// there (results.rs does not depend on this module).
pub use super::results::SpeedRatio;
use super::results::{Engine, Results, RunnerRecord};

/// `pp` or `tg` samples of a row.
fn samples<'a>(r: &'a RunnerRecord, test: &str) -> &'a [f64] {
    if test == "pp" {
        &r.pp_samples_tokens_per_s
    } else {
        &r.tg_samples_tokens_per_s
    }
}

/// A row's sample of each round (`None` where it did not run), or `None` when its samples
/// cannot be placed in rounds (their count differs from the rounds it appears in).
fn per_round(results: &Results, r: &RunnerRecord, test: &str) -> Option<Vec<Option<f64>>> {
    let s = samples(r, test);
    let mut next = 0;
    let mut out = Vec::with_capacity(results.speed_rounds.len());
    for round in &results.speed_rounds {
        if round.iter().any(|n| n == &r.name) {
            out.push(Some(*s.get(next)?));
            next += 1;
        } else {
            out.push(None);
        }
    }
    (next == s.len() && next > 0).then_some(out)
}

/// A row's sample of each round for the test whose ratios are named `test`: from its
/// `speed_points` when it has them, else (`pp`/`tg`) from [`per_round`].
fn per_round_of(results: &Results, r: &RunnerRecord, test: &str) -> Option<Vec<Option<f64>>> {
    if r.speed_points.is_empty() {
        return match test {
            "pp" | "tg" => per_round(results, r, test),
            _ => None,
        };
    }
    let p = r.speed_points.iter().find(|p| p.ratio_test() == test)?;
    if p.samples_tokens_per_s.is_empty() || p.rounds.len() != p.samples_tokens_per_s.len() {
        return None;
    }
    let mut out = vec![None; results.speed_rounds.len()];
    for (&round, &v) in p.rounds.iter().zip(&p.samples_tokens_per_s) {
        *out.get_mut(round)? = Some(v);
    }
    Some(out)
}

/// The tests with ratios, pp tests before tg tests, each in the sweep's order.
fn tests_of(results: &Results) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for kind in ["pp", "tg"] {
        let mut any = false;
        for p in results.runners.iter().flat_map(|r| &r.speed_points) {
            any = true;
            let t = p.ratio_test();
            if p.kind == kind && !out.contains(&t) {
                out.push(t);
            }
        }
        if !any {
            out.push(kind.to_string());
        }
    }
    out
}

/// The paired ratios of `results` (see the module doc), test by test (pp tests first),
/// then in row order then column order; pairs with no common round are left out.
pub fn paired_speed_ratios(results: &Results) -> Vec<SpeedRatio> {
    let reference = results.ppl_delta_reference.as_deref().unwrap_or("float32");
    let is_reference = |r: &RunnerRecord| r.engine == Engine::Kwk && r.name == reference;
    let columns: Vec<&RunnerRecord> = results
        .runners
        .iter()
        .filter(|r| is_reference(r) || r.engine.is_external())
        .collect();
    let mut out = Vec::new();
    for test in tests_of(results) {
        // The reference row too, against the external rows only: a run without float32
        // has another kwk row as its reference, whose speed against llama.cpp's was
        // otherwise in no table.
        for row in results.runners.iter().filter(|r| r.engine == Engine::Kwk) {
            let Some(a) = per_round_of(results, row, &test) else {
                continue;
            };
            for vs in columns.iter().filter(|vs| !std::ptr::eq(**vs, row)) {
                let Some(b) = per_round_of(results, vs, &test) else {
                    continue;
                };
                let mut ratios: Vec<f64> = a
                    .iter()
                    .zip(&b)
                    .filter_map(|(x, y)| Some(x.as_ref()? / y.as_ref()?))
                    .filter(|q| q.is_finite())
                    .collect();
                let Some(median) = crate::stats::median(&ratios) else {
                    continue;
                };
                ratios.sort_by(f64::total_cmp);
                out.push(SpeedRatio {
                    test: test.clone(),
                    row: row.name.clone(),
                    vs: vs.name.clone(),
                    rounds: ratios.len(),
                    median,
                    min: ratios[0],
                    max: ratios[ratios.len() - 1],
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::results::testdata::sample_results;

    fn row(name: &str, engine: Engine, pp: &[f64], tg: &[f64]) -> RunnerRecord {
        RunnerRecord {
            name: name.into(),
            engine,
            pp_samples_tokens_per_s: pp.to_vec(),
            tg_samples_tokens_per_s: tg.to_vec(),
            ..Default::default()
        }
    }

    fn results(runners: Vec<RunnerRecord>, rounds: &[&[&str]]) -> Results {
        let mut r = sample_results();
        r.runners = runners;
        r.ppl_delta_reference = Some("float32".into());
        r.speed_rounds = rounds
            .iter()
            .map(|x| x.iter().map(|s| s.to_string()).collect())
            .collect();
        r
    }

    #[test]
    fn ratios_pair_samples_by_round_not_by_position() {
        // int8 failed its first round (no sample there): its samples are rounds 2 and 3.
        let r = results(
            vec![
                row(
                    "float32",
                    Engine::Kwk,
                    &[100.0, 50.0, 80.0],
                    &[10.0, 5.0, 8.0],
                ),
                row("int8", Engine::Kwk, &[60.0, 120.0], &[]),
                row(
                    "gguf:q8.gguf",
                    Engine::LlamaCpp,
                    &[40.0, 20.0, 30.0],
                    &[4.0, 2.0, 4.0],
                ),
            ],
            &[
                &["float32", "gguf:q8.gguf"],
                &["int8", "gguf:q8.gguf", "float32"],
                &["gguf:q8.gguf", "float32", "int8"],
            ],
        );
        let got = paired_speed_ratios(&r);
        // Rows: float32 (the reference: against llama.cpp's rows only) and int8 (against
        // both); llama.cpp rows are columns. int8 has no tg samples.
        assert_eq!(got.len(), 4, "{got:?}");
        let reference = &got[0];
        assert_eq!(
            (
                reference.test.as_str(),
                reference.row.as_str(),
                reference.vs.as_str()
            ),
            ("pp", "float32", "gguf:q8.gguf")
        );
        // Rounds 1-3: 100/40, 50/20, 80/30.
        assert_eq!(reference.rounds, 3);
        assert!((reference.median - 2.5).abs() < 1e-12);
        assert!((reference.max - 80.0 / 30.0).abs() < 1e-12);
        assert_eq!(
            (got[3].test.as_str(), got[3].row.as_str()),
            ("tg", "float32")
        );
        let got: Vec<&SpeedRatio> = got.iter().filter(|x| x.row == "int8").collect();
        assert_eq!(got.len(), 2, "{got:?}");
        let vs_f32 = got[0];
        assert_eq!(
            (vs_f32.test.as_str(), vs_f32.vs.as_str()),
            ("pp", "float32")
        );
        assert_eq!(vs_f32.rounds, 2);
        // Round 2: 60/50 = 1.2; round 3: 120/80 = 1.5.
        assert!((vs_f32.min - 1.2).abs() < 1e-12 && (vs_f32.max - 1.5).abs() < 1e-12);
        assert!((vs_f32.median - 1.35).abs() < 1e-12);
        let vs_q8 = got[1];
        assert_eq!(vs_q8.vs, "gguf:q8.gguf");
        // Round 2: 60/20 = 3; round 3: 120/30 = 4.
        assert!((vs_q8.min - 3.0).abs() < 1e-12 && (vs_q8.max - 4.0).abs() < 1e-12);
    }

    #[test]
    fn samples_that_do_not_fit_the_rounds_are_not_paired() {
        // Three samples but only two rounds list the row: no ratios for it.
        let r = results(
            vec![
                row("float32", Engine::Kwk, &[100.0, 100.0], &[10.0, 10.0]),
                row("int4", Engine::Kwk, &[1.0, 2.0, 3.0], &[20.0, 20.0]),
            ],
            &[&["float32", "int4"], &["int4", "float32"]],
        );
        let got = paired_speed_ratios(&r);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].test, "tg");
        assert_eq!(got[0].median, 2.0);
    }

    /// With a sweep every point gets its ratios, named after the point (the primary
    /// point's plain tests `pp`/`tg`), samples paired by their recorded rounds.
    #[test]
    fn every_point_of_a_sweep_gets_its_paired_ratios() {
        use crate::protocol::points::PointSpeed;
        let point =
            |test: &str, kind: &str, depth, primary, v: &[f64], rounds: &[usize]| PointSpeed {
                test: test.into(),
                kind: kind.into(),
                tokens: 4,
                depth,
                threads: 1,
                primary,
                samples_tokens_per_s: v.to_vec(),
                rounds: rounds.to_vec(),
                ..Default::default()
            };
        let mut f32 = row("float32", Engine::Kwk, &[], &[]);
        f32.speed_points = vec![
            point("tg4", "tg", 0, true, &[10.0, 10.0], &[0, 1]),
            point("tg4@d64", "tg", 64, false, &[5.0, 4.0], &[0, 1]),
        ];
        let mut int8 = row("int8", Engine::Kwk, &[], &[]);
        // int8 has no depth-64 sample in round 0.
        int8.speed_points = vec![
            point("tg4", "tg", 0, true, &[20.0, 30.0], &[0, 1]),
            point("tg4@d64", "tg", 64, false, &[12.0], &[1]),
        ];
        let r = results(
            vec![f32, int8],
            &[&["float32", "int8"], &["int8", "float32"]],
        );
        let got = paired_speed_ratios(&r);
        let names: Vec<&str> = got.iter().map(|x| x.test.as_str()).collect();
        assert_eq!(names, ["tg", "tg4@d64"]);
        assert_eq!((got[0].rounds, got[0].median), (2, 2.5));
        assert_eq!((got[1].rounds, got[1].median), (1, 3.0));
    }
}

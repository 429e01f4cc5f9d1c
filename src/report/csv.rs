//! results.csv: the runner rows of results.json flattened, one row per runner. Lists
//! (running PPL, per-repetition samples) are space-separated in one cell; the type mix is
//! `type:count` pairs; llama-bench's raw objects stay in results.json only. And
//! speed_ratios.csv: the paired per-round speed ratios, one line per pair.

use super::exporter::{Exporter, Run};
use super::table::spread;
use crate::protocol::results::{Results, RunnerRecord};
use anyhow::{Context, Result};

const HEADER: &[&str] = &[
    "name",
    "engine",
    "tensor_bytes",
    "file_bytes",
    "bits_per_weight",
    "params",
    "type_mix",
    "kv_type",
    "kv_bytes_per_token",
    "ppl",
    "ppl_err",
    "ppl_delta_pct",
    "scored_tokens",
    "tokens_match",
    "kld_mean",
    "kld_mean_err",
    "kld_p99",
    "top1_agreement",
    "top1_agreement_err",
    "delta_p_rms",
    "entropy_delta",
    "entropy_delta_err",
    "ln_ppl_ratio",
    "ln_ppl_ratio_err",
    "compare_to",
    "compare_to_ln_ppl_ratio",
    "compare_to_ln_ppl_ratio_err",
    "compare_to_kld_diff",
    "compare_to_kld_diff_err",
    "compare_to_top1_diff",
    "compare_to_top1_diff_err",
    "pp_tokens_per_s",
    "pp_tokens_per_s_std",
    "pp_samples_tokens_per_s",
    "pp_median_min_max",
    "tg_tokens_per_s",
    "tg_tokens_per_s_std",
    "tg_samples_tokens_per_s",
    "tg_median_min_max",
    "pp_ops_per_token",
    "pp_roofline_pct",
    "tg_bytes_per_token",
    "tg_roofline_pct",
    "tg_samples_read_gbps",
    "tg_roofline_paired_pct",
    "tg_ceiling",
    "load_s",
    "load_read_s",
    "load_pack_s",
    "peak_rss_bytes",
    "running_ppl",
    "error",
    "speed_unreliable",
    "status",
    "status_reason",
];

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(ToString::to_string).unwrap_or_default()
}

fn list(v: &[f64]) -> String {
    v.iter().map(f64::to_string).collect::<Vec<_>>().join(" ")
}

/// One runner's cells; `noisy` is the run's steadiness verdict (`None`: not judged).
fn cells(r: &RunnerRecord, noisy: Option<bool>) -> Vec<String> {
    let has_speed = r.pp_tokens_per_s.is_some() || r.tg_tokens_per_s.is_some();
    vec![
        r.name.clone(),
        r.engine.to_string(),
        opt(&r.tensor_bytes),
        opt(&r.file_bytes),
        opt(&r.bits_per_weight),
        opt(&r.params),
        r.type_mix
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect::<Vec<_>>()
            .join(" "),
        opt(&r.kv_type),
        opt(&r.kv_bytes_per_token),
        opt(&r.ppl),
        opt(&r.ppl_err),
        opt(&r.ppl_delta_pct),
        opt(&r.scored_tokens),
        opt(&r.tokens_match),
        opt(&r.kld_mean),
        opt(&r.kld_mean_err),
        opt(&r.kld_p99),
        opt(&r.top1_agreement),
        opt(&r.top1_agreement_err),
        opt(&r.delta_p_rms),
        opt(&r.entropy_delta),
        opt(&r.entropy_delta_err),
        opt(&r.ln_ppl_ratio),
        opt(&r.ln_ppl_ratio_err),
        opt(&r.compare_to.as_ref().map(|c| c.row.clone())),
        opt(&r.compare_to.as_ref().map(|c| c.ln_ppl_ratio)),
        opt(&r.compare_to.as_ref().map(|c| c.ln_ppl_ratio_err)),
        opt(&r.compare_to.as_ref().map(|c| c.kld_diff)),
        opt(&r.compare_to.as_ref().map(|c| c.kld_diff_err)),
        opt(&r.compare_to.as_ref().map(|c| c.top1_diff)),
        opt(&r.compare_to.as_ref().map(|c| c.top1_diff_err)),
        opt(&r.pp_tokens_per_s),
        opt(&r.pp_tokens_per_s_std),
        list(&r.pp_samples_tokens_per_s),
        spread(&r.pp_samples_tokens_per_s),
        opt(&r.tg_tokens_per_s),
        opt(&r.tg_tokens_per_s_std),
        list(&r.tg_samples_tokens_per_s),
        spread(&r.tg_samples_tokens_per_s),
        opt(&r.pp_ops_per_token),
        opt(&r.pp_roofline_pct),
        opt(&r.tg_bytes_per_token),
        opt(&r.tg_roofline_pct),
        list(&r.tg_samples_read_gbps),
        opt(&r.tg_roofline_paired_pct),
        opt(&r.tg_ceiling),
        opt(&r.load_s),
        opt(&r.load_read_s),
        opt(&r.load_pack_s),
        opt(&r.peak_rss_bytes),
        list(&r.running_ppl),
        opt(&r.error),
        opt(&noisy.filter(|_| has_speed)),
        r.status.as_str().to_string(),
        opt(&r.status_reason),
    ]
}

pub fn to_bytes(results: &Results) -> Result<Vec<u8>> {
    let mut w = ::csv::Writer::from_writer(Vec::new());
    w.write_record(HEADER)?;
    let noisy = results.machine.steadiness.as_ref().map(|s| s.noisy);
    for r in &results.runners {
        w.write_record(cells(r, noisy))?;
    }
    w.into_inner().context("finishing results.csv")
}

/// results.csv as an [`Exporter`]: one line per row.
pub struct ResultsCsv;

impl Exporter for ResultsCsv {
    fn file_name(&self) -> &'static str {
        "results.csv"
    }
    fn serialize(&self, run: &Run<'_>) -> Result<Vec<u8>> {
        to_bytes(run.results)
    }
}

/// speed_ratios.csv as an [`Exporter`]: [`ratios_to_bytes`].
pub struct SpeedRatiosCsv;

impl Exporter for SpeedRatiosCsv {
    fn file_name(&self) -> &'static str {
        "speed_ratios.csv"
    }
    fn serialize(&self, run: &Run<'_>) -> Result<Vec<u8>> {
        ratios_to_bytes(run.results)
    }
}

/// speed_ratios.csv: `results.speed_ratios`, one line per (test, row, compared row).
pub fn ratios_to_bytes(results: &Results) -> Result<Vec<u8>> {
    let mut w = ::csv::Writer::from_writer(Vec::new());
    w.write_record(["test", "row", "vs", "rounds", "median", "min", "max"])?;
    for x in &results.speed_ratios {
        w.write_record([
            x.test.clone(),
            x.row.clone(),
            x.vs.clone(),
            x.rounds.to_string(),
            x.median.to_string(),
            x.min.to_string(),
            x.max.to_string(),
        ])?;
    }
    w.into_inner().context("finishing speed_ratios.csv")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::results::testdata::sample_results;

    #[test]
    fn one_row_per_runner_with_the_header_fields() {
        let bytes = to_bytes(&sample_results()).unwrap();
        let mut rd = ::csv::Reader::from_reader(&bytes[..]);
        let header: Vec<String> = rd.headers().unwrap().iter().map(String::from).collect();
        assert_eq!(header, HEADER);
        let rows: Vec<_> = rd.records().collect::<Result<_, _>>().unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(&rows[1][0], "int4");
        let col = |name: &str| HEADER.iter().position(|h| *h == name).unwrap();
        assert_eq!(&rows[0][col("ppl")], "20");
        assert_eq!(&rows[0][col("kld_mean")], "", "unmeasured KLD is empty");
        assert_eq!(&rows[0][col("pp_samples_tokens_per_s")], "990 1010");
        assert_eq!(&rows[0][col("pp_median_min_max")], "1000.0 [990.0–1010.0]");
        assert_eq!(&rows[1][col("ln_ppl_ratio_err")], "0.004");
        assert_eq!(&rows[0][col("speed_unreliable")], "", "not judged");
        assert_eq!(&rows[1][col("status")], "ok");
        assert_eq!(&rows[1][col("status_reason")], "");
    }

    #[test]
    fn a_noisy_run_marks_every_row_with_speed() {
        use crate::protocol::steadiness::{Snapshot, Steadiness};
        let mut r = sample_results();
        let snap = |own| Snapshot {
            total: 1000,
            idle: 0,
            steal: 0,
            own,
            load1: 4.0,
        };
        let zero = Snapshot {
            total: 0,
            ..snap(0)
        };
        r.machine.steadiness = Some(Steadiness::judge(&zero, &snap(500), &[], 2));
        let bytes = to_bytes(&r).unwrap();
        let mut rd = ::csv::Reader::from_reader(&bytes[..]);
        let col = HEADER
            .iter()
            .position(|h| *h == "speed_unreliable")
            .unwrap();
        for row in rd.records() {
            assert_eq!(&row.unwrap()[col], "true");
        }
        let md = super::super::markdown::render(&r, &Default::default());
        assert!(
            md.contains("**SPEED UNRELIABLE.** the machine was not quiet"),
            "{md}"
        );
        let term = super::super::terminal::render(&r);
        assert!(term.contains("SPEED UNRELIABLE: "), "{term}");
    }

    #[test]
    fn ratios_file_has_one_line_per_pair() {
        let bytes = ratios_to_bytes(&sample_results()).unwrap();
        let mut rd = ::csv::Reader::from_reader(&bytes[..]);
        let rows: Vec<_> = rd.records().collect::<Result<_, _>>().unwrap();
        // int4 against the float32 reference, pp then tg.
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (&rows[0][0], &rows[0][1], &rows[0][2], &rows[0][3]),
            ("pp", "int4", "float32", "2")
        );
        let tg_min: f64 = rows[1][5].parse().unwrap();
        assert!((tg_min - 305.0 / 102.0).abs() < 1e-12, "{tg_min}");
    }
}

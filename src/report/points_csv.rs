//! speed_points.csv: every speed figure of a run in long form, one line per (row, test,
//! depth, threads), like llama-bench's own `-o csv` / `-o jsonl` (its `n_prompt`, `n_gen`,
//! `n_depth`, `n_threads`, `avg_ts`, `stddev_ts`, `samples_ts` columns, under the same
//! names). From each row's `speed_points`; a row without them (a file written before the
//! sweep) gives its `pp_*`/`tg_*` figures at depth 0 and the machine's thread count.
//! `flash_attn` (llama-bench's column, 0 or 1) is the flash-attention setting a llama.cpp
//! row's figures were measured at (under `--llama-fa best`, the faster of the two per
//! test; the other's figures are in results.json); it is empty for kwk's rows, which have
//! no such setting, and for files written before it was recorded.

use super::exporter::{Exporter, Run};
use crate::protocol::points::{test_name, PointSpeed};
use crate::protocol::results::{Results, RunnerRecord};
use anyhow::{Context, Result};

/// The file's columns, in order.
pub const HEADER: [&str; 15] = [
    "row",
    "engine",
    "kv_type",
    "test",
    "n_prompt",
    "n_gen",
    "n_depth",
    "n_threads",
    "primary",
    "reps",
    "avg_ts",
    "stddev_ts",
    "samples_ts",
    "rounds",
    "flash_attn",
];

/// speed_points.csv as an [`Exporter`].
pub struct SpeedPointsCsv;

impl Exporter for SpeedPointsCsv {
    fn file_name(&self) -> &'static str {
        "speed_points.csv"
    }
    fn serialize(&self, run: &Run<'_>) -> Result<Vec<u8>> {
        to_bytes(run.results)
    }
}

/// A row's points as written: its own, or those its `pp_*`/`tg_*` figures make.
fn points_of(results: &Results, r: &RunnerRecord) -> Vec<PointSpeed> {
    if !r.speed_points.is_empty() {
        return r.speed_points.clone();
    }
    let p = &results.protocol;
    let threads = results.machine.threads;
    [
        (
            "pp",
            p.pp,
            r.pp_tokens_per_s,
            r.pp_tokens_per_s_std,
            &r.pp_samples_tokens_per_s,
        ),
        (
            "tg",
            p.tg,
            r.tg_tokens_per_s,
            r.tg_tokens_per_s_std,
            &r.tg_samples_tokens_per_s,
        ),
    ]
    .into_iter()
    .filter(|x| x.2.is_some())
    .map(|(kind, n, mean, std, samples)| PointSpeed {
        test: test_name(kind, n, 0, None),
        kind: kind.into(),
        tokens: n,
        depth: 0,
        threads,
        primary: true,
        tokens_per_s: mean,
        tokens_per_s_std: std,
        samples_tokens_per_s: samples.clone(),
        rounds: Vec::new(),
        flash_attn: None,
        by_flash_attn: Vec::new(),
    })
    .collect()
}

fn join<T: ToString>(v: &[T]) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(" ")
}

/// The file's bytes: [`HEADER`], then one line per point of every row, rows in order.
pub fn to_bytes(results: &Results) -> Result<Vec<u8>> {
    let mut w = ::csv::Writer::from_writer(Vec::new());
    w.write_record(HEADER)?;
    let opt = |v: Option<f64>| v.map_or(String::new(), |x| x.to_string());
    for r in &results.runners {
        for p in points_of(results, r) {
            let (n_prompt, n_gen) = match p.kind.as_str() {
                "pp" => (p.tokens, 0),
                _ => (0, p.tokens),
            };
            w.write_record([
                r.name.clone(),
                r.engine.to_string(),
                r.kv_type.clone().unwrap_or_default(),
                p.test.clone(),
                n_prompt.to_string(),
                n_gen.to_string(),
                p.depth.to_string(),
                p.threads.to_string(),
                p.primary.to_string(),
                p.samples_tokens_per_s.len().to_string(),
                opt(p.tokens_per_s),
                opt(p.tokens_per_s_std),
                join(&p.samples_tokens_per_s),
                join(&p.rounds),
                p.flash_attn
                    .map_or(String::new(), |on| u8::from(on).to_string()),
            ])?;
        }
    }
    w.into_inner().context("finishing speed_points.csv")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::results::testdata::sample_results;

    fn read(bytes: &[u8]) -> (Vec<String>, Vec<Vec<String>>) {
        let mut rd = ::csv::Reader::from_reader(bytes);
        let header = rd.headers().unwrap().iter().map(String::from).collect();
        let rows = rd
            .records()
            .map(|r| r.unwrap().iter().map(String::from).collect())
            .collect();
        (header, rows)
    }

    /// A file without points gives each row's pp and tg at depth 0; a row with points gives
    /// one line per point, named after it, with llama-bench's columns.
    #[test]
    fn one_line_per_row_test_depth_and_threads() {
        let r = sample_results();
        let (header, rows) = read(&to_bytes(&r).unwrap());
        assert_eq!(header, HEADER);
        let with_pp = r
            .runners
            .iter()
            .filter(|x| x.pp_tokens_per_s.is_some())
            .count();
        let with_tg = r
            .runners
            .iter()
            .filter(|x| x.tg_tokens_per_s.is_some())
            .count();
        assert_eq!(rows.len(), with_pp + with_tg);
        assert!(rows
            .iter()
            .all(|l| l[6] == "0" && (l[3] == "pp16" || l[3] == "tg4")));
        let mut r = sample_results();
        r.runners[0].speed_points = vec![PointSpeed {
            test: "tg4@d64/t1".into(),
            kind: "tg".into(),
            tokens: 4,
            depth: 64,
            threads: 1,
            primary: false,
            tokens_per_s: Some(12.5),
            tokens_per_s_std: Some(0.5),
            samples_tokens_per_s: vec![12.0, 13.0],
            rounds: vec![0, 1],
            flash_attn: Some(false),
            by_flash_attn: Vec::new(),
        }];
        let (_, rows) = read(&to_bytes(&r).unwrap());
        let line = rows.iter().find(|l| l[0] == r.runners[0].name).unwrap();
        assert_eq!(
            line[3..],
            [
                "tg4@d64/t1",
                "0",
                "4",
                "64",
                "1",
                "false",
                "2",
                "12.5",
                "0.5",
                "12 13",
                "0 1",
                "0"
            ]
        );
        // A row without the setting (kwk's, or a file from before it) leaves it empty.
        assert!(rows
            .iter()
            .filter(|l| l[0] != r.runners[0].name)
            .all(|l| l[14].is_empty()));
    }
}

//! What a run prints on stdout (`--output`, as llama-bench's `-o`): the compact table with
//! its verdict lines (`table`, the default), every column (`wide`), or the results as
//! Markdown, CSV, JSON or JSON Lines (one runner per line) for another program. The data
//! formats are the run folder's files, byte for byte where there is one.

use super::exporter::{Exporter, Run};
use super::plot::PlotFiles;
use super::{csv, json, markdown, summary, terminal};
use crate::protocol::results::Results;
use anyhow::{Context, Result};

/// The `--output` choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum StdoutFormat {
    /// The compact table (fits 100 columns) and one verdict line per size.
    #[default]
    Table,
    /// Every column of the report's table (about 230 columns).
    Wide,
    /// report.md (without its plots).
    Md,
    /// results.csv.
    Csv,
    /// results.json.
    Json,
    /// One runner row of results.json per line.
    Jsonl,
}

impl StdoutFormat {
    /// Whether the output is for a person (then the run folder's path and the gate's
    /// summary follow on stdout) rather than for a parser (they go to stderr).
    pub fn for_people(self) -> bool {
        matches!(self, StdoutFormat::Table | StdoutFormat::Wide)
    }
}

/// The run folder's file of `exporter`, without plots.
fn file(exporter: &dyn Exporter, results: &Results) -> Result<String> {
    let run = Run {
        results,
        plots: &PlotFiles::default(),
    };
    String::from_utf8(exporter.serialize(&run)?).context(exporter.file_name())
}

/// `results` in `format`.
pub fn render(results: &Results, format: StdoutFormat) -> Result<String> {
    Ok(match format {
        StdoutFormat::Table => summary::render(results),
        StdoutFormat::Wide => terminal::render(results),
        StdoutFormat::Md => file(&markdown::Markdown, results)?,
        StdoutFormat::Csv => file(&csv::ResultsCsv, results)?,
        StdoutFormat::Json => file(&json::Json, results)?,
        StdoutFormat::Jsonl => {
            let mut s = String::new();
            for r in &results.runners {
                s.push_str(&serde_json::to_string(r).context("serializing a runner row")?);
                s.push('\n');
            }
            s
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::results::testdata::sample_results;
    use clap::ValueEnum;

    #[test]
    fn each_format_parses_as_what_it_claims() {
        let r = sample_results();
        for f in StdoutFormat::value_variants() {
            let out = render(&r, *f).unwrap();
            assert!(!out.is_empty(), "{f:?}");
            match f {
                StdoutFormat::Json => {
                    let back: Results = serde_json::from_str(&out).unwrap();
                    assert_eq!(back, r);
                }
                StdoutFormat::Jsonl => {
                    let rows: Vec<serde_json::Value> = out
                        .lines()
                        .map(|l| serde_json::from_str(l).unwrap())
                        .collect();
                    assert_eq!(rows.len(), r.runners.len());
                    assert_eq!(rows[1]["name"], "int4");
                }
                StdoutFormat::Csv => {
                    let mut rd = ::csv::Reader::from_reader(out.as_bytes());
                    assert_eq!(rd.records().count(), r.runners.len());
                }
                StdoutFormat::Md => {
                    assert!(out.starts_with("# kwk-eval: "), "{out}");
                    let table: Vec<&str> = out.lines().filter(|l| l.starts_with('|')).collect();
                    let bars = table[0].matches(" | ").count();
                    assert!(table
                        .iter()
                        .take(2 + r.runners.len())
                        .all(|l| l.matches('|').count() >= bars));
                }
                StdoutFormat::Table | StdoutFormat::Wide => {
                    assert!(out.lines().next().unwrap().contains("engine"), "{out}")
                }
            }
        }
    }
}

//! The exporters of [`Results`] (the type lives in [`crate::protocol::results`]): JSON,
//! CSV, Markdown, plots and the terminal table; and the comparisons of two results files,
//! `compare` and the `--baseline` gate built on it.
//!
//! `complete` is false until the last runner has finished, so a run that was interrupted
//! says so in every file it left. Files are written to a temporary name and renamed, so a
//! reader never sees half a file. Submodules depend on [`crate::protocol`], on the leaves
//! `table` and `files`, `gate` on `compare` and `markdown` on `plot` (the plot file names);
//! [`write_all`] here writes every file of a run folder.

pub mod compare;
pub mod csv;
pub mod files;
pub mod gate;
pub mod json;
pub mod markdown;
pub mod output;
pub mod plot;
pub mod summary;
pub mod table;
pub mod terminal;
#[cfg(test)]
mod unicode_tests;

pub use crate::protocol::results::{
    Engine, Machine, PairedChange, Protocol, Results, RunnerRecord, Versions, SCHEMA_VERSION,
};
use anyhow::Result;
use std::path::Path;

/// Every file [`write_all`] may write into a run folder; a run refuses a folder that holds
/// any of them already (it never overwrites what it did not write).
pub const REPORT_FILES: &[&str] = &[
    "results.json",
    "results.csv",
    "speed_ratios.csv",
    "report.md",
    "quality_vs_bpw.png",
    "quality_vs_bpw.svg",
    "quality_vs_speed.png",
    "quality_vs_speed.svg",
    "speed.png",
    "speed.svg",
];

/// Writes every report file of `results` into `dir`: results.json, results.csv,
/// speed_ratios.csv, report.md and the plots. Each goes through a temporary of its own
/// ([`files::write_atomically`]), removed on failure; no other file is touched.
pub fn write_all(dir: &Path, results: &Results) -> Result<()> {
    json::write(&dir.join("results.json"), results)?;
    csv::write(&dir.join("results.csv"), results)?;
    csv::write_ratios(&dir.join("speed_ratios.csv"), results)?;
    let plots = plot::write_plots(dir, results)?;
    markdown::write(&dir.join("report.md"), results, &plots)?;
    Ok(())
}

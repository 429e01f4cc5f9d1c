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
pub mod plot;
pub mod table;
pub mod terminal;

pub use crate::protocol::results::{
    Machine, PairedChange, Protocol, Results, RunnerRecord, Versions, SCHEMA_VERSION,
};
use anyhow::Result;
use std::path::Path;

/// Writes every report file of `results` into `dir`: results.json, results.csv,
/// report.md and the plots.
pub fn write_all(dir: &Path, results: &Results) -> Result<()> {
    json::write(&dir.join("results.json"), results)?;
    csv::write(&dir.join("results.csv"), results)?;
    let plots = plot::write_plots(dir, results)?;
    markdown::write(&dir.join("report.md"), results, &plots)?;
    Ok(())
}

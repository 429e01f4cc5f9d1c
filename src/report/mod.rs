//! The exporters of [`Results`] (the type lives in [`crate::protocol::results`]): JSON,
//! CSV, Markdown, plots and the terminal table; and the comparisons of two results files,
//! `compare` and the `--baseline` gate built on it.
//!
//! `complete` is false until the last runner has finished, so a run that was interrupted
//! says so in every file it left. Files are written to a temporary name and renamed, so a
//! reader never sees half a file. Submodules depend on [`crate::protocol`], on the leaves
//! `table` and `files`, `gate` on `compare` and `markdown` on `plot` and `plot_sweep` (the
//! plot file names; `plot_sweep` draws with `plot`'s helpers);
//! [`export`] lists the run folder's reports (one [`Exporter`] per data file, and the plots)
//! and [`write_all`] writes them.

pub mod compare;
pub mod csv;
pub mod export;
pub mod exporter;
pub mod files;
pub mod gate;
pub mod json;
pub mod labels;
pub mod markdown;
pub mod output;
pub mod pareto;
pub mod plot;
pub mod plot_sweep;
pub mod points_csv;
pub mod summary;
pub mod table;
pub mod terminal;
#[cfg(test)]
mod unicode_tests;

pub use crate::protocol::results::{
    Engine, Machine, PairedChange, Protocol, Results, RunnerRecord, Versions, SCHEMA_VERSION,
};
pub use export::{write_all, Exporter};
use std::sync::LazyLock;

/// Every file [`write_all`] may write into a run folder ([`export::report_files`]); a run
/// refuses a folder that holds any of them already (it never overwrites what it did not
/// write).
pub static REPORT_FILES: LazyLock<Vec<&'static str>> = LazyLock::new(export::report_files);

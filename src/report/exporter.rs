//! The [`Exporter`] trait every data file of a run folder implements (results.json, the
//! CSVs, report.md), and [`Run`], what it serializes. A leaf of `report`: the exporters
//! depend on it, and the list of them ([`super::export::REPORTS`]) on them.

use super::plot::PlotFiles;
use crate::protocol::results::Results;
use anyhow::Result;

/// What an exporter serializes: the results, and the plots drawn beside them (report.md
/// shows them; none on stdout).
pub struct Run<'a> {
    pub results: &'a Results,
    pub plots: &'a PlotFiles,
}

/// One report file made from a run.
pub trait Exporter: Sync {
    /// Its name in the run folder.
    fn file_name(&self) -> &'static str;
    /// Its bytes.
    fn serialize(&self, run: &Run<'_>) -> Result<Vec<u8>>;
}

//! The report files of a run folder, in the spirit of hyperfine's `export/`: each data file
//! is an [`Exporter`] that names its file and serializes the run into its bytes; the plots
//! are drawn into their own files by plotters ([`Report::Plots`]). [`REPORTS`] is the one
//! list: what a run writes ([`write_all`]), the files a run folder may hold and a run
//! refuses to overwrite ([`report_files`]), and the help's list of them follow from it. A
//! new exporter is a type implementing [`Exporter`] in its own file under `report/`, added
//! to [`REPORTS`].

pub use super::exporter::{Exporter, Run};
use super::files::write_atomically;
use super::plot::{self, PlotFiles};
use super::{csv, json, markdown, plot_sweep, points_csv};
use crate::protocol::results::Results;
use anyhow::Result;
use std::path::Path;

/// One entry of the run folder's reports.
pub enum Report {
    /// A file serialized from the results.
    File(&'static dyn Exporter),
    /// The plots, PNG and SVG each ([`plot::PLOT_FILES`]), drawn by plotters; each only
    /// when the results hold its figures.
    Plots,
    /// The speed sweep's plots ([`plot_sweep::SWEEP_PLOT_FILES`]), when it swept depth or
    /// threads.
    SweepPlots,
}

impl Report {
    /// The files this entry may write.
    pub fn file_names(&self) -> Vec<&'static str> {
        match self {
            Report::File(e) => vec![e.file_name()],
            Report::Plots => plot::PLOT_FILES.to_vec(),
            Report::SweepPlots => plot_sweep::SWEEP_PLOT_FILES.to_vec(),
        }
    }
}

/// The reports of a run folder in the order they are written: the data files first (a plot
/// that cannot be drawn still leaves results.json), then the plots, then report.md, which
/// shows them.
pub const REPORTS: &[Report] = &[
    Report::File(&json::Json),
    Report::File(&csv::ResultsCsv),
    Report::File(&csv::SpeedRatiosCsv),
    Report::File(&points_csv::SpeedPointsCsv),
    Report::Plots,
    Report::SweepPlots,
    Report::File(&markdown::Markdown),
];

/// Every file [`write_all`] may write into a run folder, in [`REPORTS`]' order.
pub fn report_files() -> Vec<&'static str> {
    REPORTS.iter().flat_map(Report::file_names).collect()
}

/// The data files' names in [`REPORTS`]' order (the plots left out), for the help.
pub fn data_file_names() -> Vec<&'static str> {
    REPORTS
        .iter()
        .filter_map(|r| match r {
            Report::File(e) => Some(e.file_name()),
            Report::Plots | Report::SweepPlots => None,
        })
        .collect()
}

/// Writes every report of `results` into `dir`, in [`REPORTS`]' order. Each file goes
/// through a temporary of its own ([`write_atomically`]), removed on failure; no other
/// file is touched.
pub fn write_all(dir: &Path, results: &Results) -> Result<()> {
    let mut plots = PlotFiles::default();
    for report in REPORTS {
        match report {
            Report::File(e) => {
                let run = Run {
                    results,
                    plots: &plots,
                };
                write_atomically(&dir.join(e.file_name()), &e.serialize(&run)?)?;
            }
            Report::Plots => plots = plot::write_plots(dir, results)?,
            Report::SweepPlots => {
                plot_sweep::write_sweep_plots(dir, results)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::results::testdata::sample_results;

    /// The list names each file once, and a run writes only files on it.
    #[test]
    fn a_run_writes_only_the_listed_files() {
        let files = report_files();
        let mut unique = files.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), files.len(), "{files:?}");
        let dir = tempfile::tempdir().unwrap();
        write_all(dir.path(), &sample_results()).unwrap();
        for e in std::fs::read_dir(dir.path()).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            assert!(files.contains(&name.as_str()), "{name} is not listed");
        }
        assert_eq!(
            data_file_names(),
            [
                "results.json",
                "results.csv",
                "speed_ratios.csv",
                "speed_points.csv",
                "report.md"
            ]
        );
    }
}

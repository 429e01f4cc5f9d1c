//! One evaluation run, as a one-way pipeline: [`crate::plan::make`] checks every input
//! and resolves the run (no folder is created for bad input), [`crate::prepare::prepare`]
//! loads the model, tokenizes and checks the baseline's identity, the run folder is claimed
//! ([`crate::run_folder`]: created or freshly named, locked, holding none of the files the
//! run writes), [`crate::measure::run`] measures every runner (rewriting the reports after
//! each row), and the exporters and the gate ([`crate::report`]) finish. Until the last
//! runner has finished every report says `complete: false`; a runner that failed makes the
//! process exit 2 at the end.
//!
//! Nothing finished is lost: a report write that fails (a full disk) is reported once and
//! the run goes on measuring; the reports are written again after the next row and at the
//! end, and if the last attempt fails too the table is still printed and the run exits 2
//! naming the file. On SIGINT/SIGTERM ([`crate::interrupt`]) the reports are written with
//! the rows that finished and `complete: false`, and the run exits 130/143. Every planned
//! row is in the reports with a `status` (`ok`, `failed`, `skipped` and why); `complete` is
//! true only when every row is `ok` and every report was written. On every way out the
//! files this run created are removed and only those ([`crate::scratch`]: the float32
//! reference log-probs unless `--keep-logits` on a finished run, the private copy of
//! `--text` llama.cpp reads, the reports' temporaries); nothing else in the folder is
//! touched.

use crate::interrupt::{self, Interrupted};
use crate::plan::EvalOptions;
use crate::protocol::results::{Results, RowStatus, RunnerRecord};
use crate::run_folder::{RunFolder, REFERENCE_LOGITS};
use crate::scratch::Scratch;
use crate::ui::{print_stdout, Reporter};
use crate::{ladder, measure, plan, prepare, report, text};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// How a run ended when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    GateFailed,
}

/// Writes every report of `Results` into a folder ([`report::write_all`], or a test's).
type WriteReports<'a> = Box<dyn FnMut(&Path, &Results) -> Result<()> + 'a>;

/// The reports of a run folder, rewritten after each row. A failed write does not stop
/// the run: it is remembered (and reported once), and [`Reports::finish`] tries again.
pub struct Reports<'a> {
    dir: PathBuf,
    write: WriteReports<'a>,
    failed: Option<anyhow::Error>,
    ui: &'a dyn Reporter,
}

impl<'a> Reports<'a> {
    pub fn new(
        dir: &Path,
        write: impl FnMut(&Path, &Results) -> Result<()> + 'a,
        ui: &'a dyn Reporter,
    ) -> Self {
        Reports {
            dir: dir.to_path_buf(),
            write: Box::new(write),
            failed: None,
            ui,
        }
    }

    /// Writes the reports; a failure is kept for [`Reports::finish`] and reported the
    /// first time.
    pub fn save(&mut self, results: &Results) {
        match (self.write)(&self.dir, results) {
            Ok(()) => {
                if self.failed.take().is_some() {
                    self.ui.note(&format!(
                        "the reports in '{}' are written again",
                        self.dir.display()
                    ));
                }
            }
            Err(e) => {
                if self.failed.is_none() {
                    self.ui.warn(&format!(
                        "{e:#}; measuring goes on, the reports are written again after the next row and at the end"
                    ));
                }
                self.failed = Some(e);
            }
        }
    }

    /// The last write: `results` once more; its error names the file that could not be
    /// written.
    pub fn finish(&mut self, results: &Results) -> Result<()> {
        self.failed = None;
        (self.write)(&self.dir, results).context("the reports could not be written (is the disk full?); the table above holds the figures")
    }
}

/// Runs the evaluation `args` describe.
pub fn evaluate(args: &EvalOptions, ui: &dyn Reporter) -> Result<Outcome> {
    let mut plan = plan::make(args, ui)?;
    // A depth past the model's context, or KV caches past the memory, before any work.
    crate::depth::check_before_run(&plan)?;
    if let (Some(ladder), Some(tools)) = (plan.ladder.clone(), plan.tools.clone()) {
        let settings = ladder::MakeSettings {
            llm: &plan.llm,
            tools: &tools,
            ik_tools: plan.ik_tools.as_ref(),
            threads: plan.threads,
            timeout: plan.tool_timeout,
        };
        let made = match ladder::make(&ladder, &settings, ui) {
            Err(_) if interrupt::requested() => {
                return Err(Interrupted {
                    kept: "stopped while making the ladder's GGUFs; no run folder was made (finished GGUFs stay cached)".into(),
                }
                .into())
            }
            r => r.context("making llama.cpp's ladder")?,
        };
        if !args.formats_given {
            ladder::matched::add_rows(&mut plan, &made.formats, ui)?;
        }
        // Each made GGUF runs on every peer (`--peer`), its record under each row's name.
        for f in made.formats {
            let record = made.made.iter().find(|(n, _)| *n == f.name());
            for row in ladder::rows_on_peers(&f, &plan.peers) {
                if let Some((_, m)) = record {
                    plan.made.push((row.name(), m.clone()));
                }
                plan.formats.push(row);
            }
        }
        plan.unmade = made.unmade;
        plan.not_made = made.not_made;
    }
    // GGUF headers are read before the model loads, so a bad file fails first.
    measure::build_llamacpp(&plan)?;
    let mut prep = match prepare::prepare(&plan, ui) {
        Err(_) if interrupt::requested() => {
            return Err(Interrupted {
                kept: "stopped before measuring; no run folder was made".into(),
            }
            .into())
        }
        r => r?,
    };
    let folder = claim_folder(args, &plan.out_dir)?;
    plan.out_dir = folder.path.clone();
    // The reference log-probs' file, reserved now (exclusive create): the run owns it and
    // removes it at the end unless kept; a file someone else made there is never touched.
    // The float32 row writes a partial file of its own (a fresh name) and renames it over
    // the reserved one once complete, so a killed run never leaves a file there that looks
    // complete. A loaded reference (`--reference`) is read where it is, never written.
    prep.protocol.logits_dir = Some(folder.path.clone());
    let mut partial = None;
    let mut reference = match &mut prep.protocol.reference_logits {
        Some(_) if prep.loaded_reference.is_some() => None,
        Some(r) => {
            *r = folder.path.join(REFERENCE_LOGITS);
            let p = Scratch::create(&folder.path, &format!("{REFERENCE_LOGITS}.partial"))?;
            prep.reference_partial = Some(p.path().to_path_buf());
            partial = Some(p);
            match Scratch::create_at(r) {
                Ok(s) => Some(s),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => bail!(
                    "--out '{}' already holds {REFERENCE_LOGITS}, which this run would overwrite; pass a new folder (or remove the old run)",
                    folder.path.display()
                ),
                Err(e) => return Err(e).with_context(|| format!("creating '{}'", r.display())),
            }
        }
        None => None,
    };
    // llama.cpp's tools read the text by path: they get the run's private copy of the
    // bytes hashed and tokenized, never --text itself (which may change meanwhile).
    let text_copy = if plan
        .formats
        .iter()
        .any(|f| matches!(f, crate::protocol::FormatSpec::Gguf { .. }))
    {
        let copy = text::private_copy(&plan.text, &folder.path)?;
        prep.stream.text_path = copy.path().to_path_buf();
        prep.stream.text_sha256 = Some(plan.text.sha256.clone());
        Some(copy)
    } else {
        None
    };
    ui.line(&format!("run folder: {}", plan.out_dir.display()));
    let mut results = prep.results.clone();
    results.not_made = plan.not_made.clone();
    let mut reports = Reports::new(&plan.out_dir, report::write_all, ui);
    reports.save(&results);
    let measured = measure::run(&plan, &prep, &mut results, &mut |r| reports.save(r), ui);
    drop(text_copy);
    let stopped = interrupt::requested();
    // Every planned row has a row: those never measured are `skipped`, with why.
    let why_skipped = match (&measured, stopped) {
        (_, true) => "not measured: the run was interrupted first".to_string(),
        (Err(e), false) => format!("not measured: the run stopped first ({e:#})"),
        (Ok(()), false) => "not measured".to_string(),
    };
    // Ladder rows whose GGUF could not be made are failed rows, saying why.
    results.runners.extend(plan.unmade.iter().cloned());
    for spec in &plan.formats {
        let name = spec.name();
        if !results.runners.iter().any(|r| r.name == name) {
            results.runners.push(RunnerRecord::skipped(
                &name,
                spec.engine(),
                why_skipped.clone(),
            ));
        }
    }
    results.complete = measured.is_ok() && !stopped && results.all_rows_ok();
    // The reference log-probs are a temporary file unless kept from a finished run.
    drop(partial);
    if let Some(r) = reference.take() {
        // Only a complete one (the float32 row recorded its digest): an empty or partial
        // file would only be refused later.
        let kept = plan.keep_logits
            && measured.is_ok()
            && !stopped
            && results.protocol.reference.is_some();
        if let Some(used) = results.protocol.reference.as_mut() {
            used.file = kept.then(|| r.path().display().to_string());
        }
        if kept {
            r.keep();
        }
    }
    let written = reports.finish(&results);
    if written.is_err() && results.complete {
        // Not every report was written: the run is not complete. Say so in results.json
        // if it can still be written (best effort: the error below names the failure).
        results.complete = false;
        let _ = report::json::write(&plan.out_dir.join(report::json::FILE_NAME), &results);
    }
    if stopped {
        if let Err(e) = written {
            ui.warn(&format!("{e:#}"));
        }
        return Err(Interrupted {
            kept: format!(
                "{} finished row(s) kept in '{}' (complete: false)",
                results
                    .runners
                    .iter()
                    .filter(|r| r.status != RowStatus::Skipped)
                    .count(),
                plan.out_dir.join(report::json::FILE_NAME).display()
            ),
        }
        .into());
    }
    measured?;
    // A person gets the table, the folder and the gate on stdout; a program gets only the
    // format it asked for there, and the rest on stderr.
    let people = args.output.for_people();
    let aside = |text: &str| -> Result<()> {
        if people {
            print_stdout(ui, text)
        } else {
            ui.stderr(text);
            Ok(())
        }
    };
    print_stdout(ui, &report::output::render(&results, args.output)?)?;
    aside(&format!("reports: {}\n", plan.out_dir.display()))?;
    written?;
    let mut outcome = Outcome::Passed;
    if let Some(b) = &plan.baseline {
        let gate = report::gate::run(&b.results, &results, &plan.limits);
        aside(&gate.summary(&b.path.display().to_string()))?;
        if !gate.passed() {
            outcome = Outcome::GateFailed;
        }
    }
    let failures: Vec<String> = results
        .failures()
        .map(|r| format!("{}: {}", r.name, r.error.as_deref().unwrap_or_default()))
        .collect();
    if !failures.is_empty() {
        bail!(
            "{} runner(s) failed: {}",
            failures.len(),
            failures.join("; ")
        );
    }
    Ok(outcome)
}

/// `--out` locked as given, or the default `runs/<stamp>` under a fresh name.
fn claim_folder(args: &EvalOptions, planned: &Path) -> Result<RunFolder> {
    if args.out.is_some() {
        return RunFolder::claim(planned);
    }
    let parent = planned.parent().unwrap_or(Path::new("."));
    let stamp = planned
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    RunFolder::fresh(parent, &stamp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::results::testdata::sample_results;
    use std::cell::Cell;

    /// A write that fails (a full disk) neither stops the run nor is forgotten: later
    /// rows are still saved, and the final write is retried; its error names the file.
    #[test]
    fn failed_report_writes_are_retried_and_the_last_one_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let calls = Cell::new(0);
        // Writes 1 and 2 fail as a full disk would, then the disk has room again.
        let fail_until = Cell::new(2);
        let write = |d: &Path, r: &Results| -> Result<()> {
            calls.set(calls.get() + 1);
            if calls.get() <= fail_until.get() {
                let p = d.join("results.json");
                return Err(std::io::Error::from(std::io::ErrorKind::StorageFull))
                    .with_context(|| format!("writing '{}'", p.display()));
            }
            report::write_all(d, r)
        };
        let mut reports = Reports::new(dir.path(), write, &crate::ui::Silent);
        let r = sample_results();
        reports.save(&r);
        assert!(reports.failed.is_some());
        reports.save(&r);
        reports.save(&r);
        assert!(reports.failed.is_none(), "a later write succeeded");
        reports.finish(&r).unwrap();
        assert_eq!(
            report::json::read(&dir.path().join("results.json")).unwrap(),
            r
        );
        assert_eq!(calls.get(), 4);

        // A disk that stays full: finish fails, naming the file.
        fail_until.set(usize::MAX);
        let mut reports = Reports::new(dir.path(), write, &crate::ui::Silent);
        reports.save(&r);
        let e = format!("{:#}", reports.finish(&r).unwrap_err());
        assert!(e.contains("could not be written"), "{e}");
        assert!(e.contains("results.json"), "{e}");
    }

    /// A real failed write (results.json's place is taken by a folder, so the rename
    /// fails) names the file, leaves no temporary of its own behind and touches no file
    /// of the user's, whatever its name.
    #[test]
    fn a_failed_write_names_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("results.json/x")).unwrap();
        let theirs = [".results.json.tmp", ".tmp.speed.svg", ".tmp.report.md"];
        for name in theirs {
            std::fs::write(dir.path().join(name), "the user's").unwrap();
        }
        let e = format!(
            "{:#}",
            report::write_all(dir.path(), &sample_results()).unwrap_err()
        );
        assert!(e.contains("results.json"), "{e}");
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                ".results.json.tmp",
                ".tmp.report.md",
                ".tmp.speed.svg",
                "results.json"
            ]
        );
        for name in theirs {
            assert_eq!(
                std::fs::read_to_string(dir.path().join(name)).unwrap(),
                "the user's"
            );
        }
    }
}

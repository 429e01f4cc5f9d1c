//! `kwk-eval sweep`: many kwk-eval runs from one sweep file ([`file`]), planned into cells
//! and shared jobs ([`plan`]), run one after another on this machine (`run --local`) or as
//! Slurm job arrays ([`slurm`]), and merged (`kwk-eval merge`) into one report.
//!
//! A sweep folder holds `sweep.toml` (the file's copy; `sweep-origin` names the original,
//! against whose folder its paths resolve), `shared/NN-MODEL/` (the caches' job) and
//! `shared/NN-MODEL-TEXT-float32/` (the float32 reference the cells load, done only when
//! its reference file is complete), `cells/NNN-.../` (each a plain kwk-eval run folder), `slurm/` (scripts, logs, `jobs.log` of what was submitted)
//! and `merged/`. A cell is done when its results.json says `complete: true`; kwk-eval
//! rewrites it after every row with `complete: false` until the end, so a folder half
//! written is never taken as done. A cell whose run holds the folder's lock is running; an
//! incomplete one that is not is moved aside to `NAME.incomplete-K` (nothing deleted) and
//! run again, by `sweep task` (what every Slurm task and `run --local` run) and so by
//! `sweep resume`, which submits only the cells neither done, running nor still queued.
//! Each cell, shared job and merge is a separate kwk-eval process (`program`), so no
//! command calls another in this process.

pub mod file;
pub mod plan;
pub mod slurm;

use crate::report;
use crate::ui::{print_stdout, Reporter};
use anyhow::{bail, Context, Result};
use file::Sweep;
use plan::Plan;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What `kwk-eval sweep` was asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum SweepAction {
    /// Print the cells and the shared work.
    Plan { file: PathBuf },
    /// Run every cell here, one after another, then merge.
    Local { file: PathBuf, out: PathBuf },
    /// Write the sbatch scripts and submit them (or only write them).
    Slurm {
        file: PathBuf,
        out: PathBuf,
        dry_run: bool,
    },
    /// Submit the cells of a sweep folder that are neither done, running nor queued.
    Resume {
        file: PathBuf,
        out: PathBuf,
        dry_run: bool,
    },
    /// One job of a sweep folder (what each Slurm task runs).
    Task { out: PathBuf, job: TaskJob },
}

/// One job of a sweep folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskJob {
    Shared(usize),
    Cell(usize),
    Merge,
}

/// `kwk-eval sweep ...`.
pub fn run(action: &SweepAction, ui: &dyn Reporter) -> Result<()> {
    match action {
        SweepAction::Plan { file } => {
            let s = file::read(file)?;
            print_stdout(ui, &plan::render(&plan::plan(&s), &program(&s)?))
        }
        SweepAction::Local { file, out } => local(file, out, ui),
        SweepAction::Slurm { file, out, dry_run } => submit(file, out, *dry_run, false, ui),
        SweepAction::Resume { file, out, dry_run } => submit(file, out, *dry_run, true, ui),
        SweepAction::Task { out, job } => task(out, *job, ui),
    }
}

/// The kwk-eval every job runs: the file's `kwk_eval`, else this program when it is a
/// kwk-eval binary (not, say, the Python interpreter running `python -m kwk.bench`).
fn program(s: &Sweep) -> Result<String> {
    if let Some(p) = &s.kwk_eval {
        return Ok(p.display().to_string());
    }
    let exe = std::env::current_exe()
        .context("finding this kwk-eval's path for the jobs; set kwk_eval in the sweep file")?;
    let name = exe
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !name.starts_with("kwk-eval") && !name.starts_with("kwk_eval") {
        bail!(
            "this program is '{}', not a kwk-eval binary the jobs can run; set kwk_eval = \"/path/to/kwk-eval\" in the sweep file",
            exe.display()
        );
    }
    Ok(exe.display().to_string())
}

const COPY: &str = "sweep.toml";
const ORIGIN: &str = "sweep-origin";

/// Makes `out` the folder of `file`'s sweep: a new folder gets the file's copy; an
/// existing one must hold a copy of the same bytes.
fn claim_folder(file: &Path, out: &Path) -> Result<Sweep> {
    let s = file::read(file)?;
    let copy = out.join(COPY);
    if copy.exists() {
        let old = std::fs::read_to_string(&copy)
            .with_context(|| format!("reading '{}'", copy.display()))?;
        if old != s.source {
            bail!(
                "sweep folder '{}' was made from another version of the sweep file (its copy is '{}'); pass a new --out, or the same file",
                out.display(),
                copy.display()
            );
        }
    } else {
        std::fs::create_dir_all(out).with_context(|| format!("creating '{}'", out.display()))?;
        let origin = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
        std::fs::write(out.join(ORIGIN), origin.display().to_string())
            .with_context(|| format!("writing into '{}'", out.display()))?;
        std::fs::write(&copy, &s.source)
            .with_context(|| format!("writing '{}'", copy.display()))?;
    }
    Ok(s)
}

/// The sweep of a sweep folder (its copy, its paths against the original's folder).
fn folder_sweep(out: &Path) -> Result<Sweep> {
    let copy = out.join(COPY);
    let source = std::fs::read_to_string(&copy).with_context(|| {
        format!(
            "'{}' is not a sweep folder (no {COPY}); make one with kwk-eval sweep slurm or sweep run --local",
            out.display()
        )
    })?;
    let origin = std::fs::read_to_string(out.join(ORIGIN)).unwrap_or_default();
    let path = if origin.trim().is_empty() {
        copy
    } else {
        PathBuf::from(origin.trim())
    };
    file::parse(&path, &source)
}

/// Where a cell (or shared job) folder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// No folder yet.
    Missing,
    /// A kwk-eval run holds its lock.
    Running,
    /// Its results.json says `complete: true`.
    Complete,
    /// A folder without a complete results.json that no run holds.
    Incomplete,
}

/// The state of the run folder `dir`.
pub fn state(dir: &Path) -> State {
    if !dir.is_dir() {
        return State::Missing;
    }
    if locked(dir) {
        return State::Running;
    }
    match report::json::read(&dir.join(report::json::FILE_NAME)) {
        Ok(r) if r.complete => State::Complete,
        _ => State::Incomplete,
    }
}

/// Whether a kwk-eval run holds `dir`'s lock (`run_folder`'s exclusive flock).
fn locked(dir: &Path) -> bool {
    #[cfg(unix)]
    {
        use rustix::fs::{flock, FlockOperation};
        if let Ok(f) = std::fs::File::open(dir) {
            return matches!(
                flock(&f, FlockOperation::NonBlockingLockExclusive),
                Err(rustix::io::Errno::WOULDBLOCK)
            );
        }
    }
    false
}

/// Moves an incomplete folder aside to `NAME.incomplete-K` (the first free K).
fn move_aside(dir: &Path, ui: &dyn Reporter) -> Result<()> {
    for k in 1..1000 {
        let to = dir.with_file_name(format!(
            "{}.incomplete-{k}",
            dir.file_name().unwrap_or_default().to_string_lossy()
        ));
        if !to.exists() {
            std::fs::rename(dir, &to)
                .with_context(|| format!("moving the incomplete '{}' aside", dir.display()))?;
            ui.note(&format!(
                "'{}' was not complete; kept as '{}', run again",
                dir.display(),
                to.display()
            ));
            return Ok(());
        }
    }
    bail!(
        "'{}' has 999 incomplete copies beside it; remove some",
        dir.display()
    )
}

/// Runs one kwk-eval into `dir` unless it is complete there already.
fn run_into(
    program: &str,
    args: &[String],
    dir: &Path,
    what: &str,
    ui: &dyn Reporter,
) -> Result<()> {
    match state(dir) {
        State::Complete => {
            ui.note(&format!(
                "{what} is complete in '{}'; left as it is",
                dir.display()
            ));
            return Ok(());
        }
        State::Running => bail!(
            "{what}: '{}' is in use by a running kwk-eval; wait for it",
            dir.display()
        ),
        State::Incomplete => move_aside(dir, ui)?,
        State::Missing => {}
    }
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating '{}'", parent.display()))?;
    }
    ui.line(&format!("{what}: {}", plan::shell_line(program, args)));
    let status = Command::new(program)
        .args(args)
        .arg("--out")
        .arg(dir)
        .status()
        .with_context(|| format!("running '{program}' for {what}"))?;
    if !status.success() {
        bail!(
            "{what}: kwk-eval ended with {status}; its folder '{}' is run again by kwk-eval sweep resume",
            dir.display()
        );
    }
    Ok(())
}

/// Whether shared job `j`'s folder `dir` is done: a complete run, and for a reference job
/// a complete reference file in it (its trailer read, not its digest).
fn shared_done(j: &plan::Shared, dir: &Path) -> bool {
    state(dir) == State::Complete
        && match j.kind {
            plan::SharedKind::Caches => true,
            plan::SharedKind::Reference { .. } => {
                crate::eval::base_file::read_identity(&plan::reference_file(dir)).is_ok()
            }
        }
}

/// Runs shared job `j` into its folder unless it is done; a complete run whose reference
/// file is missing or incomplete is moved aside and run again.
fn run_shared(prog: &str, j: &plan::Shared, out: &Path, ui: &dyn Reporter) -> Result<()> {
    let dir = plan::shared_dir(out).join(&j.name);
    if state(&dir) == State::Complete && !shared_done(j, &dir) {
        ui.note(&format!(
            "shared {}: its run is complete but '{}' is not a complete reference",
            j.name,
            plan::reference_file(&dir).display()
        ));
        move_aside(&dir, ui)?;
    }
    run_into(prog, &j.args, &dir, &format!("shared {}", j.name), ui)
}

/// The folders of every cell of `p`, in order.
fn cell_dirs(p: &Plan, out: &Path) -> Vec<PathBuf> {
    p.cells
        .iter()
        .map(|c| plan::cells_dir(out).join(&c.name))
        .collect()
}

/// One job of the sweep folder `out`.
fn task(out: &Path, job: TaskJob, ui: &dyn Reporter) -> Result<()> {
    let s = folder_sweep(out)?;
    let p = plan::plan(&s);
    let prog = program(&s)?;
    match job {
        TaskJob::Shared(i) => {
            let Some(j) = p.shared.get(i) else {
                bail!(
                    "--shared {i}: the sweep has {} shared job(s)",
                    p.shared.len()
                );
            };
            run_shared(&prog, j, out, ui)
        }
        TaskJob::Cell(i) => {
            let Some(c) = p.cells.get(i) else {
                bail!(
                    "--cell {i}: the sweep has {} cells (0 to {})",
                    p.cells.len(),
                    p.cells.len().saturating_sub(1)
                );
            };
            let dir = plan::cells_dir(out).join(&c.name);
            let args = plan::cell_command(c, out);
            run_into(&prog, &args, &dir, &format!("cell {}", c.name), ui)
        }
        TaskJob::Merge => merge(&prog, &p, out, ui),
    }
}

/// The merged folders of a sweep and their cells: `merged/` of every cell, or with
/// several texts (which one report cannot hold: merge refuses cells of two texts)
/// `merged-TEXT/` of each text's cells.
fn merge_groups(p: &Plan, out: &Path) -> Vec<(PathBuf, Vec<PathBuf>)> {
    let mut texts: Vec<&Path> = Vec::new();
    for c in &p.cells {
        if !texts.contains(&c.text.as_path()) {
            texts.push(&c.text);
        }
    }
    texts
        .iter()
        .map(|t| {
            let dir = if texts.len() == 1 {
                out.join("merged")
            } else {
                out.join(format!("merged-{}", plan::text_short(t)))
            };
            let cells = p
                .cells
                .iter()
                .filter(|c| c.text == *t)
                .map(|c| plan::cells_dir(out).join(&c.name))
                .collect();
            (dir, cells)
        })
        .collect()
}

/// `kwk-eval merge` of the cells into `out/merged` (or one folder per text; an older
/// merge moved aside).
fn merge(prog: &str, p: &Plan, out: &Path, ui: &dyn Reporter) -> Result<()> {
    for (merged, cells) in merge_groups(p, out) {
        if merged.exists() {
            move_aside(&merged, ui)?;
        }
        let mut args: Vec<String> = vec!["merge".into()];
        args.extend(cells.iter().map(|d| d.display().to_string()));
        args.extend(["--out".into(), merged.display().to_string()]);
        ui.line(&format!("merge: {}", plan::shell_line(prog, &args)));
        let status = Command::new(prog)
            .args(&args)
            .status()
            .with_context(|| format!("running '{prog}' merge"))?;
        if !status.success() {
            bail!(
                "merging the cells into '{}' failed ({status})",
                merged.display()
            );
        }
    }
    Ok(())
}

/// `sweep run --local`: the shared jobs, then every cell, here, one after another; then
/// the merge. A cell that fails does not stop the others; the run exits 2 naming them.
fn local(file: &Path, out: &Path, ui: &dyn Reporter) -> Result<()> {
    claim_folder(file, out)?;
    let s = folder_sweep(out)?;
    let p = plan::plan(&s);
    let prog = program(&s)?;
    let mut failed = Vec::new();
    for j in &p.shared {
        if let Err(e) = run_shared(&prog, j, out, ui) {
            ui.warn(&format!("{e:#}"));
            failed.push(format!("shared {}", j.name));
        }
    }
    for (c, dir) in p.cells.iter().zip(cell_dirs(&p, out)) {
        let args = plan::cell_command(c, out);
        if let Err(e) = run_into(&prog, &args, &dir, &format!("cell {}", c.name), ui) {
            ui.warn(&format!("{e:#}"));
            failed.push(format!("cell {}", c.name));
        }
    }
    let cells_failed = failed.iter().filter(|f| f.starts_with("cell")).count();
    if cells_failed > 0 {
        bail!(
            "{cells_failed} of {} cells failed ({}); run the same command again to re-run only them",
            p.cells.len(),
            failed.join(", ")
        );
    }
    merge(&prog, &p, out, ui)
}

/// `sweep slurm` (a new sweep folder; `resume`: an existing one): the scripts written and
/// the shared array, the cells' array (after it) and the merge (after them) submitted,
/// each only for what is neither done, running nor queued.
fn submit(file: &Path, out: &Path, dry_run: bool, resume: bool, ui: &dyn Reporter) -> Result<()> {
    let jobs_log = slurm::slurm_dir(out).join("jobs.log");
    if resume && !out.join(COPY).exists() {
        bail!(
            "'{}' is not a sweep folder (no {COPY}); start it with kwk-eval sweep slurm",
            out.display()
        );
    }
    if !resume && jobs_log.exists() {
        bail!(
            "sweep folder '{}' was submitted already (see '{}'); use kwk-eval sweep resume to submit what is missing",
            out.display(),
            jobs_log.display()
        );
    }
    claim_folder(file, out)?;
    let s = folder_sweep(out)?;
    let p = plan::plan(&s);
    let prog = program(&s)?;
    let scripts = slurm::write_scripts(&s, &p, out, Path::new(&prog))?;
    let queued = if resume && !dry_run {
        let q = slurm::queued_cells(out);
        if q.is_none() {
            ui.warn("squeue did not answer: cells still queued cannot be told apart and may be submitted twice");
        }
        q.unwrap_or_default()
    } else {
        Vec::new()
    };
    let mut todo = Vec::new();
    let mut complete = 0;
    for (c, dir) in p.cells.iter().zip(cell_dirs(&p, out)) {
        match state(&dir) {
            State::Complete => complete += 1,
            State::Running => ui.note(&format!("cell {} is running; not submitted again", c.name)),
            _ if queued.contains(&c.index) => {
                ui.note(&format!("cell {} is queued; not submitted again", c.name))
            }
            _ => todo.push(c.index),
        }
    }
    let shared_todo: Vec<usize> = p
        .shared
        .iter()
        .filter(|j| !todo.is_empty() && !shared_done(j, &plan::shared_dir(out).join(&j.name)))
        .map(|j| j.index)
        .collect();
    let merged_done = merge_groups(&p, out)
        .iter()
        .all(|(m, _)| state(m) == State::Complete);
    if todo.is_empty() && (merged_done || complete < p.cells.len()) {
        return print_stdout(
            ui,
            &format!(
                "nothing to submit: {} of {} cells complete{}\n",
                complete,
                p.cells.len(),
                if merged_done {
                    ", merged"
                } else {
                    ", the rest queued or running"
                }
            ),
        );
    }
    let mut plan_lines = Vec::new();
    let mut log = String::new();
    let mut dependency: Option<String> = None;
    let mut step =
        |what: &'static str, args: Vec<String>, dep: Option<String>| -> Result<Option<String>> {
            let sub = slurm::Submission { what, args };
            if dry_run {
                plan_lines.push(sub.line(dep.as_deref()));
                return Ok(Some(format!("<{what}>")));
            }
            let id = sub.submit(dep.as_deref())?;
            log.push_str(&format!("{what} {id} {}\n", sub.line(dep.as_deref())));
            plan_lines.push(format!("{what}: job {id}"));
            Ok(Some(id))
        };
    // The cells wait for the shared jobs to end whatever their outcome (a cell makes the
    // caches' contents it misses itself; one whose reference job failed stops at once,
    // naming the missing file, and resume runs both again); the merge needs every cell ok.
    if let (Some(script), false) = (&scripts.shared, shared_todo.is_empty()) {
        dependency = step(
            "shared",
            vec![
                format!("--array={}", slurm::array_spec(&shared_todo, None)),
                script.display().to_string(),
            ],
            None,
        )?
        .map(|id| format!("afterany:{id}"));
    }
    if !todo.is_empty() {
        dependency = step(
            "cells",
            vec![
                format!("--array={}", slurm::array_spec(&todo, s.slurm.max_parallel)),
                scripts.cells.display().to_string(),
            ],
            dependency,
        )?
        .map(|id| format!("afterok:{id}"));
    }
    step(
        "merge",
        vec![scripts.merge.display().to_string()],
        dependency,
    )?;
    if !log.is_empty() {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&jobs_log)
            .with_context(|| format!("writing '{}'", jobs_log.display()))?;
        f.write_all(log.as_bytes())
            .with_context(|| format!("writing '{}'", jobs_log.display()))?;
    }
    let head = if dry_run {
        format!(
            "dry run: scripts in '{}'; would submit {} cell(s):\n",
            slurm::slurm_dir(out).display(),
            todo.len()
        )
    } else {
        format!("submitted {} cell(s) of '{}':\n", todo.len(), out.display())
    };
    print_stdout(ui, &format!("{head}{}\n", plan_lines.join("\n")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::results::testdata::sample_results;

    /// Only a results.json saying `complete: true` is done; a partial file, one saying
    /// false, and a folder a run holds are not.
    #[test]
    fn a_cell_is_done_only_when_its_results_say_complete() {
        let dir = tempfile::tempdir().unwrap();
        let cell = dir.path().join("000-m-int8-t1");
        assert_eq!(state(&cell), State::Missing);
        std::fs::create_dir(&cell).unwrap();
        assert_eq!(state(&cell), State::Incomplete);
        let mut r = sample_results();
        r.complete = false;
        report::json::write(&cell.join("results.json"), &r).unwrap();
        assert_eq!(state(&cell), State::Incomplete);
        let full = std::fs::read_to_string(cell.join("results.json")).unwrap();
        std::fs::write(cell.join("results.json"), &full[..full.len() / 2]).unwrap();
        assert_eq!(state(&cell), State::Incomplete);
        r.complete = true;
        report::json::write(&cell.join("results.json"), &r).unwrap();
        assert_eq!(state(&cell), State::Complete);
        let other = dir.path().join("001-m-int4-t1");
        let held = crate::run_folder::RunFolder::claim(&other).unwrap();
        assert_eq!(state(&other), State::Running);
        drop(held);
        assert_eq!(state(&other), State::Incomplete);
        move_aside(&other, &crate::ui::Silent).unwrap();
        assert!(dir.path().join("001-m-int4-t1.incomplete-1").is_dir());
    }

    #[test]
    fn several_texts_merge_into_one_folder_each() {
        let dir = tempfile::tempdir().unwrap();
        for t in ["a.txt", "b.txt"] {
            std::fs::write(dir.path().join(t), "x").unwrap();
        }
        let s = file::parse(
            &dir.path().join("s.toml"),
            "models = [\"m\"]\ntexts = [\"a.txt\", \"b.txt\"]\nformats = [\"int8\"]\nthreads = [1]\n",
        )
        .unwrap();
        let g = merge_groups(&plan::plan(&s), Path::new("/o"));
        assert_eq!(g.len(), 2);
        assert_eq!(g[1].0, Path::new("/o/merged-b"));
        assert_eq!(g[1].1, [Path::new("/o/cells/001-m-b-int8-t1")]);
    }
}

//! `kwk-eval merge DIR... --out DIR`: run folders (the cells of a sweep, or any runs of one
//! protocol) put together into one report, written by the same exporters as a single run
//! ([`crate::report::write_all`]).
//!
//! Every cell must be complete (`complete: true` in its results.json: kwk-eval rewrites the
//! file after each row with `complete: false`, so a folder still running, interrupted or
//! with a failed row is never taken as done) and of one protocol: the same text (SHA-256),
//! ctx, chunks, speed test and llama.cpp KV type for all cells, and for cells of the same
//! model also the same tokens (ids, BOS, count). A row two cells both measured (the float32
//! reference each carries, llama.cpp's F32 row of each ladder cell) must have the same
//! perplexity to the last bit: that is the reference identity. Anything else stops the merge
//! with one line naming both cells (exit 2).
//!
//! Rows keep every figure of their cell as it was written; only their names gain what tells
//! cells apart when it varies (`MODEL/` when there are several models, `@tN` when thread
//! counts differ, `@dD` when the speed tests' depths differ (a sweep over depths, issue 39),
//! `@CELL` when CPUs differ). Each cell's machine, protocol and versions are
//! kept in `cells`, each row names its cell. Speed ratios: each cell's own paired ratios,
//! plus unpaired ones (`rounds: 0`, ratio of medians) between rows of different cells of the
//! same model, thread count and CPU; across CPUs only with `--speed-across-machines`.

use crate::protocol::results::{
    Cell, Engine, Machine, Protocol, Results, RunnerRecord, SpeedRatio,
};
use crate::report;
use crate::report::output::StdoutFormat;
use crate::run_folder::RunFolder;
use crate::ui::{print_stdout, Reporter};
use anyhow::{bail, Context, Result};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// What `kwk-eval merge` was asked for.
#[derive(Debug, Clone)]
pub struct MergeOptions {
    /// Run folders (or their results.json files).
    pub dirs: Vec<PathBuf>,
    /// The merged report's folder (created; must not hold a report).
    pub out: PathBuf,
    /// Also put speeds measured on different CPUs into one ratio.
    pub speed_across_machines: bool,
}

/// One cell as read: its name (its folder's), the path given and its results.
#[derive(Debug, Clone)]
pub struct CellRun {
    pub name: String,
    pub dir: PathBuf,
    pub results: Results,
}

/// `kwk-eval merge`: reads, checks and merges the cells, writes the reports into `--out`
/// and prints the table.
pub fn run(opts: &MergeOptions, ui: &dyn Reporter) -> Result<()> {
    let cells = read_cells(&opts.dirs)?;
    let merged = merge(&cells, opts.speed_across_machines)?;
    let kwk_builds: BTreeSet<Option<&str>> = cells
        .iter()
        .map(|c| c.results.versions.kwk.as_deref())
        .collect();
    if kwk_builds.len() > 1 {
        ui.warn("the cells ran different kwk builds (each cell's is in results.json `cells`)");
    }
    let folder = RunFolder::claim(&opts.out)?;
    report::write_all(&folder.path, &merged)
        .with_context(|| format!("writing the merged reports into '{}'", opts.out.display()))?;
    print_stdout(ui, &report::output::render(&merged, StdoutFormat::Table)?)?;
    print_stdout(
        ui,
        &format!(
            "merged {} cells ({} rows): {}\n",
            cells.len(),
            merged.runners.len(),
            folder.path.display()
        ),
    )
}

/// Reads every cell's results.json (a folder or the file itself), refusing a missing or
/// incomplete one and two cells of the same name.
pub fn read_cells(dirs: &[PathBuf]) -> Result<Vec<CellRun>> {
    let mut cells: Vec<CellRun> = Vec::new();
    for given in dirs {
        let (dir, file) = if given.is_dir() {
            (given.clone(), given.join(report::json::FILE_NAME))
        } else {
            let parent = given.parent().unwrap_or(Path::new(".")).to_path_buf();
            (parent, given.clone())
        };
        if !file.exists() {
            bail!(
                "cell '{}' holds no results.json (never run, or still starting); run it (kwk-eval sweep resume) or leave it out",
                given.display()
            );
        }
        // `complete` first: a folder a killed run left may hold a partial file.
        let complete = std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v.get("complete").and_then(serde_json::Value::as_bool));
        if complete == Some(false) {
            bail!(
                "cell '{}' is not complete (its results.json says complete: false: a run still going, interrupted, or with a failed or skipped row); re-run it (kwk-eval sweep resume) or leave it out",
                given.display()
            );
        }
        let results = report::json::read(&file)?;
        if !results.complete {
            bail!(
                "cell '{}' is not complete (complete is not true in its results.json); re-run it (kwk-eval sweep resume) or leave it out",
                given.display()
            );
        }
        let name = std::fs::canonicalize(&dir)
            .unwrap_or_else(|_| dir.clone())
            .file_name()
            .map_or_else(
                || dir.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
        if let Some(other) = cells.iter().find(|c| c.name == name) {
            bail!(
                "cells '{}' and '{}' have the same folder name '{name}'; merge cells of distinct names",
                other.dir.display(),
                given.display()
            );
        }
        cells.push(CellRun {
            name,
            dir: given.clone(),
            results,
        });
    }
    if cells.is_empty() {
        bail!("merge needs at least one run folder");
    }
    Ok(cells)
}

/// One protocol field that must agree: its name and the two values, when they differ.
fn differ<T: PartialEq + std::fmt::Debug>(field: &str, a: &T, b: &T) -> Option<String> {
    (a != b).then(|| format!("{field} ({a:?} vs {b:?})"))
}

/// The protocol fields every cell must share, and those cells of one model must share.
fn protocol_differences(a: &Protocol, b: &Protocol) -> Vec<String> {
    let mut d: Vec<String> = [
        differ("text sha256", &a.text_sha256, &b.text_sha256),
        differ("ctx", &a.ctx, &b.ctx),
        differ("chunks", &a.chunks, &b.chunks),
        differ("speed measured", &a.speed, &b.speed),
        differ("pp", &a.pp, &b.pp),
        differ("tg", &a.tg, &b.tg),
        differ("reps", &a.reps, &b.reps),
        differ("llama.cpp KV type", &a.llama_kv_type, &b.llama_kv_type),
        // Only between cells that both ran llama-bench: a cell without GGUF rows has none.
        a.llama_bench_fa
            .as_ref()
            .zip(b.llama_bench_fa.as_ref())
            .and_then(|(x, y)| differ("llama-bench -fa", x, y)),
    ]
    .into_iter()
    .flatten()
    .collect();
    if a.model_sha256 == b.model_sha256 {
        d.extend(
            [
                differ("token ids sha256", &a.tokens_sha256, &b.tokens_sha256),
                differ("text tokens", &a.text_tokens, &b.text_tokens),
                differ("scored tokens", &a.scored_tokens, &b.scored_tokens),
                differ("BOS", &(a.add_bos, a.bos_id), &(b.add_bos, b.bos_id)),
            ]
            .into_iter()
            .flatten(),
        );
        // The float32 reference's log-probs, when both cells name theirs (files written
        // before the field name none; the float32 rows' perplexity is checked either way).
        if let (Some(x), Some(y)) = (&a.reference, &b.reference) {
            d.extend(differ("float32 reference sha256", &x.sha256, &y.sha256));
        }
    }
    d
}

/// Checks that every cell follows the first's protocol (and its model's first cell's
/// tokens): an error naming both cells and what differs otherwise.
pub fn check_identity(cells: &[CellRun]) -> Result<()> {
    for (i, c) in cells.iter().enumerate() {
        // Against the first cell, and against the first cell of the same model (tokens).
        let first_of_model = cells[..i]
            .iter()
            .find(|o| o.results.protocol.model_sha256 == c.results.protocol.model_sha256);
        for other in [cells.first(), first_of_model].into_iter().flatten() {
            if std::ptr::eq(other, c) {
                continue;
            }
            let d = protocol_differences(&other.results.protocol, &c.results.protocol);
            if !d.is_empty() {
                bail!(
                    "cells '{}' and '{}' differ in {}: not one protocol; merge only cells of one sweep (same text, ctx, chunks, speed test, and tokens per model)",
                    other.dir.display(),
                    c.dir.display(),
                    d.join(", ")
                );
            }
        }
    }
    Ok(())
}

/// The short name of a model as `--llm` named it: the last path component, without
/// `.gguf` (also a sweep cell's).
pub fn model_short(model: &str) -> String {
    let last = model
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(model);
    last.strip_suffix(".gguf").unwrap_or(last).to_string()
}

/// What tells cells apart in row names.
struct Naming {
    /// Each model's label by its content's SHA-256, when there are several models: its
    /// short name, `-2`, `-3`, ... after it when two share one.
    models: Option<Vec<(String, String)>>,
    threads: bool,
    depths: bool,
    cpus: bool,
}

/// The depths of a run's speed tests as a row name's `@d` suffix shows them
/// ([`Protocol::depth_key`]).
fn depth_key(r: &Results) -> String {
    r.protocol.depth_key()
}

impl Naming {
    fn of(cells: &[CellRun]) -> Naming {
        let count = |f: &dyn Fn(&Results) -> String| {
            cells
                .iter()
                .map(|c| f(&c.results))
                .collect::<BTreeSet<_>>()
                .len()
        };
        let mut labels: Vec<(String, String)> = Vec::new();
        for c in cells {
            let sha = &c.results.protocol.model_sha256;
            if labels.iter().any(|(s, _)| s == sha) {
                continue;
            }
            let short = model_short(&c.results.model);
            let mut label = short.clone();
            let mut n = 1;
            while labels.iter().any(|(_, l)| *l == label) {
                n += 1;
                label = format!("{short}-{n}");
            }
            labels.push((sha.clone(), label));
        }
        Naming {
            models: (labels.len() > 1).then_some(labels),
            threads: count(&|r| r.machine.threads.to_string()) > 1,
            depths: count(&depth_key) > 1,
            cpus: count(&|r| machine_key(&r.machine)) > 1,
        }
    }

    fn row(&self, cell: &CellRun, row: &str) -> String {
        let mut s = String::new();
        if let Some(labels) = &self.models {
            let sha = &cell.results.protocol.model_sha256;
            if let Some((_, l)) = labels.iter().find(|(x, _)| x == sha) {
                s.push_str(l);
                s.push('/');
            }
        }
        s.push_str(row);
        if self.threads {
            s.push_str(&format!("@t{}", cell.results.machine.threads));
        }
        if self.depths {
            s.push_str(&format!("@d{}", depth_key(&cell.results)));
        }
        if self.cpus {
            s.push('@');
            s.push_str(&cell.name);
        }
        s
    }
}

/// The identity of a machine for speed: its CPU and its features.
fn machine_key(m: &Machine) -> String {
    format!("{} [{}]", m.cpu, m.isa.join(","))
}

/// The merged results of `cells` (checked first: [`check_identity`], then each row
/// measured twice must agree).
pub fn merge(cells: &[CellRun], speed_across_machines: bool) -> Result<Results> {
    check_identity(cells)?;
    let naming = Naming::of(cells);
    let first = &cells[0].results;
    let mut runners: Vec<RunnerRecord> = Vec::new();
    let mut cell_records = Vec::new();
    let mut origin: Vec<Origin> = Vec::new();
    let mut ratios: Vec<SpeedRatio> = Vec::new();
    for (ci, c) in cells.iter().enumerate() {
        let mut rows = Vec::new();
        for r in &c.results.runners {
            let name = naming.row(c, &r.name);
            if let Some(k) = runners.iter().position(|x| x.name == name) {
                let kept = &runners[k];
                if kept.ppl.map(f64::to_bits) != r.ppl.map(f64::to_bits) || kept.engine != r.engine
                {
                    bail!(
                        "cells '{}' and '{}' both measured row '{}' with different perplexity ({} vs {}): not the same reference or build; merge only cells of one sweep",
                        cells[origin[k].cell].dir.display(),
                        c.dir.display(),
                        r.name,
                        fmt_ppl(kept.ppl),
                        fmt_ppl(r.ppl)
                    );
                }
                continue;
            }
            let mut row = r.clone();
            row.name = name.clone();
            row.cell = Some(c.name.clone());
            if let Some(cmp) = &mut row.compare_to {
                cmp.row = naming.row(c, &cmp.row);
            }
            runners.push(row);
            origin.push(Origin {
                cell: ci,
                name: r.name.clone(),
            });
            rows.push(name);
        }
        for x in &c.results.speed_ratios {
            let (row, vs) = (naming.row(c, &x.row), naming.row(c, &x.vs));
            if !ratios
                .iter()
                .any(|y| y.test == x.test && y.row == row && y.vs == vs)
            {
                ratios.push(SpeedRatio {
                    row,
                    vs,
                    ..x.clone()
                });
            }
        }
        cell_records.push(Cell {
            name: c.name.clone(),
            dir: c.dir.display().to_string(),
            model: c.results.model.clone(),
            started_utc: c.results.started_utc.clone(),
            machine: c.results.machine.clone(),
            versions: c.results.versions.clone(),
            protocol: c.results.protocol.clone(),
            rows,
        });
    }
    fill_deltas(cells, &origin, &mut runners);
    ratios.extend(unpaired_ratios(
        cells,
        &origin,
        &runners,
        &ratios,
        speed_across_machines,
    ));
    let mut models: Vec<String> = Vec::new();
    for c in cells {
        if !models.contains(&c.results.model) {
            models.push(c.results.model.clone());
        }
    }
    let mut protocol = first.protocol.clone();
    protocol.kld = cells.iter().any(|c| c.results.protocol.kld);
    // Cells of different speed sweeps (depths): no one sweep; each ratio's test names its
    // point, and the plain `pp`/`tg` ones are depth 0's.
    if cells
        .iter()
        .any(|c| c.results.protocol.speed_axes != first.protocol.speed_axes)
    {
        protocol.speed_axes = None;
    }
    if naming.models.is_some() {
        protocol.model_sha256 = "several models (each cell's in `cells`)".into();
        protocol.tokens_sha256 = "several tokenizers (each cell's in `cells`)".into();
    }
    // One reference for the merged report only when every cell used the same one; each
    // cell's stays in `cells`.
    let used: BTreeSet<Option<&str>> = cells
        .iter()
        .map(|c| {
            c.results
                .protocol
                .reference
                .as_ref()
                .map(|r| r.sha256.as_str())
        })
        .collect();
    if used.len() > 1 {
        protocol.reference = None;
    }
    let references: BTreeSet<Option<&str>> = cells
        .iter()
        .map(|c| c.results.ppl_delta_reference.as_deref())
        .collect();
    Ok(Results {
        schema_version: report::SCHEMA_VERSION,
        complete: true,
        started_utc: cells
            .iter()
            .map(|c| c.results.started_utc.clone())
            .min()
            .unwrap_or_default(),
        model: models.join(", "),
        machine: merged_machine(cells),
        versions: first.versions.clone(),
        protocol,
        ppl_delta_reference: if references.len() == 1 {
            first.ppl_delta_reference.clone()
        } else {
            Some("float32".into())
        },
        compare_to: None,
        runners,
        speed_rounds: Vec::new(),
        speed_ratios: ratios,
        not_made: cells
            .iter()
            .flat_map(|c| {
                c.results
                    .not_made
                    .iter()
                    .map(move |n| format!("{}: {n}", c.name))
            })
            .collect(),
        cells: cell_records,
    })
}

fn fmt_ppl(p: Option<f64>) -> String {
    p.map_or_else(|| "none".into(), |p| format!("{p}"))
}

/// ΔPPL % of rows whose cell had no float32 reference (their cell computed it against
/// its own first row): against the float32 row of the same model, thread count and CPU
/// among the merged rows, or none when there is no such row.
fn fill_deltas(cells: &[CellRun], origin: &[Origin], runners: &mut [RunnerRecord]) {
    let references: Vec<(String, f64)> = runners
        .iter()
        .zip(origin)
        .filter(|(r, o)| o.is_float32(r))
        .filter_map(|(r, o)| Some((o.setting(cells), r.ppl?)))
        .collect();
    for (row, o) in runners.iter_mut().zip(origin) {
        if cells[o.cell].results.ppl_delta_reference.as_deref() == Some("float32") {
            continue;
        }
        let setting = o.setting(cells);
        let base = references.iter().find(|x| x.0 == setting).map(|x| x.1);
        row.ppl_delta_pct = match (base, row.ppl) {
            (Some(b), Some(p)) => Some((p / b - 1.0) * 100.0),
            _ => None,
        };
    }
}

/// Where a merged row came from: its cell and its name there.
struct Origin {
    cell: usize,
    name: String,
}

impl Origin {
    /// Whether the row is kwk's float32 (the reference of its model).
    fn is_float32(&self, r: &RunnerRecord) -> bool {
        r.engine == Engine::Kwk && self.name == "float32"
    }

    /// The model, thread count and CPU the row was measured with.
    fn setting(&self, cells: &[CellRun]) -> String {
        let r = &cells[self.cell].results;
        format!(
            "{} t{} d{} {}",
            r.protocol.model_sha256,
            r.machine.threads,
            depth_key(r),
            machine_key(&r.machine)
        )
    }
}

/// The speed samples' median of a row for `test`.
fn median(r: &RunnerRecord, test: &str) -> Option<(f64, f64, f64)> {
    let s = if test == "pp" {
        &r.pp_samples_tokens_per_s
    } else {
        &r.tg_samples_tokens_per_s
    };
    let m = crate::stats::median(s)?;
    let lo = s.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((m, lo, hi))
}

/// Ratios between rows of different cells that the cells' own paired ratios lack: each kwk
/// row other than float32 over every llama.cpp row and every kwk float32 row of the same
/// model and thread count, on the same CPU (any CPU with `across`). Unpaired (`rounds`
/// 0): the median of one row's samples over the other's, the range from the extremes.
fn unpaired_ratios(
    cells: &[CellRun],
    origin: &[Origin],
    runners: &[RunnerRecord],
    have: &[SpeedRatio],
    across: bool,
) -> Vec<SpeedRatio> {
    let mut out = Vec::new();
    for test in ["pp", "tg"] {
        for (i, row) in runners.iter().enumerate() {
            if row.engine != Engine::Kwk || origin[i].is_float32(row) {
                continue;
            }
            let Some(a) = median(row, test) else { continue };
            let (ra, ca) = (&cells[origin[i].cell].results, origin[i].cell);
            for (j, vs) in runners.iter().enumerate() {
                let cb = origin[j].cell;
                if cb == ca || !(vs.engine.is_external() || origin[j].is_float32(vs)) {
                    continue;
                }
                let rb = &cells[cb].results;
                if rb.protocol.model_sha256 != ra.protocol.model_sha256
                    || rb.machine.threads != ra.machine.threads
                    || depth_key(rb) != depth_key(ra)
                    || (!across && machine_key(&rb.machine) != machine_key(&ra.machine))
                {
                    continue;
                }
                // The primary point's test as the cell names it (`pp`, `pp512@d4096`).
                let name = ra.protocol.primary_ratio_test(test);
                if have
                    .iter()
                    .chain(&out)
                    .any(|x| x.test == name && x.row == row.name && x.vs == vs.name)
                {
                    continue;
                }
                let Some(b) = median(vs, test) else { continue };
                out.push(SpeedRatio {
                    test: name,
                    row: row.name.clone(),
                    vs: vs.name.clone(),
                    rounds: 0,
                    median: a.0 / b.0,
                    min: a.1 / b.2,
                    max: a.2 / b.1,
                });
            }
        }
    }
    out
}

/// The merged report's machine: the cells' when they agree; otherwise the CPUs joined,
/// the features all share, and threads 0 ("per cell") when thread counts differ. The
/// steadiness of the first cell whose speed was unreliable, so the warning stands.
fn merged_machine(cells: &[CellRun]) -> Machine {
    let first = &cells[0].results.machine;
    let mut m = first.clone();
    let mut cpus: Vec<&str> = Vec::new();
    for c in cells {
        if !cpus.contains(&c.results.machine.cpu.as_str()) {
            cpus.push(&c.results.machine.cpu);
        }
    }
    m.cpu = cpus.join(" | ");
    m.isa
        .retain(|f| cells.iter().all(|c| c.results.machine.isa.contains(f)));
    if cells
        .iter()
        .any(|c| c.results.machine.threads != first.threads)
    {
        m.threads = 0;
    }
    if cells
        .iter()
        .any(|c| c.results.machine.kernels != first.kernels)
    {
        m.kernels = None;
    }
    if cells
        .iter()
        .any(|c| machine_key(&c.results.machine) != machine_key(first))
    {
        m.peaks = None;
        m.peaks_best_tier = None;
    }
    m.steadiness = cells
        .iter()
        .filter_map(|c| c.results.machine.steadiness.clone())
        .find(|s| s.noisy)
        .or_else(|| first.steadiness.clone());
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::results::testdata::sample_results;

    /// A cell as a sweep makes one: float32 and `row` (a copy of the sample's int4 with
    /// `ppl`), at `threads`.
    fn cell(name: &str, row: &str, ppl: f64, threads: usize) -> CellRun {
        let mut r = sample_results();
        r.machine.threads = threads;
        r.runners[1].name = row.into();
        r.runners[1].ppl = Some(ppl);
        r.update_deltas();
        r.speed_rounds = vec![
            vec!["float32".into(), row.into()],
            vec![row.into(), "float32".into()],
        ];
        r.speed_ratios = crate::protocol::speed_ratios::paired_speed_ratios(&r);
        CellRun {
            name: name.into(),
            dir: PathBuf::from(format!("cells/{name}")),
            results: r,
        }
    }

    #[test]
    fn merged_rows_keep_their_cells_figures_to_the_bit() {
        let cells = [
            cell("000-int8-t1", "int8", 20.123_456_789_012_3, 1),
            cell("001-int4-t1", "int4", 20.5, 1),
            cell("002-int8-t2", "int8", 20.123_456_789_012_3, 2),
        ];
        let m = merge(&cells, false).unwrap();
        let names: Vec<&str> = m.runners.iter().map(|r| r.name.as_str()).collect();
        // float32@t1 is measured by two cells alike: kept once, under the first.
        assert_eq!(
            names,
            ["float32@t1", "int8@t1", "int4@t1", "float32@t2", "int8@t2"]
        );
        for (merged, c, row) in [(1, 0, 1), (2, 1, 1), (4, 2, 1)] {
            let a = &m.runners[merged];
            let b = &cells[c].results.runners[row];
            assert_eq!(a.ppl.map(f64::to_bits), b.ppl.map(f64::to_bits));
            assert_eq!(a.ppl_delta_pct, b.ppl_delta_pct);
            assert_eq!(a.cell.as_deref(), Some(cells[c].name.as_str()));
        }
        assert_eq!(m.machine.threads, 0);
        assert_eq!(m.cells.len(), 3);
        assert_eq!(m.cells[1].rows, ["int4@t1"]);
        // Each cell's paired ratio is kept; int8@t1 over float32@t1 is paired (2 rounds).
        let r = m
            .speed_ratios
            .iter()
            .find(|x| x.row == "int8@t1" && x.vs == "float32@t1" && x.test == "pp")
            .unwrap();
        assert_eq!(r.rounds, 2);
        // No ratio crosses thread counts.
        assert!(m
            .speed_ratios
            .iter()
            .all(|x| x.row.ends_with("@t1") == x.vs.ends_with("@t1")));
        // The files a run writes, written by the same exporters.
        let dir = tempfile::tempdir().unwrap();
        report::write_all(dir.path(), &m).unwrap();
        let back = report::json::read(&dir.path().join("results.json")).unwrap();
        assert_eq!(back, m);
        let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
        assert!(
            md.contains("## Cells") && md.contains("| 001-int4-t1 |"),
            "{md}"
        );
        assert!(md.contains("per-cell threads"), "{md}");
    }

    #[test]
    fn cells_of_another_protocol_or_reference_are_refused_naming_both() {
        let a = cell("a", "int8", 20.1, 1);
        let mut b = cell("b", "int4", 20.5, 1);
        b.results.protocol.ctx = 128;
        let e = format!("{:#}", merge(&[a.clone(), b], false).unwrap_err());
        assert!(
            e.contains("cells 'cells/a' and 'cells/b' differ in ctx (64 vs 128)"),
            "{e}"
        );
        let mut c = cell("c", "int4", 20.5, 1);
        c.results.protocol.tokens_sha256 = "33".into();
        let e = format!("{:#}", merge(&[a.clone(), c], false).unwrap_err());
        assert!(e.contains("token ids sha256"), "{e}");
        // Another model may have other tokens, not another text.
        let mut d = cell("d", "int4", 20.5, 1);
        d.results.protocol.model_sha256 = "other".into();
        d.results.protocol.tokens_sha256 = "44".into();
        d.results.model = "other-model".into();
        let m = merge(&[a.clone(), d.clone()], false).unwrap();
        assert!(m.runners.iter().any(|r| r.name == "other-model/int4"));
        // Two models of one file name are told apart.
        let mut e2 = d.clone();
        e2.results.model = "elsewhere/tiny".into();
        let m = merge(&[a.clone(), e2], false).unwrap();
        let names: Vec<&str> = m.runners.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            ["tiny/float32", "tiny/int8", "tiny-2/float32", "tiny-2/int4"]
        );
        d.results.protocol.text_sha256 = "ff".into();
        let e = format!("{:#}", merge(&[a.clone(), d], false).unwrap_err());
        assert!(e.contains("text sha256"), "{e}");
        // The reference each cell carries must agree to the last bit.
        let mut f = cell("f", "int4", 20.5, 1);
        f.results.runners[0].ppl = Some(20.000_000_000_001);
        let e = format!("{:#}", merge(&[a, f], false).unwrap_err());
        assert!(
            e.contains("both measured row 'float32' with different perplexity"),
            "{e}"
        );
    }

    #[test]
    fn speed_ratios_cross_cells_only_on_one_cpu_unless_asked() {
        let mut a = cell("a", "int8", 20.1, 2);
        let mut g = cell("g", "gguf:Q8_0", 20.2, 2);
        g.results.runners[1].engine = Engine::LlamaCpp;
        g.results.speed_ratios.clear();
        let m = merge(&[a.clone(), g.clone()], false).unwrap();
        let x = m
            .speed_ratios
            .iter()
            .find(|x| x.row == "int8" && x.vs == "gguf:Q8_0" && x.test == "tg")
            .unwrap();
        assert_eq!(x.rounds, 0);
        assert!((x.median - 300.0 / 300.0).abs() < 1e-12);
        a.results.machine.cpu = "Other CPU".into();
        let m = merge(&[a.clone(), g.clone()], false).unwrap();
        assert!(
            m.speed_ratios.iter().all(|x| x.vs != "gguf:Q8_0@g"),
            "{:?}",
            m.speed_ratios
        );
        assert!(m.runners.iter().any(|r| r.name == "int8@a"));
        let m = merge(&[a, g], true).unwrap();
        assert!(m
            .speed_ratios
            .iter()
            .any(|x| x.row == "int8@a" && x.vs == "gguf:Q8_0@g"));
    }

    #[test]
    fn incomplete_or_missing_cells_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let done = dir.path().join("done");
        let half = dir.path().join("half");
        std::fs::create_dir_all(&done).unwrap();
        std::fs::create_dir_all(&half).unwrap();
        let mut r = sample_results();
        report::json::write(&done.join("results.json"), &r).unwrap();
        r.complete = false;
        report::json::write(&half.join("results.json"), &r).unwrap();
        assert_eq!(read_cells(std::slice::from_ref(&done)).unwrap().len(), 1);
        let e = format!("{:#}", read_cells(&[done.clone(), half]).unwrap_err());
        assert!(e.contains("is not complete"), "{e}");
        let e = format!(
            "{:#}",
            read_cells(&[done, dir.path().join("none")]).unwrap_err()
        );
        assert!(e.contains("holds no results.json"), "{e}");
    }

    /// A merge of cells at depths 0, 64 and 128 (one depth a cell) draws speed against
    /// depth: one line per row across its cells, named without the `@dD` of its cells; a
    /// merge of cells at one depth draws none.
    #[test]
    fn cells_at_different_depths_draw_speed_against_depth() {
        use crate::protocol::points::{PointSpeed, SpeedAxes};
        use crate::report::plot_sweep::{sweep_plot_svgs, sweep_plots, write_sweep_plots, Axis};
        let at = |depth: usize| {
            let mut c = cell(&format!("00{depth}-int8-t1-d{depth}"), "int8", 20.5, 1);
            let p = &mut c.results.protocol;
            let mut axes = SpeedAxes::single(p.pp, p.tg, 1);
            axes.depth = vec![depth];
            for (i, row) in c.results.runners.iter_mut().enumerate() {
                row.speed_points = [("pp", p.pp), ("tg", p.tg)]
                    .map(|(kind, n)| PointSpeed {
                        test: axes.test_name(kind, n, depth, 1),
                        kind: kind.into(),
                        tokens: n,
                        depth,
                        threads: 1,
                        primary: true,
                        tokens_per_s: Some(100.0 * (i + 1) as f64 / (1.0 + depth as f64)),
                        ..Default::default()
                    })
                    .to_vec();
            }
            p.speed_axes = Some(axes);
            c
        };
        let flat = cell("000-int8-t1", "int8", 20.5, 1);
        assert!(flat.results.runners[1].tg_tokens_per_s.is_some());
        let m = merge(&[flat.clone(), at(64), at(128)], false).unwrap();
        assert_eq!(sweep_plots(&m), [Axis::Depth]);
        assert_eq!(sweep_plot_svgs(&m), ["speed_vs_depth.svg"]);
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            write_sweep_plots(dir.path(), &m).unwrap(),
            ["speed_vs_depth.svg"]
        );
        let svg = std::fs::read_to_string(dir.path().join("speed_vs_depth.svg")).unwrap();
        assert!(
            svg.contains("\nint8\n") && svg.contains("\nfloat32\n"),
            "{svg}"
        );
        assert!(!svg.contains("int8@d"), "one line per row, not per cell");
        let md = crate::report::markdown::render(&m, &Default::default());
        assert!(
            md.contains("![speed across the sweep](speed_vs_depth.svg)"),
            "{md}"
        );
        // Cells at one depth (threads differ): no depth plot.
        let m = merge(&[flat.clone(), cell("001-int8-t2", "int8", 20.5, 2)], false).unwrap();
        assert!(sweep_plots(&m).is_empty());
    }

    /// Cells of a sweep over depths: rows gain `@dD`, each cell's ratios keep their point's
    /// name, and no unpaired ratio crosses depths.
    #[test]
    fn cells_at_different_depths_are_told_apart() {
        use crate::protocol::points::SpeedAxes;
        let mut deep = cell("001-int8-t1-d64", "int8", 20.5, 1);
        let mut axes = SpeedAxes::single(16, 4, 1);
        axes.depth = vec![64];
        deep.results.protocol.speed_axes = Some(axes);
        for x in &mut deep.results.speed_ratios {
            x.test = deep.results.protocol.primary_ratio_test(&x.test);
        }
        let flat = cell("000-int8-t1", "int8", 20.5, 1);
        let m = merge(&[flat, deep], false).unwrap();
        let names: Vec<&str> = m.runners.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["float32@d0", "int8@d0", "float32@d64", "int8@d64"]);
        assert!(m.protocol.speed_axes.is_none());
        let tests: Vec<(&str, &str, &str)> = m
            .speed_ratios
            .iter()
            .map(|x| (x.test.as_str(), x.row.as_str(), x.vs.as_str()))
            .collect();
        assert!(
            tests.contains(&("pp16@d64", "int8@d64", "float32@d64")),
            "{tests:?}"
        );
        assert!(
            tests.contains(&("pp", "int8@d0", "float32@d0")),
            "{tests:?}"
        );
        assert!(
            m.speed_ratios
                .iter()
                .all(|x| x.row.ends_with("@d0") == x.vs.ends_with("@d0")),
            "{tests:?}"
        );
    }
}

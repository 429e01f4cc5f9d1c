//! Slurm as the sweep's engine: the sbatch scripts of a sweep folder (`slurm/shared.sbatch`,
//! an array of one task per shared job; `slurm/cells.sbatch`, an array of one task per cell,
//! after the shared array; `slurm/merge.sbatch`, after the cells), their submission with
//! `sbatch --parsable`, and the tasks squeue still holds (so `resume` never submits a cell
//! twice). Each task is `kwk-eval sweep task DIR --cell N` (or `--shared N`), which runs the
//! plain kwk-eval of that cell. The sbatch options come from the sweep file's `[slurm]`.

use super::file::{SlurmOptions, Sweep};
use super::plan::{shell_quote, Plan};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The scripts' folder in a sweep folder.
pub fn slurm_dir(out: &Path) -> PathBuf {
    out.join("slurm")
}

/// The job name prefix of a sweep folder: `kwk-` and 8 hex digits of its path, so squeue
/// tells this sweep's jobs from any other's.
pub fn job_name(out: &Path) -> String {
    let hex = crate::digest::sha256_hex(out.display().to_string().as_bytes());
    format!("kwk-{}", &hex[..8])
}

/// The `#SBATCH` lines of one job.
fn header(opts: &SlurmOptions, name: &str, cpus: usize, logs: &Path) -> String {
    let mut lines = vec![
        "#!/bin/bash".to_string(),
        format!("#SBATCH --job-name={name}"),
        format!(
            "#SBATCH --cpus-per-task={}",
            opts.cpus_per_task.unwrap_or(cpus)
        ),
        "#SBATCH --ntasks=1".into(),
        format!(
            "#SBATCH --output={}",
            logs.join(format!("{name}-%A_%a.out")).display()
        ),
    ];
    for (flag, v) in [
        ("partition", &opts.partition),
        ("account", &opts.account),
        ("time", &opts.time),
        ("mem", &opts.mem),
        ("qos", &opts.qos),
    ] {
        if let Some(v) = v {
            lines.push(format!("#SBATCH --{flag}={v}"));
        }
    }
    for e in &opts.extra {
        lines.push(format!("#SBATCH {e}"));
    }
    lines.push("set -euo pipefail".into());
    lines.join("\n") + "\n"
}

/// The three scripts of a sweep folder, written (replacing the previous ones).
pub struct Scripts {
    pub shared: Option<PathBuf>,
    pub cells: PathBuf,
    pub merge: PathBuf,
}

/// Writes the sbatch scripts of `plan` into `out/slurm`, their tasks running `program`.
pub fn write_scripts(sweep: &Sweep, plan: &Plan, out: &Path, program: &Path) -> Result<Scripts> {
    let dir = slurm_dir(out);
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating '{}'", logs.display()))?;
    let cpus = sweep.threads.iter().max().copied().unwrap_or(1);
    let name = job_name(out);
    let prog = shell_quote(&program.display().to_string());
    let folder = shell_quote(&out.display().to_string());
    let write = |file: &str, body: String| -> Result<PathBuf> {
        let p = dir.join(file);
        std::fs::write(&p, body).with_context(|| format!("writing '{}'", p.display()))?;
        Ok(p)
    };
    let shared = if plan.shared.is_empty() {
        None
    } else {
        Some(write(
            "shared.sbatch",
            format!(
                "{}# One task per shared job: a model's conversion, ladder types and packed formats, or a (model, text)'s float32 reference, made once.\nexec {prog} sweep task {folder} --shared \"$SLURM_ARRAY_TASK_ID\"\n",
                header(&sweep.slurm, &format!("{name}-shared"), cpus, &logs)
            ),
        )?)
    };
    let cells = write(
        "cells.sbatch",
        format!(
            "{}# One task per cell (kwk-eval sweep plan lists them); a complete cell is left as it is.\nexec {prog} sweep task {folder} --cell \"$SLURM_ARRAY_TASK_ID\"\n",
            header(&sweep.slurm, &format!("{name}-cells"), cpus, &logs)
        ),
    )?;
    let mut merge_opts = sweep.slurm.clone();
    merge_opts.cpus_per_task = Some(1);
    let merge = write(
        "merge.sbatch",
        format!(
            "{}exec {prog} sweep task {folder} --merge\n",
            header(&merge_opts, &format!("{name}-merge"), 1, &logs)
        ),
    )?;
    Ok(Scripts {
        shared,
        cells,
        merge,
    })
}

/// `0-3,7,9` for sorted indices, with `%N` when at most N may run at once.
pub fn array_spec(indices: &[usize], max_parallel: Option<usize>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < indices.len() {
        let start = indices[i];
        let mut end = start;
        while i + 1 < indices.len() && indices[i + 1] == end + 1 {
            i += 1;
            end = indices[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    let mut s = parts.join(",");
    if let Some(n) = max_parallel {
        s.push_str(&format!("%{n}"));
    }
    s
}

/// One sbatch submission: its arguments after `sbatch --parsable`.
#[derive(Debug, Clone, PartialEq)]
pub struct Submission {
    pub what: &'static str,
    pub args: Vec<String>,
}

impl Submission {
    /// The command line as it is (or would be) run; `dependency` as sbatch takes it
    /// (`afterok:12`).
    pub fn line(&self, dependency: Option<&str>) -> String {
        let mut a = vec!["sbatch".to_string(), "--parsable".into()];
        if let Some(d) = dependency {
            a.push(format!("--dependency={d}"));
            a.push("--kill-on-invalid-dep=yes".into());
        }
        a.extend(self.args.iter().cloned());
        a.iter()
            .map(|x| shell_quote(x))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Runs sbatch; the job id it printed.
    pub fn submit(&self, dependency: Option<&str>) -> Result<String> {
        let mut c = Command::new("sbatch");
        c.arg("--parsable");
        if let Some(d) = dependency {
            c.arg(format!("--dependency={d}"));
            c.arg("--kill-on-invalid-dep=yes");
        }
        c.args(&self.args);
        let out = c.output().map_err(|e| {
            anyhow::anyhow!(
                "running sbatch for the {} job: {e}; is Slurm installed (scripts/setup-slurm.sh starts a single-node one)? --dry-run writes the scripts only",
                self.what
            )
        })?;
        if !out.status.success() {
            bail!(
                "sbatch refused the {} job ({}): {}",
                self.what,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let text = String::from_utf8_lossy(&out.stdout);
        // `--parsable` prints `JOBID` or `JOBID;CLUSTER`.
        let id = text.trim().split(';').next().unwrap_or("").to_string();
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
            bail!(
                "sbatch printed '{}' for the {} job, not a job id",
                text.trim(),
                self.what
            );
        }
        Ok(id)
    }
}

/// The array tasks of this sweep's cells squeue still holds (pending or running), by
/// index; `None` when squeue cannot be asked.
pub fn queued_cells(out: &Path) -> Option<Vec<usize>> {
    let name = format!("{}-cells", job_name(out));
    let o = Command::new("squeue")
        .args(["-h", "-r", "-n", &name, "-o", "%K"])
        .output()
        .ok()?;
    if !o.status.success() {
        return None;
    }
    let mut v = Vec::new();
    for tok in String::from_utf8_lossy(&o.stdout).split_whitespace() {
        v.extend(parse_task_ids(tok));
    }
    v.sort_unstable();
    v.dedup();
    Some(v)
}

/// Task ids as squeue prints them: `3`, or a pending range `[4-9%2]`, `4-6,8`.
pub fn parse_task_ids(tok: &str) -> Vec<usize> {
    let tok = tok.trim_matches(['[', ']']);
    let tok = tok.split('%').next().unwrap_or(tok);
    let mut v = Vec::new();
    for part in tok.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    v.extend(a..=b);
                }
            }
            None => v.extend(part.parse::<usize>().ok()),
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_and_squeue_ids() {
        assert_eq!(array_spec(&[0, 1, 2, 3, 7, 9, 10], None), "0-3,7,9-10");
        assert_eq!(array_spec(&[5], Some(2)), "5%2");
        assert_eq!(parse_task_ids("[4-6,9%2]"), [4, 5, 6, 9]);
        assert_eq!(parse_task_ids("3"), [3]);
        assert_eq!(parse_task_ids("N/A"), Vec::<usize>::new());
    }

    #[test]
    fn headers_carry_the_files_options() {
        let o = SlurmOptions {
            partition: Some("cpu".into()),
            account: Some("lab".into()),
            time: Some("00:20:00".into()),
            extra: vec!["--constraint=zen4".into()],
            ..Default::default()
        };
        let h = header(&o, "kwk-x-cells", 2, Path::new("/s/slurm/logs"));
        for l in [
            "#SBATCH --partition=cpu",
            "#SBATCH --account=lab",
            "#SBATCH --time=00:20:00",
            "#SBATCH --cpus-per-task=2",
            "#SBATCH --constraint=zen4",
            "#SBATCH --output=/s/slurm/logs/kwk-x-cells-%A_%a.out",
        ] {
            assert!(h.lines().any(|x| x == l), "{l} in\n{h}");
        }
        let s = Submission {
            what: "cells",
            args: vec!["--array=0-3".into(), "c.sbatch".into()],
        };
        assert_eq!(
            s.line(Some("afterok:12")),
            "sbatch --parsable --dependency=afterok:12 --kill-on-invalid-dep=yes --array=0-3 c.sbatch"
        );
    }
}

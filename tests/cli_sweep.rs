//! `kwk-eval sweep` and `kwk-eval merge` end to end on the tiny fixture model: the plan,
//! a local sweep (two formats × two thread counts) merged into one report whose rows have
//! their cells' perplexity to the last bit, a half-written cell re-run instead of taken as
//! done, the merge's refusals, and the same sweep as a Slurm job array where a Slurm
//! cluster answers (`sinfo`; scripts/setup-slurm.sh starts one) or `KWK_SLURM=1` demands
//! one. Without Slurm that test says it is skipped.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A sweep file in `dir` over the tiny model: int8 and int4 at 1 and 2 threads, 2 chunks
/// of 64, one quick speed repetition, the pack cache inside `dir`.
fn sweep_file(dir: &Path) -> PathBuf {
    let body = format!(
        "models = [\"{}\"]\ntexts = [\"{}\"]\nformats = [\"int8\", \"int4\"]\nthreads = [1, 2]\nctx = 64\nchunks = 2\nreps = 1\npp = 16\ntg = 4\nargs = [\"--pack-cache\", \"{}\"]\n\n[slurm]\ntime = \"00:10:00\"\n",
        tiny_llama().display(),
        eval_txt().display(),
        dir.join("pack").display()
    );
    let p = dir.join("sweep.toml");
    std::fs::write(&p, body).unwrap();
    p
}

fn results(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("results.json"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    serde_json::from_str(&text).unwrap()
}

/// Every merged row's perplexity equals its cell's, bit for bit, and every cell row is
/// there (the float32 reference once per thread count).
fn check_merged(out: &Path) {
    let merged = results(&out.join("merged"));
    assert_eq!(merged["complete"], true);
    let rows = merged["runners"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    for want in [
        "float32@t1",
        "int8@t1",
        "int4@t1",
        "float32@t2",
        "int8@t2",
        "int4@t2",
    ] {
        assert!(names.contains(&want), "{want} not in {names:?}");
    }
    assert_eq!(merged["cells"].as_array().unwrap().len(), 4);
    for r in rows {
        let cell = out.join("cells").join(r["cell"].as_str().unwrap());
        let c = results(&cell);
        let base = r["name"].as_str().unwrap().split('@').next().unwrap();
        let row = c["runners"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == base)
            .unwrap();
        assert_eq!(
            r["ppl"].as_f64().unwrap().to_bits(),
            row["ppl"].as_f64().unwrap().to_bits(),
            "{base}"
        );
        assert_eq!(r["kld_mean"], row["kld_mean"]);
    }
    for f in ["results.csv", "speed_ratios.csv", "report.md"] {
        assert!(out.join("merged").join(f).is_file(), "{f}");
    }
}

/// The float32 reference was computed once, by the shared job, and every cell loaded it
/// (the log has one float32 perplexity computed, four loaded).
fn check_one_reference(out: &Path, stderr: &str) {
    let computed: Vec<&str> = stderr
        .lines()
        .filter(|l| l.ends_with("float32: perplexity"))
        .collect();
    assert_eq!(computed.len(), 1, "{stderr}");
    assert_eq!(
        stderr
            .matches("float32: perplexity from --reference")
            .count(),
        4
    );
    check_cells_loaded_the_reference(out);
}

/// Every merged cell names the shared job's reference file and digest (`source: loaded`),
/// and so does report.md's Cells table.
fn check_cells_loaded_the_reference(out: &Path) {
    let shared = out.join("shared/01-tiny-llama-eval-float32");
    let made = results(&shared);
    assert_eq!(made["protocol"]["reference"]["source"], "computed");
    let sha = made["protocol"]["reference"]["sha256"].as_str().unwrap();
    let file = shared.join("float32-kl-divergence-base.bin");
    let merged = results(&out.join("merged"));
    for c in merged["cells"].as_array().unwrap() {
        let r = &c["protocol"]["reference"];
        assert_eq!(r["source"], "loaded", "{c}");
        assert_eq!(r["sha256"], sha, "{c}");
        assert_eq!(r["file"], file.display().to_string(), "{c}");
    }
    let md = std::fs::read_to_string(out.join("merged/report.md")).unwrap();
    assert!(md.contains(&format!("loaded {}", file.display())), "{md}");
}

/// The merged rows have the perplexity and KLD of one plain local run of the same rows
/// at the same thread count, to the last digit.
fn check_equals_single_runs(dir: &Path, out: &Path) {
    let merged = results(&out.join("merged"));
    for t in ["1", "2"] {
        let single = dir.join(format!("single-t{t}"));
        kwk_eval()
            .arg("--llm")
            .arg(tiny_llama())
            .arg("--text")
            .arg(eval_txt())
            .args(["--formats", "float32,int8,int4", "--threads", t])
            .args([
                "--ctx",
                "64",
                "--chunks",
                "2",
                "--no-speed",
                "--no-pack-cache",
            ])
            .arg("--out")
            .arg(&single)
            .assert()
            .success();
        let s = results(&single);
        for name in ["float32", "int8", "int4"] {
            let a = s["runners"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == name)
                .unwrap();
            let b = merged["runners"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == format!("{name}@t{t}").as_str())
                .unwrap();
            for f in ["ppl", "ppl_err", "kld_mean", "kld_p99", "top1_agreement"] {
                assert_eq!(a[f], b[f], "{name}@t{t} {f}");
            }
        }
    }
}

#[test]
fn plan_lists_cells_and_the_shared_work() {
    let dir = tempfile::tempdir().unwrap();
    let file = sweep_file(dir.path());
    let out = kwk_eval()
        .args(["sweep", "plan"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("4 cells, 2 shared job(s)"), "{text}");
    assert!(
        text.contains("shared 01-tiny-llama-eval-float32: the float32 reference on eval"),
        "{text}"
    );
    assert!(text.contains("cell 003-tiny-llama-int4-t2"), "{text}");
    assert!(
        text.contains("kwk's int8, int4 packed into the pack cache"),
        "{text}"
    );
    // Depth is an axis (issue 39): one cell per depth, each passing its `--depth`.
    std::fs::write(
        &file,
        std::fs::read_to_string(&file)
            .unwrap()
            .replace("reps = 1", "reps = 1\ndepths = [0, 64]"),
    )
    .unwrap();
    let out = kwk_eval()
        .args(["sweep", "plan"])
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.starts_with("8 cells, 2 shared job(s)"), "{text}");
    assert!(
        text.contains("-d64") && text.contains("--depth 64"),
        "{text}"
    );
}

/// A sweep over depths (one cell a depth) of int8 and float32 with a q8 cache
/// (`float32+kv:q8`, a row with its own KV cache): the shared job packs int8 alone, and the
/// merged report draws speed against depth, one line per row across its cells, with each
/// row's `kv_type` kept.
#[test]
fn a_sweep_over_depths_merges_into_a_speed_against_depth_plot() {
    let dir = tempfile::tempdir().unwrap();
    let file = sweep_file(dir.path());
    std::fs::write(
        &file,
        std::fs::read_to_string(&file)
            .unwrap()
            .replace(
                r#"formats = ["int8", "int4"]"#,
                r#"formats = ["int8", "float32+kv:q8"]"#,
            )
            .replace("threads = [1, 2]", "threads = [1]\ndepths = [0, 32]"),
    )
    .unwrap();
    let plan = kwk_eval()
        .args(["sweep", "plan"])
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&plan.stdout);
    assert!(plan.status.success(), "{text}");
    assert!(text.starts_with("4 cells, 2 shared job(s)"), "{text}");
    assert!(
        text.contains("kwk's int8 packed into the pack cache"),
        "{text}"
    );
    let out = dir.path().join("sweep");
    let run = kwk_eval()
        .args(["sweep", "run"])
        .arg(&file)
        .arg("--local")
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let merged = out.join("merged");
    let r = results(&merged);
    let rows = r["runners"].as_array().unwrap();
    let kv = |name: &str| {
        rows.iter()
            .find(|x| x["name"] == name)
            .unwrap_or_else(|| panic!("no row {name}: {rows:?}"))["kv_type"]
            .clone()
    };
    assert_eq!(kv("float32+kv:q8@d32"), "q8");
    assert_eq!(kv("float32@d32"), "f32");
    let svg = std::fs::read_to_string(merged.join("speed_vs_depth.svg")).unwrap();
    for row in ["int8", "float32+kv:q8"] {
        assert!(svg.contains(&format!("\n{row}\n")), "{row} has no line");
    }
    assert!(!svg.contains("@d32"), "one line per row, not per cell");
    assert!(merged.join("speed_vs_depth.png").is_file());
    let md = std::fs::read_to_string(merged.join("report.md")).unwrap();
    assert!(
        md.contains("![speed across the sweep](speed_vs_depth.svg)"),
        "{md}"
    );
}

#[test]
fn a_local_sweep_merges_to_its_cells_figures_and_reruns_a_half_written_cell() {
    let dir = tempfile::tempdir().unwrap();
    let file = sweep_file(dir.path());
    let out = dir.path().join("sweep");
    // A cell folder a killed run left: results.json with complete: false. It must be run
    // again, not merged.
    let half = out.join("cells/001-tiny-llama-int8-t2");
    std::fs::create_dir_all(&half).unwrap();
    std::fs::write(
        half.join("results.json"),
        r#"{"schema_version": 2, "complete": false}"#,
    )
    .unwrap();
    let run_local = || {
        kwk_eval()
            .args(["sweep", "run"])
            .arg(&file)
            .arg("--local")
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap()
    };
    let run = run_local();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(
        out.join("cells/001-tiny-llama-int8-t2.incomplete-1/results.json")
            .is_file(),
        "{stderr}"
    );
    check_merged(&out);
    check_one_reference(&out, &stderr);
    check_equals_single_runs(dir.path(), &out);
    // A second run finds every cell complete and runs none of them again, nor the
    // reference.
    std::fs::remove_dir_all(out.join("merged")).unwrap();
    let again = run_local();
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert_eq!(stderr.matches("is complete in").count(), 6, "{stderr}");
    assert!(!stderr.contains("float32: perplexity\n"), "{stderr}");
    check_merged(&out);
    // A reference job whose run is complete but whose file is cut short is run again.
    let shared = out.join("shared/01-tiny-llama-eval-float32");
    let file = shared.join("float32-kl-divergence-base.bin");
    let sha = results(&shared)["protocol"]["reference"]["sha256"].clone();
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let third = kwk_eval()
        .args(["sweep", "task"])
        .arg(&out)
        .args(["--shared", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&third.stderr);
    assert!(third.status.success(), "{stderr}");
    assert!(stderr.contains("is not a complete reference"), "{stderr}");
    // The same log-probs again (the digest of the bytes before the trailer; the trailer's
    // run start differs), complete.
    assert_eq!(results(&shared)["protocol"]["reference"]["sha256"], sha);
    assert!(std::fs::read(&file).unwrap().ends_with(b"_kwkref1"));
    assert!(shared
        .with_file_name("01-tiny-llama-eval-float32.incomplete-1")
        .is_dir());

    // merge refuses an incomplete cell and cells of two protocols, naming them.
    let cells = out.join("cells");
    let line = assert_error(
        kwk_eval()
            .arg("merge")
            .arg(cells.join("000-tiny-llama-int8-t1"))
            .arg(cells.join("001-tiny-llama-int8-t2.incomplete-1"))
            .arg("--out")
            .arg(dir.path().join("m1")),
        2,
        "cell",
    );
    assert!(line.contains("is not complete"), "{line}");
    let other = dir.path().join("ctx32");
    kwk_eval()
        .arg("--llm")
        .arg(tiny_llama())
        .arg("--text")
        .arg(eval_txt())
        .args([
            "--formats",
            "int8",
            "--ctx",
            "32",
            "--chunks",
            "2",
            "--no-speed",
            "--no-pack-cache",
            "--out",
        ])
        .arg(&other)
        .assert()
        .success();
    let line = assert_error(
        kwk_eval()
            .arg("merge")
            .arg(cells.join("000-tiny-llama-int8-t1"))
            .arg(&other)
            .arg("--out")
            .arg(dir.path().join("m2")),
        2,
        "cells",
    );
    assert!(line.contains("differ in ctx (64 vs 32)"), "{line}");
    assert!(!dir.path().join("m2").exists());
}

/// Why the Slurm test cannot run here, or `None` when a cluster answers (`sinfo`).
/// `KWK_SLURM=1` makes a missing one a failure, `KWK_SLURM=0` skips the test.
fn slurm_missing() -> Option<&'static str> {
    if std::env::var("KWK_SLURM").as_deref() == Ok("0") {
        return Some("KWK_SLURM=0");
    }
    let answers = std::process::Command::new("sinfo")
        .args(["-h", "-o", "%t"])
        .output()
        .is_ok_and(|o| o.status.success() && !o.stdout.is_empty());
    if !answers && std::env::var("KWK_SLURM").as_deref() == Ok("1") {
        panic!("KWK_SLURM=1 but sinfo does not answer; start Slurm with scripts/setup-slurm.sh");
    }
    (!answers).then_some("no Slurm answers here (sinfo)")
}

#[test]
fn a_sweep_runs_as_a_slurm_job_array_and_merges() {
    if let Some(why) = slurm_missing() {
        eprintln!(
            "SKIPPED a_sweep_runs_as_a_slurm_job_array_and_merges: {why}; \
             scripts/setup-slurm.sh starts a single-node Slurm, KWK_SLURM=1 makes its absence a failure"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = sweep_file(dir.path());
    // One cell at a time, so the last one is still pending when it is cancelled.
    let text = std::fs::read_to_string(&file).unwrap() + "max_parallel = 1\n";
    std::fs::write(&file, text).unwrap();
    let out = dir.path().join("sweep");
    let sweep = |cmd: &str, dry: bool| {
        let mut c = kwk_eval();
        c.args(["sweep", cmd]).arg(&file).arg("--out").arg(&out);
        if dry {
            c.arg("--dry-run");
        }
        let o = c.output().unwrap();
        let stdout = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(
            o.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        stdout
    };
    let text = sweep("slurm", true);
    assert!(text.contains("--array=0-3%1"), "{text}");
    let script = std::fs::read_to_string(out.join("slurm/cells.sbatch")).unwrap();
    assert!(script.contains("#SBATCH --time=00:10:00"), "{script}");
    sweep("slurm", false);
    let jobs = std::fs::read_to_string(out.join("slurm/jobs.log")).unwrap();
    let cells_job = jobs
        .lines()
        .find_map(|l| l.strip_prefix("cells "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no cells job in {jobs}"))
        .to_string();
    // Cancel the last cell while it waits: the merge (afterok) is cancelled with it, and
    // resume submits that cell alone, then the merge.
    let cancelled = std::process::Command::new("scancel")
        .arg(format!("{cells_job}_3"))
        .status()
        .unwrap();
    assert!(cancelled.success());
    let name = job_name_of(&out);
    wait(&out, || !queued(&name));
    assert!(!out.join("merged").exists());
    assert!(!out
        .join("cells/003-tiny-llama-int4-t2/results.json")
        .exists());
    let text = sweep("resume", false);
    assert!(text.starts_with("submitted 1 cell(s)"), "{text}");
    // report.md is the merge's last file.
    wait(&out, || out.join("merged/report.md").is_file());
    check_merged(&out);
    check_cells_loaded_the_reference(&out);
    let text = sweep("resume", false);
    assert!(
        text.starts_with("nothing to submit: 4 of 4 cells complete, merged"),
        "{text}"
    );
}

/// Whether squeue holds a job of the sweep named `name`.
fn queued(name: &str) -> bool {
    let o = std::process::Command::new("squeue")
        .args(["-h", "-o", "%j"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .any(|l| l.starts_with(name))
}

/// Waits at most 15 minutes for `done`, then fails with the jobs' logs (and cancels them).
fn wait(out: &Path, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(900);
    while !done() {
        if Instant::now() > deadline {
            let logs: Vec<String> = std::fs::read_dir(out.join("slurm/logs"))
                .map(|d| {
                    d.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
                        .collect()
                })
                .unwrap_or_default();
            for suffix in ["shared", "cells", "merge"] {
                let _ = std::process::Command::new("scancel")
                    .args(["-n", &format!("{}-{suffix}", job_name_of(out))])
                    .status();
            }
            panic!(
                "the sweep did not get there within 900 s; logs:\n{}",
                logs.join("\n---\n")
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The job name prefix kwk-eval gives a sweep folder's jobs (`sweep::slurm::job_name`).
fn job_name_of(out: &Path) -> String {
    use sha2::Digest;
    let hex = format!(
        "{:x}",
        sha2::Sha256::digest(out.display().to_string().as_bytes())
    );
    format!("kwk-{}", &hex[..8])
}

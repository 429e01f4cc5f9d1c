//! `kwk-eval compare` on two committed results (tests/data: a tiny-fixture run with kwk and
//! llama.cpp rows, and a copy whose int8 PPL is 2% higher and whose GGUF row generates at
//! half the speed), and the gate's identity checks before anything runs.

mod common;
use common::*;
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn compare(format: &str) -> String {
    let out = kwk_eval()
        .arg("compare")
        .arg(data("compare-old.json"))
        .arg(data("compare-new.json"))
        .args(["--format", format])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn compare_two_committed_results_in_every_format() {
    let t = compare("terminal");
    let line = |name: &str| {
        t.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row in\n{t}"))
            .to_string()
    };
    assert!(line("float32").ends_with("same"), "{t}");
    assert!(
        line("int8 ").contains("REGRESSED (ppl +2.000% > 0.5%)"),
        "{t}"
    );
    assert!(line("int8 ").contains("+0.01980 ±"), "{t}");
    assert!(
        line("gguf:model.gguf").contains("REGRESSED (tg -50.0% < -25%)"),
        "{t}"
    );
    let csv = compare("csv");
    let mut rd = csv::Reader::from_reader(csv.as_bytes());
    let rows: Vec<_> = rd.records().collect::<Result<_, _>>().unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(&rows[1][0], "int8");
    assert!(rows[2][7].starts_with("REGRESSED"));
    let md = compare("markdown");
    assert!(md.contains("| int8 | ") && md.lines().nth(1).unwrap().starts_with("|---|"));
}

#[test]
fn compare_needs_results_files() {
    let line = assert_error(
        kwk_eval()
            .arg("compare")
            .arg(data("compare-old.json"))
            .arg(eval_txt()),
        2,
        "",
    );
    assert!(line.contains("is not JSON"), "{line}");
}

fn gated(out: &Path, llm: PathBuf, formats: &str) -> assert_cmd::Command {
    gated_ctx(out, llm, formats, "64")
}

fn gated_ctx(out: &Path, llm: PathBuf, formats: &str, ctx: &str) -> assert_cmd::Command {
    let mut c = kwk_eval();
    c.args([
        "--formats",
        formats,
        "--ctx",
        ctx,
        "--chunks",
        "8",
        "--no-speed",
    ])
    .args(["--threads", "2", "--no-pack-cache", "--llm"])
    .arg(llm)
    .arg("--text")
    .arg(eval_txt())
    .arg("--out")
    .arg(out)
    .arg("--baseline")
    .arg(data("compare-old.json"));
    c
}

#[test]
fn baseline_without_a_shared_row_or_of_another_model_fails_before_running() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let line = assert_error(&mut gated(&out, tiny_llama(), "bf16"), 2, "--baseline");
    assert!(line.contains("no row of the baseline"), "{line}");
    assert!(!out.exists(), "a run folder was created");
    // Same text, ctx and chunks, another model: refused once its content is hashed.
    let other = fixtures_dir().join("tiny-qwen2");
    let line = assert_error(&mut gated(&out, other, "float32"), 2, "--baseline");
    assert!(line.contains("model sha256"), "{line}");
    assert!(!out.exists(), "a run folder was created");
    // Another context: refused before loading.
    let line = assert_error(
        &mut gated_ctx(&out, tiny_llama(), "float32", "32"),
        2,
        "--baseline",
    );
    assert!(line.contains("ctx 64 vs 32"), "{line}");
}

/// `compare` checks its limits as `--baseline` does: NaN, infinite and negative limits
/// are refused (exit 2, naming the flag) instead of turning a drop into "changed" or an
/// unchanged row into REGRESSED.
#[test]
fn compare_refuses_limits_that_are_not_finite_and_non_negative() {
    for (flag, value) in [
        ("--max-top1-regression", "nan"),
        ("--max-ppl-regression", "-1"),
        ("--max-kld-regression", "inf"),
        ("--max-speed-regression", "-0.5"),
    ] {
        let line = assert_error(
            kwk_eval()
                .arg("compare")
                .arg(data("compare-old.json"))
                .arg(data("compare-old.json"))
                .arg(format!("{flag}={value}")),
            2,
            flag,
        );
        assert!(line.ends_with(": pass a non-negative number"), "{line}");
    }
}

/// Two runs of another model, text or protocol are refused (exit 2) naming what differs,
/// as the gate refuses such a baseline; so is a pair without a measured row in common.
#[test]
fn compare_refuses_runs_that_are_not_comparable() {
    let dir = tempfile::tempdir().unwrap();
    let old: serde_json::Value = read_json(&data("compare-old.json"));
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit, &str); 4] = [
        (
            "model",
            |v| v["protocol"]["model_sha256"] = "ff".repeat(32).into(),
            "model sha256",
        ),
        (
            "text",
            |v| v["protocol"]["text_sha256"] = "ee".repeat(32).into(),
            "text sha256",
        ),
        (
            "ctx",
            |v| v["protocol"]["ctx"] = 128.into(),
            "ctx: first 64, this file 128",
        ),
        (
            "rows",
            |v| {
                for r in v["runners"].as_array_mut().unwrap() {
                    let name = format!("other-{}", r["name"].as_str().unwrap());
                    r["name"] = name.into();
                }
            },
            "no measured row is in both",
        ),
    ];
    for (what, edit, want) in cases {
        let mut new = old.clone();
        edit(&mut new);
        let path = dir.path().join(format!("{what}.json"));
        std::fs::write(&path, serde_json::to_string(&new).unwrap()).unwrap();
        let out = kwk_eval()
            .arg("compare")
            .arg(data("compare-old.json"))
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {stderr}");
        assert!(out.stdout.is_empty(), "{what}: printed a table");
        let line = assert_error(
            kwk_eval()
                .arg("compare")
                .arg(data("compare-old.json"))
                .arg(&path),
            2,
            &format!(
                "'{}' cannot be compared with '{}'",
                path.display(),
                data("compare-old.json").display()
            ),
        );
        assert!(line.contains(want), "{what}: {line}");
    }
    // A file compared with itself is "same" on every row.
    let out = kwk_eval()
        .arg("compare")
        .arg(data("compare-old.json"))
        .arg(data("compare-old.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let t = String::from_utf8(out.stdout).unwrap();
    assert!(!t.contains("REGRESSED") && t.contains("same"), "{t}");
}

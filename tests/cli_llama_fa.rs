//! `--llama-fa` with the real llama-bench on the tiny fixture GGUF: `best` (the default)
//! runs `-fa 0,1` in each round's one invocation and records, per test, the setting whose
//! mean is higher with both settings' figures; a forced setting runs only itself; the
//! same on ik_llama.cpp's llama-bench when its build is there; `off` with a quantized cache
//! is refused; and the flag warns when it changes nothing. (`best` with a quantized cache,
//! flash attention on alone, is checked in src/runner/llamacpp_tests.rs: llama.cpp's tools
//! cannot run the tiny fixture with a q8_0 cache at all: its head size, 16, is not a
//! multiple of the 32-value block.) No
//! figure here is checked against a speed: only which settings ran and that the one kept
//! is the faster of those recorded.

mod common;
use common::*;
use std::path::Path;

/// The tiny fixture's GGUF alone (no kwk format), timed by llama-bench: pp16, tg4, two
/// rounds, one thread, into `out`.
fn gguf_run(out: &Path, extra: &[&str]) -> assert_cmd::Command {
    let mut c = kwk_eval();
    c.args(["--formats", "none", "--ctx", "64", "--chunks", "1"])
        .args(["--pp", "16", "--tg", "4", "--reps", "2", "--threads", "1"])
        .args(["--no-pack-cache", "--ladder", "none", "--llama-bench"])
        .arg("--llm")
        .arg(tiny_llama())
        .arg("--gguf")
        .arg(tiny_llama().join("model.gguf"))
        .arg("--llama-cpp-dir")
        .arg(llama_dir())
        .arg("--text")
        .arg(eval_txt())
        .arg("--out")
        .arg(out)
        .args(extra);
    c
}

fn run_ok(cmd: &mut assert_cmd::Command) -> String {
    let o = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "stderr:\n{stderr}");
    stderr
}

/// The `-fa` settings each of the row's llama-bench objects ran with, in order (mainline
/// prints 0/1, ik_llama.cpp true/false).
fn raw_settings(row: &serde_json::Value) -> Vec<bool> {
    row["llama_bench"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| match &o["flash_attn"] {
            serde_json::Value::Bool(b) => *b,
            v => v.as_u64().unwrap() == 1,
        })
        .collect()
}

/// Checks every speed point of `row` was measured at exactly `settings` and keeps the
/// faster of them: its figures are the kept setting's own, its `flash_attn` the one with
/// the highest mean (a tie to on).
fn check_points(row: &serde_json::Value, settings: &[bool]) {
    let points = row["speed_points"].as_array().unwrap();
    assert_eq!(points.len(), 2, "{row}");
    for p in points {
        let by = p["by_flash_attn"].as_array().unwrap();
        let fa: Vec<bool> = by
            .iter()
            .map(|b| b["flash_attn"].as_bool().unwrap())
            .collect();
        assert_eq!(fa, settings, "{p}");
        for b in by {
            assert_eq!(
                b["samples_tokens_per_s"].as_array().unwrap().len(),
                2,
                "{b}"
            );
            assert_eq!(b["rounds"], serde_json::json!([0, 1]), "{b}");
        }
        let mean = |b: &serde_json::Value| b["tokens_per_s"].as_f64().unwrap();
        let best = by
            .iter()
            .fold(None::<&serde_json::Value>, |acc, b| match acc {
                Some(a) if mean(a) > mean(b) => Some(a),
                _ => Some(b),
            })
            .unwrap();
        assert_eq!(p["flash_attn"], best["flash_attn"], "{p}");
        assert_eq!(p["tokens_per_s"], best["tokens_per_s"], "{p}");
        assert_eq!(
            p["samples_tokens_per_s"], best["samples_tokens_per_s"],
            "{p}"
        );
        assert_eq!(p["rounds"], serde_json::json!([0, 1]), "{p}");
    }
}

/// The `flash_attn` column of speed_points.csv, by test, for row `name`.
fn csv_flash_attn(out: &Path, name: &str) -> Vec<(String, String)> {
    let mut rd = csv::Reader::from_path(out.join("speed_points.csv")).unwrap();
    let header: Vec<String> = rd.headers().unwrap().iter().map(String::from).collect();
    let col = |h: &str| header.iter().position(|x| x == h).unwrap();
    let (row, test, fa) = (col("row"), col("test"), col("flash_attn"));
    rd.records()
        .map(|r| r.unwrap())
        .filter(|r| &r[row] == name)
        .map(|r| (r[test].to_string(), r[fa].to_string()))
        .collect()
}

#[test]
fn best_runs_both_settings_in_each_round_and_keeps_the_faster_per_test() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    run_ok(&mut gguf_run(&out, &[]));
    let r = read_json(&out.join("results.json"));
    assert_eq!(r["protocol"]["llama_bench_fa"], "best");
    let row = &r["runners"][0];
    assert_eq!(row["engine"], "llama.cpp");
    assert!(
        row["engine_flags"]
            .as_str()
            .unwrap()
            .contains("llama-bench -fa 0,1 -ctk f16"),
        "{}",
        row["engine_flags"]
    );
    // Two rounds, each one invocation: pp and tg at 0, then at 1.
    assert_eq!(
        raw_settings(row),
        [false, false, true, true, false, false, true, true]
    );
    check_points(row, &[false, true]);
    // The row's pp/tg figures are the primary point's kept ones.
    let pp = &row["speed_points"][0];
    assert_eq!(row["pp_tokens_per_s"], pp["tokens_per_s"]);
    // speed_points.csv carries the kept setting, as llama-bench's 0/1.
    let name = row["name"].as_str().unwrap();
    let csv = csv_flash_attn(&out, name);
    assert_eq!(csv.len(), 2);
    for ((test, fa), p) in csv.iter().zip(row["speed_points"].as_array().unwrap()) {
        assert_eq!(test, p["test"].as_str().unwrap());
        let want = if p["flash_attn"].as_bool().unwrap() {
            "1"
        } else {
            "0"
        };
        assert_eq!(fa, want, "{test}");
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains("the faster of -fa 0 and -fa 1 per test"),
        "{report}"
    );
}

#[test]
fn a_forced_setting_runs_only_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    run_ok(&mut gguf_run(&out, &["--llama-fa", "off"]));
    let r = read_json(&out.join("results.json"));
    assert_eq!(r["protocol"]["llama_bench_fa"], "off");
    let row = &r["runners"][0];
    assert!(
        row["engine_flags"]
            .as_str()
            .unwrap()
            .contains("llama-bench -fa 0 -ctk f16"),
        "{}",
        row["engine_flags"]
    );
    assert_eq!(raw_settings(row), [false; 4]);
    check_points(row, &[false]);
    // llama-perplexity keeps its own setting (on for f16).
    assert!(row["engine_flags"]
        .as_str()
        .unwrap()
        .starts_with("llama-perplexity -fa on"));
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("-fa 0 alone (--llama-fa off)"), "{report}");
}

/// The refusal of `off` with a quantized cache is one line naming both flags and the fix
/// (docs/bad-inputs.md's `llama-fa-off-quantized-kv` row, checked word for word by
/// tests/cli_bounds.rs), before any tool runs; q4_0 likewise.
#[test]
fn off_with_a_quantized_cache_is_a_usage_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let line = assert_error(
        &mut gguf_run(&out, &["--llama-kv", "q4_0", "--llama-fa", "off"]),
        2,
        "--llama-fa off with --llama-kv q4_0: ",
    );
    assert!(
        line.ends_with("pass --llama-fa best (or on), or --llama-kv f16"),
        "{line}"
    );
    assert!(!out.exists(), "no run folder for bad input");
}

/// ik_llama.cpp's llama-bench takes `-fa 0,1` too; its rows get the same treatment.
#[test]
fn ik_rows_get_both_settings_too() {
    let Some(ik) = ik_dir() else {
        eprintln!("note: no ik_llama.cpp build; scripts/setup-ik-llama-cpp.sh makes one (skipped)");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    run_ok(gguf_run(&out, &["--peer", "ik", "--ik-llama-cpp-dir"]).arg(&ik));
    let row = &read_json(&out.join("results.json"))["runners"][0];
    assert_eq!(row["engine"], "ik");
    assert!(
        row["engine_flags"]
            .as_str()
            .unwrap()
            .contains("llama-bench -fa 0,1 -ctk f16 -ctv f16 -rtr 1"),
        "{}",
        row["engine_flags"]
    );
    assert_eq!(
        raw_settings(row),
        [false, false, true, true, false, false, true, true]
    );
    check_points(row, &[false, true]);
}

/// `--llama-fa` where no llama-bench runs: one warning line each, and the run goes on.
#[test]
fn llama_fa_that_changes_nothing_warns_once() {
    let cases: [(&[&str], &str); 2] = [
        (
            &["--formats", "float32"],
            "warning: --llama-fa does nothing: there is no llama.cpp row",
        ),
        (
            &["--formats", "none", "--no-speed", "--llama-bench"],
            "warning: --llama-fa does nothing with --no-speed",
        ),
    ];
    for (args, want) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let mut c = kwk_eval();
        c.args([
            "--ctx", "64", "--chunks", "1", "--pp", "16", "--tg", "4", "--reps", "1",
        ])
        .args(["--threads", "1", "--no-pack-cache", "--ladder", "none"])
        .args(["--llama-fa", "on"])
        .args(args)
        .arg("--llm")
        .arg(tiny_llama())
        .arg("--text")
        .arg(eval_txt())
        .arg("--llama-cpp-dir")
        .arg(llama_dir())
        .arg("--out")
        .arg(tmp.path().join("r"));
        if args.contains(&"none") {
            c.arg("--gguf").arg(tiny_llama().join("model.gguf"));
        }
        let stderr = run_ok(&mut c);
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("warning: --llama-fa"))
            .collect();
        assert_eq!(lines.len(), 1, "{stderr}");
        assert!(lines[0].starts_with(want), "{stderr}");
    }
}

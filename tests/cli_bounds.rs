//! Issue 10's harness side: every numeric flag has a bound checked before the model loads,
//! `--text` must be a bounded regular file, a runner that panics fails only its row, and a
//! closed stdout does not panic. Also keeps the "kwk-eval says" table of docs/bad-inputs.md
//! true: each of its rows is built here and must print exactly the row's message.

mod common;
use common::*;
use std::path::{Path, PathBuf};

fn doc_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/bad-inputs.md")
}

/// `(id, message)` of each row of the table in the "## Bad flags and texts" section.
fn table_rows() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(doc_path()).unwrap();
    let section = text
        .lines()
        .skip_while(|l| !l.starts_with("## Bad flags and texts"))
        .skip(1)
        .take_while(|l| !l.starts_with("## "));
    doc_table::table_rows(section)
}

const BUILDERS: [&str; 24] = [
    "reps-huge",
    "reps-0",
    "pp-huge",
    "tg-huge",
    "pp-plus-tg",
    "depth-plus-pp-tg",
    "depth-twice",
    "depth-past-context",
    "ctx-huge",
    "chunks-huge",
    "threads-huge",
    "threads-0",
    "llama-fa-off-quantized-kv",
    "text-directory",
    "text-device",
    "text-fifo",
    "text-too-big",
    "calib-text-device",
    "formats-kv-suffix",
    "generate-max-new-tokens-huge",
    "generate-threads-huge",
    "generate-temperature-nan",
    "generate-top-p",
    "prompt-too-long",
];

/// A run that would be valid but for `extra`.
fn eval_with(out: &Path, formats: &str, text: &Path, extra: &[&str]) -> assert_cmd::Command {
    let mut c = kwk_eval();
    c.args(["--formats", formats, "--no-pack-cache", "--llm"])
        .arg(tiny_llama())
        .arg("--text")
        .arg(text)
        .arg("--out")
        .arg(out)
        .args(extra);
    c
}

fn generate_with(extra: &[&str]) -> assert_cmd::Command {
    let mut c = kwk_eval();
    c.args([
        "generate",
        "--prompt",
        "The fox",
        "--no-pack-cache",
        "--llm",
    ])
    .arg(tiny_llama())
    .args(extra);
    c
}

/// Builds the bad input of row `id` under `tmp`: the command and the paths `{file}` and
/// `{dir}` stand for.
fn build(id: &str, tmp: &Path) -> (assert_cmd::Command, PathBuf, PathBuf) {
    let out = tmp.join("run");
    let none = PathBuf::from("/nonexistent-placeholder");
    let eval = |extra: &[&str]| {
        let c = eval_with(&out, "float32", &eval_txt(), extra);
        (c, none.clone(), none.clone())
    };
    let text = |file: &Path| {
        let c = eval_with(&out, "float32", file, &[]);
        (c, file.to_path_buf(), file.to_path_buf())
    };
    let generate = |extra: &[&str]| (generate_with(extra), none.clone(), none.clone());
    match id {
        "reps-huge" => eval(&["--reps", "18446744073709551615"]),
        "reps-0" => eval(&["--reps", "0"]),
        "pp-huge" => eval(&["--pp", "18446744073709551615"]),
        "tg-huge" => eval(&["--tg", "18446744073709551615"]),
        "pp-plus-tg" => eval(&["--pp", "1048576", "--tg", "1"]),
        "depth-plus-pp-tg" => eval(&["--depth", "0,1048000", "--pp", "512", "--tg", "128"]),
        "depth-twice" => eval(&["--depth", "0,512,0"]),
        "depth-past-context" => {
            let (c, _, dir) = eval(&["--depth", "0,200", "--pp", "64", "--tg", "16"]);
            (c, tiny_llama(), dir)
        }
        "ctx-huge" => eval(&["--ctx", "2097152"]),
        "chunks-huge" => eval(&["--chunks", "18446744073709551615"]),
        "threads-huge" => eval(&["--threads", "100000"]),
        "threads-0" => eval(&["--threads", "0"]),
        "llama-fa-off-quantized-kv" => eval(&["--llama-kv", "q8_0", "--llama-fa", "off"]),
        "text-directory" => text(tmp),
        "text-device" => text(Path::new("/dev/zero")),
        "text-fifo" => {
            let fifo = tmp.join("pipe.txt");
            let ok = std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap();
            assert!(ok.success(), "mkfifo failed");
            text(&fifo)
        }
        "text-too-big" => {
            let big = tmp.join("big.txt");
            // Sparse: no gigabyte is written.
            std::fs::File::create(&big)
                .unwrap()
                .set_len((1 << 30) + 1)
                .unwrap();
            text(&big)
        }
        "calib-text-device" => {
            let extra = ["--calib-text", "/dev/zero"];
            let c = eval_with(&out, "float32,int4:calib", &eval_txt(), &extra);
            (c, none.clone(), none.clone())
        }
        "formats-kv-suffix" => {
            let c = eval_with(&out, "float32,float32+kv:q4", &eval_txt(), &[]);
            (c, none.clone(), none.clone())
        }
        "generate-max-new-tokens-huge" => generate(&["--max-new-tokens", "18446744073709551615"]),
        "generate-threads-huge" => generate(&["--threads", "100000"]),
        "generate-temperature-nan" => generate(&["--temperature", "NaN"]),
        "generate-top-p" => generate(&["--top-p", "1.5"]),
        "prompt-too-long" => generate(&["--max-new-tokens", "1048576"]),
        _ => panic!("no builder for row {id}"),
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[test]
fn every_row_of_the_kwk_eval_table_is_the_message_printed() {
    let rows = table_rows();
    let ids: Vec<&str> = rows.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        ids, BUILDERS,
        "the table's rows and this test's builders differ"
    );
    let mut wrong = Vec::new();
    for (id, want) in &rows {
        let tmp = tempfile::tempdir().unwrap();
        let (mut cmd, file, dir) = build(id, tmp.path());
        let want = want
            .replace("{file}", &file.display().to_string())
            .replace("{dir}", &dir.display().to_string())
            .replace("{max_threads}", &(4 * cores()).to_string())
            .replace("{cores}", &cores().to_string());
        let line = assert_error(&mut cmd, 2, "");
        if line != format!("error: {want}") {
            wrong.push(format!(
                "{id}:\n  table:   error: {want}\n  printed: {line}"
            ));
        }
        assert!(
            !tmp.path().join("run").exists(),
            "{id}: a run folder was left"
        );
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

fn tiny_run(out: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(assert_cmd::cargo::cargo_bin("kwk-eval"));
    c.env_remove("KWK_LLAMA_CPP_DIR")
        .env_remove("KWK_ISA")
        .env_remove("KWK_TEST_PANIC_ROW")
        .args(["--formats", "float32,int8,bf16", "--ctx", "64", "--chunks"])
        .args([
            "2",
            "--pp",
            "16",
            "--tg",
            "4",
            "--reps",
            "2",
            "--threads",
            "2",
        ])
        .args(["--no-pack-cache", "--llm"])
        .arg(tiny_llama())
        .arg("--text")
        .arg(eval_txt())
        .arg("--out")
        .arg(out);
    c
}

/// A runner that panics (through the documented test hook `KWK_TEST_PANIC_ROW`) fails its
/// row only: the later rows are measured, the report holds the panic message, and the run
/// exits 2 naming the row. Once in the quality pass, once in a speed repetition.
#[test]
fn a_panicking_runner_fails_only_its_row() {
    for (hook, phase) in [("int8", "perplexity"), ("int8@speed", "speed")] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run");
        let o = tiny_run(&out)
            .env("KWK_TEST_PANIC_ROW", hook)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{hook}: {stderr}");
        let last = stderr
            .lines()
            .rev()
            .find(|l| l.starts_with("error:"))
            .unwrap();
        let prefix = if phase == "speed" { "speed: " } else { "" };
        let error = format!("{prefix}panicked: KWK_TEST_PANIC_ROW asked row 'int8' to panic");
        assert_eq!(
            last,
            format!("error: 1 runner(s) failed: int8: {error}"),
            "{hook}"
        );
        assert!(
            stderr.contains("note: KWK_TEST_PANIC_ROW=") && stderr.contains("(a test hook)"),
            "{stderr}"
        );
        let v = read_json(&out.join("results.json"));
        // A failed row: not every planned row was measured, so the run is not complete.
        assert_eq!(v["complete"], false, "{hook}");
        let rows = v["runners"].as_array().unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["float32", "int8", "bf16"], "{hook}");
        assert_eq!(rows[1]["error"], error, "{hook}");
        assert_eq!(
            (
                rows[1]["status"].as_str(),
                rows[1]["status_reason"].as_str()
            ),
            (Some("failed"), Some(error.as_str())),
            "{hook}"
        );
        for r in [&rows[0], &rows[2]] {
            assert!(r["error"].is_null(), "{hook}: {r}");
            assert!(r["ppl"].as_f64().unwrap() > 1.0, "{hook}: {r}");
            assert_eq!(
                r["tg_samples_tokens_per_s"].as_array().unwrap().len(),
                2,
                "{hook}: {r}"
            );
        }
        if phase == "speed" {
            // It had scored its perplexity before the speed test panicked.
            assert!(rows[1]["ppl"].as_f64().unwrap() > 1.0);
        } else {
            assert!(rows[1]["ppl"].is_null());
        }
    }
}

/// `kwk-eval ... | head -1`: the table goes to a closed pipe. No panic, the reports are
/// written, and the exit status is the run's own (0).
#[test]
fn a_closed_stdout_does_not_panic() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let log = dir.path().join("stderr.txt");
    let mut child = tiny_run(&out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // Close the read end at once: every write to stdout fails with EPIPE.
    drop(child.stdout.take());
    let status = child.wait().unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("error:"), "{stderr}");
    let v = read_json(&out.join("results.json"));
    assert_eq!(v["complete"], true);
    for f in ["results.csv", "report.md"] {
        assert!(out.join(f).exists(), "{f} missing");
    }
}

/// The same for a llama.cpp row: the first of two GGUF rows panics, the second is scored.
#[test]
fn a_panicking_llama_cpp_runner_fails_only_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    for p in [&a, &b] {
        std::fs::copy(tiny_llama().join("model.gguf"), p).unwrap();
    }
    let out = dir.path().join("run");
    let o = kwk_eval()
        .env("KWK_TEST_PANIC_ROW", "gguf:a.gguf")
        .args([
            "--formats",
            "none",
            "--ctx",
            "64",
            "--chunks",
            "2",
            "--no-speed",
        ])
        .arg("--llama-cpp-dir")
        .arg(llama_dir())
        .arg("--llm")
        .arg(tiny_llama())
        .arg("--text")
        .arg(eval_txt())
        .arg("--gguf")
        .arg(&a)
        .arg("--gguf")
        .arg(&b)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    let last = stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("error:"))
        .unwrap();
    assert_eq!(
        last,
        "error: 1 runner(s) failed: gguf:a.gguf: panicked: KWK_TEST_PANIC_ROW asked row 'gguf:a.gguf' to panic"
    );
    let v = read_json(&out.join("results.json"));
    let rows = v["runners"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["engine"], "llama.cpp");
    assert!(rows[0]["error"].as_str().unwrap().starts_with("panicked: "));
    assert_eq!(rows[1]["name"], "gguf:b.gguf");
    assert!(rows[1]["error"].is_null(), "{}", rows[1]);
    assert!(rows[1]["ppl"].as_f64().unwrap() > 1.0);
}

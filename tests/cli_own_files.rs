//! What a run reads and writes is its own (issue 42): llama.cpp scores the bytes of `--text`
//! that were hashed (a private copy in the run folder, checked against the hash), files in
//! `--out` named like kwk's old temporaries are never touched, GGUF rows get unique names
//! (two `model.gguf` in different folders, `--gguf LABEL=PATH`, names past 240 bytes), and
//! every planned row has a `status` every exporter shows.
//!
//! llama.cpp's real tools run through wrapper scripts where a test needs to see what a tool
//! was given; a fake llama-perplexity that exits 1 stands in for a failing row.

mod common;
use common::*;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Wrappers of every `llama-*` tool of `real` in `dir`; llama-perplexity's runs `before`
/// (shell, `$TEXT` is the path it was given with `-f`) and then the real tool.
fn wrappers(dir: &Path, before: &str) {
    let real = llama_dir();
    std::fs::create_dir_all(dir).unwrap();
    for e in std::fs::read_dir(&real).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if !name.starts_with("llama-") || name.contains('.') {
            continue;
        }
        let tool = real.join(&name);
        let mut body = format!(
            "#!/bin/sh\nLD_LIBRARY_PATH='{r}':\"$LD_LIBRARY_PATH\"\nexport LD_LIBRARY_PATH\n\
             case \"$1\" in --help|--version) exec '{t}' \"$@\";; esac\n",
            r = real.display(),
            t = tool.display()
        );
        if name == "llama-perplexity" {
            body.push_str(
                "TEXT=''\nprev=''\nfor a in \"$@\"; do\n  if [ \"$prev\" = '-f' ]; then TEXT=\"$a\"; fi\n  prev=\"$a\"\ndone\n",
            );
            body.push_str(before);
            body.push('\n');
        }
        body.push_str(&format!("exec '{}' \"$@\"\n", tool.display()));
        llamacpp::process::write_executable(&dir.join(&name), &body).unwrap();
    }
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A float32 row and the GGUF rows `ggufs` on the tiny model, perplexity only.
fn run(
    out: &Path,
    text: &Path,
    tools: &Path,
    formats: &str,
    ggufs: &[&str],
) -> assert_cmd::Command {
    let mut c = kwk_eval();
    c.args(["--formats", formats, "--ctx", "64", "--chunks", "2"])
        .args(["--no-speed", "--threads", "2", "--no-pack-cache", "--llm"])
        .arg(tiny_llama())
        .arg("--text")
        .arg(text)
        .arg("--out")
        .arg(out)
        .arg("--llama-cpp-dir")
        .arg(tools);
    for g in ggufs {
        c.arg("--gguf").arg(g);
    }
    c
}

fn names(v: &serde_json::Value) -> Vec<String> {
    v["runners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect()
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// llama-perplexity is given the run folder's copy of the text, holding exactly the bytes
/// hashed, and replacing `--text` under the run (the wrapper does it just before the tool
/// starts) changes nothing it reads; the copy is gone after the run.
#[test]
fn llama_cpp_reads_the_run_folders_copy_of_the_hashed_text() {
    let tmp = tempfile::tempdir().unwrap();
    let original = std::fs::read(eval_txt()).unwrap();
    let text = tmp.path().join("text.txt");
    std::fs::write(&text, &original).unwrap();
    let given = tmp.path().join("given-path");
    let seen = tmp.path().join("seen.txt");
    let bin = tmp.path().join("bin");
    wrappers(
        &bin,
        &format!(
            "printf 'a different text, replaced under the run\\n' > '{text}'\n\
             printf '%s' \"$TEXT\" > '{given}'\ncat \"$TEXT\" > '{seen}'",
            text = text.display(),
            given = given.display(),
            seen = seen.display()
        ),
    );
    let out = tmp.path().join("run");
    let model = tiny_llama().join("model.gguf");
    let output = run(&out, &text, &bin, "float32", &[model.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let path = PathBuf::from(std::fs::read_to_string(&given).unwrap());
    assert_ne!(path, text, "llama-perplexity read --text itself");
    assert_eq!(path.parent(), Some(out.as_path()), "{}", path.display());
    assert!(
        std::fs::read(&seen).unwrap() == original,
        "llama-perplexity did not read the bytes hashed"
    );
    let v = read_json(&out.join("results.json"));
    assert_eq!(v["protocol"]["text_sha256"], sha256(&original));
    assert_eq!(v["complete"], true);
    let rows = v["runners"].as_array().unwrap();
    assert_eq!(rows[1]["status"], "ok", "{}", rows[1]);
    assert_eq!(rows[1]["tokens_match"], true, "{}", rows[1]);
    // The same tokens scored by both engines: the GGUF row's PPL is float32's, near enough.
    let (a, b) = (
        rows[0]["ppl"].as_f64().unwrap(),
        rows[1]["ppl"].as_f64().unwrap(),
    );
    assert!((a / b - 1.0).abs() < 0.01, "{a} vs {b}");
    assert!(!path.exists(), "the private copy was left behind");
}

/// A private copy that changes while llama.cpp runs fails the row, naming the file.
#[test]
fn a_text_copy_changed_under_the_run_fails_its_row_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    wrappers(&bin, "chmod u+w \"$TEXT\"; printf 'more' >> \"$TEXT\"");
    // A copy of the fixture as --text: whatever the tool is given, the fixture is safe.
    let text = tmp.path().join("text.txt");
    std::fs::copy(eval_txt(), &text).unwrap();
    let out = tmp.path().join("run");
    let model = tiny_llama().join("model.gguf");
    let output = run(&out, &text, &bin, "float32", &[model.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    let v = read_json(&out.join("results.json"));
    let row = &v["runners"][1];
    assert_eq!(row["status"], "failed", "{row}");
    let why = row["status_reason"].as_str().unwrap();
    assert!(
        why.contains("changed during the run") && why.contains(&out.display().to_string()),
        "{why}"
    );
    assert!(row["ppl"].is_null(), "{row}");
    assert_eq!(v["complete"], false);
}

/// Files of the user's named like kwk's old temporaries (the reports' `.NAME.tmp` and
/// `.tmp.NAME`, a GGUF row's `gguf_<name>.logprobs.bin`) survive a run with their content,
/// and the run leaves no temporary of its own.
#[test]
fn files_named_like_kwk_temporaries_are_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    std::fs::create_dir(&out).unwrap();
    let theirs = [
        ".results.json.tmp",
        ".results.csv.tmp",
        ".report.md.tmp",
        ".tmp.report.md",
        ".tmp.speed.svg",
        ".tmp.quality_vs_bpw.png",
        "gguf_model_gguf.logprobs.bin",
    ];
    for name in theirs {
        std::fs::write(out.join(name), format!("the user's {name}")).unwrap();
    }
    // With speed (of the kwk row), so the speed plots are drawn too.
    let output = kwk_eval()
        .args(["--formats", "float32", "--ctx", "64", "--chunks", "2"])
        .args(["--pp", "16", "--tg", "4", "--reps", "1"])
        .args(["--threads", "2", "--no-pack-cache", "--llm"])
        .arg(tiny_llama())
        .arg("--text")
        .arg(eval_txt())
        .arg("--out")
        .arg(&out)
        .arg("--llama-cpp-dir")
        .arg(llama_dir())
        .arg("--gguf")
        .arg(tiny_llama().join("model.gguf"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    for name in theirs {
        assert_eq!(
            std::fs::read_to_string(out.join(name)).unwrap(),
            format!("the user's {name}"),
            "{name} was touched"
        );
    }
    let v = read_json(&out.join("results.json"));
    assert!(v["runners"][1]["kld_mean"].as_f64().is_some(), "{v}");
    let left: Vec<String> = files_in(&out)
        .into_iter()
        .filter(|f| !theirs.contains(&f.as_str()))
        .collect();
    for f in &left {
        assert!(
            kwk_eval::report::REPORT_FILES.contains(&f.as_str()),
            "left in the run folder: {f} ({left:?})"
        );
    }
    assert!(left.contains(&"speed.svg".to_string()), "{left:?}");
}

/// Two different `model.gguf` files are two rows, told apart by their folders; `--gguf
/// LABEL=PATH` names a row; the same file twice is refused; a 250-byte file name runs.
#[test]
fn gguf_rows_get_unique_names() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_llama().join("model.gguf");
    for d in ["a", "b"] {
        std::fs::create_dir(tmp.path().join(d)).unwrap();
        std::fs::copy(&model, tmp.path().join(d).join("model.gguf")).unwrap();
    }
    let long = tmp.path().join(format!("{}.gguf", "m".repeat(245)));
    std::fs::copy(&model, &long).unwrap();
    let a = tmp.path().join("a/model.gguf");
    let b = tmp.path().join("b/model.gguf");
    let out = tmp.path().join("run");
    let labelled = format!("mine={}", b.display());
    let output = run(
        &out,
        &eval_txt(),
        &llama_dir(),
        "float32",
        &[
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            &labelled,
            long.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    // b twice (once labelled): refused before anything runs.
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("is asked for twice") && stderr.contains("b/model.gguf"),
        "{stderr}"
    );
    assert!(!out.exists());

    let c = tmp.path().join("c.gguf");
    std::fs::copy(&model, &c).unwrap();
    let labelled = format!("mine={}", c.display());
    let output = run(
        &out,
        &eval_txt(),
        &llama_dir(),
        "float32",
        &[
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            &labelled,
            long.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let v = read_json(&out.join("results.json"));
    assert_eq!(
        names(&v),
        [
            "float32".to_string(),
            "gguf:a/model.gguf".into(),
            "gguf:b/model.gguf".into(),
            "gguf:mine".into(),
            format!("gguf:{}", long.file_name().unwrap().to_string_lossy()),
        ]
    );
    for r in v["runners"].as_array().unwrap() {
        assert_eq!(r["status"], "ok", "{r}");
        assert!(
            r["kld_mean"].as_f64().is_some() || r["name"] == "float32",
            "{r}"
        );
    }

    // The same file by two paths is one file.
    let again = tmp.path().join("a/../a/model.gguf");
    let out2 = tmp.path().join("run2");
    let line = assert_error(
        &mut run(
            &out2,
            &eval_txt(),
            &llama_dir(),
            "float32",
            &[a.to_str().unwrap(), again.to_str().unwrap()],
        ),
        2,
        "GGUF file",
    );
    assert!(line.contains("is asked for twice"), "{line}");
    assert!(!out2.exists());
}

/// A fake llama.cpp whose llama-perplexity exits 1: the row is `failed` with its reason in
/// results.json, results.csv, report.md and the terminal table, `complete` is false and
/// the run exits 2.
#[test]
fn a_failed_llama_cpp_row_has_status_failed_in_every_exporter() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("fake");
    std::fs::create_dir(&bin).unwrap();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("runners/llamacpp/tests/data");
    for (tool, help) in [
        ("llama-perplexity", "llama-perplexity-help.txt"),
        ("llama-bench", "llama-bench-help.txt"),
    ] {
        let script = format!(
            "#!/bin/sh\ncase \"$1\" in\n--version) echo 'version: 0.5.0-dev (build 0, commit unknown)' >&2; exit 0;;\n\
             --help) cat '{}'; exit 0;;\nesac\necho 'fake tool: failing on purpose' >&2\nexit 1\n",
            data.join(help).display()
        );
        llamacpp::process::write_executable(&bin.join(tool), &script).unwrap();
    }
    let out = tmp.path().join("run");
    let model = tiny_llama().join("model.gguf");
    let output = run(
        &out,
        &eval_txt(),
        &bin,
        "float32",
        &[model.to_str().unwrap()],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("1 runner(s) failed"), "{stderr}");

    let v = read_json(&out.join("results.json"));
    assert_eq!(v["complete"], false);
    assert_eq!(v["runners"][0]["status"], "ok");
    assert!(v["runners"][0]["status_reason"].is_null());
    let row = &v["runners"][1];
    assert_eq!(row["status"], "failed", "{row}");
    assert!(
        row["status_reason"]
            .as_str()
            .unwrap()
            .contains("perplexity"),
        "{row}"
    );

    let mut csv = csv::Reader::from_path(out.join("results.csv")).unwrap();
    let header = csv.headers().unwrap().clone();
    let col = |n: &str| header.iter().position(|h| h == n).unwrap();
    let rows: Vec<_> = csv.records().collect::<Result<_, _>>().unwrap();
    assert_eq!(&rows[0][col("status")], "ok");
    assert_eq!(&rows[1][col("status")], "failed");
    assert!(rows[1][col("status_reason")].contains("perplexity"));

    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("| float32 | kwk | ok |"), "{md}");
    assert!(
        md.contains("| gguf:model.gguf | llama.cpp | FAILED |"),
        "{md}"
    );
    assert!(md.contains("INCOMPLETE RUN"), "{md}");

    // The compact table: engine, type, then the status and its reason for a row not ok.
    let line = stdout
        .lines()
        .find(|l| l.starts_with("llama.cpp") && l.contains("model"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        line.contains("FAILED") && line.contains("llama-perplexity failed"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("kwk") && l.contains("float32") && !l.contains("FAILED")),
        "{stdout}"
    );
}

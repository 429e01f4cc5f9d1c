//! The run folder is this run's alone and nothing finished is lost on disk: a second run
//! on a locked `--out` stops, a folder holding a report file is refused and left as it was,
//! two default folders of the same second get fresh names, a report write that keeps
//! failing neither stops the measuring nor leaves temporary files, and `--tool-timeout` is
//! bounded. Each message is a row of docs/bad-inputs.md's kwk-eval section.

mod common;
use common::*;
use std::path::Path;

/// Every row of the section has a test (here or in cli_interrupt.rs).
#[test]
fn every_lifetime_row_has_a_test() {
    let ids: Vec<String> = lifetime_rows().into_iter().map(|(id, _, _)| id).collect();
    assert_eq!(
        ids,
        [
            "out-in-use",
            "out-holds-report",
            "tool-timeout-0",
            "reports-unwritable",
            "interrupted-sigint"
        ]
    );
}

fn tiny_run(out: &Path) -> assert_cmd::Command {
    let mut c = kwk_eval();
    c.args(["--formats", "float32,int8", "--ctx", "64", "--chunks", "2"])
        .args(["--no-speed", "--threads", "2", "--no-pack-cache", "--llm"])
        .arg(tiny_llama())
        .arg("--text")
        .arg(eval_txt())
        .arg("--out")
        .arg(out);
    c
}

fn expect(id: &str, dir: &Path, file: &Path) -> (i32, String) {
    let (code, msg) = lifetime_row(id);
    (
        code,
        msg.replace("{dir}", &dir.display().to_string())
            .replace("{file}", &file.display().to_string()),
    )
}

#[test]
fn a_locked_out_folder_stops_a_second_run() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    std::fs::create_dir(&out).unwrap();
    // Held as a running kwk-eval holds it.
    let held = std::fs::File::open(&out).unwrap();
    rustix::fs::flock(&held, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
    let (code, msg) = expect("out-in-use", &out, &out);
    let line = assert_error(&mut tiny_run(&out), code, &msg);
    assert_eq!(line, format!("error: {msg}"));
    assert_eq!(
        std::fs::read_dir(&out).unwrap().count(),
        0,
        "nothing written"
    );
    // Released: the run goes ahead.
    drop(held);
    tiny_run(&out).assert().success();
    assert!(out.join("results.json").exists());
}

#[test]
fn a_folder_holding_a_report_file_is_refused_and_left_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("report.md"), "my notes").unwrap();
    let (code, msg) = expect("out-holds-report", &out, &out);
    let line = assert_error(&mut tiny_run(&out), code, &msg);
    assert_eq!(line, format!("error: {msg}"));
    assert_eq!(
        std::fs::read_to_string(out.join("report.md")).unwrap(),
        "my notes"
    );
    let names: Vec<_> = std::fs::read_dir(&out).unwrap().collect();
    assert_eq!(names.len(), 1, "only the user's file");
}

#[test]
fn tool_timeout_is_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let (code, msg) = expect("tool-timeout-0", &out, &out);
    let line = assert_error(tiny_run(&out).args(["--tool-timeout", "0"]), code, &msg);
    assert_eq!(line, format!("error: {msg}"));
    assert!(!out.exists());
}

#[test]
fn reports_that_cannot_be_written_do_not_stop_the_run_or_leave_temporaries() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    std::fs::create_dir(&out).unwrap();
    // A folder of the user's named like an old temporary of results.json: left alone.
    std::fs::create_dir(out.join(".results.json.tmp")).unwrap();
    let (code, msg) = expect("reports-unwritable", &out, &out.join("results.json"));
    // Every write of results.json fails as on a full disk (kwk-eval's fault-injection hook).
    let output = tiny_run(&out)
        .env("KWK_TEST_REPORT_WRITE_FAILS", "results.json")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(output.status.code(), Some(code), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors, [format!("error: {msg}")], "{stderr}");
    // Warned once, measured to the end: both rows in the printed table.
    assert_eq!(stderr.matches("warning: writing").count(), 1, "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("float32") && stdout.contains("int8"),
        "{stdout}"
    );
    // No temporary file left; the user's folder untouched.
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, [".results.json.tmp"], "{names:?}");
    assert!(out.join(".results.json.tmp").is_dir());
}

#[test]
fn default_run_folders_of_the_same_second_do_not_collide() {
    let tmp = tempfile::tempdir().unwrap();
    // Two runs at once in the same working folder, default --out.
    let run = || {
        let mut c = std::process::Command::new(assert_cmd::cargo::cargo_bin("kwk-eval"));
        c.env_remove("KWK_LLAMA_CPP_DIR")
            .env_remove("KWK_ISA")
            .current_dir(tmp.path())
            .args(["--formats", "float32", "--ctx", "64", "--chunks", "2"])
            .args(["--no-speed", "--threads", "1", "--no-pack-cache", "--llm"])
            .arg(tiny_llama())
            .arg("--text")
            .arg(eval_txt())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        c
    };
    let mut a = run().spawn().unwrap();
    let mut b = run().spawn().unwrap();
    assert!(a.wait().unwrap().success());
    assert!(b.wait().unwrap().success());
    let runs: Vec<_> = std::fs::read_dir(tmp.path().join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    // Same second or not, each run has its own folder with one complete results.json.
    assert_eq!(runs.len(), 2, "{runs:?}");
    for r in runs {
        let json: serde_json::Value = read_json(&r.join("results.json"));
        assert_eq!(json["complete"], true);
        assert_eq!(json["runners"].as_array().unwrap().len(), 1);
    }
}

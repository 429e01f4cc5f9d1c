//! SIGINT/SIGTERM stop a run cleanly: a run signalled while its third runner (llama.cpp)
//! is running leaves a results.json with `complete: false` holding the two rows that
//! finished, no llama.cpp process alive, and no temporary file (run folder or pack cache),
//! and exits 130 (SIGINT) or 143 (SIGTERM).
//!
//! llama.cpp's real tools run through wrapper scripts; the llama-perplexity wrapper starts
//! the real tool and a long `sleep` in its process group, records their pids and waits, so
//! the signal always lands while a llama.cpp process group is alive (the tiny model alone
//! would finish before any signal could be sent).
//!
//! No signal leaves a llama.cpp tool running (issue 42 item 6): with a fake
//! llama-perplexity that records its pid and sleeps, SIGHUP stops the run like SIGTERM
//! (exit 129), a second signal kills the tool before exiting, and even SIGKILL of kwk-eval
//! takes the tool down (its parent-death signal).

mod common;
use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// Wrappers of every `llama-*` tool of `real` in `dir`; llama-perplexity's also holds on
/// (see the module doc) and writes the pids of its group to `pids`.
fn wrappers(real: &Path, dir: &Path, pids: &Path) {
    for e in std::fs::read_dir(real).unwrap() {
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
            body.push_str(&format!(
                "'{t}' \"$@\" >/dev/null 2>&1 &\necho $! > '{p}.tmp'\nsleep 300 &\necho $! >> '{p}.tmp'\n\
                 echo $$ >> '{p}.tmp'\nmv '{p}.tmp' '{p}'\nwait\n",
                t = tool.display(),
                p = pids.display()
            ));
        } else {
            body.push_str(&format!("exec '{}' \"$@\"\n", tool.display()));
        }
        let path = dir.join(&name);
        llamacpp::process::write_executable(&path, &body).unwrap();
    }
}

/// Whether process `pid` is gone (or a zombie).
fn dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signalled_run(signal: rustix::process::Signal, code: i32, name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let wrap = tmp.path().join("bin");
    std::fs::create_dir(&wrap).unwrap();
    let pids = tmp.path().join("pids");
    wrappers(&llama_dir(), &wrap, &pids);
    let out = tmp.path().join("run");
    let cache = tmp.path().join("pack-cache");
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("kwk-eval"))
        .env_remove("KWK_LLAMA_CPP_DIR")
        .env_remove("KWK_ISA")
        .args(["--formats", "float32,int8", "--ctx", "64", "--chunks", "2"])
        .args(["--no-speed", "--threads", "2", "--llm"])
        .arg(tiny_llama())
        .arg("--gguf")
        .arg(tiny_llama().join("model.gguf"))
        .arg("--llama-cpp-dir")
        .arg(&wrap)
        .arg("--pack-cache")
        .arg(&cache)
        .arg("--text")
        .arg(eval_txt())
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Signalled once the third runner's llama-perplexity is running.
    wait_until(
        "llama-perplexity to start",
        Duration::from_secs(300),
        || pids.exists() || child.try_wait().unwrap().is_some(),
    );
    assert!(pids.exists(), "kwk-eval ended before llama-perplexity ran");
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, signal).unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(output.status.code(), Some(code), "stderr:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    let results = out.join("results.json");
    // docs/bad-inputs.md's row (written for SIGINT; SIGTERM says its own name and 143).
    let (doc_code, msg) = lifetime_row("interrupted-sigint");
    assert_eq!(doc_code, 130);
    let msg = msg
        .replace("SIGINT", name)
        .replace("{file}", &results.display().to_string());
    assert_eq!(errors[0], format!("error: {msg}"));

    // The rows that finished, and only those, marked incomplete.
    let json: serde_json::Value = read_json(&results);
    assert_eq!(json["complete"], false);
    let all = json["runners"].as_array().unwrap();
    // The row the signal cut short is not a measured row: status skipped, with why.
    let skipped = all.iter().find(|r| r["status"] == "skipped").unwrap();
    assert_eq!(skipped["name"], "gguf:model.gguf");
    assert!(skipped["status_reason"]
        .as_str()
        .unwrap()
        .contains("interrupted"));
    let rows: Vec<_> = all.iter().filter(|r| r["status"] == "ok").collect();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["float32", "int8"]);
    assert_eq!(all.len(), 3);
    for r in rows {
        assert!(r["error"].is_null(), "{r}");
        assert!(r["ppl"].as_f64().unwrap() > 1.0, "{r}");
    }
    assert!(
        json["versions"]["llama_cpp_env_cleared"].is_array(),
        "{json}"
    );
    assert!(std::fs::read_to_string(out.join("report.md"))
        .unwrap()
        .contains("INCOMPLETE"));

    // No llama.cpp process (the tool, its wrapper, the wrapper's child) alive.
    for line in std::fs::read_to_string(&pids).unwrap().lines() {
        let id: i32 = line.trim().parse().unwrap();
        wait_until(
            &format!("process {id} to die"),
            Duration::from_secs(10),
            || dead(id),
        );
    }

    // No temporary file: only the reports in the run folder, only packs in the cache.
    let mut left: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    for f in &left {
        assert!(
            kwk_eval::report::REPORT_FILES.contains(&f.as_str()),
            "left in the run folder: {f} ({left:?})"
        );
    }
    if cache.exists() {
        for e in std::fs::read_dir(&cache).unwrap() {
            let f = e.unwrap().file_name().to_string_lossy().into_owned();
            assert!(!f.contains(".tmp."), "left in the pack cache: {f}");
        }
    }
}

#[test]
fn sigint_after_the_second_runner_keeps_its_rows_and_leaves_nothing_running() {
    signalled_run(rustix::process::Signal::INT, 130, "SIGINT");
}

#[test]
fn sigterm_stops_the_same_way_with_exit_143() {
    signalled_run(rustix::process::Signal::TERM, 143, "SIGTERM");
}

/// Fake llama.cpp tools in `dir`: they answer `--version` and `--help` as the real build
/// does (captured output in runners/llamacpp/tests/data); llama-perplexity otherwise writes
/// its pid to `pid_file` and holds on (`exec sleep`, the same process) until killed.
fn slow_fake_llama(dir: &Path, pid_file: &Path) {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("runners/llamacpp/tests/data");
    let tools = [
        (
            "llama-perplexity",
            format!(
                "echo $$ > '{p}.tmp'\nmv '{p}.tmp' '{p}'\nexec sleep 300\n",
                p = pid_file.display()
            ),
        ),
        ("llama-bench", "exit 1\n".to_string()),
    ];
    for (tool, body) in tools {
        let text = format!(
            "#!/bin/sh\ncase \"$1\" in\n--version) cat '{v}' >&2; exit 0;;\n--help) cat '{h}'; exit 0;;\nesac\n{body}",
            v = data.join("llama-perplexity-version.txt").display(),
            h = data.join(format!("{tool}-help.txt")).display(),
        );
        llamacpp::process::write_executable(&dir.join(tool), &text).unwrap();
    }
}

/// kwk-eval with one GGUF row run by [`slow_fake_llama`], started; returns it once the fake
/// llama-perplexity runs, with that tool's pid.
fn run_until_llama_perplexity_runs(tmp: &Path) -> (std::process::Child, i32) {
    let bin = tmp.join("bin");
    std::fs::create_dir(&bin).unwrap();
    let pid_file = tmp.join("pid");
    slow_fake_llama(&bin, &pid_file);
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("kwk-eval"))
        .env_remove("KWK_LLAMA_CPP_DIR")
        .env_remove("KWK_ISA")
        .args(["--formats", "none", "--ctx", "64", "--chunks", "2"])
        .args([
            "--no-speed",
            "--no-kld",
            "--threads",
            "1",
            "--no-pack-cache",
        ])
        .arg("--llm")
        .arg(tiny_llama())
        .arg("--gguf")
        .arg(tiny_llama().join("model.gguf"))
        .arg("--llama-cpp-dir")
        .arg(&bin)
        .arg("--text")
        .arg(eval_txt())
        .arg("--out")
        .arg(tmp.join("run"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(
        "llama-perplexity to start",
        Duration::from_secs(300),
        || pid_file.exists() || child.try_wait().unwrap().is_some(),
    );
    assert!(
        pid_file.exists(),
        "kwk-eval ended before llama-perplexity ran: {:?}",
        child.wait_with_output().unwrap()
    );
    let tool: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!dead(tool), "the fake llama-perplexity is not running");
    (child, tool)
}

fn send(child: &std::process::Child, signal: rustix::process::Signal) {
    rustix::process::kill_process(rustix::process::Pid::from_child(child), signal).unwrap();
}

/// The tool is gone within 10 s of kwk-eval's end (it would sleep 300 s if orphaned).
fn assert_tool_gone(tool: i32) {
    wait_until(
        &format!("llama-perplexity (pid {tool}) to die"),
        Duration::from_secs(10),
        || dead(tool),
    );
}

#[test]
fn sighup_stops_like_sigterm_with_exit_129_and_kills_the_tool() {
    let tmp = tempfile::tempdir().unwrap();
    let (child, tool) = run_until_llama_perplexity_runs(tmp.path());
    send(&child, rustix::process::Signal::HUP);
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(output.status.code(), Some(129), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].starts_with("error: interrupted by SIGHUP; "),
        "{stderr}"
    );
    assert_tool_gone(tool);
}

/// Two signals handled back to back (sent while kwk-eval is stopped, so the second one
/// always finds the first one's stop still under way): the second exits at once, and
/// kills the running tool's process group first.
#[test]
fn a_second_signal_exits_at_once_and_kills_the_tool_first() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, tool) = run_until_llama_perplexity_runs(tmp.path());
    send(&child, rustix::process::Signal::STOP);
    send(&child, rustix::process::Signal::INT);
    send(&child, rustix::process::Signal::TERM);
    send(&child, rustix::process::Signal::CONT);
    let status = child.wait().unwrap();
    assert!(
        matches!(status.code(), Some(130 | 143)),
        "exit status {status:?}"
    );
    assert_tool_gone(tool);
}

/// The report: two SIGINTs 50 ms apart.
#[test]
fn two_sigints_50_ms_apart_leave_no_tool_running() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, tool) = run_until_llama_perplexity_runs(tmp.path());
    send(&child, rustix::process::Signal::INT);
    std::thread::sleep(Duration::from_millis(50));
    // kwk-eval may have finished stopping already.
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::INT,
    );
    assert_eq!(child.wait().unwrap().code(), Some(130));
    assert_tool_gone(tool);
}

/// Not even SIGKILL (no handler runs) leaves the tool running: it has a parent-death signal.
#[test]
fn sigkill_of_kwk_eval_takes_the_tool_down() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, tool) = run_until_llama_perplexity_runs(tmp.path());
    send(&child, rustix::process::Signal::KILL);
    child.wait().unwrap();
    assert_tool_gone(tool);
}

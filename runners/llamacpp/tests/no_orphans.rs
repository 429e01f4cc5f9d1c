//! No tool outlives the program that runs it (issue 42 item 6): [`process::kill_running`]
//! kills the process group of every tool running (what kwk-eval calls on a second signal
//! before exiting), and every tool carries a parent-death signal, so it dies with the
//! thread that started it even when nothing gets to kill it. Its own test binary:
//! `kill_running` kills every tool of the process, which would stop other tests' tools.

use llamacpp::process::{self, ToolCommand};
use llamacpp::Error;
use std::path::Path;
use std::time::{Duration, Instant};

/// Whether process `pid` is gone (or a zombie).
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A tool that starts a child of its own, writes both pids to `pids`, and waits.
fn busy_tool(dir: &Path, pids: &Path) -> ToolCommand {
    let tool = dir.join("busy-tool");
    process::write_executable(
        &tool,
        &format!(
            "#!/bin/sh\nsleep 300 &\necho $! > '{p}.tmp'\necho $$ >> '{p}.tmp'\nmv '{p}.tmp' '{p}'\nwait\n",
            p = pids.display()
        ),
    )
    .unwrap();
    ToolCommand::new("busy-tool", &tool, Duration::from_secs(600), "hint")
}

fn pids_in(file: &Path) -> Vec<u32> {
    let text = std::fs::read_to_string(file).unwrap();
    text.lines().map(|l| l.trim().parse().unwrap()).collect()
}

#[test]
fn kill_running_kills_every_running_tool_group() {
    let tmp = tempfile::tempdir().unwrap();
    let pids = tmp.path().join("pids");
    let cmd = busy_tool(tmp.path(), &pids);
    let runner = std::thread::spawn(move || process::run(&cmd, |_, _| {}).map_err(Box::new));
    wait_for("the tool to start", || pids.exists());
    process::kill_running();
    let e = runner.join().unwrap().unwrap_err();
    assert!(
        matches!(&*e, Error::Failed { status, .. } if status.starts_with("killed by signal 9")),
        "{e}"
    );
    let ids = pids_in(&pids);
    assert_eq!(ids.len(), 2);
    for id in ids {
        wait_for(&format!("process {id} to die"), || dead(id));
    }
    // Nothing is left registered: a later call kills nothing and a later run finishes.
    process::kill_running();
    let quick = tmp.path().join("quick-tool");
    process::write_executable(&quick, "#!/bin/sh\nexit 0\n").unwrap();
    process::run(
        &ToolCommand::new("quick-tool", &quick, Duration::from_secs(60), "hint"),
        |_, _| {},
    )
    .unwrap();
}

/// The parent-death signal: a tool spawned (as `run` spawns it) by a thread that then ends
/// is killed, though no one killed it; that is what takes a tool down when kwk-eval itself
/// is killed with SIGKILL.
#[cfg(target_os = "linux")]
#[test]
fn a_tool_dies_with_the_thread_that_started_it() {
    let tmp = tempfile::tempdir().unwrap();
    let tool = tmp.path().join("sleepy-tool");
    process::write_executable(&tool, "#!/bin/sh\nexec sleep 300\n").unwrap();
    let cmd = ToolCommand::new("sleepy-tool", &tool, Duration::from_secs(600), "hint");
    let mut child = std::thread::spawn(move || cmd.to_command().spawn().unwrap())
        .join()
        .unwrap();
    // Killed by SIGKILL within 10 s, not after its 300 s sleep.
    let until = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the tool outlived the thread that started it");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "{status:?}");
}

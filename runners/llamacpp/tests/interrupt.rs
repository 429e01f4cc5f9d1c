//! The interrupt flag ([`llamacpp::process::interrupt_flag`]) kills a running tool's whole
//! process group (with a system call, no `kill` binary) and makes later runs stop at once.
//! Its own test binary: the flag is process-wide and would stop the other tests' tools.

use llamacpp::process::{self, ToolCommand};
use llamacpp::Error;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Whether process `pid` is gone (or a zombie: dead, waiting for a parent to reap it).
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // "PID (comm) STATE ..."; comm may hold spaces, so split after the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    while !ok() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn an_interrupt_kills_the_tool_group_and_stops_later_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let tool = tmp.path().join("busy-tool");
    let pids = tmp.path().join("pids");
    // The tool and a child of its own, both recording their pids, then waiting.
    process::write_executable(
        &tool,
        &format!(
            "#!/bin/sh\nsleep 300 &\necho $! > '{p}.tmp'\necho $$ >> '{p}.tmp'\nmv '{p}.tmp' '{p}'\nwait\n",
            p = pids.display()
        ),
    )
    .unwrap();
    let cmd = ToolCommand::new("busy-tool", &tool, Duration::from_secs(600), "hint");
    let pids_file = pids.clone();
    let setter = std::thread::spawn(move || {
        wait_for("the tool to start", || pids_file.exists());
        process::interrupt_flag().store(true, Ordering::SeqCst);
    });
    let e = process::run(&cmd, |_, _| {}).unwrap_err();
    setter.join().unwrap();
    assert!(matches!(e, Error::Interrupted { .. }), "{e}");
    assert!(
        e.to_string()
            .starts_with("busy-tool was stopped: the run was interrupted"),
        "{e}"
    );
    all_dead(&pids);
    // Once set, a new run is stopped as soon as it starts (whatever it got to start dies).
    std::fs::remove_file(&pids).unwrap();
    let e = process::run(&cmd, |_, _| {}).unwrap_err();
    assert!(matches!(e, Error::Interrupted { .. }), "{e}");
    if pids.exists() {
        all_dead(&pids);
    }
}

/// Every pid the tool recorded in `pids` (itself and its child) is dead.
fn all_dead(pids: &Path) {
    let text = std::fs::read_to_string(pids).unwrap();
    let ids: Vec<u32> = text.lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(ids.len(), 2, "{text}");
    for id in ids {
        wait_for(&format!("process {id} to die"), || dead(id));
    }
}

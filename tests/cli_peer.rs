//! `--peer ik` (issue 40) without a usable ik_llama.cpp: a missing build, or mainline's
//! tools given as the fork's, stop the run before anything is measured with one line naming
//! the tool and the set-up command, exit status 2.

mod common;
use common::*;

fn peer_ik_run(ik_dir: &std::path::Path, out: &std::path::Path) -> assert_cmd::Command {
    let mut c = kwk_eval();
    c.args(["--formats", "none", "--ctx", "64", "--chunks", "2"])
        .args(["--no-speed", "--threads", "2", "--no-pack-cache", "--llm"])
        .arg(tiny_llama())
        .arg("--gguf")
        .arg(tiny_llama().join("model.gguf"))
        .args(["--peer", "ik", "--ik-llama-cpp-dir"])
        .arg(ik_dir)
        .arg("--text")
        .arg(eval_txt())
        .arg("--out")
        .arg(out);
    c
}

#[test]
fn a_missing_ik_build_is_one_line_and_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("no-ik");
    std::fs::create_dir(&empty).unwrap();
    let out = tmp.path().join("run");
    let line = assert_error(
        &mut peer_ik_run(&empty, &out),
        2,
        "--peer ik: ik_llama.cpp tool `llama-perplexity` not found",
    );
    assert!(line.contains("scripts/setup-ik-llama-cpp.sh"), "{line}");
    assert!(!out.exists(), "a run folder was made");
}

/// Mainline's real tools given as ik_llama.cpp's are recognised by their own `--help`.
#[test]
fn mainline_tools_given_as_iks_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let line = assert_error(&mut peer_ik_run(&llama_dir(), &out), 2, "--peer ik: ");
    assert!(line.contains("is not ik_llama.cpp but llama.cpp"), "{line}");
    assert!(line.contains("scripts/setup-ik-llama-cpp.sh"), "{line}");
}

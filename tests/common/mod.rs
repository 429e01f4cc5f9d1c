//! Shared helpers of the end-to-end tests: the fixture folders and a kwk-eval command with
//! a clean environment.
#![allow(dead_code)]

use assert_cmd::Command;
use std::path::{Path, PathBuf};

/// `../shared/fixtures` of the repository (the first ancestor holding `shared/fixtures`;
/// a worktree sits one level deeper than the main checkout).
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|a| a.join("shared").join("fixtures"))
        .find(|p| p.is_dir())
        .expect("../shared/fixtures not found above the repository")
}

pub fn tiny_llama() -> PathBuf {
    fixtures_dir().join("tiny-llama")
}

pub fn eval_txt() -> PathBuf {
    fixtures_dir().join("eval.txt")
}

/// kwk-eval with no llama.cpp or pack cache configuration from the environment.
pub fn kwk_eval() -> Command {
    let mut c = Command::cargo_bin("kwk-eval").unwrap();
    c.env_remove("KWK_LLAMA_CPP_DIR").env_remove("KWK_ISA");
    c
}

/// Runs `cmd`, asserts exit status `code`, that stderr holds exactly one `error:` line and
/// that it starts with `error: {prefix}`; returns that line.
pub fn assert_error(cmd: &mut Command, code: i32, prefix: &str) -> String {
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(code), "stderr:\n{stderr}");
    assert!(!stderr.contains("panicked"), "panic:\n{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(
        errors.len(),
        1,
        "expected one error line, stderr:\n{stderr}"
    );
    let want = format!("error: {prefix}");
    assert!(
        errors[0].starts_with(&want),
        "expected a line starting with\n  {want}\ngot\n  {}",
        errors[0]
    );
    errors[0].to_string()
}

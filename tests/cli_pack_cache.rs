//! The pack cache from the command line: a run leaves the folder at or under
//! `KWK_PACK_CACHE_GB` (a pack larger than the whole limit is used, not kept, with one
//! warning line), an unusable folder is one warning line, and `cache clear` touches only
//! kwk's files (issue 42, items 5 and 9).

mod common;
use common::*;
use std::path::{Path, PathBuf};

/// The SmolLM2-135M Q8_0 GGUF scripts/setup-model.sh installs (`kwk::paths`).
fn smollm2_q8() -> PathBuf {
    let path = kwk::paths::default_models_dir()
        .expect("none of KWK_MODELS_DIR, KWK_CACHE, XDG_CACHE_HOME, HOME is set")
        .join("SmolLM2-135M-Instruct/SmolLM2-135M-Instruct-Q8_0.gguf");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/setup-model.sh (docs/paths.md)",
        path.display()
    );
    path
}

fn folder_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

fn kwk_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".kwkpack"))
        .collect();
    v.sort();
    v
}

/// One int8 row of `llm` with the pack cache in `cache` limited to `gb`; stderr.
fn run_int8(llm: &Path, cache: &Path, out: &Path, gb: &str) -> String {
    let o = kwk_eval()
        .env("KWK_PACK_CACHE_GB", gb)
        .args([
            "--formats",
            "int8",
            "--ctx",
            "64",
            "--chunks",
            "1",
            "--no-speed",
        ])
        .args(["--threads", "2", "--llm"])
        .arg(llm)
        .arg("--text")
        .arg(eval_txt())
        .arg("--pack-cache")
        .arg(cache)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    stderr
}

fn over_limit_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains("is larger than the whole cache limit"))
        .collect()
}

#[test]
fn a_run_leaves_the_cache_at_or_under_its_limit() {
    let llm = smollm2_q8();
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("pack");
    // 0.05 GB: SmolLM2-135M's int8 pack (about 140 MB) is used and not kept.
    let stderr = run_int8(&llm, &cache, &dir.path().join("r1"), "0.05");
    let lines = over_limit_lines(&stderr);
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with(&format!(
            "warning: pack cache {}: the int8 pack (",
            cache.display()
        )) && lines[0].ends_with(
            "is larger than the whole cache limit (50.0 MB, KWK_PACK_CACHE_GB): used for \
                 this run, not kept"
        ),
        "{}",
        lines[0]
    );
    assert!(
        folder_bytes(&cache) <= 50_000_000,
        "{}",
        folder_bytes(&cache)
    );
    assert!(kwk_files(&cache).is_empty());
    // Under 1 GB it is kept; a later run with the lower limit loads it, then deletes it.
    let stderr = run_int8(&llm, &cache, &dir.path().join("r2"), "1");
    assert!(over_limit_lines(&stderr).is_empty(), "{stderr}");
    assert_eq!(kwk_files(&cache).len(), 1);
    let kept = folder_bytes(&cache);
    assert!(kept > 50_000_000 && kept <= 1_000_000_000, "{kept}");
    let stderr = run_int8(&llm, &cache, &dir.path().join("r3"), "0.05");
    assert_eq!(over_limit_lines(&stderr).len(), 1, "{stderr}");
    assert!(
        folder_bytes(&cache) <= 50_000_000,
        "{}",
        folder_bytes(&cache)
    );
}

fn tiny_int8_int4(cache: Option<&Path>) -> assert_cmd::Command {
    let mut c = kwk_eval();
    c.args([
        "--formats",
        "int8,int4",
        "--ctx",
        "64",
        "--chunks",
        "1",
        "--no-speed",
    ])
    .args(["--threads", "2", "--llm"])
    .arg(tiny_llama())
    .arg("--text")
    .arg(eval_txt());
    if let Some(cache) = cache {
        c.arg("--pack-cache").arg(cache);
    }
    c
}

#[test]
fn an_unusable_cache_folder_is_one_warning_line() {
    let dir = tempfile::tempdir().unwrap();
    // A file where the folder should be: two quantized rows, one warning.
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a folder").unwrap();
    let o = tiny_int8_int4(Some(&file))
        .arg("--out")
        .arg(dir.path().join("r1"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("warning: pack cache"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].starts_with(&format!(
            "warning: pack cache {} cannot be used (",
            file.display()
        )) && warnings[0].ends_with(
            "); packing without it (pass --pack-cache DIR naming a writable folder, or \
             --no-pack-cache)"
        ),
        "{}",
        warnings[0]
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"not a folder");
    // No home, no cache variables: no default folder, one warning.
    let o = tiny_int8_int4(None)
        .env_remove("HOME")
        .env_remove("XDG_CACHE_HOME")
        .env_remove("KWK_CACHE")
        .arg("--out")
        .arg(dir.path().join("r2"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("warning: pack cache"))
        .collect();
    assert_eq!(
        warnings,
        vec![
            "warning: pack cache: no folder (none of KWK_CACHE, XDG_CACHE_HOME, HOME is set); \
             packing without it (pass --pack-cache DIR)"
        ],
        "{stderr}"
    );
}

#[test]
fn cache_clear_deletes_only_kwk_files_and_refuses_a_foreign_folder() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("pack");
    // kwk creates the folder (marker) and writes two packs; the user's files join them.
    let o = tiny_int8_int4(Some(&cache))
        .arg("--out")
        .arg(dir.path().join("r1"))
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(kwk_files(&cache).len(), 1, "one file per model");
    for f in ["Cargo.lock", "poetry.lock", ".notes.tmp.999999"] {
        std::fs::write(cache.join(f), b"mine").unwrap();
    }
    let o = kwk_eval()
        .args(["cache", "prune", "--pack-cache"])
        .arg(&cache)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    let o = kwk_eval()
        .args(["cache", "clear", "--pack-cache"])
        .arg(&cache)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("deleted 1 files"));
    assert!(kwk_files(&cache).is_empty());
    for f in ["Cargo.lock", "poetry.lock", ".notes.tmp.999999"] {
        assert_eq!(std::fs::read(cache.join(f)).unwrap(), b"mine", "{f}");
    }
    // A folder kwk did not create, holding other files: refused, nothing deleted.
    let project = dir.path().join("project");
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join("Cargo.lock"), b"mine").unwrap();
    let line = assert_error(
        kwk_eval()
            .args(["cache", "clear", "--pack-cache"])
            .arg(&project),
        2,
        "clearing the pack cache",
    );
    assert!(
        line.contains("is not a folder kwk created (no KWK-PACK-CACHE file)")
            && line.contains("(Cargo.lock)"),
        "{line}"
    );
    assert!(project.join("Cargo.lock").is_file());
}

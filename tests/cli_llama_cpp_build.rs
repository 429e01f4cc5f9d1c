//! A real llama.cpp built from a shallow clone (`git clone --depth 1`) reports `build 1`
//! (issue 42 item 10). Such a build is run, judged by its `--help` alone, and the reports
//! say which build ran and how it was judged. llama.cpp's real tools run through wrappers
//! whose `--version` prints the captured output of a shallow-clone build
//! (runners/llamacpp/tests/data/llama-perplexity-version-shallow-clone.txt).

mod common;
use common::*;
use std::path::Path;

/// Wrappers of every `llama-*` tool of `real` in `dir`, answering `--version` with the
/// text of `version`.
fn wrappers(real: &Path, dir: &Path, version: &Path) {
    for e in std::fs::read_dir(real).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if !name.starts_with("llama-") || name.contains('.') {
            continue;
        }
        let body = format!(
            "#!/bin/sh\nLD_LIBRARY_PATH='{r}':\"$LD_LIBRARY_PATH\"\nexport LD_LIBRARY_PATH\n\
             case \"$1\" in --version) cat '{v}' >&2; exit 0;; esac\nexec '{t}' \"$@\"\n",
            r = real.display(),
            v = version.display(),
            t = real.join(&name).display()
        );
        llamacpp::process::write_executable(&dir.join(&name), &body).unwrap();
    }
}

#[test]
fn a_shallow_clone_build_runs_and_the_reports_say_how_it_was_judged() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let version = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("runners/llamacpp/tests/data/llama-perplexity-version-shallow-clone.txt");
    wrappers(&llama_dir(), &bin, &version);
    let out = tmp.path().join("run");
    let output = kwk_eval()
        .args(["--formats", "none", "--ctx", "64", "--chunks", "2"])
        .args(["--no-speed", "--threads", "2", "--no-pack-cache", "--llm"])
        .arg(tiny_llama())
        .arg("--gguf")
        .arg(tiny_llama().join("model.gguf"))
        .arg("--llama-cpp-dir")
        .arg(&bin)
        .arg("--text")
        .arg(eval_txt())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let json: serde_json::Value = read_json(&out.join("results.json"));
    assert_eq!(
        json["versions"]["llama_cpp_build"],
        serde_json::json!({
            "number": 1,
            "commit": "abcdef0",
            "judged_by": "--help flags (build number 1 not plausible)"
        }),
        "{json}"
    );
    assert_eq!(
        json["versions"]["llama_cpp_version"],
        "version: 1 (abcdef0)"
    );
    let row = &json["runners"][0];
    assert!(row["ppl"].as_f64().unwrap() > 1.0, "{row}");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains(
            "llama.cpp build 1 (commit abcdef0; judged new enough by --help flags (build number 1 not plausible))"
        ),
        "{report}"
    );
}

//! `--reference` end to end on the tiny fixture model: a run that keeps its float32
//! reference (`--keep-logits`), a second run that loads it instead of computing float32's
//! log-probs again (and gets the same figures to the last bit), and the refusals, exit 2
//! with one line naming both values: a reference of another ctx, another text (tokens),
//! another model, and a truncated file.

mod common;
use common::*;
use std::path::Path;

fn results(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("results.json"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    serde_json::from_str(&text).unwrap()
}

fn row<'a>(r: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    r["runners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == name)
        .unwrap_or_else(|| panic!("no row {name}"))
}

/// A quality-only run of the tiny model: `formats`, ctx `ctx`, 2 chunks, into `out`.
fn run(model: &Path, text: &Path, formats: &str, ctx: &str, out: &Path) -> assert_cmd::Command {
    let mut c = kwk_eval();
    c.arg("--llm")
        .arg(model)
        .arg("--text")
        .arg(text)
        .args(["--formats", formats, "--ctx", ctx, "--chunks", "2"])
        .args(["--no-speed", "--no-pack-cache", "--threads", "1", "--out"])
        .arg(out);
    c
}

#[test]
fn a_kept_reference_is_loaded_checked_and_refused_when_it_is_of_another_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The reference, kept.
    run(&tiny_llama(), &eval_txt(), "float32", "64", &d.join("ref"))
        .arg("--keep-logits")
        .assert()
        .success();
    let file = d.join("ref/float32-kl-divergence-base.bin");
    let made = results(&d.join("ref"));
    let used = &made["protocol"]["reference"];
    assert_eq!(used["source"], "computed");
    assert_eq!(used["file"], file.display().to_string());
    // A run computing everything itself, and one loading the reference: the same figures.
    run(
        &tiny_llama(),
        &eval_txt(),
        "float32,int8",
        "64",
        &d.join("own"),
    )
    .assert()
    .success();
    let out = run(
        &tiny_llama(),
        &eval_txt(),
        "float32,int8",
        "64",
        &d.join("loaded"),
    )
    .arg("--reference")
    .arg(d.join("ref"))
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("float32: perplexity from --reference"),
        "{stderr}"
    );
    assert!(!stderr.contains("float32: perplexity\n"), "{stderr}");
    let (own, loaded) = (results(&d.join("own")), results(&d.join("loaded")));
    assert_eq!(loaded["protocol"]["reference"]["source"], "loaded");
    assert_eq!(loaded["protocol"]["reference"]["sha256"], used["sha256"]);
    assert_eq!(own["protocol"]["reference"]["sha256"], used["sha256"]);
    assert_eq!(
        own["protocol"]["reference"]["file"],
        serde_json::Value::Null
    );
    for name in ["float32", "int8"] {
        for field in ["ppl", "ppl_err", "kld_mean", "kld_p99", "ln_ppl_ratio"] {
            let (a, b) = (&row(&own, name)[field], &row(&loaded, name)[field]);
            assert!(!a.is_null() || name == "float32", "{name} {field}");
            assert_eq!(a, b, "{name} {field}");
        }
    }
    assert_eq!(
        row(&own, "float32")["running_ppl"],
        row(&loaded, "float32")["running_ppl"]
    );
    assert!(
        !d.join("loaded/float32-kl-divergence-base.bin").exists(),
        "a loaded reference is not copied"
    );

    // Another ctx, another text, another model: refused before anything is measured.
    let refused = |model: &Path, text: &Path, ctx: &str, name: &str, reference: &Path| {
        assert_error(
            run(model, text, "int8", ctx, &d.join(name))
                .arg("--reference")
                .arg(reference),
            2,
            "--reference",
        )
    };
    let line = refused(&tiny_llama(), &eval_txt(), "32", "ctx32", &file);
    assert!(
        line.contains("was made with ctx 64, this run has 32"),
        "{line}"
    );
    let other_text = d.join("other.txt");
    let text = std::fs::read_to_string(eval_txt()).unwrap();
    std::fs::write(&other_text, text.replace("the", "a")).unwrap();
    let line = refused(&tiny_llama(), &other_text, "64", "text", &file);
    assert!(line.contains("text sha256"), "{line}");
    let line = refused(
        &fixtures_dir().join("tiny-qwen2"),
        &eval_txt(),
        "64",
        "model",
        &file,
    );
    assert!(line.contains("model sha256"), "{line}");
    for name in ["ctx32", "text", "model"] {
        assert!(!d.join(name).join("results.json").exists(), "{name}");
    }

    // A copy cut short, and a folder without a reference.
    let cut = d.join("cut.bin");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    let line = refused(&tiny_llama(), &eval_txt(), "64", "cut", &cut);
    assert!(
        line.contains("incomplete") && line.contains("cut.bin"),
        "{line}"
    );
    let line = refused(&tiny_llama(), &eval_txt(), "64", "none", &d.join("own"));
    assert!(
        line.contains("no file") && line.contains("--keep-logits"),
        "{line}"
    );
}

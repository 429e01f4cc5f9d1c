//! The llama.cpp ladder end to end on the tiny fixture model (its GGUF: the
//! `--allow-requantize` path), with llama.cpp's real tools: the rows it makes, how each was
//! made (fallbacks for row length named, bits per weight), the cache (a second run reuses
//! every file; a changed source or calibration text makes new ones) and the no-op warning.

mod common;
use common::*;
use std::path::Path;

fn results(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("results.json")).unwrap()).unwrap()
}

/// kwk-eval on `model` with the ladder's tools, 2 chunks of 64, no speed, `extra` flags
/// (no `--formats`: the callers choose).
fn ladder_cmd(cache: &Path, model: &Path, out: &Path, extra: &[&str]) -> assert_cmd::Command {
    let mut c = kwk_eval();
    c.env("KWK_CACHE", cache)
        .arg("--llm")
        .arg(model)
        .arg("--text")
        .arg(eval_txt())
        .args(["--ctx", "64", "--chunks", "2", "--no-speed"])
        .arg("--llama-cpp-dir")
        .arg(llama_dir())
        .args(extra)
        .arg("--out")
        .arg(out);
    c
}

fn ladder_run(
    cache: &Path,
    model: &Path,
    out: &Path,
    extra: &[&str],
) -> (serde_json::Value, String) {
    let o = ladder_cmd(
        cache,
        model,
        out,
        &[&["--formats", "float32"], extra].concat(),
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "stderr:\n{stderr}");
    (results(out), stderr)
}

fn row<'a>(r: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    r["runners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == name)
        .unwrap_or_else(|| panic!("no row {name} in {r:#}"))
}

#[test]
fn the_ladder_is_made_from_the_model_cached_and_reused() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let model = tiny_llama().join("model.gguf");
    let (r, stderr) = ladder_run(
        &cache,
        &model,
        &tmp.path().join("a"),
        &["--ladder", "Q8_0,Q4_K_M"],
    );
    for name in ["gguf:F32", "gguf:Q8_0", "gguf:Q4_K_M"] {
        let x = row(&r, name);
        assert_eq!(x["status"], "ok", "{x:#}");
        assert_eq!(x["made"]["cached"], false, "{x:#}");
        assert!(x["made"]["from"]
            .as_str()
            .unwrap()
            .contains("--allow-requantize"));
        assert!(x["ppl"].as_f64().unwrap() > 1.0);
    }
    // The F32 conversion computes what kwk's float32 computes.
    let (kwk, f32) = (row(&r, "float32"), row(&r, "gguf:F32"));
    let rel = (kwk["ppl"].as_f64().unwrap() / f32["ppl"].as_f64().unwrap() - 1.0).abs();
    assert!(rel < 1e-3, "float32 {kwk:#} vs F32 {f32:#}");
    // The fixture's rows (64 wide) are not multiples of 256: Q4_K_M falls back, and says so.
    let q4 = &row(&r, "gguf:Q4_K_M")["made"];
    assert!(q4["fallback_tensors"].as_u64().unwrap() > 0, "{q4:#}");
    assert!(
        q4["fallbacks"][0]["wanted"]
            .as_str()
            .unwrap()
            .contains("_K"),
        "{q4:#}"
    );
    let md = std::fs::read_to_string(tmp.path().join("a/report.md")).unwrap();
    assert!(
        md.contains("gguf:Q4_K_M: ") && md.contains("fell back for row length"),
        "{md}"
    );
    assert!(md.contains("## Size against quality"), "{md}");
    assert!(stderr.contains("ladder [2/2] Q4_K_M: made in"), "{stderr}");

    // Again: every file from the cache, the same figures.
    let (again, stderr) = ladder_run(
        &cache,
        &model,
        &tmp.path().join("b"),
        &["--ladder", "Q8_0,Q4_K_M"],
    );
    for name in ["gguf:F32", "gguf:Q8_0", "gguf:Q4_K_M"] {
        assert_eq!(row(&again, name)["made"]["cached"], true, "{name}");
        assert_eq!(row(&again, name)["ppl"], row(&r, name)["ppl"], "{name}");
    }
    assert!(stderr.contains("reused from the cache"), "{stderr}");

    // A changed source (the lowest bit of its last weight byte) makes new files.
    let changed = tmp.path().join("changed.gguf");
    let mut bytes = std::fs::read(&model).unwrap();
    let last = bytes.len() - 4; // the low byte of the last little-endian f32
    bytes[last] ^= 1;
    std::fs::write(&changed, &bytes).unwrap();
    let (c, _) = ladder_run(
        &cache,
        &changed,
        &tmp.path().join("c"),
        &["--ladder", "Q8_0"],
    );
    assert_eq!(row(&c, "gguf:Q8_0")["made"]["cached"], false);

    // With a calibration text: +imatrix rows, and another text makes another imatrix.
    let calib = tmp.path().join("calib.txt");
    let text = std::fs::read_to_string(eval_txt()).unwrap();
    let reversed: String = text.chars().rev().collect();
    std::fs::write(&calib, &reversed).unwrap();
    let ask = [
        "--ladder",
        "Q4_K_M+imatrix",
        "--calib-text",
        calib.to_str().unwrap(),
    ];
    let (i1, _) = ladder_run(&cache, &model, &tmp.path().join("d"), &ask);
    let m1 = &row(&i1, "gguf:Q4_K_M+imatrix")["made"];
    assert!(m1["imatrix_sha256"].is_string(), "{m1:#}");
    let half: String = reversed
        .chars()
        .take(reversed.chars().count() / 2)
        .collect();
    std::fs::write(&calib, format!("{reversed}\n{half}")).unwrap();
    let (i2, _) = ladder_run(&cache, &model, &tmp.path().join("e"), &ask);
    let m2 = &row(&i2, "gguf:Q4_K_M+imatrix")["made"];
    assert_eq!(m2["cached"], false);
    assert_ne!(m1["imatrix_sha256"], m2["imatrix_sha256"]);

    // `cache list` shows them.
    let list = kwk_eval()
        .env("KWK_CACHE", &cache)
        .args(["cache", "list"])
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout).to_string();
    assert!(
        list.contains("made GGUFs") && list.contains("gguf Q4_K_M"),
        "{list}"
    );
}

#[test]
fn llama_bench_without_any_llama_cpp_row_warns_once() {
    let tmp = tempfile::tempdir().unwrap();
    let o = kwk_eval()
        .env("KWK_CACHE", tmp.path().join("cache"))
        .arg("--llm")
        .arg(tiny_llama())
        .arg("--text")
        .arg(eval_txt())
        .args([
            "--formats",
            "float32",
            "--ctx",
            "64",
            "--chunks",
            "1",
            "--no-speed",
        ])
        .args(["--llama-bench", "--ladder", "none"])
        .arg("--out")
        .arg(tmp.path().join("r"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("warning: --llama-bench does nothing"))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
}

/// `--gguf F32=FILE` beside a ladder (which always makes its F32 base row) would be two
/// rows named `gguf:F32`: refused before anything is made, naming the fix.
#[test]
fn a_gguf_label_the_ladder_also_makes_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_llama().join("model.gguf");
    let line = assert_error(
        kwk_eval()
            .env("KWK_CACHE", tmp.path().join("cache"))
            .arg("--llm")
            .arg(&model)
            .arg("--text")
            .arg(eval_txt())
            .args(["--formats", "float32", "--ladder", "Q8_0", "--no-speed"])
            .arg("--gguf")
            .arg(format!("F32={}", model.display()))
            .arg("--llama-cpp-dir")
            .arg(llama_dir())
            .arg("--out")
            .arg(tmp.path().join("r")),
        2,
        "'gguf:F32' is both a --gguf row and a row of llama.cpp's ladder",
    );
    assert!(line.contains("--gguf LABEL=PATH"), "{line}");
    assert!(
        !tmp.path().join("cache").join("gguf").exists()
            || std::fs::read_dir(tmp.path().join("cache").join("gguf"))
                .unwrap()
                .next()
                .is_none(),
        "nothing made"
    );
    assert!(
        !tmp.path().join("r").exists(),
        "no run folder for bad input"
    );
}

#[test]
fn a_missing_converter_python_is_one_error_naming_the_set_up() {
    let tmp = tempfile::tempdir().unwrap();
    let line = assert_error(
        kwk_eval()
            .env("KWK_CACHE", tmp.path().join("cache"))
            .env("KWK_PYTHON", tmp.path().join("no-python"))
            .arg("--llm")
            .arg(tiny_llama())
            .arg("--text")
            .arg(eval_txt())
            .args(["--ladder", "Q8_0", "--no-speed"])
            .arg("--llama-cpp-dir")
            .arg(llama_dir())
            .arg("--out")
            .arg(tmp.path().join("r")),
        2,
        "a Python not found for llama.cpp's convert_hf_to_gguf.py",
    );
    assert!(line.contains("scripts/setup-convert.sh"), "{line}");
    assert!(
        !tmp.path().join("r").exists(),
        "no run folder for bad input"
    );
}

/// The real model's Hugging Face folder (scripts/setup-model.sh makes it) converted by
/// llama.cpp's convert_hf_to_gguf.py inside kwk-eval: the same token ids as kwk-eval's and
/// llama.cpp's float32 perplexity equal to kwk's float32 on them.
#[test]
fn the_converted_hf_folder_scores_as_kwk_float32() {
    let models = kwk::paths::models_dir(&kwk::paths::CacheEnv::from_env()).unwrap();
    let folder = models.join("SmolLM2-135M-Instruct/SmolLM2-135M-Instruct-hf");
    assert!(
        folder.join("config.json").is_file(),
        "{} is missing: run scripts/setup-model.sh",
        folder.display()
    );
    let tmp = tempfile::tempdir().unwrap();
    let text = wiki_test_raw();
    let out = tmp.path().join("r");
    let o = kwk_eval()
        .arg("--llm")
        .arg(&folder)
        .arg("--text")
        .arg(&text)
        .args(["--formats", "float32", "--chunks", "2", "--no-speed"])
        .args(["--ladder", "F32", "--llama-kv", "f32"])
        .arg("--llama-cpp-dir")
        .arg(llama_dir())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{stderr}");
    let r = results(&out);
    let (kwk, f32) = (row(&r, "float32"), row(&r, "gguf:F32"));
    assert_eq!(f32["tokens_match"], true, "{f32:#}");
    assert!(f32["made"]["from"]
        .as_str()
        .unwrap()
        .contains("convert_hf_to_gguf.py"));
    let rel = (kwk["ppl"].as_f64().unwrap() / f32["ppl"].as_f64().unwrap() - 1.0).abs();
    assert!(
        rel < 1e-4,
        "float32 {} vs converted F32 {}",
        kwk["ppl"],
        f32["ppl"]
    );
}

/// Without `--formats` kwk's side spans the ladder's sizes: a `bpw:X` row at the size of a
/// type no fixed row stands for (here Q4_0, the one type made), X its GGUF's bits per weight
/// rounded down, and the line that says so; with `--formats` nothing is added.
#[test]
fn kwk_rows_are_added_at_the_ladders_sizes() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let model = tiny_llama().join("model.gguf");
    let run = |out: &str, formats: Option<&str>| {
        let mut extra = vec!["--ladder", "Q4_0"];
        extra.extend(formats.map(|f| ["--formats", f]).into_iter().flatten());
        let mut c = ladder_cmd(&cache, &model, &tmp.path().join(out), &extra);
        let o = c.output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).to_string();
        let r = results(&tmp.path().join(out));
        // The default rows' bpw:3.5 is under what the tiny model can pack to (3.77 bpw):
        // that row fails, naming the floor, and the run exits 2; every other row is ok.
        let failed: Vec<&str> = r["runners"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["status"] != "ok")
            .map(|x| x["name"].as_str().unwrap())
            .collect();
        let expect: &[&str] = if formats.is_none() { &["bpw:3.5"] } else { &[] };
        assert_eq!(failed, expect, "stderr:\n{stderr}");
        assert_eq!(o.status.code(), Some(if expect.is_empty() { 0 } else { 2 }));
        (r, stderr)
    };
    let (r, stderr) = run("default", None);
    let q4_0 = row(&r, "gguf:Q4_0")["bits_per_weight"].as_f64().unwrap();
    let name = format!("bpw:{:.2}", (q4_0 * 100.0 + 1e-9).floor() / 100.0);
    let added = row(&r, &name);
    assert_eq!(added["status"], "ok", "{added:#}");
    assert!(added["bits_per_weight"].as_f64().unwrap() <= q4_0 + 1e-9);
    let stands_for = format!("Q4_0 {q4_0:.2}");
    assert_eq!(added["stands_for"], serde_json::json!([stands_for]));
    let report = std::fs::read_to_string(tmp.path().join("default").join("report.md")).unwrap();
    assert!(
        report.contains(&format!(
            "{name}: added at the ladder's sizes, for {stands_for}"
        )),
        "{report}"
    );
    assert!(
        stderr.contains(&format!(
            "kwk: {name} (Q4_0 {q4_0:.2}) added at the ladder's sizes"
        )),
        "{stderr}"
    );
    for fixed in ["float32", "int8", "int4", "int3", "bpw:3.5"] {
        row(&r, fixed);
    }
    let (r, stderr) = run("given", Some("float32,int4"));
    assert!(!stderr.contains("added at the ladder's sizes"), "{stderr}");
    assert_eq!(
        r["runners"].as_array().unwrap().len(),
        4,
        "float32, int4, gguf:F32, gguf:Q4_0"
    );
}

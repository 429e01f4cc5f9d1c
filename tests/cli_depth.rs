//! Speed at depth and speed sweeps (issue 39) on the tiny fixture: the lists of `--depth`,
//! `--pp`, `--tg` and `--threads` and their refusals, the depth past the model's context,
//! the KV cache memory check, and a whole run at depths 0 and 64 whose every row has every
//! point, named after it, in results.json, speed_ratios.csv and speed_points.csv, with the
//! speed-against-depth plot beside them. With llama.cpp's tools built (the set-up
//! script's folder), the same run with a GGUF row timed by llama-bench `-d`.

mod common;
use common::*;
use std::path::Path;

/// kwk-eval on the tiny fixture, float32 and int8, ctx 64 × 2 chunks, into `out`.
fn tiny(out: &Path) -> assert_cmd::Command {
    let mut c = kwk_eval();
    c.args([
        "--formats",
        "float32,int8",
        "--ctx",
        "64",
        "--chunks",
        "2",
        "--no-pack-cache",
        "--llm",
    ])
    .arg(tiny_llama())
    .arg("--text")
    .arg(eval_txt())
    .arg("--out")
    .arg(out);
    c
}

fn no_run_folder(out: &Path) {
    assert!(
        !out.join("results.json").exists(),
        "a refused run wrote a report"
    );
}

#[test]
fn lists_that_do_not_parse_or_repeat_a_value_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // Not a number: clap names the flag and the value (exit 2).
    let o = tiny(&out).args(["--depth", "0,x"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("'x'") && stderr.contains("--depth"),
        "{stderr}"
    );
    assert_error(
        tiny(&out).args(["--depth", "0,64,0"]),
        2,
        "--depth gives 0 twice; pass each value once",
    );
    assert_error(
        tiny(&out).args(["--threads", "1,1"]),
        2,
        "--threads gives 1 twice; pass each value once",
    );
    assert_error(
        tiny(&out).args(["--pp", "16,2000000"]),
        2,
        "--pp 2000000 is out of range: pass 0 to 1048576",
    );
    no_run_folder(&out);
}

/// tiny-llama was trained for 256 positions: depth 250 + pp 16 runs past them.
#[test]
fn a_depth_past_the_trained_context_names_the_limit_and_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let line = assert_error(
        tiny(&out).args(["--depth", "0,250", "--pp", "16", "--tg", "4"]),
        2,
        "--depth 250 + --pp 16 needs 266 positions, past the 256 model",
    );
    assert!(
        line.contains(&tiny_llama().display().to_string())
            && line.contains("max_position_embeddings")
            && line.ends_with("pass a depth of at most 240"),
        "{line}"
    );
    no_run_folder(&out);
}

/// The KV caches at the largest depth are checked against the memory available before
/// anything runs (the testing override stands for MemAvailable).
#[test]
fn kv_caches_past_the_memory_available_are_refused_first() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let line = assert_error(
        tiny(&out)
            .env("KWK_TEST_MEM_AVAILABLE_BYTES", "1000")
            .env_remove("KWK_MEMORY_CHECK")
            .args(["--depth", "64", "--pp", "16", "--tg", "4"]),
        2,
        "the KV caches at --depth 64 need ",
    );
    assert!(
        line.contains("2 kwk row(s) × 80 tokens × ")
            && line.contains("bytes per token (f32)")
            && line.contains("this machine has 1.0 kB available (KWK_TEST_MEM_AVAILABLE_BYTES)"),
        "{line}"
    );
    no_run_folder(&out);
}

/// The tests of a row's `speed_points`, in order.
fn point_tests(row: &serde_json::Value) -> Vec<String> {
    row["speed_points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["test"].as_str().unwrap().to_string())
        .collect()
}

/// The long CSV's lines as (row, test, n_depth, n_threads).
fn csv_lines(dir: &Path) -> Vec<(String, String, String, String)> {
    let mut rd = csv::Reader::from_path(dir.join("speed_points.csv")).unwrap();
    let h: Vec<String> = rd.headers().unwrap().iter().map(String::from).collect();
    assert_eq!(
        h,
        [
            "row",
            "engine",
            "kv_type",
            "test",
            "n_prompt",
            "n_gen",
            "n_depth",
            "n_threads",
            "primary",
            "reps",
            "avg_ts",
            "stddev_ts",
            "samples_ts",
            "rounds",
            "flash_attn"
        ]
    );
    rd.records()
        .map(|r| {
            let r = r.unwrap();
            (r[0].into(), r[3].into(), r[6].into(), r[7].into())
        })
        .collect()
}

#[test]
fn a_run_at_two_depths_has_every_point_of_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = tiny(&out)
        .args(["--depth", "0,64", "--pp", "16", "--tg", "4", "--reps", "1"])
        .args(["--threads", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "stderr:\n{stderr}");
    let r = read_json(&out.join("results.json"));
    assert_eq!(
        r["protocol"]["speed_axes"]["depth"],
        serde_json::json!([0, 64])
    );
    assert!(r["protocol"]["kv_values_per_token"].as_u64().unwrap() > 0);
    for row in r["runners"].as_array().unwrap() {
        assert_eq!(point_tests(row), ["pp16", "tg4", "pp16@d64", "tg4@d64"]);
        for p in row["speed_points"].as_array().unwrap() {
            assert!(p["tokens_per_s"].as_f64().unwrap() > 0.0, "{p}");
        }
        // The primary point is also the row's pp/tg figures.
        assert_eq!(
            row["pp_tokens_per_s"],
            row["speed_points"][0]["tokens_per_s"]
        );
    }
    let tests: Vec<&str> = r["speed_ratios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["test"].as_str().unwrap())
        .collect();
    assert_eq!(tests, ["pp", "pp16@d64", "tg", "tg4@d64"]);
    let ratios = std::fs::read_to_string(out.join("speed_ratios.csv")).unwrap();
    assert!(ratios.contains("\ntg4@d64,int8,float32,1,"), "{ratios}");
    let lines = csv_lines(&out);
    assert_eq!(lines.len(), 2 * 4);
    assert!(lines.contains(&("int8".into(), "tg4@d64".into(), "64".into(), "1".into())));
    for f in ["speed_vs_depth.png", "speed_vs_depth.svg"] {
        assert!(out.join(f).exists(), "{f}");
    }
    assert!(
        !out.join("speed_vs_threads.svg").exists(),
        "threads were not swept"
    );
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        md.contains("**Speed sweep:** pp 16, tg 4, depth 0,64, threads 1")
            && md.contains("- KV cache f32: ")
            && md.contains("at the largest depth (64 + 16 tokens")
            && md.contains("![speed across the sweep](speed_vs_depth.svg)"),
        "{md}"
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("speed sweep: the columns are pp16 and tg4; all 4 tests of every row in speed_points.csv"),
        "{stdout}"
    );
    table_fits(&stdout);
}

/// The table's lines (up to the first verdict) fit 100 columns.
fn table_fits(stdout: &str) {
    for l in stdout.lines().take_while(|l| !l.starts_with("at ")) {
        assert!(l.chars().count() <= 100, "{l}\n{stdout}");
    }
}

/// The set-up script's llama.cpp build folder, when it was built.
fn llama_dir() -> Option<std::path::PathBuf> {
    let root = kwk::paths::cache_root(&kwk::paths::CacheEnv::from_env())?;
    let mut bins: Vec<_> = std::fs::read_dir(&root)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("build/bin"))
        .filter(|p| p.join("llama-bench").exists())
        .collect();
    bins.sort();
    bins.pop()
}

/// A GGUF row timed by llama-bench at every point too (`-d 64`, `-t 1` and `-t 2`): its
/// JSON objects carry the depth, its points are named like kwk's, and the kwk rows get
/// paired ratios against it at every point; threads swept draw the threads plot.
#[test]
fn llama_bench_rows_run_at_every_point() {
    let Some(bin) = llama_dir() else {
        eprintln!("note: no llama.cpp build under the cache; scripts/setup-llama-cpp.sh makes one");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = tiny(&out)
        .args(["--depth", "0,64", "--pp", "16", "--tg", "4", "--reps", "1"])
        .args(["--threads", "1,2", "--ladder", "none", "--llama-bench"])
        .arg("--llama-cpp-dir")
        .arg(&bin)
        .arg("--gguf")
        .arg(tiny_llama().join("model.gguf"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "stderr:\n{stderr}");
    let r = read_json(&out.join("results.json"));
    let rows = r["runners"].as_array().unwrap();
    let gguf = rows.iter().find(|x| x["engine"] == "llama.cpp").unwrap();
    let want = [
        "pp16/t1",
        "tg4/t1",
        "pp16@d64/t1",
        "tg4@d64/t1",
        "pp16/t2",
        "tg4/t2",
        "pp16@d64/t2",
        "tg4@d64/t2",
    ];
    for row in rows {
        assert_eq!(point_tests(row), want, "{}", row["name"]);
    }
    let depths: Vec<u64> = gguf["llama_bench"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["n_depth"].as_u64().unwrap())
        .collect();
    // Each invocation runs pp and tg at -fa 0, then at -fa 1 (`--llama-fa best`).
    assert_eq!(
        depths,
        [0, 0, 0, 0, 64, 64, 64, 64, 0, 0, 0, 0, 64, 64, 64, 64]
    );
    let vs_gguf: Vec<&str> = r["speed_ratios"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["row"] == "int8" && x["vs"] == gguf["name"])
        .map(|x| x["test"].as_str().unwrap())
        .collect();
    assert_eq!(vs_gguf.len(), 8, "{vs_gguf:?}");
    assert!(vs_gguf.contains(&"tg4@d64/t2"));
    for f in ["speed_vs_depth.svg", "speed_vs_threads.svg"] {
        assert!(out.join(f).exists(), "{f}");
    }
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("the columns are pp16/t1 and tg4/t1; all 8 tests"),
        "{stdout}"
    );
    table_fits(&stdout);
}

//! Rows with their own KV cache (`FORMAT+kv:TYPE` in `--formats`, issue 39): float32
//! weights with an f16 or q8 cache beside the float32/f32 reference, each named as asked,
//! with its `kv_type` and KV bytes per token in results.json and results.csv, compared with
//! the reference (KLD), listed in the report's KV lines, and counted at its own precision
//! by the memory check at depth.

mod common;
use common::*;
use std::path::Path;

/// kwk-eval on the tiny fixture with `formats`, ctx 64 × 2 chunks, into `out`.
fn tiny(out: &Path, formats: &str) -> assert_cmd::Command {
    let mut c = kwk_eval();
    c.args(["--formats", formats, "--ctx", "64", "--chunks", "2"])
        .args(["--no-pack-cache", "--llm"])
        .arg(tiny_llama())
        .arg("--text")
        .arg(eval_txt())
        .arg("--out")
        .arg(out);
    c
}

#[test]
fn float32_rows_with_their_own_cache_sit_beside_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = tiny(&out, "float32,float32+kv:f16,float32+kv:q8_0,int8")
        .args(["--kv", "bf16", "--no-speed", "--kld"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "stderr:\n{stderr}");
    let r = read_json(&out.join("results.json"));
    let rows = r["runners"].as_array().unwrap();
    let field = |k: &str| -> Vec<String> {
        rows.iter()
            .map(|x| x[k].as_str().unwrap_or("").to_string())
            .collect()
    };
    assert_eq!(
        field("name"),
        ["float32", "float32+kv:f16", "float32+kv:q8", "int8"]
    );
    // The reference keeps f32, the suffixed rows their own, int8 the run's --kv.
    assert_eq!(field("kv_type"), ["f32", "f16", "q8", "bf16"]);
    let bytes: Vec<u64> = rows
        .iter()
        .map(|x| x["kv_bytes_per_token"].as_u64().unwrap())
        .collect();
    // The fixture's heads are 16 wide: f32 and f16 pad nothing, q8 pads to one block of
    // 32 (codes and a 4-byte scale), so its cache is larger here than f16's.
    assert_eq!(bytes, [512, 256, 288, 256]);
    assert_eq!(r["ppl_delta_reference"], "float32");
    // The same weights as the reference: what is left is the cache's cost, small but not
    // nothing for q8.
    for row in &rows[1..3] {
        let kld = row["kld_mean"].as_f64().unwrap();
        assert!((0.0..0.05).contains(&kld), "{row}");
        assert!(row["ppl"].as_f64().unwrap() > 1.0, "{row}");
    }
    assert!(rows[2]["kld_mean"].as_f64().unwrap() > 0.0);
    let mut rd = csv::Reader::from_path(out.join("results.csv")).unwrap();
    let h: Vec<String> = rd.headers().unwrap().iter().map(String::from).collect();
    let col = |name: &str| h.iter().position(|x| x == name).unwrap();
    let (name, kv) = (col("name"), col("kv_type"));
    let csv: Vec<(String, String)> = rd
        .records()
        .map(|x| {
            let x = x.unwrap();
            (x[name].to_string(), x[kv].to_string())
        })
        .collect();
    assert!(
        csv.contains(&("float32+kv:q8".into(), "q8".into())),
        "{csv:?}"
    );
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        md.contains(
            "**KV caches:** f32: float32; f16: float32+kv:f16; q8: float32+kv:q8; bf16: int8\n"
        ),
        "{md}"
    );
}

/// The memory check at depth counts each row's cache at its own precision.
#[test]
fn the_depth_memory_check_counts_each_rows_own_cache() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let line = assert_error(
        tiny(&out, "float32,float32+kv:q8,int8")
            .env("KWK_TEST_MEM_AVAILABLE_BYTES", "1000")
            .env_remove("KWK_MEMORY_CHECK")
            .args(["--depth", "64", "--pp", "16", "--tg", "4"]),
        2,
        "the KV caches at --depth 64 need ",
    );
    assert!(
        line.contains("2 kwk row(s) × 80 tokens × ")
            && line.contains("bytes per token (f32)")
            && line.contains("1 kwk row(s) × 80 tokens × ")
            && line.contains("bytes per token (q8)"),
        "{line}"
    );
    assert!(!out.join("results.json").exists());
}

/// A bad suffix is one line naming the grammar, before anything runs.
#[test]
fn a_bad_kv_suffix_is_one_line_naming_the_grammar() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    for (formats, says) in [
        ("float32,int8+q8", "'int8+q8' has the suffix '+q8'; the one suffix an in-tree format takes is FORMAT+kv:TYPE"),
        ("float32,float32+kv:f32", "'float32+kv:f32' is the float32 reference itself (it keeps an f32 cache); write float32"),
    ] {
        let line = assert_error(&mut tiny(&out, formats), 2, "invalid value ");
        assert!(line.contains(says), "{line}");
        assert!(!out.exists());
    }
    // The same row twice, spelled two ways, is refused as a repeat.
    let line = assert_error(
        &mut tiny(&out, "float32,int8+kv:q8,int8+kv:Q8_0"),
        2,
        "'int8+kv:q8' is asked for twice",
    );
    assert!(line.contains("give each format once"), "{line}");
}

//! A whole run on the tiny fixture: exit 0, every report file exists and parses, the
//! reference file is cleaned up; then the regression gate's exit codes against the run's
//! own results.json and a fabricated better baseline.

mod common;
use common::*;
use std::path::Path;

fn run_tiny(out: &Path, extra: &[&str]) -> std::process::Output {
    kwk_eval()
        .args([
            "--formats",
            "float32,int8",
            "--ctx",
            "64",
            "--chunks",
            "2",
            "--pp",
            "16",
            "--tg",
            "4",
        ])
        .args(["--reps", "2", "--threads", "2", "--no-pack-cache", "--llm"])
        .arg(tiny_llama())
        .arg("--text")
        .arg(eval_txt())
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn tiny_run_writes_reports_that_parse_and_gate_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first");
    let out = run_tiny(&first, &["--compare-to", "float32"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{stderr}");

    let v = read_json(&first.join("results.json"));
    assert_eq!(v["schema_version"], 2);
    assert_eq!(v["complete"], true);
    assert_eq!(v["protocol"]["ctx"], 64);
    assert_eq!(v["protocol"]["chunks"], 2);
    assert_eq!(v["protocol"]["scored_tokens"], 62);
    assert_eq!(v["protocol"]["add_bos"], false);
    assert_eq!(v["protocol"]["text"], "eval.txt");
    assert_eq!(v["protocol"]["text_sha256"].as_str().unwrap().len(), 64);
    assert!(v["machine"]["cpu"].as_str().is_some());
    assert_eq!(v["machine"]["threads"], 2);
    let runners = v["runners"].as_array().unwrap();
    assert_eq!(runners.len(), 2);
    assert_eq!(runners[0]["name"], "float32");
    assert_eq!(runners[1]["name"], "int8");
    // The kernels each row ran, as the decoder names them for this CPU's best tier.
    use kwk::kernels::{best_isa, WeightKernels};
    let best = best_isa();
    assert_eq!(v["machine"]["kernels"], best.summary());
    assert_eq!(
        runners[0]["kernels"],
        best.weight_kernels(WeightKernels::Float32)
    );
    assert_eq!(
        runners[1]["kernels"],
        best.weight_kernels(WeightKernels::Quantized)
    );
    for r in runners {
        assert!(r["error"].is_null(), "{r}");
        assert!(r["ppl"].as_f64().unwrap() > 1.0);
        assert!(r["ppl_err"].as_f64().unwrap() > 0.0);
        assert!(r["tensor_bytes"].as_u64().unwrap() > 0);
        assert!(r["bits_per_weight"].as_f64().unwrap() > 0.0);
        assert_eq!(r["pp_samples_tokens_per_s"].as_array().unwrap().len(), 2);
        assert_eq!(r["tg_samples_tokens_per_s"].as_array().unwrap().len(), 2);
        assert!(r["pp_tokens_per_s"].as_f64().unwrap() > 0.0);
        assert!(r["tg_tokens_per_s"].as_f64().unwrap() > 0.0);
        assert!(r["load_s"].as_f64().is_some());
        assert_eq!(r["running_ppl"].as_array().unwrap().len(), 2);
    }
    assert_eq!(runners[0]["ppl_delta_pct"].as_f64(), Some(0.0));
    assert!(
        runners[0]["kld_mean"].is_null(),
        "the reference has no KLD against itself"
    );
    let kld = runners[1]["kld_mean"].as_f64().unwrap();
    assert!((0.0..1.0).contains(&kld), "int8 KLD {kld}");
    let top1 = runners[1]["top1_agreement"].as_f64().unwrap();
    assert!((0.5..=1.0).contains(&top1), "int8 top-1 {top1}");
    // Paired against the reference on the same tokens, and against --compare-to float32:
    // the same differences, so the same figures.
    let lr = runners[1]["ln_ppl_ratio"].as_f64().unwrap();
    let lre = runners[1]["ln_ppl_ratio_err"].as_f64().unwrap();
    assert!(lr.abs() < 0.1 && lre > 0.0 && lre < 0.05, "{lr} ± {lre}");
    assert_eq!(runners[1]["compare_to"]["row"], "float32");
    assert_eq!(runners[1]["compare_to"]["ln_ppl_ratio"].as_f64(), Some(lr));
    assert!(runners[1]["top1_agreement_err"].as_f64().unwrap() >= 0.0);
    // Speed in interleaved rounds, the order rotating.
    assert_eq!(
        v["speed_rounds"],
        serde_json::json!([["float32", "int8"], ["int8", "float32"]])
    );
    // int8 over float32, paired round by round, for pp and tg.
    let ratios = v["speed_ratios"].as_array().unwrap();
    assert_eq!(ratios.len(), 2, "{ratios:?}");
    for (x, test) in ratios.iter().zip(["pp", "tg"]) {
        assert_eq!(
            (x["test"].as_str(), x["row"].as_str()),
            (Some(test), Some("int8"))
        );
        assert_eq!(
            (x["vs"].as_str(), x["rounds"].as_u64()),
            (Some("float32"), Some(2))
        );
        let (lo, mid, hi) = (
            x["min"].as_f64().unwrap(),
            x["median"].as_f64().unwrap(),
            x["max"].as_f64().unwrap(),
        );
        assert!(lo > 0.0 && lo <= mid && mid <= hi, "{x}");
    }
    assert!(first.join("speed_ratios.csv").exists());
    assert!(
        !first.join("float32-kl-divergence-base.bin").exists(),
        "reference file not removed"
    );

    let mut csv = csv::Reader::from_path(first.join("results.csv")).unwrap();
    let rows: Vec<_> = csv.records().collect::<Result<_, _>>().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(&rows[1][0], "int8");

    let md = std::fs::read_to_string(first.join("report.md")).unwrap();
    assert!(md.contains("| float32 | kwk |") && md.contains("| int8 | kwk |"));
    assert!(!md.contains("INCOMPLETE"));
    for f in [
        "quality_vs_bpw.png",
        "quality_vs_bpw.svg",
        "speed.png",
        "speed.svg",
    ] {
        assert!(first.join(f).metadata().unwrap().len() > 0, "{f}");
    }
    // The compact table: engine, then type; one verdict line per size.
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("kwk") && l.contains("float32")),
        "{stdout}"
    );
    // int8 on the tiny model: 8 bits and its scales (its short rows each carry a whole
    // super-block).
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("at ≤ 8.") && l.contains("int8")),
        "{stdout}"
    );
    // How quiet the machine was during the speed rounds is judged and kept.
    assert!(
        v["machine"]["steadiness"]["noisy"].is_boolean(),
        "{}",
        v["machine"]
    );

    // Gate: the same results pass (perplexity is deterministic; speed limit is wide).
    let baseline = first.join("results.json");
    let second = dir.path().join("second");
    let out = run_tiny(
        &second,
        &["--no-speed", "--baseline", baseline.to_str().unwrap()],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("gate: PASSED"), "{stdout}");

    // A baseline whose int8 perplexity was 1% lower: this run regressed, exit 1.
    let mut better = read_json(&baseline);
    let p = better["runners"][1]["ppl"].as_f64().unwrap();
    better["runners"][1]["ppl"] = serde_json::json!(p * 0.99);
    let better_path = dir.path().join("better.json");
    std::fs::write(&better_path, serde_json::to_string(&better).unwrap()).unwrap();
    let third = dir.path().join("third");
    let out = run_tiny(
        &third,
        &["--no-speed", "--baseline", better_path.to_str().unwrap()],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("int8") && l.contains("REGRESSED (ppl +1.0")),
        "{stdout}"
    );
    assert!(stdout.contains("gate: FAILED"), "{stdout}");
    // The reports of a gated run are complete all the same.
    assert_eq!(read_json(&third.join("results.json"))["complete"], true);
}

/// `--output json` and `jsonl` print only the data on stdout (the run folder and the rest
/// go to stderr), and it is the run's results.
#[test]
fn output_formats_for_programs_parse_from_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_tiny(
        &dir.path().join("json"),
        &["--no-speed", "--output", "json"],
    );
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, read_json(&dir.path().join("json/results.json")));
    assert!(String::from_utf8_lossy(&out.stderr).contains("reports: "));
    let out = run_tiny(&dir.path().join("jsonl"), &["--no-speed", "-o", "jsonl"]);
    assert_eq!(out.status.code(), Some(0));
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1]["name"], "int8");
}

fn run_calibrated(out: &Path, formats: &str, extra: &[&str]) -> std::process::Output {
    kwk_eval()
        .args([
            "--formats",
            formats,
            "--ctx",
            "64",
            "--chunks",
            "2",
            "--no-speed",
        ])
        .args(["--threads", "2", "--no-pack-cache", "--llm"])
        .arg(tiny_llama())
        .arg("--text")
        .arg(eval_txt())
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

/// Calibration reported: `--calib-on-eval` lets the scored text be the calibration text and
/// the run is marked (results.json `protocol.calibration.on_eval`, a loud line in
/// report.md); a slice of the same file disjoint from the scored chunks (`--calib-range`)
/// runs unmarked; both rows state their calibration time.
#[test]
fn calibration_is_reported_and_marked_on_the_scored_text() {
    let dir = tempfile::tempdir().unwrap();
    let eval = eval_txt();
    let eval = eval.to_str().unwrap();
    let on_eval = dir.path().join("on-eval");
    let out = run_calibrated(
        &on_eval,
        "float32,int4:gptq",
        &["--calib-text", eval, "--calib-on-eval"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{stderr}");
    let v = read_json(&on_eval.join("results.json"));
    let c = &v["protocol"]["calibration"];
    assert_eq!(c["on_eval"], true);
    assert_eq!(c["text"], "eval.txt");
    assert!(c["tokens"].as_u64().unwrap() >= 512);
    let row = &v["runners"][1];
    assert_eq!(row["name"], "int4:gptq");
    let (cal, pack) = (
        row["calibration_s"].as_f64().unwrap(),
        row["load_pack_s"].as_f64().unwrap(),
    );
    assert!(cal > 0.0 && cal <= pack, "{cal} {pack}");
    assert!(v["runners"][0]["calibration_s"].is_null());
    let md = std::fs::read_to_string(on_eval.join("report.md")).unwrap();
    assert!(md.contains("CALIBRATED ON THE SCORED TEXT"), "{md}");

    let sliced = dir.path().join("sliced");
    let out = run_calibrated(
        &sliced,
        "float32,int4:calib",
        &["--calib-text", eval, "--calib-range", "1000:2000"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{stderr}");
    let v = read_json(&sliced.join("results.json"));
    let c = &v["protocol"]["calibration"];
    assert_eq!(
        (c["on_eval"].clone(), c["range"].clone()),
        (false.into(), "1000:2000".into())
    );
    assert_eq!(c["tokens"], 1000);
    let md = std::fs::read_to_string(sliced.join("report.md")).unwrap();
    assert!(
        md.contains("**Calibration:** 'eval.txt'") && !md.contains("CALIBRATED ON"),
        "{md}"
    );
}

/// `int8:calib` goes through kwk-eval like `int4:calib`: refused without `--calib-text`
/// (exit 2, naming the format), and with one its row states its calibration time while
/// plain int8's is null.
#[test]
fn int8_calib_needs_and_reports_calibration() {
    let dir = tempfile::tempdir().unwrap();
    let eval = eval_txt();
    let eval = eval.to_str().unwrap();
    let refused = run_calibrated(&dir.path().join("refused"), "float32,int8:calib", &[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "stderr:\n{stderr}");
    assert!(
        stderr.contains("int8:calib") && stderr.contains("--calib-text"),
        "{stderr}"
    );
    let run = dir.path().join("run");
    let out = run_calibrated(
        &run,
        "float32,int8,int8:calib",
        &["--calib-text", eval, "--calib-range", "1000:2000"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{stderr}");
    let v = read_json(&run.join("results.json"));
    assert_eq!(v["protocol"]["calibration"]["tokens"], 1000);
    let rows = v["runners"].as_array().unwrap();
    assert_eq!(rows[1]["name"], "int8");
    assert!(rows[1]["calibration_s"].is_null());
    assert_eq!(rows[2]["name"], "int8:calib");
    assert!(rows[2]["calibration_s"].as_f64().unwrap() > 0.0);
    assert_eq!(rows[1]["tensor_bytes"], rows[2]["tensor_bytes"]);
}

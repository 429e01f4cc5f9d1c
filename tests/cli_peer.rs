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

/// The ladder with ik_llama.cpp among the peers (issue 40), on SmolLM2-135M (the fork's
/// IQ types want real rows; the tiny random fixture gives its llama-perplexity NaNs, and its
/// IQ4_KS aborts in flash attention on this 576-wide model, a failed row, while IQ4_K runs):
/// mainline's type runs on both engines, the fork's own type (`ik:IQ4_K`, made by its
/// llama-quantize from the same F32 base and the same importance matrix, rewritten in the
/// legacy format it reads) on the fork alone. Needs a real ik build
/// (scripts/setup-ik-llama-cpp.sh): without one the test says it is skipped, and
/// scripts/test.sh says so too.
#[test]
fn the_ladder_adds_iks_own_types_on_ik_alone() {
    let Some(ik) = ik_dir_or_skip() else {
        return;
    };
    let model = smollm2_f32_gguf();
    let wiki = wiki_test_raw();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let o = kwk_eval()
        .env("KWK_CACHE", tmp.path().join("cache"))
        .arg("--llm")
        .arg(&model)
        .args(["--formats", "float32", "--ctx", "128", "--chunks", "2"])
        .args(["--no-speed", "--threads", "2", "--no-pack-cache"])
        .arg("--llama-cpp-dir")
        .arg(llama_dir())
        .args(["--peer", "llama.cpp,ik", "--ik-llama-cpp-dir"])
        .arg(&ik)
        .args(["--ladder", "Q8_0+imatrix,ik:IQ4_K+imatrix", "--calib-text"])
        .arg(&wiki)
        // A calibration slice far from the two scored chunks at the text's start.
        .args(["--calib-range", "100000:108192"])
        .arg("--text")
        .arg(&wiki)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "stderr:\n{stderr}");
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    let rows = r["runners"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|x| x["name"].as_str().unwrap()).collect();
    let ppl = |name: &str| {
        let x = rows
            .iter()
            .find(|x| x["name"] == name)
            .unwrap_or_else(|| panic!("no row {name} in {names:?}"));
        assert_eq!(x["status"], "ok", "{x:#}");
        x["ppl"].as_f64().unwrap()
    };
    let f32 = ppl("float32");
    for name in ["llama.cpp:F32", "ik:F32"] {
        assert!(
            (ppl(name) / f32 - 1.0).abs() < 1e-3,
            "{name} against float32"
        );
    }
    // Quantized rows lose something, and not everything.
    for name in [
        "llama.cpp:Q8_0+imatrix",
        "ik:Q8_0+imatrix",
        "ik:IQ4_K+imatrix",
    ] {
        let p = ppl(name);
        assert!(p > f32 * 0.97 && p < f32 * 1.5, "{name}: {p} against {f32}");
    }
    assert!(!names.contains(&"llama.cpp:IQ4_K+imatrix"), "{names:?}");
    let iq = rows
        .iter()
        .find(|x| x["name"] == "ik:IQ4_K+imatrix")
        .unwrap();
    assert_eq!(iq["engine"], "ik");
    assert_eq!(iq["made"]["qtype"], "IQ4_K");
    assert!(iq["made"]["imatrix_sha256"].is_string(), "{iq:#}");
    let bpw = iq["bits_per_weight"].as_f64().unwrap();
    assert!(bpw > 4.0 && bpw < 6.5, "{bpw}");
    assert!(
        stderr.contains("importance matrix rewritten in the legacy format"),
        "{stderr}"
    );
}

/// `--peer llama.cpp,ik` with `--depth` (issue 39) on SmolLM2-135M's F32 GGUF: mainline's
/// llama-bench times every point with `-d`; ik_llama.cpp's llama-bench has no `-d`, so the
/// run says so in one warning line and leaves the ik row's deeper points empty, never timed
/// at depth 0 in their place, while its depth-0 points and its perplexity are measured.
/// Gated like the ladder test above (KWK_IK=1 demands a build).
#[test]
fn iks_llama_bench_at_depth_is_skipped_in_one_line_not_recorded_at_depth_0() {
    let Some(ik) = ik_dir_or_skip() else {
        return;
    };
    let model = smollm2_f32_gguf();
    let wiki = wiki_test_raw();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let o = kwk_eval()
        .arg("--llm")
        .arg(&model)
        .arg("--gguf")
        .arg(&model)
        .args(["--formats", "none", "--ladder", "none", "--ctx", "128"])
        .args(["--chunks", "1", "--threads", "2", "--no-pack-cache"])
        .args(["--llama-bench", "--reps", "1", "--pp", "16", "--tg", "4"])
        .args(["--depth", "0,64"])
        .arg("--llama-cpp-dir")
        .arg(llama_dir())
        .args(["--peer", "llama.cpp,ik", "--ik-llama-cpp-dir"])
        .arg(&ik)
        .arg("--text")
        .arg(&wiki)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "stderr:\n{stderr}");
    let warning = "ik_llama.cpp's llama-bench has no -d (--n-depth): its rows are not timed at depth 64 (those points stay empty; nothing is timed at depth 0 in their place)";
    assert_eq!(stderr.matches(warning).count(), 1, "{stderr}");
    // Mainline's llama-bench takes -d: no such line for it.
    assert_eq!(
        stderr.matches("llama-bench has no -d").count(),
        1,
        "{stderr}"
    );
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    let rows = r["runners"].as_array().unwrap();
    let row = |name: &str| {
        rows.iter()
            .find(|x| x["name"] == name)
            .unwrap_or_else(|| panic!("no row {name}: {r:#}"))
    };
    // (test, measured) for each point of a row.
    let points = |name: &str| -> Vec<(String, bool)> {
        let x = row(name);
        assert_eq!(x["status"], "ok", "{x:#}");
        x["speed_points"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["test"].as_str().unwrap().to_string(),
                    p["tokens_per_s"].as_f64().is_some(),
                )
            })
            .collect()
    };
    let tests = ["pp16", "tg4", "pp16@d64", "tg4@d64"];
    let want = |deep: bool| -> Vec<(String, bool)> {
        tests
            .iter()
            .map(|t| (t.to_string(), deep || !t.contains('@')))
            .collect()
    };
    assert_eq!(
        points("llama.cpp:SmolLM2-135M-Instruct-F32.gguf"),
        want(true)
    );
    assert_eq!(points("ik:SmolLM2-135M-Instruct-F32.gguf"), want(false));
    // Every test ik's llama-bench ran was at depth 0 and says so; mainline's name theirs.
    let depths = |name: &str| -> Vec<u64> {
        row(name)["llama_bench"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["n_depth"].as_u64().unwrap_or(0))
            .collect()
    };
    // (`--llama-fa best` runs each test at -fa 0 and -fa 1: two records per test.)
    let ik = depths("ik:SmolLM2-135M-Instruct-F32.gguf");
    assert!(!ik.is_empty() && ik.iter().all(|&d| d == 0), "{ik:?}");
    let mainline = depths("llama.cpp:SmolLM2-135M-Instruct-F32.gguf");
    let at = |d: u64| mainline.iter().filter(|&&x| x == d).count();
    assert!(
        at(64) > 0 && at(0) == at(64) && at(0) + at(64) == mainline.len(),
        "{mainline:?}"
    );
}

//! The parsers against output captured from the real llama.cpp binaries (llama-cpp-python
//! 0.3.36 build, this machine), stored in tests/data/. How each file was made:
//! - tiny-llama-ppl.*: `llama-perplexity -m tiny-llama/model.gguf -f eval.txt -c 64 -b 64
//!   -ub 64 --chunks 8 -t 2 -tb 2 -ngl 0 -fa off -ctk f32 -ctv f32`
//! - tiny-llama-ppl-truncated.*: the same command on a loaded machine, where llama.cpp's
//!   logger lost the last `[8]` value and the `Final estimate` line (exit code 0)
//! - tiny-llama-too-short.*: the same on the first 150 bytes of eval.txt (exit code 0)
//! - tiny-llama-kld-f16-vs-f32.*: `--kl-divergence-base` written with f32 KV, then
//!   `--kl-divergence` with `-ctk f16 -ctv f16`
//! - tiny-llama-bench.json: `llama-bench -p 64 -n 16 -r 3 -t 2 -ngl 0 -fa 0 -ctk f16 -ctv f16
//!   -b 2048 -ub 512 -o json`
//! - smollm2-f32-wiki-c512-40.*: SmolLM2-135M-Instruct-F32.gguf on wiki.test.raw, `-c 512
//!   --chunks 40 -b 512 -ub 512 -t 2 -ngl 0 -fa on -ctk f16 -ctv f16`
//! - tiny-llama-tokenize-300.stdout: `llama-tokenize --ids --no-escape --no-parse-special` on
//!   the first 300 bytes of eval.txt
//! - llama-*-help.txt, llama-perplexity-version.txt: `--help` / `--version`

use llamacpp::bench::parse_bench_json;
use llamacpp::kld::{count_rows, parse_kl_divergence};
use llamacpp::perplexity::{count_running, parse_perplexity, parse_running, PerplexityProblem};
use llamacpp::tokenize::{parse_ids, perplexity_text};
use llamacpp::BuildInfo;

fn data(name: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn tiny_llama_final_estimate_and_running_values() {
    let out = parse_perplexity(
        &data("tiny-llama-ppl.stdout"),
        &data("tiny-llama-ppl.stderr"),
    )
    .unwrap();
    assert_eq!(out.ppl, 25954.9134);
    assert_eq!(out.ppl_err, 4809.80099);
    assert_eq!(
        out.running,
        vec![
            46994.1030, 44973.2407, 35761.2993, 29876.9161, 28858.3908, 26795.3714, 25815.1632,
            25954.9134
        ]
    );
    assert_eq!(out.chunks, Some(8));
    assert_eq!(out.n_ctx, Some(64));
    assert_eq!(out.batch_size, Some(64));
    assert_eq!(out.n_seq, Some(1));
    // `0.00.570.059 I system_info:`: M.SS.mmm.uuu = 0 min 0 s 570 ms 59 us.
    assert!((out.ready_s.unwrap() - 0.570059).abs() < 1e-9);
    // The build's CPU features, from the same `system_info:` line.
    assert_eq!(
        out.cpu_features.unwrap(),
        [
            "SSE3",
            "SSSE3",
            "AVX",
            "AVX2",
            "F16C",
            "FMA",
            "BMI2",
            "AVX512",
            "AVX512_VBMI",
            "AVX512_VNNI",
            "AVX512_BF16",
            "LLAMAFILE",
            "OPENMP",
            "REPACK"
        ]
    );
    assert_eq!(out.seconds_per_pass, Some(0.72));
}

#[test]
fn smollm2_wikitext_run() {
    let out = parse_perplexity(
        &data("smollm2-f32-wiki-c512-40.stdout"),
        &data("smollm2-f32-wiki-c512-40.stderr"),
    )
    .unwrap();
    // The figure in ../shared/design/PERFORMANCE.md for the F32 GGUF, 40 chunks.
    assert_eq!(out.ppl, 22.4998);
    assert_eq!(out.ppl_err, 0.68087);
    assert_eq!(out.running.len(), 40);
    assert_eq!(out.running[0], 12.5619);
    assert_eq!(out.running[39], 22.4998);
    assert_eq!(out.chunks, Some(40));
    assert_eq!(out.n_ctx, Some(512));
    assert_eq!(out.n_seq, Some(1));
}

#[test]
fn output_cut_short_by_the_logger_is_truncated_not_a_result() {
    let stdout = data("tiny-llama-ppl-truncated.stdout");
    let stderr = data("tiny-llama-ppl-truncated.stderr");
    assert!(!stderr.contains("Final estimate"));
    assert_eq!(
        parse_perplexity(&stdout, &stderr),
        Err(PerplexityProblem::Truncated)
    );
    // 7 of the 8 running values made it out.
    assert_eq!(count_running(&stdout), 7);
}

#[test]
fn too_short_text_is_detected() {
    let p = parse_perplexity(
        &data("tiny-llama-too-short.stdout"),
        &data("tiny-llama-too-short.stderr"),
    );
    assert_eq!(
        p,
        Err(PerplexityProblem::TooShort {
            needed: 128,
            ctx: 64,
            got: Some(71)
        })
    );
    // Only the first of the two lines survived the logger: still too short, count unknown.
    let stderr = data("tiny-llama-too-short.stderr");
    let first_only: String = stderr
        .lines()
        .filter(|l| !l.contains("tokenizes to only"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        parse_perplexity("", &first_only),
        Err(PerplexityProblem::TooShort {
            needed: 128,
            ctx: 64,
            got: None
        })
    );
}

#[test]
fn error_lines_and_negative_variance_are_reported() {
    let stderr = "0.00.014.320 I perplexity: calculating perplexity over 8 chunks, n_ctx=64, batch_size=64, n_seq=1\n\
                  0.00.015.000 E perplexity: failed to eval\n";
    assert_eq!(
        parse_perplexity("", stderr),
        Err(PerplexityProblem::Reported(vec![
            "perplexity: failed to eval".to_string()
        ]))
    );
    // After the unterminated ETA text, as llama-perplexity prints a failed decode.
    let stderr = "0.01.293.823 I perplexity: 0.05 seconds per pass - ETA 0.01.300.000 E perplexity: failed to eval\n";
    assert_eq!(
        parse_perplexity("", stderr),
        Err(PerplexityProblem::Reported(vec![
            "perplexity: failed to eval".to_string()
        ]))
    );
    let stderr = "0.00.015.000 E Unexpected negative standard deviation of log(prob)\n";
    assert!(matches!(
        parse_perplexity("[1]nan,", stderr),
        Err(PerplexityProblem::Reported(_))
    ));
}

#[test]
fn running_values_must_be_consistent() {
    assert_eq!(
        parse_running("0.01 minutes\n[1]5.0000,[2]6.0000,\n").unwrap(),
        vec![5.0, 6.0]
    );
    assert!(matches!(
        parse_running("[1]5.0000,[3]6.0000,"),
        Err(PerplexityProblem::Malformed(_))
    ));
    // A Final line whose chunk count disagrees with the running values.
    let stderr = data("tiny-llama-ppl.stderr");
    let stdout = "[1]46994.1030,[2]44973.2407,";
    assert!(matches!(
        parse_perplexity(stdout, &stderr),
        Err(PerplexityProblem::Malformed(_))
    ));
    // A last running value that is not the Final value.
    let stdout = data("tiny-llama-ppl.stdout").replace("[8]25954.9134", "[8]25000.0000");
    assert!(matches!(
        parse_perplexity(&stdout, &stderr),
        Err(PerplexityProblem::Malformed(_))
    ));
}

#[test]
fn kl_divergence_statistics() {
    let stdout = data("tiny-llama-kld-f16-vs-f32.stdout");
    let stderr = data("tiny-llama-kld-f16-vs-f32.stderr");
    let s = parse_kl_divergence(&stdout, &stderr).unwrap();
    assert_eq!((s.ppl_q.value, s.ppl_q.err), (25953.028976, 4809.622121));
    assert_eq!(
        (s.ppl_base.value, s.ppl_base.err),
        (25846.229484, 4773.913422)
    );
    assert_eq!(s.cor_ln_ppl_pct, 99.99);
    assert_eq!(
        (s.mean_ln_ppl_ratio.value, s.mean_ln_ppl_ratio.err),
        (0.004124, 0.002596)
    );
    assert_eq!((s.ppl_ratio.value, s.ppl_ratio.err), (1.004132, 0.002607));
    assert_eq!((s.ppl_diff.value, s.ppl_diff.err), (106.799492, 74.446628));
    assert_eq!((s.kld_mean.value, s.kld_mean.err), (0.000006, 0.000001));
    assert_eq!(s.kld_max, 0.000067);
    assert_eq!(s.kld_p99_9, 0.000063);
    assert_eq!(s.kld_p99, 0.000043);
    assert_eq!(s.kld_p95, 0.000030);
    assert_eq!(s.kld_p90, 0.000023);
    assert_eq!(s.kld_median, 0.000005);
    assert_eq!(s.kld_p10, -0.000013);
    assert_eq!(s.kld_p5, -0.000018);
    assert_eq!(s.kld_p1, -0.000025);
    assert_eq!(s.kld_p0_1, -0.000030);
    assert_eq!(s.kld_min, -0.000031);
    assert_eq!(
        (s.delta_p_mean_pct.value, s.delta_p_mean_pct.err),
        (0.0, 0.0)
    );
    assert_eq!(s.delta_p_max_pct, 0.025);
    assert_eq!(s.delta_p_p99_9_pct, 0.023);
    assert_eq!(s.delta_p_p99_pct, 0.006);
    assert_eq!(s.delta_p_p75_pct, 0.0);
    assert_eq!(s.delta_p_p5_pct, -0.001);
    assert_eq!(s.delta_p_p1_pct, -0.003);
    assert_eq!(s.delta_p_p0_1_pct, -0.006);
    assert_eq!(s.delta_p_min_pct, -0.007);
    assert_eq!(
        (s.rms_delta_p_pct.value, s.rms_delta_p_pct.err),
        (0.002, 0.001)
    );
    assert_eq!((s.same_top_pct.value, s.same_top_pct.err), (99.597, 0.403));
    assert_eq!(s.chunks, Some(8));
    assert_eq!(s.n_ctx, Some(64));
    assert_eq!(count_rows(&stdout), 8);
}

#[test]
fn kl_divergence_requires_the_statistics_block() {
    let stdout = data("tiny-llama-kld-f16-vs-f32.stdout");
    let stderr = data("tiny-llama-kld-f16-vs-f32.stderr");
    // Cut where the logger could cut: before the KL block, and inside it.
    let at = stdout.find("====== KL divergence statistics").unwrap();
    let e = parse_kl_divergence(&stdout[..at], &stderr).unwrap_err();
    assert!(e.contains("KL divergence statistics"), "{e}");
    let at = stdout.rfind("Same top p").unwrap();
    let e = parse_kl_divergence(&stdout[..at], &stderr).unwrap_err();
    assert!(e.contains("Same top p"), "{e}");
    // An error line (e.g. a vocabulary mismatch) fails the run even with statistics.
    // It may start a line or follow the unterminated `... ETA ` text.
    for sep in ["\n", ""] {
        let bad = format!(
            "{stderr}{sep}0.00.009.000 E kl_divergence: inconsistent vocabulary (512 vs 49152)\n"
        );
        let e = parse_kl_divergence(&stdout, &bad).unwrap_err();
        assert!(e.contains("inconsistent vocabulary"), "{e}");
    }
}

#[test]
fn llama_bench_json() {
    let b = parse_bench_json(&data("tiny-llama-bench.json")).unwrap();
    let pp = b.pp_at(None).unwrap().clone();
    let tg = b.tg_at(None).unwrap().clone();
    assert_eq!(pp.flash_attn, Some(false));
    assert_eq!((pp.n_prompt, pp.n_gen), (64, 0));
    assert_eq!((tg.n_prompt, tg.n_gen), (0, 16));
    assert_eq!(pp.avg_ts, 38921.852919);
    assert_eq!(pp.stddev_ts, 33248.681867);
    assert_eq!(pp.samples_ts, vec![609.877, 55928.6, 60227.1]);
    assert_eq!(pp.samples_ns, vec![104939239, 1144316, 1062645]);
    assert_eq!(tg.avg_ts, 7160.624978);
    assert_eq!(tg.samples_ts, vec![10215.3, 10968.7, 297.812]);
    assert_eq!(b.raw.len(), 2);
    assert_eq!(pp.raw["model_n_params"], 119104);
    assert_eq!(pp.raw["type_k"], "f16");
    // avg_ts is the mean of the per-repetition rates (B:1572).
    let mean = tg.samples_ts.iter().sum::<f64>() / 3.0;
    assert!((mean - tg.avg_ts).abs() / tg.avg_ts < 1e-5);
}

/// llama-bench 0.3.36 at a depth (`-p 16 -n 4 -d 64 -r 1 -t 1` on the tiny fixture): both
/// tests carry `n_depth` 64; the run is checked against a request at that depth, and one
/// at another depth is refused; the stderr's progress counts timed runs, not depth runs.
#[test]
fn llama_bench_json_at_depth() {
    use llamacpp::bench::{check_matches, count_progress, BenchRequest};
    use llamacpp::settings::{ComputeSettings, KvType};
    let b = parse_bench_json(&data("tiny-llama-bench-d64.json")).unwrap();
    let (pp, tg) = (b.pp[0].clone(), b.tg[0].clone());
    assert_eq!((pp.n_prompt, pp.n_gen, pp.n_depth), (16, 0, 64));
    assert_eq!((tg.n_prompt, tg.n_gen, tg.n_depth), (0, 4, 64));
    assert_eq!(pp.samples_ts.len(), 1);
    let mut req = BenchRequest {
        model: "m.gguf".into(),
        pp: 16,
        tg: 4,
        depth: 64,
        reps: 1,
        compute: ComputeSettings::new(1, KvType::F16),
        flash_attn: vec![],
        timeout: std::time::Duration::from_secs(60),
    };
    check_matches(&b, &req, llamacpp::Engine::LlamaCpp).unwrap();
    req.depth = 0;
    let e = check_matches(&b, &req, llamacpp::Engine::LlamaCpp).unwrap_err();
    assert!(e.contains("depth 64") && e.contains("depth 0"), "{e}");
    // Depth-0 output is checked against a depth-0 request as before.
    let flat = parse_bench_json(&data("tiny-llama-bench.json")).unwrap();
    assert_eq!(flat.pp[0].n_depth, 0);
    assert_eq!(count_progress(&data("tiny-llama-bench-d64.stderr")), 2);
}

/// llama-bench 0.3.36 with both flash-attention settings in one run (`-p 16 -n 4 -r 2 -t 1
/// -fa 0,1` on the tiny fixture): every test at 0 then 1, told apart by `flash_attn`; the
/// run matches a request for both, and for either one alone not (an extra setting), nor a
/// request for a setting it did not run.
#[test]
fn llama_bench_json_with_both_flash_attn_settings() {
    use llamacpp::bench::{check_matches, BenchRequest};
    use llamacpp::settings::{ComputeSettings, KvType};
    let b = parse_bench_json(&data("tiny-llama-bench-fa01.json")).unwrap();
    assert_eq!((b.pp.len(), b.tg.len(), b.raw.len()), (2, 2, 4));
    for fa in [false, true] {
        let (pp, tg) = (b.pp_at(Some(fa)).unwrap(), b.tg_at(Some(fa)).unwrap());
        assert_eq!((pp.n_prompt, pp.flash_attn), (16, Some(fa)));
        assert_eq!((tg.n_gen, tg.flash_attn), (4, Some(fa)));
        assert_eq!(tg.samples_ts.len(), 2);
    }
    assert!(
        b.pp_at(None).is_none(),
        "two pp tests: none is the only one"
    );
    let mut req = BenchRequest {
        model: "m.gguf".into(),
        pp: 16,
        tg: 4,
        depth: 0,
        reps: 2,
        compute: ComputeSettings::new(1, KvType::F16),
        flash_attn: vec![false, true],
        timeout: std::time::Duration::from_secs(60),
    };
    check_matches(&b, &req, llamacpp::Engine::LlamaCpp).unwrap();
    req.flash_attn = vec![true];
    let e = check_matches(&b, &req, llamacpp::Engine::LlamaCpp).unwrap_err();
    assert!(e.contains("2 pp tests, asked for -fa 1"), "{e}");
    // A single-setting run is checked for its setting: the fa-0 objects alone are not `-fa 1`.
    let only_off = serde_json::to_string(&b.raw[..2]).unwrap();
    let e = check_matches(
        &parse_bench_json(&only_off).unwrap(),
        &req,
        llamacpp::Engine::LlamaCpp,
    )
    .unwrap_err();
    assert!(e.contains("no pp16 test at -fa 1"), "{e}");
    // `flash_attn` other than 0/1/true/false is not read as either.
    let odd =
        data("tiny-llama-bench-fa01.json").replacen("\"flash_attn\": 0", "\"flash_attn\": -1", 1);
    assert!(parse_bench_json(&odd)
        .unwrap_err()
        .contains("`flash_attn` is -1"));
}

#[test]
fn llama_bench_json_is_tolerant_but_complete() {
    // Unknown fields are ignored; the raw object keeps them.
    let json = r#"[{"n_prompt": 8, "n_gen": 0, "avg_ts": 10.5, "stddev_ts": 0.5,
        "samples_ts": [10.0, 11.0], "samples_ns": [1, 2], "brand_new_field": {"x": 1}}]"#;
    let b = parse_bench_json(json).unwrap();
    assert_eq!(b.pp[0].raw["brand_new_field"]["x"], 1);
    assert!(b.tg.is_empty());
    // A missing required field, a truncated array, and no JSON at all are errors.
    let e = parse_bench_json(r#"[{"n_prompt": 8, "n_gen": 0, "avg_ts": 1.0}]"#).unwrap_err();
    assert!(e.contains("stddev_ts"), "{e}");
    assert!(parse_bench_json("[\n  {\n    \"n_prompt\": 8,\n").is_err());
    assert!(parse_bench_json("").is_err());
    // A combined pp+tg test is not what we asked for.
    let json =
        r#"[{"n_prompt": 8, "n_gen": 8, "avg_ts": 1.0, "stddev_ts": 0.0, "samples_ts": [1.0]}]"#;
    assert!(parse_bench_json(json).is_err());
}

#[test]
fn llama_tokenize_ids() {
    let ids = parse_ids(&data("tiny-llama-tokenize-300.stdout")).unwrap();
    // Recorded from an earlier tiny-llama fixture: the first 24 ids of its eval.txt, as its
    // golden.json "probe_tokens" listed them.
    assert_eq!(
        &ids[..24],
        &[
            161, 225, 245, 319, 300, 471, 318, 71, 379, 86, 260, 78, 280, 85, 268, 314, 71, 279,
            284, 68, 330, 86, 280, 366
        ]
    );
    assert_eq!(ids.len(), 138);
    assert_eq!(parse_ids("[]\n").unwrap(), Vec::<u32>::new());
    assert!(parse_ids("[1, x]\n").is_err());
    assert!(parse_ids("Total number of tokens: 3\n").is_err());
}

#[test]
fn text_as_llama_perplexity_reads_it() {
    assert_eq!(perplexity_text(b"a\r\nb\n"), b"a\r\nb");
    assert_eq!(perplexity_text(b"a\n\n"), b"a\n");
    assert_eq!(perplexity_text(b"a"), b"a");
    assert_eq!(perplexity_text(b""), b"");
}

#[test]
fn version_and_help_of_the_real_binaries() {
    let b = BuildInfo::parse(&data("llama-perplexity-version.txt")).unwrap();
    assert_eq!(b.version.as_deref(), Some("0.5.0-dev"));
    assert_eq!(b.build_number, None);
    assert_eq!(b.build_commit, None);
    for (help, needle) in [
        ("llama-perplexity-help.txt", "--flash-attn [on|off|auto]"),
        ("llama-perplexity-help.txt", "--kl-divergence-base"),
        ("llama-bench-help.txt", "json"),
        ("llama-tokenize-help.txt", "--no-parse-special"),
        ("llama-tokenize-help.txt", "--no-escape"),
    ] {
        assert!(data(help).contains(needle), "{help} lacks {needle}");
    }
}

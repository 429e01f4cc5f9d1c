//! Live tests against the real llama.cpp tools on the tiny-llama fixture. They need the
//! tools (`KWK_LLAMA_CPP_DIR`, `PATH`, or the build `scripts/setup-llama-cpp.sh` leaves in
//! the cache) and fail with the setup hint when they are missing.

use llamacpp::{
    BenchRequest, ComputeSettings, Error, KlDivergenceRequest, KvType, LlamaCppTools,
    PerplexityRequest, TokenizeRequest,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn tools() -> LlamaCppTools {
    LlamaCppTools::locate(None).unwrap_or_else(|e| {
        panic!("live tests need llama.cpp's tools: {e}\n(run scripts/setup-llama-cpp.sh)")
    })
}

/// `shared/fixtures` of the repository: the first ancestor holding it (a worktree sits one
/// level deeper than the main checkout).
fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|a| a.join("shared/fixtures"))
        .find(|p| p.is_dir())
        .expect("../shared/fixtures not found above the repository")
}

fn golden() -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(fixtures().join("tiny-llama/golden.json")).unwrap())
        .unwrap()
}

fn f32_exact() -> ComputeSettings {
    // f32 KV cache, flash attention off: the configuration that matches a float32 reference.
    let c = ComputeSettings::new(2, KvType::F32);
    assert!(!c.flash_attn);
    c
}

#[test]
fn tiny_llama_perplexity_equals_golden() {
    let tools = tools();
    let mut req = PerplexityRequest::new(
        fixtures().join("tiny-llama/model.gguf"),
        fixtures().join("eval.txt"),
        64,
        f32_exact(),
    );
    req.chunks = Some(8);
    req.timeout = Duration::from_secs(600);
    let mut progress = Vec::new();
    let run = llamacpp::run_perplexity(&tools, &req, |d| progress.push(d)).unwrap();
    let g = golden();
    let want = g["perplexity"]["ppl"].as_f64().unwrap();
    // llama-perplexity prints 25954.9134 (the fixtures README); golden 25954.91131.
    assert!(
        ((run.output.ppl - want) / want).abs() < 5e-7,
        "{} vs golden {want}",
        run.output.ppl
    );
    let running: Vec<f64> = g["perplexity"]["running"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(run.output.running.len(), running.len());
    for (got, want) in run.output.running.iter().zip(&running) {
        assert!(((got - want) / want).abs() < 5e-7, "{got} vs {want}");
    }
    assert_eq!(run.output.n_seq, Some(1));
    assert_eq!(progress.last(), Some(&8));
    assert!(
        run.command.contains("-c 64 -b 64 -ub 64 --chunks 8"),
        "{}",
        run.command
    );
}

#[test]
fn tiny_llama_tokens_equal_golden() {
    let tools = tools();
    let run = llamacpp::run_tokenize(
        &tools,
        &TokenizeRequest {
            model: fixtures().join("tiny-llama/model.gguf"),
            text: fixtures().join("eval.txt"),
            timeout: Duration::from_secs(600),
        },
    )
    .unwrap();
    let g = golden();
    assert_eq!(run.ids.len() as u64, g["n_tokens"].as_u64().unwrap());
    let probe: Vec<u32> = g["probe_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(&run.ids[..probe.len()], &probe[..]);
}

#[test]
fn tiny_llama_kl_divergence_against_its_own_f32_run() {
    let tools = tools();
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base.kld");
    let model = fixtures().join("tiny-llama/model.gguf");
    let mut req =
        PerplexityRequest::new(model.clone(), fixtures().join("eval.txt"), 64, f32_exact());
    req.chunks = Some(8);
    req.save_logits = Some(base.clone());
    llamacpp::run_perplexity(&tools, &req, |_| {}).unwrap();
    // §2.2 of the protocol notes: 20 + 4*chunks*ctx + 2*nv*chunks*(ctx-1-ctx/2) bytes, nv =
    // 2*ceil(512/2)+4.
    let nv = 516u64;
    assert_eq!(
        std::fs::metadata(&base).unwrap().len(),
        20 + 4 * 8 * 64 + 2 * nv * 8 * 31
    );
    let kld = llamacpp::run_kl_divergence(
        &tools,
        &KlDivergenceRequest {
            model,
            base,
            ctx: 64,
            compute: f32_exact(),
            timeout: Duration::from_secs(600),
            attempts: 4,
        },
        |_| {},
    )
    .unwrap();
    let s = kld.stats;
    // The same model and settings: the only difference is the base file's 16-bit log-probs.
    assert!(s.kld_mean.value.abs() < 1e-4, "{:?}", s.kld_mean);
    assert!(s.same_top_pct.value > 99.0, "{:?}", s.same_top_pct);
    assert_eq!(s.chunks, Some(8));
    assert_eq!(s.n_ctx, Some(64));
    let want = golden()["perplexity"]["ppl"].as_f64().unwrap();
    assert!(
        ((s.ppl_q.value - want) / want).abs() < 1e-4,
        "{:?}",
        s.ppl_q
    );
}

#[test]
fn tiny_llama_bench() {
    let tools = tools();
    let run = llamacpp::run_bench(
        &tools,
        &BenchRequest {
            model: fixtures().join("tiny-llama/model.gguf"),
            pp: 32,
            tg: 8,
            reps: 2,
            compute: ComputeSettings::new(2, KvType::F16),
            timeout: Duration::from_secs(600),
        },
        |_, _| {},
    )
    .unwrap();
    let (pp, tg) = (run.output.pp.unwrap(), run.output.tg.unwrap());
    assert_eq!((pp.n_prompt, pp.samples_ts.len()), (32, 2));
    assert_eq!((tg.n_gen, tg.samples_ts.len()), (8, 2));
    assert_eq!(pp.raw["n_threads"], 2);
    assert_eq!(pp.raw["type_k"], "f16");
    assert_eq!(pp.raw["flash_attn"], 1);
}

#[test]
fn too_short_text_never_gives_a_result() {
    let tools = tools();
    let tmp = tempfile::tempdir().unwrap();
    let text = tmp.path().join("short.txt");
    std::fs::write(
        &text,
        &std::fs::read(fixtures().join("eval.txt")).unwrap()[..150],
    )
    .unwrap();
    let req = PerplexityRequest::new(
        fixtures().join("tiny-llama/model.gguf"),
        text,
        64,
        f32_exact(),
    );
    // llama-perplexity exits 0 here; its two error lines can be lost with the rest of the log
    // tail, in which case the retries end in a "no Final estimate" error. Either way: no PPL.
    match llamacpp::run_perplexity(&tools, &req, |_| {}) {
        Err(Error::TextTooShort { needed: 128, .. }) => {}
        Err(Error::BadOutput { what, .. }) => assert!(what.contains("Final estimate"), "{what}"),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn missing_model_fails_with_the_stderr_tail() {
    let tools = tools();
    let req = PerplexityRequest::new(
        "/nonexistent/model.gguf".into(),
        fixtures().join("eval.txt"),
        64,
        f32_exact(),
    );
    let msg = llamacpp::run_perplexity(&tools, &req, |_| {})
        .unwrap_err()
        .to_string();
    assert!(msg.contains("llama-perplexity"), "{msg}");
    assert!(msg.contains("/nonexistent/model.gguf"), "{msg}");
}

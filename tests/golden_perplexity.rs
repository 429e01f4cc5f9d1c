//! The in-tree float32 runner reproduces the fixtures' golden perplexities (kwk-fixtures'
//! float64 reference; llama.cpp agrees with them within 5e-7) within 1e-4 relative, with
//! the harness's own protocol code: ctx 64, 8 chunks of the fixtures' eval.txt.

mod common;
use common::*;
use kwk_eval::protocol::{ChunkPlan, NoProgress, PerplexityProtocol, TokenStream};
use kwk_eval::runner::kwk::{KwkRunner, KwkRunnerOptions, ReferenceRole};
use kwk_eval::runner::Runner;
use std::rc::Rc;

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs()
}

fn check_fixture(name: &str) {
    let dir = fixtures_dir().join(name);
    let golden: serde_json::Value = read_json(&dir.join("golden.json"));
    let g = &golden["perplexity"];
    let model = Rc::new(kwk::model::load_model_header(dir.to_str().unwrap()).unwrap());
    let text = kwk_eval::text::read_text(&eval_txt(), "--text").unwrap();
    let tokens = model.tokenizer.encode(&text.text, true).unwrap();
    assert_eq!(
        tokens.len() as u64,
        golden["n_tokens"].as_u64().unwrap(),
        "{name}: token count"
    );
    let stream = TokenStream {
        tokens,
        add_bos: model.tokenizer.add_bos(),
        bos_id: model.tokenizer.bos_id(),
        text_path: eval_txt(),
        text_sha256: None,
    };
    let ctx = g["ctx"].as_u64().unwrap() as usize;
    let chunks = g["chunks"].as_u64().unwrap() as usize;
    let options = KwkRunnerOptions {
        threads: 2,
        kv: kwk::KvPrecision::F32,
        max_cache_len: ctx,
        calibration_tokens: None,
        pack_cache_dir: None,
    };
    let mut runner = KwkRunner::new(
        Rc::clone(&model),
        "float32",
        kwk::Precision::Float32,
        &options,
        ReferenceRole::Compared,
    )
    .unwrap();
    let protocol = PerplexityProtocol {
        plan: ChunkPlan::new(stream.tokens.len(), ctx, Some(chunks)).unwrap(),
        threads: 2,
        reference_logits: None,
        logits_dir: None,
    };
    let r = runner.perplexity(&protocol, &stream, &NoProgress).unwrap();
    let ppl = g["ppl"].as_f64().unwrap();
    let err = g["ppl_err"].as_f64().unwrap();
    assert_eq!(
        r.scored_tokens as u64,
        g["scored"].as_u64().unwrap(),
        "{name}: scored tokens"
    );
    assert!(
        rel(r.ppl, ppl) < 1e-4,
        "{name}: PPL {} vs golden {ppl}",
        r.ppl
    );
    assert!(
        rel(r.ppl_err, err) < 1e-3,
        "{name}: PPL error {} vs golden {err}",
        r.ppl_err
    );
    let running: Vec<f64> = serde_json::from_value(g["running"].clone()).unwrap();
    assert_eq!(r.running.len(), running.len());
    for (k, (a, b)) in r.running.iter().zip(&running).enumerate() {
        assert!(
            rel(*a, *b) < 1e-4,
            "{name}: running PPL after chunk {}: {a} vs {b}",
            k + 1
        );
    }
}

#[test]
fn tiny_llama_golden_perplexity() {
    check_fixture("tiny-llama");
}

#[test]
fn tiny_qwen2_golden_perplexity() {
    check_fixture("tiny-qwen2");
}

#[test]
fn tiny_mixtral_golden_perplexity() {
    check_fixture("tiny-mixtral");
}

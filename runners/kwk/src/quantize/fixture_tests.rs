//! The quantized formats on the tiny fixtures (random weights, so nothing sits on a grid):
//! dense (tiny-llama, tiny-qwen2) and mixture-of-experts (tiny-mixtral, every expert packed
//! through the same `pack_quantized`), against float32 of the same weights: largest logit
//! error relative to the largest |logit|, KL divergence of the next-token distributions at
//! the probe positions, and perplexity over 8 chunks of 64 tokens.

use crate::decoder::{DecoderOptions, KwkDecoder};
use crate::format::{LowBitOptions, Precision};
use crate::kernels::quant::Bits;
use crate::model::safetensors_loader::load_hf_weights;
use crate::model::{ModelConfig, ModelWeights};
use kwk_fixtures::model_dir as fixture_dir;
use std::path::PathBuf;

struct Fixture {
    config: ModelConfig,
    weights: ModelWeights,
    golden: serde_json::Value,
    dir: PathBuf,
}

fn load(name: &str) -> Fixture {
    let dir = fixture_dir(name);
    let config = ModelConfig::from_hf_config_json(&dir.join("config.json")).expect("config");
    let (weights, _) = load_hf_weights(&dir, &config).expect("weights");
    let golden =
        serde_json::from_slice(&std::fs::read(dir.join("golden.json")).expect("golden.json"))
            .expect("json");
    Fixture {
        config,
        weights,
        golden,
        dir,
    }
}

fn decoder(f: &Fixture, precision: Precision) -> KwkDecoder {
    decoder_calibrated(f, precision, None)
}

fn decoder_calibrated(f: &Fixture, precision: Precision, calib: Option<Vec<u32>>) -> KwkDecoder {
    KwkDecoder::from_weights(
        &f.config,
        &f.weights,
        f.config.eos_token_ids.clone(),
        &f.dir,
        DecoderOptions {
            max_cache_len: 64,
            precision,
            kv: Default::default(),
            threads: 2,
            calibration_tokens: calib,
            pack_cache_dir: None,
        },
    )
    .expect("decoder builds")
}

fn eval_tokens(f: &Fixture) -> Vec<u32> {
    let mut text =
        String::from_utf8(std::fs::read(f.dir.join("../eval.txt")).expect("eval.txt")).unwrap();
    if text.ends_with('\n') {
        text.pop();
    }
    let tok =
        tokenizers::Tokenizer::from_file(f.dir.join("tokenizer.json")).expect("tokenizer.json");
    tok.encode(text, false).expect("encodes").get_ids().to_vec()
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = row
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    row.iter().map(|&l| l as f64 - lse).collect()
}

/// llama-perplexity's protocol on `chunks` chunks of 64 tokens.
fn perplexity(dec: &mut KwkDecoder, tokens: &[u32], vocab: usize) -> f64 {
    let (ctx, first) = (64, 32);
    let (mut nll, mut n) = (0f64, 0usize);
    for chunk in tokens.chunks_exact(ctx).take(8) {
        dec.reset();
        let logits = dec.forward(chunk, first).unwrap();
        for j in 0..ctx - 1 - first {
            nll -= log_softmax(&logits[j * vocab..(j + 1) * vocab])[chunk[first + j + 1] as usize];
            n += 1;
        }
    }
    (nll / n as f64).exp()
}

struct Quality {
    logit_err_rel: f64,
    kld: f64,
    ppl_rel: f64,
}

fn measure(f: &Fixture, reference: &[f32], ref_ppl: f64, p: Precision) -> Quality {
    measure_calibrated(f, reference, ref_ppl, p, None)
}

fn measure_calibrated(
    f: &Fixture,
    reference: &[f32],
    ref_ppl: f64,
    p: Precision,
    calib: Option<Vec<u32>>,
) -> Quality {
    let vocab = f.config.vocab_size;
    let tokens: Vec<u32> = f.golden["probe_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let mut dec = decoder_calibrated(f, p, calib);
    let logits = dec.forward(&tokens, 0).unwrap();
    let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    let err = logits
        .iter()
        .zip(reference)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs() as f64));
    let mut kld = 0f64;
    for t in 0..tokens.len() {
        let (p, q) = (
            log_softmax(&reference[t * vocab..(t + 1) * vocab]),
            log_softmax(&logits[t * vocab..(t + 1) * vocab]),
        );
        kld += p
            .iter()
            .zip(&q)
            .map(|(a, b)| a.exp() * (a - b))
            .sum::<f64>();
    }
    let ppl = perplexity(&mut dec, &eval_tokens(f), vocab);
    Quality {
        logit_err_rel: err / scale,
        kld: kld / tokens.len() as f64,
        ppl_rel: ppl / ref_ppl - 1.0,
    }
}

/// Limits, about 1.5x the worst measured over the three generated fixtures and an earlier
/// set of the same shapes (random normal weights of width 64: a 4-bit code's rounding error
/// is ~7% of a weight's rms, and MoE routing flips experts on small changes, so these models
/// are far more fragile than trained ones; their perplexities are in the tens of thousands,
/// so a perturbation that flattens the distribution can lower it by several percent).
/// Measured on the generated fixtures (max logit error / largest |logit|, KL, ΔPPL): int8
/// llama 0.064 / 0.0053 / +1.6%, qwen2 0.040 / 0.0029 / +0.9%, mixtral 0.057 / 0.0041 /
/// +0.05%; int4 (g32, mix8) llama 0.39 / 0.29 / +0.2%, qwen2 0.26 / 0.14 / −9.6%, mixtral
/// 0.26 / 0.17 / +3.7%; int4:g128 up to 0.60 / 0.43 / −8.8%; int4:mix6 up to 0.40 / 0.27 /
/// −10.1%. On the earlier set: int8 up to 0.21 / 0.014 / +1.6%, int4 up to 0.52 / 0.26 /
/// 3.6%, int4:g128 up to 0.54 / 0.38 / 16%, int4:mix6 up to 0.59 / 0.29 / 2.5%. Besides the
/// limits, KL must not rise from int8 to int4 to int4:g128.
fn check(name: &str) {
    let f = load(name);
    let vocab = f.config.vocab_size;
    let tokens: Vec<u32> = f.golden["probe_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let mut reference_dec = decoder(&f, Precision::Float32);
    let reference = reference_dec.forward(&tokens, 0).unwrap();
    let ref_ppl = perplexity(&mut reference_dec, &eval_tokens(&f), vocab);
    let mut klds = Vec::new();
    let int4 = |group_size, mix_bits| {
        Precision::LowBit(LowBitOptions {
            bits: Bits::B4,
            group_size,
            mix_bits,
            calibrate: false,
            gptq: false,
            act_order: false,
        })
    };
    for (label, p, logit_lim, kld_lim, ppl_lim) in [
        ("int8", Precision::INT8, 0.32, 0.021, 0.025),
        ("int4", int4(32, None), 0.78, 0.39, 0.15),
        ("int4:g128", int4(128, None), 0.82, 0.57, 0.25),
        ("int4:mix6", int4(32, Some(Bits::B6)), 0.88, 0.43, 0.15),
    ] {
        let q = measure(&f, &reference, ref_ppl, p);
        klds.push(q.kld);
        eprintln!(
            "{name} {label}: max logit err {:.4} of largest, KL {:.5}, ppl {:+.3}% (float32 ppl {ref_ppl:.1})",
            q.logit_err_rel,
            q.kld,
            q.ppl_rel * 100.0
        );
        if std::env::var_os("KWK_PRINT_ONLY").is_some() {
            continue;
        }
        assert!(
            q.logit_err_rel <= logit_lim,
            "{name} {label}: logit error {} > {logit_lim}",
            q.logit_err_rel
        );
        assert!(q.kld <= kld_lim, "{name} {label}: KL {} > {kld_lim}", q.kld);
        assert!(
            q.ppl_rel.abs() <= ppl_lim,
            "{name} {label}: ppl change {} > {ppl_lim}",
            q.ppl_rel
        );
    }
    // int4 and int4:g128 spend the same budget (the mix search may buy finer groups for
    // either), so only int8 below both is an ordering.
    assert!(
        klds[0] < klds[1] && klds[0] < klds[2],
        "{name}: KL int8 {} int4 {} int4:g128 {}",
        klds[0],
        klds[1],
        klds[2]
    );
}

#[test]
fn tiny_llama_quantized_close_to_float32() {
    check("tiny-llama");
}

#[test]
fn tiny_qwen2_quantized_close_to_float32() {
    check("tiny-qwen2");
}

#[test]
fn tiny_mixtral_quantized_close_to_float32() {
    check("tiny-mixtral");
}

/// The low-bit widths end to end (pack, mix, kernels, forward): int3, int5 and int6 are
/// sized to Q3_K_M, Q5_K_M and Q6_K (growing budgets), so their KL divergence from float32
/// falls in that order, and int6's stays within plain int4's limit of [`check`].
fn check_widths(name: &str) {
    let f = load(name);
    let vocab = f.config.vocab_size;
    let tokens: Vec<u32> = f.golden["probe_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let mut reference_dec = decoder(&f, Precision::Float32);
    let reference = reference_dec.forward(&tokens, 0).unwrap();
    let ref_ppl = perplexity(&mut reference_dec, &eval_tokens(&f), vocab);
    let kld: Vec<f64> = ["int3", "int5", "int6"]
        .iter()
        .map(|spec| {
            let q = measure(&f, &reference, ref_ppl, Precision::parse(spec).unwrap());
            eprintln!(
                "{name} {spec}: max logit err {:.4} of largest, KL {:.5}, ppl {:+.3}%",
                q.logit_err_rel,
                q.kld,
                q.ppl_rel * 100.0
            );
            q.kld
        })
        .collect();
    assert!(
        kld.iter().all(|k| k.is_finite()) && kld[0] > kld[1] && kld[1] > kld[2] && kld[2] <= 0.39,
        "{name}: KL int3 {} int5 {} int6 {}",
        kld[0],
        kld[1],
        kld[2]
    );
}

#[test]
fn tiny_llama_low_bit_widths_order_by_size() {
    check_widths("tiny-llama");
}

#[test]
fn tiny_qwen2_low_bit_widths_order_by_size() {
    check_widths("tiny-qwen2");
}

#[test]
fn tiny_mixtral_low_bit_widths_order_by_size() {
    check_widths("tiny-mixtral");
}

/// `int4:calib`, `int4:gptq`, `int8:calib` and `int8:gptq` calibrated on a text other than
/// the scored one (the first 20,000 bytes of the fixtures' tokenizer-training text,
/// WikiText-2 lines before the eval text): KL divergence at the probe positions and
/// perplexity change within the plain int4 / int8 limits of [`check`], and GPTQ's KL below
/// `int4:calib`'s.
fn check_calibrated(name: &str) {
    let f = load(name);
    let vocab = f.config.vocab_size;
    let tokens: Vec<u32> = f.golden["probe_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let mut reference_dec = decoder(&f, Precision::Float32);
    let reference = reference_dec.forward(&tokens, 0).unwrap();
    let ref_ppl = perplexity(&mut reference_dec, &eval_tokens(&f), vocab);
    let tok =
        tokenizers::Tokenizer::from_file(f.dir.join("tokenizer.json")).expect("tokenizer.json");
    let training = kwk_fixtures::text::read().training;
    let calib: Vec<u32> = tok
        .encode(&training[..training.len().min(20_000)], false)
        .expect("encodes")
        .get_ids()
        .to_vec();
    assert!(calib.len() > 1000, "{} calibration tokens", calib.len());
    let mut kld = Vec::new();
    for spec in [
        "int4",
        "int4:calib",
        "int4:gptq",
        "int8",
        "int8:calib",
        "int8:gptq",
    ] {
        let p = Precision::parse(spec).unwrap();
        let q = measure_calibrated(&f, &reference, ref_ppl, p, Some(calib.clone()));
        eprintln!(
            "{name} {spec}: max logit err {:.4} of largest, KL {:.5}, ppl {:+.3}%",
            q.logit_err_rel,
            q.kld,
            q.ppl_rel * 100.0
        );
        kld.push(q.kld);
        if std::env::var_os("KWK_PRINT_ONLY").is_some() {
            continue;
        }
        // The plain formats' limits of [`check`]; int8:gptq's KL on tiny-mixtral is above
        // plain int8's (a router flip). Measured KL int8 / int8:calib / int8:gptq: llama
        // 0.0075 / 0.0043 / 0.0053, qwen2 0.0023 / 0.0030 / 0.0025, mixtral 0.0075 / 0.0033 /
        // 0.0226.
        let (kld_lim, ppl_lim) = match spec {
            "int8:gptq" => (0.03, 0.025),
            s if s.starts_with("int8") => (0.021, 0.025),
            _ => (0.39, 0.15),
        };
        assert!(q.kld <= kld_lim, "{name} {spec}: KL {}", q.kld);
        assert!(
            q.ppl_rel.abs() <= ppl_lim,
            "{name} {spec}: ppl {}",
            q.ppl_rel
        );
    }
    if std::env::var_os("KWK_PRINT_ONLY").is_none() {
        // int4:gptq differs from int4:calib only in the rounding (same calibration, factors
        // and mix). Measured KL int4 / calib / gptq: llama 0.0308 / 0.0496 / 0.0419, qwen2
        // 0.1218 / 0.1192 / 0.1198, mixtral 0.241 / 0.250 / 0.224 (with `lm_head` on its
        // own ladder, PACK_VERSION 8; before: llama 0.0453 / 0.0629 / 0.0542, qwen2 0.1522 /
        // 0.1568 / 0.1430, mixtral 0.318 / 0.310 / 0.291). qwen2's layers now take grids
        // fine enough that GPTQ has almost nothing to correct: it may lose a little to
        // calib, by how much depending on the prompt path's arithmetic (2026-12-07: the
        // `vnni` tier's q8 activations 0.1198 against 0.1192, the `amx` tier's bf16 tiles
        // 0.1211 against 0.1173, where llama gains 17 % and mixtral 10 % on both).
        let slack = if name == "tiny-qwen2" { 1.05 } else { 1.0 };
        assert!(
            kld[2] < kld[1] * slack,
            "{name}: KL int4:gptq {} >= int4:calib {}",
            kld[2],
            kld[1]
        );
    }
}

#[test]
fn tiny_llama_calibrated_close_to_float32() {
    check_calibrated("tiny-llama");
}

#[test]
fn tiny_qwen2_calibrated_close_to_float32() {
    check_calibrated("tiny-qwen2");
}

#[test]
fn tiny_mixtral_calibrated_close_to_float32() {
    check_calibrated("tiny-mixtral");
}

/// A quantized prompt in one batch (the prompt path: bf16 tiles on the `amx` tier, q8
/// blocks elsewhere) against the same tokens one at a time (the one-token GEMV on q8
/// blocks), both on two threads: 37 tokens fill one 32-token step of the tiles and part of
/// a zero-padded one. A wrong token tile, padding that leaks or a thread's part packed
/// twice moves logits by about the largest one; the two arithmetics differ by the
/// activations' rounding, measured below 6 % of the largest |logit| on tiny-llama
/// (2026-12-07: int8 0.044 and int4 0.059 on `amx`).
#[test]
fn quantized_prompts_in_one_batch_agree_with_one_token_at_a_time() {
    let f = load("tiny-llama");
    let vocab = f.config.vocab_size as u32;
    let tokens: Vec<u32> = (0..37u32).map(|i| (i * 7919 + 13) % vocab).collect();
    for spec in ["int8", "int4"] {
        let mut dec = decoder(&f, Precision::parse(spec).unwrap());
        let batch = dec.forward(&tokens, 0).unwrap();
        dec.reset();
        let mut single = Vec::new();
        for &t in &tokens {
            single.extend(dec.forward(&[t], 0).unwrap());
        }
        assert_eq!(batch.len(), single.len());
        let largest = batch.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = batch
            .iter()
            .zip(&single)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!(
            "{spec}: batch against one at a time {:.2e} of the largest",
            err / largest
        );
        // Without the bf16 tiles both are the same q8 arithmetic: measured 0 on `vnni`,
        // `avx512bw`, `avx2` and `scalar`.
        let bf16_prompts = crate::format::quantized_input_kind(tokens.len())
            == crate::format::InputKind::Bf16Tiles;
        let bound = if bf16_prompts { 0.1 } else { 1e-5 };
        assert!(err <= bound * largest, "{spec}: {err} of {largest}");
    }
}

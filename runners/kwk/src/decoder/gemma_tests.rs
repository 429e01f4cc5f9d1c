//! Gemma 3 against transformers: the tiny random model `scripts/gen_gemma3_test_model.py`
//! made with `Gemma3ForCausalLM` (window 6 under a 40-token sequence, two local layers of
//! three, query_pre_attn_scalar 24 with head_dim 16, random norms), read from its Hugging
//! Face folder and from its GGUF, and its golden float32 logits.

use super::*;
use crate::model::gguf_loader::load_gguf;
use crate::model::safetensors_loader::load_hf_weights;
use kv_cache::KvCache;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-gemma3")
}

struct Golden {
    tokens: Vec<u32>,
    vocab: usize,
    logits: Vec<f32>,
}

fn golden() -> Golden {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture_dir().join("golden.json")).unwrap()).unwrap();
    Golden {
        tokens: v["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect(),
        vocab: v["vocab"].as_u64().unwrap() as usize,
        logits: v["logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect(),
    }
}

fn options(max_cache_len: usize, threads: usize) -> DecoderOptions {
    DecoderOptions {
        max_cache_len,
        precision: Precision::Float32,
        kv: Default::default(),
        threads,
        calibration_tokens: None,
        pack_cache_dir: None,
    }
}

/// Both sources of the fixture: (what, config, weights).
fn sources() -> Vec<(&'static str, ModelConfig, ModelWeights)> {
    let dir = fixture_dir();
    let hc = ModelConfig::from_hf_config_json(&dir.join("config.json")).unwrap();
    let (hw, _) = load_hf_weights(&dir, &hc).unwrap();
    let (gc, gw, _, _) = load_gguf(&dir.join("model.gguf")).unwrap();
    vec![("safetensors", hc, hw), ("gguf", gc, gw)]
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn tiny_gemma3_configs_agree() {
    let s = sources();
    let (hc, gc) = (&s[0].1, &s[1].1);
    for c in [hc, gc] {
        assert_eq!(c.architecture, Architecture::Gemma3);
        assert!(c.tie_word_embeddings);
        assert_eq!(c.sliding_window, None);
        assert_eq!((c.head_dim, c.n_heads, c.n_kv_heads), (16, 2, 1));
        assert_eq!(c.rope_theta, 1_000_000.0);
        let g = c.gemma3.as_ref().unwrap();
        assert_eq!(g.sliding_window, 6);
        assert_eq!(g.sliding_layers, vec![true, false, true]);
        assert_eq!(g.rope_local_theta, 10000.0);
        assert_eq!(g.final_logit_softcapping, None);
    }
    // The GGUF does not store query_pre_attn_scalar: llama.cpp scales by 1/sqrt(head_dim).
    assert_eq!(hc.gemma3.as_ref().unwrap().query_pre_attn_scalar, 24.0);
    assert_eq!(gc.gemma3.as_ref().unwrap().query_pre_attn_scalar, 16.0);
}

/// The naming trap and the (1 + w) norms: the safetensors folder's weights, read with
/// Gemma 3's names and 1 added to every norm, equal the GGUF's (which stores 1 + w under
/// llama.cpp's names) exactly; in particular the FFN norm is `pre_feedforward_layernorm`,
/// not `post_attention_layernorm`.
#[test]
fn tiny_gemma3_safetensors_and_gguf_weights_are_equal() {
    let s = sources();
    let (hw, gw) = (&s[0].2, &s[1].2);
    assert_eq!(hw.embed, gw.embed);
    assert_eq!(hw.final_norm, gw.final_norm);
    assert!(hw.lm_head.is_none() && gw.lm_head.is_none());
    assert_eq!(hw.post_norms, gw.post_norms);
    assert_eq!(hw.post_norms.len(), 3);
    for (l, (h, g)) in hw.layers.iter().zip(&gw.layers).enumerate() {
        assert_eq!(h.attn_norm, g.attn_norm, "layer {l}");
        assert_eq!(h.ffn_norm, g.ffn_norm, "layer {l}");
        assert_eq!(h.q_norm, g.q_norm, "layer {l}");
        assert_eq!(h.k_norm, g.k_norm, "layer {l}");
        assert_eq!(
            (&h.q, &h.k, &h.v, &h.o),
            (&g.q, &g.k, &g.v, &g.o),
            "layer {l}"
        );
        assert_ne!(
            h.ffn_norm, hw.post_norms[l].attn,
            "layer {l}: the naming trap"
        );
    }
}

/// kwk's float32 logits on the safetensors folder are within 1e-4 of transformers' at
/// every position of the 40-token sequence (the window of 6 cuts in from position 6 on),
/// in one call, in chunks of 7 tokens and token by token (generation), on 1 and 2 threads.
#[test]
fn tiny_gemma3_matches_transformers_logits() {
    let g = golden();
    let s = sources();
    let (_, config, weights) = &s[0];
    assert_eq!(config.vocab_size, g.vocab);
    let n = g.tokens.len();
    for threads in [1, 2] {
        let mut dec = KwkDecoder::from_weights(
            config,
            weights,
            Vec::new(),
            &fixture_dir(),
            options(64, threads),
        )
        .unwrap();
        let all = dec.forward(&g.tokens, 0).unwrap();
        let diff = max_abs_diff(&all, &g.logits);
        assert!(
            diff < 1e-4,
            "{threads} threads, one call: max |diff| {diff}"
        );

        dec.reset();
        let mut chunked = Vec::new();
        for c in g.tokens.chunks(7) {
            chunked.extend(dec.forward(c, 0).unwrap());
        }
        let diff = max_abs_diff(&chunked, &g.logits);
        assert!(
            diff < 1e-4,
            "{threads} threads, chunks of 7: max |diff| {diff}"
        );

        dec.reset();
        let mut stepped = Vec::new();
        for &t in &g.tokens {
            stepped.extend(dec.forward(&[t], 0).unwrap());
        }
        let diff = max_abs_diff(&stepped, &g.logits);
        assert!(
            diff < 1e-4,
            "{threads} threads, token by token: max |diff| {diff}"
        );
        assert_eq!(stepped.len(), n * g.vocab);
    }
}

/// The window is what makes the match: with the local layers' window opened to the
/// whole sequence, the late positions' logits move far from transformers'.
#[test]
fn tiny_gemma3_window_changes_the_logits() {
    let g = golden();
    let s = sources();
    let (_, config, weights) = &s[0];
    let mut wide = config.clone();
    wide.gemma3.as_mut().unwrap().sliding_window = 1000;
    let mut dec =
        KwkDecoder::from_weights(&wide, weights, Vec::new(), &fixture_dir(), options(64, 1))
            .unwrap();
    let all = dec.forward(&g.tokens, 0).unwrap();
    let v = g.vocab;
    // Up to the window the two agree; past it they must not.
    let early = max_abs_diff(&all[..6 * v], &g.logits[..6 * v]);
    assert!(early < 1e-4, "{early}");
    let late = max_abs_diff(&all[20 * v..], &g.logits[20 * v..]);
    assert!(late > 1e-2, "the window did not matter: {late}");
}

/// The GGUF, read as llama.cpp reads it, scales queries by 1/sqrt(head_dim) = 1/4 instead
/// of transformers' 24^-1/2; with the scalar set to transformers' value its logits are
/// transformers' too (everything else about the GGUF path is the same model).
#[test]
fn tiny_gemma3_gguf_matches_transformers_with_its_query_scale() {
    let g = golden();
    let s = sources();
    let (_, config, weights) = &s[1];
    let mut c = config.clone();
    c.gemma3.as_mut().unwrap().query_pre_attn_scalar = 24.0;
    let mut dec =
        KwkDecoder::from_weights(&c, weights, Vec::new(), &fixture_dir(), options(64, 2)).unwrap();
    let all = dec.forward(&g.tokens, 0).unwrap();
    let diff = max_abs_diff(&all, &g.logits);
    assert!(diff < 1e-4, "max |diff| {diff}");
}

/// The local layers' ring cache (window 6 + one micro-batch - 1 = 517 slots, 528 rounded)
/// gives the logits of a full cache with the window as a mask, past the point where the
/// ring wraps: 700 tokens in one call (micro-batches of 512 and 188), in chunks of 97 and
/// token by token over the last 40.
#[test]
fn tiny_gemma3_ring_cache_equals_full_cache() {
    let s = sources();
    let (_, config, weights) = &s[0];
    // The fixture's 128 positions stretched: RoPE has no limit of its own.
    let mut config = config.clone();
    config.max_position_embeddings = 1024;
    let config = &config;
    let mut state = 12345u64;
    let tokens: Vec<u32> = (0..700)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % config.vocab_size as u64) as u32
        })
        .collect();
    let build = || {
        KwkDecoder::from_weights(config, weights, Vec::new(), &fixture_dir(), options(700, 2))
            .unwrap()
    };
    let mut ring = build();
    assert_eq!(ring.kv.cap(0), 528, "layer 0 is local: a ring");
    assert_eq!(ring.kv.cap(1), 704, "layer 1 is global: every position");
    let mut full = build();
    full.kv = KvCache::with_lengths(config.n_kv_heads, config.head_dim, &[700; 3]);
    let want = full.forward(&tokens, 0).unwrap();
    let close = |got: &[f32], want: &[f32], what: &str| {
        let diff = max_abs_diff(got, want);
        assert!(diff < 1e-4, "{what}: max |diff| {diff}");
    };
    close(&ring.forward(&tokens, 0).unwrap(), &want, "one call");
    ring.reset();
    let mut chunked = Vec::new();
    for c in tokens.chunks(97) {
        chunked.extend(ring.forward(c, 0).unwrap());
    }
    close(&chunked, &want, "chunks of 97");
    ring.reset();
    let v = config.vocab_size;
    ring.forward(&tokens[..660], 0).unwrap();
    let mut stepped = Vec::new();
    for &t in &tokens[660..] {
        stepped.extend(ring.forward(&[t], 0).unwrap());
    }
    close(&stepped, &want[660 * v..], "token by token past the wrap");
}

/// Every KV precision, on the ring and the tiled path (past the wrap, token by token over
/// the last 40), stays close to a full float32 cache: bounds about twice the measured
/// largest logit difference (f16 0.0026, bf16 0.025, q8 0.090).
#[test]
fn tiny_gemma3_kv_precisions_stay_close_to_float32() {
    let s = sources();
    let (_, config, weights) = &s[0];
    let mut config = config.clone();
    config.max_position_embeddings = 1024;
    let tokens: Vec<u32> = (0..700u32)
        .map(|i| (i * 7919 + 13) % config.vocab_size as u32)
        .collect();
    let build = |kv: KvPrecision| {
        let o = DecoderOptions {
            kv,
            ..options(700, 2)
        };
        KwkDecoder::from_weights(&config, weights, Vec::new(), &fixture_dir(), o).unwrap()
    };
    let want = build(KvPrecision::F32).forward(&tokens, 0).unwrap();
    let v = config.vocab_size;
    let diffs: Vec<(KvPrecision, f32, f32, f32)> = [
        (KvPrecision::F16, 0.006),
        (KvPrecision::Bf16, 0.05),
        (KvPrecision::Q8, 0.2),
    ]
    .into_iter()
    .map(|(kv, bound)| {
        let mut dec = build(kv);
        let mut got = dec.forward(&tokens[..660], 0).unwrap();
        for &t in &tokens[660..] {
            got.extend(dec.forward(&[t], 0).unwrap());
        }
        let late = max_abs_diff(&got[660 * v..], &want[660 * v..]);
        (kv, max_abs_diff(&got, &want), late, bound)
    })
    .collect();
    assert!(
        diffs.iter().all(|&(_, d, l, b)| d <= b && l <= b),
        "max |diff| against the float32 cache (precision, all, past the wrap, bound): {diffs:?}"
    );
}

//! Tests of the config readers (`config.json` and GGUF metadata) and the size checks.

use super::*;
use serde_json::{json, Value};

fn parse(v: Value) -> Result<ModelConfig> {
    ModelConfig::from_hf_config_object(Path::new("config.json"), v.as_object().unwrap())
}

fn fixture(name: &str) -> std::path::PathBuf {
    kwk_fixtures::model_dir(name).join("config.json")
}

#[test]
fn reads_the_three_fixture_configs() {
    let llama = ModelConfig::from_hf_config_json(&fixture("tiny-llama")).unwrap();
    assert_eq!(llama.architecture, Architecture::Llama);
    assert_eq!(
        (llama.hidden_size, llama.intermediate_size, llama.n_layers),
        (64, 160, 2)
    );
    assert_eq!(
        (llama.n_heads, llama.n_kv_heads, llama.head_dim),
        (4, 2, 16)
    );
    assert!(llama.tie_word_embeddings);
    assert_eq!(llama.eos_token_ids, vec![0]);
    assert_eq!(llama.rope_theta, 10000.0);

    let qwen = ModelConfig::from_hf_config_json(&fixture("tiny-qwen2")).unwrap();
    assert_eq!(qwen.architecture, Architecture::Qwen2);
    assert_eq!(qwen.n_kv_heads, 1);
    assert!(!qwen.tie_word_embeddings);
    assert_eq!(qwen.rope_theta, 1e6);

    let mix = ModelConfig::from_hf_config_json(&fixture("tiny-mixtral")).unwrap();
    assert_eq!(mix.architecture, Architecture::Mixtral);
    assert_eq!((mix.n_experts, mix.experts_per_token), (4, 2));
    assert_eq!(mix.moe_intermediate_size, 96);
    assert!(mix.norm_topk_prob);
}

fn base() -> Value {
    json!({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100})
}

#[test]
fn defaults_follow_transformers() {
    let c = parse(base()).unwrap();
    assert_eq!(c.n_kv_heads, 4);
    assert_eq!(c.head_dim, 16);
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert!(!c.tie_word_embeddings);
    assert_eq!(c.rope_scaling, RopeScaling::None);
    assert_eq!(c.sliding_window, None);
    assert!(c.eos_token_ids.is_empty());
}

#[test]
fn missing_key_is_named() {
    let mut v = base();
    v.as_object_mut().unwrap().remove("vocab_size");
    let err = parse(v).unwrap_err().to_string();
    assert!(
        err.contains("'vocab_size'") && err.contains("config.json"),
        "{err}"
    );
}

#[test]
fn wrong_type_is_named() {
    let mut v = base();
    v["hidden_size"] = json!("sixty-four");
    let err = parse(v).unwrap_err().to_string();
    assert!(err.contains("'hidden_size'"), "{err}");
}

#[test]
fn unknown_model_type_is_unsupported() {
    let mut v = base();
    v["model_type"] = json!("gpt_neox");
    assert!(matches!(parse(v), Err(KwkError::Unsupported(m)) if m.contains("gpt_neox")));
}

#[test]
fn llama3_rope_scaling_and_eos_list() {
    let mut v = base();
    v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    v["eos_token_id"] = json!([128001, 128008, 128009]);
    let c = parse(v).unwrap();
    assert_eq!(
        c.rope_scaling,
        RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        }
    );
    assert_eq!(c.eos_token_ids, vec![128001, 128008, 128009]);
}

#[test]
fn transformers5_rope_parameters() {
    let mut v = base();
    v["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 1e6});
    let c = parse(v.clone()).unwrap();
    assert_eq!((c.rope_theta, c.rope_scaling), (1e6, RopeScaling::None));
    v["rope_parameters"] = json!({"rope_type": "llama3", "rope_theta": 500000.0,
        "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192});
    let c = parse(v.clone()).unwrap();
    assert_eq!(c.rope_theta, 500000.0);
    assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
    v["rope_parameters"] = json!({"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0});
    assert_eq!(
        parse(v).unwrap().rope_scaling,
        RopeScaling::Other("yarn".into())
    );
}

#[test]
fn other_rope_scaling_is_kept_by_name() {
    let mut v = base();
    v["rope_scaling"] = json!({"type": "yarn", "factor": 4.0});
    assert_eq!(
        parse(v).unwrap().rope_scaling,
        RopeScaling::Other("yarn".into())
    );
}

#[test]
fn sliding_window_rules() {
    let mut v = base();
    v["model_type"] = json!("mistral");
    v["max_position_embeddings"] = json!(32768);
    v["sliding_window"] = json!(4096);
    assert_eq!(parse(v.clone()).unwrap().sliding_window, Some(4096));
    v["use_sliding_window"] = json!(false);
    assert_eq!(parse(v.clone()).unwrap().sliding_window, None);
    v["use_sliding_window"] = json!(true);
    v["sliding_window"] = json!(null);
    assert_eq!(parse(v).unwrap().sliding_window, None);
}

#[test]
fn qwen_moe_keys() {
    let mut v = base();
    v["model_type"] = json!("qwen2_moe");
    v["num_experts"] = json!(60);
    v["num_experts_per_tok"] = json!(4);
    v["moe_intermediate_size"] = json!(32);
    v["shared_expert_intermediate_size"] = json!(64);
    let c = parse(v.clone()).unwrap();
    assert_eq!((c.n_experts, c.experts_per_token), (60, 4));
    assert_eq!(
        (c.moe_intermediate_size, c.shared_expert_intermediate_size),
        (32, 64)
    );
    assert!(!c.norm_topk_prob);
    v["mlp_only_layers"] = json!([1]);
    assert!(matches!(parse(v), Err(KwkError::Unsupported(_))));

    let mut v = base();
    v["model_type"] = json!("qwen3_moe");
    v["num_experts"] = json!(8);
    v["num_experts_per_tok"] = json!(2);
    v["moe_intermediate_size"] = json!(32);
    v["head_dim"] = json!(32);
    let c = parse(v.clone()).unwrap();
    assert!(c.norm_topk_prob);
    assert_eq!(c.head_dim, 32);
    // transformers 5 writes qwen3_moe's expert count as num_local_experts.
    let count = v.as_object_mut().unwrap().remove("num_experts").unwrap();
    v["num_local_experts"] = count;
    assert_eq!(parse(v.clone()).unwrap().n_experts, 8);
    assert_eq!(c.shared_expert_intermediate_size, 0);
}

#[test]
fn kv_heads_must_divide_heads() {
    let mut v = base();
    v["num_key_value_heads"] = json!(3);
    assert!(parse(v)
        .unwrap_err()
        .to_string()
        .contains("num_key_value_heads"));
}

#[test]
fn zero_context_length_is_an_error_naming_the_key() {
    let mut v = base();
    v["max_position_embeddings"] = json!(0);
    let err = parse(v).unwrap_err().to_string();
    assert!(
        err.starts_with("config.json: config key 'max_position_embeddings' is 0; the context length bounds the KV cache"),
        "{err}"
    );
}

#[test]
fn sizes_above_the_limits_are_errors_naming_the_key() {
    for (key, value) in [
        ("hidden_size", 1usize << 21),
        ("num_hidden_layers", 5000),
        ("vocab_size", 1 << 25),
        ("intermediate_size", usize::MAX),
        ("max_position_embeddings", 1 << 28),
    ] {
        let mut v = base();
        v[key] = json!(value);
        if key == "hidden_size" {
            v["head_dim"] = json!(16);
        }
        let err = parse(v).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "config key '{key}' is {value}, more than kwk's limit"
            )),
            "{key}: {err}"
        );
    }
}

#[test]
fn products_of_sizes_are_checked() {
    // Each size within its limit, the parameter count above 2^44.
    let mut v = base();
    v["hidden_size"] = json!(1 << 20);
    v["num_attention_heads"] = json!(128);
    v["intermediate_size"] = json!(1 << 22);
    v["num_hidden_layers"] = json!(4096);
    let err = parse(v).unwrap_err().to_string();
    assert!(err.contains("imply more than 2^44 parameters"), "{err}");
    // A KV cache over the whole context above 2^56 bytes.
    let mut v = base();
    v["num_attention_heads"] = json!(4096);
    v["num_key_value_heads"] = json!(4096);
    v["head_dim"] = json!(1 << 14);
    v["max_position_embeddings"] = json!(1 << 27);
    let err = parse(v).unwrap_err().to_string();
    assert!(
        err.contains("config key 'max_position_embeddings' is 134217728: a KV cache"),
        "{err}"
    );
}

#[test]
fn an_oversized_config_json_is_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(MAX_CONFIG_JSON_BYTES + 1).unwrap();
    let err = ModelConfig::from_hf_config_json(&path)
        .unwrap_err()
        .to_string();
    assert!(err.contains("more than kwk's limit of 16 MiB"), "{err}");
}

/// The `ModelConfig` of a GGUF holding only these metadata pairs (and llama defaults).
fn gguf_config(edit: &[(&str, crate::gguf::GgufValue)]) -> Result<ModelConfig> {
    use crate::gguf::GgufValue as V;
    let mut meta: Vec<(String, V)> = vec![
        ("general.architecture".into(), V::String("llama".into())),
        ("llama.embedding_length".into(), V::U32(64)),
        ("llama.block_count".into(), V::U32(2)),
        ("llama.attention.head_count".into(), V::U32(4)),
        ("llama.attention.head_count_kv".into(), V::U32(2)),
        (
            "llama.attention.layer_norm_rms_epsilon".into(),
            V::F32(1e-5),
        ),
        ("llama.context_length".into(), V::U32(2048)),
        ("llama.feed_forward_length".into(), V::U32(128)),
        ("llama.vocab_size".into(), V::U32(100)),
    ];
    for (k, v) in edit {
        match meta.iter_mut().find(|(m, _)| m == k) {
            Some(slot) => slot.1 = v.clone(),
            None => meta.push((k.to_string(), v.clone())),
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, crate::gguf::test_writer::gguf_bytes(&meta, &[])).unwrap();
    let file = crate::gguf::GgufFile::open(&path)?;
    config_from_gguf(&file)
}

#[test]
fn gguf_sizes_are_checked_like_config_json() {
    use crate::gguf::GgufValue as V;
    assert_eq!(gguf_config(&[]).unwrap().max_position_embeddings, 2048);
    let err = gguf_config(&[("llama.context_length", V::U32(0))])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("m.gguf: metadata key 'llama.context_length' is 0; the context length bounds"),
        "{err}"
    );
    let err = gguf_config(&[("llama.block_count", V::U64(u64::MAX))])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("metadata key 'llama.block_count' is 18446744073709551615, more than kwk's limit of 4096"),
        "{err}"
    );
    let err = gguf_config(&[
        ("llama.embedding_length", V::U32(1 << 20)),
        ("llama.attention.head_count", V::U32(128)),
        ("llama.attention.head_count_kv", V::U32(128)),
        ("llama.feed_forward_length", V::U32(1 << 22)),
        ("llama.block_count", V::U32(4096)),
    ])
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("metadata key 'llama.embedding_length'"),
        "{err}"
    );
    assert!(err.contains("2^44 parameters"), "{err}");
}

/// A Gemma 3 270M `config.json` as transformers 4.5x wrote it (`rope_local_base_freq`,
/// `sliding_window_pattern`, no `layer_types`).
fn gemma3_v4() -> Value {
    json!({
        "model_type": "gemma3_text", "hidden_size": 640, "intermediate_size": 2048,
        "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 256, "vocab_size": 262144, "query_pre_attn_scalar": 256,
        "sliding_window": 512, "sliding_window_pattern": 6, "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0, "rope_scaling": null,
        "max_position_embeddings": 32768, "hidden_activation": "gelu_pytorch_tanh",
        "attn_logit_softcapping": null, "final_logit_softcapping": null
    })
}

#[test]
fn gemma3_transformers4_keys() {
    let c = parse(gemma3_v4()).unwrap();
    assert_eq!(c.architecture, Architecture::Gemma3);
    // Gemma3TextConfig ties the output by default.
    assert!(c.tie_word_embeddings);
    assert_eq!(c.sliding_window, None, "Gemma's window is per layer");
    assert_eq!(c.rope_theta, 1e6);
    let g = c.gemma3.unwrap();
    assert_eq!((g.sliding_window, g.rope_local_theta), (512, 10000.0));
    assert_eq!(g.query_pre_attn_scalar, 256.0);
    let globals: Vec<usize> = (0..18).filter(|&l| !g.sliding_layers[l]).collect();
    assert_eq!(globals, vec![5, 11, 17], "every sixth layer is global");
    // `layer_types` wins over the pattern when both are there.
    let mut v = gemma3_v4();
    let mut types = vec!["sliding_attention"; 18];
    types[0] = "full_attention";
    v["layer_types"] = json!(types);
    let g = parse(v).unwrap().gemma3.unwrap();
    assert!(!g.sliding_layers[0] && g.sliding_layers[5]);
}

#[test]
fn gemma3_refusals_name_the_key() {
    for (key, value, want) in [
        (
            "attn_logit_softcapping",
            json!(50.0),
            "attn_logit_softcapping",
        ),
        (
            "hidden_activation",
            json!("gelu"),
            "hidden_activation 'gelu'",
        ),
        (
            "use_bidirectional_attention",
            json!(true),
            "use_bidirectional_attention",
        ),
        ("layer_types", json!(["full_attention"]), "layer_types"),
        ("query_pre_attn_scalar", json!(0), "query_pre_attn_scalar"),
    ] {
        let mut v = gemma3_v4();
        v[key] = value;
        let e = parse(v).unwrap_err().to_string();
        assert!(e.contains(want), "{key}: {e}");
    }
}

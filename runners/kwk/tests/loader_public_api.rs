//! The loader's public API as other crates call it (names fixed for the harness and the
//! decoder): `kwk::model::load_model`, `kwk::gguf::GgufFile::{open, summary}`,
//! `kwk::model::safetensors_loader::load_hf_weights`, `kwk::model::gguf_loader::load_gguf`,
//! `kwk::ModelConfig::from_hf_config_json`.

use kwk_fixtures::model_dir as fixture;

#[test]
fn public_loader_api_on_the_qwen2_fixture() {
    let dir = fixture("tiny-qwen2");
    let config = kwk::ModelConfig::from_hf_config_json(&dir.join("config.json")).unwrap();
    assert_eq!(config.architecture, kwk::model::Architecture::Qwen2);
    let (weights, info) = kwk::model::safetensors_loader::load_hf_weights(&dir, &config).unwrap();
    assert_eq!(weights.layers.len(), 2);
    assert!(info.source_bytes > 0);

    let gguf = kwk::gguf::GgufFile::open(&dir.join("model.gguf")).unwrap();
    let summary = gguf.summary();
    assert_eq!(summary.architecture.as_deref(), Some("qwen2"));
    assert_eq!(summary.type_counts.get("F32"), Some(&gguf.tensors().len()));

    let (gconfig, gweights, tokenizer_meta, _) =
        kwk::model::gguf_loader::load_gguf(&dir.join("model.gguf")).unwrap();
    assert_eq!(gconfig.n_kv_heads, config.n_kv_heads);
    assert_eq!(tokenizer_meta.tokens.len(), 512);
    assert_eq!(gweights.layers[1].v_bias, weights.layers[1].v_bias);

    let model = kwk::model::load_model(dir.to_str().unwrap()).unwrap();
    assert_eq!(model.weights.layers[0].q, weights.layers[0].q);
    assert_eq!(model.info.requested, dir.to_str().unwrap());
}

//! The Hugging Face folder path: BOS/EOS policy from tokenizer_config.json, the
//! post-processor template and generation_config.json; special-token text in the input;
//! streaming decode; and the errors for broken folders and broken GGUF metadata.

mod common;

use kwk::tokenizer::{GgufTokenizerMetadata, StreamDecoder, Tokenizer};
use kwk::KwkError;
use serde_json::{json, Value};

fn fixture_tokenizer_json() -> Value {
    let path = common::fixtures_dir().join("tiny-llama/tokenizer.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// A folder with `tokenizer.json` (and optional config files) in a temp dir.
fn folder(
    tokenizer: &Value,
    config: Option<Value>,
    generation: Option<Value>,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, v: &Value| {
        std::fs::write(dir.path().join(name), serde_json::to_vec(v).unwrap()).unwrap()
    };
    write("tokenizer.json", tokenizer);
    if let Some(c) = config {
        write("tokenizer_config.json", &c);
    }
    if let Some(g) = generation {
        write("generation_config.json", &g);
    }
    dir
}

/// The fixture tokenizer.json with a post-processor template `[BOS?] $A [EOS?]`.
fn with_template(bos: Option<(&str, u32)>, eos: Option<(&str, u32)>) -> Value {
    let mut t = fixture_tokenizer_json();
    let mut single = Vec::new();
    let mut special = serde_json::Map::new();
    if let Some((text, id)) = bos {
        single.push(json!({"SpecialToken": {"id": text, "type_id": 0}}));
        special.insert(
            text.into(),
            json!({"id": text, "ids": [id], "tokens": [text]}),
        );
    }
    single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    if let Some((text, id)) = eos {
        single.push(json!({"SpecialToken": {"id": text, "type_id": 0}}));
        special.insert(
            text.into(),
            json!({"id": text, "ids": [id], "tokens": [text]}),
        );
    }
    t["post_processor"] = json!({
        "type": "TemplateProcessing",
        "single": single,
        "pair": single,
        "special_tokens": special,
    });
    t
}

#[test]
fn template_with_bos_means_add_bos_and_eos_is_never_added() {
    let t = with_template(Some(("<|im_start|>", 1)), Some(("<|im_end|>", 2)));
    let dir = folder(&t, None, None);
    let tok = Tokenizer::from_hf_folder(dir.path()).unwrap();
    assert!(tok.add_bos());
    assert_eq!(tok.bos_id(), Some(1));
    let plain = tok.encode("Hello world", false).unwrap();
    let special = tok.encode("Hello world", true).unwrap();
    assert!(!plain.is_empty() && !plain.contains(&1) && !plain.contains(&2));
    assert_eq!(special[0], 1);
    assert_eq!(
        &special[1..],
        &plain[..],
        "only a BOS is added, never the template's EOS"
    );
}

#[test]
fn template_with_only_eos_adds_nothing() {
    let t = with_template(None, Some(("<|im_end|>", 2)));
    let dir = folder(&t, None, None);
    let tok = Tokenizer::from_hf_folder(dir.path()).unwrap();
    assert!(!tok.add_bos());
    assert_eq!(
        tok.encode("Hello", true).unwrap(),
        tok.encode("Hello", false).unwrap()
    );
}

#[test]
fn tokenizer_config_add_bos_token_overrides_the_template() {
    let t = with_template(Some(("<|im_start|>", 1)), None);
    let dir = folder(
        &t,
        Some(json!({"add_bos_token": false, "bos_token": "<|im_start|>"})),
        None,
    );
    let tok = Tokenizer::from_hf_folder(dir.path()).unwrap();
    assert!(!tok.add_bos());
    assert_eq!(tok.bos_id(), Some(1));

    let t = fixture_tokenizer_json();
    let config = json!({"add_bos_token": true, "bos_token": {"content": "<|endoftext|>"}, "eos_token": "<|im_end|>"});
    let dir = folder(&t, Some(config), Some(json!({"eos_token_id": [0, 2]})));
    let tok = Tokenizer::from_hf_folder(dir.path()).unwrap();
    assert!(tok.add_bos());
    assert_eq!(tok.bos_id(), Some(0));
    assert_eq!(tok.encode("x", true).unwrap()[0], 0);
    assert_eq!(tok.eos_ids(), &[0, 2]);
    assert!(tok.is_eos(2) && tok.is_eos(0) && !tok.is_eos(1));
}

#[test]
fn special_tokens_map_names_bos_and_eos_when_tokenizer_config_does_not() {
    let dir = folder(
        &fixture_tokenizer_json(),
        Some(json!({"add_bos_token": true})),
        None,
    );
    std::fs::write(
        dir.path().join("special_tokens_map.json"),
        serde_json::to_vec(
            &json!({"bos_token": {"content": "<|im_start|>"}, "eos_token": "<|im_end|>"}),
        )
        .unwrap(),
    )
    .unwrap();
    let tok = Tokenizer::from_hf_folder(dir.path()).unwrap();
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.encode("x", true).unwrap()[0], 1);
    assert!(tok.is_eos(2));
}

#[test]
fn generation_config_eos_may_be_a_number() {
    let dir = folder(
        &fixture_tokenizer_json(),
        None,
        Some(json!({"eos_token_id": 2, "bos_token_id": 1})),
    );
    let tok = Tokenizer::from_hf_folder(dir.path()).unwrap();
    assert!(tok.is_eos(2));
    assert_eq!(tok.bos_id(), Some(1));
    assert!(!tok.add_bos());
}

#[test]
fn special_token_text_is_plain_text_but_non_special_added_tokens_match() {
    let mut t = fixture_tokenizer_json();
    t["added_tokens"].as_array_mut().unwrap().push(json!({
        "id": 512, "content": "<tool>", "single_word": false, "lstrip": false,
        "rstrip": false, "normalized": false, "special": false
    }));
    let dir = folder(&t, None, None);
    let tok = Tokenizer::from_hf_folder(dir.path()).unwrap();
    assert_eq!(tok.vocab_size(), 513);
    let ids = tok.encode("a<|im_start|>b<tool>c", false).unwrap();
    assert!(
        !ids.contains(&1),
        "control token text must be tokenized as text: {ids:?}"
    );
    assert_eq!(ids.iter().filter(|&&i| i == 512).count(), 1, "{ids:?}");
    // "<|im_start|>" as text: the same ids as the text alone.
    let alone = tok.encode("<|im_start|>", false).unwrap();
    assert!(alone.len() > 1, "{alone:?}");
    assert_eq!(tok.decode(&ids).unwrap(), "a<|im_start|>b<tool>c");
}

#[test]
fn stream_decoder_joins_multi_token_characters() {
    let tok = Tokenizer::from_hf_folder(&common::fixtures_dir().join("tiny-llama")).unwrap();
    let text = "emoji 😀 and 日本語, café\r\n";
    let ids = tok.encode(text, false).unwrap();
    let mut stream = StreamDecoder::new();
    let mut out = String::new();
    let mut partial_seen = false;
    for &id in &ids {
        let piece = stream.push(&tok, id).unwrap();
        partial_seen |= piece.is_empty();
        assert!(
            !piece.contains('\u{FFFD}'),
            "no replacement characters mid-stream"
        );
        out.push_str(&piece);
    }
    out.push_str(&stream.finish());
    assert_eq!(out, text);
    assert!(
        partial_seen,
        "the 512-token vocabulary splits some characters over tokens"
    );
    // The same through the GGUF tokenizer.
    let meta =
        common::gguf_tokenizer_metadata(&common::fixtures_dir().join("tiny-llama/model.gguf"));
    let gguf = Tokenizer::from_gguf(&meta).unwrap();
    let mut stream = StreamDecoder::new();
    let mut out = String::new();
    for &id in &ids {
        out.push_str(&stream.push(&gguf, id).unwrap());
    }
    assert_eq!(out, text);
    assert_eq!(gguf.token_to_bytes(0).unwrap(), b"<|endoftext|>");
}

fn tokenizer_error(r: kwk::Result<Tokenizer>) -> String {
    match r {
        Err(KwkError::Tokenizer(msg)) => msg,
        Err(other) => panic!("expected KwkError::Tokenizer, got {other:?}"),
        Ok(t) => panic!("expected an error, got {t:?}"),
    }
}

#[test]
fn broken_hf_folders_are_tokenizer_errors_naming_the_file() {
    let empty = tempfile::tempdir().unwrap();
    let msg = tokenizer_error(Tokenizer::from_hf_folder(empty.path()));
    assert!(msg.contains("tokenizer.json"), "{msg}");

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), b"{\"model\": ").unwrap();
    let msg = tokenizer_error(Tokenizer::from_hf_folder(dir.path()));
    assert!(
        msg.contains("tokenizer.json") && msg.contains("not valid JSON"),
        "{msg}"
    );

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tokenizer.json"),
        b"{\"model\": {\"type\": \"Nope\"}}",
    )
    .unwrap();
    let msg = tokenizer_error(Tokenizer::from_hf_folder(dir.path()));
    assert!(msg.contains("tokenizer.json"), "{msg}");

    let dir = folder(&fixture_tokenizer_json(), None, None);
    std::fs::write(dir.path().join("tokenizer_config.json"), b"not json").unwrap();
    let msg = tokenizer_error(Tokenizer::from_hf_folder(dir.path()));
    assert!(msg.contains("tokenizer_config.json"), "{msg}");

    let dir = folder(
        &fixture_tokenizer_json(),
        Some(json!({"bos_token": "<nope>"})),
        None,
    );
    let msg = tokenizer_error(Tokenizer::from_hf_folder(dir.path()));
    assert!(msg.contains("bos_token") && msg.contains("<nope>"), "{msg}");

    let dir = folder(
        &fixture_tokenizer_json(),
        Some(json!({"add_bos_token": true})),
        None,
    );
    let msg = tokenizer_error(Tokenizer::from_hf_folder(dir.path()));
    assert!(msg.contains("BOS"), "{msg}");
}

fn tiny_meta() -> GgufTokenizerMetadata {
    common::gguf_tokenizer_metadata(&common::fixtures_dir().join("tiny-llama/model.gguf"))
}

#[test]
fn broken_gguf_metadata_is_a_tokenizer_error_naming_the_key() {
    let mut m = tiny_meta();
    m.tokens.clear();
    assert!(tokenizer_error(Tokenizer::from_gguf(&m)).contains("tokenizer.ggml.tokens"));

    let mut m = tiny_meta();
    m.merges.as_mut().unwrap().push("Ġ zzzz".into());
    let msg = tokenizer_error(Tokenizer::from_gguf(&m));
    assert!(
        msg.contains("tokenizer.ggml.merges[253]") && msg.contains("zzzz"),
        "{msg}"
    );

    let mut m = tiny_meta();
    m.merges = None;
    assert!(tokenizer_error(Tokenizer::from_gguf(&m)).contains("tokenizer.ggml.merges"));

    let mut m = tiny_meta();
    m.pre = Some("mystery-pre".into());
    assert!(tokenizer_error(Tokenizer::from_gguf(&m)).contains("mystery-pre"));

    let mut m = tiny_meta();
    m.model = "t5".into();
    assert!(tokenizer_error(Tokenizer::from_gguf(&m)).contains("\"t5\""));

    let mut m = tiny_meta();
    m.bos_id = Some(100_000);
    assert!(tokenizer_error(Tokenizer::from_gguf(&m)).contains("tokenizer.ggml.bos_token_id"));

    let mut m = tiny_meta();
    m.token_types.as_mut().unwrap().truncate(3);
    assert!(tokenizer_error(Tokenizer::from_gguf(&m)).contains("tokenizer.ggml.token_type"));

    let tok = Tokenizer::from_gguf(&tiny_meta()).unwrap();
    assert!(matches!(tok.decode(&[512]), Err(KwkError::Tokenizer(_))));
    assert!(matches!(
        tok.token_to_bytes(9999),
        Err(KwkError::Tokenizer(_))
    ));
}

#[test]
fn gguf_bos_defaults_follow_llama_cpp() {
    // gpt2 + gpt-2 pre: no BOS unless tokenizer.ggml.add_bos_token says so.
    let mut m = tiny_meta();
    m.add_bos = None;
    assert!(!Tokenizer::from_gguf(&m).unwrap().add_bos());
    m.add_bos = Some(true);
    m.bos_id = Some(1);
    let tok = Tokenizer::from_gguf(&m).unwrap();
    assert!(tok.add_bos());
    assert_eq!(tok.encode("hi", true).unwrap()[0], 1);
    assert_eq!(
        tok.encode("hi", false).unwrap(),
        tok.encode("hi", true).unwrap()[1..]
    );
    // llama-bpe: BOS by default.
    m.add_bos = None;
    m.pre = Some("llama-bpe".into());
    assert!(Tokenizer::from_gguf(&m).unwrap().add_bos());
    // end of generation: the EOS plus <|endoftext|> / <|im_end|> by text.
    let tok = Tokenizer::from_gguf(&tiny_meta()).unwrap();
    assert!(tok.is_eos(0) && tok.is_eos(2) && !tok.is_eos(1));
}

#[test]
fn tokenizer_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<StreamDecoder>();
}

/// A SentencePiece-style tokenizer.json (Llama 2 / Mistral layout: "▁" for spaces via the
/// normalizer, BPE with byte fallback, decoder Replace + ByteFallback + Fuse + Strip).
fn sentencepiece_style_tokenizer_json() -> Value {
    let mut vocab = serde_json::Map::new();
    for (i, t) in ["<unk>", "<s>", "</s>", "▁", "H", "i", "Hi", "▁Hi", "!"]
        .iter()
        .enumerate()
    {
        vocab.insert(t.to_string(), json!(i));
    }
    for b in 0..=255u32 {
        vocab.insert(format!("<0x{b:02X}>"), json!(9 + b));
    }
    let special = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
        ]},
        "pre_tokenizer": null,
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": ["H i", "▁ Hi"]}
    })
}

#[test]
fn sentencepiece_style_tokenizer_json_bos_bytes_and_streaming() {
    let dir = folder(&sentencepiece_style_tokenizer_json(), None, None);
    let tok = Tokenizer::from_hf_folder(dir.path()).unwrap();
    assert!(tok.add_bos(), "the template puts <s> first");
    assert_eq!(tok.bos_id(), Some(1));
    let ids = tok.encode("Hi é!", true).unwrap();
    // <s> ▁Hi ▁ <0xC3> <0xA9> !
    assert_eq!(ids, vec![1, 7, 3, 9 + 0xC3, 9 + 0xA9, 8]);
    assert_eq!(tok.decode(&ids[1..]).unwrap(), "Hi é!");
    // Streaming keeps the space the first piece stands for (generation continues a prompt).
    let mut stream = StreamDecoder::new();
    let mut out = String::new();
    for &id in &ids[1..] {
        out.push_str(&stream.push(&tok, id).unwrap());
    }
    assert_eq!(out, " Hi é!");
    assert_eq!(tok.token_to_bytes(9 + 0xC3).unwrap(), vec![0xC3]);
    assert_eq!(tok.token_to_bytes(1).unwrap(), b"<s>");
}

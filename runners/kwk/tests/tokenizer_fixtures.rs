//! The tiny fixtures' tokenizer (byte-level BPE, GPT-2 regex, no BOS) through both paths:
//! `tokenizer.json` must reproduce golden.json's token count and first tokens of eval.txt,
//! and the same tokenizer rebuilt from each fixture's model.gguf metadata must give the
//! same ids, which must also be llama-tokenize's.

mod common;

use kwk::tokenizer::Tokenizer;

fn eval_text() -> String {
    let path = common::fixtures_dir().join("eval.txt");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    String::from_utf8(bytes).expect("eval.txt is UTF-8")
}

fn golden(name: &str) -> serde_json::Value {
    let path = common::fixtures_dir().join(name).join("golden.json");
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

#[test]
fn tokenizer_json_reproduces_golden_token_count_and_probe_tokens() {
    let text = eval_text();
    for name in ["tiny-llama", "tiny-qwen2", "tiny-mixtral"] {
        let golden = golden(name);
        let tokenizer = Tokenizer::from_hf_folder(&common::fixtures_dir().join(name)).unwrap();
        assert!(
            !tokenizer.add_bos(),
            "{name}: the fixtures' tokenizer adds no BOS"
        );
        assert_eq!(tokenizer.vocab_size(), 512);
        let ids = tokenizer.encode(&text, true).unwrap();
        assert_eq!(
            ids.len() as u64,
            golden["n_tokens"].as_u64().unwrap(),
            "{name}: n_tokens"
        );
        let probe: Vec<u32> = golden["probe_tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(&ids[..probe.len()], &probe[..], "{name}: probe_tokens");
        assert_eq!(tokenizer.decode(&ids).unwrap(), text, "{name}: decode");
    }
}

#[test]
fn gguf_metadata_gives_the_same_ids_as_tokenizer_json_and_llama_tokenize() {
    let text = eval_text();
    let probes = [
        text.as_str(),
        "Hello  world's 2024 <|im_start|>x<|endoftext|>",
        "CRLF\r\nline\r\n\r\n  spaces   ",
        "ünïcödé 😀 日本",
    ];
    for name in ["tiny-llama", "tiny-qwen2", "tiny-mixtral"] {
        let dir = common::fixtures_dir().join(name);
        let hf = Tokenizer::from_hf_folder(&dir).unwrap();
        let gguf_path = dir.join("model.gguf");
        let meta = common::gguf_tokenizer_metadata(&gguf_path);
        assert_eq!(meta.pre.as_deref(), Some("gpt-2"));
        let gguf = Tokenizer::from_gguf(&meta).unwrap();
        assert!(!gguf.add_bos());
        assert_eq!(gguf.vocab_size(), hf.vocab_size());
        for text in probes {
            let from_json = hf.encode(text, true).unwrap();
            let from_gguf = gguf.encode(text, true).unwrap();
            assert_eq!(
                from_gguf,
                from_json,
                "{name}: {:?}",
                &text[..text.len().min(40)]
            );
            let llama = common::llama_tokenize(&gguf_path, text);
            assert_eq!(
                from_gguf,
                llama,
                "{name}: llama-tokenize, {:?}",
                &text[..text.len().min(40)]
            );
        }
    }
}

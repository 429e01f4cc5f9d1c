//! Writes a GGUF file with a tokenizer and no tensors, which `llama-tokenize` loads (it
//! opens models with `vocab_only`): synthetic vocabularies and other pre-tokenizer types
//! can then be checked against llama.cpp itself. Layout per ggml docs/gguf.md (v3,
//! little-endian): magic, version, tensor count, key-value count, key-values, padding to the
//! 32-byte alignment.

use std::path::Path;

use kwk::tokenizer::GgufTokenizerMetadata;

#[derive(Default)]
struct Writer {
    buf: Vec<u8>,
    n_kv: u64,
}

impl Writer {
    fn string(&mut self, s: &str) {
        self.buf.extend((s.len() as u64).to_le_bytes());
        self.buf.extend(s.as_bytes());
    }
    fn key(&mut self, key: &str, ty: u32) {
        self.n_kv += 1;
        self.string(key);
        self.buf.extend(ty.to_le_bytes());
    }
    fn kv_u32(&mut self, key: &str, v: u32) {
        self.key(key, 4);
        self.buf.extend(v.to_le_bytes());
    }
    fn kv_f32(&mut self, key: &str, v: f32) {
        self.key(key, 6);
        self.buf.extend(v.to_le_bytes());
    }
    fn kv_bool(&mut self, key: &str, v: bool) {
        self.key(key, 7);
        self.buf.push(v as u8);
    }
    fn kv_str(&mut self, key: &str, v: &str) {
        self.key(key, 8);
        self.string(v);
    }
    fn kv_array_header(&mut self, key: &str, item_ty: u32, n: usize) {
        self.key(key, 9);
        self.buf.extend(item_ty.to_le_bytes());
        self.buf.extend((n as u64).to_le_bytes());
    }
    fn kv_strs(&mut self, key: &str, v: &[String]) {
        self.kv_array_header(key, 8, v.len());
        for s in v {
            self.string(s);
        }
    }
    fn kv_f32s(&mut self, key: &str, v: &[f32]) {
        self.kv_array_header(key, 6, v.len());
        for x in v {
            self.buf.extend(x.to_le_bytes());
        }
    }
    fn kv_i32s(&mut self, key: &str, v: &[i32]) {
        self.kv_array_header(key, 5, v.len());
        for x in v {
            self.buf.extend(x.to_le_bytes());
        }
    }
}

/// Writes `meta` as the tokenizer of a tensorless `llama`-architecture GGUF at `path`.
pub fn write(path: &Path, meta: &GgufTokenizerMetadata) {
    let mut w = Writer::default();
    w.kv_str("general.architecture", "llama");
    // Hyper-parameters llama.cpp reads before the vocabulary (values are irrelevant here).
    w.kv_u32("llama.context_length", 64);
    w.kv_u32("llama.embedding_length", 8);
    w.kv_u32("llama.block_count", 1);
    w.kv_u32("llama.feed_forward_length", 8);
    w.kv_u32("llama.attention.head_count", 1);
    w.kv_u32("llama.attention.head_count_kv", 1);
    w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5);
    w.kv_str("tokenizer.ggml.model", &meta.model);
    if let Some(pre) = &meta.pre {
        w.kv_str("tokenizer.ggml.pre", pre);
    }
    w.kv_strs("tokenizer.ggml.tokens", &meta.tokens);
    if let Some(scores) = &meta.scores {
        w.kv_f32s("tokenizer.ggml.scores", scores);
    }
    if let Some(types) = &meta.token_types {
        w.kv_i32s("tokenizer.ggml.token_type", types);
    }
    if let Some(merges) = &meta.merges {
        w.kv_strs("tokenizer.ggml.merges", merges);
    }
    let ids = [
        ("tokenizer.ggml.bos_token_id", meta.bos_id),
        ("tokenizer.ggml.eos_token_id", meta.eos_id),
        ("tokenizer.ggml.unknown_token_id", meta.unk_id),
        ("tokenizer.ggml.padding_token_id", meta.pad_id),
    ];
    for (key, id) in ids {
        if let Some(id) = id {
            w.kv_u32(key, id);
        }
    }
    let flags = [
        ("tokenizer.ggml.add_bos_token", meta.add_bos),
        ("tokenizer.ggml.add_eos_token", meta.add_eos),
        ("tokenizer.ggml.add_space_prefix", meta.add_space_prefix),
    ];
    for (key, flag) in flags {
        if let Some(flag) = flag {
            w.kv_bool(key, flag);
        }
    }
    let mut file = Vec::with_capacity(w.buf.len() + 64);
    file.extend(b"GGUF");
    file.extend(3u32.to_le_bytes());
    file.extend(0u64.to_le_bytes());
    file.extend(w.n_kv.to_le_bytes());
    file.extend(&w.buf);
    while file.len() % 32 != 0 {
        file.push(0);
    }
    std::fs::write(path, file).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

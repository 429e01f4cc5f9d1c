//! Keeps docs/bad-inputs.md true: for every row of its table this test builds the bad
//! input the row describes (from the fixture models), loads it with `kwk::load_model` (what
//! `kwk-eval --llm` and `generate --llm` call) and checks that the error is exactly the
//! row's message, with `{file}` / `{dir}` standing for the bad file / model folder. Every
//! row needs a builder here and every builder a row.
//!
//! `KWK_BAD_INPUTS_PRINT=1 cargo test -p kwk --test bad_inputs -- --nocapture` prints the
//! current messages (for updating the table after a deliberate wording change).

#[path = "common/doc_table.rs"]
mod doc_table;

use std::path::{Path, PathBuf};

fn table_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/bad-inputs.md")
}

/// `(id, message)` of every row of the loader's table (the sections after the first `## `
/// hold kwk-eval's own messages).
fn table_rows() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(table_path()).unwrap();
    doc_table::table_rows(text.lines().take_while(|l| !l.starts_with("## ")))
}

fn fixture(name: &str) -> PathBuf {
    kwk_fixtures::model_dir(name)
}

/// A copy of a fixture folder (config.json, model.safetensors, tokenizer.json, model.gguf).
fn copy_fixture(name: &str, into: &Path) -> PathBuf {
    let dir = into.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "model.gguf",
    ] {
        std::fs::copy(fixture(name).join(f), dir.join(f)).unwrap();
    }
    dir
}

/// Overwrites the value of GGUF metadata key `key` (an integer of its stored width).
fn patch_gguf_int(bytes: &mut [u8], key: &str, value: u64) {
    let mut pat = (key.len() as u64).to_le_bytes().to_vec();
    pat.extend(key.as_bytes());
    let at = bytes
        .windows(pat.len())
        .position(|w| w == pat)
        .unwrap_or_else(|| panic!("no key {key}"))
        + pat.len();
    let ty = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let width = match ty {
        0 | 1 => 1,
        2 | 3 => 2,
        4 | 5 => 4,
        10 | 11 => 8,
        _ => panic!("{key} has type {ty}"),
    };
    bytes[at + 4..at + 4 + width].copy_from_slice(&value.to_le_bytes()[..width]);
}

/// Replaces `path` with a named pipe (no writer: opening it would block).
fn make_fifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

/// Builds the bad input of row `id` under `tmp`; returns the `--llm` value and the paths
/// `{file}` and `{dir}` stand for.
fn build(id: &str, tmp: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let dir = copy_fixture("tiny-llama", tmp);
    let gguf = dir.join("model.gguf");
    let config = dir.join("config.json");
    let st = dir.join("model.safetensors");
    let tok = dir.join("tokenizer.json");
    let good = std::fs::read(&gguf).unwrap();
    let write_gguf = |bytes: &[u8]| {
        std::fs::write(&gguf, bytes).unwrap();
        (gguf.clone(), gguf.clone(), dir.clone())
    };
    let folder = |file: &Path| (dir.clone(), file.to_path_buf(), dir.clone());
    match id {
        "missing-path" => {
            let p = tmp.join("no-such-model.gguf");
            (p.clone(), p, dir.clone())
        }
        "llm-named-pipe" => {
            let p = tmp.join("pipe.gguf");
            make_fifo(&p);
            (p.clone(), p, dir.clone())
        }
        "llm-device" => {
            let p = PathBuf::from("/dev/zero");
            (p.clone(), p, dir.clone())
        }
        "gguf-not-gguf" => write_gguf(b"hello, this is text\n"),
        "gguf-empty" => write_gguf(b""),
        "gguf-version-1" => {
            let mut b = good.clone();
            b[4..8].copy_from_slice(&1u32.to_le_bytes());
            write_gguf(&b)
        }
        "gguf-big-endian" => {
            let mut b = good.clone();
            b[4..8].copy_from_slice(&3u32.to_be_bytes());
            write_gguf(&b)
        }
        "gguf-truncated-header" => write_gguf(&good[..1000]),
        "gguf-truncated-data" => write_gguf(&good[..good.len() - 100]),
        "gguf-huge-kv-count" => {
            let mut b = good.clone();
            b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
            write_gguf(&b)
        }
        "gguf-huge-string" => {
            let mut b = good.clone();
            b[24..32].copy_from_slice(&(1u64 << 62).to_le_bytes());
            write_gguf(&b)
        }
        "gguf-context-length-0" => {
            let mut b = good.clone();
            patch_gguf_int(&mut b, "llama.context_length", 0);
            write_gguf(&b)
        }
        "gguf-block-count-huge" => {
            let mut b = good.clone();
            patch_gguf_int(&mut b, "llama.block_count", 1 << 20);
            write_gguf(&b)
        }
        "gguf-params-overflow" => {
            let mut b = good.clone();
            patch_gguf_int(&mut b, "llama.embedding_length", 1 << 20);
            patch_gguf_int(&mut b, "llama.attention.head_count", 4096);
            patch_gguf_int(&mut b, "llama.attention.head_count_kv", 4096);
            patch_gguf_int(&mut b, "llama.feed_forward_length", 1 << 22);
            patch_gguf_int(&mut b, "llama.block_count", 4096);
            patch_gguf_int(&mut b, "llama.rope.dimension_count", 256);
            write_gguf(&b)
        }
        "gguf-wrong-shape" => {
            let mut b = good.clone();
            patch_gguf_int(&mut b, "llama.feed_forward_length", 96);
            write_gguf(&b)
        }
        "gguf-unknown-architecture" => {
            let mut b = good.clone();
            let at = b.windows(5).position(|w| w == b"llama").unwrap();
            // general.architecture's value "llama" becomes "lxama".
            b[at + 1] = b'x';
            write_gguf(&b)
        }
        "gguf-tensor-offset" => {
            let f = kwk::gguf::GgufFile::open(&gguf).unwrap();
            let second = &f.tensors()[1];
            let mut pat = (second.name.len() as u64).to_le_bytes().to_vec();
            pat.extend(second.name.as_bytes());
            let at = good.windows(pat.len()).position(|w| w == pat).unwrap() + pat.len();
            let offset_at = at + 4 + 8 * second.dims.len() + 4;
            let mut b = good.clone();
            b[offset_at..offset_at + 8].copy_from_slice(&0u64.to_le_bytes());
            write_gguf(&b)
        }
        "config-missing" => {
            std::fs::remove_file(&config).unwrap();
            folder(&config)
        }
        "config-not-json" => {
            std::fs::write(&config, "{\"model_type\": \"llama\",").unwrap();
            folder(&config)
        }
        "config-missing-key" => {
            edit_json(&config, |v| {
                v.as_object_mut().unwrap().remove("hidden_size");
            });
            folder(&config)
        }
        "config-wrong-type" => {
            edit_json(&config, |v| v["num_hidden_layers"] = "two".into());
            folder(&config)
        }
        "config-unknown-model-type" => {
            edit_json(&config, |v| v["model_type"] = "gpt2".into());
            folder(&config)
        }
        "config-max-positions-0" => {
            edit_json(&config, |v| v["max_position_embeddings"] = 0.into());
            folder(&config)
        }
        "config-size-huge" => {
            edit_json(&config, |v| v["vocab_size"] = (1u64 << 40).into());
            folder(&config)
        }
        "config-too-big" => {
            let f = std::fs::File::create(&config).unwrap();
            f.set_len((16 << 20) + 1).unwrap();
            folder(&config)
        }
        "config-named-pipe" => {
            make_fifo(&config);
            folder(&config)
        }
        "safetensors-missing" => {
            std::fs::remove_file(&st).unwrap();
            folder(&dir)
        }
        "safetensors-shard-missing" => {
            // Two shards in the index; the second was never downloaded.
            let first = dir.join("model-00001-of-00002.safetensors");
            std::fs::rename(&st, &first).unwrap();
            let index = dir.join("model.safetensors.index.json");
            let header = {
                let b = std::fs::read(&first).unwrap();
                let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
                serde_json::from_slice::<serde_json::Value>(&b[8..8 + n]).unwrap()
            };
            let mut names: Vec<&String> = header
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| *k != "__metadata__")
                .collect();
            names.sort();
            let last = names.pop().unwrap();
            let mut map = serde_json::Map::new();
            for n in names {
                map.insert(n.clone(), "model-00001-of-00002.safetensors".into());
            }
            map.insert(last.clone(), "model-00002-of-00002.safetensors".into());
            let v = serde_json::json!({"metadata": {}, "weight_map": map});
            std::fs::write(&index, serde_json::to_vec(&v).unwrap()).unwrap();
            folder(&index)
        }
        "safetensors-bad-header" => {
            let mut b = std::fs::read(&st).unwrap();
            b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
            std::fs::write(&st, b).unwrap();
            folder(&st)
        }
        "safetensors-truncated" => {
            let b = std::fs::read(&st).unwrap();
            std::fs::write(&st, &b[..b.len() - 4]).unwrap();
            folder(&st)
        }
        "safetensors-wrong-shape" => {
            edit_json(&config, |v| v["intermediate_size"] = 96.into());
            folder(&st)
        }
        "tokenizer-json-missing" => {
            std::fs::remove_file(&tok).unwrap();
            folder(&tok)
        }
        "tokenizer-json-named-pipe" => {
            make_fifo(&tok);
            folder(&tok)
        }
        "tokenizer-beyond-embedding" => {
            // Another model's tokenizer: one id more than the 512 embedding rows.
            edit_json(&tok, |v| {
                let added = v["added_tokens"].as_array_mut().unwrap();
                let mut extra = added[0].clone();
                extra["id"] = 512.into();
                extra["content"] = "<|another-model|>".into();
                added.push(extra);
            });
            folder(&tok)
        }
        "tokenizer-json-not-json" => {
            std::fs::write(&tok, "{\"model\": ").unwrap();
            folder(&tok)
        }
        other => panic!("no builder for row {other}"),
    }
}

const BUILDERS: &[&str] = &[
    "missing-path",
    "llm-named-pipe",
    "llm-device",
    "gguf-not-gguf",
    "gguf-empty",
    "gguf-version-1",
    "gguf-big-endian",
    "gguf-truncated-header",
    "gguf-truncated-data",
    "gguf-huge-kv-count",
    "gguf-huge-string",
    "gguf-context-length-0",
    "gguf-block-count-huge",
    "gguf-params-overflow",
    "gguf-wrong-shape",
    "gguf-unknown-architecture",
    "gguf-tensor-offset",
    "config-missing",
    "config-not-json",
    "config-missing-key",
    "config-wrong-type",
    "config-unknown-model-type",
    "config-max-positions-0",
    "config-size-huge",
    "config-too-big",
    "config-named-pipe",
    "safetensors-missing",
    "safetensors-shard-missing",
    "safetensors-bad-header",
    "safetensors-truncated",
    "safetensors-wrong-shape",
    "tokenizer-json-missing",
    "tokenizer-json-named-pipe",
    "tokenizer-beyond-embedding",
    "tokenizer-json-not-json",
];

/// The message loading the bad input of `id` gives, with the paths replaced by `{file}`
/// and `{dir}`.
fn message(id: &str) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let (llm, file, dir) = build(id, tmp.path());
    let err = match kwk::load_model(&llm.display().to_string()) {
        Ok(_) => panic!("{id}: the bad input loaded"),
        Err(e) => e.to_string(),
    };
    assert_eq!(err.lines().count(), 1, "{id}: not one line: {err}");
    let err = if file != dir {
        err.replace(&file.display().to_string(), "{file}")
    } else {
        err
    };
    err.replace(&dir.display().to_string(), "{dir}")
}

#[test]
fn every_row_of_docs_bad_inputs_md_is_the_message_given() {
    let rows = table_rows();
    let print = std::env::var_os("KWK_BAD_INPUTS_PRINT").is_some();
    if print {
        for id in BUILDERS {
            println!("| `{id}` | | `{}` |", message(id));
        }
        return;
    }
    let ids: Vec<&str> = rows.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        ids, BUILDERS,
        "the table's rows and this test's builders differ"
    );
    let mut wrong = Vec::new();
    for (id, want) in &rows {
        let got = message(id);
        if &got != want {
            wrong.push(format!("{id}:\n  table: {want}\n  given: {got}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

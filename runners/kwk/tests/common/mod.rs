//! Shared helpers of the tokenizer integration tests: where the model, the text, the
//! fixtures and llama.cpp's `llama-tokenize` are, and running `llama-tokenize`.
#![allow(dead_code)]

pub mod vocab_only_gguf;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `tokenizer.ggml.*` metadata of a GGUF file, through kwk's GGUF reader and loader.
pub fn gguf_tokenizer_metadata(path: &Path) -> kwk::tokenizer::GgufTokenizerMetadata {
    let file =
        kwk::gguf::GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    kwk::model::gguf_loader::tokenizer_metadata_from_gguf(&file)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn models_dir() -> PathBuf {
    match std::env::var_os("KWK_MODELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/kwk/models")
        }
    }
}

/// The SmolLM2-135M-Instruct GGUF the protocol uses; panics naming the set-up script when
/// it is missing (a test that needs it must not pass silently).
pub fn smollm2_gguf() -> PathBuf {
    let path = models_dir().join("SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/setup-model.sh (or set KWK_MODELS_DIR)",
        path.display()
    );
    path
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `shared/fixtures`: `KWK_FIXTURES_DIR` if set, else the first ancestor of the crate
/// holding `shared/fixtures` (`../shared` of the repository root for the main checkout,
/// further up for worktrees).
pub fn fixtures_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("KWK_FIXTURES_DIR") {
        return PathBuf::from(d);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|a| a.join("shared/fixtures"))
        .find(|p| p.is_dir())
        .expect("shared/fixtures not found above the crate; set KWK_FIXTURES_DIR")
}

/// wiki.test.raw, committed under datasets/ of the repository.
pub fn wiki_test_raw() -> PathBuf {
    let path = repo_root().join("datasets/wikitext-2-raw/wiki.test.raw");
    assert!(
        path.is_file(),
        "{} is missing (scripts/fetch-wikitext.py fetches it; see datasets/README.md)",
        path.display()
    );
    path
}

/// The text llama-perplexity evaluates: the file's bytes with exactly one trailing "\n"
/// removed (common/arg.cpp, `-f`).
pub fn perplexity_text(path: &Path) -> String {
    let mut bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
    }
    String::from_utf8(bytes).unwrap_or_else(|e| panic!("{}: not UTF-8: {e}", path.display()))
}

pub fn llama_tokenize_bin() -> PathBuf {
    let dir = match std::env::var_os("KWK_LLAMA_CPP_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
            .join(".cache/kwk/llama.cpp-0.3.36/build/bin"),
    };
    let bin = dir.join("llama-tokenize");
    assert!(
        bin.is_file(),
        "{} is missing: run scripts/setup-llama-cpp.sh (or set KWK_LLAMA_CPP_DIR to its build/bin)",
        bin.display()
    );
    bin
}

/// llama.cpp's ids for `text` with `add_special = true` (a BOS when the model adds one)
/// and `parse_special = false`, as llama-perplexity tokenizes. llama-tokenize reads `-f`
/// verbatim (tools/tokenize/tokenize.cpp), so the text goes through a file of exactly its
/// bytes, with escape processing off.
pub fn llama_tokenize(model: &Path, text: &str) -> Vec<u32> {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, text.as_bytes()).expect("write prompt");
    let output = Command::new(llama_tokenize_bin())
        .arg("-m")
        .arg(model)
        .arg("-f")
        .arg(&file)
        .args([
            "--ids",
            "--log-disable",
            "--no-escape",
            "--no-parse-special",
        ])
        .output()
        .expect("run llama-tokenize");
    assert!(
        output.status.success(),
        "llama-tokenize failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).expect("llama-tokenize prints ASCII");
    let list = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('['))
        .unwrap_or_else(|| panic!("no id list in llama-tokenize output: {stdout}"));
    let inner = list.trim().trim_start_matches('[').trim_end_matches(']');
    if inner.trim().is_empty() {
        return Vec::new();
    }
    inner
        .split(',')
        .map(|s| {
            s.trim()
                .parse::<u32>()
                .unwrap_or_else(|e| panic!("bad id {s:?}: {e}"))
        })
        .collect()
}

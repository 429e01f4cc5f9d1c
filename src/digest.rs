//! The one hex digest the harness writes (texts, token ids, names): SHA-256, lower-case
//! hex, and a model's content digest. A leaf: it imports nothing from the crate.

use anyhow::Context;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of the file at `path`, streamed.
pub fn file_sha256(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// SHA-256 over a model's content: the file itself, or the weight, config and tokenizer
/// files of a folder (sorted by name, each name hashed before its bytes).
pub fn model_sha256(path: &Path) -> anyhow::Result<String> {
    let mut files = Vec::new();
    if path.is_dir() {
        for e in std::fs::read_dir(path).with_context(|| format!("listing '{}'", path.display()))? {
            let p = e?.path();
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let wanted = [".safetensors", ".json", ".gguf", ".model"]
                .iter()
                .any(|x| name.ends_with(x));
            if p.is_file() && wanted && !name.starts_with('.') {
                files.push(p);
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    for f in &files {
        h.update(
            f.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        let mut r = std::fs::File::open(f).with_context(|| format!("hashing '{}'", f.display()))?;
        loop {
            let n = r
                .read(&mut buf)
                .with_context(|| format!("hashing '{}'", f.display()))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

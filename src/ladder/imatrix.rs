//! The ladder's importance matrices: llama-imatrix on the calibration text over the F32
//! base (mainline's GGUF format), and the same matrix in the legacy format ik_llama.cpp's
//! llama-quantize reads, both cached like the GGUFs.

use super::cache::{self, GgufCache, Record};
use super::{keep_log, tool_err, tool_identity, MakeSettings};
use crate::text::EvalText;
use crate::ui::Reporter;
use anyhow::{anyhow, Context, Result};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The importance matrix of the calibration text on the F32 base: its path and SHA-256.
pub(super) fn make_imatrix(
    cache: &GgufCache,
    base: &cache::Entry,
    base_key: &str,
    calib: &EvalText,
    settings: &MakeSettings,
    timeout: Duration,
    ui: &dyn Reporter,
) -> Result<(PathBuf, String)> {
    let window = kwk::decoder::CALIBRATION_WINDOW;
    let chunks = kwk::decoder::CALIBRATION_TOKENS / window;
    let imatrix_tool = settings
        .tools
        .imatrix_path()
        .ok_or_else(|| anyhow!("llama-imatrix not found"))?;
    let key = cache::key(&[
        ("kind", "imatrix"),
        ("base", base_key),
        ("tool", &tool_identity(imatrix_tool)?),
        ("text", &calib.sha256),
        ("ctx", &window.to_string()),
        ("chunks", &chunks.to_string()),
    ]);
    let entry = match cache.lookup(&key, "imatrix") {
        Some(e) => {
            ui.line(&format!(
                "ladder: importance matrix of '{}' reused from the cache",
                calib.name
            ));
            e
        }
        None => {
            ui.line(&format!(
                "ladder: llama-imatrix on '{}' ({chunks} chunks of {window} tokens, as kwk calibrates) ...",
                calib.name
            ));
            // The text as hashed, from this run's copy (the file may change meanwhile).
            let copy = tempfile::Builder::new()
                .prefix("kwk-imatrix-text-")
                .suffix(".txt")
                .tempfile()
                .context("creating a temporary copy of --calib-text")?;
            let mut bytes = calib.text.clone().into_bytes();
            if calib.trailing_newline {
                bytes.push(b'\n');
            }
            std::fs::write(copy.path(), &bytes).context("writing the --calib-text copy")?;
            let e = cache.store(&key, "imatrix", |tmp| {
                let start = Instant::now();
                // llama-imatrix picks its output format by the name's extension.
                let out_gguf = tmp.with_extension("gguf");
                let req = llamacpp::ImatrixRequest {
                    model: base.path.clone(),
                    text: copy.path().to_path_buf(),
                    output: out_gguf.clone(),
                    ctx: window,
                    chunks,
                    threads: settings.threads,
                    timeout,
                };
                let run = llamacpp::run_imatrix(settings.tools, &req);
                let run = match run {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = std::fs::remove_file(&out_gguf);
                        return Err(tool_err(e));
                    }
                };
                std::fs::rename(&out_gguf, tmp)
                    .with_context(|| format!("moving '{}'", out_gguf.display()))?;
                Ok(Record {
                    kind: "imatrix".into(),
                    what: calib.name.clone(),
                    inputs: vec![
                        ("base".into(), base.path.display().to_string()),
                        ("text_sha256".into(), calib.sha256.clone()),
                        ("command".into(), run.command.clone()),
                    ],
                    bytes: 0,
                    make_s: start.elapsed().as_secs_f64(),
                    made_utc: crate::machine::utc_now().0,
                    log: keep_log(&run.text),
                })
            })?;
            ui.line(&format!(
                "ladder: importance matrix made in {:.1} s",
                e.record.make_s
            ));
            e
        }
    };
    hashed(entry)
}

/// The importance matrix `gguf` (its path and SHA-256, from [`make_imatrix`]) in the legacy
/// binary format ik_llama.cpp's llama-quantize reads, converted by mainline's llama-imatrix
/// and cached under the GGUF matrix's hash: the same sums, so both engines' `+imatrix` rows
/// are made from one matrix. Its path and SHA-256.
pub(super) fn legacy_copy(
    cache: &GgufCache,
    base: &cache::Entry,
    gguf: &(PathBuf, String),
    settings: &MakeSettings,
    timeout: Duration,
    ui: &dyn Reporter,
) -> Result<(PathBuf, String)> {
    let key = cache::key(&[("kind", "imatrix-legacy"), ("from", &gguf.1)]);
    let entry = match cache.lookup(&key, "imatrix") {
        Some(e) => e,
        None => {
            let e = cache.store(&key, "imatrix", |tmp| {
                let start = Instant::now();
                // llama-imatrix warns about a GGUF matrix without the suffix, not a legacy one.
                let out_dat = tmp.with_extension("dat");
                let run = llamacpp::run_imatrix_to_legacy(
                    settings.tools,
                    &base.path,
                    &gguf.0,
                    &out_dat,
                    timeout,
                );
                let run = match run {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = std::fs::remove_file(&out_dat);
                        return Err(tool_err(e));
                    }
                };
                std::fs::rename(&out_dat, tmp)
                    .with_context(|| format!("moving '{}'", out_dat.display()))?;
                Ok(Record {
                    kind: "imatrix".into(),
                    what: "legacy format (for ik_llama.cpp)".into(),
                    inputs: vec![
                        ("from".into(), gguf.0.display().to_string()),
                        ("from_sha256".into(), gguf.1.clone()),
                        ("command".into(), run.command.clone()),
                    ],
                    bytes: 0,
                    make_s: start.elapsed().as_secs_f64(),
                    made_utc: crate::machine::utc_now().0,
                    log: keep_log(&run.text),
                })
            })?;
            ui.line(&format!(
                "ladder: importance matrix rewritten in the legacy format ik_llama.cpp reads in {:.1} s",
                e.record.make_s
            ));
            e
        }
    };
    hashed(entry)
}

/// A cached matrix's path and SHA-256 (the key of the types made with it).
fn hashed(entry: cache::Entry) -> Result<(PathBuf, String)> {
    let sha = crate::digest::file_sha256(&entry.path)
        .with_context(|| format!("hashing '{}'", entry.path.display()))?;
    Ok((entry.path, sha))
}

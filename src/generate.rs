//! `kwk-eval generate`: load a model, pack it in one format, and stream a completion of a
//! prompt to stdout, then print prompt and generation speed (tokens/s) on stderr.

use anyhow::{Context, Result};
use kwk::{DecoderOptions, KwkDecoder, Precision, Sampling};
use std::io::Write;

#[derive(Debug, Clone)]
pub struct GenerateConfig {
    pub llm: String,
    pub prompt: String,
    pub max_new_tokens: usize,
    pub format: String,
    pub threads: usize,
    pub sampling: Sampling,
    pub pack_cache_dir: Option<std::path::PathBuf>,
}

/// The new text after `printed` bytes, held back while it ends in an incomplete UTF-8
/// sequence (decoded as U+FFFD) so a multi-byte character is printed whole.
fn new_suffix(full: &str, printed: usize) -> Option<&str> {
    if full.len() <= printed || full.ends_with('\u{FFFD}') || !full.is_char_boundary(printed) {
        return None;
    }
    Some(&full[printed..])
}

pub fn generate(cfg: &GenerateConfig) -> Result<()> {
    anyhow::ensure!(cfg.threads >= 1, "--threads 0: pass at least 1 thread");
    anyhow::ensure!(
        !cfg.prompt.is_empty(),
        "--prompt is empty; pass the text to continue"
    );
    let precision = Precision::parse(&cfg.format).map_err(|e| {
        anyhow::anyhow!(
            "unknown --format '{}' ({e}); known formats: {}",
            cfg.format,
            crate::protocol::KNOWN_FORMATS.trim_end_matches(", and gguf:PATH")
        )
    })?;
    let model =
        kwk::load_model(&cfg.llm).with_context(|| format!("loading --llm '{}'", cfg.llm))?;
    let prompt = model
        .tokenizer
        .encode(&cfg.prompt, true)
        .context("tokenizing --prompt")?;
    let mut decoder = KwkDecoder::new(
        &model,
        DecoderOptions {
            max_cache_len: prompt.len() + cfg.max_new_tokens,
            precision,
            threads: cfg.threads,
            calibration_tokens: None,
            pack_cache_dir: cfg.pack_cache_dir.clone(),
        },
    )
    .with_context(|| format!("packing '{}' as {}", cfg.llm, cfg.format))?;
    let mut out = std::io::stdout().lock();
    write!(out, "{}", cfg.prompt)?;
    out.flush()?;
    let mut generated: Vec<u32> = Vec::new();
    let mut printed = 0usize;
    let mut failure: Option<anyhow::Error> = None;
    let stats = decoder.generate(&prompt, cfg.max_new_tokens, &cfg.sampling, &mut |tok| {
        generated.push(tok);
        let text = match model.tokenizer.decode(&generated) {
            Ok(t) => t,
            Err(e) => {
                failure = Some(anyhow::Error::new(e).context("decoding generated tokens"));
                return false;
            }
        };
        if let Some(s) = new_suffix(&text, printed) {
            if let Err(e) = out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
                failure = Some(anyhow::Error::new(e).context("writing to stdout"));
                return false;
            }
            printed = text.len();
        }
        true
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    // Whatever was held back (an incomplete character at the very end).
    let text = model.tokenizer.decode(&generated)?;
    if text.len() > printed && text.is_char_boundary(printed) {
        write!(out, "{}", &text[printed..])?;
    }
    writeln!(out)?;
    let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { f64::NAN };
    eprintln!(
        "prompt: {} tokens in {:.3} s ({:.1} tokens/s); generation: {} tokens in {:.3} s ({:.1} tokens/s); format {}, {} threads",
        stats.prompt_tokens,
        stats.prompt_s,
        rate(stats.prompt_tokens, stats.prompt_s),
        stats.generated_tokens,
        stats.generate_s,
        rate(stats.generated_tokens, stats.generate_s),
        cfg.format,
        cfg.threads
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_whole_characters_only() {
        assert_eq!(new_suffix("hello", 2), Some("llo"));
        assert_eq!(new_suffix("he\u{FFFD}", 2), None);
        assert_eq!(new_suffix("hé", 2), None, "not a char boundary");
        assert_eq!(new_suffix("hé", 3), None, "nothing new");
        assert_eq!(new_suffix("hé!", 3), Some("!"));
    }
}

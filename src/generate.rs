//! `kwk-eval generate`: load a model, pack it in one format, and stream a completion of a
//! prompt to stdout, then print prompt and generation speed (tokens/s) on stderr.

use crate::ui::Reporter;
use anyhow::{Context, Result};
use kwk::{DecoderOptions, KwkDecoder, Precision, Sampling};
use std::io::Write;

#[derive(Debug, Clone)]
pub struct GenerateConfig {
    pub llm: String,
    pub prompt: String,
    pub max_new_tokens: usize,
    pub format: String,
    /// `--kv`: the KV cache's precision.
    pub kv: kwk::KvPrecision,
    pub threads: usize,
    pub sampling: Sampling,
    /// `--pack-cache` as given (the default folder when `None`).
    pub pack_cache: Option<std::path::PathBuf>,
    /// `--no-pack-cache`.
    pub no_pack_cache: bool,
}

/// Largest `--temperature` (higher only flattens the distribution further).
pub const MAX_TEMPERATURE: f32 = 100.0;

/// The generated text as it streams: each token's bytes are decoded once, as they arrive
/// (`kwk::tokenizer::StreamDecoder`: linear in the output, unlike re-decoding everything
/// generated at each step), and a UTF-8 character split over several tokens is printed
/// whole once its last byte arrives. The printed text is the concatenation of the tokens'
/// pieces, so a SentencePiece model keeps the space before the first generated word.
struct Streamer<W: Write> {
    decoder: kwk::tokenizer::StreamDecoder,
    out: W,
    /// Set when stdout was closed (`| head`): nothing more is written.
    closed: bool,
}

impl<W: Write> Streamer<W> {
    fn new(out: W) -> Self {
        Streamer {
            decoder: kwk::tokenizer::StreamDecoder::new(),
            out,
            closed: false,
        }
    }

    fn write(&mut self, text: &str) -> Result<()> {
        if self.closed || text.is_empty() {
            return Ok(());
        }
        match self
            .out
            .write_all(text.as_bytes())
            .and_then(|()| self.out.flush())
        {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            r => r.context("writing to stdout"),
        }
    }

    /// Adds one generated token; prints the text it completes.
    fn push(&mut self, tokenizer: &kwk::tokenizer::Tokenizer, id: u32) -> Result<()> {
        let text = self
            .decoder
            .push(tokenizer, id)
            .context("decoding generated tokens")?;
        self.write(&text)
    }

    /// Prints whatever was held back (an incomplete character at the very end, as U+FFFD).
    fn finish(&mut self) -> Result<()> {
        let rest = self.decoder.finish();
        self.write(&rest)
    }
}

/// Every flag checked before the model loads; the format parsed.
fn check_flags(cfg: &GenerateConfig) -> Result<Precision> {
    // A forced kernel tier this CPU cannot run (or a misspelt one) is refused as kwk-eval
    // refuses it, not warned about and replaced by another tier.
    kwk::kernels::check_isa_env().map_err(anyhow::Error::msg)?;
    crate::limits::check_threads(cfg.threads)?;
    crate::limits::check_range(
        "--max-new-tokens",
        cfg.max_new_tokens,
        1,
        crate::limits::MAX_TOKENS,
        "new tokens",
    )?;
    let s = &cfg.sampling;
    anyhow::ensure!(
        s.temperature.is_finite() && (0.0..=MAX_TEMPERATURE).contains(&s.temperature),
        "--temperature {} is out of range: pass 0 (greedy) to {MAX_TEMPERATURE}",
        s.temperature
    );
    anyhow::ensure!(
        s.top_p.is_finite() && (0.0..=1.0).contains(&s.top_p),
        "--top-p {} is out of range: pass 0 to 1 (0 and 1 keep every token)",
        s.top_p
    );
    anyhow::ensure!(
        !cfg.prompt.is_empty(),
        "--prompt is empty; pass the text to continue"
    );
    Precision::parse(&cfg.format).map_err(|e| anyhow::anyhow!("--format: {e}"))
}

/// What the pack cache did, in words.
fn pack_outcome_line(o: &kwk::pack_cache::PackOutcome) -> String {
    use kwk::pack_cache::PackOutcome::*;
    match o {
        NoCache => "not used".into(),
        Loaded(p) => format!("mapped every tensor from '{}'", p.display()),
        Written(p) => format!("packed and kept in '{}'", p.display()),
        Updated {
            path,
            reused,
            repacked,
        } => format!(
            "'{}' updated: {reused} tensors reused, {repacked} packed again",
            path.display()
        ),
        NotWritten(why) => format!("packed, not kept ({why})"),
        NotKept { path, bytes, limit } => format!(
            "packed, not kept: {} MB is over the cache limit of {} MB ('{}')",
            bytes / 1_000_000,
            limit / 1_000_000,
            path.display()
        ),
    }
}

/// `kwk-eval generate`: loads (or maps from the pack cache) the model in `--format`, then
/// streams the prompt and each new token to stdout, with the speeds on stderr.
pub fn generate(cfg: &GenerateConfig, ui: &dyn Reporter) -> Result<()> {
    let started = std::time::Instant::now();
    let pack_cache_dir =
        crate::cache_dir::pack_cache(cfg.pack_cache.clone(), cfg.no_pack_cache, ui);
    let precision = check_flags(cfg)?;
    // A warm start reads only the model's header and the pack cache; otherwise int8/int4
    // stream the weights one layer at a time (`KwkDecoder::from_header`).
    let header = kwk::model::load_model_header(&cfg.llm)
        .with_context(|| format!("loading --llm '{}'", cfg.llm))?;
    let prompt = header
        .tokenizer
        .encode(&cfg.prompt, true)
        .context("tokenizing --prompt")?;
    let max_cache_len = prompt
        .len()
        .checked_add(cfg.max_new_tokens)
        .filter(|&n| n <= crate::limits::MAX_TOKENS)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--prompt ({} tokens) + --max-new-tokens {} is more than {} tokens; pass a shorter prompt or fewer new tokens",
                prompt.len(),
                cfg.max_new_tokens,
                crate::limits::MAX_TOKENS
            )
        })?;
    let options = DecoderOptions {
        max_cache_len,
        precision,
        kv: cfg.kv,
        threads: cfg.threads,
        calibration_tokens: None,
        pack_cache_dir: pack_cache_dir.clone(),
    };
    {
        use kwk::decoder::resident::{available_memory, check_fits, resident_need, Build};
        let need = resident_need(
            &header.config,
            &precision,
            cfg.kv,
            max_cache_len,
            Build::FromHeader,
        );
        check_fits(
            &crate::limits::row_label(&cfg.format, &cfg.llm),
            &need,
            0,
            available_memory(),
            "use a smaller model, another --format or fewer --max-new-tokens (KWK_MEMORY_CHECK=0 skips this check)",
        )
        .map_err(|e| anyhow::anyhow!(e))?;
    }
    let packing = || format!("packing '{}' as {}", cfg.llm, cfg.format);
    let mut decoder = KwkDecoder::from_header(&header, options).with_context(packing)?;
    let tokenizer = header.tokenizer;
    if let Some(o) = decoder.pack_cache_outcome() {
        ui.line(&format!("pack cache: {}", pack_outcome_line(o)));
        if let Some(dir) = &pack_cache_dir {
            if let Some(w) = crate::cache_dir::outcome_warning(dir, &cfg.format, o) {
                ui.warn_once(&w);
            }
        }
    }
    ui.line(&format!(
        "ready after {:.3} s (packing or mapping {:.3} s)",
        started.elapsed().as_secs_f64(),
        decoder.pack_s()
    ));
    let mut out = Streamer::new(crate::ui::Stdout(ui));
    out.write(&cfg.prompt)?;
    let mut failure: Option<anyhow::Error> = None;
    let mut first_token_s = None;
    let stats = decoder.generate(&prompt, cfg.max_new_tokens, &cfg.sampling, &mut |tok| {
        first_token_s.get_or_insert_with(|| started.elapsed().as_secs_f64());
        if let Err(e) = out.push(&tokenizer, tok) {
            failure = Some(e);
            return false;
        }
        // A closed stdout ends the generation; the speeds still go to stderr.
        !out.closed
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    out.finish()?;
    out.write("\n")?;
    let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { f64::NAN };
    ui.line(&format!(
        "prompt: {} tokens in {:.3} s ({:.1} tokens/s); generation: {} tokens in {:.3} s ({:.1} tokens/s); format {}, {} threads",
        stats.prompt_tokens,
        stats.prompt_s,
        rate(stats.prompt_tokens, stats.prompt_s),
        stats.generated_tokens,
        stats.generate_s,
        rate(stats.generated_tokens, stats.generate_s),
        cfg.format,
        cfg.threads
    ));
    if let Some(t) = first_token_s {
        ui.line(&format!("first token {t:.3} s after start"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Token by token, the streamed text is the one-shot decode of all the tokens, and
    /// no piece ends inside a character split over several tokens.
    #[test]
    fn streamed_text_is_the_one_shot_decode() {
        let header = kwk::model::load_model_header(
            &kwk_fixtures::model_dir("tiny-llama").display().to_string(),
        )
        .unwrap();
        let tok = &header.tokenizer;
        let text = "naïve café — 日本語 🙂 done";
        let ids = tok.encode(text, false).unwrap();
        // Some character is split over tokens (else the test shows nothing about holding back).
        let split = ids
            .iter()
            .any(|&id| std::str::from_utf8(&tok.token_to_bytes(id).unwrap()).is_err());
        assert!(split, "no token holds a partial character: {ids:?}");
        let mut s = Streamer::new(Vec::new());
        for &id in &ids {
            let before = s.out.len();
            s.push(tok, id).unwrap();
            assert!(std::str::from_utf8(&s.out[before..]).is_ok());
        }
        s.finish().unwrap();
        let streamed = String::from_utf8(s.out).unwrap();
        assert_eq!(streamed, tok.decode(&ids).unwrap());
        assert_eq!(streamed, text);
    }

    /// A closed stdout stops the output without an error.
    #[test]
    fn a_closed_stdout_ends_output_quietly() {
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut s = Streamer::new(Closed);
        s.write("hello").unwrap();
        assert!(s.closed);
        s.write("more").unwrap();
    }
}

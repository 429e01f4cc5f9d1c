//! Perplexity of the kwk decoder on pre-tokenized text, with llama-perplexity's protocol
//! (chunks of `--ctx` tokens, logits from ctx/2, each scored against the next token, NLL
//! with f32 exp terms summed in f64), for comparing with llama.cpp on the same GGUF and the
//! same ids (`llama-tokenize -m MODEL -f TEXT --ids --log-disable > IDS`).
//!
//! `cargo run --release -p kwk --example perplexity -- MODEL.gguf IDS.json [--precision
//!  float32] [--kv f32|f16|bf16|q8] [--ctx 512] [--chunks 10] [--threads 2] [--bos ID]`
//!
//! With `--kv` other than f32 it also runs the same weights with a float32 cache and
//! prints the mean KL divergence of the chosen cache's next-token distributions from the
//! float32 cache's, and both perplexities (what the cache precision costs, weights held
//! fixed).

use kwk::decoder::{DecoderOptions, KvPrecision, KwkDecoder, Precision};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: perplexity MODEL.gguf IDS.json [--precision P] [--kv K] [--ctx N] [--chunks N] [--threads N] [--bos ID]";
    let (model, ids_path) = match (args.first(), args.get(1)) {
        (Some(m), Some(i)) => (m, i),
        _ => return Err(usage.into()),
    };
    let opt = |name: &str| -> Option<String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let precision = Precision::parse(&opt("--precision").unwrap_or("float32".into()))?;
    let kv: KvPrecision = opt("--kv").unwrap_or("f32".into()).parse()?;
    let ctx: usize = opt("--ctx").unwrap_or("512".into()).parse()?;
    let chunks: usize = opt("--chunks").unwrap_or("10".into()).parse()?;
    let threads: usize = opt("--threads").unwrap_or("2".into()).parse()?;
    let bos: Option<u32> = opt("--bos").map(|b| b.parse()).transpose()?;
    let text = std::fs::read_to_string(ids_path).map_err(|e| format!("{ids_path}: {e}"))?;
    let ids: Vec<u32> =
        serde_json::from_str(text.trim()).map_err(|e| format!("{ids_path}: {e}"))?;
    let (config, weights, _tok, _info) =
        kwk::model::gguf_loader::load_gguf(std::path::Path::new(model))?;
    let build = |kv: KvPrecision| {
        KwkDecoder::from_weights(
            &config,
            &weights,
            config.eos_token_ids.clone(),
            std::path::Path::new(model),
            DecoderOptions {
                max_cache_len: ctx,
                precision,
                kv,
                threads,
                calibration_tokens: None,
                pack_cache_dir: None,
            },
        )
    };
    let mut dec = build(kv)?;
    let mut reference = (kv != KvPrecision::F32)
        .then(|| build(KvPrecision::F32))
        .transpose()?;
    let (mut kld, mut ref_nll) = (0f64, 0f64);
    let chunks = chunks.min(ids.len() / ctx);
    let first = ctx / 2;
    let vocab = config.vocab_size;
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let t = std::time::Instant::now();
    for c in 0..chunks {
        let mut chunk = ids[c * ctx..(c + 1) * ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        dec.reset();
        let logits = dec.forward(&chunk, first)?;
        let ref_logits = match reference.as_mut() {
            Some(r) => {
                r.reset();
                Some(r.forward(&chunk, first)?)
            }
            None => None,
        };
        for j in 0..ctx - 1 - first {
            let row = &logits[j * vocab..(j + 1) * vocab];
            let log_probs = |row: &[f32]| -> Vec<f64> {
                let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let lse = row
                    .iter()
                    .map(|&l| ((l - max) as f64).exp())
                    .sum::<f64>()
                    .ln();
                row.iter().map(|&l| (l - max) as f64 - lse).collect()
            };
            let next = ids[c * ctx + first + j + 1] as usize;
            if let Some(rl) = &ref_logits {
                let (p, q) = (log_probs(&rl[j * vocab..(j + 1) * vocab]), log_probs(row));
                kld += p
                    .iter()
                    .zip(&q)
                    .map(|(a, b)| a.exp() * (a - b))
                    .sum::<f64>();
                ref_nll -= p[next];
            }
            let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let sum_exp: f64 = row.iter().map(|&l| (l - max).exp() as f64).sum();
            let v = -((row[next] - max) as f64 - sum_exp.ln());
            nll += v;
            nll2 += v * v;
            count += 1;
        }
        print!("[{}]{:.4},", c + 1, (nll / count as f64).exp());
        use std::io::Write;
        std::io::stdout().flush()?;
    }
    let mean = nll / count as f64;
    let var = nll2 / count as f64 - mean * mean;
    let err = if count > 1 {
        (var / (count - 1) as f64).sqrt() * mean.exp()
    } else {
        0.0
    };
    println!(
        "\n{} {}: PPL = {:.6} +/- {:.5} over {count} tokens ({:.1}s)",
        precision.name(),
        kwk::kernels::isa_in_use(),
        mean.exp(),
        err,
        t.elapsed().as_secs_f64()
    );
    if reference.is_some() {
        let ref_ppl = (ref_nll / count as f64).exp();
        println!(
            "kv {kv} against f32 cache: mean KLD {:.6}, PPL {:.6} vs {:.6} (delta {:+.4} %)",
            kld / count as f64,
            mean.exp(),
            ref_ppl,
            100.0 * (mean.exp() / ref_ppl - 1.0)
        );
    }
    Ok(())
}

//! Prompt and generation speed of the kwk decoder on a GGUF model, measured the way
//! llama-bench does: pp = a prompt of `--pp` tokens from an empty cache, tg = `--tg`
//! single-token steps from an empty cache; one warm-up, then `--reps` repetitions. With
//! `--depth D` each test first fills the cache with D prompt tokens, untimed (llama-bench's
//! `-d`).
//!
//! `cargo run --release -p kwk --example speed -- MODEL.gguf [--precision float32]
//!  [--threads 2] [--pp 512] [--tg 128] [--reps 3] [--kv f32|f16|bf16|q8] [--depth 0] [--pack-cache DIR]`
//!
//! Each rate is also given as a share of this machine's roofline (`roofline`, the
//! active tier's instructions, measured first with the same threads; `model::cost` for
//! the operations and bytes per token): pp against the fp32 / bf16 / int8 peak of the
//! format's kernels, tg against the read bandwidth.

use kwk::decoder::{DecoderOptions, KvPrecision, KwkDecoder, Precision};
use kwk::kernels::Arithmetic;
use std::time::Instant;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}

/// Fills the cache with `tokens` (untimed), as llama-bench's depth does.
fn prefill(dec: &mut KwkDecoder, tokens: &[u32]) -> Result<(), Box<dyn std::error::Error>> {
    if !tokens.is_empty() {
        dec.forward(tokens, tokens.len() - 1)?;
    }
    Ok(())
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64
    } else {
        0.0
    };
    (m, var.sqrt())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args.first().ok_or(
        "usage: speed MODEL.gguf [--precision P] [--threads N] [--pp N] [--tg N] [--reps N] [--kv P] [--depth D] [--pack-cache DIR]",
    )?;
    let opt = |name: &str, default: &str| -> String {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
            .unwrap_or_else(|| default.to_string())
    };
    let precision = Precision::parse(&opt("--precision", "float32"))?;
    let threads: usize = opt("--threads", "2").parse()?;
    let pp: usize = opt("--pp", "512").parse()?;
    let tg: usize = opt("--tg", "128").parse()?;
    let reps: usize = opt("--reps", "3").parse()?;
    let kv: KvPrecision = opt("--kv", "f32").parse()?;
    let pack_cache = opt("--pack-cache", "");
    let depth: usize = opt("--depth", "0").parse()?;

    let peaks = kwk::roofline::measure(kwk::kernels::active_isa(), threads);
    println!(
        "peaks ({} threads, tier {}): fp32 {:.1} GFLOP/s, int8 {:.1} GOP/s, bf16 {}, read {:.1} GB/s",
        peaks.threads,
        peaks.isa,
        peaks.fp32_gflops,
        peaks.int8_gops,
        peaks
            .bf16_gflops
            .map_or("converted".to_string(), |b| format!("{b:.1} GFLOP/s")),
        peaks.read_gbps
    );
    let compute_peak = match precision.arithmetic() {
        Arithmetic::Fp32 => peaks.fp32_gflops,
        Arithmetic::Bf16 => peaks.bf16_gflops.unwrap_or(peaks.fp32_gflops),
        Arithmetic::Int8 => peaks.int8_gops,
    } * 1e9;
    let t = Instant::now();
    let (config, weights, _tok, _info) =
        kwk::model::gguf_loader::load_gguf(std::path::Path::new(path))?;
    let load_s = t.elapsed().as_secs_f64();
    let mut dec = KwkDecoder::from_weights(
        &config,
        &weights,
        config.eos_token_ids.clone(),
        std::path::Path::new(path),
        DecoderOptions {
            max_cache_len: depth + pp.max(tg).max(1),
            precision,
            kv,
            threads,
            calibration_tokens: None,
            pack_cache_dir: (!pack_cache.is_empty()).then(|| pack_cache.into()),
        },
    )?;
    drop(weights);
    println!(
        "model {path}\nformat {} kernels {} (tier {}; cpu: {}) threads {threads} kv cache {kv}\nload {load_s:.2}s pack {:.2}s weights {:.1} MiB {:.2} bits/weight",
        precision.name(),
        precision.kernels(),
        kwk::kernels::kernels_summary(),
        kwk::kernels::detected_flags().join(","),
        dec.pack_s(),
        dec.weight_bytes() as f64 / (1u64 << 20) as f64,
        dec.bits_per_weight()
    );
    // Deterministic pseudo-random prompt, like llama-bench's random tokens.
    let vocab = config.vocab_size as u64;
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let prompt: Vec<u32> = (0..depth + pp.max(1))
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab) as u32
        })
        .collect();
    if pp > 0 {
        let mut rates = Vec::new();
        for rep in 0..=reps {
            dec.reset();
            prefill(&mut dec, &prompt[pp..pp + depth])?;
            let t = Instant::now();
            let logits = dec.forward(&prompt[..pp], pp - 1)?;
            let dt = t.elapsed().as_secs_f64();
            assert_eq!(logits.len(), config.vocab_size);
            if rep > 0 {
                rates.push(pp as f64 / dt);
            }
        }
        let (m, sd) = mean_std(&rates);
        // The prompt's own attention, plus each token's scores and P·V over the depth.
        let ops = kwk::model::cost::prompt_ops_per_token(&config, pp)
            + 4.0 * (config.n_heads * config.head_dim * config.n_layers * depth) as f64;
        println!(
            "pp{pp}@d{depth}: {m:.1} ± {sd:.1} tokens/s ({:.1} G op/s, {:.0} % of the compute roofline)",
            m * ops / 1e9,
            100.0 * m * ops / compute_peak
        );
    }
    if tg > 0 {
        let mut rates = Vec::new();
        for rep in 0..=reps {
            dec.reset();
            prefill(&mut dec, &prompt[pp..pp + depth])?;
            let mut next = prompt.first().copied().unwrap_or(1);
            let t = Instant::now();
            for _ in 0..tg {
                let logits = dec.forward(&[next], 0)?;
                next = kwk::decoder::sampling::argmax(&logits);
            }
            let dt = t.elapsed().as_secs_f64();
            if rep > 0 {
                rates.push(tg as f64 / dt);
            }
        }
        let (m, sd) = mean_std(&rates);
        let kv_value_bytes =
            kv.bytes_per_position(config.head_dim) as f64 / (2 * config.head_dim) as f64;
        let bytes = dec.weight_bytes_read_per_token()
            + kwk::model::cost::kv_bytes_per_token(&config, kv_value_bytes, depth, tg);
        println!(
            "tg{tg}@d{depth}: {m:.1} ± {sd:.1} tokens/s ({:.2} GB/s of {:.1} MB per token, {:.0} % of the read roofline)",
            m * bytes / 1e9,
            bytes / 1e6,
            100.0 * m * bytes / (peaks.read_gbps * 1e9)
        );
    }
    Ok(())
}

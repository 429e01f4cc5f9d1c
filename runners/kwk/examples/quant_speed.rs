//! pp512 / tg128 of the decoder in given formats, llama-bench's definitions (pp: a
//! 512-token prompt from an empty cache, logits of the last token; tg: 128 single-token
//! steps from an empty cache), one warm-up then REPS timed repetitions, mean ± sample std.
//! `cargo run --release -p kwk --example quant_speed -- MODEL THREADS REPS FORMAT...`

use kwk::decoder::{DecoderOptions, KwkDecoder, Precision};
use std::time::Instant;

/// CPU seconds the whole process has used (user + system, all threads).
fn cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

fn stats(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        return Err("usage: quant_speed MODEL THREADS REPS FORMAT...".into());
    }
    let threads: usize = args[1].parse()?;
    let reps: usize = args[2].parse()?;
    let model = kwk::load_model(&args[0])?;
    let vocab = model.config.vocab_size as u32;
    let prompt: Vec<u32> = (0..512u32).map(|i| (i * 7919 + 13) % vocab).collect();
    for f in &args[3..] {
        let mut dec = KwkDecoder::new(
            &model,
            DecoderOptions {
                max_cache_len: 640,
                precision: Precision::parse(f)?,
                kv: Default::default(),
                threads,
                calibration_tokens: None,
                pack_cache_dir: None,
            },
        )?;
        let (mut pp, mut tg) = (Vec::new(), Vec::new());
        let (mut pp_cpu, mut tg_cpu) = (0f64, 0f64);
        for rep in 0..=reps {
            dec.reset();
            let (t, c) = (Instant::now(), cpu_s());
            dec.forward(&prompt, 511)?;
            let pp_s = t.elapsed().as_secs_f64();
            let pp_c = cpu_s() - c;
            dec.reset();
            let tg_tokens = if std::env::var_os("SKIP_TG").is_some() {
                1
            } else {
                128
            };
            let (t, c) = (Instant::now(), cpu_s());
            for &tok in &prompt[..tg_tokens] {
                dec.forward(&[tok], 0)?;
            }
            let tg_s = t.elapsed().as_secs_f64();
            let tg_c = cpu_s() - c;
            if rep > 0 {
                pp_cpu += pp_c;
                tg_cpu += tg_c;
                pp.push(512.0 / pp_s);
                tg.push(128.0 / tg_s);
            }
        }
        let (pm, ps) = stats(&pp);
        let (tm, ts) = stats(&tg);
        println!(
            "{f}: pp512 {pm:.1} ± {ps:.1} t/s, tg128 {tm:.1} ± {ts:.1} t/s ({threads} threads, {reps} reps, {:.1} MiB); CPU seconds per run: pp512 {:.3}, tg128 {:.3}",
            dec.weight_bytes() as f64 / 1048576.0,
            pp_cpu / reps as f64,
            tg_cpu / reps as f64
        );
    }
    Ok(())
}

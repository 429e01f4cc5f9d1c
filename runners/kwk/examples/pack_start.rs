//! Start-up time and memory through the pack cache: process start to the first token's
//! logits, cold (no cache entry: the weights streamed layer by layer, equalized, quantized
//! and written) or warm (the cache file mapped, the weights not read), with the peak resident memory and a hash of the logits
//! (a warm start must print the same hash as a cold one).
//!
//! `cargo run --release -p kwk --example pack_start -- MODEL FORMAT CACHE_DIR [THREADS]`
//!
//! Prints one line: `start warm|cold ready_s first_token_s logits_sha256 peak_rss_bytes
//! packed_bytes kv_bytes`. Peak RSS is the process's `VmHWM` (/proc/self/status): the
//! most resident memory at any point, mapped cache pages included.

use kwk::decoder::{DecoderOptions, KwkDecoder, Precision};
use sha2::{Digest, Sha256};
use std::time::Instant;

fn vm_hwm_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        return Err("usage: pack_start MODEL FORMAT CACHE_DIR [THREADS]".into());
    }
    let precision = Precision::parse(&args[1])?;
    let threads: usize = args.get(3).map_or(Ok(2), |t| t.parse())?;
    let header = kwk::model::load_model_header(&args[0])?;
    let prompt = header.tokenizer.encode(
        "The pack cache keeps packed weights so that the next start",
        true,
    )?;
    let options = DecoderOptions {
        max_cache_len: 64,
        precision,
        kv: Default::default(),
        threads,
        calibration_tokens: None,
        pack_cache_dir: Some(args[2].clone().into()),
    };
    let config = header.config.clone();
    let mut dec = KwkDecoder::from_header(&header, options)?;
    let start = match dec.pack_cache_outcome() {
        Some(kwk::pack_cache::PackOutcome::Loaded(_)) => "warm",
        _ => "cold",
    };
    let ready_s = started.elapsed().as_secs_f64();
    let logits = dec.forward(&prompt, prompt.len() - 1)?;
    let first_token_s = started.elapsed().as_secs_f64();
    let digest = Sha256::digest(bytemuck_bytes(&logits));
    let kv_bytes = 2 * config.n_layers * config.n_kv_heads * config.head_dim * 64 * 4;
    println!(
        "start {start} ready_s {ready_s:.3} first_token_s {first_token_s:.3} logits_sha256 {} \
         peak_rss_bytes {} packed_bytes {} kv_bytes {kv_bytes} outcome {:?}",
        digest
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>(),
        vm_hwm_bytes().unwrap_or(0),
        dec.weight_bytes(),
        dec.pack_cache_outcome()
    );
    Ok(())
}

fn bytemuck_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

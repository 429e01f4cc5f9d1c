//! Times packing a model in each quantized format and prints its size: the pack time the
//! decoder reports, on all threads (rayon's pool), plus a timed prompt and token.
//! `cargo run --release -p kwk --example quant_pack_time -- MODEL [FORMAT...]`

use kwk::decoder::{DecoderOptions, KwkDecoder, Precision};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model_spec = args
        .next()
        .ok_or("usage: quant_pack_time MODEL [FORMAT...]")?;
    let mut formats: Vec<String> = args.collect();
    if formats.is_empty() {
        formats = vec!["int8".into(), "int4".into(), "int4:g128".into()];
    }
    let t = Instant::now();
    let model = kwk::load_model(&model_spec)?;
    println!(
        "read {model_spec} in {:.2} s ({} parameters)",
        t.elapsed().as_secs_f64(),
        model.n_params()
    );
    if let Some(dir) = std::env::var_os("PACK_CACHE") {
        // The pack cache: a cold build (quantize + write, or reuse) then a warm one
        // (mapped from the cache file alone, the weights not used).
        for f in &formats {
            let precision = Precision::parse(f)?;
            let options = DecoderOptions {
                max_cache_len: 600,
                precision,
                kv: Default::default(),
                threads: 2,
                calibration_tokens: None,
                pack_cache_dir: Some(dir.clone().into()),
            };
            let t = Instant::now();
            let cold = KwkDecoder::new(&model, options.clone())?;
            println!(
                "{f} cold: {:.3} s -> {:?}",
                t.elapsed().as_secs_f64(),
                cold.pack_cache_outcome()
            );
            drop(cold);
            let t = Instant::now();
            let warm = KwkDecoder::from_pack_cache(
                &model.config,
                model.config.eos_token_ids.clone(),
                &model.info.resolved_path,
                options,
            )?
            .ok_or("the pack cache written by the cold build was not found")?;
            println!(
                "{f} warm: {:.3} s -> {:?}",
                t.elapsed().as_secs_f64(),
                warm.pack_cache_outcome()
            );
        }
        return Ok(());
    }
    for f in formats {
        let precision = Precision::parse(&f)?;
        let cache = None;
        let t = Instant::now();
        let dec = KwkDecoder::new(
            &model,
            DecoderOptions {
                max_cache_len: 600,
                precision,
                kv: Default::default(),
                threads: 2,
                calibration_tokens: None,
                pack_cache_dir: cache,
            },
        )?;
        println!(
            "{f}: pack {:.2} s (decoder total {:.2} s), {:.1} MiB, {:.3} bits per weight, rayon threads {}",
            dec.pack_s(),
            t.elapsed().as_secs_f64(),
            dec.weight_bytes() as f64 / (1u64 << 20) as f64,
            dec.bits_per_weight(),
            rayon::current_num_threads()
        );
    }
    Ok(())
}

//! Times packing a model in each quantized format and prints its size: the pack time the
//! decoder reports, on all threads (rayon's pool), plus a timed prompt and token.
//! `cargo run --release -p kwk --example quant_pack_time -- MODEL [FORMAT...]`

use kwk::decoder::{DecoderOptions, KwkDecoder, Precision};
use kwk::format::{TensorPlace, TensorRole};
use kwk::model::{FeedForward, Mlp, Model, Tensor};
use kwk::pack_cache::PackSession;
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
        // The pack cache through PackSession, the decoder's packing order: a cold pass
        // (quantize + write) then a warm one (read + validate).
        for f in &formats {
            let precision = Precision::parse(f)?;
            for pass in ["cold", "warm"] {
                let t = Instant::now();
                let mut s = PackSession::open(
                    Some(dir.as_ref()),
                    &model.info.resolved_path,
                    &precision,
                    None,
                );
                let loading = s.is_loading();
                let n = pack_all(&model, &mut s)?;
                println!(
                    "{f} {pass}: {n} tensors in {:.3} s ({}) -> {:?}",
                    t.elapsed().as_secs_f64(),
                    if loading {
                        "read from cache"
                    } else {
                        "quantized"
                    },
                    s.finish()
                );
            }
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

/// Packs every linear weight through `s` in the decoder's order; returns the count.
fn pack_all(model: &Model, s: &mut PackSession) -> Result<usize, Box<dyn std::error::Error>> {
    let w = &model.weights;
    let n_layers = w.layers.len();
    let params = model.n_params();
    let place = |role, layer| TensorPlace {
        role,
        layer,
        n_layers,
        model_params: params,
    };
    let mut n = 0;
    let mut one = |t: &Tensor, role, layer| -> Result<(), Box<dyn std::error::Error>> {
        s.pack(t, place(role, layer), None)?;
        n += 1;
        Ok(())
    };
    match &w.lm_head {
        None => one(&w.embed, TensorRole::LmHead, None)?,
        Some(h) => {
            one(&w.embed, TensorRole::Embedding, None)?;
            one(h, TensorRole::LmHead, None)?;
        }
    }
    for (i, l) in w.layers.iter().enumerate() {
        let mut mlp = |m: &Mlp| -> Result<(), Box<dyn std::error::Error>> {
            one(&m.gate, TensorRole::FfnGate, Some(i))?;
            one(&m.up, TensorRole::FfnUp, Some(i))?;
            one(&m.down, TensorRole::FfnDown, Some(i))
        };
        match &l.ffn {
            FeedForward::Dense(m) => mlp(m)?,
            FeedForward::Moe(m) => {
                for e in &m.experts {
                    mlp(e)?;
                }
            }
        }
        one(&l.q, TensorRole::AttnQ, Some(i))?;
        one(&l.k, TensorRole::AttnK, Some(i))?;
        one(&l.v, TensorRole::AttnV, Some(i))?;
        one(&l.o, TensorRole::AttnOutput, Some(i))?;
    }
    Ok(n)
}

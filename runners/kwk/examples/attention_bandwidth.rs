//! How fast one generated token's attention reads a deep KV cache, per cache precision (issue
//! 39 item 3): `HEADS` KV heads (SmolLM2-135M: 30 layers x 3 KV heads) of `KEYS` cached
//! positions each, 64 head dimensions, 3 query rows per KV head (its GQA group), laid out
//! as the decoder's cache lays them out (key panels of 16 positions, values one position
//! per row). Each round runs the two inner products of every head's attention, first the
//! scores over every key panel, then P·V over every slot (timed apart), on one thread, and
//! reports the cache's bytes over the time: a bandwidth far under the machine's read
//! bandwidth (roofline) says the kernels, not memory, bound generation at depth.
//!
//! `cargo run --release -p kwk --example attention_bandwidth [-- KEYS [ROUNDS]]`
//! (defaults 4096 keys, 5 rounds; `KWK_ISA` picks the tier).

use kwk::kernels::attention::{
    accumulate_values, key_scores, KeyPanels, ScoreTile, ValueRows, ValueTile, Q8_BLOCK,
};
use kwk::kernels::{self, PANEL_ROWS};
use std::time::Instant;

mod common;
use common::pseudo;

/// KV heads the token reads (layers x KV heads of SmolLM2-135M).
const HEADS: usize = 90;
/// Head dimensions.
const DIMS: usize = 64;
/// Query rows per KV head (SmolLM2-135M's GQA group).
const ROWS: usize = 3;
/// Keys per kernel call (the tiled attention's key block).
const BLOCK: usize = 64;

/// One precision's cache: keys and values of every head.
enum Cache {
    F32 {
        k: Vec<f32>,
        v: Vec<f32>,
    },
    F16 {
        k: Vec<u16>,
        v: Vec<u16>,
    },
    Q8 {
        kc: Vec<i8>,
        ks: Vec<f32>,
        vc: Vec<i8>,
        vs: Vec<f32>,
    },
}

impl Cache {
    fn bytes(&self) -> usize {
        match self {
            Cache::F32 { k, v } => 4 * (k.len() + v.len()),
            Cache::F16 { k, v } => 2 * (k.len() + v.len()),
            Cache::Q8 { kc, ks, vc, vs } => kc.len() + vc.len() + 4 * (ks.len() + vs.len()),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let keys: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(4096);
    let rounds: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(5);
    let keys = keys.div_ceil(BLOCK) * BLOCK;
    let isa = kernels::active_isa();
    let per_head = keys * DIMS;
    let x = pseudo(HEADS * per_head, 7);
    let f16: Vec<u16> = x
        .iter()
        .map(|&v| half::f16::from_f32(v).to_bits())
        .collect();
    let q8 = |x: &[f32]| {
        let mut codes = vec![0i8; x.len()];
        let mut scales = vec![0f32; x.len() / Q8_BLOCK];
        kwk::kernels::attention::quantize_q8_blocks(x, &mut codes, &mut scales);
        (codes, scales)
    };
    let (kc, ks) = q8(&x);
    let (vc, vs) = q8(&x);
    let caches = [
        (
            "f32",
            Cache::F32 {
                k: x.clone(),
                v: x.clone(),
            },
        ),
        (
            "f16",
            Cache::F16 {
                k: f16.clone(),
                v: f16,
            },
        ),
        ("q8", Cache::Q8 { kc, ks, vc, vs }),
    ];
    let q = pseudo(ROWS * DIMS, 3);
    let mut s = vec![0f32; ROWS * BLOCK];
    let mut o = vec![0f32; ROWS * DIMS];
    println!("isa {isa:?}, {HEADS} heads x {keys} keys x {DIMS} dims, {ROWS} query rows, 1 thread");
    for round in 0..rounds {
        for (name, cache) in &caches {
            let t0 = Instant::now();
            // Every head's scores, then every head's P·V (timed apart; the decoder
            // interleaves them per key block).
            for h in 0..HEADS {
                for k0 in (0..keys).step_by(BLOCK) {
                    let p0 = k0 / PANEL_ROWS;
                    let kp = match cache {
                        Cache::F32 { k, .. } => KeyPanels::F32(&k[h * per_head + p0 * DIMS * 16..]),
                        Cache::F16 { k, .. } => KeyPanels::F16(&k[h * per_head + p0 * DIMS * 16..]),
                        Cache::Q8 { kc, ks, .. } => KeyPanels::Q8 {
                            codes: &kc[h * per_head + p0 * DIMS * 16..],
                            scales: &ks[(h * per_head + p0 * DIMS * 16) / Q8_BLOCK..],
                        },
                    };
                    let tile = ScoreTile {
                        q: &q,
                        q_ld: DIMS,
                        rows: ROWS,
                        out: &mut s,
                        out_ld: BLOCK,
                        streamed: true,
                    };
                    key_scores(isa, kp, DIMS, BLOCK / PANEL_ROWS, tile);
                }
            }
            let t_scores = t0.elapsed().as_secs_f64();
            s.iter_mut().for_each(|v| *v = v.abs() * 1e-3);
            let t1 = Instant::now();
            for h in 0..HEADS {
                let vr = match cache {
                    Cache::F32 { v, .. } => ValueRows::F32Panels {
                        data: &v[h * per_head..][..per_head],
                        cap: keys,
                    },
                    Cache::F16 { v, .. } => ValueRows::F16(&v[h * per_head..][..per_head]),
                    Cache::Q8 { vc, vs, .. } => ValueRows::Q8 {
                        codes: &vc[h * per_head..][..per_head],
                        scales: &vs[h * per_head / Q8_BLOCK..][..per_head / Q8_BLOCK],
                    },
                };
                for k0 in (0..keys).step_by(BLOCK) {
                    let tile = ValueTile {
                        p: &s,
                        p_ld: BLOCK,
                        rows: ROWS,
                        out: &mut o,
                        out_ld: DIMS,
                        streamed: true,
                    };
                    accumulate_values(isa, vr, DIMS, k0..k0 + BLOCK, tile);
                }
            }
            let t_values = t1.elapsed().as_secs_f64();
            let t = t0.elapsed().as_secs_f64();
            let gb = cache.bytes() as f64 / 1e9;
            println!(
                "round {round} {name:>4}: {:.2} ms per token, cache {:.1} MB, {:.1} GB/s; scores {:.2} ms, values {:.2} ms (sum {:.3e})",
                t * 1e3,
                gb * 1e3,
                gb / t,
                t_scores * 1e3,
                t_values * 1e3,
                o.iter().sum::<f32>()
            );
        }
    }
}

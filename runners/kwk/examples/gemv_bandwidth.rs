//! How close the single-token matmul (GEMV) of every format comes to the machine's read
//! bandwidth (issue 8 item 3): one matrix per format, each about `MIB` of packed bytes
//! (scales included) so it streams from memory, multiplied by one token on `THREADS`
//! threads of kwk's own worker pool, in interleaved rounds with the roofline's read probe
//! (`roofline::ReadProbe`, same threads, same buffer size) so drift hits both alike.
//! The layouts are the ones the decoder packs: float32 and bf16 panels, int8 (8-bit codes,
//! groups of 64), int4's 4-bit g32 layers, and int4's lm_head (symmetric 8-bit).
//!
//! `cargo run --release -p kwk --example gemv_bandwidth [-- MIB [THREADS [ROUNDS]]]`
//! (defaults 128 MiB, 2 threads, 7 rounds; `KWK_ISA` picks the tier).

use kwk::decoder::LowBitOptions;
use kwk::format::{pack_linear, InputKind, PackedLinear, PreparedInput, TensorPlace, TensorRole};
use kwk::kernels::q8_activations::quantize_rows_q8;
use kwk::kernels::{self, OutputMatrix};
use kwk::model::Tensor;
use kwk::roofline::ReadProbe;
use kwk::threads::{split_range, ThreadPool};
use kwk::Precision;
use std::time::Instant;

mod common;
use common::pseudo;

/// Columns of every matrix (SmolLM2-1.7B's hidden size).
const COLS: usize = 2048;

/// One format's matrix: its name and the packed weight.
struct Case {
    name: &'static str,
    w: Box<dyn PackedLinear>,
}

fn pack(name: &'static str, precision: Precision, role: TensorRole, mib: usize) -> Case {
    // Bits per weight with scales, roughly, to size the matrix in packed bytes.
    let bits = match name {
        "float32" => 32.0,
        "bf16" => 16.0,
        "int4 (4-bit g32)" => 4.5,
        _ => 8.5,
    };
    let rows = ((mib << 20) as f64 * 8.0 / bits / COLS as f64) as usize / 64 * 64;
    let t = Tensor::new(vec![rows, COLS], pseudo(rows * COLS, rows as u64));
    let place = TensorPlace {
        role,
        layer: (role != TensorRole::LmHead).then_some(12),
        n_layers: 24,
        model_params: 1_700_000_000,
        model_width: COLS,
    };
    let w = pack_linear(&t, &precision, place).expect("packing");
    Case { name, w }
}

/// GB/s of one GEMV of `w` on the pool (rows split as the decoder splits them).
fn gemv_gbps(pool: &ThreadPool, w: &dyn PackedLinear, x: &PreparedInput, y: &mut [f32]) -> f64 {
    let out = OutputMatrix::new(y, 1, w.rows());
    let t = Instant::now();
    pool.run(|part, parts| {
        let rows = split_range(w.rows(), parts, part, w.row_align());
        if !rows.is_empty() {
            w.matmul_rows(x, rows, &out);
        }
    });
    w.bytes() as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let arg = |i: usize, default: usize| -> usize {
        std::env::args()
            .nth(i)
            .map(|a| a.parse().expect("MIB THREADS ROUNDS are numbers"))
            .unwrap_or(default)
    };
    let (mib, threads, rounds) = (arg(1, 128), arg(2, 2).max(1), arg(3, 7).max(1));
    let int4 = Precision::LowBit(LowBitOptions::default());
    eprintln!("packing {mib} MiB per format ...");
    let cases = [
        pack("float32", Precision::Float32, TensorRole::AttnQ, mib),
        pack("bf16", Precision::Bf16, TensorRole::AttnQ, mib),
        pack("int8", Precision::INT8, TensorRole::AttnQ, mib),
        pack("int4 (4-bit g32)", int4, TensorRole::AttnQ, mib),
        pack("int4 lm_head", int4, TensorRole::LmHead, mib),
        pack("int4 ffn_down", int4, TensorRole::FfnDown, mib),
        pack("int4 attn_v", int4, TensorRole::AttnV, mib),
    ];
    for c in &cases {
        eprintln!("{}: {}", c.name, c.w.layout_name());
    }
    // The token in each encoding the kernels read.
    let x = pseudo(COLS, 7);
    let xb: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
    let (mut q, mut s, mut b) = (
        vec![0i8; COLS],
        vec![0f32; COLS / 32],
        vec![0i32; COLS / 32],
    );
    quantize_rows_q8(&x, COLS, &mut q, &mut s, &mut b);
    let input = |kind: InputKind| match kind {
        InputKind::F32 => PreparedInput::F32 {
            data: &x,
            dim: COLS,
        },
        InputKind::Bf16 => PreparedInput::Bf16 {
            data: &xb,
            dim: COLS,
        },
        InputKind::Q8Blocks => PreparedInput::Q8Blocks {
            quants: &q,
            scales: &s,
            block_sums: &b,
            dim: COLS,
            memo: None,
        },
        InputKind::Bf16Tiles => unreachable!("one token is never asked for in token tiles"),
    };
    let pool = ThreadPool::new(threads);
    let probe = ReadProbe::new(kernels::active_isa(), threads, mib << 20);
    let mut y = vec![0f32; cases.iter().map(|c| c.w.rows()).max().unwrap_or(0)];
    println!(
        "tier {} threads {threads}, {} rounds (first discarded), matrices of {COLS} columns:",
        kernels::isa_in_use(),
        rounds
    );
    for c in &cases {
        println!(
            "  {:<18} {:>7} rows {:>6.1} MiB ({})",
            c.name,
            c.w.rows(),
            c.w.bytes() as f64 / (1u64 << 20) as f64,
            c.w.layout_name()
        );
    }
    let mut read = Vec::new();
    let mut rates = vec![Vec::new(); cases.len()];
    let mut shares = vec![Vec::new(); cases.len()];
    for round in 0..=rounds {
        let r = probe.best_gbps(1);
        let per: Vec<f64> = cases
            .iter()
            .map(|c| gemv_gbps(&pool, c.w.as_ref(), &input(c.w.input_kind(1)), &mut y))
            .collect();
        if round == 0 {
            continue; // warm-up: page faults, pool start
        }
        read.push(r);
        for (k, g) in per.into_iter().enumerate() {
            rates[k].push(g);
            shares[k].push(g / r);
        }
    }
    let best_read = read.iter().copied().fold(0.0, f64::max);
    println!(
        "read probe: best {best_read:.1} GB/s, median {:.1}",
        median(read.clone())
    );
    println!("format              best GB/s  median GB/s  median % of the same round's read  best % of best read");
    for (k, c) in cases.iter().enumerate() {
        let best = rates[k].iter().copied().fold(0.0, f64::max);
        println!(
            "{:<18} {:>10.1} {:>12.1} {:>20.0} % {:>24.0} %",
            c.name,
            best,
            median(rates[k].clone()),
            100.0 * median(shares[k].clone()),
            100.0 * best / best_read
        );
    }
}

//! Times the int8/int4 matmul kernels on SmolLM2-135M's shapes (one layer's seven
//! matmuls and lm_head), one thread, for a 512-token prompt tile and single tokens; and the
//! float32 panel kernels on the same shapes for comparison.
//! `ISA=<tier>|all cargo run --release -p kwk --example quant_kernel_bench
//!  [int8|int8:g32|q8sym|int4|int4:g64|int4:g128|int3|int5|int6|float32]` (tiers: amx, vnni, avx512bw,
//! avxvnni, avx2, scalar; default the CPU's best; `all` every tier the CPU supports);
//! `TOKENS=512,64,8,1` times other token counts (default 512 and 1). On the `amx` tier with
//! AMX-BF16, prompts run the bf16 tiles the decoder runs (activations packed untimed, as
//! q8 activations are quantized untimed); `AMX_INT8=1` times the int8 tiles instead.
//! `int8` is what the int8 format packs (asymmetric 8-bit codes, groups of 64); the int4
//! format's default mix adds `int8:g32` (8-bit projections) and `q8sym` (symmetric 8-bit
//! embedding/lm_head) to `int4` (4-bit, groups of 32); `int3`, `int5`, `int6` are 3-, 5-, 6-bit
//! codes in groups of 64.
//! Each line gives the layer's mean on-CPU time over the repetitions (at least 8) and the
//! fastest repetition by wall clock: on a shared host, compare builds by the fastest of
//! several interleaved runs (on-CPU time moves in scheduler ticks).

use kwk::format::int4::LowBitWeights;
use kwk::format::int8::Int8Weights;
use kwk::format::quantized::INT8_GROUP;
use kwk::format::{PackedLinear, PreparedInput};
use kwk::kernels::q8_activations::quantize_rows_q8;
use kwk::kernels::quant::amx::bf16;
use kwk::kernels::quant::{Bits, QuantIsa};
use kwk::kernels::{self, Isa, OutputMatrix};
use kwk::model::Tensor;
use std::time::Instant;

mod common;
use common::pseudo;

/// Nanoseconds this thread has run on a CPU (the machine is shared; wall time lies).
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

struct Clock(Instant, u64);
impl Clock {
    fn start() -> Clock {
        Clock(Instant::now(), cpu_ns())
    }
    /// (wall seconds, on-CPU seconds)
    fn elapsed(&self) -> (f64, f64) {
        (
            self.0.elapsed().as_secs_f64(),
            (cpu_ns() - self.1) as f64 * 1e-9,
        )
    }
}

type Matmul = Box<dyn Fn(QuantIsa, &PreparedInput, std::ops::Range<usize>, &OutputMatrix)>;

fn main() {
    let fmt = std::env::args().nth(1).unwrap_or_else(|| "int8".into());
    let isas: Vec<QuantIsa> = match std::env::var("ISA").ok().as_deref() {
        None | Some("") => vec![QuantIsa::best()],
        Some("all") => QuantIsa::available(),
        Some(name) => match QuantIsa::parse(name) {
            Some(i) if i.is_available() => vec![i],
            _ => {
                eprintln!("error: ISA={name} is not a tier this CPU supports (or `all`)");
                std::process::exit(2);
            }
        },
    };
    // TOKENS=512,64,1 (default 512,1): the token counts to time.
    let token_counts: Vec<usize> = std::env::var("TOKENS")
        .ok()
        .map(|v| v.split(',').filter_map(|t| t.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty() && !v.contains(&0))
        .unwrap_or_else(|| vec![512, 1]);
    let shapes = [
        (576, 576),
        (192, 576),
        (192, 576),
        (576, 576),
        (1536, 576),
        (1536, 576),
        (576, 1536),
    ];
    let pack = |rows: usize, cols: usize| -> Matmul {
        let t = Tensor::new(vec![rows, cols], pseudo(rows * cols, (rows * cols) as u64));
        match fmt.as_str() {
            "q8sym" => {
                let w = Int8Weights::quantize(&t, None, "bench").unwrap();
                Box::new(move |i, x, r, y| match x {
                    PreparedInput::Bf16Tiles(_) => w.matmul_rows(x, r, y),
                    _ => w.matmul_rows_isa(i, x, r, y),
                })
            }
            "float32" => {
                let panels = kernels::pack_f32_panels(&t.data, rows, cols);
                Box::new(move |i, x, r, y| {
                    let PreparedInput::F32 { data, dim } = x else {
                        unreachable!()
                    };
                    let n = data.len() / dim;
                    let w = kernels::PanelWeights {
                        data: &panels,
                        n_rows: rows,
                        cols,
                    };
                    let x = kernels::TokenRows { data, n_tokens: n };
                    kernels::gemm_f32_panels(tier(i), w, x, r, y)
                })
            }
            f => {
                let (bits, gs) = match f {
                    "int4" => (Bits::B4, 32),
                    "int4:g64" => (Bits::B4, 64),
                    "int4:g128" => (Bits::B4, 128),
                    "int3" => (Bits::B3, 64),
                    "int5" => (Bits::B5, 64),
                    "int6" => (Bits::B6, 64),
                    "int8" => (Bits::B8, INT8_GROUP),
                    "int8:g32" => (Bits::B8, 32),
                    _ => panic!("format {f}"),
                };
                let w = LowBitWeights::quantize(&t, bits, gs, None, "bench").unwrap();
                let _ = w.bytes();
                Box::new(move |i, x, r, y| match x {
                    PreparedInput::Bf16Tiles(_) => w.matmul_rows(x, r, y),
                    _ => w.matmul_rows_isa(i, x, r, y),
                })
            }
        }
    };
    let layer: Vec<_> = shapes.iter().map(|&(r, c)| (r, c, pack(r, c))).collect();
    let head = pack(49152, 576);
    for isa in isas {
        for &n_tok in &token_counts {
            let mut xs = Vec::new();
            for &c in &[576usize, 1536] {
                let x = pseudo(n_tok * c, c as u64 + 7);
                let nb = x.len() / 32;
                let (mut q, mut s, mut b) = (vec![0i8; x.len()], vec![0f32; nb], vec![0i32; nb]);
                quantize_rows_q8(&x, c, &mut q, &mut s, &mut b);
                let tiles = if bf16_tiles(isa, n_tok) {
                    let mut t = vec![0u16; bf16::padded_tokens(n_tok) * c];
                    bf16::pack_token_tiles(&x, c, &mut t);
                    t
                } else {
                    Vec::new()
                };
                xs.push((c, q, s, b, x, tiles));
            }
            let mut y = vec![0f32; n_tok * 49152];
            let reps = (1536 / n_tok).clamp(8, 200);
            let mut macs = 0f64;
            let mut best_rep = f64::INFINITY;
            let t = Clock::start();
            for _ in 0..reps {
                let rep = Instant::now();
                for (r, c, f) in &layer {
                    let x = input(&fmt, n_tok, xs.iter().find(|v| v.0 == *c).unwrap());
                    let out = OutputMatrix::new(&mut y, n_tok, *r);
                    f(isa, &x, 0..*r, &out);
                    macs += (*r * *c * n_tok) as f64;
                }
                best_rep = best_rep.min(rep.elapsed().as_secs_f64());
            }
            let (lw, lc) = t.elapsed();
            let layer_s = lc / reps as f64;
            let t = Clock::start();
            let hreps = if n_tok == 1 { 20 } else { 1 };
            for _ in 0..hreps {
                let one = (
                    576,
                    xs[0].1[..576].to_vec(),
                    xs[0].2[..18].to_vec(),
                    xs[0].3[..18].to_vec(),
                    xs[0].4[..576].to_vec(),
                    Vec::new(),
                );
                let x = input(&fmt, n_tok, &one);
                let out = OutputMatrix::new(&mut y, 1, 49152);
                // lm_head for one token (perplexity/pp only need some rows' logits).
                head(isa, &x, 0..49152, &out);
            }
            let (hw, hc) = t.elapsed();
            let head_s = hc / hreps as f64;
            let wall_share = (lc + hc) / (lw + hw);
            let gmacs = macs / reps as f64 / layer_s / 1e9;
            let best_gmacs = macs / reps as f64 / best_rep / 1e9;
            println!(
                "{fmt} {} tokens={n_tok}: layer {:.3} ms ({gmacs:.1} GMAC/s; fastest of {reps} by wall clock {best_gmacs:.1}), 30 layers {:.1} ms, lm_head(1 token) {:.3} ms -> matmul-only {:.0} tokens/s/thread (on-CPU time; {:.0}% of wall)",
                if fmt == "float32" {
                    tier(isa).name()
                } else if isa == QuantIsa::Amx && n_tok >= 16 && !bf16_tiles(isa, n_tok) {
                    "amx int8 tiles (prompts)"
                } else {
                    isa.label()
                },
                layer_s * 1e3,
                layer_s * 30e3,
                head_s * 1e3,
                n_tok as f64 / (layer_s * 30.0 + head_s),
                wall_share * 100.0
            );
        }
    }
}

/// The kernel tier whose quantized path is `q` (the float kernels the tier runs).
fn tier(q: QuantIsa) -> Isa {
    match q {
        QuantIsa::Scalar => Isa::Scalar,
        QuantIsa::Avx2 => Isa::Avx2,
        QuantIsa::AvxVnni => Isa::AvxVnni,
        QuantIsa::Avx512Bw => Isa::Avx512Bw,
        QuantIsa::Avx512Vnni | QuantIsa::Amx => Isa::Avx512Vnni {
            bf16: kernels::isa_supported(Isa::Avx512Vnni {
                bf16: true,
                amx: false,
            }),
            amx: q == QuantIsa::Amx,
        },
    }
}

/// (width, q8 quants, q8 scales, q8 block sums, float32 values, bf16 token tiles (empty
/// unless [`bf16_tiles`])) of some tokens.
type Acts = (usize, Vec<i8>, Vec<f32>, Vec<i32>, Vec<f32>, Vec<u16>);

/// Whether `n_tok` tokens on `isa` run the bf16 tiles, as in the decoder (`AMX_INT8=1`:
/// never).
fn bf16_tiles(isa: QuantIsa, n_tok: usize) -> bool {
    isa == QuantIsa::Amx
        && n_tok >= kwk::kernels::quant::AMX_MIN_TOKENS
        && bf16::available()
        && std::env::var_os("AMX_INT8").is_none()
}

/// The activations in the encoding `fmt`'s kernels read (at most `n_tok` tokens).
fn input<'a>(fmt: &str, n_tok: usize, v: &'a Acts) -> PreparedInput<'a> {
    if fmt == "float32" {
        return PreparedInput::F32 {
            data: &v.4[..n_tok.min(v.4.len() / v.0) * v.0],
            dim: v.0,
        };
    }
    if !v.5.is_empty() {
        return PreparedInput::Bf16Tiles(bf16::Bf16Tiles {
            data: &v.5,
            dim: v.0,
            n_tokens: n_tok,
        });
    }
    PreparedInput::Q8Blocks {
        quants: &v.1,
        scales: &v.2,
        block_sums: &v.3,
        dim: v.0,
        memo: None,
    }
}

//! The quantized matmuls (int8 tiles; 3-, 4-, 5-, 6- and 8-bit codes: the `int8` and
//! `int3`..`int6` formats and their mixes' tensors) by tier. Data flows one way: this module's entry
//! points ([`int8_matmul`], [`lowbit_matmul`]) pick a tier's kernels; a tier's kernels run
//! under the shared driver ([`driver`]: blocking, threading, the tile types) and read the
//! packed layout ([`layout`]); no tier calls another.
//!
//! | file | what it owns |
//! |---|---|
//! | `layout.rs` | row groups, blocks, tile byte orders; `Int8Tiles`, `LowBitTiles`, `Bits` |
//! | `driver.rs` | `QuantIsa`, `Rounding`, `Q8Rows`, `InputMemo`, row-group/token blocking |
//! | `spec.rs` | the specification every tier agrees with to the bit |
//! | `scalar/` | the `scalar` tier (widened panels; `sse2.rs` its x86-64 block dots) |
//! | `ymm.rs`, `ymm_lowbit.rs` | the 256-bit source the `avx2` and `avxvnni` tiers instantiate |
//! | `avx2.rs` | the `avx2` tier (`vpmaddubsw` + `vpmaddwd` ymm) |
//! | `avxvnni.rs` | the `avxvnni` tier (`vpdpbusd` ymm, VEX and EVEX encodings) |
//! | `zmm.rs` | what the 512-bit tiers share (code unpacking and widening, float steps) |
//! | `avx512bw.rs` | the `avx512bw` tier (`vpmaddubsw` + `vpmaddwd` zmm) |
//! | `avx512vnni.rs` | the `vnni` tier (`vpdpbusd` zmm) |
//! | `amx/` | the `amx` tier (AMX prompt tiles: `bf16.rs` bf16 tiles where the CPU has AMX-BF16, `tiles.rs` int8 tiles) |
//!
//! ## Tiers
//! One per kernel tier ([`crate::kernels::Isa`], [`QuantIsa`]): AMX for prompts of
//! 16 or more tokens on CPUs with AMX (the `amx` tier, `amx/`: with AMX-BF16 the
//! weights are dequantized to bf16 tiles and the activations rounded to bf16, `amx/bf16.rs`,
//! the one path that does not agree to the bit with the specification; else the 512-byte
//! int8 tile of `layout.rs`, which is AMX's B-tile layout as it is), AVX512-VNNI (`vpdpbusd` zmm, `avx512vnni.rs`), AVX-512BW without VNNI (`avx512bw.rs`:
//! `vpmaddubsw` + `vpmaddwd` zmm), 256-bit VNNI and AVX2 (`avxvnni.rs`, `avx2.rs`), and
//! the scalar tier (`scalar/`), all held to the specification (`spec.rs`). `vpmaddubsw` would saturate its i16 pair sums on `255 · 127 · 2`, so the
//! paths without VNNI take full bytes through the sign trick (see those files). All paths
//! compute the same exact integer block dots and then the same float operations in the same
//! order (`acc = float(dot) · (d_w · d_a) + acc` per block, rounded once by a fused
//! multiply-add; twice on the scalar tier of x86-64, which has no FMA: [`Rounding`]), so
//! their results agree to the bit with the specification of their rounding; the tests run
//! every path the CPU supports against it. GEMM (prompts): a
//! tile of up to [`TOKEN_TILE`] tokens shares each weight load and each weight preparation
//! (the AVX-512 VNNI tier's low-bit codes take two row groups × [`PAIR_TOKENS`] tokens per
//! call, so each activation broadcast also serves two weight registers);
//! GEMV (one token): the same microkernel with one token, whose independent per-block
//! integer chains the out-of-order core overlaps; it is bound by memory bandwidth. The
//! 256-bit paths, whose registers hold 8 of a group's 16 rows, have a one-token variant that
//! runs both halves in one pass over each tile (`ymm.rs`).
//!
//! ## Prompts without VNNI: integer tiles, not dequantized float tiles
//! The other way to run a prompt on a CPU without `vpdpbusd` is to dequantize a weight tile
//! to f32 once and reuse it over the whole token block. Such a kernel performs the float32
//! panel GEMM's FMAs (one per 16 multiply-adds on zmm, 8 on ymm) plus the dequantization,
//! so the float32 kernel's own rate is its upper bound. The integer tiles match or beat
//! that bound on every tier, so they are the rule. Measured on an AMD Zen 4 (EPYC, 2
//! cores, a tier forced as `KWK_ISA` would; `ISA=<tier> cargo run --release -p kwk
//! --example quant_kernel_bench <format>`: SmolLM2-135M's layer shapes, 512-token prompt
//! tile, one thread, on-CPU time, best of 3 under a load average of 5-8 from other jobs),
//! GMAC/s:
//!
//! | tier | float32 (the bound) | int8 (8-bit codes g64) | int4 (g32) | 6-bit (g64) | 8-bit g32 | symmetric 8-bit (`Int8Tiles`) |
//! |---|---|---|---|---|---|---|
//! | `vnni` | 50.4 | 127.4 | 124.7 | 124.7 | 118.1 | 131.7 |
//! | `avx512bw` | 52.3 | 59.4 | 97.9 | 86.9 | 54.5 | 62.2 |
//! | `avxvnni` (EVEX encoding) | 45.3 | 90.9 | 85.5 | 80.9 | 80.7 | 91.4 |
//! | `avx2` | 41.1 | 42.6 | 64.8 | 54.8 | 41.7 | 43.3 |
//!
//! Full bytes without VNNI cost 4 instructions per 32-bit lane and quad (sign fix,
//! `vpmaddubsw`, `vpmaddwd`, add), as many as the FMAs of the same multiply-adds, so 8-bit
//! weights only tie with float32 there (their gain is the 4x smaller weight reads); 4- and
//! 6-bit codes sum several quads in i16 and need about half. On `avx512bw` and `avx2`,
//! prompts of 8-bit codes instead widen codes and activations to i16 once per call
//! (`vpmaddwd` + `vpaddd` per column pair: the same count, without the sign fix's per-quad
//! weight preparation), measured 1.1-1.2x the byte tiles on a Xeon (`avx512bw.rs`) and
//! 1.05-1.4x on a Zen 5 forced to `avx2` (`ymm.rs`). Splitting full bytes into
//! nibbles (`u = 16 hi + lo`, i16 sums, no sign fix) measured no faster on AVX2 (41 vs 44
//! GMAC/s), nor did 3-token sub-tiles. Nor did cache blocking over tokens (every row group
//! over a chunk of 16-128 tokens before the next chunk, so the chunk's activations stay in
//! L2): on an AMD Zen 3 (AVX2, one thread, 512 tokens) it measured slower, int4 50 -> 37-38
//! and 8-bit codes 35 -> 26-31 GMAC/s, because the weights then stream from L3 once per
//! chunk; row group outer, all tokens inner stays the order. The `avx512bw` tier was measured here by forcing it
//! on Zen 4, not on a Skylake-SP/Cascade Lake, whose ports for 512-bit integer multiplies
//! differ; the same bench there (`ISA=avx512bw`) is the check.
//!
//! ## Low-bit codes: the math
//! Per row and column group `cg`: `Σ_b d_a[b] · (d · Σ q·a + m · Σ a)`; the integer
//! dot of each block goes through `acc = fma(float(dot), d · d_a[b], acc)` and the minimum's
//! part once per group, `acc = fma(m, S[cg], acc)`, where `S[cg] = Σ_{b in cg} d_a[b] ·
//! blocksum[b]` is computed once per token (shared code, so every path sees the same
//! value). The specification and every tier perform the same float operations in the same
//! order and agree to the bit.

pub mod driver;
pub mod layout;
pub(crate) mod scalar;
pub mod spec;

#[cfg(target_arch = "x86_64")]
pub mod amx;
#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx512bw;
#[cfg(target_arch = "x86_64")]
pub mod avx512vnni;
#[cfg(target_arch = "x86_64")]
pub mod avxvnni;
#[cfg(target_arch = "x86_64")]
mod ymm;
#[cfg(target_arch = "x86_64")]
mod ymm_lowbit;
#[cfg(target_arch = "x86_64")]
mod zmm;

#[cfg(test)]
pub(crate) mod tests;

pub use driver::{
    avx_vnni_vex, padded_tokens, selected_isa, Bf16Tiles, InputMemo, PairedGemv, Q8Rows, QuantIsa,
    Rounding, TileAt, AMX_MIN_TOKENS, PAIR_TOKENS, TOKEN_TILE,
};
pub use layout::{
    code_tile_bytes, put_tile_code, Bits, Int8Tiles, LowBitTiles, BIT_TILE_BYTES, BLOCK,
    BYTE_TILE_BYTES, HIGH_BITS_TILE_BYTES, INT8_TILE_BYTES, NIBBLE_TILE_BYTES, PAIR_TILE_BYTES,
    ROW_GROUP,
};
pub use spec::{int8_matmul_spec, int8_tile_scalar, lowbit_matmul_spec, lowbit_tile_scalar};

use crate::kernels::OutputMatrix;
use driver::{check_operands, drive_row_groups, min_terms_all, GemvPair};
use scalar::{BaselineDots, WidenedDots};
use std::ops::Range;

/// `y[t][r] = W[r] · x[t]` for `r` in `rows` (start a multiple of 16) on path `isa`.
pub fn int8_matmul(isa: QuantIsa, w: &Int8Tiles, x: &Q8Rows, rows: Range<usize>, y: &OutputMatrix) {
    w.check();
    check_operands(x, w.cols, w.rows, &rows);
    assert!(isa.is_available(), "{} path not available", isa.name());
    #[cfg(target_arch = "x86_64")]
    if isa == QuantIsa::Amx && x.n_tokens >= AMX_MIN_TOKENS {
        // The tokens the AMX tiles leave run on the `vnni` tier's tiles.
        let vnni = |g: usize, t0: usize, n: usize, out: &mut amx::Out8| {
            // SAFETY: the `amx` tier has AVX-512 F/BW/VNNI (checked above); `w` and `x`
            // were checked; the AMX driver passes groups of `rows` and tokens below
            // `x.n_tokens`, at most `TOKEN_TILE` of them.
            unsafe { avx512vnni::int8_tile(w, x, g, t0, n, out) }
        };
        return amx::int8_matmul(w, x, rows, y, vnni);
    }
    #[cfg(target_arch = "x86_64")]
    let vex = avx_vnni_vex();
    #[cfg(target_arch = "x86_64")]
    let paired = isa.paired_gemv();
    #[cfg(target_arch = "x86_64")]
    let mut gemv_pair = |ga: usize, gb: usize, out: &mut [[f32; ROW_GROUP]; 2]| match paired {
        // SAFETY (every arm): `paired_gemv` names a path whose features the tier has; as
        // for the tiles below, for both groups and token 0.
        Some(PairedGemv::Avx2) => unsafe { avx2::int8_gemv_pair(w, x, ga, gb, 0, out) },
        Some(PairedGemv::VnniVex) => unsafe { avxvnni::vex::int8_gemv_pair(w, x, ga, gb, 0, out) },
        Some(PairedGemv::VnniEvex) => unsafe {
            avxvnni::evex::int8_gemv_pair(w, x, ga, gb, 0, out)
        },
        None => unreachable!("no paired GEMV on {}", isa.name()),
    };
    #[cfg(target_arch = "x86_64")]
    let pair = paired.map(|_| &mut gemv_pair as GemvPair);
    #[cfg(not(target_arch = "x86_64"))]
    let pair = None;
    let mut widened_dots = (isa == QuantIsa::Scalar).then(|| WidenedDots::<BaselineDots>::new(x));
    drive_row_groups(
        rows,
        x.n_tokens,
        y,
        |g, t0, n, out| match isa {
            QuantIsa::Scalar => match widened_dots.as_mut() {
                Some(f) => f.int8_tile(w, x, TileAt { g, t0, n }, out),
                None => unreachable!("the scalar tier's state is made above"),
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY (every arm): the path's CPU features were checked above (`avxvnni` runs
            // the VEX encoding only when AVX-VNNI is present, else the EVEX one, which
            // `is_available` then guaranteed); `check` guaranteed the slices cover group `g`,
            // tokens `t0..t0 + n` and every block.
            QuantIsa::Avx2 => unsafe { avx2::int8_tile(w, x, g, t0, n, out) },
            #[cfg(target_arch = "x86_64")]
            QuantIsa::AvxVnni if vex => unsafe { avxvnni::vex::int8_tile(w, x, g, t0, n, out) },
            #[cfg(target_arch = "x86_64")]
            QuantIsa::AvxVnni => unsafe { avxvnni::evex::int8_tile(w, x, g, t0, n, out) },
            #[cfg(target_arch = "x86_64")]
            QuantIsa::Avx512Bw => unsafe { avx512bw::int8_tile(w, x, g, t0, n, out) },
            #[cfg(target_arch = "x86_64")]
            QuantIsa::Avx512Vnni | QuantIsa::Amx => unsafe {
                avx512vnni::int8_tile(w, x, g, t0, n, out)
            },
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!(),
        },
        pair,
    );
}

/// `y[t][r] = W[r] · x[t]` for `r` in `rows` (start a multiple of 16) on path `isa`.
pub fn lowbit_matmul(
    isa: QuantIsa,
    w: &LowBitTiles,
    x: &Q8Rows,
    rows: Range<usize>,
    y: &OutputMatrix,
) {
    w.check();
    check_operands(x, w.cols, w.rows, &rows);
    assert!(isa.is_available(), "{} path not available", isa.name());
    let ncg = w.n_col_groups();
    let s_all = min_terms_all(x, w.group_size, ncg);
    #[cfg(target_arch = "x86_64")]
    if isa == QuantIsa::Amx && x.n_tokens >= AMX_MIN_TOKENS {
        // The tokens the AMX tiles leave run on the `vnni` tier's tiles.
        let vnni = |g: usize, t0: usize, n: usize, s: &[f32], out: &mut amx::Out8| {
            // SAFETY: as for int8 in `int8_matmul`; `s` holds the `n` tokens' terms.
            unsafe { avx512vnni::lowbit_tile(w, x, s, g, t0, n, out) }
        };
        return amx::lowbit_matmul(w, x, &s_all, rows, y, vnni);
    }
    #[cfg(target_arch = "x86_64")]
    if isa == QuantIsa::Avx512Bw && w.bits == Bits::B8 && x.n_tokens > TOKEN_TILE {
        // SAFETY: the tier has AVX-512 F/BW (checked above); `w` and `x` were checked.
        unsafe { avx512bw::code8_matmul_i16(w, x, &s_all, rows, y) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == QuantIsa::Avx2 && w.bits == Bits::B8 && x.n_tokens > TOKEN_TILE {
        // SAFETY: the tier has AVX2/FMA/F16C (checked above); `w` and `x` were checked.
        unsafe { avx2::code8_matmul_i16(w, x, &s_all, rows, y) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, QuantIsa::Avx512Vnni | QuantIsa::Amx) && x.n_tokens > TOKEN_TILE {
        // SAFETY: the tier has AVX512F/BW/VNNI (checked above); `w` and `x` were checked.
        unsafe { avx512vnni::lowbit_matmul_pairs(w, x, &s_all, rows, y) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    let vex = avx_vnni_vex();
    #[cfg(target_arch = "x86_64")]
    let paired = isa.paired_gemv();
    #[cfg(target_arch = "x86_64")]
    let mut gemv_pair = |ga: usize, gb: usize, out: &mut [[f32; ROW_GROUP]; 2]| {
        let s = &s_all[..ncg];
        match paired {
            // SAFETY (every arm): `paired_gemv` names a path whose features the tier has;
            // as for the tiles below, for both groups and token 0.
            Some(PairedGemv::Avx2) => unsafe { avx2::lowbit_gemv_pair(w, x, s, ga, gb, 0, out) },
            Some(PairedGemv::VnniVex) => unsafe {
                avxvnni::vex::lowbit_gemv_pair(w, x, s, ga, gb, 0, out)
            },
            Some(PairedGemv::VnniEvex) => unsafe {
                avxvnni::evex::lowbit_gemv_pair(w, x, s, ga, gb, 0, out)
            },
            None => unreachable!("no paired GEMV on {}", isa.name()),
        }
    };
    #[cfg(target_arch = "x86_64")]
    let pair = paired.map(|_| &mut gemv_pair as GemvPair);
    #[cfg(not(target_arch = "x86_64"))]
    let pair = None;
    let mut widened_dots = (isa == QuantIsa::Scalar).then(|| WidenedDots::<BaselineDots>::new(x));
    drive_row_groups(
        rows,
        x.n_tokens,
        y,
        |g, t0, n, out| {
            let s = &s_all[t0 * ncg..(t0 + n) * ncg];
            match isa {
                QuantIsa::Scalar => match widened_dots.as_mut() {
                    Some(f) => f.lowbit_tile(w, x, s, TileAt { g, t0, n }, out),
                    None => unreachable!("the scalar tier's state is made above"),
                },
                #[cfg(target_arch = "x86_64")]
                // SAFETY (every arm): the path's CPU features were checked above (`avxvnni`
                // runs the VEX encoding only when AVX-VNNI is present, else the EVEX one);
                // `check` guaranteed the slices cover group `g`, tokens `t0..t0 + n`, every
                // block and column group; `s` holds `n` tokens' minimum terms.
                QuantIsa::Avx2 => unsafe { avx2::lowbit_tile(w, x, s, g, t0, n, out) },
                #[cfg(target_arch = "x86_64")]
                QuantIsa::AvxVnni if vex => unsafe {
                    avxvnni::vex::lowbit_tile(w, x, s, g, t0, n, out)
                },
                #[cfg(target_arch = "x86_64")]
                QuantIsa::AvxVnni => unsafe { avxvnni::evex::lowbit_tile(w, x, s, g, t0, n, out) },
                #[cfg(target_arch = "x86_64")]
                QuantIsa::Avx512Bw => unsafe { avx512bw::lowbit_tile(w, x, s, g, t0, n, out) },
                #[cfg(target_arch = "x86_64")]
                QuantIsa::Avx512Vnni | QuantIsa::Amx => unsafe {
                    avx512vnni::lowbit_tile(w, x, s, g, t0, n, out)
                },
                #[cfg(not(target_arch = "x86_64"))]
                _ => unreachable!(),
            }
        },
        pair,
    );
}

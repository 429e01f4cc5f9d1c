//! AMX-BF16 prompt tiles (`tdpbf16ps`) for every quantized layout: the `amx` tier's
//! prompt matmuls where the CPU has AMX-BF16 (Sapphire Rapids and later; [`available`]).
//! The activations are rounded to bf16 once per matmul input, in tile order
//! ([`pack_token_tiles`]); each pair of weight row groups is dequantized to bf16 once
//! (`w = d · q + m` in f32, exact, then rounded to nearest even: [`dequant_int8_group`],
//! [`dequant_lowbit_group`]) into AMX's B layout, and every token tile of the prompt
//! multiplies it with float32 accumulation in the tiles over the whole row. Twins:
//! [`pack_token_tiles_scalar`], [`dequant_group_scalar`], and the tests hold the products to
//! a float64 sum of the same bf16 operands.
//!
//! Why not the int8 tiles (`tiles.rs`): a q8 activation block has its own scale per 32
//! columns, so every 32-column step of an int8 tile product has to leave the tiles
//! (`tilestored`) for a float step, which took 55 % of an int4 pp512 profile on a Xeon
//! with AMX. Here nothing leaves the tiles until the row is done. Measured on that Xeon
//! (2026-12-07, one thread, 512 tokens, SmolLM2-135M's shapes, a standalone copy of this
//! kernel): 460-500 GMAC/s with the dequantization and 500-575 without, where the int8
//! tiles' layer ran 227-242 (`quant_kernel_bench`, `amx`).
//!
//! The arithmetic differs from the other tiers (which agree to the bit with
//! `spec.rs`): a weight is rounded to bf16 (relative error at most 2^-9; for 4-bit codes a
//! 64th of the quantization step or less, for 8-bit codes about 3 % more error variance
//! than the codes' own) and so is an activation (about a sixth of the rounding error of a
//! q8 block); the sums are float32 in the tile unit's order. One-token products (the
//! GEMV) stay on the q8 path.
//!
//! Layout of the packed activations ([`Bf16Tiles`]): token tile `tt` (16 tokens) × column
//! block `b` (32 columns) is 1 KiB at `(tt · n_blocks + b) · 512` values, token-major
//! (AMX's A tile as it is); tokens are padded with zeros to a multiple of
//! [`TOKEN_STEP`]. A weight block in B layout is 1 KiB too: row `p` (16 of them) holds
//! column pair `2p, 2p + 1` of the group's 16 weight rows, 2 values each.

use super::tiles::{self, TileConfig, TileScope};
use crate::kernels::quant::driver::write_group_row;
pub use crate::kernels::quant::driver::{padded_tokens, Bf16Tiles, TILE_TOKENS, TOKEN_STEP};
use crate::kernels::quant::layout::{
    Int8Tiles, LowBitTiles, BLOCK, BYTE_TILE_BYTES, INT8_TILE_BYTES, ROW_GROUP,
};
use crate::kernels::quant::zmm::{mins_zmm, scales_zmm, widen_group_codes};
use crate::kernels::OutputMatrix;
use std::arch::asm;
use std::arch::x86_64::*;
use std::ops::Range;
use std::sync::OnceLock;

/// bf16 values of one A or B tile (16 rows of 32).
pub const TILE_VALUES: usize = TILE_TOKENS * BLOCK;

/// Whether the `amx` tier's prompts can run here: AMX-INT8's checks ([`tiles::available`])
/// plus AMX-BF16 (CPUID leaf 7, EDX bit 22) and AVX512-BF16 (the packing's conversion).
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let amx_bf16 = __cpuid_count(7, 0).edx >> 22 & 1 == 1;
        amx_bf16 && std::arch::is_x86_feature_detected!("avx512bf16") && tiles::available()
    })
}

/// Packs whole token tiles: `x` holds up to `out.len() / dim` rows of `dim` floats (token
/// `i` of the first tile first; fewer rows leave zeros); `out` is a whole number of token
/// tiles (`16 · dim` values each). Runs [`pack_token_tiles_avx512`] where the CPU has
/// AVX512-BF16, else the scalar twin.
pub fn pack_token_tiles(x: &[f32], dim: usize, out: &mut [u16]) {
    assert!(dim.is_multiple_of(BLOCK) && out.len().is_multiple_of(TILE_TOKENS * dim));
    assert!(x.len() <= out.len() && x.len().is_multiple_of(dim));
    if std::arch::is_x86_feature_detected!("avx512bf16") {
        // SAFETY: the feature was checked; the lengths were asserted.
        unsafe { pack_token_tiles_avx512(x, dim, out) }
    } else {
        pack_token_tiles_scalar(x, dim, out)
    }
}

/// [`pack_token_tiles`]' scalar twin (round to nearest even, as `vcvtne2ps2bf16`).
pub fn pack_token_tiles_scalar(x: &[f32], dim: usize, out: &mut [u16]) {
    let nb = dim / BLOCK;
    for (tt, tile) in out.chunks_exact_mut(TILE_TOKENS * dim).enumerate() {
        for b in 0..nb {
            for i in 0..TILE_TOKENS {
                let t = tt * TILE_TOKENS + i;
                let dst = &mut tile[(b * TILE_TOKENS + i) * BLOCK..][..BLOCK];
                match x.get(t * dim + b * BLOCK..t * dim + (b + 1) * BLOCK) {
                    Some(src) => {
                        for (d, &v) in dst.iter_mut().zip(src) {
                            *d = half::bf16::from_f32(v).to_bits();
                        }
                    }
                    None => dst.fill(0),
                }
            }
        }
    }
}

/// [`pack_token_tiles`] with `vcvtne2ps2bf16`, block by block so the writes are in order.
///
/// # Safety
/// AVX512F and AVX512-BF16 present; the lengths as [`pack_token_tiles`] asserts.
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn pack_token_tiles_avx512(x: &[f32], dim: usize, out: &mut [u16]) {
    let nb = dim / BLOCK;
    let n = x.len() / dim;
    for (tt, tile) in out.chunks_exact_mut(TILE_TOKENS * dim).enumerate() {
        for b in 0..nb {
            for i in 0..TILE_TOKENS {
                let t = tt * TILE_TOKENS + i;
                let dst = tile[(b * TILE_TOKENS + i) * BLOCK..][..BLOCK].as_mut_ptr();
                // SAFETY: `dst` is 32 values of `out`; row t (when t < n) has 32 values
                // at block b.
                unsafe {
                    let v = if t < n {
                        let src = x.as_ptr().add(t * dim + b * BLOCK);
                        let (lo, hi) = (_mm512_loadu_ps(src), _mm512_loadu_ps(src.add(16)));
                        bf16_bits(_mm512_cvtne2ps_pbh(hi, lo))
                    } else {
                        _mm512_setzero_si512()
                    };
                    _mm512_storeu_si512(dst as *mut _, v);
                }
            }
        }
    }
}

#[inline(always)]
fn bf16_bits(v: __m512bh) -> __m512i {
    // SAFETY: both are 512-bit vectors of plain bits.
    unsafe { std::mem::transmute::<__m512bh, __m512i>(v) }
}

/// One weight row group in B layout, dequantized, from byte tiles (`quad · 64 + row · 4 +
/// k` per 512-byte block, the int8 layout): `w = fma(byte, d, m)` with the 16 rows' `d`
/// and `m` of each block (`dm(b)`), rounded to bf16, into `out` (`nb` blocks of 512).
///
/// # Safety
/// AVX512F/BW and AVX512-BF16 present; `bytes` holds `nb` tiles of 512 and `out` `nb` of
/// 512 values.
#[inline(always)]
unsafe fn dequant_bytes(
    bytes: *const u8,
    nb: usize,
    out: *mut u16,
    mut dm: impl FnMut(usize) -> (__m512, __m512),
) {
    // SAFETY: the caller's contract; every offset is inside block b's 512 bytes / values.
    unsafe {
        // Lane l of quarter i of a 64-byte line is row 4i + l / 4: each row's scale 4 times.
        let spread =
            [0, 1, 2, 3].map(|i| _mm512_add_epi32(_mm512_set1_epi32(4 * i), row_of_lane()));
        let even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
        let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
        for b in 0..nb {
            let (d, m) = dm(b);
            let ds = spread.map(|s| _mm512_permutexvar_ps(s, d));
            let ms = spread.map(|s| _mm512_permutexvar_ps(s, m));
            let src = bytes.add(b * INT8_TILE_BYTES);
            let dst = out.add(b * TILE_VALUES);
            for q in 0..BLOCK / 4 {
                let line = _mm512_loadu_si512(src.add(q * 64) as *const _);
                let f = [
                    _mm512_extracti32x4_epi32::<0>(line),
                    _mm512_extracti32x4_epi32::<1>(line),
                    _mm512_extracti32x4_epi32::<2>(line),
                    _mm512_extracti32x4_epi32::<3>(line),
                ];
                let w: [__m512; 4] = std::array::from_fn(|i| {
                    let v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(f[i]));
                    _mm512_fmadd_ps(v, ds[i], ms[i])
                });
                // Rows 0-7 and 8-15 × columns 4q..4q+3, as (row, column pair) u32s.
                let lo = _mm512_castsi512_ps(bf16_bits(_mm512_cvtne2ps_pbh(w[1], w[0])));
                let hi = _mm512_castsi512_ps(bf16_bits(_mm512_cvtne2ps_pbh(w[3], w[2])));
                let pair0 = _mm512_permutex2var_ps(lo, even, hi);
                let pair1 = _mm512_permutex2var_ps(lo, odd, hi);
                _mm512_storeu_ps(dst.add(2 * q * 32) as *mut f32, pair0);
                _mm512_storeu_ps(dst.add((2 * q + 1) * 32) as *mut f32, pair1);
            }
        }
    }
}

/// Lane `l` → `l / 4`.
#[inline(always)]
fn row_of_lane() -> __m512i {
    // SAFETY: no memory access; AVX-512F is a precondition of every caller.
    unsafe { _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0) }
}

/// Row group `g` of symmetric 8-bit tiles in bf16 B layout (`w = (byte − 128) · d` as
/// `fma(byte, d, −128 · d)`, exact) into `out` (`n_blocks · 512` values).
///
/// # Safety
/// AVX512F/BW and AVX512-BF16 present; `w` checked, `g < w.n_groups()`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,f16c")]
pub unsafe fn dequant_int8_group(w: &Int8Tiles, g: usize, out: &mut [u16]) {
    let nb = w.n_blocks();
    assert!(out.len() >= nb * TILE_VALUES);
    // SAFETY: group g's tiles and scales are inside what `check` validated.
    unsafe {
        let codes = w.qs.as_ptr().add(g * nb * INT8_TILE_BYTES);
        let sc = w.scales.as_ptr().add(g * nb * ROW_GROUP) as *const u16;
        dequant_bytes(codes, nb, out.as_mut_ptr(), |b| {
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(sc.add(b * ROW_GROUP) as *const _));
            (d, _mm512_mul_ps(d, _mm512_set1_ps(-128.0)))
        });
    }
}

/// Row group `g` of 3- to 8-bit codes in bf16 B layout (`w = fma(q, d, m)`, the layout's
/// exact `d = D · sc`, `m = M · mc`), using `bytes` (at least `n_blocks · 512`) for the
/// codes widened to bytes.
///
/// # Safety
/// AVX512F/BW and AVX512-BF16 present; `w` checked, `g < w.n_groups()`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,f16c")]
pub unsafe fn dequant_lowbit_group(w: &LowBitTiles, g: usize, bytes: &mut [u8], out: &mut [u16]) {
    let nb = w.n_blocks();
    assert!(out.len() >= nb * TILE_VALUES && bytes.len() >= nb * BYTE_TILE_BYTES);
    let bpg = w.group_size / BLOCK;
    // SAFETY: the features are present; group g's codes and scales are inside what
    // `check` validated; `bytes` and `out` were asserted long enough.
    unsafe {
        widen_group_codes(w, g, bytes);
        let gs = w.group_scales(g);
        dequant_bytes(bytes.as_ptr(), nb, out.as_mut_ptr(), |b| {
            (scales_zmm(gs, b / bpg), mins_zmm(gs, b / bpg))
        });
    }
}

/// The dequantization's scalar twin: row group `g` of a matrix whose row `r` is
/// `row(r, out)` (its `dequantize_row`, exact in f32), rounded to bf16 in B layout.
pub fn dequant_group_scalar(
    g: usize,
    cols: usize,
    mut row: impl FnMut(usize, &mut [f32]),
) -> Vec<u16> {
    let nb = cols / BLOCK;
    let mut out = vec![0u16; nb * TILE_VALUES];
    let mut w = vec![0f32; cols];
    for rr in 0..ROW_GROUP {
        row(g * ROW_GROUP + rr, &mut w);
        for (c, &v) in w.iter().enumerate() {
            let (b, cc) = (c / BLOCK, c % BLOCK);
            out[b * TILE_VALUES + (cc / 2) * 32 + rr * 2 + cc % 2] =
                half::bf16::from_f32(v).to_bits();
        }
    }
    out
}

/// The bf16 tiles' configuration: tmm0-3 16 × 16 f32 sums (tokens × rows), tmm4-5 token
/// tiles, tmm6-7 weight tiles, all 16 rows of 64 bytes.
static BF16_TILES: TileConfig = TileConfig::new(&[(16, 64); 8]);

/// 32 tokens (token tiles at `a` and `a + nb · 512`) × two row groups (B tiles at `w0`,
/// `w1`) over `nb` blocks: sums into `out[0]` (tokens 0-15 × group 0), `out[1]` (0-15 ×
/// 1), `out[2]` (16-31 × 0), `out[3]` (16-31 × 1), each 16 rows of 16 floats `ld` floats
/// apart.
///
/// # Safety
/// A [`TileScope`] of [`BF16_TILES`] is alive on this thread; `a` holds `2 · nb` tiles,
/// `w0`/`w1` `nb` each; the outputs are writable as stated and this thread's alone.
#[inline(always)]
unsafe fn tile_2x2(a: *const u16, nb: usize, w: [*const u16; 2], out: [*mut f32; 4], ld: usize) {
    // SAFETY: the caller's contract; every load is one whole tile of the stated arrays.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
        let a1 = a.add(nb * TILE_VALUES);
        for b in 0..nb {
            let o = b * TILE_VALUES;
            asm!(
                "tileloadd tmm4, [{a0} + {s} * 1]",
                "tileloadd tmm6, [{w0} + {s} * 1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm7, [{w1} + {s} * 1]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm5, [{a1} + {s} * 1]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a.add(o), a1 = in(reg) a1.add(o),
                w0 = in(reg) w[0].add(o), w1 = in(reg) w[1].add(o), s = in(reg) 64usize,
                options(nostack, readonly),
            );
        }
        asm!(
            "tilestored [{d0} + {s} * 1], tmm0",
            "tilestored [{d1} + {s} * 1], tmm1",
            "tilestored [{d2} + {s} * 1], tmm2",
            "tilestored [{d3} + {s} * 1], tmm3",
            d0 = in(reg) out[0], d1 = in(reg) out[1], d2 = in(reg) out[2], d3 = in(reg) out[3],
            s = in(reg) ld * 4, options(nostack),
        );
    }
}

/// A quantized matrix as this path reads it.
#[derive(Clone, Copy)]
pub enum Weights<'a> {
    Int8(&'a Int8Tiles<'a>),
    LowBit(&'a LowBitTiles<'a>),
}

impl Weights<'_> {
    fn cols(&self) -> usize {
        match self {
            Weights::Int8(w) => w.cols,
            Weights::LowBit(w) => w.cols,
        }
    }
}

/// `y[t][r] = W[r] · x[t]` for `r` in `rows` (start a multiple of 16) and every token of
/// `x`, on AMX-BF16 tiles: row groups two at a time, each pair dequantized once and run
/// against every 32-token step of the prompt.
pub fn matmul(w: Weights, x: &Bf16Tiles, rows: Range<usize>, y: &OutputMatrix) {
    assert!(available(), "AMX-BF16 prompt tiles on a CPU without them");
    let cols = w.cols();
    x.check(cols);
    match w {
        Weights::Int8(t) => t.check(),
        Weights::LowBit(t) => t.check(),
    }
    assert_eq!(rows.start % ROW_GROUP, 0, "row slices start on a row group");
    assert!(y.n_tokens() >= x.n_tokens && rows.end <= y.ld());
    let nb = cols / BLOCK;
    let mut wt = [vec![0u16; nb * TILE_VALUES], vec![0u16; nb * TILE_VALUES]];
    let mut bytes = match w {
        Weights::LowBit(_) => vec![0u8; nb * BYTE_TILE_BYTES],
        Weights::Int8(_) => Vec::new(),
    };
    let dequant = |g: usize, out: &mut [u16], bytes: &mut [u8]| match w {
        // SAFETY: `available` implies the AVX-512 F/BW/BF16 features; `check` ran; g is a
        // group of `rows`, inside the matrix.
        Weights::Int8(t) => unsafe { dequant_int8_group(t, g, out) },
        Weights::LowBit(t) => unsafe { dequant_lowbit_group(t, g, bytes, out) },
    };
    let n = x.n_tokens;
    let groups = rows.start / ROW_GROUP..rows.end.div_ceil(ROW_GROUP);
    // SAFETY: AMX-BF16 is available (asserted); the scope lives for this call.
    let _scope = unsafe { TileScope::load(&BF16_TILES) };
    let mut scratch = [[0f32; 2 * ROW_GROUP]; TOKEN_STEP];
    let mut g = groups.start;
    while g < groups.end {
        let pair = g + 1 < groups.end;
        let [w0, w1] = &mut wt;
        dequant(g, w0, &mut bytes);
        if pair {
            dequant(g + 1, w1, &mut bytes);
        }
        let wp = [w0.as_ptr(), if pair { w1.as_ptr() } else { w0.as_ptr() }];
        // Both groups' rows whole in `rows`: the tiles go straight into `y`.
        let whole = pair && (g + 2) * ROW_GROUP <= rows.end;
        let mut t0 = 0;
        while t0 < n {
            // SAFETY: token tiles t0 / 16 and the next are in `x` (padded to 32 tokens);
            // the weight tiles hold nb blocks.
            let a = unsafe { x.data.as_ptr().add(t0 * cols) };
            if whole && t0 + TOKEN_STEP <= n {
                let at = |t: usize, j: usize| {
                    y.block_ptr(t, TILE_TOKENS, (g + j) * ROW_GROUP, ROW_GROUP)
                };
                let out = [at(t0, 0), at(t0, 1), at(t0 + 16, 0), at(t0 + 16, 1)];
                // SAFETY: `block_ptr` checked each 16 tokens × 16 columns; they lie in
                // `rows`, which this thread owns in `y`; the scope is loaded.
                unsafe { tile_2x2(a, nb, wp, out, y.ld()) };
            } else {
                let s = scratch.as_mut_ptr() as *mut f32;
                let ld = 2 * ROW_GROUP;
                // SAFETY: `scratch` is 32 tokens × 32 floats; the scope is loaded.
                unsafe {
                    let out = [
                        s,
                        s.add(ROW_GROUP),
                        s.add(16 * ld),
                        s.add(16 * ld + ROW_GROUP),
                    ];
                    tile_2x2(a, nb, wp, out, ld);
                }
                for (i, row) in scratch.iter().enumerate().take(n - t0) {
                    for j in 0..if pair { 2 } else { 1 } {
                        let o: &[f32; ROW_GROUP] = row[j * ROW_GROUP..][..ROW_GROUP]
                            .try_into()
                            .expect("16 floats");
                        write_group_row(y, rows.end, t0 + i, g + j, o);
                    }
                }
            }
            t0 += TOKEN_STEP;
        }
        g += if pair { 2 } else { 1 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::int4::LowBitWeights;
    use crate::format::int8::Int8Weights;
    use crate::format::PackedLinear;
    use crate::kernels::quant::layout::Bits;
    use crate::kernels::quant::tests::support::pseudo;
    use crate::model::Tensor;

    fn bf16_f64(bits: u16) -> f64 {
        half::bf16::from_bits(bits).to_f64()
    }

    #[test]
    fn packing_matches_its_scalar_twin_with_zero_padding() {
        if !std::arch::is_x86_feature_detected!("avx512bf16") {
            return;
        }
        for &(n, dim) in &[(1usize, 32usize), (17, 64), (33, 96), (40, 576)] {
            let x = pseudo(n * dim, n as u64 + dim as u64, 3.0);
            let len = padded_tokens(n) * dim;
            let (mut simd, mut twin) = (vec![7u16; len], vec![9u16; len]);
            // SAFETY: the feature was checked; the lengths are whole token tiles.
            unsafe { pack_token_tiles_avx512(&x, dim, &mut simd) };
            pack_token_tiles_scalar(&x, dim, &mut twin);
            assert_eq!(simd, twin, "n {n} dim {dim}");
            // Token t, column c sits where the layout says; padded tokens are zeros.
            let nb = dim / BLOCK;
            for t in 0..padded_tokens(n) {
                for c in (0..dim).step_by(7) {
                    let at =
                        ((t / 16) * nb + c / BLOCK) * TILE_VALUES + (t % 16) * BLOCK + c % BLOCK;
                    let want = if t < n {
                        half::bf16::from_f32(x[t * dim + c]).to_bits()
                    } else {
                        0
                    };
                    assert_eq!(twin[at], want, "t {t} c {c}");
                }
            }
        }
    }

    /// Every row group's dequantization equals the twin (the exact f32 weight, rounded).
    fn check_dequant(packed: &dyn PackedLinear, mut simd: impl FnMut(usize, &mut [u16])) {
        let (rows, cols) = (packed.rows(), packed.cols());
        for g in 0..rows.div_ceil(ROW_GROUP) {
            let twin = dequant_group_scalar(g, cols, |r, out| {
                if r < rows {
                    packed.dequantize_row(r, out)
                } else {
                    out.fill(0.0)
                }
            });
            let mut got = vec![1u16; twin.len()];
            simd(g, &mut got);
            assert_eq!(
                got,
                twin,
                "group {g} of {rows} x {cols} ({})",
                packed.layout_name()
            );
        }
    }

    #[test]
    fn dequantization_matches_its_scalar_twin() {
        if !available() {
            return;
        }
        for &(rows, cols) in &[(16usize, 32usize), (20, 96), (37, 576)] {
            let w = pseudo(rows * cols, rows as u64, 0.05);
            let t = Tensor::new(vec![rows, cols], w);
            let int8 = Int8Weights::quantize(&t, None, "test").unwrap();
            check_dequant(&int8, |g, out| {
                // SAFETY: `available` implies the features; the group is in the matrix.
                unsafe { dequant_int8_group(&int8.tiles(), g, out) }
            });
            for bits in [Bits::B3, Bits::B4, Bits::B5, Bits::B6, Bits::B8] {
                for gs in [32usize, 64, 128] {
                    let lb = LowBitWeights::quantize(&t, bits, gs, None, "test").unwrap();
                    let mut bytes = vec![0u8; cols / BLOCK * BYTE_TILE_BYTES];
                    check_dequant(&lb, |g, out| {
                        // SAFETY: as above.
                        unsafe { dequant_lowbit_group(&lb.tiles(), g, &mut bytes, out) }
                    });
                }
            }
        }
    }

    /// The tiles' products against float64 sums of the same bf16 operands: within 1e-5
    /// of `Σ |w · x|` (float32 sums over at most 576 products), on row slices as threads
    /// cut them, token counts with tails.
    fn check_matmul(
        packed: &dyn PackedLinear,
        run: impl Fn(&Bf16Tiles, Range<usize>, &OutputMatrix),
    ) {
        let (rows, cols) = (packed.rows(), packed.cols());
        for n in [16usize, 17, 31, 32, 45, 70] {
            let x = pseudo(n * cols, n as u64, 1.0);
            let mut data = vec![0u16; padded_tokens(n) * cols];
            pack_token_tiles_scalar(&x, cols, &mut data);
            let tiles = Bf16Tiles {
                data: &data,
                dim: cols,
                n_tokens: n,
            };
            let mut y = vec![f32::NAN; n * rows];
            let out = OutputMatrix::new(&mut y, n, rows);
            let mid = (rows / 2) / ROW_GROUP * ROW_GROUP;
            for r in [0..mid, mid..rows] {
                if !r.is_empty() {
                    run(&tiles, r, &out);
                }
            }
            let mut w = vec![0f32; cols];
            for r in 0..rows {
                packed.dequantize_row(r, &mut w);
                for t in 0..n {
                    let (mut sum, mut abs) = (0f64, 0f64);
                    for c in 0..cols {
                        let p = bf16_f64(half::bf16::from_f32(w[c]).to_bits())
                            * bf16_f64(half::bf16::from_f32(x[t * cols + c]).to_bits());
                        sum += p;
                        abs += p.abs();
                    }
                    let got = y[t * rows + r] as f64;
                    assert!(
                        (got - sum).abs() <= 1e-5 * abs + 1e-30,
                        "{} {rows} x {cols}, {n} tokens: row {r} token {t}: {got} vs {sum}",
                        packed.layout_name()
                    );
                }
            }
        }
    }

    #[test]
    fn products_match_float64_sums_of_the_bf16_operands() {
        if !available() {
            return;
        }
        for &(rows, cols) in &[(16usize, 32usize), (20, 96), (48, 160), (37, 576), (64, 64)] {
            let w = pseudo(rows * cols, rows as u64 * 3 + cols as u64, 0.05);
            let t = Tensor::new(vec![rows, cols], w);
            let int8 = Int8Weights::quantize(&t, None, "test").unwrap();
            check_matmul(&int8, |x, r, y| {
                matmul(Weights::Int8(&int8.tiles()), x, r, y)
            });
            for (bits, gs) in [
                (Bits::B4, 32),
                (Bits::B6, 64),
                (Bits::B3, 128),
                (Bits::B5, 32),
                (Bits::B8, 64),
            ] {
                let lb = LowBitWeights::quantize(&t, bits, gs, None, "test").unwrap();
                check_matmul(&lb, |x, r, y| matmul(Weights::LowBit(&lb.tiles()), x, r, y));
            }
        }
    }
}

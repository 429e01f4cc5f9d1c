//! The 256-bit int8 / low-bit (3- to 8-bit code) matmul tiles, one source that the
//! `avx2` tier (`avx2.rs`: `vpmaddubsw` + `vpmaddwd`) and the `avxvnni` tier
//! (`avxvnni.rs`: `vpdpbusd` ymm in its VEX encoding, Alder Lake and later, and in its
//! AVX512-VNNI + VL encoding) compile with their target features ([`ymm_tier!`]; the
//! low-bit kernels are in `ymm_lowbit.rs`). The `avxvnni` tier runs the VEX instance where
//! the CPU has AVX-VNNI and the EVEX one otherwise, so its logic is tested on every CPU
//! with either extension; only the VEX instruction encoding itself needs an AVX-VNNI CPU.
//!
//! A 16-row group is processed as two 8-row halves (one ymm of i32/f32 lanes each), in
//! sub-tiles of up to [`SUB_TOKENS`] tokens that share every weight load and every weight
//! preparation (offset removal, nibble unpacking). Full bytes (int8 tiles, 8-bit codes) and
//! 4-bit codes walk both halves at once, so each activation quad is broadcast once for 16
//! rows (`quant_kernel_bench` on an AMD Zen 3, one thread: int8 32.4 -> 35.9 GMAC/s; 4-bit
//! codes, whose i16 block sums fit 8 registers for 4 tokens once the float accumulators
//! live in memory, median 38.8 -> 44.0 of 12 alternating runs, `speed` int4 pp512 +6 %);
//! 6-bit codes, which widen every 2 quads, walk the tile once per half. A
//! single token (GEMV, generation) runs both halves in one pass over each tile, so every
//! 64-byte weight line is used whole while it streams in (tokens=1, Zen 3: 8-bit codes 18
//! -> 24-26 GMAC/s, 4-bit 23-25 -> 34), and two row groups in lock step when the driver has
//! a pair to give (two read streams per core: 1 thread int8 7.8 -> 9.0 GB/s from memory).
//!
//! Exact integer block dots, as the scalar specification computes them:
//! - int8 tiles and 8-bit codes (bytes `u` in 0..=255): `vpdpbusd` takes `u` unsigned
//!   directly (`Σ u·a`); `vpmaddubsw` would saturate its i16 pair sums (`255 · 127 · 2 >
//!   32767`), so the AVX2 instance uses `q = u - 128` with the sign trick
//!   (`|q| · sign(a, q)`, pair sums at most `128 · 127 · 2 = 32512`) and computes
//!   `Σ (u - 128)·a`. The accumulator starts at the block sum times whatever offset makes
//!   the result the wanted dot (`Σ (u - 128)·a` for int8, `Σ u·a` for codes).
//! - 4-bit codes (0..=15): `vpmaddubsw` pair sums are at most `15 · 127 · 2 = 3810`, so the
//!   AVX2 instance sums all 8 quads of a block in i16 (at most 30480) and widens once with
//!   `vpmaddwd`; 6-bit codes (0..=63, pairs up to 16002) are widened every 2 quads.
//!
//! Then per block `acc = fma(float(dot), d_w · d_a, acc)` and per column group
//! `acc = fma(m, S, acc)` (low-bit codes), the scalar twin's float operations in its order.
//!
//! What each recipe can gain over float32 on AVX2 without VNNI (`scripts/opmix-microbench.sh`,
//! one thread, 8 independent accumulators, AMD Zen 3; MACs per cycle at the same clock):
//! `vfmadd231ps` 16; the sign trick for full bytes (`vpsignb`, `vpmaddubsw`, `vpmaddwd`,
//! `vpaddd`: 0.79 steps of 32 MACs per cycle) 25, i.e. 1.6x float32; i16 pairs
//! (`vpmaddwd`+`vpaddd`, widened weights) the same 1.6x; small codes summed in i16
//! (`vpmaddubsw`+`vpaddw`) 3.2x. So the 8-bit formats' prompts can be at most ~1.6x
//! float32's before loads, weight preparation and the per-block float steps (measured
//! kernels, `quant_kernel_bench` tokens=512, fastest runs in a quiet spell: float32 47-48,
//! int8 50-51, int4 79-81 GMAC/s per thread), while 4-bit codes have twice that headroom;
//! the nibble-split of 8-bit codes into two 4-bit halves costs two `vpmaddubsw` per 32
//! MACs and gains nothing. Nor does handing part of the columns to the FMA pipes (f32
//! FMAs on converted codes give a 32-column block's integer dot exactly, every partial sum
//! being an integer below 2^24): sign-trick steps and FMAs interleaved 4:4 or 6:2 in one
//! loop ran at 75 and 72 GMAC/s against the sign trick's 79 alone (same run), so the two
//! kinds of work share the pipes rather than add up. Where the int8 tile's time goes
//! (Zen 3, one thread, tokens=512, 47-50 GMAC/s): its inner quad loop alone, copied out of
//! the compiled kernel into a harness with L1-resident operands, runs at 65 GMAC/s (40
//! vector operations per 256 MACs at ~3.2 per cycle; `llvm-mca -mcpu=znver3` predicts the
//! four vector pipes as the bound); dropping the per-block float step (a throwaway build,
//! wrong results) gains 12 %, dropping the block-sum start value or the offset removal
//! (`vpxor`) nothing measurable, unrolling the quad loop by two nothing.
//!
//! Prompts of 8-bit codes on `avx2` widen codes and activations to i16 pairs once per call
//! instead (`vpmaddwd` + `vpaddd` per column pair, half and token: no sign fix, no
//! per-quad weight preparation), as `avx512bw`'s do on zmm (`code8_matmul_i16` in `ymm_lowbit.rs`; the
//! symmetric int8 tiles keep the sign trick). A C loop of the bare block step on an Intel
//! Xeon of the Sapphire Rapids class had measured them alike (21.5-27.3 against the sign
//! trick's 22.3-24.0 multiply-adds per TSC tick for 3-4 tokens); the whole kernel on an AMD
//! Zen 5 (`ISA=avx2 quant_kernel_bench int8`, one thread, 512 tokens, fastest of 8,
//! interleaved) ran 81.3-82.5 GMAC/s against 55.9-77.2, and `speed` int8 pp512 on 2
//! threads 1049-1198 against 999-1085 t/s (four interleaved pairs; one outlier of 711 left
//! out). More than 4 tokens per sub-tile spill. `vpdpbusd` ymm over both halves ran 67-70
//! for 4, 5 and 6 tokens alike and 44-46 for 7 (spills; the Xeon's C loop).

use super::driver::Q8Rows;
use super::layout::{GroupScales, LowBitTiles, BLOCK, ROW_GROUP, SUPER_GROUPS};
use std::arch::x86_64::*;

/// i16 values of one widened block of 16 rows × 32 columns (`code8_matmul_i16`).
pub(crate) const I16_BLOCK: usize = ROW_GROUP * BLOCK;

/// Tokens per sub-tile (the accumulators of 4 tokens and two i32 partial sums fit the 16
/// ymm registers of AVX2 code).
pub const SUB_TOKENS: usize = 4;

/// The operations that differ between the instances.
macro_rules! ops {
    (sign_trick, $features:literal) => {
        /// The full-byte path computes `Σ u·a + FULL8_BIAS · Σa`.
        const FULL8_BIAS: i32 = -128;

        /// Whether the prompt tiles' quad loops may unroll: not here, where the unrolled
        /// loop keeps every prepared weight alive and spills (measured on Zen 3).
        const UNROLL_QUADS: bool = false;

        /// Quads of 3- to 6-bit codes summed in i16 before widening (see the module doc):
        /// pair sums of 3- and 4-bit codes are at most `15 · 128 · 2`, so 8 quads fit;
        /// of 5- and 6-bit codes `63 · 128 · 2`, so 2.
        const fn small_run(bits: u32) -> usize {
            if bits <= 4 {
                8
            } else {
                2
            }
        }

        /// `(|u - 128|, u - 128)` as bytes.
        #[inline]
        #[target_feature(enable = $features)]
        fn full8_prep(w: __m256i) -> [__m256i; 2] {
            let q = _mm256_xor_si256(w, _mm256_set1_epi8(-128));
            [_mm256_abs_epi8(q), q]
        }

        /// `s + Σ_4 (u - 128) · a` per i32 lane.
        #[inline]
        #[target_feature(enable = $features)]
        fn full8_dot(s: __m256i, w: [__m256i; 2], a: __m256i) -> __m256i {
            let p = _mm256_maddubs_epi16(w[0], _mm256_sign_epi8(a, w[1]));
            _mm256_add_epi32(s, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
        }

        /// Accumulates `Σ_4 c · a` of small codes (i16 pair sums).
        #[inline]
        #[target_feature(enable = $features)]
        fn small_acc(s: __m256i, c: __m256i, a: __m256i) -> __m256i {
            _mm256_add_epi16(s, _mm256_maddubs_epi16(c, a))
        }

        /// Widens what [`small_acc`] accumulated to i32 lanes (one per row).
        #[inline]
        #[target_feature(enable = $features)]
        fn small_finish(s: __m256i) -> __m256i {
            _mm256_madd_epi16(s, _mm256_set1_epi16(1))
        }
    };
    (dpbusd $dp:ident, $features:literal) => {
        /// The full-byte path computes `Σ u·a + FULL8_BIAS · Σa`.
        const FULL8_BIAS: i32 = 0;

        /// Whether the prompt tiles' quad loops may unroll: yes, one `vpdpbusd` per product
        /// needs no prepared weights kept (`quant_kernel_bench`, AMD Zen 5, one thread,
        /// `avxvnni`, fastest of 6 interleaved runs: int4 142 -> 158, int8 151 -> 166 GMAC/s).
        const UNROLL_QUADS: bool = true;

        const fn small_run(_bits: u32) -> usize {
            8
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn full8_prep(w: __m256i) -> [__m256i; 2] {
            [w, w]
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn full8_dot(s: __m256i, w: [__m256i; 2], a: __m256i) -> __m256i {
            $dp(s, w[0], a)
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn small_acc(s: __m256i, c: __m256i, a: __m256i) -> __m256i {
            $dp(s, c, a)
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn small_finish(s: __m256i) -> __m256i {
            s
        }
    };
}
pub(crate) use ops;

/// Where one low-bit sub-tile call reads: row group `g`'s code tiles (and 6-bit high-bit
/// tiles), scales and minimums, and token `tok`'s activations, scales and block sums, with
/// the shapes the walks need. Shared by every prompt sub-tile walk of the instances.
#[derive(Clone, Copy)]
pub(crate) struct LowBitGroup {
    pub(crate) codes: *const u8,
    /// The high tiles (3-, 5- and 6-bit codes), else null.
    pub(crate) hbits: *const u8,
    /// The row group's two-level scales and minimums.
    pub(crate) gs: GroupScales,
    pub(crate) xq: *const i8,
    pub(crate) xs: *const f32,
    pub(crate) xbs: *const i32,
    pub(crate) nb: usize,
    pub(crate) ncg: usize,
    /// Blocks per column group.
    pub(crate) bpg: usize,
    pub(crate) dim: usize,
    pub(crate) tile_bytes: usize,
}

impl LowBitGroup {
    /// # Safety
    /// `w` and `x` passed their `check`, `g < w.n_groups()` and `tok < x.n_tokens`, so
    /// every pointer is inside its slice.
    pub(crate) unsafe fn new(w: &LowBitTiles, x: &Q8Rows, g: usize, tok: usize) -> Self {
        let (nb, ncg, dim) = (w.n_blocks(), w.n_col_groups(), x.dim);
        let tile_bytes = w.bits.code_tile_bytes();
        // SAFETY: forwarded contract.
        unsafe {
            LowBitGroup {
                codes: w.nibbles.as_ptr().add(g * nb * tile_bytes),
                hbits: if w.bits.has_high_bits() {
                    w.high_bits.as_ptr().add(g * nb * w.bits.high_tile_bytes())
                } else {
                    std::ptr::null()
                },
                gs: w.group_scales(g),
                xq: x.quants.as_ptr().add(tok * dim),
                xs: x.scales.as_ptr().add(tok * nb),
                xbs: x.block_sums.as_ptr().add(tok * nb),
                nb,
                ncg,
                bpg: w.group_size / BLOCK,
                dim,
                tile_bytes,
            }
        }
    }
}

/// The operands of a prompt of 8-bit codes widened to i16 (`code8_matmul_i16`): a row
/// group's codes and every token's activations.
#[derive(Clone, Copy)]
pub(crate) struct WidenedI16 {
    pub(crate) codes: *const i16,
    pub(crate) acts: *const i16,
}

/// A column group's minimum step for the prompt walks: column group `cg` of the row
/// group's minimums `gs`, token 0's term `S` at `smin` (token `t`'s at `smin + t * ncg`).
#[derive(Clone, Copy)]
pub(crate) struct MinStep {
    pub(crate) gs: GroupScales,
    pub(crate) cg: usize,
    pub(crate) smin: *const f32,
    pub(crate) ncg: usize,
}

impl MinStep {
    /// Column group `cg` of a row group whose minimums `gs` holds, with the sub-tile's
    /// terms `smin` (`ncg` per token).
    pub(crate) fn new(gs: GroupScales, smin: &[f32], ncg: usize, cg: usize) -> Self {
        MinStep {
            gs,
            cg,
            smin: smin[cg..].as_ptr(),
            ncg,
        }
    }
}

/// Where a block's 16 row scales come from, for the float steps int8 tiles and low-bit
/// codes share.
#[derive(Clone, Copy)]
pub(crate) enum RowScales {
    /// 16 f16 values (an `Int8Tiles` block's scales).
    F16(*const u16),
    /// Column group `cg` of a row group's two-level scales (`d = D · sc`).
    TwoLevel(GroupScales, usize),
}

/// Rows `8h..8h + 8` of `s`'s scales as f32 (two-level products are exact).
///
/// # Safety
/// AVX2 and F16C present (inlined into the tiers' kernels, whose features it runs
/// with); `s` points into a checked matrix's scales of one row group, `h < 2`.
#[inline(always)]
pub(crate) unsafe fn scale_half(s: RowScales, h: usize) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        match s {
            RowScales::F16(p) => _mm256_cvtph_ps(_mm_loadu_si128(p.add(h * 8) as *const _)),
            RowScales::TwoLevel(gs, cg) => {
                scale_of_half(gs, cg, h, supers_half(gs, cg / SUPER_GROUPS, h).0)
            }
        }
    }
}

/// Rows `8h..8h + 8` of column group `cg`'s minimums `m = M · mc` (exact).
///
/// # Safety
/// As [`scale_half`].
#[inline(always)]
pub(crate) unsafe fn min_half(gs: GroupScales, cg: usize, h: usize) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe { min_of_half(gs, cg, h, supers_half(gs, cg / SUPER_GROUPS, h).1) }
}

/// Rows `8h..8h + 8` of super-block `sb`'s super-scale `D` and super-minimum `M` as f32:
/// converted once for the [`SUPER_GROUPS`] column groups that share them.
///
/// # Safety
/// As [`scale_half`]; `sb` a super-block of the row group `gs` points at.
#[inline(always)]
pub(crate) unsafe fn supers_half(gs: GroupScales, sb: usize, h: usize) -> (__m256, __m256) {
    // SAFETY: the caller's contract.
    unsafe {
        let at = sb * ROW_GROUP + h * 8;
        (
            _mm256_cvtph_ps(_mm_loadu_si128(gs.sd.add(at) as *const _)),
            _mm256_cvtph_ps(_mm_loadu_si128(gs.sm.add(at) as *const _)),
        )
    }
}

/// Rows `8h..8h + 8` of column group `cg`'s scales `D · sc`, given `D` ([`supers_half`]).
///
/// # Safety
/// As [`supers_half`], `cg` in the super-block `sup_d` belongs to.
#[inline(always)]
pub(crate) unsafe fn scale_of_half(gs: GroupScales, cg: usize, h: usize, sup_d: __m256) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        let sub = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
            gs.sc.add(cg * ROW_GROUP + h * 8) as *const _
        ));
        _mm256_mul_ps(sup_d, _mm256_cvtepi32_ps(sub))
    }
}

/// Rows `8h..8h + 8` of column group `cg`'s minimums `M · mc`, given `M`
/// ([`scale_of_half`]'s twin).
///
/// # Safety
/// As [`scale_of_half`].
#[inline(always)]
pub(crate) unsafe fn min_of_half(gs: GroupScales, cg: usize, h: usize, sup_m: __m256) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        let sub = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
            gs.mc.add(cg * ROW_GROUP + h * 8) as *const _
        ));
        _mm256_mul_ps(sup_m, _mm256_cvtepi32_ps(sub))
    }
}

/// The int8 and low-bit tiles of one 256-bit tier, compiled with `$features`: `sign_trick`
/// (the `avx2` tier) or `dpbusd <intrinsic>` (the `avxvnni` tier's two encodings). Expands
/// to items in the calling module: `int8_tile`, `int8_gemv_pair`, `lowbit_tile`,
/// `lowbit_gemv_pair`, `code8_matmul_i16` are what the dispatcher calls.
macro_rules! ymm_tier {
    ($features:literal, $($kind:tt)+) => {
        use $crate::kernels::quant::driver::*;
        use $crate::kernels::quant::layout::*;
        use $crate::kernels::quant::ymm::*;
        use std::arch::x86_64::*;

        $crate::kernels::quant::ymm::ops!($($kind)+, $features);
        $crate::kernels::quant::ymm_lowbit::ymm_lowbit!($features);

        /// One int8 tile: rows of group `g`, tokens `t0..t0 + n`, into `out[..n]`.
        ///
        /// # Safety
        /// The CPU has the module's features; `w` and `x` passed their `check`,
        /// `g < w.n_groups()`, `t0 + n <= x.n_tokens`, `1 <= n <= TOKEN_TILE`.
        pub unsafe fn int8_tile(
            w: &Int8Tiles,
            x: &Q8Rows,
            g: usize,
            t0: usize,
            n: usize,
            out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
        ) {
            let mut t = 0;
            while t < n {
                let m = (n - t).min(SUB_TOKENS);
                let o = &mut out[t..t + m];
                // SAFETY: forwarded contract; tokens t0+t..t0+t+m are in range.
                unsafe {
                    match m {
                        1 => int8_gemv::<1>(w, x, [g], t0 + t, [&mut o[0]]),
                        2 => int8_sub::<2>(w, x, g, t0 + t, o),
                        3 => int8_sub::<3>(w, x, g, t0 + t, o),
                        _ => int8_sub::<4>(w, x, g, t0 + t, o),
                    }
                }
                t += m;
            }
        }

        /// `N` tokens of an int8 tile with both 8-row halves in one pass (each
        /// activation quad broadcast once for 16 rows; see [`full8_sub_both`]).
        #[target_feature(enable = $features)]
        unsafe fn int8_sub<const N: usize>(
            w: &Int8Tiles,
            x: &Q8Rows,
            g: usize,
            tok: usize,
            out: &mut [[f32; ROW_GROUP]],
        ) {
            let nb = w.n_blocks();
            let dim = x.dim;
            // SAFETY: every pointer stays inside the slices `check` validated: the
            // tiles and scales of group g (blocks < nb), tokens tok..tok+N.
            unsafe {
                let qs = w.qs.as_ptr().add(g * nb * INT8_TILE_BYTES);
                let sc = w.scales.as_ptr().add(g * nb * ROW_GROUP) as *const u16;
                let xq = x.quants.as_ptr().add(tok * dim);
                let xs = x.scales.as_ptr().add(tok * nb);
                let xbs = x.block_sums.as_ptr().add(tok * nb);
                let mut acc = [[_mm256_setzero_ps(); N]; 2];
                for b in 0..nb {
                    let tile = qs.add(b * INT8_TILE_BYTES);
                    if tok == 0 {
                        prefetch_ahead(tile, INT8_TILE_BYTES);
                    }
                    // int8 wants Σ (u - 128)·a.
                    let block = Full8Block {
                    xq: xq.add(b * BLOCK),
                    xbs: xbs.add(b),
                    xs: xs.add(b),
                    dim,
                    nb,
                };
                    full8_block_both::<N>(&mut acc, tile, block, -128 - FULL8_BIAS, RowScales::F16(sc.add(b * ROW_GROUP)), None);
                }
                store_tokens(&acc, out);
            }
        }

        /// One block of `N` tokens' activations: its first quad at `xq` (token `t` at
        /// `xq + t * dim`), block sums at `xbs` and scales at `xs` (token `t` at `+ t *
        /// nb`).
        #[derive(Clone, Copy)]
        struct Full8Block {
            xq: *const i8,
            xbs: *const i32,
            xs: *const f32,
            dim: usize,
            nb: usize,
        }

        /// One block of full-byte dots (16 rows × 32 columns at `tile`, quads 64 bytes
        /// apart, rows 0..8 in the first 32 bytes of each) for `N` tokens, both halves
        /// per activation broadcast: each (half, token) dot starts at `bias · Σa` and
        /// is added by [`finish_block`] with the 16 row scales at `dw` (f16) and `min`.
        ///
        /// # Safety
        /// The module's features; the tile's 512 bytes, each token's 32 activations,
        /// block sum and scale, the 16 scales and `min`'s operands are readable.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn full8_block_both<const N: usize>(
            acc: &mut [[__m256; N]; 2],
            tile: *const u8,
            block: Full8Block,
            bias: i32,
            dw: RowScales,
            min: Option<MinStep>,
        ) {
            let Full8Block { dim, nb, .. } = block;
            // SAFETY: forwarded contract.
            unsafe {
                let mut s = [[_mm256_setzero_si256(); N]; 2];
                for t in 0..N {
                    let init = _mm256_set1_epi32(bias * *block.xbs.add(t * nb));
                    s[0][t] = init;
                    s[1][t] = init;
                }
                let mut quad = 0;
                // Where the instance keeps it rolled (`UNROLL_QUADS`), a loop the
                // compiler keeps: fully unrolled (a constant bound), it orders the work
                // token by token, keeps all prepared weights alive and spills them to the
                // stack (measured slower on Zen 3). The bound is then made opaque once,
                // outside the loop, so it stays in a register.
                let quads = if UNROLL_QUADS { BLOCK / 4 } else { std::hint::black_box(BLOCK / 4) };
                while quad < quads {
                    let wv = [0, 1].map(|h| {
                        full8_prep(_mm256_loadu_si256(tile.add(quad * 64 + h * 32) as *const _))
                    });
                    for t in 0..N {
                        let a = _mm256_set1_epi32(
                            (block.xq.add(t * dim + quad * 4) as *const i32).read_unaligned(),
                        );
                        s[0][t] = full8_dot(s[0][t], wv[0], a);
                        s[1][t] = full8_dot(s[1][t], wv[1], a);
                    }
                    quad += 1;
                }
                finish_block(acc, &s, dw, block.xs, nb, min);
            }
        }

        /// The float steps of one block for both 8-row halves of `N` tokens, each
        /// accumulator loaded and stored once: `acc = fma(float(s), d_w · d_a, acc)`
        /// with the 16 row scales at `dw` (f16) and token `t`'s scale at `xs + t * nb`,
        /// then, when the block ends a column group (`min` is given), that group's
        /// minimum step `acc = fma(m, S, acc)`: per (half, token) the specification's
        /// order.
        ///
        /// # Safety
        /// The module's features; 16 scales at `dw`, `N` token scales, and `min`'s
        /// operands are readable.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn finish_block<const N: usize>(
            acc: &mut [[__m256; N]; 2],
            s: &[[__m256i; N]; 2],
            dw: RowScales,
            xs: *const f32,
            nb: usize,
            min: Option<MinStep>,
        ) {
            // SAFETY: forwarded contract.
            unsafe {
                for h in 0..2 {
                    let dw = scale_half(dw, h);
                    let mw = min.map(|m| min_half(m.gs, m.cg, h));
                    for t in 0..N {
                        let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*xs.add(t * nb)));
                        let mut a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[h][t]), scale, acc[h][t]);
                        if let (Some(m), Some(mw)) = (min, mw) {
                            a = _mm256_fmadd_ps(mw, _mm256_set1_ps(*m.smin.add(t * m.ncg)), a);
                        }
                        acc[h][t] = a;
                    }
                }
            }
        }

        /// Stores both halves of `N` tokens' accumulators into their outputs.
        #[inline]
        #[target_feature(enable = $features)]
        fn store_tokens<const N: usize>(acc: &[[__m256; N]; 2], out: &mut [[f32; ROW_GROUP]]) {
            for (h, acc_h) in acc.iter().enumerate() {
                for (o, a) in out.iter_mut().zip(acc_h) {
                    let (lo, hi) = o.split_at_mut(8);
                    let half = if h == 0 { lo } else { hi };
                    // SAFETY: 8 floats.
                    unsafe { _mm256_storeu_ps(half.as_mut_ptr(), *a) };
                }
            }
        }

        /// The 3- to 6-bit codes of quad `quad` (0..8) of a block, this 8-row half: the
        /// low or high nibbles of `v` (the nibble tile's 64-byte line `quad % 4`; unused
        /// for 3-bit codes), and from [`code_aux`]'s registers `aux` the 6-bit codes' bits
        /// 2j..2j+1 of the pair line `aux[quad / 4]` moved to bits 4..5, the 5-bit codes'
        /// bit `quad` of the bit line `aux[2]` moved to bit 4, or the 3-bit codes' pair of
        /// `aux[quad / 4]` (bits 0..1) and bit of `aux[2]` (bit 2). 16-bit shifts; the
        /// bits they carry across a byte are masked off.
        #[inline]
        #[target_feature(enable = $features)]
        fn small_codes<const BITS: u32>(v: __m256i, aux: [__m256i; 3], quad: usize) -> __m256i {
            // Bit `from` of each byte of `x` to bit `to` (other bits for the caller to mask).
            let moved = |x: __m256i, from: usize, to: usize| {
                if from <= to {
                    _mm256_sll_epi16(x, _mm_cvtsi32_si128((to - from) as i32))
                } else {
                    _mm256_srl_epi16(x, _mm_cvtsi32_si128((from - to) as i32))
                }
            };
            if BITS == 3 {
                let pair = _mm256_and_si256(
                    moved(aux[quad / 4], 2 * (quad % 4), 0),
                    _mm256_set1_epi8(3),
                );
                let bit = _mm256_and_si256(moved(aux[2], quad, 2), _mm256_set1_epi8(4));
                return _mm256_or_si256(pair, bit);
            }
            let low4 = _mm256_set1_epi8(0x0F);
            let c = if quad < 4 {
                _mm256_and_si256(v, low4)
            } else {
                _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4)
            };
            if BITS == 5 {
                let bit = _mm256_and_si256(moved(aux[2], quad, 4), _mm256_set1_epi8(0x10));
                return _mm256_or_si256(c, bit);
            }
            if BITS != 6 {
                return c;
            }
            let hv = aux[quad / 4];
            let placed = match quad % 4 {
                0 => _mm256_slli_epi16::<4>(hv),
                1 => _mm256_slli_epi16::<2>(hv),
                2 => hv,
                _ => _mm256_srli_epi16::<2>(hv),
            };
            _mm256_or_si256(c, _mm256_and_si256(placed, _mm256_set1_epi8(0x30)))
        }

        /// The registers [`small_codes`] takes besides the nibbles, for one 8-row half of
        /// a block whose code tile's half starts at `tile` and high tile's half at `high`
        /// (both already `h * 32` in): the pair lines (6-bit codes' high tile, 3-bit codes'
        /// code tile) and the bit line (3- and 5-bit codes' high tile); zeros elsewhere.
        ///
        /// # Safety
        /// The module's features; the tiles `BITS`-bit codes have are readable there.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn code_aux<const BITS: u32>(tile: *const u8, high: *const u8) -> [__m256i; 3] {
            let load = |p: *const u8| {
                // SAFETY: the caller's contract.
                unsafe { _mm256_loadu_si256(p as *const _) }
            };
            let zero = _mm256_setzero_si256();
            // SAFETY (the offsets): inside the tiles the caller's contract covers.
            unsafe {
                match BITS {
                    3 => [load(tile), load(tile.add(64)), load(high)],
                    5 => [zero, zero, load(high)],
                    6 => [load(high), load(high.add(64)), zero],
                    _ => [zero; 3],
                }
            }
        }

        /// The nibble line of quad `quad` of one 8-row half whose code tile's half starts
        /// at `tile` (zeros for 3-bit codes, which have no nibble tile).
        ///
        /// # Safety
        /// The module's features; the code tile is readable.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn nibble_line<const BITS: u32>(tile: *const u8, quad: usize) -> __m256i {
            if BITS == 3 {
                return _mm256_setzero_si256();
            }
            // SAFETY: the caller's contract (a nibble tile's line `quad % 4`).
            unsafe { _mm256_loadu_si256(tile.add((quad % 4) * 64) as *const _) }
        }

        /// `acc[h] = fma(float(s[h]), d_w · d_a, acc[h])` for both 8-row halves, the
        /// weight scales of the 16 rows at `dw` (f16), the activation scale `da`.
        ///
        /// # Safety
        /// The module's features; 16 scales readable at `dw`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn add_scaled_halves(acc: &mut [__m256; 2], s: [__m256i; 2], dw: RowScales, da: __m256) {
            // SAFETY: forwarded contract.
            let dw = unsafe { [scale_half(dw, 0), scale_half(dw, 1)] };
            add_scaled(acc, s, dw, da);
        }

        /// [`add_scaled_halves`] with the 16 row scales already as f32 halves (a column
        /// group's, formed once for its blocks).
        #[inline]
        #[target_feature(enable = $features)]
        fn add_scaled(acc: &mut [__m256; 2], s: [__m256i; 2], dw: [__m256; 2], da: __m256) {
            for h in 0..2 {
                acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[h]), _mm256_mul_ps(dw[h], da), acc[h]);
            }
        }

        /// Stores each group's two halves of accumulators into its 16 outputs.
        #[inline]
        #[target_feature(enable = $features)]
        fn store_groups<const G: usize>(acc: [[__m256; 2]; G], outs: [&mut [f32; ROW_GROUP]; G]) {
            for (acc, out) in acc.into_iter().zip(outs) {
                let (lo, hi) = out.split_at_mut(8);
                // SAFETY: 8 floats each.
                unsafe {
                    _mm256_storeu_ps(lo.as_mut_ptr(), acc[0]);
                    _mm256_storeu_ps(hi.as_mut_ptr(), acc[1]);
                }
            }
        }

        /// One token of an int8 tile with both 8-row halves in one pass (GEMV): each
        /// 64-byte weight line is used whole as it streams in and each activation quad
        /// is broadcast once, where the token-tile path walks the tiles once per half.
        /// `G` row groups (1 or 2) are walked in lock step, block by block: two
        /// sequential read streams keep more of the memory system busy than one (see
        /// [`int8_gemv_pair`]); each group's operations are those of the one-group walk.
        #[target_feature(enable = $features)]
        unsafe fn int8_gemv<const G: usize>(
            w: &Int8Tiles,
            x: &Q8Rows,
            groups: [usize; G],
            tok: usize,
            outs: [&mut [f32; ROW_GROUP]; G],
        ) {
            let nb = w.n_blocks();
            // SAFETY: as `int8_sub` with N = 1, for each group.
            unsafe {
                let qs = groups.map(|g| w.qs.as_ptr().add(g * nb * INT8_TILE_BYTES));
                let sc = groups.map(|g| w.scales.as_ptr().add(g * nb * ROW_GROUP) as *const u16);
                let xq = x.quants.as_ptr().add(tok * x.dim);
                let xs = x.scales.as_ptr().add(tok * nb);
                let xbs = x.block_sums.as_ptr().add(tok * nb);
                let mut acc = [[_mm256_setzero_ps(); 2]; G];
                for b in 0..nb {
                    // int8 wants Σ (u - 128)·a.
                    let init = _mm256_set1_epi32((-128 - FULL8_BIAS) * *xbs.add(b));
                    let da = _mm256_set1_ps(*xs.add(b));
                    for k in 0..G {
                        let tile = qs[k].add(b * INT8_TILE_BYTES);
                        prefetch_ahead(tile, INT8_TILE_BYTES);
                        let s = full8_both_halves(init, tile, xq.add(b * BLOCK));
                        add_scaled_halves(&mut acc[k], s, RowScales::F16(sc[k].add(b * ROW_GROUP)), da);
                    }
                }
                store_groups(acc, outs);
            }
        }

        /// One token of int8 row groups `ga` and `gb` (GEMV), read as two streams in
        /// lock step; `out[0]` gets group `ga`, `out[1]` group `gb`, each exactly as
        /// [`int8_tile`] computes it.
        ///
        /// # Safety
        /// As [`int8_tile`] for both groups, with `tok < x.n_tokens`.
        pub unsafe fn int8_gemv_pair(
            w: &Int8Tiles,
            x: &Q8Rows,
            ga: usize,
            gb: usize,
            tok: usize,
            out: &mut [[f32; ROW_GROUP]; 2],
        ) {
            let [oa, ob] = out;
            // SAFETY: forwarded contract.
            unsafe { int8_gemv::<2>(w, x, [ga, gb], tok, [oa, ob]) }
        }

        /// `init + Σ u·a + FULL8_BIAS · Σa` per row: the full-byte dots of one 16-row ×
        /// 32-column tile at `tile` (quads 64 bytes apart, rows 0..8 in the first 32
        /// bytes of each) with one token's 32 activations at `xq`, as two 8-row halves.
        ///
        /// # Safety
        /// The module's features; the tile's 512 bytes and the 32 activations are
        /// readable.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn full8_both_halves(init: __m256i, tile: *const u8, xq: *const i8) -> [__m256i; 2] {
            let mut s = [init; 2];
            // SAFETY: forwarded contract.
            unsafe {
                for quad in 0..BLOCK / 4 {
                    let a = _mm256_set1_epi32((xq.add(quad * 4) as *const i32).read_unaligned());
                    for (h, s_h) in s.iter_mut().enumerate() {
                        let wv = full8_prep(_mm256_loadu_si256(
                            tile.add(quad * 64 + h * 32) as *const _,
                        ));
                        *s_h = full8_dot(*s_h, wv, a);
                    }
                }
            }
            s
        }

        /// The integer dots of one block of low-bit codes (16 rows × 32 columns at
        /// `tile`, the high tile at `hbits` for 3-, 5- and 6-bit codes) with one token's 32
        /// activations at `xq` (block sum `xbs`), as two 8-row halves: `Σ u·a`.
        ///
        /// # Safety
        /// The module's features; the tile (and high-bit tile) and the activations
        /// are readable.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn lowbit_block_both_halves<const BITS: u32>(
            tile: *const u8,
            hbits: *const u8,
            xq: *const i8,
            xbs: i32,
        ) -> [__m256i; 2] {
            // SAFETY: forwarded contract.
            unsafe {
                if BITS == 8 {
                    // codes want Σ u·a: start at -FULL8_BIAS · Σa.
                    let init = _mm256_set1_epi32(-FULL8_BIAS * xbs);
                    return full8_both_halves(init, tile, xq);
                }
                let aux = [0, 1].map(|h| {
                    code_aux::<BITS>(tile.wrapping_add(h * 32), hbits.wrapping_add(h * 32))
                });
                let run = small_run(BITS);
                let mut s = [_mm256_setzero_si256(); 2];
                let mut s16 = [_mm256_setzero_si256(); 2];
                for quad in 0..BLOCK / 4 {
                    let a = _mm256_set1_epi32((xq.add(quad * 4) as *const i32).read_unaligned());
                    for h in 0..2 {
                        let v = nibble_line::<BITS>(tile.add(h * 32), quad);
                        let c = small_codes::<BITS>(v, aux[h], quad);
                        s16[h] = small_acc(s16[h], c, a);
                    }
                    if (quad + 1) % run == 0 {
                        for h in 0..2 {
                            s[h] = _mm256_add_epi32(s[h], small_finish(s16[h]));
                            s16[h] = _mm256_setzero_si256();
                        }
                    }
                }
                s
            }
        }

    };
}
pub(crate) use ymm_tier;

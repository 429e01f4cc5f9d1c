//! AVX-512BW int8 / low-bit matmul tiles for CPUs without AVX512-VNNI (Skylake-SP,
//! Cascade Lake-class): the VNNI kernels' layout and loop structure (a 16-row group in the
//! 16 lanes of one zmm, up to 8 tokens sharing every weight load and unpack), with
//! `vpmaddubsw` (u8 × i8, i16 pair sums) + `vpmaddwd` (widening to i32) in place of
//! `vpdpbusd`.
//!
//! Exactness (see `ymm.rs` for the same rules on ymm):
//! - int8 tiles and 8-bit codes (bytes `u` in 0..=255) would saturate `vpmaddubsw`'s pair
//!   sums (`255 · 127 · 2 > 32767`), so the weights become `q = u - 128` and the product is
//!   `|q| · sign(a, q)` (pairs at most `128 · 127 · 2 = 32512`). AVX-512 has no `vpsignb`:
//!   the sign is applied with a byte-masked subtraction from zero, the mask being `q`'s
//!   sign bits (computed once per weight vector, shared by the tokens). The accumulator
//!   starts at `128 · Σa` for codes (which want `Σ u·a`) and at 0 for int8.
//! - 3- and 4-bit codes: pair sums at most `15 · 128 · 2 = 3840`, so a block's 8 quads are
//!   summed in i16 (at most 30720) and widened once; 5- and 6-bit codes (pairs up to
//!   `63 · 128 · 2 = 16128`) every 2 quads.
//!
//! Cost per 16 rows × 32 columns × token (vector ALU instructions; the broadcast loads of
//! activation quads are load-port work): int8 32 (`vpsubb`{k}, `vpmaddubsw`, `vpmaddwd`,
//! `vpaddd` per quad), 4-bit codes 16, 6-bit 19, versus 8 `vpdpbusd` with VNNI and 32
//! `vfmadd` for the same 512 multiply-adds in float32; plus 3 per block for the scale.
//!
//! Register blocking does not change that for the sign trick as it does for `vpdpbusd`
//! (two row groups × 6 tokens in `avx512vnni.rs`'s byte tiles): the sign fix is made per
//! weight register and token, so a broadcast activation shared by two groups still costs 4
//! operations per group. Measured on a Xeon (Sapphire Rapids class; a C loop of the 8-bit
//! block step on L1-resident data, multiply-adds per TSC tick): 1 group × 8 tokens 33.8,
//! 2 × 4 30.5, 2 × 6 33.2, 3 × 4 31.2, against float32 FMA tiles of 1 × 8 35.2 and 2 × 6
//! 37.8. So prompts of 8-bit codes take another road, [`code8_matmul_i16`]: codes and
//! activations widened to i16 once per call, `vpmaddwd` + `vpaddd` per column pair (the
//! same 32 instructions per block and token, but no sign fix, no per-quad weight
//! preparation and no offset start), two row groups × 6 tokens: 2 × 4 37.1 in the same C
//! loop; `quant_kernel_bench int8` (512 tokens, one thread) 71 -> 81-86 GMAC/s, float32
//! 68-77; `speed` pp512 int8 908-976 -> 990-1061 t/s with float32 at 892-945. The
//! single-token and short-batch paths keep the byte tiles (no widening to amortize).

use super::driver::{acts_i16_all, drive_row_group_pairs, prefetch_ahead, Q8Rows, TOKEN_TILE};
use super::layout::{
    code_bytes, high_bytes, Bits, Int8Tiles, LowBitTiles, BLOCK, BYTE_TILE_BYTES, INT8_TILE_BYTES,
    ROW_GROUP, SUPER_GROUPS,
};
use super::zmm::{code_tiles_zmm, mins_of_zmm, scales_of_zmm, supers_zmm, unpack_zmm};
use std::arch::x86_64::*;

/// One int8 tile: rows of group `g`, tokens `t0..t0 + n`, into `out[..n]`.
///
/// # Safety
/// AVX-512 F/BW present; `w` and `x` passed their `check`, `g < w.n_groups()`,
/// `t0 + n <= x.n_tokens`, `1 <= n <= TOKEN_TILE`.
pub unsafe fn int8_tile(
    w: &Int8Tiles,
    x: &Q8Rows,
    g: usize,
    t0: usize,
    n: usize,
    out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
) {
    // SAFETY: forwarded contract.
    unsafe {
        match n {
            1 => int8_n::<1>(w, x, g, t0, out),
            2 => int8_n::<2>(w, x, g, t0, out),
            3 => int8_n::<3>(w, x, g, t0, out),
            4 => int8_n::<4>(w, x, g, t0, out),
            5 => int8_n::<5>(w, x, g, t0, out),
            6 => int8_n::<6>(w, x, g, t0, out),
            7 => int8_n::<7>(w, x, g, t0, out),
            8 => int8_n::<8>(w, x, g, t0, out),
            _ => unreachable!("token tile of {n}"),
        }
    }
}

/// `s + Σ_4 (u - 128) · a` per i32 lane, given `|u - 128|` and the mask of `u < 128`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn full8_dot(s: __m512i, wabs: __m512i, neg: __mmask64, a: __m512i) -> __m512i {
    let signed = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
    let p = _mm512_maddubs_epi16(wabs, signed);
    _mm512_add_epi32(s, _mm512_madd_epi16(p, _mm512_set1_epi16(1)))
}

/// `(|u - 128|, mask of u - 128 < 0)` of 64 weight bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn full8_prep(u: __m512i) -> (__m512i, __mmask64) {
    let q = _mm512_xor_si512(u, _mm512_set1_epi8(-128));
    (_mm512_abs_epi8(q), _mm512_movepi8_mask(q))
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn int8_n<const N: usize>(
    w: &Int8Tiles,
    x: &Q8Rows,
    g: usize,
    t0: usize,
    out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
) {
    let nb = w.n_blocks();
    let dim = x.dim;
    // SAFETY: every pointer stays inside the slices `check` validated: tiles and scales of
    // group g (blocks < nb), activations of tokens t0..t0+N.
    unsafe {
        let qs = w.qs.as_ptr().add(g * nb * INT8_TILE_BYTES);
        let sc = w.scales.as_ptr().add(g * nb * ROW_GROUP) as *const u16;
        let xq = x.quants.as_ptr().add(t0 * dim);
        let xs = x.scales.as_ptr().add(t0 * nb);
        let mut acc = [_mm512_setzero_ps(); N];
        for b in 0..nb {
            let tile = qs.add(b * INT8_TILE_BYTES);
            prefetch_ahead(tile, INT8_TILE_BYTES);
            let mut s = [_mm512_setzero_si512(); N];
            for quad in 0..BLOCK / 4 {
                let (wabs, neg) = full8_prep(_mm512_loadu_si512(tile.add(quad * 64) as *const _));
                for (t, s_t) in s.iter_mut().enumerate() {
                    let a = (xq.add(t * dim + b * BLOCK + quad * 4) as *const i32).read_unaligned();
                    *s_t = full8_dot(*s_t, wabs, neg, _mm512_set1_epi32(a));
                }
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(sc.add(b * ROW_GROUP) as *const _));
            for (t, acc_t) in acc.iter_mut().enumerate() {
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*xs.add(t * nb + b)));
                *acc_t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), scale, *acc_t);
            }
        }
        for (t, acc_t) in acc.iter().enumerate() {
            _mm512_storeu_ps(out[t].as_mut_ptr(), *acc_t);
        }
    }
}

/// One low-bit tile (3-, 4-, 5-, 6- or 8-bit codes); `s` holds the tokens' minimum terms
/// `[t * n_col_groups + cg]` for `t < n`.
///
/// # Safety
/// As [`int8_tile`], and `s.len() >= n * w.n_col_groups()`.
pub unsafe fn lowbit_tile(
    w: &LowBitTiles,
    x: &Q8Rows,
    s: &[f32],
    g: usize,
    t0: usize,
    n: usize,
    out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
) {
    // SAFETY: forwarded contract.
    unsafe {
        match w.bits {
            Bits::B3 => lowbit_tokens::<3>(w, x, s, g, t0, n, out),
            Bits::B4 => lowbit_tokens::<4>(w, x, s, g, t0, n, out),
            Bits::B5 => lowbit_tokens::<5>(w, x, s, g, t0, n, out),
            Bits::B6 => lowbit_tokens::<6>(w, x, s, g, t0, n, out),
            Bits::B8 => lowbit_tokens::<8>(w, x, s, g, t0, n, out),
        }
    }
}

/// [`lowbit_tile`] for `BITS`-bit codes: the kernel for `n` tokens.
///
/// # Safety
/// As [`lowbit_tile`], and `w.bits` is `BITS`.
#[inline(always)]
unsafe fn lowbit_tokens<const BITS: u32>(
    w: &LowBitTiles,
    x: &Q8Rows,
    s: &[f32],
    g: usize,
    t0: usize,
    n: usize,
    out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
) {
    // SAFETY: forwarded contract.
    unsafe {
        match n {
            1 => lowbit_n::<1, BITS>(w, x, s, g, t0, out),
            2 => lowbit_n::<2, BITS>(w, x, s, g, t0, out),
            3 => lowbit_n::<3, BITS>(w, x, s, g, t0, out),
            4 => lowbit_n::<4, BITS>(w, x, s, g, t0, out),
            5 => lowbit_n::<5, BITS>(w, x, s, g, t0, out),
            6 => lowbit_n::<6, BITS>(w, x, s, g, t0, out),
            7 => lowbit_n::<7, BITS>(w, x, s, g, t0, out),
            8 => lowbit_n::<8, BITS>(w, x, s, g, t0, out),
            _ => unreachable!("token tile of {n}"),
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn lowbit_n<const N: usize, const BITS: u32>(
    w: &LowBitTiles,
    x: &Q8Rows,
    smin: &[f32],
    g: usize,
    t0: usize,
    out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
) {
    let nb = w.n_blocks();
    let ncg = w.n_col_groups();
    let bpg = w.group_size / BLOCK;
    let dim = x.dim;
    let (tile_bytes, high_bytes) = (code_bytes(BITS), high_bytes(BITS));
    // SAFETY: every pointer stays inside the slices `check` validated: code (and high-bit)
    // tiles of group g, blocks < nb, scales/mins of column groups < ncg, tokens t0..t0+N.
    unsafe {
        let codes = w.nibbles.as_ptr().add(g * nb * tile_bytes);
        let hbits = w.high_bits.as_ptr().wrapping_add(g * nb * high_bytes);
        let gs = w.group_scales(g);
        let xq = x.quants.as_ptr().add(t0 * dim);
        let xs = x.scales.as_ptr().add(t0 * nb);
        let xbs = x.block_sums.as_ptr().add(t0 * nb);
        let ones = _mm512_set1_epi16(1);
        let mut acc = [_mm512_setzero_ps(); N];
        let mut sup = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for cg in 0..ncg {
            if cg % SUPER_GROUPS == 0 {
                sup = supers_zmm(gs, cg / SUPER_GROUPS);
            }
            let dw = scales_of_zmm(gs, cg, sup.0);
            for b in cg * bpg..((cg + 1) * bpg).min(nb) {
                let tile = codes.add(b * tile_bytes);
                prefetch_ahead(tile, tile_bytes);
                let act = |t: usize, quad: usize| {
                    _mm512_set1_epi32(
                        (xq.add(t * dim + b * BLOCK + quad * 4) as *const i32).read_unaligned(),
                    )
                };
                let mut s = [_mm512_setzero_si512(); N];
                if BITS == 8 {
                    for (t, s_t) in s.iter_mut().enumerate() {
                        // Σ u·a = Σ (u - 128)·a + 128 Σa.
                        *s_t = _mm512_set1_epi32(128 * *xbs.add(t * nb + b));
                    }
                    for quad in 0..BLOCK / 4 {
                        let (wabs, neg) =
                            full8_prep(_mm512_loadu_si512(tile.add(quad * 64) as *const _));
                        for (t, s_t) in s.iter_mut().enumerate() {
                            *s_t = full8_dot(*s_t, wabs, neg, act(t, quad));
                        }
                    }
                } else {
                    let hb = hbits.wrapping_add(b * high_bytes);
                    let c = unpack_zmm::<BITS>(tile, hb);
                    for (t, s_t) in s.iter_mut().enumerate() {
                        if BITS <= 4 {
                            let mut p = _mm512_maddubs_epi16(c[0], act(t, 0));
                            for (quad, cq) in c.iter().enumerate().skip(1) {
                                p = _mm512_add_epi16(p, _mm512_maddubs_epi16(*cq, act(t, quad)));
                            }
                            *s_t = _mm512_madd_epi16(p, ones);
                        } else {
                            for pair in 0..4 {
                                let p = _mm512_add_epi16(
                                    _mm512_maddubs_epi16(c[2 * pair], act(t, 2 * pair)),
                                    _mm512_maddubs_epi16(c[2 * pair + 1], act(t, 2 * pair + 1)),
                                );
                                *s_t = _mm512_add_epi32(*s_t, _mm512_madd_epi16(p, ones));
                            }
                        }
                    }
                }
                for (t, acc_t) in acc.iter_mut().enumerate() {
                    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*xs.add(t * nb + b)));
                    *acc_t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), scale, *acc_t);
                }
            }
            let mw = mins_of_zmm(gs, cg, sup.1);
            for (t, acc_t) in acc.iter_mut().enumerate() {
                *acc_t = _mm512_fmadd_ps(mw, _mm512_set1_ps(smin[t * ncg + cg]), *acc_t);
            }
        }
        for (t, acc_t) in acc.iter().enumerate() {
            _mm512_storeu_ps(out[t].as_mut_ptr(), *acc_t);
        }
    }
}

/// Prompts of 8-bit codes (the `int8` format, the int4 mix's 8-bit tensors) on i16 pairs:
/// the activations of the call and each pair of row groups' codes are widened to i16
/// once, and a block of 16 rows × 32 columns × 1 token is then 16 `vpmaddwd` + 16
/// `vpaddd` (`u · a` exact in i16 × i16 products, pair sums up to `2 · 255 · 127` in
/// i32), with no sign fix, no per-quad weight preparation and no offset correction (the
/// codes are taken as the unsigned values they are, so the block dot is `Σ u·a`, the
/// specification's, directly). Row groups two at a time × [`PAIR_TOKENS`](super::PAIR_TOKENS) tokens, as the
/// VNNI tiles (`drive_row_group_pairs`). Measured on a Xeon (a C loop of the block step on
/// L1-resident data, multiply-adds per TSC tick): the sign trick 1 × 8 31-32, i16 pairs
/// 1 × 8 34.7, 2 × 4 37.1, 2 × 6 35.8-36.9, float32 FMA tiles 35-38.
///
/// # Safety
/// AVX-512 F/BW present; `w` and `x` checked against each other and `rows`, `w.bits ==
/// 8`, `s_all` holds every token's minimum terms (`n_tokens * n_col_groups`).
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn code8_matmul_i16(
    w: &LowBitTiles,
    x: &Q8Rows,
    s_all: &[f32],
    rows: std::ops::Range<usize>,
    y: &crate::kernels::OutputMatrix,
) {
    assert_eq!(w.bits, Bits::B8);
    let nb = w.n_blocks();
    let ncg = w.n_col_groups();
    let acts = acts_i16_all(x);
    let mut codes = [vec![0i16; nb * I16_BLOCK], vec![0i16; nb * I16_BLOCK]];
    let mut widened = [usize::MAX; 2];
    drive_row_group_pairs(rows, x.n_tokens, y, |g, count, t0, n, out| {
        let s = &s_all[t0 * ncg..(t0 + n) * ncg];
        let mut ptrs = [std::ptr::null(); 2];
        for j in 0..count {
            if widened[j] != g + j {
                let tiles = &w.nibbles[(g + j) * nb * BYTE_TILE_BYTES..][..nb * BYTE_TILE_BYTES];
                // SAFETY: AVX-512 F/BW (this function's contract).
                unsafe { widen_codes_i16(tiles, &mut codes[j]) };
                widened[j] = g + j;
            }
            ptrs[j] = codes[j].as_ptr();
        }
        let a = acts[t0 * x.dim..].as_ptr();
        let two = WidenedI16 {
            codes: ptrs,
            acts: a,
        };
        let one_g = WidenedI16 {
            codes: [ptrs[0]],
            acts: a,
        };
        // SAFETY: forwarded contract; `ptrs[..count]` hold the groups' widened codes,
        // `a` tokens t0..t0 + n of the widened activations.
        unsafe {
            match (count, n) {
                (2, 1) => code8_i16::<2, 1>(w, two, x, s, [g, g + 1], t0, out),
                (2, 2) => code8_i16::<2, 2>(w, two, x, s, [g, g + 1], t0, out),
                (2, 3) => code8_i16::<2, 3>(w, two, x, s, [g, g + 1], t0, out),
                (2, 4) => code8_i16::<2, 4>(w, two, x, s, [g, g + 1], t0, out),
                (2, 5) => code8_i16::<2, 5>(w, two, x, s, [g, g + 1], t0, out),
                (2, 6) => code8_i16::<2, 6>(w, two, x, s, [g, g + 1], t0, out),
                (1, n) => {
                    let one = std::array::from_mut(&mut out[0]);
                    match n {
                        1 => code8_i16::<1, 1>(w, one_g, x, s, [g], t0, one),
                        2 => code8_i16::<1, 2>(w, one_g, x, s, [g], t0, one),
                        3 => code8_i16::<1, 3>(w, one_g, x, s, [g], t0, one),
                        4 => code8_i16::<1, 4>(w, one_g, x, s, [g], t0, one),
                        5 => code8_i16::<1, 5>(w, one_g, x, s, [g], t0, one),
                        _ => code8_i16::<1, 6>(w, one_g, x, s, [g], t0, one),
                    }
                }
                _ => unreachable!("{count} groups × {n} tokens"),
            }
        }
    });
}

/// i16 values of one block of 16 rows × 32 columns: 16 column pairs × 16 rows × 2.
const I16_BLOCK: usize = ROW_GROUP * BLOCK;

/// A row group's byte tiles (`quad * 64 + row * 4 + k`: column `4 quad + k`) as i16
/// column pairs: per block, pair `p` (columns `2p`, `2p + 1`) is 16 i32 lanes, lane `r`
/// holding row `r`'s two codes (the lower column in the low half).
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn widen_codes_i16(tiles: &[u8], out: &mut [i16]) {
    let nb = tiles.len() / BYTE_TILE_BYTES;
    assert!(out.len() >= nb * I16_BLOCK);
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for b in 0..nb {
        for quad in 0..BLOCK / 4 {
            let src = &tiles[b * BYTE_TILE_BYTES + quad * 64..][..64];
            let dst = &mut out[b * I16_BLOCK + quad * 2 * 32..][..64];
            // SAFETY: 64 bytes read from a 64-byte slice, 2 × 64 written to 64 i16.
            unsafe {
                let v = _mm512_loadu_si512(src.as_ptr() as *const _);
                // Rows 0-7 and 8-15, each row's four codes as i16: i32 lanes alternate
                // the row's pairs (4 quad, 4 quad + 1) and (4 quad + 2, 4 quad + 3).
                let lo = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(v));
                let hi = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64::<1>(v));
                _mm512_storeu_si512(
                    dst.as_mut_ptr() as *mut _,
                    _mm512_permutex2var_epi32(lo, even, hi),
                );
                _mm512_storeu_si512(
                    dst.as_mut_ptr().add(32) as *mut _,
                    _mm512_permutex2var_epi32(lo, odd, hi),
                );
            }
        }
    }
}

/// The operands of [`code8_i16`]: `G` row groups' codes widened to i16 and the call's
/// tokens' widened activations.
#[derive(Clone, Copy)]
struct WidenedI16<const G: usize> {
    codes: [*const i16; G],
    acts: *const i16,
}

/// `G` row groups' i16 codes (`codes[j]`, [`widen_codes_i16`]) × tokens `t0..t0 + N`
/// (`acts`: their widened activations, rows of `x.dim`) into `out[j][..N]`: exact block
/// dots, then the specification's float steps in its order (`code_tiles_zmm`).
///
/// # Safety
/// AVX-512 F/BW; as [`code8_matmul_i16`], each `codes[j]` holds `n_blocks` widened blocks
/// of group `groups[j]`, `acts` `N` rows, `s` `N` tokens' minimum terms.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn code8_i16<const G: usize, const N: usize>(
    w: &LowBitTiles,
    wide: WidenedI16<G>,
    x: &Q8Rows,
    s: &[f32],
    groups: [usize; G],
    t0: usize,
    out: &mut [[[f32; ROW_GROUP]; TOKEN_TILE]; G],
) {
    let WidenedI16 { codes, acts } = wide;
    let dim = x.dim;
    // SAFETY: the reads stay in the caller's buffers (`N` activation rows, `n_blocks`
    // widened blocks per group); the rest is `code_tiles_zmm`'s contract.
    unsafe {
        code_tiles_zmm::<G, N>(w, x, s, groups, t0, out, |b| {
            let mut d = [[_mm512_setzero_si512(); N]; G];
            for p in 0..BLOCK / 2 {
                let mut wv = [_mm512_setzero_si512(); G];
                for j in 0..G {
                    wv[j] = _mm512_loadu_si512(codes[j].add(b * I16_BLOCK + p * 32) as *const _);
                }
                for t in 0..N {
                    let a = (acts.add(t * dim + b * BLOCK + 2 * p) as *const i32).read_unaligned();
                    let a = _mm512_set1_epi32(a);
                    for j in 0..G {
                        d[j][t] = _mm512_add_epi32(d[j][t], _mm512_madd_epi16(wv[j], a));
                    }
                }
            }
            d
        })
    }
}

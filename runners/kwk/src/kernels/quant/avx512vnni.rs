//! The `vnni` tier's quantized tiles (AVX-512 F/BW + VNNI, `vpdpbusd` on zmm): int8 tiles
//! ([`int8_tile`]), 3- to 6-bit codes unpacked block by block (`lowbit_tile_vnni`), and the
//! byte tiles of 8-bit codes (or 3- to 6-bit codes widened once per row group, `zmm.rs`) two
//! row groups × [`PAIR_TOKENS`](super::PAIR_TOKENS) tokens per call for prompts ([`lowbit_matmul_pairs`]).
//! Twins: `spec.rs`'s `int8_tile_scalar` and `lowbit_tile_scalar` (the tests hold every
//! path to them bit for bit). The `amx` tier runs these for the tokens its tiles leave.

use super::driver::{drive_row_group_pairs, Q8Rows, TOKEN_TILE};
use super::layout::{
    code_bytes, high_bytes, Bits, Int8Tiles, LowBitTiles, BLOCK, BYTE_TILE_BYTES, INT8_TILE_BYTES,
    ROW_GROUP, SUPER_GROUPS,
};
use super::zmm::{
    code_tiles_zmm, mins_of_zmm, scales_of_zmm, supers_zmm, unpack_zmm, WidenedGroup,
};
use crate::kernels::OutputMatrix;
use std::arch::x86_64::*;
use std::array::from_mut;
use std::ops::Range;

/// # Safety
/// AVX512F/BW/VNNI present; `w` and `x` checked (`Int8Tiles::check`, `Q8Rows::check`),
/// `g < w.n_groups()`, `t0 + n <= x.n_tokens`, `1 <= n <= TOKEN_TILE`.
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
            1 => int8_tile_vnni::<1>(w, x, g, t0, out),
            2 => int8_tile_vnni::<2>(w, x, g, t0, out),
            3 => int8_tile_vnni::<3>(w, x, g, t0, out),
            4 => int8_tile_vnni::<4>(w, x, g, t0, out),
            5 => int8_tile_vnni::<5>(w, x, g, t0, out),
            6 => int8_tile_vnni::<6>(w, x, g, t0, out),
            7 => int8_tile_vnni::<7>(w, x, g, t0, out),
            8 => int8_tile_vnni::<8>(w, x, g, t0, out),
            _ => unreachable!("token tile of {n}"),
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn int8_tile_vnni<const N: usize>(
    w: &Int8Tiles,
    x: &Q8Rows,
    g: usize,
    t0: usize,
    out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
) {
    let nb = w.n_blocks();
    let dim = x.dim;
    // SAFETY: every pointer below stays inside the slices `check` validated: tiles and
    // scales of group g (blocks < nb), activations of tokens t0..t0+N (< n_tokens).
    unsafe {
        let qs = w.qs.as_ptr().add(g * nb * INT8_TILE_BYTES);
        let sc = w.scales.as_ptr().add(g * nb * ROW_GROUP) as *const u16;
        let xq = x.quants.as_ptr().add(t0 * dim);
        let xs = x.scales.as_ptr().add(t0 * nb);
        let xbs = x.block_sums.as_ptr().add(t0 * nb);
        let mut acc = [_mm512_setzero_ps(); N];
        for b in 0..nb {
            let tile = qs.add(b * INT8_TILE_BYTES);
            let mut wv = [_mm512_setzero_si512(); 8];
            for (quad, v) in wv.iter_mut().enumerate() {
                *v = _mm512_loadu_si512(tile.add(quad * 64) as *const _);
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(sc.add(b * ROW_GROUP) as *const _));
            for (t, acc_t) in acc.iter_mut().enumerate() {
                let a = xq.add(t * dim + b * BLOCK) as *const i32;
                let mut s = _mm512_set1_epi32(-128 * *xbs.add(t * nb + b));
                for (quad, v) in wv.iter().enumerate() {
                    s = _mm512_dpbusd_epi32(s, *v, _mm512_set1_epi32(a.add(quad).read_unaligned()));
                }
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*xs.add(t * nb + b)));
                *acc_t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, *acc_t);
            }
        }
        for (t, acc_t) in acc.iter().enumerate() {
            _mm512_storeu_ps(out[t].as_mut_ptr(), *acc_t);
        }
    }
}

/// [`lowbit_matmul`](super::lowbit_matmul) for prompts on the VNNI tiles: row groups two at a time
/// (`drive_row_group_pairs`, `byte_tiles_vnni`), each group's 3- to 6-bit codes
/// widened to bytes once (8-bit codes are bytes already). `s_all` holds every token's
/// minimum terms.
///
/// # Safety
/// AVX512F/BW/VNNI present; `w` and `x` checked against each other and `rows`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn lowbit_matmul_pairs(
    w: &LowBitTiles,
    x: &Q8Rows,
    s_all: &[f32],
    rows: Range<usize>,
    y: &OutputMatrix,
) {
    let nb = w.n_blocks();
    let ncg = w.n_col_groups();
    let mut widened = match w.bits {
        Bits::B3 | Bits::B4 | Bits::B5 | Bits::B6 => {
            Some([WidenedGroup::new(w), WidenedGroup::new(w)])
        }
        Bits::B8 => None,
    };
    drive_row_group_pairs(rows, x.n_tokens, y, |g, count, t0, n, out| {
        let s = &s_all[t0 * ncg..(t0 + n) * ncg];
        let mut codes = [std::ptr::null(); 2];
        for (j, c) in codes.iter_mut().enumerate().take(count) {
            *c = match widened.as_mut() {
                // SAFETY: forwarded contract (`g + j` is a group of `rows`).
                Some(wd) => unsafe { wd[j].group(w, g + j) }.as_ptr(),
                None => w.nibbles[(g + j) * nb * BYTE_TILE_BYTES..].as_ptr(),
            };
        }
        // SAFETY: forwarded contract; `codes[..count]` cover the groups' byte tiles.
        unsafe {
            match (count, n) {
                (2, 1) => byte_tiles_vnni::<2, 1>(w, codes, x, s, [g, g + 1], t0, out),
                (2, 2) => byte_tiles_vnni::<2, 2>(w, codes, x, s, [g, g + 1], t0, out),
                (2, 3) => byte_tiles_vnni::<2, 3>(w, codes, x, s, [g, g + 1], t0, out),
                (2, 4) => byte_tiles_vnni::<2, 4>(w, codes, x, s, [g, g + 1], t0, out),
                (2, 5) => byte_tiles_vnni::<2, 5>(w, codes, x, s, [g, g + 1], t0, out),
                (2, 6) => byte_tiles_vnni::<2, 6>(w, codes, x, s, [g, g + 1], t0, out),
                (1, n) => {
                    let one = from_mut(&mut out[0]);
                    let c = [codes[0]];
                    match n {
                        1 => byte_tiles_vnni::<1, 1>(w, c, x, s, [g], t0, one),
                        2 => byte_tiles_vnni::<1, 2>(w, c, x, s, [g], t0, one),
                        3 => byte_tiles_vnni::<1, 3>(w, c, x, s, [g], t0, one),
                        4 => byte_tiles_vnni::<1, 4>(w, c, x, s, [g], t0, one),
                        5 => byte_tiles_vnni::<1, 5>(w, c, x, s, [g], t0, one),
                        _ => byte_tiles_vnni::<1, 6>(w, c, x, s, [g], t0, one),
                    }
                }
                _ => unreachable!("{count} groups × {n} tokens"),
            }
        }
    });
}

/// Tokens `t0..t0 + n` of row group `g` on the VNNI tiles (short batches and the
/// `amx` tier's leftover tokens; longer prompts take [`lowbit_matmul_pairs`]):
/// 8-bit codes on the byte tiles, 3- to 6-bit codes unpacked block by block.
///
/// # Safety
/// AVX512F/BW/VNNI present; `w`, `x` checked, `g < w.n_groups()`,
/// `t0 + n <= x.n_tokens`, `1 <= n <= TOKEN_TILE`, `s` holds `n * n_col_groups` values.
pub unsafe fn lowbit_tile(
    w: &LowBitTiles,
    x: &Q8Rows,
    s: &[f32],
    g: usize,
    t0: usize,
    n: usize,
    out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
) {
    let nb = w.n_blocks();
    // SAFETY (every arm): forwarded contract; for 8-bit codes the group's byte tiles
    // (which `check` validated) start at `c`.
    match w.bits {
        Bits::B8 => {
            let c = w.nibbles[g * nb * BYTE_TILE_BYTES..].as_ptr();
            let one = from_mut(out);
            unsafe {
                match n {
                    1 => byte_tiles_vnni::<1, 1>(w, [c], x, s, [g], t0, one),
                    2 => byte_tiles_vnni::<1, 2>(w, [c], x, s, [g], t0, one),
                    3 => byte_tiles_vnni::<1, 3>(w, [c], x, s, [g], t0, one),
                    4 => byte_tiles_vnni::<1, 4>(w, [c], x, s, [g], t0, one),
                    5 => byte_tiles_vnni::<1, 5>(w, [c], x, s, [g], t0, one),
                    6 => byte_tiles_vnni::<1, 6>(w, [c], x, s, [g], t0, one),
                    7 => byte_tiles_vnni::<1, 7>(w, [c], x, s, [g], t0, one),
                    8 => byte_tiles_vnni::<1, 8>(w, [c], x, s, [g], t0, one),
                    _ => unreachable!("token tile of {n}"),
                }
            }
        }
        Bits::B3 => unsafe { packed_tile_vnni::<3>(w, x, s, g, t0, n, out) },
        Bits::B4 => unsafe { packed_tile_vnni::<4>(w, x, s, g, t0, n, out) },
        Bits::B5 => unsafe { packed_tile_vnni::<5>(w, x, s, g, t0, n, out) },
        Bits::B6 => unsafe { packed_tile_vnni::<6>(w, x, s, g, t0, n, out) },
    }
}

/// [`lowbit_tile`] for `BITS`-bit codes (3 to 6): the kernel for `n` tokens.
///
/// # Safety
/// As [`lowbit_tile`], and `w.bits` is `BITS`.
#[inline(always)]
unsafe fn packed_tile_vnni<const BITS: u32>(
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
            1 => lowbit_tile_vnni::<1, BITS>(w, x, s, g, t0, out),
            2 => lowbit_tile_vnni::<2, BITS>(w, x, s, g, t0, out),
            3 => lowbit_tile_vnni::<3, BITS>(w, x, s, g, t0, out),
            4 => lowbit_tile_vnni::<4, BITS>(w, x, s, g, t0, out),
            5 => lowbit_tile_vnni::<5, BITS>(w, x, s, g, t0, out),
            6 => lowbit_tile_vnni::<6, BITS>(w, x, s, g, t0, out),
            7 => lowbit_tile_vnni::<7, BITS>(w, x, s, g, t0, out),
            8 => lowbit_tile_vnni::<8, BITS>(w, x, s, g, t0, out),
            _ => unreachable!("token tile of {n}"),
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn lowbit_tile_vnni<const N: usize, const BITS: u32>(
    w: &LowBitTiles,
    x: &Q8Rows,
    s: &[f32],
    g: usize,
    t0: usize,
    out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
) {
    let nb = w.n_blocks();
    let ncg = w.n_col_groups();
    let bpg = w.group_size / BLOCK;
    let dim = x.dim;
    // SAFETY: every pointer stays inside the slices `check` validated: tiles of group g
    // (blocks < nb), its scales/mins (column groups < ncg), tokens t0..t0+N.
    unsafe {
        let (code_bytes, high_bytes) = (code_bytes(BITS), high_bytes(BITS));
        let codes = w.nibbles.as_ptr().add(g * nb * code_bytes);
        let hbp = w.high_bits.as_ptr().wrapping_add(g * nb * high_bytes);
        let gs = w.group_scales(g);
        let xq = x.quants.as_ptr().add(t0 * dim);
        let xs = x.scales.as_ptr().add(t0 * nb);
        let mut acc = [_mm512_setzero_ps(); N];
        let mut sup = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for cg in 0..ncg {
            if cg % SUPER_GROUPS == 0 {
                sup = supers_zmm(gs, cg / SUPER_GROUPS);
            }
            let dw = scales_of_zmm(gs, cg, sup.0);
            for b in cg * bpg..((cg + 1) * bpg).min(nb) {
                let hb = hbp.wrapping_add(b * high_bytes);
                let wv = unpack_zmm::<BITS>(codes.add(b * code_bytes), hb);
                for (t, acc_t) in acc.iter_mut().enumerate() {
                    let a = xq.add(t * dim + b * BLOCK) as *const i32;
                    let mut d = _mm512_setzero_si512();
                    for (quad, v) in wv.iter().enumerate() {
                        d = _mm512_dpbusd_epi32(
                            d,
                            *v,
                            _mm512_set1_epi32(a.add(quad).read_unaligned()),
                        );
                    }
                    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*xs.add(t * nb + b)));
                    *acc_t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), scale, *acc_t);
                }
            }
            let mw = mins_of_zmm(gs, cg, sup.1);
            for (t, acc_t) in acc.iter_mut().enumerate() {
                *acc_t = _mm512_fmadd_ps(mw, _mm512_set1_ps(s[t * ncg + cg]), *acc_t);
            }
        }
        for (t, acc_t) in acc.iter().enumerate() {
            _mm512_storeu_ps(out[t].as_mut_ptr(), *acc_t);
        }
    }
}

/// The 8-bit codes' tiles of `G` row groups: the same math as `lowbit_tile_vnni` with
/// byte tiles, read from `codes[j]` (row group `groups[j]`'s `n_blocks` tiles of
/// [`BYTE_TILE_BYTES`]: its 8-bit codes, or its 3- to 6-bit codes widened by
/// [`widen_group_codes`]), tokens `t0..t0 + N` into `out[j][..N]`.
///
/// Register blocking: each 64-byte weight load serves `N` tokens and each broadcast
/// activation quad serves `G` groups, quad by quad, so one block holds `G · N` integer
/// and `G · N` float accumulators. `G = 2, N = 6` leaves enough independent `vpdpbusd`
/// chains and loads per instruction to run near the float step's bound (see
/// [`PAIR_TOKENS`](super::PAIR_TOKENS)).
///
/// # Safety
/// AVX512F/BW/VNNI present; `w`, `x` checked, each `groups[j] < w.n_groups()`,
/// `t0 + N <= x.n_tokens`, each `codes[j]` readable for `n_blocks` byte tiles, `s`
/// holds `N` tokens' terms, `N <= TOKEN_TILE`.
// Index loops: each index addresses several register arrays at once.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn byte_tiles_vnni<const G: usize, const N: usize>(
    w: &LowBitTiles,
    codes: [*const u8; G],
    x: &Q8Rows,
    s: &[f32],
    groups: [usize; G],
    t0: usize,
    out: &mut [[[f32; ROW_GROUP]; TOKEN_TILE]; G],
) {
    let dim = x.dim;
    // SAFETY: the activation reads stay in tokens t0..t0+N, the code reads in the
    // caller's tiles (blocks < nb); the rest is `code_tiles_zmm`'s contract.
    unsafe {
        let xq = x.quants.as_ptr().add(t0 * dim);
        code_tiles_zmm::<G, N>(w, x, s, groups, t0, out, |b| {
            let mut d = [[_mm512_setzero_si512(); N]; G];
            for quad in 0..BLOCK / 4 {
                let mut wv = [_mm512_setzero_si512(); G];
                for j in 0..G {
                    wv[j] = _mm512_loadu_si512(
                        codes[j].add(b * BYTE_TILE_BYTES + quad * 64) as *const _
                    );
                }
                for t in 0..N {
                    let a = (xq.add(t * dim + b * BLOCK + quad * 4) as *const i32).read_unaligned();
                    let a = _mm512_set1_epi32(a);
                    for j in 0..G {
                        d[j][t] = _mm512_dpbusd_epi32(d[j][t], wv[j], a);
                    }
                }
            }
            d
        })
    }
}

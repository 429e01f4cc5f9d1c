//! What the 512-bit tiers (`avx512bw`, `vnni`, `amx`) share, all on AVX-512 F/BW: 3- to
//! 6-bit codes unpacked to byte operands ([`unpack_zmm`]) and widened once per row group to byte
//! tiles ([`widen_group_codes`], [`WidenedGroup`]: the 8-bit codes' layout, which is also
//! AMX's B layout), and the float steps around a block's integer dots for `G` row groups ×
//! `N` tokens ([`code_tiles_zmm`]). Their scalar twins are `layout.rs`'s `tile_code` and
//! `spec.rs`'s float steps.

use super::driver::{Q8Rows, TOKEN_TILE};
use super::layout::{
    code_bytes, high_bytes, Bits, GroupScales, LowBitTiles, BLOCK, BYTE_TILE_BYTES, ROW_GROUP,
    SUPER_GROUPS,
};
use std::arch::x86_64::*;

/// One row group's 3- to 6-bit codes widened to byte tiles, kept while a prompt's token
/// tiles of that group run (the driver walks a group's tokens before the next group).
pub(crate) struct WidenedGroup {
    group: Option<usize>,
    codes: Vec<u8>,
}

impl WidenedGroup {
    pub(crate) fn new(w: &LowBitTiles) -> WidenedGroup {
        WidenedGroup {
            group: None,
            codes: vec![0; w.n_blocks() * BYTE_TILE_BYTES],
        }
    }

    /// Group `g`'s widened codes (widened now unless they already are).
    ///
    /// # Safety
    /// AVX512F/BW present; `w` checked, `g < w.n_groups()`, and `w` the matrix this was
    /// made for.
    pub(crate) unsafe fn group(&mut self, w: &LowBitTiles, g: usize) -> &[u8] {
        if self.group != Some(g) {
            // SAFETY: forwarded contract (the buffer holds `n_blocks` byte tiles of `w`).
            unsafe { widen_group_codes(w, g, &mut self.codes) };
            self.group = Some(g);
        }
        &self.codes
    }
}

/// Widens row group `g`'s codes into `dst` as byte tiles (the 8-bit codes' layout, which
/// is also AMX's B layout: byte `quad * 64 + row * 4 + k` of each block's 512), so a
/// prompt decodes each code once instead of once per token tile (8-bit codes are copied
/// as they are).
///
/// # Safety
/// AVX512F/BW present; `w` checked (`LowBitTiles::check`), `g < w.n_groups()`.
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn widen_group_codes(w: &LowBitTiles, g: usize, dst: &mut [u8]) {
    // SAFETY: forwarded contract.
    unsafe {
        match w.bits {
            Bits::B3 => widen_codes::<3>(w, g, dst),
            Bits::B4 => widen_codes::<4>(w, g, dst),
            Bits::B5 => widen_codes::<5>(w, g, dst),
            Bits::B6 => widen_codes::<6>(w, g, dst),
            Bits::B8 => {
                let bytes = w.n_blocks() * BYTE_TILE_BYTES;
                dst[..bytes].copy_from_slice(&w.nibbles[g * bytes..][..bytes]);
            }
        }
    }
}

/// [`widen_group_codes`] for `BITS`-bit codes (3 to 6).
///
/// # Safety
/// As [`widen_group_codes`], and `w.bits` is `BITS`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn widen_codes<const BITS: u32>(w: &LowBitTiles, g: usize, dst: &mut [u8]) {
    let nb = w.n_blocks();
    let (code_bytes, high_bytes) = (code_bytes(BITS), high_bytes(BITS));
    assert!(dst.len() >= nb * BYTE_TILE_BYTES && w.bits.get() == BITS);
    // SAFETY: group g's tiles lie inside the slices `check` validated; `dst` was
    // asserted long enough.
    unsafe {
        for b in 0..nb {
            let tile = g * nb + b;
            let low = w.nibbles.as_ptr().add(tile * code_bytes);
            let high = w.high_bits.as_ptr().wrapping_add(tile * high_bytes);
            let wv = unpack_zmm::<BITS>(low, high);
            let out = dst.as_mut_ptr().add(b * BYTE_TILE_BYTES);
            for (quad, v) in wv.iter().enumerate() {
                _mm512_storeu_si512(out.add(quad * 64) as *mut _, *v);
            }
        }
    }
}

/// Bit `from` of every byte of `x` moved to bit `to` by a 16-bit shift (the bits it
/// carries across a byte boundary, and the byte's other bits, are the caller's to mask).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn move_bits_zmm(x: __m512i, from: u32, to: u32) -> __m512i {
    if from <= to {
        _mm512_sll_epi16(x, _mm_cvtsi32_si128((to - from) as i32))
    } else {
        _mm512_srl_epi16(x, _mm_cvtsi32_si128((from - to) as i32))
    }
}

/// Unpacks one block's `BITS`-bit codes (3 to 6) into 8 operands of 16 rows × 4
/// columns (quad order), from its code tile at `low` and its high tile at `high` (3-,
/// 5- and 6-bit codes; layouts in `layout.rs`).
///
/// # Safety
/// AVX512F/BW; `low` points at a code tile, `high` (3-, 5-, 6-bit codes) at its high
/// tile.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn unpack_zmm<const BITS: u32>(low: *const u8, high: *const u8) -> [__m512i; 8] {
    let low4 = _mm512_set1_epi8(0x0F);
    let mut wv = [_mm512_setzero_si512(); 8];
    // SAFETY: the caller's contract covers the code tile at `low` and the high tile at
    // `high` (`code_bytes(BITS)` and `high_bytes(BITS)` bytes).
    unsafe {
        if BITS == 3 {
            // Bits 0..1 from the pair tile, bit 2 from the bit tile.
            let pairs = [
                _mm512_loadu_si512(low as *const _),
                _mm512_loadu_si512(low.add(64) as *const _),
            ];
            let bits = _mm512_loadu_si512(high as *const _);
            for (q, v) in wv.iter_mut().enumerate() {
                let q = q as u32;
                let p = _mm512_and_si512(
                    move_bits_zmm(pairs[q as usize / 4], 2 * (q % 4), 0),
                    _mm512_set1_epi8(3),
                );
                let b = _mm512_and_si512(move_bits_zmm(bits, q, 2), _mm512_set1_epi8(4));
                *v = _mm512_or_si512(p, b);
            }
            return wv;
        }
        let h = match BITS {
            6 => [
                _mm512_loadu_si512(high as *const _),
                _mm512_loadu_si512(high.add(64) as *const _),
            ],
            5 => [_mm512_loadu_si512(high as *const _); 2],
            _ => [_mm512_setzero_si512(); 2],
        };
        for j in 0..4 {
            let v = _mm512_loadu_si512(low.add(j * 64) as *const _);
            let mut lo = _mm512_and_si512(v, low4);
            let mut hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            if BITS == 6 {
                // Bits 2j..2j+1 of each byte to bits 4..5 (16-bit shifts: the bits
                // that cross a byte boundary are masked off by 0x30).
                let bits45 = _mm512_set1_epi8(0x30);
                let place = |x: __m512i| match j {
                    0 => _mm512_and_si512(_mm512_slli_epi16(x, 4), bits45),
                    1 => _mm512_and_si512(_mm512_slli_epi16(x, 2), bits45),
                    2 => _mm512_and_si512(x, bits45),
                    _ => _mm512_and_si512(_mm512_srli_epi16(x, 2), bits45),
                };
                lo = _mm512_or_si512(lo, place(h[0]));
                hi = _mm512_or_si512(hi, place(h[1]));
            }
            if BITS == 5 {
                // Bit q of each byte (quads j and j + 4) to bit 4.
                let bit4 = _mm512_set1_epi8(0x10);
                let j = j as u32;
                lo = _mm512_or_si512(lo, _mm512_and_si512(move_bits_zmm(h[0], j, 4), bit4));
                hi = _mm512_or_si512(hi, _mm512_and_si512(move_bits_zmm(h[0], j + 4, 4), bit4));
            }
            wv[j] = lo;
            wv[j + 4] = hi;
        }
    }
    wv
}

/// The super-scales `D` and super-minimums `M` of super-block `sb` of the row group `gs`
/// points at, as f32 (16 rows each): loaded once per [`SUPER_GROUPS`] column groups.
///
/// # Safety
/// AVX-512 F present; `gs` from a checked matrix's `group_scales(g)`, `g` a row group of
/// it, `sb` one of its super-blocks.
#[inline(always)]
pub(crate) unsafe fn supers_zmm(gs: GroupScales, sb: usize) -> (__m512, __m512) {
    // SAFETY: within the row group's arrays (the caller's contract).
    unsafe {
        (
            _mm512_cvtph_ps(_mm256_loadu_si256(gs.sd.add(sb * ROW_GROUP) as *const _)),
            _mm512_cvtph_ps(_mm256_loadu_si256(gs.sm.add(sb * ROW_GROUP) as *const _)),
        )
    }
}

/// The 16 scales `d = D · sc` of column group `cg`, given its super-block's `D`
/// ([`supers_zmm`]; exact products, the layout's two levels).
///
/// # Safety
/// As [`supers_zmm`], `cg` a column group of the super-block `sup_d` belongs to.
#[inline(always)]
pub(crate) unsafe fn scales_of_zmm(gs: GroupScales, cg: usize, sup_d: __m512) -> __m512 {
    // SAFETY: within the row group's arrays (the caller's contract).
    unsafe {
        let sub = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
            gs.sc.add(cg * ROW_GROUP) as *const _,
        )));
        _mm512_mul_ps(sup_d, sub)
    }
}

/// The 16 minimums `m = M · mc` of column group `cg` ([`scales_of_zmm`]'s twin).
///
/// # Safety
/// As [`scales_of_zmm`].
#[inline(always)]
pub(crate) unsafe fn mins_of_zmm(gs: GroupScales, cg: usize, sup_m: __m512) -> __m512 {
    // SAFETY: within the row group's arrays (the caller's contract).
    unsafe {
        let sub = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
            gs.mc.add(cg * ROW_GROUP) as *const _,
        )));
        _mm512_mul_ps(sup_m, sub)
    }
}

/// The 16 scales `d = D · sc` of column group `cg` of the row group `gs` points at (exact
/// products, the layout's two levels).
///
/// # Safety
/// AVX-512 F present; `gs` from a checked matrix's `group_scales(g)`, `g` a row group of
/// it, `cg` one of its column groups.
#[inline(always)]
pub(crate) unsafe fn scales_zmm(gs: GroupScales, cg: usize) -> __m512 {
    // SAFETY: forwarded contract.
    unsafe { scales_of_zmm(gs, cg, supers_zmm(gs, cg / SUPER_GROUPS).0) }
}

/// The 16 minimums `m = M · mc` of column group `cg` ([`scales_zmm`]'s twin).
///
/// # Safety
/// As [`scales_zmm`].
#[inline(always)]
pub(crate) unsafe fn mins_zmm(gs: GroupScales, cg: usize) -> __m512 {
    // SAFETY: forwarded contract.
    unsafe { mins_of_zmm(gs, cg, supers_zmm(gs, cg / SUPER_GROUPS).1) }
}

/// The float steps shared by the zmm prompt tiles of codes (`G` row groups × `N`
/// tokens): per block `acc = fma(float(dot), d_w · d_a, acc)` and per column group
/// `acc = fma(m, S, acc)`, the specification's order, around `block_dots(b)`, block
/// `b`'s exact integer dots `[group][token]`; results into `out[j][..N]`. Inlined into
/// each kernel, whose target features it then runs with.
///
/// # Safety
/// AVX-512 F/BW present; `w`, `x` checked, each `groups[j] < w.n_groups()`, `t0 + N <=
/// x.n_tokens`, `s` holds `N` tokens' minimum terms, `N <= TOKEN_TILE`.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub(crate) unsafe fn code_tiles_zmm<const G: usize, const N: usize>(
    w: &LowBitTiles,
    x: &Q8Rows,
    s: &[f32],
    groups: [usize; G],
    t0: usize,
    out: &mut [[[f32; ROW_GROUP]; TOKEN_TILE]; G],
    mut block_dots: impl FnMut(usize) -> [[__m512i; N]; G],
) {
    let nb = w.n_blocks();
    let ncg = w.n_col_groups();
    let bpg = w.group_size / BLOCK;
    // SAFETY: every pointer stays inside the slices `check` validated: scales and
    // minimums of each group's column groups < ncg, activation scales of tokens
    // t0..t0+N; the intrinsics need AVX-512 F (the caller's contract).
    unsafe {
        let gs = groups.map(|g| w.group_scales(g));
        let xs = x.scales.as_ptr().add(t0 * nb);
        let mut acc = [[_mm512_setzero_ps(); N]; G];
        let mut sup = [(_mm512_setzero_ps(), _mm512_setzero_ps()); G];
        for cg in 0..ncg {
            if cg % SUPER_GROUPS == 0 {
                for j in 0..G {
                    sup[j] = supers_zmm(gs[j], cg / SUPER_GROUPS);
                }
            }
            let mut dw = [_mm512_setzero_ps(); G];
            for j in 0..G {
                dw[j] = scales_of_zmm(gs[j], cg, sup[j].0);
            }
            for b in cg * bpg..((cg + 1) * bpg).min(nb) {
                let d = block_dots(b);
                for t in 0..N {
                    let da = _mm512_set1_ps(*xs.add(t * nb + b));
                    for j in 0..G {
                        let scale = _mm512_mul_ps(dw[j], da);
                        acc[j][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[j][t]), scale, acc[j][t]);
                    }
                }
            }
            for j in 0..G {
                let mw = mins_of_zmm(gs[j], cg, sup[j].1);
                for t in 0..N {
                    acc[j][t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(s[t * ncg + cg]), acc[j][t]);
                }
            }
        }
        for j in 0..G {
            for t in 0..N {
                _mm512_storeu_ps(out[j][t].as_mut_ptr(), acc[j][t]);
            }
        }
    }
}

//! The scalar tier's quantized block dots on x86-64 with SSE2, which every x86-64 CPU has
//! (`scalar/mod.rs`'s `BlockDots`; its twin there is `F32Dots`, and the scalar
//! specifications `int8_tile_scalar` / `lowbit_tile_scalar` hold both to the bit).
//!
//! Codes are widened once per row group to i16 pairs: per 32-column block, 16 column pairs
//! × 4 registers of 4 rows, each row's two codes side by side, so `pmaddwd` against an
//! activation pair broadcast to every i32 lane adds 2 products per row and lane (8 per
//! instruction, where the f32 path adds 4 per multiply and add). Each block's i32 sums are
//! exact (below `32 · 255 · 128`) and convert to f32 exactly.
//!
//! SSE2 is part of every x86-64 CPU (and enabled in every x86-64 build), so the intrinsic
//! calls need no feature check; the panel is a slice of vectors, so no pointer is read.

use super::BlockDots;
use crate::kernels::quant::layout::{Bits, BLOCK, ROW_GROUP};
use std::arch::x86_64::*;

/// Eight i16 lanes: two codes of each of 4 rows.
#[derive(Clone, Copy)]
pub struct I16x8(__m128i);

impl Default for I16x8 {
    fn default() -> Self {
        // SAFETY: SSE2 is in the x86-64 baseline.
        I16x8(unsafe { _mm_setzero_si128() })
    }
}

/// Block dots with `pmaddwd` on i16 code pairs (see the module doc).
pub struct PairDots;

/// Column pairs of a block.
const PAIRS: usize = BLOCK / 2;
/// Registers of 4 rows in a row group.
const ROW_QUADS: usize = ROW_GROUP / 4;

impl BlockDots for PairDots {
    type Lane = I16x8;
    /// An activation pair, `a[2p]` in the low and `a[2p + 1]` in the high 16 bits.
    type Act = i32;
    const LANES_PER_BLOCK: usize = PAIRS * ROW_QUADS;
    const ACTS_PER_BLOCK: usize = PAIRS;

    fn widen_acts(quants: &[i8]) -> Vec<i32> {
        quants
            .chunks_exact(2)
            .map(|p| (p[0] as i16 as u16 as u32 | (p[1] as i16 as u16 as u32) << 16) as i32)
            .collect()
    }

    /// A quad of columns (`4j..4j + 4`) of 4 rows is 16 bytes of the packed tile; widened
    /// to i16 that is 2 registers of 2 rows each, whose i32 lanes hold the pairs `2j` and
    /// `2j + 1` in turn, so one shuffle per pair regroups them by pair.
    fn widen_block(bits: Bits, tile: &[u8], high_bits: &[u8], offset: i16, lanes: &mut [I16x8]) {
        let lanes = &mut lanes[..Self::LANES_PER_BLOCK];
        // SAFETY: SSE2 is in the x86-64 baseline (the loads are `quad_codes`', checked).
        unsafe {
            let off = _mm_set1_epi16(offset);
            let zero = _mm_setzero_si128();
            for j in 0..BLOCK / 4 {
                for q in 0..ROW_QUADS {
                    let codes = quad_codes(bits, tile, high_bits, j, q);
                    // Rows 4q, 4q + 1 and rows 4q + 2, 4q + 3, each [pair 2j, pair 2j + 1].
                    let lo = _mm_castsi128_ps(_mm_sub_epi16(_mm_unpacklo_epi8(codes, zero), off));
                    let hi = _mm_castsi128_ps(_mm_sub_epi16(_mm_unpackhi_epi8(codes, zero), off));
                    lanes[2 * j * ROW_QUADS + q] =
                        I16x8(_mm_castps_si128(_mm_shuffle_ps::<0x88>(lo, hi)));
                    lanes[(2 * j + 1) * ROW_QUADS + q] =
                        I16x8(_mm_castps_si128(_mm_shuffle_ps::<0xDD>(lo, hi)));
                }
            }
        }
    }

    /// Straight from the packed tile: per column quad `j` and row quad `q`, the 16 codes
    /// widened to i16 (rows `4q, 4q + 1` and `4q + 2, 4q + 3`, 4 columns each) meet the
    /// quad's 4 activations repeated twice in one `pmaddwd` each, whose i32 lanes hold each
    /// row's two column-pair sums; one shuffle pair and an add per row quad finish the
    /// rows. The offset comes off once per row as `offset · Σ a` (`block_sum`), all exact
    /// in i32 (below `32 · 255 · 128` before it, `2^23` after).
    fn packed_block_dots(
        bits: Bits,
        tile: &[u8],
        high_bits: &[u8],
        offset: i16,
        acts: &[i8],
        block_sum: i32,
    ) -> [f32; ROW_GROUP] {
        let acts = &acts[..BLOCK];
        // SAFETY: SSE2 is in the x86-64 baseline; the activation loads read 16 bytes each of
        // the 32 checked above, the stores 4 floats each of a 16-float array.
        unsafe {
            let zero = _mm_setzero_si128();
            // The 32 activations as i16, 8 columns (two quads) per register.
            let mut a16 = [zero; BLOCK / 8];
            for (h, half) in a16.chunks_exact_mut(2).enumerate() {
                let v = _mm_loadu_si128(acts[16 * h..].as_ptr() as *const __m128i);
                half[0] = _mm_srai_epi16::<8>(_mm_unpacklo_epi8(v, v));
                half[1] = _mm_srai_epi16::<8>(_mm_unpackhi_epi8(v, v));
            }
            let mut lo = [zero; ROW_QUADS];
            let mut hi = [zero; ROW_QUADS];
            for j in 0..BLOCK / 4 {
                let a = if j % 2 == 0 {
                    _mm_shuffle_epi32::<0x44>(a16[j / 2])
                } else {
                    _mm_shuffle_epi32::<0xEE>(a16[j / 2])
                };
                for q in 0..ROW_QUADS {
                    let codes = quad_codes(bits, tile, high_bits, j, q);
                    let l = _mm_madd_epi16(_mm_unpacklo_epi8(codes, zero), a);
                    let h = _mm_madd_epi16(_mm_unpackhi_epi8(codes, zero), a);
                    lo[q] = _mm_add_epi32(lo[q], l);
                    hi[q] = _mm_add_epi32(hi[q], h);
                }
            }
            let correction = _mm_set1_epi32(offset as i32 * block_sum);
            let mut out = [0f32; ROW_GROUP];
            for (q, o) in out.chunks_exact_mut(4).enumerate() {
                let (l, h) = (_mm_castsi128_ps(lo[q]), _mm_castsi128_ps(hi[q]));
                let first = _mm_castps_si128(_mm_shuffle_ps::<0x88>(l, h));
                let second = _mm_castps_si128(_mm_shuffle_ps::<0xDD>(l, h));
                let rows = _mm_sub_epi32(_mm_add_epi32(first, second), correction);
                _mm_storeu_ps(o.as_mut_ptr(), _mm_cvtepi32_ps(rows));
            }
            out
        }
    }

    /// Each register of codes is loaded once for all `N` tokens.
    #[inline(always)]
    fn block_dots<const N: usize>(lanes: &[I16x8], acts: [&[i32]; N]) -> [[f32; ROW_GROUP]; N] {
        // SAFETY: SSE2 is in the x86-64 baseline; the stores write 4 floats to 4 floats.
        unsafe {
            let mut s = [[_mm_setzero_si128(); ROW_QUADS]; N];
            for (p, w) in lanes.chunks_exact(ROW_QUADS).enumerate() {
                for (s_t, a_t) in s.iter_mut().zip(&acts) {
                    let a = _mm_set1_epi32(a_t[p]);
                    for (s_q, w_q) in s_t.iter_mut().zip(w) {
                        *s_q = _mm_add_epi32(*s_q, _mm_madd_epi16(w_q.0, a));
                    }
                }
            }
            s.map(|s_t| {
                let mut out = [0f32; ROW_GROUP];
                for (o, v) in out.chunks_exact_mut(4).zip(s_t) {
                    _mm_storeu_ps(o.as_mut_ptr(), _mm_cvtepi32_ps(v));
                }
                out
            })
        }
    }
}

/// The 16 codes of column quad `j` (columns `4j..4j + 4`) and row quad `q` (rows
/// `4q..4q + 4`) of a block's packed tiles as bytes, row by row (the 8-bit tile's layout:
/// byte `j * 64 + row * 4 + k`); nibble tiles hold quads `j` and `j + 4` in the low and
/// high nibbles of the same bytes, pair tiles quad `j`'s two bits in bits `2(j % 4)` of
/// line `j / 4`, bit tiles its bit in bit `j` (`layout.rs` has the table of widths).
#[inline(always)]
fn quad_codes(bits: Bits, tile: &[u8], high_bits: &[u8], j: usize, q: usize) -> __m128i {
    // SAFETY: SSE2 is in the x86-64 baseline; every load reads 16 bytes of a slice whose
    // bounds were checked by indexing.
    unsafe {
        let load = |bytes: &[u8], at: usize| {
            _mm_loadu_si128(bytes[at..at + 16].as_ptr() as *const __m128i)
        };
        let nibbles = || {
            let v = load(tile, (j % 4) * 64 + q * 16);
            let v = if j < 4 { v } else { _mm_srli_epi16(v, 4) };
            _mm_and_si128(v, _mm_set1_epi8(0x0F))
        };
        // Quad j's two bits of a pair tile, in bits 0..1.
        let pair = |t: &[u8]| {
            let v = load(t, (j / 4) * 64 + q * 16);
            let shift = _mm_cvtsi32_si128(2 * (j % 4) as i32);
            _mm_and_si128(_mm_srl_epi16(v, shift), _mm_set1_epi8(3))
        };
        // Quad j's bit of a bit tile, in bit 0.
        let bit = |t: &[u8]| {
            let v = load(t, q * 16);
            _mm_and_si128(
                _mm_srl_epi16(v, _mm_cvtsi32_si128(j as i32)),
                _mm_set1_epi8(1),
            )
        };
        match bits {
            Bits::B3 => _mm_or_si128(pair(tile), _mm_slli_epi16(bit(high_bits), 2)),
            Bits::B4 => nibbles(),
            Bits::B5 => _mm_or_si128(nibbles(), _mm_slli_epi16(bit(high_bits), 4)),
            Bits::B6 => _mm_or_si128(nibbles(), _mm_slli_epi16(pair(high_bits), 4)),
            Bits::B8 => load(tile, j * 64 + q * 16),
        }
    }
}

//! Copying a GGUF source's blocks into a packed layout that holds them exactly, instead of
//! rounding the dequantized float32 weights onto a kwk grid again (issue 38). A weight
//! loaded from a quantized GGUF keeps its blocks beside its float32 copy
//! ([`SourceBlocks`]); when the layout the format chose for it can hold those blocks,
//! packing copies their codes and scales and the packed tensor dequantizes to the very
//! same floats. Which block types map onto which layout:
//!
//! | source | kwk layout | how |
//! |---|---|---|
//! | Q4_K, Q5_K | 4-/5-bit codes in groups of 32, [`SUPER_GROUPS`] = 8 per super-block (`format::int4`) | `D = d`, `sc = sc`, `M = −dmin`, `mc = m`, codes as stored |
//! | Q8_0, Q4_0, Q5_0 | symmetric int8 blocks of 32 (`format::int8`) | `d = d`, `q = q` (Q8_0), `q − 8` (Q4_0), `q − 16` (Q5_0) |
//!
//! ggml computes a Q4_K/Q5_K value as `(d·sc)·q − dmin·m` (`dequantize_row_q4_K`); the
//! low-bit layout computes `q·(D·sc) + M·mc`, both products exact in f32. With
//! `M = −dmin` and `mc = m` the last step is `x + (−(dmin·m))`, which IEEE defines as
//! `x − dmin·m` to the bit, signed zeros included (`M = dmin`, `mc = −m` would give
//! `+0` where ggml gives `−0` when `x = −0` and `m = 0`). Q8_0 codes of −128 (never
//! written by ggml's rounding, `d = amax / 127`) are outside the int8 layout's range, so a
//! tensor holding one is rounded as before.
//!
//! Not mapped exactly: Q4_1 and Q5_1 (an f16 scale *and* minimum per block of 32: the
//! low-bit layout's groups of 32 share an f16 super-scale per 8 groups and keep 8-bit
//! sub-scales, which hold 8 independent f16 scales only by chance); Q6_K (a signed 8-bit
//! scale per 16 values: the layouts' groups are 32 or more, so two scales would have to
//! share one); Q5_0/Q4_0 in a low-bit layout (the same f16-per-block problem as Q4_1).
//! Q4_0 and Q5_0 have a *near* copy in the low-bit layout of their width too
//! ([`copy_near`], `format::near_copy`): codes copied, scales fitted.
//!
//! The copy is taken only when the blocks still dequantize to the tensor's float32 values
//! bit for bit ([`exact_layout_of`] checks every row): a weight that was changed after
//! loading (channel equalization, a converted model) is rounded as before. Channel
//! equalization, GPTQ and calibration skip a tensor that will be copied: none of them can
//! do better than the exact values, and equalization would scale the weights off the
//! source's grid.

use crate::format::ggml_blocks::{dequantize, fifth_bits, scale_min_k4, GgmlType, SourceBlocks};
use crate::format::int4::{LowBitWeights, RowScales};
use crate::format::int8::Int8Weights;
use crate::format::near_copy::{blocks_finite, near_bits, near_row};
use crate::kernels::quant::layout::SUPER_GROUPS;
use crate::kernels::quant::{Bits, BLOCK};
use crate::model::Tensor;
use half::f16;
use rayon::prelude::*;

/// Values per k-quant super-block (`QK_K`): [`SUPER_GROUPS`] groups of 32.
const QK_K: usize = 256;
const _: () = assert!(SUPER_GROUPS * BLOCK == QK_K);

/// The packed layout a GGUF block type is copied into exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExactLayout {
    /// Unsigned codes of this width in two-level groups of 32 (`format::int4`).
    LowBit(Bits),
    /// Symmetric int8 blocks of 32 with an f16 scale (`format::int8`).
    Sym8,
}

impl ExactLayout {
    /// The width of its codes.
    pub fn code_bits(self) -> u32 {
        match self {
            ExactLayout::LowBit(b) => b.get(),
            ExactLayout::Sym8 => 8,
        }
    }
}

/// The layout `ty`'s blocks are copied into exactly, if there is one (see the module doc).
pub fn exact_layout(ty: GgmlType) -> Option<ExactLayout> {
    match ty {
        GgmlType::Q4_K => Some(ExactLayout::LowBit(Bits::B4)),
        GgmlType::Q5_K => Some(ExactLayout::LowBit(Bits::B5)),
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => Some(ExactLayout::Sym8),
        _ => None,
    }
}

/// Whether a loader should keep `ty`'s blocks beside the float32 weights.
pub fn may_copy(ty: GgmlType) -> bool {
    exact_layout(ty).is_some() || near_bits(ty).is_some()
}

/// The blocks of `t` when `t` still holds exactly what they dequantize to (every row
/// compared bit for bit), in whole blocks of 32 per row.
fn held_source(t: &Tensor) -> Option<&SourceBlocks> {
    let src = t.source.as_deref()?;
    let bl = src.ty.layout()?;
    if t.shape.len() != 2 || t.rows() == 0 {
        return None;
    }
    let (rows, cols) = (t.rows(), t.cols());
    if !cols.is_multiple_of(bl.block_size) || !cols.is_multiple_of(BLOCK) {
        return None;
    }
    let row_bytes = cols / bl.block_size * bl.type_size;
    if src.bytes.len() != rows * row_bytes || t.data.len() != rows * cols {
        return None;
    }
    let same = src
        .bytes
        .par_chunks_exact(row_bytes)
        .zip(t.data.par_chunks_exact(cols))
        .all(|(b, want)| {
            let mut got = vec![0f32; cols];
            dequantize(src.ty, b, &mut got).is_ok()
                && got
                    .iter()
                    .zip(want)
                    .all(|(g, w)| g.to_bits() == w.to_bits())
        });
    same.then_some(src)
}

/// The blocks of `t` and the layout they copy into, when `t` still holds exactly what they
/// dequantize to (every row compared bit for bit) and the layout can hold them all.
pub fn exact_layout_of(t: &Tensor) -> Option<(&SourceBlocks, ExactLayout)> {
    Some((t.source.as_deref()?, source_homes(t).exact?))
}

/// The blocks of `t` and the code width of their near copy (`format::near_copy`), when
/// `t` still holds exactly what they dequantize to and their scales are finite.
pub fn near_layout_of(t: &Tensor) -> Option<(&SourceBlocks, Bits)> {
    Some((t.source.as_deref()?, source_homes(t).near?))
}

/// Where a tensor's source blocks can go: the layout holding them exactly and the width of
/// their near copy (`format::near_copy`), each when the blocks still hold the tensor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceHomes {
    pub exact: Option<ExactLayout>,
    pub near: Option<Bits>,
}

/// Both homes of `t`'s source blocks, its rows compared with them once: the exact layout
/// unless a Q8_0 code is −128, the near copy unless a scale is not finite.
pub fn source_homes(t: &Tensor) -> SourceHomes {
    let Some(ty) = t.source.as_deref().map(|s| s.ty) else {
        return SourceHomes::default();
    };
    let (exact, near) = (exact_layout(ty), near_bits(ty));
    let held = if exact.is_some() || near.is_some() {
        held_source(t)
    } else {
        None
    };
    let Some(src) = held else {
        return SourceHomes::default();
    };
    SourceHomes {
        exact: exact.filter(|_| !(ty == GgmlType::Q8_0 && has_q8_0_minus_128(&src.bytes))),
        near: near.filter(|_| blocks_finite(ty, &src.bytes)),
    }
}

/// Whether a row of Q8_0 blocks holds a code of −128 (outside the int8 layout's range).
fn has_q8_0_minus_128(row: &[u8]) -> bool {
    row.chunks_exact(34)
        .any(|b| b[2..34].iter().any(|&q| q as i8 == i8::MIN))
}

/// `t`'s near copy (`format::near_copy`): its source's codes in the low-bit layout of
/// their width in groups of 32, the scales fitted, marked as a near copy; `None` when the
/// blocks do not hold `t` ([`near_layout_of`]).
pub fn copy_near(t: &Tensor) -> Option<LowBitWeights> {
    let (src, bits) = near_layout_of(t)?;
    let (rows, cols) = (t.rows(), t.cols());
    let row_bytes = cols / BLOCK * src.ty.layout()?.type_size;
    let mut w = LowBitWeights::from_rows(bits, BLOCK, rows, cols, |r, codes, s| {
        near_row(
            src.ty,
            &src.bytes[r * row_bytes..(r + 1) * row_bytes],
            codes,
            s,
        )
    });
    w.set_copied_from(Some(src.ty));
    w.set_near_copy(true);
    Some(w)
}

/// A tensor copied from its source blocks into the layout that holds them
/// ([`exact_layout_of`]'s), marked as copied.
pub enum Copied {
    LowBit(LowBitWeights),
    Int8(Int8Weights),
}

/// Copies `t`'s source blocks (see [`Copied`]); `None` when they do not hold `t` exactly.
pub fn copy_exact(t: &Tensor) -> Option<Copied> {
    let (src, layout) = exact_layout_of(t)?;
    let (rows, cols) = (t.rows(), t.cols());
    let bl = src.ty.layout()?;
    let row_bytes = cols / bl.block_size * bl.type_size;
    let row = |r: usize| &src.bytes[r * row_bytes..(r + 1) * row_bytes];
    Some(match layout {
        ExactLayout::LowBit(bits) => {
            let mut w = LowBitWeights::from_rows(bits, BLOCK, rows, cols, |r, codes, s| {
                k_quant_row(src.ty, row(r), codes, s)
            });
            w.set_copied_from(Some(src.ty));
            Copied::LowBit(w)
        }
        ExactLayout::Sym8 => {
            let mut w = Int8Weights::from_codes(rows, cols, |r, codes, ds| {
                sym_row(src.ty, row(r), codes, ds)
            });
            w.set_copied_from(Some(src.ty));
            Copied::Int8(w)
        }
    })
}

fn f16_at(b: &[u8], i: usize) -> f16 {
    f16::from_le_bytes([b[i], b[i + 1]])
}

/// One row of Q4_K/Q5_K super-blocks as low-bit codes and two-level scales (layouts from
/// `ggml-common.h`'s `block_q4_K`/`block_q5_K`, the order of `ggml_blocks`).
fn k_quant_row(ty: GgmlType, row: &[u8], codes: &mut [u8], s: &mut RowScales) {
    let type_size = if ty == GgmlType::Q4_K { 144 } else { 176 };
    for (sb, b) in row.chunks_exact(type_size).enumerate() {
        s.sup_d[sb] = f16_at(b, 0);
        s.sup_m[sb] = -f16_at(b, 2);
        let scales = &b[4..16];
        for j in 0..SUPER_GROUPS {
            let (sc, m) = scale_min_k4(j, scales);
            s.sc[sb * SUPER_GROUPS + j] = sc;
            s.mc[sb * SUPER_GROUPS + j] = m as i8;
        }
        let (qh, qs) = if ty == GgmlType::Q4_K {
            (None, &b[16..144])
        } else {
            (Some(&b[16..48]), &b[48..176])
        };
        let out = &mut codes[sb * QK_K..(sb + 1) * QK_K];
        for (chunk, q) in qs.chunks_exact(32).enumerate() {
            for l in 0..32 {
                let (h1, h2) = match qh {
                    Some(h) => (
                        (h[l] >> (2 * chunk) & 1) << 4,
                        (h[l] >> (2 * chunk + 1) & 1) << 4,
                    ),
                    None => (0, 0),
                };
                out[chunk * 64 + l] = (q[l] & 0x0F) | h1;
                out[chunk * 64 + 32 + l] = (q[l] >> 4) | h2;
            }
        }
    }
}

/// One row of Q8_0/Q4_0/Q5_0 blocks as symmetric int8 codes and f16 scales.
fn sym_row(ty: GgmlType, row: &[u8], codes: &mut [i8], ds: &mut [f16]) {
    let type_size = match ty {
        GgmlType::Q8_0 => 34,
        GgmlType::Q4_0 => 18,
        _ => 22,
    };
    for (k, b) in row.chunks_exact(type_size).enumerate() {
        ds[k] = f16_at(b, 0);
        let out = &mut codes[k * BLOCK..(k + 1) * BLOCK];
        match ty {
            GgmlType::Q8_0 => out
                .iter_mut()
                .zip(&b[2..34])
                .for_each(|(o, &q)| *o = q as i8),
            GgmlType::Q4_0 => {
                for j in 0..16 {
                    out[j] = (b[2 + j] & 0x0F) as i8 - 8;
                    out[j + 16] = (b[2 + j] >> 4) as i8 - 8;
                }
            }
            _ => {
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                for j in 0..16 {
                    let (h0, h1) = fifth_bits(qh, j);
                    out[j] = ((b[6 + j] & 0x0F) | h0) as i8 - 16;
                    out[j + 16] = ((b[6 + j] >> 4) | h1) as i8 - 16;
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "source_grid_tests.rs"]
mod tests;

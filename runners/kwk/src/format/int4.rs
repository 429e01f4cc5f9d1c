//! Asymmetric low-bit weights: the `int3`, `int4`, `int5` and `int6` formats, the 6-/8-bit
//! tensors of their mixes, and the `int8` format (8 bits, groups of 64). Unsigned codes of
//! 3, 4, 5, 6 or 8 bits ([`Bits`]) with a scale and minimum per group of 32, 64 or 128
//! columns (`w = d · q + m`, llama.cpp Q4_1's form, which this project's test model is
//! stored in), held in two levels: an 8-bit sub-scale and sub-minimum per group under an
//! f16 super-scale and super-minimum per [`SUPER_GROUPS`](crate::kernels::quant::layout::SUPER_GROUPS) groups (`d = D · sc`,
//! `m = M · mc`, as llama.cpp's k-quants hold theirs). Rows are interleaved in groups of 16
//! (`kernels::quant::layout` documents the layout of each width).
//!
//! Bits per weight: `bits + 16 / group + 32 / (8 · group)` = `bits + 20 / group` (4-bit:
//! g32 4.625, g64 4.3125, g128 4.15625; 8-bit g64 8.3125).

use crate::error::{KwkError, Result};
use crate::format::ggml_blocks::GgmlType;
use crate::format::int8::{check_importance, check_shape, q8_rows};
use crate::format::storage::Store;
use crate::format::{InputKind, PackedLinear, PreparedInput};
use crate::kernels::quant::layout::n_supers;
use crate::kernels::quant::{
    lowbit_matmul, put_tile_code, selected_isa, Bits, LowBitTiles, QuantIsa, BLOCK, ROW_GROUP,
};
use crate::kernels::OutputMatrix;
use crate::model::Tensor;
use crate::quantize::rounding::round_row_two_level;
use half::f16;
use rayon::prelude::*;
use std::ops::Range;

/// A packed weight matrix of 3- to 8-bit codes.
#[derive(Debug, Clone, PartialEq)]
pub struct LowBitWeights {
    bits: Bits,
    group_size: usize,
    rows: usize,
    cols: usize,
    nibbles: Store<u8>,
    high_bits: Store<u8>,
    scales: Store<u8>,
    mins: Store<i8>,
    super_scales: Store<f16>,
    super_mins: Store<f16>,
    /// The GGUF block type these codes and scales were copied from unchanged (`None`:
    /// rounded here); reports count such tensors.
    copied_from: Option<GgmlType>,
    /// Whether those codes were copied with fitted scales (`format::near_copy`), not
    /// exactly.
    near_copy: bool,
}

/// The packed arrays of a [`LowBitWeights`], as [`LowBitWeights::from_parts`] takes them
/// back (the order of [`LowBitWeights::parts`]).
#[derive(Debug, Clone)]
pub struct LowBitParts {
    pub nibbles: Store<u8>,
    pub high_bits: Store<u8>,
    pub scales: Store<u8>,
    pub mins: Store<i8>,
    pub super_scales: Store<f16>,
    pub super_mins: Store<f16>,
}

/// One row's scales as a row function writes them for [`LowBitWeights::from_rows`]:
/// sub-scales and sub-minimums per column group, super-scales and super-minimums per
/// super-block ([`SUPER_GROUPS`] groups).
pub(crate) struct RowScales {
    pub sc: Vec<u8>,
    pub mc: Vec<i8>,
    pub sup_d: Vec<f16>,
    pub sup_m: Vec<f16>,
}

impl RowScales {
    pub(crate) fn new(n_col_groups: usize) -> Self {
        let ns = n_supers(n_col_groups);
        RowScales {
            sc: vec![0; n_col_groups],
            mc: vec![0; n_col_groups],
            sup_d: vec![f16::ZERO; ns],
            sup_m: vec![f16::ZERO; ns],
        }
    }
}

/// The packed arrays of a [`LowBitWeights`], borrowed ([`LowBitWeights::parts`]).
#[derive(Debug, Clone, Copy)]
pub struct LowBitPartsRef<'a> {
    pub nibbles: &'a [u8],
    pub high_bits: &'a [u8],
    pub scales: &'a [u8],
    pub mins: &'a [i8],
    pub super_scales: &'a [f16],
    pub super_mins: &'a [f16],
}

/// Group sizes the format accepts.
pub const GROUP_SIZES: [usize; 3] = [32, 64, 128];

impl LowBitWeights {
    /// Quantizes `tensor` to `bits`-bit codes in groups of `group_size` columns on all rayon
    /// threads. `importance` (length cols) weights the rounding error per input column.
    pub fn quantize(
        tensor: &Tensor,
        bits: Bits,
        group_size: usize,
        importance: Option<&[f32]>,
        what: &str,
    ) -> Result<Self> {
        check_shape(tensor, what)?;
        if !GROUP_SIZES.contains(&group_size) {
            return Err(KwkError::InvalidArgument(format!(
                "{what}: group size {group_size} is not one of 32, 64, 128"
            )));
        }
        let (rows, cols) = (tensor.rows(), tensor.cols());
        check_importance(importance, cols, what)?;
        Ok(Self::from_rows(
            bits,
            group_size,
            rows,
            cols,
            |r, codes, s| {
                round_row_two_level(
                    tensor.row(r),
                    bits,
                    group_size,
                    importance,
                    codes,
                    &mut s.sc,
                    &mut s.mc,
                    (&mut s.sup_d, &mut s.sup_m),
                );
            },
        ))
    }

    /// Packs rows whose codes and scales `row_fn(r, codes, scales)` writes (`codes` of
    /// length `cols`), on all rayon threads. `group_size` must be valid (checked by the
    /// callers).
    pub(crate) fn from_rows(
        bits: Bits,
        group_size: usize,
        rows: usize,
        cols: usize,
        row_fn: impl Fn(usize, &mut [u8], &mut RowScales) + Sync,
    ) -> Self {
        let nb = cols / BLOCK;
        let ng = rows.div_ceil(ROW_GROUP);
        let ncg = cols.div_ceil(group_size);
        let ns = n_supers(ncg);
        let (tile_bytes, high_bytes) = (bits.code_tile_bytes(), bits.high_tile_bytes());
        let mut nibbles = vec![0u8; ng * nb * tile_bytes];
        let mut high_bits = vec![0u8; ng * nb * high_bytes];
        let mut scales = vec![0u8; ng * ncg * ROW_GROUP];
        let mut mins = vec![0i8; ng * ncg * ROW_GROUP];
        let mut super_scales = vec![f16::ZERO; ng * ns * ROW_GROUP];
        let mut super_mins = vec![f16::ZERO; ng * ns * ROW_GROUP];
        let mut hb_parts: Vec<&mut [u8]> = if high_bytes > 0 {
            high_bits.chunks_mut(nb * high_bytes).collect()
        } else {
            (0..ng).map(|_| &mut [][..]).collect()
        };
        nibbles
            .par_chunks_mut(nb * tile_bytes)
            .zip(hb_parts.par_iter_mut())
            .zip(scales.par_chunks_mut(ncg * ROW_GROUP))
            .zip(mins.par_chunks_mut(ncg * ROW_GROUP))
            .zip(super_scales.par_chunks_mut(ns * ROW_GROUP))
            .zip(super_mins.par_chunks_mut(ns * ROW_GROUP))
            .enumerate()
            .for_each(|(g, (((((ng_nib, ng_hb), ng_sc), ng_mn), ng_sd), ng_sm))| {
                let mut codes = vec![0u8; cols];
                let mut rs = RowScales::new(ncg);
                for r in 0..ROW_GROUP.min(rows - g * ROW_GROUP) {
                    row_fn(g * ROW_GROUP + r, &mut codes, &mut rs);
                    for cg in 0..ncg {
                        ng_sc[cg * ROW_GROUP + r] = rs.sc[cg];
                        ng_mn[cg * ROW_GROUP + r] = rs.mc[cg];
                    }
                    for s in 0..ns {
                        ng_sd[s * ROW_GROUP + r] = rs.sup_d[s];
                        ng_sm[s * ROW_GROUP + r] = rs.sup_m[s];
                    }
                    for (c, &code) in codes.iter().enumerate() {
                        let (b, cc) = (c / BLOCK, c % BLOCK);
                        put_tile_code(
                            bits,
                            &mut ng_nib[b * tile_bytes..][..tile_bytes],
                            &mut ng_hb[b * high_bytes..][..high_bytes],
                            (cc / 4, r, cc % 4),
                            code,
                        );
                    }
                }
            });
        drop(hb_parts);
        LowBitWeights {
            bits,
            group_size,
            rows,
            cols,
            nibbles: nibbles.into(),
            high_bits: high_bits.into(),
            scales: scales.into(),
            mins: mins.into(),
            super_scales: super_scales.into(),
            super_mins: super_mins.into(),
            copied_from: None,
            near_copy: false,
        }
    }

    /// Rebuilds from packed parts (the pack cache); `None` if the lengths do not fit.
    pub fn from_parts(
        bits: Bits,
        group_size: usize,
        rows: usize,
        cols: usize,
        parts: LowBitParts,
    ) -> Option<Self> {
        let LowBitParts {
            nibbles,
            high_bits,
            scales,
            mins,
            super_scales,
            super_mins,
        } = parts;
        // Checked: the sizes come from a file (a corrupt index must not overflow).
        let row_groups = rows.div_ceil(ROW_GROUP);
        let tiles = row_groups.checked_mul(cols / BLOCK)?;
        let ncg = cols.div_ceil(group_size.max(1));
        let ncg_total = row_groups.checked_mul(ncg)?.checked_mul(ROW_GROUP)?;
        let ns_total = row_groups
            .checked_mul(n_supers(ncg))?
            .checked_mul(ROW_GROUP)?;
        let code_bytes = tiles.checked_mul(bits.code_tile_bytes())?;
        let high_bytes = tiles.checked_mul(bits.high_tile_bytes())?;
        let ok = GROUP_SIZES.contains(&group_size)
            && cols.is_multiple_of(BLOCK)
            && nibbles.len() == code_bytes
            && high_bits.len() == high_bytes
            && scales.len() == ncg_total
            && mins.len() == ncg_total
            && super_scales.len() == ns_total
            && super_mins.len() == ns_total;
        ok.then_some(LowBitWeights {
            bits,
            group_size,
            rows,
            cols,
            nibbles,
            high_bits,
            scales,
            mins,
            super_scales,
            super_mins,
            copied_from: None,
            near_copy: false,
        })
    }

    /// The GGUF block type this tensor was copied from unchanged, if it was.
    pub fn copied_from(&self) -> Option<GgmlType> {
        self.copied_from
    }
    /// Marks this tensor as copied from `ty`'s blocks (`None`: rounded here).
    pub fn set_copied_from(&mut self, ty: Option<GgmlType>) {
        self.copied_from = ty;
    }
    /// Whether the copy's scales were fitted (`format::near_copy`), not copied exactly.
    pub fn near_copy(&self) -> bool {
        self.near_copy
    }
    /// Marks the copy as a near copy (see [`LowBitWeights::near_copy`]).
    pub fn set_near_copy(&mut self, near: bool) {
        self.near_copy = near;
    }

    pub fn bits(&self) -> Bits {
        self.bits
    }
    pub fn group_size(&self) -> usize {
        self.group_size
    }
    /// The packed arrays, borrowed in the order of [`LowBitParts`].
    pub fn parts(&self) -> LowBitPartsRef<'_> {
        LowBitPartsRef {
            nibbles: &self.nibbles,
            high_bits: &self.high_bits,
            scales: &self.scales,
            mins: &self.mins,
            super_scales: &self.super_scales,
            super_mins: &self.super_mins,
        }
    }

    pub fn tiles(&self) -> LowBitTiles<'_> {
        LowBitTiles {
            bits: self.bits,
            nibbles: &self.nibbles,
            high_bits: &self.high_bits,
            scales: &self.scales,
            mins: &self.mins,
            super_scales: &self.super_scales,
            super_mins: &self.super_mins,
            rows: self.rows,
            cols: self.cols,
            group_size: self.group_size,
        }
    }

    /// `matmul_rows` on a chosen kernel path (tests compare the paths).
    pub fn matmul_rows_isa(
        &self,
        isa: QuantIsa,
        x: &PreparedInput,
        rows: Range<usize>,
        y: &OutputMatrix,
    ) {
        lowbit_matmul(
            isa,
            &self.tiles(),
            &q8_rows(x, y.n_tokens(), "int4"),
            rows,
            y,
        );
    }
}

impl PackedLinear for LowBitWeights {
    fn layout_name(&self) -> String {
        crate::format::copied_layout_name(
            format!("{}-bit g{}", self.bits.get(), self.group_size),
            self.copied_from,
            self.near_copy,
        )
    }
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn bytes(&self) -> usize {
        self.nibbles.len()
            + self.high_bits.len()
            + self.scales.len()
            + self.mins.len()
            + 2 * (self.super_scales.len() + self.super_mins.len())
    }
    fn input_kind(&self, n_tokens: usize) -> InputKind {
        crate::format::quantized_input_kind(n_tokens)
    }
    fn row_align(&self) -> usize {
        selected_isa().row_align()
    }
    fn matmul_rows(&self, x: &PreparedInput, rows: Range<usize>, y: &OutputMatrix) {
        #[cfg(target_arch = "x86_64")]
        if let PreparedInput::Bf16Tiles(x) = x {
            let w = crate::kernels::quant::amx::bf16::Weights::LowBit(&self.tiles());
            return crate::kernels::quant::amx::bf16::matmul(w, x, rows, y);
        }
        self.matmul_rows_isa(selected_isa(), x, rows, y);
    }
    fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows && out.len() >= self.cols);
        let tiles = self.tiles();
        let (g, rr) = (r / ROW_GROUP, r % ROW_GROUP);
        for (c, o) in out[..self.cols].iter_mut().enumerate() {
            let cg = c / self.group_size;
            *o = tiles.code(r, c) as f32 * tiles.scale(g, cg, rr) + tiles.min(g, cg, rr);
        }
    }
}

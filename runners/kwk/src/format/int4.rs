//! Asymmetric low-bit weights: the `int3`, `int4`, `int5` and `int6` formats, the 6-/8-bit
//! tensors of their mixes, and the `int8` format (8 bits, groups of 64). Unsigned codes of
//! 3, 4, 5, 6 or 8 bits ([`Bits`]) with an f16 scale and f16 minimum per group of 32, 64 or
//! 128 columns (`w = d · q + m`, llama.cpp Q4_1's form, which this project's test model is
//! stored in), rows interleaved in groups of 16 (`kernels::quant::layout` documents the
//! layout of each width).
//!
//! Bits per weight: `bits + 32 / group_size` (3-bit g64 3.5; 4-bit: g32 5.0, g64 4.5,
//! g128 4.25; 5-bit g64 5.5; 6-bit g64 6.5; 8-bit g64 8.5, g32 9.0).

use crate::error::{KwkError, Result};
use crate::format::int8::{check_importance, check_shape, q8_rows};
use crate::format::storage::Store;
use crate::format::{InputKind, PackedLinear, PreparedInput};
use crate::kernels::quant::{
    lowbit_matmul, put_tile_code, selected_isa, Bits, LowBitTiles, QuantIsa, BLOCK, ROW_GROUP,
};
use crate::kernels::OutputMatrix;
use crate::model::Tensor;
use crate::quantize::rounding::round_asymmetric;
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
    scales: Store<f16>,
    mins: Store<f16>,
}

/// The packed arrays of a [`LowBitWeights`], as [`LowBitWeights::from_parts`] takes them
/// back (the order of [`LowBitWeights::parts`]).
#[derive(Debug, Clone)]
pub struct LowBitParts {
    pub nibbles: Store<u8>,
    pub high_bits: Store<u8>,
    pub scales: Store<f16>,
    pub mins: Store<f16>,
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
            |r, codes, sc, mn| {
                let row = tensor.row(r);
                for (cg, (d, m)) in sc.iter_mut().zip(mn.iter_mut()).enumerate() {
                    let c0 = cg * group_size;
                    let c1 = (c0 + group_size).min(cols);
                    let imp = importance.map(|w| &w[c0..c1]);
                    (*d, *m) = round_asymmetric(&row[c0..c1], bits, imp, &mut codes[c0..c1]);
                }
            },
        ))
    }

    /// Packs rows whose codes, scales and minimums `row_fn(r, codes, scales, mins)` writes
    /// (`codes` of length `cols`, `scales`/`mins` one per group), on all rayon threads.
    /// `group_size` must be valid (checked by the callers).
    pub(crate) fn from_rows(
        bits: Bits,
        group_size: usize,
        rows: usize,
        cols: usize,
        row_fn: impl Fn(usize, &mut [u8], &mut [f16], &mut [f16]) + Sync,
    ) -> Self {
        let nb = cols / BLOCK;
        let ng = rows.div_ceil(ROW_GROUP);
        let ncg = cols.div_ceil(group_size);
        let (tile_bytes, high_bytes) = (bits.code_tile_bytes(), bits.high_tile_bytes());
        let mut nibbles = vec![0u8; ng * nb * tile_bytes];
        let mut high_bits = vec![0u8; ng * nb * high_bytes];
        let mut scales = vec![f16::ZERO; ng * ncg * ROW_GROUP];
        let mut mins = vec![f16::ZERO; ng * ncg * ROW_GROUP];
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
            .enumerate()
            .for_each(|(g, (((ng_nib, ng_hb), ng_sc), ng_mn))| {
                let mut codes = vec![0u8; cols];
                let mut row_sc = vec![f16::ZERO; ncg];
                let mut row_mn = vec![f16::ZERO; ncg];
                for r in 0..ROW_GROUP.min(rows - g * ROW_GROUP) {
                    row_fn(g * ROW_GROUP + r, &mut codes, &mut row_sc, &mut row_mn);
                    for cg in 0..ncg {
                        ng_sc[cg * ROW_GROUP + r] = row_sc[cg];
                        ng_mn[cg * ROW_GROUP + r] = row_mn[cg];
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
        } = parts;
        // Checked: the sizes come from a file (a corrupt index must not overflow).
        let row_groups = rows.div_ceil(ROW_GROUP);
        let tiles = row_groups.checked_mul(cols / BLOCK)?;
        let ncg_total = row_groups
            .checked_mul(cols.div_ceil(group_size.max(1)))?
            .checked_mul(ROW_GROUP)?;
        let code_bytes = tiles.checked_mul(bits.code_tile_bytes())?;
        let high_bytes = tiles.checked_mul(bits.high_tile_bytes())?;
        let ok = GROUP_SIZES.contains(&group_size)
            && cols.is_multiple_of(BLOCK)
            && nibbles.len() == code_bytes
            && high_bits.len() == high_bytes
            && scales.len() == ncg_total
            && mins.len() == ncg_total;
        ok.then_some(LowBitWeights {
            bits,
            group_size,
            rows,
            cols,
            nibbles,
            high_bits,
            scales,
            mins,
        })
    }

    pub fn bits(&self) -> Bits {
        self.bits
    }
    pub fn group_size(&self) -> usize {
        self.group_size
    }
    /// `(nibbles, high_bits, scales, mins)` as packed.
    pub fn parts(&self) -> (&[u8], &[u8], &[f16], &[f16]) {
        (&self.nibbles, &self.high_bits, &self.scales, &self.mins)
    }

    pub fn tiles(&self) -> LowBitTiles<'_> {
        LowBitTiles {
            bits: self.bits,
            nibbles: &self.nibbles,
            high_bits: &self.high_bits,
            scales: &self.scales,
            mins: &self.mins,
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
        format!("{}-bit g{}", self.bits.get(), self.group_size)
    }
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn bytes(&self) -> usize {
        self.nibbles.len() + self.high_bits.len() + 2 * (self.scales.len() + self.mins.len())
    }
    fn input_kind(&self) -> InputKind {
        InputKind::Q8Blocks
    }
    fn row_align(&self) -> usize {
        selected_isa().row_align()
    }
    fn matmul_rows(&self, x: &PreparedInput, rows: Range<usize>, y: &OutputMatrix) {
        self.matmul_rows_isa(selected_isa(), x, rows, y);
    }
    fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows && out.len() >= self.cols);
        let tiles = self.tiles();
        let ncg = tiles.n_col_groups();
        let (g, rr) = (r / ROW_GROUP, r % ROW_GROUP);
        for (c, o) in out[..self.cols].iter_mut().enumerate() {
            let cg = c / self.group_size;
            let d = self.scales[(g * ncg + cg) * ROW_GROUP + rr].to_f32();
            let m = self.mins[(g * ncg + cg) * ROW_GROUP + rr].to_f32();
            *o = tiles.code(r, c) as f32 * d + m;
        }
    }
}

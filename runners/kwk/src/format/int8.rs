//! Symmetric 8-bit weights: codes in -127..=127 in blocks of 32 columns with one f16 scale
//! per row and block (8.5 bits per weight, llama.cpp Q8_0's layout), rows interleaved in
//! groups of 16 for the VNNI/AVX2 kernels (`kernels::quant::layout` documents the layout).
//! Used for the embedding/`lm_head` of `int4:mix8`; the `int8` format itself is the
//! asymmetric 8-bit groups of 64 in `format::int4` (same size, measured slightly better:
//! see `format::quantized::INT8_GROUP`).

use crate::error::{KwkError, Result};
use crate::format::ggml_blocks::GgmlType;
use crate::format::storage::Store;
use crate::format::{InputKind, PackedLinear, PreparedInput};
use crate::kernels::quant::{
    int8_matmul, selected_isa, Int8Tiles, Q8Rows, QuantIsa, BLOCK, INT8_TILE_BYTES, ROW_GROUP,
};
use crate::kernels::OutputMatrix;
use crate::model::Tensor;
use crate::quantize::rounding::round_symmetric_int8;
use half::f16;
use rayon::prelude::*;
use std::ops::Range;

/// An int8-packed weight matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Int8Weights {
    rows: usize,
    cols: usize,
    /// Tiles of 16 rows × 32 columns, codes stored as `q + 128`.
    qs: Store<u8>,
    /// `[(group * n_blocks + block) * 16 + row]`.
    scales: Store<f16>,
    /// The GGUF block type these codes and scales were copied from unchanged (`None`:
    /// rounded here); reports count such tensors.
    copied_from: Option<GgmlType>,
}

/// Checks that per-column importance weights, when given, cover the `cols` columns.
pub(crate) fn check_importance(importance: Option<&[f32]>, cols: usize, what: &str) -> Result<()> {
    match importance {
        Some(imp) if imp.len() != cols => Err(KwkError::InvalidArgument(format!(
            "{what}: {} importance weights for {cols} columns",
            imp.len()
        ))),
        _ => Ok(()),
    }
}

/// Checks a weight can be packed in 32-column blocks; `what` names it for the error.
pub(crate) fn check_shape(tensor: &Tensor, what: &str) -> Result<()> {
    if tensor.shape.len() != 2 {
        return Err(KwkError::Unsupported(format!(
            "{what}: quantized formats pack 2-D weights, got shape {:?}",
            tensor.shape
        )));
    }
    if !tensor.cols().is_multiple_of(BLOCK) || tensor.cols() == 0 {
        return Err(KwkError::Unsupported(format!(
            "{what}: int8/int4 need in_features a multiple of {BLOCK}, this weight has {}; run it in float32 or bf16",
            tensor.cols()
        )));
    }
    if tensor.data.len() != tensor.rows() * tensor.cols() {
        return Err(KwkError::InvalidArgument(format!(
            "{what}: shape {:?} does not match {} values",
            tensor.shape,
            tensor.data.len()
        )));
    }
    Ok(())
}

impl Int8Weights {
    /// Quantizes `tensor` (`[rows, cols]`, cols a multiple of 32) on all rayon threads.
    /// `importance` (length cols) weights the rounding error per input column.
    pub fn quantize(tensor: &Tensor, importance: Option<&[f32]>, what: &str) -> Result<Self> {
        check_shape(tensor, what)?;
        let (rows, cols) = (tensor.rows(), tensor.cols());
        check_importance(importance, cols, what)?;
        // The same packing as a source-grid copy, each block's codes rounded here.
        Ok(Self::from_codes(rows, cols, |r, codes, ds| {
            let row = tensor.row(r);
            for (b, d) in ds.iter_mut().enumerate() {
                let imp = importance.map(|w| &w[b * BLOCK..(b + 1) * BLOCK]);
                let block = b * BLOCK..(b + 1) * BLOCK;
                *d = round_symmetric_int8(&row[block.clone()], imp, &mut codes[block]);
            }
        }))
    }

    /// Packs rows whose codes (`cols`, in -127..=127) and per-block scales (`cols / 32`)
    /// `row_fn(r, codes, scales)` writes, on all rayon threads (`format::source_grid`
    /// copies a GGUF's symmetric blocks with it). `cols` must be a multiple of 32.
    pub(crate) fn from_codes(
        rows: usize,
        cols: usize,
        row_fn: impl Fn(usize, &mut [i8], &mut [f16]) + Sync,
    ) -> Self {
        let nb = cols / BLOCK;
        let ng = rows.div_ceil(ROW_GROUP);
        let mut qs = vec![128u8; ng * nb * INT8_TILE_BYTES];
        let mut scales = vec![f16::ZERO; ng * nb * ROW_GROUP];
        qs.par_chunks_mut(nb * INT8_TILE_BYTES)
            .zip(scales.par_chunks_mut(nb * ROW_GROUP))
            .enumerate()
            .for_each(|(g, (qg, sg))| {
                let (mut codes, mut ds) = (vec![0i8; cols], vec![f16::ZERO; nb]);
                for r in 0..ROW_GROUP.min(rows - g * ROW_GROUP) {
                    row_fn(g * ROW_GROUP + r, &mut codes, &mut ds);
                    for b in 0..nb {
                        sg[b * ROW_GROUP + r] = ds[b];
                        let tile = &mut qg[b * INT8_TILE_BYTES..(b + 1) * INT8_TILE_BYTES];
                        for (c, &q) in codes[b * BLOCK..(b + 1) * BLOCK].iter().enumerate() {
                            tile[(c / 4) * 64 + r * 4 + c % 4] = (q as i32 + 128) as u8;
                        }
                    }
                }
            });
        Int8Weights {
            rows,
            cols,
            qs: qs.into(),
            scales: scales.into(),
            copied_from: None,
        }
    }

    /// Rebuilds from packed parts (the pack cache); `None` if the lengths do not fit.
    pub fn from_parts(rows: usize, cols: usize, qs: Store<u8>, scales: Store<f16>) -> Option<Self> {
        // Checked: the sizes come from a file (a corrupt index must not overflow).
        let tiles = rows.div_ceil(ROW_GROUP).checked_mul(cols / BLOCK)?;
        (cols.is_multiple_of(BLOCK)
            && qs.len() == tiles.checked_mul(INT8_TILE_BYTES)?
            && scales.len() == tiles.checked_mul(ROW_GROUP)?)
        .then_some(Int8Weights {
            rows,
            cols,
            qs,
            scales,
            copied_from: None,
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

    pub fn codes(&self) -> &[u8] {
        &self.qs
    }
    pub fn scales(&self) -> &[f16] {
        &self.scales
    }

    pub fn tiles(&self) -> Int8Tiles<'_> {
        Int8Tiles {
            qs: &self.qs,
            scales: &self.scales,
            rows: self.rows,
            cols: self.cols,
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
        int8_matmul(
            isa,
            &self.tiles(),
            &q8_rows(x, y.n_tokens(), "int8"),
            rows,
            y,
        );
    }
}

/// The q8 view of a prepared input; panics on another encoding (a decoder bug: the format
/// asked for [`InputKind::Q8Blocks`]).
pub(crate) fn q8_rows<'a>(x: &PreparedInput<'a>, n_tokens: usize, format: &str) -> Q8Rows<'a> {
    match *x {
        PreparedInput::Q8Blocks {
            quants,
            scales,
            block_sums,
            dim,
            memo,
        } => Q8Rows {
            quants,
            scales,
            block_sums,
            dim,
            n_tokens,
            memo,
        },
        _ => {
            panic!("{format} weights read Q8Blocks activations (input_kind), got another encoding")
        }
    }
}

impl PackedLinear for Int8Weights {
    fn layout_name(&self) -> String {
        crate::format::copied_layout_name("int8 sym g32".into(), self.copied_from, false)
    }
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn bytes(&self) -> usize {
        self.qs.len() + 2 * self.scales.len()
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
            let w = crate::kernels::quant::amx::bf16::Weights::Int8(&self.tiles());
            return crate::kernels::quant::amx::bf16::matmul(w, x, rows, y);
        }
        self.matmul_rows_isa(selected_isa(), x, rows, y);
    }
    fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows && out.len() >= self.cols);
        let nb = self.cols / BLOCK;
        let (g, rr) = (r / ROW_GROUP, r % ROW_GROUP);
        for b in 0..nb {
            let d = self.scales[(g * nb + b) * ROW_GROUP + rr].to_f32();
            let tile = &self.qs[(g * nb + b) * INT8_TILE_BYTES..][..INT8_TILE_BYTES];
            for c in 0..BLOCK {
                out[b * BLOCK + c] = (tile[(c / 4) * 64 + rr * 4 + c % 4] as i32 - 128) as f32 * d;
            }
        }
    }
}

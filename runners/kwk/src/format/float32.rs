//! The `float32` format: weights as they were loaded, repacked into the row panels of
//! `kernels` (16 rows interleaved per input column) so one kernel serves prompts (register
//! tiles of tokens x panels) and single tokens (a GEMV streaming the panels once).

use super::{InputKind, PackedLinear, PreparedInput};
use crate::kernels::{self, OutputMatrix, PANEL_ROWS};
use crate::model::Tensor;
use std::ops::Range;

pub struct F32Panels {
    rows: usize,
    cols: usize,
    panels: Vec<f32>,
}

impl F32Panels {
    pub fn pack(tensor: &Tensor) -> Self {
        let (rows, cols) = (tensor.rows(), tensor.cols());
        F32Panels {
            rows,
            cols,
            panels: kernels::pack_f32_panels(&tensor.data, rows, cols),
        }
    }
}

impl PackedLinear for F32Panels {
    fn layout_name(&self) -> String {
        "f32".into()
    }
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn bytes(&self) -> usize {
        // Padding rows are allocated but hold no weights; count what a user pays.
        self.panels.len() * 4
    }
    fn input_kind(&self, _n_tokens: usize) -> InputKind {
        InputKind::F32
    }
    fn row_align(&self) -> usize {
        PANEL_ROWS
    }
    fn matmul_rows(&self, x: &PreparedInput, rows: Range<usize>, y: &OutputMatrix) {
        let PreparedInput::F32 { data, dim } = x else {
            panic!("float32 weights need float32 activations");
        };
        assert_eq!(*dim, self.cols, "activation width");
        let n_tokens = data.len() / dim;
        let w = kernels::PanelWeights {
            data: &self.panels,
            n_rows: self.rows,
            cols: self.cols,
        };
        let x = kernels::TokenRows { data, n_tokens };
        kernels::gemm_f32_panels(kernels::active_isa(), w, x, rows, y);
    }
    fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        kernels::unpack_f32_panel_row(&self.panels, self.cols, r, out);
    }
}

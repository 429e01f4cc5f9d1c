//! The `bf16` format: weights rounded to bfloat16 (nearest even), in row panels whose
//! column pairs match `vdpbf16ps`'s operands; activations are rounded to bf16 once per
//! matmul input ([`super::InputKind::Bf16`]) and products summed in float32.

use super::{InputKind, PackedLinear, PreparedInput};
use crate::kernels::{self, OutputMatrix, PANEL_ROWS};
use crate::model::Tensor;
use half::slice::HalfFloatSliceExt;
use std::ops::Range;

pub struct Bf16Panels {
    rows: usize,
    cols: usize,
    /// `cols` rounded up to even (the padding column is zero).
    cols_padded: usize,
    panels: Vec<u16>,
}

impl Bf16Panels {
    pub fn pack(tensor: &Tensor) -> Self {
        let (rows, cols) = (tensor.rows(), tensor.cols());
        let (panels, cols_padded) = kernels::pack_bf16_panels(&tensor.data, rows, cols);
        Bf16Panels {
            rows,
            cols,
            cols_padded,
            panels,
        }
    }
}

impl PackedLinear for Bf16Panels {
    fn layout_name(&self) -> String {
        "bf16".into()
    }
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn bytes(&self) -> usize {
        self.panels.len() * 2
    }
    fn input_kind(&self, _n_tokens: usize) -> InputKind {
        InputKind::Bf16
    }
    fn row_align(&self) -> usize {
        PANEL_ROWS
    }
    fn matmul_rows(&self, x: &PreparedInput, rows: Range<usize>, y: &OutputMatrix) {
        let PreparedInput::Bf16 { data, dim } = x else {
            panic!("bf16 weights need bf16 activations");
        };
        assert_eq!(
            *dim, self.cols_padded,
            "bf16 activation rows are padded to even width"
        );
        let n_tokens = data.len() / dim;
        let bits: &[u16] = data.reinterpret_cast();
        let w = kernels::PanelWeights {
            data: &self.panels,
            n_rows: self.rows,
            cols: self.cols_padded,
        };
        let x = kernels::TokenRows {
            data: bits,
            n_tokens,
        };
        kernels::gemm_bf16_panels(kernels::active_isa(), w, x, rows, y);
    }
    fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        kernels::unpack_bf16_panel_row(&self.panels, self.cols_padded, r, &mut out[..self.cols]);
    }
}

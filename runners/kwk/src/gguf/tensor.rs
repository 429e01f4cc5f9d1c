//! One entry of the GGUF tensor directory, and the weight bytes a generated token reads
//! from a directory ([`gguf_weight_bytes_per_token`]).

use crate::format::ggml_blocks::GgmlType;

/// One entry of the tensor directory.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` (`ne[0]`) is the innermost, contiguous one. A
    /// Hugging Face `[out, in]` weight is stored with `dims = [in, out]`.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Bytes of data (whole blocks of `ggml_type`).
    pub n_bytes: u64,
}

impl GgufTensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The shape in row-major order (outermost first), as Hugging Face writes it.
    pub fn shape_row_major(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// Weight bytes a generated token reads from a GGUF file's tensors (llama.cpp's names):
/// expert tensors (`*_exps`) at `expert_share` (experts used per token / experts; 1 for a
/// dense model), `token_embd` one row when an `output` tensor exists (else it is the
/// output too, read whole), the rest whole.
pub fn gguf_weight_bytes_per_token(tensors: &[GgufTensorInfo], expert_share: f64) -> f64 {
    let has_output = tensors.iter().any(|t| t.name == "output.weight");
    tensors
        .iter()
        .map(|t| {
            let bytes = t.n_bytes as f64;
            if t.name == "token_embd.weight" && has_output {
                bytes / t.dims.get(1).copied().unwrap_or(1).max(1) as f64
            } else if t.name.contains("_exps") {
                bytes * expert_share
            } else {
                bytes
            }
        })
        .sum()
}

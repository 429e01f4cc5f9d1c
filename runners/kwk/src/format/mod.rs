//! Weight formats: the GGUF block types kwk can read (`ggml_blocks`, dequantized to float32
//! master weights on load) and the packed formats the decoder runs in (float32, bf16,
//! int8, int3..int6), all behind [`PackedLinear`], with their names and options ([`Precision`],
//! `precision`). Everything below the decoder reads the format choice from here.
//!
//! A matmul is `y[t][r] = W[r] · x[t]` for the tokens `t` of a batch and the rows `r` of W
//! (`[out_features, in_features]`). The caller (the decoder) prepares the activations once
//! per matmul input in the encoding the format's kernels consume ([`InputKind`]; one
//! [`PreparedInput`] is shared by q/k/v and by gate/up), splits the rows over the worker
//! threads in slices aligned to [`PackedLinear::row_align`], and lets each thread call
//! [`PackedLinear::matmul_rows`] on its slice.

pub mod bf16;
pub mod float32;
pub mod ggml_blocks;
pub mod int4;
pub mod int8;
pub mod near_copy;
pub mod precision;
pub mod quantized;
pub mod source_grid;
pub mod storage;

pub use precision::{BpwOptions, Int8Options, LowBitOptions, Precision, DEFAULT_INT4_GROUP};

use crate::error::Result;
use crate::kernels::quant::{Bf16Tiles, InputMemo};
use crate::kernels::OutputMatrix;
use crate::model::Tensor;
use std::ops::Range;

/// The activation encoding a packed format's kernels read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InputKind {
    /// Plain float32 rows.
    F32,
    /// bf16 rows (for `vdpbf16ps`), each padded with a zero to an even width.
    Bf16,
    /// int8 blocks of 32 with one f32 scale each, plus each block's sum of int8 values
    /// (for formats with offsets): the VNNI path.
    Q8Blocks,
    /// bf16 in AMX token tiles, tokens padded with zeros to a multiple of 32 (the `amx`
    /// tier's prompts with AMX-BF16: `kernels::quant::amx::bf16`).
    Bf16Tiles,
}

/// Activations of a batch, `n_tokens` rows of `dim` values, in one [`InputKind`].
pub enum PreparedInput<'a> {
    F32 {
        data: &'a [f32],
        dim: usize,
    },
    /// `dim` is the row stride: the width rounded up to even, the pad value zero.
    Bf16 {
        data: &'a [half::bf16],
        dim: usize,
    },
    /// `quants[t*dim + i]`, `scales[t*dim/32 + b]`, `block_sums[t*dim/32 + b]`
    /// (sum of the 32 int8 values of block b). `dim` is a multiple of 32.
    Q8Blocks {
        quants: &'a [i8],
        scales: &'a [f32],
        block_sums: &'a [i32],
        dim: usize,
        /// The low-bit kernels' minimum terms of these activations, kept across calls
        /// (`None`: each call computes them).
        memo: Option<&'a InputMemo>,
    },
    /// bf16 AMX token tiles (`kernels::quant::amx::bf16`'s layout, padded tokens included).
    Bf16Tiles(Bf16Tiles<'a>),
}

/// The activation encoding the quantized formats read for a batch of `n_tokens`: AMX
/// token tiles in bf16 for prompts of [`AMX_MIN_TOKENS`](crate::kernels::quant::AMX_MIN_TOKENS)
/// or more on the `amx` tier where the CPU has AMX-BF16 (`kernels::quant::amx::bf16`),
/// else q8 blocks.
pub(crate) fn quantized_input_kind(n_tokens: usize) -> InputKind {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::kernels::quant::{selected_isa, QuantIsa, AMX_MIN_TOKENS};
        if n_tokens >= AMX_MIN_TOKENS
            && selected_isa() == QuantIsa::Amx
            && crate::kernels::amx_bf16_available()
        {
            return InputKind::Bf16Tiles;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = n_tokens;
    InputKind::Q8Blocks
}

/// A weight matrix packed in one format.
pub trait PackedLinear: Send + Sync {
    /// `out_features`.
    fn rows(&self) -> usize;
    /// `in_features`.
    fn cols(&self) -> usize;
    /// Bytes of packed weight data (scales included).
    fn bytes(&self) -> usize;
    /// The activation encoding `matmul_rows` expects for a batch of `n_tokens` tokens.
    fn input_kind(&self, n_tokens: usize) -> InputKind;
    /// Thread slices of rows must start on multiples of this (the row-interleave width).
    fn row_align(&self) -> usize {
        1
    }
    /// `y[t][r] = W[r] · x[t]` for every token `t` of `x` and every `r` in `rows`.
    /// Writes only those rows of `y`, so threads with disjoint `rows` may share `y`.
    fn matmul_rows(&self, x: &PreparedInput, rows: Range<usize>, y: &OutputMatrix);
    /// Row `r` of W as float32 (embedding lookups read the table through this).
    fn dequantize_row(&self, r: usize, out: &mut [f32]);
    /// The layout's name in reports (`f32`, `bf16`, `int8 sym g32`, `4-bit g32`, ...).
    fn layout_name(&self) -> String;
}

/// A packed layout's report name, marked when its tensor was copied from a GGUF source's
/// blocks (`4-bit g32 (Q4_K copy)`, `source_grid`), or near copied with fitted scales
/// (`5-bit g32 (Q5_0 near copy)`, `near_copy`).
pub fn copied_layout_name(
    base: String,
    copied_from: Option<ggml_blocks::GgmlType>,
    near: bool,
) -> String {
    match (copied_from, near) {
        (Some(ty), false) => format!("{base} ({ty} copy)"),
        (Some(ty), true) => format!("{base} ({ty} near copy)"),
        (None, _) => base,
    }
}

/// What a weight matrix is in the model, for formats that keep some tensors at higher
/// precision (the int4 mix rule lives with the int4 format).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorRole {
    Embedding,
    LmHead,
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    FfnGate,
    FfnUp,
    FfnDown,
    /// MoE router (kept in float32 by every format).
    Router,
}

/// Where in the model a weight sits, for mix rules that depend on depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorPlace {
    pub role: TensorRole,
    /// Layer index (`None` for embedding and lm_head).
    pub layer: Option<usize>,
    pub n_layers: usize,
    /// Parameters of the whole model.
    pub model_params: u64,
    /// The model's residual width (`lm_head`'s columns; the int4 default mix depends on
    /// whether llama.cpp's Q6_K holds such rows).
    pub model_width: usize,
}

/// Packs one linear weight (`[out_features, in_features]`) in `precision`: float32 and
/// bf16 here, int8 and int3..int6 in [`quantized::pack_quantized`].
pub fn pack_linear(
    tensor: &Tensor,
    precision: &Precision,
    place: TensorPlace,
) -> Result<Box<dyn PackedLinear>> {
    match precision {
        Precision::Float32 => Ok(Box::new(float32::F32Panels::pack(tensor))),
        Precision::Bf16 => Ok(Box::new(bf16::Bf16Panels::pack(tensor))),
        Precision::Int8(_) | Precision::LowBit(_) | Precision::Bpw(_) => {
            quantized::pack_quantized(tensor, precision, place)
        }
    }
}

//! The int8 and int4 formats (owned by the quantization work; this placeholder only
//! reports that they are not available yet).

use super::{PackedLinear, TensorPlace};
use crate::decoder::Precision;
use crate::error::{KwkError, Result};
use crate::model::Tensor;

/// Packs `tensor` as int8/int4 according to `precision` and the mix rule for `place`.
pub fn pack_quantized(
    tensor: &Tensor,
    precision: &Precision,
    place: TensorPlace,
) -> Result<Box<dyn PackedLinear>> {
    let _ = (tensor, precision, place);
    Err(KwkError::Unsupported(
        "int8/int4 land with the quantization issue".into(),
    ))
}

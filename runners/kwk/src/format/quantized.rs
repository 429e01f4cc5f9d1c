//! Packing a weight into the quantized formats (`int8`, `int4` with its mix rule): the one
//! entry point the decoder calls for every linear weight, experts included.
//!
//! ## The int4 mix rule
//! Under `int4`, these tensors are kept at `mix_bits`, the rest are 4-bit groups:
//! `mix8` keeps the embedding/`lm_head` in symmetric 8-bit blocks of 32 with an f16 scale
//! (8.5 bits per weight: it is a fifth of a small model's weights) and the projections in
//! asymmetric 8-bit groups of 32 (scale and minimum, 9 bits per weight); `mix6` keeps all of
//! them in asymmetric 6-bit groups of 64 (6.5 bits per weight). Which tensors:
//! - the token embedding and `lm_head` (the embedding once when they are tied);
//! - `attn_v` and `ffn_down` (experts' included) of the layers llama.cpp's Q4_K_M gives
//!   more bits, `use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2`
//!   (llama.cpp `src/llama-quant.cpp`, `llama_tensor_get_type`, which puts those tensors
//!   in Q6_K under Q4_K_M).
//!
//! `mix_bits` defaults to 6 for models of 1e9 parameters and more, 8 below (a small model's
//! embedding is a large share of its weights and of its error).

use crate::decoder::{Int4Options, Precision};
use crate::error::{KwkError, Result};
use crate::format::int4::LowBitWeights;
use crate::format::int8::Int8Weights;
use crate::format::{PackedLinear, TensorPlace, TensorRole};
use crate::model::Tensor;

/// Columns per group of the `int8` format's asymmetric 8-bit codes (f16 scale and minimum
/// per 64: 8.5 bits per weight, llama.cpp Q8_0's size). Measured on SmolLM2-135M-Instruct
/// (ctx 512, 40 chunks of wiki.test.raw, ΔPPL vs kwk float32 22.5003): this layout with the
/// current rounding (min/max grid plus least-squares refits) +0.300%; symmetric g32 with an
/// f16 scale (Q8_0's layout, `Int8Weights`) +0.500%; llama.cpp Q8_0 +0.483% (vs its F32).
pub const INT8_GROUP: usize = 64;

/// Columns per group of the int4 mix's asymmetric 8-bit projections (9 bits per weight).
pub const MIX8_GROUP: usize = 32;

/// Columns per group of the 6-bit mix tensors.
pub const MIX6_GROUP: usize = 64;

/// llama.cpp's `use_more_bits` (see the module doc).
pub fn use_more_bits(layer: usize, n_layers: usize) -> bool {
    let (i, n) = (layer as i64, n_layers as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8).rem_euclid(3) == 2
}

/// Whether the int4 mix keeps this tensor at `mix_bits`.
pub fn int4_keeps_high(place: &TensorPlace) -> bool {
    match place.role {
        TensorRole::Embedding | TensorRole::LmHead => true,
        TensorRole::AttnV | TensorRole::FfnDown => match place.layer {
            Some(l) => use_more_bits(l, place.n_layers),
            None => false,
        },
        _ => false,
    }
}

/// `mix_bits` when the spec names none: 6 from 1e9 parameters, 8 below.
pub fn default_mix_bits(model_params: u64) -> u8 {
    if model_params >= 1_000_000_000 {
        6
    } else {
        8
    }
}

/// A short name of the tensor for error messages.
pub fn describe(place: &TensorPlace) -> String {
    match place.layer {
        Some(l) => format!("{:?} weight of layer {l}", place.role),
        None => format!("{:?} weight", place.role),
    }
}

/// A weight in one of the quantized layouts (what the pack cache stores).
#[derive(Debug, Clone, PartialEq)]
pub enum QuantizedTensor {
    Int8(Int8Weights),
    LowBit(LowBitWeights),
}

impl QuantizedTensor {
    pub fn rows(&self) -> usize {
        match self {
            QuantizedTensor::Int8(w) => w.rows(),
            QuantizedTensor::LowBit(w) => w.rows(),
        }
    }
    pub fn cols(&self) -> usize {
        match self {
            QuantizedTensor::Int8(w) => w.cols(),
            QuantizedTensor::LowBit(w) => w.cols(),
        }
    }
    pub fn into_packed(self) -> Box<dyn PackedLinear> {
        match self {
            QuantizedTensor::Int8(w) => Box::new(w),
            QuantizedTensor::LowBit(w) => Box::new(w),
        }
    }
}

/// Packs one linear weight in `precision` (`Int8` or `Int4`).
pub fn pack_quantized(
    tensor: &Tensor,
    precision: &Precision,
    place: TensorPlace,
) -> Result<Box<dyn PackedLinear>> {
    Ok(quantize_tensor(tensor, precision, place, None)?.into_packed())
}

/// Quantizes one linear weight in `precision` with the int4 mix rule for `place`;
/// `importance` (per input column, from calibration) weights the rounding error, `None`
/// rounds to plain least squared error.
pub fn quantize_tensor(
    tensor: &Tensor,
    precision: &Precision,
    place: TensorPlace,
    importance: Option<&[f32]>,
) -> Result<QuantizedTensor> {
    let what = describe(&place);
    if place.role == TensorRole::Router {
        return Err(KwkError::InvalidArgument(format!(
            "{what}: MoE routers stay in float32 in every format; pack them with the float32 format"
        )));
    }
    match precision {
        Precision::Int8 => Ok(QuantizedTensor::LowBit(LowBitWeights::quantize(
            tensor, 8, INT8_GROUP, importance, &what,
        )?)),
        Precision::Int4(opts) => pack_int4(tensor, opts, &place, importance, &what),
        other => Err(KwkError::InvalidArgument(format!(
            "{what}: pack_quantized packs int8/int4, not {other:?}"
        ))),
    }
}

fn pack_int4(
    tensor: &Tensor,
    opts: &Int4Options,
    place: &TensorPlace,
    importance: Option<&[f32]>,
    what: &str,
) -> Result<QuantizedTensor> {
    if (opts.calibrate || opts.gptq) && importance.is_none() {
        return Err(KwkError::Unsupported(format!(
            "{what}: int4:calib / int4:gptq need activation statistics from the decoder, which kwk does not collect yet; use int4"
        )));
    }
    if int4_keeps_high(place) {
        let bits = opts
            .mix_bits
            .unwrap_or_else(|| default_mix_bits(place.model_params));
        return match bits {
            // The embedding/lm_head is a fifth of a small model: the 8.5-bit symmetric
            // layout. The few projections: asymmetric 8-bit groups of 32 (9 bits).
            8 if matches!(place.role, TensorRole::Embedding | TensorRole::LmHead) => Ok(
                QuantizedTensor::Int8(Int8Weights::quantize(tensor, importance, what)?),
            ),
            8 => Ok(QuantizedTensor::LowBit(LowBitWeights::quantize(
                tensor, 8, MIX8_GROUP, importance, what,
            )?)),
            6 => Ok(QuantizedTensor::LowBit(LowBitWeights::quantize(
                tensor, 6, MIX6_GROUP, importance, what,
            )?)),
            b => Err(KwkError::InvalidArgument(format!(
                "int4:mix{b}: mix bits must be 6 or 8"
            ))),
        };
    }
    Ok(QuantizedTensor::LowBit(LowBitWeights::quantize(
        tensor,
        4,
        opts.group_size,
        importance,
        what,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_more_bits_matches_llama_cpp_for_30_layers() {
        // n/8 = 3, 7n/8 = 26: layers 0-2, 26-29, and (i - 3) % 3 == 2 → 5, 8, ..., 23.
        let picked: Vec<usize> = (0..30).filter(|&i| use_more_bits(i, 30)).collect();
        assert_eq!(
            picked,
            vec![0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
        );
    }

    #[test]
    fn router_and_float_precisions_are_refused() {
        let t = Tensor::new(vec![16, 32], vec![0.5; 512]);
        let place = TensorPlace {
            role: TensorRole::Router,
            layer: Some(0),
            n_layers: 1,
            model_params: 1,
        };
        assert!(pack_quantized(&t, &Precision::Int8, place).is_err());
        let place = TensorPlace {
            role: TensorRole::AttnQ,
            ..place
        };
        assert!(pack_quantized(&t, &Precision::Float32, place).is_err());
        assert!(pack_quantized(&t, &Precision::Int8, place).is_ok());
    }

    #[test]
    fn mix_rule_picks_format_and_bits() {
        let t = Tensor::new(
            vec![32, 64],
            (0..2048).map(|i| (i % 17) as f32 * 0.01).collect(),
        );
        let opts = Int4Options {
            group_size: 32,
            mix_bits: None,
            calibrate: false,
            gptq: false,
        };
        let small = TensorPlace {
            role: TensorRole::Embedding,
            layer: None,
            n_layers: 30,
            model_params: 135_000_000,
        };
        let p = pack_quantized(&t, &Precision::Int4(opts), small).unwrap();
        assert_eq!(p.bytes(), 32 * 64 + 2 * 32 * 2); // int8: 8.5 bits per weight
        let big = TensorPlace {
            model_params: 2_000_000_000,
            ..small
        };
        let p = pack_quantized(&t, &Precision::Int4(opts), big).unwrap();
        assert_eq!(p.bytes(), 32 * 64 * 6 / 8 + 2 * 2 * 32); // 6-bit g64: 6.5 bits per weight
        let plain = TensorPlace {
            role: TensorRole::AttnQ,
            layer: Some(3),
            ..small
        };
        let p = pack_quantized(&t, &Precision::Int4(opts), plain).unwrap();
        assert_eq!(p.bytes(), 32 * 64 / 2 + 2 * 2 * 2 * 32); // 4-bit g32: 5 bits per weight
        let kept = TensorPlace {
            role: TensorRole::FfnDown,
            layer: Some(29),
            ..small
        };
        assert_eq!(
            pack_quantized(&t, &Precision::Int4(opts), kept)
                .unwrap()
                .bytes(),
            32 * 64 + 2 * 2 * 2 * 32 // asymmetric 8-bit g32: 9 bits per weight
        );
        let p = pack_quantized(&t, &Precision::Int8, plain).unwrap();
        assert_eq!(p.bytes(), 32 * 64 + 2 * 2 * 32); // int8: asymmetric g64, 8.5 bits per weight
    }
}

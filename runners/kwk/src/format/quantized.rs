//! Packing a weight into the quantized formats (`int8`, and `int3`..`int6` with their mix
//! rule): the one entry point the decoder calls for every linear weight, experts included.
//!
//! ## The low-bit mix rule
//! Under `intB` (B = 3, 4, 5, 6), these tensors are kept at `mix_bits`, the rest are B-bit
//! groups (the sensitivity mix of `quantize::mix` then moves the rest between grids; this
//! rule places what it does not cover): `mix8` keeps the embedding/`lm_head` in symmetric
//! 8-bit blocks of 32 with an f16 scale (8.5 bits per weight: it is a fifth of a small
//! model's weights) and the projections in asymmetric 8-bit groups of 32 (scale and
//! minimum, 9 bits per weight); `mix6` keeps all of them in asymmetric 6-bit groups of 64
//! (6.5 bits per weight). Which tensors:
//! - `lm_head` (the embedding when they are tied; an untied input embedding is B-bit): the
//!   grid its equalization aims at; the mix chooses its grid on a ladder of its own, 6-bit
//!   g64 to symmetric int8 whatever `mix_bits` (`quantize::mix::head_ladder`);
//! - `attn_v` and `ffn_down` (experts' included) of the layers llama.cpp's Q4_K_M gives
//!   more bits, `use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2`
//!   (llama.cpp `src/llama-quant.cpp`, `llama_tensor_get_type`, which puts those tensors
//!   in Q6_K under Q4_K_M).
//!
//! `mix_bits` defaults by width (`LowBitOptions::mix_bits_for`): for int4 6 where Q6_K
//! holds the model's rows (width a multiple of 256), 8 where Q4_K_M's `output` falls back
//! to Q8_0; for int3, int5 and int6 6.
//!
//! ## Copies of a GGUF's own grid
//! A weight loaded from a quantized GGUF whose blocks a kwk layout holds exactly is copied
//! from them, not rounded, when their codes are no wider than its slot's
//! ([`source_copy_grid`]; `format::source_grid` has the mapping and why it is exact).

use crate::error::{KwkError, Result};
use crate::format::int4::LowBitWeights;
use crate::format::int8::Int8Weights;
use crate::format::source_grid::{
    copy_exact, copy_near, source_homes, Copied, ExactLayout, SourceHomes,
};
use crate::format::Precision;
use crate::format::{PackedLinear, TensorPlace, TensorRole};
use crate::kernels::quant::layout::{n_supers, SUPER_GROUPS};
use crate::kernels::quant::Bits;
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

/// The grids the size-targeted format (`bpw:X`) chooses among for each tensor, one line
/// per grid: a new width joins by adding its lines here (the budget's range, the parser's
/// check and the allocation all follow this list).
pub const BUDGET_GRIDS: &[Grid] = &[
    Grid::Asym {
        bits: Bits::B3,
        group: 128,
    },
    Grid::Asym {
        bits: Bits::B3,
        group: 64,
    },
    Grid::Asym {
        bits: Bits::B3,
        group: 32,
    },
    Grid::Asym {
        bits: Bits::B4,
        group: 128,
    },
    Grid::Asym {
        bits: Bits::B4,
        group: 64,
    },
    Grid::Asym {
        bits: Bits::B4,
        group: 32,
    },
    Grid::Asym {
        bits: Bits::B5,
        group: 128,
    },
    Grid::Asym {
        bits: Bits::B5,
        group: 64,
    },
    Grid::Asym {
        bits: Bits::B5,
        group: 32,
    },
    Grid::Asym {
        bits: Bits::B6,
        group: 128,
    },
    Grid::Asym {
        bits: Bits::B6,
        group: 64,
    },
    Grid::Asym {
        bits: Bits::B6,
        group: 32,
    },
    Grid::Sym8,
    Grid::Asym {
        bits: Bits::B8,
        group: 128,
    },
    Grid::Asym {
        bits: Bits::B8,
        group: 64,
    },
    Grid::Asym {
        bits: Bits::B8,
        group: 32,
    },
];

/// The budgets `bpw:X` accepts: the fewest and the most bits per weight of
/// [`BUDGET_GRIDS`] (for rows whose length is a multiple of the group).
pub fn budget_range() -> (f64, f64) {
    let bpw = BUDGET_GRIDS.iter().map(|g| g.bits_per_weight());
    let lo = bpw.clone().fold(f64::INFINITY, f64::min);
    (lo, bpw.fold(0.0, f64::max))
}

/// The grid of [`BUDGET_GRIDS`] nearest to a budget of `bits` per weight (the cheaper one
/// of two as near): what `bpw:X` equalizes its layers for before it chooses each tensor's.
pub fn budget_reference_grid(bits: f64) -> Grid {
    let mut best = BUDGET_GRIDS[0];
    for &g in BUDGET_GRIDS {
        let (d, db) = (
            (g.bits_per_weight() - bits).abs(),
            (best.bits_per_weight() - bits).abs(),
        );
        if d < db || (d == db && g.bits_per_weight() < best.bits_per_weight()) {
            best = g;
        }
    }
    best
}

/// llama.cpp's `use_more_bits` (see the module doc).
pub fn use_more_bits(layer: usize, n_layers: usize) -> bool {
    let (i, n) = (layer as i64, n_layers as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8).rem_euclid(3) == 2
}

/// Whether the low-bit mix rule keeps this tensor at `mix_bits`.
pub fn int4_keeps_high(place: &TensorPlace) -> bool {
    match place.role {
        // An untied input embedding is only looked up: its rounding error enters the
        // residual stream once per token, like one projection's, so it takes the plain grid
        // (llama.cpp's Q4_K_M likewise keeps `token_embd` in Q4_K, `output` in Q6_K).
        TensorRole::LmHead => true,
        TensorRole::Embedding => false,
        TensorRole::AttnV | TensorRole::FfnDown => match place.layer {
            Some(l) => use_more_bits(l, place.n_layers),
            None => false,
        },
        _ => false,
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

/// Packs one linear weight in `precision` (`Int8`, `LowBit` or `Bpw`).
pub fn pack_quantized(
    tensor: &Tensor,
    precision: &Precision,
    place: TensorPlace,
) -> Result<Box<dyn PackedLinear>> {
    Ok(quantize_tensor(tensor, precision, place, None)?.into_packed())
}

/// Quantizes one linear weight in `precision` with the low-bit mix rule for `place`;
/// `importance` (per input column, from calibration) weights the rounding error, `None`
/// rounds to plain least squared error.
pub fn quantize_tensor(
    tensor: &Tensor,
    precision: &Precision,
    place: TensorPlace,
    importance: Option<&[f32]>,
) -> Result<QuantizedTensor> {
    quantize_on(tensor, precision, place, None, importance)
}

/// [`quantize_tensor`] on `grid` when given (a mix chosen by `quantize::mix`), else on the
/// grid the mix rule gives `place`. This rounds each group on its own: under `intB:gptq`
/// and `int8:gptq` the decoder rounds the layers' linears with `quantize::gptq` (it needs their inputs'
/// Hessians) and only the embedding, `lm_head` and experts no calibration token reached
/// come here.
pub fn quantize_on(
    tensor: &Tensor,
    precision: &Precision,
    place: TensorPlace,
    grid: Option<Grid>,
    importance: Option<&[f32]>,
) -> Result<QuantizedTensor> {
    let what = describe(&place);
    if place.role == TensorRole::Router {
        return Err(KwkError::InvalidArgument(format!(
            "{what}: MoE routers stay in float32 in every format; pack them with the float32 format"
        )));
    }
    let grid = match grid {
        Some(g) => g,
        None => grid_for(precision, &place)?.ok_or_else(|| {
            KwkError::InvalidArgument(format!(
                "{what}: pack_quantized packs int8 and int3..int6, not {}",
                precision.name()
            ))
        })?,
    };
    if let Some(q) = copy_source(tensor, grid) {
        return Ok(q);
    }
    match grid {
        Grid::Sym8 => Ok(QuantizedTensor::Int8(Int8Weights::quantize(
            tensor, importance, &what,
        )?)),
        Grid::Asym { bits, group } => Ok(QuantizedTensor::LowBit(LowBitWeights::quantize(
            tensor, bits, group, importance, &what,
        )?)),
    }
}

/// How a tensor is carried from its source's blocks into a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// Codes and scales copied: the very same floats (`format::source_grid`).
    Exact,
    /// Codes copied, scales fitted (`format::near_copy`): a small error, measured.
    Near,
}

/// The grid `tensor` is copied onto from its GGUF source's blocks instead of being rounded
/// onto `slot` (`format::source_grid`): when the blocks still hold it exactly and their
/// codes are no wider than `slot`'s. A source grid wider than the slot (Q5_0 or Q8_0 in a
/// 4-bit slot, Q6_K anywhere) is rounded onto the slot as before; a narrower one (Q4_K in
/// a 6- or 8-bit slot) is copied at its own, smaller size: lossless and no larger. At the
/// same width the copy may cost a little more than the slot (Q8_0's symmetric blocks of 32,
/// 8.5 bits per weight, in `int8`'s 8.3125-bit groups of 64); bits per weight are counted
/// from the packed bytes either way. A source with no exact home in the slot but a near
/// copy (`format::near_copy`) is near copied only in the slot of the copy's own grid (Q5_0
/// in 5-bit g32, Q4_0 in 4-bit g32): a near copy is not lossless, so a wider slot
/// rounds as before and the mix weighs the two by their measured errors (with near copies
/// in every slot at least as wide, SmolLM2's Q4_1 GGUF could not climb above its 4-bit
/// copy: int4 fell to 5.47 bpw and KLD rose from 0.0034 to 0.0044).
pub fn source_copy_grid(tensor: &Tensor, slot: Grid) -> Option<Grid> {
    source_copy(tensor, slot).map(|(g, _)| g)
}

/// [`source_copy_grid`] with the kind of copy.
pub fn source_copy(tensor: &Tensor, slot: Grid) -> Option<(Grid, CopyKind)> {
    copy_grid_in(source_homes(tensor), slot)
}

/// The grid a source with `homes` is copied onto in `slot` ([`source_copy_grid`]'s rule,
/// for callers that checked the source once), and how.
pub fn copy_grid_in(homes: SourceHomes, slot: Grid) -> Option<(Grid, CopyKind)> {
    if let Some(l) = homes.exact.filter(|l| l.code_bits() <= slot.code_bits()) {
        let grid = match l {
            ExactLayout::LowBit(bits) => Grid::Asym { bits, group: 32 },
            ExactLayout::Sym8 => Grid::Sym8,
        };
        return Some((grid, CopyKind::Exact));
    }
    homes
        .near
        .map(|bits| Grid::Asym { bits, group: 32 })
        .filter(|&g| g == slot)
        .map(|g| (g, CopyKind::Near))
}

/// `tensor` copied from its source's blocks when [`source_copy_grid`] allows it.
pub fn copy_source(tensor: &Tensor, slot: Grid) -> Option<QuantizedTensor> {
    Some(match source_copy(tensor, slot)?.1 {
        CopyKind::Exact => match copy_exact(tensor)? {
            Copied::LowBit(w) => QuantizedTensor::LowBit(w),
            Copied::Int8(w) => QuantizedTensor::Int8(w),
        },
        CopyKind::Near => QuantizedTensor::LowBit(copy_near(tensor)?),
    })
}

/// The grid a quantized weight is rounded onto.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grid {
    /// Asymmetric `bits`-bit codes with a scale and minimum per `group` columns (8-bit
    /// sub-scales under f16 super-scales, `format::int4`).
    Asym { bits: Bits, group: usize },
    /// Symmetric int8 blocks of 32 with an f16 scale (the mix8 embedding/`lm_head`).
    Sym8,
}

impl Grid {
    /// Bits per weight of this grid, scales and minimums included, for rows whose length
    /// is a multiple of the group.
    pub fn bits_per_weight(self) -> f64 {
        match self {
            // 8-bit sub-scale and sub-minimum per group, two f16 per super-block.
            Grid::Asym { bits, group } => {
                bits.get() as f64 + 16.0 / group as f64 + 32.0 / (SUPER_GROUPS * group) as f64
            }
            Grid::Sym8 => 8.5,
        }
    }

    /// The width of its codes.
    pub fn code_bits(self) -> u32 {
        match self {
            Grid::Asym { bits, .. } => bits.get(),
            Grid::Sym8 => 8,
        }
    }

    /// Bits of a `rows × cols` matrix on this grid (a last partial group still carries a
    /// scale and minimum: 576 columns in groups of 128 are 5 groups).
    pub fn tensor_bits(self, rows: usize, cols: usize) -> f64 {
        match self {
            Grid::Asym { bits, group } => {
                let ncg = cols.div_ceil(group);
                let scale_bits = 16 * ncg + 32 * n_supers(ncg);
                rows as f64 * (bits.get() as f64 * cols as f64 + scale_bits as f64)
            }
            Grid::Sym8 => rows as f64 * (8.0 * cols as f64 + (16 * cols.div_ceil(32)) as f64),
        }
    }
}

/// The grid `precision` puts the weight at `place` on (the low-bit mix rule included); `None`
/// for formats that do not quantize and for MoE routers (always float32).
pub fn grid_for(precision: &Precision, place: &TensorPlace) -> Result<Option<Grid>> {
    if place.role == TensorRole::Router {
        return Ok(None);
    }
    let opts = match precision {
        Precision::Int8(_) => {
            return Ok(Some(Grid::Asym {
                bits: Bits::B8,
                group: INT8_GROUP,
            }))
        }
        Precision::LowBit(opts) => opts,
        // The plan (`quantize::budget`) gives every tensor its grid; this one is what the
        // layers are equalized for.
        Precision::Bpw(o) => return Ok(Some(budget_reference_grid(o.bits()))),
        Precision::Float32 | Precision::Bf16 => return Ok(None),
    };
    if !int4_keeps_high(place) {
        return Ok(Some(Grid::Asym {
            bits: opts.bits,
            group: opts.group_size,
        }));
    }
    match opts.mix_bits_for(place.model_width) {
        // The embedding/lm_head is a fifth of a small model: the 8.5-bit symmetric
        // layout. The few projections: asymmetric 8-bit groups of 32 (9 bits).
        Bits::B8 if matches!(place.role, TensorRole::Embedding | TensorRole::LmHead) => {
            Ok(Some(Grid::Sym8))
        }
        Bits::B8 => Ok(Some(Grid::Asym {
            bits: Bits::B8,
            group: MIX8_GROUP,
        })),
        Bits::B6 => Ok(Some(Grid::Asym {
            bits: Bits::B6,
            group: MIX6_GROUP,
        })),
        b @ (Bits::B3 | Bits::B4 | Bits::B5) => Err(KwkError::InvalidArgument(format!(
            "int{}:mix{}: mix bits must be 6 or 8",
            opts.bits.get(),
            b.get()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::LowBitOptions;

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
            model_width: 64,
        };
        assert!(pack_quantized(&t, &Precision::INT8, place).is_err());
        let place = TensorPlace {
            role: TensorRole::AttnQ,
            ..place
        };
        assert!(pack_quantized(&t, &Precision::Float32, place).is_err());
        assert!(pack_quantized(&t, &Precision::INT8, place).is_ok());
    }

    #[test]
    fn mix_rule_picks_format_and_bits() {
        let t = Tensor::new(
            vec![32, 64],
            (0..2048).map(|i| (i % 17) as f32 * 0.01).collect(),
        );
        let opts = LowBitOptions {
            bits: Bits::B4,
            group_size: 32,
            mix_bits: None,
            calibrate: false,
            gptq: false,
            act_order: false,
        };
        let small = TensorPlace {
            role: TensorRole::LmHead,
            layer: None,
            n_layers: 30,
            model_params: 135_000_000,
            model_width: 576,
        };
        let p = pack_quantized(&t, &Precision::LowBit(opts), small).unwrap();
        assert_eq!(p.bytes(), 32 * 64 + 2 * 32 * 2); // int8: 8.5 bits per weight
        let big = TensorPlace {
            model_params: 2_000_000_000,
            model_width: 2048,
            ..small
        };
        let p = pack_quantized(&t, &Precision::LowBit(opts), big).unwrap();
        // 6-bit g64: per row an 8-bit sub-scale and sub-minimum and, for its one
        // super-block, an f16 super-scale and super-minimum.
        assert_eq!(p.bytes(), 32 * 64 * 6 / 8 + 32 * (2 + 4));
        let plain = TensorPlace {
            role: TensorRole::AttnQ,
            layer: Some(3),
            ..small
        };
        let p = pack_quantized(&t, &Precision::LowBit(opts), plain).unwrap();
        assert_eq!(p.bytes(), 32 * 64 / 2 + 2 * 2 * 2 * 32); // 4-bit g32: 5 bits per weight
        let kept = TensorPlace {
            role: TensorRole::FfnDown,
            layer: Some(29),
            ..small
        };
        assert_eq!(
            pack_quantized(&t, &Precision::LowBit(opts), kept)
                .unwrap()
                .bytes(),
            // asymmetric 8-bit g32: two groups and one super-block per row.
            32 * 64 + 32 * (2 * 2 + 4)
        );
        let p = pack_quantized(&t, &Precision::INT8, plain).unwrap();
        // int8: asymmetric g64, one group and one super-block per row.
        assert_eq!(p.bytes(), 32 * 64 + 32 * (2 + 4));
    }

    #[test]
    fn every_width_puts_plain_tensors_on_its_grid_and_lm_head_on_6_bits() {
        let place = |role, layer| TensorPlace {
            role,
            layer,
            n_layers: 30,
            model_params: 135_000_000,
            model_width: 576,
        };
        for (name, bits) in [("int3", Bits::B3), ("int5", Bits::B5), ("int6", Bits::B6)] {
            let p = Precision::parse(name).unwrap();
            let plain = grid_for(&p, &place(TensorRole::AttnQ, Some(3))).unwrap();
            let group = crate::format::precision::default_group(bits);
            assert_eq!(plain, Some(Grid::Asym { bits, group }), "{name}");
            let head = grid_for(&p, &place(TensorRole::LmHead, None)).unwrap();
            let six = Grid::Asym {
                bits: Bits::B6,
                group: MIX6_GROUP,
            };
            assert_eq!(head, Some(six), "{name}");
            let p8 = Precision::parse(&format!("{name}:mix8")).unwrap();
            let head = grid_for(&p8, &place(TensorRole::LmHead, None)).unwrap();
            assert_eq!(head, Some(Grid::Sym8), "{name}");
        }
        let bits_of = |g: Grid| match g {
            Grid::Asym { bits, .. } => bits.get(),
            Grid::Sym8 => 8,
        };
        let t = Tensor::new(
            vec![17, 96],
            (0..17 * 96).map(|i| (i % 23) as f32 * 0.01).collect(),
        );
        for name in ["int3", "int5"] {
            let p = Precision::parse(name).unwrap();
            let q = quantize_tensor(&t, &p, place(TensorRole::FfnUp, Some(4)), None).unwrap();
            let QuantizedTensor::LowBit(w) = q else {
                panic!("{name}: not a low-bit tensor")
            };
            let g = grid_for(&p, &place(TensorRole::FfnUp, Some(4)))
                .unwrap()
                .unwrap();
            assert_eq!(w.bits().get(), bits_of(g), "{name}");
        }
    }
}

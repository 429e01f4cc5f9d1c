//! The low-bit mix chosen by sensitivity: which grid each tensor gets under a bits-per-weight
//! budget, for every width of the family (`int3`, `int4`, `int5`, `int6`).
//!
//! Every tensor group (one role in one layer, all experts of that role together; the untied
//! input embedding) starts on the cheapest grid of the width's ladder ([`ladder`]; for int4
//! 4-bit groups of 128) and is moved up the ladder (for int4: 4-bit g64, g32 — no finer
//! than the `int4:gG` the user gave —, 6-bit g64, and 8-bit g32 under `mix8`) greedily,
//! always taking the step that lowers the estimated error most per bit spent, until the
//! budget is used. The error of a grid is the relative output noise of the tensor,
//! `Σ E[x_k²] ΔW_ik² / Σ E[x_k²] W_ik²` (sampled rows, second moments measured by calibration
//! or estimated from the weights, see `quantize::equalize`), summed over the group's
//! tensors: every linear's noise counts the same. `lm_head` climbs its own short ladder
//! from 6-bit g64 (as llama.cpp always gives `output` more bits) to symmetric int8
//! ([`head_ladder`]), its error counted `2L + 1` times.
//!
//! The default budget is the size llama.cpp's k-quant mix of the same width would give the
//! same model ([`k_quant_bits_per_weight`]: Q3_K_M, Q4_K_M, Q5_K_M, Q6_K), so a kwk `intB`
//! row is compared with that k-quant at equal size; a grid whose estimated error is not
//! lower than the cheaper one (weights that already sit on a 4-bit g32 grid) is never
//! bought. int4's budget is Q4_K_M as llama.cpp makes it on the model, row-length
//! fallbacks included ([`q4_k_m_bits_per_weight`]); int3, int5 and int6 take their k-quant's
//! own types on every tensor (no fallback: kwk's grids need only rows of 32, so a kwk row
//! sits at its width on any model, where llama.cpp's k-quants on a 576-wide model fall back
//! to 4.5-8.5-bit types; a model whose rows are multiples of 256 gets the same budget
//! either way).

use crate::format::quantized::{copy_grid_in, CopyKind, Grid};
use crate::format::source_grid::{copy_near, source_homes, SourceHomes};
use crate::format::{PackedLinear, TensorRole};
use crate::kernels::quant::Bits;
use crate::model::Tensor;
use crate::quantize::equalize::relative_error;
use rayon::prelude::*;
use std::cell::OnceCell;

/// A tensor with its input channels' second moments and its rounding importance.
pub type Member<'a> = (&'a Tensor, &'a [f32], Option<&'a [f32]>);

/// One group of tensors that gets one grid.
pub struct MixUnit<'a> {
    pub role: TensorRole,
    pub layer: Option<usize>,
    pub tensors: Vec<Member<'a>>,
}

impl MixUnit<'_> {
    pub fn params(&self) -> u64 {
        self.tensors
            .iter()
            .map(|(t, _, _)| t.data.len() as u64)
            .sum()
    }
}

/// The grids a unit may take under `intB:gG` with `mix_bits` (`bits` = B), cheapest first:
/// B-bit groups of 128 down to `G` (the finest group the user allows), then wider grids up
/// to `mix_bits`: for int3 4-bit and 5-bit g64 (the Q4_K and Q5_K of Q3_K_M's sensitive
/// tensors) and 6-bit g64; for int4 and int5 6-bit g64; 8-bit g32 under `mix8` for every
/// width. int4's ladder is the one its results were measured with.
pub fn ladder(bits: Bits, finest_group: usize, mix_bits: Bits) -> Vec<Grid> {
    let grid = |bits, group| Grid::Asym { bits, group };
    let mut l: Vec<Grid> = [128, 64, 32]
        .into_iter()
        .filter(|&g| g >= finest_group)
        .map(|group| grid(bits, group))
        .collect();
    let wider: &[Bits] = match bits {
        Bits::B3 => &[Bits::B4, Bits::B5, Bits::B6],
        Bits::B4 | Bits::B5 => &[Bits::B6],
        Bits::B6 | Bits::B8 => &[],
    };
    l.extend(wider.iter().map(|&b| grid(b, 64)));
    if mix_bits == Bits::B8 && bits != Bits::B8 {
        l.push(grid(Bits::B8, 32));
    }
    l
}

/// `ladder` for one unit: with the grid of its tensors' near copies (`format::near_copy`:
/// 5-bit g32 for Q5_0, 4-bit g32 for Q4_0) added in its place by bits per weight
/// when the ladder lacks it, so the unit can buy the copy at its own size (int4's ladder
/// goes from 4-bit g32 to 6-bit g64; only the copy's own grid takes a near copy,
/// `format::quantized::copy_grid_in`). A unit with no near copy keeps `ladder`.
/// `homes` are the unit's [`unit_homes`].
pub fn unit_ladder(ladder: &[Grid], homes: &[SourceHomes]) -> Vec<Grid> {
    let mut l = ladder.to_vec();
    for h in homes {
        if let Some(bits) = h.near {
            let g = Grid::Asym { bits, group: 32 };
            if !l.contains(&g) {
                let at = l.partition_point(|x| x.bits_per_weight() < g.bits_per_weight());
                l.insert(at, g);
            }
        }
    }
    l
}

/// Bits of one weight of each llama.cpp type the k-quant mixes use (block bytes × 8 / block
/// weights; `ggml/src/ggml-common.h`).
const Q3_K: f64 = 3.4375;
const Q4_K: f64 = 4.5;
const Q5_K: f64 = 5.5;
const Q5_0: f64 = 5.5;
const Q6_K: f64 = 6.5625;
const Q8_0: f64 = 8.5;

/// llama.cpp's `use_more_bits` (as in `format::quantized`).
fn more_bits(layer: usize, n_layers: usize) -> bool {
    crate::format::quantized::use_more_bits(layer, n_layers)
}

/// Tensor bits llama.cpp's Q4_K_M gives a tensor of `role` with `cols` input columns
/// (`src/llama-quant.cpp`, `llama_tensor_get_type` for `LLAMA_FTYPE_MOSTLY_Q4_K_M`: `output`
/// (and a tied embedding) Q6_K; `attn_v` and `ffn_down` Q6_K in the `use_more_bits` layers;
/// everything else Q4_K; a row length not a multiple of 256 falls back to Q5_0 for Q4_K and
/// Q8_0 for Q6_K).
pub fn q4_k_m_bits_per_weight(
    role: TensorRole,
    layer: Option<usize>,
    n_layers: usize,
    cols: usize,
) -> f64 {
    let high = match role {
        TensorRole::LmHead => true,
        TensorRole::AttnV | TensorRole::FfnDown => layer.is_some_and(|l| more_bits(l, n_layers)),
        _ => false,
    };
    let fits = cols.is_multiple_of(256);
    match (high, fits) {
        (true, true) => Q6_K,
        (true, false) => Q8_0,
        (false, true) => Q4_K,
        (false, false) => Q5_0,
    }
}

/// Tensor bits per weight llama.cpp's k-quant mix of width `bits` gives a tensor of `role`
/// with `cols` input columns (`src/llama-quant.cpp`, `llama_tensor_get_type`), the budget
/// of `intB` (see the module doc):
/// - 3 (`LLAMA_FTYPE_MOSTLY_Q3_K_M`): `output` (and a tied embedding) Q6_K; `attn_v` Q5_K
///   in layers 0 and 1, Q4_K after; `ffn_down` Q5_K in the first `n/16` layers, Q4_K after
///   (the rule of every architecture but Falcon); `attn_output` Q4_K; the rest Q3_K;
/// - 4: [`q4_k_m_bits_per_weight`] (fallbacks included);
/// - 5 (`LLAMA_FTYPE_MOSTLY_Q5_K_M`): `output` Q6_K; `attn_v` and `ffn_down` Q6_K in the
///   `use_more_bits` layers; the rest Q5_K;
/// - 6 (`LLAMA_FTYPE_MOSTLY_Q6_K`): every tensor Q6_K;
/// - 8: every tensor Q8_0.
pub fn k_quant_bits_per_weight(
    bits: Bits,
    role: TensorRole,
    layer: Option<usize>,
    n_layers: usize,
    cols: usize,
) -> f64 {
    let first = |n: usize| layer.is_some_and(|l| l < n);
    let more = layer.is_some_and(|l| more_bits(l, n_layers));
    match bits {
        Bits::B3 => match role {
            TensorRole::LmHead => Q6_K,
            TensorRole::AttnV if first(2) => Q5_K,
            TensorRole::FfnDown if first(n_layers / 16) => Q5_K,
            TensorRole::AttnV | TensorRole::FfnDown | TensorRole::AttnOutput => Q4_K,
            _ => Q3_K,
        },
        Bits::B4 => q4_k_m_bits_per_weight(role, layer, n_layers, cols),
        Bits::B5 => match role {
            TensorRole::LmHead => Q6_K,
            TensorRole::AttnV | TensorRole::FfnDown if more => Q6_K,
            _ => Q5_K,
        },
        Bits::B6 => Q6_K,
        Bits::B8 => Q8_0,
    }
}

/// How a unit's error falls as it climbs the ladder (what [`allocate_curves`] needs of a
/// unit: a streaming packer keeps these instead of the tensors).
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// Bits of the unit's tensors at each ladder step.
    pub bits: Vec<f64>,
    /// Relative error at each ladder step.
    pub err: Vec<f64>,
}

/// Chooses a grid per unit (see the module doc): `budget_bits` is what the units may use in
/// all (bits of everything else already taken off).
pub fn allocate(units: &[MixUnit], ladder: &[Grid], budget_bits: f64) -> Vec<Grid> {
    let curves: Vec<Curve> = units.iter().map(|u| unit_curve(u, ladder)).collect();
    allocate_curves(&curves, budget_bits)
        .into_iter()
        .map(|step| ladder[step])
        .collect()
}

/// The curve of one unit on `ladder`. A tensor its GGUF source's blocks hold exactly
/// costs, at a step whose grid takes the copy (`format::quantized::source_copy_grid`), the
/// bits of the copy and no error: that is what packing will make of it. A near copy
/// (`format::near_copy`) costs its bits and the error of its fitted scales, measured on
/// the packed tensor ([`near_copy_error`]).
pub fn unit_curve(u: &MixUnit, ladder: &[Grid]) -> Curve {
    unit_curve_on(u, ladder, &unit_homes(u))
}

/// Where each of the unit's tensors' source blocks can go (`format::source_grid`), its
/// rows checked against the blocks once, for [`unit_ladder`] and [`unit_curve_on`].
pub fn unit_homes(u: &MixUnit) -> Vec<SourceHomes> {
    u.tensors.iter().map(|(t, _, _)| source_homes(t)).collect()
}

/// [`unit_curve`] with the unit's [`unit_homes`] already found.
pub fn unit_curve_on(u: &MixUnit, ladder: &[Grid], homes: &[SourceHomes]) -> Curve {
    let near_err: Vec<OnceCell<f64>> = u.tensors.iter().map(|_| OnceCell::new()).collect();
    Curve {
        bits: ladder
            .iter()
            .map(|&g| {
                u.tensors
                    .iter()
                    .zip(homes)
                    .map(|((t, _, _), &h)| {
                        copy_grid_in(h, g)
                            .map_or(g, |(c, _)| c)
                            .tensor_bits(t.rows(), t.cols())
                    })
                    .sum()
            })
            .collect(),
        err: ladder
            .iter()
            .map(|&g| {
                u.tensors
                    .iter()
                    .zip(homes)
                    .zip(&near_err)
                    .map(|((&(t, m, imp), &h), e)| match copy_grid_in(h, g) {
                        Some((_, CopyKind::Exact)) => 0.0,
                        Some((_, CopyKind::Near)) => *e.get_or_init(|| near_copy_error(t, m)),
                        None => relative_error(t, g, m, imp),
                    })
                    .sum()
            })
            .collect(),
    }
}

/// The relative output noise `Σ m_k ΔW_ik² / Σ m_k W_ik²` of `t`'s near copy, every row
/// of the packed tensor against `t` (0 when `t` has none).
pub fn near_copy_error(t: &Tensor, moment: &[f32]) -> f64 {
    let Some(w) = copy_near(t) else { return 0.0 };
    let (err, signal) = (0..t.rows())
        .into_par_iter()
        .map_init(
            || vec![0f32; t.cols()],
            |buf, r| {
                w.dequantize_row(r, buf);
                buf.iter()
                    .zip(t.row(r))
                    .zip(moment)
                    .fold((0f64, 0f64), |(e, s), ((&q, &x), &m)| {
                        let d = (q - x) as f64;
                        (e + d * d * m as f64, s + (x * x * m) as f64)
                    })
            },
        )
        .reduce(|| (0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
    if signal > 0.0 {
        err / signal
    } else {
        0.0
    }
}

/// [`allocate`] on the units' curves (each unit may have a ladder of its own length): the
/// step each unit ends on.
pub fn allocate_curves(curves: &[Curve], budget_bits: f64) -> Vec<usize> {
    let bits = |c: &Curve, step: usize| c.bits[step];
    let mut level = vec![0usize; curves.len()];
    let mut used: f64 = curves.iter().map(|c| bits(c, 0)).sum();
    loop {
        // The best (error drop per bit) affordable move of any unit to any higher step.
        let mut best: Option<(f64, usize, usize)> = None;
        for (u, c) in curves.iter().enumerate() {
            let from = level[u];
            for to in from + 1..c.bits.len() {
                let gain = c.err[from] - c.err[to];
                let cost = bits(c, to) - bits(c, from);
                if gain <= 0.0 || cost <= 0.0 || used + cost > budget_bits {
                    continue;
                }
                let rate = gain / cost;
                if best.is_none_or(|(r, _, _)| rate > r) {
                    best = Some((rate, u, to));
                }
            }
        }
        let Some((_, u, to)) = best else { break };
        used += bits(&curves[u], to) - bits(&curves[u], level[u]);
        level[u] = to;
    }
    level
}

/// The grids the output projection may take under every `intB`, cheapest first: 6-bit
/// groups of 64 (the grid of llama.cpp's Q6_K `output`), groups of 32, and the symmetric
/// 8-bit layout (Q8_0's, where a Q8_0 source is copied exactly). Its error counts `2L + 1`
/// times in the search (as in `quantize::budget`: its noise is the logits' own), so the
/// mix buys the finer grids when they lower the model's error more per bit than the
/// layers' steps do. The ladder does not depend on `mix_bits`: the budget still counts
/// the output at what the k-quant gives it (Q8_0 where Q6_K falls back for the row
/// length), but where its 8.5 bits would leave the layers on grids that lose more, the
/// table takes 6 bits and the layers the rest. Pinned at 8.5 bits (`mix_bits` = 8, the
/// rule before), Gemma 3 270M's tied table (63 % of its weights) left its layers 5.4 bits
/// a weight, below their Q5_0 near copies' 5.65 and Q8_0 copies' 8.5, and int4 lost 2.6x
/// Q4_K_M's KLD on held-out text; on its ladder the table takes 6-bit g32, every layer
/// its exact copy (the Q6_K `ffn_down`, which have none, 8-bit g32), and the KLD falls to
/// 1.1x Q4_K_M's at 7.01 bits per weight
/// (`docs/quality.md`, "The output table by error per bit").
pub fn head_ladder() -> Vec<Grid> {
    vec![
        Grid::Asym {
            bits: Bits::B6,
            group: 64,
        },
        Grid::Asym {
            bits: Bits::B6,
            group: 32,
        },
        Grid::Sym8,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(seed: u64, rows: usize, cols: usize, scale: f32) -> Tensor {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let data = (0..rows * cols)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * scale
            })
            .collect();
        Tensor::new(vec![rows, cols], data)
    }

    #[test]
    fn a_partial_last_group_costs_a_whole_scale_and_minimum() {
        let g128 = Grid::Asym {
            bits: Bits::B4,
            group: 128,
        };
        // 5 groups (16 bits each) in one super-block (32 bits).
        assert_eq!(
            g128.tensor_bits(2, 576),
            2.0 * (4.0 * 576.0 + 5.0 * 16.0 + 32.0)
        );
        // 9 groups of 64 span two super-blocks.
        let g64 = Grid::Asym {
            bits: Bits::B4,
            group: 64,
        };
        assert_eq!(
            g64.tensor_bits(1, 576),
            4.0 * 576.0 + 9.0 * 16.0 + 2.0 * 32.0
        );
        assert_eq!(Grid::Sym8.tensor_bits(1, 64), 8.5 * 64.0);
    }

    #[test]
    fn q4_k_m_rule_with_fallbacks() {
        assert_eq!(
            q4_k_m_bits_per_weight(TensorRole::AttnQ, Some(5), 30, 576),
            Q5_0
        );
        assert_eq!(
            q4_k_m_bits_per_weight(TensorRole::AttnQ, Some(5), 30, 2048),
            Q4_K
        );
        assert_eq!(
            q4_k_m_bits_per_weight(TensorRole::FfnDown, Some(0), 30, 1536),
            Q6_K
        );
        assert_eq!(
            q4_k_m_bits_per_weight(TensorRole::FfnDown, Some(3), 30, 1536),
            Q4_K
        );
        assert_eq!(
            q4_k_m_bits_per_weight(TensorRole::LmHead, None, 30, 576),
            Q8_0
        );
    }

    #[test]
    fn budget_is_respected_and_spent_where_error_falls() {
        let ones = vec![1f32; 64];
        let (a, b) = (tensor(1, 64, 64, 1.0), tensor(2, 64, 64, 1.0));
        let units = vec![
            MixUnit {
                role: TensorRole::AttnQ,
                layer: Some(0),
                tensors: vec![(&a, &ones, None)],
            },
            MixUnit {
                role: TensorRole::AttnK,
                layer: Some(0),
                tensors: vec![(&b, &ones, None)],
            },
        ];
        let ladder = ladder(Bits::B4, 32, Bits::B8);
        let n = 64.0 * 64.0;
        // Enough for the cheapest grid only.
        let g = allocate(&units, &ladder, 2.0 * n * 4.25);
        assert_eq!(g, vec![ladder[0], ladder[0]]);
        // Enough for one tensor at 6 bits: spent, and never exceeded.
        for budget in [n * (4.25 + 6.5), n * 11.0, n * 14.0, n * 20.0] {
            let g = allocate(&units, &ladder, budget);
            let used: f64 = g.iter().map(|g| n * g.bits_per_weight()).sum();
            assert!(used <= budget, "{used} > {budget}");
            assert!(
                used > budget - n * 4.75,
                "budget {budget} left unspent: {used}"
            );
        }
    }

    /// The output projection climbs its own ladder ([`head_ladder`]) beside the layers':
    /// with no budget beyond the floors every unit stays on its first grid; with budget
    /// for one finer step, the head (error counted 2L + 1 times) takes it first; the
    /// budget is never exceeded.
    #[test]
    fn the_head_climbs_its_own_ladder_within_the_budget() {
        let ones = vec![1f32; 64];
        let (layer, head) = (tensor(4, 64, 64, 1.0), tensor(5, 256, 64, 1.0));
        let unit = |role, t| MixUnit {
            role,
            layer: None,
            tensors: vec![(t, &ones[..], None)],
        };
        let floor = Grid::Asym {
            bits: Bits::B6,
            group: 64,
        };
        let layers = ladder(Bits::B6, 32, Bits::B6);
        let heads = head_ladder();
        assert_eq!(heads.len(), 3);
        assert_eq!(heads[0], floor);
        let mut head_curve = unit_curve(&unit(TensorRole::LmHead, &head), &heads);
        head_curve.err.iter_mut().for_each(|e| *e *= 61.0);
        let curves = vec![
            unit_curve(&unit(TensorRole::AttnQ, &layer), &layers),
            head_curve,
        ];
        let floors: f64 = curves.iter().map(|c| c.bits[0]).sum();
        assert_eq!(allocate_curves(&curves, floors), vec![0, 0]);
        let one_step = floors + (curves[1].bits[1] - curves[1].bits[0]);
        assert_eq!(allocate_curves(&curves, one_step), vec![0, 1]);
        for budget in [floors, one_step, floors * 1.1, floors * 2.0] {
            let steps = allocate_curves(&curves, budget);
            let used: f64 = steps.iter().zip(&curves).map(|(&s, c)| c.bits[s]).sum();
            assert!(used <= budget, "{used} > {budget}");
        }
    }

    /// A tensor held in GGUF blocks of type `ty` (Q5_0 or Q8_0, each block's scale from
    /// its largest value as ggml rounds them), its float32 weights what they dequantize to.
    fn source_tensor(
        ty: crate::format::ggml_blocks::GgmlType,
        seed: u64,
        rows: usize,
        cols: usize,
    ) -> Tensor {
        use crate::format::ggml_blocks::{dequantize, GgmlType, SourceBlocks};
        let x = tensor(seed, rows, cols, 0.05);
        let mut bytes = Vec::new();
        for g in x.data.chunks(32) {
            let max = g
                .iter()
                .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
            if ty == GgmlType::Q8_0 {
                let d = half::f16::from_f32(max.abs() / 127.0);
                let id = 1.0 / d.to_f32();
                bytes.extend(d.to_le_bytes());
                bytes.extend(
                    g.iter()
                        .map(|&v| (v * id).round().clamp(-127.0, 127.0) as i8 as u8),
                );
                continue;
            }
            let d = half::f16::from_f32(max / -16.0);
            let id = 1.0 / d.to_f32();
            let q: Vec<u32> = g
                .iter()
                .map(|&v| ((v * id + 16.5) as i32).clamp(0, 31) as u32)
                .collect();
            bytes.extend(d.to_le_bytes());
            let qh = (0..32).fold(0u32, |h, j| h | ((q[j] >> 4) << j));
            bytes.extend(qh.to_le_bytes());
            bytes.extend((0..16).map(|j| (q[j] & 15) as u8 | ((q[j + 16] & 15) << 4) as u8));
        }
        let mut data = vec![0f32; rows * cols];
        dequantize(ty, &bytes, &mut data).unwrap();
        Tensor::new(vec![rows, cols], data).with_source(SourceBlocks { ty, bytes })
    }

    /// The output table takes its grid by error per bit like the layers, from 6-bit g64 up
    /// to its exact Q8_0 copy, under a budget that counts it at Q8_0's 8.5 bits and the
    /// Q5_0 layers at 5.5 (Q4_K_M's fallbacks on 640-wide rows, where kwk's 5-bit copy
    /// costs 5.65): pinned at 8.5 bits the table leaves the layers at 4 bits; on its
    /// ladder it drops to 6 bits when its error counts little beside the layers', the
    /// layers take their copies and the summed error falls; when its error counts much it
    /// keeps its exact copy.
    #[test]
    fn the_head_gives_way_to_the_layers_when_they_lose_more_per_bit() {
        use crate::format::ggml_blocks::GgmlType;
        let (cols, ones) = (640, vec![1f32; 640]);
        let head = source_tensor(GgmlType::Q8_0, 20, 256, cols);
        let layers: Vec<Tensor> = (0..4)
            .map(|i| source_tensor(GgmlType::Q5_0, 21 + i, 64, cols))
            .collect();
        let unit = |role, t| MixUnit {
            role,
            layer: None,
            tensors: vec![(t, &ones[..], None)],
        };
        let base = ladder(Bits::B4, 32, Bits::B8);
        let layer_curves: Vec<Curve> = layers
            .iter()
            .map(|t| {
                let u = unit(TensorRole::FfnUp, t);
                unit_curve(&u, &unit_ladder(&base, &unit_homes(&u)))
            })
            .collect();
        let head_unit = unit(TensorRole::LmHead, &head);
        let budget = (256.0 * Q8_0 + 4.0 * 64.0 * Q5_0) * cols as f64;
        let plan = |head_steps: &[Grid], weight: f64| {
            let mut c = unit_curve(&head_unit, head_steps);
            c.err.iter_mut().for_each(|e| *e *= weight);
            let mut curves = vec![c];
            curves.extend(layer_curves.iter().cloned());
            let steps = allocate_curves(&curves, budget);
            let used: f64 = steps.iter().zip(&curves).map(|(&s, c)| c.bits[s]).sum();
            assert!(used <= budget, "{used} > {budget}");
            let err: f64 = steps.iter().zip(&curves).map(|(&s, c)| c.err[s]).sum();
            (head_steps[steps[0]], err)
        };
        let heads = head_ladder();
        assert_eq!(heads.last(), Some(&Grid::Sym8));
        let (pinned, pinned_err) = plan(&[Grid::Sym8], 2.0);
        assert_eq!(pinned, Grid::Sym8);
        let (free, free_err) = plan(&heads, 2.0);
        assert_ne!(free, Grid::Sym8, "the head kept 8.5 bits");
        assert!(free_err < pinned_err / 2.0, "{free_err} vs {pinned_err}");
        assert_eq!(plan(&heads, 1e6).0, Grid::Sym8);
    }

    #[test]
    fn a_tensor_already_on_the_g32_grid_is_not_moved_to_6_bits() {
        let ones = vec![1f32; 64];
        let mut a = tensor(3, 64, 64, 1.0);
        for row in a.data.chunks_mut(64) {
            for g in row.chunks_mut(32) {
                let mut q = [0u8; 32];
                let (d, m) = crate::quantize::rounding::round_asymmetric(g, Bits::B4, None, &mut q);
                g.iter_mut()
                    .zip(q)
                    .for_each(|(v, c)| *v = c as f32 * d.to_f32() + m.to_f32());
            }
        }
        let units = vec![MixUnit {
            role: TensorRole::AttnQ,
            layer: Some(0),
            tensors: vec![(&a, &ones, None)],
        }];
        let g = allocate(&units, &ladder(Bits::B4, 32, Bits::B8), 64.0 * 64.0 * 20.0);
        assert_eq!(
            g,
            vec![Grid::Asym {
                bits: Bits::B4,
                group: 32
            }]
        );
    }

    /// A Q5_0-loaded tensor (Q4_K_M's fallback) gets a 5-bit g32 step on int4's ladder,
    /// costing the near copy's 5.625 bits and its measured error (not zero, and far below
    /// rounding to 4 bits); with budget for it the mix takes it over 4-bit g32, and a
    /// tensor without such a source keeps the plain ladder.
    #[test]
    fn a_q5_0_source_gets_its_near_copy_step_and_the_mix_picks_it() {
        let (rows, cols) = (64, 640);
        let t = source_tensor(crate::format::ggml_blocks::GgmlType::Q5_0, 9, rows, cols);
        let ones = vec![1f32; cols];
        let unit = MixUnit {
            role: TensorRole::AttnQ,
            layer: Some(0),
            tensors: vec![(&t, &ones, None)],
        };
        let base = ladder(Bits::B4, 32, Bits::B6);
        let l = unit_ladder(&base, &unit_homes(&unit));
        let (g4, g5) = (
            Grid::Asym {
                bits: Bits::B4,
                group: 32,
            },
            Grid::Asym {
                bits: Bits::B5,
                group: 32,
            },
        );
        assert_eq!(l.len(), base.len() + 1);
        let (i4, i5) = (
            l.iter().position(|&g| g == g4).unwrap(),
            l.iter().position(|&g| g == g5).unwrap(),
        );
        assert_eq!(i5, i4 + 1);
        let c = unit_curve(&unit, &l);
        assert_eq!(c.bits[i5], g5.tensor_bits(rows, cols));
        assert!(c.err[i5] > 0.0, "a near copy is not exact");
        assert!(
            c.err[i5] * 100.0 < c.err[i4],
            "near copy {} vs 4-bit g32 {}",
            c.err[i5],
            c.err[i4]
        );
        assert_eq!(
            allocate_curves(std::slice::from_ref(&c), c.bits[i5]),
            vec![i5]
        );
        let plain = tensor(10, rows, cols, 0.05);
        let unit = MixUnit {
            tensors: vec![(&plain, &ones, None)],
            ..unit
        };
        assert_eq!(unit_ladder(&base, &unit_homes(&unit)), base);
    }

    #[test]
    fn ladders_by_width_are_cheapest_first_and_int4s_is_as_measured() {
        let g = |bits, group| Grid::Asym { bits, group };
        assert_eq!(
            ladder(Bits::B4, 32, Bits::B8),
            vec![
                g(Bits::B4, 128),
                g(Bits::B4, 64),
                g(Bits::B4, 32),
                g(Bits::B6, 64),
                g(Bits::B8, 32)
            ]
        );
        assert_eq!(
            ladder(Bits::B3, 64, Bits::B6),
            vec![
                g(Bits::B3, 128),
                g(Bits::B3, 64),
                g(Bits::B4, 64),
                g(Bits::B5, 64),
                g(Bits::B6, 64)
            ]
        );
        assert_eq!(
            ladder(Bits::B6, 32, Bits::B6),
            vec![g(Bits::B6, 128), g(Bits::B6, 64), g(Bits::B6, 32)]
        );
        for bits in [Bits::B3, Bits::B4, Bits::B5, Bits::B6] {
            for mix in [Bits::B6, Bits::B8] {
                let l = ladder(bits, 32, mix);
                let bpw: Vec<f64> = l.iter().map(|g| g.bits_per_weight()).collect();
                assert!(bpw.windows(2).all(|w| w[0] < w[1]), "{bits:?}: {bpw:?}");
            }
        }
    }

    #[test]
    fn k_quant_rules_by_width() {
        let k = |bits, role, layer| k_quant_bits_per_weight(bits, role, layer, 32, 2048);
        // Q3_K_M (32 layers: n/16 = 2).
        assert_eq!(k(Bits::B3, TensorRole::AttnQ, Some(5)), Q3_K);
        assert_eq!(k(Bits::B3, TensorRole::AttnV, Some(1)), Q5_K);
        assert_eq!(k(Bits::B3, TensorRole::AttnV, Some(2)), Q4_K);
        assert_eq!(k(Bits::B3, TensorRole::FfnDown, Some(1)), Q5_K);
        assert_eq!(k(Bits::B3, TensorRole::FfnDown, Some(9)), Q4_K);
        assert_eq!(k(Bits::B3, TensorRole::AttnOutput, Some(9)), Q4_K);
        assert_eq!(k(Bits::B3, TensorRole::Embedding, None), Q3_K);
        assert_eq!(k(Bits::B3, TensorRole::LmHead, None), Q6_K);
        // Q5_K_M (use_more_bits of 32: 0-3, 28-31, (i - 4) % 3 == 2).
        assert_eq!(k(Bits::B5, TensorRole::FfnDown, Some(0)), Q6_K);
        assert_eq!(k(Bits::B5, TensorRole::FfnDown, Some(5)), Q5_K);
        assert_eq!(k(Bits::B5, TensorRole::AttnV, Some(6)), Q6_K);
        assert_eq!(k(Bits::B5, TensorRole::FfnUp, Some(0)), Q5_K);
        assert_eq!(k(Bits::B5, TensorRole::LmHead, None), Q6_K);
        // Q6_K everywhere; int4 keeps Q4_K_M's rule with its fallbacks.
        assert_eq!(k(Bits::B6, TensorRole::FfnGate, Some(3)), Q6_K);
        assert_eq!(k(Bits::B6, TensorRole::LmHead, None), Q6_K);
        assert_eq!(
            k_quant_bits_per_weight(Bits::B4, TensorRole::AttnQ, Some(5), 30, 576),
            Q5_0
        );
    }
}

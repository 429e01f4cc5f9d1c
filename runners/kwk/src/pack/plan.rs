//! The `int4` mix plan: which grid each (role, layer) gets, chosen by sensitivity
//! (`quantize::mix`) within the bits llama.cpp's Q4_K_M would give the model.

use crate::error::{KwkError, Result};
use crate::format::quantized::{grid_for, Grid};
use crate::format::{LowBitOptions, Precision, TensorPlace, TensorRole};
use crate::model::{FeedForward, Mlp, ModelConfig, ModelWeights};
use crate::quantize::equalize::{Equalized, LayerImportance};
use crate::quantize::mix::{allocate, k_quant_bits_per_weight, ladder, MixUnit};
use std::collections::HashMap;

/// The mix units of layer `i` (q, k, v, o, gate, up, down; an MoE layer's experts share a
/// unit per role), each tensor with the second moments of its input (`li`'s importance when
/// it has them, else ones) and its rounding importance.
pub(crate) fn layer_mix_units<'a>(
    i: usize,
    l: &'a crate::model::LayerWeights,
    li: Option<&'a LayerImportance>,
    ones: &'a [f32],
) -> Vec<MixUnit<'a>> {
    use crate::model::Tensor;
    // The moments of each input (ones when equalization produced none); rounding is
    // weighted by them when it did.
    let m = |v: Option<&'a [f32]>, t: &Tensor| -> (&'a [f32], Option<&'a [f32]>) {
        match v.filter(|v| v.len() == t.cols()) {
            Some(v) => (v, Some(v)),
            None => (&ones[..t.cols().min(ones.len())], None),
        }
    };
    let mlps: Vec<&Mlp> = match &l.ffn {
        FeedForward::Dense(m) => vec![m],
        FeedForward::Moe(m) => m.experts.iter().chain(m.shared_expert.iter()).collect(),
    };
    let attn_in = li.map(|x| &x.attn_in[..]);
    let ffn_in = li.map(|x| &x.ffn_in[..]);
    type Inputs<'b> = Vec<(&'b Tensor, Option<&'b [f32]>)>;
    let groups: Vec<(TensorRole, Inputs)> = vec![
        (TensorRole::AttnQ, vec![(&l.q, attn_in)]),
        (TensorRole::AttnK, vec![(&l.k, attn_in)]),
        (TensorRole::AttnV, vec![(&l.v, attn_in)]),
        (
            TensorRole::AttnOutput,
            vec![(&l.o, li.map(|x| &x.o_in[..]))],
        ),
        (
            TensorRole::FfnGate,
            mlps.iter().map(|mm| (&mm.gate, ffn_in)).collect(),
        ),
        (
            TensorRole::FfnUp,
            mlps.iter().map(|mm| (&mm.up, ffn_in)).collect(),
        ),
        (
            TensorRole::FfnDown,
            mlps.iter()
                .enumerate()
                .map(|(j, mm)| (&mm.down, li.and_then(|x| x.down_in.get(j)).map(|v| &v[..])))
                .collect(),
        ),
    ];
    groups
        .into_iter()
        .map(|(role, tensors)| MixUnit {
            role,
            layer: Some(i),
            tensors: tensors
                .into_iter()
                .map(|(t, v)| {
                    let (moment, imp) = m(v, t);
                    (t, moment, imp)
                })
                .collect(),
        })
        .collect()
}

/// The `int4` mix by sensitivity (`quantize::mix`): a grid per (role, layer) for every
/// linear but `lm_head`, within the bits llama.cpp's Q4_K_M would give the model.
pub(crate) fn int4_plan<'a>(
    config: &ModelConfig,
    weights: &'a ModelWeights,
    eq: &'a Equalized,
    ones: &'a [f32],
    opts: &LowBitOptions,
    place: &(dyn Fn(TensorRole, Option<usize>) -> TensorPlace + Sync),
) -> Result<HashMap<(TensorRole, Option<usize>), Grid>> {
    let n_layers = config.n_layers;
    use crate::model::Tensor;
    let q4km = |role, layer, t: &Tensor| {
        t.data.len() as f64 * k_quant_bits_per_weight(opts.bits, role, layer, n_layers, t.cols())
    };
    let output = weights.output();
    let head_grid = grid_for(&Precision::LowBit(*opts), &place(TensorRole::LmHead, None))?
        .ok_or_else(|| KwkError::InvalidArgument("lm_head has no int4 grid".into()))?;
    // Bits Q4_K_M would spend on the tensors the search covers: its whole size less
    // lm_head (kwk keeps that at mix_bits; the float vectors cost the same in both).
    let mut budget = q4km(TensorRole::LmHead, None, output)
        - head_grid.tensor_bits(output.rows(), output.cols());
    let mut units: Vec<MixUnit> = Vec::new();
    if weights.lm_head.is_some() {
        budget += q4km(TensorRole::Embedding, None, &weights.embed);
        let e = &weights.embed;
        units.push(MixUnit {
            role: TensorRole::Embedding,
            layer: None,
            tensors: vec![(e, &ones[..e.cols().min(ones.len())], None)],
        });
    }
    for (i, l) in weights.layers.iter().enumerate() {
        let li = eq.importance.get(i).filter(|x| !x.attn_in.is_empty());
        for u in layer_mix_units(i, l, li, ones) {
            for (t, _, _) in &u.tensors {
                budget += q4km(u.role, Some(i), t);
            }
            units.push(u);
        }
    }
    let mix_bits = opts.mix_bits_for(place(TensorRole::LmHead, None).model_params);
    let grids = allocate(
        &units,
        &ladder(opts.bits, opts.group_size, mix_bits),
        budget,
    );
    Ok(units
        .iter()
        .zip(grids)
        .map(|(u, g)| ((u.role, u.layer), g))
        .collect())
}

/// The most input columns any linear of `w` has.
pub(crate) fn widest_input(w: &ModelWeights) -> usize {
    let mut n = w.embed.cols();
    for l in &w.layers {
        n = n.max(l.q.cols()).max(l.o.cols());
        match &l.ffn {
            FeedForward::Dense(m) => n = n.max(m.down.cols()),
            FeedForward::Moe(m) => {
                for e in m.experts.iter().chain(m.shared_expert.iter()) {
                    n = n.max(e.down.cols());
                }
            }
        }
    }
    n
}

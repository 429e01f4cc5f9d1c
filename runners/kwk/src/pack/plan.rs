//! The `int4` mix plan: which grid each (role, layer) gets, chosen by sensitivity
//! (`quantize::mix`) within the bits llama.cpp's Q4_K_M would give the model.

use crate::error::{KwkError, Result};
use crate::format::quantized::{default_mix_bits, grid_for, Grid};
use crate::format::{Precision, TensorPlace, TensorRole};
use crate::model::{FeedForward, LayerWeights, Mlp, ModelConfig, Tensor};
use crate::quantize::equalize::LayerImportance;
use crate::quantize::mix::{
    allocate_curves, ladder, q4_k_m_bits_per_weight, unit_curve, Curve, MixUnit,
};
use std::collections::HashMap;

/// The mix units of layer `i` (q, k, v, o, gate, up, down; an MoE layer's experts share a
/// unit per role), each tensor with the second moments of its input (`li`'s importance when
/// it has them, else ones) and its rounding importance.
fn layer_mix_units<'a>(
    i: usize,
    l: &'a LayerWeights,
    li: Option<&'a LayerImportance>,
    ones: &'a [f32],
) -> Vec<MixUnit<'a>> {
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

/// The `int4` mix by sensitivity (`quantize::mix`), planned one way for every source: a
/// grid per (role, layer) for every linear but `lm_head`, within the bits llama.cpp's
/// Q4_K_M would give the model. The units are handed in as the source yields them (the
/// untied embedding, then each equalized layer in order); only their curves are kept, so a
/// streamed model need not stay in memory.
pub(crate) struct MixPlanner {
    n_layers: usize,
    steps: Vec<Grid>,
    /// Bits the covered units may use: Q4_K_M's bits of them, plus what it would give
    /// `lm_head` beyond kwk's `mix_bits` grid.
    budget: f64,
    keys: Vec<(TensorRole, Option<usize>)>,
    curves: Vec<Curve>,
}

impl MixPlanner {
    /// The planner of `precision` (`None`: it is not `int4`, whose grids come from the
    /// mix rule alone). The output projection is `vocab × d` (from `config`).
    pub fn new(
        config: &ModelConfig,
        precision: &Precision,
        place: &(dyn Fn(TensorRole, Option<usize>) -> TensorPlace + Sync),
    ) -> Result<Option<MixPlanner>> {
        let Precision::Int4(opts) = precision else {
            return Ok(None);
        };
        let n_layers = config.n_layers;
        let (vocab, d) = (config.vocab_size, config.hidden_size);
        let head_grid = grid_for(precision, &place(TensorRole::LmHead, None))?
            .ok_or_else(|| KwkError::InvalidArgument("lm_head has no int4 grid".into()))?;
        let mix_bits = opts
            .mix_bits
            .unwrap_or_else(|| default_mix_bits(place(TensorRole::LmHead, None).model_params));
        // Bits Q4_K_M would spend on the tensors the search covers: its whole size less
        // lm_head (kwk keeps that at mix_bits; the float vectors cost the same in both).
        let out_bits =
            (vocab * d) as f64 * q4_k_m_bits_per_weight(TensorRole::LmHead, None, n_layers, d);
        Ok(Some(MixPlanner {
            n_layers,
            steps: ladder(opts.group_size, mix_bits),
            budget: out_bits - head_grid.tensor_bits(vocab, d),
            keys: Vec::new(),
            curves: Vec::new(),
        }))
    }

    fn add(&mut self, u: &MixUnit) {
        for (t, _, _) in &u.tensors {
            self.budget += t.data.len() as f64
                * q4_k_m_bits_per_weight(u.role, u.layer, self.n_layers, t.cols());
        }
        self.curves.push(unit_curve(u, &self.steps));
        self.keys.push((u.role, u.layer));
    }

    /// The untied input embedding `e` (its inputs' second moments taken as ones).
    pub fn add_embedding(&mut self, e: &Tensor) {
        let ones = vec![1f32; e.cols()];
        self.add(&MixUnit {
            role: TensorRole::Embedding,
            layer: None,
            tensors: vec![(e, &ones[..], None)],
        });
    }

    /// Layer `i`, equalized, with its rounding importance when equalization kept one.
    pub fn add_layer(&mut self, i: usize, l: &LayerWeights, imp: &LayerImportance) {
        let ones = vec![1f32; layer_width(l)];
        let li = Some(imp).filter(|x| !x.attn_in.is_empty());
        for u in layer_mix_units(i, l, li, &ones) {
            self.add(&u);
        }
    }

    /// The grids chosen.
    pub fn finish(self) -> HashMap<(TensorRole, Option<usize>), Grid> {
        let grids = allocate_curves(&self.curves, &self.steps, self.budget);
        self.keys.into_iter().zip(grids).collect()
    }
}

/// The widest input of a layer's linears.
fn layer_width(l: &LayerWeights) -> usize {
    let mut n = l.q.cols().max(l.o.cols());
    match &l.ffn {
        FeedForward::Dense(m) => n = n.max(m.down.cols()),
        FeedForward::Moe(m) => {
            for e in m.experts.iter().chain(m.shared_expert.iter()) {
                n = n.max(e.down.cols());
            }
        }
    }
    n
}

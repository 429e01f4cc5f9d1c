//! Channel equalization's factors and how they are applied: per layer and for an untied
//! `lm_head`, the factors moved across each norm/linear and linear/linear pair
//! ([`LayerScales`], [`ChannelScales`]), what they do to the linears' inputs
//! ([`InputFactors`]), and applying them to a layer, one matrix of it, or a whole model.

use super::{kv_channel, mlps_mut};
use crate::model::{FeedForward, LayerWeights, ModelConfig, ModelWeights, Tensor};
use rayon::prelude::*;

/// The factors chosen for one layer; an empty vector is the identity.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LayerScales {
    /// Per model channel, moved from `attn_norm` into q/k/v.
    pub attn_in: Vec<f32>,
    /// Per v channel, moved from v's rows into `attn_output`'s columns.
    pub v_to_o: Vec<f32>,
    /// Per model channel, moved from `ffn_norm` into gate/up (router, experts included).
    pub ffn_in: Vec<f32>,
    /// Per MLP (as in [`LayerStats::down_in`]), per hidden channel, from `up` into `down`.
    pub up_to_down: Vec<Vec<f32>>,
}

/// Per linear input of one layer, the factor each channel is divided by once a layer's
/// factors are applied (`x' = x / α`, the weights' columns having been multiplied by `α`);
/// `None` where the input is unchanged.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InputFactors {
    pub attn_in: Option<Vec<f32>>,
    /// Per query channel of `attn_output`'s input (each reads its key/value group's v channel).
    pub o_in: Option<Vec<f32>>,
    pub ffn_in: Option<Vec<f32>>,
    /// Per MLP, as [`LayerStats::down_in`].
    pub down_in: Vec<Option<Vec<f32>>>,
}

impl LayerScales {
    /// What [`apply_layer`] does to the inputs of the layer's linears (see [`InputFactors`]).
    pub fn input_factors(&self, config: &ModelConfig) -> InputFactors {
        let some = |v: &Vec<f32>| (!v.is_empty()).then(|| v.clone());
        let o_cols = config.n_heads * config.head_dim;
        InputFactors {
            attn_in: some(&self.attn_in),
            o_in: (!self.v_to_o.is_empty()).then(|| {
                (0..o_cols)
                    .map(|c| self.v_to_o[kv_channel(config, c)])
                    .collect()
            }),
            ffn_in: some(&self.ffn_in),
            down_in: self.up_to_down.iter().map(some).collect(),
        }
    }
}

/// Factors for every layer, and the one moved from the final norm into an untied `lm_head`
/// (empty: identity, e.g. a tied head or a format that does not search it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChannelScales {
    pub layers: Vec<LayerScales>,
    pub head: Vec<f32>,
}

/// Per-input-column second moments of one layer's linears in the rescaled coordinates: the
/// rounding importance (empty when importance is off).
#[derive(Debug, Clone, Default)]
pub struct LayerImportance {
    pub attn_in: Vec<f32>,
    pub o_in: Vec<f32>,
    pub ffn_in: Vec<f32>,
    pub down_in: Vec<Vec<f32>>,
}

fn scale_cols(t: &mut Tensor, alpha: &[f32]) {
    let c = t.cols();
    for row in t.data.chunks_mut(c) {
        row.iter_mut().zip(alpha).for_each(|(w, a)| *w *= a);
    }
}

fn scale_rows_inv(t: &mut Tensor, alpha: &[f32]) {
    let c = t.cols();
    for (row, a) in t.data.chunks_mut(c).zip(alpha) {
        row.iter_mut().for_each(|w| *w /= a);
    }
}

fn div_vec(v: &mut [f32], alpha: &[f32]) {
    v.iter_mut().zip(alpha).for_each(|(x, a)| *x /= a);
}

/// Applies one layer's factors in place (the order the search chose them in).
pub fn apply_layer(l: &mut LayerWeights, config: &ModelConfig, s: &LayerScales) {
    if !s.attn_in.is_empty() {
        div_vec(&mut l.attn_norm, &s.attn_in);
        for t in [&mut l.q, &mut l.k, &mut l.v] {
            scale_cols(t, &s.attn_in);
        }
    }
    if !s.v_to_o.is_empty() {
        scale_rows_inv(&mut l.v, &s.v_to_o);
        if let Some(b) = &mut l.v_bias {
            div_vec(b, &s.v_to_o);
        }
        let per_col: Vec<f32> = (0..l.o.cols())
            .map(|c| s.v_to_o[kv_channel(config, c)])
            .collect();
        scale_cols(&mut l.o, &per_col);
    }
    if !s.ffn_in.is_empty() {
        div_vec(&mut l.ffn_norm, &s.ffn_in);
        if let FeedForward::Moe(m) = &mut l.ffn {
            scale_cols(&mut m.router, &s.ffn_in);
            if let Some(g) = &mut m.shared_expert_gate {
                scale_cols(g, &s.ffn_in);
            }
        }
        for m in mlps_mut(&mut l.ffn) {
            scale_cols(&mut m.gate, &s.ffn_in);
            scale_cols(&mut m.up, &s.ffn_in);
        }
    }
    for (m, a) in mlps_mut(&mut l.ffn).into_iter().zip(&s.up_to_down) {
        if !a.is_empty() {
            scale_rows_inv(&mut m.up, a);
            scale_cols(&mut m.down, a);
        }
    }
}

/// A matrix of a dense (non-MoE) layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DensePart {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

/// Applies a dense layer's factors to one of its matrices alone: the same operations in
/// the same order as [`apply_layer`] on the whole layer, so a streaming packer can load,
/// scale and pack one matrix at a time.
pub fn apply_to_part(t: &mut Tensor, part: DensePart, config: &ModelConfig, s: &LayerScales) {
    let up_down = s.up_to_down.first().filter(|a| !a.is_empty());
    match part {
        DensePart::Q | DensePart::K | DensePart::V => {
            if !s.attn_in.is_empty() {
                scale_cols(t, &s.attn_in);
            }
            if part == DensePart::V && !s.v_to_o.is_empty() {
                scale_rows_inv(t, &s.v_to_o);
            }
        }
        DensePart::O => {
            if !s.v_to_o.is_empty() {
                let per_col: Vec<f32> = (0..t.cols())
                    .map(|c| s.v_to_o[kv_channel(config, c)])
                    .collect();
                scale_cols(t, &per_col);
            }
        }
        DensePart::Gate | DensePart::Up => {
            if !s.ffn_in.is_empty() {
                scale_cols(t, &s.ffn_in);
            }
            if let (DensePart::Up, Some(a)) = (part, up_down) {
                scale_rows_inv(t, a);
            }
        }
        DensePart::Down => {
            if let Some(a) = up_down {
                scale_cols(t, a);
            }
        }
    }
}

/// `weights` with `scales` applied (the same function, other weights).
pub fn apply(weights: &ModelWeights, config: &ModelConfig, scales: &ChannelScales) -> ModelWeights {
    let mut out = weights.clone();
    out.layers
        .par_iter_mut()
        .zip(&scales.layers)
        .for_each(|(l, s)| apply_layer(l, config, s));
    apply_head(&mut out, &scales.head);
    out
}

/// Moves `alpha` from the final norm into the columns of an untied `lm_head` (a tied one
/// is also the embedding, whose rows are residual vectors: it is left alone).
pub fn apply_head(w: &mut ModelWeights, alpha: &[f32]) {
    if alpha.is_empty() {
        return;
    }
    if let Some(h) = &mut w.lm_head {
        div_vec(&mut w.final_norm, alpha);
        scale_cols(h, alpha);
    }
}

//! Calibration, the pipeline's measuring step: activation statistics and Hessians over the
//! calibration tokens (run by a float32 decoder, the [`CalibrationPass`] the pipeline is
//! handed: the decoder is the activation sink, the pipeline owns what is measured and what
//! it is used for), equalization with them, and the GPTQ passes.

use crate::error::{KwkError, Result};
use crate::format::quantized::{quantize_on, source_copy_grid, Grid, QuantizedTensor};
use crate::format::{Precision, TensorPlace, TensorRole};
use crate::model::{FeedForward, Mlp, ModelConfig, ModelWeights};
use crate::quantize::equalize::{
    equalize, ActivationStats, ChannelScales, EqualizeOptions, Equalized, InputFactors, LayerStats,
};
use crate::quantize::gptq::{
    act_order, gptq_lowbit, inverse_factor, Hessian, InverseFactor, KeptHessian, KEPT_HESSIAN_BYTES,
};
use rayon::prelude::*;
use std::collections::HashMap;

/// A float32 decoder run over calibration tokens that reports what its linears see: the
/// activation sink the pipeline measures through (implemented by the decoder).
pub trait CalibrationPass {
    /// Per-channel second moments of every linear's input over `tokens`, in windows of
    /// `window` tokens from an empty cache; an expert no token reached gets `fallback`'s.
    fn activation_stats(
        &mut self,
        tokens: &[u32],
        window: usize,
        fallback: &ActivationStats,
    ) -> Result<ActivationStats>;
    /// The Hessians of every linear input, one layer at a time (`each(layer, hessians)`),
    /// and the sums of squares of the same pass.
    fn layer_hessians(
        &mut self,
        tokens: &[u32],
        window: usize,
        each: &mut dyn FnMut(usize, LayerGrams) -> Result<()>,
    ) -> Result<PassRecords>;
}

/// Builds the float32 [`CalibrationPass`] of `weights` with a KV cache of `window` tokens
/// on `threads` threads (the decoder hands the pipeline this).
pub type Reference<'a> = &'a (dyn Fn(&ModelConfig, &ModelWeights, usize, usize) -> Result<Box<dyn CalibrationPass>>
         + Sync);

/// Calibration tokens the statistics are gathered over (at most).
pub const CALIBRATION_TOKENS: usize = 8192;

/// Tokens per window when calibration statistics are gathered.
pub const CALIBRATION_WINDOW: usize = 512;

/// A float32 decoder of `weights` for the calibration passes, with a KV cache of one
/// calibration window (at most the model's positions), and that window.
fn calibration_decoder(
    config: &ModelConfig,
    weights: &ModelWeights,
    threads: usize,
    reference: Reference<'_>,
) -> Result<(Box<dyn CalibrationPass>, usize)> {
    let window = CALIBRATION_WINDOW.min(config.max_position_embeddings.max(1));
    let decoder = reference(config, weights, window, threads)?;
    Ok((decoder, window))
}

/// Equalizes `weights` for a quantized `precision` (`quantize::equalize`): with activation
/// statistics measured by a float32 decoder over the calibration tokens for
/// `int8:calib`/`int8:gptq`/`int4:calib`/`int4:gptq`, else estimated from the weights.
/// Calibrated int8 is searched with [`EqualizeOptions::INT8_CALIBRATED`] (activation-block
/// error scored, the `lm_head` unit), calibrated int4 with
/// [`EqualizeOptions::CALIBRATED`].
pub(crate) fn equalize_for(
    config: &ModelConfig,
    weights: &ModelWeights,
    precision: &Precision,
    calibration: Option<&[u32]>,
    threads: usize,
    place: &(dyn Fn(TensorRole, Option<usize>) -> TensorPlace + Sync),
    reference: Reference<'_>,
) -> Result<(Equalized, Option<Vec<KeptGrams>>)> {
    let estimated = ActivationStats::estimate(weights, config);
    if !precision.needs_calibration() {
        let e = equalize(
            weights,
            config,
            precision,
            &estimated,
            place,
            EqualizeOptions::estimated_for(precision),
        )?;
        return Ok((e, None));
    }
    let tokens = calibration.filter(|t| !t.is_empty()).ok_or_else(|| {
        KwkError::InvalidArgument(format!(
            "{} needs calibration tokens (kwk-eval: --calib-text FILE)",
            precision.name()
        ))
    })?;
    let (mut reference, window) = calibration_decoder(config, weights, threads, reference)?;
    let tokens = &tokens[..tokens.len().min(CALIBRATION_TOKENS)];
    // GPTQ formats whose Hessians fit in KEPT_HESSIAN_BYTES: one layer-by-layer pass
    // measures the statistics and the Hessians together (the Hessians are kept for
    // `gptq_layers`); otherwise the statistics come from a windowed forward pass here and
    // the Hessians from a second pass over the equalized weights.
    let mut kept = None;
    let limit = KEPT_HESSIAN_LIMIT.with(|l| l.get());
    let stats = if precision.gptq() && kept_hessian_bytes(config, weights) <= limit {
        let mut grams = Vec::with_capacity(weights.layers.len());
        let records = reference.layer_hessians(tokens, window, &mut |_, g| {
            grams.push(KeptGrams::keep(&g));
            Ok(())
        })?;
        kept = Some(grams);
        records.stats(&estimated)
    } else {
        reference.activation_stats(tokens, window, &estimated)?
    };
    drop(reference);
    let opts = match precision {
        Precision::Int8(_) => EqualizeOptions::INT8_CALIBRATED,
        // The head unit too: its measured moments are what `bpw` weighs lm_head's error by.
        Precision::Bpw(_) => EqualizeOptions {
            head: true,
            ..EqualizeOptions::CALIBRATED
        },
        _ => EqualizeOptions::CALIBRATED,
    };
    Ok((
        equalize(weights, config, precision, &stats, place, opts)?,
        kept,
    ))
}

thread_local! {
    /// [`KEPT_HESSIAN_BYTES`] for builds on this thread (tests lower it to take the
    /// two-pass path).
    pub(crate) static KEPT_HESSIAN_LIMIT: std::cell::Cell<usize> = const {
        std::cell::Cell::new(KEPT_HESSIAN_BYTES)
    };
}

/// Bytes of every layer's Hessians as [`KeptHessian`]s.
fn kept_hessian_bytes(config: &ModelConfig, weights: &ModelWeights) -> usize {
    let d = config.hidden_size;
    let qd = config.n_heads * config.head_dim;
    let values: usize = weights
        .layers
        .iter()
        .map(|l| {
            let mlps: usize = match &l.ffn {
                FeedForward::Dense(m) => KeptHessian::values(m.down.cols()),
                FeedForward::Moe(m) => m
                    .experts
                    .iter()
                    .chain(m.shared_expert.iter())
                    .map(|e| KeptHessian::values(e.down.cols()))
                    .sum(),
            };
            2 * KeptHessian::values(d) + KeptHessian::values(qd) + mlps
        })
        .sum();
    values * std::mem::size_of::<f32>()
}

/// Key of a tensor quantized by the GPTQ pass: role, layer, MLP index (0 outside the
/// feed-forward; experts in order, then the shared expert).
pub(crate) type GptqKey = (TensorRole, usize, usize);

/// A GPTQ factor and the column order it was computed for (`None`: natural order).
type OrderedFactor = (InverseFactor, Option<Vec<usize>>);

/// What [`gptq_layers`] runs on: the model (equalized weights), the format, the
/// calibration tokens, the threads and the float32 decoder to build, and where each tensor
/// sits.
#[derive(Clone, Copy)]
pub(crate) struct GptqPass<'a> {
    pub config: &'a ModelConfig,
    pub weights: &'a ModelWeights,
    pub precision: &'a Precision,
    pub calibration: &'a [u32],
    pub threads: usize,
    pub place: &'a (dyn Fn(TensorRole, Option<usize>) -> TensorPlace + Sync),
    pub reference: Reference<'a>,
}

/// GPTQ for every linear of every layer (`quantize::gptq`) of `weights`, the *equalized*
/// weights. The Hessians are those `kept` from the calibration pass over the original
/// weights, rescaled by the equalization's factors, or else gathered layer by layer
/// ([`CalibrationPass::layer_hessians`]) by a float32 decoder of `weights`: equalization
/// preserves the function, so that decoder's linears see exactly the inputs the final,
/// rescaled weights will (`x / α` per channel). Each tensor is rounded on the grid `grid`
/// gives it; an expert that no calibration token reached is rounded plainly. The embedding
/// and `lm_head` are not in a layer and are rounded plainly by the caller.
pub(crate) fn gptq_layers(
    pass: &GptqPass<'_>,
    grid: &dyn Fn(TensorRole, usize) -> Result<Grid>,
    kept: Option<(Vec<KeptGrams>, &ChannelScales)>,
) -> Result<HashMap<GptqKey, QuantizedTensor>> {
    let GptqPass {
        config,
        weights,
        precision,
        calibration,
        threads,
        place,
        reference,
    } = *pass;
    let mut out = HashMap::new();
    let mut each_layer = |li: usize, grams: LayerGrams| -> Result<()> {
        let l = &weights.layers[li];
        let mlps: Vec<&Mlp> = match &l.ffn {
            FeedForward::Dense(m) => vec![m],
            FeedForward::Moe(m) => m.experts.iter().chain(m.shared_expert.iter()).collect(),
        };
        let empty = Hessian::zeros(0);
        let mut inputs: Vec<&Hessian> = vec![&grams.attn_in, &grams.o_in, &grams.ffn_in];
        inputs.extend((0..mlps.len()).map(|j| grams.down_in.get(j).unwrap_or(&empty)));
        let moments: Vec<Vec<f32>> = inputs.iter().map(|h| h.moments()).collect();
        let mut jobs: Vec<(TensorRole, usize, &crate::model::Tensor, usize)> = vec![
            (TensorRole::AttnQ, 0, &l.q, 0),
            (TensorRole::AttnK, 0, &l.k, 0),
            (TensorRole::AttnV, 0, &l.v, 0),
            (TensorRole::AttnOutput, 0, &l.o, 1),
        ];
        for (j, m) in mlps.iter().enumerate() {
            jobs.push((TensorRole::FfnGate, j, &m.gate, 2));
            jobs.push((TensorRole::FfnUp, j, &m.up, 2));
            jobs.push((TensorRole::FfnDown, j, &m.down, 3 + j));
        }
        let grids: Vec<Grid> = jobs
            .iter()
            .map(|&(role, ..)| grid(role, li))
            .collect::<Result<_>>()?;
        // A tensor copied from its GGUF source's blocks skips GPTQ (`format::source_grid`:
        // nothing rounds closer than the exact values).
        let copied: Vec<bool> = jobs
            .iter()
            .zip(&grids)
            .map(|(&(_, _, t, _), &g)| source_copy_grid(t, g).is_some())
            .collect();
        // One factor per input, or with act-order per input and group size (the column
        // order depends on the groups), each (input, group) factored once, in parallel.
        let act = matches!(precision, Precision::LowBit(o) if o.act_order);
        let mut keys: Vec<(usize, usize)> = jobs
            .iter()
            .zip(&grids)
            .zip(&copied)
            .filter_map(|((&(.., input), g), &copied)| match g {
                Grid::Asym { group, .. } if inputs[input].tokens > 0 && !copied => {
                    Some((input, if act { *group } else { 0 }))
                }
                _ => None,
            })
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let factors: HashMap<(usize, usize), OrderedFactor> = keys
            .par_iter()
            .map(|&(input, group)| {
                let what = format!("layer {li} ({})", precision.name());
                let h = inputs[input];
                if group == 0 {
                    return Ok(((input, 0), (inverse_factor(h, &what)?, None)));
                }
                let order = act_order(&moments[input], group);
                let f = inverse_factor(&h.permuted(&order), &what)?;
                Ok(((input, group), (f, Some(order))))
            })
            .collect::<Result<_>>()?;
        for (((role, which, t, input), g), copied) in jobs.into_iter().zip(grids).zip(copied) {
            let factor = match g {
                Grid::Asym { group, .. } if !copied => {
                    factors.get(&(input, if act { group } else { 0 }))
                }
                _ => None,
            };
            let q = match (g, factor) {
                (Grid::Asym { bits, group }, Some((f, order))) => {
                    QuantizedTensor::LowBit(gptq_lowbit(
                        t,
                        f,
                        bits,
                        group,
                        Some(&moments[input]),
                        order.as_deref(),
                        &format!("{role:?} weight of layer {li}"),
                    )?)
                }
                _ => quantize_on(t, precision, place(role, Some(li)), Some(g), None)?,
            };
            out.insert((role, li, which), q);
        }
        Ok(())
    };
    match kept {
        // The Hessians measured on the original weights, rescaled to the equalized inputs.
        Some((kept, scales)) => {
            for (li, k) in kept.into_iter().enumerate() {
                crate::interrupt::check()?;
                let factors = scales
                    .layers
                    .get(li)
                    .map(|s| s.input_factors(config))
                    .unwrap_or_default();
                each_layer(li, k.restore(&factors))?;
            }
        }
        None => {
            let (mut reference, window) = calibration_decoder(config, weights, threads, reference)?;
            let tokens = &calibration[..calibration.len().min(CALIBRATION_TOKENS)];
            reference.layer_hessians(tokens, window, &mut each_layer)?;
        }
    }
    Ok(out)
}

/// The sums of squares one calibration pass gathered: per layer, and `lm_head`'s input
/// (sums, positions).
pub struct PassRecords {
    pub(crate) layers: Vec<LayerRecord>,
    pub(crate) head: Option<(Vec<f64>, u64)>,
}

impl PassRecords {
    /// The per-channel second moments; an expert no token was routed to (or a missing head
    /// record) gets `fallback`'s estimate.
    pub(crate) fn stats(&self, fallback: &ActivationStats) -> ActivationStats {
        let mean = |sums: &[f64], n: u64| -> Vec<f32> {
            sums.iter().map(|s| (s / n.max(1) as f64) as f32).collect()
        };
        let layers = self
            .layers
            .iter()
            .zip(&fallback.layers)
            .map(|(r, fb)| LayerStats {
                attn_in: mean(&r.attn_in, r.tokens),
                o_in: mean(&r.o_in, r.tokens),
                ffn_in: mean(&r.ffn_in, r.tokens),
                down_in: fb
                    .down_in
                    .iter()
                    .enumerate()
                    .map(|(i, est)| match r.down_in.get(i) {
                        Some((sums, n)) if *n > 0 => mean(sums, *n),
                        _ => est.clone(),
                    })
                    .collect(),
            })
            .collect();
        let head_in = match &self.head {
            Some((sums, n)) if *n > 0 => mean(sums, *n),
            _ => fallback.head_in.clone(),
        };
        ActivationStats { layers, head_in }
    }
}

/// Sums of squares of every linear's input per channel, gathered during calibration
/// (`KwkDecoder::activation_stats`).
#[derive(Debug, Default, Clone)]
pub(crate) struct LayerRecord {
    pub tokens: u64,
    pub attn_in: Vec<f64>,
    pub o_in: Vec<f64>,
    pub ffn_in: Vec<f64>,
    /// Per MLP (dense; or experts then the shared expert): sums and the tokens routed to it.
    pub down_in: Vec<(Vec<f64>, u64)>,
    /// When set, the Hessians `Σ x xᵀ` of the same inputs too (GPTQ; one layer at a time).
    pub gram: Option<LayerGrams>,
}

/// `Σ x xᵀ` of each linear input of one layer (`KwkDecoder::layer_hessians`).
#[derive(Debug, Clone)]
pub struct LayerGrams {
    pub attn_in: Hessian,
    pub o_in: Hessian,
    pub ffn_in: Hessian,
    /// Per MLP, as [`LayerRecord::down_in`] (an expert no token reached has none, or an
    /// empty one).
    pub down_in: Vec<Hessian>,
}

impl Default for LayerGrams {
    fn default() -> Self {
        LayerGrams {
            attn_in: Hessian::zeros(0),
            o_in: Hessian::zeros(0),
            ffn_in: Hessian::zeros(0),
            down_in: Vec::new(),
        }
    }
}

/// One layer's Hessians kept for GPTQ after the calibration pass that measured them
/// ([`KeptHessian`]: half the size), until the layer's equalization is known.
#[derive(Debug, Clone)]
pub struct KeptGrams {
    attn_in: KeptHessian,
    o_in: KeptHessian,
    ffn_in: KeptHessian,
    down_in: Vec<KeptHessian>,
}

impl KeptGrams {
    pub fn keep(g: &LayerGrams) -> Self {
        KeptGrams {
            attn_in: KeptHessian::keep(&g.attn_in),
            o_in: KeptHessian::keep(&g.o_in),
            ffn_in: KeptHessian::keep(&g.ffn_in),
            down_in: g.down_in.iter().map(KeptHessian::keep).collect(),
        }
    }

    /// The Hessians of the inputs the equalized layer's linears see (each input divided by
    /// its factor, [`InputFactors`]).
    pub fn restore(&self, f: &InputFactors) -> LayerGrams {
        LayerGrams {
            attn_in: self.attn_in.restore(f.attn_in.as_deref()),
            o_in: self.o_in.restore(f.o_in.as_deref()),
            ffn_in: self.ffn_in.restore(f.ffn_in.as_deref()),
            down_in: self
                .down_in
                .iter()
                .enumerate()
                .map(|(j, h)| h.restore(f.down_in.get(j).and_then(|a| a.as_deref())))
                .collect(),
        }
    }
}

/// The statistics of one MLP's `down` input: the sums of squares with their token count,
/// and the Hessian when it is gathered.
pub(crate) type DownRecord<'a> = (&'a mut (Vec<f64>, u64), Option<&'a mut Hessian>);

impl LayerRecord {
    pub(crate) fn down(&mut self, which: usize) -> DownRecord<'_> {
        if self.down_in.len() <= which {
            self.down_in.resize(which + 1, (Vec::new(), 0));
        }
        let gram = self.gram.as_mut().map(|g| {
            if g.down_in.len() <= which {
                g.down_in.resize_with(which + 1, || Hessian::zeros(0));
            }
            &mut g.down_in[which]
        });
        (&mut self.down_in[which], gram)
    }
}

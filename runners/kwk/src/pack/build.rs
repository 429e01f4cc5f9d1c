//! The packing pipeline for a model held in float32: pack-cache look-up, equalization
//! (with calibration when the format asks for it), the `int4` mix plan, GPTQ, then every
//! tensor packed through one [`Packer`] and every layer put together by
//! [`build_layer`](super::source::build_layer) from the in-memory [`LayerSource`].
//! A streamed file (`stream`) and the pack cache (`cached`) are the other two sources.

use super::cache::{self, PackOutcome, PackSession};
use super::calibrate::{equalize_for, gptq_layers, GptqKey, GptqPass, Reference};
use super::model::{names, Built, Layer, PackedModel};
use super::plan::{int4_plan, widest_input};
use super::source::{build_layer, lock, LayerFloats, LayerSource, LinearId, Packer};
use crate::error::{KwkError, Result};
use crate::format::quantized::{grid_for, Grid, QuantizedTensor};
use crate::format::{PackedLinear, Precision, TensorPlace, TensorRole};
use crate::model::{FeedForward, LayerWeights, Mlp, ModelConfig, ModelWeights};
use crate::quantize::equalize::LayerImportance;
use crate::threads::ThreadPool;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// What a build is asked for: the format and how to get there.
pub(crate) struct PackOptions<'a> {
    pub precision: Precision,
    pub threads: usize,
    /// Token ids of calibration text (the calibrated formats).
    pub calibration_tokens: Option<&'a [u32]>,
    /// The pack cache's folder (`None`: no cache).
    pub pack_cache_dir: Option<&'a Path>,
    /// Builds the float32 decoder calibration runs on.
    pub reference: Reference<'a>,
}

/// Packs `weights` (named `source` for the pack cache and in errors) as `options` say;
/// from the pack cache when it holds this model and recipe.
pub(crate) fn pack_weights(
    config: &ModelConfig,
    weights: &ModelWeights,
    source: &Path,
    options: &PackOptions<'_>,
) -> Result<Built> {
    let precision = options.precision;
    let n_layers = config.n_layers;
    let n_params = count_params(weights);
    let place = |role, layer| TensorPlace {
        role,
        layer,
        n_layers,
        model_params: n_params,
    };
    // int8/int4 weights go through the pack cache when a folder is given: mapped from
    // a valid file for this model and recipe (the weights are then not used), else
    // quantized, reusing the tensors of an older file whose key is unchanged, and
    // written (`pack_cache`).
    let quantized = precision.is_quantized();
    let calibration = options.calibration_tokens;
    let mut session = None;
    let mut not_written = None;
    if let (Some(dir), true) = (options.pack_cache_dir, quantized) {
        match cache::try_load(dir, source, &precision, calibration) {
            Ok(Some(cached)) => return super::cached::from_cache(config, cached, source),
            Ok(None) => {}
            Err(e) => crate::notices::warn(format!("pack cache: {e}; packing without it")),
        }
        match PackSession::open(dir, source, &precision, calibration) {
            Ok(mut s) => {
                if let Some(cached) = s.take_hit() {
                    return super::cached::from_cache(config, cached, source);
                }
                session = Some(Mutex::new(s));
            }
            Err(e) => not_written = Some(PackOutcome::NotWritten(e.to_string())),
        }
    }
    // Quantized formats first move per-channel factors across norm/linear pairs where
    // that lowers the estimated rounding error (`quantize::equalize`), and round with
    // per-column importance; the decoder then runs the equalized weights.
    let calibrating = precision.needs_calibration();
    let mut calibration_s = 0f64;
    let mut kept_grams = None;
    let equalized = if quantized {
        let t0 = Instant::now();
        let (e, kept) = equalize_for(
            config,
            weights,
            &precision,
            calibration,
            options.threads,
            &place,
            options.reference,
        )?;
        if calibrating {
            calibration_s += t0.elapsed().as_secs_f64();
        }
        kept_grams = kept;
        Some(e)
    } else {
        None
    };
    let weights: &ModelWeights = equalized.as_ref().map_or(weights, |e| &e.weights);
    // Second moments of 1 for inputs without measured or estimated ones (the embedding).
    let unit_moments = vec![1f32; widest_input(weights)];
    let plan = match (&precision, &equalized) {
        (Precision::LowBit(opts), Some(eq)) => {
            int4_plan(config, weights, eq, &unit_moments, opts, &place)?
        }
        _ => HashMap::new(),
    };
    let grid = |role, layer| plan.get(&(role, layer)).copied();
    // int4:gptq / int8:gptq: every layer's linears rounded with error compensation now,
    // in one layer-by-layer pass (the embedding and lm_head are rounded plainly below).
    let gptq_done: Mutex<HashMap<GptqKey, QuantizedTensor>> = Mutex::new(match &precision {
        p if p.gptq() => {
            let t0 = Instant::now();
            let tokens = calibration.filter(|t| !t.is_empty()).ok_or_else(|| {
                KwkError::InvalidArgument(format!(
                    "{} needs calibration tokens (kwk-eval: --calib-text FILE)",
                    precision.name()
                ))
            })?;
            let grid_of = |role, layer: usize| -> Result<Grid> {
                match grid(role, Some(layer)) {
                    Some(g) => Ok(g),
                    None => grid_for(&precision, &place(role, Some(layer)))?.ok_or_else(|| {
                        KwkError::InvalidArgument(format!(
                            "{role:?} weight of layer {layer} has no quantized grid"
                        ))
                    }),
                }
            };
            let kept = kept_grams.take().zip(equalized.as_ref().map(|e| &e.scales));
            let pass = GptqPass {
                config,
                weights,
                precision: &precision,
                calibration: tokens,
                threads: options.threads,
                place: &place,
                reference: options.reference,
            };
            let done = gptq_layers(&pass, &grid_of, kept)?;
            calibration_s += t0.elapsed().as_secs_f64();
            done
        }
        _ => HashMap::new(),
    });
    let packer = Packer {
        precision: &precision,
        place: &place,
        grid: &grid,
        session: session.as_ref(),
        gptq_done: Some(&gptq_done),
    };
    let source_of = |i: usize| MemorySource {
        layer: &weights.layers[i],
        importance: equalized.as_ref().and_then(|e| e.importance.get(i)),
        packer: &packer,
    };

    // Jobs: the embedding, the untied lm_head, then each layer, taken from a shared
    // counter by the pool's threads (the embedding costs about as much as 8 layers of
    // a small model, so a queue balances better than a static split).
    // A tied output projection is packed once, as the lm_head (it is the larger
    // consumer); embedding lookups dequantize its rows.
    let pool = ThreadPool::new(options.threads);
    let embed_role = if weights.lm_head.is_some() {
        TensorRole::Embedding
    } else {
        TensorRole::LmHead
    };
    // The untied lm_head's importance when its unit was equalized (int8:calib).
    let head_imp = equalized
        .as_ref()
        .map(|e| &e.head_importance[..])
        .filter(|v| !v.is_empty());
    let n_jobs = 2 + n_layers;
    let next_job = AtomicUsize::new(0);
    let embed_slot = Mutex::new(None);
    let head_slot = Mutex::new(None);
    let layer_slots: Vec<Mutex<Option<Result<Layer>>>> =
        (0..n_layers).map(|_| Mutex::new(None)).collect();
    let run_jobs = || loop {
        let job = next_job.fetch_add(1, Ordering::Relaxed);
        match job {
            0 => {
                *lock(&embed_slot) =
                    Some(packer.pack(names::EMBED, &weights.embed, (embed_role, None, 0), None))
            }
            1 => {
                *lock(&head_slot) = weights.lm_head.as_ref().map(|h| {
                    packer.pack(names::LM_HEAD, h, (TensorRole::LmHead, None, 0), head_imp)
                })
            }
            j if j < n_jobs => {
                let i = j - 2;
                *lock(&layer_slots[i]) = Some(build_layer(&mut source_of(i), config, i))
            }
            _ => break,
        }
    };
    // With a session, tensors are quantized one after the other on this thread
    // (quantizing a tensor is itself parallel) while the session writes them.
    if session.is_some() {
        run_jobs();
    } else {
        pool.run(|_, _| run_jobs());
    }
    let embed = lock(&embed_slot).take().expect("the embedding job ran")?;
    let lm_head = lock(&head_slot).take().transpose()?;
    let layers = layer_slots
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every layer job ran")
        })
        .collect::<Result<Vec<Layer>>>()?;
    let pack_cache = match session {
        Some(s) => {
            let mut s = s.into_inner().unwrap_or_else(|e| e.into_inner());
            put_floats(&mut s, weights);
            Some(s.finish())
        }
        None => not_written,
    };
    Ok(Built {
        model: PackedModel {
            embed,
            lm_head,
            final_norm: weights.final_norm.clone(),
            layers,
        },
        n_params,
        pack_cache,
        calibration_s,
        pool: Some(pool),
    })
}

/// A layer of a model held in float32 (equalized), packed through the build's [`Packer`]
/// with the equalization's importance.
struct MemorySource<'a> {
    layer: &'a LayerWeights,
    importance: Option<&'a LayerImportance>,
    packer: &'a Packer<'a>,
}

impl LayerSource for MemorySource<'_> {
    fn layer_floats(&mut self, _i: usize) -> Result<LayerFloats> {
        Ok(LayerFloats::of(self.layer))
    }

    fn linear(&mut self, id: LinearId) -> Result<Box<dyn PackedLinear>> {
        let t = id
            .of(self.layer)
            .expect("build_layer asks for the linears the layer has");
        let imp = self.importance.and_then(|li| {
            let v: &[f32] = match id.role {
                TensorRole::AttnQ | TensorRole::AttnK | TensorRole::AttnV => &li.attn_in,
                TensorRole::AttnOutput => &li.o_in,
                TensorRole::FfnGate | TensorRole::FfnUp => &li.ffn_in,
                _ => li.down_in.get(id.mlp).map_or(&[][..], |v| &v[..]),
            };
            (!v.is_empty()).then_some(v)
        });
        self.packer
            .pack(&id.name(), t, (id.role, Some(id.layer), id.mlp), imp)
    }
}

/// Stores the float vectors a warm start needs (after equalization) in the session.
fn put_floats(s: &mut PackSession, w: &ModelWeights) {
    s.put_floats(names::FINAL_NORM, &w.final_norm);
    for (i, l) in w.layers.iter().enumerate() {
        put_layer_floats(s, i, l);
    }
}

/// Stores layer `i`'s float vectors in the session.
pub(crate) fn put_layer_floats(s: &mut PackSession, i: usize, l: &LayerWeights) {
    let n = |what: &str| names::layer(i, what);
    s.put_floats(&n("attn_norm"), &l.attn_norm);
    s.put_floats(&n("ffn_norm"), &l.ffn_norm);
    for (what, v) in [
        ("q_bias", &l.q_bias),
        ("k_bias", &l.k_bias),
        ("v_bias", &l.v_bias),
        ("q_norm", &l.q_norm),
        ("k_norm", &l.k_norm),
    ] {
        if let Some(v) = v {
            s.put_floats(&n(what), v);
        }
    }
    if let FeedForward::Moe(m) = &l.ffn {
        s.put_floats(&n("router"), &m.router.data);
        if let Some(g) = &m.shared_expert_gate {
            s.put_floats(&n("shared_gate"), &g.data);
        }
    }
}

pub(crate) fn count_params(w: &ModelWeights) -> u64 {
    let mut n = (w.embed.data.len() + w.final_norm.len()) as u64;
    n += w.lm_head.as_ref().map(|t| t.data.len()).unwrap_or(0) as u64;
    n + w.layers.iter().map(layer_params).sum::<u64>()
}

/// Parameters of one layer: matrices, norms, biases, routers.
pub(crate) fn layer_params(l: &LayerWeights) -> u64 {
    fn mlp(m: &Mlp) -> usize {
        m.gate.data.len() + m.up.data.len() + m.down.data.len()
    }
    let opt = |v: &Option<Vec<f32>>| v.as_ref().map(|x| x.len()).unwrap_or(0);
    let mut n = l.attn_norm.len() + l.ffn_norm.len();
    n += l.q.data.len() + l.k.data.len() + l.v.data.len() + l.o.data.len();
    n += opt(&l.q_bias) + opt(&l.k_bias) + opt(&l.v_bias) + opt(&l.q_norm) + opt(&l.k_norm);
    n += match &l.ffn {
        FeedForward::Dense(m) => mlp(m),
        FeedForward::Moe(m) => {
            m.router.data.len()
                + m.experts.iter().map(mlp).sum::<usize>()
                + m.shared_expert.as_ref().map(mlp).unwrap_or(0)
                + m.shared_expert_gate
                    .as_ref()
                    .map(|t| t.data.len())
                    .unwrap_or(0)
        }
    };
    n as u64
}

//! The one packing pipeline for a float32 model, whichever its source ([`FloatModel`]:
//! held in memory, `build`, or streamed from its files, `stream`): [`pack_model`] counts
//! its parameters, looks it up in the pack cache, has the source equalize and plan it
//! ([`FloatModel::equalize_and_plan`]), packs it through one [`Packer`] with the one outer
//! build (`source::assemble`, which the pack cache's warm start shares) and stores its
//! float vectors for a warm start.

use super::cache::{self, PackOutcome, PackSession};
use super::calibrate::{GptqKey, Reference};
use super::model::{names, Built, PackedFfn, PackedModel};
use super::source::{assemble, ModelParts, Packer};
use crate::error::Result;
use crate::format::quantized::{Grid, QuantizedTensor};
use crate::format::{Precision, TensorPlace, TensorRole};
use crate::model::ModelConfig;
use crate::threads::ThreadPool;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

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

/// Where each tensor sits (role, layer), for the mix rule and the pack cache's keys.
pub(crate) type Place<'a> = &'a (dyn Fn(TensorRole, Option<usize>) -> TensorPlace + Sync);

/// What "equalize and plan" is given.
pub(crate) struct PlanInput<'a> {
    pub config: &'a ModelConfig,
    pub options: &'a PackOptions<'a>,
    pub place: Place<'a>,
}

/// What "equalize and plan" leaves for packing.
#[derive(Default)]
pub(crate) struct Plan {
    /// The grid of each (role, layer) the plan chose (the rest follow the format's rule).
    pub grids: HashMap<(TensorRole, Option<usize>), Grid>,
    /// Tensors a GPTQ pass already rounded.
    pub gptq_done: HashMap<GptqKey, QuantizedTensor>,
    /// Seconds spent on calibration.
    pub calibration_s: f64,
}

/// A model in float32 the pipeline packs (held in memory or streamed from its files).
pub(crate) trait FloatModel {
    /// Its parameters (the mix rule and the pack cache's keys depend on the model size).
    fn n_params(&mut self) -> Result<u64>;
    /// Equalizes the model for a quantized format (the source keeps the equalized
    /// weights, or what it needs to redo them) and plans its grids.
    fn equalize_and_plan(&mut self, input: &PlanInput<'_>) -> Result<Plan>;
    /// The (equalized) model's parts, each packed through `packer`.
    fn parts<'a>(&'a self, packer: &'a Packer<'a>) -> Box<dyn ModelParts + 'a>;
    /// Whether its tensors may be packed on several threads at once (a streamed source
    /// packs one at a time to bound its memory).
    fn parallel(&self) -> bool;
}

/// Packs `model` (named `source` for the pack cache and in errors) as `options` say; from
/// the pack cache when it holds this model and recipe.
pub(crate) fn pack_model(
    model: &mut dyn FloatModel,
    config: &ModelConfig,
    source: &Path,
    options: &PackOptions<'_>,
) -> Result<Built> {
    let precision = options.precision;
    let n_layers = config.n_layers;
    let n_params = model.n_params()?;
    let place = |role, layer| TensorPlace {
        role,
        layer,
        n_layers,
        model_params: n_params,
        model_width: config.hidden_size,
    };
    // Quantized weights go through the pack cache when a folder is given: mapped from a
    // valid file for this model and recipe (the weights are then not used), else
    // quantized, reusing the tensors of an older file whose key is unchanged, and written.
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
    let plan = if quantized {
        let input = PlanInput {
            config,
            options,
            place: &place,
        };
        model.equalize_and_plan(&input)?
    } else {
        Plan::default()
    };
    let grids = &plan.grids;
    let grid = |role, layer| grids.get(&(role, layer)).copied();
    let gptq_done = Mutex::new(plan.gptq_done);
    let packer = Packer {
        precision: &precision,
        place: &place,
        grid: &grid,
        session: session.as_ref(),
        gptq_done: Some(&gptq_done),
    };
    let pool = model.parallel().then(|| ThreadPool::new(options.threads));
    // With a session, tensors are quantized one after the other on this thread
    // (quantizing a tensor is itself parallel) while the session writes them.
    let packed = {
        let parts = model.parts(&packer);
        let on = pool.as_ref().filter(|_| session.is_none());
        assemble(parts.as_ref(), config, on)?
    };
    let pack_cache = match session {
        Some(s) => {
            let mut s = s.into_inner().unwrap_or_else(|e| e.into_inner());
            put_floats(&mut s, &packed);
            Some(s.finish())
        }
        None => not_written,
    };
    Ok(Built {
        model: packed,
        n_params,
        pack_cache,
        calibration_s: plan.calibration_s,
        pool,
    })
}

/// Stores the float vectors a warm start needs (as packed: after equalization) in the
/// session.
fn put_floats(s: &mut PackSession, m: &PackedModel) {
    s.put_floats(names::FINAL_NORM, &m.final_norm);
    for (i, l) in m.layers.iter().enumerate() {
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
        if let Some(p) = &l.post_norms {
            s.put_floats(&n(names::POST_ATTN_NORM), &p.attn);
            s.put_floats(&n(names::POST_FFN_NORM), &p.ffn);
        }
        if let PackedFfn::Moe(m) = &l.ffn {
            s.put_floats(&n("router"), &m.router.data);
            if let Some(g) = &m.shared_gate {
                s.put_floats(&n("shared_gate"), g);
            }
        }
    }
}

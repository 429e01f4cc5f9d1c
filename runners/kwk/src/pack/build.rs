//! The in-memory source of the packing pipeline (`pipeline`): a model held in float32,
//! equalized as a whole (with calibration when the format asks for it), its low-bit mix
//! or `bpw:X` grids planned, GPTQ run when asked, then every tensor packed through the pipeline's
//! [`Packer`] and every layer put together by
//! [`build_layer`](super::source::build_layer) from the in-memory [`LayerSource`].
//! A streamed file (`stream`) and the pack cache (`cached`) are the other two sources.

use super::calibrate::{equalize_for, gptq_layers, GptqPass};
use super::model::{names, Built};
use super::pipeline::{pack_model, FloatModel, PackOptions, Plan, PlanInput};
use super::plan::GridPlanner;
use super::source::{embed_role, LayerFloats, LayerSource, LinearId, ModelParts, Packer};
use crate::error::{KwkError, Result};
use crate::format::quantized::{grid_for, Grid};
use crate::format::{PackedLinear, TensorRole};
use crate::model::{FeedForward, LayerWeights, Mlp, ModelConfig, ModelWeights, PostNorms};
use crate::quantize::equalize::{Equalized, LayerImportance};
use std::path::Path;
use std::time::Instant;

/// Packs `weights` (named `source` for the pack cache and in errors) as `options` say;
/// from the pack cache when it holds this model and recipe.
pub(crate) fn pack_weights(
    config: &ModelConfig,
    weights: &ModelWeights,
    source: &Path,
    options: &PackOptions<'_>,
) -> Result<Built> {
    let mut model = MemoryModel {
        weights,
        equalized: None,
    };
    pack_model(&mut model, config, source, options)
}

/// A model held in float32, and once equalized, its equalized copy.
struct MemoryModel<'a> {
    weights: &'a ModelWeights,
    equalized: Option<Equalized>,
}

impl FloatModel for MemoryModel<'_> {
    fn n_params(&mut self) -> Result<u64> {
        Ok(count_params(self.weights))
    }

    fn equalize_and_plan(&mut self, input: &PlanInput<'_>) -> Result<Plan> {
        let PlanInput {
            config,
            options,
            place,
        } = *input;
        let precision = options.precision;
        let calibration = options.calibration_tokens;
        let t0 = Instant::now();
        let (eq, mut kept_grams) = equalize_for(
            config,
            self.weights,
            &precision,
            calibration,
            options.threads,
            place,
            options.reference,
        )?;
        let mut calibration_s = 0f64;
        if precision.needs_calibration() {
            calibration_s += t0.elapsed().as_secs_f64();
        }
        let eq = self.equalized.insert(eq);
        let weights = &eq.weights;
        let grids = match GridPlanner::new(config, &precision, place)? {
            Some(mut planner) => {
                let (embed, head) = (&weights.embed, weights.lm_head.as_ref());
                planner.add_tables(embed, head, &weights.final_norm, &eq.head_importance);
                let none = LayerImportance::default();
                for (i, l) in weights.layers.iter().enumerate() {
                    planner.add_layer(i, l, eq.importance.get(i).unwrap_or(&none));
                }
                planner.finish()?
            }
            None => Default::default(),
        };
        // int4:gptq / int8:gptq: every layer's linears rounded with error compensation now,
        // in one layer-by-layer pass (the embedding and lm_head are rounded plainly).
        let gptq_done = if precision.gptq() {
            let t0 = Instant::now();
            let tokens = calibration.filter(|t| !t.is_empty()).ok_or_else(|| {
                KwkError::InvalidArgument(format!(
                    "{} needs calibration tokens (kwk-eval: --calib-text FILE)",
                    precision.name()
                ))
            })?;
            let grid_of = |role, layer: usize| -> Result<Grid> {
                match grids.get(&(role, Some(layer))) {
                    Some(g) => Ok(*g),
                    None => grid_for(&precision, &place(role, Some(layer)))?.ok_or_else(|| {
                        KwkError::InvalidArgument(format!(
                            "{role:?} weight of layer {layer} has no quantized grid"
                        ))
                    }),
                }
            };
            let kept = kept_grams.take().map(|k| (k, &eq.scales));
            let pass = GptqPass {
                config,
                weights,
                precision: &precision,
                calibration: tokens,
                threads: options.threads,
                place,
                reference: options.reference,
            };
            let done = gptq_layers(&pass, &grid_of, kept)?;
            calibration_s += t0.elapsed().as_secs_f64();
            done
        } else {
            Default::default()
        };
        Ok(Plan {
            grids,
            gptq_done,
            calibration_s,
        })
    }

    fn parts<'a>(&'a self, packer: &'a Packer<'a>) -> Box<dyn ModelParts + 'a> {
        let eq = self.equalized.as_ref();
        Box::new(MemoryParts {
            weights: eq.map_or(self.weights, |e| &e.weights),
            equalized: eq,
            packer,
        })
    }

    fn parallel(&self) -> bool {
        true
    }
}

/// The parts of a model held in float32 (equalized when quantized).
struct MemoryParts<'a> {
    weights: &'a ModelWeights,
    equalized: Option<&'a Equalized>,
    packer: &'a Packer<'a>,
}

impl ModelParts for MemoryParts<'_> {
    fn embed(&self) -> Result<Box<dyn PackedLinear>> {
        let w = self.weights;
        let role = embed_role(w.lm_head.is_some());
        self.packer
            .pack(names::EMBED, &w.embed, (role, None, 0), None)
    }

    fn lm_head(&self) -> Result<Option<Box<dyn PackedLinear>>> {
        // The untied lm_head's importance when its unit was equalized (int8:calib).
        let imp = self
            .equalized
            .map(|e| &e.head_importance[..])
            .filter(|v| !v.is_empty());
        let role = (TensorRole::LmHead, None, 0);
        self.weights
            .lm_head
            .as_ref()
            .map(|h| self.packer.pack(names::LM_HEAD, h, role, imp))
            .transpose()
    }

    fn final_norm(&self) -> Result<Vec<f32>> {
        Ok(self.weights.final_norm.clone())
    }

    fn layer(&self, i: usize) -> Box<dyn LayerSource + '_> {
        Box::new(MemorySource {
            layer: &self.weights.layers[i],
            post: self.weights.post_norms.get(i),
            importance: self.equalized.and_then(|e| e.importance.get(i)),
            packer: self.packer,
        })
    }
}

/// A layer of a model held in float32 (equalized), packed through the build's [`Packer`]
/// with the equalization's importance.
struct MemorySource<'a> {
    layer: &'a LayerWeights,
    /// Gemma 3's post norms of the layer.
    post: Option<&'a PostNorms>,
    importance: Option<&'a LayerImportance>,
    packer: &'a Packer<'a>,
}

impl LayerSource for MemorySource<'_> {
    fn layer_floats(&mut self, _i: usize) -> Result<LayerFloats> {
        Ok(LayerFloats::of(self.layer, self.post))
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

pub(crate) fn count_params(w: &ModelWeights) -> u64 {
    let mut n = (w.embed.data.len() + w.final_norm.len()) as u64;
    n += w.lm_head.as_ref().map(|t| t.data.len()).unwrap_or(0) as u64;
    n += post_norm_params(&w.post_norms);
    n + w.layers.iter().map(layer_params).sum::<u64>()
}

/// Parameters of Gemma 3's post norms (0 for the Llama family).
pub(crate) fn post_norm_params(post: &[PostNorms]) -> u64 {
    post.iter()
        .map(|p| (p.attn.len() + p.ffn.len()) as u64)
        .sum()
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

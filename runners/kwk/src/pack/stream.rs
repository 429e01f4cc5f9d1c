//! The streamed source of the packing pipeline (`pipeline`): a model read from its files
//! one layer at a time, without holding it in float32 (int8, int3..int6 and `bpw:X`
//! with weights-only equalization; the decoder's `from_header` picks it):
//! 1. count the parameters (the mix rule and the tensors' keys depend on the model size);
//! 2. equalize and plan: equalize each layer, keep its factors, importance and float
//!    vectors, and hand it to the grid planner (`plan::GridPlanner`, which keeps only its
//!    curves; `int3`..`int6` and `bpw:X` plan their grids);
//! 3. pack: load each matrix again, scale it with the kept factors (deterministic: the same
//!    weights), pack it through the streamed [`LayerSource`] (one matrix at a time for a
//!    dense layer), drop the float32 copy and release the source pages.
//!
//! The result is bit for bit what `build::pack_weights` packs from the whole model (a test
//! compares them).

use super::build::{layer_params, post_norm_params};
use super::model::{names, Built};
use super::pipeline::{pack_model, FloatModel, PackOptions, Plan, PlanInput};
use super::plan::GridPlanner;
use super::source::{embed_role, LayerFloats, LayerSource, LinearId, ModelParts, Packer};
use crate::error::{KwkError, Result};
use crate::format::{PackedLinear, TensorRole};
use crate::model::lazy::LazyWeights;
use crate::model::{FeedForward, LayerWeights, Mlp, ModelConfig, PostNorms, Tensor};
use crate::quantize::equalize::{
    apply_layer, apply_to_part, equalize_layer, estimate_layer, DensePart, EqualizeOptions,
    LayerImportance, LayerScales,
};
use std::path::Path;

/// Packs the model `lazy` reads (named `source` for the pack cache and in errors) as
/// `options` say, one layer at a time (see the module doc).
pub(crate) fn pack_streamed(
    config: &ModelConfig,
    lazy: &LazyWeights,
    source: &Path,
    options: &PackOptions<'_>,
) -> Result<Built> {
    let mut model = StreamModel {
        config,
        lazy,
        source,
        saved: Vec::new(),
    };
    pack_model(&mut model, config, source, options)
}

/// A model streamed from its files, and what pass 2 kept of each layer.
struct StreamModel<'a> {
    config: &'a ModelConfig,
    lazy: &'a LazyWeights,
    source: &'a Path,
    saved: Vec<Saved>,
}

impl FloatModel for StreamModel<'_> {
    fn n_params(&mut self) -> Result<u64> {
        let (vocab, d) = (self.config.vocab_size, self.config.hidden_size);
        let mut n_params = (vocab * d + d) as u64;
        if !self.config.tie_word_embeddings {
            n_params += (vocab * d) as u64;
        }
        n_params += post_norm_params(&self.lazy.post_norms()?);
        for i in 0..self.config.n_layers {
            n_params += layer_params(&self.lazy.layer(i)?);
            self.lazy.release_pages();
        }
        Ok(n_params)
    }

    fn equalize_and_plan(&mut self, input: &PlanInput<'_>) -> Result<Plan> {
        let PlanInput {
            config,
            options,
            place,
        } = *input;
        let precision = options.precision;
        if precision.needs_calibration() {
            return Err(KwkError::Unsupported(format!(
                "{} needs calibration, which a streamed build does not run; load the whole \
                 model",
                precision.name()
            )));
        }
        let eq_opts = EqualizeOptions::estimated_for(&precision);
        let mut planner = GridPlanner::new(config, &precision, place)?;
        if let Some(p) = &mut planner {
            let (embed, head) = (self.lazy.embed()?, self.lazy.lm_head()?);
            p.add_tables(&embed, head.as_ref(), &self.lazy.final_norm()?, &[]);
            drop((embed, head));
            self.lazy.release_pages();
        }
        self.saved = Vec::with_capacity(config.n_layers);
        // Gemma 3's post norms (float32, left alone by equalization).
        let mut post = self.lazy.post_norms()?.into_iter();
        for i in 0..config.n_layers {
            let mut l = self.lazy.layer(i)?;
            let stats = estimate_layer(&l, config);
            let grid = |role| crate::format::quantized::grid_for(&precision, &place(role, Some(i)));
            let (scales, imp) = equalize_layer(&mut l, config, &stats, &grid, eq_opts)?;
            let imp = if eq_opts.importance {
                imp
            } else {
                LayerImportance::default()
            };
            if let Some(p) = &mut planner {
                p.add_layer(i, &l, &imp);
            }
            self.saved.push(Saved {
                scales,
                imp,
                floats: float_part(&l),
                post: post.next(),
            });
            drop(l);
            self.lazy.release_pages();
        }
        Ok(Plan {
            grids: planner
                .map(GridPlanner::finish)
                .transpose()?
                .unwrap_or_default(),
            ..Plan::default()
        })
    }

    fn parts<'a>(&'a self, packer: &'a Packer<'a>) -> Box<dyn ModelParts + 'a> {
        Box::new(StreamParts {
            model: self,
            packer,
        })
    }

    fn parallel(&self) -> bool {
        false
    }
}

/// The parts of a streamed model, each loaded when asked for and packed.
struct StreamParts<'a> {
    model: &'a StreamModel<'a>,
    packer: &'a Packer<'a>,
}

impl ModelParts for StreamParts<'_> {
    fn embed(&self) -> Result<Box<dyn PackedLinear>> {
        let lazy = self.model.lazy;
        let role = embed_role(!self.model.config.tie_word_embeddings);
        let packed = self
            .packer
            .pack(names::EMBED, &lazy.embed()?, (role, None, 0), None);
        lazy.release_pages();
        packed
    }

    fn lm_head(&self) -> Result<Option<Box<dyn PackedLinear>>> {
        let lazy = self.model.lazy;
        let role = (TensorRole::LmHead, None, 0);
        let packed = match lazy.lm_head()? {
            Some(h) => Some(self.packer.pack(names::LM_HEAD, &h, role, None)?),
            None => None,
        };
        lazy.release_pages();
        Ok(packed)
    }

    fn final_norm(&self) -> Result<Vec<f32>> {
        self.model.lazy.final_norm()
    }

    fn layer(&self, _i: usize) -> Box<dyn LayerSource + '_> {
        let m = self.model;
        Box::new(StreamSource {
            config: m.config,
            lazy: m.lazy,
            source: m.source,
            saved: &m.saved,
            packer: self.packer,
            moe_layer: None,
        })
    }
}

/// The layers of a streamed model, equalized as pass 2 found: a dense layer one matrix at
/// a time (load, scale, pack, drop), a mixture of experts whole (scaled as the search left
/// it).
struct StreamSource<'a> {
    config: &'a ModelConfig,
    lazy: &'a LazyWeights,
    source: &'a Path,
    saved: &'a [Saved],
    packer: &'a Packer<'a>,
    /// The mixture-of-experts layer being packed, loaded and scaled.
    moe_layer: Option<LayerWeights>,
}

impl LayerSource for StreamSource<'_> {
    fn layer_floats(&mut self, i: usize) -> Result<LayerFloats> {
        let (fl, post) = (&self.saved[i].floats, self.saved[i].post.as_ref());
        if let FeedForward::Dense(_) = &fl.ffn {
            return Ok(LayerFloats::of(fl, post));
        }
        // Mixture of experts: the whole layer, scaled as the search left it.
        let mut l = self.lazy.layer(i)?;
        apply_layer(&mut l, self.config, &self.saved[i].scales);
        if !matches!(l.ffn, FeedForward::Moe(_)) {
            return Err(KwkError::bad_model(
                self.source,
                format!("layer {i} changed its kind between passes"),
            ));
        }
        let floats = LayerFloats::of(&l, post);
        self.moe_layer = Some(l);
        Ok(floats)
    }

    fn linear(&mut self, id: LinearId) -> Result<Box<dyn PackedLinear>> {
        let i = id.layer;
        let imp = &self.saved[i].imp;
        let imp = match id.role {
            TensorRole::AttnQ | TensorRole::AttnK | TensorRole::AttnV => pick(&imp.attn_in),
            TensorRole::AttnOutput => pick(&imp.o_in),
            TensorRole::FfnGate | TensorRole::FfnUp => pick(&imp.ffn_in),
            _ => imp.down_in.get(id.mlp).and_then(|v| pick(v)),
        };
        let at = (id.role, Some(i), id.mlp);
        if let Some(l) = &self.moe_layer {
            let t = id
                .of(l)
                .expect("build_layer asks for the linears the layer has");
            return self.packer.pack(&id.name(), t, at, imp);
        }
        // One matrix at a time: load, scale, pack, drop.
        let part = match id.role {
            TensorRole::AttnQ => DensePart::Q,
            TensorRole::AttnK => DensePart::K,
            TensorRole::AttnV => DensePart::V,
            TensorRole::AttnOutput => DensePart::O,
            TensorRole::FfnGate => DensePart::Gate,
            TensorRole::FfnUp => DensePart::Up,
            _ => DensePart::Down,
        };
        let mut t = self.lazy.dense_part(i, part)?;
        apply_to_part(&mut t, part, self.config, &self.saved[i].scales);
        let packed = self.packer.pack(&id.name(), &t, at, imp);
        drop(t);
        self.lazy.release_pages();
        packed
    }

    fn layer_done(&mut self, _i: usize) -> Result<()> {
        if self.moe_layer.take().is_some() {
            self.lazy.release_pages();
        }
        Ok(())
    }
}

fn pick(v: &[f32]) -> Option<&[f32]> {
    (!v.is_empty()).then_some(v)
}

/// What pass 2 keeps of a layer for pass 3.
struct Saved {
    scales: LayerScales,
    imp: LayerImportance,
    /// The equalized float vectors (norms, biases, router), matrices empty.
    floats: LayerWeights,
    /// Gemma 3's post norms of the layer.
    post: Option<PostNorms>,
}

/// A layer's float vectors with empty matrices (what the cache file stores of it).
fn float_part(l: &LayerWeights) -> LayerWeights {
    let empty = || Tensor::new(vec![0, 1], Vec::new());
    let empty_mlp = || Mlp {
        gate: empty(),
        up: empty(),
        down: empty(),
    };
    LayerWeights {
        attn_norm: l.attn_norm.clone(),
        q: empty(),
        k: empty(),
        v: empty(),
        o: empty(),
        q_bias: l.q_bias.clone(),
        k_bias: l.k_bias.clone(),
        v_bias: l.v_bias.clone(),
        q_norm: l.q_norm.clone(),
        k_norm: l.k_norm.clone(),
        ffn_norm: l.ffn_norm.clone(),
        ffn: match &l.ffn {
            FeedForward::Dense(_) => FeedForward::Dense(empty_mlp()),
            FeedForward::Moe(m) => FeedForward::Moe(crate::model::MoeBlock {
                router: m.router.clone(),
                experts: Vec::new(),
                shared_expert: None,
                shared_expert_gate: m.shared_expert_gate.clone(),
            }),
        },
    }
}

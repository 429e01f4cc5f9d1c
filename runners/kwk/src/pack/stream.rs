//! The packing pipeline for a model streamed from its files, one layer at a time, without
//! holding it in float32 (int8 and int4 with weights-only equalization; the decoder's
//! `from_header` picks it):
//! 1. count the parameters (the mix rule and the tensors' keys depend on the model size);
//! 2. int4 only: equalize each layer and keep only its mix curves (`quantize::mix`), then
//!    allocate the grids over the whole model;
//! 3. equalize each layer again (deterministic: the same factors), pack it through the
//!    streamed [`LayerSource`] (one matrix at a time for a dense layer), store its float
//!    vectors in the pack cache, drop the float32 copy and release the source pages.
//!
//! The result is bit for bit what `build::pack_weights` packs from the whole model (a test
//! compares them).

use super::build::{layer_params, put_layer_floats, PackOptions};
use super::cache::{PackOutcome, PackSession};
use super::model::{names, Built, PackedModel};
use super::plan::layer_mix_units;
use super::source::{build_layer, LayerFloats, LayerSource, LinearId, Packer};
use crate::error::{KwkError, Result};
use crate::format::quantized::{grid_for, Grid};
use crate::format::{PackedLinear, Precision, TensorPlace, TensorRole};
use crate::model::lazy::LazyWeights;
use crate::model::{FeedForward, LayerWeights, Mlp, ModelConfig, Tensor};
use crate::quantize::equalize::{
    apply_layer, apply_to_part, equalize_layer, estimate_layer, DensePart, EqualizeOptions,
    LayerImportance, LayerScales,
};
use crate::quantize::mix::{allocate_curves, unit_curve, Curve, MixUnit};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

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

/// Packs the model `lazy` reads (named `source` for the pack cache and in errors) as
/// `options` say, one layer at a time (see the module doc).
pub(crate) fn pack_streamed(
    config: &ModelConfig,
    lazy: &LazyWeights,
    source: &Path,
    options: &PackOptions<'_>,
) -> Result<Built> {
    let precision = options.precision;
    let n_layers = config.n_layers;
    let (vocab, d) = (config.vocab_size, config.hidden_size);
    let bad = |why: String| KwkError::bad_model(source, why);

    // Pass 1: parameters.
    let mut n_params = (vocab * d + d) as u64;
    if !config.tie_word_embeddings {
        n_params += (vocab * d) as u64;
    }
    for i in 0..n_layers {
        n_params += layer_params(&lazy.layer(i)?);
        lazy.release_pages();
    }
    let place = |role, layer| TensorPlace {
        role,
        layer,
        n_layers,
        model_params: n_params,
    };
    let grid_of = |i: usize| {
        move |role| crate::format::quantized::grid_for(&precision, &place(role, Some(i)))
    };
    let eq_opts = EqualizeOptions::ESTIMATED;
    let equalize_one = |l: &mut LayerWeights, i: usize| -> Result<Saved> {
        let stats = estimate_layer(l, config);
        let (scales, imp) = equalize_layer(l, config, &stats, &grid_of(i), eq_opts)?;
        let imp = if eq_opts.importance {
            imp
        } else {
            LayerImportance::default()
        };
        Ok(Saved {
            scales,
            imp,
            floats: float_part(l),
        })
    };

    // Pass 2: equalize each layer (the factors, importance and float vectors are kept;
    // they are small), and for int4 its mix curves; then the int4 grids.
    let mut saved: Vec<Saved> = Vec::with_capacity(n_layers);
    let mut plan: HashMap<(TensorRole, Option<usize>), Grid> = HashMap::new();
    let int4 = match &precision {
        Precision::LowBit(opts) => Some(*opts),
        _ => None,
    };
    {
        use crate::quantize::mix::{k_quant_bits_per_weight, ladder};
        let q4km = |bits, role, layer, t: &Tensor| {
            t.data.len() as f64 * k_quant_bits_per_weight(bits, role, layer, n_layers, t.cols())
        };
        let mut steps = Vec::new();
        let mut budget = 0.0;
        let mut keys: Vec<(TensorRole, Option<usize>)> = Vec::new();
        let mut curves: Vec<Curve> = Vec::new();
        if let Some(opts) = &int4 {
            let head_grid = grid_for(&precision, &place(TensorRole::LmHead, None))?
                .ok_or_else(|| KwkError::InvalidArgument("lm_head has no int4 grid".into()))?;
            let mix_bits = opts.mix_bits_for(place(TensorRole::LmHead, None).model_params);
            steps = ladder(opts.bits, opts.group_size, mix_bits);
            // Q4_K_M's bits of the output projection, from its shape alone.
            let out_bits = (vocab * d) as f64
                * k_quant_bits_per_weight(opts.bits, TensorRole::LmHead, None, n_layers, d);
            budget = out_bits - head_grid.tensor_bits(vocab, d);
            if !config.tie_word_embeddings {
                let e = lazy.embed()?;
                budget += q4km(opts.bits, TensorRole::Embedding, None, &e);
                let ones = vec![1f32; e.cols()];
                let unit = MixUnit {
                    role: TensorRole::Embedding,
                    layer: None,
                    tensors: vec![(&e, &ones[..], None)],
                };
                curves.push(unit_curve(&unit, &steps));
                keys.push((TensorRole::Embedding, None));
                lazy.release_pages();
            }
        }
        for i in 0..n_layers {
            let mut l = lazy.layer(i)?;
            let sv = equalize_one(&mut l, i)?;
            if let Some(opts) = &int4 {
                let ones = vec![1f32; layer_width(&l)];
                let li = Some(&sv.imp).filter(|x| !x.attn_in.is_empty());
                for u in layer_mix_units(i, &l, li, &ones) {
                    for (t, _, _) in &u.tensors {
                        budget += q4km(opts.bits, u.role, Some(i), t);
                    }
                    curves.push(unit_curve(&u, &steps));
                    keys.push((u.role, u.layer));
                }
            }
            saved.push(sv);
            drop(l);
            lazy.release_pages();
        }
        if int4.is_some() {
            plan = keys
                .into_iter()
                .zip(allocate_curves(&curves, &steps, budget))
                .collect();
        }
    }
    let grid = |role, layer| plan.get(&(role, layer)).copied();

    // Pass 3: pack, through the pack cache when a folder is given.
    let mut session = None;
    let mut not_written = None;
    if let Some(dir) = options.pack_cache_dir {
        match PackSession::open(dir, source, &precision, None) {
            Ok(mut s) => {
                if let Some(cached) = s.take_hit() {
                    return super::cached::from_cache(config, cached, source);
                }
                session = Some(Mutex::new(s));
            }
            Err(e) => not_written = Some(PackOutcome::NotWritten(e.to_string())),
        }
    }
    let packer = Packer {
        precision: &precision,
        place: &place,
        grid: &grid,
        session: session.as_ref(),
        gptq_done: None,
    };
    let tied = config.tie_word_embeddings;
    let embed_role = if tied {
        TensorRole::LmHead
    } else {
        TensorRole::Embedding
    };
    let embed = {
        let e = lazy.embed()?;
        packer.pack(names::EMBED, &e, (embed_role, None, 0), None)?
    };
    lazy.release_pages();
    let lm_head = match lazy.lm_head()? {
        Some(h) => Some(packer.pack(names::LM_HEAD, &h, (TensorRole::LmHead, None, 0), None)?),
        None => None,
    };
    lazy.release_pages();
    let final_norm = lazy.final_norm()?;
    let mut src = StreamSource {
        config,
        lazy,
        source,
        saved: &saved,
        packer: &packer,
        moe_layer: None,
    };
    let mut layers = Vec::with_capacity(n_layers);
    for i in 0..saved.len() {
        layers.push(build_layer(&mut src, config, i)?);
    }
    if layers.len() != n_layers {
        return Err(bad(format!("{} layers packed of {n_layers}", layers.len())));
    }
    let pack_cache = match session {
        Some(s) => {
            let mut s = s.into_inner().unwrap_or_else(|e| e.into_inner());
            s.put_floats(names::FINAL_NORM, &final_norm);
            for (i, sv) in saved.iter().enumerate() {
                put_layer_floats(&mut s, i, &sv.floats);
            }
            Some(s.finish())
        }
        None => not_written,
    };
    Ok(Built {
        model: PackedModel {
            embed,
            lm_head,
            final_norm,
            layers,
        },
        n_params,
        pack_cache,
        calibration_s: 0.0,
        pool: None,
    })
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
        let fl = &self.saved[i].floats;
        if let FeedForward::Dense(_) = &fl.ffn {
            return Ok(LayerFloats::of(fl));
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
        let floats = LayerFloats::of(&l);
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

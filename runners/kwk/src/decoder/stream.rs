//! Building a decoder from a model's files without holding the model in float32: a warm
//! start maps the pack cache; int8 and int4 (weights-only equalization) stream the source
//! one layer at a time ([`KwkDecoder::from_header`]).
//!
//! Streaming makes passes over the mapped source, each layer loaded, used and dropped:
//! 1. count the parameters (the mix rule and the tensors' keys depend on the model size);
//! 2. int4 only: equalize each layer and keep only its mix curves (`quantize::mix`), then
//!    allocate the grids over the whole model;
//! 3. equalize each layer again (deterministic: the same factors), pack it, store its float
//!    vectors in the pack cache, drop the float32 copy and release the source pages.
//!
//! The result is bit for bit what [`KwkDecoder::from_weights`] packs from the whole model
//! (a test compares them). Float formats and the calibrated formats (`int8:calib`,
//! `int8:gptq`, `int4:calib`, `int4:gptq`, which run a float32 decoder over the calibration
//! text) load the whole model.

use super::*;
use crate::model::lazy::LazyWeights;
use crate::model::{LayerWeights, ModelHeader, Tensor};
use crate::quantize::equalize::{
    apply_layer, equalize_layer, estimate_layer, EqualizeOptions, LayerScales,
};
use crate::quantize::mix::{allocate_curves, unit_curve, Curve};

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

impl KwkDecoder {
    /// The decoder for the model `header` describes in `options.precision`: from the pack
    /// cache when it holds a valid entry (the weights are not read), else streamed from
    /// the source one layer at a time (int8, int4 without calibration), else from the whole
    /// model in float32.
    pub fn from_header(header: &ModelHeader, options: DecoderOptions) -> Result<Self> {
        let eos = eos_ids(&header.config, &header.tokenizer);
        let source = header.info.resolved_path.clone();
        if let Some(d) =
            Self::from_pack_cache(&header.config, eos.clone(), &source, options.clone())?
        {
            return Ok(d);
        }
        let streams = !super::resident::holds_float32_masters(
            &options.precision,
            super::resident::Build::FromHeader,
        );
        let lazy = LazyWeights::open(header)?;
        if !streams {
            let weights = lazy.all()?;
            return Self::from_weights(&header.config, &weights, eos, &source, options);
        }
        Self::stream(&header.config, &lazy, eos, &source, options)
    }

    fn stream(
        config: &ModelConfig,
        lazy: &LazyWeights,
        eos: Vec<u32>,
        source: &Path,
        options: DecoderOptions,
    ) -> Result<Self> {
        if let Some(why) = config_unsupported(config, options.max_cache_len) {
            return Err(KwkError::Unsupported(why));
        }
        let started = Instant::now();
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
            Precision::Int4(opts) => Some(*opts),
            _ => None,
        };
        {
            use crate::quantize::mix::{ladder, q4_k_m_bits_per_weight};
            let q4km = |role, layer, t: &Tensor| {
                t.data.len() as f64 * q4_k_m_bits_per_weight(role, layer, n_layers, t.cols())
            };
            let mut steps = Vec::new();
            let mut budget = 0.0;
            let mut keys: Vec<(TensorRole, Option<usize>)> = Vec::new();
            let mut curves: Vec<Curve> = Vec::new();
            if let Some(opts) = &int4 {
                let head_grid = grid_for(&precision, &place(TensorRole::LmHead, None))?
                    .ok_or_else(|| KwkError::InvalidArgument("lm_head has no int4 grid".into()))?;
                let mix_bits = opts.mix_bits.unwrap_or_else(|| {
                    default_mix_bits(place(TensorRole::LmHead, None).model_params)
                });
                steps = ladder(opts.group_size, mix_bits);
                // Q4_K_M's bits of the output projection, from its shape alone.
                let out_bits = (vocab * d) as f64
                    * q4_k_m_bits_per_weight(TensorRole::LmHead, None, n_layers, d);
                budget = out_bits - head_grid.tensor_bits(vocab, d);
                if !config.tie_word_embeddings {
                    let e = lazy.embed()?;
                    budget += q4km(TensorRole::Embedding, None, &e);
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
                if int4.is_some() {
                    let ones = vec![1f32; layer_width(&l)];
                    let li = Some(&sv.imp).filter(|x| !x.attn_in.is_empty());
                    for u in layer_mix_units(i, &l, li, &ones) {
                        for (t, _, _) in &u.tensors {
                            budget += q4km(u.role, Some(i), t);
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
        if let Some(dir) = &options.pack_cache_dir {
            match PackSession::open(dir, source, &precision, None) {
                Ok(mut s) => {
                    if let Some(cached) = s.take_hit() {
                        return Self::from_cached(config, eos, cached, source, options, started);
                    }
                    session = Some(s);
                }
                Err(e) => not_written = Some(PackOutcome::NotWritten(e.to_string())),
            }
        }
        let mut pack = |name: &str,
                        t: &Tensor,
                        role,
                        layer,
                        imp: Option<&[f32]>|
         -> Result<Box<dyn PackedLinear>> {
            match session.as_mut() {
                Some(s) => s.pack(
                    name,
                    t,
                    place(role, layer),
                    grid(role, layer),
                    imp,
                    &precision,
                ),
                None => Ok(
                    quantize_on(t, &precision, place(role, layer), grid(role, layer), imp)?
                        .into_packed(),
                ),
            }
        };
        let tied = config.tie_word_embeddings;
        let embed_role = if tied {
            TensorRole::LmHead
        } else {
            TensorRole::Embedding
        };
        let embed = {
            let e = lazy.embed()?;
            pack(names::EMBED, &e, embed_role, None, None)?
        };
        lazy.release_pages();
        let lm_head = match lazy.lm_head()? {
            Some(h) => Some(pack(names::LM_HEAD, &h, TensorRole::LmHead, None, None)?),
            None => None,
        };
        lazy.release_pages();
        let final_norm = lazy.final_norm()?;
        let mut layers = Vec::with_capacity(n_layers);
        for (i, sv) in saved.iter().enumerate() {
            let imp = &sv.imp;
            let attn_in = pick(&imp.attn_in);
            let o_in = pick(&imp.o_in);
            let ffn_in = pick(&imp.ffn_in);
            let n = |w: &str| names::layer(i, w);
            let m = |j: usize, w: &str| names::mlp(i, j, w);
            let fl = &sv.floats;
            let layer = if let FeedForward::Dense(_) = &fl.ffn {
                // One matrix at a time: load, scale, pack, drop.
                use crate::quantize::equalize::{apply_to_part, DensePart as P};
                let mut one = |part: P, name: &str, role, imp: Option<&[f32]>| {
                    let mut t = lazy.dense_part(i, part)?;
                    apply_to_part(&mut t, part, config, &sv.scales);
                    let packed = pack(name, &t, role, Some(i), imp);
                    drop(t);
                    lazy.release_pages();
                    packed
                };
                let q = one(P::Q, &n("q"), TensorRole::AttnQ, attn_in)?;
                let k = one(P::K, &n("k"), TensorRole::AttnK, attn_in)?;
                let v = one(P::V, &n("v"), TensorRole::AttnV, attn_in)?;
                let o = one(P::O, &n("o"), TensorRole::AttnOutput, o_in)?;
                let down_in = imp.down_in.first().and_then(|v| pick(v));
                let gate = one(P::Gate, &m(0, "gate"), TensorRole::FfnGate, ffn_in)?;
                let up = one(P::Up, &m(0, "up"), TensorRole::FfnUp, ffn_in)?;
                let down = one(P::Down, &m(0, "down"), TensorRole::FfnDown, down_in)?;
                Layer {
                    attn_norm: fl.attn_norm.clone(),
                    q,
                    k,
                    v,
                    o,
                    q_bias: fl.q_bias.clone(),
                    k_bias: fl.k_bias.clone(),
                    v_bias: fl.v_bias.clone(),
                    q_norm: fl.q_norm.clone(),
                    k_norm: fl.k_norm.clone(),
                    ffn_norm: fl.ffn_norm.clone(),
                    ffn: PackedFfn::Dense(PackedMlp { gate, up, down }),
                }
            } else {
                // Mixture of experts: the whole layer, scaled as the search left it.
                let mut l = lazy.layer(i)?;
                apply_layer(&mut l, config, &sv.scales);
                let mut pack_mlp = |mm: &Mlp, j: usize| -> Result<PackedMlp> {
                    let down_in = imp.down_in.get(j).and_then(|v| pick(v));
                    Ok(PackedMlp {
                        gate: pack(
                            &m(j, "gate"),
                            &mm.gate,
                            TensorRole::FfnGate,
                            Some(i),
                            ffn_in,
                        )?,
                        up: pack(&m(j, "up"), &mm.up, TensorRole::FfnUp, Some(i), ffn_in)?,
                        down: pack(
                            &m(j, "down"),
                            &mm.down,
                            TensorRole::FfnDown,
                            Some(i),
                            down_in,
                        )?,
                    })
                };
                let FeedForward::Moe(mo) = &l.ffn else {
                    return Err(bad(format!("layer {i} changed its kind between passes")));
                };
                let ffn = PackedFfn::Moe(PackedMoe {
                    router: mo.router.clone(),
                    experts: mo
                        .experts
                        .iter()
                        .enumerate()
                        .map(|(j, e)| pack_mlp(e, j))
                        .collect::<Result<_>>()?,
                    shared: mo
                        .shared_expert
                        .as_ref()
                        .map(|s| pack_mlp(s, mo.experts.len()))
                        .transpose()?,
                    shared_gate: mo.shared_expert_gate.as_ref().map(|g| g.data.clone()),
                    top_k: config.experts_per_token,
                    renormalize: config.architecture == Architecture::Mixtral
                        || config.norm_topk_prob,
                });
                let layer = Layer {
                    attn_norm: l.attn_norm.clone(),
                    q: pack(&n("q"), &l.q, TensorRole::AttnQ, Some(i), attn_in)?,
                    k: pack(&n("k"), &l.k, TensorRole::AttnK, Some(i), attn_in)?,
                    v: pack(&n("v"), &l.v, TensorRole::AttnV, Some(i), attn_in)?,
                    o: pack(&n("o"), &l.o, TensorRole::AttnOutput, Some(i), o_in)?,
                    q_bias: l.q_bias.clone(),
                    k_bias: l.k_bias.clone(),
                    v_bias: l.v_bias.clone(),
                    q_norm: l.q_norm.clone(),
                    k_norm: l.k_norm.clone(),
                    ffn_norm: l.ffn_norm.clone(),
                    ffn,
                };
                drop(l);
                lazy.release_pages();
                layer
            };
            layers.push(layer);
        }
        if layers.len() != n_layers {
            return Err(bad(format!("{} layers packed of {n_layers}", layers.len())));
        }
        let pack_cache = match session {
            Some(mut s) => {
                s.put_floats(names::FINAL_NORM, &final_norm);
                for (i, sv) in saved.iter().enumerate() {
                    put_layer_floats(&mut s, i, &sv.floats);
                }
                Some(s.finish())
            }
            None => not_written,
        };
        Ok(Self::assemble(
            config,
            precision,
            eos,
            ThreadPool::new(options.threads),
            Parts {
                embed,
                lm_head,
                final_norm,
                layers,
            },
            n_params,
            started.elapsed().as_secs_f64(),
            pack_cache,
            &options,
        ))
    }
}

/// `v` unless empty (no importance).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{load_model, load_model_header};

    fn options(precision: Precision, cache: Option<&Path>) -> DecoderOptions {
        DecoderOptions {
            max_cache_len: 32,
            precision,
            threads: 2,
            calibration_tokens: None,
            pack_cache_dir: cache.map(Path::to_path_buf),
        }
    }

    /// Inf in `ffn_down` is refused while int8 and int4 stream-pack (their scales made
    /// finite codes of it), and when the whole model is read for float32.
    #[test]
    fn packing_refuses_inf_in_ffn_down() {
        let inf = [
            (3, f32::INFINITY),
            (40, f32::NEG_INFINITY),
            (41, f32::INFINITY),
        ];
        let (_d, path) = crate::model::gguf_loader::tests::gguf_with_values(
            "tiny-llama",
            &[("blk.1.ffn_down.weight", &inf)],
        );
        let header = load_model_header(path.to_str().unwrap()).unwrap();
        for precision in [
            Precision::INT8,
            Precision::parse("int4").unwrap(),
            Precision::parse("float32").unwrap(),
        ] {
            let msg = match KwkDecoder::from_header(&header, options(precision, None)) {
                Ok(_) => panic!("{precision:?}: packed a model with Inf weights"),
                Err(e) => e.to_string(),
            };
            assert!(
                msg.contains("tensor 'blk.1.ffn_down.weight' has 3 non-finite values (NaN/Inf)"),
                "{precision:?}: {msg}"
            );
        }
    }

    /// Streaming packs exactly what packing the whole model packs (logits, sizes, layouts),
    /// from a folder and from a GGUF file, dense and MoE; its cache file is the one
    /// `from_weights` reads, and a warm start from it gives the same logits.
    #[test]
    fn streaming_packs_what_the_whole_model_packs() {
        let tokens = [1u32, 50, 200, 7, 300, 42];
        let fixtures = kwk_fixtures::model_dir("tiny-llama");
        let sources = [
            fixtures.clone(),
            fixtures.join("model.gguf"),
            kwk_fixtures::model_dir("tiny-mixtral"),
            kwk_fixtures::model_dir("tiny-qwen2"),
        ];
        for src in sources {
            let spec = src.to_str().unwrap();
            let model = load_model(spec).unwrap();
            let header = load_model_header(spec).unwrap();
            for precision in [Precision::INT8, Precision::parse("int4").unwrap()] {
                let what = format!("{spec} {precision:?}");
                let mut whole = KwkDecoder::new(&model, options(precision, None)).unwrap();
                let mut streamed =
                    KwkDecoder::from_header(&header, options(precision, None)).unwrap();
                let a = whole.forward(&tokens, 0).unwrap();
                assert_eq!(a, streamed.forward(&tokens, 0).unwrap(), "{what}");
                assert_eq!(whole.weight_bytes(), streamed.weight_bytes(), "{what}");
                assert_eq!(whole.n_params(), streamed.n_params(), "{what}");
                assert_eq!(whole.type_mix(), streamed.type_mix(), "{what}");

                let cache = tempfile::tempdir().unwrap();
                let cold = KwkDecoder::from_header(&header, options(precision, Some(cache.path())))
                    .unwrap();
                assert!(
                    matches!(cold.pack_cache_outcome(), Some(PackOutcome::Written(_))),
                    "{what}: {:?}",
                    cold.pack_cache_outcome()
                );
                let mut warm =
                    KwkDecoder::from_header(&header, options(precision, Some(cache.path())))
                        .unwrap();
                assert!(
                    matches!(warm.pack_cache_outcome(), Some(PackOutcome::Loaded(_))),
                    "{what}"
                );
                assert_eq!(a, warm.forward(&tokens, 0).unwrap(), "{what}: warm");
                assert_eq!(whole.n_params(), warm.n_params(), "{what}: warm");
                let mut via_weights =
                    KwkDecoder::new(&model, options(precision, Some(cache.path()))).unwrap();
                assert!(
                    matches!(
                        via_weights.pack_cache_outcome(),
                        Some(PackOutcome::Loaded(_))
                    ),
                    "{what}"
                );
                assert_eq!(a, via_weights.forward(&tokens, 0).unwrap(), "{what}");
            }
        }
    }
}

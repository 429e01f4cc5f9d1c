//! The decoder's constructors: each checks that the model can run here, hands the packing
//! to the pipeline (`crate::pack`: the whole model in memory, a streamed file, or the pack
//! cache) and puts the runtime around the packed parts it returns.

use super::*;
use crate::model::lazy::LazyWeights;
use crate::model::ModelHeader;
use crate::pack::build::pack_weights;
use crate::pack::calibrate::CalibrationPass;
use crate::pack::model::Built;
use crate::pack::pipeline::PackOptions;

/// The float32 decoder calibration runs on (the pipeline's [`CalibrationPass`]): `weights`
/// with a KV cache of `window` tokens on `threads` threads.
fn reference(
    config: &ModelConfig,
    weights: &ModelWeights,
    window: usize,
    threads: usize,
) -> Result<Box<dyn CalibrationPass>> {
    let decoder = KwkDecoder::from_weights(
        config,
        weights,
        Vec::new(),
        Path::new("calibration"),
        DecoderOptions {
            max_cache_len: window,
            precision: Precision::Float32,
            kv: Default::default(),
            threads,
            calibration_tokens: None,
            pack_cache_dir: None,
        },
    )?;
    Ok(Box::new(decoder))
}

/// The pipeline's options for the decoder's.
fn pack_options(options: &DecoderOptions) -> PackOptions<'_> {
    PackOptions {
        precision: options.precision,
        threads: options.threads,
        calibration_tokens: options.calibration_tokens.as_deref(),
        pack_cache_dir: options.pack_cache_dir.as_deref(),
        reference: &reference,
    }
}

impl KwkDecoder {
    pub fn new(model: &Model, options: DecoderOptions) -> Result<Self> {
        let eos = eos_ids(&model.config, &model.tokenizer);
        Self::from_weights(
            &model.config,
            &model.weights,
            eos,
            &model.info.resolved_path,
            options,
        )
    }

    /// Builds a decoder from a config and weights without a [`Model`] (no tokenizer
    /// needed): `eos` are the ids that end generation, `source` names the weights in
    /// errors.
    pub fn from_weights(
        config: &ModelConfig,
        weights: &ModelWeights,
        eos: Vec<u32>,
        source: &Path,
        options: DecoderOptions,
    ) -> Result<Self> {
        if let Some(why) = config_unsupported(config, options.max_cache_len) {
            return Err(KwkError::Unsupported(why));
        }
        if let Some(why) = weights_mismatch(config, weights) {
            return Err(KwkError::bad_model(source, why));
        }
        let started = Instant::now();
        let built = pack_weights(config, weights, source, &pack_options(&options))?;
        Self::assemble(config, eos, built, started, &options)
    }

    /// A warm start: the decoder from the pack cache alone, without the model's weights
    /// (`config` and `eos` from the model's metadata); `Ok(None)` when the cache holds no
    /// valid entry for `source` in `options.precision` (then load the weights and call
    /// [`KwkDecoder::from_weights`], which packs and writes it). Always `Ok(None)` for
    /// Gemma 3: its post-attention and post-FFN norms are not in the pack cache, so its
    /// decoder is built from the weights (which read the cache themselves).
    pub fn from_pack_cache(
        config: &ModelConfig,
        eos: Vec<u32>,
        source: &Path,
        options: DecoderOptions,
    ) -> Result<Option<Self>> {
        if let Some(why) = config_unsupported(config, options.max_cache_len) {
            return Err(KwkError::Unsupported(why));
        }
        let started = Instant::now();
        let quantized = options.precision.is_quantized();
        let Some(dir) = options.pack_cache_dir.as_ref().filter(|_| quantized) else {
            return Ok(None);
        };
        let calibration = options.calibration_tokens.as_deref();
        match pack_cache::try_load(dir, source, &options.precision, calibration)? {
            Some(cached) => {
                let built = crate::pack::cached::from_cache(config, cached, source)?;
                Ok(Some(Self::assemble(config, eos, built, started, &options)?))
            }
            None => Ok(None),
        }
    }

    /// The decoder for the model `header` describes in `options.precision`: from the pack
    /// cache when it holds a valid entry (the weights are not read), else streamed from
    /// the source one layer at a time (int8, int3..int6 and bpw:X without calibration), else from the whole
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
        let config = &header.config;
        if let Some(why) = config_unsupported(config, options.max_cache_len) {
            return Err(KwkError::Unsupported(why));
        }
        let started = Instant::now();
        let built =
            crate::pack::stream::pack_streamed(config, &lazy, &source, &pack_options(&options))?;
        Self::assemble(config, eos, built, started, &options)
    }

    /// The decoder around the packed parts of a build started at `started` (and Gemma 3's
    /// RoPE tables and embedding scale).
    fn assemble(
        config: &ModelConfig,
        eos: Vec<u32>,
        built: Built,
        started: Instant,
        options: &DecoderOptions,
    ) -> Result<Self> {
        let Built {
            model,
            n_params,
            pack_cache,
            calibration_s,
            pool,
        } = built;
        let pool = pool.unwrap_or_else(|| ThreadPool::new(options.threads));
        let pack_s = started.elapsed().as_secs_f64();
        let PackedModel {
            embed,
            lm_head,
            final_norm,
            layers,
        } = model;
        let mut weight_bytes = embed.bytes() as u64
            + lm_head.as_ref().map(|h| h.bytes() as u64).unwrap_or(0)
            + 4 * final_norm.len() as u64;
        for l in &layers {
            weight_bytes += l.bytes();
        }
        // Every source gives a Gemma 3 layer its post norms (a cache entry without them is
        // refused); a packed model without them is a build error, not a silent Llama layer.
        if let Some(i) = layers
            .iter()
            .position(|l| l.post_norms.is_some() != config.gemma3.is_some())
        {
            return Err(KwkError::Unsupported(format!(
                "layer {i}: the packed model's post norms do not match the architecture \
                 ({}); this is a bug in the build",
                config.architecture.hf_model_type()
            )));
        }
        let gemma = GemmaParts::new(config, options.max_cache_len);
        let rope = rope::Rope::new(
            config.head_dim,
            config.rope_theta as f64,
            &config.rope_scaling,
            options.max_cache_len,
        );
        // Gemma 3's local layers keep a ring of the window plus one micro-batch less one.
        let lengths = kv_precision::cache_lengths(config, options.max_cache_len);
        let kv = KvCache::new(config.n_kv_heads, config.head_dim, &lengths, options.kv);
        Ok(KwkDecoder {
            config: config.clone(),
            precision: options.precision,
            max_cache_len: options.max_cache_len,
            pool,
            embed,
            lm_head,
            final_norm,
            layers,
            rope,
            kv,
            kv_precision: options.kv,
            pos: 0,
            eos,
            weight_bytes,
            n_params,
            pack_s,
            calibration_s,
            pack_cache,
            x_buf: Vec::new(),
            scratch: Scratch::default(),
            gemma,
        })
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
            kv: Default::default(),
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
    /// from a folder and from a GGUF file, dense and MoE, int8, int3/int4/int5 and `bpw` (one
    /// budget above 4 bits per weight, one below); its cache file
    /// is the one `from_weights` reads, and a warm start from it gives the same logits.
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
            for precision in [
                Precision::INT8,
                Precision::parse("int4").unwrap(),
                Precision::parse("int3").unwrap(),
                Precision::parse("int5").unwrap(),
                Precision::parse("bpw:5.5").unwrap(),
                Precision::parse("bpw:4.25").unwrap(),
            ] {
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

//! The in-tree decoder as a [`super::Runner`], one runner per format.
//!
//! All runners of a run share one model header (config and tokenizer, no weights); each
//! builds its decoder with [`KwkDecoder::from_header`] when it is built: a valid pack-cache
//! entry is mapped (the weights are not read), int8 and int4 without calibration are
//! streamed from the source one tensor at a time, and only float32, bf16 and calibrated
//! int4 (whose statistics and GPTQ passes run a float32 decoder) read the whole model as
//! float32 masters, dropped once the row's decoder is built. So an int4-only run never
//! holds the model in float32. The harness builds one runner at a time and drops it before
//! the next when only perplexity is measured; with speed, it keeps every runner until the
//! interleaved speed rounds are done. Load time is this row's header read plus its build
//! (reading, packing). Perplexity runs [`crate::eval::perplexity::score_chunks`] over the
//! decoder's forward pass; the float32 reference runner also writes the KL-divergence base
//! file, and the others compare against it when the protocol names one. Speed runs one
//! [`crate::eval::speed::SpeedSession`] repetition per call.

use super::Runner;
use crate::eval::base_file::{LogitsBaseWriter, ReferencePerplexity};
use crate::eval::perplexity::{score_chunks, ChunkLogits};
use crate::eval::reference::ReferenceComparer;
use crate::eval::speed::{SpeedSession, SpeedTarget};
use crate::protocol::{
    ComputeKind, Engine, PerplexityProtocol, PerplexityResult, Progress, ReferenceStamp,
    RooflineCost, RunnerInfo, SpeedRep, SpeedSpec, TokenStream,
};
use anyhow::{anyhow, bail, Context, Result};
use kwk::model::ModelHeader;
use kwk::{DecoderOptions, KwkDecoder, Precision};
use std::path::PathBuf;
use std::rc::Rc;

/// How a kwk runner is built (the same for every format of a run).
#[derive(Debug, Clone)]
pub struct KwkRunnerOptions {
    pub threads: usize,
    /// The KV cache's precision.
    pub kv: kwk::KvPrecision,
    /// Longest sequence the KV cache must hold: `max(ctx, pp + tg)`.
    pub max_cache_len: usize,
    /// Calibration token ids for `int8:calib` / `int8:gptq` / `int4:calib` / `int4:gptq`.
    pub calibration_tokens: Option<Vec<u32>>,
    pub pack_cache_dir: Option<PathBuf>,
}

/// Whether this runner is the reference whose log-probs other runners are compared with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReferenceRole {
    /// An ordinary runner (compares against `protocol.reference_logits` when set).
    Compared,
    /// The reference: writes its scored log-probs to a KL-divergence base file.
    Writes(ReferenceTarget),
}

/// Where the reference runner writes its log-probs: into `partial` (reserved by the run),
/// renamed to `path` once complete, its trailer stamped with `stamp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferenceTarget {
    pub partial: PathBuf,
    pub path: PathBuf,
    pub stamp: ReferenceStamp,
}

pub struct KwkRunner {
    model: Rc<ModelHeader>,
    decoder: KwkDecoder,
    info: RunnerInfo,
    role: ReferenceRole,
    speed: SpeedSession,
}

impl KwkRunner {
    /// Builds `model` in `precision` (from the pack cache, streamed, or from float32
    /// masters read for this build only). `name` is the format as the user typed it.
    pub fn new(
        model: Rc<ModelHeader>,
        name: &str,
        precision: Precision,
        options: &KwkRunnerOptions,
        role: ReferenceRole,
    ) -> Result<Self> {
        if let Some(why) = kwk::decoder::config_unsupported(&model.config, options.max_cache_len) {
            bail!(
                "the in-tree decoder cannot run '{}' as {name}: {why}",
                model.info.requested
            );
        }
        kwk::decoder::decoder_available()
            .map_err(|why| anyhow!("the in-tree decoder cannot run on this CPU: {why}"))?;
        let started = std::time::Instant::now();
        let decoder = KwkDecoder::from_header(
            &model,
            DecoderOptions {
                max_cache_len: options.max_cache_len,
                precision,
                kv: options.kv,
                threads: options.threads,
                calibration_tokens: options.calibration_tokens.clone(),
                pack_cache_dir: options.pack_cache_dir.clone(),
            },
        )
        .with_context(|| format!("packing '{}' as {name}", model.info.requested))?;
        // Reading the header, plus the build's time outside packing (the whole model read
        // for float formats and calibrated int4); int8/int4 streaming read while packing.
        let pack_s = decoder.pack_s();
        let read_s = model.info.read_s + (started.elapsed().as_secs_f64() - pack_s).max(0.0);
        let cfg = &model.config;
        let info = RunnerInfo {
            name: name.to_string(),
            engine: Engine::Kwk,
            kv_bytes_per_token: Some(decoder.kv_bytes_per_token()),
            tensor_bytes: decoder.weight_bytes(),
            file_bytes: None,
            bits_per_weight: decoder.bits_per_weight(),
            params: decoder.n_params(),
            type_mix: decoder.type_mix(),
            load_s: Some(read_s + pack_s),
            load_read_s: Some(read_s),
            load_pack_s: Some(pack_s),
            calibration_s: precision
                .needs_calibration()
                .then(|| decoder.calibration_s()),
            kv_type: decoder.kv_cache_type().into(),
            kernels: Some(precision.kernels().to_string()),
            engine_flags: None,
            roofline: Some(RooflineCost {
                compute: match precision.arithmetic() {
                    kwk::kernels::Arithmetic::Fp32 => ComputeKind::Fp32,
                    kwk::kernels::Arithmetic::Bf16 => ComputeKind::Bf16,
                    kwk::kernels::Arithmetic::Int8 => ComputeKind::Int8,
                },
                weight_bytes_per_token: decoder.weight_bytes_read_per_token(),
                // Bytes per cached value, scales and padding included.
                kv_bytes_per_value: decoder.kv_bytes_per_token() as f64
                    / (2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim).max(1) as f64,
                best_kernels: false,
            }),
        };
        Ok(KwkRunner {
            model,
            decoder,
            info,
            role,
            speed: SpeedSession::default(),
        })
    }
}

impl KwkRunner {
    /// What the pack cache did when this runner was built (`None` without a cache).
    pub fn pack_cache_outcome(&self) -> Option<&kwk::pack_cache::PackOutcome> {
        self.decoder.pack_cache_outcome()
    }
}

/// The decoder as a speed-test target.
struct DecoderTarget<'a>(&'a mut KwkDecoder);

impl SpeedTarget for DecoderTarget<'_> {
    fn reset(&mut self) {
        self.0.reset();
    }
    fn forward(&mut self, tokens: &[u32], logits_from: usize) -> Result<()> {
        self.0.forward(tokens, logits_from)?;
        Ok(())
    }
    fn set_threads(&mut self, threads: usize) -> Result<()> {
        self.0.set_threads(threads);
        Ok(())
    }
}

impl Runner for KwkRunner {
    fn info(&self) -> &RunnerInfo {
        &self.info
    }

    fn perplexity(
        &mut self,
        protocol: &PerplexityProtocol,
        tokens: &TokenStream,
        progress: &dyn Progress,
    ) -> Result<PerplexityResult> {
        let plan = protocol.plan;
        plan.check_covers(tokens.tokens.len())
            .map_err(|e| anyhow!("{e}"))?;
        let bos = tokens.chunk_bos();
        let n_vocab = self.model.config.vocab_size;

        enum Sink {
            None,
            Write(LogitsBaseWriter),
            Compare(ReferenceComparer),
        }
        let mut sink = match (&self.role, &protocol.reference_logits) {
            (ReferenceRole::Writes(t), _) => Sink::Write(LogitsBaseWriter::create(
                &t.partial,
                &t.path,
                &plan,
                n_vocab,
                &tokens.tokens,
            )?),
            (ReferenceRole::Compared, Some(path)) => Sink::Compare(ReferenceComparer::open(
                path,
                &plan,
                n_vocab,
                &tokens.tokens,
            )?),
            (ReferenceRole::Compared, None) => Sink::None,
        };
        let decoder = &mut self.decoder;
        let mut logits_of = |window: &[u32], first: usize| -> Result<Vec<f32>> {
            decoder.reset();
            Ok(decoder.forward(window, first)?)
        };
        let mut observe = |c: &ChunkLogits| -> Result<()> {
            match &mut sink {
                Sink::None => Ok(()),
                Sink::Write(w) => w.write_chunk(c),
                Sink::Compare(r) => r.compare_chunk(c),
            }
        };
        let score = score_chunks(
            &tokens.tokens,
            &plan,
            bos,
            &mut logits_of,
            &mut observe,
            progress,
        )?;
        self.decoder.reset();
        let (reference, scores) = match sink {
            Sink::None => (None, None),
            Sink::Write(w) => {
                let ReferenceRole::Writes(t) = &self.role else {
                    bail!("a base file writer without the reference role");
                };
                let ppl = ReferencePerplexity {
                    ppl: score.ppl,
                    ppl_err: score.ppl_err,
                    running: score.running.clone(),
                    scored_tokens: score.scored_tokens,
                };
                (None, Some(w.finish(&t.stamp, &ppl)?))
            }
            Sink::Compare(r) => {
                let (c, s) = r.finish()?;
                (Some(c), Some(s))
            }
        };
        Ok(PerplexityResult {
            ppl: score.ppl,
            ppl_err: score.ppl_err,
            running: score.running,
            scored_tokens: score.scored_tokens,
            tokens_match: None,
            reference,
            tokens: scores,
            peak_rss_bytes: None,
        })
    }

    fn speed_rep(&mut self, spec: &SpeedSpec) -> Result<Option<SpeedRep>> {
        let tokenizer = &self.model.tokenizer;
        let bos = if tokenizer.add_bos() {
            Some(
                tokenizer
                    .bos_id()
                    .context("the tokenizer adds a BOS but names no BOS id")?,
            )
        } else {
            None
        };
        let n_vocab = self.model.config.vocab_size;
        let target = &mut DecoderTarget(&mut self.decoder);
        self.speed.rep(target, spec, n_vocab, bos).map(Some)
    }
}

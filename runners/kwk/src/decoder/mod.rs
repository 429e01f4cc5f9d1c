//! KwkDecoder: the runtime. It runs a model packed into one weight format (by `crate::pack`,
//! which its constructors in `build` call) on the CPU: batched prompt processing,
//! single-token generation, a KV cache reused across calls, and sampling.
//!
//! Shape of a forward pass over `n` tokens (prompts are cut into micro-batches of
//! [`MICRO_BATCH`] tokens): embedding rows (read through the packed table's
//! `dequantize_row`), then per layer RMSNorm → q/k/v (one pool hand-off for the three
//! matmuls on one prepared input) → biases, per-head q/k norms, RoPE → KV cache → causal
//! attention (threads split the heads) → output projection → residual → RMSNorm → SwiGLU
//! MLP (gate and up in one hand-off) or mixture of experts (tokens grouped by expert) →
//! residual; the final norm and `lm_head` run only on the rows whose logits are asked for.
//! Norms, RoPE, softmax, routing and the KV cache are float32 in every format.
//!
//! Gemma 3 adds a scaled embedding, norms on attention's and the FFN's outputs (in each
//! packed layer), GeGLU, and local layers with their own RoPE base and a sliding window
//! over a ring cache, whose attention covers only the window ([`GemmaParts`]).
//!
//! Submodules: `build` (the constructors), `layers` (the attention block, MLP, MoE and the
//! per-row helpers), `attention` (the softmax attention itself), `kv_cache`, `rope`,
//! `sampling`, `sink` (the forward passes calibration measures
//! through), `resident` (memory estimates).
//! The format names ([`Precision`] and its options) live in `format::precision`; they are
//! re-exported here under their old paths.

mod attention;
mod build;
mod flash;
mod kv_cache;
pub mod kv_precision;
mod kv_rotation;
mod layers;
pub mod resident;
pub mod rope;
pub mod sampling;
mod sink;

pub use crate::format::precision::{self, LowBitOptions, Precision, DEFAULT_INT4_GROUP};
pub use crate::pack::calibrate::{CALIBRATION_TOKENS, CALIBRATION_WINDOW};
pub use kv_precision::KvPrecision;

use crate::error::{KwkError, Result};
use crate::format::PackedLinear;
use crate::kernels::{self, OutputMatrix};
use crate::model::{Architecture, FeedForward, Mlp, Model, ModelConfig, ModelWeights, RopeScaling};
use crate::pack::cache::{self as pack_cache, PackOutcome};
use crate::pack::model::{Layer, PackedModel};
use crate::threads::ThreadPool;
use kv_cache::KvCache;
use layers::Scratch;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Tokens per internal batch of a long prompt (bounds the scratch memory).
pub const MICRO_BATCH: usize = 512;

/// Sampling for [`KwkDecoder::generate`]. `temperature == 0` is greedy.
#[derive(Debug, Clone)]
pub struct Sampling {
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`
    /// (1.0: all).
    pub top_p: f32,
    pub seed: u64,
}

#[derive(Debug, Clone)]
pub struct DecoderOptions {
    /// Longest sequence (prompt + generated) the KV cache holds.
    pub max_cache_len: usize,
    pub precision: Precision,
    /// The KV cache's element type (`KvPrecision::F32` by default).
    pub kv: KvPrecision,
    pub threads: usize,
    /// Token ids of calibration text (int4:calib / int4:gptq).
    pub calibration_tokens: Option<Vec<u32>>,
    /// Where packed weights are kept between runs; `None` disables the pack cache.
    pub pack_cache_dir: Option<PathBuf>,
}

/// Timings of one `generate` call.
#[derive(Debug, Clone, Default)]
pub struct GenerateStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Seconds of the prompt's forward pass (sampling excluded).
    pub prompt_s: f64,
    /// Seconds of the single-token forward passes of generated tokens fed back
    /// (`decode_steps` of them; sampling excluded).
    pub generate_s: f64,
    /// Single-token forward passes timed in `generate_s` (the last generated token is not
    /// fed back, so this is usually `generated_tokens - 1`).
    pub decode_steps: usize,
}

pub struct KwkDecoder {
    config: ModelConfig,
    precision: Precision,
    max_cache_len: usize,
    pool: ThreadPool,
    /// The embedding table; also the output projection when `lm_head` is `None` (tied).
    embed: Box<dyn PackedLinear>,
    lm_head: Option<Box<dyn PackedLinear>>,
    final_norm: Vec<f32>,
    layers: Vec<Layer>,
    rope: rope::Rope,
    kv: KvCache,
    kv_precision: KvPrecision,
    pos: usize,
    eos: Vec<u32>,
    weight_bytes: u64,
    n_params: u64,
    pack_s: f64,
    /// Seconds of `pack_s` spent on calibration: the float32 passes over the calibration
    /// tokens and, for `int4:gptq`, the Hessians and GPTQ itself (0 when none ran).
    calibration_s: f64,
    /// What the pack cache did in `new` (`None`: not used for this format).
    pack_cache: Option<PackOutcome>,
    /// Buffers reused across calls: the residual stream and the per-layer scratch.
    x_buf: Vec<f32>,
    scratch: Scratch,
    /// Gemma 3's parts (`None` for the Llama family).
    gemma: Option<GemmaParts>,
}

/// What a Gemma 3 model adds to the runtime (its post norms are in the packed layers):
/// the local layers' RoPE tables (base `rope_local_theta`; `rope` holds the global
/// layers'), and the embedding scale `sqrt(hidden_size)` in float32 (transformers'
/// `Gemma3TextScaledWordEmbedding` multiplies by it in the weights' dtype, llama.cpp by
/// `sqrtf(n_embd)`: the same float32 value).
pub(crate) struct GemmaParts {
    local_rope: rope::Rope,
    embed_scale: f32,
}

impl GemmaParts {
    /// The parts for `config` (a Gemma 3 config; `None` otherwise), RoPE tables for
    /// `max_cache_len` positions.
    pub(crate) fn new(config: &ModelConfig, max_cache_len: usize) -> Option<GemmaParts> {
        let g = config.gemma3.as_ref()?;
        Some(GemmaParts {
            local_rope: rope::Rope::new(
                config.head_dim,
                g.rope_local_theta as f64,
                &RopeScaling::None,
                max_cache_len,
            ),
            embed_scale: (config.hidden_size as f64).sqrt() as f32,
        })
    }
}

/// The runtime of layer `li`: the global RoPE tables `rope`, or for a Gemma 3 local layer
/// the local ones and its window.
fn layer_runtime<'a>(
    cfg: &'a ModelConfig,
    pool: &'a ThreadPool,
    rope: &'a rope::Rope,
    gemma: Option<&'a GemmaParts>,
    li: usize,
) -> layers::Runtime<'a> {
    let (Some(parts), Some(g)) = (gemma, cfg.gemma3.as_ref()) else {
        return layers::Runtime {
            cfg,
            pool,
            rope,
            gemma: None,
        };
    };
    let local = g.sliding_layers[li];
    layers::Runtime {
        cfg,
        pool,
        rope: if local { &parts.local_rope } else { rope },
        gemma: Some(layers::GemmaLayer {
            window: local.then_some(g.sliding_window),
        }),
    }
}

/// Embedding rows of `tokens` into `x` (`[n][d]`), scaled for Gemma 3.
fn embed_rows(embed: &dyn PackedLinear, gemma: Option<&GemmaParts>, tokens: &[u32], x: &mut [f32]) {
    let d = x.len() / tokens.len().max(1);
    for (t, &id) in tokens.iter().enumerate() {
        embed.dequantize_row(id as usize, &mut x[t * d..(t + 1) * d]);
    }
    if let Some(g) = gemma {
        x.iter_mut().for_each(|v| *v *= g.embed_scale);
    }
}

/// Why `model` cannot run in this decoder with a cache of `max_cache_len` tokens
/// (architecture, rope scaling, sliding window, cache longer than the model allows), or
/// `None` when it can.
pub fn runner_unsupported(model: &Model, max_cache_len: usize) -> Option<String> {
    config_unsupported(&model.config, max_cache_len)
        .or_else(|| weights_mismatch(&model.config, &model.weights))
}

/// Why a model with config `c` cannot run with a cache of `max_cache_len` tokens, from
/// the config alone (the part of [`runner_unsupported`] that needs no weights).
pub fn config_unsupported(c: &ModelConfig, max_cache_len: usize) -> Option<String> {
    if let RopeScaling::Other(kind) = &c.rope_scaling {
        return Some(format!(
            "rope scaling '{kind}' is not implemented (this decoder knows none and llama3)"
        ));
    }
    if max_cache_len == 0 {
        return Some("a KV cache of 0 tokens cannot hold anything".into());
    }
    if max_cache_len > c.max_position_embeddings {
        return Some(format!(
            "a cache of {max_cache_len} tokens is longer than the {} positions the model was \
             trained for (max_position_embeddings); use a shorter context",
            c.max_position_embeddings
        ));
    }
    if let Some(w) = c.sliding_window {
        if w < max_cache_len {
            return Some(format!(
                "the model uses sliding-window attention over {w} tokens, which this decoder \
                 does not implement; use a context of at most {w} tokens"
            ));
        }
    }
    if c.head_dim == 0 || !c.head_dim.is_multiple_of(2) {
        return Some(format!(
            "head_dim {} must be even for rotary embeddings",
            c.head_dim
        ));
    }
    if c.n_heads == 0 || c.n_kv_heads == 0 || !c.n_heads.is_multiple_of(c.n_kv_heads) {
        return Some(format!(
            "{} attention heads cannot be grouped over {} KV heads",
            c.n_heads, c.n_kv_heads
        ));
    }
    let moe = matches!(
        c.architecture,
        Architecture::Mixtral | Architecture::Qwen2Moe | Architecture::Qwen3Moe
    );
    if moe && (c.experts_per_token == 0 || c.experts_per_token > c.n_experts) {
        return Some(format!(
            "{} experts per token out of {} experts",
            c.experts_per_token, c.n_experts
        ));
    }
    if let Some(g) = &c.gemma3 {
        if g.sliding_layers.len() != c.n_layers {
            return Some(format!(
                "gemma3: {} layer kinds for {} layers",
                g.sliding_layers.len(),
                c.n_layers
            ));
        }
        if g.rope_local_theta.is_nan() || g.rope_local_theta <= 0.0 {
            return Some(format!(
                "gemma3: rope_local_base_freq {} must be positive",
                g.rope_local_theta
            ));
        }
    }
    if c.rope_theta.is_nan() || c.rope_theta <= 0.0 {
        return Some(format!("rope_theta {} must be positive", c.rope_theta));
    }
    None
}

/// Weight shapes that disagree with the config (a loader would normally have caught them).
fn weights_mismatch(c: &ModelConfig, w: &ModelWeights) -> Option<String> {
    let d = c.hidden_size;
    let (qd, kvd) = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
    let check = |name: &str, t: &crate::model::Tensor, rows: usize, cols: usize| {
        (t.shape.len() != 2 || t.rows() != rows || t.cols() != cols || t.data.len() != rows * cols)
            .then(|| format!("{name} has shape {:?}, expected [{rows}, {cols}]", t.shape))
    };
    let vec_len = |name: &str, v: &[f32], n: usize| {
        (v.len() != n).then(|| format!("{name} has {} values, expected {n}", v.len()))
    };
    let mlp = |name: &str, m: &Mlp| {
        let ffn = m.gate.rows();
        check(&format!("{name}.gate"), &m.gate, ffn, d)
            .or_else(|| check(&format!("{name}.up"), &m.up, ffn, d))
            .or_else(|| check(&format!("{name}.down"), &m.down, d, ffn))
    };
    if let Some(e) = check("embed", &w.embed, c.vocab_size, d) {
        return Some(e);
    }
    if let Some(h) = &w.lm_head {
        if let Some(e) = check("lm_head", h, c.vocab_size, d) {
            return Some(e);
        }
    }
    if let Some(e) = vec_len("final_norm", &w.final_norm, d) {
        return Some(e);
    }
    if w.layers.len() != c.n_layers {
        return Some(format!(
            "{} layers of weights for {} in the config",
            w.layers.len(),
            c.n_layers
        ));
    }
    let post_layers = if c.gemma3.is_some() { c.n_layers } else { 0 };
    if w.post_norms.len() != post_layers {
        return Some(format!(
            "{} layers of post-attention/post-FFN norms, expected {post_layers} (gemma3 has \
             them on every layer, other architectures none)",
            w.post_norms.len()
        ));
    }
    for (i, p) in w.post_norms.iter().enumerate() {
        if let Some(e) = vec_len(&format!("layer {i} post_attn_norm"), &p.attn, d)
            .or_else(|| vec_len(&format!("layer {i} post_ffn_norm"), &p.ffn, d))
        {
            return Some(e);
        }
    }
    for (i, l) in w.layers.iter().enumerate() {
        let p = |s: &str| format!("layer {i} {s}");
        let bias = |s: &str, b: &Option<Vec<f32>>, n| b.as_ref().and_then(|b| vec_len(&p(s), b, n));
        let err = check(&p("q"), &l.q, qd, d)
            .or_else(|| check(&p("k"), &l.k, kvd, d))
            .or_else(|| check(&p("v"), &l.v, kvd, d))
            .or_else(|| check(&p("o"), &l.o, d, qd))
            .or_else(|| vec_len(&p("attn_norm"), &l.attn_norm, d))
            .or_else(|| vec_len(&p("ffn_norm"), &l.ffn_norm, d))
            .or_else(|| bias("q_bias", &l.q_bias, qd))
            .or_else(|| bias("k_bias", &l.k_bias, kvd))
            .or_else(|| bias("v_bias", &l.v_bias, kvd))
            .or_else(|| bias("q_norm", &l.q_norm, c.head_dim))
            .or_else(|| bias("k_norm", &l.k_norm, c.head_dim))
            .or_else(|| match &l.ffn {
                FeedForward::Dense(m) => mlp(&p("mlp"), m),
                FeedForward::Moe(m) => check(&p("router"), &m.router, m.experts.len(), d)
                    .or_else(|| {
                        (m.experts.len() != c.n_experts).then(|| {
                            format!(
                                "{} has {} experts, config says {}",
                                p("moe"),
                                m.experts.len(),
                                c.n_experts
                            )
                        })
                    })
                    .or_else(|| {
                        m.experts
                            .iter()
                            .enumerate()
                            .find_map(|(e, x)| mlp(&p(&format!("expert {e}")), x))
                    })
                    .or_else(|| {
                        m.shared_expert
                            .as_ref()
                            .and_then(|s| mlp(&p("shared expert"), s))
                    })
                    .or_else(|| {
                        m.shared_expert_gate
                            .as_ref()
                            .and_then(|g| check(&p("shared_expert_gate"), g, 1, d))
                    })
                    .or_else(|| {
                        (m.experts.len() < c.experts_per_token)
                            .then(|| format!("{}: fewer experts than experts_per_token", p("moe")))
                    }),
            });
        if err.is_some() {
            return err;
        }
    }
    None
}

/// Whether this CPU can run the decoder as asked (`Err` says why not). Every kernel has a
/// portable scalar version, so any CPU can run it; the one refusal is a `KWK_ISA` value that
/// names no tier this CPU supports (the error lists the ones it does), so that a
/// measurement never runs under a tier other than the one requested.
pub fn decoder_available() -> std::result::Result<(), String> {
    kernels::check_isa_env()?;
    let _ = kernels::active_isa();
    Ok(())
}

/// The ids that end generation: the config's and the tokenizer's.
pub fn eos_ids(config: &ModelConfig, tokenizer: &crate::tokenizer::Tokenizer) -> Vec<u32> {
    let mut eos = config.eos_token_ids.clone();
    for &id in tokenizer.eos_ids() {
        if !eos.contains(&id) {
            eos.push(id);
        }
    }
    eos
}

impl KwkDecoder {
    /// Empties the KV cache; the next `forward` starts at position 0.
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    /// Tokens currently in the KV cache.
    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    pub fn max_cache_len(&self) -> usize {
        self.max_cache_len
    }

    /// Threads of the forward passes.
    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// Runs the next forward passes on `threads` threads (at least 1): a new pool when the
    /// count changes (a speed sweep over thread counts).
    pub fn set_threads(&mut self, threads: usize) {
        if self.pool.n_threads() != threads.max(1) {
            self.pool = ThreadPool::new(threads);
        }
    }

    /// The KV cache's element type (`f32`, `f16`, `bf16`, `q8`).
    pub fn kv_cache_type(&self) -> &'static str {
        self.kv_precision.name()
    }

    /// The KV cache's precision.
    pub fn kv_precision(&self) -> KvPrecision {
        self.kv_precision
    }

    /// K+V bytes per cached token over all layers, scales included
    /// ([`KvPrecision::bytes_per_token`]).
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.kv_precision.bytes_per_token(&self.config)
    }

    /// Appends `tokens` at the current position and returns the logits of positions
    /// `logits_from..tokens.len()` of this call, row-major `[tokens.len() - logits_from][vocab]`.
    /// Perplexity asks for the second half of a window, generation for the last token only.
    pub fn forward(&mut self, tokens: &[u32], logits_from: usize) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(KwkError::InvalidArgument(
                "forward needs at least one token".into(),
            ));
        }
        if logits_from > tokens.len() {
            return Err(KwkError::InvalidArgument(format!(
                "logits_from {logits_from} is past the {} tokens of this call",
                tokens.len()
            )));
        }
        if self.pos + tokens.len() > self.max_cache_len {
            return Err(KwkError::InvalidArgument(format!(
                "{} tokens at position {} overflow the KV cache of {} tokens; reset() or \
                 build the decoder with a larger max_cache_len",
                tokens.len(),
                self.pos,
                self.max_cache_len
            )));
        }
        let vocab = self.config.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(KwkError::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        let mut logits = Vec::with_capacity((tokens.len() - logits_from) * vocab);
        let mut start = 0;
        while start < tokens.len() {
            let end = (start + MICRO_BATCH).min(tokens.len());
            let from = logits_from.clamp(start, end) - start;
            self.forward_batch(&tokens[start..end], from, &mut logits);
            start = end;
        }
        Ok(logits)
    }

    /// One micro-batch: runs every layer, appends logits of rows `logits_from..` to `out`.
    fn forward_batch(&mut self, tokens: &[u32], logits_from: usize, out: &mut Vec<f32>) {
        let n = tokens.len();
        let d = self.config.hidden_size;
        let mut x_buf = std::mem::take(&mut self.x_buf);
        x_buf.resize(n * d, 0.0);
        let x = &mut x_buf[..n * d];
        embed_rows(self.embed.as_ref(), self.gemma.as_ref(), tokens, x);
        let scratch = &mut self.scratch;
        for (li, layer) in self.layers.iter().enumerate() {
            layer.forward(
                &layer_runtime(
                    &self.config,
                    &self.pool,
                    &self.rope,
                    self.gemma.as_ref(),
                    li,
                ),
                &mut self.kv,
                li,
                self.pos,
                x,
                scratch,
            );
        }
        self.pos += n;
        if let Some((acc, count)) = self.scratch.head_record.as_mut() {
            // Calibration: lm_head's input at every position, not only the scored ones.
            let mut xn = x.to_vec();
            layers::rms_norm_rows(
                &self.pool,
                &mut xn,
                &self.final_norm,
                self.config.rms_norm_eps,
            );
            layers::accumulate_squares(acc, &xn, d);
            *count += n as u64;
        }
        let rows = n - logits_from;
        if rows == 0 {
            self.x_buf = x_buf;
            return;
        }
        let mut xn = x[logits_from * d..].to_vec();
        self.x_buf = x_buf;
        let acts = &mut self.scratch.acts;
        layers::rms_norm_rows(
            &self.pool,
            &mut xn,
            &self.final_norm,
            self.config.rms_norm_eps,
        );
        let head = self.lm_head.as_deref().unwrap_or(self.embed.as_ref());
        let vocab = self.config.vocab_size;
        let base = out.len();
        out.resize(base + rows * vocab, 0.0);
        acts.prepare(&self.pool, &xn, d, [head.input_kind(rows)]);
        let y = OutputMatrix::new(&mut out[base..], rows, vocab);
        layers::matmuls(
            &self.pool,
            &[(head, acts.get(&xn, head.input_kind(rows)), &y)],
        );
        if let Some(cap) = self
            .config
            .gemma3
            .as_ref()
            .and_then(|g| g.final_logit_softcapping)
        {
            out[base..]
                .iter_mut()
                .for_each(|v| *v = cap * (*v / cap).tanh());
        }
    }

    /// Bytes of packed weights the decoder holds (what a user pays in memory): every
    /// packed linear, the embedding (once when tied), norms, biases and routers (float32).
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    /// Weight bytes one generated token reads (see `model::cost`): every layer (routed
    /// experts only, as a share), the output matrix, and one row of an input embedding
    /// that is not also the output.
    pub fn weight_bytes_read_per_token(&self) -> f64 {
        let layers: f64 = self.layers.iter().map(|l| l.bytes_read_per_token()).sum();
        let embed = self.embed.bytes() as f64;
        let (head, embed_row) = match &self.lm_head {
            Some(h) => (
                h.bytes() as f64,
                embed / self.config.vocab_size.max(1) as f64,
            ),
            None => (embed, 0.0),
        };
        layers + head + embed_row + 4.0 * self.final_norm.len() as f64
    }

    /// Packed linears per layout (`4-bit g32` → count), the embedding and `lm_head`
    /// included; the report's `type_mix`.
    pub fn type_mix(&self) -> std::collections::BTreeMap<String, usize> {
        let mut mix = std::collections::BTreeMap::new();
        let mut all: Vec<&dyn PackedLinear> = vec![self.embed.as_ref()];
        all.extend(self.lm_head.iter().map(|h| h.as_ref()));
        for l in &self.layers {
            all.extend(l.linears());
        }
        for t in all {
            *mix.entry(t.layout_name()).or_insert(0) += 1;
        }
        mix
    }

    /// Bits per weight over all parameters, embeddings and norms included.
    pub fn bits_per_weight(&self) -> f64 {
        if self.n_params == 0 {
            return 0.0;
        }
        self.weight_bytes as f64 * 8.0 / self.n_params as f64
    }

    /// Parameters of the model (embedding once when tied).
    pub fn n_params(&self) -> u64 {
        self.n_params
    }

    /// Seconds spent packing weights (quantizing, or reading the pack cache) in `new`.
    /// What the pack cache did when this decoder was built: `None` when it was not used
    /// (float formats, or no `pack_cache_dir`).
    pub fn pack_cache_outcome(&self) -> Option<&PackOutcome> {
        self.pack_cache.as_ref()
    }

    pub fn pack_s(&self) -> f64 {
        self.pack_s
    }

    /// Seconds of [`Self::pack_s`] spent on calibration (statistics passes, and the
    /// Hessians and GPTQ of `int4:gptq`); 0 when none ran (other formats, or a pack-cache
    /// hit).
    pub fn calibration_s(&self) -> f64 {
        self.calibration_s
    }

    /// Runs `prompt` from an empty cache (the cache is reset first), then samples up to
    /// `max_new_tokens`, stopping at EOS (not passed to `on_token`) or when the cache is
    /// full; `on_token` sees each new id and returns false to stop early.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_new_tokens: usize,
        sampling: &Sampling,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<GenerateStats> {
        if prompt.is_empty() {
            return Err(KwkError::InvalidArgument(
                "generate needs a non-empty prompt".into(),
            ));
        }
        self.reset();
        let mut rng = sampling::Rng::new(sampling.seed);
        let mut stats = GenerateStats {
            prompt_tokens: prompt.len(),
            ..Default::default()
        };
        let t0 = Instant::now();
        let mut logits = self.forward(prompt, prompt.len() - 1)?;
        stats.prompt_s = t0.elapsed().as_secs_f64();
        while stats.generated_tokens < max_new_tokens {
            let next = sampling::sample(&logits, sampling, &mut rng);
            if self.eos.contains(&next) {
                break;
            }
            stats.generated_tokens += 1;
            if !on_token(next) {
                break;
            }
            if stats.generated_tokens == max_new_tokens || self.pos >= self.max_cache_len {
                break;
            }
            let t = Instant::now();
            logits = self.forward(&[next], 0)?;
            stats.generate_s += t.elapsed().as_secs_f64();
            stats.decode_steps += 1;
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod flash_tests;
#[cfg(test)]
mod gemma_quant_tests;
#[cfg(test)]
mod gemma_tests;
#[cfg(test)]
mod tests;

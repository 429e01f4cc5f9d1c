//! KwkDecoder: packs a [`Model`]'s master weights into one weight format and runs the
//! transformer on the CPU: batched prompt processing, single-token generation, a KV cache
//! reused across calls, and sampling.
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
//! Submodules: `rope`, `sampling`, `layers` (attention, MLP, MoE and the per-row helpers).
//! The format names ([`Precision`] and its options) live in `format::precision`; they are
//! re-exported here under their old paths.

mod layers;
pub mod resident;
pub mod rope;
pub mod sampling;
mod stream;

pub use crate::format::precision::{self, Int4Options, Precision, DEFAULT_INT4_GROUP};

use crate::error::{KwkError, Result};
use crate::format::quantized::default_mix_bits;
use crate::format::quantized::{grid_for, quantize_on, Grid, QuantizedTensor};
use crate::format::{self, PackedLinear, TensorPlace, TensorRole};
use crate::kernels::{self, OutputMatrix};
use crate::model::{Architecture, FeedForward, Mlp, Model, ModelConfig, ModelWeights, RopeScaling};
use crate::pack::cache::{self as pack_cache, CachedModel, PackOutcome, PackSession};
use crate::quantize::equalize::{
    equalize, ActivationStats, ChannelScales, EqualizeOptions, Equalized, LayerImportance,
    LayerStats,
};
use crate::quantize::gptq::{
    act_order, gptq_lowbit, inverse_factor, Hessian, InverseFactor, KeptHessian, KEPT_HESSIAN_BYTES,
};
use crate::quantize::mix::{allocate, ladder, q4_k_m_bits_per_weight, MixUnit};
use crate::threads::ThreadPool;
use layers::{KeptGrams, KvCache, Layer, LayerGrams, PackedFfn, PackedMlp, PackedMoe, Scratch};
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
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

/// The mix units of layer `i` (q, k, v, o, gate, up, down; an MoE layer's experts share a
/// unit per role), each tensor with the second moments of its input (`li`'s importance when
/// it has them, else ones) and its rounding importance.
fn layer_mix_units<'a>(
    i: usize,
    l: &'a crate::model::LayerWeights,
    li: Option<&'a LayerImportance>,
    ones: &'a [f32],
) -> Vec<MixUnit<'a>> {
    use crate::model::Tensor;
    // The moments of each input (ones when equalization produced none); rounding is
    // weighted by them when it did.
    let m = |v: Option<&'a [f32]>, t: &Tensor| -> (&'a [f32], Option<&'a [f32]>) {
        match v.filter(|v| v.len() == t.cols()) {
            Some(v) => (v, Some(v)),
            None => (&ones[..t.cols().min(ones.len())], None),
        }
    };
    let mlps: Vec<&Mlp> = match &l.ffn {
        FeedForward::Dense(m) => vec![m],
        FeedForward::Moe(m) => m.experts.iter().chain(m.shared_expert.iter()).collect(),
    };
    let attn_in = li.map(|x| &x.attn_in[..]);
    let ffn_in = li.map(|x| &x.ffn_in[..]);
    type Inputs<'b> = Vec<(&'b Tensor, Option<&'b [f32]>)>;
    let groups: Vec<(TensorRole, Inputs)> = vec![
        (TensorRole::AttnQ, vec![(&l.q, attn_in)]),
        (TensorRole::AttnK, vec![(&l.k, attn_in)]),
        (TensorRole::AttnV, vec![(&l.v, attn_in)]),
        (
            TensorRole::AttnOutput,
            vec![(&l.o, li.map(|x| &x.o_in[..]))],
        ),
        (
            TensorRole::FfnGate,
            mlps.iter().map(|mm| (&mm.gate, ffn_in)).collect(),
        ),
        (
            TensorRole::FfnUp,
            mlps.iter().map(|mm| (&mm.up, ffn_in)).collect(),
        ),
        (
            TensorRole::FfnDown,
            mlps.iter()
                .enumerate()
                .map(|(j, mm)| (&mm.down, li.and_then(|x| x.down_in.get(j)).map(|v| &v[..])))
                .collect(),
        ),
    ];
    groups
        .into_iter()
        .map(|(role, tensors)| MixUnit {
            role,
            layer: Some(i),
            tensors: tensors
                .into_iter()
                .map(|(t, v)| {
                    let (moment, imp) = m(v, t);
                    (t, moment, imp)
                })
                .collect(),
        })
        .collect()
}

/// The `int4` mix by sensitivity (`quantize::mix`): a grid per (role, layer) for every
/// linear but `lm_head`, within the bits llama.cpp's Q4_K_M would give the model.
fn int4_plan<'a>(
    config: &ModelConfig,
    weights: &'a ModelWeights,
    eq: &'a Equalized,
    ones: &'a [f32],
    opts: &Int4Options,
    place: &(dyn Fn(TensorRole, Option<usize>) -> TensorPlace + Sync),
) -> Result<HashMap<(TensorRole, Option<usize>), Grid>> {
    let n_layers = config.n_layers;
    use crate::model::Tensor;
    let q4km = |role, layer, t: &Tensor| {
        t.data.len() as f64 * q4_k_m_bits_per_weight(role, layer, n_layers, t.cols())
    };
    let output = weights.output();
    let head_grid = grid_for(&Precision::Int4(*opts), &place(TensorRole::LmHead, None))?
        .ok_or_else(|| KwkError::InvalidArgument("lm_head has no int4 grid".into()))?;
    // Bits Q4_K_M would spend on the tensors the search covers: its whole size less
    // lm_head (kwk keeps that at mix_bits; the float vectors cost the same in both).
    let mut budget = q4km(TensorRole::LmHead, None, output)
        - head_grid.tensor_bits(output.rows(), output.cols());
    let mut units: Vec<MixUnit> = Vec::new();
    if weights.lm_head.is_some() {
        budget += q4km(TensorRole::Embedding, None, &weights.embed);
        let e = &weights.embed;
        units.push(MixUnit {
            role: TensorRole::Embedding,
            layer: None,
            tensors: vec![(e, &ones[..e.cols().min(ones.len())], None)],
        });
    }
    for (i, l) in weights.layers.iter().enumerate() {
        let li = eq.importance.get(i).filter(|x| !x.attn_in.is_empty());
        for u in layer_mix_units(i, l, li, ones) {
            for (t, _, _) in &u.tensors {
                budget += q4km(u.role, Some(i), t);
            }
            units.push(u);
        }
    }
    let mix_bits = opts
        .mix_bits
        .unwrap_or_else(|| default_mix_bits(place(TensorRole::LmHead, None).model_params));
    let grids = allocate(&units, &ladder(opts.group_size, mix_bits), budget);
    Ok(units
        .iter()
        .zip(grids)
        .map(|(u, g)| ((u.role, u.layer), g))
        .collect())
}

/// The most input columns any linear of `w` has.
fn widest_input(w: &ModelWeights) -> usize {
    let mut n = w.embed.cols();
    for l in &w.layers {
        n = n.max(l.q.cols()).max(l.o.cols());
        match &l.ffn {
            FeedForward::Dense(m) => n = n.max(m.down.cols()),
            FeedForward::Moe(m) => {
                for e in m.experts.iter().chain(m.shared_expert.iter()) {
                    n = n.max(e.down.cols());
                }
            }
        }
    }
    n
}

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
) -> Result<(KwkDecoder, usize)> {
    let window = CALIBRATION_WINDOW.min(config.max_position_embeddings.max(1));
    let decoder = KwkDecoder::from_weights(
        config,
        weights,
        Vec::new(),
        Path::new("calibration"),
        DecoderOptions {
            max_cache_len: window,
            precision: Precision::Float32,
            threads,
            calibration_tokens: None,
            pack_cache_dir: None,
        },
    )?;
    Ok((decoder, window))
}

/// Equalizes `weights` for a quantized `precision` (`quantize::equalize`): with activation
/// statistics measured by a float32 decoder over the calibration tokens for
/// `int8:calib`/`int8:gptq`/`int4:calib`/`int4:gptq`, else estimated from the weights.
/// Calibrated int8 is searched with [`EqualizeOptions::INT8_CALIBRATED`] (activation-block
/// error scored, the `lm_head` unit), calibrated int4 with
/// [`EqualizeOptions::CALIBRATED`].
fn equalize_for(
    config: &ModelConfig,
    weights: &ModelWeights,
    precision: &Precision,
    calibration: Option<&[u32]>,
    threads: usize,
    place: &(dyn Fn(TensorRole, Option<usize>) -> TensorPlace + Sync),
) -> Result<(Equalized, Option<Vec<KeptGrams>>)> {
    let estimated = ActivationStats::estimate(weights, config);
    if !precision.needs_calibration() {
        let e = equalize(
            weights,
            config,
            precision,
            &estimated,
            place,
            EqualizeOptions::ESTIMATED,
        )?;
        return Ok((e, None));
    }
    let tokens = calibration.filter(|t| !t.is_empty()).ok_or_else(|| {
        KwkError::InvalidArgument(format!(
            "{} needs calibration tokens (kwk-eval: --calib-text FILE)",
            precision.name()
        ))
    })?;
    let (mut reference, window) = calibration_decoder(config, weights, threads)?;
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
    static KEPT_HESSIAN_LIMIT: std::cell::Cell<usize> = const {
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

/// Key of a tensor quantized by the GPTQ pass: role, layer, MLP index (0 outside the
/// feed-forward; experts in order, then the shared expert).
type GptqKey = (TensorRole, usize, usize);

/// A GPTQ factor and the column order it was computed for (`None`: natural order).
type OrderedFactor = (InverseFactor, Option<Vec<usize>>);

/// GPTQ for every linear of every layer (`quantize::gptq`) of `weights`, the *equalized*
/// weights. The Hessians are those `kept` from the calibration pass over the original
/// weights, rescaled by the equalization's factors, or else gathered layer by layer
/// ([`KwkDecoder::layer_hessians`]) by a float32 decoder of `weights`: equalization
/// preserves the function, so that decoder's linears see exactly the inputs the final,
/// rescaled weights will (`x / α` per channel). Each tensor is rounded on the grid `grid`
/// gives it; an expert that no calibration token reached is rounded plainly. The embedding
/// and `lm_head` are not in a layer and are rounded plainly by the caller.
#[allow(clippy::too_many_arguments)]
fn gptq_layers(
    config: &ModelConfig,
    weights: &ModelWeights,
    precision: &Precision,
    calibration: &[u32],
    threads: usize,
    place: &(dyn Fn(TensorRole, Option<usize>) -> TensorPlace + Sync),
    grid: &dyn Fn(TensorRole, usize) -> Result<Grid>,
    kept: Option<(Vec<KeptGrams>, &ChannelScales)>,
) -> Result<HashMap<GptqKey, QuantizedTensor>> {
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
        // One factor per input, or with act-order per input and group size (the column
        // order depends on the groups), each (input, group) factored once, in parallel.
        let act = matches!(precision, Precision::Int4(o) if o.act_order);
        let mut keys: Vec<(usize, usize)> = jobs
            .iter()
            .zip(&grids)
            .filter_map(|(&(.., input), g)| match g {
                Grid::Asym { group, .. } if inputs[input].tokens > 0 => {
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
        for ((role, which, t, input), g) in jobs.into_iter().zip(grids) {
            let factor = match g {
                Grid::Asym { group, .. } => factors.get(&(input, if act { group } else { 0 })),
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
            let (mut reference, window) = calibration_decoder(config, weights, threads)?;
            let tokens = &calibration[..calibration.len().min(CALIBRATION_TOKENS)];
            reference.layer_hessians(tokens, window, &mut each_layer)?;
        }
    }
    Ok(out)
}

/// The sums of squares one calibration pass gathered: per layer, and `lm_head`'s input
/// (sums, positions).
pub(crate) struct PassRecords {
    layers: Vec<layers::LayerRecord>,
    head: Option<(Vec<f64>, u64)>,
}

impl PassRecords {
    /// The per-channel second moments; an expert no token was routed to (or a missing head
    /// record) gets `fallback`'s estimate.
    fn stats(&self, fallback: &ActivationStats) -> ActivationStats {
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
        let calibration = options.calibration_tokens.as_deref();
        let mut session = None;
        let mut not_written = None;
        if let (Some(dir), true) = (&options.pack_cache_dir, quantized) {
            match pack_cache::try_load(dir, source, &precision, calibration) {
                Ok(Some(cached)) => {
                    return Self::from_cached(config, eos, cached, source, options, started)
                }
                Ok(None) => {}
                Err(e) => crate::notices::warn(format!("pack cache: {e}; packing without it")),
            }
            match PackSession::open(dir, source, &precision, calibration) {
                Ok(mut s) => {
                    if let Some(cached) = s.take_hit() {
                        return Self::from_cached(config, eos, cached, source, options, started);
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
            (Precision::Int4(opts), Some(eq)) => {
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
                let tokens = options
                    .calibration_tokens
                    .as_deref()
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| {
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
                let done = gptq_layers(
                    config,
                    weights,
                    &precision,
                    tokens,
                    options.threads,
                    &place,
                    &grid_of,
                    kept,
                )?;
                calibration_s += t0.elapsed().as_secs_f64();
                done
            }
            _ => HashMap::new(),
        });
        let importance = |layer: Option<usize>, pick: &dyn Fn(&LayerImportance) -> &[f32]| {
            let e = equalized.as_ref()?;
            let li = e.importance.get(layer?)?;
            let v = pick(li);
            (!v.is_empty()).then_some(v)
        };
        // A tensor GPTQ made is handed to the session as made (its bytes depend on the
        // Hessian, which its key does not hold: never reused from an older file).
        let pack = |name: &str,
                    t: &crate::model::Tensor,
                    role,
                    layer: Option<usize>,
                    which: usize,
                    imp: Option<&[f32]>| {
            let done = layer.and_then(|l| lock(&gptq_done).remove(&(role, l, which)));
            match (&session, done) {
                (Some(s), done) => lock(s).pack_with(
                    name,
                    t,
                    place(role, layer),
                    grid(role, layer),
                    imp,
                    &precision,
                    done,
                ),
                (None, Some(q)) => Ok(q.into_packed()),
                (None, None) if quantized => {
                    Ok(
                        quantize_on(t, &precision, place(role, layer), grid(role, layer), imp)?
                            .into_packed(),
                    )
                }
                (None, None) => format::pack_linear(t, &precision, place(role, layer)),
            }
        };

        // Jobs: the embedding, the untied lm_head, then each layer, taken from a shared
        // counter by the pool's threads (the embedding costs about as much as 8 layers of
        // a small model, so a queue balances better than a static split).
        // A tied output projection is packed once, as the lm_head (it is the larger
        // consumer); embedding lookups dequantize its rows.
        let pool = ThreadPool::new(options.threads);
        let pack_mlp = |m: &Mlp, layer: usize, which: usize| -> Result<PackedMlp> {
            let ffn_in = importance(Some(layer), &|li| &li.ffn_in);
            let down_in = importance(Some(layer), &|li| {
                li.down_in.get(which).map_or(&[][..], |v| &v[..])
            });
            let n = |w: &str| names::mlp(layer, which, w);
            Ok(PackedMlp {
                gate: pack(
                    &n("gate"),
                    &m.gate,
                    TensorRole::FfnGate,
                    Some(layer),
                    which,
                    ffn_in,
                )?,
                up: pack(
                    &n("up"),
                    &m.up,
                    TensorRole::FfnUp,
                    Some(layer),
                    which,
                    ffn_in,
                )?,
                down: pack(
                    &n("down"),
                    &m.down,
                    TensorRole::FfnDown,
                    Some(layer),
                    which,
                    down_in,
                )?,
            })
        };
        let pack_layer = |i: usize| -> Result<Layer> {
            let l = &weights.layers[i];
            let attn_in = importance(Some(i), &|li| &li.attn_in);
            let o_in = importance(Some(i), &|li| &li.o_in);
            let ffn = match &l.ffn {
                FeedForward::Dense(m) => PackedFfn::Dense(pack_mlp(m, i, 0)?),
                FeedForward::Moe(m) => PackedFfn::Moe(PackedMoe {
                    router: m.router.clone(),
                    experts: m
                        .experts
                        .iter()
                        .enumerate()
                        .map(|(j, e)| pack_mlp(e, i, j))
                        .collect::<Result<_>>()?,
                    shared: m
                        .shared_expert
                        .as_ref()
                        .map(|s| pack_mlp(s, i, m.experts.len()))
                        .transpose()?,
                    shared_gate: m.shared_expert_gate.as_ref().map(|g| g.data.clone()),
                    top_k: config.experts_per_token,
                    renormalize: config.architecture == Architecture::Mixtral
                        || config.norm_topk_prob,
                }),
            };
            let n = |w: &str| names::layer(i, w);
            Ok(Layer {
                attn_norm: l.attn_norm.clone(),
                q: pack(&n("q"), &l.q, TensorRole::AttnQ, Some(i), 0, attn_in)?,
                k: pack(&n("k"), &l.k, TensorRole::AttnK, Some(i), 0, attn_in)?,
                v: pack(&n("v"), &l.v, TensorRole::AttnV, Some(i), 0, attn_in)?,
                o: pack(&n("o"), &l.o, TensorRole::AttnOutput, Some(i), 0, o_in)?,
                q_bias: l.q_bias.clone(),
                k_bias: l.k_bias.clone(),
                v_bias: l.v_bias.clone(),
                q_norm: l.q_norm.clone(),
                k_norm: l.k_norm.clone(),
                ffn_norm: l.ffn_norm.clone(),
                ffn,
            })
        };
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
                    *lock(&embed_slot) = Some(pack(
                        names::EMBED,
                        &weights.embed,
                        embed_role,
                        None,
                        0,
                        None,
                    ))
                }
                1 => {
                    *lock(&head_slot) = weights
                        .lm_head
                        .as_ref()
                        .map(|h| pack(names::LM_HEAD, h, TensorRole::LmHead, None, 0, head_imp))
                }
                j if j < n_jobs => *lock(&layer_slots[j - 2]) = Some(pack_layer(j - 2)),
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
        let mut decoder = Self::assemble(
            config,
            precision,
            eos,
            pool,
            Parts {
                embed,
                lm_head,
                final_norm: weights.final_norm.clone(),
                layers,
            },
            n_params,
            started.elapsed().as_secs_f64(),
            pack_cache,
            &options,
        );
        decoder.calibration_s = calibration_s;
        Ok(decoder)
    }

    /// A warm start: the decoder from the pack cache alone, without the model's weights
    /// (`config` and `eos` from the model's metadata); `Ok(None)` when the cache holds no
    /// valid entry for `source` in `options.precision` (then load the weights and call
    /// [`KwkDecoder::from_weights`], which packs and writes it).
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
                Self::from_cached(config, eos, cached, source, options, started).map(Some)
            }
            None => Ok(None),
        }
    }

    /// Builds the decoder from the tensors and float vectors of a cache entry.
    fn from_cached(
        config: &ModelConfig,
        eos: Vec<u32>,
        mut c: CachedModel,
        source: &Path,
        options: DecoderOptions,
        started: Instant,
    ) -> Result<Self> {
        let path = c.path.clone();
        let bad = |what: String| {
            KwkError::bad_model(
                &path,
                format!(
                    "pack cache entry for {} does not fit the model: {what}; delete it \
                     (kwk-eval cache clear)",
                    source.display()
                ),
            )
        };
        let d = config.hidden_size;
        let (qd, kvd) = (
            config.n_heads * config.head_dim,
            config.n_kv_heads * config.head_dim,
        );
        let tensor = |c: &mut CachedModel, name: &str, rows: usize, cols: usize| {
            let t = c
                .take_tensor(name)
                .ok_or_else(|| bad(format!("no tensor {name}")))?;
            if (t.rows(), t.cols()) != (rows, cols) {
                return Err(bad(format!(
                    "{name} is {}x{}, the model needs {rows}x{cols}",
                    t.rows(),
                    t.cols()
                )));
            }
            Ok(t)
        };
        let mut floats_n = 0u64;
        let mut floats = |c: &mut CachedModel, name: &str, len: Option<usize>| {
            let v = c.take_floats(name);
            if let (Some(v), Some(n)) = (&v, len) {
                if v.len() != n {
                    return Err(bad(format!("{name} has {} values, expected {n}", v.len())));
                }
            }
            floats_n += v.as_ref().map_or(0, |v| v.len() as u64);
            Ok(v)
        };
        let need = |v: Option<Vec<f32>>, name: &str| v.ok_or_else(|| bad(format!("no {name}")));
        let tied = !c.has_tensor(names::LM_HEAD);
        let embed = tensor(&mut c, names::EMBED, config.vocab_size, d)?;
        let lm_head = if tied {
            None
        } else {
            Some(tensor(&mut c, names::LM_HEAD, config.vocab_size, d)?)
        };
        let final_norm = need(floats(&mut c, names::FINAL_NORM, Some(d))?, "final norm")?;
        let mut layers = Vec::with_capacity(config.n_layers);
        for i in 0..config.n_layers {
            let n = |w: &str| names::layer(i, w);
            let mlp = |c: &mut CachedModel, j: usize| -> Result<PackedMlp> {
                let m = |w: &str| names::mlp(i, j, w);
                let gate = c
                    .take_tensor(&m("gate"))
                    .ok_or_else(|| bad(format!("no tensor {}", m("gate"))))?;
                let ffn = gate.rows();
                if gate.cols() != d {
                    return Err(bad(format!("{} has {} columns", m("gate"), gate.cols())));
                }
                Ok(PackedMlp {
                    gate,
                    up: tensor(c, &m("up"), ffn, d)?,
                    down: tensor(c, &m("down"), d, ffn)?,
                })
            };
            let moe = c.has_floats(&n("router"));
            let ffn = if moe {
                let ne = config.n_experts;
                let router = need(floats(&mut c, &n("router"), Some(ne * d))?, "router")?;
                let experts = (0..ne).map(|j| mlp(&mut c, j)).collect::<Result<_>>()?;
                let shared = if c.has_tensor(&names::mlp(i, ne, "gate")) {
                    Some(mlp(&mut c, ne)?)
                } else {
                    None
                };
                PackedFfn::Moe(PackedMoe {
                    router: crate::model::Tensor::new(vec![ne, d], router),
                    experts,
                    shared,
                    shared_gate: floats(&mut c, &n("shared_gate"), Some(d))?,
                    top_k: config.experts_per_token,
                    renormalize: config.architecture == Architecture::Mixtral
                        || config.norm_topk_prob,
                })
            } else {
                PackedFfn::Dense(mlp(&mut c, 0)?)
            };
            layers.push(Layer {
                attn_norm: need(floats(&mut c, &n("attn_norm"), Some(d))?, "attn_norm")?,
                q: tensor(&mut c, &n("q"), qd, d)?,
                k: tensor(&mut c, &n("k"), kvd, d)?,
                v: tensor(&mut c, &n("v"), kvd, d)?,
                o: tensor(&mut c, &n("o"), d, qd)?,
                q_bias: floats(&mut c, &n("q_bias"), Some(qd))?,
                k_bias: floats(&mut c, &n("k_bias"), Some(kvd))?,
                v_bias: floats(&mut c, &n("v_bias"), Some(kvd))?,
                q_norm: floats(&mut c, &n("q_norm"), Some(config.head_dim))?,
                k_norm: floats(&mut c, &n("k_norm"), Some(config.head_dim))?,
                ffn_norm: need(floats(&mut c, &n("ffn_norm"), Some(d))?, "ffn_norm")?,
                ffn,
            });
        }
        if c.left_over() > 0 {
            return Err(bad(format!(
                "{} entries the model does not have",
                c.left_over()
            )));
        }
        // Parameters: every packed linear (the tied table once) and every float vector.
        let mut n_params = floats_n;
        let mut all: Vec<&dyn PackedLinear> = vec![embed.as_ref()];
        all.extend(lm_head.iter().map(|h| h.as_ref()));
        for l in &layers {
            all.extend(l.linears());
        }
        n_params += all
            .iter()
            .map(|t| (t.rows() * t.cols()) as u64)
            .sum::<u64>();
        let pool = ThreadPool::new(options.threads);
        Ok(Self::assemble(
            config,
            options.precision,
            eos,
            pool,
            Parts {
                embed,
                lm_head,
                final_norm,
                layers,
            },
            n_params,
            started.elapsed().as_secs_f64(),
            Some(c.outcome()),
            &options,
        ))
    }

    /// The decoder around packed parts.
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        config: &ModelConfig,
        precision: Precision,
        eos: Vec<u32>,
        pool: ThreadPool,
        parts: Parts,
        n_params: u64,
        pack_s: f64,
        pack_cache: Option<PackOutcome>,
        options: &DecoderOptions,
    ) -> Self {
        let Parts {
            embed,
            lm_head,
            final_norm,
            layers,
        } = parts;
        let mut weight_bytes = embed.bytes() as u64
            + lm_head.as_ref().map(|h| h.bytes() as u64).unwrap_or(0)
            + 4 * final_norm.len() as u64;
        for l in &layers {
            weight_bytes += l.bytes();
        }
        let rope = rope::Rope::new(
            config.head_dim,
            config.rope_theta as f64,
            &config.rope_scaling,
            options.max_cache_len,
        );
        let kv = KvCache::new(
            config.n_layers,
            config.n_kv_heads,
            config.head_dim,
            options.max_cache_len,
        );
        KwkDecoder {
            config: config.clone(),
            precision,
            max_cache_len: options.max_cache_len,
            pool,
            embed,
            lm_head,
            final_norm,
            layers,
            rope,
            kv,
            pos: 0,
            eos,
            weight_bytes,
            n_params,
            pack_s,
            calibration_s: 0.0,
            pack_cache,
            x_buf: Vec::new(),
            scratch: Scratch::default(),
        }
    }

    /// Per-channel second moments of every linear's input over `tokens`, run in windows of
    /// `window` tokens from an empty cache (calibration). An expert no token was routed to
    /// gets `fallback`'s estimate for its `down` input.
    pub fn activation_stats(
        &mut self,
        tokens: &[u32],
        window: usize,
        fallback: &ActivationStats,
    ) -> Result<ActivationStats> {
        if tokens.is_empty() || window == 0 {
            return Err(KwkError::InvalidArgument(
                "calibration needs at least one token and a window of at least one".into(),
            ));
        }
        let n_layers = self.layers.len();
        self.scratch.record = Some(vec![layers::LayerRecord::default(); n_layers]);
        self.scratch.head_record = Some((Vec::new(), 0));
        let mut run = || -> Result<()> {
            for w in tokens.chunks(window.min(self.max_cache_len)) {
                crate::interrupt::check()?;
                self.reset();
                // Only the last position's logits: the statistics are taken inside.
                self.forward(w, w.len() - 1)?;
            }
            Ok(())
        };
        let ran = run();
        let records = PassRecords {
            layers: self.scratch.record.take().unwrap_or_default(),
            head: self.scratch.head_record.take(),
        };
        self.reset();
        ran?;
        Ok(records.stats(fallback))
    }

    /// The Hessians `Σ x xᵀ` of every linear input over `tokens` (run in windows of
    /// `window` tokens from an empty cache, as [`Self::activation_stats`]), one layer at a
    /// time: the residual stream of every calibration token is kept (`tokens × hidden`
    /// float32) and pushed through layer 0, then 1, ...; after each layer `each(layer,
    /// hessians)` gets that layer's Hessians, which are then dropped. Peak memory: the
    /// residual streams plus one layer's Hessians (f64) and what `each` holds. Returns the
    /// sums of squares of the same pass ([`Self::activation_stats`]'s, the same values).
    pub(crate) fn layer_hessians(
        &mut self,
        tokens: &[u32],
        window: usize,
        each: &mut dyn FnMut(usize, LayerGrams) -> Result<()>,
    ) -> Result<PassRecords> {
        if tokens.is_empty() || window == 0 {
            return Err(KwkError::InvalidArgument(
                "calibration needs at least one token and a window of at least one".into(),
            ));
        }
        let vocab = self.config.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(KwkError::InvalidArgument(format!(
                "calibration token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        let d = self.config.hidden_size;
        let win = window.min(self.max_cache_len);
        let mut streams: Vec<Vec<f32>> = tokens
            .chunks(win)
            .map(|w| {
                let mut x = vec![0f32; w.len() * d];
                for (t, &id) in w.iter().enumerate() {
                    self.embed
                        .dequantize_row(id as usize, &mut x[t * d..(t + 1) * d]);
                }
                x
            })
            .collect();
        let n_layers = self.layers.len();
        let mut pass = PassRecords {
            layers: Vec::with_capacity(n_layers),
            head: None,
        };
        let mut run = || -> Result<()> {
            for li in 0..n_layers {
                crate::interrupt::check()?;
                let mut records = vec![layers::LayerRecord::default(); n_layers];
                records[li].gram = Some(LayerGrams::default());
                self.scratch.record = Some(records);
                for x in streams.iter_mut() {
                    let mut pos = 0;
                    for chunk in x.chunks_mut(MICRO_BATCH * d) {
                        self.layers[li].forward(
                            &self.config,
                            &self.pool,
                            &self.rope,
                            &mut self.kv,
                            li,
                            pos,
                            chunk,
                            &mut self.scratch,
                        );
                        pos += chunk.len() / d;
                    }
                }
                let mut records = self.scratch.record.take().unwrap_or_default();
                let mut record = records.swap_remove(li);
                let mut grams = record.gram.take().unwrap_or_default();
                pass.layers.push(record);
                for h in [&mut grams.attn_in, &mut grams.o_in, &mut grams.ffn_in]
                    .into_iter()
                    .chain(grams.down_in.iter_mut())
                {
                    layers::mirror_gram(h);
                }
                each(li, grams)?;
            }
            // lm_head's input: the final norm of every stream.
            let mut head = (Vec::new(), 0u64);
            for x in &streams {
                let mut xn = x.clone();
                let eps = self.config.rms_norm_eps;
                layers::rms_norm_rows(&self.pool, &mut xn, &self.final_norm, eps);
                layers::accumulate_squares(&mut head.0, &xn, d);
                head.1 += (x.len() / d) as u64;
            }
            pass.head = Some(head);
            Ok(())
        };
        let ran = run();
        layers::release_gram_scratch();
        self.reset();
        ran.map(|()| pass)
    }

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

    /// The KV cache's element type (float32 in every format).
    pub fn kv_cache_type(&self) -> &'static str {
        "f32"
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
        for (t, &id) in tokens.iter().enumerate() {
            self.embed
                .dequantize_row(id as usize, &mut x[t * d..(t + 1) * d]);
        }
        let scratch = &mut self.scratch;
        for (li, layer) in self.layers.iter().enumerate() {
            layer.forward(
                &self.config,
                &self.pool,
                &self.rope,
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
        acts.prepare(&self.pool, &xn, d, [head.input_kind()]);
        let y = OutputMatrix::new(&mut out[base..], rows, vocab);
        layers::matmuls(&self.pool, &[(head, acts.get(&xn, head.input_kind()), &y)]);
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

/// Locks `m`, ignoring poisoning (a panicking job re-raises its panic in `run` anyway).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The packed parts a decoder runs on.
struct Parts {
    embed: Box<dyn PackedLinear>,
    lm_head: Option<Box<dyn PackedLinear>>,
    final_norm: Vec<f32>,
    layers: Vec<Layer>,
}

/// Names of the entries of a pack-cache section.
mod names {
    /// The embedding table (the output projection too when tied).
    pub const EMBED: &str = "embed";
    pub const LM_HEAD: &str = "lm_head";
    pub const FINAL_NORM: &str = "final_norm";
    /// `blk.I.WHAT` (q, k, v, o, attn_norm, ffn_norm, biases, q/k norms, router).
    pub fn layer(i: usize, what: &str) -> String {
        format!("blk.{i}.{what}")
    }
    /// `blk.I.mlp.J.WHAT`: MLP `J` of layer `I` (0 when dense; experts, then the shared
    /// expert).
    pub fn mlp(i: usize, j: usize, what: &str) -> String {
        format!("blk.{i}.mlp.{j}.{what}")
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
fn put_layer_floats(s: &mut PackSession, i: usize, l: &crate::model::LayerWeights) {
    {
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
}

fn count_params(w: &ModelWeights) -> u64 {
    let mut n = (w.embed.data.len() + w.final_norm.len()) as u64;
    n += w.lm_head.as_ref().map(|t| t.data.len()).unwrap_or(0) as u64;
    n + w.layers.iter().map(layer_params).sum::<u64>()
}

/// Parameters of one layer: matrices, norms, biases, routers.
fn layer_params(l: &crate::model::LayerWeights) -> u64 {
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

#[cfg(test)]
mod tests;

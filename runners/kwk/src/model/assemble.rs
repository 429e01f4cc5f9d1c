//! The source-independent assembly of [`ModelWeights`]: [`assemble_weights`] asks a
//! [`WeightSource`] (safetensors, GGUF, tensors in memory) for each tensor by its role
//! ([`WeightName`]) and the shape the config implies, so every source checks shapes the
//! same way, refuses non-finite weights, and names the file and tensor in errors.
//! Layers are assembled in parallel (rayon).

use super::config::ModelConfig;
#[cfg(doc)]
use super::names::hf_norm_offset;
use super::names::{requires_qk_norm, requires_qkv_bias, LayerTensor, WeightName};
use super::{FeedForward, LayerWeights, Mlp, ModelWeights, MoeBlock, PostNorms, Tensor};
use crate::error::{KwkError, Result};
use rayon::prelude::*;
use std::path::Path;

/// A file format the master weights can be read from.
pub(crate) trait WeightSource: Sync {
    /// The file (or folder) errors about missing tensors should name.
    fn path(&self) -> &Path;
    /// The name the tensor has in this source, for error messages.
    fn name_of(&self, name: WeightName) -> String;
    /// The tensor converted to float32, row-major with Hugging Face's `[out, in]` layout and
    /// rope order, or `None` when the source does not hold it. `shape` is what the config
    /// implies; a tensor of another shape is a `BadModel` error naming file and tensor.
    fn load(&self, name: WeightName, shape: &[usize]) -> Result<Option<Tensor>>;
    /// The name of the tensor [`WeightSource::load`] found for `name` (where a source has
    /// several spellings, the one present), for errors about its values.
    fn found_name(&self, name: WeightName) -> String {
        self.name_of(name)
    }
    /// What to add to every value of tensor `name` to get the weight kwk multiplies by
    /// (Hugging Face's Gemma 3 norms store `w` for `1 + w`: [`hf_norm_offset`]); 0 for
    /// sources that store the multiplier itself (GGUF).
    fn norm_offset(&self, _name: WeightName) -> f32 {
        0.0
    }
}

/// How many of `data` are NaN or ±Inf. Branch-free over fixed-size chunks, so it
/// vectorises: a scan costs far less than the conversion that produced the data.
pub(crate) fn non_finite_count(data: &[f32]) -> usize {
    const LANES: usize = 16;
    let mut counts = [0u32; LANES];
    let chunks = data.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (n, v) in counts.iter_mut().zip(c) {
            *n += u32::from(!v.is_finite());
        }
    }
    // Each lane counts at most len / 16 < 2^32 values for any slice up to 2^36 elements;
    // summed in usize.
    let mut total: usize = counts.iter().map(|&n| n as usize).sum();
    total += tail.iter().filter(|v| !v.is_finite()).count();
    total
}

/// `src.load`, refusing a tensor holding NaN or ±Inf: every weight the decoder, the
/// packers and the quantizers see passes through here, so a damaged or overflowed model
/// is an error naming the tensor and the count instead of numbers that hide it (a
/// softmax or a quantizer's scale can turn a non-finite weight into finite output).
fn load_finite(
    src: &dyn WeightSource,
    name: WeightName,
    shape: &[usize],
) -> Result<Option<Tensor>> {
    let mut t = src.load(name, shape)?;
    let offset = src.norm_offset(name);
    if let Some(t) = t.as_mut().filter(|_| offset != 0.0) {
        t.data.iter_mut().for_each(|v| *v += offset);
    }
    if let Some(t) = &t {
        let bad = non_finite_count(&t.data);
        if bad > 0 {
            return Err(KwkError::bad_model(
                src.path(),
                format!(
                    "tensor '{}' has {bad} non-finite value{} (NaN/Inf); the model is damaged \
                     or was converted with overflow — re-convert it",
                    src.found_name(name),
                    if bad == 1 { "" } else { "s" }
                ),
            ));
        }
    }
    Ok(t)
}

pub(crate) fn require(src: &dyn WeightSource, name: WeightName, shape: &[usize]) -> Result<Tensor> {
    load_finite(src, name, shape)?.ok_or_else(|| {
        KwkError::bad_model(
            src.path(),
            format!(
                "tensor '{}' is missing (expected shape {shape:?})",
                src.name_of(name)
            ),
        )
    })
}

pub(crate) fn require_vec(
    src: &dyn WeightSource,
    name: WeightName,
    len: usize,
) -> Result<Vec<f32>> {
    Ok(require(src, name, &[len])?.data)
}

fn optional_vec(src: &dyn WeightSource, name: WeightName, len: usize) -> Result<Option<Vec<f32>>> {
    Ok(load_finite(src, name, &[len])?.map(|t| t.data))
}

fn load_mlp(
    src: &dyn WeightSource,
    layer: usize,
    names: [LayerTensor; 3],
    d: usize,
    ffn: usize,
) -> Result<Mlp> {
    let [g, u, dn] = names;
    Ok(Mlp {
        gate: require(src, WeightName::Layer(layer, g), &[ffn, d])?,
        up: require(src, WeightName::Layer(layer, u), &[ffn, d])?,
        down: require(src, WeightName::Layer(layer, dn), &[d, ffn])?,
    })
}

pub(crate) fn assemble_layer(
    src: &dyn WeightSource,
    c: &ModelConfig,
    l: usize,
) -> Result<LayerWeights> {
    use LayerTensor as T;
    let d = c.hidden_size;
    let q_dim = c.n_heads * c.head_dim;
    let kv_dim = c.n_kv_heads * c.head_dim;
    let name = |t| WeightName::Layer(l, t);

    let needs_bias = requires_qkv_bias(c.architecture);
    let bias = |t, len| -> Result<Option<Vec<f32>>> {
        if needs_bias {
            require_vec(src, name(t), len).map(Some)
        } else {
            optional_vec(src, name(t), len)
        }
    };
    let needs_qk_norm = requires_qk_norm(c.architecture);
    let qk_norm = |t| -> Result<Option<Vec<f32>>> {
        if needs_qk_norm {
            require_vec(src, name(t), c.head_dim).map(Some)
        } else {
            optional_vec(src, name(t), c.head_dim)
        }
    };

    let ffn = if c.architecture.is_moe() {
        let ffn = c.moe_intermediate_size;
        let experts = (0..c.n_experts)
            .map(|e| {
                load_mlp(
                    src,
                    l,
                    [T::ExpertGate(e), T::ExpertUp(e), T::ExpertDown(e)],
                    d,
                    ffn,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let (shared_expert, shared_expert_gate) = if c.shared_expert_intermediate_size > 0 {
            let s = c.shared_expert_intermediate_size;
            (
                Some(load_mlp(
                    src,
                    l,
                    [T::SharedGate, T::SharedUp, T::SharedDown],
                    d,
                    s,
                )?),
                Some(require(src, name(T::SharedExpertGate), &[1, d])?),
            )
        } else {
            (None, None)
        };
        FeedForward::Moe(MoeBlock {
            router: require(src, name(T::Router), &[c.n_experts, d])?,
            experts,
            shared_expert,
            shared_expert_gate,
        })
    } else {
        FeedForward::Dense(load_mlp(
            src,
            l,
            [T::Gate, T::Up, T::Down],
            d,
            c.intermediate_size,
        )?)
    };

    Ok(LayerWeights {
        attn_norm: require_vec(src, name(T::AttnNorm), d)?,
        q: require(src, name(T::Q), &[q_dim, d])?,
        k: require(src, name(T::K), &[kv_dim, d])?,
        v: require(src, name(T::V), &[kv_dim, d])?,
        o: require(src, name(T::O), &[d, q_dim])?,
        q_bias: bias(T::QBias, q_dim)?,
        k_bias: bias(T::KBias, kv_dim)?,
        v_bias: bias(T::VBias, kv_dim)?,
        q_norm: qk_norm(T::QNorm)?,
        k_norm: qk_norm(T::KNorm)?,
        ffn_norm: require_vec(src, name(T::FfnNorm), d)?,
        ffn,
    })
}

/// The norms after attention and after the FFN of layer `l` (Gemma 3), required.
pub(crate) fn assemble_post_norms(
    src: &dyn WeightSource,
    c: &ModelConfig,
    l: usize,
) -> Result<PostNorms> {
    let d = c.hidden_size;
    Ok(PostNorms {
        attn: require_vec(src, WeightName::Layer(l, LayerTensor::PostAttnNorm), d)?,
        ffn: require_vec(src, WeightName::Layer(l, LayerTensor::PostFfnNorm), d)?,
    })
}

/// Every layer's [`PostNorms`] when the architecture has them (Gemma 3), else empty.
pub(crate) fn assemble_all_post_norms(
    src: &dyn WeightSource,
    c: &ModelConfig,
) -> Result<Vec<PostNorms>> {
    if c.gemma3.is_none() {
        return Ok(Vec::new());
    }
    (0..c.n_layers)
        .map(|l| assemble_post_norms(src, c, l))
        .collect()
}

/// Builds [`ModelWeights`] from `src`, checking every tensor's shape against `config`.
/// Layers load in parallel; the first error (in layer order) is returned.
pub(crate) fn assemble_weights(
    src: &dyn WeightSource,
    config: &ModelConfig,
) -> Result<ModelWeights> {
    let d = config.hidden_size;
    let (embed, rest) = rayon::join(
        || require(src, WeightName::Embed, &[config.vocab_size, d]),
        || -> Result<_> {
            // Every layer's result is kept and the first error taken in layer order: a
            // parallel `collect` into `Result` returns whichever error a thread met first,
            // so the message named layer 0 or layer 1 from run to run.
            let layers = (0..config.n_layers)
                .into_par_iter()
                .map(|l| assemble_layer(src, config, l))
                .collect::<Vec<Result<_>>>()
                .into_iter()
                .collect::<Result<Vec<_>>>()?;
            let final_norm = require_vec(src, WeightName::FinalNorm, d)?;
            let lm_head = if config.tie_word_embeddings {
                None
            } else {
                Some(require(src, WeightName::LmHead, &[config.vocab_size, d])?)
            };
            Ok((layers, final_norm, lm_head))
        },
    );
    let embed = embed?;
    let (layers, final_norm, lm_head) = rest?;
    Ok(ModelWeights {
        embed,
        layers,
        final_norm,
        lm_head,
        post_norms: assemble_all_post_norms(src, config)?,
    })
}

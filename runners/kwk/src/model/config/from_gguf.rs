//! GGUF metadata (`<arch>.*` keys, llama.cpp's `src/llama-arch.cpp` names) read into a
//! [`ModelConfig`], and Llama 3.x rope scaling recognised from `rope_freqs.weight`.

use super::{Architecture, Gemma3Params, ModelConfig, RopeScaling};
use crate::error::{KwkError, Result};
use crate::format::ggml_blocks::dequantize;
use crate::gguf::GgufFile;

/// Reads `<arch>.*` keys, naming the file and key in errors.
struct ArchKeys<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl ArchKeys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn usize_opt(&self, k: &str) -> Result<Option<usize>> {
        Ok(self.file.get_u64(&self.key(k))?.map(|v| v as usize))
    }

    fn usize(&self, k: &str) -> Result<usize> {
        self.usize_opt(k)?.ok_or_else(|| {
            KwkError::bad_model(
                self.file.path(),
                format!("metadata key '{}' is missing", self.key(k)),
            )
        })
    }

    fn f32_opt(&self, k: &str) -> Result<Option<f32>> {
        self.file.get_f32(&self.key(k))
    }
}

/// The `ModelConfig` a GGUF file describes.
pub fn config_from_gguf(file: &GgufFile) -> Result<ModelConfig> {
    let path = file.path();
    let arch = file.get_str("general.architecture")?.ok_or_else(|| {
        KwkError::bad_model(path, "metadata key 'general.architecture' is missing")
    })?;
    let keys = ArchKeys { file, arch };
    let n_experts = keys.usize_opt("expert_count")?.unwrap_or(0);
    let architecture = Architecture::from_gguf_arch(arch, n_experts > 0).ok_or_else(|| {
        KwkError::Unsupported(format!(
            "{}: GGUF architecture '{arch}'; kwk runs llama (incl. Mistral, Mixtral), \
             qwen2, qwen3, qwen2moe, qwen3moe and gemma3",
            path.display()
        ))
    })?;

    let hidden_size = keys.usize("embedding_length")?;
    let n_layers = keys.usize("block_count")?;
    let n_heads = keys.usize("attention.head_count")?;
    let n_kv_heads = keys
        .usize_opt("attention.head_count_kv")?
        .unwrap_or(n_heads);
    if hidden_size == 0
        || n_layers == 0
        || n_heads == 0
        || n_kv_heads == 0
        || n_heads % n_kv_heads != 0
    {
        return Err(KwkError::bad_model(
            path,
            format!(
                "embedding_length {hidden_size}, block_count {n_layers}, head_count {n_heads} \
                 and head_count_kv {n_kv_heads} must be positive, with head_count a multiple \
                 of head_count_kv"
            ),
        ));
    }
    let head_dim = match keys.usize_opt("attention.key_length")? {
        Some(h) => h,
        None if hidden_size % n_heads == 0 => hidden_size / n_heads,
        None => {
            return Err(KwkError::bad_model(
                path,
                format!("no '{arch}.attention.key_length' and embedding_length is not a multiple of head_count"),
            ))
        }
    };
    if let Some(v) = keys.usize_opt("attention.value_length")? {
        if v != head_dim {
            return Err(KwkError::Unsupported(format!(
                "{}: value head size {v} differs from key head size {head_dim}",
                path.display()
            )));
        }
    }
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(KwkError::bad_model(
            path,
            format!("head size {head_dim} must be positive and even"),
        ));
    }
    if let Some(rot) = keys.usize_opt("rope.dimension_count")? {
        if rot != head_dim {
            return Err(KwkError::Unsupported(format!(
                "{}: rope rotates {rot} of {head_dim} head dimensions; kwk implements full rotary only",
                path.display()
            )));
        }
    }

    let token_embd = file.tensor("token_embd.weight");
    let vocab_size = match keys.usize_opt("vocab_size")? {
        Some(v) => v,
        None => match token_embd {
            Some(t) if t.dims.len() == 2 => t.dims[1] as usize,
            _ => {
                return Err(KwkError::bad_model(
                    path,
                    format!("no '{arch}.vocab_size' and no 2-D token_embd.weight to infer it from"),
                ))
            }
        },
    };
    let rms_norm_eps = keys
        .f32_opt("attention.layer_norm_rms_epsilon")?
        .ok_or_else(|| {
            KwkError::bad_model(
                path,
                format!("metadata key '{arch}.attention.layer_norm_rms_epsilon' is missing"),
            )
        })?;
    // llama.cpp's default freq_base is 10000 (llama_hparams rope_freq_base_train).
    let rope_theta = keys.f32_opt("rope.freq_base")?.unwrap_or(10000.0);
    let max_position_embeddings = keys.usize("context_length")?;

    let (experts_per_token, moe_intermediate_size, shared, norm_topk_prob, intermediate_size);
    if architecture.is_moe() {
        experts_per_token = keys.usize("expert_used_count")?;
        if n_experts == 0 || experts_per_token == 0 || experts_per_token > n_experts {
            return Err(KwkError::bad_model(
                path,
                format!("expert_used_count {experts_per_token} must be in 1..={n_experts} (expert_count)"),
            ));
        }
        if architecture == Architecture::Mixtral {
            intermediate_size = keys.usize("feed_forward_length")?;
            moe_intermediate_size = intermediate_size;
        } else {
            moe_intermediate_size = keys.usize("expert_feed_forward_length")?;
            intermediate_size = keys
                .usize_opt("feed_forward_length")?
                .unwrap_or(moe_intermediate_size);
        }
        shared = if architecture == Architecture::Qwen2Moe {
            keys.usize("expert_shared_feed_forward_length")?
        } else {
            0
        };
        // As llama.cpp's graphs: llama (Mixtral) and qwen3moe renormalise the top-k
        // weights, qwen2moe does not (src/models/{llama,qwen2moe,qwen3moe}.cpp).
        norm_topk_prob = architecture != Architecture::Qwen2Moe;
    } else {
        experts_per_token = 0;
        moe_intermediate_size = 0;
        shared = 0;
        norm_topk_prob = false;
        intermediate_size = keys.usize("feed_forward_length")?;
    }

    let rope_scaling = rope_scaling_from_gguf(file, &keys, rope_theta, head_dim)?;
    let gemma3 = if architecture == Architecture::Gemma3 {
        Some(gemma3_from_gguf(
            file,
            &keys,
            n_layers,
            hidden_size,
            n_heads,
            head_dim,
        )?)
    } else {
        None
    };
    // Gemma 3's window is per layer (in `gemma3`), not the all-layers window.
    let sliding_window = keys
        .usize_opt("attention.sliding_window")?
        .filter(|&w| w > 0 && w < max_position_embeddings && gemma3.is_none());

    let tok = |k: &str| file.get_u32(&format!("tokenizer.ggml.{k}"));
    let mut eos_token_ids: Vec<u32> = tok("eos_token_id")?.into_iter().collect();
    if let Some(eot) = tok("eot_token_id")? {
        if !eos_token_ids.contains(&eot) {
            eos_token_ids.push(eot);
        }
    }

    let config = ModelConfig {
        architecture,
        hidden_size,
        intermediate_size,
        n_layers,
        n_heads,
        n_kv_heads,
        head_dim,
        vocab_size,
        rms_norm_eps,
        rope_theta,
        rope_scaling,
        max_position_embeddings,
        tie_word_embeddings: file.tensor("output.weight").is_none(),
        n_experts: if architecture.is_moe() { n_experts } else { 0 },
        experts_per_token,
        moe_intermediate_size,
        shared_expert_intermediate_size: shared,
        norm_topk_prob,
        sliding_window,
        bos_token_id: tok("bos_token_id")?,
        eos_token_ids,
        gemma3,
    };
    config.check_sizes(path, &|k| {
        format!("metadata key '{arch}.{}'", k.gguf_key(architecture))
    })?;
    Ok(config)
}

/// Gemma 3's details as llama.cpp reads them (`src/models/gemma3.cpp`): the window from
/// `gemma3.attention.sliding_window` (none: every layer global), the layer pattern from
/// `gemma3.attention.sliding_window_pattern` (a number, or one bool per layer; default 6),
/// the local RoPE base from `gemma3.rope.freq_base_swa` (default 10000), the query scale
/// `1/sqrt(head_dim)` (the converter does not store `query_pre_attn_scalar`; llama.cpp
/// uses `1/sqrt(embedding_length / head_count)` for the 62-layer 27B instead), and the
/// optional `gemma3.final_logit_softcapping`.
fn gemma3_from_gguf(
    file: &GgufFile,
    keys: &ArchKeys,
    n_layers: usize,
    hidden_size: usize,
    n_heads: usize,
    head_dim: usize,
) -> Result<Gemma3Params> {
    let window = keys.usize_opt("attention.sliding_window")?.unwrap_or(0);
    let pattern_key = keys.key("attention.sliding_window_pattern");
    let sliding_layers = if window == 0 {
        vec![false; n_layers]
    } else {
        match file.get(&pattern_key) {
            None => Gemma3Params::pattern_layers(n_layers, 6),
            Some(v) => match (v.as_u64(), v.as_array()) {
                (Some(p), _) => Gemma3Params::pattern_layers(n_layers, p as usize),
                (None, Some(a)) if a.len() >= n_layers => (0..n_layers)
                    .map(|l| a.get(l).and_then(|x| x.as_bool()))
                    .collect::<Option<Vec<bool>>>()
                    .ok_or_else(|| {
                        KwkError::bad_model(
                            file.path(),
                            format!("metadata key '{pattern_key}' should hold one bool per layer"),
                        )
                    })?,
                _ => {
                    return Err(KwkError::bad_model(
                        file.path(),
                        format!(
                            "metadata key '{pattern_key}' should be a number or {n_layers} bools"
                        ),
                    ))
                }
            },
        }
    };
    let query_pre_attn_scalar = if n_layers == 62 {
        (hidden_size / n_heads) as f32
    } else {
        head_dim as f32
    };
    Ok(Gemma3Params {
        query_pre_attn_scalar,
        sliding_window: window,
        rope_local_theta: keys.f32_opt("rope.freq_base_swa")?.unwrap_or(10000.0),
        sliding_layers,
        final_logit_softcapping: keys
            .f32_opt("final_logit_softcapping")?
            .filter(|&c| c != 0.0),
    })
}

/// llama3 rope factors per frequency, as `conversion/llama.py` computes them for
/// `rope_freqs.weight` (and as transformers' `_compute_llama3_parameters` applies them).
pub(crate) fn llama3_rope_factors(
    theta: f32,
    head_dim: usize,
    factor: f32,
    low: f32,
    high: f32,
    orig: usize,
) -> Vec<f32> {
    let low_wavelen = orig as f32 / low;
    let high_wavelen = orig as f32 / high;
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf((2 * i) as f32 / head_dim as f32);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (orig as f32 / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

fn rope_scaling_from_gguf(
    file: &GgufFile,
    keys: &ArchKeys,
    rope_theta: f32,
    head_dim: usize,
) -> Result<RopeScaling> {
    if let Some(kind) = file.get_str(&keys.key("rope.scaling.type"))? {
        if kind != "none" {
            return Ok(RopeScaling::Other(kind.to_string()));
        }
    }
    if let Some(s) = keys.f32_opt("rope.scale_linear")? {
        if s != 1.0 {
            return Ok(RopeScaling::Other(format!("linear (scale {s})")));
        }
    }
    let Some(info) = file.tensor("rope_freqs.weight") else {
        return Ok(RopeScaling::None);
    };
    if info.n_elements() != (head_dim / 2) as u64 {
        return Err(KwkError::bad_model(
            file.path(),
            format!(
                "tensor 'rope_freqs.weight' has {} values, expected head_dim/2 = {}",
                info.n_elements(),
                head_dim / 2
            ),
        ));
    }
    let mut freqs = vec![0f32; head_dim / 2];
    dequantize(info.ggml_type, file.tensor_bytes(info)?, &mut freqs).map_err(|e| {
        KwkError::bad_model(file.path(), format!("tensor 'rope_freqs.weight': {e}"))
    })?;
    if freqs.iter().all(|&f| f == 1.0) {
        return Ok(RopeScaling::None);
    }
    // The converter writes only the factors; recognise the parameters every Llama 3.x
    // release uses (low 1, high 4, original context 8192; factor 8 for 3.1, 32 for 3.2).
    let factor = freqs.iter().cloned().fold(f32::MIN, f32::max);
    let orig = file
        .get_u64(&keys.key("rope.scaling.original_context_length"))?
        .map(|v| v as usize)
        .unwrap_or(8192);
    let candidate = llama3_rope_factors(rope_theta, head_dim, factor, 1.0, 4.0, orig);
    let matches = candidate
        .iter()
        .zip(&freqs)
        .all(|(a, b)| (a - b).abs() <= 1e-4 * b.abs().max(1.0));
    Ok(if matches {
        RopeScaling::Llama3 {
            factor,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: orig,
        }
    } else {
        RopeScaling::Other("rope_freqs factors not matching llama3 (low 1, high 4)".into())
    })
}

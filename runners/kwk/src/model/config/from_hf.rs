//! A Hugging Face `config.json` read into a [`ModelConfig`], with `transformers`'
//! defaults and errors naming the file and key.

use super::{Architecture, Gemma3Params, ModelConfig, RopeScaling, MAX_CONFIG_JSON_BYTES};
use crate::error::{KwkError, Result};
use serde_json::{Map, Value};
use std::path::Path;

/// Reads typed keys of one JSON object and names the file and key in every error.
struct JsonKeys<'a> {
    path: &'a Path,
    obj: &'a Map<String, Value>,
}

impl<'a> JsonKeys<'a> {
    /// The value of `key`, treating JSON `null` as absent (HF writes `"sliding_window": null`).
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn bad(&self, key: &str, want: &str, got: &Value) -> KwkError {
        KwkError::bad_model(
            self.path,
            format!("config key '{key}' should be {want}, found {got}"),
        )
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| self.bad(key, "a non-negative integer", v)),
        }
    }

    fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| {
            KwkError::bad_model(
                self.path,
                format!("config key '{key}' is missing; a model folder's config.json needs it"),
            )
        })
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.bad(key, "a number", v)),
        }
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.bad(key, "true or false", v)),
        }
    }

    fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.bad(key, "a string", v)),
        }
    }

    fn opt_token_id(&self, key: &str) -> Result<Option<u32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| self.bad(key, "a token id", v)),
        }
    }

    /// `eos_token_id` may be one id or a list of ids (Llama 3.x instruct models).
    fn token_id_list(&self, key: &str) -> Result<Vec<u32>> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|x| u32::try_from(x).ok())
                        .ok_or_else(|| self.bad(key, "a list of token ids", v))
                })
                .collect(),
            Some(_) => Ok(self.opt_token_id(key)?.into_iter().collect()),
        }
    }
}

impl ModelConfig {
    /// Reads a Hugging Face `config.json` (llama, mistral, qwen2, qwen3, mixtral, qwen2_moe,
    /// qwen3_moe). Missing required keys and wrongly typed values are `BadModel` errors
    /// naming the file and key; an unknown `model_type` is `Unsupported`.
    pub fn from_hf_config_json(path: &Path) -> Result<ModelConfig> {
        let len = crate::files::regular_metadata(path)
            .map_err(|e| KwkError::io(path, e))?
            .len();
        if len > MAX_CONFIG_JSON_BYTES {
            return Err(KwkError::bad_model(
                path,
                format!(
                    "config.json is {len} bytes, more than kwk's limit of {} MiB (real ones \
                     are a few kilobytes); is this the right file?",
                    MAX_CONFIG_JSON_BYTES >> 20
                ),
            ));
        }
        let text = crate::files::read_regular_to_string(path).map_err(|e| KwkError::io(path, e))?;
        Self::from_hf_config_str(&text, path)
    }

    /// Reads a Hugging Face config given as JSON text (e.g. `transformers`'
    /// `config.to_json_string()` of a model held in memory); `origin` names it in errors.
    pub fn from_hf_config_str(text: &str, origin: &Path) -> Result<ModelConfig> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| KwkError::bad_model(origin, format!("config is not valid JSON: {e}")))?;
        let obj = value
            .as_object()
            .ok_or_else(|| KwkError::bad_model(origin, "config is not a JSON object"))?;
        Self::from_hf_config_object(origin, obj)
    }

    pub(super) fn from_hf_config_object(
        path: &Path,
        obj: &Map<String, Value>,
    ) -> Result<ModelConfig> {
        let keys = JsonKeys { path, obj };
        let model_type = keys.opt_str("model_type")?.ok_or_else(|| {
            KwkError::bad_model(path, "config key 'model_type' is missing (e.g. \"llama\")")
        })?;
        let architecture = Architecture::from_hf_model_type(model_type).ok_or_else(|| {
            KwkError::Unsupported(format!(
                "{}: model_type '{model_type}'; kwk runs llama, mistral, qwen2, qwen3, \
                 mixtral, qwen2_moe, qwen3_moe and gemma3_text",
                path.display()
            ))
        })?;

        let hidden_size = keys.usize("hidden_size")?;
        let intermediate_size = keys.usize("intermediate_size")?;
        let n_layers = keys.usize("num_hidden_layers")?;
        let n_heads = keys.usize("num_attention_heads")?;
        let vocab_size = keys.usize("vocab_size")?;
        if hidden_size == 0 || n_heads == 0 || n_layers == 0 || vocab_size == 0 {
            return Err(KwkError::bad_model(
                path,
                "hidden_size, num_attention_heads, num_hidden_layers and vocab_size must be positive",
            ));
        }
        let n_kv_heads = keys.opt_usize("num_key_value_heads")?.unwrap_or(n_heads);
        if n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(KwkError::bad_model(
                path,
                format!(
                    "num_key_value_heads {n_kv_heads} must divide num_attention_heads {n_heads}"
                ),
            ));
        }
        let head_dim = match keys.opt_usize("head_dim")? {
            Some(h) => h,
            None => {
                if hidden_size % n_heads != 0 {
                    return Err(KwkError::bad_model(
                        path,
                        format!(
                            "config has no 'head_dim' and hidden_size {hidden_size} is not a \
                             multiple of num_attention_heads {n_heads}"
                        ),
                    ));
                }
                hidden_size / n_heads
            }
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(KwkError::bad_model(
                path,
                format!("head_dim {head_dim} must be a positive even number (rope rotates pairs)"),
            ));
        }

        // transformers' defaults: rms_norm_eps 1e-6, rope_theta 10000, max positions 2048
        // (LlamaConfig); the other configs use the same or always write the key.
        let rms_norm_eps = keys.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32;
        // transformers 5 writes `rope_parameters` ({"rope_type", "rope_theta", and the
        // scaling keys}) where older files have `rope_theta` and `rope_scaling`.
        let gemma = architecture == Architecture::Gemma3;
        let rope_parameters = Self::rope_parameters(&keys)?;
        // transformers 5 keeps Gemma 3's two rope settings under `rope_parameters`, one per
        // layer type; the global layers' is the model's rope.
        let rope_parameters = match rope_parameters {
            Some(p) if gemma && p.get("full_attention").is_some() => Some(Self::nested_object(
                &p,
                "rope_parameters",
                "full_attention",
            )?),
            other => other,
        };
        let rope_theta = match &rope_parameters {
            Some(p) => p.opt_f64("rope_theta")?,
            None => None,
        };
        let rope_theta = match rope_theta {
            Some(t) => t,
            // Gemma3TextConfig's default is 1e6.
            None if gemma => keys.opt_f64("rope_theta")?.unwrap_or(1_000_000.0),
            None => keys.opt_f64("rope_theta")?.unwrap_or(10000.0),
        } as f32;
        let max_position_embeddings = keys
            .opt_usize("max_position_embeddings")?
            .unwrap_or(if gemma { 131072 } else { 2048 });
        // Gemma3TextConfig ties the output to the embedding unless told otherwise.
        let tie_word_embeddings = keys.opt_bool("tie_word_embeddings")?.unwrap_or(gemma);
        let rope_scaling = match &rope_parameters {
            Some(p) => Self::rope_scaling_from_object(&keys, p)?,
            None => Self::rope_scaling_from_hf(&keys)?,
        };

        let (n_experts, experts_per_token, moe_intermediate_size, shared, norm_topk_prob) =
            match architecture {
                Architecture::Mixtral => {
                    let e = keys.usize("num_local_experts")?;
                    let k = keys.usize("num_experts_per_tok")?;
                    // Mixtral's router always renormalises the top-k softmax weights.
                    (e, k, intermediate_size, 0, true)
                }
                Architecture::Qwen2Moe | Architecture::Qwen3Moe => {
                    // transformers 5 writes qwen3_moe's count as `num_local_experts`.
                    let e = match keys.opt_usize("num_local_experts")? {
                        Some(e) if keys.get("num_experts").is_none() => e,
                        _ => keys.usize("num_experts")?,
                    };
                    let k = keys.usize("num_experts_per_tok")?;
                    let moe = keys.usize("moe_intermediate_size")?;
                    let shared = if architecture == Architecture::Qwen2Moe {
                        keys.usize("shared_expert_intermediate_size")?
                    } else {
                        0
                    };
                    // Qwen2MoeConfig defaults norm_topk_prob to false, Qwen3MoeConfig to true.
                    let default_norm = architecture == Architecture::Qwen3Moe;
                    let norm = keys.opt_bool("norm_topk_prob")?.unwrap_or(default_norm);
                    // Both classes can make some layers dense (`mlp_only_layers`,
                    // `decoder_sparse_step`); ModelConfig has one feed-forward kind for all
                    // layers, so such models are refused here rather than misloaded.
                    let step = keys.opt_usize("decoder_sparse_step")?.unwrap_or(1);
                    let mlp_only = keys
                        .get("mlp_only_layers")
                        .and_then(|v| v.as_array())
                        .map(|a| a.len())
                        .unwrap_or(0);
                    if step != 1 || mlp_only != 0 {
                        return Err(KwkError::Unsupported(format!(
                            "{}: dense layers inside a MoE model (decoder_sparse_step {step}, \
                             {mlp_only} mlp_only_layers); kwk needs every layer sparse",
                            path.display()
                        )));
                    }
                    (e, k, moe, shared, norm)
                }
                _ => (0, 0, 0, 0, false),
            };
        if architecture.is_moe()
            && (n_experts == 0 || experts_per_token == 0 || experts_per_token > n_experts)
        {
            return Err(KwkError::bad_model(
                path,
                format!(
                    "num_experts_per_tok {experts_per_token} must be between 1 and the number \
                     of experts {n_experts}"
                ),
            ));
        }

        // A window only matters when it is shorter than the positions the model supports;
        // qwen2/qwen3 write `sliding_window` but switch it off with `use_sliding_window`.
        let use_sliding_window = keys.opt_bool("use_sliding_window")?.unwrap_or(true);
        let sliding_window = match keys.opt_usize("sliding_window")? {
            Some(w) if use_sliding_window && w < max_position_embeddings && !gemma => Some(w),
            _ => None,
        };
        let gemma3 = if gemma {
            Some(Self::gemma3_from_hf(&keys, n_layers)?)
        } else {
            None
        };

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
            tie_word_embeddings,
            n_experts,
            experts_per_token,
            moe_intermediate_size,
            shared_expert_intermediate_size: shared,
            norm_topk_prob,
            sliding_window,
            bos_token_id: keys.opt_token_id("bos_token_id")?,
            eos_token_ids: keys.token_id_list("eos_token_id")?,
            gemma3,
        };
        config.check_sizes(path, &|k| {
            format!("config key '{}'", k.hf_key(architecture))
        })?;
        Ok(config)
    }

    /// `outer.key` as an object (named `outer_name.key` in errors).
    fn nested_object<'a>(
        outer: &JsonKeys<'a>,
        outer_name: &str,
        key: &str,
    ) -> Result<JsonKeys<'a>> {
        let v = outer.get(key).ok_or_else(|| {
            KwkError::bad_model(
                outer.path,
                format!("config key '{outer_name}.{key}' is missing"),
            )
        })?;
        let obj = v
            .as_object()
            .ok_or_else(|| outer.bad(&format!("{outer_name}.{key}"), "an object", v))?;
        Ok(JsonKeys {
            path: outer.path,
            obj,
        })
    }

    /// Gemma3TextConfig's own keys, with its defaults: `query_pre_attn_scalar` (256),
    /// `sliding_window` (4096), the local RoPE base (`rope_local_base_freq`, 10000, or
    /// transformers 5's `rope_parameters.sliding_attention.rope_theta`), the layer kinds
    /// (`layer_types`, else `sliding_window_pattern`, default 6),
    /// `final_logit_softcapping` (none). Refused: `attn_logit_softcapping` (Gemma 2's, not
    /// implemented), bidirectional attention (EmbeddingGemma), an activation other than
    /// tanh GELU, and a rope scaling on the local layers.
    fn gemma3_from_hf(keys: &JsonKeys, n_layers: usize) -> Result<Gemma3Params> {
        let unsupported = |what: String| {
            Err(KwkError::Unsupported(format!(
                "{}: {what}",
                keys.path.display()
            )))
        };
        if let Some(cap) = keys.opt_f64("attn_logit_softcapping")? {
            return unsupported(format!(
                "attn_logit_softcapping {cap} (Gemma 2's attention soft-capping) is not \
                 implemented"
            ));
        }
        if keys.opt_bool("use_bidirectional_attention")? == Some(true) {
            return unsupported(
                "use_bidirectional_attention (EmbeddingGemma's encoder attention) is not \
                 implemented; kwk runs causal Gemma 3"
                    .into(),
            );
        }
        let act = keys
            .opt_str("hidden_activation")?
            .or(keys.opt_str("hidden_act")?)
            .unwrap_or("gelu_pytorch_tanh");
        if act != "gelu_pytorch_tanh" {
            return unsupported(format!(
                "hidden_activation '{act}'; kwk's Gemma 3 runs gelu_pytorch_tanh only"
            ));
        }
        let local = match Self::rope_parameters(keys)? {
            Some(p) if p.get("sliding_attention").is_some() => Some(Self::nested_object(
                &p,
                "rope_parameters",
                "sliding_attention",
            )?),
            _ => None,
        };
        let local_theta = match &local {
            Some(l) => {
                if !matches!(Self::rope_scaling_from_object(keys, l)?, RopeScaling::None) {
                    return unsupported(
                        "a rope scaling on the sliding-window layers is not implemented".into(),
                    );
                }
                l.opt_f64("rope_theta")?
            }
            None => None,
        };
        let rope_local_theta = match local_theta {
            Some(t) => t,
            None => keys.opt_f64("rope_local_base_freq")?.unwrap_or(10000.0),
        } as f32;
        let sliding_window = keys.opt_usize("sliding_window")?.unwrap_or(4096);
        let sliding_layers = match keys.get("layer_types") {
            Some(v) => {
                let items = v
                    .as_array()
                    .filter(|a| a.len() == n_layers)
                    .ok_or_else(|| {
                        keys.bad(
                            "layer_types",
                            &format!("a list of {n_layers} layer types"),
                            v,
                        )
                    })?;
                items
                    .iter()
                    .map(|t| match t.as_str() {
                        Some("sliding_attention") => Ok(true),
                        Some("full_attention") => Ok(false),
                        _ => Err(keys.bad(
                            "layer_types",
                            "\"sliding_attention\" or \"full_attention\" items",
                            t,
                        )),
                    })
                    .collect::<Result<Vec<bool>>>()?
            }
            None => {
                let pattern = keys.opt_usize("sliding_window_pattern")?.unwrap_or(6);
                Gemma3Params::pattern_layers(n_layers, pattern)
            }
        };
        let query_pre_attn_scalar = keys.opt_f64("query_pre_attn_scalar")?.unwrap_or(256.0) as f32;
        if query_pre_attn_scalar.is_nan() || query_pre_attn_scalar <= 0.0 {
            return Err(KwkError::bad_model(
                keys.path,
                format!("config key 'query_pre_attn_scalar' is {query_pre_attn_scalar}; it must be positive"),
            ));
        }
        if sliding_window == 0 && sliding_layers.iter().any(|&s| s) {
            return Err(KwkError::bad_model(
                keys.path,
                "config key 'sliding_window' is 0 but some layers are sliding_attention",
            ));
        }
        Ok(Gemma3Params {
            query_pre_attn_scalar,
            sliding_window,
            rope_local_theta,
            sliding_layers,
            final_logit_softcapping: keys.opt_f64("final_logit_softcapping")?.map(|c| c as f32),
        })
    }

    /// transformers 5's `rope_parameters` object, when the config has one.
    fn rope_parameters<'a>(keys: &JsonKeys<'a>) -> Result<Option<JsonKeys<'a>>> {
        let Some(v) = keys.get("rope_parameters") else {
            return Ok(None);
        };
        let obj = v
            .as_object()
            .ok_or_else(|| keys.bad("rope_parameters", "null or an object", v))?;
        Ok(Some(JsonKeys {
            path: keys.path,
            obj,
        }))
    }

    /// `rope_scaling`: `null`, `{"rope_type": "llama3", ...}` (older files say `"type"`),
    /// or another kind kept as [`RopeScaling::Other`].
    fn rope_scaling_from_hf(keys: &JsonKeys) -> Result<RopeScaling> {
        let Some(v) = keys.get("rope_scaling") else {
            return Ok(RopeScaling::None);
        };
        let obj = v
            .as_object()
            .ok_or_else(|| keys.bad("rope_scaling", "null or an object", v))?;
        let inner = JsonKeys {
            path: keys.path,
            obj,
        };
        Self::rope_scaling_from_object(keys, &inner)
    }

    /// The scaling an object with `rope_type` (or `type`) describes: `rope_scaling`, or
    /// transformers 5's `rope_parameters` (whose `rope_type` is `"default"` when unscaled).
    fn rope_scaling_from_object(keys: &JsonKeys, inner: &JsonKeys) -> Result<RopeScaling> {
        let kind = match inner.opt_str("rope_type")? {
            Some(k) => k,
            None => inner.opt_str("type")?.ok_or_else(|| {
                KwkError::bad_model(keys.path, "config key 'rope_scaling' has no 'rope_type'")
            })?,
        };
        match kind {
            "default" => Ok(RopeScaling::None),
            "llama3" => {
                let need = |k: &str| {
                    inner.opt_f64(k)?.ok_or_else(|| {
                        KwkError::bad_model(
                            keys.path,
                            format!(
                                "config key 'rope_scaling.{k}' is missing (llama3 rope scaling)"
                            ),
                        )
                    })
                };
                Ok(RopeScaling::Llama3 {
                    factor: need("factor")? as f32,
                    low_freq_factor: need("low_freq_factor")? as f32,
                    high_freq_factor: need("high_freq_factor")? as f32,
                    original_max_position_embeddings: inner
                        .usize("original_max_position_embeddings")?,
                })
            }
            other => Ok(RopeScaling::Other(other.to_string())),
        }
    }
}

//! ModelConfig: the hyper-parameters of a Llama-family model, read from a Hugging Face
//! `config.json` or from GGUF metadata (`<arch>.block_count`, ...), and the checks that say
//! whether this decoder can run it.
//!
//! [`ModelConfig::from_hf_config_json`] reads the keys of `transformers`' `LlamaConfig`,
//! `MistralConfig`, `Qwen2Config`, `Qwen3Config`, `MixtralConfig`, `Qwen2MoeConfig` and
//! `Qwen3MoeConfig`, with the same defaults those classes use where a key may be absent.
//! Anything this decoder could not run (an unknown rope scaling, dense layers inside a MoE
//! stack) is kept representable or rejected here with a message naming the key, so the
//! decoder's `runner_unsupported` can say why instead of computing something else.

use crate::error::{KwkError, Result};
use serde::Serialize;
use serde_json::{Map, Value};
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Mixtral,
    Qwen2Moe,
    Qwen3Moe,
}

impl Architecture {
    /// From a Hugging Face `model_type`.
    pub fn from_hf_model_type(model_type: &str) -> Option<Architecture> {
        Some(match model_type {
            "llama" => Architecture::Llama,
            "mistral" => Architecture::Mistral,
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            "mixtral" => Architecture::Mixtral,
            "qwen2_moe" => Architecture::Qwen2Moe,
            "qwen3_moe" => Architecture::Qwen3Moe,
            _ => return None,
        })
    }

    /// The Hugging Face `model_type` of this architecture.
    pub fn hf_model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Mixtral => "mixtral",
            Architecture::Qwen2Moe => "qwen2_moe",
            Architecture::Qwen3Moe => "qwen3_moe",
        }
    }

    /// Whether the feed-forward blocks are mixtures of experts.
    pub fn is_moe(self) -> bool {
        matches!(
            self,
            Architecture::Mixtral | Architecture::Qwen2Moe | Architecture::Qwen3Moe
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum RopeScaling {
    None,
    /// Llama 3.x "llama3" rope scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
    /// A rope scaling this decoder does not implement ("linear", "dynamic", "yarn", ...),
    /// kept by name so `runner_unsupported` can reject the model with a reason.
    Other(String),
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// MoE: experts in total and per token (0 for dense models).
    pub n_experts: usize,
    pub experts_per_token: usize,
    /// MoE: intermediate size of each expert (qwen2/3_moe `moe_intermediate_size`; for
    /// mixtral, whose experts use `intermediate_size`, the same value).
    pub moe_intermediate_size: usize,
    /// qwen2_moe: intermediate size of the shared expert.
    pub shared_expert_intermediate_size: usize,
    /// Renormalise the top-k routing weights to sum to 1 (mixtral always; qwen per config).
    pub norm_topk_prob: bool,
    /// A sliding window the model needs (Mistral v0.1); `None` when full attention.
    pub sliding_window: Option<usize>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

/// The sizes a config declares, by role, for [`ModelConfig::check_sizes`] to name the key
/// each came from in the source's own terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeKey {
    HiddenSize,
    IntermediateSize,
    Layers,
    Heads,
    KvHeads,
    HeadDim,
    VocabSize,
    MaxPositions,
    Experts,
    ExpertsPerToken,
    ExpertFfn,
    SharedExpertFfn,
}

impl SizeKey {
    /// The `config.json` key (`architecture` tells Mixtral's expert count key apart).
    pub fn hf_key(self, architecture: Architecture) -> &'static str {
        match self {
            SizeKey::HiddenSize => "hidden_size",
            SizeKey::IntermediateSize => "intermediate_size",
            SizeKey::Layers => "num_hidden_layers",
            SizeKey::Heads => "num_attention_heads",
            SizeKey::KvHeads => "num_key_value_heads",
            SizeKey::HeadDim => "head_dim",
            SizeKey::VocabSize => "vocab_size",
            SizeKey::MaxPositions => "max_position_embeddings",
            SizeKey::Experts if architecture == Architecture::Mixtral => "num_local_experts",
            SizeKey::Experts => "num_experts",
            SizeKey::ExpertsPerToken => "num_experts_per_tok",
            SizeKey::ExpertFfn if architecture == Architecture::Mixtral => "intermediate_size",
            SizeKey::ExpertFfn => "moe_intermediate_size",
            SizeKey::SharedExpertFfn => "shared_expert_intermediate_size",
        }
    }

    /// The GGUF metadata key without the `<arch>.` prefix (llama.cpp's `llama-arch.cpp`).
    pub fn gguf_key(self, architecture: Architecture) -> &'static str {
        match self {
            SizeKey::HiddenSize => "embedding_length",
            SizeKey::IntermediateSize => "feed_forward_length",
            SizeKey::Layers => "block_count",
            SizeKey::Heads => "attention.head_count",
            SizeKey::KvHeads => "attention.head_count_kv",
            SizeKey::HeadDim => "attention.key_length",
            SizeKey::VocabSize => "vocab_size",
            SizeKey::MaxPositions => "context_length",
            SizeKey::Experts => "expert_count",
            SizeKey::ExpertsPerToken => "expert_used_count",
            SizeKey::ExpertFfn if architecture == Architecture::Mixtral => "feed_forward_length",
            SizeKey::ExpertFfn => "expert_feed_forward_length",
            SizeKey::SharedExpertFfn => "expert_shared_feed_forward_length",
        }
    }

    /// The largest value kwk accepts. Far above every released model (hidden 16384,
    /// 126 layers, 128 heads, head size 256, vocabulary 262144, context 10M, 384 experts)
    /// and low enough that every product the loader and decoder form from them fits in
    /// 64 bits; a larger value is a corrupt or hostile file.
    pub fn max(self) -> usize {
        match self {
            SizeKey::HiddenSize => 1 << 20,
            SizeKey::IntermediateSize | SizeKey::ExpertFfn | SizeKey::SharedExpertFfn => 1 << 22,
            SizeKey::Layers | SizeKey::Heads | SizeKey::KvHeads => 1 << 12,
            SizeKey::HeadDim => 1 << 14,
            SizeKey::VocabSize => 1 << 24,
            SizeKey::MaxPositions => 1 << 27,
            SizeKey::Experts | SizeKey::ExpertsPerToken => 1 << 14,
        }
    }
}

/// The most parameters a config may imply (2^44, about 17.6 trillion).
pub const MAX_PARAMS: u64 = 1 << 44;
/// The most bytes a float32 KV cache over the whole context may take (2^56).
pub const MAX_KV_CACHE_BYTES: u64 = 1 << 56;
/// The largest `config.json` read (real ones are a few kilobytes).
pub const MAX_CONFIG_JSON_BYTES: u64 = 16 << 20;

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

    fn from_hf_config_object(path: &Path, obj: &Map<String, Value>) -> Result<ModelConfig> {
        let keys = JsonKeys { path, obj };
        let model_type = keys.opt_str("model_type")?.ok_or_else(|| {
            KwkError::bad_model(path, "config key 'model_type' is missing (e.g. \"llama\")")
        })?;
        let architecture = Architecture::from_hf_model_type(model_type).ok_or_else(|| {
            KwkError::Unsupported(format!(
                "{}: model_type '{model_type}'; kwk runs llama, mistral, qwen2, qwen3, \
                 mixtral, qwen2_moe and qwen3_moe",
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
        let rope_parameters = Self::rope_parameters(&keys)?;
        let rope_theta = match &rope_parameters {
            Some(p) => p.opt_f64("rope_theta")?,
            None => None,
        };
        let rope_theta = match rope_theta {
            Some(t) => t,
            None => keys.opt_f64("rope_theta")?.unwrap_or(10000.0),
        } as f32;
        let max_position_embeddings = keys.opt_usize("max_position_embeddings")?.unwrap_or(2048);
        let tie_word_embeddings = keys.opt_bool("tie_word_embeddings")?.unwrap_or(false);
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
            Some(w) if use_sliding_window && w < max_position_embeddings => Some(w),
            _ => None,
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
        };
        config.check_sizes(path, &|k| {
            format!("config key '{}'", k.hf_key(architecture))
        })?;
        Ok(config)
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

    /// Checks every size against [`SizeKey::max`], the context length against 0, and the
    /// products the loaders and the decoder form (attention widths, parameter count, KV
    /// cache bytes over the whole context) with checked arithmetic, so no later
    /// multiplication of these sizes can overflow. `key` names a size's key in the source
    /// (e.g. "config key 'hidden_size'"); errors are `BadModel` naming `path` and the key.
    pub fn check_sizes(&self, path: &Path, key: &dyn Fn(SizeKey) -> String) -> Result<()> {
        use SizeKey as K;
        let moe = self.architecture.is_moe();
        let mut sizes = vec![
            (K::HiddenSize, self.hidden_size),
            (K::Layers, self.n_layers),
            (K::Heads, self.n_heads),
            (K::KvHeads, self.n_kv_heads),
            (K::HeadDim, self.head_dim),
            (K::VocabSize, self.vocab_size),
            (K::MaxPositions, self.max_position_embeddings),
        ];
        if moe {
            sizes.extend([
                (K::Experts, self.n_experts),
                (K::ExpertsPerToken, self.experts_per_token),
                (K::ExpertFfn, self.moe_intermediate_size),
            ]);
            if self.shared_expert_intermediate_size > 0 {
                sizes.push((K::SharedExpertFfn, self.shared_expert_intermediate_size));
            }
        } else {
            sizes.push((K::IntermediateSize, self.intermediate_size));
        }
        for (k, v) in sizes {
            if v == 0 {
                let why = if k == K::MaxPositions {
                    "; the context length bounds the KV cache, so it must be positive (set it \
                     to the context the model was trained for)"
                } else {
                    "; it must be positive"
                };
                return Err(KwkError::bad_model(path, format!("{} is 0{why}", key(k))));
            }
            if v > k.max() {
                return Err(KwkError::bad_model(
                    path,
                    format!(
                        "{} is {v}, more than kwk's limit of {}; the file is corrupt",
                        key(k),
                        k.max()
                    ),
                ));
            }
        }
        // Every factor is below 2^27 here, so these u64 products cannot overflow; the
        // sums and the products with the layer count are checked all the same.
        let u = |x: usize| x as u64;
        let d = u(self.hidden_size);
        let q_dim = u(self.n_heads) * u(self.head_dim);
        let kv_dim = u(self.n_kv_heads) * u(self.head_dim);
        let ffn = if moe {
            let experts = u(self.n_experts) * 3 * d * u(self.moe_intermediate_size);
            experts + u(self.n_experts) * d + 3 * d * u(self.shared_expert_intermediate_size) + d
        } else {
            3 * d * u(self.intermediate_size)
        };
        let per_layer = d * (2 * q_dim + 2 * kv_dim) + ffn + 2 * d;
        let embeddings = u(self.vocab_size) * d * if self.tie_word_embeddings { 1 } else { 2 };
        let params = u(self.n_layers)
            .checked_mul(per_layer)
            .and_then(|p| p.checked_add(embeddings));
        let names = [K::HiddenSize, K::Layers, K::VocabSize].map(key).join(", ");
        if params.is_none_or(|p| p > MAX_PARAMS) {
            return Err(KwkError::bad_model(
                path,
                format!(
                    "the sizes ({names}, ...) imply more than 2^44 parameters (kwk's limit); \
                     the file is corrupt"
                ),
            ));
        }
        let kv_bytes =
            (2 * 4 * u(self.n_layers) * kv_dim).checked_mul(u(self.max_position_embeddings));
        if kv_bytes.is_none_or(|b| b > MAX_KV_CACHE_BYTES) {
            return Err(KwkError::bad_model(
                path,
                format!(
                    "{} is {}: a KV cache that long would take more than 2^56 bytes; the file \
                     is corrupt",
                    key(K::MaxPositions),
                    self.max_position_embeddings
                ),
            ));
        }
        Ok(())
    }

    /// Query heads sharing one key/value head.
    pub fn group_size(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// Intermediate size of the routed experts (0 for dense models).
    pub fn expert_ffn_size(&self) -> usize {
        self.moe_intermediate_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<ModelConfig> {
        ModelConfig::from_hf_config_object(Path::new("config.json"), v.as_object().unwrap())
    }

    fn fixture(name: &str) -> std::path::PathBuf {
        kwk_fixtures::model_dir(name).join("config.json")
    }

    #[test]
    fn reads_the_three_fixture_configs() {
        let llama = ModelConfig::from_hf_config_json(&fixture("tiny-llama")).unwrap();
        assert_eq!(llama.architecture, Architecture::Llama);
        assert_eq!(
            (llama.hidden_size, llama.intermediate_size, llama.n_layers),
            (64, 160, 2)
        );
        assert_eq!(
            (llama.n_heads, llama.n_kv_heads, llama.head_dim),
            (4, 2, 16)
        );
        assert!(llama.tie_word_embeddings);
        assert_eq!(llama.eos_token_ids, vec![0]);
        assert_eq!(llama.rope_theta, 10000.0);

        let qwen = ModelConfig::from_hf_config_json(&fixture("tiny-qwen2")).unwrap();
        assert_eq!(qwen.architecture, Architecture::Qwen2);
        assert_eq!(qwen.n_kv_heads, 1);
        assert!(!qwen.tie_word_embeddings);
        assert_eq!(qwen.rope_theta, 1e6);

        let mix = ModelConfig::from_hf_config_json(&fixture("tiny-mixtral")).unwrap();
        assert_eq!(mix.architecture, Architecture::Mixtral);
        assert_eq!((mix.n_experts, mix.experts_per_token), (4, 2));
        assert_eq!(mix.moe_intermediate_size, 96);
        assert!(mix.norm_topk_prob);
    }

    fn base() -> Value {
        json!({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
               "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100})
    }

    #[test]
    fn defaults_follow_transformers() {
        let c = parse(base()).unwrap();
        assert_eq!(c.n_kv_heads, 4);
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.rms_norm_eps, 1e-6);
        assert!(!c.tie_word_embeddings);
        assert_eq!(c.rope_scaling, RopeScaling::None);
        assert_eq!(c.sliding_window, None);
        assert!(c.eos_token_ids.is_empty());
    }

    #[test]
    fn missing_key_is_named() {
        let mut v = base();
        v.as_object_mut().unwrap().remove("vocab_size");
        let err = parse(v).unwrap_err().to_string();
        assert!(
            err.contains("'vocab_size'") && err.contains("config.json"),
            "{err}"
        );
    }

    #[test]
    fn wrong_type_is_named() {
        let mut v = base();
        v["hidden_size"] = json!("sixty-four");
        let err = parse(v).unwrap_err().to_string();
        assert!(err.contains("'hidden_size'"), "{err}");
    }

    #[test]
    fn unknown_model_type_is_unsupported() {
        let mut v = base();
        v["model_type"] = json!("gpt_neox");
        assert!(matches!(parse(v), Err(KwkError::Unsupported(m)) if m.contains("gpt_neox")));
    }

    #[test]
    fn llama3_rope_scaling_and_eos_list() {
        let mut v = base();
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        v["eos_token_id"] = json!([128001, 128008, 128009]);
        let c = parse(v).unwrap();
        assert_eq!(
            c.rope_scaling,
            RopeScaling::Llama3 {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192
            }
        );
        assert_eq!(c.eos_token_ids, vec![128001, 128008, 128009]);
    }

    #[test]
    fn transformers5_rope_parameters() {
        let mut v = base();
        v["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 1e6});
        let c = parse(v.clone()).unwrap();
        assert_eq!((c.rope_theta, c.rope_scaling), (1e6, RopeScaling::None));
        v["rope_parameters"] = json!({"rope_type": "llama3", "rope_theta": 500000.0,
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192});
        let c = parse(v.clone()).unwrap();
        assert_eq!(c.rope_theta, 500000.0);
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
        v["rope_parameters"] = json!({"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0});
        assert_eq!(
            parse(v).unwrap().rope_scaling,
            RopeScaling::Other("yarn".into())
        );
    }

    #[test]
    fn other_rope_scaling_is_kept_by_name() {
        let mut v = base();
        v["rope_scaling"] = json!({"type": "yarn", "factor": 4.0});
        assert_eq!(
            parse(v).unwrap().rope_scaling,
            RopeScaling::Other("yarn".into())
        );
    }

    #[test]
    fn sliding_window_rules() {
        let mut v = base();
        v["model_type"] = json!("mistral");
        v["max_position_embeddings"] = json!(32768);
        v["sliding_window"] = json!(4096);
        assert_eq!(parse(v.clone()).unwrap().sliding_window, Some(4096));
        v["use_sliding_window"] = json!(false);
        assert_eq!(parse(v.clone()).unwrap().sliding_window, None);
        v["use_sliding_window"] = json!(true);
        v["sliding_window"] = json!(null);
        assert_eq!(parse(v).unwrap().sliding_window, None);
    }

    #[test]
    fn qwen_moe_keys() {
        let mut v = base();
        v["model_type"] = json!("qwen2_moe");
        v["num_experts"] = json!(60);
        v["num_experts_per_tok"] = json!(4);
        v["moe_intermediate_size"] = json!(32);
        v["shared_expert_intermediate_size"] = json!(64);
        let c = parse(v.clone()).unwrap();
        assert_eq!((c.n_experts, c.experts_per_token), (60, 4));
        assert_eq!(
            (c.moe_intermediate_size, c.shared_expert_intermediate_size),
            (32, 64)
        );
        assert!(!c.norm_topk_prob);
        v["mlp_only_layers"] = json!([1]);
        assert!(matches!(parse(v), Err(KwkError::Unsupported(_))));

        let mut v = base();
        v["model_type"] = json!("qwen3_moe");
        v["num_experts"] = json!(8);
        v["num_experts_per_tok"] = json!(2);
        v["moe_intermediate_size"] = json!(32);
        v["head_dim"] = json!(32);
        let c = parse(v.clone()).unwrap();
        assert!(c.norm_topk_prob);
        assert_eq!(c.head_dim, 32);
        // transformers 5 writes qwen3_moe's expert count as num_local_experts.
        let count = v.as_object_mut().unwrap().remove("num_experts").unwrap();
        v["num_local_experts"] = count;
        assert_eq!(parse(v.clone()).unwrap().n_experts, 8);
        assert_eq!(c.shared_expert_intermediate_size, 0);
    }

    #[test]
    fn kv_heads_must_divide_heads() {
        let mut v = base();
        v["num_key_value_heads"] = json!(3);
        assert!(parse(v)
            .unwrap_err()
            .to_string()
            .contains("num_key_value_heads"));
    }

    #[test]
    fn zero_context_length_is_an_error_naming_the_key() {
        let mut v = base();
        v["max_position_embeddings"] = json!(0);
        let err = parse(v).unwrap_err().to_string();
        assert!(
            err.starts_with("config.json: config key 'max_position_embeddings' is 0; the context length bounds the KV cache"),
            "{err}"
        );
    }

    #[test]
    fn sizes_above_the_limits_are_errors_naming_the_key() {
        for (key, value) in [
            ("hidden_size", 1usize << 21),
            ("num_hidden_layers", 5000),
            ("vocab_size", 1 << 25),
            ("intermediate_size", usize::MAX),
            ("max_position_embeddings", 1 << 28),
        ] {
            let mut v = base();
            v[key] = json!(value);
            if key == "hidden_size" {
                v["head_dim"] = json!(16);
            }
            let err = parse(v).unwrap_err().to_string();
            assert!(
                err.contains(&format!(
                    "config key '{key}' is {value}, more than kwk's limit"
                )),
                "{key}: {err}"
            );
        }
    }

    #[test]
    fn products_of_sizes_are_checked() {
        // Each size within its limit, the parameter count above 2^44.
        let mut v = base();
        v["hidden_size"] = json!(1 << 20);
        v["num_attention_heads"] = json!(128);
        v["intermediate_size"] = json!(1 << 22);
        v["num_hidden_layers"] = json!(4096);
        let err = parse(v).unwrap_err().to_string();
        assert!(err.contains("imply more than 2^44 parameters"), "{err}");
        // A KV cache over the whole context above 2^56 bytes.
        let mut v = base();
        v["num_attention_heads"] = json!(4096);
        v["num_key_value_heads"] = json!(4096);
        v["head_dim"] = json!(1 << 14);
        v["max_position_embeddings"] = json!(1 << 27);
        let err = parse(v).unwrap_err().to_string();
        assert!(
            err.contains("config key 'max_position_embeddings' is 134217728: a KV cache"),
            "{err}"
        );
    }

    #[test]
    fn an_oversized_config_json_is_refused_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(MAX_CONFIG_JSON_BYTES + 1).unwrap();
        let err = ModelConfig::from_hf_config_json(&path)
            .unwrap_err()
            .to_string();
        assert!(err.contains("more than kwk's limit of 16 MiB"), "{err}");
    }

    /// The `ModelConfig` of a GGUF holding only these metadata pairs (and llama defaults).
    fn gguf_config(edit: &[(&str, crate::gguf::GgufValue)]) -> Result<ModelConfig> {
        use crate::gguf::GgufValue as V;
        let mut meta: Vec<(String, V)> = vec![
            ("general.architecture".into(), V::String("llama".into())),
            ("llama.embedding_length".into(), V::U32(64)),
            ("llama.block_count".into(), V::U32(2)),
            ("llama.attention.head_count".into(), V::U32(4)),
            ("llama.attention.head_count_kv".into(), V::U32(2)),
            (
                "llama.attention.layer_norm_rms_epsilon".into(),
                V::F32(1e-5),
            ),
            ("llama.context_length".into(), V::U32(2048)),
            ("llama.feed_forward_length".into(), V::U32(128)),
            ("llama.vocab_size".into(), V::U32(100)),
        ];
        for (k, v) in edit {
            match meta.iter_mut().find(|(m, _)| m == k) {
                Some(slot) => slot.1 = v.clone(),
                None => meta.push((k.to_string(), v.clone())),
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, crate::gguf::test_writer::gguf_bytes(&meta, &[])).unwrap();
        let file = crate::gguf::GgufFile::open(&path)?;
        crate::model::gguf_loader::config_from_gguf(&file)
    }

    #[test]
    fn gguf_sizes_are_checked_like_config_json() {
        use crate::gguf::GgufValue as V;
        assert_eq!(gguf_config(&[]).unwrap().max_position_embeddings, 2048);
        let err = gguf_config(&[("llama.context_length", V::U32(0))])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "m.gguf: metadata key 'llama.context_length' is 0; the context length bounds"
            ),
            "{err}"
        );
        let err = gguf_config(&[("llama.block_count", V::U64(u64::MAX))])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("metadata key 'llama.block_count' is 18446744073709551615, more than kwk's limit of 4096"),
            "{err}"
        );
        let err = gguf_config(&[
            ("llama.embedding_length", V::U32(1 << 20)),
            ("llama.attention.head_count", V::U32(128)),
            ("llama.attention.head_count_kv", V::U32(128)),
            ("llama.feed_forward_length", V::U32(1 << 22)),
            ("llama.block_count", V::U32(4096)),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("metadata key 'llama.embedding_length'"),
            "{err}"
        );
        assert!(err.contains("2^44 parameters"), "{err}");
    }
}

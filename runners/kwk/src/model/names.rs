//! Tensor names: each weight by its role in the model ([`WeightName`], [`LayerTensor`]),
//! what each source calls it (a Hugging Face checkpoint: [`hf_tensor_name`], per
//! architecture; a GGUF file: [`gguf_tensor_names`], llama.cpp's names), and the per-
//! architecture rules on which tensors a layer must have ([`requires_qkv_bias`],
//! [`requires_qk_norm`]) and how GGUF stores q/k ([`gguf_qk_permuted`]). The one place a
//! new architecture's tensor-name mapping goes.

use super::config::Architecture;

/// A tensor of one layer, by its role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LayerTensor {
    AttnNorm,
    Q,
    K,
    V,
    O,
    QBias,
    KBias,
    VBias,
    QNorm,
    KNorm,
    FfnNorm,
    /// Gemma 3: the norm of attention's output, before the residual add.
    PostAttnNorm,
    /// Gemma 3: the norm of the feed-forward block's output, before the residual add.
    PostFfnNorm,
    Gate,
    Up,
    Down,
    Router,
    ExpertGate(usize),
    ExpertUp(usize),
    ExpertDown(usize),
    SharedGate,
    SharedUp,
    SharedDown,
    SharedExpertGate,
}

/// A tensor of the model, by its role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WeightName {
    Embed,
    FinalNorm,
    LmHead,
    Layer(usize, LayerTensor),
}

/// Whether every layer of `architecture` has q/k/v biases: qwen2 (and qwen2_moe) always
/// do; other architectures may (llama's `attention_bias`), so there they are read when
/// present.
pub(crate) fn requires_qkv_bias(architecture: Architecture) -> bool {
    matches!(architecture, Architecture::Qwen2 | Architecture::Qwen2Moe)
}

/// Whether every layer of `architecture` normalises each q/k head (qwen3, qwen3_moe,
/// gemma3);
/// other architectures read the norms when present.
pub(crate) fn requires_qk_norm(architecture: Architecture) -> bool {
    matches!(
        architecture,
        Architecture::Qwen3 | Architecture::Qwen3Moe | Architecture::Gemma3
    )
}

/// Whether a GGUF of llama.cpp architecture `gguf_arch` has its q/k rows reordered by the
/// converter (`LlamaModel.permute`: `llama`, which covers Mistral and Mixtral); qwen2/qwen3
/// use ggml's NeoX rope and are stored unpermuted.
pub(crate) fn gguf_qk_permuted(gguf_arch: Option<&str>) -> bool {
    gguf_arch == Some("llama")
}

/// The Hugging Face names of a layer's two norms (after `model.layers.{l}.`), per
/// architecture.
///
/// The naming trap: in the Llama family (every architecture kwk runs today)
/// `post_attention_layernorm` is the norm *before the feed-forward block* (it is applied
/// to the residual stream after attention), so it fills kwk's [`LayerTensor::FfnNorm`]
/// slot. Gemma 3 uses the same name for a different norm, applied to attention's output
/// before the residual add ([`LayerTensor::PostAttnNorm`]); its feed-forward pre-norm is
/// `pre_feedforward_layernorm`, and `post_feedforward_layernorm` follows the block
/// ([`LayerTensor::PostFfnNorm`]). So Gemma 3 has its own row here: a Gemma folder read
/// through Llama's row would put the post-attention norm into the FFN-norm slot.
struct HfNormNames {
    attn_norm: &'static str,
    ffn_norm: &'static str,
    /// The norms after attention and after the FFN (`None`: the architecture has none).
    post_attn_norm: Option<&'static str>,
    post_ffn_norm: Option<&'static str>,
}

/// Llama's layer norms: `input_layernorm` before attention, `post_attention_layernorm`
/// before the feed-forward block.
const LLAMA_NORMS: HfNormNames = HfNormNames {
    attn_norm: "input_layernorm.weight",
    ffn_norm: "post_attention_layernorm.weight",
    post_attn_norm: None,
    post_ffn_norm: None,
};

/// Gemma 3's layer norms (transformers' `Gemma3DecoderLayer`): `input_layernorm` before
/// attention, `post_attention_layernorm` on attention's output, `pre_feedforward_layernorm`
/// before the FFN, `post_feedforward_layernorm` on its output.
const GEMMA3_NORMS: HfNormNames = HfNormNames {
    attn_norm: "input_layernorm.weight",
    ffn_norm: "pre_feedforward_layernorm.weight",
    post_attn_norm: Some("post_attention_layernorm.weight"),
    post_ffn_norm: Some("post_feedforward_layernorm.weight"),
};

fn hf_norm_names(architecture: Architecture) -> HfNormNames {
    use Architecture as A;
    match architecture {
        A::Llama | A::Mistral | A::Qwen2 | A::Qwen3 | A::Mixtral | A::Qwen2Moe | A::Qwen3Moe => {
            LLAMA_NORMS
        }
        A::Gemma3 => GEMMA3_NORMS,
    }
}

/// What a Hugging Face checkpoint of `architecture` stores for RMSNorm weight `name`,
/// as an offset to add: Gemma 3's `Gemma3RMSNorm` multiplies by `1 + w` and stores `w`
/// (every norm: layer norms, q/k norms, the final norm), so 1 is added on loading; kwk's
/// norms multiply by the stored value, as llama.cpp's GGUF stores it (its converter adds
/// the 1, `Gemma3Model.norm_shift` in `conversion/gemma.py`).
pub(crate) fn hf_norm_offset(architecture: Architecture, name: WeightName) -> f32 {
    use LayerTensor as T;
    let norm = matches!(
        name,
        WeightName::FinalNorm
            | WeightName::Layer(
                _,
                T::AttnNorm | T::FfnNorm | T::QNorm | T::KNorm | T::PostAttnNorm | T::PostFfnNorm
            )
    );
    if architecture == Architecture::Gemma3 && norm {
        1.0
    } else {
        0.0
    }
}

/// The name a tensor has in a Hugging Face checkpoint of `architecture` (what
/// `transformers` writes and `state_dict()` returns).
pub(crate) fn hf_tensor_name(architecture: Architecture, name: WeightName) -> String {
    use LayerTensor as T;
    let l = match name {
        WeightName::Embed => return "model.embed_tokens.weight".into(),
        WeightName::FinalNorm => return "model.norm.weight".into(),
        WeightName::LmHead => return "lm_head.weight".into(),
        WeightName::Layer(l, t) => (l, t),
    };
    let (layer, t) = l;
    let mixtral = architecture == Architecture::Mixtral;
    let norms = hf_norm_names(architecture);
    let suffix = match t {
        T::AttnNorm => norms.attn_norm.to_string(),
        T::Q => "self_attn.q_proj.weight".into(),
        T::K => "self_attn.k_proj.weight".into(),
        T::V => "self_attn.v_proj.weight".into(),
        T::O => "self_attn.o_proj.weight".into(),
        T::QBias => "self_attn.q_proj.bias".into(),
        T::KBias => "self_attn.k_proj.bias".into(),
        T::VBias => "self_attn.v_proj.bias".into(),
        T::QNorm => "self_attn.q_norm.weight".into(),
        T::KNorm => "self_attn.k_norm.weight".into(),
        T::FfnNorm => norms.ffn_norm.into(),
        // An architecture without the norm has no name for it: a name no checkpoint holds.
        T::PostAttnNorm => norms
            .post_attn_norm
            .unwrap_or("(no post-attention norm)")
            .into(),
        T::PostFfnNorm => norms.post_ffn_norm.unwrap_or("(no post-FFN norm)").into(),
        T::Gate => "mlp.gate_proj.weight".into(),
        T::Up => "mlp.up_proj.weight".into(),
        T::Down => "mlp.down_proj.weight".into(),
        T::Router if mixtral => "block_sparse_moe.gate.weight".into(),
        T::Router => "mlp.gate.weight".into(),
        // Mixtral's experts: w1 = gate, w3 = up, w2 = down.
        T::ExpertGate(e) if mixtral => format!("block_sparse_moe.experts.{e}.w1.weight"),
        T::ExpertUp(e) if mixtral => format!("block_sparse_moe.experts.{e}.w3.weight"),
        T::ExpertDown(e) if mixtral => format!("block_sparse_moe.experts.{e}.w2.weight"),
        T::ExpertGate(e) => format!("mlp.experts.{e}.gate_proj.weight"),
        T::ExpertUp(e) => format!("mlp.experts.{e}.up_proj.weight"),
        T::ExpertDown(e) => format!("mlp.experts.{e}.down_proj.weight"),
        T::SharedGate => "mlp.shared_expert.gate_proj.weight".into(),
        T::SharedUp => "mlp.shared_expert.up_proj.weight".into(),
        T::SharedDown => "mlp.shared_expert.down_proj.weight".into(),
        T::SharedExpertGate => "mlp.shared_expert_gate.weight".into(),
    };
    format!("model.layers.{layer}.{suffix}")
}

/// The names a tensor has in a GGUF file (llama.cpp's `llama-arch.cpp` names): `(tensor name, expert index in a stacked tensor)`, first choice first.
pub(crate) fn gguf_tensor_names(name: WeightName) -> Vec<(String, Option<usize>)> {
    use LayerTensor as T;
    let (l, t) = match name {
        WeightName::Embed => return vec![("token_embd.weight".into(), None)],
        WeightName::FinalNorm => return vec![("output_norm.weight".into(), None)],
        WeightName::LmHead => return vec![("output.weight".into(), None)],
        WeightName::Layer(l, t) => (l, t),
    };
    let b = |s: &str| vec![(format!("blk.{l}.{s}"), None)];
    let expert = |stacked: &str, single: &str, e: usize| {
        vec![
            (format!("blk.{l}.{stacked}.weight"), Some(e)),
            (format!("blk.{l}.{single}.{e}.weight"), None),
        ]
    };
    match t {
        T::AttnNorm => b("attn_norm.weight"),
        T::Q => b("attn_q.weight"),
        T::K => b("attn_k.weight"),
        T::V => b("attn_v.weight"),
        T::O => b("attn_output.weight"),
        T::QBias => b("attn_q.bias"),
        T::KBias => b("attn_k.bias"),
        T::VBias => b("attn_v.bias"),
        T::QNorm => b("attn_q_norm.weight"),
        T::KNorm => b("attn_k_norm.weight"),
        T::FfnNorm => b("ffn_norm.weight"),
        T::PostAttnNorm => b("post_attention_norm.weight"),
        T::PostFfnNorm => b("post_ffw_norm.weight"),
        T::Gate => b("ffn_gate.weight"),
        T::Up => b("ffn_up.weight"),
        T::Down => b("ffn_down.weight"),
        T::Router => b("ffn_gate_inp.weight"),
        T::ExpertGate(e) => expert("ffn_gate_exps", "ffn_gate", e),
        T::ExpertUp(e) => expert("ffn_up_exps", "ffn_up", e),
        T::ExpertDown(e) => expert("ffn_down_exps", "ffn_down", e),
        T::SharedGate => b("ffn_gate_shexp.weight"),
        T::SharedUp => b("ffn_up_shexp.weight"),
        T::SharedDown => b("ffn_down_shexp.weight"),
        T::SharedExpertGate => b("ffn_gate_inp_shexp.weight"),
    }
}

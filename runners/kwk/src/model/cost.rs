//! What one token costs a model, from its shapes alone: the operations of a prompt token
//! and the bytes a generated token reads, the numerators of a roofline (with the machine
//! peaks of `roofline` as denominators). The same rule serves every engine, so kwk's
//! rows and llama.cpp's are put against one ceiling:
//!
//! - **prompt**: 2 operations per multiply-add of every matmul a token passes through
//!   (q/k/v/o, the FFN or the router plus the experts it is routed to and a shared expert,
//!   `lm_head`), plus attention's `q·k` and `p·v` over the positions before it (on average
//!   `(pp + 1) / 2` for a prompt of `pp` tokens). Norms, rope and softmax are ignored
//!   (under 1 % here).
//! - **generation**: the weight bytes a token reads (every tensor but the experts it is
//!   not routed to, counted as `k / n` of the expert tensors, and of an input embedding
//!   that is not also the output, one row), plus the K and V cache it reads at its
//!   position (on average `start + (tg - 1) / 2` earlier positions for `tg` tokens
//!   generated after `start`). kwk counts its packed tensors
//!   (`KwkDecoder::weight_bytes_read_per_token`), a GGUF file its tensor directory
//!   ([`gguf_weight_bytes_per_token`], which lives with the tensor directory in `gguf` and
//!   is re-exported here, so `gguf` does not read `model`).

use super::ModelConfig;
pub use crate::gguf::gguf_weight_bytes_per_token;

/// Parameters of one layer's attention projections (q, k, v, o).
fn attention_params(c: &ModelConfig) -> u64 {
    let d = c.hidden_size as u64;
    let q = (c.n_heads * c.head_dim) as u64;
    let kv = (c.n_kv_heads * c.head_dim) as u64;
    d * q + 2 * d * kv + q * d
}

/// Parameters of a gated FFN (gate, up, down) of intermediate size `f`.
fn ffn_params(d: usize, f: usize) -> u64 {
    3 * d as u64 * f as u64
}

/// Parameters of one layer's FFN that a token uses, and all of them (stored).
fn ffn_used_and_stored(c: &ModelConfig) -> (u64, u64) {
    let d = c.hidden_size;
    if c.n_experts == 0 {
        let p = ffn_params(d, c.intermediate_size);
        return (p, p);
    }
    let expert = ffn_params(d, c.expert_ffn_size());
    let router = (c.n_experts * d) as u64;
    let shared = if c.shared_expert_intermediate_size > 0 {
        ffn_params(d, c.shared_expert_intermediate_size) + d as u64
    } else {
        0
    };
    let used = router + shared + expert * c.experts_per_token as u64;
    let stored = router + shared + expert * c.n_experts as u64;
    (used, stored)
}

/// Matrix parameters one token multiplies by: every layer's projections and the FFN
/// parameters it is routed through, plus `lm_head`.
pub fn matmul_params_per_token(c: &ModelConfig) -> u64 {
    let (ffn_used, _) = ffn_used_and_stored(c);
    c.n_layers as u64 * (attention_params(c) + ffn_used) + (c.vocab_size * c.hidden_size) as u64
}

/// Parameters the model stores: every layer's projections, FFN (all experts), norms and
/// biases, the embedding, and `lm_head` when it is not tied to the embedding.
pub fn stored_params(c: &ModelConfig) -> u64 {
    let (_, ffn_stored) = ffn_used_and_stored(c);
    let d = c.hidden_size as u64;
    let (q, kv) = (
        (c.n_heads * c.head_dim) as u64,
        (c.n_kv_heads * c.head_dim) as u64,
    );
    // Norms (attention, FFN), q/k/v biases and q/k norms: at most this many per layer.
    let small = 2 * d + q + 2 * kv + 2 * c.head_dim as u64;
    let embed = (c.vocab_size * c.hidden_size) as u64;
    let head = if c.tie_word_embeddings { 0 } else { embed };
    c.n_layers as u64 * (attention_params(c) + ffn_stored + small) + embed + head + d
}

/// Parameters of the largest layer (as [`stored_params`] counts them).
pub fn layer_params(c: &ModelConfig) -> u64 {
    let (_, ffn_stored) = ffn_used_and_stored(c);
    attention_params(c) + ffn_stored
}

/// Operations (2 per multiply-add) of one token of a `pp`-token prompt, on average.
pub fn prompt_ops_per_token(c: &ModelConfig, pp: usize) -> f64 {
    let avg_positions = (pp as f64 + 1.0) / 2.0;
    let attention = 4.0 * (c.n_heads * c.head_dim) as f64 * avg_positions * c.n_layers as f64;
    2.0 * matmul_params_per_token(c) as f64 + attention
}

/// Bytes of K and V cache one of `tg` tokens generated after `start` positions reads, on
/// average, with `kv_bytes_per_value` bytes per stored value.
pub fn kv_bytes_per_token(
    c: &ModelConfig,
    kv_bytes_per_value: f64,
    start: usize,
    tg: usize,
) -> f64 {
    let avg_positions = start as f64 + (tg.max(1) as f64 - 1.0) / 2.0;
    2.0 * (c.n_layers * c.n_kv_heads * c.head_dim) as f64 * kv_bytes_per_value * avg_positions
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{Architecture, RopeScaling};

    fn config(n_experts: usize, tied: bool) -> ModelConfig {
        ModelConfig {
            architecture: if n_experts > 0 {
                Architecture::Mixtral
            } else {
                Architecture::Llama
            },
            hidden_size: 8,
            intermediate_size: 16,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 2,
            vocab_size: 10,
            rms_norm_eps: 1e-5,
            rope_theta: 1e4,
            rope_scaling: RopeScaling::None,
            max_position_embeddings: 64,
            tie_word_embeddings: tied,
            n_experts,
            experts_per_token: if n_experts > 0 { 2 } else { 0 },
            moe_intermediate_size: if n_experts > 0 { 16 } else { 0 },
            shared_expert_intermediate_size: 0,
            norm_topk_prob: true,
            sliding_window: None,
            bos_token_id: None,
            eos_token_ids: vec![],
            gemma3: None,
        }
    }

    /// Hand count: attention 8x8 + 2 x 8x4 + 8x8 = 192; FFN 3 x 8 x 16 = 384; lm_head
    /// 10 x 8 = 80; two layers.
    #[test]
    fn dense_counts_by_hand() {
        let c = config(0, true);
        assert_eq!(matmul_params_per_token(&c), 2 * (192 + 384) + 80);
        // Attention of a 3-token prompt: positions 1, 2, 3 (average 2), 4 x 8 x 2 x 2 layers.
        let ops = prompt_ops_per_token(&c, 3);
        assert_eq!(ops, 2.0 * 1232.0 + 4.0 * 8.0 * 2.0 * 2.0);
        // KV: 2 x 2 layers x 2 heads x 2 dims x 2 bytes = 32 per position, positions
        // 10..13 after start 10 (average 11.5).
        assert_eq!(kv_bytes_per_token(&c, 2.0, 10, 4), 32.0 * 11.5);
    }

    /// MoE: 4 experts of 384 parameters, 2 used per token, router 4 x 8 = 32.
    /// Stored: two layers of 192 + 384 and at most 36 small parameters (norms 2d = 16,
    /// biases q + 2kv = 16, q/k norms 2hd = 4), the embedding 80 (and its untied copy),
    /// the final norm 8.
    #[test]
    fn stored_params_by_hand() {
        assert_eq!(stored_params(&config(0, true)), 2 * (576 + 36) + 80 + 8);
        assert_eq!(stored_params(&config(0, false)), 2 * (576 + 36) + 160 + 8);
        // MoE stores every expert: 4 x 384 + router 32.
        assert_eq!(
            stored_params(&config(4, true)),
            2 * (192 + 32 + 4 * 384 + 36) + 80 + 8
        );
    }

    #[test]
    fn moe_counts_only_routed_experts() {
        let c = config(4, true);
        assert_eq!(matmul_params_per_token(&c), 2 * (192 + 32 + 2 * 384) + 80);
    }
}

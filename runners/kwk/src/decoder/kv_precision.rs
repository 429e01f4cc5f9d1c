//! [`KvPrecision`]: the element type the KV cache stores keys and values in (`f32`, `f16`,
//! `bf16`, `q8`), its name as users type it, and what it costs in memory
//! ([`KvPrecision::bytes_per_token`], [`KvPrecision::cache_bytes`]). The cache itself is
//! `kv_cache`; attention reads every precision in place (`kernels::attention`).

use super::MICRO_BATCH;
use crate::error::{KwkError, Result};
use crate::kernels::PANEL_ROWS;
use crate::model::ModelConfig;
use std::fmt;
use std::str::FromStr;

/// Head dimensions per q8 block (one scale each).
pub const KV_Q8_BLOCK: usize = 32;

/// The element type of the KV cache. Queries, scores, softmax and the attention output stay
/// float32 in every precision; only the cached keys and values are narrowed, and attention
/// widens them inside its kernels, a tile at a time (no float32 copy of the cache exists).
///
/// - `f32`: the default; the decoder's numbers are those of a float32 cache.
/// - `f16`: IEEE half (11-bit significand, range ±65504): relative error at most 2⁻¹¹.
/// - `bf16`: bfloat16 (8-bit significand, float32's range): relative error at most 2⁻⁸.
/// - `q8`: int8 codes in blocks of [`KV_Q8_BLOCK`] (32) head dimensions of one position,
///   one float32 scale per block (`scale = max|x| / 127`, `code = round(x / scale)`): an
///   error of at most `max|x| / 254` per block, 1.125 bytes per value. The blocks run along
///   `head_dim` because that is the axis the scale must not cross for an outlier channel to
///   cost only its own block, and because it fits how the kernels read: keys sit in panels
///   of 16 positions (`[hd][16]` codes, then `[hd/32][16]` scales), so the score kernel
///   widens 16 codes of one dimension with one load and applies the 16 positions' scales
///   once per 32 dimensions as one vector multiply-add; values sit one position per row
///   (`[hd]` codes, then `[hd/32]` scales), so the P·V kernel folds the block's scale into
///   the probability it broadcasts (one scalar multiply per 32 values). A float32 scale
///   (against q8_0's f16) costs 1/16 byte per value more and saves a conversion per block.
///   Keys are rounded after RoPE, and the current batch's own keys are read back rounded
///   (as llama.cpp's are). Before rounding, each head's key and value is rotated by an
///   orthonormal Walsh-Hadamard matrix (`kv_rotation`, llama.cpp's `attn_rot` rule; head
///   dimensions a multiple of 64), which spreads the few large dimensions RoPE's slow pairs
///   give a key over the whole head so they no longer set every block's step; queries are
///   rotated alike and outputs rotated back, in float32. Codes round to nearest (ties away
///   from zero) and stay within ±127 by construction of the scale; nothing else is
///   rounded: queries, scores, probabilities and every sum stay float32 (llama.cpp's CPU
///   flash attention also rounds the query to q8_0 for a q8_0 cache). What each rounding
///   costs on SmolLM2-135M, against llama.cpp's q8_0: `reports/kv-quality-39/README.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvPrecision {
    #[default]
    F32,
    F16,
    Bf16,
    Q8,
}

impl KvPrecision {
    /// Every precision, in the order users are shown them.
    pub const ALL: [KvPrecision; 4] = [
        KvPrecision::F32,
        KvPrecision::F16,
        KvPrecision::Bf16,
        KvPrecision::Q8,
    ];

    /// The name as `--kv` spells it (`f32`, `f16`, `bf16`, `q8`).
    pub fn name(self) -> &'static str {
        match self {
            KvPrecision::F32 => "f32",
            KvPrecision::F16 => "f16",
            KvPrecision::Bf16 => "bf16",
            KvPrecision::Q8 => "q8",
        }
    }

    /// The head dimensions a cached row holds: `head_dim` rounded up to 16 (one vector of
    /// float32 lanes, the chunk the P·V kernel reads) or, for `q8`, to 32 (whole blocks);
    /// the padding is zero.
    pub fn padded_head_dim(self, head_dim: usize) -> usize {
        match self {
            KvPrecision::Q8 => head_dim.div_ceil(KV_Q8_BLOCK) * KV_Q8_BLOCK,
            _ => head_dim.div_ceil(PANEL_ROWS) * PANEL_ROWS,
        }
    }

    /// Bytes one position of one KV head takes, key and value together, scales and padding
    /// included (the layouts of `kv_cache`).
    pub fn bytes_per_position(self, head_dim: usize) -> usize {
        let padded = self.padded_head_dim(head_dim);
        match self {
            // Keys `[hd][16]` per panel of positions, values `padded` per position.
            KvPrecision::F32 => 4 * (head_dim + padded),
            KvPrecision::F16 | KvPrecision::Bf16 => 2 * (head_dim + padded),
            // Codes and one float32 scale per block, for keys and for values.
            KvPrecision::Q8 => 2 * (padded + 4 * padded / KV_Q8_BLOCK),
        }
    }

    /// K+V bytes one token adds to the cache of a model with config `cfg`: every layer and
    /// KV head, scales included. A Gemma 3 local layer stops growing at its ring
    /// ([`Self::cache_bytes`] counts that); this figure counts every layer, the cost of a
    /// token while the context is shorter than the window.
    pub fn bytes_per_token(self, cfg: &ModelConfig) -> u64 {
        (cfg.n_layers * cfg.n_kv_heads * self.bytes_per_position(cfg.head_dim)) as u64
    }

    /// Bytes of the whole cache a decoder with `max_cache_len` positions allocates (each
    /// layer's slots, rounded up to 16, and a local layer's ring; [`cache_lengths`]).
    pub fn cache_bytes(self, cfg: &ModelConfig, max_cache_len: usize) -> u64 {
        let per_position = (cfg.n_kv_heads * self.bytes_per_position(cfg.head_dim)) as u64;
        cache_lengths(cfg, max_cache_len)
            .iter()
            .map(|&len| (len.div_ceil(PANEL_ROWS) * PANEL_ROWS) as u64 * per_position)
            .sum()
    }
}

/// The positions each layer's cache holds for a context of `max_cache_len`: all of them, or
/// for a Gemma 3 local layer a ring of the window plus one micro-batch less one (the most
/// keys a batch's queries look back over), when that is shorter.
pub fn cache_lengths(cfg: &ModelConfig, max_cache_len: usize) -> Vec<usize> {
    (0..cfg.n_layers)
        .map(|l| match &cfg.gemma3 {
            Some(g) if g.sliding_layers.get(l).copied().unwrap_or(false) => {
                max_cache_len.min(g.sliding_window + MICRO_BATCH - 1)
            }
            _ => max_cache_len,
        })
        .collect()
}

impl fmt::Display for KvPrecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvPrecision {
    type Err = KwkError;

    /// `f32`, `f16`, `bf16` or `q8` (case and surrounding spaces ignored; `float32`,
    /// `float16` and `q8_0` are accepted as the other spellings users bring).
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "float32" | "fp32" => Ok(KvPrecision::F32),
            "f16" | "float16" | "fp16" => Ok(KvPrecision::F16),
            "bf16" | "bfloat16" => Ok(KvPrecision::Bf16),
            "q8" | "q8_0" | "int8" => Ok(KvPrecision::Q8),
            _ => Err(KwkError::InvalidArgument(format!(
                "KV cache precision '{s}' is not one of {}",
                KvPrecision::ALL.map(KvPrecision::name).join("|")
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Architecture, RopeScaling};

    /// SmolLM2-135M's attention shape: 30 layers, 3 KV heads of 64.
    fn test_config() -> ModelConfig {
        ModelConfig {
            architecture: Architecture::Llama,
            hidden_size: 576,
            intermediate_size: 1536,
            n_layers: 30,
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            vocab_size: 49152,
            rms_norm_eps: 1e-5,
            rope_theta: 1e4,
            rope_scaling: RopeScaling::None,
            max_position_embeddings: 8192,
            tie_word_embeddings: true,
            n_experts: 0,
            experts_per_token: 0,
            moe_intermediate_size: 0,
            shared_expert_intermediate_size: 0,
            norm_topk_prob: true,
            sliding_window: None,
            bos_token_id: None,
            eos_token_ids: vec![],
            gemma3: None,
        }
    }

    #[test]
    fn names_round_trip_and_bad_names_say_the_choices() {
        for p in KvPrecision::ALL {
            assert_eq!(p.name().parse::<KvPrecision>().unwrap(), p);
            assert_eq!(p.to_string(), p.name());
        }
        assert_eq!(" Q8_0 ".parse::<KvPrecision>().unwrap(), KvPrecision::Q8);
        let e = "q4".parse::<KvPrecision>().unwrap_err().to_string();
        assert_eq!(e, "KV cache precision 'q4' is not one of f32|f16|bf16|q8");
    }

    #[test]
    fn bytes_per_token_counts_every_layer_head_and_scale() {
        let mut c = test_config();
        let per = |p: KvPrecision| p.bytes_per_token(&c);
        assert_eq!(per(KvPrecision::F32), 30 * 3 * 2 * 64 * 4);
        assert_eq!(per(KvPrecision::F16), 30 * 3 * 2 * 64 * 2);
        assert_eq!(per(KvPrecision::Bf16), per(KvPrecision::F16));
        assert_eq!(per(KvPrecision::Q8), 30 * 3 * 2 * (64 + 2 * 4));
        assert_eq!(
            KvPrecision::Q8.cache_bytes(&c, 100),
            112 * per(KvPrecision::Q8)
        );
        // A head_dim of 40: values padded to 48 (f32), q8 blocks to 64.
        c.head_dim = 40;
        assert_eq!(KvPrecision::F32.bytes_per_position(40), 4 * (40 + 48));
        assert_eq!(KvPrecision::Q8.bytes_per_position(40), 2 * (64 + 8));
    }
}

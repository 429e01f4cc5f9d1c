//! The limits of a speed sweep at depth (issue 39), checked before anything runs (before
//! llama.cpp's ladder is made and before any row is built): every depth plus the longest
//! test (`--pp` or `--tg`) must fit the positions the model was trained for (its config's
//! `max_position_embeddings`, [`kwk::ModelConfig`]), and the KV caches at the largest depth
//! must fit the memory available (`MemAvailable`, `kwk::decoder::resident::available_memory`).
//! Runs at depth 0 are checked as they always were (`prepare`), so their refusals read as
//! before.
//!
//! KV sizes go through one function of the bytes per cached value
//! ([`crate::protocol::points::kv_bytes_per_value`], keyed by a row's KV type): kwk's rows
//! at `--kv` (the float32 reference at f32, a `FORMAT+kv:TYPE` row at its TYPE), llama-bench
//! at `--llama-kv` as it runs it.

use crate::limits::MEMORY_HINT;
use crate::plan::RunPlan;
use crate::protocol::points::{kv_bytes_per_value, kv_cache_bytes, size, SpeedAxes};
use anyhow::{bail, Result};
use kwk::decoder::resident::{available_memory, Available};
use kwk::ModelConfig;

/// Values one token adds to the KV cache: K and V of every layer's KV heads.
pub fn kv_values_per_token(c: &ModelConfig) -> u64 {
    2 * (c.n_layers * c.n_kv_heads * c.head_dim) as u64
}

/// Refuses a depth whose test runs past the model's trained context, naming the limit and
/// the model: each depth plus the largest `--pp` and the largest `--tg`.
pub fn check_depth_limit(axes: &SpeedAxes, positions: usize, llm: &str) -> Result<()> {
    for &d in &axes.depth {
        for (flag, list) in [("--pp", &axes.pp), ("--tg", &axes.tg)] {
            let n = list.iter().copied().max().unwrap_or(0);
            if d + n > positions {
                bail!(
                    "--depth {d} + {flag} {n} needs {} positions, past the {positions} model '{llm}' was trained for (max_position_embeddings in its config); pass a depth of at most {}",
                    d + n,
                    positions.saturating_sub(n)
                );
            }
        }
    }
    Ok(())
}

/// What the KV caches at the largest depth need: every kwk row's own cache (all are kept
/// through the speed rounds) of `cache_len` tokens, plus one llama-bench cache when GGUF
/// rows are timed (one llama-bench runs at a time).
pub struct KvNeed {
    pub values_per_token: u64,
    /// kwk's rows by their cache's type (`--kv`, a `+kv:` row's own; the float32
    /// reference's is f32).
    pub kwk_rows: Vec<(&'static str, usize)>,
    pub cache_len: usize,
    pub bench_len: Option<usize>,
    /// The type llama-bench's cache runs with (`--llama-kv`, f16 for f32).
    pub bench_kv: &'static str,
}

impl KvNeed {
    pub fn bytes(&self) -> f64 {
        let kwk: f64 = self
            .kwk_rows
            .iter()
            .map(|&(t, n)| {
                kv_cache_bytes(self.values_per_token, t, self.cache_len).unwrap_or(0.0) * n as f64
            })
            .sum();
        let bench = self.bench_len.map_or(0.0, |n| {
            kv_cache_bytes(self.values_per_token, self.bench_kv, n).unwrap_or(0.0)
        });
        kwk + bench
    }

    /// Refuses the run when the caches need more than `available`, naming both.
    pub fn check(&self, max_depth: usize, available: Option<Available>) -> Result<()> {
        let Some(avail) = available else {
            return Ok(());
        };
        let need = self.bytes();
        if need <= avail.bytes as f64 {
            return Ok(());
        }
        let per_token = |t| self.values_per_token as f64 * kv_bytes_per_value(t).unwrap_or(0.0);
        let mut parts = Vec::new();
        for &(t, n) in self.kwk_rows.iter().filter(|r| r.1 > 0) {
            parts.push(format!(
                "{n} kwk row(s) × {} tokens × {} bytes per token ({t})",
                self.cache_len,
                per_token(t)
            ));
        }
        if let Some(n) = self.bench_len {
            parts.push(format!(
                "llama-bench's {n} tokens × {} bytes per token ({})",
                per_token(self.bench_kv),
                self.bench_kv
            ));
        }
        bail!(
            "the KV caches at --depth {max_depth} need {} ({}); this machine has {} available ({}) — pass a smaller --depth, or {MEMORY_HINT}",
            size(need),
            parts.join(" + "),
            size(avail.bytes as f64),
            avail.source
        )
    }
}

/// The run's KV need at its largest depth, for a model of `config`.
pub fn kv_need(plan: &RunPlan, config: &ModelConfig) -> KvNeed {
    let axes = &plan.speed_axes;
    // One entry per cache type in the order first met: the reference's f32, the other
    // rows' `--kv`, a `+kv:` row's own.
    let mut kwk_rows: Vec<(&'static str, usize)> = Vec::new();
    for kv in plan.formats.iter().filter_map(|f| f.kwk_kv(plan.kv)) {
        match kwk_rows.iter_mut().find(|(t, _)| *t == kv.name()) {
            Some((_, n)) => *n += 1,
            None => kwk_rows.push((kv.name(), 1)),
        }
    }
    let gguf = plan.formats.iter().any(|f| f.engine().is_external());
    KvNeed {
        values_per_token: kv_values_per_token(config),
        kwk_rows,
        cache_len: plan.ctx.max(axes.longest_test()),
        bench_len: (gguf && plan.llama_bench).then(|| axes.longest_test()),
        bench_kv: plan.llama_kv.for_bench().as_str(),
    }
}

/// The checks of a run with a depth other than 0 (see the module doc), on the model's
/// header; nothing for runs without speed or at depth 0 only.
pub fn check_before_run(plan: &RunPlan) -> Result<()> {
    if plan.speed.is_none() || plan.speed_axes.max_depth() == 0 {
        return Ok(());
    }
    let model = kwk::model::load_model_header(&plan.llm)
        .map_err(|e| anyhow::anyhow!("loading --llm '{}': {e}", plan.llm))?;
    let config = &model.config;
    check_depth_limit(&plan.speed_axes, config.max_position_embeddings, &plan.llm)?;
    kv_need(plan, config).check(plan.speed_axes.max_depth(), available_memory())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axes(depth: &[usize], pp: usize, tg: usize) -> SpeedAxes {
        SpeedAxes {
            pp: vec![pp],
            tg: vec![tg],
            depth: depth.to_vec(),
            threads: vec![1],
        }
    }

    #[test]
    fn a_depth_past_the_trained_context_names_the_limit_and_the_model() {
        check_depth_limit(&axes(&[0, 200], 56, 4), 256, "m").unwrap();
        // Exactly the trained context fits; one more position does not.
        check_depth_limit(&axes(&[0, 240], 16, 4), 256, "tiny").unwrap();
        assert!(check_depth_limit(&axes(&[241], 16, 4), 256, "tiny").is_err());
        // The longer of pp and tg counts.
        let e = check_depth_limit(&axes(&[250], 4, 16), 256, "tiny").unwrap_err();
        assert!(
            e.to_string().starts_with("--depth 250 + --tg 16 needs 266"),
            "{e}"
        );
        let e = check_depth_limit(&axes(&[300], 16, 4), 256, "tiny")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "--depth 300 + --pp 16 needs 316 positions, past the 256 model 'tiny' was trained for (max_position_embeddings in its config); pass a depth of at most 240"
        );
    }

    #[test]
    fn the_kv_need_counts_every_kwk_row_and_one_bench_cache() {
        // 2 layers × 2 KV heads × 8 dims × K and V = 64 values per token.
        let need = KvNeed {
            values_per_token: 64,
            kwk_rows: vec![("f32", 2), ("q8", 0)],
            cache_len: 1000,
            bench_len: Some(500),
            bench_kv: "f16",
        };
        assert_eq!(need.bytes(), 2.0 * 1000.0 * 64.0 * 4.0 + 500.0 * 64.0 * 2.0);
        let fits = Available {
            bytes: need.bytes() as u64,
            source: "MemAvailable",
        };
        need.check(900, Some(fits)).unwrap();
        need.check(900, None).unwrap();
        let short = Available {
            bytes: 1000,
            source: "MemAvailable",
        };
        let e = need.check(900, Some(short)).unwrap_err().to_string();
        // A q8 cache: 32 int8 values and one f32 scale per block.
        let q8 = KvNeed {
            kwk_rows: vec![("f32", 1), ("q8", 1)],
            bench_len: None,
            ..need
        };
        assert_eq!(q8.bytes(), 1000.0 * 64.0 * (4.0 + 36.0 / 32.0));
        assert!(
            e.starts_with("the KV caches at --depth 900 need 576.0 kB (2 kwk row(s) × 1000 tokens × 256 bytes per token (f32) + llama-bench's 500 tokens × 128 bytes per token (f16)); this machine has 1.0 kB available (MemAvailable)"),
            "{e}"
        );
    }
}

//! Perplexity exactly as llama-perplexity computes it (default mode, `perplexity()` in
//! tools/perplexity/perplexity.cpp, P:478-650).
//!
//! The token stream is cut into `floor(n_tokens / ctx)` non-overlapping windows (capped by
//! `--chunks`); each window starts from an empty cache at position 0, its first token is
//! replaced by BOS when the tokenizer adds one, and the logits of positions
//! `ctx/2 .. ctx-2` are scored against the next token. NLL numerics follow llama.cpp: the
//! row maximum in f32, `expf` terms in f32 summed in f64, `log` in f64, sums in f64.
//!
//! [`score_chunks`] is a pure function over a logits provider (a closure), so the arithmetic
//! is tested with hand-computed cases and the same code drives every in-tree runner.

use crate::protocol::{ChunkPlan, Progress};
use anyhow::{bail, ensure, Result};

/// NLL of `target` under one logit row with llama.cpp's numerics (P:60-70):
/// `-(float(l_tok - max) - log(Σ double(expf(l - max))))`.
pub fn token_nll(row: &[f32], target: usize) -> f64 {
    // std::max(a, b) returns a unless a < b, so a NaN in the row never becomes the max;
    // it still poisons the sum below, and the caller rejects a non-finite result.
    let mut max = row[0];
    for &l in &row[1..] {
        if max < l {
            max = l;
        }
    }
    let mut sum_exp = 0.0f64;
    for &l in row {
        sum_exp += f64::from((l - max).exp());
    }
    let log_softmax = f64::from(row[target] - max) - sum_exp.ln();
    -log_softmax
}

/// Running sums of NLL and NLL² over scored tokens (doubles, as llama.cpp keeps them).
#[derive(Debug, Clone, Copy, Default)]
pub struct NllSums {
    pub sum: f64,
    pub sum2: f64,
    pub count: usize,
}

impl NllSums {
    pub fn add(&mut self, nll: f64) {
        self.sum += nll;
        self.sum2 += nll * nll;
        self.count += 1;
    }

    /// `exp(Σnll / N)`: the cumulative value llama-perplexity prints as `[k]x,`.
    pub fn running_ppl(&self) -> f64 {
        (self.sum / self.count as f64).exp()
    }

    /// Final `PPL ± err` (P:641-650): `ppl = exp(mean)`, `err = ppl * sqrt(var/(N-1))`
    /// with the population variance `var = Σnll²/N - mean²`. A non-positive variance or a
    /// non-finite value is an error, as llama.cpp prints no estimate for it either.
    pub fn estimate(&self) -> Result<(f64, f64)> {
        ensure!(
            self.count >= 2,
            "only {} scored tokens; perplexity needs at least 2",
            self.count
        );
        let n = self.count as f64;
        let mean = self.sum / n;
        let ppl = mean.exp();
        let var = self.sum2 / n - mean * mean;
        if !ppl.is_finite() || !var.is_finite() {
            bail!(
                "perplexity is not finite (mean NLL {mean}); the runner produced NaN or infinite logits"
            );
        }
        if var <= 0.0 {
            bail!(
                "unexpected non-positive variance of log(prob) ({var}) over {} tokens",
                self.count
            );
        }
        let se = (var / (n - 1.0)).sqrt();
        Ok((ppl, se * ppl))
    }
}

/// What a runner gets to see of each chunk after scoring (for the KL-divergence reference).
pub struct ChunkLogits<'a> {
    pub chunk: usize,
    /// Logit rows of positions `first .. ctx-2`, `[scored_per_chunk][vocab]`.
    pub rows: &'a [f32],
    pub vocab: usize,
    /// The token each row is scored against.
    pub targets: &'a [u32],
}

/// The outcome of [`score_chunks`].
#[derive(Debug, Clone, PartialEq)]
pub struct PerplexityScore {
    pub ppl: f64,
    pub ppl_err: f64,
    /// Cumulative PPL after each chunk.
    pub running: Vec<f64>,
    pub scored_tokens: usize,
}

/// `logits_of(window, first)`: the logits of window positions `first..ctx` from an empty cache.
pub type LogitsProvider<'a> = dyn FnMut(&[u32], usize) -> Result<Vec<f32>> + 'a;

/// Runs the protocol. `logits_of(window, first)` returns the logits of window positions
/// `first .. ctx` (row-major, `ctx - first` rows, as `KwkDecoder::forward` does), starting
/// from an empty cache. `observe` sees each chunk's scored rows.
pub fn score_chunks(
    tokens: &[u32],
    plan: &ChunkPlan,
    bos: Option<u32>,
    logits_of: &mut LogitsProvider,
    observe: &mut dyn FnMut(&ChunkLogits) -> Result<()>,
    progress: &dyn Progress,
) -> Result<PerplexityScore> {
    ensure!(
        tokens.len() >= plan.chunks * plan.ctx,
        "the plan needs {} tokens but the stream has {}",
        plan.chunks * plan.ctx,
        tokens.len()
    );
    progress.set_total(plan.chunks as u64, "chunks");
    let n_rows_returned = plan.ctx - plan.first;
    let n_scored = plan.scored_per_chunk();
    let mut sums = NllSums::default();
    let mut running = Vec::with_capacity(plan.chunks);
    for k in 0..plan.chunks {
        // Between chunks: a SIGINT/SIGTERM stops the run promptly.
        kwk::interrupt::check()?;
        let window = plan.window(tokens, k, bos);
        let logits = logits_of(&window, plan.first)?;
        ensure!(
            !logits.is_empty() && logits.len() % n_rows_returned == 0,
            "chunk {}: the runner returned {} logits, not a multiple of the {} rows asked for",
            k + 1,
            logits.len(),
            n_rows_returned
        );
        let vocab = logits.len() / n_rows_returned;
        // Any NaN or ±Inf logit fails the row, scored position or not, whatever the NLL
        // would be (a -Inf logit gives a finite NLL; a kernel that hides NaN does not).
        if let Some((r, row)) = logits
            .chunks_exact(vocab)
            .enumerate()
            .find(|(_, row)| row.iter().any(|v| !v.is_finite()))
        {
            let bad = row.iter().filter(|v| !v.is_finite()).count();
            bail!(
                "non-finite logits at chunk {} token {}: {bad} of its {vocab} logits are NaN or \
                 infinite; the runner produced NaN or infinite logits",
                k + 1,
                plan.first + r
            );
        }
        let targets = plan.targets(tokens, k);
        for (i, &t) in targets.iter().enumerate() {
            ensure!(
                (t as usize) < vocab,
                "token id {t} is outside the model's vocabulary of {vocab}"
            );
            let row = &logits[i * vocab..(i + 1) * vocab];
            let nll = token_nll(row, t as usize);
            if !nll.is_finite() {
                bail!(
                    "chunk {}: NLL of the token at position {} is {nll}; the runner produced NaN or infinite logits",
                    k + 1,
                    plan.first + 1 + i
                );
            }
            sums.add(nll);
        }
        running.push(sums.running_ppl());
        observe(&ChunkLogits {
            chunk: k,
            rows: &logits[..n_scored * vocab],
            vocab,
            targets,
        })?;
        progress.advance(k as u64 + 1);
    }
    let (ppl, ppl_err) = sums.estimate()?;
    Ok(PerplexityScore {
        ppl,
        ppl_err,
        running,
        scored_tokens: sums.count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::NoProgress;

    #[test]
    fn token_nll_matches_hand_computation() {
        assert!((token_nll(&[0.0, 0.0], 1) - std::f64::consts::LN_2).abs() < 1e-12);
        // -(1 - 3) + ln(e^-2 + e^-1 + 1)
        let expected = 2.0 + ((-2.0f64).exp() + (-1.0f64).exp() + 1.0).ln();
        assert!((token_nll(&[1.0, 2.0, 3.0], 0) - expected).abs() < 1e-6);
        assert!(token_nll(&[1.0, f32::NAN, 3.0], 0).is_nan());
    }

    #[test]
    fn score_chunks_reproduces_a_hand_computed_perplexity() {
        // Vocabulary of 2, every row [0, ln 3]: p(1) = 3/4, p(0) = 1/4.
        let tokens: Vec<u32> = (0..17).map(|i| i % 2).collect();
        let plan = ChunkPlan::new(tokens.len(), 8, None).unwrap();
        assert_eq!(plan.chunks, 2);
        let mut windows = Vec::new();
        let mut provider = |w: &[u32], first: usize| -> Result<Vec<f32>> {
            windows.push((w.to_vec(), first));
            Ok([0.0f32, 3.0f32.ln()].repeat(w.len() - first))
        };
        let mut seen = Vec::new();
        let mut observe = |c: &ChunkLogits| -> Result<()> {
            seen.push((c.chunk, c.rows.len(), c.vocab, c.targets.to_vec()));
            Ok(())
        };
        let s = score_chunks(
            &tokens,
            &plan,
            Some(9),
            &mut provider,
            &mut observe,
            &NoProgress,
        )
        .unwrap();
        // Targets (positions 5, 6, 7 of each window): 1, 0, 1.
        let (a, b) = ((4.0f64 / 3.0).ln(), 4.0f64.ln());
        let mean = (2.0 * a + b) / 3.0;
        let var = (2.0 * a * a + b * b) / 3.0 - mean * mean;
        let ppl = (64.0f64 / 9.0).powf(1.0 / 3.0);
        assert!((s.ppl - ppl).abs() / ppl < 1e-6, "{} vs {ppl}", s.ppl);
        let err = ppl * (var / 5.0).sqrt();
        assert!(
            (s.ppl_err - err).abs() / err < 1e-6,
            "{} vs {err}",
            s.ppl_err
        );
        assert_eq!(s.scored_tokens, 6);
        assert_eq!(s.running.len(), 2);
        assert!((s.running[0] - ppl).abs() / ppl < 1e-6);
        assert_eq!(windows.len(), 2);
        assert!(windows
            .iter()
            .all(|(w, f)| w[0] == 9 && *f == 4 && w.len() == 8));
        assert_eq!(windows[1].0[1..], tokens[9..16]);
        assert_eq!(
            seen,
            vec![(0, 6, 2, vec![1, 0, 1]), (1, 6, 2, vec![1, 0, 1])]
        );
    }

    #[test]
    fn running_values_are_cumulative_not_per_chunk() {
        // Chunk 1 rows give p(target) = 1/2, chunk 2 rows give p = 1/4 or 3/4.
        let tokens: Vec<u32> = (0..16).map(|i| i % 2).collect();
        let plan = ChunkPlan::new(16, 8, None).unwrap();
        let mut call = 0;
        let mut provider = |w: &[u32], first: usize| -> Result<Vec<f32>> {
            call += 1;
            let row = if call == 1 {
                [0.0, 0.0]
            } else {
                [0.0f32, 3.0f32.ln()]
            };
            Ok(row.repeat(w.len() - first))
        };
        let s = score_chunks(
            &tokens,
            &plan,
            None,
            &mut provider,
            &mut |_| Ok(()),
            &NoProgress,
        );
        // Chunk 1 alone has zero variance but the total does not.
        let s = s.unwrap();
        assert!((s.running[0] - 2.0).abs() < 1e-9);
        let (a, b, l2) = ((4.0f64 / 3.0).ln(), 4.0f64.ln(), 2.0f64.ln());
        let expected = ((3.0 * l2 + 2.0 * a + b) / 6.0).exp();
        assert!((s.running[1] - expected).abs() < 1e-6);
        assert_eq!(s.ppl, s.running[1]);
    }

    /// One -Inf logit in an unscored row (its NLL would be finite) fails the row, naming
    /// chunk and token.
    #[test]
    fn any_non_finite_logit_fails_the_row() {
        let plan = ChunkPlan {
            ctx: 8,
            first: 4,
            chunks: 2,
        };
        let tokens: Vec<u32> = (0..16).map(|i| i % 2).collect();
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut calls = 0;
            let mut logits = |w: &[u32], f: usize| {
                calls += 1;
                let mut l = [0.5f32, 0.25].repeat(w.len() - f);
                if calls == 2 {
                    // Chunk 2, the row of token 7 (rows start at `first` = 4).
                    l[2 * 3 + 1] = bad;
                }
                Ok(l)
            };
            let e = score_chunks(
                &tokens,
                &plan,
                None,
                &mut logits,
                &mut |_| Ok(()),
                &NoProgress,
            )
            .unwrap_err();
            assert!(
                format!("{e:#}")
                    .contains("non-finite logits at chunk 2 token 7: 1 of its 2 logits"),
                "{bad}: {e:#}"
            );
        }
    }

    #[test]
    fn nan_logits_and_zero_variance_are_errors_not_numbers() {
        let tokens: Vec<u32> = (0..16).map(|i| i % 2).collect();
        let plan = ChunkPlan::new(16, 8, None).unwrap();
        let mut nan = |w: &[u32], f: usize| Ok([0.0f32, f32::NAN].repeat(w.len() - f));
        let e =
            score_chunks(&tokens, &plan, None, &mut nan, &mut |_| Ok(()), &NoProgress).unwrap_err();
        assert!(format!("{e:#}").contains("NaN"), "{e:#}");
        // Every target certain (NLL exactly 0): no variance, no estimate (llama.cpp prints
        // "Unexpected negative standard deviation" instead of a value).
        let zeros = vec![0u32; 16];
        // (A finite logit whose exp underflows: -Inf logits fail the row.)
        let mut certain = |w: &[u32], f: usize| Ok([0.0f32, -1e30].repeat(w.len() - f));
        let e = score_chunks(
            &zeros,
            &plan,
            None,
            &mut certain,
            &mut |_| Ok(()),
            &NoProgress,
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("variance"), "{e:#}");
        let mut short = |_: &[u32], _: usize| Ok(vec![0.0f32; 3]);
        assert!(score_chunks(
            &tokens,
            &plan,
            None,
            &mut short,
            &mut |_| Ok(()),
            &NoProgress
        )
        .is_err());
    }

    /// The fixtures' golden logits come from an independent float64 reference: the NLL of
    /// each probe position must equal its `probe_logprob_of_next`.
    #[test]
    fn token_nll_agrees_with_golden_log_probs() {
        for name in kwk_fixtures::MODELS {
            let path = kwk_fixtures::model_dir(name).join("golden.json");
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let g: serde_json::Value = serde_json::from_str(&text).unwrap();
            let tokens: Vec<usize> = serde_json::from_value(g["probe_tokens"].clone()).unwrap();
            let logits: Vec<Vec<f32>> = serde_json::from_value(g["probe_logits"].clone()).unwrap();
            let lp: Vec<f64> = serde_json::from_value(g["probe_logprob_of_next"].clone()).unwrap();
            assert_eq!(lp.len(), tokens.len() - 1);
            for j in 0..lp.len() {
                let nll = token_nll(&logits[j], tokens[j + 1]);
                assert!(
                    (nll + lp[j]).abs() < 2e-5,
                    "{name} position {j}: {nll} vs {}",
                    -lp[j]
                );
            }
        }
    }
}

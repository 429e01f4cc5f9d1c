//! Prompt (pp) and generation (tg) speed by llama-bench's definitions
//! (tools/llama-bench/llama-bench.cpp; protocol doc §4.2-4.3), for in-tree runners.
//!
//! pp: the cache is emptied, then one `pp`-token prompt of random ids (BOS first when the
//! tokenizer adds one) is processed in one call, asking for the last position's logits.
//! tg: the cache is emptied, then `tg` single-token steps, each asking for its logits
//! (llama-bench's tg test starts from an empty cache too; the first token is BOS when the
//! tokenizer adds one). At a depth D (llama-bench `-d`, B:2441-2478), each timed test is
//! preceded, after the cache is emptied, by an untimed prefill of a D-token random prompt
//! (BOS first), in pieces of [`DEPTH_PIECE`] tokens (llama-bench's `-ub`); the timed prompt
//! then starts with BOS again, as llama-bench's `test_prompt` does. The thread count of the
//! point is set before its tests ([`SpeedTarget::set_threads`]). One untimed warm-up like llama-bench's (a whole prompt for pp, one
//! token for tg) before a runner's first repetition, then one timed repetition per call
//! ([`SpeedSession::rep`]): the harness calls it once per runner per round, so repetitions
//! of different runners interleave. Per repetition `tokens / seconds`. Random ids come from
//! a fixed-seed generator, so every runner sees the same prompts.

use crate::protocol::{SpeedRep, SpeedSpec};
use anyhow::{ensure, Result};
use std::time::Instant;

/// What speed is measured on: an engine with a KV cache.
pub trait SpeedTarget {
    /// Empties the cache.
    fn reset(&mut self);
    /// Appends `tokens` and computes the logits of positions `logits_from..tokens.len()`.
    fn forward(&mut self, tokens: &[u32], logits_from: usize) -> Result<()>;
    /// Runs the next tests on `threads` threads.
    fn set_threads(&mut self, threads: usize) -> Result<()>;
}

/// Tokens per forward call of the untimed depth prefill (llama-bench's `-ub` 512).
pub const DEPTH_PIECE: usize = 512;

/// Empties the cache and prefills `depth` tokens of `prompt`, untimed.
fn prefill(t: &mut dyn SpeedTarget, prompt: &[u32]) -> Result<()> {
    t.reset();
    for piece in prompt.chunks(DEPTH_PIECE) {
        t.forward(piece, piece.len() - 1)?;
    }
    Ok(())
}

/// A small deterministic generator (SplitMix64) for the random token ids.
#[derive(Debug, Clone)]
pub struct TokenRng(u64);

impl TokenRng {
    pub fn new(seed: u64) -> Self {
        TokenRng(seed)
    }
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A token id in `0..n_vocab`.
    pub fn token(&mut self, n_vocab: usize) -> u32 {
        (self.next_u64() % n_vocab as u64) as u32
    }
}

/// The seed of the random prompts (fixed so runs are comparable).
pub const SPEED_SEED: u64 = 0x6b77_6b5f_6576_616c;

/// A random prompt of `n` ids, BOS first when `bos` is given (llama-bench's test_prompt).
pub fn random_prompt(rng: &mut TokenRng, n: usize, n_vocab: usize, bos: Option<u32>) -> Vec<u32> {
    (0..n)
        .map(|i| match (i, bos) {
            (0, Some(b)) => b,
            _ => rng.token(n_vocab),
        })
        .collect()
}

fn time_pp(t: &mut dyn SpeedTarget, depth: &[u32], prompt: &[u32]) -> Result<f64> {
    prefill(t, depth)?;
    let start = Instant::now();
    t.forward(prompt, prompt.len() - 1)?;
    Ok(start.elapsed().as_secs_f64())
}

fn time_tg(t: &mut dyn SpeedTarget, depth: &[u32], tokens: &[u32]) -> Result<f64> {
    prefill(t, depth)?;
    let start = Instant::now();
    for &tok in tokens {
        t.forward(&[tok], 0)?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// One runner's speed test across rounds: the first repetition is preceded by one untimed
/// warm-up of each test (llama-bench's), later ones are not; prompts come from one
/// fixed-seed stream per runner, so every runner times the same prompts in the same round.
pub struct SpeedSession {
    rng: TokenRng,
    warmed: bool,
}

impl Default for SpeedSession {
    fn default() -> Self {
        SpeedSession {
            rng: TokenRng::new(SPEED_SEED),
            warmed: false,
        }
    }
}

impl SpeedSession {
    /// One timed repetition of pp and tg on `target` (a test of size 0 is skipped, as in
    /// llama-bench); tokens per second of each.
    pub fn rep(
        &mut self,
        target: &mut dyn SpeedTarget,
        spec: &SpeedSpec,
        n_vocab: usize,
        bos: Option<u32>,
    ) -> Result<SpeedRep> {
        ensure!(n_vocab > 0, "the model has an empty vocabulary");
        target.set_threads(spec.threads)?;
        let warm = !self.warmed;
        self.warmed = true;
        let mut pp = None;
        if spec.pp > 0 {
            if warm {
                time_pp(
                    target,
                    &[],
                    &random_prompt(&mut self.rng, spec.pp, n_vocab, bos),
                )?;
            }
            let depth = random_prompt(&mut self.rng, spec.depth, n_vocab, bos);
            let prompt = random_prompt(&mut self.rng, spec.pp, n_vocab, bos);
            pp = Some(spec.pp as f64 / time_pp(target, &depth, &prompt)?);
        }
        let mut tg = None;
        if spec.tg > 0 {
            if warm {
                time_tg(target, &[], &random_prompt(&mut self.rng, 1, n_vocab, bos))?;
            }
            let depth = random_prompt(&mut self.rng, spec.depth, n_vocab, bos);
            let tokens = random_prompt(&mut self.rng, spec.tg, n_vocab, bos);
            tg = Some(spec.tg as f64 / time_tg(target, &depth, &tokens)?);
        }
        target.reset();
        Ok(SpeedRep {
            pp,
            tg,
            raw: None,
            by_flash_attn: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reps(r: &mut Recorder, spec: &SpeedSpec, n_vocab: usize, bos: Option<u32>) -> Vec<SpeedRep> {
        let mut session = SpeedSession::default();
        (0..spec.reps)
            .map(|_| session.rep(r, spec, n_vocab, bos).unwrap())
            .collect()
    }

    /// Records calls; each forward "takes" no measurable time, so only the call pattern is
    /// checked here (no test asserts a wall-clock time).
    #[derive(Default)]
    struct Recorder {
        calls: Vec<(String, usize, usize)>,
        cache: usize,
        threads: Vec<usize>,
    }
    impl SpeedTarget for Recorder {
        fn reset(&mut self) {
            self.cache = 0;
            self.calls.push(("reset".into(), 0, 0));
        }
        fn forward(&mut self, tokens: &[u32], logits_from: usize) -> Result<()> {
            self.cache += tokens.len();
            std::thread::sleep(std::time::Duration::from_micros(50));
            self.calls
                .push(("forward".into(), tokens.len(), logits_from));
            Ok(())
        }
        fn set_threads(&mut self, threads: usize) -> Result<()> {
            self.threads.push(threads);
            Ok(())
        }
    }

    #[test]
    fn follows_llama_bench_call_pattern() {
        let mut r = Recorder::default();
        let spec = SpeedSpec {
            pp: 16,
            tg: 4,
            depth: 0,
            reps: 3,
            threads: 1,
        };
        let res = reps(&mut r, &spec, 100, Some(1));
        let pp_calls = r
            .calls
            .iter()
            .filter(|c| c.0 == "forward" && c.1 == 16)
            .count();
        assert_eq!(pp_calls, 4, "one warm-up + 3 reps");
        assert!(r.calls.iter().filter(|c| c.1 == 16).all(|c| c.2 == 15));
        let tg_calls = r
            .calls
            .iter()
            .filter(|c| c.0 == "forward" && c.1 == 1)
            .count();
        assert_eq!(tg_calls, 1 + 3 * 4, "one warm-up token + 3 reps of 4");
        assert!(r.calls.iter().filter(|c| c.1 == 1).all(|c| c.2 == 0));
        assert_eq!(res.len(), 3);
        assert!(res
            .iter()
            .all(|x| x.pp.is_some_and(|v| v > 0.0) && x.tg.is_some_and(|v| v > 0.0)));
        // Every timed test starts from an empty cache.
        let mut last_reset = true;
        for c in &r.calls {
            if c.0 == "reset" {
                last_reset = true;
            } else if c.1 == 16 {
                assert!(last_reset);
                last_reset = false;
            }
        }
    }

    #[test]
    fn zero_sizes_skip_tests_and_prompts_start_with_bos() {
        let mut r = Recorder::default();
        let spec = SpeedSpec {
            pp: 0,
            tg: 2,
            depth: 0,
            reps: 1,
            threads: 1,
        };
        let res = reps(&mut r, &spec, 10, None);
        assert!(res[0].pp.is_none() && res[0].tg.is_some());
        let mut rng = TokenRng::new(1);
        let p = random_prompt(&mut rng, 50, 7, Some(99));
        assert_eq!(p[0], 99);
        assert!(p[1..].iter().all(|&t| t < 7));
        let mut a = TokenRng::new(5);
        let mut b = TokenRng::new(5);
        assert_eq!(
            random_prompt(&mut a, 8, 1000, None),
            random_prompt(&mut b, 8, 1000, None)
        );
    }

    /// At depth D every timed test follows an emptied cache and an untimed prefill of D
    /// tokens in pieces of DEPTH_PIECE; the point's thread count is set first.
    #[test]
    fn depth_prefills_untimed_before_each_test() {
        let mut r = Recorder::default();
        let spec = SpeedSpec {
            pp: 16,
            tg: 2,
            depth: DEPTH_PIECE + 100,
            reps: 1,
            threads: 3,
        };
        let mut session = SpeedSession {
            warmed: true,
            ..Default::default()
        };
        session.rep(&mut r, &spec, 100, Some(7)).unwrap();
        assert_eq!(r.threads, [3]);
        let shape: Vec<(&str, usize)> = r.calls.iter().map(|c| (c.0.as_str(), c.1)).collect();
        assert_eq!(
            shape,
            [
                ("reset", 0),
                ("forward", DEPTH_PIECE),
                ("forward", 100),
                ("forward", 16),
                ("reset", 0),
                ("forward", DEPTH_PIECE),
                ("forward", 100),
                ("forward", 1),
                ("forward", 1),
                ("reset", 0)
            ]
        );
        // Each prefill piece asks for its last position's logits only.
        assert_eq!(r.calls[1].2, DEPTH_PIECE - 1);
        assert_eq!(r.calls[2].2, 99);
    }
}

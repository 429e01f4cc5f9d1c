//! The points of a speed sweep (issue 39): the lists given to `--pp`, `--tg`, `--depth`
//! and `--threads`, the speed tests they make, and their names. Depth has llama-bench's
//! `-d` / `--n-depth` meaning (tools/llama-bench/llama-bench.cpp B:2441-2478): an untimed
//! prefill of D tokens, then the timed test. A test is named after its point: `pp512`,
//! `tg128@d4096`, `tg128@d4096/t1` (`/tN` only when threads are swept; a test at depth 0
//! with one thread count keeps its plain name, so reports, baselines and the gate of runs
//! made before the sweep read as they did). Each row's figures at every point are
//! [`PointSpeed`] records (results.json `speed_points`); the first point is also the row's
//! `pp_*`/`tg_*` figures. A leaf of [`super`].

use super::SpeedSpec;
use serde::{Deserialize, Serialize};

/// The lists of a speed sweep, each in the order given (each non-empty, no value twice).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpeedAxes {
    pub pp: Vec<usize>,
    pub tg: Vec<usize>,
    pub depth: Vec<usize>,
    pub threads: Vec<usize>,
}

impl SpeedAxes {
    /// One point: today's single `--pp`, `--tg` and `--threads` at depth 0.
    pub fn single(pp: usize, tg: usize, threads: usize) -> Self {
        SpeedAxes {
            pp: vec![pp],
            tg: vec![tg],
            depth: vec![0],
            threads: vec![threads],
        }
    }

    /// Whether more than one thread count is measured (test names then carry `/tN`).
    pub fn threads_swept(&self) -> bool {
        self.threads.len() > 1
    }

    /// Whether this is one point at depth 0, as every run was before the sweep.
    pub fn is_single(&self) -> bool {
        self.pp.len() == 1 && self.tg.len() == 1 && self.depth == [0] && self.threads.len() == 1
    }

    pub fn max_depth(&self) -> usize {
        self.depth.iter().copied().max().unwrap_or(0)
    }

    /// The longest sequence one test holds in the cache: the largest depth plus the
    /// largest of `pp` and `tg` (each test starts from an emptied cache).
    pub fn longest_test(&self) -> usize {
        let pp = self.pp.iter().copied().max().unwrap_or(0);
        let tg = self.tg.iter().copied().max().unwrap_or(0);
        self.max_depth() + pp.max(tg)
    }

    /// The runs of one round, in order: for each thread count, each depth, the `pp` and
    /// `tg` lists paired by position (a shorter list gives 0 there: no test), so a single
    /// `--pp 512 --tg 128` is one run of both, as before. The first is the primary point.
    pub fn specs(&self, reps: usize) -> Vec<SpeedSpec> {
        let n = self.pp.len().max(self.tg.len());
        let mut out = Vec::new();
        for &threads in &self.threads {
            for &depth in &self.depth {
                for i in 0..n {
                    out.push(SpeedSpec {
                        pp: self.pp.get(i).copied().unwrap_or(0),
                        tg: self.tg.get(i).copied().unwrap_or(0),
                        depth,
                        reps,
                        threads,
                    });
                }
            }
        }
        out
    }

    /// The name of the `kind` (`pp` or `tg`) test of `n` tokens at `depth` with `threads`.
    pub fn test_name(&self, kind: &str, n: usize, depth: usize, threads: usize) -> String {
        test_name(kind, n, depth, self.threads_swept().then_some(threads))
    }
}

/// `pp512`, `pp512@d4096`, `tg128@d4096/t2`, `tg128/t2`: the test, `@dD` when the depth is
/// not 0, `/tN` when `threads` is given (threads swept).
pub fn test_name(kind: &str, n: usize, depth: usize, threads: Option<usize>) -> String {
    let mut s = format!("{kind}{n}");
    if depth > 0 {
        s.push_str(&format!("@d{depth}"));
    }
    if let Some(t) = threads {
        s.push_str(&format!("/t{t}"));
    }
    s
}

/// Bytes one cached value of a KV cache of `kv_type` takes, as the rows name their type
/// (`f32`, `f16`, `bf16`; llama.cpp's `q8_0` and `q4_0` in blocks of 32 with an f16 scale,
/// kwk's `q8` in blocks of 32 with an f32 scale, `kwk::KvPrecision`); `None` for a type this
/// table does not know.
pub fn kv_bytes_per_value(kv_type: &str) -> Option<f64> {
    match kv_type {
        "f32" => Some(4.0),
        "f16" | "bf16" => Some(2.0),
        "q8_0" => Some(34.0 / 32.0),
        "q8" => Some(36.0 / 32.0),
        "q4_0" => Some(18.0 / 32.0),
        _ => None,
    }
}

/// Bytes of a KV cache of `kv_type` holding `tokens` tokens of a model with `values`
/// values per token (K and V of every layer's KV heads); `None` for an unknown type.
pub fn kv_cache_bytes(values: u64, kv_type: &str, tokens: usize) -> Option<f64> {
    Some(values as f64 * kv_bytes_per_value(kv_type)? * tokens as f64)
}

/// `12.3 GB`, `4.5 MB`, `6.7 kB` (decimal units).
pub fn size(bytes: f64) -> String {
    match bytes {
        b if b >= 1e9 => format!("{:.1} GB", b / 1e9),
        b if b >= 1e6 => format!("{:.1} MB", b / 1e6),
        b => format!("{:.1} kB", b / 1e3),
    }
}

/// The first value `list` gives twice, if any (`--depth 0,0`).
pub fn repeated(list: &[usize]) -> Option<usize> {
    list.iter()
        .enumerate()
        .find(|(i, v)| list[..*i].contains(v))
        .map(|(_, &v)| v)
}

/// One row's figures at one point of the sweep (results.json `speed_points`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct PointSpeed {
    /// The test's name ([`test_name`]): `pp512`, `tg128@d4096`, `tg128@d4096/t1`.
    pub test: String,
    /// `pp` or `tg`.
    pub kind: String,
    /// Prompt tokens (pp) or generated tokens (tg) timed.
    pub tokens: usize,
    /// Tokens in the cache before the timed test (llama-bench's `n_depth`).
    pub depth: usize,
    pub threads: usize,
    /// Whether this is the run's first point, whose figures are also the row's `pp_*`/`tg_*`.
    pub primary: bool,
    pub tokens_per_s: Option<f64>,
    pub tokens_per_s_std: Option<f64>,
    pub samples_tokens_per_s: Vec<f64>,
    /// The round (0-based, `speed_rounds`) of each sample: the pairs of [`super::speed_ratios`].
    pub rounds: Vec<usize>,
    /// llama-bench's flash-attention setting of these figures (its `flash_attn`, `-fa 1` =
    /// true): under `--llama-fa best` the setting with the higher mean of the two measured,
    /// else the one run. Absent for rows without the setting (kwk's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flash_attn: Option<bool>,
    /// Every flash-attention setting llama-bench measured at this point with its figures
    /// (both under `--llama-fa best`, the loser's kept for the reader); empty for kwk rows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_flash_attn: Vec<FlashAttnSpeed>,
}

/// One flash-attention setting's figures at a point (`PointSpeed::by_flash_attn`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FlashAttnSpeed {
    pub flash_attn: bool,
    pub tokens_per_s: f64,
    pub tokens_per_s_std: f64,
    pub samples_tokens_per_s: Vec<f64>,
    /// The round of each sample.
    pub rounds: Vec<usize>,
}

impl PointSpeed {
    /// The name of this point's paired ratios (`speed_ratios[].test`): the plain `pp`/`tg`
    /// of the primary point when its name is plain (depth 0, one thread count), as runs
    /// before the sweep named them; the test's name otherwise.
    pub fn ratio_test(&self) -> String {
        ratio_test(&self.kind, &self.test, self.primary)
    }
}

/// See [`PointSpeed::ratio_test`].
pub fn ratio_test(kind: &str, test: &str, primary: bool) -> String {
    if primary && !test.contains(['@', '/']) {
        kind.to_string()
    } else {
        test.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tests_are_named_after_their_point() {
        assert_eq!(test_name("pp", 512, 0, None), "pp512");
        assert_eq!(test_name("tg", 128, 4096, None), "tg128@d4096");
        assert_eq!(test_name("tg", 128, 4096, Some(1)), "tg128@d4096/t1");
        assert_eq!(test_name("pp", 16, 0, Some(2)), "pp16/t2");
        let mut a = SpeedAxes::single(512, 128, 2);
        assert!(a.is_single() && !a.threads_swept());
        assert_eq!(a.test_name("pp", 512, 0, 2), "pp512");
        a.threads = vec![1, 2];
        assert_eq!(a.test_name("pp", 512, 64, 1), "pp512@d64/t1");
        assert_eq!(ratio_test("pp", "pp512", true), "pp");
        assert_eq!(ratio_test("pp", "pp512", false), "pp512");
        assert_eq!(ratio_test("tg", "tg128@d64", true), "tg128@d64");
    }

    #[test]
    fn specs_pair_pp_and_tg_by_position_within_threads_and_depths() {
        let a = SpeedAxes::single(512, 128, 2);
        let s = a.specs(3);
        assert_eq!(s.len(), 1);
        assert_eq!(
            (s[0].pp, s[0].tg, s[0].depth, s[0].threads),
            (512, 128, 0, 2)
        );
        let a = SpeedAxes {
            pp: vec![16, 32],
            tg: vec![4],
            depth: vec![0, 64],
            threads: vec![1, 2],
        };
        let got: Vec<_> = a
            .specs(1)
            .iter()
            .map(|s| (s.threads, s.depth, s.pp, s.tg))
            .collect();
        assert_eq!(
            got,
            [
                (1, 0, 16, 4),
                (1, 0, 32, 0),
                (1, 64, 16, 4),
                (1, 64, 32, 0),
                (2, 0, 16, 4),
                (2, 0, 32, 0),
                (2, 64, 16, 4),
                (2, 64, 32, 0)
            ]
        );
        assert_eq!(a.longest_test(), 64 + 32);
    }

    #[test]
    fn a_value_given_twice_is_found() {
        assert_eq!(repeated(&[0, 512, 4096]), None);
        assert_eq!(repeated(&[1, 2, 1, 2]), Some(1));
    }
}

//! Choosing the next token from a row of logits: greedy (temperature 0), or temperature,
//! top-k and top-p (nucleus) sampling driven by a seeded xorshift64* generator, so a seed
//! reproduces a generation exactly.

use super::Sampling;

/// xorshift64* (Vigna 2016): small, fast, good enough to pick tokens.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // splitmix64 of the seed, so that seeds 0, 1, 2... start far apart and never at 0.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        Rng(if z == 0 { 1 } else { z })
    }

    /// The generator at raw state `state` (non-zero), without [`Rng::new`]'s seed mixing:
    /// tests that fix their sequences by state.
    pub fn from_state(state: u64) -> Self {
        assert_ne!(state, 0, "xorshift64* needs a non-zero state");
        Rng(state)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Index of the largest logit (the first one on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Picks a token from `logits` under `s`.
pub fn sample(logits: &[f32], s: &Sampling, rng: &mut Rng) -> u32 {
    if s.temperature <= 0.0 || logits.len() <= 1 {
        return argmax(logits);
    }
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    // Descending by logit; ties by index for determinism.
    order.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    if s.top_k > 0 && s.top_k < order.len() {
        order.truncate(s.top_k);
    }
    let max = logits[order[0] as usize];
    let inv_t = 1.0 / s.temperature as f64;
    let mut probs: Vec<f64> = order
        .iter()
        .map(|&i| ((logits[i as usize] - max) as f64 * inv_t).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    if s.top_p > 0.0 && s.top_p < 1.0 {
        let mut cum = 0.0;
        let mut keep = probs.len();
        for (i, p) in probs.iter().enumerate() {
            cum += p;
            if cum >= s.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        probs.truncate(keep);
        order.truncate(keep);
    }
    let total: f64 = probs.iter().sum();
    let mut u = rng.next_f64() * total;
    for (i, p) in probs.iter().enumerate() {
        if u < *p {
            return order[i];
        }
        u -= p;
    }
    order[probs.len() - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling(temperature: f32, top_k: usize, top_p: f32) -> Sampling {
        Sampling {
            temperature,
            top_k,
            top_p,
            seed: 7,
        }
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut rng = Rng::new(1);
        assert_eq!(
            sample(&[0.1, 3.0, 3.0, -1.0], &sampling(0.0, 0, 1.0), &mut rng),
            1
        );
    }

    #[test]
    fn top_k_one_is_greedy_and_seeds_reproduce() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 7919) % 97) as f32 / 10.0).collect();
        let mut rng = Rng::new(3);
        for _ in 0..20 {
            assert_eq!(
                sample(&logits, &sampling(1.0, 1, 1.0), &mut rng),
                argmax(&logits)
            );
        }
        let run = |seed| {
            let mut rng = Rng::new(seed);
            (0..30)
                .map(|_| sample(&logits, &sampling(1.0, 0, 0.9), &mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(11), run(11));
        assert_ne!(run(11), run(12));
    }

    #[test]
    fn top_p_keeps_only_the_nucleus_and_frequencies_follow_probabilities() {
        // probabilities ~ [0.6, 0.3, 0.1] at temperature 1.
        let logits = [0.6f32.ln(), 0.3f32.ln(), 0.1f32.ln()];
        let mut rng = Rng::new(5);
        let mut counts = [0usize; 3];
        for _ in 0..20000 {
            counts[sample(&logits, &sampling(1.0, 0, 0.8), &mut rng) as usize] += 1;
        }
        assert_eq!(counts[2], 0, "token outside the 0.8 nucleus was sampled");
        let f0 = counts[0] as f64 / 20000.0;
        assert!((f0 - 2.0 / 3.0).abs() < 0.02, "{f0}");
    }
}

//! Helpers shared by the benchmark examples (not an example itself: no `main.rs`).

/// `n` deterministic pseudo-random weights in [-0.05, 0.05) (xorshift64 from `seed`).
pub fn pseudo(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
        })
        .collect()
}

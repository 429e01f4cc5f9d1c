//! Deterministic pseudo-random test data shared by the crate's unit tests (test builds
//! only).

/// `n` values uniform in [-1, 1): xorshift64 (shifts 13, 7, 17) from `seed` mixed by the
/// golden-ratio constant, the top 24 bits of each state as the fraction.
pub(crate) fn uniform(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

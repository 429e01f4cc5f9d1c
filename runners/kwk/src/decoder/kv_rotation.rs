//! The basis a q8 KV cache stores keys and values in: each head's key (and query) rotated
//! by the orthonormal Walsh-Hadamard matrix of the head dimension, and its value (and the
//! attention output, rotated back) by that of 64 dimensions, before the q8 blocks round
//! them ([`KvRotation`]). The same rule as llama.cpp's `attn_rot` (its `llama-kv-cache.cpp`
//! since PR 21038, on by default for every quantized cache type).

/// Head dimensions of the smallest rotation (and the value rotation's size).
const MIN_ROTATION: usize = 64;

/// The Walsh-Hadamard rotations of a q8 cache's keys and values.
///
/// Why: a q8 block's step is its largest value over 127, so a few large dimensions (the
/// slow RoPE pairs of a key carry most of its norm) make the step coarse for the whole
/// block. The orthonormal Walsh-Hadamard matrix `H` (Sylvester's, `H[a][b] =
/// (-1)^popcount(a & b) / sqrt(n)`, symmetric, `H·H = I`) spreads every dimension over all
/// `n` outputs, so a block's largest value nears its typical one and the same 8 bits
/// carry less error. Attention is unchanged in exact arithmetic: scores are
/// `(H q)·(H k) = q·k`, and `Σ p_j H v_j = H Σ p_j v_j`, which `H` maps back.
/// On SmolLM2-135M (held-out text) it halves the mean squared score error of q8 keys, and
/// the q8 cache's KLD at ctx 4096 falls from 0.000275 to 0.000129, where llama.cpp's q8_0
/// is 0.000235 (`reports/kv-quality-39/README.md`, session 52).
///
/// Sizes follow llama.cpp: keys (and queries) use the largest power of two dividing the
/// head dimension, values 64; a head dimension that is not a multiple of 64 is not rotated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KvRotation {
    /// Dimensions per key rotation (a power of two, at least 64).
    pub key: usize,
    /// Dimensions per value rotation (64).
    pub value: usize,
}

impl KvRotation {
    /// The rotation of a head of `head_dim` dimensions, or `None` when `head_dim` is not a
    /// multiple of 64.
    pub fn for_head_dim(head_dim: usize) -> Option<Self> {
        if head_dim == 0 || !head_dim.is_multiple_of(MIN_ROTATION) {
            return None;
        }
        let mut key = MIN_ROTATION;
        while head_dim.is_multiple_of(2 * key) {
            key *= 2;
        }
        Some(KvRotation {
            key,
            value: MIN_ROTATION,
        })
    }

    /// Rotates one head's key or query (`head_dim` long) in place.
    pub fn rotate_key(&self, x: &mut [f32]) {
        x.chunks_exact_mut(self.key).for_each(walsh_hadamard);
    }

    /// Rotates one head's value, or rotates an attention output back (`H` is its own
    /// inverse), in place.
    pub fn rotate_value(&self, x: &mut [f32]) {
        x.chunks_exact_mut(self.value).for_each(walsh_hadamard);
    }
}

/// `x ← H x` for the orthonormal Walsh-Hadamard matrix of `x.len()` (a power of two):
/// the fast transform's butterflies `(a, b) → (a + b, a - b)`, then `1/sqrt(n)`.
pub(crate) fn walsh_hadamard(x: &mut [f32]) {
    let n = x.len();
    debug_assert!(n.is_power_of_two());
    let mut h = 1;
    while h < n {
        for pair in x.chunks_exact_mut(2 * h) {
            let (a, b) = pair.split_at_mut(h);
            for (a, b) in a.iter_mut().zip(b.iter_mut()) {
                let (s, d) = (*a + *b, *a - *b);
                *a = s;
                *b = d;
            }
        }
        h *= 2;
    }
    let norm = 1.0 / (n as f32).sqrt();
    x.iter_mut().for_each(|v| *v *= norm);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sylvester's matrix entry by entry: `(-1)^popcount(a & b) / sqrt(n)`.
    fn naive(x: &[f32]) -> Vec<f64> {
        let n = x.len();
        (0..n)
            .map(|a| {
                (0..n)
                    .map(|b| {
                        let sign = if (a & b).count_ones() % 2 == 0 {
                            1.0
                        } else {
                            -1.0
                        };
                        sign * x[b] as f64
                    })
                    .sum::<f64>()
                    / (n as f64).sqrt()
            })
            .collect()
    }

    use crate::test_values::uniform as values;

    #[test]
    fn sizes_follow_llama_cpp() {
        let r = |hd| KvRotation::for_head_dim(hd).map(|r| (r.key, r.value));
        assert_eq!(r(64), Some((64, 64)));
        assert_eq!(r(128), Some((128, 64)));
        assert_eq!(r(192), Some((64, 64)));
        assert_eq!(r(256), Some((256, 64)));
        assert_eq!(r(80), None);
        assert_eq!(r(96), None);
        assert_eq!(r(0), None);
    }

    #[test]
    fn fast_transform_is_sylvesters_matrix_and_its_own_inverse() {
        for n in [1, 2, 8, 64, 256] {
            let x = values(n, n as u64 + 7);
            let mut y = x.clone();
            walsh_hadamard(&mut y);
            for (a, b) in y.iter().zip(naive(&x)) {
                assert!((*a as f64 - b).abs() < 1e-5, "n {n}: {a} vs {b}");
            }
            walsh_hadamard(&mut y);
            for (a, b) in y.iter().zip(&x) {
                assert!((a - b).abs() < 1e-5, "n {n}: H·H x = {a}, x = {b}");
            }
        }
    }

    #[test]
    fn rotating_query_and_key_keeps_their_dot_product() {
        let rot = KvRotation::for_head_dim(128).unwrap();
        let (q, k) = (values(128, 3), values(128, 5));
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        let (mut qr, mut kr) = (q.clone(), k.clone());
        rot.rotate_key(&mut qr);
        rot.rotate_key(&mut kr);
        assert!((dot(&qr, &kr) - dot(&q, &k)).abs() < 1e-4);
    }

    /// The point of the rotation: a key whose norm sits in a few dimensions (as RoPE's
    /// slow pairs make it) rounds to q8 with a far smaller error once rotated.
    #[test]
    fn rotation_shrinks_q8_error_of_a_key_with_outlier_dimensions() {
        use crate::kernels::attention::quantize_q8_blocks;
        let rot = KvRotation::for_head_dim(64).unwrap();
        let mut k = values(64, 11);
        k[40] = 20.0;
        k[41] = -15.0;
        let q8_error = |x: &[f32]| {
            let mut codes = vec![0i8; 64];
            let mut scales = vec![0f32; 2];
            quantize_q8_blocks(x, &mut codes, &mut scales);
            x.iter()
                .enumerate()
                .map(|(i, &v)| (v - codes[i] as f32 * scales[i / 32]).powi(2))
                .sum::<f32>()
        };
        let plain = q8_error(&k);
        let mut kr = k.clone();
        rot.rotate_key(&mut kr);
        let rotated = q8_error(&kr);
        assert!(rotated * 4.0 < plain, "rotated {rotated} vs plain {plain}");
    }
}

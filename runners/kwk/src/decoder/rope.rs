//! Rotary position embeddings in Hugging Face's rotate-half (NeoX) layout: dimension `i`
//! of a head pairs with `i + head_dim/2`. Frequencies follow HF
//! (`inv_freq[i] = theta^(-2i/head_dim)`), with Llama 3's frequency remap
//! (`_compute_llama3_parameters` in transformers' `modeling_rope_utils.py`) when the model
//! asks for it. cos/sin are tabulated per position at construction, computed in f64.

use crate::model::RopeScaling;

pub struct Rope {
    half: usize,
    /// `[position][half]`.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// The inverse frequencies of the `head_dim / 2` rotation pairs.
pub fn inverse_frequencies(head_dim: usize, theta: f64, scaling: &RopeScaling) -> Vec<f64> {
    let half = head_dim / 2;
    let base: Vec<f64> = (0..half)
        .map(|i| 1.0 / theta.powf((2 * i) as f64 / head_dim as f64))
        .collect();
    match scaling {
        // `runner_unsupported` rejects unknown kinds before a decoder is built.
        RopeScaling::None | RopeScaling::Other(_) => base,
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let (factor, low, high) = (
                *factor as f64,
                *low_freq_factor as f64,
                *high_freq_factor as f64,
            );
            let old_len = *original_max_position_embeddings as f64;
            let low_freq_wavelen = old_len / low;
            let high_freq_wavelen = old_len / high;
            base.iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < high_freq_wavelen {
                        f
                    } else if wavelen > low_freq_wavelen {
                        f / factor
                    } else {
                        let smooth = (old_len / wavelen - low) / (high - low);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}

impl Rope {
    pub fn new(head_dim: usize, theta: f64, scaling: &RopeScaling, max_positions: usize) -> Self {
        let half = head_dim / 2;
        let inv = inverse_frequencies(head_dim, theta, scaling);
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for &f in &inv {
                let angle = p as f64 * f;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Rope { half, cos, sin }
    }

    /// Rotates every head (`head_dim` values each) of `x` for position `pos`.
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let h = self.half;
        let cos = &self.cos[pos * h..(pos + 1) * h];
        let sin = &self.sin[pos * h..(pos + 1) * h];
        for head in x.chunks_exact_mut(2 * h) {
            let (a, b) = head.split_at_mut(h);
            for i in 0..h {
                let (x0, x1) = (a[i], b[i]);
                a[i] = x0 * cos[i] - x1 * sin[i];
                b[i] = x1 * cos[i] + x0 * sin[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_remap_matches_transformers_regions() {
        // Llama 3.1: factor 8, low 1, high 4, original 8192; head_dim 128, theta 5e5.
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let base = inverse_frequencies(128, 500000.0, &RopeScaling::None);
        let scaled = inverse_frequencies(128, 500000.0, &s);
        // High frequencies (wavelength < 2048) unchanged, low ones (> 8192) divided by 8.
        assert_eq!(scaled[0], base[0]);
        assert!((scaled[63] - base[63] / 8.0).abs() < 1e-18);
        // Medium band: strictly between f/8 and f.
        let mid = (0..64)
            .find(|&i| {
                let w = 2.0 * std::f64::consts::PI / base[i];
                (2048.0..=8192.0).contains(&w)
            })
            .unwrap();
        assert!(scaled[mid] < base[mid] && scaled[mid] > base[mid] / 8.0);
    }

    #[test]
    fn rotation_keeps_norms_and_is_identity_at_zero() {
        let rope = Rope::new(8, 10000.0, &RopeScaling::None, 16);
        let orig: Vec<f32> = (0..16).map(|i| i as f32 - 7.5).collect();
        let mut x = orig.clone();
        rope.apply(&mut x, 0);
        assert_eq!(x, orig);
        rope.apply(&mut x, 5);
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-3);
        // Pair (0, 4) of the first head at position 5 with frequency 1: angle 5.
        let (c, s) = (5f64.cos() as f32, 5f64.sin() as f32);
        assert!((x[0] - (orig[0] * c - orig[4] * s)).abs() < 1e-5);
        assert!((x[4] - (orig[4] * c + orig[0] * s)).abs() < 1e-5);
    }
}

//! Activations quantized to int8 blocks of 32 (one f32 scale per block, like llama.cpp's
//! Q8_0 `vec_dot_type`), once per matmul input, for the int8/int4 VNNI kernels.
//! This is the scalar specification; SIMD versions must match it exactly.

/// Values per activation block.
pub const Q8_BLOCK: usize = 32;

/// Quantizes `x` (`n_rows` rows of `dim` values, `dim % 32 == 0`) into `quants`, one
/// `scales` entry per block (`amax / 127`) and `block_sums` (sum of the block's int8 values).
/// Rounding is to nearest, ties away from zero.
pub fn quantize_rows_q8(
    x: &[f32],
    dim: usize,
    quants: &mut [i8],
    scales: &mut [f32],
    block_sums: &mut [i32],
) {
    assert_eq!(
        dim % Q8_BLOCK,
        0,
        "activation width must be a multiple of 32"
    );
    let n_blocks = x.len() / Q8_BLOCK;
    assert!(quants.len() >= x.len() && scales.len() >= n_blocks && block_sums.len() >= n_blocks);
    for b in 0..n_blocks {
        let xs = &x[b * Q8_BLOCK..(b + 1) * Q8_BLOCK];
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (i, v) in xs.iter().enumerate() {
            let q = (v * inv).round().clamp(-127.0, 127.0) as i8;
            quants[b * Q8_BLOCK + i] = q;
            sum += q as i32;
        }
        scales[b] = d;
        block_sums[b] = sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_error_is_within_half_a_step() {
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let mut q = vec![0i8; 96];
        let mut s = vec![0f32; 3];
        let mut sums = vec![0i32; 3];
        quantize_rows_q8(&x, 96, &mut q, &mut s, &mut sums);
        for (i, v) in x.iter().enumerate() {
            let back = q[i] as f32 * s[i / 32];
            assert!(
                (back - v).abs() <= s[i / 32] * 0.5 + 1e-7,
                "{i}: {v} vs {back}"
            );
        }
        for b in 0..3 {
            assert_eq!(
                sums[b],
                q[b * 32..(b + 1) * 32]
                    .iter()
                    .map(|&v| v as i32)
                    .sum::<i32>()
            );
        }
    }
}

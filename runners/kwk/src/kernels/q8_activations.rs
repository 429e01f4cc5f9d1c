//! Activations quantized to int8 blocks of 32 (one f32 scale per block, like llama.cpp's
//! Q8_0 `vec_dot_type`), once per matmul input, for the int8/int4 kernels.
//! `quantize_rows_q8_scalar` is the specification; [`quantize_rows_q8`] runs the AVX-512
//! version when the quantized kernels' path (`quant::selected_isa`) is an AVX-512
//! tier (`vnni` or `avx512bw`) and the AVX2 version on the 256-bit tiers; both match it
//! exactly for finite inputs (same division, multiply and rounding; the
//! half-away-from-zero rounding is built from truncation, whose remainder is exact).
//! The AVX-512 version takes 16 blocks at a time, so their maxima and code sums reduce
//! across lanes in one tree and the scales come from one vector division; with its sign
//! steps in AVX-512F integer operations (the `_ps` bit operations need AVX512DQ and were
//! function calls) its share of an int8 pp512 profile (`amx` tier, relative to the
//! matmul kernel's) fell by a third, from 4.8 % to about 3 % of the samples.

/// Values per activation block.
pub const Q8_BLOCK: usize = 32;

/// Quantizes `x` (`n_rows` rows of `dim` values, `dim % 32 == 0`) into `quants`, one
/// `scales` entry per block (`amax / 127`) and `block_sums` (sum of the block's int8 values).
/// Rounding is to nearest, ties away from zero. A block holding NaN or ±Inf gets a NaN
/// scale ([`poison_non_finite_blocks`]), so the matmul gives NaN rather than a number.
pub fn quantize_rows_q8(
    x: &[f32],
    dim: usize,
    quants: &mut [i8],
    scales: &mut [f32],
    block_sums: &mut [i32],
) {
    quantize_rows_q8_codes(x, dim, quants, scales, block_sums);
    poison_non_finite_blocks(x, scales);
}

/// Sets the scale of every 32-value block of `x` holding NaN or ±Inf to NaN. Rounding made
/// finite codes of them (NaN becomes 0, Inf saturates to ±127), which would hide the
/// fault; a NaN scale carries it into every product of the block. One branch-free pass
/// over the activations (a matmul reads each of them `rows` times).
pub fn poison_non_finite_blocks(x: &[f32], scales: &mut [f32]) {
    for (xs, s) in x.chunks_exact(Q8_BLOCK).zip(scales.iter_mut()) {
        if xs.iter().fold(false, |bad, v| bad | !v.is_finite()) {
            *s = f32::NAN;
        }
    }
}

fn quantize_rows_q8_codes(
    x: &[f32],
    dim: usize,
    quants: &mut [i8],
    scales: &mut [f32],
    block_sums: &mut [i32],
) {
    #[cfg(target_arch = "x86_64")]
    if matches!(
        super::quant::selected_isa(),
        super::quant::QuantIsa::Avx512Vnni
            | super::quant::QuantIsa::Amx
            | super::quant::QuantIsa::Avx512Bw
    ) {
        check_lengths(x, dim, quants, scales, block_sums);
        // SAFETY: AVX-512 F/BW are present (the path was selected on them) and the
        // lengths were checked.
        unsafe { avx512::quantize_rows_q8(x, quants, scales, block_sums) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(
        super::quant::selected_isa(),
        super::quant::QuantIsa::Avx2 | super::quant::QuantIsa::AvxVnni
    ) {
        check_lengths(x, dim, quants, scales, block_sums);
        // SAFETY: AVX2 is present (the path was selected on it) and the lengths were
        // checked.
        unsafe { avx2::quantize_rows_q8(x, quants, scales, block_sums) };
        return;
    }
    quantize_rows_q8_scalar(x, dim, quants, scales, block_sums)
}

fn check_lengths(x: &[f32], dim: usize, quants: &[i8], scales: &[f32], block_sums: &[i32]) {
    assert_eq!(
        dim % Q8_BLOCK,
        0,
        "activation width must be a multiple of 32"
    );
    assert_eq!(x.len() % Q8_BLOCK, 0);
    let n_blocks = x.len() / Q8_BLOCK;
    assert!(quants.len() >= x.len() && scales.len() >= n_blocks && block_sums.len() >= n_blocks);
}

/// The specification of [`quantize_rows_q8`].
pub fn quantize_rows_q8_scalar(
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

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::Q8_BLOCK;
    use std::arch::x86_64::*;

    /// Blocks quantized together: their maxima and sums are reduced across the 16 lanes
    /// of one register at once (a transpose-and-reduce tree) instead of one horizontal
    /// reduction per block, and the 16 scales come from one vector division.
    const GROUP: usize = 16;

    /// # Safety
    /// AVX-512 F/BW present; `x.len()` a multiple of 32 and the outputs long enough.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn quantize_rows_q8(
        x: &[f32],
        quants: &mut [i8],
        scales: &mut [f32],
        block_sums: &mut [i32],
    ) {
        let n_blocks = x.len() / Q8_BLOCK;
        let whole = n_blocks - n_blocks % GROUP;
        let mut b = 0;
        // SAFETY: blocks b..b+16 (b + 16 <= n_blocks) and the single blocks after them are
        // in bounds of every slice by the caller's contract.
        unsafe {
            while b < whole {
                quantize_group(x, quants, scales, block_sums, b);
                b += GROUP;
            }
            while b < n_blocks {
                quantize_block(x, quants, scales, block_sums, b);
                b += 1;
            }
        }
    }

    /// `|v|` of a block's 32 values as two registers.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn block_abs(x: &[f32], b: usize) -> [__m512; 2] {
        // SAFETY: the caller's contract covers block b of `x`.
        unsafe {
            let p = x.as_ptr().add(b * Q8_BLOCK);
            [
                _mm512_abs_ps(_mm512_loadu_ps(p)),
                _mm512_abs_ps(_mm512_loadu_ps(p.add(16))),
            ]
        }
    }

    /// Reduces 16 registers to one whose lane `i` combines all lanes of `v[i]` (`op` is
    /// max or add, on f32 lanes or on i32 lanes viewed as f32 bits): four levels of
    /// 128-bit-chunk and in-chunk shuffles, then the 4 × 4 lane transpose they leave
    /// undone.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn reduce_lanes(v: [__m512; 16], op: impl Fn(__m512, __m512) -> __m512) -> __m512 {
        // Level 1: pair (a, b) -> chunks [a0 ∘ a2, a1 ∘ a3, b0 ∘ b2, b1 ∘ b3].
        let l1: [__m512; 8] = std::array::from_fn(|i| {
            let (a, b) = (v[2 * i], v[2 * i + 1]);
            op(
                _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
                _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
            )
        });
        // Level 2: chunks become one block each: [B0, B1, B2, B3] of 4 partial lanes.
        let l2: [__m512; 4] = std::array::from_fn(|i| {
            let (c, d) = (l1[2 * i], l1[2 * i + 1]);
            op(
                _mm512_shuffle_f32x4::<0b10_00_10_00>(c, d),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(c, d),
            )
        });
        // Level 3: chunk k holds blocks 4i + k and 4i + 4 + k, two partial lanes each.
        let l3: [__m512; 2] = std::array::from_fn(|i| {
            let (e, f) = (l2[2 * i], l2[2 * i + 1]);
            op(
                _mm512_shuffle_ps::<0b01_00_01_00>(e, f),
                _mm512_shuffle_ps::<0b11_10_11_10>(e, f),
            )
        });
        // Level 4: lane 4k + m holds block 4m + k.
        let l4 = op(
            _mm512_shuffle_ps::<0b10_00_10_00>(l3[0], l3[1]),
            _mm512_shuffle_ps::<0b11_01_11_01>(l3[0], l3[1]),
        );
        // Lane i = block i: read lane 4 (i % 4) + i / 4.
        let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        _mm512_permutexvar_ps(order, l4)
    }

    /// Round half away from zero, clamp to ±127, truncate: one register of codes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn round_codes(v: __m512, inv: __m512) -> __m512i {
        let s = _mm512_mul_ps(v, inv);
        let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(s);
        let frac = _mm512_abs_ps(_mm512_sub_ps(s, t));
        let away = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, _mm512_set1_ps(0.5));
        // ±1 with the sign of s (integer bit operations: the `_ps` forms need AVX512DQ,
        // and without it they were function calls inside this loop).
        let sign = _mm512_and_si512(_mm512_castps_si512(s), _mm512_set1_epi32(i32::MIN));
        let step = _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_set1_epi32(0x3f80_0000)));
        let r = _mm512_mask_add_ps(t, away, t, step);
        let lim = _mm512_set1_ps(127.0);
        let r = _mm512_max_ps(
            _mm512_min_ps(r, lim),
            _mm512_sub_ps(_mm512_setzero_ps(), lim),
        );
        _mm512_cvttps_epi32(r)
    }

    /// Block `b`'s codes at `1 / d = inv` into `quants`; returns the two halves' codes
    /// added lane by lane (16 partial sums of the block's codes).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn encode_block(x: &[f32], quants: &mut [i8], b: usize, inv: __m512) -> __m512i {
        // SAFETY: the caller's contract covers block b of `x` and `quants`.
        unsafe {
            let p = x.as_ptr().add(b * Q8_BLOCK);
            let q0 = round_codes(_mm512_loadu_ps(p), inv);
            let q1 = round_codes(_mm512_loadu_ps(p.add(16)), inv);
            let out = quants.as_mut_ptr().add(b * Q8_BLOCK);
            _mm_storeu_si128(out as *mut _, _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128(out.add(16) as *mut _, _mm512_cvtepi32_epi8(q1));
            _mm512_add_epi32(q0, q1)
        }
    }

    /// Blocks `b0..b0 + 16`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn quantize_group(
        x: &[f32],
        quants: &mut [i8],
        scales: &mut [f32],
        block_sums: &mut [i32],
        b0: usize,
    ) {
        // SAFETY: the caller's contract covers blocks b0..b0 + 16 of every slice.
        unsafe {
            let maxima: [__m512; GROUP] = std::array::from_fn(|i| {
                let [lo, hi] = block_abs(x, b0 + i);
                _mm512_max_ps(lo, hi)
            });
            let amax = reduce_lanes(maxima, |a, b| _mm512_max_ps(a, b));
            let d = _mm512_div_ps(amax, _mm512_set1_ps(127.0));
            let positive = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(d, _mm512_setzero_ps());
            let inv = _mm512_maskz_div_ps(positive, _mm512_set1_ps(1.0), d);
            _mm512_storeu_ps(scales.as_mut_ptr().add(b0), d);
            let mut invs = [0f32; GROUP];
            _mm512_storeu_ps(invs.as_mut_ptr(), inv);
            let sums: [__m512; GROUP] = std::array::from_fn(|i| {
                let codes = encode_block(x, quants, b0 + i, _mm512_set1_ps(invs[i]));
                _mm512_castsi512_ps(codes)
            });
            let add_i32 = |a: __m512, b: __m512| {
                _mm512_castsi512_ps(_mm512_add_epi32(
                    _mm512_castps_si512(a),
                    _mm512_castps_si512(b),
                ))
            };
            let total = reduce_lanes(sums, add_i32);
            _mm512_storeu_si512(
                block_sums.as_mut_ptr().add(b0) as *mut _,
                _mm512_castps_si512(total),
            );
        }
    }

    /// One block `b` (the blocks after the last whole group).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn quantize_block(
        x: &[f32],
        quants: &mut [i8],
        scales: &mut [f32],
        block_sums: &mut [i32],
        b: usize,
    ) {
        // SAFETY: the caller's contract covers block b of every slice.
        unsafe {
            let [lo, hi] = block_abs(x, b);
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(lo, hi));
            let d = amax / 127.0;
            let inv = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
            let codes = encode_block(x, quants, b, inv);
            scales[b] = d;
            block_sums[b] = _mm512_reduce_add_epi32(codes);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::Q8_BLOCK;
    use std::arch::x86_64::*;

    /// The AVX-512 version's operations on four ymm per block.
    ///
    /// # Safety
    /// AVX2 present; `x.len()` a multiple of 32 and the outputs long enough.
    #[target_feature(enable = "avx2")]
    pub unsafe fn quantize_rows_q8(
        x: &[f32],
        quants: &mut [i8],
        scales: &mut [f32],
        block_sums: &mut [i32],
    ) {
        let n_blocks = x.len() / Q8_BLOCK;
        // SAFETY: block b reads x[32b..32b+32] and writes quants[32b..32b+32], scales[b],
        // block_sums[b], all in bounds by the caller's contract.
        unsafe {
            let half = _mm256_set1_ps(0.5);
            let one = _mm256_set1_ps(1.0);
            let lim = _mm256_set1_ps(127.0);
            let sign = _mm256_set1_ps(-0.0);
            // packs interleave 128-bit lanes; this puts the bytes back in order.
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            for b in 0..n_blocks {
                let p = x.as_ptr().add(b * Q8_BLOCK);
                let v = [
                    _mm256_loadu_ps(p),
                    _mm256_loadu_ps(p.add(8)),
                    _mm256_loadu_ps(p.add(16)),
                    _mm256_loadu_ps(p.add(24)),
                ];
                let mut m = _mm256_andnot_ps(sign, v[0]);
                for vh in &v[1..] {
                    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vh));
                }
                let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
                let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
                let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)));
                let d = amax / 127.0;
                let inv = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
                let mut qi = [_mm256_setzero_si256(); 4];
                let mut sum = _mm256_setzero_si256();
                for (h, vh) in v.iter().enumerate() {
                    let s = _mm256_mul_ps(*vh, inv);
                    let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(s);
                    let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(s, t));
                    let away = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, half);
                    let step = _mm256_and_ps(away, _mm256_or_ps(one, _mm256_and_ps(s, sign)));
                    let r = _mm256_add_ps(t, step);
                    let r = _mm256_max_ps(
                        _mm256_min_ps(r, lim),
                        _mm256_sub_ps(_mm256_setzero_ps(), lim),
                    );
                    qi[h] = _mm256_cvttps_epi32(r);
                    sum = _mm256_add_epi32(sum, qi[h]);
                }
                let w01 = _mm256_packs_epi32(qi[0], qi[1]);
                let w23 = _mm256_packs_epi32(qi[2], qi[3]);
                let bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), order);
                _mm256_storeu_si256(quants.as_mut_ptr().add(b * Q8_BLOCK) as *mut _, bytes);
                let s4 = _mm_add_epi32(
                    _mm256_castsi256_si128(sum),
                    _mm256_extracti128_si256::<1>(sum),
                );
                let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
                let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2));
                scales[b] = d;
                block_sums[b] = _mm_cvtsi128_si32(s1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NaN rounds to code 0 and Inf saturates: the block's scale must carry the fault.
    #[test]
    fn non_finite_activations_give_nan_scales() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x: Vec<f32> = (0..128).map(|i| (i as f32 - 60.0) * 0.01).collect();
            x[40] = bad;
            x[127] = bad;
            let (mut q, mut s, mut b) = (vec![0i8; 128], vec![0f32; 4], vec![0i32; 4]);
            quantize_rows_q8(&x, 64, &mut q, &mut s, &mut b);
            assert!(s[0].is_finite() && s[2].is_finite(), "{bad}: {s:?}");
            assert!(s[1].is_nan() && s[3].is_nan(), "{bad}: {s:?}");
        }
    }

    #[test]
    fn round_trip_error_is_within_half_a_step() {
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let mut q = vec![0i8; 96];
        let mut s = vec![0f32; 3];
        let mut sums = vec![0i32; 3];
        quantize_rows_q8_scalar(&x, 96, &mut q, &mut s, &mut sums);
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

    #[test]
    fn simd_version_matches_the_scalar_spec() {
        // Values include exact ties (k + 0.5 steps) and zero blocks.
        let dim = 96;
        // Six rows of three blocks: a group of 16 blocks (the ties in its second) and two
        // single blocks after it.
        let mut x: Vec<f32> = (0..dim * 6)
            .map(|i| (((i * 7919) % 1013) as f32 - 506.0) * 0.0031)
            .collect();
        // amax 127 makes the scale exactly 1, so k + 0.5 values are exact ties.
        x[32] = 127.0;
        for (i, v) in x[33..64].iter_mut().enumerate() {
            *v = i as f32 - 15.0 + 0.5;
        }
        x[64..96].fill(0.0);
        let nb = x.len() / 32;
        let (mut q0, mut s0, mut b0) = (vec![0i8; x.len()], vec![0f32; nb], vec![0i32; nb]);
        let (mut q1, mut s1, mut b1) = (vec![0i8; x.len()], vec![0f32; nb], vec![0i32; nb]);
        quantize_rows_q8_scalar(&x, dim, &mut q0, &mut s0, &mut b0);
        quantize_rows_q8(&x, dim, &mut q1, &mut s1, &mut b1);
        assert_eq!(q0, q1);
        assert_eq!(s0, s1);
        assert_eq!(b0, b1);
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx512bw") {
            let (mut q2, mut s2, mut b2) = (vec![0i8; x.len()], vec![0f32; nb], vec![0i32; nb]);
            // SAFETY: AVX-512 F/BW detected; lengths as the function requires.
            unsafe { avx512::quantize_rows_q8(&x, &mut q2, &mut s2, &mut b2) };
            assert_eq!(q0, q2);
            assert_eq!(s0, s2);
            assert_eq!(b0, b2);
        }
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            let (mut q3, mut s3, mut b3) = (vec![0i8; x.len()], vec![0f32; nb], vec![0i32; nb]);
            // SAFETY: AVX2 detected; lengths as the function requires.
            unsafe { avx2::quantize_rows_q8(&x, &mut q3, &mut s3, &mut b3) };
            assert_eq!(q0, q3);
            assert_eq!(s0, s3);
            assert_eq!(b0, b3);
        }
    }

    #[test]
    fn simd_versions_match_the_scalar_spec_on_random_magnitudes() {
        let dim = 1536;
        let mut st = 0x1234_5678_9abc_def1u64;
        let mut next = || {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            st
        };
        let x: Vec<f32> = (0..dim * 40)
            .map(|i| {
                let u = (next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                // Block magnitudes from 1e-6 to 1e4.
                u * 10f32.powi(((i / 32) % 11) as i32 - 6)
            })
            .collect();
        let nb = x.len() / 32;
        let (mut q0, mut s0, mut b0) = (vec![0i8; x.len()], vec![0f32; nb], vec![0i32; nb]);
        quantize_rows_q8_scalar(&x, dim, &mut q0, &mut s0, &mut b0);
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                let (mut q, mut s, mut b) = (vec![0i8; x.len()], vec![0f32; nb], vec![0i32; nb]);
                // SAFETY: AVX2 detected; lengths as the function requires.
                unsafe { avx2::quantize_rows_q8(&x, &mut q, &mut s, &mut b) };
                assert_eq!(q0, q);
                assert_eq!(s0, s);
                assert_eq!(b0, b);
            }
            if std::is_x86_feature_detected!("avx512bw") {
                let (mut q, mut s, mut b) = (vec![0i8; x.len()], vec![0f32; nb], vec![0i32; nb]);
                // SAFETY: AVX-512 F/BW detected; lengths as the function requires.
                unsafe { avx512::quantize_rows_q8(&x, &mut q, &mut s, &mut b) };
                assert_eq!(q0, q);
                assert_eq!(s0, s);
                assert_eq!(b0, b);
            }
        }
    }
}

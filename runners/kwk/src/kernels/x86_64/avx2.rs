//! AVX2 + FMA kernels for CPUs without AVX-512: float32 and bf16 panel matmuls (tiles of
//! 2 tokens x 2 panels = 8 ymm accumulators, float32 prompts 1 panel x 6 tokens, bf16
//! generation 4 panels; bf16 widened to f32 by shifts) and the vector helpers of
//! attention, SwiGLU and GPTQ (dot products, axpy, `exp` by the polynomial of the AVX-512
//! file, which this tier otherwise took from libm one value at a time). Reached only
//! through `kernels/mod.rs`, which checked the features and the buffer bounds.

use super::{Gate, EXP_LN2_HI, EXP_LN2_LO, EXP_MAX, EXP_MIN, EXP_POLY};
use crate::kernels::{prefetch_hint, OutputMatrix, PanelOperands, GEMV_PREFETCH_BYTES, PANEL_ROWS};
use std::arch::x86_64::*;
use std::ops::Range;

fn assert_features() {
    debug_assert!(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"));
}

/// # Safety
/// AVX2+FMA; `w` holds the panels covering `rows` (`cols*16` elements each, 4 bytes for
/// f32 or 2 for bf16) and `x` holds `n_tokens*cols` elements.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_panels(
    bf16: bool,
    w: *const u8,
    panel_stride: usize,
    cols: usize,
    x: *const u8,
    ldx: usize,
    n_tokens: usize,
    rows: Range<usize>,
    y: &OutputMatrix,
) {
    let elem = if bf16 { 2 } else { 4 };
    let panel_bytes = panel_stride * elem;
    let n_panels = (rows.end - rows.start).div_ceil(PANEL_ROWS);
    let first = rows.start / PANEL_ROWS;
    if !bf16 && n_tokens >= 3 {
        // SAFETY: as this function's contract.
        unsafe { gemm_f32_tall(w, panel_bytes, cols, x, ldx, n_tokens, rows, y) };
        return;
    }
    // bf16 generation (one token) takes four panels at a time, so eight accumulator
    // chains of two FMAs per column pair (odd column, then even) are in flight where the
    // 2 x 1 tile had four: that tile's chains, not the reads, bounded it (71 % of the read
    // roofline at tg128 where float32's one-FMA chains reach 92 %). Each output's FMA
    // chain is the 2 x 1 tile's, so results are identical.
    let max_panels = if bf16 && n_tokens == 1 { 4 } else { 2 };
    let mut p = 0;
    while p < n_panels {
        let take = (n_panels - p).min(max_panels);
        let r0 = (first + p) * PANEL_ROWS;
        let valid = (rows.end - r0).min(take * PANEL_ROWS);
        // SAFETY: panels first+p.. lie inside `w`; token rows t.. inside `x`.
        unsafe {
            let wp = w.add((first + p) * panel_bytes);
            let mut t = 0;
            while t < n_tokens {
                let tt = (n_tokens - t).min(2);
                let xp = x.add(t * ldx * elem);
                match (take, tt, bf16) {
                    (2, 2, false) => {
                        tile_f32::<2, 2>(wp, panel_bytes, cols, ldx, xp, t, r0, valid, y)
                    }
                    (2, 1, false) => {
                        tile_f32::<2, 1>(wp, panel_bytes, cols, ldx, xp, t, r0, valid, y)
                    }
                    (1, 2, false) => {
                        tile_f32::<1, 2>(wp, panel_bytes, cols, ldx, xp, t, r0, valid, y)
                    }
                    (1, 1, false) => {
                        tile_f32::<1, 1>(wp, panel_bytes, cols, ldx, xp, t, r0, valid, y)
                    }
                    (2, 2, true) => {
                        tile_bf16::<2, 2>(wp, panel_bytes, cols, ldx, xp, t, r0, valid, y)
                    }
                    (2, 1, true) => {
                        tile_bf16::<2, 1>(wp, panel_bytes, cols, ldx, xp, t, r0, valid, y)
                    }
                    (1, 2, true) => {
                        tile_bf16::<1, 2>(wp, panel_bytes, cols, ldx, xp, t, r0, valid, y)
                    }
                    (1, 1, true) => {
                        tile_bf16::<1, 1>(wp, panel_bytes, cols, ldx, xp, t, r0, valid, y)
                    }
                    (4, 1, true) => {
                        tile_bf16::<4, 1>(wp, panel_bytes, cols, ldx, xp, t, r0, valid, y)
                    }
                    (3, 1, true) => {
                        tile_bf16::<3, 1>(wp, panel_bytes, cols, ldx, xp, t, r0, valid, y)
                    }
                    _ => unreachable!(),
                }
                t += tt;
            }
        }
        p += take;
    }
}

/// Float32 prompts: one panel at a time against tiles of up to six tokens (12 ymm
/// accumulators). Per column a 64-byte panel line feeds 12 FMAs; the 2 x 2 tile's 128 bytes
/// per 8 FMAs would need the whole L2-to-L1 bandwidth once a panel pair (16 rows x 2 x
/// `cols` f32) outgrows L1, as the models' 576-and-wider panels do. Each output is the same
/// FMA chain over the columns in order, so results are identical to the 2 x 2 tile's.
///
/// # Safety
/// As [`gemm_panels`] (float32).
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_f32_tall(
    w: *const u8,
    panel_bytes: usize,
    cols: usize,
    x: *const u8,
    ldx: usize,
    n_tokens: usize,
    rows: Range<usize>,
    y: &OutputMatrix,
) {
    let n_panels = (rows.end - rows.start).div_ceil(PANEL_ROWS);
    let first = rows.start / PANEL_ROWS;
    for p in 0..n_panels {
        let r0 = (first + p) * PANEL_ROWS;
        let valid = (rows.end - r0).min(PANEL_ROWS);
        // SAFETY: panel first+p lies inside `w`; token rows t.. inside `x`.
        unsafe {
            let wp = w.add((first + p) * panel_bytes);
            let mut t = 0;
            while t < n_tokens {
                let tt = (n_tokens - t).min(6);
                let xp = x.add(t * ldx * 4);
                match tt {
                    6 => tile_f32::<1, 6>(wp, panel_bytes, cols, ldx, xp, t, r0, valid, y),
                    5 => tile_f32::<1, 5>(wp, panel_bytes, cols, ldx, xp, t, r0, valid, y),
                    4 => tile_f32::<1, 4>(wp, panel_bytes, cols, ldx, xp, t, r0, valid, y),
                    3 => tile_f32::<1, 3>(wp, panel_bytes, cols, ldx, xp, t, r0, valid, y),
                    2 => tile_f32::<1, 2>(wp, panel_bytes, cols, ldx, xp, t, r0, valid, y),
                    _ => tile_f32::<1, 1>(wp, panel_bytes, cols, ldx, xp, t, r0, valid, y),
                }
                t += tt;
            }
        }
    }
}

/// Writes a finished tile (`P` panels of two ymm each, `T` tokens).
#[target_feature(enable = "avx2,fma")]
fn store_tile<const P: usize, const T: usize>(
    acc: &[[[__m256; 2]; P]; T],
    t0: usize,
    r0: usize,
    valid: usize,
    y: &OutputMatrix,
) {
    let mut buf = [[0f32; PANEL_ROWS]; P];
    for (t, a) in acc.iter().enumerate() {
        for p in 0..P {
            // SAFETY: `buf[p]` holds 16 f32: two stores of 8.
            unsafe {
                _mm256_storeu_ps(buf[p].as_mut_ptr(), a[p][0]);
                _mm256_storeu_ps(buf[p].as_mut_ptr().add(8), a[p][1]);
            }
        }
        if valid == P * PANEL_ROWS {
            for (p, panel) in buf.iter().enumerate() {
                y.write_array(t0 + t, r0 + p * PANEL_ROWS, panel);
            }
        } else {
            y.write_cols(t0 + t, r0, &buf.as_flattened()[..valid]);
        }
    }
}

/// # Safety
/// As [`gemm_panels`]; `w` points at the first of `P` f32 panels, `x` at `T` token rows.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_f32<const P: usize, const T: usize>(
    w: *const u8,
    panel_bytes: usize,
    cols: usize,
    ldx: usize,
    x: *const u8,
    t0: usize,
    r0: usize,
    valid: usize,
    y: &OutputMatrix,
) {
    let w = w as *const f32;
    let x = x as *const f32;
    let ps = panel_bytes / 4;
    let mut acc = [[[_mm256_setzero_ps(); 2]; P]; T];
    for k in 0..cols {
        let mut wv = [[_mm256_setzero_ps(); 2]; P];
        for (p, v) in wv.iter_mut().enumerate() {
            // SAFETY: element k of panel p (16 f32) lies inside `w`.
            unsafe {
                v[0] = _mm256_loadu_ps(w.add(p * ps + k * PANEL_ROWS));
                v[1] = _mm256_loadu_ps(w.add(p * ps + k * PANEL_ROWS + 8));
            }
        }
        for (t, a) in acc.iter_mut().enumerate() {
            // SAFETY: column k of token row t lies inside `x`.
            let xb = _mm256_set1_ps(unsafe { *x.add(t * ldx + k) });
            for p in 0..P {
                a[p][0] = _mm256_fmadd_ps(wv[p][0], xb, a[p][0]);
                a[p][1] = _mm256_fmadd_ps(wv[p][1], xb, a[p][1]);
            }
        }
    }
    store_tile::<P, T>(&acc, t0, r0, valid, y);
}

/// # Safety
/// As [`gemm_panels`]; `w` points at the first of `P` bf16 panels, `x` at `T` bf16 rows.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_bf16<const P: usize, const T: usize>(
    w: *const u8,
    panel_bytes: usize,
    cols: usize,
    ldx: usize,
    x: *const u8,
    t0: usize,
    r0: usize,
    valid: usize,
    y: &OutputMatrix,
) {
    let w = w as *const u16;
    let x = x as *const u16;
    let ps = panel_bytes / 2;
    let hi = _mm256_set1_epi32(0xffff_0000u32 as i32);
    let mut acc = [[[_mm256_setzero_ps(); 2]; P]; T];
    for j in 0..cols / 2 {
        // even/odd columns of 8 rows per ymm: [panel][half]
        let mut even = [[_mm256_setzero_ps(); 2]; P];
        let mut odd = [[_mm256_setzero_ps(); 2]; P];
        for p in 0..P {
            if T == 1 {
                // Generation: the weights asked for ahead of the reads.
                let at = w.wrapping_add(p * ps + j * 2 * PANEL_ROWS) as *const u8;
                prefetch_hint(at.wrapping_add(GEMV_PREFETCH_BYTES), 1);
            }
            for h in 0..2 {
                // SAFETY: 16 u16 (8 rows x 2 columns) of pair j of panel p lie inside `w`.
                let v = unsafe {
                    _mm256_loadu_si256(w.add(p * ps + j * 2 * PANEL_ROWS + h * 16) as *const _)
                };
                even[p][h] = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v));
                odd[p][h] = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
            }
        }
        for (t, a) in acc.iter_mut().enumerate() {
            // SAFETY: columns 2j, 2j+1 of token row t lie inside `x`.
            let (x0, x1) = unsafe { (*x.add(t * ldx + 2 * j), *x.add(t * ldx + 2 * j + 1)) };
            let x0 = _mm256_set1_ps(f32::from_bits((x0 as u32) << 16));
            let x1 = _mm256_set1_ps(f32::from_bits((x1 as u32) << 16));
            for p in 0..P {
                for h in 0..2 {
                    a[p][h] = _mm256_fmadd_ps(odd[p][h], x1, a[p][h]);
                    a[p][h] = _mm256_fmadd_ps(even[p][h], x0, a[p][h]);
                }
            }
        }
    }
    store_tile::<P, T>(&acc, t0, r0, valid, y);
}

/// See [`crate::kernels::gemm_f32_panels_strided`].
pub(crate) fn gemm_f32_panels(op: &PanelOperands<f32>, rows: Range<usize>, y: &OutputMatrix) {
    let PanelOperands {
        w,
        panel_stride,
        cols,
        x,
        ldx,
        n_tokens,
    } = *op;
    assert_features();
    // SAFETY: the dispatcher checked AVX2+FMA and the bounds of `w` and `x`.
    unsafe {
        gemm_panels(
            false,
            w.as_ptr() as *const u8,
            panel_stride,
            cols,
            x.as_ptr() as *const u8,
            ldx,
            n_tokens,
            rows,
            y,
        )
    }
}

/// See [`crate::kernels::gemm_bf16_panels`].
pub fn gemm_bf16_panels(
    w: &[u16],
    cols: usize,
    x: &[u16],
    n_tokens: usize,
    rows: Range<usize>,
    y: &OutputMatrix,
) {
    assert_features();
    // SAFETY: the dispatcher checked AVX2+FMA and the bounds of `w` and `x`.
    unsafe {
        gemm_panels(
            true,
            w.as_ptr() as *const u8,
            cols * PANEL_ROWS,
            cols,
            x.as_ptr() as *const u8,
            cols,
            n_tokens,
            rows,
            y,
        )
    }
}

/// See [`crate::kernels::dot_f32`] (equal lengths).
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_features();
    assert_eq!(a.len(), b.len());
    // SAFETY: AVX2+FMA checked by the dispatcher; lengths equal.
    unsafe { dot_f32_impl(a, b) }
}

/// # Safety
/// AVX2+FMA; equal lengths.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_f32_impl(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i..i+16 lies inside both slices.
        unsafe {
            acc0 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i)),
                _mm256_loadu_ps(b.as_ptr().add(i)),
                acc0,
            );
            acc1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i + 8)),
                _mm256_loadu_ps(b.as_ptr().add(i + 8)),
                acc1,
            );
        }
        i += 16;
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(acc0, acc1)) };
    let mut s: f32 = lanes.iter().sum();
    for j in i..n {
        s += a[j] * b[j];
    }
    s
}

/// See [`crate::kernels::dot_f64`] (equal lengths).
pub fn dot_f64(a: &[f64], b: &[f64]) -> f64 {
    assert_features();
    assert_eq!(a.len(), b.len());
    // SAFETY: AVX2+FMA checked by the dispatcher; lengths equal.
    unsafe { dot_f64_impl(a, b) }
}

/// # Safety
/// AVX2+FMA; equal lengths.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_f64_impl(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len();
    // Four independent accumulators cover the FMA latency.
    let mut acc = [_mm256_setzero_pd(); 4];
    let mut i = 0;
    while i + 16 <= n {
        for (j, s) in acc.iter_mut().enumerate() {
            // SAFETY: i + 4j .. i + 4j + 4 lies inside both slices.
            unsafe {
                *s = _mm256_fmadd_pd(
                    _mm256_loadu_pd(a.as_ptr().add(i + 4 * j)),
                    _mm256_loadu_pd(b.as_ptr().add(i + 4 * j)),
                    *s,
                );
            }
        }
        i += 16;
    }
    while i + 4 <= n {
        // SAFETY: i..i+4 lies inside both slices.
        unsafe {
            acc[0] = _mm256_fmadd_pd(
                _mm256_loadu_pd(a.as_ptr().add(i)),
                _mm256_loadu_pd(b.as_ptr().add(i)),
                acc[0],
            );
        }
        i += 4;
    }
    let sum = _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3]));
    let mut lanes = [0f64; 4];
    // SAFETY: `lanes` holds 4 f64.
    unsafe { _mm256_storeu_pd(lanes.as_mut_ptr(), sum) };
    let mut s = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for j in i..n {
        s += a[j] * b[j];
    }
    s
}

/// See [`crate::kernels::axpy_f32`] (equal lengths).
pub fn axpy_f32(y: &mut [f32], alpha: f32, x: &[f32]) {
    assert_features();
    assert_eq!(y.len(), x.len());
    // SAFETY: AVX2+FMA checked by the dispatcher; lengths equal.
    unsafe { axpy_f32_impl(y, alpha, x) }
}

/// # Safety
/// AVX2+FMA; equal lengths.
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_f32_impl(y: &mut [f32], alpha: f32, x: &[f32]) {
    let n = y.len();
    let va = _mm256_set1_ps(alpha);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i..i+8 lies inside both slices.
        unsafe {
            let vy = _mm256_loadu_ps(y.as_ptr().add(i));
            let vx = _mm256_loadu_ps(x.as_ptr().add(i));
            _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_fmadd_ps(va, vx, vy));
        }
        i += 8;
    }
    for j in i..n {
        y[j] += alpha * x[j];
    }
}

/// `exp` of 8 values: the AVX-512 file's Cephes polynomial; `2^n` applied in two halves
/// (`n ∈ [-150, 128]` after the clamp, each half a normal power of two), as `vscalefps`
/// would.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp_ps(x: __m256) -> __m256 {
    let x = _mm256_max_ps(
        _mm256_min_ps(x, _mm256_set1_ps(EXP_MAX)),
        _mm256_set1_ps(EXP_MIN),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
    let mut p = _mm256_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let r2 = _mm256_mul_ps(r, r);
    let e = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0)));
    let ni = _mm256_cvtps_epi32(n);
    let n1 = _mm256_srai_epi32::<1>(ni);
    let n2 = _mm256_sub_epi32(ni, n1);
    let pow2 = |k: __m256i| {
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            k,
            _mm256_set1_epi32(127),
        )))
    };
    _mm256_mul_ps(_mm256_mul_ps(e, pow2(n1)), pow2(n2))
}

/// See [`crate::kernels::exp_shifted_sum`].
pub fn exp_shifted_sum(x: &mut [f32], shift: f32) -> f32 {
    assert_features();
    // SAFETY: AVX2+FMA checked by the dispatcher.
    unsafe { exp_shifted_sum_impl(x, shift) }
}

/// # Safety
/// AVX2+FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_shifted_sum_impl(x: &mut [f32], shift: f32) -> f32 {
    let n = x.len();
    let s = _mm256_set1_ps(shift);
    let mut sum = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i..i+8 lies inside `x`.
        unsafe {
            let p = x.as_mut_ptr().add(i);
            let v = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(p), s));
            _mm256_storeu_ps(p, v);
            sum = _mm256_add_ps(sum, v);
        }
        i += 8;
    }
    let mut total = hsum(sum);
    if i < n {
        let mut tail = [0f32; 8];
        tail[..n - i].copy_from_slice(&x[i..]);
        // SAFETY: `tail` holds 8 f32.
        unsafe {
            let v = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(tail.as_ptr()), s));
            _mm256_storeu_ps(tail.as_mut_ptr(), v);
        }
        x[i..].copy_from_slice(&tail[..n - i]);
        total += tail[..n - i].iter().sum::<f32>();
    }
    total
}

/// Sum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)))
}

/// See [`crate::kernels::silu_mul`] (equal lengths).
pub fn silu_mul(g: &mut [f32], u: &[f32]) {
    gated_mul(g, u, Gate::Silu)
}

/// See [`crate::kernels::gelu_tanh_mul`] (equal lengths).
pub fn gelu_tanh_mul(g: &mut [f32], u: &[f32]) {
    gated_mul(g, u, Gate::GeluTanh)
}

fn gated_mul(g: &mut [f32], u: &[f32], gate: Gate) {
    assert_features();
    assert_eq!(g.len(), u.len());
    // SAFETY: the features are checked by the dispatcher; lengths equal.
    unsafe { gated_mul_impl(g, u, gate) }
}

/// # Safety
/// The features enabled below; equal lengths.
#[target_feature(enable = "avx2,fma")]
unsafe fn gated_mul_impl(g: &mut [f32], u: &[f32], gate: Gate) {
    use crate::kernels::scalar::{GELU_2C, GELU_2C3};
    let n = g.len();
    let (one, c1, c3) = (
        _mm256_set1_ps(1.0),
        _mm256_set1_ps(GELU_2C),
        _mm256_set1_ps(GELU_2C3),
    );
    let gate = |x: __m256, vu: __m256| {
        let a = match gate {
            Gate::Silu => x,
            Gate::GeluTanh => _mm256_mul_ps(x, _mm256_fmadd_ps(c3, _mm256_mul_ps(x, x), c1)),
        };
        let e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), a));
        _mm256_div_ps(_mm256_mul_ps(x, vu), _mm256_add_ps(one, e))
    };
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i..i+8 lies inside both slices.
        unsafe {
            let pg = g.as_mut_ptr().add(i);
            let r = gate(_mm256_loadu_ps(pg), _mm256_loadu_ps(u.as_ptr().add(i)));
            _mm256_storeu_ps(pg, r);
        }
        i += 8;
    }
    if i < n {
        let (mut tg, mut tu) = ([0f32; 8], [0f32; 8]);
        tg[..n - i].copy_from_slice(&g[i..]);
        tu[..n - i].copy_from_slice(&u[i..]);
        // SAFETY: both arrays hold 8 f32.
        unsafe {
            let r = gate(_mm256_loadu_ps(tg.as_ptr()), _mm256_loadu_ps(tu.as_ptr()));
            _mm256_storeu_ps(tg.as_mut_ptr(), r);
        }
        g[i..].copy_from_slice(&tg[..n - i]);
    }
}

/// See [`crate::kernels::scale_max_f32`].
pub fn scale_max_f32(x: &mut [f32], scale: f32) -> f32 {
    assert_features();
    // SAFETY: AVX2+FMA checked by the dispatcher.
    unsafe { scale_max_f32_impl(x, scale) }
}

/// # Safety
/// AVX2+FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn scale_max_f32_impl(x: &mut [f32], scale: f32) -> f32 {
    let n = x.len();
    let s = _mm256_set1_ps(scale);
    let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
    // `max_ps` drops a NaN operand (it returns the second one), so NaN lanes are
    // collected apart (unordered compare) and make the result NaN.
    let mut vnan = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i..i+8 lies inside `x`.
        unsafe {
            let p = x.as_mut_ptr().add(i);
            let v = _mm256_mul_ps(_mm256_loadu_ps(p), s);
            _mm256_storeu_ps(p, v);
            vmax = _mm256_max_ps(vmax, v);
            vnan = _mm256_or_ps(vnan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        }
        i += 8;
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), vmax) };
    let mut max = lanes.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut nan = _mm256_movemask_ps(vnan) != 0;
    for v in &mut x[i..] {
        *v *= scale;
        max = max.max(*v);
        nan |= v.is_nan();
    }
    if nan {
        f32::NAN
    } else {
        max
    }
}

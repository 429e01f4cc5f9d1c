//! The specification of every kernel, in plain Rust: the SIMD versions in `x86_64/` must
//! agree with these within the limits their tests state (they differ only in the order and
//! fusion of float additions).

use super::{OutputMatrix, PANEL_ROWS};
use std::ops::Range;

/// See [`super::gemm_f32_panels_strided`].
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32_panels(
    w: &[f32],
    panel_stride: usize,
    cols: usize,
    x: &[f32],
    ldx: usize,
    n_tokens: usize,
    rows: Range<usize>,
    y: &OutputMatrix,
) {
    let mut acc = [0f32; PANEL_ROWS];
    let mut r0 = rows.start;
    while r0 < rows.end {
        let panel = &w[(r0 / PANEL_ROWS) * panel_stride..][..cols * PANEL_ROWS];
        let valid = (rows.end - r0).min(PANEL_ROWS);
        for t in 0..n_tokens {
            let xt = &x[t * ldx..t * ldx + cols];
            acc.fill(0.0);
            for (k, &xk) in xt.iter().enumerate() {
                let wk = &panel[k * PANEL_ROWS..(k + 1) * PANEL_ROWS];
                for lane in 0..PANEL_ROWS {
                    acc[lane] += wk[lane] * xk;
                }
            }
            y.write_cols(t, r0, &acc[..valid]);
        }
        r0 += PANEL_ROWS;
    }
}

/// bf16 bits to f32 (exact).
#[inline]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// f32 to bf16 bits, round to nearest even; NaN stays NaN (quiet bit set).
#[inline]
pub fn f32_to_bf16_one(v: f32) -> u16 {
    let bits = v.to_bits();
    if v.is_nan() {
        return ((bits >> 16) | 0x0040) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// See [`super::f32_to_bf16`].
pub fn f32_to_bf16(x: &[f32], out: &mut [u16]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f32_to_bf16_one(v);
    }
}

/// See [`super::gemm_bf16_panels`]: per column pair, the odd column's product is added
/// first, then the even one's (the order `vdpbf16ps` documents), each product exact.
pub fn gemm_bf16_panels(
    w: &[u16],
    cols: usize,
    x: &[u16],
    n_tokens: usize,
    rows: Range<usize>,
    y: &OutputMatrix,
) {
    let mut acc = [0f32; PANEL_ROWS];
    let pairs = cols / 2;
    let mut r0 = rows.start;
    while r0 < rows.end {
        let panel = &w[(r0 / PANEL_ROWS) * cols * PANEL_ROWS..][..cols * PANEL_ROWS];
        let valid = (rows.end - r0).min(PANEL_ROWS);
        for t in 0..n_tokens {
            let xt = &x[t * cols..(t + 1) * cols];
            acc.fill(0.0);
            for j in 0..pairs {
                let x0 = bf16_to_f32(xt[2 * j]);
                let x1 = bf16_to_f32(xt[2 * j + 1]);
                let wj = &panel[j * 2 * PANEL_ROWS..(j + 1) * 2 * PANEL_ROWS];
                for lane in 0..PANEL_ROWS {
                    acc[lane] += bf16_to_f32(wj[2 * lane + 1]) * x1;
                    acc[lane] += bf16_to_f32(wj[2 * lane]) * x0;
                }
            }
            y.write_cols(t, r0, &acc[..valid]);
        }
        r0 += PANEL_ROWS;
    }
}

/// `a · b`.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `a · b` in f64.
pub fn dot_f64(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `y += alpha * x`.
pub fn axpy_f32(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (o, v) in y.iter_mut().zip(x) {
        *o += alpha * v;
    }
}

/// See [`super::scale_max_f32`].
pub fn scale_max_f32(x: &mut [f32], scale: f32) -> f32 {
    let mut max = f32::NEG_INFINITY;
    for v in x.iter_mut() {
        *v *= scale;
        max = max.max(*v);
    }
    max
}

/// See [`super::exp_shifted_sum`].
pub fn exp_shifted_sum(x: &mut [f32], shift: f32) -> f32 {
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - shift).exp();
        sum += *v;
    }
    sum
}

/// See [`super::silu_mul`].
pub fn silu_mul(g: &mut [f32], u: &[f32]) {
    for (a, b) in g.iter_mut().zip(u) {
        *a = *a / (1.0 + (-*a).exp()) * b;
    }
}

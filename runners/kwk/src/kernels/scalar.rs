//! The specification of every kernel, in plain Rust: the SIMD versions in `x86_64/` must
//! agree with these within the limits their tests state (they differ only in the order and
//! fusion of float additions).

use super::{OutputMatrix, PanelOperands, GEMV_PREFETCH_BYTES, PANEL_ROWS};
use std::ops::Range;

/// See [`super::gemm_f32_panels_strided`].
pub(crate) fn gemm_f32_panels(op: &PanelOperands<f32>, rows: Range<usize>, y: &OutputMatrix) {
    drive_panels::<F32Panels>(op, rows, y);
}

/// The panel matmul of either element type: up to [`PANELS_AT_ONCE`] panels per token,
/// and for generation (one token) the weights asked for ahead of the reads.
fn drive_panels<S: PanelSums>(op: &PanelOperands<S::Elem>, rows: Range<usize>, y: &OutputMatrix) {
    let PanelOperands {
        w,
        panel_stride,
        cols,
        x,
        ldx,
        n_tokens,
    } = *op;
    let mut r0 = rows.start;
    while r0 < rows.end {
        let first = r0 / PANEL_ROWS;
        let valid = (rows.end - r0).min(PANELS_AT_ONCE * PANEL_ROWS);
        let panel = |p: usize| &w[(first + p) * panel_stride..][..cols * PANEL_ROWS];
        for t in 0..n_tokens {
            let xt = &x[t * ldx..t * ldx + cols];
            let out = |acc: &[f32]| y.write_cols(t, r0, &acc[..valid]);
            macro_rules! sums {
                ($ahead:literal) => {
                    match valid.div_ceil(PANEL_ROWS) {
                        3 => out(S::sums::<3, $ahead>([0, 1, 2].map(panel), xt).as_flattened()),
                        2 => out(S::sums::<2, $ahead>([0, 1].map(panel), xt).as_flattened()),
                        _ => out(S::sums::<1, $ahead>([panel(0)], xt).as_flattened()),
                    }
                };
            }
            if n_tokens == 1 {
                sums!(true)
            } else {
                sums!(false)
            }
        }
        r0 += PANELS_AT_ONCE * PANEL_ROWS;
    }
}

/// One element type's panel sums for [`drive_panels`].
trait PanelSums {
    type Elem;
    /// The 16 row sums of each of `P` panels against one token's `xt`, asking for the
    /// weights [`GEMV_PREFETCH_BYTES`] ahead when `AHEAD`.
    fn sums<const P: usize, const AHEAD: bool>(
        panels: [&[Self::Elem]; P],
        xt: &[Self::Elem],
    ) -> [[f32; PANEL_ROWS]; P];
}

/// Panels of 16 rows summed together per token: independent sums in flight per column,
/// which generation (one token, every weight read once) needs to keep the reads going.
/// Measured (`speed`, `KWK_ISA=scalar`, tg128, 2 threads, Xeon with SSE2 code): bf16 one
/// panel 35-40, two 56-59, three 66-71, four 66-70 tokens/s; prompts unchanged.
const PANELS_AT_ONCE: usize = 3;

/// float32 panels: one multiply-add per row and column.
struct F32Panels;

impl PanelSums for F32Panels {
    type Elem = f32;
    #[inline(always)]
    fn sums<const P: usize, const AHEAD: bool>(
        panels: [&[f32]; P],
        xt: &[f32],
    ) -> [[f32; PANEL_ROWS]; P] {
        let mut acc = [[0f32; PANEL_ROWS]; P];
        for (k, &xk) in xt.iter().enumerate() {
            for (a, panel) in acc.iter_mut().zip(&panels) {
                let wk = &panel[k * PANEL_ROWS..(k + 1) * PANEL_ROWS];
                if AHEAD {
                    super::prefetch_hint(
                        (wk.as_ptr() as *const u8).wrapping_add(GEMV_PREFETCH_BYTES),
                        1,
                    );
                }
                for lane in 0..PANEL_ROWS {
                    a[lane] += wk[lane] * xk;
                }
            }
        }
        acc
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
    let op = PanelOperands {
        w,
        panel_stride: cols * PANEL_ROWS,
        cols,
        x,
        ldx: cols,
        n_tokens,
    };
    drive_panels::<Bf16Panels>(&op, rows, y);
}

/// bf16 panels: column pairs, the odd column's product first.
struct Bf16Panels;

impl PanelSums for Bf16Panels {
    type Elem = u16;
    #[inline(always)]
    fn sums<const P: usize, const AHEAD: bool>(
        panels: [&[u16]; P],
        xt: &[u16],
    ) -> [[f32; PANEL_ROWS]; P] {
        let mut acc = [[0f32; PANEL_ROWS]; P];
        for (j, xj) in xt.chunks_exact(2).enumerate() {
            let x0 = bf16_to_f32(xj[0]);
            let x1 = bf16_to_f32(xj[1]);
            for (a, panel) in acc.iter_mut().zip(&panels) {
                let wj = &panel[j * 2 * PANEL_ROWS..(j + 1) * 2 * PANEL_ROWS];
                if AHEAD {
                    super::prefetch_hint(
                        (wj.as_ptr() as *const u8).wrapping_add(GEMV_PREFETCH_BYTES),
                        1,
                    );
                }
                for lane in 0..PANEL_ROWS {
                    a[lane] += bf16_to_f32(wj[2 * lane + 1]) * x1;
                    a[lane] += bf16_to_f32(wj[2 * lane]) * x0;
                }
            }
        }
        acc
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
    let mut nan = false;
    for v in x.iter_mut() {
        *v *= scale;
        // `f32::max` ignores a NaN operand; it is tracked apart and returned.
        max = max.max(*v);
        nan |= v.is_nan();
    }
    if nan {
        f32::NAN
    } else {
        max
    }
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

/// GELU-tanh's `0.5·x·(1 + tanh(z))` written as `x / (1 + e^(−2z))` (the same function:
/// `1 + tanh(z) = 2 / (1 + e^(−2z))`), with `2z = x·(GELU_2C + GELU_2C3·x²)`; the vector
/// tiers use these constants and this form, so every tier needs only `exp`.
pub const GELU_2C: f32 = 1.595_769; // 2·sqrt(2/π)
/// `GELU_2C · 0.044715`.
pub const GELU_2C3: f32 = GELU_2C * 0.044715;

/// See [`super::gelu_tanh_mul`].
pub fn gelu_tanh_mul(g: &mut [f32], u: &[f32]) {
    for (a, b) in g.iter_mut().zip(u) {
        let x = *a;
        let t = x * (GELU_2C + GELU_2C3 * (x * x));
        *a = x * b / (1.0 + (-t).exp());
    }
}

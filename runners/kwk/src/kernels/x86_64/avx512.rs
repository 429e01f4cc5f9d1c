//! AVX-512 kernels: float32 and bf16 panel matmuls (register tiles of up to 6 tokens x 4
//! panels = 24 zmm accumulators), bf16 through `vdpbf16ps` when the CPU has AVX512_BF16 and
//! through shift-to-f32 + FMA otherwise, and the small vector helpers of attention.
//!
//! Every public function here is safe to call only through `kernels/mod.rs`, which checked
//! the CPU features ([`crate::kernels::active_isa`]) and the buffer bounds; each one asserts
//! the features again in debug builds.

use super::{Gate, EXP_LN2_HI, EXP_LN2_LO, EXP_MAX, EXP_MIN, EXP_POLY};
use crate::kernels::{prefetch_hint, OutputMatrix, PanelOperands, GEMV_PREFETCH_BYTES, PANEL_ROWS};
use std::arch::x86_64::*;
use std::ops::Range;

/// Tokens per register tile.
const TILE_TOKENS: usize = 6;
/// Panels per register tile.
const TILE_PANELS: usize = 4;

fn assert_features(bf16: bool) {
    debug_assert!(
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("fma")
            && (!bf16 || is_x86_feature_detected!("avx512bf16"))
    );
}

/// Which inner product a tile runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    F32,
    Bf16Dp,
    Bf16Fma,
}

/// Defines the tile drivers for one target-feature set, so that code for CPUs without
/// AVX512_BF16 is never compiled with that feature enabled.
macro_rules! define_tiles {
    ($module:ident, $features:literal) => {
        mod $module {
            use super::*;

            /// Drives tiles over `rows` (panel-aligned start) and all tokens. `elem_bytes` is 4 for f32
            /// data and 2 for bf16.
            ///
            /// # Safety
            /// The CPU has AVX-512 F/BW (+BF16 for `Kind::Bf16Dp`); `w` holds the panels covering
            /// `rows` (`cols * 16` values each) and `x` holds `n_tokens * cols` values, as
            /// `kernels::check_panel_args` asserted.
            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            pub(super) unsafe fn gemm_panels(
                kind: Kind,
                w: *const u8,
                panel_stride: usize,
                cols: usize,
                x: *const u8,
                ldx: usize,
                n_tokens: usize,
                rows: Range<usize>,
                y: &OutputMatrix,
            ) {
                let elem = if kind == Kind::F32 { 4 } else { 2 };
                let panel_bytes = panel_stride * elem;
                let n_panels = (rows.end - rows.start).div_ceil(PANEL_ROWS);
                let first = rows.start / PANEL_ROWS;
                let mut p = 0;
                while p < n_panels {
                    // Generation (one token) takes 8 panels per tile: twice the independent
                    // sums in flight per column. bf16 tg128 on the `amx`/`vnni` tiers (Xeon,
                    // `vdpbf16ps`, 3 interleaved rounds): 95-102 -> 104-109 tokens/s (80-83 ->
                    // 86-90 % of the read roofline); float32 unchanged (93-97 %).
                    let take = (n_panels - p).min(if n_tokens == 1 { 8 } else { TILE_PANELS });
                    let r0 = (first + p) * PANEL_ROWS;
                    let valid = (rows.end - r0).min(take * PANEL_ROWS);
                    // SAFETY: panel first+p..first+p+take lies inside `w` (bounds checked by the caller).
                    let wp = unsafe { w.add((first + p) * panel_bytes) };
                    let mut t = 0;
                    while t < n_tokens {
                        let tt = (n_tokens - t).min(TILE_TOKENS);
                        // SAFETY: tokens t..t+tt lie inside `x`.
                        let xp = unsafe { x.add(t * ldx * elem) };
                        // SAFETY: forwarded from this function's contract.
                        unsafe {
                            tile_dispatch(
                                kind,
                                take,
                                tt,
                                wp,
                                panel_bytes,
                                cols,
                                ldx,
                                xp,
                                t,
                                r0,
                                valid,
                                y,
                            )
                        };
                        t += tt;
                    }
                    p += take;
                }
            }

            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = $features)]
            unsafe fn tile_dispatch(
                kind: Kind,
                panels: usize,
                tokens: usize,
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
                macro_rules! go {
                    ($p:literal, $t:literal) => {
                        // SAFETY: forwarded from the caller's contract.
                        unsafe {
                            tile::<$p, $t>(kind, w, panel_bytes, cols, ldx, x, t0, r0, valid, y)
                        }
                    };
                }
                match (panels, tokens) {
                    (8, 1) => go!(8, 1),
                    (7, 1) => go!(7, 1),
                    (6, 1) => go!(6, 1),
                    (5, 1) => go!(5, 1),
                    (4, 6) => go!(4, 6),
                    (4, 5) => go!(4, 5),
                    (4, 4) => go!(4, 4),
                    (4, 3) => go!(4, 3),
                    (4, 2) => go!(4, 2),
                    (4, 1) => go!(4, 1),
                    (3, 6) => go!(3, 6),
                    (3, 5) => go!(3, 5),
                    (3, 4) => go!(3, 4),
                    (3, 3) => go!(3, 3),
                    (3, 2) => go!(3, 2),
                    (3, 1) => go!(3, 1),
                    (2, 6) => go!(2, 6),
                    (2, 5) => go!(2, 5),
                    (2, 4) => go!(2, 4),
                    (2, 3) => go!(2, 3),
                    (2, 2) => go!(2, 2),
                    (2, 1) => go!(2, 1),
                    (1, 6) => go!(1, 6),
                    (1, 5) => go!(1, 5),
                    (1, 4) => go!(1, 4),
                    (1, 3) => go!(1, 3),
                    (1, 2) => go!(1, 2),
                    (1, 1) => go!(1, 1),
                    _ => unreachable!("tile shape {panels}x{tokens}"),
                }
            }

            /// One register tile: `P` panels x `T` tokens, accumulated over all columns, then written.
            ///
            /// # Safety
            /// As [`gemm_panels`]; `w` points at the first of `P` panels, `x` at the first of `T`
            /// token rows.
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = $features)]
            unsafe fn tile<const P: usize, const T: usize>(
                kind: Kind,
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
                let mut acc = [[_mm512_setzero_ps(); P]; T];
                // SAFETY (whole block): every load reads inside panel p (`cols*16` elements) or token
                // row t (`cols` elements) for k < cols, as the caller guarantees.
                unsafe {
                    match kind {
                        Kind::F32 => {
                            let w = w as *const f32;
                            let x = x as *const f32;
                            let ps = panel_bytes / 4;
                            for k in 0..cols {
                                let mut wv = [_mm512_setzero_ps(); P];
                                for (p, v) in wv.iter_mut().enumerate() {
                                    let at = w.add(p * ps + k * PANEL_ROWS);
                                    if T == 1 {
                                        prefetch_hint(
                                            (at as *const u8).wrapping_add(GEMV_PREFETCH_BYTES),
                                            1,
                                        );
                                    }
                                    *v = _mm512_loadu_ps(at);
                                }
                                for (t, a) in acc.iter_mut().enumerate() {
                                    let xb = _mm512_set1_ps(*x.add(t * ldx + k));
                                    for p in 0..P {
                                        a[p] = _mm512_fmadd_ps(wv[p], xb, a[p]);
                                    }
                                }
                            }
                        }
                        Kind::Bf16Dp => {
                            let w = w as *const u16;
                            let x = x as *const u16;
                            let ps = panel_bytes / 2;
                            for j in 0..cols / 2 {
                                let mut wv = [_mm512_setzero_si512(); P];
                                for (p, v) in wv.iter_mut().enumerate() {
                                    let at = w.add(p * ps + j * 2 * PANEL_ROWS);
                                    if T == 1 {
                                        prefetch_hint(
                                            (at as *const u8).wrapping_add(GEMV_PREFETCH_BYTES),
                                            1,
                                        );
                                    }
                                    *v = _mm512_loadu_si512(at as *const _);
                                }
                                for (t, a) in acc.iter_mut().enumerate() {
                                    let pair =
                                        (x.add(t * ldx + 2 * j) as *const i32).read_unaligned();
                                    let xb: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                                    for p in 0..P {
                                        let wb: __m512bh = std::mem::transmute(wv[p]);
                                        a[p] = _mm512_dpbf16_ps(a[p], wb, xb);
                                    }
                                }
                            }
                        }
                        Kind::Bf16Fma => {
                            let w = w as *const u16;
                            let x = x as *const u16;
                            let ps = panel_bytes / 2;
                            let hi_mask = _mm512_set1_epi32(0xffff_0000u32 as i32);
                            for j in 0..cols / 2 {
                                let mut even = [_mm512_setzero_ps(); P];
                                let mut odd = [_mm512_setzero_ps(); P];
                                for p in 0..P {
                                    let at = w.add(p * ps + j * 2 * PANEL_ROWS);
                                    if T == 1 {
                                        prefetch_hint(
                                            (at as *const u8).wrapping_add(GEMV_PREFETCH_BYTES),
                                            1,
                                        );
                                    }
                                    let v = _mm512_loadu_si512(at as *const _);
                                    even[p] = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v));
                                    odd[p] = _mm512_castsi512_ps(_mm512_and_si512(v, hi_mask));
                                }
                                for (t, a) in acc.iter_mut().enumerate() {
                                    let x0 = f32::from_bits((*x.add(t * ldx + 2 * j) as u32) << 16);
                                    let x1 =
                                        f32::from_bits((*x.add(t * ldx + 2 * j + 1) as u32) << 16);
                                    let x0 = _mm512_set1_ps(x0);
                                    let x1 = _mm512_set1_ps(x1);
                                    for p in 0..P {
                                        a[p] = _mm512_fmadd_ps(odd[p], x1, a[p]);
                                        a[p] = _mm512_fmadd_ps(even[p], x0, a[p]);
                                    }
                                }
                            }
                        }
                    }
                }
                if valid == P * PANEL_ROWS {
                    // Whole panels: stores straight into `y` (through a buffer, each token's
                    // row was a `memcpy` call).
                    for (t, a) in acc.iter().enumerate() {
                        let dst = y.block_ptr(t0 + t, 1, r0, valid);
                        for (p, v) in a.iter().enumerate() {
                            // SAFETY: `block_ptr` checked the token's `valid` columns; this
                            // tile's rows are the caller's to write.
                            unsafe { _mm512_storeu_ps(dst.add(p * PANEL_ROWS), *v) };
                        }
                    }
                    return;
                }
                let mut buf = [[0f32; PANEL_ROWS]; P];
                for (t, a) in acc.iter().enumerate() {
                    for p in 0..P {
                        // SAFETY: `buf[p]` holds exactly 16 f32.
                        unsafe { _mm512_storeu_ps(buf[p].as_mut_ptr(), a[p]) };
                    }
                    y.write_cols(t0 + t, r0, &buf.as_flattened()[..valid]);
                }
            }
        }
    };
}

define_tiles!(tiles_f32, "avx512f,avx512bw,avx512vl,fma");
define_tiles!(tiles_bf16, "avx512f,avx512bw,avx512vl,fma,avx512bf16");

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
    assert_features(false);
    // SAFETY: the dispatcher checked AVX-512 support and the bounds of `w` and `x`.
    unsafe {
        tiles_f32::gemm_panels(
            Kind::F32,
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

/// See [`crate::kernels::gemm_bf16_panels`]; needs AVX512_BF16.
pub fn gemm_bf16_panels_dpbf16(
    w: &[u16],
    cols: usize,
    x: &[u16],
    n_tokens: usize,
    rows: Range<usize>,
    y: &OutputMatrix,
) {
    assert_features(true);
    // SAFETY: the dispatcher checked AVX512_BF16 support and the bounds of `w` and `x`.
    unsafe {
        tiles_bf16::gemm_panels(
            Kind::Bf16Dp,
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

/// See [`crate::kernels::gemm_bf16_panels`]; AVX-512 F without BF16 (bf16 widened to f32
/// by a shift, then FMA).
pub fn gemm_bf16_panels_fma(
    w: &[u16],
    cols: usize,
    x: &[u16],
    n_tokens: usize,
    rows: Range<usize>,
    y: &OutputMatrix,
) {
    assert_features(false);
    // SAFETY: the dispatcher checked AVX-512 support and the bounds of `w` and `x`.
    unsafe {
        tiles_f32::gemm_panels(
            Kind::Bf16Fma,
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
    assert_features(false);
    assert_eq!(a.len(), b.len());
    // SAFETY: AVX-512 checked by the dispatcher; lengths equal.
    unsafe { dot_f32_impl(a, b) }
}

/// # Safety
/// AVX-512 F; `a.len() == b.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn dot_f32_impl(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc0 = _mm512_setzero_ps();
    let mut acc1 = _mm512_setzero_ps();
    let mut i = 0;
    // SAFETY (whole block): every full load reads i..i+16 (or +32) < n; the tail uses a
    // mask covering only i..n.
    unsafe {
        while i + 32 <= n {
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)), acc0);
            acc1 = _mm512_fmadd_ps(
                _mm512_loadu_ps(pa.add(i + 16)),
                _mm512_loadu_ps(pb.add(i + 16)),
                acc1,
            );
            i += 32;
        }
        while i < n {
            let m: __mmask16 = if n - i >= 16 {
                0xffff
            } else {
                (1u16 << (n - i)) - 1
            };
            let va = _mm512_maskz_loadu_ps(m, pa.add(i));
            let vb = _mm512_maskz_loadu_ps(m, pb.add(i));
            acc0 = _mm512_fmadd_ps(va, vb, acc0);
            i += 16;
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
}

/// See [`crate::kernels::axpy_f32`] (equal lengths).
pub fn axpy_f32(y: &mut [f32], alpha: f32, x: &[f32]) {
    assert_features(false);
    assert_eq!(y.len(), x.len());
    // SAFETY: AVX-512 checked by the dispatcher; lengths equal.
    unsafe { axpy_f32_impl(y, alpha, x) }
}

/// # Safety
/// AVX-512 F; `y.len() == x.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn axpy_f32_impl(y: &mut [f32], alpha: f32, x: &[f32]) {
    let n = y.len();
    let (py, px) = (y.as_mut_ptr(), x.as_ptr());
    let va = _mm512_set1_ps(alpha);
    let mut i = 0;
    // SAFETY: loads/stores cover i..i+16 <= n, or the masked tail i..n.
    unsafe {
        while i < n {
            let m: __mmask16 = if n - i >= 16 {
                0xffff
            } else {
                (1u16 << (n - i)) - 1
            };
            let vy = _mm512_maskz_loadu_ps(m, py.add(i));
            let vx = _mm512_maskz_loadu_ps(m, px.add(i));
            _mm512_mask_storeu_ps(py.add(i), m, _mm512_fmadd_ps(va, vx, vy));
            i += 16;
        }
    }
}

/// See [`crate::kernels::f32_to_bf16`] (equal lengths).
pub fn f32_to_bf16(x: &[f32], out: &mut [u16]) {
    assert_features(false);
    assert_eq!(x.len(), out.len());
    // SAFETY: AVX-512 checked by the dispatcher; lengths equal.
    unsafe { f32_to_bf16_impl(x, out) }
}

/// # Safety
/// AVX-512 F/BW; `x.len() == out.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn f32_to_bf16_impl(x: &[f32], out: &mut [u16]) {
    let n = x.len();
    let mut i = 0;
    let one = _mm512_set1_epi32(1);
    let bias = _mm512_set1_epi32(0x7fff);
    let quiet = _mm512_set1_epi32(0x0040);
    while i + 16 <= n {
        // SAFETY: i..i+16 lies inside both slices.
        unsafe {
            let v = _mm512_loadu_ps(x.as_ptr().add(i));
            let bits = _mm512_castps_si512(v);
            let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), one);
            let rounded =
                _mm512_srli_epi32::<16>(_mm512_add_epi32(bits, _mm512_add_epi32(bias, lsb)));
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            let nan_bits = _mm512_or_si512(_mm512_srli_epi32::<16>(bits), quiet);
            let r = _mm512_mask_mov_epi32(rounded, nan, nan_bits);
            _mm256_storeu_si256(
                out.as_mut_ptr().add(i) as *mut __m256i,
                _mm512_cvtepi32_epi16(r),
            );
        }
        i += 16;
    }
    crate::kernels::scalar::f32_to_bf16(&x[i..], &mut out[i..]);
}

/// e^x for 16 lanes: Cephes `expf` (x = n·ln2 + r with |r| <= ln2/2, e^r by a degree-6
/// polynomial), 2^n applied by `vscalefps`. Inputs are clamped to [-103.9, 88.7].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
fn exp_ps(x: __m512) -> __m512 {
    let x = _mm512_max_ps(
        _mm512_min_ps(x, _mm512_set1_ps(EXP_MAX)),
        _mm512_set1_ps(EXP_MIN),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LO), r);
    let mut p = _mm512_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let r2 = _mm512_mul_ps(r, r);
    let e = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0)));
    _mm512_scalef_ps(e, n)
}

/// See [`crate::kernels::scale_max_f32`].
pub fn scale_max_f32(x: &mut [f32], scale: f32) -> f32 {
    assert_features(false);
    // SAFETY: AVX-512 checked by the dispatcher.
    unsafe { scale_max_f32_impl(x, scale) }
}

/// # Safety
/// AVX-512 F.
#[target_feature(enable = "avx512f")]
unsafe fn scale_max_f32_impl(x: &mut [f32], scale: f32) -> f32 {
    let n = x.len();
    let p = x.as_mut_ptr();
    let s = _mm512_set1_ps(scale);
    let mut vmax = _mm512_set1_ps(f32::NEG_INFINITY);
    // `max_ps` drops a NaN operand, so NaN lanes are collected apart (unordered compare)
    // and make the result NaN.
    let mut nan: __mmask16 = 0;
    let mut i = 0;
    // SAFETY: every access covers i..i + 16 <= n, or (masked) the tail lanes below n.
    unsafe {
        while i + 16 <= n {
            let v = _mm512_mul_ps(_mm512_loadu_ps(p.add(i)), s);
            _mm512_storeu_ps(p.add(i), v);
            vmax = _mm512_max_ps(vmax, v);
            nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            i += 16;
        }
        if i < n {
            let m: __mmask16 = (1u16 << (n - i)) - 1;
            let v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p.add(i)), s);
            _mm512_mask_storeu_ps(p.add(i), m, v);
            vmax = _mm512_mask_max_ps(vmax, m, vmax, v);
            nan |= _mm512_mask_cmp_ps_mask::<_CMP_UNORD_Q>(m, v, v);
        }
        if nan != 0 {
            f32::NAN
        } else {
            _mm512_reduce_max_ps(vmax)
        }
    }
}

/// See [`crate::kernels::exp_shifted_sum`].
pub fn exp_shifted_sum(x: &mut [f32], shift: f32) -> f32 {
    assert_features(false);
    // SAFETY: AVX-512 checked by the dispatcher.
    unsafe { exp_shifted_sum_impl(x, shift) }
}

/// # Safety
/// AVX-512 F.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn exp_shifted_sum_impl(x: &mut [f32], shift: f32) -> f32 {
    let n = x.len();
    let p = x.as_mut_ptr();
    let s = _mm512_set1_ps(shift);
    let mut sum = _mm512_setzero_ps();
    let mut i = 0;
    while i < n {
        let m: __mmask16 = if n - i >= 16 {
            0xffff
        } else {
            (1u16 << (n - i)) - 1
        };
        // SAFETY: the mask covers only i..min(i+16, n).
        unsafe {
            let v = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, p.add(i)), s));
            _mm512_mask_storeu_ps(p.add(i), m, v);
            sum = _mm512_mask_add_ps(sum, m, sum, v);
        }
        i += 16;
    }
    _mm512_reduce_add_ps(sum)
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
    assert_features(false);
    assert_eq!(g.len(), u.len());
    // SAFETY: the features are checked by the dispatcher; lengths equal.
    unsafe { gated_mul_impl(g, u, gate) }
}

/// # Safety
/// The features enabled below; equal lengths.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn gated_mul_impl(g: &mut [f32], u: &[f32], gate: Gate) {
    use crate::kernels::scalar::{GELU_2C, GELU_2C3};
    let n = g.len();
    let (one, c1, c3) = (
        _mm512_set1_ps(1.0),
        _mm512_set1_ps(GELU_2C),
        _mm512_set1_ps(GELU_2C3),
    );
    let gate = |x: __m512, vu: __m512| {
        let a = match gate {
            Gate::Silu => x,
            Gate::GeluTanh => _mm512_mul_ps(x, _mm512_fmadd_ps(c3, _mm512_mul_ps(x, x), c1)),
        };
        let e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), a));
        _mm512_div_ps(_mm512_mul_ps(x, vu), _mm512_add_ps(one, e))
    };
    let (pg, pu) = (g.as_mut_ptr(), u.as_ptr());
    let mut i = 0;
    while i < n {
        let m: __mmask16 = if n - i >= 16 {
            0xffff
        } else {
            (1u16 << (n - i)) - 1
        };
        // SAFETY: the mask covers only i..min(i+16, n) of both slices.
        unsafe {
            let r = gate(
                _mm512_maskz_loadu_ps(m, pg.add(i)),
                _mm512_maskz_loadu_ps(m, pu.add(i)),
            );
            _mm512_mask_storeu_ps(pg.add(i), m, r);
        }
        i += 16;
    }
}

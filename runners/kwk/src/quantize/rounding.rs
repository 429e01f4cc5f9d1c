//! Rounding float weights onto the packed formats' grids: symmetric int8 blocks
//! (`w = d · q`, `q` in -127..=127) and asymmetric 3- to 8-bit groups (`w = d · q + m`,
//! `q` in `0..2^bits`). Scales and minimums are stored as f16, so every candidate is judged
//! with its f16-rounded values, and the codes are chosen against those.
//!
//! Both accept optional per-column importance weights (activation statistics from
//! calibration): the fitted grid then minimizes `Σ_i imp_i (ŵ_i - w_i)²` instead of the
//! plain squared error.
//!
//! Asymmetric groups start from llama.cpp's Q4_1 rule (`m = min`, `d = (max - min) / 15`,
//! `ggml-quants.c: quantize_row_q4_1_ref`), which reproduces weights already on such a grid
//! exactly; when that leaves an error, a few scale candidates each followed by a weighted
//! least-squares refit of `(d, m)` (the idea of llama.cpp's `make_qkx2_quants`) are tried
//! and the best kept.

use crate::kernels::quant::layout::{MAX_SUB_MIN, MAX_SUB_SCALE, SUPER_GROUPS};
use crate::kernels::quant::Bits;
use half::f16;

fn f16_round(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

#[inline]
fn round_away(x: f32) -> f32 {
    let r = (x.abs() + 0.5) as u32 as f32;
    if x < 0.0 {
        -r
    } else {
        r
    }
}

fn weight(imp: Option<&[f32]>, i: usize) -> f32 {
    imp.map_or(1.0, |w| w[i])
}

/// Codes for scale `d` (already f16-rounded) and their weighted squared error.
fn round_symmetric_with(x: &[f32], imp: Option<&[f32]>, d: f32, q: &mut [i8]) -> f64 {
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut err = 0f64;
    for (i, (&v, qi)) in x.iter().zip(q.iter_mut()).enumerate() {
        // Round half away from zero via truncation (`f32::round` is a libm call on the
        // x86_64 baseline; this is the packing's inner loop).
        let c = round_away((v * inv).clamp(-127.0, 127.0));
        *qi = c as i8;
        let e = c * d - v;
        err += (weight(imp, i) * e * e) as f64;
    }
    err
}

/// Rounds one block to symmetric int8: returns the f16 scale, writes the codes.
pub fn round_symmetric_int8(x: &[f32], imp: Option<&[f32]>, q: &mut [i8]) -> f16 {
    assert_eq!(x.len(), q.len());
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 || !amax.is_finite() {
        q.fill(0);
        return f16::ZERO;
    }
    let d0 = f16_round(amax / 127.0);
    let mut best_err = round_symmetric_with(x, imp, d0, q);
    if best_err == 0.0 {
        return f16::from_f32(d0);
    }
    // Weighted least-squares scale for these codes, then re-round once.
    let (mut num, mut den) = (0f64, 0f64);
    for (i, (&v, &c)) in x.iter().zip(q.iter()).enumerate() {
        let w = weight(imp, i) as f64;
        num += w * v as f64 * c as f64;
        den += w * c as f64 * c as f64;
    }
    let mut best_d = d0;
    if den > 0.0 {
        let d1 = f16_round((num / den) as f32);
        if d1 > 0.0 && d1 != d0 {
            let mut q1 = vec![0i8; q.len()];
            let e1 = round_symmetric_with(x, imp, d1, &mut q1);
            if e1 < best_err {
                best_err = e1;
                best_d = d1;
                q.copy_from_slice(&q1);
            }
        }
    }
    let _ = best_err;
    f16::from_f32(best_d)
}

/// Codes for `(d, m)` (already f16-rounded) and their weighted squared error.
fn round_asymmetric_with(
    x: &[f32],
    imp: Option<&[f32]>,
    nmax: f32,
    d: f32,
    m: f32,
    q: &mut [u8],
) -> f64 {
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    // Written so the compiler vectorizes it (the packing's inner loop): codes first, then
    // the error in 8 independent f32 lanes.
    for (qi, &v) in q.iter_mut().zip(x) {
        *qi = (((v - m) * inv).clamp(0.0, nmax) + 0.5) as u8;
    }
    let mut lanes = [0f32; 8];
    let n8 = x.len() / 8 * 8;
    match imp {
        None => {
            for (xs, qs) in x[..n8].chunks_exact(8).zip(q[..n8].chunks_exact(8)) {
                for j in 0..8 {
                    let e = qs[j] as f32 * d + m - xs[j];
                    lanes[j] += e * e;
                }
            }
        }
        Some(w) => {
            for ((xs, qs), ws) in x[..n8]
                .chunks_exact(8)
                .zip(q[..n8].chunks_exact(8))
                .zip(w[..n8].chunks_exact(8))
            {
                for j in 0..8 {
                    let e = qs[j] as f32 * d + m - xs[j];
                    lanes[j] += ws[j] * e * e;
                }
            }
        }
    }
    let mut err: f64 = lanes.iter().map(|&v| v as f64).sum();
    for i in n8..x.len() {
        let e = q[i] as f32 * d + m - x[i];
        err += (weight(imp, i) * e * e) as f64;
    }
    err
}

/// Weighted least-squares `(d, m)` for fixed codes: minimizes `Σ w (d q + m - x)²`.
fn refit(x: &[f32], imp: Option<&[f32]>, q: &[u8]) -> Option<(f32, f32)> {
    let (mut sw, mut sq, mut sqq, mut sx, mut sqx) = (0f64, 0f64, 0f64, 0f64, 0f64);
    for (i, (&v, &c)) in x.iter().zip(q.iter()).enumerate() {
        let w = weight(imp, i) as f64;
        let (c, v) = (c as f64, v as f64);
        sw += w;
        sq += w * c;
        sqq += w * c * c;
        sx += w * v;
        sqx += w * c * v;
    }
    let det = sw * sqq - sq * sq;
    if det <= 0.0 {
        return None;
    }
    let d = (sw * sqx - sq * sx) / det;
    let m = (sqq * sx - sq * sqx) / det;
    (d > 0.0).then_some((d as f32, m as f32))
}

/// Rounds one group to `bits`-bit asymmetric codes: returns `(d, m)` as f16, writes codes.
pub fn round_asymmetric(x: &[f32], bits: Bits, imp: Option<&[f32]>, q: &mut [u8]) -> (f16, f16) {
    assert_eq!(x.len(), q.len());
    let nmax = bits.max_code() as f32;
    let (lo, hi) = x
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        });
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo {
        // Constant group (or empty): all codes 0, the value in the minimum.
        q.fill(0);
        let m = if lo.is_finite() { lo } else { 0.0 };
        return (f16::ZERO, f16::from_f32(m));
    }
    let m0 = f16_round(lo);
    let d0 = f16_round((hi - m0) / nmax);
    let mut best = (d0, m0);
    let mut best_err = round_asymmetric_with(x, imp, nmax, d0, m0, q);
    let scale2: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    if best_err <= 1e-12 * scale2 {
        return (f16::from_f32(d0), f16::from_f32(m0));
    }
    let mut cand = vec![0u8; q.len()];
    // 4-bit grids gain from a small scale search; at 6 and 8 bits one refit of the
    // min/max grid captures nearly all of it (and packing time matters).
    let deltas: &[f32] = if bits.get() <= 4 {
        &[-1.0, -0.5, 0.0, 0.5, 1.0]
    } else {
        &[0.0]
    };
    for &delta in deltas {
        let d = f16_round((hi - lo) / (nmax + delta));
        if d <= 0.0 {
            continue;
        }
        round_asymmetric_with(x, imp, nmax, d, m0, &mut cand);
        for _ in 0..2 {
            let Some((d1, m1)) = refit(x, imp, &cand) else {
                break;
            };
            let (d1, m1) = (f16_round(d1), f16_round(m1));
            if d1 <= 0.0 {
                break;
            }
            let e = round_asymmetric_with(x, imp, nmax, d1, m1, &mut cand);
            if e < best_err {
                best_err = e;
                best = (d1, m1);
                q.copy_from_slice(&cand);
            } else {
                break;
            }
        }
    }
    (f16::from_f32(best.0), f16::from_f32(best.1))
}

/// The smallest f16 at or above `v` (`v` finite, non-negative).
fn f16_at_least(v: f32) -> f16 {
    let h = f16::from_f32(v);
    if h.to_f32() >= v {
        h
    } else {
        f16::from_bits(h.to_bits() + 1)
    }
}

/// The super-scale `D` and super-minimum `M` of a super-block whose groups were fitted
/// `(d, m)` on their own: the smallest f16 values under which every group's scale fits in
/// a sub-scale of `0..=255` and its minimum in `-127..=127`.
pub fn super_scales(fits: &[(f32, f32)]) -> (f16, f16) {
    let dmax = fits.iter().fold(0f32, |a, f| a.max(f.0));
    let mmax = fits.iter().fold(0f32, |a, f| a.max(f.1.abs()));
    let sup = |v: f32, n: i32| {
        if v > 0.0 && v.is_finite() {
            f16_at_least(v / n as f32)
        } else {
            f16::ZERO
        }
    };
    (sup(dmax, MAX_SUB_SCALE), sup(mmax, MAX_SUB_MIN))
}

/// The integer multiples of `unit` next to `v`, clamped to `lo..=hi` (the sub-scale or
/// sub-minimum candidates of a fitted value).
fn neighbours(v: f32, unit: f32, lo: i32, hi: i32) -> [i32; 2] {
    if unit <= 0.0 || !v.is_finite() {
        return [0, 0];
    }
    let f = (v / unit).floor().clamp(lo as f32, hi as f32) as i32;
    [f, (f + 1).min(hi)]
}

/// Rounds one group onto its super-block's grid (`D`, `M` from [`super_scales`]): tries
/// the sub-scales and sub-minimums next to the group's own fit `(d, m)` and next to the
/// weighted refit of the best codes, keeps the pair of least (weighted) squared error,
/// writes its codes and returns `(sc, mc)`.
pub fn round_group_on_super(
    x: &[f32],
    bits: Bits,
    imp: Option<&[f32]>,
    fit: (f32, f32),
    (sup_d, sup_m): (f16, f16),
    q: &mut [u8],
) -> (u8, i8) {
    assert_eq!(x.len(), q.len());
    let nmax = bits.max_code() as f32;
    let (dd, mm) = (sup_d.to_f32(), sup_m.to_f32());
    let mut cand = vec![0u8; q.len()];
    let mut best: Option<(f64, i32, i32)> = None;
    let mut try_near = |d: f32, m: f32, best: &mut Option<(f64, i32, i32)>, q: &mut [u8]| {
        for sc in neighbours(d, dd, 0, MAX_SUB_SCALE) {
            for mc in neighbours(m, mm, -MAX_SUB_MIN, MAX_SUB_MIN) {
                if best.is_some_and(|b| b.1 == sc && b.2 == mc) {
                    continue;
                }
                let e =
                    round_asymmetric_with(x, imp, nmax, dd * sc as f32, mm * mc as f32, &mut cand);
                if best.is_none_or(|b| e < b.0) {
                    *best = Some((e, sc, mc));
                    q.copy_from_slice(&cand);
                }
            }
        }
    };
    try_near(fit.0, fit.1, &mut best, q);
    if let Some((d1, m1)) = refit(x, imp, q) {
        try_near(d1, m1, &mut best, q);
    }
    let (_, sc, mc) = best.expect("at least one candidate");
    (sc as u8, mc as i8)
}

/// Each group's own fit `(d, m)` (one level, [`round_asymmetric`]); `q` is scratch of the
/// row's length.
fn group_fits(
    row: &[f32],
    bits: Bits,
    group: usize,
    imp: Option<&[f32]>,
    q: &mut [u8],
) -> Vec<(f32, f32)> {
    let cols = row.len();
    (0..cols.div_ceil(group))
        .map(|cg| {
            let r = cg * group..((cg + 1) * group).min(cols);
            let (d, m) =
                round_asymmetric(&row[r.clone()], bits, imp.map(|w| &w[r.clone()]), &mut q[r]);
            (d.to_f32(), m.to_f32())
        })
        .collect()
}

/// The super-scales and super-minimums of one row's super-blocks ([`super_scales`] of its
/// groups' own fits): what GPTQ fixes before it starts on the row.
pub fn row_super_scales(
    row: &[f32],
    bits: Bits,
    group: usize,
    imp: Option<&[f32]>,
) -> Vec<(f16, f16)> {
    let mut q = vec![0u8; row.len()];
    group_fits(row, bits, group, imp, &mut q)
        .chunks(SUPER_GROUPS)
        .map(super_scales)
        .collect()
}

/// Rounds one row onto two-level grids of `group` columns (the last group may be
/// shorter): codes into `q`, sub-scales and sub-minimums (one per group) into `sc`/`mc`,
/// super-scales and super-minimums (one per [`SUPER_GROUPS`] groups) into `sup_d`/`sup_m`.
/// `imp` (length of the row) weights the error per column.
#[allow(clippy::too_many_arguments)]
pub fn round_row_two_level(
    row: &[f32],
    bits: Bits,
    group: usize,
    imp: Option<&[f32]>,
    q: &mut [u8],
    sc: &mut [u8],
    mc: &mut [i8],
    (sup_d, sup_m): (&mut [f16], &mut [f16]),
) {
    let cols = row.len();
    let span = |cg: usize| cg * group..((cg + 1) * group).min(cols);
    let fits = group_fits(row, bits, group, imp, q);
    for (s, chunk) in fits.chunks(SUPER_GROUPS).enumerate() {
        let sup = super_scales(chunk);
        (sup_d[s], sup_m[s]) = sup;
        for (j, &fit) in chunk.iter().enumerate() {
            let cg = s * SUPER_GROUPS + j;
            let r = span(cg);
            (sc[cg], mc[cg]) = round_group_on_super(
                &row[r.clone()],
                bits,
                imp.map(|w| &w[r.clone()]),
                fit,
                sup,
                &mut q[r],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32 - 0.5) * 0.2
            })
            .collect()
    }

    #[test]
    fn symmetric_error_within_half_step() {
        for seed in 0..50 {
            let x = pseudo(32, seed);
            let mut q = [0i8; 32];
            let d = round_symmetric_int8(&x, None, &mut q).to_f32();
            for (v, c) in x.iter().zip(q) {
                // Half a step, plus the clamp at ±127 when f16 rounded the scale down.
                assert!((c as f32 * d - v).abs() <= 0.5 * d * 1.01, "{v} {c} {d}");
            }
        }
    }

    #[test]
    fn asymmetric_reproduces_values_on_a_q4_1_grid() {
        // Weights on a Q4_1 grid (f16 scale and minimum, codes spanning 0..=15) come back exact.
        for seed in 0..50 {
            let r = pseudo(33, seed);
            let d = f16_round(0.01 + r[32].abs() * 0.05);
            let m = f16_round(-0.08 + r[31] * 0.1);
            let mut codes: Vec<u8> = r[..32]
                .iter()
                .map(|v| ((v + 0.1) * 80.0) as u8 % 16)
                .collect();
            codes[0] = 0;
            codes[1] = 15;
            let x: Vec<f32> = codes.iter().map(|&c| c as f32 * d + m).collect();
            let mut q = [0u8; 32];
            let (dd, mm) = round_asymmetric(&x, Bits::B4, None, &mut q);
            for (i, &v) in x.iter().enumerate() {
                assert_eq!(
                    q[i] as f32 * dd.to_f32() + mm.to_f32(),
                    v,
                    "seed {seed} i {i}"
                );
            }
        }
    }

    #[test]
    fn asymmetric_error_bounded_and_refit_helps() {
        for bits in [Bits::B4, Bits::B6] {
            let nmax = bits.max_code() as f32;
            let (mut plain_total, mut fitted_total) = (0f64, 0f64);
            for seed in 0..50 {
                let x = pseudo(64, seed + 100);
                let mut q = [0u8; 64];
                let (d, m) = round_asymmetric(&x, bits, None, &mut q);
                let (d, m) = (d.to_f32(), m.to_f32());
                let (lo, hi) = x
                    .iter()
                    .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
                let step = (hi - lo) / nmax;
                for (v, c) in x.iter().zip(q) {
                    assert!((c as f32 * d + m - v).abs() <= step, "bits {bits:?}");
                }
                fitted_total += x
                    .iter()
                    .zip(q)
                    .map(|(v, c)| ((c as f32 * d + m - v) as f64).powi(2))
                    .sum::<f64>();
                let mut q0 = [0u8; 64];
                let (m0, d0) = (f16_round(lo), f16_round((hi - f16_round(lo)) / nmax));
                plain_total += round_asymmetric_with(&x, None, nmax, d0, m0, &mut q0);
            }
            assert!(
                fitted_total <= plain_total,
                "bits {bits:?}: {fitted_total} > {plain_total}"
            );
        }
    }

    #[test]
    fn importance_weights_shift_the_error() {
        let x = pseudo(32, 7);
        let mut imp = vec![1f32; 32];
        imp[3] = 1000.0;
        let (mut q, mut qw) = ([0u8; 32], [0u8; 32]);
        let (d, m) = round_asymmetric(&x, Bits::B4, None, &mut q);
        let (dw, mw) = round_asymmetric(&x, Bits::B4, Some(&imp), &mut qw);
        let e = (q[3] as f32 * d.to_f32() + m.to_f32() - x[3]).abs();
        let ew = (qw[3] as f32 * dw.to_f32() + mw.to_f32() - x[3]).abs();
        assert!(ew <= e, "{ew} > {e}");
    }
}

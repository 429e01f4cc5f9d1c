//! Near copies (issue 38): a GGUF source held in blocks of 32 with an f16 scale of their
//! own (Q4_0, Q5_0: `d·(q − 8)`, `d·(q − 16)`; Q4_1, Q5_1: `d·q + m`) packed into the
//! low-bit layout of the same width in groups of 32 (`format::int4`), its codes copied and
//! only its scales fitted. Q4_0 and Q5_0 are near copied ([`near_bits`]; Q4_1 and Q5_1
//! are fitted by the same code but measured no better than rounding). Q4_K_M falls back to Q5_0 for rows that are not multiples of
//! 256 (Gemma 3 270M's 640), so re-rounding those onto 4 bits was most of int4's loss
//! there.
//!
//! Every block is first written as `s·c + m` with `s ≥ 0` and `c` in `0..=qmax` (the
//! layout's sub-scales are unsigned): a negative `d` flips the codes, `c = qmax − q`,
//! `s = −d`, `m = m0 + d·qmax` (`m0` = `−8d`, `−16d` or the block's `m`). ggml's Q4_0/Q5_0
//! `d = max / −8` (`/ −16`, `quantize_row_q5_0_ref`) is negative for about half of the
//! blocks, which then sit at an offset of `−7s` (`−15s`) where the others sit at `−8s`
//! (`−16s`); that is why a minimum tied to the scale (`mc = sc` under `M = −16·D`) cannot
//! hold them and each group gets its own sub-minimum.
//!
//! The fit, per super-block of [`SUPER_GROUPS`] groups ([`fit_super`]): `D` = the least
//! f16 with `max s / D ≤ 255`, `sc = round(s / D)` (8 bits: a relative error of at most
//! `1/510` on the largest group); each group's minimum is then refitted to its codes,
//! `m' = m + (s − D·sc)·c̄` (`c̄` the group's mean code: the least-squares offset for the
//! rounded scale), `M` = the least f16 with `max |m'| / M ≤ 127`, `mc = round(m' / M)`.
//! The error of a value is `(s − D·sc)·(c − c̄) + (m' − M·mc)`, so at most
//! `D/2 · max |c − c̄| + M/2` per super-block ([`error_bound`]; about an eighth of the
//! largest group's step), against half a step of a grid twice as coarse when rounded to
//! one bit fewer. The tensor is packed, and its error measured, as it will run.

use crate::format::ggml_blocks::{fifth_bits, GgmlType};
use crate::format::int4::RowScales;
use crate::kernels::quant::layout::SUPER_GROUPS;
use crate::kernels::quant::{Bits, BLOCK};
use half::f16;

/// The code width a near copy of `ty` takes (`None`: `ty` has no near copy).
///
/// Q4_1 and Q5_1 are not offered, though [`near_row`] fits them as well: their minimum
/// is free per block, so it is fitted on its own 8-bit grid, and kwk's own asymmetric
/// rounding of the same 4-bit g32 slot did better. Measured on SmolLM2-135M-Instruct's
/// Q4_1 GGUF (10 chunks of wiki.test.raw, int4, 6.16 bpw both): rounded ΔPPL +0.31 %,
/// KLD 0.0034; near copied +0.05 %, KLD 0.0040. Q4_0 there: rounded +3.67 %, KLD 0.0322;
/// near copied +1.14 %, KLD 0.0048.
pub fn near_bits(ty: GgmlType) -> Option<Bits> {
    match ty {
        GgmlType::Q4_0 => Some(Bits::B4),
        GgmlType::Q5_0 => Some(Bits::B5),
        _ => None,
    }
}

/// The code width of `ty`'s blocks when [`near_row`] can fit them (what [`near_bits`]
/// offers, and Q4_1/Q5_1).
#[cfg(test)]
fn fit_bits(ty: GgmlType) -> Option<Bits> {
    match ty {
        GgmlType::Q4_1 => Some(Bits::B4),
        GgmlType::Q5_1 => Some(Bits::B5),
        _ => near_bits(ty),
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// One block of `ty` (a [`fit_bits`] type) as `s·c + m` with `s ≥ 0`: writes its 32 codes
/// `c` and returns `(s, m)` (see the module doc; `ggml-common.h` for the block layouts).
pub(crate) fn block_affine(ty: GgmlType, b: &[u8], codes: &mut [u8]) -> (f32, f32) {
    let d = f16_at(b, 0);
    let (m0, qmax, qs, qh) = match ty {
        GgmlType::Q4_0 => (-8.0 * d, 15u8, &b[2..18], None),
        GgmlType::Q4_1 => (f16_at(b, 2), 15, &b[4..20], None),
        GgmlType::Q5_0 => (-16.0 * d, 31, &b[6..22], Some(&b[2..6])),
        _ => (f16_at(b, 2), 31, &b[8..24], Some(&b[4..8])),
    };
    let qh = qh.map_or(0, |h| u32::from_le_bytes([h[0], h[1], h[2], h[3]]));
    for j in 0..16 {
        let (h0, h1) = fifth_bits(qh, j);
        codes[j] = (qs[j] & 0x0F) | h0;
        codes[j + 16] = (qs[j] >> 4) | h1;
    }
    if d < 0.0 {
        codes.iter_mut().for_each(|c| *c = qmax - *c);
        (-d, m0 + d * qmax as f32)
    } else {
        (d.abs(), m0)
    }
}

/// Whether every block of `bytes` (whole blocks of `ty`) has finite f16 fields (a near copy
/// of an infinite or NaN scale would not be near).
pub(crate) fn blocks_finite(ty: GgmlType, bytes: &[u8]) -> bool {
    let (size, fields) = match ty {
        GgmlType::Q4_0 => (18, 1),
        GgmlType::Q5_0 => (22, 1),
        GgmlType::Q4_1 => (20, 2),
        _ => (24, 2),
    };
    bytes
        .chunks_exact(size)
        .all(|b| (0..fields).all(|k| f16_at(b, 2 * k).is_finite()))
}

/// The least f16 `h ≥ 0` with `max ≤ h · n` (`max` finite, `≥ 0`, `≤ 65504 · n`).
fn least_f16(max: f32, n: f32) -> f16 {
    let mut h = f16::from_f32(max / n);
    while (h.to_f32() as f64) * (n as f64) < max as f64 {
        h = f16::from_bits(h.to_bits() + 1);
    }
    h
}

/// The two-level scales of one super-block (up to [`SUPER_GROUPS`] groups) whose group `g`
/// holds `s[g]·c + m[g]` with codes `codes[g·32..]`: writes `sc`, `mc` and returns
/// `(D, M)` (see the module doc).
pub(crate) fn fit_super(
    s: &[f32],
    m: &[f32],
    codes: &[u8],
    sc: &mut [u8],
    mc: &mut [i8],
) -> (f16, f16) {
    let smax = s.iter().fold(0f32, |a, &x| a.max(x));
    let d = least_f16(smax, 255.0);
    let df = d.to_f32();
    let mut m_fit = [0f32; SUPER_GROUPS];
    for g in 0..s.len() {
        sc[g] = if df > 0.0 {
            (s[g] / df).round().min(255.0) as u8
        } else {
            0
        };
        let mean = codes[g * BLOCK..(g + 1) * BLOCK]
            .iter()
            .map(|&c| c as f32)
            .sum::<f32>()
            / BLOCK as f32;
        m_fit[g] = m[g] + (s[g] - df * sc[g] as f32) * mean;
    }
    let m_fit = &m_fit[..s.len()];
    let mmax = m_fit.iter().fold(0f32, |a, &x| a.max(x.abs()));
    let mm = least_f16(mmax, 127.0);
    let mf = mm.to_f32();
    for g in 0..s.len() {
        mc[g] = if mf > 0.0 {
            (m_fit[g] / mf).round().clamp(-127.0, 127.0) as i8
        } else {
            0
        };
    }
    (d, mm)
}

/// The bound [`fit_super`]'s fit keeps every value of a super-block within:
/// `D/2 · max_g max_i |c_i − c̄_g| + |M|/2`.
#[cfg(test)]
pub(crate) fn error_bound(d: f16, mm: f16, codes: &[u8]) -> f32 {
    let spread = codes
        .chunks(BLOCK)
        .map(|g| {
            let mean = g.iter().map(|&c| c as f32).sum::<f32>() / g.len() as f32;
            g.iter()
                .map(|&c| (c as f32 - mean).abs())
                .fold(0f32, f32::max)
        })
        .fold(0f32, f32::max);
    d.to_f32() / 2.0 * spread + mm.to_f32().abs() / 2.0
}

/// One row of `ty` blocks (a [`fit_bits`] type) as low-bit codes and fitted two-level
/// scales in groups of 32 (a row function of `LowBitWeights::from_rows`).
pub(crate) fn near_row(ty: GgmlType, row: &[u8], codes: &mut [u8], out: &mut RowScales) {
    let size = ty.layout().map_or(0, |l| l.type_size);
    let n = codes.len() / BLOCK;
    let (mut s, mut m) = (vec![0f32; n], vec![0f32; n]);
    for (g, b) in row.chunks_exact(size).enumerate() {
        (s[g], m[g]) = block_affine(ty, b, &mut codes[g * BLOCK..(g + 1) * BLOCK]);
    }
    for (k, (ss, ms)) in s
        .chunks(SUPER_GROUPS)
        .zip(m.chunks(SUPER_GROUPS))
        .enumerate()
    {
        let g0 = k * SUPER_GROUPS;
        let g1 = g0 + ss.len();
        let (d, mm) = fit_super(
            ss,
            ms,
            &codes[g0 * BLOCK..g1 * BLOCK],
            &mut out.sc[g0..g1],
            &mut out.mc[g0..g1],
        );
        out.sup_d[k] = d;
        out.sup_m[k] = mm;
    }
}

#[cfg(test)]
#[path = "near_copy_tests.rs"]
mod tests;

//! The specification of the attention kernels ([`super::key_scores`],
//! [`super::accumulate_values`]) and the `scalar` tier: plain loops, one key or value
//! widened to float32 at a time.

use super::{KeyPanels, ScoreTile, ValueRows, ValueTile, Q8_BLOCK};
use crate::kernels::PANEL_ROWS;
use std::ops::Range;

/// Key `lane` of panel `p`, dimension `d`, as float32 (without a q8 block's scale).
#[inline]
fn key_code(keys: KeyPanels<'_>, dims: usize, p: usize, d: usize, lane: usize) -> f32 {
    let at = (p * dims + d) * PANEL_ROWS + lane;
    match keys {
        KeyPanels::F32(k) => k[at],
        KeyPanels::F16(k) => half::f16::from_bits(k[at]).to_f32(),
        KeyPanels::Bf16(k) => half::bf16::from_bits(k[at]).to_f32(),
        KeyPanels::Q8 { codes, .. } => codes[at] as f32,
    }
}

/// See [`super::key_scores`]: per block of 32 dimensions (all of them for a float key) the
/// products summed in dimension order, a q8 block's sum then times its scale.
pub fn key_scores(keys: KeyPanels<'_>, dims: usize, n_panels: usize, t: ScoreTile<'_>) {
    let block = match keys {
        KeyPanels::Q8 { .. } => Q8_BLOCK,
        _ => dims.max(1),
    };
    for r in 0..t.rows {
        let q = &t.q[r * t.q_ld..][..dims];
        for p in 0..n_panels {
            for lane in 0..PANEL_ROWS {
                let mut acc = 0f32;
                for (b, qb) in q.chunks(block).enumerate() {
                    let mut s = 0f32;
                    for (i, &qv) in qb.iter().enumerate() {
                        s += qv * key_code(keys, dims, p, b * block + i, lane);
                    }
                    acc += match keys {
                        KeyPanels::Q8 { scales, .. } => {
                            s * scales[(p * (dims / Q8_BLOCK) + b) * PANEL_ROWS + lane]
                        }
                        _ => s,
                    };
                }
                t.out[r * t.out_ld + p * PANEL_ROWS + lane] = acc;
            }
        }
    }
}

/// Value dimension `d` of slot `j` as float32, and the factor it is scaled by (a q8
/// block's scale, else 1).
#[inline]
fn value(values: ValueRows<'_>, dims: usize, j: usize, d: usize) -> (f32, f32) {
    match values {
        ValueRows::F32Panels { data, cap } => {
            let (c, lane) = (d / PANEL_ROWS, d % PANEL_ROWS);
            (data[(c * cap + j) * PANEL_ROWS + lane], 1.0)
        }
        ValueRows::F16(v) => (half::f16::from_bits(v[j * dims + d]).to_f32(), 1.0),
        ValueRows::Bf16(v) => (half::bf16::from_bits(v[j * dims + d]).to_f32(), 1.0),
        ValueRows::Q8 { codes, scales } => (
            codes[j * dims + d] as f32,
            scales[j * (dims / Q8_BLOCK) + d / Q8_BLOCK],
        ),
    }
}

/// See [`super::accumulate_values`]: slots in order, each weight (times a q8 block's
/// scale) times the widened value added into the output.
pub fn accumulate_values(
    values: ValueRows<'_>,
    dims: usize,
    slots: Range<usize>,
    t: ValueTile<'_>,
) {
    for r in 0..t.rows {
        let out = &mut t.out[r * t.out_ld..][..dims];
        for (i, j) in slots.clone().enumerate() {
            let w = t.p[r * t.p_ld + i];
            for (d, o) in out.iter_mut().enumerate() {
                let (v, s) = value(values, dims, j, d);
                *o += (w * s) * v;
            }
        }
    }
}

/// See [`super::widen_key_panels`]: each key widened, a q8 code times its block's scale.
pub fn widen_key_panels(keys: KeyPanels<'_>, dims: usize, n_panels: usize, out: &mut [f32]) {
    for p in 0..n_panels {
        for d in 0..dims {
            for lane in 0..PANEL_ROWS {
                let at = (p * dims + d) * PANEL_ROWS + lane;
                out[at] = match keys {
                    KeyPanels::Q8 { scales, .. } => {
                        key_code(keys, dims, p, d, lane)
                            * scales[(p * (dims / Q8_BLOCK) + d / Q8_BLOCK) * PANEL_ROWS + lane]
                    }
                    _ => key_code(keys, dims, p, d, lane),
                };
            }
        }
    }
}

/// See [`super::widen_values`]: each value widened, a q8 code times its block's scale.
pub fn widen_values(values: ValueRows<'_>, dims: usize, slots: Range<usize>, out: &mut [f32]) {
    let n = slots.len();
    for (i, j) in slots.enumerate() {
        for d in 0..dims {
            let (v, s) = value(values, dims, j, d);
            out[((d / PANEL_ROWS) * n + i) * PANEL_ROWS + d % PANEL_ROWS] = v * s;
        }
    }
}

//! The quantized matmuls' specification: one code at a time, exact integer block dots,
//! then the float steps in their order (`acc = float(dot) · (d_w · d_a) + acc` per block;
//! for low-bit codes `acc = m · S + acc` per column group, `d = D · sc` and `m = M · mc`
//! formed exactly first), rounded as a
//! [`Rounding`] says. Every tier agrees with it to the bit (the tests run every tier
//! the CPU has against it); no tier runs it.

use super::driver::{
    check_operands, drive_row_groups, min_terms, Q8Rows, Rounding, TileAt, TOKEN_TILE,
};
use super::layout::{Int8Tiles, LowBitTiles, BLOCK, INT8_TILE_BYTES, ROW_GROUP};
use crate::kernels::OutputMatrix;
use std::ops::Range;

/// [`int8_matmul`](super::int8_matmul) on the specification ([`int8_tile_scalar`], one code at a time) with
/// `rounding`: the reference the tests hold every path to, the scalar tier's included.
pub fn int8_matmul_spec(
    rounding: Rounding,
    w: &Int8Tiles,
    x: &Q8Rows,
    rows: Range<usize>,
    y: &OutputMatrix,
) {
    w.check();
    check_operands(x, w.cols, w.rows, &rows);
    drive_row_groups(
        rows,
        x.n_tokens,
        y,
        |g, t0, n, out| int8_tile_scalar(rounding, w, x, TileAt { g, t0, n }, out),
        None,
    );
}

/// The specification: exact integer block dots, then `acc = float(dot) · (d_w · d_a) +
/// acc`, rounded as `rounding` says.
pub fn int8_tile_scalar(
    rounding: Rounding,
    w: &Int8Tiles,
    x: &Q8Rows,
    at: TileAt,
    out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
) {
    let TileAt { g, t0, n } = at;
    let nb = w.n_blocks();
    for (t, out_t) in out.iter_mut().take(n).enumerate() {
        let tok = t0 + t;
        let mut acc = [0f32; ROW_GROUP];
        for b in 0..nb {
            let tile = &w.qs[(g * nb + b) * INT8_TILE_BYTES..][..INT8_TILE_BYTES];
            let ds = &w.scales[(g * nb + b) * ROW_GROUP..][..ROW_GROUP];
            let a = &x.quants[tok * x.dim + b * BLOCK..][..BLOCK];
            let da = x.scales[tok * nb + b];
            let bs = x.block_sums[tok * nb + b];
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let mut dot = -128 * bs;
                for quad in 0..BLOCK / 4 {
                    for k in 0..4 {
                        dot += tile[quad * 64 + r * 4 + k] as i32 * a[quad * 4 + k] as i32;
                    }
                }
                *acc_r = rounding.step(dot as f32, ds[r].to_f32() * da, *acc_r);
            }
        }
        *out_t = acc;
    }
}

/// [`lowbit_matmul`](super::lowbit_matmul) on the specification ([`lowbit_tile_scalar`], one code at a time)
/// with `rounding`: the reference the tests hold every path to, the scalar tier's included.
pub fn lowbit_matmul_spec(
    rounding: Rounding,
    w: &LowBitTiles,
    x: &Q8Rows,
    rows: Range<usize>,
    y: &OutputMatrix,
) {
    w.check();
    check_operands(x, w.cols, w.rows, &rows);
    let ncg = w.n_col_groups();
    let s_all = min_terms(x, 0, x.n_tokens, w.group_size, ncg);
    drive_row_groups(
        rows,
        x.n_tokens,
        y,
        |g, t0, n, out| {
            let s = &s_all[t0 * ncg..(t0 + n) * ncg];
            lowbit_tile_scalar(rounding, w, x, s, TileAt { g, t0, n }, out)
        },
        None,
    );
}

/// The specification (see the module doc for the order of operations), its float steps
/// rounded as `rounding` says; `s` holds the tokens' minimum terms `[t * n_col_groups +
/// cg]`.
pub fn lowbit_tile_scalar(
    rounding: Rounding,
    w: &LowBitTiles,
    x: &Q8Rows,
    s: &[f32],
    at: TileAt,
    out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
) {
    let TileAt { g, t0, n } = at;
    let nb = w.n_blocks();
    let ncg = w.n_col_groups();
    let bpg = w.group_size / BLOCK;
    for t in 0..n {
        let tok = t0 + t;
        let mut acc = [0f32; ROW_GROUP];
        for cg in 0..ncg {
            // `d = D · sc` and `m = M · mc`, exact in f32 (the layout's module doc).
            let ds: [f32; ROW_GROUP] = std::array::from_fn(|r| w.scale(g, cg, r));
            let ms: [f32; ROW_GROUP] = std::array::from_fn(|r| w.min(g, cg, r));
            for b in cg * bpg..((cg + 1) * bpg).min(nb) {
                let a = &x.quants[tok * x.dim + b * BLOCK..][..BLOCK];
                let da = x.scales[tok * nb + b];
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    let mut dot = 0i32;
                    for (c, &av) in a.iter().enumerate() {
                        dot += w.code(g * ROW_GROUP + r, b * BLOCK + c) as i32 * av as i32;
                    }
                    *acc_r = rounding.step(dot as f32, ds[r] * da, *acc_r);
                }
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                *acc_r = rounding.step(ms[r], s[t * ncg + cg], *acc_r);
            }
        }
        out[t] = acc;
    }
}

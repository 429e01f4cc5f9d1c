//! Tests of `format::near_copy`: every near-copied type comes back within the derived
//! bound of what ggml dequantizes (random and ggml-quantized blocks, odd numbers of
//! super-blocks, zero blocks, a super-block whose scales span more than 8 bits), and the
//! packed tensor is what the fit made.

use super::*;
use crate::decoder::sampling::Rng;
use crate::format::ggml_blocks::{dequantize, SourceBlocks};
use crate::format::quantized::{source_copy, CopyKind, Grid};
use crate::format::source_grid::{copy_near, near_layout_of};
use crate::format::PackedLinear;
use crate::kernels::quant::layout::n_supers;
use crate::model::Tensor;

/// Uniform in [-1, 1).
fn unit(rng: &mut Rng) -> f32 {
    (rng.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// ggml's `quantize_row_q5_0_ref` (`ggml-quants.c`) on one block: `d = max / −16` with
/// `max` the value of largest magnitude, `q = min(31, (int)(x/d + 16.5))`.
fn q5_0_block(x: &[f32]) -> Vec<u8> {
    let max = x
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut b = vec![0u8; 22];
    b[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    let mut qh = 0u32;
    for j in 0..16 {
        let q0 = ((x[j] * id + 16.5) as i32).min(31) as u32;
        let q1 = ((x[j + 16] * id + 16.5) as i32).min(31) as u32;
        b[6 + j] = (q0 & 0x0F) as u8 | ((q1 & 0x0F) << 4) as u8;
        qh |= ((q0 & 0x10) >> 4) << j;
        qh |= ((q1 & 0x10) >> 4) << (j + 16);
    }
    b[2..6].copy_from_slice(&qh.to_le_bytes());
    b
}

/// Random blocks of `ty` with finite f16 fields: scales of either sign spread over three
/// orders of magnitude, some zero.
fn random_blocks(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let size = ty.layout().unwrap().type_size;
    let two_fields = matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1);
    let mut out = Vec::new();
    for _ in 0..n {
        let mut b: Vec<u8> = (0..size).map(|_| (rng.next_u64() >> 56) as u8).collect();
        let d = match rng.next_u64() % 6 {
            0 => 0.0,
            _ => unit(rng) * 10f32.powi(-((rng.next_u64() % 3) as i32) - 1),
        };
        b[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        if two_fields {
            b[2..4].copy_from_slice(&f16::from_f32(unit(rng) * 0.3).to_le_bytes());
        }
        out.extend(b);
    }
    out
}

fn loaded(ty: GgmlType, rows: usize, cols: usize, bytes: Vec<u8>) -> Tensor {
    let mut data = vec![0f32; rows * cols];
    dequantize(ty, &bytes, &mut data).unwrap();
    Tensor::new(vec![rows, cols], data).with_source(SourceBlocks { ty, bytes })
}

/// Fits one row and checks every value against ggml's within [`error_bound`] (plus f32
/// rounding of the two products); returns the largest error relative to the bound.
fn check_row(ty: GgmlType, row: &[u8]) -> f32 {
    let size = ty.layout().unwrap().type_size;
    let cols = row.len() / size * BLOCK;
    let ncg = cols / BLOCK;
    let mut want = vec![0f32; cols];
    dequantize(ty, row, &mut want).unwrap();
    let mut codes = vec![0u8; cols];
    let mut s = RowScales::new(ncg);
    near_row(ty, row, &mut codes, &mut s);
    assert_eq!(s.sup_d.len(), n_supers(ncg));
    let qmax = fit_bits(ty).unwrap().max_code() as u8;
    assert!(codes.iter().all(|&c| c <= qmax), "{ty}: code above {qmax}");
    let mut worst = 0f32;
    for (k, (d, mm)) in s.sup_d.iter().zip(&s.sup_m).enumerate() {
        let g0 = k * SUPER_GROUPS;
        let g1 = (g0 + SUPER_GROUPS).min(ncg);
        let sb_codes = &codes[g0 * BLOCK..g1 * BLOCK];
        let bound = error_bound(*d, *mm, sb_codes);
        for g in g0..g1 {
            let scale = d.to_f32() * s.sc[g] as f32;
            let min = mm.to_f32() * s.mc[g] as f32;
            for i in g * BLOCK..(g + 1) * BLOCK {
                let got = codes[i] as f32 * scale + min;
                let err = (got - want[i]).abs();
                let slack = 4.0 * f32::EPSILON * (want[i].abs() + min.abs() + 1e-30);
                assert!(
                    err <= bound + slack,
                    "{ty} super-block {k} value {i}: {got} vs ggml {} (error {err} > bound {bound})",
                    want[i]
                );
                if bound > 0.0 {
                    worst = worst.max(err / bound);
                }
            }
        }
    }
    worst
}

#[test]
fn every_near_type_round_trips_within_the_bound() {
    let mut rng = Rng::from_state(0x243F_6A88_85A3_08D3);
    for ty in [
        GgmlType::Q5_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_1,
    ] {
        // 1, 8 (one whole super-block), 9 and 20 (Gemma's 640: 3 super-blocks, the last
        // of 4 groups) blocks per row.
        for blocks in [1, 8, 9, 20] {
            for _ in 0..20 {
                check_row(ty, &random_blocks(ty, blocks, &mut rng));
            }
        }
    }
}

/// On blocks ggml itself quantized (Q5_0 of Gaussian-like rows, the shape of Gemma's
/// fallback tensors), the error stays within the bound and the bound is small: under a
/// fifth of the largest group's step (`D·255/2 · 31 / 255 + M/2`, about `0.06 + 0.063`).
#[test]
fn ggml_quantized_q5_0_rows_stay_within_an_eighth_of_a_step() {
    let mut rng = Rng::from_state(11);
    for _ in 0..50 {
        let x: Vec<f32> = (0..640)
            .map(|_| (unit(&mut rng) + unit(&mut rng) + unit(&mut rng)) * 0.03)
            .collect();
        let row: Vec<u8> = x.chunks(32).flat_map(q5_0_block).collect();
        check_row(GgmlType::Q5_0, &row);
        let (mut codes, mut s) = (vec![0u8; 640], RowScales::new(20));
        near_row(GgmlType::Q5_0, &row, &mut codes, &mut s);
        for (k, (d, mm)) in s.sup_d.iter().zip(&s.sup_m).enumerate() {
            let g1 = ((k + 1) * SUPER_GROUPS).min(20);
            let step = row[k * SUPER_GROUPS * 22..g1 * 22]
                .chunks(22)
                .map(|b| f16_at(b, 0).abs())
                .fold(0f32, f32::max);
            let bound = error_bound(*d, *mm, &codes[k * 256..g1 * BLOCK]);
            assert!(bound < 0.2 * step, "bound {bound} vs step {step}");
        }
    }
}

#[test]
fn zero_blocks_are_exact_zeros() {
    let row = vec![0u8; 22 * 9];
    let (mut codes, mut s) = (vec![0u8; 9 * 32], RowScales::new(9));
    near_row(GgmlType::Q5_0, &row, &mut codes, &mut s);
    assert!(s.sup_d.iter().chain(&s.sup_m).all(|h| h.to_f32() == 0.0));
    assert!(s.sc.iter().all(|&x| x == 0) && s.mc.iter().all(|&x| x == 0));
    // A zero block beside ordinary ones decodes to zeros.
    let mut rng = Rng::from_state(5);
    let mut row = random_blocks(GgmlType::Q5_0, 8, &mut rng);
    row[3 * 22..3 * 22 + 2].copy_from_slice(&f16::ZERO.to_le_bytes());
    check_row(GgmlType::Q5_0, &row);
}

/// Scales 4000x apart in one super-block: the small groups' sub-scales round to 0 or 1
/// (8 bits cannot hold both), yet every value stays within the bound, and no sub-scale
/// overflows even when `max / 255` rounds down in f16.
#[test]
fn scales_wider_than_8_bits_stay_within_the_bound() {
    let mut rng = Rng::from_state(99);
    let mut row = random_blocks(GgmlType::Q5_0, 16, &mut rng);
    for (g, b) in row.chunks_mut(22).enumerate() {
        let d = if g % 8 == 3 { 0.9 } else { 2.2e-4 };
        b[0..2].copy_from_slice(&f16::from_f32(if g % 2 == 0 { d } else { -d }).to_le_bytes());
    }
    check_row(GgmlType::Q5_0, &row);
    // f16(max / 255) below max / 255: the least f16 above is taken.
    for max in [0.9f32, 1.0, 0.0173, 3.1e-6, 6.0e-8, 65504.0] {
        for n in [255.0f32, 127.0] {
            let h = least_f16(max, n);
            assert!(h.to_f32() as f64 * n as f64 >= max as f64, "{max}/{n}");
            let below = f16::from_bits(h.to_bits().saturating_sub(1));
            assert!(h.to_bits() == 0 || (below.to_f32() as f64) * (n as f64) < max as f64);
        }
    }
}

/// A loaded Q5_0 tensor is near copied (and only a fresh one), packed at 5-bit g32's size, named as a near copy, and its packed rows are what the fit made.
#[test]
fn a_loaded_q5_0_tensor_packs_as_a_near_copy() {
    let mut rng = Rng::from_state(3);
    let (rows, cols) = (19, 640);
    let t = loaded(
        GgmlType::Q5_0,
        rows,
        cols,
        random_blocks(GgmlType::Q5_0, rows * 20, &mut rng),
    );
    let four = Grid::Asym {
        bits: Bits::B4,
        group: 32,
    };
    let five = Grid::Asym {
        bits: Bits::B5,
        group: 32,
    };
    let six = Grid::Asym {
        bits: Bits::B6,
        group: 64,
    };
    assert_eq!(source_copy(&t, four), None);
    assert_eq!(source_copy(&t, five), Some((five, CopyKind::Near)));
    // Not lossless: only the copy's own grid takes it; a wider slot rounds.
    assert_eq!(source_copy(&t, six), None);
    assert_eq!(
        source_copy(&t, Grid::Sym8),
        Some((Grid::Sym8, CopyKind::Exact))
    );
    let w = copy_near(&t).unwrap();
    assert_eq!(w.layout_name(), "5-bit g32 (Q5_0 near copy)");
    // Rows are packed in groups of 16 (19 rows take 32).
    assert_eq!(w.bytes() as f64 * 8.0, five.tensor_bits(32, cols));
    let size = 22 * 20;
    let mut got = vec![0f32; cols];
    for r in 0..rows {
        let (mut codes, mut s) = (vec![0u8; cols], RowScales::new(20));
        near_row(
            GgmlType::Q5_0,
            &t.source.as_ref().unwrap().bytes[r * size..][..size],
            &mut codes,
            &mut s,
        );
        w.dequantize_row(r, &mut got);
        for c in 0..cols {
            let g = c / BLOCK;
            let want = codes[c] as f32 * (s.sup_d[g / 8].to_f32() * s.sc[g] as f32)
                + s.sup_m[g / 8].to_f32() * s.mc[g] as f32;
            assert_eq!(got[c].to_bits(), want.to_bits(), "row {r} col {c}");
        }
    }
    // One value changed after loading: no near copy.
    let mut moved = t.clone();
    moved.data[7] += 1.0;
    assert!(near_layout_of(&moved).is_none() && copy_near(&moved).is_none());
    // Q8_0 and the k-quants have none.
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::F16,
    ] {
        assert_eq!(near_bits(ty), None, "{ty}");
    }
}

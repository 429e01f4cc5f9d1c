//! Tests of channel equalization: the statistics, the factors and their application, and
//! the search.

use super::*;
use crate::kernels::quant::Bits;

use crate::test_values::uniform as pseudo;

const G4: Grid = Grid::Asym {
    bits: Bits::B4,
    group: 32,
};

/// Three 96x64 matrices fed by a norm whose channels `outliers` carry `s` times the
/// activation while their weight columns are `s` times smaller (a folded outlier).
fn folded(s: f32, outliers: &[usize]) -> (Vec<Tensor>, Vec<f32>) {
    let mut moment = vec![1f32; 64];
    let ts = (0..3)
        .map(|i| {
            let mut t = Tensor::new(vec![96, 64], pseudo(96 * 64, i + 1));
            for &k in outliers {
                moment[k] = s * s;
                for r in 0..96 {
                    t.data[r * 64 + k] /= s;
                }
            }
            t
        })
        .collect();
    (ts, moment)
}

#[test]
fn a_folded_outlier_is_moved_back_and_the_error_drops() {
    let outliers = [3, 40];
    let (ts, moment) = folded(10.0, &outliers);
    let units: Vec<(&Tensor, Grid)> = ts.iter().map(|t| (t, G4)).collect();
    let alpha = search_norm_unit(&units, &moment, EqualizeOptions::ESTIMATED);
    for &k in &outliers {
        for j in (0..64).filter(|j| !outliers.contains(j)) {
            assert!(
                alpha[k] > 2.0 * alpha[j],
                "alpha {k} {} vs {j} {}",
                alpha[k],
                alpha[j]
            );
        }
    }
    let err = |a: Option<&[f32]>| -> f64 {
        ts.iter()
            .map(|w| {
                rounding_error(&Scored {
                    w,
                    grid: G4,
                    row_div: None,
                    col_mul: a,
                    row_weight: None,
                    col_moment: &moment,
                    importance: None,
                    whole_rows: false,
                })
            })
            .sum()
    };
    assert!(err(Some(&alpha)) < 0.5 * err(None));
}

#[test]
fn weights_already_on_the_grid_are_left_alone() {
    let (mut ts, moment) = folded(1.0, &[]);
    for t in &mut ts {
        for row in t.data.chunks_mut(64) {
            fake_quant_row(row, G4, None);
        }
    }
    let units: Vec<(&Tensor, Grid)> = ts.iter().map(|t| (t, G4)).collect();
    assert!(is_identity(&search_norm_unit(
        &units,
        &moment,
        EqualizeOptions::ESTIMATED
    )));
}

#[test]
fn a_pair_with_a_folded_row_scale_is_equalized() {
    // v rows scaled up by 8 on a few channels, o columns down by 8: moving it back
    // lowers the error of the pair.
    let mut v = Tensor::new(vec![64, 64], pseudo(64 * 64, 7));
    let mut o = Tensor::new(vec![64, 64], pseudo(64 * 64, 8));
    for j in [5, 6, 50] {
        v.data[j * 64..(j + 1) * 64]
            .iter_mut()
            .for_each(|x| *x *= 8.0);
        (0..64).for_each(|r| o.data[r * 64 + j] /= 8.0);
    }
    let ones = vec![1f32; 64];
    let o_in = row_moments(&v, &ones);
    let alpha = search_pair(
        (&v, G4),
        &ones,
        (&o, G4),
        &o_in,
        &|c| c,
        None,
        EqualizeOptions::ESTIMATED,
    );
    assert!(
        alpha[5] > 2.0 * alpha[0] && alpha[50] > 2.0 * alpha[1],
        "{alpha:?}"
    );
}

/// Quantizes each token's values to int8 blocks of [`ACT_BLOCK`] with a per-block
/// absmax scale, as the kernels do (`kernels::quant`'s `Q8Rows`).
fn fake_quant_activations(x: &mut [f32]) {
    for block in x.chunks_mut(ACT_BLOCK) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        if amax > 0.0 {
            let d = amax / 127.0;
            block.iter_mut().for_each(|v| *v = (*v / d).round() * d);
        }
    }
}

/// `Σ ‖W x − Q(W α) Q(x / α)‖²` over `tokens` (rows of `x`): what the int8 kernels
/// compute for weights `ws` fed by one norm, after moving `alpha` across.
fn simulated_output_error(ws: &[Tensor], grid: Grid, x: &[Vec<f32>], alpha: &[f32]) -> f64 {
    let mut e = 0f64;
    for w in ws {
        let cols = w.cols();
        let mut wq = w.clone();
        for row in wq.data.chunks_mut(cols) {
            row.iter_mut().zip(alpha).for_each(|(v, a)| *v *= a);
            fake_quant_row(row, grid, None);
        }
        for t in x {
            let mut xq: Vec<f32> = t.iter().zip(alpha).map(|(v, a)| v / a).collect();
            fake_quant_activations(&mut xq);
            for r in 0..w.rows() {
                let exact: f64 = w.row(r).iter().zip(t).map(|(a, b)| (a * b) as f64).sum();
                let got: f64 = wq.row(r).iter().zip(&xq).map(|(a, b)| (a * b) as f64).sum();
                e += (exact - got).powi(2);
            }
        }
    }
    e
}

/// Residual-stream outlier channels that the norm weight does not show (as in real
/// checkpoints): the estimate sees unit moments and cannot find them; measured moments
/// do, and `int8:calib`'s search (activation blocks scored) moves them into the weights.
/// The kernels' actual arithmetic (8-bit g64 weights, int8 activation blocks of 32)
/// then has a lower output error than with the estimated factors.
#[test]
fn calibrated_int8_beats_estimated_on_hidden_outlier_channels() {
    let grid = Grid::Asym {
        bits: Bits::B8,
        group: 64,
    };
    let (cols, tokens) = (128, 256);
    let outliers = [3usize, 40, 77, 100];
    let ws: Vec<Tensor> = (0..3)
        .map(|i| Tensor::new(vec![64, cols], pseudo(64 * cols, 31 + i)))
        .collect();
    let noise = pseudo(tokens * cols, 99);
    let x: Vec<Vec<f32>> = (0..tokens)
        .map(|t| {
            (0..cols)
                .map(|k| {
                    let v = noise[t * cols + k] * 1.7;
                    if outliers.contains(&k) {
                        v * 12.0
                    } else {
                        v
                    }
                })
                .collect()
        })
        .collect();
    let measured: Vec<f32> = (0..cols)
        .map(|k| x.iter().map(|t| t[k] * t[k]).sum::<f32>() / tokens as f32)
        .collect();
    let estimated = vec![1f32; cols];
    let units: Vec<(&Tensor, Grid)> = ws.iter().map(|t| (t, grid)).collect();
    let est = search_norm_unit(&units, &estimated, EqualizeOptions::ESTIMATED);
    let cal = search_norm_unit(&units, &measured, EqualizeOptions::INT8_CALIBRATED);
    let (e_est, e_cal) = (
        simulated_output_error(&ws, grid, &x, &est),
        simulated_output_error(&ws, grid, &x, &cal),
    );
    for &k in &outliers {
        assert!(
            cal[k] > 2.0 * cal[0],
            "outlier {k}: {} vs {}",
            cal[k],
            cal[0]
        );
    }
    assert!(
        e_cal < 0.5 * e_est,
        "calibrated error {e_cal} not well below estimated {e_est}"
    );
    // With no outliers the calibrated search must not do worse than the estimate (beyond
    // the simulation's noise: each token's activation rounding is shared by all rows).
    let plain: Vec<Vec<f32>> = (0..tokens)
        .map(|t| {
            noise[t * cols..(t + 1) * cols]
                .iter()
                .map(|v| v * 1.7)
                .collect()
        })
        .collect();
    let m: Vec<f32> = (0..cols)
        .map(|k| plain.iter().map(|t| t[k] * t[k]).sum::<f32>() / tokens as f32)
        .collect();
    let cal = search_norm_unit(&units, &m, EqualizeOptions::INT8_CALIBRATED);
    let est = search_norm_unit(&units, &estimated, EqualizeOptions::ESTIMATED);
    let (e_est, e_cal) = (
        simulated_output_error(&ws, grid, &plain, &est),
        simulated_output_error(&ws, grid, &plain, &cal),
    );
    assert!(e_cal <= 1.1 * e_est, "no outliers: {e_cal} vs {e_est}");
}

/// Whole-matrix scaling of the sampled error: a matrix of identical rows has exactly
/// `rows / sampled` times the sampled rows' error.
#[test]
fn whole_rows_scales_the_sampled_error_to_the_matrix() {
    let row = pseudo(64, 5);
    let rows = 300;
    let w = Tensor::new(vec![rows, 64], row.repeat(rows));
    let moment = vec![1f32; 64];
    let score = |whole_rows| {
        rounding_error(&Scored {
            w: &w,
            grid: G4,
            row_div: None,
            col_mul: None,
            row_weight: None,
            col_moment: &moment,
            importance: None,
            whole_rows,
        })
    };
    let one = {
        let mut r = row.clone();
        fake_quant_row(&mut r, G4, None);
        r.iter()
            .zip(&row)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum::<f64>()
    };
    assert!(one > 0.0);
    assert!((score(true) / one - rows as f64).abs() < 1e-6 * rows as f64);
    assert!(score(false) < score(true) / 2.0);
}

#[test]
fn gate_second_moment_limits() {
    // Small inputs: silu(z) ≈ gelu(z) ≈ z/2, so E ≈ var/4; large: ≈ relu, so E ≈ var/2.
    for gelu in [false, true] {
        let small = gate_second_moment(1e-4, gelu);
        assert!((small / 1e-4 - 0.25).abs() < 0.01, "{gelu}: {small}");
        let big = gate_second_moment(1e4, gelu);
        assert!((big / 1e4 - 0.5).abs() < 0.01, "{gelu}: {big}");
    }
    // At unit variance they differ: a float64 quadrature of 200,001 points over ±8 gives
    // E[gelu_tanh(z)²] = 0.42519 and E[silu(z)²] = 0.35578.
    let (s, g) = (
        gate_second_moment(1.0, false),
        gate_second_moment(1.0, true),
    );
    assert!(
        (s - 0.3557).abs() < 2e-3 && (g - 0.4252).abs() < 3e-3,
        "{s} {g}"
    );
}

#[test]
fn candidate_is_normalised_and_identity_at_zero() {
    let a = candidate(&[1.0, 4.0, 16.0], &[1.0, 1.0, 1.0], (0.5, 0.5));
    let gm: f32 = a.iter().map(|x| x.ln()).sum::<f32>() / 3.0;
    assert!(gm.abs() < 1e-6);
    assert!((a[2] / a[0] - 4.0).abs() < 1e-5);
    assert!(is_identity(&candidate(
        &[1.0, 4.0],
        &[2.0, 1.0],
        (0.0, 0.0)
    )));
    assert_eq!(
        candidate(&[0.0, 1.0], &[1.0, 0.0], (1.0, 1.0)),
        vec![1.0, 1.0]
    );
    // SmoothQuant's family: a^1 / c^0 flattens the activation scales completely.
    let sq = candidate(&[1.0, 4.0, 16.0], &[2.0, 3.0, 5.0], (1.0, 0.0));
    assert!((sq[1] / sq[0] - 4.0).abs() < 1e-5 && (sq[2] / sq[0] - 16.0).abs() < 1e-4);
}

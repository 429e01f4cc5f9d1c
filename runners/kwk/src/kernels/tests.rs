//! Every SIMD kernel the CPU supports against its scalar specification, at odd sizes and
//! tails. Limits: matmuls and dot products agree within 1e-5 of the sum of |w·x| terms
//! (they differ only in summation order and FMA rounding); conversions bit for bit.

use super::*;

use crate::test_values::uniform as values;

fn run_f32(
    isa: Isa,
    w: &[f32],
    n_rows: usize,
    cols: usize,
    x: &[f32],
    nt: usize,
    rows: Range<usize>,
) -> Vec<f32> {
    let panels = pack_f32_panels(w, n_rows, cols);
    let mut y = vec![f32::NAN; nt * n_rows];
    let out = OutputMatrix::new(&mut y, nt, n_rows);
    let w = PanelWeights {
        data: &panels,
        n_rows,
        cols,
    };
    let x = TokenRows {
        data: x,
        n_tokens: nt,
    };
    gemm_f32_panels(isa, w, x, rows, &out);
    y
}

fn run_bf16(
    isa: Isa,
    w: &[f32],
    n_rows: usize,
    cols: usize,
    x: &[f32],
    nt: usize,
    rows: Range<usize>,
) -> Vec<f32> {
    let (panels, cp) = pack_bf16_panels(w, n_rows, cols);
    let mut xb = vec![0u16; nt * cp];
    for t in 0..nt {
        scalar::f32_to_bf16(&x[t * cols..(t + 1) * cols], &mut xb[t * cp..t * cp + cols]);
    }
    let mut y = vec![f32::NAN; nt * n_rows];
    let out = OutputMatrix::new(&mut y, nt, n_rows);
    let w = PanelWeights {
        data: &panels,
        n_rows,
        cols: cp,
    };
    let x = TokenRows {
        data: &xb,
        n_tokens: nt,
    };
    gemm_bf16_panels(isa, w, x, rows, &out);
    y
}

fn abs_sum(w: &[f32], x: &[f32], cols: usize, t: usize, r: usize) -> f32 {
    (0..cols)
        .map(|k| (w[r * cols + k] * x[t * cols + k]).abs())
        .sum()
}

#[test]
fn panel_matmuls_match_scalar_at_odd_shapes() {
    for &(n_rows, cols, nt) in &[
        (1, 1, 1),
        (17, 3, 7),
        (33, 64, 13),
        (100, 37, 6),
        (80, 96, 1),
        (130, 50, 25),
        // Every tail of the AVX2 float32 prompt path's tiles of six tokens.
        (50, 11, 3),
        (24, 13, 4),
        (17, 12, 5),
        (20, 7, 8),
        (40, 20, 9),
        (33, 70, 10),
        (16, 9, 11),
        // Generation (one token) over every count and tail of the 8-panel AVX-512 and
        // 4-panel AVX2 bf16 tiles and the scalar tier's 3 panels at a time.
        (70, 24, 1),
        (40, 10, 1),
        (33, 12, 1),
        (64, 8, 1),
        (112, 6, 1),
        (96, 5, 1),
        (150, 6, 1),
    ] {
        let w = values(n_rows * cols, (n_rows * 31 + cols) as u64);
        let x = values(nt * cols, (nt * 7 + cols) as u64);
        let rows_cases = [
            0..n_rows,
            (n_rows / 32 * 16).min(n_rows)..n_rows,
            0..n_rows.min(16),
        ];
        for rows in rows_cases {
            let reference = run_f32(Isa::Scalar, &w, n_rows, cols, &x, nt, rows.clone());
            let reference_bf = run_bf16(Isa::Scalar, &w, n_rows, cols, &x, nt, rows.clone());
            for isa in supported_isas() {
                let got = run_f32(isa, &w, n_rows, cols, &x, nt, rows.clone());
                let got_bf = run_bf16(isa, &w, n_rows, cols, &x, nt, rows.clone());
                for t in 0..nt {
                    for r in 0..n_rows {
                        let i = t * n_rows + r;
                        if !rows.contains(&r) {
                            assert!(
                                got[i].is_nan() && got_bf[i].is_nan(),
                                "{isa:?} wrote row {r} outside {rows:?}"
                            );
                            continue;
                        }
                        let lim = 1e-5 * abs_sum(&w, &x, cols, t, r) + 1e-30;
                        assert!(
                            (got[i] - reference[i]).abs() <= lim,
                            "{isa:?} f32 {n_rows}x{cols} t{t} r{r}: {} vs {}",
                            got[i],
                            reference[i]
                        );
                        assert!(
                            (got_bf[i] - reference_bf[i]).abs() <= lim,
                            "{isa:?} bf16 {n_rows}x{cols} t{t} r{r}: {} vs {}",
                            got_bf[i],
                            reference_bf[i]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn output_matrix_writes_land_at_token_and_column() {
    let (n_tokens, ld) = (3, 37);
    let mut y = vec![0f32; n_tokens * ld];
    {
        let out = OutputMatrix::new(&mut y, n_tokens, ld);
        let group: [f32; 16] = std::array::from_fn(|i| 100.0 + i as f32);
        out.write_array(1, 16, &group);
        out.write_cols(2, 32, &[7.0, 8.0, 9.0, 10.0, 11.0]);
    }
    for (i, &v) in y.iter().enumerate() {
        let (t, c) = (i / ld, i % ld);
        let want = match (t, c) {
            (1, 16..=31) => 100.0 + (c - 16) as f32,
            (2, 32..=36) => 7.0 + (c - 32) as f32,
            _ => 0.0,
        };
        assert_eq!(v, want, "token {t} column {c}");
    }
}

#[test]
fn scalar_panel_matmul_is_a_plain_matmul() {
    // 2, 3 and 4 panels (the scalar tier takes up to 3 at a time), full and partial.
    for (n_rows, cols, nt) in [(21, 9, 3), (48, 5, 2), (55, 9, 1), (64, 4, 1)] {
        plain_matmul_case(n_rows, cols, nt);
    }
}

fn plain_matmul_case(n_rows: usize, cols: usize, nt: usize) {
    let w = values(n_rows * cols, n_rows as u64);
    let x = values(nt * cols, cols as u64);
    let y = run_f32(Isa::Scalar, &w, n_rows, cols, &x, nt, 0..n_rows);
    for t in 0..nt {
        for r in 0..n_rows {
            let want: f64 = (0..cols)
                .map(|k| w[r * cols + k] as f64 * x[t * cols + k] as f64)
                .sum();
            assert!((y[t * n_rows + r] as f64 - want).abs() < 1e-5);
        }
    }
    // bf16: the same with both operands rounded to bf16.
    let yb = run_bf16(Isa::Scalar, &w, n_rows, cols, &x, nt, 0..n_rows);
    let round = |v: f32| scalar::bf16_to_f32(scalar::f32_to_bf16_one(v)) as f64;
    for t in 0..nt {
        for r in 0..n_rows {
            let want: f64 = (0..cols)
                .map(|k| round(w[r * cols + k]) * round(x[t * cols + k]))
                .sum();
            assert!((yb[t * n_rows + r] as f64 - want).abs() < 1e-5);
        }
    }
}

#[test]
fn panel_rows_round_trip() {
    let (n_rows, cols) = (19, 7);
    let w = values(n_rows * cols, 3);
    let p = pack_f32_panels(&w, n_rows, cols);
    let (pb, cp) = pack_bf16_panels(&w, n_rows, cols);
    assert_eq!(cp, 8);
    let mut row = vec![0f32; cols];
    for r in 0..n_rows {
        unpack_f32_panel_row(&p, cols, r, &mut row);
        assert_eq!(row, &w[r * cols..(r + 1) * cols]);
        unpack_bf16_panel_row(&pb, cp, r, &mut row);
        for k in 0..cols {
            assert!((row[k] - w[r * cols + k]).abs() <= w[r * cols + k].abs() / 256.0);
        }
    }
}

#[test]
fn dot_and_axpy_match_scalar() {
    for n in [0, 1, 5, 16, 17, 31, 32, 33, 64, 100] {
        let a = values(n, n as u64 + 1);
        let b = values(n, n as u64 + 2);
        let want = scalar::dot_f32(&a, &b);
        let lim = 1e-5 * a.iter().zip(&b).map(|(x, y)| (x * y).abs()).sum::<f32>() + 1e-30;
        for isa in supported_isas() {
            assert!((dot_f32(isa, &a, &b) - want).abs() <= lim, "{isa:?} n={n}");
            let mut y1 = b.clone();
            let mut y2 = b.clone();
            scalar::axpy_f32(&mut y1, 0.37, &a);
            axpy_f32(isa, &mut y2, 0.37, &a);
            for i in 0..n {
                assert!((y1[i] - y2[i]).abs() <= 1e-6, "{isa:?} axpy n={n} i={i}");
            }
        }
    }
}

#[test]
fn dot_f64_matches_scalar() {
    for n in [0, 1, 3, 4, 5, 15, 16, 17, 33, 100, 577] {
        let a: Vec<f64> = values(n, n as u64 + 3).iter().map(|&v| v as f64).collect();
        let b: Vec<f64> = values(n, n as u64 + 4)
            .iter()
            .map(|&v| v as f64 * 1e3)
            .collect();
        let want = scalar::dot_f64(&a, &b);
        let lim = 1e-14 * a.iter().zip(&b).map(|(x, y)| (x * y).abs()).sum::<f64>();
        for isa in supported_isas() {
            let got = dot_f64(isa, &a, &b);
            assert!((got - want).abs() <= lim, "{isa:?} n={n}: {got} vs {want}");
        }
    }
}

#[test]
fn bf16_conversion_matches_scalar_and_half() {
    let mut x = values(53, 9);
    x.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-40,
        f32::MAX,
        3.0e38,
    ]);
    // A tie that must round to even: 1 + 2^-8 (exactly between two bf16 values).
    x.push(1.0 + 1.0 / 256.0);
    for isa in supported_isas() {
        let mut got = vec![0u16; x.len()];
        f32_to_bf16(isa, &x, &mut got);
        for (i, &v) in x.iter().enumerate() {
            let want = half::bf16::from_f32(v);
            if v.is_nan() {
                assert!(scalar::bf16_to_f32(got[i]).is_nan());
            } else {
                assert_eq!(got[i], want.to_bits(), "{isa:?} value {v}");
            }
        }
    }
}

#[test]
fn strided_panels_match_packed_panels() {
    // Panels spaced wider than cols*16 and activations with a row stride > cols.
    let (n_rows, cols, nt, stride, ldx) = (40, 11, 5, 11 * 16 + 48, 17);
    let w = values(n_rows * cols, 21);
    let packed = pack_f32_panels(&w, n_rows, cols);
    let mut spaced = vec![0f32; 3 * stride];
    for p in 0..3 {
        spaced[p * stride..p * stride + cols * 16]
            .copy_from_slice(&packed[p * cols * 16..(p + 1) * cols * 16]);
    }
    let x = values(nt * ldx, 22);
    let mut xd = vec![0f32; nt * cols];
    for t in 0..nt {
        xd[t * cols..(t + 1) * cols].copy_from_slice(&x[t * ldx..t * ldx + cols]);
    }
    for isa in supported_isas() {
        let mut a = vec![0f32; nt * n_rows];
        let mut b = vec![0f32; nt * n_rows];
        let ya = OutputMatrix::new(&mut a, nt, n_rows);
        let yb = OutputMatrix::new(&mut b, nt, n_rows);
        let w = PanelWeights {
            data: &packed,
            n_rows,
            cols,
        };
        let xt = TokenRows {
            data: &xd,
            n_tokens: nt,
        };
        gemm_f32_panels(isa, w, xt, 0..n_rows, &ya);
        let w = PanelWeights {
            data: &spaced,
            n_rows,
            cols,
        };
        let xt = TokenRows {
            data: &x,
            n_tokens: nt,
        };
        let strides = PanelStrides {
            panel: stride,
            token: ldx,
        };
        gemm_f32_panels_strided(isa, w, xt, strides, 0..n_rows, &yb);
        assert_eq!(a, b, "{isa:?}");
    }
}

/// The clamped range ends: underflow to (near) zero, the largest finite results, and
/// SiLU's saturated tails, on every tier (lengths cover the 8- and 16-lane tails).
#[test]
fn exp_and_silu_hold_at_the_range_ends() {
    let ends = [
        -150.0, -103.0, -95.0, -87.0, -20.0, 0.0, 1e-3, 30.0, 88.0, 88.5, -60.0, 60.0, -88.5, 87.9,
        5.0, -5.0, 0.5,
    ];
    for isa in supported_isas() {
        let (mut a, mut b) = (ends.to_vec(), ends.to_vec());
        scalar::exp_shifted_sum(&mut a, 0.0);
        exp_shifted_sum(isa, &mut b, 0.0);
        for i in 0..ends.len() {
            assert!(b[i].is_finite() && b[i] >= 0.0, "{isa:?} exp({})", ends[i]);
            assert!(
                (a[i] - b[i]).abs() <= 2.5e-7 * a[i] + 1e-37,
                "{isa:?} exp({}) {} vs {}",
                ends[i],
                a[i],
                b[i]
            );
        }
        let u = vec![1.5f32; ends.len()];
        let (mut g1, mut g2) = (ends.to_vec(), ends.to_vec());
        scalar::silu_mul(&mut g1, &u);
        silu_mul(isa, &mut g2, &u);
        for i in 0..ends.len() {
            assert!(
                (g1[i] - g2[i]).abs() <= 3e-7 * g1[i].abs() + 1e-30,
                "{isa:?} silu({}) {} vs {}",
                ends[i],
                g1[i],
                g2[i]
            );
        }
    }
}

#[test]
fn scale_max_matches_scalar_exactly() {
    for n in [0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 100] {
        let base: Vec<f32> = values(n, 90 + n as u64).iter().map(|v| v * 30.0).collect();
        let mut want = base.clone();
        let m = scalar::scale_max_f32(&mut want, 0.125);
        for isa in supported_isas() {
            let mut got = base.clone();
            assert_eq!(scale_max_f32(isa, &mut got, 0.125), m, "{isa:?} n={n}");
            assert_eq!(got, want, "{isa:?} n={n}");
        }
    }
}

/// A NaN anywhere (body or tail of the vector loop) makes the maximum NaN on every tier:
/// `max` instructions drop a NaN operand, and a softmax shifted by a NaN-free maximum
/// hid NaN scores (issue 42, item 1).
#[test]
fn scale_max_propagates_nan() {
    for n in [1, 7, 8, 9, 16, 17, 33, 100] {
        for at in [0, n / 2, n - 1] {
            let mut base: Vec<f32> = values(n, 7 + n as u64);
            base[at] = f32::NAN;
            for isa in supported_isas() {
                let mut got = base.clone();
                let m = scale_max_f32(isa, &mut got, 0.5);
                assert!(m.is_nan(), "{isa:?} n={n} NaN at {at}: max {m}");
            }
        }
    }
}

#[test]
fn exp_and_silu_match_scalar_within_two_ulp() {
    for n in [0, 1, 15, 16, 17, 100] {
        let base: Vec<f32> = values(n, 40 + n as u64).iter().map(|v| v * 60.0).collect();
        for isa in supported_isas() {
            let (mut a, mut b) = (base.clone(), base.clone());
            let sa = scalar::exp_shifted_sum(&mut a, 20.0);
            let sb = exp_shifted_sum(isa, &mut b, 20.0);
            for i in 0..n {
                assert!(
                    (a[i] - b[i]).abs() <= 2.5e-7 * a[i],
                    "{isa:?} exp({}) {} vs {}",
                    base[i] - 20.0,
                    a[i],
                    b[i]
                );
            }
            assert!((sa - sb).abs() <= 1e-6 * sa.max(1e-30), "{isa:?} sum");
            let u = values(n, 7);
            let (mut g1, mut g2) = (base.clone(), base.clone());
            scalar::silu_mul(&mut g1, &u);
            silu_mul(isa, &mut g2, &u);
            for i in 0..n {
                assert!(
                    (g1[i] - g2[i]).abs() <= 3e-7 * g1[i].abs() + 1e-37,
                    "{isa:?} silu({}) {} vs {}",
                    base[i],
                    g1[i],
                    g2[i]
                );
            }
        }
    }
}

#[test]
fn kwk_isa_values_force_each_supported_tier_and_refuse_the_rest() {
    assert_eq!(parse_isa_request(None), Ok(None));
    assert_eq!(parse_isa_request(Some("")), Ok(None));
    let supported = supported_isas();
    for isa in &supported {
        let got = parse_isa_request(Some(isa.name())).unwrap().unwrap();
        assert_eq!(got.name(), isa.name());
        assert!(isa_supported(got));
        // Upper case is accepted too.
        assert_eq!(
            parse_isa_request(Some(&isa.name().to_ascii_uppercase())),
            Ok(Some(got))
        );
    }
    let best = best_isa();
    match parse_isa_request(Some("avx512")) {
        Ok(Some(isa)) => assert!(best.has_avx512() && isa == best),
        Ok(None) => panic!("avx512 must name a tier"),
        Err(e) => assert!(!best.has_avx512() && e.contains("set it to one of"), "{e}"),
    }
    let err = parse_isa_request(Some("avx1024")).unwrap_err();
    assert!(
        err.contains("KWK_ISA=avx1024") && err.contains("scalar"),
        "{err}"
    );
    for name in ["amx", "vnni", "avx512bw", "avxvnni", "avx2"] {
        let tier_here = supported.iter().any(|i| i.name() == name);
        let parsed = parse_isa_request(Some(name));
        assert_eq!(parsed.is_ok(), tier_here, "{name}: {parsed:?}");
        if let Err(e) = parsed {
            assert!(
                e.contains("set it to one of ") && e.contains("scalar"),
                "{e}"
            );
        }
    }
}

#[test]
fn each_tier_names_the_kernels_it_runs() {
    let bw = Isa::Avx512Bw;
    assert_eq!(bw.weight_kernels(WeightKernels::Float32), "avx512f");
    assert_eq!(bw.weight_kernels(WeightKernels::Bf16), "avx512f (convert)");
    assert_eq!(
        bw.weight_kernels(WeightKernels::Quantized),
        "avx512bw (1-token: avx2 ymm)"
    );
    let vnni = Isa::Avx512Vnni {
        bf16: true,
        amx: false,
    };
    assert_eq!(vnni.weight_kernels(WeightKernels::Bf16), "avx512bf16");
    assert_eq!(
        vnni.weight_kernels(WeightKernels::Quantized),
        "avx512vnni (1-token: vpdpbusd ymm)"
    );
    let amx = Isa::Avx512Vnni {
        bf16: true,
        amx: true,
    };
    assert_eq!(amx.name(), "amx");
    assert_eq!(amx.weight_kernels(WeightKernels::Bf16), "avx512bf16");
    assert!(amx
        .weight_kernels(WeightKernels::Quantized)
        .ends_with("tiles (prompts) + avx512vnni (1-token: vpdpbusd ymm)"));
    let vnni_no_bf16 = Isa::Avx512Vnni {
        bf16: false,
        amx: false,
    };
    assert_eq!(
        vnni_no_bf16.weight_kernels(WeightKernels::Bf16),
        "avx512f (convert)"
    );
    assert_eq!(Isa::Avx2.weight_kernels(WeightKernels::Float32), "avx2");
    assert_eq!(
        Isa::Avx2.weight_kernels(WeightKernels::Bf16),
        "avx2 (convert)"
    );
    assert_eq!(Isa::Avx2.weight_kernels(WeightKernels::Quantized), "avx2");
    assert!(Isa::AvxVnni
        .weight_kernels(WeightKernels::Quantized)
        .starts_with("avxvnni"));
    // The roofline's compute ceiling follows the arithmetic the kernels really use: the
    // scalar tier's block dots are SSE2 `pmaddwd` on x86-64, f32 multiply-adds elsewhere.
    let (label, arithmetic) = if cfg!(target_arch = "x86_64") {
        ("scalar (sse2 pmaddwd)", super::Arithmetic::Int8)
    } else {
        ("scalar (f32 dots)", super::Arithmetic::Fp32)
    };
    assert_eq!(Isa::Scalar.weight_kernels(WeightKernels::Quantized), label);
    assert_eq!(Isa::Scalar.arithmetic(WeightKernels::Quantized), arithmetic);
    assert_eq!(
        Isa::Avx2.arithmetic(WeightKernels::Quantized),
        super::Arithmetic::Int8
    );
    assert_eq!(
        Isa::Avx2.arithmetic(WeightKernels::Bf16),
        super::Arithmetic::Bf16
    );
    assert_eq!(
        bw.summary(),
        "avx512bw: float32 avx512f, bf16 avx512f (convert), int8/int4 avx512bw (1-token: avx2 ymm)"
    );
}

/// GeGLU's gate on every tier against the scalar twin (odd lengths for the 8- and 16-lane
/// tails, and the range ends where `e^(−2z)` under- or overflows), and the scalar twin's
/// `x / (1 + e^(−2z))` against the tanh form computed in f64.
#[test]
fn gelu_tanh_matches_scalar_and_the_tanh_form() {
    let ends = [
        -1000.0, -60.0, -11.0, -10.0, -5.0, -1.0, -1e-3, 0.0, 1e-3, 0.5, 1.0, 5.0, 10.0, 60.0,
        1000.0, -3.0, 2.5,
    ];
    // In f64: the tanh form where 1 + tanh(z) keeps its digits, else its equal
    // x·e^(2z)/(1 + e^(2z)) (1 + tanh(z) cancels to 0 in f64 below z ≈ −18).
    let tanh_form = |x: f32| {
        let x = x as f64;
        let z = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
        if z > -4.0 {
            0.5 * x * (1.0 + z.tanh())
        } else {
            x * (2.0 * z).exp() / (1.0 + (2.0 * z).exp())
        }
    };
    for n in [0, 1, 7, 8, 9, 15, 16, 17, 33, 100] {
        let mut base: Vec<f32> = values(n, 70 + n as u64).iter().map(|v| v * 8.0).collect();
        if n == ends.len() {
            base.copy_from_slice(&ends);
        }
        let u = values(n, 11 + n as u64);
        let mut want = base.clone();
        scalar::gelu_tanh_mul(&mut want, &u);
        for i in 0..n {
            let r = tanh_form(base[i]) * u[i] as f64;
            // e^(−2z) carries the f32 rounding of its argument: relative error ~ |2z|·ε.
            let two_z = (base[i] * (scalar::GELU_2C + scalar::GELU_2C3 * base[i] * base[i])).abs();
            assert!(
                (want[i] as f64 - r).abs() <= 5e-7 * (1.0 + two_z as f64) * r.abs() + 1e-30,
                "scalar gelu({}) {} vs tanh form {r}",
                base[i],
                want[i]
            );
        }
        for isa in supported_isas() {
            let mut got = base.clone();
            gelu_tanh_mul(isa, &mut got, &u);
            for i in 0..n {
                // The tiers round 2z with an FMA: e^(−2z) may differ by |2z|·ε.
                let two_z =
                    (base[i] * (scalar::GELU_2C + scalar::GELU_2C3 * base[i] * base[i])).abs();
                assert!(
                    (got[i] - want[i]).abs() <= 3e-7 * (1.0 + two_z) * want[i].abs() + 1e-33,
                    "{isa:?} gelu({}) {} vs {}",
                    base[i],
                    got[i],
                    want[i]
                );
            }
        }
    }
    // The range ends themselves, on every tier.
    let u = vec![1.5f32; ends.len()];
    let mut want = ends.to_vec();
    scalar::gelu_tanh_mul(&mut want, &u);
    for isa in supported_isas() {
        let mut got = ends.to_vec();
        gelu_tanh_mul(isa, &mut got, &u);
        for i in 0..ends.len() {
            assert!(got[i].is_finite(), "{isa:?} gelu({})", ends[i]);
            let x = ends[i];
            let two_z = (x * (scalar::GELU_2C + scalar::GELU_2C3 * x * x))
                .abs()
                .min(1e3);
            assert!(
                (got[i] - want[i]).abs() <= 3e-7 * (1.0 + two_z) * want[i].abs() + 1e-33,
                "{isa:?} gelu({}) {} vs {}",
                ends[i],
                got[i],
                want[i]
            );
        }
    }
}

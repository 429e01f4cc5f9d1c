//! The quantized kernels' tests: every tier the CPU has against the specification (bit
//! for bit) and against float32 math, at odd sizes; shared helpers in [`support`].

pub(crate) mod support {
    //! Shared by the quantized kernels' tests: pseudo-random data, q8 activations, and
    //! the comparisons every path must pass.
    use crate::format::{PackedLinear, PreparedInput};
    use crate::kernels::q8_activations::quantize_rows_q8;
    use crate::kernels::quant::{InputMemo, QuantIsa, Rounding};
    use crate::kernels::OutputMatrix;
    use std::ops::Range;

    pub fn pseudo(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5) as f32 * 2.0 * scale
            })
            .collect()
    }

    pub struct Q8 {
        pub quants: Vec<i8>,
        pub scales: Vec<f32>,
        pub sums: Vec<i32>,
        pub dim: usize,
        /// Shared by every call on these activations, as the decoder's is.
        pub memo: InputMemo,
    }

    impl Q8 {
        pub fn new(x: &[f32], dim: usize) -> Q8 {
            let nb = x.len() / 32;
            let mut q = Q8 {
                quants: vec![0; x.len()],
                scales: vec![0.0; nb],
                sums: vec![0; nb],
                dim,
                memo: InputMemo::default(),
            };
            quantize_rows_q8(x, dim, &mut q.quants, &mut q.scales, &mut q.sums);
            q
        }
        pub fn input(&self) -> PreparedInput<'_> {
            PreparedInput::Q8Blocks {
                quants: &self.quants,
                scales: &self.scales,
                block_sums: &self.sums,
                dim: self.dim,
                memo: Some(&self.memo),
            }
        }
        pub fn dequant(&self) -> Vec<f32> {
            self.quants
                .iter()
                .enumerate()
                .map(|(i, &q)| q as f32 * self.scales[i / 32])
                .collect()
        }
    }

    /// Where a test matmul runs: a tier, or the specification with a rounding.
    #[derive(Clone, Copy)]
    pub enum Path {
        Tier(QuantIsa),
        Spec(Rounding),
    }

    /// A matmul on a path.
    pub type MatmulFn<'a> = dyn Fn(Path, &PreparedInput, Range<usize>, &OutputMatrix) + 'a;

    /// Runs `w` on `path` over the row slices `splits` (as threads would) into a fresh output.
    pub fn run(
        w: &MatmulFn,
        path: Path,
        q8: &Q8,
        n_tokens: usize,
        rows: usize,
        splits: &[Range<usize>],
    ) -> Vec<f32> {
        let mut y = vec![f32::NAN; n_tokens * rows];
        let out = OutputMatrix::new(&mut y, n_tokens, rows);
        for r in splits {
            w(path, &q8.input(), r.clone(), &out);
        }
        y
    }

    /// Checks every path, the scalar tier's included, against the specification (bit-exact)
    /// and the specification against float32 math: the result
    /// must be within the sum of the per-product quantization errors
    /// `Σ_i |ŵ_i â_i - w_i x_i|` (plus 1e-5 relative float slack) of `W · x` in f64,
    /// and within 1e-5 relative of `Ŵ · x̂` (the dequantized operands) in f64.
    pub fn check_paths(
        packed: &dyn PackedLinear,
        matmul: &MatmulFn,
        w: &[f32],
        rows: usize,
        cols: usize,
        n_tokens: usize,
        seed: u64,
    ) {
        let x = pseudo(n_tokens * cols, seed, 1.0);
        let q8 = Q8::new(&x, cols);
        let xd = q8.dequant();
        let mut wd = vec![0f32; rows * cols];
        for r in 0..rows {
            packed.dequantize_row(r, &mut wd[r * cols..(r + 1) * cols]);
        }
        // Row slices on multiples of 16, as the decoder's thread split makes them.
        let mid = (rows / 2) / 16 * 16;
        let splits = [0..mid, mid..rows];
        let spec = |rounding| run(matmul, Path::Spec(rounding), &q8, n_tokens, rows, &splits);
        let reference = spec(Rounding::Once);
        let twice = spec(Rounding::Twice);
        for isa in QuantIsa::available() {
            let got = run(matmul, Path::Tier(isa), &q8, n_tokens, rows, &splits);
            let want = match isa.rounding() {
                Rounding::Once => &reference,
                Rounding::Twice => &twice,
            };
            for (i, (a, b)) in got.iter().zip(want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{} vs the specification rounding {:?} at {i}: {a} vs {b} (rows {rows} cols {cols} tokens {n_tokens})",
                    isa.name(),
                    isa.rounding()
                );
            }
        }
        // Rounding twice differs from once by at most a rounding of the accumulator per
        // step: far inside the float32 bound below, which both must meet.
        for (t, r) in (0..n_tokens).flat_map(|t| (0..rows).map(move |r| (t, r))) {
            let (a, b) = (twice[t * rows + r], reference[t * rows + r]);
            let mag: f64 = (0..cols)
                .map(|c| (wd[r * cols + c] as f64 * xd[t * cols + c] as f64).abs())
                .sum();
            assert!(
                ((a - b) as f64).abs() <= 1e-5 * mag + 1e-6,
                "rounding twice: {a} vs once {b} (t {t} r {r})"
            );
        }
        for t in 0..n_tokens {
            for r in 0..rows {
                let (mut exact, mut deq, mut bound, mut mag) = (0f64, 0f64, 0f64, 0f64);
                for c in 0..cols {
                    let (wv, xv) = (w[r * cols + c] as f64, x[t * cols + c] as f64);
                    let (wq, xq) = (wd[r * cols + c] as f64, xd[t * cols + c] as f64);
                    exact += wv * xv;
                    deq += wq * xq;
                    bound += (wq * xq - wv * xv).abs();
                    mag += (wq * xq).abs();
                }
                let y = reference[t * rows + r] as f64;
                assert!(
                    (y - deq).abs() <= 1e-5 * mag + 1e-6,
                    "dequantized math: {y} vs {deq} (t {t} r {r})"
                );
                assert!(
                    (y - exact).abs() <= bound + 1e-5 * mag + 1e-6,
                    "float32: {y} vs {exact}, bound {bound} (t {t} r {r})"
                );
            }
        }
    }
}

mod int8 {
    use super::support::*;
    use crate::format::int8::Int8Weights;
    use crate::format::PackedLinear;
    use crate::kernels::quant::*;
    use crate::kernels::OutputMatrix;
    use crate::model::Tensor;

    #[test]
    fn int8_paths_agree_with_the_specification_and_float32_at_odd_sizes() {
        for &(rows, cols, tokens) in &[
            (1, 32, 1),
            (16, 32, 8),
            (17, 96, 3),
            (37, 160, 9),
            (48, 224, 17),
            // The amx tier's 16-token tiles with tails, partial last row group.
            (37, 96, 33),
            (20, 64, 16),
            (64, 160, 40),
            (48, 96, 70),
            // A pair of row groups whose second is partial, with 32+ tokens: the 2 × 2
            // kernel through its buffer.
            (20, 96, 40),
            (5, 64, 1),
            (33, 96, 5),
            (50, 64, 6),
            (19, 128, 7),
            // One token over several row groups (paired GEMV, odd and partial groups).
            (100, 96, 1),
            (65, 64, 1),
        ] {
            let w = pseudo(rows * cols, rows as u64 * 7 + cols as u64, 0.05);
            let t = Tensor::new(vec![rows, cols], w.clone());
            let packed = Int8Weights::quantize(&t, None, "test").unwrap();
            let f = |path, x: &crate::format::PreparedInput, r, y: &OutputMatrix| match path {
                Path::Tier(isa) => packed.matmul_rows_isa(isa, x, r, y),
                Path::Spec(rounding) => {
                    let x = crate::format::int8::q8_rows(x, y.n_tokens(), "int8");
                    int8_matmul_spec(rounding, &packed.tiles(), &x, r, y)
                }
            };
            check_paths(&packed, &f, &w, rows, cols, tokens, 3);
        }
    }

    #[test]
    fn int8_round_trip_within_half_a_step() {
        let (rows, cols) = (19, 96);
        let w = pseudo(rows * cols, 11, 0.1);
        let packed =
            Int8Weights::quantize(&Tensor::new(vec![rows, cols], w.clone()), None, "test").unwrap();
        assert_eq!(packed.bytes(), 32 * 96 + 2 * 32 * 3); // two row groups (19 rows padded to 32)
        let mut out = vec![0f32; cols];
        for r in 0..rows {
            packed.dequantize_row(r, &mut out);
            for b in 0..cols / 32 {
                let xs = &w[r * cols + b * 32..r * cols + b * 32 + 32];
                let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                for c in 0..32 {
                    let err = (out[b * 32 + c] - xs[c]).abs();
                    assert!(
                        err <= amax / 127.0 * 0.51,
                        "row {r} col {}: {err}",
                        b * 32 + c
                    );
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_typed_errors() {
        let t = Tensor::new(vec![4, 40], vec![0.0; 160]);
        let err = Int8Weights::quantize(&t, None, "AttnQ weight of layer 2")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("AttnQ weight of layer 2") && err.contains("40"),
            "{err}"
        );
    }
}

mod lowbit {
    use super::support::*;
    use crate::format::int4::LowBitWeights;
    use crate::format::PackedLinear;
    use crate::kernels::quant::*;
    use crate::kernels::OutputMatrix;
    use crate::model::Tensor;

    #[test]
    fn lowbit_paths_agree_with_the_specification_and_float32_at_odd_sizes() {
        for bits in [Bits::B3, Bits::B4, Bits::B5, Bits::B6, Bits::B8] {
            for gs in [32usize, 64, 128] {
                for &(rows, cols, tokens) in &[
                    (1, 32, 1),
                    (17, 96, 3),
                    (37, 160, 9),
                    (16, 576, 2),
                    (33, 64, 8),
                    (50, 128, 6),
                    (19, 192, 7),
                    // The amx tier's 16-token tiles with tails, partial row groups, a
                    // short last scale group (576 = 4 · 128 + 64).
                    (37, 160, 33),
                    (20, 576, 16),
                    (48, 96, 40),
                    (40, 128, 70),
                    // A pair of row groups whose second is partial, with 32+ tokens.
                    (20, 96, 40),
                    // One token over several row groups: the paired GEMV (groups g and
                    // g + half in lock step), an odd group left over, a partial last group.
                    (100, 128, 1),
                    (65, 64, 1),
                ] {
                    let w = pseudo(rows * cols, (rows * 31 + cols) as u64 + gs as u64, 0.05);
                    let t = Tensor::new(vec![rows, cols], w.clone());
                    let packed = LowBitWeights::quantize(&t, bits, gs, None, "test").unwrap();
                    let f = |path, x: &crate::format::PreparedInput, r, y: &OutputMatrix| match path
                    {
                        Path::Tier(isa) => packed.matmul_rows_isa(isa, x, r, y),
                        Path::Spec(rounding) => {
                            let x = crate::format::int8::q8_rows(x, y.n_tokens(), "int4");
                            lowbit_matmul_spec(rounding, &packed.tiles(), &x, r, y)
                        }
                    };
                    check_paths(&packed, &f, &w, rows, cols, tokens, bits.get() as u64);
                }
            }
        }
    }

    #[test]
    fn one_prepared_input_keeps_minimum_terms_per_group_size() {
        // Matrices of different group sizes read one prepared input (the int4 mix's q/k/v
        // or gate/up): each group size gets its own terms, reused by later calls.
        let (rows, cols, tokens) = (32, 256, 5);
        let mut q8 = Q8::new(&pseudo(tokens * cols, 9, 1.0), cols);
        for gs in [32usize, 64, 128, 64, 32] {
            let w = pseudo(rows * cols, gs as u64, 0.05);
            let t = Tensor::new(vec![rows, cols], w);
            let packed = LowBitWeights::quantize(&t, Bits::B4, gs, None, "t").unwrap();
            let f = |path, x: &crate::format::PreparedInput, r, y: &OutputMatrix| match path {
                Path::Tier(isa) => packed.matmul_rows_isa(isa, x, r, y),
                Path::Spec(rounding) => {
                    let x = crate::format::int8::q8_rows(x, y.n_tokens(), "int4");
                    lowbit_matmul_spec(rounding, &packed.tiles(), &x, r, y)
                }
            };
            let best = QuantIsa::best();
            let spec = run(
                &f,
                Path::Spec(best.rounding()),
                &q8,
                tokens,
                rows,
                &[0..16, 16..rows],
            );
            let got = run(&f, Path::Tier(best), &q8, tokens, rows, &[0..16, 16..rows]);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&spec), "groups of {gs}");
        }
        let held = |q8: &Q8| q8.memo.min_terms.lock().unwrap().len();
        assert_eq!(held(&q8), 3);
        q8.memo.clear();
        assert_eq!(held(&q8), 0);
    }

    #[test]
    fn lowbit_round_trip_error_bounds() {
        // Every weight is within one step (max - min) / (2^bits - 1) of its group: the
        // least-squares refit may trade an extreme weight's error (up to a step) for a lower
        // total error (`rounding` tests that the total never exceeds the min/max grid's).
        let (rows, cols) = (21, 160);
        let w = pseudo(rows * cols, 5, 0.1);
        for bits in [Bits::B3, Bits::B4, Bits::B5, Bits::B6, Bits::B8] {
            for gs in [32usize, 64, 128] {
                let packed = LowBitWeights::quantize(
                    &Tensor::new(vec![rows, cols], w.clone()),
                    bits,
                    gs,
                    None,
                    "t",
                )
                .unwrap();
                let mut out = vec![0f32; cols];
                for r in 0..rows {
                    packed.dequantize_row(r, &mut out);
                    for c0 in (0..cols).step_by(gs) {
                        let c1 = (c0 + gs).min(cols);
                        let xs = &w[r * cols + c0..r * cols + c1];
                        let (lo, hi) = xs
                            .iter()
                            .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
                        let step = (hi - lo) / bits.max_code() as f32;
                        for c in c0..c1 {
                            let err = (out[c] - w[r * cols + c]).abs();
                            assert!(
                                err <= step,
                                "bits {bits:?} g{gs} row {r} col {c}: {err} vs step {step}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bits_per_weight_of_each_group_size() {
        let (rows, cols) = (64, 1536);
        let t = Tensor::new(vec![rows, cols], pseudo(rows * cols, 1, 0.1));
        // Per row of 1536: g32 48 groups in 6 super-blocks (48 · 16 + 6 · 32 = 960 bits of
        // scales), g64 24 in 3 (480), g128 12 in 2 (256).
        let (g32, g64, g128) = (960.0 / 1536.0, 480.0 / 1536.0, 256.0 / 1536.0);
        for (bits, gs, bpw) in [
            (Bits::B3, 32, 3.0 + g32),
            (Bits::B3, 64, 3.0 + g64),
            (Bits::B3, 128, 3.0 + g128),
            (Bits::B4, 32, 4.625),
            (Bits::B4, 64, 4.3125),
            (Bits::B4, 128, 4.0 + g128),
            (Bits::B5, 64, 5.0 + g64),
            (Bits::B5, 128, 5.0 + g128),
            (Bits::B6, 64, 6.3125),
            (Bits::B8, 32, 8.0 + g32),
            (Bits::B8, 64, 8.0 + g64),
        ] {
            let p = LowBitWeights::quantize(&t, bits, gs, None, "t").unwrap();
            assert_eq!(p.bytes() as f64 * 8.0 / (rows * cols) as f64, bpw);
        }
    }
}

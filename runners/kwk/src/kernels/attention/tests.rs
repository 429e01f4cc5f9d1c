//! The attention kernels of every tier this CPU supports against a float64 evaluation of
//! the same sums, for every KV element type, at odd row counts, panel counts, slot runs and
//! head dimensions. Limit: 1e-5 of the sum of |terms| (float32 accumulation in a different
//! order); the narrow types are compared on the values they store (widening is exact).

use super::*;
use crate::kernels::supported_isas;

use crate::test_values::uniform as values;

/// One cached tensor in each element type, and its values as float64 (what a kernel must
/// compute with).
enum Stored {
    F32(Vec<f32>),
    F16(Vec<u16>),
    Bf16(Vec<u16>),
    Q8(Vec<i8>, Vec<f32>),
}

impl Stored {
    /// These values as key panels.
    fn key_panels(&self) -> KeyPanels<'_> {
        match self {
            Stored::F32(v) => KeyPanels::F32(v),
            Stored::F16(v) => KeyPanels::F16(v),
            Stored::Bf16(v) => KeyPanels::Bf16(v),
            Stored::Q8(c, s) => KeyPanels::Q8 {
                codes: c,
                scales: s,
            },
        }
    }

    /// These values as value rows; float32 ones are read from `panels` (value panels of a
    /// `cap`-slot head) instead.
    fn value_rows<'a>(&'a self, panels: &'a [f32], cap: usize) -> ValueRows<'a> {
        match self {
            Stored::F32(_) => ValueRows::F32Panels { data: panels, cap },
            Stored::F16(v) => ValueRows::F16(v),
            Stored::Bf16(v) => ValueRows::Bf16(v),
            Stored::Q8(c, s) => ValueRows::Q8 {
                codes: c,
                scales: s,
            },
        }
    }
}

const KINDS: [&str; 4] = ["f32", "f16", "bf16", "q8"];

/// `x` stored as `kind`; q8 blocks run along runs of 32 elements `stride` apart starting at
/// each index that `block_start` accepts (keys: dimension-major in a panel; values:
/// contiguous). Returns the storage and the exact stored values.
fn store(kind: &str, x: &[f32], q8_groups: &[Vec<usize>]) -> (Stored, Vec<f64>) {
    match kind {
        "f32" => (
            Stored::F32(x.to_vec()),
            x.iter().map(|&v| v as f64).collect(),
        ),
        "f16" => {
            let b: Vec<u16> = x
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect();
            let e = b
                .iter()
                .map(|&h| half::f16::from_bits(h).to_f64())
                .collect();
            (Stored::F16(b), e)
        }
        "bf16" => {
            let b: Vec<u16> = x
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_bits())
                .collect();
            let e = b
                .iter()
                .map(|&h| half::bf16::from_bits(h).to_f64())
                .collect();
            (Stored::Bf16(b), e)
        }
        _ => {
            let mut codes = vec![0i8; x.len()];
            let mut scales = vec![0f32; q8_groups.len()];
            let mut exact = vec![0f64; x.len()];
            for (g, idx) in q8_groups.iter().enumerate() {
                let xs: Vec<f32> = idx.iter().map(|&i| x[i]).collect();
                let mut c = vec![0i8; Q8_BLOCK];
                quantize_q8_blocks(&xs, &mut c, &mut scales[g..g + 1]);
                for (k, &i) in idx.iter().enumerate() {
                    codes[i] = c[k];
                    exact[i] = c[k] as f64 * scales[g] as f64;
                }
            }
            (Stored::Q8(codes, scales), exact)
        }
    }
}

/// The q8 blocks of `n_panels` key panels: panel p, block b, lane l holds dims
/// b*32..b*32+32 of that lane (scale index (p * blocks + b) * 16 + l).
fn key_q8_groups(n_panels: usize, dims: usize) -> Vec<Vec<usize>> {
    let blocks = dims / Q8_BLOCK;
    (0..n_panels * blocks * 16)
        .map(|g| {
            let (p, b, l) = (g / (blocks * 16), g / 16 % blocks, g % 16);
            (b * Q8_BLOCK..(b + 1) * Q8_BLOCK)
                .map(|d| (p * dims + d) * 16 + l)
                .collect()
        })
        .collect()
}

/// The q8 blocks of `cap` value slots: 32 contiguous dims of a slot.
fn value_q8_groups(cap: usize, dims: usize) -> Vec<Vec<usize>> {
    (0..cap * dims / Q8_BLOCK)
        .map(|g| (g * Q8_BLOCK..(g + 1) * Q8_BLOCK).collect())
        .collect()
}

/// Scores of every tier against float64, for `kind` keys.
fn check_scores(kind: &str, dims: usize, n_panels: usize, rows: usize, seed: u64) {
    let keys = values(n_panels * dims * 16, seed);
    let (stored, exact) = store(kind, &keys, &key_q8_groups(n_panels, dims));
    let q_ld = dims + 3;
    let q = values(rows * q_ld, seed + 1);
    let out_ld = n_panels * 16 + 5;
    for isa in supported_isas() {
        let mut out = vec![f32::NAN; rows * out_ld];
        let k = stored.key_panels();
        let t = ScoreTile {
            q: &q,
            q_ld,
            rows,
            out: &mut out,
            out_ld,
            // Either way (a prefetch hint or none): the results must not differ.
            streamed: rows % 2 == 1,
        };
        key_scores(isa, k, dims, n_panels, t);
        for r in 0..rows {
            for j in 0..n_panels * 16 {
                let (p, l) = (j / 16, j % 16);
                let (mut want, mut mag) = (0f64, 0f64);
                for d in 0..dims {
                    let term = q[r * q_ld + d] as f64 * exact[(p * dims + d) * 16 + l];
                    want += term;
                    mag += term.abs();
                }
                let got = out[r * out_ld + j] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * mag + 1e-30,
                    "{} {kind} dims {dims} panels {n_panels} rows {rows}: score [{r}][{j}] {got} vs {want}",
                    isa.name()
                );
            }
        }
    }
}

#[test]
fn key_scores_match_float64_on_every_tier_and_type() {
    for kind in KINDS {
        let dims_list: &[usize] = if kind == "q8" {
            &[32, 64, 96]
        } else {
            &[1, 7, 16, 64, 80]
        };
        for &dims in dims_list {
            for (n_panels, rows) in [(1, 1), (3, 2), (2, 3), (1, 4), (2, 7), (4, 9)] {
                check_scores(kind, dims, n_panels, rows, (dims * 31 + rows) as u64);
            }
        }
    }
}

/// P·V of every tier against float64, for `kind` values (float32 in the value panels of a
/// `cap`-slot head, the others one slot per row).
fn check_values(kind: &str, dims: usize, cap: usize, slots: Range<usize>, rows: usize) {
    let chunks = dims / 16;
    let vals = values(cap * dims, (dims * 7 + rows) as u64);
    // Row-major copy for the narrow types; q8 groups are 32 contiguous dims of a slot.
    let (stored, exact) = store(kind, &vals, &value_q8_groups(cap, dims));
    let panels: Vec<f32> = if kind == "f32" {
        let mut p = vec![0f32; chunks * cap * 16];
        for j in 0..cap {
            for d in 0..dims {
                p[((d / 16) * cap + j) * 16 + d % 16] = vals[j * dims + d];
            }
        }
        p
    } else {
        Vec::new()
    };
    let n = slots.len();
    let p_ld = n + 2;
    let p = values(rows * p_ld, 99);
    let out_ld = dims + 1;
    let init = values(rows * out_ld, 7);
    for isa in supported_isas() {
        let mut out = init.clone();
        let v = stored.value_rows(&panels, cap);
        let t = ValueTile {
            p: &p,
            p_ld,
            rows,
            out: &mut out,
            out_ld,
            streamed: rows % 2 == 1,
        };
        accumulate_values(isa, v, dims, slots.clone(), t);
        for r in 0..rows {
            for d in 0..dims {
                let mut want = init[r * out_ld + d] as f64;
                let mut mag = want.abs();
                for (i, j) in slots.clone().enumerate() {
                    let term = p[r * p_ld + i] as f64 * exact[j * dims + d];
                    want += term;
                    mag += term.abs();
                }
                let got = out[r * out_ld + d] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * mag,
                    "{} {kind} dims {dims} slots {slots:?} rows {rows}: out [{r}][{d}] {got} vs {want}",
                    isa.name()
                );
            }
            // Columns past `dims` are not touched.
            assert_eq!(
                out[r * out_ld + dims].to_bits(),
                init[r * out_ld + dims].to_bits()
            );
        }
    }
}

#[test]
fn value_accumulation_matches_float64_on_every_tier_and_type() {
    for kind in KINDS {
        // Chunks of 16 dims: the vector tiers run 4 at a time and then one at a time.
        let dims_list: &[usize] = if kind == "q8" {
            &[32, 64, 96, 160]
        } else {
            &[16, 48, 64, 80, 256]
        };
        for &dims in dims_list {
            for (slots, rows) in [(0..1, 1), (3..10, 2), (0..17, 3), (5..38, 4), (1..40, 9)] {
                check_values(kind, dims, 48, slots, rows);
            }
        }
    }
}

/// q8 round trip: every value within `max|block| / 254` of the original (half a step), a
/// zero block stays zero, and a non-finite value makes its block NaN.
#[test]
fn q8_blocks_round_trip_within_half_a_step() {
    let mut x = values(32 * 5, 3);
    x[40] = 9.0; // an outlier only costs its own block
    x[64..96].fill(0.0);
    let mut codes = vec![0i8; x.len()];
    let mut scales = vec![0f32; 5];
    quantize_q8_blocks(&x, &mut codes, &mut scales);
    for b in 0..5 {
        let amax = x[b * 32..(b + 1) * 32]
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()));
        for i in b * 32..(b + 1) * 32 {
            let back = codes[i] as f32 * scales[b];
            assert!(
                (back - x[i]).abs() <= amax / 254.0 * (1.0 + 1e-6),
                "block {b} value {i}: {back} vs {}",
                x[i]
            );
        }
    }
    assert_eq!(scales[2], 0.0);
    assert!(scales[0] < 1.0 / 127.0 + 1e-7 && scales[1] == 9.0 / 127.0);
    x[3] = f32::INFINITY;
    quantize_q8_blocks(&x, &mut codes, &mut scales);
    assert!(scales[0].is_nan() && scales[1].is_finite());
}

/// `got` is `want` rounded once to float32 (a q8 code times its scale; exact otherwise).
fn assert_rounded_once(got: f32, want: f64, what: &dyn Fn() -> String) {
    assert!(
        (got as f64 - want).abs() <= want.abs() * f32::EPSILON as f64 / 2.0,
        "{}: {got} vs {want}",
        what()
    );
}

#[test]
fn widened_keys_and_values_equal_the_stored_ones_on_every_tier_and_type() {
    for kind in KINDS {
        for &dims in if kind == "q8" {
            &[32, 96][..]
        } else {
            &[16, 48, 80][..]
        } {
            // Keys: panel-major, q8 blocks along each lane's dims (as in `check_scores`).
            let n_panels = 3;
            let keys = values(n_panels * dims * 16, dims as u64);
            let (stored, exact) = store(kind, &keys, &key_q8_groups(n_panels, dims));
            // Values: one slot per row, q8 blocks of 32 contiguous dims.
            let cap = 21;
            let vals = values(cap * dims, dims as u64 + 1);
            let (vstored, vexact) = store(kind, &vals, &value_q8_groups(cap, dims));
            let panels: Vec<f32> = (0..dims / 16 * cap * 16)
                .map(|at| {
                    let (c, j, l) = (at / (cap * 16), at / 16 % cap, at % 16);
                    vals[j * dims + c * 16 + l]
                })
                .collect();
            for isa in supported_isas() {
                let k = stored.key_panels();
                let mut out = vec![f32::NAN; keys.len()];
                widen_key_panels(isa, k, dims, n_panels, &mut out);
                for (i, (&got, &want)) in out.iter().zip(&exact).enumerate() {
                    assert_rounded_once(got, want, &|| format!("{} {kind} key {i}", isa.name()));
                }
                let v = vstored.value_rows(&panels, cap);
                let slots = 5..18;
                let n = slots.len();
                let mut out = vec![f32::NAN; n * dims];
                widen_values(isa, v, dims, slots.clone(), &mut out);
                for (i, j) in slots.enumerate() {
                    for d in 0..dims {
                        let got = out[((d / 16) * n + i) * 16 + d % 16];
                        assert_rounded_once(got, vexact[j * dims + d], &|| {
                            format!("{} {kind} value slot {j} dim {d}", isa.name())
                        });
                    }
                }
            }
        }
    }
}

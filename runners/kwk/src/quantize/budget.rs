//! The size-targeted allocation of `bpw:X`: which grid of
//! [`BUDGET_GRIDS`](crate::format::quantized::BUDGET_GRIDS) each tensor group gets, so that
//! the whole model stays within a budget of bits with the least total error.
//!
//! **The budget** is counted as llama.cpp counts bits per weight: the bits of every tensor
//! (embedding, output, norms, biases and routers included) over all weights. Float vectors
//! stay float32 (32 bits each); what is left of `X × weights` is spent on the units (the
//! layers' linears, one unit per role and layer with all experts of that role together, the
//! embedding and the untied `lm_head`; a tied table is one unit).
//!
//! **The error of a unit** on a grid is its relative output noise, the measure the `int4`
//! mix uses (`quantize::mix`, `quantize::equalize::relative_error`):
//! `Σ_ik E[x_k²] ΔW_ik² / Σ_ik E[x_k²] W_ik²` on sampled rows, summed over the unit's
//! tensors. With calibration (`bpw:X:calib`) `E[x_k²]` are the second moments of the
//! tensor's inputs measured on the calibration text (in the equalized coordinates), so the
//! ratio is the linear's expected output error relative to its output; without, they are
//! estimated from the weights (the preceding norm's weights), a weight-only proxy. The
//! embedding's rows are looked up, not multiplied: its moments are ones.
//!
//! **Comparable across tensors** because each error is normalised by the tensor's own output
//! signal under the same moments: a dimensionless noise-to-signal ratio, independent of the
//! tensor's size and of its scale (which equalization and the norms move freely). Each
//! layer's linear adds its output to the residual stream, one of the `2L + 1` contributions
//! it sums (the embedding, each layer's attention and feed-forward outputs), so a unit of
//! relative noise costs about the same wherever it enters a layer, and those errors are
//! summed with equal weight (the embedding's too). The output projection's relative noise
//! is the logits' own, not one part in `2L + 1`, so its error counts `2L + 1` times (a tied
//! table is that projection too). This is the reason llama.cpp gives `output` more bits
//! than the rest (Q6_K under Q4_K_M), as the `int4` mix does.
//!
//! **The allocation** is exact, not greedy: a multiple-choice knapsack solved by dynamic
//! programming over the units, the bits above each unit's cheapest grid counted in cells of
//! [`CELL_BPW`] bits per weight of the model and rounded up (so the plan never exceeds the
//! budget, and loses at most one cell per unit to rounding). It minimises the summed error
//! under the budget, so it is at least as good as taking the largest error drop per extra
//! bit greedily; and more budget never gives a larger total error (the cell does not depend
//! on the budget, and a larger budget only adds choices).

use crate::format::quantized::Grid;
use crate::quantize::mix::Curve;

/// The cell the dynamic program counts bits in, in bits per weight of the whole model.
pub const CELL_BPW: f64 = 1e-4;

/// A grid per unit and the summed error of the choice.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    pub grids: Vec<Grid>,
    /// The summed error of the units on their grids.
    pub error: f64,
    /// Bits of the units on their grids.
    pub bits: f64,
}

/// The grids (`curves[u]` is unit `u`'s bits and error on each of `grids`) with the least
/// summed error whose bits stay within `budget_bits`, counted in cells of `cell_bits`;
/// `None` when even the cheapest grid of every unit does not fit.
pub fn allocate_budget(
    curves: &[Curve],
    grids: &[Grid],
    budget_bits: f64,
    cell_bits: f64,
) -> Option<Allocation> {
    debug_assert!(grids.len() <= 1 << 8, "a choice is kept in a byte");
    let cheapest: Vec<f64> = curves
        .iter()
        .map(|c| c.bits.iter().copied().fold(f64::INFINITY, f64::min))
        .collect();
    let base: f64 = cheapest.iter().sum();
    if curves.is_empty() || base > budget_bits {
        return (curves.is_empty() && budget_bits >= 0.0).then(|| Allocation {
            grids: Vec::new(),
            error: 0.0,
            bits: 0.0,
        });
    }
    // Cells above each unit's cheapest grid, rounded up (a tiny tolerance keeps an exact
    // multiple from rounding up by float noise).
    let cost: Vec<Vec<usize>> = curves
        .iter()
        .zip(&cheapest)
        .map(|(c, &lo)| {
            c.bits
                .iter()
                .map(|&b| ((b - lo) / cell_bits - 1e-9).ceil().max(0.0) as usize)
                .collect()
        })
        .collect();
    let most: usize = cost
        .iter()
        .map(|c| c.iter().copied().max().unwrap_or(0))
        .sum();
    let cap = (((budget_bits - base) / cell_bits).floor() as usize).min(most);
    // best[c]: the least summed error of the units so far within c cells.
    let mut best = vec![0f64; cap + 1];
    let mut choice = vec![0u8; curves.len() * (cap + 1)];
    let mut next = vec![0f64; cap + 1];
    for (u, c) in curves.iter().enumerate() {
        let row = &mut choice[u * (cap + 1)..(u + 1) * (cap + 1)];
        for (cells, (slot, pick)) in next.iter_mut().zip(row.iter_mut()).enumerate() {
            let mut least = f64::INFINITY;
            for (j, &k) in cost[u].iter().enumerate() {
                if k <= cells {
                    let e = best[cells - k] + c.err[j];
                    if e < least {
                        least = e;
                        *pick = j as u8;
                    }
                }
            }
            *slot = least;
        }
        std::mem::swap(&mut best, &mut next);
    }
    let mut picks = vec![0usize; curves.len()];
    let mut cells = cap;
    for u in (0..curves.len()).rev() {
        let j = choice[u * (cap + 1) + cells] as usize;
        picks[u] = j;
        cells -= cost[u][j];
    }
    Some(Allocation {
        grids: picks.iter().map(|&j| grids[j]).collect(),
        error: picks.iter().zip(curves).map(|(&j, c)| c.err[j]).sum(),
        bits: picks.iter().zip(curves).map(|(&j, c)| c.bits[j]).sum(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grids(n: usize) -> Vec<Grid> {
        crate::format::quantized::BUDGET_GRIDS[..n].to_vec()
    }

    /// Brute force over every choice: the least summed error within the budget.
    fn brute(curves: &[Curve], budget: f64) -> f64 {
        let n = curves[0].bits.len();
        let mut least = f64::INFINITY;
        let total = n.pow(curves.len() as u32);
        for mut code in 0..total {
            let (mut bits, mut err) = (0.0, 0.0);
            for c in curves {
                bits += c.bits[code % n];
                err += c.err[code % n];
                code /= n;
            }
            if bits <= budget && err < least {
                least = err;
            }
        }
        least
    }

    fn curves() -> Vec<Curve> {
        // Unequal sizes, errors falling unevenly with bits (one curve not convex).
        vec![
            Curve {
                bits: vec![400.0, 450.0, 500.0, 650.0],
                err: vec![1.0, 0.7, 0.6, 0.1],
            },
            Curve {
                bits: vec![4000.0, 4500.0, 5000.0, 6500.0],
                err: vec![0.5, 0.45, 0.2, 0.19],
            },
            Curve {
                bits: vec![1000.0, 1125.0, 1250.0, 1625.0],
                err: vec![2.0, 1.0, 0.9, 0.3],
            },
        ]
    }

    #[test]
    fn matches_brute_force_stays_within_budget_and_never_worsens_with_more() {
        let c = curves();
        let g = grids(4);
        let mut last = f64::INFINITY;
        for budget in (5400..=8800).step_by(25) {
            let budget = budget as f64;
            let a = allocate_budget(&c, &g, budget, 1.0).unwrap();
            assert!(a.bits <= budget, "{budget}: {}", a.bits);
            assert!((a.error - brute(&c, budget)).abs() < 1e-12, "{budget}");
            assert!(a.error <= last, "{budget}: {} > {last}", a.error);
            last = a.error;
        }
        assert_eq!(allocate_budget(&c, &g, 5399.0, 1.0), None);
    }

    #[test]
    fn rounding_to_cells_never_exceeds_the_budget() {
        let c = curves();
        for cell in [0.3, 7.0, 33.0] {
            for budget in [5400.0, 6001.0, 7777.7] {
                let a = allocate_budget(&c, &grids(4), budget, cell).unwrap();
                assert!(a.bits <= budget, "{cell} {budget}");
            }
        }
    }
}

//! GPTQ (`int4:gptq`, and `int8:gptq` on the int8 format's 8-bit g64 grid): rounding a linear weight column by column while pushing each
//! column's rounding error onto the columns not yet rounded, weighted by the inverse Hessian
//! of the layer's reconstruction error `‖(W − Q) X‖²`, `H = Σ x xᵀ` over the calibration
//! inputs of that linear (Frantar et al., "GPTQ: Accurate Post-Training Quantization for
//! Generative Pre-trained Transformers", 2022, Algorithm 1).
//!
//! - `H` is damped by `λ = DAMP · mean(diag H)` on the diagonal; a channel no calibration
//!   token ever used (`H_kk = 0`) gets `H_kk = 1` and no coupling, so its column is rounded
//!   plainly and passes no error on (the reference implementation zeroes such a column; it
//!   is kept here, since text outside the calibration may use the channel).
//! - The upper Cholesky factor `U` of `H⁻¹` (`H⁻¹ = Uᵀ U`) is computed without forming
//!   `H⁻¹`: with `J` the index reversal, `J H J = L Lᵀ` (lower Cholesky) gives
//!   `U = J L⁻¹ J` (then `H = U⁻¹ U⁻ᵀ`), in f64.
//! - Columns are processed in blocks of [`BLOCK_COLS`]: inside a block the error update is
//!   applied column by column, the columns after the block get the block's accumulated update
//!   at its end (the paper's lazy batch update, same result).
//! - Each group's scale and minimum are chosen when the quantizer reaches the group's first
//!   column, from the group's current (error-updated) weights, by the same weighted
//!   least-squares search as plain rounding (`quantize::rounding`), then every column of the
//!   group is rounded to the nearest code on that grid. A group never straddles a block
//!   (group sizes 32, 64 and 128 divide the block).
//! - Columns are taken in their natural order, or with `:act` (the paper's act-order,
//!   "descending diag H") in an order that keeps every scale group whole: groups by
//!   descending sum of `diag H` over their columns, the columns inside each group by
//!   descending `diag H` ([`act_order`]). The most active columns are rounded first, while
//!   the most columns are left to absorb their error, and a group's columns stay one
//!   contiguous run, so each group's grid is still fitted at its first column and the packed
//!   layout needs no per-column group index (the reference's act-order with groups stores
//!   one). A trailing partial group keeps its place (only its columns are reordered).
//!
//! Rows are independent given `U`: they are processed in batches of [`ROW_BATCH`] on the
//! rayon threads, so the result does not depend on the thread count.
//!
//! Where `H` comes from (`decoder`): a float32 pass pushes the calibration tokens through
//! the model one layer at a time, accumulating every linear input's `Σ x xᵀ` and sums of
//! squares. When all layers' Hessians fit in [`KEPT_HESSIAN_BYTES`] as [`KeptHessian`]s,
//! that one pass on the original weights serves both the statistics the equalization
//! needs and GPTQ: each kept `H` is rescaled to the equalized layer's inputs
//! (`x / α` per channel, so `D⁻¹ H D⁻¹`). Larger models gather the statistics first and
//! the Hessians in a second pass over the equalized weights (same result up to rounding).

use crate::error::{KwkError, Result};
use crate::format::int4::{LowBitWeights, GROUP_SIZES};
use crate::format::int8::{check_importance, check_shape};
use crate::kernels::quant::layout::{n_supers, SUPER_GROUPS};
use crate::kernels::quant::Bits;
use crate::kernels::{active_isa, axpy_f32, dot_f64, Isa};
use crate::model::Tensor;
use crate::quantize::rounding::{round_asymmetric, round_group_on_super, row_super_scales};
use half::f16;
use rayon::prelude::*;

/// Damping as a fraction of the mean diagonal of `H`.
pub const DAMP: f64 = 0.01;

/// Columns per lazy-update block.
pub const BLOCK_COLS: usize = 128;

/// Rows per task.
const ROW_BATCH: usize = 16;

/// Bytes the Hessians of a GPTQ calibration may take when kept between the statistics and
/// GPTQ (see the module doc; SmolLM2-135M: 201 MiB, 360M: 0.6 GiB; larger models take a
/// second pass instead).
pub const KEPT_HESSIAN_BYTES: usize = 1 << 30;

/// The settings that change GPTQ's output (part of the pack-cache key).
pub fn settings(act_order: bool) -> String {
    let act = if act_order { "groups" } else { "off" };
    format!(
        "gptq damp {DAMP} block {BLOCK_COLS} act-order {act} hessians kept up to {KEPT_HESSIAN_BYTES} bytes"
    )
}

/// The act-order permutation for groups of `group` columns: `order[k]` is the original
/// column taken k-th (see the module doc). Deterministic: ties keep the natural order.
pub fn act_order(moments: &[f32], group: usize) -> Vec<usize> {
    let cols = moments.len();
    let group = group.max(1);
    let whole = cols / group;
    let activity = |g: usize| -> f64 {
        moments[g * group..(g + 1) * group]
            .iter()
            .map(|&m| m as f64)
            .sum()
    };
    let mut groups: Vec<usize> = (0..whole).collect();
    groups.sort_by(|&a, &b| activity(b).total_cmp(&activity(a)));
    if whole * group < cols {
        groups.push(whole);
    }
    let mut order = Vec::with_capacity(cols);
    for g in groups {
        let mut members: Vec<usize> = (g * group..((g + 1) * group).min(cols)).collect();
        members.sort_by(|&a, &b| moments[b].total_cmp(&moments[a]));
        order.extend(members);
    }
    order
}

impl Hessian {
    /// `H` with rows and columns taken in `order` (`order[k]` = original index).
    pub fn permuted(&self, order: &[usize]) -> Hessian {
        let n = self.dim;
        let mut sums = vec![0f64; n * n];
        for (i, &oi) in order.iter().enumerate() {
            for (j, &oj) in order.iter().enumerate() {
                sums[i * n + j] = self.sums[oi * n + oj];
            }
        }
        Hessian {
            dim: n,
            sums,
            tokens: self.tokens,
        }
    }
}

/// `Σ x xᵀ` over `tokens` input vectors of width `dim` (row-major, full symmetric).
#[derive(Debug, Clone, PartialEq)]
pub struct Hessian {
    pub dim: usize,
    pub sums: Vec<f64>,
    pub tokens: u64,
}

impl Hessian {
    pub fn zeros(dim: usize) -> Self {
        Hessian {
            dim,
            sums: vec![0.0; dim * dim],
            tokens: 0,
        }
    }

    /// Adds the `x.len() / dim` rows of `x` (scalar reference; the decoder accumulates with
    /// its matmul kernels).
    pub fn add_rows(&mut self, x: &[f32]) {
        let d = self.dim;
        for row in x.chunks_exact(d) {
            for i in 0..d {
                let xi = row[i] as f64;
                for (s, &xj) in self.sums[i * d..(i + 1) * d].iter_mut().zip(row) {
                    *s += xi * xj as f64;
                }
            }
            self.tokens += 1;
        }
    }

    /// `diag(H) / tokens`: the per-channel second moments.
    pub fn moments(&self) -> Vec<f32> {
        let n = self.tokens.max(1) as f64;
        (0..self.dim)
            .map(|i| (self.sums[i * self.dim + i] / n) as f32)
            .collect()
    }
}

/// A Hessian kept between calibration steps in half its size: the lower triangle (row `i`:
/// columns `0..=i`) in f32. The sums are accumulated in f64; f32 keeps them to 6e-8, far
/// below GPTQ's damping of [`DAMP`] of the mean diagonal.
#[derive(Debug, Clone, PartialEq)]
pub struct KeptHessian {
    pub dim: usize,
    pub tokens: u64,
    lower: Vec<f32>,
}

impl KeptHessian {
    pub fn keep(h: &Hessian) -> Self {
        let n = h.dim;
        let mut lower = Vec::with_capacity(Self::values(n));
        for i in 0..n {
            lower.extend(h.sums[i * n..i * n + i + 1].iter().map(|&v| v as f32));
        }
        KeptHessian {
            dim: n,
            tokens: h.tokens,
            lower,
        }
    }

    /// Values stored for `dim` channels.
    pub fn values(dim: usize) -> usize {
        dim * (dim + 1) / 2
    }

    /// The full Hessian of the inputs divided by `alpha` per channel (`D⁻¹ H D⁻¹`,
    /// `D = diag(alpha)`; `None`: unchanged), in f64.
    pub fn restore(&self, alpha: Option<&[f32]>) -> Hessian {
        let n = self.dim;
        let mut h = Hessian::zeros(n);
        h.tokens = self.tokens;
        let inv: Vec<f64> = match alpha {
            Some(a) => a.iter().map(|&v| 1.0 / v as f64).collect(),
            None => vec![1.0; n],
        };
        let mut k = 0;
        for i in 0..n {
            for j in 0..=i {
                let v = self.lower[k] as f64 * inv[i] * inv[j];
                h.sums[i * n + j] = v;
                h.sums[j * n + i] = v;
                k += 1;
            }
        }
        h
    }
}

/// Columns handled together by the Cholesky factorisation and the triangular inverse (their
/// rows, at most `FACTOR_BLOCK × n` f64, stay in L2 while every other row streams past).
const FACTOR_BLOCK: usize = 16;

/// Rows per rayon task in the factorisation's parallel passes.
const FACTOR_ROWS_PER_TASK: usize = 16;

/// Lower Cholesky factor of the row-major `n × n` matrix `a`; `None` if not positive
/// definite. Every entry is `(a_ij − l_i[..j] · l_j[..j]) / l_jj` (Cholesky–Banachiewicz),
/// computed a block of [`FACTOR_BLOCK`] columns at a time: the block's diagonal rows first,
/// then every row below in parallel, each row's prefix read once for the whole block
/// (column by column, each column would stream the whole lower triangle from L3).
fn cholesky_lower(a: &[f64], n: usize, isa: Isa) -> Option<Vec<f64>> {
    let mut l = vec![0f64; n * n];
    for j0 in (0..n).step_by(FACTOR_BLOCK) {
        let j1 = (j0 + FACTOR_BLOCK).min(n);
        for i in j0..j1 {
            for j in j0..=i {
                let s = a[i * n + j] - dot_f64(isa, &l[i * n..i * n + j], &l[j * n..j * n + j]);
                if i == j {
                    if !(s > 0.0 && s.is_finite()) {
                        return None;
                    }
                    l[i * n + i] = s.sqrt();
                } else {
                    l[i * n + j] = s / l[j * n + j];
                }
            }
        }
        let (head, tail) = l.split_at_mut(j1 * n);
        let block = &head[j0 * n..];
        tail.par_chunks_mut(n)
            .with_min_len(FACTOR_ROWS_PER_TASK)
            .enumerate()
            .for_each(|(k, row)| {
                let i = j1 + k;
                for j in j0..j1 {
                    let lj = &block[(j - j0) * n..(j - j0) * n + j + 1];
                    row[j] = (a[i * n + j] - dot_f64(isa, &row[..j], &lj[..j])) / lj[j];
                }
            });
    }
    Some(l)
}

/// `L⁻¹` of a lower-triangular `l` (`n × n`, row-major) as its columns below the diagonal
/// (`x_j[i − j]` = `L⁻¹[i][j]`), by forward substitution, [`FACTOR_BLOCK`] columns per
/// task so each row of `l` is read once per block.
fn lower_inverse_columns(l: &[f64], n: usize, isa: Isa) -> Vec<Vec<f64>> {
    let starts: Vec<usize> = (0..n).step_by(FACTOR_BLOCK).collect();
    starts
        .into_par_iter()
        .flat_map_iter(|j0| {
            let j1 = (j0 + FACTOR_BLOCK).min(n);
            let mut xs: Vec<Vec<f64>> = (j0..j1).map(|j| vec![0f64; n - j]).collect();
            for i in j0..n {
                for j in j0..j1.min(i + 1) {
                    let x = &mut xs[j - j0];
                    if i == j {
                        x[0] = 1.0 / l[j * n + j];
                    } else {
                        let s = dot_f64(isa, &l[i * n + j..i * n + i], &x[..i - j]);
                        x[i - j] = -s / l[i * n + i];
                    }
                }
            }
            xs
        })
        .collect()
}

/// The GPTQ factor of one input: the upper-triangular `U` (row-major f32) with
/// `Uᵀ U = (H + λ I)⁻¹` (dead channels set to 1 first), and which channels are dead.
#[derive(Debug, Clone)]
pub struct InverseFactor {
    pub dim: usize,
    pub u: Vec<f32>,
    pub dead: Vec<bool>,
}

/// Damps `h` and factors its inverse (see the module doc). The damping is raised tenfold
/// (up to three times) if rounding leaves the damped matrix not positive definite.
pub fn inverse_factor(h: &Hessian, what: &str) -> Result<InverseFactor> {
    let n = h.dim;
    if h.sums.len() != n * n || n == 0 {
        return Err(KwkError::InvalidArgument(format!(
            "{what}: Hessian of {} values for {n} channels",
            h.sums.len()
        )));
    }
    let dead: Vec<bool> = (0..n).map(|i| h.sums[i * n + i] <= 0.0).collect();
    let mean_diag = (0..n)
        .map(|i| if dead[i] { 1.0 } else { h.sums[i * n + i] })
        .sum::<f64>()
        / n as f64;
    if !mean_diag.is_finite() {
        return Err(KwkError::InvalidArgument(format!(
            "{what}: the calibration inputs' Hessian is not finite"
        )));
    }
    let isa = active_isa();
    let mut damp = DAMP;
    for _ in 0..4 {
        // J H J, damped, dead channels set to 1 (J reverses the indices).
        let mut a = vec![0f64; n * n];
        for i in 0..n {
            for j in 0..n {
                let (si, sj) = (n - 1 - i, n - 1 - j);
                a[i * n + j] = if dead[si] || dead[sj] {
                    if si == sj {
                        1.0
                    } else {
                        0.0
                    }
                } else {
                    h.sums[si * n + sj]
                };
            }
            a[i * n + i] += damp * mean_diag;
        }
        let Some(l) = cholesky_lower(&a, n, isa) else {
            damp *= 10.0;
            continue;
        };
        let cols = lower_inverse_columns(&l, n, isa);
        // U[a][b] = X[n-1-a][n-1-b].
        let mut u = vec![0f32; n * n];
        for (j, x) in cols.iter().enumerate() {
            let b = n - 1 - j;
            for (k, &v) in x.iter().enumerate() {
                let a = n - 1 - (j + k);
                u[a * n + b] = v as f32;
            }
        }
        return Ok(InverseFactor { dim: n, u, dead });
    }
    Err(KwkError::InvalidArgument(format!(
        "{what}: the calibration inputs' Hessian stays singular after damping; use int4:calib"
    )))
}

/// Where [`gptq_rows`] writes one batch of rows: codes, and sub-scales and sub-minimums
/// per group (in the order the columns are taken).
struct RowsOut<'a> {
    codes: &'a mut [u8],
    scales: &'a mut [u8],
    mins: &'a mut [i8],
}

/// The two-level grid GPTQ rounds one batch of rows onto: the code width, the group, the
/// rows' super-scales and super-minimums (`[r * n_supers + s]`, fixed from the weights
/// before GPTQ starts), and the natural column group of each group in the order the
/// columns are taken.
struct SuperGrid<'a> {
    bits: Bits,
    group: usize,
    sups: &'a [(f16, f16)],
    n_supers: usize,
    natural_group: &'a [usize],
}

/// GPTQ on one batch of rows (`w`, `nr × cols`): codes, scales and minimums per row.
fn gptq_rows(
    w: &mut [f32],
    cols: usize,
    f: &InverseFactor,
    importance: Option<&[f32]>,
    grid: &SuperGrid<'_>,
    out: RowsOut<'_>,
) {
    let (bits, group) = (grid.bits, grid.group);
    let RowsOut {
        codes,
        scales,
        mins,
    } = out;
    let nr = w.len() / cols;
    let ncg = cols.div_ceil(group);
    let nmax = bits.max_code() as f32;
    let u = &f.u;
    let isa = active_isa();
    let mut err = vec![0f32; nr * BLOCK_COLS];
    let mut dm = vec![(0f32, 0f32); nr];
    for i1 in (0..cols).step_by(BLOCK_COLS) {
        let i2 = (i1 + BLOCK_COLS).min(cols);
        for i in i1..i2 {
            if i % group == 0 {
                let c1 = (i + group).min(cols);
                let imp = importance.map(|v| &v[i..c1]);
                let sup = grid.natural_group[i / group] / SUPER_GROUPS;
                for r in 0..nr {
                    let g = &w[r * cols + i..r * cols + c1];
                    let q = &mut codes[r * cols + i..r * cols + c1];
                    let (d, m) = round_asymmetric(g, bits, imp, q);
                    let (sd, sm) = grid.sups[r * grid.n_supers + sup];
                    let fit = (d.to_f32(), m.to_f32());
                    let (sc, mc) = round_group_on_super(g, bits, imp, fit, (sd, sm), q);
                    scales[r * ncg + i / group] = sc;
                    mins[r * ncg + i / group] = mc;
                    dm[r] = (sd.to_f32() * sc as f32, sm.to_f32() * mc as f32);
                }
            }
            let uii = u[i * cols + i];
            let urow = &u[i * cols + i + 1..i * cols + i2];
            for r in 0..nr {
                let (d, m) = dm[r];
                let v = w[r * cols + i];
                let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                let q = (((v - m) * inv).clamp(0.0, nmax) + 0.5) as u8;
                codes[r * cols + i] = q;
                let e = (v - (q as f32 * d + m)) / uii;
                err[r * BLOCK_COLS + (i - i1)] = e;
                if e != 0.0 {
                    axpy_f32(isa, &mut w[r * cols + i + 1..r * cols + i2], -e, urow);
                }
            }
        }
        if i2 < cols {
            for k in 0..i2 - i1 {
                let urow = &u[(i1 + k) * cols + i2..(i1 + k + 1) * cols];
                for r in 0..nr {
                    let e = err[r * BLOCK_COLS + k];
                    if e != 0.0 {
                        axpy_f32(isa, &mut w[r * cols + i2..(r + 1) * cols], -e, urow);
                    }
                }
            }
        }
    }
}

/// Quantizes `tensor` (`rows × cols`) to `bits`-bit asymmetric groups of `group` columns
/// with GPTQ against the input factor `f` (from [`inverse_factor`] of the inputs this
/// weight sees). `importance` (per column, e.g. `diag H / tokens`) weights each group's
/// scale search as in plain rounding. With `order` (from [`act_order`] for this `group`),
/// the columns are taken in that order and `f` must be the factor of the Hessian
/// [`Hessian::permuted`] the same way; `importance` stays in the natural order.
pub fn gptq_lowbit(
    tensor: &Tensor,
    f: &InverseFactor,
    bits: Bits,
    group: usize,
    importance: Option<&[f32]>,
    order: Option<&[usize]>,
    what: &str,
) -> Result<LowBitWeights> {
    check_shape(tensor, what)?;
    let (rows, cols) = (tensor.rows(), tensor.cols());
    check_importance(importance, cols, what)?;
    if !GROUP_SIZES.contains(&group) || !BLOCK_COLS.is_multiple_of(group) {
        return Err(KwkError::InvalidArgument(format!(
            "{what}: group size {group} is not one of 32, 64, 128"
        )));
    }
    if f.dim != cols {
        return Err(KwkError::InvalidArgument(format!(
            "{what}: Hessian of {} channels for a weight of {cols} columns",
            f.dim
        )));
    }
    if let Some(order) = order {
        let mut seen = vec![false; cols];
        let groups_whole = order.len() == cols
            && order
                .iter()
                .all(|&c| c < cols && !std::mem::replace(&mut seen[c], true))
            && order
                .chunks(group)
                .all(|g| g.iter().all(|&c| c / group == g[0] / group));
        if !groups_whole {
            return Err(KwkError::InvalidArgument(format!(
                "{what}: the GPTQ column order is not a permutation keeping groups of {group} whole"
            )));
        }
    }
    let ncg = cols.div_ceil(group);
    // The weight (and importance) with columns in processing order.
    let permuted: Option<(Vec<f32>, Option<Vec<f32>>)> = order.map(|order| {
        let mut w = vec![0f32; rows * cols];
        for (dst, src) in w.chunks_exact_mut(cols).zip(tensor.data.chunks_exact(cols)) {
            for (d, &o) in dst.iter_mut().zip(order) {
                *d = src[o];
            }
        }
        (w, importance.map(|v| order.iter().map(|&o| v[o]).collect()))
    });
    let natural_importance = importance;
    let (data, importance) = match &permuted {
        Some((w, imp)) => (w.as_slice(), imp.as_deref()),
        None => (tensor.data.as_slice(), importance),
    };
    // The super-blocks' scales come from the weights before GPTQ moves them (in the
    // natural order, which act-order keeps groups whole in).
    let ns = n_supers(ncg);
    let sups: Vec<(f16, f16)> = (0..rows)
        .into_par_iter()
        .flat_map_iter(|r| {
            row_super_scales(
                &tensor.data[r * cols..(r + 1) * cols],
                bits,
                group,
                natural_importance,
            )
        })
        .collect();
    let natural_group: Vec<usize> = match order {
        Some(order) => order.chunks(group).map(|run| run[0] / group).collect(),
        None => (0..ncg).collect(),
    };
    let mut codes = vec![0u8; rows * cols];
    let mut scales = vec![0u8; rows * ncg];
    let mut mins = vec![0i8; rows * ncg];
    codes
        .par_chunks_mut(ROW_BATCH * cols)
        .zip(scales.par_chunks_mut(ROW_BATCH * ncg))
        .zip(mins.par_chunks_mut(ROW_BATCH * ncg))
        .enumerate()
        .for_each(|(b, ((c, s), m))| {
            let r0 = b * ROW_BATCH;
            let nr = c.len() / cols;
            let mut w = data[r0 * cols..(r0 + nr) * cols].to_vec();
            let out = RowsOut {
                codes: c,
                scales: s,
                mins: m,
            };
            let grid = SuperGrid {
                bits,
                group,
                sups: &sups[r0 * ns..(r0 + nr) * ns],
                n_supers: ns,
                natural_group: &natural_group,
            };
            gptq_rows(&mut w, cols, f, importance, &grid, out);
        });
    if let Some(order) = order {
        // Back to the natural order: column order[k] holds code k; the group run starting
        // at k holds the scale of the group order[k] belongs to.
        let mut natural = vec![0u8; cols];
        let (mut sc, mut mn) = (vec![0u8; ncg], vec![0i8; ncg]);
        for r in 0..rows {
            let (c, s, m) = (
                &mut codes[r * cols..(r + 1) * cols],
                &mut scales[r * ncg..(r + 1) * ncg],
                &mut mins[r * ncg..(r + 1) * ncg],
            );
            for (k, &o) in order.iter().enumerate() {
                natural[o] = c[k];
            }
            for (k, run) in order.chunks(group).enumerate() {
                sc[run[0] / group] = s[k];
                mn[run[0] / group] = m[k];
            }
            c.copy_from_slice(&natural);
            s.copy_from_slice(&sc);
            m.copy_from_slice(&mn);
        }
    }
    Ok(LowBitWeights::from_rows(
        bits,
        group,
        rows,
        cols,
        |r, c, s| {
            c.copy_from_slice(&codes[r * cols..(r + 1) * cols]);
            s.sc.copy_from_slice(&scales[r * ncg..(r + 1) * ncg]);
            s.mc.copy_from_slice(&mins[r * ncg..(r + 1) * ncg]);
            for (k, &(d, m)) in sups[r * ns..(r + 1) * ns].iter().enumerate() {
                (s.sup_d[k], s.sup_m[k]) = (d, m);
            }
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::PackedLinear;

    use crate::test_values::uniform as pseudo;

    /// `tokens × dim` inputs with correlated channels and a few outlier channels.
    fn inputs(tokens: usize, dim: usize, seed: u64) -> Vec<f32> {
        let base = pseudo(tokens * dim, seed);
        let mix = pseudo(dim * 4, seed + 1);
        let mut x = vec![0f32; tokens * dim];
        for t in 0..tokens {
            for k in 0..dim {
                // Each channel shares components with its neighbours (correlation).
                let mut v = base[t * dim + k];
                for j in 1..4 {
                    v += mix[k * 4 + j] * base[t * dim + (k + j) % dim];
                }
                if k % 37 == 5 {
                    v *= 6.0;
                }
                x[t * dim + k] = v;
            }
        }
        x
    }

    fn output_error(w: &Tensor, q: &dyn PackedLinear, x: &[f32]) -> f64 {
        let (rows, cols) = (w.rows(), w.cols());
        let mut row = vec![0f32; cols];
        let mut e = 0f64;
        for r in 0..rows {
            q.dequantize_row(r, &mut row);
            for xt in x.chunks_exact(cols) {
                let d: f64 = (0..cols)
                    .map(|k| (w.data[r * cols + k] - row[k]) as f64 * xt[k] as f64)
                    .sum();
                e += d * d;
            }
        }
        e
    }

    #[test]
    fn inverse_factor_is_the_upper_cholesky_of_the_damped_inverse() {
        let (dim, tokens) = (40, 300);
        let x = inputs(tokens, dim, 3);
        let mut h = Hessian::zeros(dim);
        h.add_rows(&x);
        let f = inverse_factor(&h, "test").unwrap();
        let mean = (0..dim).map(|i| h.sums[i * dim + i]).sum::<f64>() / dim as f64;
        // Uᵀ U (H + λI) = I, U upper triangular.
        for i in 0..dim {
            for j in 0..i {
                assert_eq!(f.u[i * dim + j], 0.0);
            }
        }
        for i in 0..dim {
            for j in 0..dim {
                let mut s = 0f64;
                for k in 0..dim {
                    let mut hkj = h.sums[k * dim + j];
                    if k == j {
                        hkj += DAMP * mean;
                    }
                    let uu: f64 = (0..dim)
                        .map(|m| f.u[m * dim + i] as f64 * f.u[m * dim + k] as f64)
                        .sum();
                    s += uu * hkj;
                }
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((s - want).abs() < 1e-3, "({i},{j}) {s}");
            }
        }
    }

    #[test]
    fn gptq_lowers_the_output_error_below_plain_rounding_on_every_grid() {
        let (rows, cols, tokens) = (48, 256, 1024);
        let w = Tensor::new(vec![rows, cols], pseudo(rows * cols, 11));
        let x = inputs(tokens, cols, 21);
        let mut h = Hessian::zeros(cols);
        h.add_rows(&x);
        let f = inverse_factor(&h, "test").unwrap();
        let imp = h.moments();
        for (bits, group) in [
            (Bits::B4, 32),
            (Bits::B4, 64),
            (Bits::B4, 128),
            (Bits::B3, 64),
            (Bits::B5, 64),
            (Bits::B6, 64),
            (Bits::B8, 32),
        ] {
            let plain = LowBitWeights::quantize(&w, bits, group, Some(&imp), "test").unwrap();
            let g = gptq_lowbit(&w, &f, bits, group, Some(&imp), None, "test").unwrap();
            let (ep, eg) = (output_error(&w, &plain, &x), output_error(&w, &g, &x));
            assert!(eg < 0.8 * ep, "{bits:?} g{group}: gptq {eg} vs plain {ep}");
        }
    }

    #[test]
    fn dead_channels_and_bad_shapes() {
        let (rows, cols) = (16, 64);
        let w = Tensor::new(vec![rows, cols], pseudo(rows * cols, 5));
        let mut x = inputs(200, cols, 9);
        for t in 0..200 {
            x[t * cols + 7] = 0.0;
        }
        let mut h = Hessian::zeros(cols);
        h.add_rows(&x);
        let f = inverse_factor(&h, "test").unwrap();
        assert!(f.dead[7] && f.dead.iter().filter(|&&d| d).count() == 1);
        let q = gptq_lowbit(&w, &f, Bits::B4, 32, None, None, "test").unwrap();
        assert_eq!(q.rows(), rows);
        // A factor of another width is refused.
        let mut h2 = Hessian::zeros(32);
        h2.add_rows(&inputs(100, 32, 2));
        let f2 = inverse_factor(&h2, "test").unwrap();
        assert!(gptq_lowbit(&w, &f2, Bits::B4, 32, None, None, "test").is_err());
        assert!(inverse_factor(&Hessian::zeros(8), "test").is_ok());
    }

    #[test]
    fn deterministic_across_thread_counts() {
        let (rows, cols) = (40, 128);
        let w = Tensor::new(vec![rows, cols], pseudo(rows * cols, 8));
        let mut h = Hessian::zeros(cols);
        h.add_rows(&inputs(300, cols, 4));
        let f = inverse_factor(&h, "test").unwrap();
        let run = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| gptq_lowbit(&w, &f, Bits::B4, 64, None, None, "test").unwrap())
        };
        assert_eq!(run(1), run(3));
    }

    /// The act-order permutation keeps groups whole, puts the more active group first and
    /// the more active column first inside a group, and leaves a partial group last.
    #[test]
    fn act_order_keeps_groups_whole() {
        let mut m = vec![1f32; 70];
        m[40] = 50.0; // group 1 (32..64) is the most active
        m[5] = 9.0; // then group 0; inside it column 5 first
        m[66] = 99.0; // the partial group 64..70 stays last whatever its activity
        let order = act_order(&m, 32);
        assert_eq!(order.len(), 70);
        assert_eq!(&order[..2], &[40, 32]);
        assert!(order[..32].iter().all(|&c| (32..64).contains(&c)));
        assert_eq!(&order[32..34], &[5, 0]);
        assert_eq!(order[64], 66);
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, (0..70).collect::<Vec<_>>());
    }

    /// With the natural order passed explicitly GPTQ is bit-identical to no order; act-order
    /// also beats plain rounding on every grid; an order that splits a group is refused.
    #[test]
    fn gptq_with_act_order() {
        let (rows, cols, tokens) = (32, 256, 1024);
        let w = Tensor::new(vec![rows, cols], pseudo(rows * cols, 12));
        let x = inputs(tokens, cols, 22);
        let mut h = Hessian::zeros(cols);
        h.add_rows(&x);
        let imp = h.moments();
        let f = inverse_factor(&h, "test").unwrap();
        let natural: Vec<usize> = (0..cols).collect();
        assert_eq!(
            gptq_lowbit(&w, &f, Bits::B4, 32, Some(&imp), Some(&natural), "test").unwrap(),
            gptq_lowbit(&w, &f, Bits::B4, 32, Some(&imp), None, "test").unwrap()
        );
        for (bits, group) in [
            (Bits::B4, 32),
            (Bits::B4, 128),
            (Bits::B6, 64),
            (Bits::B8, 32),
        ] {
            let order = act_order(&imp, group);
            assert_ne!(order, natural);
            let fa = inverse_factor(&h.permuted(&order), "test").unwrap();
            let a = gptq_lowbit(&w, &fa, bits, group, Some(&imp), Some(&order), "test").unwrap();
            let plain = LowBitWeights::quantize(&w, bits, group, Some(&imp), "test").unwrap();
            let (ep, ea) = (output_error(&w, &plain, &x), output_error(&w, &a, &x));
            assert!(
                ea < 0.8 * ep,
                "{bits:?} g{group}: act-order {ea} vs plain {ep}"
            );
        }
        let mut split = natural.clone();
        split.swap(0, 40);
        assert!(gptq_lowbit(&w, &f, Bits::B4, 32, None, Some(&split), "test").is_err());
        assert!(gptq_lowbit(&w, &f, Bits::B4, 32, None, Some(&natural[1..]), "test").is_err());
    }

    /// Without coupling between channels (a diagonal Hessian) the order cannot matter: the
    /// act-order result, put back in the natural order, dequantizes to the natural one's.
    #[test]
    fn act_order_is_undone_exactly() {
        let (rows, cols) = (16, 128);
        let w = Tensor::new(vec![rows, cols], pseudo(rows * cols, 3));
        let mut h = Hessian::zeros(cols);
        for i in 0..cols {
            h.sums[i * cols + i] = 1.0 + (i % 7) as f64;
        }
        h.tokens = 1;
        let imp = h.moments();
        let order = act_order(&imp, 32);
        let f = inverse_factor(&h, "test").unwrap();
        let fa = inverse_factor(&h.permuted(&order), "test").unwrap();
        let n = gptq_lowbit(&w, &f, Bits::B4, 32, None, None, "test").unwrap();
        let a = gptq_lowbit(&w, &fa, Bits::B4, 32, None, Some(&order), "test").unwrap();
        let (mut rn, mut ra) = (vec![0f32; cols], vec![0f32; cols]);
        for r in 0..rows {
            n.dequantize_row(r, &mut rn);
            a.dequantize_row(r, &mut ra);
            for k in 0..cols {
                assert!(
                    (rn[k] - ra[k]).abs() <= 1e-6 * rn[k].abs().max(1e-3),
                    "row {r} col {k}"
                );
            }
        }
    }
}

//! Channel equalization: function-preserving per-channel rescaling of the weights before
//! they are rounded, chosen per layer to minimise an estimate of the output error.
//!
//! Real checkpoints have outlier channels: a few input channels of a linear carry activations
//! many times larger than the rest while their weight columns are small (or the reverse). A
//! 4-bit group of 32 columns then spends its range on the wrong columns, and the int8
//! activation blocks of 32 that the kernels use lose the small channels next to a large one.
//! Both are fixed without changing what the network computes by moving a per-channel factor
//! `α` across a pair whose product is unchanged:
//! - a norm and the linears it feeds (`attn_norm` → q/k/v, `ffn_norm` → gate/up, experts and
//!   MoE router included): `g_k ← g_k / α_k`, `W[:, k] ← W[:, k] · α_k`;
//! - a linear and the linear after it (`v` → `attn_output`, a grouped-query v channel feeding
//!   the o columns of every query head that reads it; `up` → `down`, since the SwiGLU product
//!   is linear in `up`): row `j` of the first (and its bias) `÷ α_j`, column `j` of the
//!   second `· α_j`.
//!
//! The candidates are the SmoothQuant/cross-layer-equalization family
//! `α = (a / c)^β` (normalised to geometric mean 1), with `a` the channel's activation scale
//! (or, for a linear pair, the first matrix's row range) and `c` the weight column range,
//! for `β ∈ {0, ¼, ½, ¾, 1}`; `β = 0` is the identity. Each candidate is scored by the error it
//! would cause at the unit's outputs: every tensor is rounded on the grid its format gives
//! it, mapped back, and the squared difference weighted by the input channel's second
//! moment `E[x_k²]` (and, for the first matrix of a pair, by how much the second one
//! amplifies that channel), plus the error of quantizing the (rescaled) activations to int8
//! blocks of 32 as the kernels do. The lowest wins, so a layer whose weights already sit on
//! a grid (error 0 at `β = 0`) is left alone.
//!
//! `E[x²]` comes from calibration ([`ActivationStats`] measured by the decoder on the user's
//! text) or, without calibration, from the weights themselves ([`ActivationStats::estimate`]):
//! a normalised input has unit second moment per channel before the norm weight, and the
//! second moments of `v`, `up` and `silu(gate)` follow from their rows for such an input.
//!
//! How much of this runs depends on the format ([`EqualizeOptions`]): `int8`, `int4` and
//! `int4:calib` score the weights' rounding error only, over `β ∈ {0, ¼, ½, ¾, 1}`.
//! `int8:calib`/`int8:gptq` ([`EqualizeOptions::INT8_CALIBRATED`]) have measured moments, so
//! they also score the activation blocks' error (the weights' sampled rounding error then
//! scaled up to whole matrices, the activation error's units) and equalize one more pair: the final norm → an untied `lm_head`
//! ([`apply_head`]; a tied head is also the embedding and is left alone), whose input
//! carries the residual stream's outlier channels straight into the logits.

use crate::error::Result;
use crate::format::quantized::{grid_for, Grid};
use crate::format::Precision;
use crate::format::{TensorPlace, TensorRole};
use crate::model::{FeedForward, LayerWeights, Mlp, ModelConfig, ModelWeights, Tensor};
use crate::quantize::rounding::{round_asymmetric, round_symmetric_int8};
use rayon::prelude::*;

/// A candidate factor `α_k ∝ a_k^ea / c_k^ec` as its exponents `(ea, ec)`; `(0, 0)` is the
/// identity.
pub type Exponents = (f32, f32);

/// The `(a / c)^β` family for `β ∈ {0, ¼, ½, ¾, 1}` (`int8`, `int4`, `int4:calib`).
pub const BETAS: [Exponents; 5] = [
    (0.0, 0.0),
    (0.25, 0.25),
    (0.5, 0.5),
    (0.75, 0.75),
    (1.0, 1.0),
];

/// Largest factor moved across a pair (either way).
const MAX_ALPHA: f32 = 256.0;

/// Rows of each matrix whose rounding error scores a candidate (an evenly spaced sample).
const SAMPLED_ROWS: usize = 128;

/// Values per int8 activation block in the quantized kernels.
const ACT_BLOCK: usize = 32;

/// Second moments `E[x²]` of the inputs of one layer's linears, per input channel.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerStats {
    /// After `attn_norm` (its weight applied): the input of q, k, v.
    pub attn_in: Vec<f32>,
    /// The attention output per query-head channel: the input of `attn_output`.
    pub o_in: Vec<f32>,
    /// After `ffn_norm`: the input of gate/up (and the router).
    pub ffn_in: Vec<f32>,
    /// `silu(gate x) · up x`, the input of `down`, per MLP: the dense MLP, or the experts in
    /// order followed by the shared expert.
    pub down_in: Vec<Vec<f32>>,
}

/// Per-channel second moments of every linear's input, measured or estimated.
#[derive(Debug, Clone, PartialEq)]
pub struct ActivationStats {
    pub layers: Vec<LayerStats>,
    /// After the final norm (its weight applied): the input of `lm_head`.
    pub head_in: Vec<f32>,
}

/// `E[silu(z)²]` for `z ~ N(0, var)`, by quadrature over ±6 standard deviations.
fn silu_second_moment(var: f32) -> f32 {
    if var <= 0.0 {
        return 0.0;
    }
    let s = var.sqrt();
    let (n, span) = (96, 6.0f32);
    let dt = 2.0 * span / n as f32;
    let mut acc = 0f32;
    for i in 0..=n {
        let t = -span + i as f32 * dt;
        let z = s * t;
        let silu = z / (1.0 + (-z).exp());
        let w = if i == 0 || i == n { 0.5 } else { 1.0 };
        acc += w * silu * silu * (-0.5 * t * t).exp();
    }
    acc * dt / (2.0 * std::f32::consts::PI).sqrt()
}

/// `Σ_k W[j,k]² v_k` for every row `j`: the output second moment for independent inputs.
fn row_moments(w: &Tensor, input: &[f32]) -> Vec<f32> {
    (0..w.rows())
        .into_par_iter()
        .map(|j| {
            w.row(j)
                .iter()
                .zip(input)
                .map(|(&x, &v)| x * x * v)
                .sum::<f32>()
        })
        .collect()
}

fn mlps(ffn: &FeedForward) -> Vec<&Mlp> {
    match ffn {
        FeedForward::Dense(m) => vec![m],
        FeedForward::Moe(m) => m.experts.iter().chain(m.shared_expert.iter()).collect(),
    }
}

fn mlps_mut(ffn: &mut FeedForward) -> Vec<&mut Mlp> {
    match ffn {
        FeedForward::Dense(m) => vec![m],
        FeedForward::Moe(m) => m
            .experts
            .iter_mut()
            .chain(m.shared_expert.iter_mut())
            .collect(),
    }
}

/// The v channel (`kv_head · head_dim + i`) that attention-output column `c` reads.
fn kv_channel(config: &ModelConfig, c: usize) -> usize {
    let hd = config.head_dim;
    let group = (config.n_heads / config.n_kv_heads.max(1)).max(1);
    (c / hd / group) * hd + c % hd
}

impl ActivationStats {
    /// Second moments estimated from the weights alone: each normalised input channel has
    /// unit second moment before the norm weight, channels independent (see the module doc).
    pub fn estimate(weights: &ModelWeights, config: &ModelConfig) -> ActivationStats {
        let layers = weights
            .layers
            .iter()
            .map(|l| estimate_layer(l, config))
            .collect();
        ActivationStats {
            layers,
            head_in: estimate_head(&weights.final_norm),
        }
    }
}

/// The estimated second moments of `lm_head`'s input: the final norm weight squared.
pub fn estimate_head(final_norm: &[f32]) -> Vec<f32> {
    final_norm.iter().map(|g| g * g).collect()
}

/// [`ActivationStats::estimate`] of one layer (each layer's estimate needs only its own
/// weights, so a streaming packer estimates layer by layer).
pub fn estimate_layer(l: &LayerWeights, config: &ModelConfig) -> LayerStats {
    let attn_in: Vec<f32> = l.attn_norm.iter().map(|g| g * g).collect();
    let mut v2 = row_moments(&l.v, &attn_in);
    if let Some(b) = &l.v_bias {
        v2.iter_mut().zip(b).for_each(|(v, b)| *v += b * b);
    }
    let o_in = (0..l.o.cols()).map(|c| v2[kv_channel(config, c)]).collect();
    let ffn_in: Vec<f32> = l.ffn_norm.iter().map(|g| g * g).collect();
    let down_in = mlps(&l.ffn)
        .into_iter()
        .map(|m| {
            let g2 = row_moments(&m.gate, &ffn_in);
            let u2 = row_moments(&m.up, &ffn_in);
            g2.iter()
                .zip(&u2)
                .map(|(&g, &u)| silu_second_moment(g) * u)
                .collect()
        })
        .collect();
    LayerStats {
        attn_in,
        o_in,
        ffn_in,
        down_in,
    }
}

/// The factors chosen for one layer; an empty vector is the identity.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LayerScales {
    /// Per model channel, moved from `attn_norm` into q/k/v.
    pub attn_in: Vec<f32>,
    /// Per v channel, moved from v's rows into `attn_output`'s columns.
    pub v_to_o: Vec<f32>,
    /// Per model channel, moved from `ffn_norm` into gate/up (router, experts included).
    pub ffn_in: Vec<f32>,
    /// Per MLP (as in [`LayerStats::down_in`]), per hidden channel, from `up` into `down`.
    pub up_to_down: Vec<Vec<f32>>,
}

/// Per linear input of one layer, the factor each channel is divided by once a layer's
/// factors are applied (`x' = x / α`, the weights' columns having been multiplied by `α`);
/// `None` where the input is unchanged.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InputFactors {
    pub attn_in: Option<Vec<f32>>,
    /// Per query channel of `attn_output`'s input (each reads its key/value group's v channel).
    pub o_in: Option<Vec<f32>>,
    pub ffn_in: Option<Vec<f32>>,
    /// Per MLP, as [`LayerStats::down_in`].
    pub down_in: Vec<Option<Vec<f32>>>,
}

impl LayerScales {
    /// What [`apply_layer`] does to the inputs of the layer's linears (see [`InputFactors`]).
    pub fn input_factors(&self, config: &ModelConfig) -> InputFactors {
        let some = |v: &Vec<f32>| (!v.is_empty()).then(|| v.clone());
        let o_cols = config.n_heads * config.head_dim;
        InputFactors {
            attn_in: some(&self.attn_in),
            o_in: (!self.v_to_o.is_empty()).then(|| {
                (0..o_cols)
                    .map(|c| self.v_to_o[kv_channel(config, c)])
                    .collect()
            }),
            ffn_in: some(&self.ffn_in),
            down_in: self.up_to_down.iter().map(some).collect(),
        }
    }
}

/// Factors for every layer, and the one moved from the final norm into an untied `lm_head`
/// (empty: identity, e.g. a tied head or a format that does not search it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChannelScales {
    pub layers: Vec<LayerScales>,
    pub head: Vec<f32>,
}

/// Per-input-column second moments of one layer's linears in the rescaled coordinates: the
/// rounding importance (empty when importance is off).
#[derive(Debug, Clone, Default)]
pub struct LayerImportance {
    pub attn_in: Vec<f32>,
    pub o_in: Vec<f32>,
    pub ffn_in: Vec<f32>,
    pub down_in: Vec<Vec<f32>>,
}

fn scale_cols(t: &mut Tensor, alpha: &[f32]) {
    let c = t.cols();
    for row in t.data.chunks_mut(c) {
        row.iter_mut().zip(alpha).for_each(|(w, a)| *w *= a);
    }
}

fn scale_rows_inv(t: &mut Tensor, alpha: &[f32]) {
    let c = t.cols();
    for (row, a) in t.data.chunks_mut(c).zip(alpha) {
        row.iter_mut().for_each(|w| *w /= a);
    }
}

fn div_vec(v: &mut [f32], alpha: &[f32]) {
    v.iter_mut().zip(alpha).for_each(|(x, a)| *x /= a);
}

/// Applies one layer's factors in place (the order the search chose them in).
pub fn apply_layer(l: &mut LayerWeights, config: &ModelConfig, s: &LayerScales) {
    if !s.attn_in.is_empty() {
        div_vec(&mut l.attn_norm, &s.attn_in);
        for t in [&mut l.q, &mut l.k, &mut l.v] {
            scale_cols(t, &s.attn_in);
        }
    }
    if !s.v_to_o.is_empty() {
        scale_rows_inv(&mut l.v, &s.v_to_o);
        if let Some(b) = &mut l.v_bias {
            div_vec(b, &s.v_to_o);
        }
        let per_col: Vec<f32> = (0..l.o.cols())
            .map(|c| s.v_to_o[kv_channel(config, c)])
            .collect();
        scale_cols(&mut l.o, &per_col);
    }
    if !s.ffn_in.is_empty() {
        div_vec(&mut l.ffn_norm, &s.ffn_in);
        if let FeedForward::Moe(m) = &mut l.ffn {
            scale_cols(&mut m.router, &s.ffn_in);
            if let Some(g) = &mut m.shared_expert_gate {
                scale_cols(g, &s.ffn_in);
            }
        }
        for m in mlps_mut(&mut l.ffn) {
            scale_cols(&mut m.gate, &s.ffn_in);
            scale_cols(&mut m.up, &s.ffn_in);
        }
    }
    for (m, a) in mlps_mut(&mut l.ffn).into_iter().zip(&s.up_to_down) {
        if !a.is_empty() {
            scale_rows_inv(&mut m.up, a);
            scale_cols(&mut m.down, a);
        }
    }
}

/// A matrix of a dense (non-MoE) layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DensePart {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

/// Applies a dense layer's factors to one of its matrices alone: the same operations in
/// the same order as [`apply_layer`] on the whole layer, so a streaming packer can load,
/// scale and pack one matrix at a time.
pub fn apply_to_part(t: &mut Tensor, part: DensePart, config: &ModelConfig, s: &LayerScales) {
    let up_down = s.up_to_down.first().filter(|a| !a.is_empty());
    match part {
        DensePart::Q | DensePart::K | DensePart::V => {
            if !s.attn_in.is_empty() {
                scale_cols(t, &s.attn_in);
            }
            if part == DensePart::V && !s.v_to_o.is_empty() {
                scale_rows_inv(t, &s.v_to_o);
            }
        }
        DensePart::O => {
            if !s.v_to_o.is_empty() {
                let per_col: Vec<f32> = (0..t.cols())
                    .map(|c| s.v_to_o[kv_channel(config, c)])
                    .collect();
                scale_cols(t, &per_col);
            }
        }
        DensePart::Gate | DensePart::Up => {
            if !s.ffn_in.is_empty() {
                scale_cols(t, &s.ffn_in);
            }
            if let (DensePart::Up, Some(a)) = (part, up_down) {
                scale_rows_inv(t, a);
            }
        }
        DensePart::Down => {
            if let Some(a) = up_down {
                scale_cols(t, a);
            }
        }
    }
}

/// `weights` with `scales` applied (the same function, other weights).
pub fn apply(weights: &ModelWeights, config: &ModelConfig, scales: &ChannelScales) -> ModelWeights {
    let mut out = weights.clone();
    out.layers
        .par_iter_mut()
        .zip(&scales.layers)
        .for_each(|(l, s)| apply_layer(l, config, s));
    apply_head(&mut out, &scales.head);
    out
}

/// Moves `alpha` from the final norm into the columns of an untied `lm_head` (a tied one
/// is also the embedding, whose rows are residual vectors: it is left alone).
pub fn apply_head(w: &mut ModelWeights, alpha: &[f32]) {
    if alpha.is_empty() {
        return;
    }
    if let Some(h) = &mut w.lm_head {
        div_vec(&mut w.final_norm, alpha);
        scale_cols(h, alpha);
    }
}

/// Rounds `x` onto `grid` in place (codes mapped back to values), group by group.
fn fake_quant_row(x: &mut [f32], grid: Grid, imp: Option<&[f32]>) {
    let group = match grid {
        Grid::Asym { group, .. } => group,
        Grid::Sym8 => ACT_BLOCK,
    };
    let mut codes = vec![0u8; group];
    let mut scodes = vec![0i8; group];
    for (g, chunk) in x.chunks_mut(group).enumerate() {
        let imp = imp.map(|w| &w[g * group..g * group + chunk.len()]);
        match grid {
            Grid::Asym { bits, .. } => {
                let q = &mut codes[..chunk.len()];
                let (d, m) = round_asymmetric(chunk, bits, imp, q);
                let (d, m) = (d.to_f32(), m.to_f32());
                chunk
                    .iter_mut()
                    .zip(q.iter())
                    .for_each(|(v, &c)| *v = c as f32 * d + m);
            }
            Grid::Sym8 => {
                let q = &mut scodes[..chunk.len()];
                let d = round_symmetric_int8(chunk, imp, q).to_f32();
                chunk
                    .iter_mut()
                    .zip(q.iter())
                    .for_each(|(v, &c)| *v = c as f32 * d);
            }
        }
    }
}

/// One tensor of a unit being scored: the weight in the current coordinates, how it would
/// be rescaled, its grid, and how its errors are weighted.
struct Scored<'a> {
    w: &'a Tensor,
    grid: Grid,
    /// Rows divided by these (the first matrix of a pair).
    row_div: Option<&'a [f32]>,
    /// Columns multiplied by these.
    col_mul: Option<&'a [f32]>,
    /// Weight of each row's error (how much the next matrix amplifies it).
    row_weight: Option<&'a [f32]>,
    /// `E[x_k²]` in the current coordinates.
    col_moment: &'a [f32],
    /// Rounding importance per column in the rescaled coordinates (`None`: plain error).
    importance: Option<&'a [f32]>,
    /// Scale the sampled rows' error up to the whole matrix (needed when it is added to an
    /// error summed over all rows, such as [`activation_error`]).
    whole_rows: bool,
}

/// The weighted squared error of rounding one rescaled tensor, in current coordinates.
fn rounding_error(s: &Scored) -> f64 {
    let cols = s.w.cols();
    // Rows are rounded independently, so a fixed sample of them (the same for every
    // candidate) ranks candidates as the whole matrix does, at a fraction of the cost.
    let stride = s.w.rows().div_ceil(SAMPLED_ROWS).max(1);
    let scale = if s.whole_rows {
        s.w.rows() as f64 / s.w.rows().div_ceil(stride).max(1) as f64
    } else {
        1.0
    };
    let sampled: f64 = (0..s.w.rows())
        .into_par_iter()
        .filter(|i| i % stride == 0)
        .map_init(
            || vec![0f32; cols],
            |buf, i| {
                let r = s.row_div.map_or(1.0, |d| d[i]);
                let row = s.w.row(i);
                for k in 0..cols {
                    buf[k] = row[k] / r * s.col_mul.map_or(1.0, |m| m[k]);
                }
                fake_quant_row(buf, s.grid, s.importance);
                let mut e = 0f64;
                for k in 0..cols {
                    let back = buf[k] * r / s.col_mul.map_or(1.0, |m| m[k]);
                    let d = (back - row[k]) as f64;
                    e += d * d * s.col_moment[k] as f64;
                }
                e * s.row_weight.map_or(1.0, |w| w[i] as f64)
            },
        )
        .sum();
    sampled * scale
}

/// `(Σ_ik m_k ΔW_ik², Σ_ik m_k W_ik²)` ratio for rounding `w` onto `grid` (sampled rows):
/// the tensor's relative output noise for inputs with second moments `moment`.
pub fn relative_error(w: &Tensor, grid: Grid, moment: &[f32], importance: Option<&[f32]>) -> f64 {
    let err = rounding_error(&Scored {
        w,
        grid,
        row_div: None,
        col_mul: None,
        row_weight: None,
        col_moment: moment,
        importance,
        whole_rows: false,
    });
    let stride = w.rows().div_ceil(SAMPLED_ROWS).max(1);
    let signal: f64 = (0..w.rows())
        .step_by(stride)
        .map(|i| {
            w.row(i)
                .iter()
                .zip(moment)
                .map(|(&x, &m)| (x * x * m) as f64)
                .sum::<f64>()
        })
        .sum();
    if signal > 0.0 {
        err / signal
    } else {
        0.0
    }
}

/// Output error of quantizing the inputs of matrices with squared column norms `col_norm2`
/// (current coordinates) to int8 blocks after dividing channel `k` by `alpha[k]`.
fn activation_error(col_norm2: &[f32], moment: &[f32], alpha: &[f32]) -> f64 {
    let mut e = 0f64;
    for (b, n2) in col_norm2.chunks(ACT_BLOCK).enumerate() {
        let k0 = b * ACT_BLOCK;
        let amax = (k0..k0 + n2.len())
            .map(|k| moment[k].max(0.0).sqrt() / alpha[k])
            .fold(0f32, f32::max)
            * 3.0;
        let step2 = (amax / 127.0).powi(2) as f64 / 12.0;
        for (i, &n) in n2.iter().enumerate() {
            let a = alpha[k0 + i] as f64;
            e += n as f64 * a * a * step2;
        }
    }
    e
}

fn col_norm2(w: &Tensor) -> Vec<f32> {
    let mut n = vec![0f32; w.cols()];
    for row in w.data.chunks(w.cols()) {
        n.iter_mut().zip(row).for_each(|(a, &x)| *a += x * x);
    }
    n
}

fn add_into(acc: &mut [f32], v: &[f32]) {
    acc.iter_mut().zip(v).for_each(|(a, b)| *a += b);
}

/// `num_k^ea / den_k^ec`, normalised to geometric mean 1 and clamped; channels where either
/// is zero or not finite get 1.
fn candidate(num: &[f32], den: &[f32], (ea, ec): Exponents) -> Vec<f32> {
    if ea == 0.0 && ec == 0.0 {
        return vec![1.0; num.len()];
    }
    let logs: Vec<Option<f32>> = num
        .iter()
        .zip(den)
        .map(|(&n, &d)| {
            let r = ea * n.ln() - ec * d.ln();
            (n > 0.0 && d > 0.0 && n.is_finite() && d.is_finite() && r.is_finite()).then_some(r)
        })
        .collect();
    let valid: Vec<f32> = logs.iter().flatten().copied().collect();
    if valid.is_empty() {
        return vec![1.0; num.len()];
    }
    let mean = valid.iter().sum::<f32>() / valid.len() as f32;
    let lim = MAX_ALPHA.ln();
    logs.iter()
        .map(|l| l.map_or(1.0, |l| (l - mean).clamp(-lim, lim).exp()))
        .collect()
}

fn col_absmax(ts: &[&Tensor]) -> Vec<f32> {
    let mut m = vec![0f32; ts[0].cols()];
    for t in ts {
        for row in t.data.chunks(t.cols()) {
            m.iter_mut()
                .zip(row)
                .for_each(|(a, &x)| *a = a.max(x.abs()));
        }
    }
    m
}

fn row_absmax(t: &Tensor) -> Vec<f32> {
    t.data
        .chunks(t.cols())
        .map(|r| r.iter().fold(0f32, |a, &x| a.max(x.abs())))
        .collect()
}

fn importance_of(moment: &[f32], alpha: &[f32], use_it: bool) -> Option<Vec<f32>> {
    use_it.then(|| moment.iter().zip(alpha).map(|(m, a)| m / (a * a)).collect())
}

/// How the search is run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EqualizeOptions {
    /// Search the factors (otherwise they are the identity and only importance is derived).
    pub rescale: bool,
    /// Round with per-column importance `E[x²]` instead of plain squared error.
    pub importance: bool,
    /// Count the error of the kernels' int8 activation blocks in the score (the weights'
    /// sampled rounding error is then scaled up to whole matrices, the units the activation
    /// error is in).
    pub activation_error: bool,
    /// The candidate factors tried per unit.
    pub candidates: &'static [Exponents],
    /// Equalize the final norm → untied `lm_head` unit too.
    pub head: bool,
}

impl EqualizeOptions {
    /// Without calibration the second moments are estimates: the norm weight stands for the
    /// activation scale, which misses the residual stream's own outlier channels, so only
    /// the weight-side rounding error is trusted (scoring the activation blocks too made
    /// SmolLM2-135M's int8 worse, KLD 0.0037 → 0.0051).
    pub const ESTIMATED: EqualizeOptions = EqualizeOptions {
        rescale: true,
        importance: true,
        activation_error: false,
        candidates: &BETAS,
        head: false,
    };
    /// With measured second moments (calibration) rounding is weighted by them too
    /// (`int4:calib`, `int4:gptq`).
    pub const CALIBRATED: EqualizeOptions = EqualizeOptions {
        rescale: true,
        importance: true,
        activation_error: false,
        candidates: &BETAS,
        head: false,
    };
    /// `int8:calib`, `int8:gptq`: at 8 bits the weights' rounding error is small and the
    /// kernels' int8 activation blocks of 32 are what outlier channels hurt (a channel
    /// 10x the others sets the block's scale, and the other 31 keep about 3.3 bits fewer).
    /// With measured second moments that error is scored too, and the final norm → untied
    /// `lm_head` unit is searched as well (its input carries the residual stream's
    /// outliers, and its error goes straight into the logits).
    ///
    /// Measured on SmolLM2-135M (rot-outlier copy, 10 chunks; KLD vs float32): int8 0.00694;
    /// this 0.00314; without the `lm_head` unit 0.00673; without the activation error
    /// 0.00324. A finer candidate set (`(a/c)^β` in steps of ⅛ plus SmoothQuant's
    /// `a^β / c^(1-β)` for β ∈ {⅝, ¾, ⅞, 1}) was worse on KLD on both the outlier copy
    /// (0.00362; 20 chunks 0.00406 vs 0.00351) and the original (10 chunks 0.00273 vs
    /// 0.00253), so the candidates are [`BETAS`].
    pub const INT8_CALIBRATED: EqualizeOptions = EqualizeOptions {
        rescale: true,
        importance: true,
        activation_error: true,
        candidates: &BETAS,
        head: true,
    };
}

/// Picks the factor among `opts.candidates` with the lowest error for a norm → linears unit.
fn search_norm_unit(
    tensors: &[(&Tensor, Grid)],
    moment: &[f32],
    opts: EqualizeOptions,
) -> Vec<f32> {
    let ones = vec![1f32; moment.len()];
    if !opts.rescale || tensors.is_empty() {
        return ones;
    }
    let act: Vec<f32> = moment.iter().map(|m| m.max(0.0).sqrt()).collect();
    let ws: Vec<&Tensor> = tensors.iter().map(|(t, _)| *t).collect();
    let cmax = col_absmax(&ws);
    let mut n2 = vec![0f32; moment.len()];
    for t in &ws {
        add_into(&mut n2, &col_norm2(t));
    }
    let mut best = (f64::INFINITY, ones);
    for &beta in opts.candidates {
        let alpha = candidate(&act, &cmax, beta);
        let imp = importance_of(moment, &alpha, opts.importance);
        let mut e = if opts.activation_error {
            activation_error(&n2, moment, &alpha)
        } else {
            0.0
        };
        for &(w, grid) in tensors {
            e += rounding_error(&Scored {
                w,
                grid,
                row_div: None,
                col_mul: Some(&alpha),
                row_weight: None,
                col_moment: moment,
                importance: imp.as_deref(),
                whole_rows: opts.activation_error,
            });
        }
        if e < best.0 {
            best = (e, alpha);
        }
    }
    best.1
}

/// Picks the factor for a linear pair `first` (rows ÷ α) → `second` (columns · α, column
/// `c` using `alpha[map(c)]`).
#[allow(clippy::too_many_arguments)]
fn search_pair(
    first: (&Tensor, Grid),
    first_in_moment: &[f32],
    second: (&Tensor, Grid),
    second_in_moment: &[f32],
    map: &dyn Fn(usize) -> usize,
    row_gain: Option<&[f32]>,
    opts: EqualizeOptions,
) -> Vec<f32> {
    let n = first.0.rows();
    let ones = vec![1f32; n];
    if !opts.rescale {
        return ones;
    }
    let cols2 = second.0.cols();
    let expand = |a: &[f32]| -> Vec<f32> { (0..cols2).map(|c| a[map(c)]).collect() };
    // How much the second matrix amplifies an error in each output of the first.
    let n2 = col_norm2(second.0);
    let mut amp = vec![0f32; n];
    let mut c2max = vec![0f32; n];
    let cm = col_absmax(&[second.0]);
    for c in 0..cols2 {
        amp[map(c)] += n2[c];
        c2max[map(c)] = c2max[map(c)].max(cm[c]);
    }
    if let Some(g) = row_gain {
        amp.iter_mut().zip(g).for_each(|(a, g)| *a *= g);
    }
    let r1 = row_absmax(first.0);
    let first_imp = importance_of(
        first_in_moment,
        &vec![1.0; first_in_moment.len()],
        opts.importance,
    );
    let mut best = (f64::INFINITY, ones);
    for &beta in opts.candidates {
        let alpha = candidate(&r1, &c2max, beta);
        let alpha2 = expand(&alpha);
        let imp2 = importance_of(second_in_moment, &alpha2, opts.importance);
        let mut e = if opts.activation_error {
            activation_error(&n2, second_in_moment, &alpha2)
        } else {
            0.0
        };
        e += rounding_error(&Scored {
            w: first.0,
            grid: first.1,
            row_div: Some(&alpha),
            col_mul: None,
            row_weight: Some(&amp),
            col_moment: first_in_moment,
            importance: first_imp.as_deref(),
            whole_rows: opts.activation_error,
        });
        e += rounding_error(&Scored {
            w: second.0,
            grid: second.1,
            row_div: None,
            col_mul: Some(&alpha2),
            row_weight: None,
            col_moment: second_in_moment,
            importance: imp2.as_deref(),
            whole_rows: opts.activation_error,
        });
        if e < best.0 {
            best = (e, alpha);
        }
    }
    best.1
}

fn is_identity(a: &[f32]) -> bool {
    a.iter().all(|&x| x == 1.0)
}

fn keep(a: Vec<f32>) -> Vec<f32> {
    if is_identity(&a) {
        Vec::new()
    } else {
        a
    }
}

/// Searches one layer's factors in order (attention input, v → o, feed-forward input,
/// up → down), applying each before the next is searched, and returns the factors and the
/// rounding importance in the final coordinates.
/// Equalizes one layer in place (what [`equalize`] does per layer): the factors chosen and
/// the rounding importance.
pub fn equalize_layer(
    l: &mut LayerWeights,
    config: &ModelConfig,
    stats: &LayerStats,
    grid: &dyn Fn(TensorRole) -> Result<Option<Grid>>,
    opts: EqualizeOptions,
) -> Result<(LayerScales, LayerImportance)> {
    let need = |role| -> Result<Grid> {
        grid(role)?.ok_or_else(|| {
            crate::error::KwkError::InvalidArgument(format!("{role:?} has no quantized grid"))
        })
    };
    let mut scales = LayerScales::default();
    let mut attn_in = stats.attn_in.clone();
    let a = search_norm_unit(
        &[
            (&l.q, need(TensorRole::AttnQ)?),
            (&l.k, need(TensorRole::AttnK)?),
            (&l.v, need(TensorRole::AttnV)?),
        ],
        &attn_in,
        opts,
    );
    attn_in.iter_mut().zip(&a).for_each(|(m, a)| *m /= a * a);
    scales.attn_in = keep(a);
    apply_layer(
        l,
        config,
        &LayerScales {
            attn_in: scales.attn_in.clone(),
            ..Default::default()
        },
    );

    let map = |c: usize| kv_channel(config, c);
    let a = search_pair(
        (&l.v, need(TensorRole::AttnV)?),
        &attn_in,
        (&l.o, need(TensorRole::AttnOutput)?),
        &stats.o_in,
        &map,
        None,
        opts,
    );
    let mut o_in = stats.o_in.clone();
    for (c, m) in o_in.iter_mut().enumerate() {
        *m /= a[map(c)] * a[map(c)];
    }
    scales.v_to_o = keep(a);
    apply_layer(
        l,
        config,
        &LayerScales {
            v_to_o: scales.v_to_o.clone(),
            ..Default::default()
        },
    );

    let mut ffn_in = stats.ffn_in.clone();
    let (gate_g, up_g, down_g) = (
        need(TensorRole::FfnGate)?,
        need(TensorRole::FfnUp)?,
        need(TensorRole::FfnDown)?,
    );
    let a = {
        let ms = mlps(&l.ffn);
        let tensors: Vec<(&Tensor, Grid)> = ms
            .iter()
            .flat_map(|m| [(&m.gate, gate_g), (&m.up, up_g)])
            .collect();
        search_norm_unit(&tensors, &ffn_in, opts)
    };
    ffn_in.iter_mut().zip(&a).for_each(|(m, a)| *m /= a * a);
    scales.ffn_in = keep(a);
    apply_layer(
        l,
        config,
        &LayerScales {
            ffn_in: scales.ffn_in.clone(),
            ..Default::default()
        },
    );

    let mut down_in = Vec::new();
    let mut up_to_down = Vec::new();
    for (m, moment) in mlps(&l.ffn).into_iter().zip(&stats.down_in) {
        // An error in `up x` reaches `down` multiplied by `silu(gate x)`.
        let u2 = row_moments(&m.up, &ffn_in);
        let gain: Vec<f32> = moment
            .iter()
            .zip(&u2)
            .map(|(&h, &u)| if u > 0.0 { h / u } else { 0.0 })
            .collect();
        let a = search_pair(
            (&m.up, up_g),
            &ffn_in,
            (&m.down, down_g),
            moment,
            &|c| c,
            Some(&gain),
            opts,
        );
        down_in.push(moment.iter().zip(&a).map(|(m, a)| m / (a * a)).collect());
        up_to_down.push(keep(a));
    }
    scales.up_to_down = up_to_down;
    apply_layer(
        l,
        config,
        &LayerScales {
            up_to_down: scales.up_to_down.clone(),
            ..Default::default()
        },
    );
    Ok((
        scales,
        LayerImportance {
            attn_in,
            o_in,
            ffn_in,
            down_in,
        },
    ))
}

/// The equalized weights, the factors chosen and the rounding importance per layer.
pub struct Equalized {
    pub weights: ModelWeights,
    pub scales: ChannelScales,
    pub importance: Vec<LayerImportance>,
    /// Rounding importance of `lm_head`'s columns when the head unit was searched
    /// ([`EqualizeOptions::head`] with importance on; empty otherwise).
    pub head_importance: Vec<f32>,
}

/// Equalizes every layer of `weights` for `precision` (see the module doc); `place` gives
/// each tensor's place for the mix rule.
pub fn equalize(
    weights: &ModelWeights,
    config: &ModelConfig,
    precision: &Precision,
    stats: &ActivationStats,
    place: &(dyn Fn(TensorRole, Option<usize>) -> TensorPlace + Sync),
    opts: EqualizeOptions,
) -> Result<Equalized> {
    let mut out = weights.clone();
    let results: Vec<Result<(LayerScales, LayerImportance)>> = out
        .layers
        .iter_mut()
        .zip(&stats.layers)
        .enumerate()
        .map(|(i, (l, s))| {
            let grid = |role| grid_for(precision, &place(role, Some(i)));
            equalize_layer(l, config, s, &grid, opts)
        })
        .collect();
    let mut scales = ChannelScales::default();
    let mut importance = Vec::new();
    for r in results {
        let (s, mut imp) = r?;
        if !opts.importance {
            imp = LayerImportance::default();
        }
        scales.layers.push(s);
        importance.push(imp);
    }
    let mut head_importance = Vec::new();
    if let (true, Some(head)) = (opts.head, &out.lm_head) {
        let grid = grid_for(precision, &place(TensorRole::LmHead, None))?.ok_or_else(|| {
            crate::error::KwkError::InvalidArgument("LmHead has no quantized grid".into())
        })?;
        let moment = if stats.head_in.len() == head.cols() {
            stats.head_in.clone()
        } else {
            estimate_head(&out.final_norm)
        };
        let alpha = search_norm_unit(&[(head, grid)], &moment, opts);
        if opts.importance {
            head_importance = moment
                .iter()
                .zip(&alpha)
                .map(|(m, a)| m / (a * a))
                .collect();
        }
        scales.head = keep(alpha);
        apply_head(&mut out, &scales.head);
    }
    Ok(Equalized {
        weights: out,
        scales,
        importance,
        head_importance,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    const G4: Grid = Grid::Asym { bits: 4, group: 32 };

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
    /// absmax scale, as the kernels do (`kernels::int8_matmul`'s `Q8Rows`).
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
        let grid = Grid::Asym { bits: 8, group: 64 };
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
    fn silu_second_moment_limits() {
        // Small inputs: silu(z) ≈ z/2, so E ≈ var/4; large: ≈ relu, so E ≈ var/2.
        let small = silu_second_moment(1e-4);
        assert!((small / 1e-4 - 0.25).abs() < 0.01, "{small}");
        let big = silu_second_moment(1e4);
        assert!((big / 1e4 - 0.5).abs() < 0.01, "{big}");
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
}

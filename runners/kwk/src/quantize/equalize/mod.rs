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
//! second moments of `v`, `up` and `silu(gate)` (Gemma 3: `gelu(gate)`) follow from their
//! rows for such an input.
//!
//! How much of this runs depends on the format ([`EqualizeOptions`]): `int8`, `int4` and
//! `int4:calib` score the weights' rounding error only, over `β ∈ {0, ¼, ½, ¾, 1}`.
//! `int8:calib`/`int8:gptq` ([`EqualizeOptions::INT8_CALIBRATED`]) have measured moments, so
//! they also score the activation blocks' error (the weights' sampled rounding error then
//! scaled up to whole matrices, the activation error's units) and equalize one more pair: the final norm → an untied `lm_head`
//! ([`apply_head`]; a tied head is also the embedding and is left alone), whose input
//! carries the residual stream's outlier channels straight into the logits.

use crate::error::Result;
use crate::format::quantized::{copy_grid_in, grid_for, Grid};
use crate::format::source_grid::source_homes;
use crate::format::Precision;
use crate::format::{TensorPlace, TensorRole};
use crate::kernels::quant::layout::{n_supers, SUPER_GROUPS};
use crate::model::{FeedForward, LayerWeights, Mlp, ModelConfig, ModelWeights, Tensor};
use crate::quantize::rounding::{round_row_two_level, round_symmetric_int8};
use half::f16;
use rayon::prelude::*;

mod scales;

pub use scales::{
    apply, apply_head, apply_layer, apply_to_part, ChannelScales, DensePart, InputFactors,
    LayerImportance, LayerScales,
};

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

/// `E[act(z)²]` for `z ~ N(0, var)` and the gate's activation (`silu`, or Gemma 3's tanh
/// GELU when `gelu`), by quadrature over ±6 standard deviations.
fn gate_second_moment(var: f32, gelu: bool) -> f32 {
    if var <= 0.0 {
        return 0.0;
    }
    let act = |z: f32| {
        if gelu {
            let c = (2.0 / std::f32::consts::PI).sqrt();
            0.5 * z * (1.0 + (c * (z + 0.044715 * z * z * z)).tanh())
        } else {
            z / (1.0 + (-z).exp())
        }
    };
    let s = var.sqrt();
    let (n, span) = (96, 6.0f32);
    let dt = 2.0 * span / n as f32;
    let mut acc = 0f32;
    for i in 0..=n {
        let t = -span + i as f32 * dt;
        let z = s * t;
        let a = act(z);
        let w = if i == 0 || i == n { 0.5 } else { 1.0 };
        acc += w * a * a * (-0.5 * t * t).exp();
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
    let gelu = config.gemma3.is_some();
    let down_in = mlps(&l.ffn)
        .into_iter()
        .map(|m| {
            let g2 = row_moments(&m.gate, &ffn_in);
            let u2 = row_moments(&m.up, &ffn_in);
            g2.iter()
                .zip(&u2)
                .map(|(&g, &u)| gate_second_moment(g, gelu) * u)
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

/// Rounds `x` onto `grid` in place (codes mapped back to values), as the packed format
/// rounds it (low-bit rows on their two-level scales).
fn fake_quant_row(x: &mut [f32], grid: Grid, imp: Option<&[f32]>) {
    if let Grid::Asym { bits, group } = grid {
        let ncg = x.len().div_ceil(group);
        let ns = n_supers(ncg);
        let mut q = vec![0u8; x.len()];
        let (mut sc, mut mc) = (vec![0u8; ncg], vec![0i8; ncg]);
        let (mut sd, mut sm) = (vec![f16::ZERO; ns], vec![f16::ZERO; ns]);
        round_row_two_level(
            x,
            bits,
            group,
            imp,
            &mut q,
            &mut sc,
            &mut mc,
            (&mut sd, &mut sm),
        );
        for (c, (v, &code)) in x.iter_mut().zip(&q).enumerate() {
            let (cg, s) = (c / group, c / group / SUPER_GROUPS);
            let d = sd[s].to_f32() * sc[cg] as f32;
            let m = sm[s].to_f32() * mc[cg] as f32;
            *v = code as f32 * d + m;
        }
        return;
    }
    // Sym8: symmetric int8 blocks.
    let mut q = [0i8; ACT_BLOCK];
    for (g, chunk) in x.chunks_mut(ACT_BLOCK).enumerate() {
        let imp = imp.map(|w| &w[g * ACT_BLOCK..g * ACT_BLOCK + chunk.len()]);
        let q = &mut q[..chunk.len()];
        let d = round_symmetric_int8(chunk, imp, q).to_f32();
        chunk
            .iter_mut()
            .zip(q.iter())
            .for_each(|(v, &c)| *v = c as f32 * d);
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
    /// The options of an uncalibrated `precision`: [`Self::ESTIMATED`], except that plain
    /// `int6` keeps its channels unscaled (importance-weighted rounding only). At 6 bits the
    /// rounding error the estimated moments score is small enough that their misjudged
    /// outlier channels decide the factors: on held-out text (10 chunks of
    /// `wiki-test-tail-120k.txt`, not the scored wiki.test chunks) the search cost int6
    /// +0.22 and +0.42 points of ΔPPL on the `rot` and widened off-grid copies (PPL 24.0858
    /// against 24.0336 unscaled; 24.1845 against 24.0870). `int5` lost without it on both
    /// (25.0676 → 25.1152, 24.3211 → 24.5584), and `int3`/`int4` split, so they keep it.
    pub fn estimated_for(precision: &Precision) -> EqualizeOptions {
        match precision {
            Precision::LowBit(o) if o.bits == crate::kernels::quant::Bits::B6 => EqualizeOptions {
                rescale: false,
                ..Self::ESTIMATED
            },
            _ => Self::ESTIMATED,
        }
    }
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

/// Whether a tensor of a unit will be copied from its GGUF source's blocks
/// (`format::source_grid`) or may be near copied (`format::near_copy`: the mix's ladder
/// offers that grid to every unit whose source has one, whatever the slot): the unit then
/// keeps its channels unscaled, since scaling would move that tensor off the source's grid,
/// and no rounding it could buy beats an exact copy.
fn keeps_source(tensors: &[(&Tensor, Grid)]) -> bool {
    tensors.iter().any(|&(t, g)| {
        let homes = source_homes(t);
        homes.near.is_some() || copy_grid_in(homes, g).is_some()
    })
}

/// Picks the factor among `opts.candidates` with the lowest error for a norm → linears unit.
fn search_norm_unit(
    tensors: &[(&Tensor, Grid)],
    moment: &[f32],
    opts: EqualizeOptions,
) -> Vec<f32> {
    let ones = vec![1f32; moment.len()];
    if !opts.rescale || tensors.is_empty() || keeps_source(tensors) {
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
    if !opts.rescale || keeps_source(&[first, second]) {
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
mod tests;

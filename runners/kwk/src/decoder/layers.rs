//! The blocks of one transformer layer on packed weights: the attention block around
//! `attention` (projections, q/k norms, RoPE, the KV cache, the output projection and
//! Gemma 3's post norms), the SwiGLU (or Gemma 3's GeGLU) MLP, the mixture-of-experts
//! feed-forward, and the row-parallel helpers (RMSNorm, activation preparation,
//! multi-matmul hand-offs) they share.

use crate::format::{InputKind, PackedLinear, PreparedInput};
use crate::kernels::quant::{Bf16Tiles, InputMemo};
use crate::kernels::{self, OutputMatrix, PANEL_ROWS};
use crate::model::ModelConfig;
use crate::quantize::gptq::Hessian;
use crate::threads::{split_range, ThreadPool};
use half::slice::HalfBitsSliceExt;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::kv_cache::KvCache;
use super::rope::Rope;
use crate::pack::calibrate::{DownRecord, LayerRecord};
use crate::pack::model::{Layer, PackedFfn, PackedMlp, PackedMoe};

/// What every layer's forward pass reads besides its weights: the model's shape, the
/// thread pool, RoPE's tables (the layer's own: Gemma 3's local layers have theirs).
pub(super) struct Runtime<'a> {
    pub cfg: &'a ModelConfig,
    pub pool: &'a ThreadPool,
    pub rope: &'a Rope,
    /// Gemma 3's parts of this layer; `None` for the Llama family.
    pub gemma: Option<GemmaLayer>,
}

/// What a Gemma 3 layer's runtime adds (its post norms are in the packed [`Layer`]): the
/// sliding window of a local layer (`None`: global).
pub(super) struct GemmaLayer {
    pub window: Option<usize>,
}

/// The buffers a feed-forward block reuses (prepared activations, gate and up outputs),
/// and its gate's activation.
struct FfnBufs<'a> {
    acts: &'a mut Activations,
    g: &'a mut Vec<f32>,
    u: &'a mut Vec<f32>,
    /// GeGLU with tanh GELU (Gemma 3) instead of SwiGLU.
    gelu: bool,
}

impl Layer {
    /// Runs the layer on the `n` rows of `x` (`[n][d]`, updated in place), tokens at
    /// positions `pos0..pos0+n`, storing their keys and values in the cache.
    pub(super) fn forward(
        &self,
        rt: &Runtime<'_>,
        kv: &mut KvCache,
        layer: usize,
        pos0: usize,
        x: &mut [f32],
        scratch: &mut Scratch,
    ) {
        let (cfg, pool, rope) = (rt.cfg, rt.pool, rt.rope);
        let post = self.post_norms.as_ref();
        let d = cfg.hidden_size;
        let n = x.len() / d;
        let hd = cfg.head_dim;
        let (qd, kvd) = (cfg.n_heads * hd, cfg.n_kv_heads * hd);
        let eps = cfg.rms_norm_eps;
        let Scratch {
            xn,
            q: qo,
            k: ko,
            v: vo,
            attn,
            o: oo,
            ffn_out,
            g,
            u,
            acts,
            record,
            head_record: _,
        } = scratch;
        let mut rec = record.as_mut().map(|r| &mut r[layer]);

        // Attention.
        let xn = sized(xn, n * d);
        add_norm_rows(pool, x, None, xn, &self.attn_norm, eps);
        if let Some(r) = rec.as_deref_mut() {
            r.tokens += n as u64;
            accumulate_squares(&mut r.attn_in, xn, d);
            if let Some(h) = r.gram.as_mut() {
                accumulate_gram(pool, &mut h.attn_in, xn, d);
            }
        }
        let (q, k, v) = (self.q.as_ref(), self.k.as_ref(), self.v.as_ref());
        acts.prepare(
            pool,
            xn,
            d,
            [q.input_kind(n), k.input_kind(n), v.input_kind(n)],
        );
        let qo = sized(qo, n * qd);
        let ko = sized(ko, n * kvd);
        let vo = sized(vo, n * kvd);
        {
            let yq = OutputMatrix::new(qo, n, qd);
            let yk = OutputMatrix::new(ko, n, kvd);
            let yv = OutputMatrix::new(vo, n, kvd);
            matmuls(
                pool,
                &[
                    (q, acts.get(xn, q.input_kind(n)), &yq),
                    (k, acts.get(xn, k.input_kind(n)), &yk),
                    (v, acts.get(xn, v.input_kind(n)), &yv),
                ],
            );
        }
        par_rows(pool, qo, qd, |t, row| {
            finish_projection(row, self.q_bias.as_deref(), self.q_norm.as_deref(), hd, eps);
            rope.apply(row, pos0 + t);
        });
        par_rows(pool, ko, kvd, |t, row| {
            finish_projection(row, self.k_bias.as_deref(), self.k_norm.as_deref(), hd, eps);
            rope.apply(row, pos0 + t);
        });
        if let Some(b) = &self.v_bias {
            for row in vo.chunks_exact_mut(kvd) {
                row.iter_mut().zip(b).for_each(|(a, b)| *a += b);
            }
        }
        kv.store(layer, pos0, ko, vo);
        let attn = sized(attn, n * qd);
        let shape = super::attention::Shape {
            cfg,
            pool,
            isa: crate::kernels::active_isa(),
            window: rt.gemma.as_ref().and_then(|g| g.window),
        };
        super::attention::attention(&shape, kv, layer, pos0, qo, attn);
        if let Some(r) = rec.as_deref_mut() {
            accumulate_squares(&mut r.o_in, attn, qd);
            if let Some(h) = r.gram.as_mut() {
                accumulate_gram(pool, &mut h.o_in, attn, qd);
            }
        }
        let o = self.o.as_ref();
        acts.prepare(pool, attn, qd, [o.input_kind(n)]);
        let oo = sized(oo, n * d);
        {
            let y = OutputMatrix::new(oo, n, d);
            matmuls(pool, &[(o, acts.get(attn, o.input_kind(n)), &y)]);
        }
        if let Some(p) = post {
            rms_norm_rows(pool, oo, &p.attn, eps);
        }

        // Feed-forward.
        add_norm_rows(pool, x, Some(oo), xn, &self.ffn_norm, eps);
        if let Some(r) = rec.as_deref_mut() {
            accumulate_squares(&mut r.ffn_in, xn, d);
            if let Some(h) = r.gram.as_mut() {
                accumulate_gram(pool, &mut h.ffn_in, xn, d);
            }
        }
        let ffn_out = sized(ffn_out, n * d);
        let gelu = rt.gemma.is_some();
        match &self.ffn {
            PackedFfn::Dense(m) => {
                let down = rec.map(|r| r.down(0));
                let mut bufs = FfnBufs { acts, g, u, gelu };
                mlp_forward(m, pool, xn, d, &mut bufs, ffn_out, down)
            }
            PackedFfn::Moe(m) => {
                let mut bufs = FfnBufs { acts, g, u, gelu };
                moe_forward(m, pool, xn, d, &mut bufs, ffn_out, rec)
            }
        }
        if let Some(p) = post {
            rms_norm_rows(pool, ffn_out, &p.ffn, eps);
        }
        let ffn_out: &[f32] = ffn_out;
        par_rows(pool, x, d, |t, row| {
            let delta = &ffn_out[t * d..(t + 1) * d];
            row.iter_mut().zip(delta).for_each(|(a, b)| *a += b);
        });
    }
}

/// Buffers a forward pass reuses from layer to layer and call to call (allocating them
/// afresh costs page faults on every prompt).
#[derive(Default)]
pub(super) struct Scratch {
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    ffn_out: Vec<f32>,
    g: Vec<f32>,
    u: Vec<f32>,
    pub acts: Activations,
    /// Per layer, when calibration statistics are being gathered.
    pub record: Option<Vec<LayerRecord>>,
    /// Sums of squares of the final norm's output per channel and the tokens summed
    /// (`lm_head`'s input), when calibration statistics are being gathered.
    pub head_record: Option<(Vec<f64>, u64)>,
}

/// Rows of the Gram matrix per task of [`accumulate_gram`] (a multiple of [`PANEL_ROWS`]).
const GRAM_BLOCK: usize = 32;

thread_local! {
    /// [`accumulate_gram`]'s buffers, reused across calls (calibration runs on one thread):
    /// `Xᵀ` as panels, `Xᵀ` row-major, and the float32 product.
    static GRAM_SCRATCH: std::cell::RefCell<[Vec<f32>; 3]> = Default::default();
}

/// Frees [`accumulate_gram`]'s buffers (after the last Hessian of a calibration).
pub(super) fn release_gram_scratch() {
    GRAM_SCRATCH.with(|b| *b.borrow_mut() = Default::default());
}

/// Adds `Σ x xᵀ` over the rows of `x` (rows of `dim`) to `h` (sized on first use), on the
/// float32 matmul kernels: with `Xᵀ` (`dim × n`) as both the weight and the input,
/// `y[j][i] = Σ_t x_t[i] x_t[j]`. Symmetry halves the work: the rows `i` of block `b`
/// ([`GRAM_BLOCK`] rows) are multiplied only with the inputs `j ≥` the block's first row,
/// so `h.sums[j][i]` is added for every `i` below the end of `j`'s block; the rest of the
/// upper triangle is filled in by [`mirror_gram`] once all rows are in. Blocks are taken
/// by the pool's threads from a shared counter, largest first.
pub(super) fn accumulate_gram(pool: &ThreadPool, h: &mut Hessian, x: &[f32], dim: usize) {
    let n = x.len() / dim;
    if n == 0 {
        return;
    }
    if h.dim != dim {
        *h = Hessian::zeros(dim);
    }
    GRAM_SCRATCH.with(|scratch| {
        let [panels, xt, y] = &mut *scratch.borrow_mut();
        // Panel p holds channels 16p..16p+16 of every row of x, 16 values per row (the
        // panel layout of `kernels` for the weight Xᵀ): a straight copy.
        let n_panels = dim.div_ceil(PANEL_ROWS);
        panels.clear();
        panels.resize(n_panels * PANEL_ROWS * n, 0.0);
        for (p, panel) in panels.chunks_exact_mut(PANEL_ROWS * n).enumerate() {
            let c0 = p * PANEL_ROWS;
            let width = PANEL_ROWS.min(dim - c0);
            for (t, dst) in panel.chunks_exact_mut(PANEL_ROWS).enumerate() {
                dst[..width].copy_from_slice(&x[t * dim + c0..t * dim + c0 + width]);
            }
        }
        // Xᵀ row-major (each channel's values over the rows), transposed in tiles.
        xt.resize(dim * n, 0.0);
        const TILE: usize = 32;
        for t0 in (0..n).step_by(TILE) {
            for c0 in (0..dim).step_by(TILE) {
                for t in t0..(t0 + TILE).min(n) {
                    for c in c0..(c0 + TILE).min(dim) {
                        xt[c * n + t] = x[t * dim + c];
                    }
                }
            }
        }
        y.resize(dim * dim, 0.0);
        let out = OutputMatrix::new(y, dim, dim);
        let blocks = dim.div_ceil(GRAM_BLOCK);
        let next = std::sync::atomic::AtomicUsize::new(0);
        let isa = kernels::active_isa();
        let (panels, xt): (&[f32], &[f32]) = (panels, xt);
        pool.run(|_, _| loop {
            let b = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if b >= blocks {
                break;
            }
            let r0 = b * GRAM_BLOCK;
            let rows = r0..(r0 + GRAM_BLOCK).min(dim);
            let w = kernels::PanelWeights {
                data: panels,
                n_rows: dim,
                cols: n,
            };
            let x = kernels::TokenRows {
                data: &xt[r0 * n..],
                n_tokens: dim - r0,
            };
            kernels::gemm_f32_panels(isa, w, x, rows, &out.from_token(r0));
        });
        for j in 0..dim {
            let end = ((j / GRAM_BLOCK + 1) * GRAM_BLOCK).min(dim);
            h.sums[j * dim..j * dim + end]
                .iter_mut()
                .zip(&y[j * dim..j * dim + end])
                .for_each(|(s, &v)| *s += v as f64);
        }
    });
    h.tokens += n as u64;
}

/// Completes a Hessian gathered by [`accumulate_gram`]: the upper triangle from the lower.
pub(super) fn mirror_gram(h: &mut Hessian) {
    let d = h.dim;
    for j in 0..d {
        for i in j + 1..d {
            h.sums[j * d + i] = h.sums[i * d + j];
        }
    }
}

/// Adds the squares of every row of `x` (rows of `dim`) to `acc` (grown to `dim`).
pub(super) fn accumulate_squares(acc: &mut Vec<f64>, x: &[f32], dim: usize) {
    acc.resize(dim, 0.0);
    for row in x.chunks_exact(dim) {
        acc.iter_mut()
            .zip(row)
            .for_each(|(a, &v)| *a += (v as f64) * (v as f64));
    }
}

/// `n` values of `v` starting on a 64-byte boundary, `v` grown if needed (contents
/// unspecified). Aligned so that a 16-float row-group result is one cache line: from a
/// 16-byte-aligned allocation every such write into a matmul output touched two.
fn sized(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    const LINE_F32: usize = 64 / std::mem::size_of::<f32>();
    if v.len() < n + LINE_F32 {
        v.resize(n + LINE_F32, 0.0);
    }
    let off = v.as_ptr().align_offset(64).min(LINE_F32);
    &mut v[off..off + n]
}

/// Bias, then the per-head RMSNorm of qwen3 and gemma3 (weights of length `head_dim`).
fn finish_projection(
    row: &mut [f32],
    bias: Option<&[f32]>,
    norm: Option<&[f32]>,
    hd: usize,
    eps: f32,
) {
    if let Some(b) = bias {
        row.iter_mut().zip(b).for_each(|(a, b)| *a += b);
    }
    if let Some(w) = norm {
        for head in row.chunks_exact_mut(hd) {
            rms_norm(head, w, eps);
        }
    }
}

/// SwiGLU MLP (GeGLU with tanh GELU when `bufs.gelu`) on the rows of `xn` (`[n][d]`)
/// into `out` (`[n][d]`).
fn mlp_forward(
    m: &PackedMlp,
    pool: &ThreadPool,
    xn: &[f32],
    d: usize,
    bufs: &mut FfnBufs<'_>,
    out: &mut [f32],
    record: Option<DownRecord>,
) {
    let FfnBufs { acts, g, u, gelu } = bufs;
    let gelu = *gelu;
    let n = xn.len() / d;
    let f = m.gate.rows();
    let (gate, up, down) = (m.gate.as_ref(), m.up.as_ref(), m.down.as_ref());
    acts.prepare(pool, xn, d, [gate.input_kind(n), up.input_kind(n)]);
    let g = sized(g, n * f);
    let u = sized(u, n * f);
    {
        let yg = OutputMatrix::new(g, n, f);
        let yu = OutputMatrix::new(u, n, f);
        matmuls(
            pool,
            &[
                (gate, acts.get(xn, gate.input_kind(n)), &yg),
                (up, acts.get(xn, up.input_kind(n)), &yu),
            ],
        );
    }
    let isa = kernels::active_isa();
    let u: &[f32] = u;
    par_rows(pool, g, f, |t, row| {
        let u = &u[t * f..(t + 1) * f];
        if gelu {
            kernels::gelu_tanh_mul(isa, row, u);
        } else {
            kernels::silu_mul(isa, row, u);
        }
    });
    if let Some(((acc, tokens), gram)) = record {
        *tokens += n as u64;
        accumulate_squares(acc, g, f);
        if let Some(h) = gram {
            accumulate_gram(pool, h, g, f);
        }
    }
    acts.prepare(pool, g, f, [down.input_kind(n)]);
    let y = OutputMatrix::new(out, n, d);
    matmuls(pool, &[(down, acts.get(g, down.input_kind(n)), &y)]);
}

/// Mixture of experts: softmax over all router logits, the `top_k` largest probabilities
/// (renormalised to sum 1 when `renormalize`), tokens grouped by expert so each expert runs
/// once on all its tokens; plus the gated shared expert (qwen2_moe).
fn moe_forward(
    m: &PackedMoe,
    pool: &ThreadPool,
    xn: &[f32],
    d: usize,
    bufs: &mut FfnBufs<'_>,
    out: &mut [f32],
    mut record: Option<&mut LayerRecord>,
) {
    let n = xn.len() / d;
    let n_experts = m.experts.len();
    let isa = kernels::active_isa();
    let mut assigned: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n_experts];
    let mut probs = vec![0f64; n_experts];
    let mut order: Vec<usize> = Vec::with_capacity(n_experts);
    for t in 0..n {
        let xt = &xn[t * d..(t + 1) * d];
        let logits: Vec<f32> = (0..n_experts)
            .map(|e| kernels::dot_f32(isa, m.router.row(e), xt))
            .collect();
        let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let mut sum = 0f64;
        for (p, &l) in probs.iter_mut().zip(&logits) {
            *p = ((l - max) as f64).exp();
            sum += *p;
        }
        probs.iter_mut().for_each(|p| *p /= sum);
        order.clear();
        order.extend(0..n_experts);
        // Largest first; ties to the lower index (torch.topk picks either).
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let chosen = &order[..m.top_k];
        let norm = if m.renormalize {
            chosen.iter().map(|&e| probs[e]).sum::<f64>()
        } else {
            1.0
        };
        for &e in chosen {
            assigned[e].push((t, (probs[e] / norm) as f32));
        }
    }
    out.fill(0.0);
    for (e, tokens) in assigned.iter().enumerate() {
        if tokens.is_empty() {
            continue;
        }
        let mut xe = Vec::with_capacity(tokens.len() * d);
        for &(t, _) in tokens {
            xe.extend_from_slice(&xn[t * d..(t + 1) * d]);
        }
        let mut ye = vec![0f32; tokens.len() * d];
        let down = record.as_deref_mut().map(|r| r.down(e));
        mlp_forward(&m.experts[e], pool, &xe, d, bufs, &mut ye, down);
        for (row, &(t, w)) in ye.chunks_exact(d).zip(tokens) {
            kernels::axpy_f32(isa, &mut out[t * d..(t + 1) * d], w, row);
        }
    }
    if let Some(shared) = &m.shared {
        let mut ys = vec![0f32; n * d];
        let down = record.map(|r| r.down(n_experts));
        mlp_forward(shared, pool, xn, d, bufs, &mut ys, down);
        for t in 0..n {
            let gate = match &m.shared_gate {
                Some(g) => {
                    let z = kernels::dot_f32(isa, g, &xn[t * d..(t + 1) * d]);
                    1.0 / (1.0 + (-z).exp())
                }
                None => 1.0,
            };
            kernels::axpy_f32(
                isa,
                &mut out[t * d..(t + 1) * d],
                gate,
                &ys[t * d..(t + 1) * d],
            );
        }
    }
}

/// HF RMSNorm in float32: `x * rsqrt(mean(x²) + eps) * w`.
pub(super) fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let inv = rms_inverse(x, eps);
    for (v, w) in x.iter_mut().zip(w) {
        *v = *v * inv * w;
    }
}

/// `1 / sqrt(mean(x²) + eps)`, the factor [`rms_norm`] scales by (the sum of squares in
/// eight lanes, then the tail, then the lanes in order).
fn rms_inverse(x: &[f32], eps: f32) -> f32 {
    let mut lanes = [0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            lanes[i] += c[i] * c[i];
        }
    }
    let mut ss: f32 = chunks.remainder().iter().map(|v| v * v).sum();
    ss += lanes.iter().sum::<f32>();
    1.0 / (ss / x.len() as f32 + eps).sqrt()
}

/// [`rms_norm`] of every row of `x` (rows of `w.len()` values), rows split over threads.
pub(super) fn rms_norm_rows(pool: &ThreadPool, x: &mut [f32], w: &[f32], eps: f32) {
    par_rows(pool, x, w.len(), |_, row| rms_norm(row, w, eps));
}

/// Runs `f(row_index, row)` on every `row_len`-value row of `data`, rows split over the
/// pool's threads (inline for a single row).
pub(super) fn par_rows(
    pool: &ThreadPool,
    data: &mut [f32],
    row_len: usize,
    f: impl Fn(usize, &mut [f32]) + Sync,
) {
    let n_rows = data.len() / row_len;
    let parts = split_rows(pool, n_rows, data, row_len);
    par_parts(pool, parts, |(first, rows)| {
        for (j, row) in rows.chunks_exact_mut(row_len).enumerate() {
            f(first + j, row);
        }
    });
}

/// `data` (rows of `row_len` values) cut into one `(first_row, rows)` part per thread
/// of `pool`, as [`split_range`] splits `0..n_rows` (a single part when there are fewer
/// than two rows or one thread).
fn split_rows<'a, T>(
    pool: &ThreadPool,
    n_rows: usize,
    data: &'a mut [T],
    row_len: usize,
) -> Vec<(usize, &'a mut [T])> {
    let nt = if n_rows < 2 { 1 } else { pool.n_threads() };
    let mut parts = Vec::with_capacity(nt);
    let mut rest = data;
    for i in 0..nt {
        let r = split_range(n_rows, nt, i, 1);
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(r.len() * row_len);
        parts.push((r.start, head));
        rest = tail;
    }
    parts
}

/// Runs `f` on each of `parts`, part `i` on thread `i` of `pool` (inline when there is
/// one part).
fn par_parts<T: Send>(pool: &ThreadPool, mut parts: Vec<T>, f: impl Fn(T) + Sync) {
    if parts.len() <= 1 {
        parts.into_iter().for_each(f);
        return;
    }
    let cells: Vec<Mutex<Option<T>>> = parts.drain(..).map(|p| Mutex::new(Some(p))).collect();
    pool.run(|i, _| {
        let part = cells
            .get(i)
            .and_then(|c| c.lock().unwrap_or_else(|e| e.into_inner()).take());
        if let Some(part) = part {
            f(part);
        }
    });
}

/// `x += delta` (when given) and `xn = rms_norm(x)`, row by row, rows split over the
/// pool's threads: the residual add and the next block's input norm in one pass.
pub(super) fn add_norm_rows(
    pool: &ThreadPool,
    x: &mut [f32],
    delta: Option<&[f32]>,
    xn: &mut [f32],
    w: &[f32],
    eps: f32,
) {
    let d = w.len();
    let n_rows = x.len() / d;
    let xs = split_rows(pool, n_rows, x, d);
    let xns = split_rows(pool, n_rows, xn, d);
    par_parts(
        pool,
        xs.into_iter().zip(xns).collect(),
        |((first, x), (_, xn))| {
            // Row by row, so each row is still in L1 for its norm (a copy of the whole
            // part first, then the norms, was a 590 KB memmove per thread at pp512).
            for (r, (x, xn)) in x
                .chunks_exact_mut(d)
                .zip(xn.chunks_exact_mut(d))
                .enumerate()
            {
                if let Some(delta) = delta {
                    let delta = &delta[(first + r) * d..(first + r + 1) * d];
                    x.iter_mut().zip(delta).for_each(|(a, b)| *a += b);
                }
                let inv = rms_inverse(x, eps);
                for ((o, v), w) in xn.iter_mut().zip(x.iter()).zip(w) {
                    *o = *v * inv * w;
                }
            }
        },
    );
}

/// Batches of at least this many tokens hand out matmul rows in claimed pieces
/// ([`matmuls`]).
const CLAIMED_MIN_TOKENS: usize = 16;

/// Pieces per thread each matrix is cut into when rows are claimed.
const PIECES_PER_THREAD: usize = 8;

/// Several matmuls in one hand-off to the pool.
///
/// A single token (generation) gives each thread one fixed slice of every matrix: the
/// slices stream as long runs, and on a 2-core AMD Zen 3 guest cutting them into pieces
/// claimed through a counter lost 5-10 % of tg128. A batch of [`CLAIMED_MIN_TOKENS`] or
/// more (prompts, perplexity chunks) instead cuts every matrix into about
/// [`PIECES_PER_THREAD`] pieces per thread, which the threads claim in order until none
/// are left, so a thread slowed by the host (a shared guest's cores run at different
/// speeds from one minute to the next) takes fewer: a piece is at least one 16-row group
/// times the whole batch, so a claim costs nothing next to it. Measured on that guest,
/// `speed` int8 pp512 under `perf`: with fixed halves the worker thread spent 27.4 % of
/// all samples in the int8 tile against the main thread's 21.7 % for the same rows, and
/// the main thread waited (`sched_yield`, clock reads) 6.9 %; with claimed pieces 25.5 /
/// 25.7 % and waits of 1.2 %. In interleaved `speed` rounds the gain (a few per cent)
/// is smaller than the host's round-to-round noise.
pub(super) fn matmuls(
    pool: &ThreadPool,
    jobs: &[(&dyn PackedLinear, PreparedInput, &OutputMatrix)],
) {
    let n_tokens = jobs.iter().map(|(_, _, y)| y.n_tokens()).max().unwrap_or(0);
    if n_tokens >= CLAIMED_MIN_TOKENS && pool.n_threads() > 1 {
        let shapes = jobs.iter().map(|(w, _, _)| (w.rows(), w.row_align()));
        let pieces = row_pieces(shapes, pool.n_threads() * PIECES_PER_THREAD);
        let next = AtomicUsize::new(0);
        pool.run(|_, _| {
            while let Some((j, rows)) = pieces.get(next.fetch_add(1, Ordering::Relaxed)) {
                let (w, x, y) = &jobs[*j];
                w.matmul_rows(x, rows.clone(), y);
            }
        });
        return;
    }
    pool.run(|i, nt| {
        for (w, x, y) in jobs {
            let rows = split_range(w.rows(), nt, i, w.row_align());
            if !rows.is_empty() {
                w.matmul_rows(x, rows, y);
            }
        }
    });
}

/// Every matrix's rows (`(rows, row_align)` per matrix, in order) cut into about `pieces`
/// pieces on multiples of its alignment: `(matrix, rows)` in matrix order, covering each
/// matrix's rows once.
pub(super) fn row_pieces(
    shapes: impl Iterator<Item = (usize, usize)>,
    pieces: usize,
) -> Vec<(usize, Range<usize>)> {
    let mut out = Vec::new();
    for (j, (rows, align)) in shapes.enumerate() {
        let align = align.max(1);
        let units = rows.div_ceil(align);
        let per_piece = (units / pieces.max(1)).max(1);
        let mut u = 0;
        while u < units {
            let end = (u + per_piece).min(units);
            out.push((j, u * align..(end * align).min(rows)));
            u = end;
        }
    }
    out
}

/// Activations of one matmul input in the encodings its consumers read, prepared once
/// (q/k/v share one, gate/up share one); the buffers are reused between inputs.
#[derive(Default)]
pub(super) struct Activations {
    dim: usize,
    bf16: Vec<u16>,
    bf16_dim: usize,
    q8_quants: Vec<i8>,
    q8_scales: Vec<f32>,
    q8_sums: Vec<i32>,
    q8_dim: usize,
    /// bf16 AMX token tiles ([`InputKind::Bf16Tiles`]).
    tiles: Vec<u16>,
    tiles_tokens: usize,
    /// The q8 activations' minimum terms, per group size (cleared by each `prepare`).
    q8_memo: InputMemo,
}

impl Activations {
    /// Encodes the rows of `x` (`dim` values each) for every kind in `kinds`, rows split
    /// over the pool's threads.
    pub fn prepare(
        &mut self,
        pool: &ThreadPool,
        x: &[f32],
        dim: usize,
        kinds: impl IntoIterator<Item = InputKind>,
    ) {
        let n = x.len() / dim;
        self.dim = dim;
        self.q8_memo.clear();
        let (mut bf16, mut q8, mut tiles) = (false, false, false);
        for k in kinds {
            match k {
                InputKind::F32 => {}
                InputKind::Bf16 => bf16 = true,
                InputKind::Q8Blocks => q8 = true,
                InputKind::Bf16Tiles => tiles = true,
            }
        }
        #[cfg(target_arch = "x86_64")]
        if tiles {
            use crate::kernels::quant::amx::bf16::{pack_token_tiles, padded_tokens, TILE_TOKENS};
            let len = padded_tokens(n) * dim;
            if self.tiles.len() < len {
                self.tiles.resize(len, 0);
            }
            self.tiles_tokens = n;
            // Whole token tiles per thread (each tile is 16 tokens' contiguous values).
            let parts = split_rows(
                pool,
                len / (TILE_TOKENS * dim),
                &mut self.tiles[..len],
                TILE_TOKENS * dim,
            );
            par_parts(pool, parts, |(first, out)| {
                let t0 = (first * TILE_TOKENS).min(n);
                let t1 = (t0 + out.len() / dim).min(n);
                pack_token_tiles(&x[t0 * dim..t1 * dim], dim, out);
            });
        }
        #[cfg(not(target_arch = "x86_64"))]
        assert!(!tiles, "AMX token tiles asked for off x86-64");
        if bf16 {
            let padded = dim + dim % 2;
            self.bf16_dim = padded;
            if self.bf16.len() < n * padded {
                self.bf16.resize(n * padded, 0);
            }
            let isa = kernels::active_isa();
            let parts = split_rows(pool, n, &mut self.bf16[..n * padded], padded);
            par_parts(pool, parts, |(first, rows)| {
                for (j, row) in rows.chunks_exact_mut(padded).enumerate() {
                    let t = first + j;
                    kernels::f32_to_bf16(isa, &x[t * dim..(t + 1) * dim], &mut row[..dim]);
                    row[dim..].fill(0);
                }
            });
        }
        if q8 {
            let per_row = dim / kernels::q8_activations::Q8_BLOCK;
            self.q8_dim = dim;
            self.q8_quants.resize(x.len(), 0);
            self.q8_scales.resize(n * per_row, 0.0);
            self.q8_sums.resize(n * per_row, 0);
            let quants = split_rows(pool, n, &mut self.q8_quants, dim);
            let scales = split_rows(pool, n, &mut self.q8_scales, per_row);
            let sums = split_rows(pool, n, &mut self.q8_sums, per_row);
            let parts: Vec<_> = quants.into_iter().zip(scales).zip(sums).collect();
            par_parts(pool, parts, |(((first, q), (_, s)), (_, b))| {
                let rows = &x[first * dim..first * dim + q.len()];
                kernels::q8_activations::quantize_rows_q8(rows, dim, q, s, b);
            });
        }
    }

    /// The prepared encoding `kind` of `x` (prepared by the last [`Self::prepare`]).
    pub fn get<'a>(&'a self, x: &'a [f32], kind: InputKind) -> PreparedInput<'a> {
        match kind {
            InputKind::F32 => PreparedInput::F32 {
                data: x,
                dim: self.dim,
            },
            InputKind::Bf16 => PreparedInput::Bf16 {
                data: &self.bf16.reinterpret_cast::<half::bf16>()
                    [..x.len() / self.dim * self.bf16_dim],
                dim: self.bf16_dim,
            },
            InputKind::Q8Blocks => {
                let blocks = x.len() / kernels::q8_activations::Q8_BLOCK;
                PreparedInput::Q8Blocks {
                    quants: &self.q8_quants[..x.len()],
                    scales: &self.q8_scales[..blocks],
                    block_sums: &self.q8_sums[..blocks],
                    dim: self.q8_dim,
                    memo: Some(&self.q8_memo),
                }
            }
            InputKind::Bf16Tiles => {
                let n = x.len() / self.dim;
                assert_eq!(
                    n, self.tiles_tokens,
                    "token tiles prepared for another batch"
                );
                PreparedInput::Bf16Tiles(Bf16Tiles {
                    data: &self.tiles,
                    dim: self.dim,
                    n_tokens: n,
                })
            }
        }
    }
}

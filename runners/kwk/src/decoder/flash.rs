//! Tiled ("flash") causal attention over a KV cache of any precision: for each (KV head,
//! block of 16 queries, share of the keys) the scores of a block of [`KEY_BLOCK`] keys,
//! an online softmax (running maximum and sum per query row, the output rescaled when the
//! maximum grows), and P·V added into a running output, so no score row as long as the
//! context exists. Keys and values are read in place in their precision by
//! `kernels::attention`. A step with fewer (KV head, query block) items than twice the
//! threads (one generated token, a short prompt at depth) also splits the keys: each share
//! gives its (max, sum, output) per row and the shares are merged after. A q8 cache holds
//! keys and values rotated (`kv_rotation`): each query row is rotated the same way when it
//! is copied in, and each output row rotated back when it is written.

use super::kv_cache::KvCache;
use super::kv_precision::KvPrecision;
use crate::kernels::attention::{self as kern, KeyPanels, ScoreTile, ValueRows, ValueTile};
use crate::kernels::{self, OutputMatrix, PANEL_ROWS};
use crate::model::ModelConfig;
use crate::threads::{split_range, ThreadPool};
use std::sync::atomic::{AtomicUsize, Ordering};

/// What attention reads besides the cache and the queries: the model's shape, the thread
/// pool, the kernels' tier (`kernels::active_isa()` but in tests), and the layer's sliding
/// window (`None`: every earlier position).
pub(super) struct Shape<'a> {
    pub cfg: &'a ModelConfig,
    pub pool: &'a ThreadPool,
    pub isa: kernels::Isa,
    pub window: Option<usize>,
}

/// Query tokens per work item (the item runs the group's heads of these tokens together).
const QUERY_BLOCK: usize = 16;

/// Keys per tile of the online softmax (a multiple of 16): the score tile is `rows x 64`.
pub(super) const KEY_BLOCK: usize = 64;

/// Query rows above which a tile widens its keys and values to float32 once, before the
/// kernels read them: the vector kernels take 4 rows per pass and widen f16, bf16 and q8
/// in registers on every pass, so a prompt's tile (16 tokens x the GQA group) widened each
/// key up to 12 times. One generated token (the group's rows, one pass) reads them in
/// place. Measured on SmolLM2-135M int8, pp512 at depth 2048, 1 thread, the AVX-512 tier
/// of a Xeon with AMX, two runs each (tokens/s, in place -> widened): f16 cache 383, 366 ->
/// 408, 445; q8 324, 373 -> 346, 428. At depth 0 the change was within the noise.
const WIDEN_ABOVE_ROWS: usize = 4;

/// Keys a share of a split holds at least (so the merge stays small against the work).
const MIN_SPLIT_KEYS: usize = 256;

/// Causal attention of the `n` query rows `q` (`[n][n_heads*hd]`, positions
/// `pos0..pos0+n`) over the cache, into `out` (`[n][n_heads*hd]`); the same function as
/// `attention::attention`'s matmul path (a local layer's query at `p` sees keys
/// `p - window + 1 ..= p`, possibly on a ring: slot = position % cap), in tiles.
pub(super) fn attention(
    rt: &Shape<'_>,
    kv: &KvCache,
    layer: usize,
    pos0: usize,
    q: &[f32],
    out: &mut [f32],
    scale: f32,
) {
    let (pool, cfg) = (rt.pool, rt.cfg);
    let (hd, nh, n_kv) = (cfg.head_dim, cfg.n_heads, cfg.n_kv_heads);
    let qd = nh * hd;
    let n = q.len() / qd;
    let group = nh / n_kv;
    let window = rt.window;
    let cap = kv.cap(layer);
    let (kd, vd) = (kv.key_dims(), kv.value_dims());
    let isa = rt.isa;
    let n_blocks = n.div_ceil(QUERY_BLOCK);
    let base_items = n_kv * n_blocks;
    // The keys the last block sees: what a share splits.
    let span = window.map_or(pos0 + n, |w| (w + QUERY_BLOCK).min(pos0 + n));
    let threads = pool.n_threads();
    let splits = if base_items < 2 * threads {
        (2 * threads)
            .div_ceil(base_items)
            .min(span / MIN_SPLIT_KEYS)
            .max(1)
    } else {
        1
    };
    let items = base_items * splits;
    let max_rows = QUERY_BLOCK.min(n) * group;
    // A share's result per row: max, sum, then the unnormalized output.
    let part_ld = max_rows * (vd + 2);
    let mut parts = vec![0f32; if splits > 1 { items * part_ld } else { 0 }];
    let partial = OutputMatrix::new(&mut parts, if splits > 1 { items } else { 0 }, part_ld);
    let y = OutputMatrix::new(out, n, qd);
    let claimed = AtomicUsize::new(0);
    pool.run(|i, _| {
        if i >= items {
            return;
        }
        let mut st = State::new(max_rows, kd, vd);
        // Later blocks see more keys: the threads claim items longest first.
        while let Some(item) = items.checked_sub(1 + claimed.fetch_add(1, Ordering::Relaxed)) {
            let (s, g, b) = (item % splits, item / splits % n_kv, item / splits / n_kv);
            let (t0, t1) = (b * QUERY_BLOCK, ((b + 1) * QUERY_BLOCK).min(n));
            let rows = (t1 - t0) * group;
            for r in 0..rows {
                let (t, h) = (t0 + r / group, g * group + r % group);
                let src = &q[t * qd + h * hd..][..hd];
                let dst = &mut st.q[r * kd..(r + 1) * kd];
                dst[..hd]
                    .iter_mut()
                    .zip(src)
                    .for_each(|(d, &x)| *d = x * scale);
                dst[hd..].fill(0.0);
                kv.rotate_query(dst);
            }
            // The keys of this block: from its first query's window start (aligned down
            // to a panel) to its last query; this item's share of them.
            let lo =
                window.map_or(0, |w| (pos0 + t0 + 1).saturating_sub(w)) / PANEL_ROWS * PANEL_ROWS;
            let hi = pos0 + t1;
            let share = split_range(hi - lo, splits, s, KEY_BLOCK);
            let block = Block {
                kv,
                layer,
                g,
                cap,
                first_pos: pos0 + t0,
                group,
                window,
            };
            st.reset(rows);
            st.run(isa, &block, rows, lo + share.start..lo + share.end);
            if splits > 1 {
                for r in 0..rows {
                    let at = r * (vd + 2);
                    let bad = st.bad[r];
                    partial.write_cols(item, at, &[st.m[r], if bad { f32::NAN } else { st.l[r] }]);
                    partial.write_cols(item, at + 2, &st.o[r * vd..(r + 1) * vd]);
                }
            } else {
                for r in 0..rows {
                    let (t, h) = (t0 + r / group, g * group + r % group);
                    let l = if st.bad[r] || st.l[r] == 0.0 {
                        f32::NAN
                    } else {
                        st.l[r]
                    };
                    let inv = 1.0 / l;
                    let o = &mut st.o[r * vd..r * vd + hd];
                    o.iter_mut().for_each(|x| *x *= inv);
                    kv.rotate_output_back(o);
                    y.write_cols(t, h * hd, o);
                }
            }
        }
    });
    if splits == 1 {
        return;
    }
    // Merge the shares: out = Σ o_s e^(m_s - M) / Σ l_s e^(m_s - M), M the largest m_s.
    let mut acc = vec![0f32; hd];
    for b in 0..n_blocks {
        let (t0, t1) = (b * QUERY_BLOCK, ((b + 1) * QUERY_BLOCK).min(n));
        for g in 0..n_kv {
            let first = (b * n_kv + g) * splits;
            for r in 0..(t1 - t0) * group {
                let row = |s: usize| &parts[(first + s) * part_ld + r * (vd + 2)..][..vd + 2];
                let m = (0..splits)
                    .map(&row)
                    .filter(|p| p[1] != 0.0)
                    .fold(f32::NEG_INFINITY, |m, p| m.max(p[0]));
                acc.fill(0.0);
                let mut l = 0f32;
                for s in 0..splits {
                    let p = row(s);
                    if p[1] == 0.0 {
                        continue;
                    }
                    let w = (p[0] - m).exp();
                    l += p[1] * w;
                    acc.iter_mut()
                        .zip(&p[2..2 + hd])
                        .for_each(|(a, &o)| *a += o * w);
                }
                let inv = if l == 0.0 { f32::NAN } else { 1.0 / l };
                let (t, h) = (t0 + r / group, g * group + r % group);
                let o = &mut out[t * qd + h * hd..][..hd];
                o.iter_mut().zip(&acc).for_each(|(o, &a)| *o = a * inv);
                kv.rotate_output_back(o);
            }
        }
    }
}

/// What a work item reads: KV head `g` of `layer`, and which keys each of its rows sees
/// (row `r` is the query at `first_pos + r / group`).
struct Block<'a> {
    kv: &'a KvCache,
    layer: usize,
    g: usize,
    cap: usize,
    first_pos: usize,
    group: usize,
    window: Option<usize>,
}

impl Block<'_> {
    /// The key positions row `r` sees within `k0..k1`.
    fn visible(&self, r: usize, k0: usize, k1: usize) -> (usize, usize) {
        let p = self.first_pos + r / self.group;
        let first = self.window.map_or(0, |w| (p + 1).saturating_sub(w));
        (first.max(k0), (p + 1).min(k1))
    }
}

/// One thread's tiles: the scaled query rows (`[rows][key_dims]`), a score tile
/// (`[rows][KEY_BLOCK]`), and per row the running max, sum and output (`[rows][value_dims]`)
/// and whether a score was not finite.
struct State {
    kd: usize,
    vd: usize,
    q: Vec<f32>,
    s: Vec<f32>,
    o: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
    bad: Vec<bool>,
    /// The tile's keys and values widened to float32 (empty when its rows never need it).
    keys32: Vec<f32>,
    values32: Vec<f32>,
}

impl State {
    fn new(max_rows: usize, kd: usize, vd: usize) -> State {
        State {
            kd,
            vd,
            q: vec![0f32; max_rows * kd],
            s: vec![0f32; max_rows * KEY_BLOCK],
            o: vec![0f32; max_rows * vd],
            m: vec![0f32; max_rows],
            l: vec![0f32; max_rows],
            bad: vec![false; max_rows],
            keys32: vec![
                0f32;
                if max_rows > WIDEN_ABOVE_ROWS {
                    KEY_BLOCK * kd
                } else {
                    0
                }
            ],
            values32: vec![
                0f32;
                if max_rows > WIDEN_ABOVE_ROWS {
                    KEY_BLOCK * vd
                } else {
                    0
                }
            ],
        }
    }

    fn reset(&mut self, rows: usize) {
        self.o[..rows * self.vd].fill(0.0);
        self.m[..rows].fill(f32::NEG_INFINITY);
        self.l[..rows].fill(0.0);
        self.bad[..rows].fill(false);
    }

    /// Runs the online softmax of `rows` rows over the key positions `keys` (its start a
    /// multiple of 16), in tiles of [`KEY_BLOCK`] that do not cross a multiple of the cap
    /// (so each tile's slots are one run).
    fn run(&mut self, isa: kernels::Isa, b: &Block<'_>, rows: usize, keys: std::ops::Range<usize>) {
        let (kd, vd) = (self.kd, self.vd);
        let widen = rows > WIDEN_ABOVE_ROWS && b.kv.precision() != KvPrecision::F32;
        let mut k0 = keys.start;
        while k0 < keys.end {
            let wrap = (k0 / b.cap + 1) * b.cap;
            let k1 = (k0 + KEY_BLOCK).min(keys.end).min(wrap);
            let slot0 = k0 % b.cap;
            let n_panels = (k1 - k0).div_ceil(PANEL_ROWS);
            let p0 = slot0 / PANEL_ROWS;
            let mut key_panels = b.kv.key_panels(b.layer, b.g, p0..p0 + n_panels);
            if widen {
                kern::widen_key_panels(isa, key_panels, kd, n_panels, &mut self.keys32);
                key_panels = KeyPanels::F32(&self.keys32);
            }
            kern::key_scores(
                isa,
                key_panels,
                kd,
                n_panels,
                ScoreTile {
                    q: &self.q,
                    q_ld: kd,
                    rows,
                    out: &mut self.s,
                    out_ld: KEY_BLOCK,
                    streamed: !widen,
                },
            );
            // Per row: the visible run's maximum, the correction of the running state,
            // e^(s - m) in place; zero outside the run.
            let (mut lo, mut hi) = (k1, k0);
            for r in 0..rows {
                let (a, e) = b.visible(r, k0, k1);
                let srow = &mut self.s[r * KEY_BLOCK..(r + 1) * KEY_BLOCK];
                if a >= e || self.bad[r] {
                    srow.fill(0.0);
                    continue;
                }
                let run = &mut srow[a - k0..e - k0];
                let mx = kernels::scale_max_f32(isa, run, 1.0);
                if !mx.is_finite() {
                    self.bad[r] = true;
                    srow.fill(0.0);
                    continue;
                }
                let m = self.m[r].max(mx);
                if m > self.m[r] {
                    let corr = (self.m[r] - m).exp();
                    self.l[r] *= corr;
                    self.o[r * vd..(r + 1) * vd]
                        .iter_mut()
                        .for_each(|x| *x *= corr);
                    self.m[r] = m;
                }
                self.l[r] += kernels::exp_shifted_sum(isa, run, m);
                srow[..a - k0].fill(0.0);
                srow[e - k0..].fill(0.0);
                (lo, hi) = (lo.min(a), hi.max(e));
            }
            if lo < hi {
                let s0 = slot0 + (lo - k0);
                let (mut values, mut slots) = (b.kv.value_rows(b.layer, b.g), s0..s0 + (hi - lo));
                if widen {
                    kern::widen_values(isa, values, vd, slots.clone(), &mut self.values32);
                    values = ValueRows::F32Panels {
                        data: &self.values32,
                        cap: slots.len(),
                    };
                    slots = 0..slots.len();
                }
                kern::accumulate_values(
                    isa,
                    values,
                    vd,
                    slots,
                    ValueTile {
                        p: &self.s[lo - k0..],
                        p_ld: KEY_BLOCK,
                        rows,
                        out: &mut self.o,
                        out_ld: vd,
                        streamed: !widen,
                    },
                );
            }
            k0 = k1;
        }
    }
}

//! Causal attention over the KV cache (each query's keys: all earlier positions, or a Gemma
//! 3 local layer's window, possibly wrapped around a ring cache). Two paths: over a float32
//! cache up to [`MATMUL_MAX_KEYS`] keys, the matmul kernels (scores = K·q on the key panels,
//! a float32 softmax over whole score rows, P·V on the value panels); otherwise, and in
//! every other precision, the tiled path of `flash` (online softmax, no score row as long
//! as the context, keys split over threads for one-token steps).

use super::flash;
pub(super) use super::flash::Shape;
use super::kv_cache::KvCache;
use super::kv_precision::KvPrecision;
use crate::kernels::{self, OutputMatrix, PANEL_ROWS};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Query tokens per attention block (each block runs the group's heads together).
const QUERY_BLOCK: usize = 16;

/// The most keys (positions up to the last query) a float32 cache's step runs on the
/// matmul path; longer contexts take the tiled path, whose buffers do not grow with the
/// context and whose one-token steps split the keys over the threads. The matmul path
/// keeps the numbers of the float32 cache as they were before the tiled path existed at
/// the lengths every earlier measurement used (up to a 1024-token context); where the two
/// cross in speed was not measured.
pub(super) const MATMUL_MAX_KEYS: usize = 1024;

/// Causal attention of the `n` query rows `q` (`[n][n_heads*hd]`, positions
/// `pos0..pos0+n`) over the cache, into `out` (`[n][n_heads*hd]`). Work items are
/// (KV head, block of query tokens); the query heads sharing a KV head run as one matrix:
/// scores = K·q on the key panels, scaled, softmax over the causal prefix in float32
/// (over its last `window` keys in a Gemma 3 local layer), then P·V on the value panels.
/// A local layer's cache may be a ring ([`KvCache`]: slot = position % cap, with cap at
/// least the window plus the `n` new positions less one, so no key a query sees was
/// overwritten); once positions wrap, the scores run over all its slots and each query's
/// window is one or two runs of slots.
pub(super) fn attention(
    rt: &Shape<'_>,
    kv: &KvCache,
    layer: usize,
    pos0: usize,
    q: &[f32],
    out: &mut [f32],
) {
    let cfg = rt.cfg;
    let n = q.len() / (cfg.n_heads * cfg.head_dim);
    let scale = match &cfg.gemma3 {
        // transformers: `query_pre_attn_scalar**-0.5` (a Python float) times f32 scores.
        Some(g) => (1.0 / (g.query_pre_attn_scalar as f64).sqrt()) as f32,
        None => 1.0 / (cfg.head_dim as f32).sqrt(),
    };
    if kv.precision() == KvPrecision::F32 && pos0 + n <= MATMUL_MAX_KEYS {
        matmul_attention(rt, kv, layer, pos0, q, out, scale);
    } else {
        flash::attention(rt, kv, layer, pos0, q, out, scale);
    }
}

/// The matmul path of [`attention`] (a float32 cache): scores = K·q on the key panels,
/// scaled, softmax over the causal prefix in float32, P·V on the value panels, with work
/// items (KV head, block of query tokens).
pub(super) fn matmul_attention(
    rt: &Shape<'_>,
    kv: &KvCache,
    layer: usize,
    pos0: usize,
    q: &[f32],
    out: &mut [f32],
    scale: f32,
) {
    let (pool, cfg) = (rt.pool, rt.cfg);
    let hd = cfg.head_dim;
    let nh = cfg.n_heads;
    let qd = nh * hd;
    let n = q.len() / qd;
    let group = nh / cfg.n_kv_heads;
    let (Some(_), Some(_)) = (kv.keys(layer, 0), kv.values(layer, 0)) else {
        // Only a float32 cache has panels these kernels read.
        return flash::attention(rt, kv, layer, pos0, q, out, scale);
    };
    let window = rt.window;
    let cap = kv.cap(layer);
    let ring = pos0 + n > cap;
    let isa = rt.isa;
    let n_blocks = n.div_ceil(QUERY_BLOCK);
    let items = cfg.n_kv_heads * n_blocks;
    let y = OutputMatrix::new(out, n, qd);
    let claimed = AtomicUsize::new(0);
    pool.run(|i, _| {
        // Later blocks see more keys: the threads claim (block, head) items longest first,
        // so the short ones at the end even out the finish whatever each core's speed.
        if i >= items {
            return;
        }
        let max_rows = QUERY_BLOCK.min(n) * group;
        let mut qbuf = vec![0f32; max_rows * hd];
        let mut scores = vec![0f32; max_rows * (pos0 + n)];
        let mut obuf = vec![0f32; max_rows * hd];
        let mut obuf2 = vec![0f32; max_rows * hd];
        while let Some(item) = items.checked_sub(1 + claimed.fetch_add(1, Ordering::Relaxed)) {
            let (b, g) = (item / cfg.n_kv_heads, item % cfg.n_kv_heads);
            let (t0, t1) = (b * QUERY_BLOCK, ((b + 1) * QUERY_BLOCK).min(n));
            let rows = (t1 - t0) * group;
            let len = if ring { cap } else { pos0 + t1 };
            for r in 0..rows {
                let (t, h) = (t0 + r / group, g * group + r % group);
                qbuf[r * hd..(r + 1) * hd]
                    .copy_from_slice(&q[t * qd + h * hd..t * qd + (h + 1) * hd]);
            }
            // The slots this block's queries see: all `len`, or in a local layer the keys
            // from its first query's window start to its last query (one or two runs).
            let span = block_span(window, cap, ring, pos0 + t0, pos0 + t1, len);
            {
                let s = OutputMatrix::new(&mut scores[..rows * len], rows, len);
                for run in span.iter().filter(|r| !r.is_empty()) {
                    let w = kernels::PanelWeights {
                        data: kv.keys(layer, g).unwrap_or_default(),
                        n_rows: len,
                        cols: hd,
                    };
                    let x = kernels::TokenRows {
                        data: &qbuf,
                        n_tokens: rows,
                    };
                    let strides = kernels::PanelStrides {
                        panel: hd * PANEL_ROWS,
                        token: hd,
                    };
                    // Key panels start on multiples of 16 slots; the scores before `run`
                    // are computed but fall outside every query's window (zeroed below).
                    let start = run.start / PANEL_ROWS * PANEL_ROWS;
                    kernels::gemm_f32_panels_strided(isa, w, x, strides, start..run.end, &s);
                }
            }
            for r in 0..rows {
                let p = pos0 + t0 + r / group;
                // A local layer's query at position p sees keys p - window + 1..=p.
                let first = window.map_or(0, |w| (p + 1).saturating_sub(w));
                let seen = if ring {
                    let (a, b) = (first % cap, p % cap + 1);
                    if a < b {
                        [a..b, 0..0]
                    } else {
                        [0..b, a..cap]
                    }
                } else {
                    [first..p + 1, 0..0]
                };
                softmax_runs(isa, &mut scores[r * len..(r + 1) * len], &seen, scale);
            }
            // P·V over the span's columns only (the weights outside it are 0): the first
            // run into `obuf`, a second (a wrapped ring) into `obuf2`, added.
            let runs: Vec<&Range<usize>> = span.iter().filter(|r| !r.is_empty()).collect();
            for (i, run) in runs.iter().enumerate() {
                let dst = if i == 0 { &mut obuf } else { &mut obuf2 };
                let o = OutputMatrix::new(&mut dst[..rows * hd], rows, hd);
                let w = kernels::PanelWeights {
                    data: &kv.values(layer, g).unwrap_or_default()[run.start * PANEL_ROWS..],
                    n_rows: hd,
                    cols: run.len(),
                };
                let x = kernels::TokenRows {
                    data: &scores[run.start..rows * len],
                    n_tokens: rows,
                };
                let strides = kernels::PanelStrides {
                    panel: cap * PANEL_ROWS,
                    token: len,
                };
                kernels::gemm_f32_panels_strided(isa, w, x, strides, 0..hd, &o);
            }
            if runs.len() == 2 {
                obuf[..rows * hd]
                    .iter_mut()
                    .zip(&obuf2[..rows * hd])
                    .for_each(|(a, b)| *a += b);
            }
            for r in 0..rows {
                let (t, h) = (t0 + r / group, g * group + r % group);
                y.write_cols(t, h * hd, &obuf[r * hd..(r + 1) * hd]);
            }
        }
    });
}

/// The slots the queries at positions `q0..q1` (one block) attend to, as one or two runs
/// in slot order, within `0..len` (the scores' row length): every slot up to `len` in a
/// global layer; in a local layer the keys at positions `q0 + 1 - window ..= q1 - 1` (the
/// first query's window start to the last query), mapped onto the ring's slots when
/// positions wrapped (`ring`), so the work per query is bounded by the window and not by
/// the slots cached.
fn block_span(
    window: Option<usize>,
    cap: usize,
    ring: bool,
    q0: usize,
    q1: usize,
    len: usize,
) -> [Range<usize>; 2] {
    let Some(w) = window else {
        return [0..len, 0..0];
    };
    let lo = (q0 + 1).saturating_sub(w);
    if !ring {
        return [lo..q1, 0..0];
    }
    if q1 - lo >= cap {
        return [0..cap, 0..0];
    }
    let (a, b) = (lo % cap, (q1 - 1) % cap + 1);
    if a < b {
        [a..b, 0..0]
    } else {
        [0..b, a..cap]
    }
}

/// Scaled softmax of `row` over the runs `seen` (in order, not overlapping; an empty run
/// is skipped) in float32, zero elsewhere. A NaN or +Inf score (or none above -Inf)
/// leaves the softmax undefined, and the vector `exp` would clamp it to finite weights:
/// NaN weights carry it to the output instead of hiding it.
fn softmax_runs(isa: kernels::Isa, row: &mut [f32], seen: &[Range<usize>; 2], scale: f32) {
    let runs = || seen.iter().filter(|r| !r.is_empty());
    let mut max = f32::NEG_INFINITY;
    let mut finite = true;
    for r in runs() {
        let m = kernels::scale_max_f32(isa, &mut row[r.clone()], scale);
        finite &= m.is_finite();
        max = max.max(m);
    }
    let mut end = 0;
    for r in runs() {
        row[end..r.start].fill(0.0);
        end = r.end;
    }
    row[end..].fill(0.0);
    if !finite {
        runs().for_each(|r| row[r.clone()].fill(f32::NAN));
        return;
    }
    let sum: f32 = runs()
        .map(|r| kernels::exp_shifted_sum(isa, &mut row[r.clone()], max))
        .sum();
    let inv = 1.0 / sum;
    // The scaling pass of `scale_max_f32` (exact per element; its maximum is not needed
    // here), in the tier's vector width.
    for r in runs() {
        kernels::scale_max_f32(isa, &mut row[r.clone()], inv);
    }
}

#[cfg(test)]
mod tests {
    use super::block_span;

    /// A global layer sees every slot; a local layer its block's window, as positions before
    /// the ring wraps and as one or two runs of slots after.
    #[test]
    fn block_spans_cover_the_window_and_no_more() {
        assert_eq!(block_span(None, 64, false, 40, 56, 56), [0..56, 0..0]);
        // Window 6, queries 40..56: keys 35..56.
        assert_eq!(block_span(Some(6), 64, false, 40, 56, 56), [35..56, 0..0]);
        assert_eq!(block_span(Some(6), 64, false, 2, 5, 5), [0..5, 0..0]);
        // A ring of 32 slots: keys 35..56 are slots 3..24; keys 53..70 wrap (21..32, 0..6).
        assert_eq!(block_span(Some(6), 32, true, 40, 56, 32), [3..24, 0..0]);
        assert_eq!(block_span(Some(6), 32, true, 58, 70, 32), [0..6, 21..32]);
        // A span as long as the ring is the whole ring.
        assert_eq!(block_span(Some(21), 32, true, 60, 72, 32), [0..32, 0..0]);
        assert_eq!(block_span(Some(20), 32, true, 60, 72, 32), [0..8, 9..32]);
    }
}

//! The float32 KV cache of the runtime: keys and values of every layer and KV head, stored
//! in the panel layout the attention's matmul kernels read. A layer that only ever looks
//! back a window of keys (Gemma 3's local layers) gets a ring of slots instead of one slot
//! per position ([`KvCache::with_lengths`]).

use crate::kernels::PANEL_ROWS;

/// The float32 KV cache, per layer and KV head in the panel layout of
/// `kernels::gemm_f32_panels_strided`, so attention runs on the matmul kernels:
/// keys as panels of 16 positions (`[cap/16][head_dim][16]`: scores = K·q is a matmul with
/// positions as rows) and values as panels of 16 head dimensions (`[ceil(hd/16)][cap][16]`:
/// the output P·V is a matmul with head dimensions as rows and positions as columns).
/// A layer's `cap` is its length rounded up to 16. Position `p` lives in slot `p % cap`:
/// the slot is the position itself while the cache is shorter than `cap`, and a layer
/// whose length is below the context (a ring) reuses the slots of positions more than
/// `cap` back.
pub(crate) struct KvCache {
    pub(super) k: Vec<Vec<f32>>,
    pub(super) v: Vec<Vec<f32>>,
    pub(super) n_kv: usize,
    pub(super) hd: usize,
    /// Slots per layer (a multiple of 16).
    caps: Vec<usize>,
    pub(super) hd_panels: usize,
}

impl KvCache {
    /// A cache of `lengths[l]` slots (rounded up to 16) on layer `l`.
    pub fn with_lengths(n_kv: usize, hd: usize, lengths: &[usize]) -> Self {
        let hd_panels = hd.div_ceil(PANEL_ROWS);
        let caps: Vec<usize> = lengths
            .iter()
            .map(|&len| len.div_ceil(PANEL_ROWS) * PANEL_ROWS)
            .collect();
        KvCache {
            k: caps
                .iter()
                .map(|&cap| vec![0f32; n_kv * cap * hd])
                .collect(),
            v: caps
                .iter()
                .map(|&cap| vec![0f32; n_kv * hd_panels * PANEL_ROWS * cap])
                .collect(),
            n_kv,
            hd,
            caps,
            hd_panels,
        }
    }

    /// Slots of `layer`.
    pub(super) fn cap(&self, layer: usize) -> usize {
        self.caps[layer]
    }

    /// Stores rows `k`, `v` (`[n][n_kv*hd]`) at positions `pos0..pos0+n` (slots
    /// `pos % cap`).
    pub(super) fn store(&mut self, layer: usize, pos0: usize, k: &[f32], v: &[f32]) {
        let (hd, kvd, cap) = (self.hd, self.n_kv * self.hd, self.caps[layer]);
        let v_head = self.hd_panels * PANEL_ROWS * cap;
        // Slices and fixed-size chunks instead of one indexed store per value (that loop,
        // bounds-checked and single-threaded, had 1.4 % of an int8 pp512 profile).
        let (keys, values) = (&mut self.k[layer], &mut self.v[layer]);
        for (t, (kr, vr)) in k.chunks_exact(kvd).zip(v.chunks_exact(kvd)).enumerate() {
            let pos = pos0 + t;
            let pos = if pos < cap { pos } else { pos % cap };
            let (pp, lane) = (pos / PANEL_ROWS, pos % PANEL_ROWS);
            for g in 0..self.n_kv {
                // Key panel `pp`: `[hd][16]`, this position in lane `lane` of every row.
                let panel = &mut keys[g * cap * hd + pp * hd * PANEL_ROWS..][..hd * PANEL_ROWS];
                for (row, &val) in panel.chunks_exact_mut(PANEL_ROWS).zip(&kr[g * hd..][..hd]) {
                    row[lane] = val;
                }
                // Value panels: 16 head dimensions of this position side by side in each.
                let head = &mut values[g * v_head..][..v_head];
                for (p, src) in vr[g * hd..][..hd].chunks(PANEL_ROWS).enumerate() {
                    let at = (p * cap + pos) * PANEL_ROWS;
                    match <&[f32; PANEL_ROWS]>::try_from(src) {
                        // A whole panel row: a fixed-size move, not a `memcpy` call.
                        Ok(row) => head[at..at + PANEL_ROWS].copy_from_slice(row),
                        Err(_) => head[at..at + src.len()].copy_from_slice(src),
                    }
                }
            }
        }
    }

    /// Key panels of KV head `g` of `layer`.
    pub(super) fn keys(&self, layer: usize, g: usize) -> &[f32] {
        let size = self.caps[layer] * self.hd;
        &self.k[layer][g * size..(g + 1) * size]
    }

    /// Value panels of KV head `g` of `layer`.
    pub(super) fn values(&self, layer: usize, g: usize) -> &[f32] {
        let size = self.hd_panels * PANEL_ROWS * self.caps[layer];
        &self.v[layer][g * size..(g + 1) * size]
    }
}

//! The KV cache of the runtime: keys and values of every layer and KV head, in the
//! precision chosen ([`KvPrecision`]) and the layouts the attention kernels read
//! (`kernels::attention`). A layer that only ever looks back a window of keys (Gemma 3's
//! local layers) gets a ring of slots instead of one slot per position
//! ([`KvCache::with_lengths`]). A q8 cache stores keys and values rotated
//! (`kv_rotation`): queries are rotated the same way before their scores and the attention
//! output rotated back ([`KvCache::rotate_query`], [`KvCache::rotate_output_back`]).

use super::kv_precision::{KvPrecision, KV_Q8_BLOCK};
use super::kv_rotation::KvRotation;
use crate::kernels::attention::{quantize_q8_blocks, KeyPanels, ValueRows};
use crate::kernels::PANEL_ROWS;

/// One layer's keys and values in one element type.
enum Store {
    F32 {
        k: Vec<f32>,
        v: Vec<f32>,
    },
    /// f16 or bf16 bits (the cache's precision says which).
    Half {
        k: Vec<u16>,
        v: Vec<u16>,
    },
    Q8 {
        k: Vec<i8>,
        k_scales: Vec<f32>,
        v: Vec<i8>,
        v_scales: Vec<f32>,
    },
}

/// The KV cache, per layer and KV head.
///
/// Keys sit in panels of 16 positions, `[cap/16][key_dims][16]` (scores = K·q multiply-add
/// 16 positions per dimension; in float32 also the layout of
/// `kernels::gemm_f32_panels_strided`, with positions as rows); q8 keys' scales follow in
/// `[cap/16][key_dims/32][16]`. Values: float32 as panels of 16 head dimensions
/// (`[ceil(hd/16)][cap][16]`: P·V is a matmul with head dimensions as rows and positions as
/// columns); f16, bf16 and q8 one position per row (`[cap][value_dims]`, q8's scales
/// `[cap][value_dims/32]`). `key_dims` is `head_dim`, or for q8 `head_dim` rounded up to 32;
/// `value_dims` is [`KvPrecision::padded_head_dim`]; padding is zero.
///
/// A layer's `cap` is its length rounded up to 16. Position `p` lives in slot `p % cap`:
/// the slot is the position itself while the cache is shorter than `cap`, and a layer
/// whose length is below the context (a ring) reuses the slots of positions more than
/// `cap` back.
pub(crate) struct KvCache {
    layers: Vec<Store>,
    pub(super) n_kv: usize,
    pub(super) hd: usize,
    precision: KvPrecision,
    /// The basis keys and values are stored in (q8 with a head dimension a multiple of 64).
    rotation: Option<KvRotation>,
    /// Slots per layer (a multiple of 16).
    caps: Vec<usize>,
    pub(super) hd_panels: usize,
    key_dims: usize,
    value_dims: usize,
    /// A q8 row being quantized (`key_dims` or `value_dims` long, zero padded).
    row: Vec<f32>,
    codes: Vec<i8>,
    scales: Vec<f32>,
}

impl KvCache {
    /// A float32 cache of `lengths[l]` slots (rounded up to 16) on layer `l`.
    #[cfg(test)]
    pub fn with_lengths(n_kv: usize, hd: usize, lengths: &[usize]) -> Self {
        Self::new(n_kv, hd, lengths, KvPrecision::F32)
    }

    /// A cache of `lengths[l]` slots (rounded up to 16) on layer `l`, in `precision`.
    pub fn new(n_kv: usize, hd: usize, lengths: &[usize], precision: KvPrecision) -> Self {
        let hd_panels = hd.div_ceil(PANEL_ROWS);
        let key_dims = match precision {
            KvPrecision::Q8 => hd.div_ceil(KV_Q8_BLOCK) * KV_Q8_BLOCK,
            _ => hd,
        };
        let value_dims = precision.padded_head_dim(hd);
        let caps: Vec<usize> = lengths
            .iter()
            .map(|&len| len.div_ceil(PANEL_ROWS) * PANEL_ROWS)
            .collect();
        let layers = caps
            .iter()
            .map(|&cap| {
                let (k, v) = (n_kv * cap * key_dims, n_kv * cap * value_dims);
                match precision {
                    KvPrecision::F32 => Store::F32 {
                        k: vec![0f32; k],
                        v: vec![0f32; n_kv * hd_panels * PANEL_ROWS * cap],
                    },
                    KvPrecision::F16 | KvPrecision::Bf16 => Store::Half {
                        k: vec![0u16; k],
                        v: vec![0u16; v],
                    },
                    KvPrecision::Q8 => Store::Q8 {
                        k: vec![0i8; k],
                        k_scales: vec![0f32; k / KV_Q8_BLOCK],
                        v: vec![0i8; v],
                        v_scales: vec![0f32; v / KV_Q8_BLOCK],
                    },
                }
            })
            .collect();
        KvCache {
            layers,
            n_kv,
            hd,
            precision,
            rotation: match precision {
                KvPrecision::Q8 => KvRotation::for_head_dim(hd),
                _ => None,
            },
            caps,
            hd_panels,
            key_dims,
            value_dims,
            row: vec![0f32; key_dims.max(value_dims)],
            codes: vec![0i8; key_dims.max(value_dims)],
            scales: vec![0f32; key_dims.max(value_dims) / KV_Q8_BLOCK + 1],
        }
    }

    pub(super) fn precision(&self) -> KvPrecision {
        self.precision
    }

    /// Rotates one head's scaled query (`head_dim` long) into the basis the keys are
    /// stored in, so that its scores are those of the unrotated query and keys (nothing
    /// to do but in a rotated q8 cache).
    pub(super) fn rotate_query(&self, q: &mut [f32]) {
        if let Some(r) = &self.rotation {
            r.rotate_key(&mut q[..self.hd]);
        }
    }

    /// Rotates one head's attention output (`head_dim` long), a mix of stored values, back
    /// from the basis the values are stored in (nothing to do but in a rotated q8 cache).
    pub(super) fn rotate_output_back(&self, o: &mut [f32]) {
        if let Some(r) = &self.rotation {
            r.rotate_value(&mut o[..self.hd]);
        }
    }

    /// Slots of `layer`.
    pub(super) fn cap(&self, layer: usize) -> usize {
        self.caps[layer]
    }

    /// Rows of a key panel (the query length the score kernel reads).
    pub(super) fn key_dims(&self) -> usize {
        self.key_dims
    }

    /// Head dimensions of a cached value (a multiple of 16).
    pub(super) fn value_dims(&self) -> usize {
        match self.precision {
            KvPrecision::F32 => self.hd_panels * PANEL_ROWS,
            _ => self.value_dims,
        }
    }

    /// Stores rows `k`, `v` (`[n][n_kv*hd]`) at positions `pos0..pos0+n` (slots
    /// `pos % cap`).
    pub(super) fn store(&mut self, layer: usize, pos0: usize, k: &[f32], v: &[f32]) {
        let (hd, kvd, cap) = (self.hd, self.n_kv * self.hd, self.caps[layer]);
        let (kd, vd, n_kv) = (self.key_dims, self.value_dims, self.n_kv);
        let v_head = self.hd_panels * PANEL_ROWS * cap;
        let bf16 = self.precision == KvPrecision::Bf16;
        let rotation = self.rotation;
        let (row, codes, scales) = (&mut self.row, &mut self.codes, &mut self.scales);
        for (t, (kr, vr)) in k.chunks_exact(kvd).zip(v.chunks_exact(kvd)).enumerate() {
            let pos = pos0 + t;
            let pos = if pos < cap { pos } else { pos % cap };
            let (pp, lane) = (pos / PANEL_ROWS, pos % PANEL_ROWS);
            for g in 0..n_kv {
                let (key, value) = (&kr[g * hd..][..hd], &vr[g * hd..][..hd]);
                // Key panel `pp` of head `g`: `[kd][16]`, this position in lane `lane`.
                let panel = (g * cap + pp * PANEL_ROWS) * kd;
                let at = (g * cap + pos) * vd;
                match &mut self.layers[layer] {
                    Store::F32 { k: keys, v: values } => {
                        let panel = &mut keys[panel..][..hd * PANEL_ROWS];
                        for (r, &val) in panel.chunks_exact_mut(PANEL_ROWS).zip(key) {
                            r[lane] = val;
                        }
                        // Value panels: 16 head dimensions of this position side by side.
                        let head = &mut values[g * v_head..][..v_head];
                        for (p, src) in value.chunks(PANEL_ROWS).enumerate() {
                            let at = (p * cap + pos) * PANEL_ROWS;
                            match <&[f32; PANEL_ROWS]>::try_from(src) {
                                // A whole panel row: a fixed-size move, not a `memcpy` call.
                                Ok(row) => head[at..at + PANEL_ROWS].copy_from_slice(row),
                                Err(_) => head[at..at + src.len()].copy_from_slice(src),
                            }
                        }
                    }
                    Store::Half { k: keys, v: values } => {
                        let to_bits = |x: f32| {
                            if bf16 {
                                half::bf16::from_f32(x).to_bits()
                            } else {
                                half::f16::from_f32(x).to_bits()
                            }
                        };
                        let panel = &mut keys[panel..][..hd * PANEL_ROWS];
                        for (r, &val) in panel.chunks_exact_mut(PANEL_ROWS).zip(key) {
                            r[lane] = to_bits(val);
                        }
                        for (o, &x) in values[at..at + hd].iter_mut().zip(value) {
                            *o = to_bits(x);
                        }
                    }
                    Store::Q8 {
                        k: keys,
                        k_scales,
                        v: values,
                        v_scales,
                    } => {
                        let (krow, kcodes) = (&mut row[..kd], &mut codes[..kd]);
                        krow[..hd].copy_from_slice(key);
                        krow[hd..].fill(0.0);
                        if let Some(r) = &rotation {
                            r.rotate_key(&mut krow[..hd]);
                        }
                        let blocks = kd / KV_Q8_BLOCK;
                        quantize_q8_blocks(krow, kcodes, &mut scales[..blocks]);
                        let panel = &mut keys[panel..][..kd * PANEL_ROWS];
                        for (r, &c) in panel.chunks_exact_mut(PANEL_ROWS).zip(kcodes.iter()) {
                            r[lane] = c;
                        }
                        let sp = &mut k_scales[(g * cap + pp * PANEL_ROWS) * blocks..]
                            [..blocks * PANEL_ROWS];
                        for (r, &s) in sp.chunks_exact_mut(PANEL_ROWS).zip(scales.iter()) {
                            r[lane] = s;
                        }
                        let vrow = &mut row[..vd];
                        vrow[..hd].copy_from_slice(value);
                        vrow[hd..].fill(0.0);
                        if let Some(r) = &rotation {
                            r.rotate_value(&mut vrow[..hd]);
                        }
                        let vb = vd / KV_Q8_BLOCK;
                        let sv = &mut v_scales[(g * cap + pos) * vb..][..vb];
                        quantize_q8_blocks(vrow, &mut values[at..at + vd], sv);
                    }
                }
            }
        }
    }

    /// Float32 key panels of KV head `g` of `layer` (the matmul path; `None` in another
    /// precision).
    pub(super) fn keys(&self, layer: usize, g: usize) -> Option<&[f32]> {
        let size = self.caps[layer] * self.hd;
        match &self.layers[layer] {
            Store::F32 { k, .. } => Some(&k[g * size..(g + 1) * size]),
            _ => None,
        }
    }

    /// Float32 value panels of KV head `g` of `layer` (the matmul path; `None` in another
    /// precision).
    pub(super) fn values(&self, layer: usize, g: usize) -> Option<&[f32]> {
        let size = self.hd_panels * PANEL_ROWS * self.caps[layer];
        match &self.layers[layer] {
            Store::F32 { v, .. } => Some(&v[g * size..(g + 1) * size]),
            _ => None,
        }
    }

    /// Key panels `panels` (of 16 slots) of KV head `g` of `layer`, for the attention
    /// kernels.
    pub(super) fn key_panels(
        &self,
        layer: usize,
        g: usize,
        panels: std::ops::Range<usize>,
    ) -> KeyPanels<'_> {
        let cap = self.caps[layer];
        let per = self.key_dims * PANEL_ROWS;
        let range =
            (g * cap / PANEL_ROWS + panels.start) * per..(g * cap / PANEL_ROWS + panels.end) * per;
        match &self.layers[layer] {
            Store::F32 { k, .. } => KeyPanels::F32(&k[range]),
            Store::Half { k, .. } if self.precision == KvPrecision::Bf16 => {
                KeyPanels::Bf16(&k[range])
            }
            Store::Half { k, .. } => KeyPanels::F16(&k[range]),
            Store::Q8 { k, k_scales, .. } => KeyPanels::Q8 {
                codes: &k[range.clone()],
                scales: &k_scales[range.start / KV_Q8_BLOCK..range.end / KV_Q8_BLOCK],
            },
        }
    }

    /// Values of KV head `g` of `layer` (all its slots), for the attention kernels.
    pub(super) fn value_rows(&self, layer: usize, g: usize) -> ValueRows<'_> {
        let cap = self.caps[layer];
        let size = cap * self.value_dims;
        match &self.layers[layer] {
            Store::F32 { .. } => ValueRows::F32Panels {
                data: self.values(layer, g).unwrap_or(&[]),
                cap,
            },
            Store::Half { v, .. } if self.precision == KvPrecision::Bf16 => {
                ValueRows::Bf16(&v[g * size..(g + 1) * size])
            }
            Store::Half { v, .. } => ValueRows::F16(&v[g * size..(g + 1) * size]),
            Store::Q8 { v, v_scales, .. } => ValueRows::Q8 {
                codes: &v[g * size..(g + 1) * size],
                scales: &v_scales[g * size / KV_Q8_BLOCK..(g + 1) * size / KV_Q8_BLOCK],
            },
        }
    }
}

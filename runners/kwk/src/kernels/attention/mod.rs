//! The two inner products of tiled (flash-style) attention over a KV cache in any
//! [`crate::decoder::KvPrecision`], dispatched by tier: [`key_scores`] (scores of a few
//! query rows against panels of 16 cached keys) and [`accumulate_values`] (`out += P·V` over
//! a run of cached values). Narrow keys and values (f16, bf16, int8 codes with per-block
//! scales) are widened to float32 in registers as they are read; a tile of many query
//! rows (a prompt) first widens its block of keys and values once ([`widen_key_panels`],
//! [`widen_values`]) and reads that float32 copy, never one of the whole cache. The
//! specification is `scalar.rs`; `avx2.rs` (the `avx2` and `avxvnni` tiers) and
//! `avx512.rs` (`avx512bw`, `vnni`, `amx`) are its SIMD twins, the same sums in a
//! different order (they agree with it to float32 rounding, not to the bit).
//!
//! Layouts (the decoder's `kv_cache` stores them):
//! - keys: panels of 16 positions, `[panel][dims][16]` (position `j` of a panel in lane
//!   `j`); for q8, after the codes, the scales `[panel][dims/32][16]`. A score is a
//!   multiply-add of a broadcast query value into 16 lanes per dimension: no horizontal
//!   sums.
//! - values: one 16-wide chunk of head dimensions per vector. float32 in the matmul
//!   kernels' value panels (`[dims/16][cap][16]`); f16, bf16 and q8 one position per row
//!   (`[slot][dims]`, q8's scales `[slot][dims/32]` in a separate slice).

#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
pub mod scalar;
#[cfg(test)]
mod tests;

use super::{Isa, PANEL_ROWS};
use std::ops::Range;

/// Head dimensions per q8 scale.
pub const Q8_BLOCK: usize = 32;

/// How far ahead of the keys and values it is reading, in bytes, the vector tiers ask the
/// caches for them. One generated token reads the whole cache once, and the hardware
/// prefetcher alone left those reads stalled. Measured with `examples/attention_bandwidth`
/// (one thread, 90 KV heads x 4096 keys, 64 dims, 3 query rows, the AVX-512 tier of a Xeon
/// with AMX; ms per token for the scores, then for P·V read slot by slot): f16 cache scores
/// 6.25 with none, 4.5 at 2 KiB ahead, 4.4 at 4 KiB, 4.5 at 8 KiB; f16 P·V 5.5 with none,
/// 4.3 at 1 KiB, 3.8 at 2 and 4 KiB, 3.9 at 8 KiB; q8 scores 3.7 -> 2.6, q8 P·V 3.8 -> 2.1.
#[cfg(target_arch = "x86_64")]
const PREFETCH_BYTES: usize = 4096;

/// How far ahead the vector tiers also ask for keys and values into L2 (the near
/// [`PREFETCH_BYTES`] hint goes to L1): one stream with L1 prefetches alone keeps only as
/// many lines in flight as L1's fill buffers, which left one core reading the cache from
/// L3 at about three quarters of what four lock-step streams read (the roofline's probe).
/// Measured with `examples/attention_bandwidth` (as above, 4096 keys, ms per token, two
/// runs each): f16 8.9 -> 6.7-6.8, f32 15.4-15.7 -> 11.5-11.9, q8 4.7-5.0 -> 4.2-4.5 (GB/s:
/// f16 10.5 -> 14.0, f32 12.2 -> 16.1, q8 11.2 -> 12.4); 8, 16, 32 and 64 KiB ahead all
/// within the noise of each other. In the decoder (`kwk-eval generate`, SmolLM2-135M int8,
/// a 3,560-token prompt then 200 tokens, 1 thread, three interleaved pairs) generation
/// went 61-66 -> 71-77 tokens/s with an f16 cache, 48-50 -> 52-56 with f32, 88-91 -> 89-94
/// with q8, the prompts unchanged. A tile's own widened copy is not asked for ahead
/// ([`ScoreTile::streamed`]): hints past such a short buffer's end cost prompts at depth
/// with a q8 cache about 12 %; and only a tile's first 4-row pass asks (without that,
/// prompts with an f32 cache lost 7 %).
#[cfg(target_arch = "x86_64")]
const PREFETCH_L2_BYTES: usize = 16384;

/// Asks for the q8 key panel [`PREFETCH_L2_BYTES`] after `codes` (`dims` rows of 16 codes)
/// and its scales (`dims / 32` rows of 16 floats at `scales`, which run 8 times slower than
/// the codes: 4 bytes per 32 codes) into L2, for both vector tiers.
#[cfg(target_arch = "x86_64")]
fn prefetch_q8_panel_l2(codes: *const i8, scales: *const f32, dims: usize) {
    use super::prefetch_hint_l2;
    prefetch_hint_l2(
        (codes as *const u8).wrapping_add(PREFETCH_L2_BYTES),
        dims * PANEL_ROWS,
    );
    prefetch_hint_l2(
        (scales as *const u8).wrapping_add(PREFETCH_L2_BYTES / 8),
        dims / Q8_BLOCK * PANEL_ROWS * 4,
    );
}

/// Consecutive key panels of 16 positions each (see the module doc), `dims` rows per panel.
#[derive(Clone, Copy, Debug)]
pub enum KeyPanels<'a> {
    F32(&'a [f32]),
    /// IEEE half bits.
    F16(&'a [u16]),
    /// bfloat16 bits.
    Bf16(&'a [u16]),
    /// `codes`: `[panel][dims][16]`; `scales`: `[panel][dims/32][16]` (`dims` a multiple
    /// of 32).
    Q8 {
        codes: &'a [i8],
        scales: &'a [f32],
    },
}

/// Cached values (see the module doc), addressed by slot.
#[derive(Clone, Copy, Debug)]
pub enum ValueRows<'a> {
    /// The float32 value panels of one KV head: slot `j`, chunk `c` at `(c*cap + j)*16`.
    F32Panels { data: &'a [f32], cap: usize },
    /// `[slot][dims]` half bits.
    F16(&'a [u16]),
    /// `[slot][dims]` bfloat16 bits.
    Bf16(&'a [u16]),
    /// `codes`: `[slot][dims]`; `scales`: `[slot][dims/32]`.
    Q8 { codes: &'a [i8], scales: &'a [f32] },
}

/// Whether `keys` hold `n_panels` panels of `dims` (a q8 cache's `dims` a multiple of 32,
/// with its scales).
fn keys_hold(keys: KeyPanels<'_>, dims: usize, n_panels: usize) -> bool {
    let need = n_panels * dims * PANEL_ROWS;
    match keys {
        KeyPanels::F32(k) => k.len() >= need,
        KeyPanels::F16(k) | KeyPanels::Bf16(k) => k.len() >= need,
        KeyPanels::Q8 { codes, scales } => {
            dims.is_multiple_of(Q8_BLOCK)
                && codes.len() >= need
                && scales.len() >= n_panels * dims / Q8_BLOCK * PANEL_ROWS
        }
    }
}

/// Whether `values` hold every slot below `end` (`dims` each; a q8 cache's `dims` a
/// multiple of 32, with its scales).
fn values_hold(values: ValueRows<'_>, dims: usize, end: usize) -> bool {
    match values {
        ValueRows::F32Panels { data, cap } => {
            end <= cap && data.len() >= dims / PANEL_ROWS * cap * PANEL_ROWS
        }
        ValueRows::F16(v) | ValueRows::Bf16(v) => v.len() >= end * dims,
        ValueRows::Q8 { codes, scales } => {
            dims.is_multiple_of(Q8_BLOCK)
                && codes.len() >= end * dims
                && scales.len() >= end * dims / Q8_BLOCK
        }
    }
}

/// Query rows and where the scores go: `q` holds `rows` rows `q_ld` apart (each at least
/// `dims` long), `out` `rows` rows `out_ld` apart.
pub struct ScoreTile<'a> {
    pub q: &'a [f32],
    pub q_ld: usize,
    pub rows: usize,
    pub out: &'a mut [f32],
    pub out_ld: usize,
    /// Whether the operand is a cache read in order, going on past this call: the vector
    /// tiers then also ask for it `PREFETCH_L2_BYTES` ahead, on their first pass of up to
    /// 4 rows (not for a tile's own widened copy, which ends with the call).
    pub streamed: bool,
}

/// `out[r][16p + j] = q[r] · key(p, j)` for the `n_panels` panels of `keys` (`dims` values
/// per key; a q8 key's blocks scaled by their scale).
pub fn key_scores(isa: Isa, keys: KeyPanels<'_>, dims: usize, n_panels: usize, t: ScoreTile<'_>) {
    assert!(
        keys_hold(keys, dims, n_panels),
        "key panels shorter than {n_panels} panels of {dims}"
    );
    assert!(t.rows == 0 || t.q.len() >= (t.rows - 1) * t.q_ld + dims);
    assert!(t.rows == 0 || t.out.len() >= (t.rows - 1) * t.out_ld + n_panels * PANEL_ROWS);
    assert!(t.out_ld >= n_panels * PANEL_ROWS && t.q_ld >= dims);
    match isa {
        #[cfg(target_arch = "x86_64")]
        _ if isa.has_avx512() => avx512::key_scores(keys, dims, n_panels, t),
        #[cfg(target_arch = "x86_64")]
        _ if isa.is_avx2_class() => avx2::key_scores(keys, dims, n_panels, t),
        _ => scalar::key_scores(keys, dims, n_panels, t),
    }
}

/// Probabilities and the output they accumulate into: `p` holds `rows` rows `p_ld` apart
/// (entry `j` of a row weighs slot `slots.start + j`), `out` `rows` rows `out_ld` apart
/// (each at least `dims` long).
pub struct ValueTile<'a> {
    pub p: &'a [f32],
    pub p_ld: usize,
    pub rows: usize,
    pub out: &'a mut [f32],
    pub out_ld: usize,
    /// As [`ScoreTile::streamed`].
    pub streamed: bool,
}

/// `out[r][d] += Σ_j p[r][j] · value(slots.start + j)[d]` for `d < dims` (`dims` a
/// multiple of 16).
pub fn accumulate_values(
    isa: Isa,
    values: ValueRows<'_>,
    dims: usize,
    slots: Range<usize>,
    t: ValueTile<'_>,
) {
    assert!(dims.is_multiple_of(PANEL_ROWS));
    assert!(
        values_hold(values, dims, slots.end),
        "values shorter than slots {slots:?} of {dims}"
    );
    let n = slots.len();
    assert!(t.rows == 0 || t.p.len() >= (t.rows - 1) * t.p_ld + n);
    assert!(t.rows == 0 || t.out.len() >= (t.rows - 1) * t.out_ld + dims);
    assert!(t.p_ld >= n && t.out_ld >= dims);
    match isa {
        #[cfg(target_arch = "x86_64")]
        _ if isa.has_avx512() => avx512::accumulate_values(values, dims, slots, t),
        #[cfg(target_arch = "x86_64")]
        _ if isa.is_avx2_class() => avx2::accumulate_values(values, dims, slots, t),
        _ => scalar::accumulate_values(values, dims, slots, t),
    }
}

/// Widens the `n_panels` key panels of `keys` to float32 in the same layout
/// (`out[(p * dims + d) * 16 + lane]`), a q8 code times its block's scale: what a tile of
/// many query rows reads instead of widening each key once per pass of a few rows.
pub fn widen_key_panels(
    isa: Isa,
    keys: KeyPanels<'_>,
    dims: usize,
    n_panels: usize,
    out: &mut [f32],
) {
    let need = n_panels * dims * PANEL_ROWS;
    assert!(
        keys_hold(keys, dims, n_panels) && out.len() >= need,
        "key panels or output shorter than {n_panels} panels of {dims}"
    );
    match isa {
        #[cfg(target_arch = "x86_64")]
        _ if isa.has_avx512() => avx512::widen_key_panels(keys, dims, n_panels, out),
        #[cfg(target_arch = "x86_64")]
        _ if isa.is_avx2_class() => avx2::widen_key_panels(keys, dims, n_panels, out),
        _ => scalar::widen_key_panels(keys, dims, n_panels, out),
    }
}

/// Widens the values of `slots` to float32 value panels of `slots.len()` slots
/// (`out[(c * n + i) * 16 + lane]` holds dimension `16c + lane` of slot `slots.start + i`,
/// what [`ValueRows::F32Panels`] with `cap = n` reads), a q8 code times its block's scale.
pub fn widen_values(
    isa: Isa,
    values: ValueRows<'_>,
    dims: usize,
    slots: Range<usize>,
    out: &mut [f32],
) {
    assert!(dims.is_multiple_of(PANEL_ROWS));
    assert!(
        values_hold(values, dims, slots.end) && out.len() >= slots.len() * dims,
        "values or output shorter than slots {slots:?} of {dims}"
    );
    match isa {
        #[cfg(target_arch = "x86_64")]
        _ if isa.has_avx512() => avx512::widen_values(values, dims, slots, out),
        #[cfg(target_arch = "x86_64")]
        _ if isa.is_avx2_class() => avx2::widen_values(values, dims, slots, out),
        _ => scalar::widen_values(values, dims, slots, out),
    }
}

/// Quantizes `x` (a multiple of 32 long) to q8 blocks of 32: per block `scale = max|x| /
/// 127` (0 for a zero block) and `code = round(x / scale)`, so that `|x - code·scale| <=
/// scale / 2`. Non-finite values give a NaN scale (the block reads back as NaN, never as
/// finite numbers that hide it).
pub fn quantize_q8_blocks(x: &[f32], codes: &mut [i8], scales: &mut [f32]) {
    for ((xb, cb), s) in x
        .chunks_exact(Q8_BLOCK)
        .zip(codes.chunks_exact_mut(Q8_BLOCK))
        .zip(scales.iter_mut())
    {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        if !xb.iter().all(|v| v.is_finite()) {
            *s = f32::NAN;
            cb.fill(0);
            continue;
        }
        let scale = amax / 127.0;
        *s = scale;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        for (c, &v) in cb.iter_mut().zip(xb) {
            *c = (v * inv).round().clamp(-127.0, 127.0) as i8;
        }
    }
}

/// Where a value chunk lives for the vector tiers' P·V tiles: slot `j`, chunk `c` at
/// `c * chunk + j * slot`, and a q8 slot's scales `[dims/32]` at `j * blocks`.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct ValueGeometry {
    chunk: usize,
    slot: usize,
    chunks: usize,
    blocks: usize,
    p_ld: usize,
    out_ld: usize,
    /// [`ValueTile::streamed`].
    streamed: bool,
}

#[cfg(target_arch = "x86_64")]
impl ValueGeometry {
    /// The geometry of `values` (`dims` head dimensions) for tile `t`.
    fn new(values: &ValueRows<'_>, dims: usize, t: &ValueTile<'_>) -> Self {
        ValueGeometry {
            p_ld: t.p_ld,
            out_ld: t.out_ld,
            streamed: t.streamed,
            ..Self::of_values(values, dims)
        }
    }

    /// The geometry of `values` alone (no weights, no output rows).
    fn of_values(values: &ValueRows<'_>, dims: usize) -> Self {
        let (chunk, slot) = match values {
            ValueRows::F32Panels { cap, .. } => (cap * PANEL_ROWS, PANEL_ROWS),
            _ => (PANEL_ROWS, dims),
        };
        ValueGeometry {
            chunk,
            slot,
            chunks: dims / PANEL_ROWS,
            blocks: dims / Q8_BLOCK,
            p_ld: 0,
            out_ld: 0,
            streamed: false,
        }
    }
}

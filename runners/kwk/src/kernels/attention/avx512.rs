//! AVX-512 twin of `scalar.rs` (the `avx512bw`, `vnni` and `amx` tiers): a key panel's 16
//! positions fill one zmm, so a score tile is up to 4 query rows x 2 accumulators (even and
//! odd dimensions, for two independent FMA chains per row); P·V runs slot by slot over up
//! to 4 chunks of 16 head dimensions (one zmm each) per row, so each slot's values are
//! read once for all rows, and a q8 value is scaled once, not per row. f16 is widened by
//! `vcvtph2ps`, bf16 by a 16-bit shift, int8 by `vpmovsxbd` + `vcvtdq2ps`, in registers.
//! Keys and values are asked for [`PREFETCH_BYTES`] ahead of where they are read (into L1)
//! and [`PREFETCH_L2_BYTES`] ahead (into L2).
//!
//! Reached only through `kernels::attention`, which checked the CPU features (through
//! [`crate::kernels::active_isa`]) and every slice bound.

use super::{
    prefetch_q8_panel_l2, KeyPanels, ScoreTile, ValueGeometry, ValueRows, ValueTile,
    PREFETCH_BYTES, PREFETCH_L2_BYTES, Q8_BLOCK,
};
use crate::kernels::x86_64::{prefetch_line, prefetch_line_l2};
use crate::kernels::{prefetch_hint, prefetch_hint_l2, PANEL_ROWS};
use std::arch::x86_64::*;
use std::ops::Range;

fn assert_features() {
    debug_assert!(
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("fma")
    );
}

/// 16 float32 lanes from 16 stored elements of each kind.
trait Lanes: Copy {
    /// # Safety
    /// AVX-512 F; `p` valid for 16 elements.
    unsafe fn load16(p: *const Self) -> __m512;
}

impl Lanes for f32 {
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> __m512 {
        // SAFETY: the caller guarantees 16 readable values and AVX-512 F.
        unsafe { _mm512_loadu_ps(p) }
    }
}

/// IEEE half bits.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct F16(u16);

impl Lanes for F16 {
    #[inline(always)]
    unsafe fn load16(p: *const F16) -> __m512 {
        // SAFETY: as above (32 bytes).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
}

/// bfloat16 bits.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Bf16(u16);

impl Lanes for Bf16 {
    #[inline(always)]
    unsafe fn load16(p: *const Bf16) -> __m512 {
        // SAFETY: as above (32 bytes).
        unsafe {
            let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
        }
    }
}

impl Lanes for i8 {
    #[inline(always)]
    unsafe fn load16(p: *const i8) -> __m512 {
        // SAFETY: as above (16 bytes).
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i))) }
    }
}

/// See [`super::key_scores`].
pub fn key_scores(keys: KeyPanels<'_>, dims: usize, n_panels: usize, t: ScoreTile<'_>) {
    assert_features();
    let q = t.q.as_ptr();
    let out = t.out.as_mut_ptr();
    let (q_ld, out_ld) = (t.q_ld, t.out_ld);
    let mut r0 = 0;
    while r0 < t.rows {
        let nr = (t.rows - r0).min(4);
        // SAFETY: AVX-512 checked by the dispatcher (and above in debug builds); the bounds
        // of every panel, query row and score row were checked by `super::key_scores`.
        unsafe {
            let (q, out) = (q.add(r0 * q_ld), out.add(r0 * out_ld));
            let g = Geometry {
                dims,
                n_panels,
                q_ld,
                out_ld,
                // The far hints on the first pass only: later passes read what it read.
                streamed: t.streamed && r0 == 0,
            };
            match keys {
                KeyPanels::F32(k) => scores_rows::<f32>(k.as_ptr(), g, nr, q, out),
                KeyPanels::F16(k) => scores_rows::<F16>(k.as_ptr() as *const F16, g, nr, q, out),
                KeyPanels::Bf16(k) => scores_rows::<Bf16>(k.as_ptr() as *const Bf16, g, nr, q, out),
                KeyPanels::Q8 { codes, scales } => {
                    scores_q8_rows(codes.as_ptr(), scales.as_ptr(), g, nr, q, out)
                }
            }
        }
        r0 += 4;
    }
}

/// The shape of a score tile.
#[derive(Clone, Copy)]
struct Geometry {
    dims: usize,
    n_panels: usize,
    q_ld: usize,
    out_ld: usize,
    /// [`super::ScoreTile::streamed`].
    streamed: bool,
}

/// Scores of `nr` (1..=4) rows.
///
/// # Safety
/// AVX-512 F; the bounds of [`super::key_scores`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn scores_rows<T: Lanes>(k: *const T, g: Geometry, nr: usize, q: *const f32, out: *mut f32) {
    // SAFETY: forwarded.
    unsafe {
        match nr {
            4 => scores_tile::<T, 4>(k, g, q, out),
            3 => scores_tile::<T, 3>(k, g, q, out),
            2 => scores_tile::<T, 2>(k, g, q, out),
            _ => scores_tile::<T, 1>(k, g, q, out),
        }
    }
}

/// # Safety
/// As [`scores_rows`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn scores_tile<T: Lanes, const R: usize>(
    k: *const T,
    g: Geometry,
    q: *const f32,
    out: *mut f32,
) {
    let dims = g.dims;
    for p in 0..g.n_panels {
        // SAFETY: panel `p` holds `dims` rows of 16 keys; query rows hold `dims` values.
        unsafe {
            let kp = k.add(p * dims * PANEL_ROWS);
            prefetch_hint(
                (kp as *const u8).wrapping_add(PREFETCH_BYTES),
                dims * PANEL_ROWS * std::mem::size_of::<T>(),
            );
            if g.streamed {
                prefetch_hint_l2(
                    (kp as *const u8).wrapping_add(PREFETCH_L2_BYTES),
                    dims * PANEL_ROWS * std::mem::size_of::<T>(),
                );
            }
            let mut even = [_mm512_setzero_ps(); R];
            let mut odd = [_mm512_setzero_ps(); R];
            let mut d = 0;
            while d + 2 <= dims {
                let k0 = T::load16(kp.add(d * PANEL_ROWS));
                let k1 = T::load16(kp.add((d + 1) * PANEL_ROWS));
                for (r, (e, o)) in even.iter_mut().zip(odd.iter_mut()).enumerate() {
                    let qr = q.add(r * g.q_ld + d);
                    *e = _mm512_fmadd_ps(_mm512_set1_ps(*qr), k0, *e);
                    *o = _mm512_fmadd_ps(_mm512_set1_ps(*qr.add(1)), k1, *o);
                }
                d += 2;
            }
            if d < dims {
                let k0 = T::load16(kp.add(d * PANEL_ROWS));
                for (r, e) in even.iter_mut().enumerate() {
                    let qv = _mm512_set1_ps(*q.add(r * g.q_ld + d));
                    *e = _mm512_fmadd_ps(qv, k0, *e);
                }
            }
            for (r, (e, o)) in even.iter().zip(&odd).enumerate() {
                _mm512_storeu_ps(
                    out.add(r * g.out_ld + p * PANEL_ROWS),
                    _mm512_add_ps(*e, *o),
                );
            }
        }
    }
}

/// q8 scores of `nr` (1..=4) rows.
///
/// # Safety
/// As [`scores_rows`], with `scales` holding `[panel][dims/32][16]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn scores_q8_rows(
    k: *const i8,
    s: *const f32,
    g: Geometry,
    nr: usize,
    q: *const f32,
    out: *mut f32,
) {
    // SAFETY: forwarded.
    unsafe {
        match nr {
            4 => scores_q8_tile::<4>(k, s, g, q, out),
            3 => scores_q8_tile::<3>(k, s, g, q, out),
            2 => scores_q8_tile::<2>(k, s, g, q, out),
            _ => scores_q8_tile::<1>(k, s, g, q, out),
        }
    }
}

/// # Safety
/// As [`scores_q8_rows`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn scores_q8_tile<const R: usize>(
    k: *const i8,
    s: *const f32,
    g: Geometry,
    q: *const f32,
    out: *mut f32,
) {
    let (dims, blocks) = (g.dims, g.dims / Q8_BLOCK);
    for p in 0..g.n_panels {
        // SAFETY: panel `p` holds `dims` rows of 16 codes and `blocks` rows of 16 scales.
        unsafe {
            let kp = k.add(p * dims * PANEL_ROWS);
            let sp = s.add(p * blocks * PANEL_ROWS);
            prefetch_hint(
                (kp as *const u8).wrapping_add(PREFETCH_BYTES),
                dims * PANEL_ROWS,
            );
            if g.streamed {
                prefetch_q8_panel_l2(kp, sp, dims);
            }
            // The scales run 8 times slower than the codes (4 bytes per 32 codes).
            prefetch_hint(
                (sp as *const u8).wrapping_add(PREFETCH_BYTES / 8),
                blocks * PANEL_ROWS * 4,
            );
            let mut acc = [_mm512_setzero_ps(); R];
            for b in 0..blocks {
                let mut even = [_mm512_setzero_ps(); R];
                let mut odd = [_mm512_setzero_ps(); R];
                let mut d = b * Q8_BLOCK;
                while d < (b + 1) * Q8_BLOCK {
                    let k0 = i8::load16(kp.add(d * PANEL_ROWS));
                    let k1 = i8::load16(kp.add((d + 1) * PANEL_ROWS));
                    for (r, (e, o)) in even.iter_mut().zip(odd.iter_mut()).enumerate() {
                        let qr = q.add(r * g.q_ld + d);
                        *e = _mm512_fmadd_ps(_mm512_set1_ps(*qr), k0, *e);
                        *o = _mm512_fmadd_ps(_mm512_set1_ps(*qr.add(1)), k1, *o);
                    }
                    d += 2;
                }
                let scale = _mm512_loadu_ps(sp.add(b * PANEL_ROWS));
                for (a, (e, o)) in acc.iter_mut().zip(even.iter().zip(&odd)) {
                    *a = _mm512_fmadd_ps(scale, _mm512_add_ps(*e, *o), *a);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(out.add(r * g.out_ld + p * PANEL_ROWS), *a);
            }
        }
    }
}

/// See [`super::accumulate_values`].
pub fn accumulate_values(
    values: ValueRows<'_>,
    dims: usize,
    slots: Range<usize>,
    t: ValueTile<'_>,
) {
    assert_features();
    let g = ValueGeometry::new(&values, dims, &t);
    let (p, out) = (t.p.as_ptr(), t.out.as_mut_ptr());
    let mut r0 = 0;
    while r0 < t.rows {
        let nr = (t.rows - r0).min(4);
        // SAFETY: AVX-512 checked by the dispatcher; the bounds of the values (slots below
        // `slots.end`), the weights and the output rows were checked by the dispatcher.
        unsafe {
            let (p, out) = (p.add(r0 * t.p_ld), out.add(r0 * t.out_ld));
            // As in `key_scores`: the far hints on the first pass only.
            let g = ValueGeometry {
                streamed: g.streamed && r0 == 0,
                ..g
            };
            match values {
                ValueRows::F32Panels { data, .. } => {
                    values_rows::<f32>(data.as_ptr(), None, g, &slots, nr, p, out)
                }
                ValueRows::F16(v) => {
                    values_rows::<F16>(v.as_ptr() as *const F16, None, g, &slots, nr, p, out)
                }
                ValueRows::Bf16(v) => {
                    values_rows::<Bf16>(v.as_ptr() as *const Bf16, None, g, &slots, nr, p, out)
                }
                ValueRows::Q8 { codes, scales } => {
                    let s = Some(scales.as_ptr());
                    values_rows::<i8>(codes.as_ptr(), s, g, &slots, nr, p, out)
                }
            }
        }
        r0 += 4;
    }
}

/// `nr` (1..=4) rows of P·V.
///
/// # Safety
/// AVX-512 F; the bounds of [`super::accumulate_values`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn values_rows<T: Lanes>(
    v: *const T,
    s: Option<*const f32>,
    g: ValueGeometry,
    slots: &Range<usize>,
    nr: usize,
    p: *const f32,
    out: *mut f32,
) {
    // SAFETY: forwarded.
    unsafe {
        match nr {
            4 => values_tile::<T, 4>(v, s, g, slots, p, out),
            3 => values_tile::<T, 3>(v, s, g, slots, p, out),
            2 => values_tile::<T, 2>(v, s, g, slots, p, out),
            _ => values_tile::<T, 1>(v, s, g, slots, p, out),
        }
    }
}

/// Chunks of 16 head dimensions a P·V pass holds per row (`R * VALUE_CHUNKS`
/// accumulators).
const VALUE_CHUNKS: usize = 4;

/// # Safety
/// As [`values_rows`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn values_tile<T: Lanes, const R: usize>(
    v: *const T,
    s: Option<*const f32>,
    g: ValueGeometry,
    slots: &Range<usize>,
    p: *const f32,
    out: *mut f32,
) {
    let mut c0 = 0;
    // SAFETY: forwarded.
    unsafe {
        while c0 + VALUE_CHUNKS <= g.chunks {
            values_pass::<T, R, VALUE_CHUNKS>(v, s, g, slots, c0, p, out);
            c0 += VALUE_CHUNKS;
        }
        while c0 < g.chunks {
            values_pass::<T, R, 1>(v, s, g, slots, c0, p, out);
            c0 += 1;
        }
    }
}

/// Chunks `c0..c0 + C` of `R` rows of P·V, slot by slot: each slot's `C` chunks are read
/// once (a q8 chunk times its block's scale) and serve every row.
///
/// # Safety
/// As [`values_rows`], with `c0 + C <= g.chunks`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn values_pass<T: Lanes, const R: usize, const C: usize>(
    v: *const T,
    s: Option<*const f32>,
    g: ValueGeometry,
    slots: &Range<usize>,
    c0: usize,
    p: *const f32,
    out: *mut f32,
) {
    let (j0, n) = (slots.start, slots.len());
    // SAFETY: chunks `c0..c0 + C` of every slot in `slots` lie inside the values (and their
    // scales); output rows hold `chunks * 16` values; weight rows hold `n` values.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        for (r, a) in acc.iter_mut().enumerate() {
            for (c, x) in a.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(out.add(r * g.out_ld + (c0 + c) * PANEL_ROWS));
            }
        }
        for i in 0..n {
            let at = |c: usize| v.add((c0 + c) * g.chunk + (j0 + i) * g.slot);
            for c in 0..C {
                prefetch_line((at(c) as *const u8).wrapping_add(PREFETCH_BYTES));
                if g.streamed {
                    prefetch_line_l2((at(c) as *const u8).wrapping_add(PREFETCH_L2_BYTES));
                }
            }
            let mut x = [_mm512_setzero_ps(); C];
            for (c, xc) in x.iter_mut().enumerate() {
                *xc = T::load16(at(c));
                if let Some(s) = s {
                    let b = (j0 + i) * g.blocks + (c0 + c) * PANEL_ROWS / Q8_BLOCK;
                    *xc = _mm512_mul_ps(*xc, _mm512_set1_ps(*s.add(b)));
                }
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let w = _mm512_set1_ps(*p.add(r * g.p_ld + i));
                for (ac, xc) in a.iter_mut().zip(&x) {
                    *ac = _mm512_fmadd_ps(w, *xc, *ac);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            for (c, x) in a.iter().enumerate() {
                _mm512_storeu_ps(out.add(r * g.out_ld + (c0 + c) * PANEL_ROWS), *x);
            }
        }
    }
}

/// See [`super::widen_key_panels`].
pub fn widen_key_panels(keys: KeyPanels<'_>, dims: usize, n_panels: usize, out: &mut [f32]) {
    assert_features();
    let n = n_panels * dims * PANEL_ROWS;
    let o = out.as_mut_ptr();
    // SAFETY: AVX-512 checked by the dispatcher; `super::widen_key_panels` checked that the
    // panels and `out` hold `n` values (and the q8 scales theirs).
    unsafe {
        match keys {
            KeyPanels::F32(k) => widen_run::<f32>(k.as_ptr(), n, o),
            KeyPanels::F16(k) => widen_run::<F16>(k.as_ptr() as *const F16, n, o),
            KeyPanels::Bf16(k) => widen_run::<Bf16>(k.as_ptr() as *const Bf16, n, o),
            KeyPanels::Q8 { codes, scales } => {
                widen_q8_panels(codes.as_ptr(), scales.as_ptr(), dims, n_panels, o)
            }
        }
    }
}

/// `n` (a multiple of 16) stored elements to float32.
///
/// # Safety
/// AVX-512 F; `src` and `out` valid for `n` elements.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn widen_run<T: Lanes>(src: *const T, n: usize, out: *mut f32) {
    // SAFETY: the caller's bounds.
    unsafe {
        for i in (0..n).step_by(PANEL_ROWS) {
            _mm512_storeu_ps(out.add(i), T::load16(src.add(i)));
        }
    }
}

/// q8 key panels to float32: each row of 16 codes times its block's 16 scales.
///
/// # Safety
/// AVX-512 F; the bounds of [`super::widen_key_panels`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn widen_q8_panels(
    k: *const i8,
    s: *const f32,
    dims: usize,
    n_panels: usize,
    out: *mut f32,
) {
    let blocks = dims / Q8_BLOCK;
    // SAFETY: the caller's bounds.
    unsafe {
        for p in 0..n_panels {
            for d in 0..dims {
                let at = (p * dims + d) * PANEL_ROWS;
                let scale = _mm512_loadu_ps(s.add((p * blocks + d / Q8_BLOCK) * PANEL_ROWS));
                _mm512_storeu_ps(out.add(at), _mm512_mul_ps(i8::load16(k.add(at)), scale));
            }
        }
    }
}

/// See [`super::widen_values`].
pub fn widen_values(values: ValueRows<'_>, dims: usize, slots: Range<usize>, out: &mut [f32]) {
    assert_features();
    let g = ValueGeometry::of_values(&values, dims);
    let o = out.as_mut_ptr();
    // SAFETY: AVX-512 checked by the dispatcher; `super::widen_values` checked the bounds
    // of the values of `slots` and of `out`.
    unsafe {
        match values {
            ValueRows::F32Panels { data, .. } => {
                widen_slots::<f32>(data.as_ptr(), None, g, &slots, o)
            }
            ValueRows::F16(v) => widen_slots::<F16>(v.as_ptr() as *const F16, None, g, &slots, o),
            ValueRows::Bf16(v) => {
                widen_slots::<Bf16>(v.as_ptr() as *const Bf16, None, g, &slots, o)
            }
            ValueRows::Q8 { codes, scales } => {
                widen_slots::<i8>(codes.as_ptr(), Some(scales.as_ptr()), g, &slots, o)
            }
        }
    }
}

/// The values of `slots` into float32 value panels of `slots.len()` slots.
///
/// # Safety
/// AVX-512 F; the bounds of [`super::widen_values`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn widen_slots<T: Lanes>(
    v: *const T,
    s: Option<*const f32>,
    g: ValueGeometry,
    slots: &Range<usize>,
    out: *mut f32,
) {
    let n = slots.len();
    // SAFETY: the caller's bounds.
    unsafe {
        for (i, j) in slots.clone().enumerate() {
            for c in 0..g.chunks {
                let mut x = T::load16(v.add(c * g.chunk + j * g.slot));
                if let Some(s) = s {
                    let b = j * g.blocks + c * PANEL_ROWS / Q8_BLOCK;
                    x = _mm512_mul_ps(x, _mm512_set1_ps(*s.add(b)));
                }
                _mm512_storeu_ps(out.add((c * n + i) * PANEL_ROWS), x);
            }
        }
    }
}

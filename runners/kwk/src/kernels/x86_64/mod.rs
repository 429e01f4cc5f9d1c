//! x86-64 SIMD float kernels (AVX2 in `avx2.rs`, AVX-512 in `avx512.rs`), each the twin of
//! a specification in `kernels/scalar.rs` and reached through `kernels/mod.rs`, which
//! checks the CPU features ([`super::active_isa`]) and the slice bounds; and what they
//! share (the vector `exp`'s constants, the prefetch). The quantized kernels' tiers live in
//! `kernels/quant/`.

pub mod avx2;
pub mod avx512;

/// The `amx` tier's module under its former path (the roofline reads its `tdpbssd` loop).
pub use super::quant::amx;

/// The operands of a SIMD panel kernel, as raw pointers: panels from `w`, `panel_bytes`
/// apart, `cols` columns each; activation rows from `x`, `ldx` elements apart. Made from a
/// [`super::PanelOperands`] whose bounds the dispatcher checked.
#[derive(Clone, Copy)]
pub(crate) struct RawPanels {
    pub(crate) w: *const u8,
    pub(crate) panel_bytes: usize,
    pub(crate) cols: usize,
    pub(crate) x: *const u8,
    pub(crate) ldx: usize,
}

impl RawPanels {
    /// `op`'s operands with elements of `elem` bytes.
    pub(crate) fn new<T>(op: &super::PanelOperands<T>, elem: usize) -> RawPanels {
        RawPanels {
            w: op.w.as_ptr() as *const u8,
            panel_bytes: op.panel_stride * elem,
            cols: op.cols,
            x: op.x.as_ptr() as *const u8,
            ldx: op.ldx,
        }
    }

    /// The same operands from weight pointer `w` and activation pointer `x` on (a tile's
    /// first panel and token).
    pub(crate) fn at(self, w: *const u8, x: *const u8) -> RawPanels {
        RawPanels { w, x, ..self }
    }
}

/// Where a register tile writes: tokens from `t0`, rows `r0..r0 + valid`.
#[derive(Clone, Copy)]
pub(crate) struct TileSpot {
    pub(crate) t0: usize,
    pub(crate) r0: usize,
    pub(crate) valid: usize,
}

/// The vector `exp` of the AVX2 and AVX-512 files (Cephes `expf`): inputs clamped to
/// `[EXP_MIN, EXP_MAX]`, `n = round(x · log2 e)`, `r = x − n·ln2` in two parts
/// ([`EXP_LN2_HI`], [`EXP_LN2_LO`]), `e^r ≈ 1 + r + r²·P(r)` with `P`'s coefficients
/// [`EXP_POLY`] (highest first), then scaled by `2^n`.
pub(crate) const EXP_MAX: f32 = 88.722_83;
pub(crate) const EXP_MIN: f32 = -103.9;
pub(crate) const EXP_LN2_HI: f32 = 0.693_359_4;
pub(crate) const EXP_LN2_LO: f32 = -2.121_944_4e-4;
pub(crate) const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// Prefetches (into L1) the cache line holding `at`, which need not be valid to read.
#[inline(always)]
pub(crate) fn prefetch_line(at: *const u8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: SSE is part of the x86-64 baseline; a prefetch reads nothing and never
    // faults, whatever the address.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(at as *const i8) };
}

//! x86-64 SIMD float kernels (AVX2 in `avx2.rs`, AVX-512 in `avx512.rs`), each the twin of
//! a specification in `kernels/scalar.rs` and reached through `kernels/mod.rs`, which
//! checks the CPU features ([`super::active_isa`]) and the slice bounds; and what they
//! share (the vector `exp`'s constants, the prefetch, the FFN gate's kind). The quantized
//! kernels' tiers live in `kernels/quant/`.
//!
//! The panel drivers and register tiles (`gemm_panels`, `tile_dispatch`, `tile`) take their
//! operands as separate pointers and sizes, with `#[allow(clippy::too_many_arguments)]`: the
//! same code taking them as two structs passed by value compiled to a float32 prompt tile
//! 2.5x slower (`quant_kernel_bench float32`, one thread, 512 tokens, Zen 4: 55 -> 22 GMAC/s,
//! the AVX2 tier unaffected), so the structs stop at the public entry points.

pub mod avx2;
pub mod avx512;

/// The `amx` tier's module under its former path (the roofline reads its `tdpbssd` loop).
pub use super::quant::amx;

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

/// Prefetches into L2 (and L3), not L1, the cache line holding `at`, which need not be
/// valid to read: for reads further ahead than L1's fill buffers can keep in flight.
#[inline(always)]
pub(crate) fn prefetch_line_l2(at: *const u8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    // SAFETY: as in `prefetch_line`.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(at as *const i8) };
}

/// Prefetches (into L1) the cache line holding `at`, which need not be valid to read.
#[inline(always)]
pub(crate) fn prefetch_line(at: *const u8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: SSE is part of the x86-64 baseline; a prefetch reads nothing and never
    // faults, whatever the address.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(at as *const i8) };
}

/// The FFN's gate activations: both are `act(x)·u = x·u / (1 + e^(−a))`, with `a = x`
/// (SiLU) or `a = 2z` (GELU-tanh, [`crate::kernels::scalar::GELU_2C`]).
#[derive(Clone, Copy)]
pub(crate) enum Gate {
    Silu,
    GeluTanh,
}

//! x86-64 SIMD kernels (the crate's `unsafe`), each the twin of a scalar specification:
//! float kernels of `kernels/scalar.rs` (reached through `kernels/mod.rs`), and the
//! quantized tiles of the tiers without 512-bit VNNI (`quant256`: AVX2 and 256-bit VNNI;
//! `quant512bw`: AVX-512BW), twins of `int8_tile_scalar` / `lowbit_tile_scalar` and reached
//! through `int8_matmul` / `int4_matmul`; `baseline`, the scalar tier's quantized block
//! dots with SSE2 (every x86-64 CPU has it; twin `quant_portable::F32Dots`); `amx`, the
//! `amx` tier's int8 prompt tiles on AMX (twin `int8_tile_scalar`; with the roofline's
//! `tdpbssd` loop, `tdpbssd_peak`). The roofline's other loops live in `roofline/`. The dispatchers
//! check the CPU features ([`super::active_isa`], `QuantIsa::is_available`) and the slice
//! bounds.

pub mod amx;
pub mod avx2;
pub mod avx512;
pub mod baseline;
pub mod quant256;
pub mod quant512bw;

use super::GEMV_PREFETCH_BYTES;

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

/// Prefetches (into L1) the tile [`GEMV_PREFETCH_BYTES`] after `tile` (`bytes`, a multiple
/// of 64): the quantized SIMD GEMVs ask for their weights as far ahead as the float ones,
/// whatever their tile size. Addresses past the matrix are harmless: a prefetch is a hint
/// and never faults.
///
/// Measured on Zen 4, `speed --precision int8 --pp 1 --tg 64`, 2 threads, tokens/s (int8
/// tiles of 512 bytes): `avx512bw` 2 KiB ahead 136, 4 KiB 122, 8 KiB 119, none 105; `avx2`
/// 2 KiB 97, none 87. The hardware prefetcher alone leaves kernels that spend several
/// instructions per weight byte short of the read bandwidth; the `vpdpbusd` zmm kernels
/// measured slower with it (int8 128 vs 155), so they do not prefetch. The distance was
/// 4 tiles until 4-bit codes (256-byte tiles, so 1 KiB ahead) were measured against 2 KiB
/// on an AMD Zen 5 (`speed --precision int4 --pp 0 --tg 128 --reps 3`, 2 threads,
/// interleaved rounds, tokens/s): `avxvnni` 359/390/423/322/338/298/349/342 ->
/// 395/460/440/370/340/319/371/436 (ahead by 4 KiB: 396/437/428), `avx2`
/// 345/323/296 -> 371/337/330. The 256-bit prompt sub-tiles prefetch only on a row
/// group's first pass (token 0): the later passes find the group's tiles in cache.
#[inline(always)]
pub(crate) fn prefetch_ahead(tile: *const u8, bytes: usize) {
    let ahead = tile.wrapping_add(GEMV_PREFETCH_BYTES);
    for line in (0..bytes).step_by(64) {
        prefetch_line(ahead.wrapping_add(line));
    }
}

/// Prefetches (into L1) the cache line holding `at`, which need not be valid to read.
#[inline(always)]
pub(crate) fn prefetch_line(at: *const u8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: SSE is part of the x86-64 baseline; a prefetch reads nothing and never
    // faults, whatever the address.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(at as *const i8) };
}

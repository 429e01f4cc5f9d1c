//! x86-64 SIMD kernels (the crate's `unsafe`), each the twin of a scalar specification:
//! float kernels of `kernels/scalar.rs` (reached through `kernels/mod.rs`), and the
//! quantized tiles of the tiers without 512-bit VNNI (`quant256`: AVX2 and 256-bit VNNI;
//! `quant512bw`: AVX-512BW), twins of `int8_tile_scalar` / `lowbit_tile_scalar` and reached
//! through `int8_matmul` / `int4_matmul`. The dispatchers check the CPU features
//! ([`super::active_isa`], `QuantIsa::is_available`) and the slice bounds.

pub mod avx2;
pub mod avx512;
pub mod quant256;
pub mod quant512bw;

//! x86-64 SIMD kernels (the crate's `unsafe`), each the twin of a function in
//! `kernels/scalar.rs`. Callers reach them only through the dispatchers in `kernels/mod.rs`,
//! which check the CPU features once ([`super::active_isa`]) and the slice bounds.

pub mod avx2;
pub mod avx512;

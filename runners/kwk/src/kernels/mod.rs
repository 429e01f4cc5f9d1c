//! Compute kernels. `scalar.rs` is the specification; `x86_64/` holds the AVX2 and AVX-512
//! versions (the only `unsafe` in the crate), chosen once at run time.

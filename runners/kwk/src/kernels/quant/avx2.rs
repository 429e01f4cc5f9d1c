//! The `avx2` tier's quantized tiles (AVX2 + FMA + F16C: `vpmaddubsw` + `vpmaddwd` on ymm,
//! full bytes through the sign trick; prompts of 8-bit codes on i16 pairs): the 256-bit
//! source of `ymm.rs` and `ymm_lowbit.rs` compiled with these features. Twins: `spec.rs`
//! (the tests hold every entry point to it bit for bit).

crate::kernels::quant::ymm::ymm_tier!("avx2,fma,f16c", sign_trick);

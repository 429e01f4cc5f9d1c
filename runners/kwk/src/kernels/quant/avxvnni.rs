//! The `avxvnni` tier's quantized tiles: 256-bit `vpdpbusd`, the source of `ymm.rs` and
//! `ymm_lowbit.rs` compiled twice, once per encoding of the instruction. The dispatcher
//! runs [`vex`] where the CPU has AVX-VNNI and [`evex`] otherwise (AVX512-VNNI + VL), so the
//! tier's logic is tested on every CPU with either extension. Twins: `spec.rs`.

/// `vpdpbusd` ymm in its VEX encoding (AVX-VNNI: Alder Lake and later).
pub mod vex {
    crate::kernels::quant::ymm::ymm_tier!("avx2,fma,f16c,avxvnni", dpbusd _mm256_dpbusd_avx_epi32);
}

/// `vpdpbusd` ymm in its EVEX encoding (AVX512-VNNI + VL).
pub mod evex {
    crate::kernels::quant::ymm::ymm_tier!(
        "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
        dpbusd _mm256_dpbusd_epi32
    );
}

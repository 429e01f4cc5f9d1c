//! The roofline's SIMD loops (this module's `unsafe`), behind the machine peaks of
//! `roofline/mod.rs`: streams of independent
//! arithmetic instructions (one per accumulator, [`CHAINS`] accumulators, so the
//! instruction latency is hidden and only the issue rate counts) and a vector read of a
//! buffer. Written as inline assembly so the compiler cannot hoist or fold the
//! loop-invariant operands; each function's scalar twin is `roofline::scalar_*`. The
//! callers check the CPU features ([`crate::kernels::isa_supported`]) before calling.

use super::read_streams::{read_part_len, READ_STREAMS};
use std::arch::asm;
use std::arch::x86_64::*;

/// Independent accumulators per loop (latency 4-5 cycles x up to 2 issues per cycle needs
/// at least 10).
pub const CHAINS: usize = 12;

/// Sum of an accumulator array's lanes read as `L` (f32 or i32), as f64.
///
/// # Safety
/// `T` must be a plain vector type made of `L` lanes.
unsafe fn lane_sum<T, L: Copy + Into<f64>>(a: &[T]) -> f64 {
    let n = std::mem::size_of_val(a) / std::mem::size_of::<L>();
    let lanes = std::slice::from_raw_parts(a.as_ptr() as *const L, n);
    lanes.iter().map(|&v| v.into()).sum()
}

macro_rules! stream_loop {
    ($name:ident, $features:literal, $reg:ident, $ty:ty, $lane:ty, $zero:expr, $x:expr, $y:expr, $body:literal) => {
        /// Runs `iters` iterations of [`CHAINS`] independent instructions `a += f(x, y)`
        /// (x, y as in `roofline::scalar_expected`) and returns the sum of every
        /// accumulator lane (so the work cannot be dropped, and tests can check it).
        ///
        /// # Safety
        /// The CPU must have the target features this function enables.
        #[target_feature(enable = $features)]
        pub unsafe fn $name(iters: u64) -> f64 {
            let mut a: [$ty; CHAINS] = [$zero; CHAINS];
            let x: $ty = $x;
            let y: $ty = $y;
            for _ in 0..iters {
                asm!(
                    $body,
                    a0 = inout($reg) a[0], a1 = inout($reg) a[1], a2 = inout($reg) a[2],
                    a3 = inout($reg) a[3], a4 = inout($reg) a[4], a5 = inout($reg) a[5],
                    a6 = inout($reg) a[6], a7 = inout($reg) a[7], a8 = inout($reg) a[8],
                    a9 = inout($reg) a[9], a10 = inout($reg) a[10], a11 = inout($reg) a[11],
                    x = in($reg) x, y = in($reg) y,
                    options(nomem, nostack, preserves_flags),
                );
            }
            lane_sum::<$ty, $lane>(&a)
        }
    };
}

stream_loop!(
    fma_zmm,
    "avx512f",
    zmm_reg,
    __m512,
    f32,
    _mm512_setzero_ps(),
    _mm512_set1_ps(1.0),
    _mm512_set1_ps(1.0),
    "vfmadd231ps {a0}, {x}, {y}\n vfmadd231ps {a1}, {x}, {y}\n vfmadd231ps {a2}, {x}, {y}\n
     vfmadd231ps {a3}, {x}, {y}\n vfmadd231ps {a4}, {x}, {y}\n vfmadd231ps {a5}, {x}, {y}\n
     vfmadd231ps {a6}, {x}, {y}\n vfmadd231ps {a7}, {x}, {y}\n vfmadd231ps {a8}, {x}, {y}\n
     vfmadd231ps {a9}, {x}, {y}\n vfmadd231ps {a10}, {x}, {y}\n vfmadd231ps {a11}, {x}, {y}"
);

stream_loop!(
    fma_ymm,
    "avx2,fma",
    ymm_reg,
    __m256,
    f32,
    _mm256_setzero_ps(),
    _mm256_set1_ps(1.0),
    _mm256_set1_ps(1.0),
    "vfmadd231ps {a0}, {x}, {y}\n vfmadd231ps {a1}, {x}, {y}\n vfmadd231ps {a2}, {x}, {y}\n
     vfmadd231ps {a3}, {x}, {y}\n vfmadd231ps {a4}, {x}, {y}\n vfmadd231ps {a5}, {x}, {y}\n
     vfmadd231ps {a6}, {x}, {y}\n vfmadd231ps {a7}, {x}, {y}\n vfmadd231ps {a8}, {x}, {y}\n
     vfmadd231ps {a9}, {x}, {y}\n vfmadd231ps {a10}, {x}, {y}\n vfmadd231ps {a11}, {x}, {y}"
);

stream_loop!(
    dpbusd_zmm,
    "avx512f,avx512vnni",
    zmm_reg,
    __m512i,
    i32,
    _mm512_setzero_si512(),
    _mm512_set1_epi8(3),
    _mm512_set1_epi8(5),
    "vpdpbusd {a0}, {x}, {y}\n vpdpbusd {a1}, {x}, {y}\n vpdpbusd {a2}, {x}, {y}\n
     vpdpbusd {a3}, {x}, {y}\n vpdpbusd {a4}, {x}, {y}\n vpdpbusd {a5}, {x}, {y}\n
     vpdpbusd {a6}, {x}, {y}\n vpdpbusd {a7}, {x}, {y}\n vpdpbusd {a8}, {x}, {y}\n
     vpdpbusd {a9}, {x}, {y}\n vpdpbusd {a10}, {x}, {y}\n vpdpbusd {a11}, {x}, {y}"
);

stream_loop!(
    dpbusd_ymm_evex,
    "avx2,avx512f,avx512vl,avx512vnni",
    ymm_reg,
    __m256i,
    i32,
    _mm256_setzero_si256(),
    _mm256_set1_epi8(3),
    _mm256_set1_epi8(5),
    "vpdpbusd {a0}, {x}, {y}\n vpdpbusd {a1}, {x}, {y}\n vpdpbusd {a2}, {x}, {y}\n
     vpdpbusd {a3}, {x}, {y}\n vpdpbusd {a4}, {x}, {y}\n vpdpbusd {a5}, {x}, {y}\n
     vpdpbusd {a6}, {x}, {y}\n vpdpbusd {a7}, {x}, {y}\n vpdpbusd {a8}, {x}, {y}\n
     vpdpbusd {a9}, {x}, {y}\n vpdpbusd {a10}, {x}, {y}\n vpdpbusd {a11}, {x}, {y}"
);

stream_loop!(dpbusd_ymm_vex, "avx2,avxvnni", ymm_reg, __m256i, i32, _mm256_setzero_si256(),
    _mm256_set1_epi8(3), _mm256_set1_epi8(5),
    "{{vex}} vpdpbusd {a0}, {x}, {y}\n {{vex}} vpdpbusd {a1}, {x}, {y}\n {{vex}} vpdpbusd {a2}, {x}, {y}\n
     {{vex}} vpdpbusd {a3}, {x}, {y}\n {{vex}} vpdpbusd {a4}, {x}, {y}\n {{vex}} vpdpbusd {a5}, {x}, {y}\n
     {{vex}} vpdpbusd {a6}, {x}, {y}\n {{vex}} vpdpbusd {a7}, {x}, {y}\n {{vex}} vpdpbusd {a8}, {x}, {y}\n
     {{vex}} vpdpbusd {a9}, {x}, {y}\n {{vex}} vpdpbusd {a10}, {x}, {y}\n {{vex}} vpdpbusd {a11}, {x}, {y}");

// bf16 1.0 is 0x3f80; each lane of `vdpbf16ps` adds two products.
stream_loop!(
    dpbf16_zmm,
    "avx512f,avx512bf16",
    zmm_reg,
    __m512,
    f32,
    _mm512_setzero_ps(),
    _mm512_castsi512_ps(_mm512_set1_epi16(0x3f80)),
    _mm512_castsi512_ps(_mm512_set1_epi16(0x3f80)),
    "vdpbf16ps {a0}, {x}, {y}\n vdpbf16ps {a1}, {x}, {y}\n vdpbf16ps {a2}, {x}, {y}\n
     vdpbf16ps {a3}, {x}, {y}\n vdpbf16ps {a4}, {x}, {y}\n vdpbf16ps {a5}, {x}, {y}\n
     vdpbf16ps {a6}, {x}, {y}\n vdpbf16ps {a7}, {x}, {y}\n vdpbf16ps {a8}, {x}, {y}\n
     vdpbf16ps {a9}, {x}, {y}\n vdpbf16ps {a10}, {x}, {y}\n vdpbf16ps {a11}, {x}, {y}"
);

/// `vpmaddubsw` + `vpmaddwd` + `vpaddd` per accumulator on zmm (the int8 dot of CPUs
/// without VNNI): three instructions per 64 byte products.
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn maddubs_zmm(iters: u64) -> f64 {
    let mut a = [_mm512_setzero_si512(); CHAINS];
    let x = _mm512_set1_epi8(3);
    let y = _mm512_set1_epi8(5);
    let ones = _mm512_set1_epi16(1);
    for _ in 0..iters {
        for chunk in a.chunks_exact_mut(4) {
            asm!(
                "vpmaddubsw {t0}, {x}, {y}", "vpmaddubsw {t1}, {x}, {y}",
                "vpmaddubsw {t2}, {x}, {y}", "vpmaddubsw {t3}, {x}, {y}",
                "vpmaddwd {t0}, {t0}, {o}", "vpmaddwd {t1}, {t1}, {o}",
                "vpmaddwd {t2}, {t2}, {o}", "vpmaddwd {t3}, {t3}, {o}",
                "vpaddd {a0}, {a0}, {t0}", "vpaddd {a1}, {a1}, {t1}",
                "vpaddd {a2}, {a2}, {t2}", "vpaddd {a3}, {a3}, {t3}",
                a0 = inout(zmm_reg) chunk[0], a1 = inout(zmm_reg) chunk[1],
                a2 = inout(zmm_reg) chunk[2], a3 = inout(zmm_reg) chunk[3],
                x = in(zmm_reg) x, y = in(zmm_reg) y, o = in(zmm_reg) ones,
                t0 = out(zmm_reg) _, t1 = out(zmm_reg) _, t2 = out(zmm_reg) _, t3 = out(zmm_reg) _,
                options(nomem, nostack, preserves_flags),
            );
        }
    }
    lane_sum::<__m512i, i32>(&a)
}

/// The AVX2 twin of [`maddubs_zmm`] on ymm (32 byte products per three instructions).
/// All twelve accumulators, the three operands and one temporary (renamed by the core)
/// fill the 16 ymm registers in a single block: with a temporary per chain, as the zmm
/// loop has room for, the compiler spilled accumulators between blocks and the peak read
/// 25 % under the C twin's.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn maddubs_ymm(iters: u64) -> f64 {
    let mut a = [_mm256_setzero_si256(); CHAINS];
    let x = _mm256_set1_epi8(3);
    let y = _mm256_set1_epi8(5);
    let ones = _mm256_set1_epi16(1);
    for _ in 0..iters {
        asm!(
            "vpmaddubsw {t}, {x}, {y}", "vpmaddwd {t}, {t}, {o}", "vpaddd {a0}, {a0}, {t}",
            "vpmaddubsw {t}, {x}, {y}", "vpmaddwd {t}, {t}, {o}", "vpaddd {a1}, {a1}, {t}",
            "vpmaddubsw {t}, {x}, {y}", "vpmaddwd {t}, {t}, {o}", "vpaddd {a2}, {a2}, {t}",
            "vpmaddubsw {t}, {x}, {y}", "vpmaddwd {t}, {t}, {o}", "vpaddd {a3}, {a3}, {t}",
            "vpmaddubsw {t}, {x}, {y}", "vpmaddwd {t}, {t}, {o}", "vpaddd {a4}, {a4}, {t}",
            "vpmaddubsw {t}, {x}, {y}", "vpmaddwd {t}, {t}, {o}", "vpaddd {a5}, {a5}, {t}",
            "vpmaddubsw {t}, {x}, {y}", "vpmaddwd {t}, {t}, {o}", "vpaddd {a6}, {a6}, {t}",
            "vpmaddubsw {t}, {x}, {y}", "vpmaddwd {t}, {t}, {o}", "vpaddd {a7}, {a7}, {t}",
            "vpmaddubsw {t}, {x}, {y}", "vpmaddwd {t}, {t}, {o}", "vpaddd {a8}, {a8}, {t}",
            "vpmaddubsw {t}, {x}, {y}", "vpmaddwd {t}, {t}, {o}", "vpaddd {a9}, {a9}, {t}",
            "vpmaddubsw {t}, {x}, {y}", "vpmaddwd {t}, {t}, {o}", "vpaddd {a10}, {a10}, {t}",
            "vpmaddubsw {t}, {x}, {y}", "vpmaddwd {t}, {t}, {o}", "vpaddd {a11}, {a11}, {t}",
            a0 = inout(ymm_reg) a[0], a1 = inout(ymm_reg) a[1], a2 = inout(ymm_reg) a[2],
            a3 = inout(ymm_reg) a[3], a4 = inout(ymm_reg) a[4], a5 = inout(ymm_reg) a[5],
            a6 = inout(ymm_reg) a[6], a7 = inout(ymm_reg) a[7], a8 = inout(ymm_reg) a[8],
            a9 = inout(ymm_reg) a[9], a10 = inout(ymm_reg) a[10], a11 = inout(ymm_reg) a[11],
            x = in(ymm_reg) x, y = in(ymm_reg) y, o = in(ymm_reg) ones,
            t = out(ymm_reg) _,
            options(nomem, nostack, preserves_flags),
        );
    }
    lane_sum::<__m256i, i32>(&a)
}

/// A loop of SSE2's two-operand forms, per accumulator a copy of `x` into a temporary,
/// `$op` of it with `y`, and `$add` into the accumulator (one temporary, renamed by the
/// core, as in [`maddubs_ymm`]).
macro_rules! sse2_loop {
    ($(#[$doc:meta])* $name:ident, $ty:ty, $lane:ty, $zero:expr, $x:expr, $y:expr, $mov:literal, $op:literal, $add:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// None beyond the function's own (SSE2 is in the x86-64 baseline); `unsafe` for
        /// symmetry with the other loops.
        #[target_feature(enable = "sse2")]
        pub unsafe fn $name(iters: u64) -> f64 {
            let mut a: [$ty; CHAINS] = [$zero; CHAINS];
            let x: $ty = $x;
            let y: $ty = $y;
            macro_rules! step {
                ($acc:literal) => {
                    concat!($mov, " {t}, {x}\n", $op, " {t}, {y}\n", $add, " {", $acc, "}, {t}\n")
                };
            }
            for _ in 0..iters {
                asm!(
                    step!("a0"), step!("a1"), step!("a2"), step!("a3"), step!("a4"), step!("a5"),
                    step!("a6"), step!("a7"), step!("a8"), step!("a9"), step!("a10"), step!("a11"),
                    a0 = inout(xmm_reg) a[0], a1 = inout(xmm_reg) a[1], a2 = inout(xmm_reg) a[2],
                    a3 = inout(xmm_reg) a[3], a4 = inout(xmm_reg) a[4], a5 = inout(xmm_reg) a[5],
                    a6 = inout(xmm_reg) a[6], a7 = inout(xmm_reg) a[7], a8 = inout(xmm_reg) a[8],
                    a9 = inout(xmm_reg) a[9], a10 = inout(xmm_reg) a[10], a11 = inout(xmm_reg) a[11],
                    x = in(xmm_reg) x, y = in(xmm_reg) y,
                    t = out(xmm_reg) _,
                    options(nomem, nostack, preserves_flags),
                );
            }
            lane_sum::<$ty, $lane>(&a)
        }
    };
}

sse2_loop!(
    /// `mulps` + `addps` on xmm (4 products added: 8 operations): what the scalar tier's
    /// float kernels compile to on x86-64, whose baseline has SSE2 but no FMA.
    mul_add_xmm, __m128, f32, _mm_setzero_ps(), _mm_set1_ps(1.0), _mm_set1_ps(1.0),
    "movaps", "mulps", "addps"
);

sse2_loop!(
    /// `pmaddwd` + `paddd` on xmm (8 i16 products added in pairs into 4 i32 lanes: 16
    /// operations): the scalar tier's quantized block dots on x86-64
    /// (`x86_64/baseline.rs`).
    madd_xmm, __m128i, i32, _mm_setzero_si128(), _mm_set1_epi16(3), _mm_set1_epi16(5),
    "movdqa", "pmaddwd", "paddd"
);

/// Reads `data` once with 512-bit loads into four accumulators, as
/// `roofline::READ_STREAMS` lock-step streams of `read_part_len` values (the
/// scalar twin's walk); returns a value depending on every byte read.
///
/// # Safety
/// The CPU must have AVX-512F.
#[target_feature(enable = "avx512f")]
pub unsafe fn read_zmm(data: &[u64]) -> u64 {
    let part = read_part_len(data.len());
    let mut acc = [_mm512_setzero_si512(); 4];
    for i in (0..part).step_by(32) {
        for s in 0..READ_STREAMS {
            // SAFETY: s * part + i + 32 <= READ_STREAMS * part <= data.len().
            let p = unsafe { data.as_ptr().add(s * part + i) } as *const __m512i;
            for (k, a) in acc.iter_mut().enumerate() {
                *a = _mm512_xor_si512(*a, _mm512_loadu_si512(p.add(k)));
            }
        }
    }
    let s = _mm512_xor_si512(
        _mm512_xor_si512(acc[0], acc[1]),
        _mm512_xor_si512(acc[2], acc[3]),
    );
    let lanes: [u64; 8] = std::mem::transmute(s);
    lanes.iter().fold(0, |h, &v| h ^ v)
}

/// The AVX2 twin of [`read_zmm`] (256-bit loads, 256 bytes per stream and step).
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn read_ymm(data: &[u64]) -> u64 {
    let part = read_part_len(data.len());
    let mut acc = [_mm256_setzero_si256(); 4];
    for i in (0..part).step_by(32) {
        for s in 0..READ_STREAMS {
            // SAFETY: as in `read_zmm`.
            let p = unsafe { data.as_ptr().add(s * part + i) } as *const __m256i;
            for k in 0..8 {
                acc[k % 4] = _mm256_xor_si256(acc[k % 4], _mm256_loadu_si256(p.add(k)));
            }
        }
    }
    let s = _mm256_xor_si256(
        _mm256_xor_si256(acc[0], acc[1]),
        _mm256_xor_si256(acc[2], acc[3]),
    );
    let lanes: [u64; 4] = std::mem::transmute(s);
    lanes.iter().fold(0, |h, &v| h ^ v)
}

//! Intel AMX (AMX-TILE + AMX-INT8: Sapphire Rapids, Granite Rapids) for the `amx` tier:
//! prompt tiles of every quantized weight matrix, 32 tokens × two row groups per call
//! ([`tile_2x2`]), 16 tokens × 16 rows at the edges (symmetric
//! 8-bit [`Int8Tiles`], and the 3- to 8-bit codes of [`LowBitTiles`] (widened to bytes first): the `int8`
//! format and the `int4` mix), and the `tdpbssd` loop of the roofline's int8 peak. Twins:
//! `int8_tile_scalar` and `lowbit_tile_scalar` (the tests hold this path to them bit for
//! bit).
//!
//! One `tdpbsud` multiplies a 16 × 32 tile of signed activation bytes (16 tokens of one q8
//! block, read in place from the row-major q8 activations with the row stride `dim`) by an
//! 8 × 64 tile of unsigned weight bytes, which is exactly `Int8Tiles`' 512-byte tile
//! (`quad * 64 + row * 4 + k`, AMX's "VNNI" layout of B: rows are column quads, each row
//! 16 weight rows × 4 bytes), into a 16 × 16 tile of i32 block dots (token × weight row).
//! So the packed format is used as it is, with no repacking; 8-bit codes share that layout,
//! and 4- and 6-bit codes are widened to it once per row group (`zmm.rs`'s
//! `widen_group_codes`) before
//! the group's token tiles run, so each widening serves the whole prompt. The dots go
//! through memory (`tilestored`) to the same float step as every other tier: for
//! `Int8Tiles` `dot − 128·Σa` (the weights are stored `q + 128`), then `acc =
//! fma(float(dot), d_w · d_a, acc)` per block (low-bit codes: the same per block, and `acc
//! = fma(m, S, acc)` per scale group), so the results equal the specification's to the
//! bit. The dots of the next block are issued before the float step of the current one
//! (two dot buffers), so the tile unit and the vector units can overlap: in the 2 × 2
//! kernel each of the four `tdpbsud` is its own `asm!` block, two placed before each of
//! the current block's two float steps (one per 16-token half, both row groups, so each
//! token's activation scale, correction and minimum term are loaded once for the two
//! groups), and the tiles are stored after the last.
//!
//! Measured on the same Xeon on 2026-12-03 (`perf` of `speed` pp512, the kernel's samples
//! against the attention GEMM's, which did not change): not zeroing the 64 accumulators
//! (block 0 writes them; a zeroed array was a 4 KB `memset` call per kernel call, 2.3 % of
//! the profile), the low-bit minimum term inside the scale group's last float step
//! instead of a second pass over the accumulators (int4 -8 %), and one float step per
//! token half (int4 and int8 -12 %).
//!
//! Measured since (same Xeon, later on 2026-12-02): a standalone copy of the 2 × 2 kernel
//! ran 210 GMAC/s per thread with the four dots and their stores in one `asm!` block (the
//! stores waited on the dots and the float steps on the stores) and 300-330 with them
//! spread between the float steps as above (a C twin with intrinsics, which GCC schedules
//! that way by itself, ran 390). In `speed` pp512 (interleaved rounds, tokens/s) `amx` then
//! ran int8 2200-2304 against `vnni`'s 2106-2216 and int4 1998-2161 against 1968-2050;
//! with the threads' row slices on pairs of row groups (`QuantIsa::row_align`, so the
//! 192-row k/v projections run on the 2 × 2 kernel too) int8 2275-2446 and int4
//! 2140-2216. So `amx` is the default tier where AMX is granted.
//!
//! Earlier measurements (2026-12-02, `speed` pp512 on SmolLM2-135M,
//! `KWK_ISA=amx` against `vnni` in interleaved runs, tokens/s): with 16 × 16 kernels only
//! (one block of look-ahead), int8 1486-1500 against 1626-1703 and int4 1484-1519 against
//! 1438-1507; with the 2 × 2 kernels (four `tdpbsud` per block) int8 1448-1512 against
//! 1546-1583 and int4 1473-1474 against 1441-1485. No faster, so the tier was opt-in. In
//! `perf` of int8 pp512 the 2 × 2 kernel takes 13.1 % of the samples where the VNNI tile
//! takes 16.2 %, and the driver around it 3 % more, so the matmuls gain a little and the
//! prompt as a whole nothing; within the kernel the samples sit on the activation tile loads
//! (18 % on one `tileloadd`, 16 rows `dim` bytes apart) and on the stores of the dots,
//! which every 32-column block needs (its activation scale differs), so the tile unit works
//! a K of 32 at a time and waits on memory between blocks. Packing the activations into
//! contiguous tiles once per call measured slower (int8 1322-1402, int4 1264-1322: each
//! of a prompt's claimed row pieces packed every token again), and issuing the 2 × 2
//! kernel's dots three blocks ahead (four dot buffers) instead of one changed nothing
//! (int8 1728-1789 against `vnni`'s 1908-1961, int4 1608-1632 against 1614-1663).
//!
//! Linux disables the tile state per process until it is asked for
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`): [`available`] asks once and
//! reports AMX absent when the CPU, the OS or the request says no. Each thread loads the
//! tile configuration ([`TileScope`]) before its tiles and releases it after.

use crate::kernels::quant::driver::Q8Rows;
use crate::kernels::quant::layout::{
    GroupScales, Int8Tiles, LowBitTiles, BLOCK, INT8_TILE_BYTES, ROW_GROUP,
};
use crate::kernels::quant::zmm::{mins_zmm, scales_zmm};
use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

/// Tokens per AMX tile call (the rows of the activation tile).
pub const AMX_TOKENS: usize = 16;

/// Whether this process can run AMX-INT8: the CPU has AMX-TILE and AMX-INT8 (CPUID leaf
/// 7), the OS enables the tile state (XCR0 bits 17 and 18), and Linux granted this process
/// the tile data (asked once, here).
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| cpu_has_amx_int8() && os_enables_tiles() && request_tile_data())
}

fn cpu_has_amx_int8() -> bool {
    let leaf7 = __cpuid_count(7, 0);
    let (amx_tile, amx_int8) = (leaf7.edx >> 24 & 1 == 1, leaf7.edx >> 25 & 1 == 1);
    amx_tile && amx_int8
}

fn os_enables_tiles() -> bool {
    if __cpuid(1).ecx >> 27 & 1 == 0 {
        return false;
    }
    // SAFETY: CPUID says the OS enabled XGETBV (OSXSAVE).
    let xcr0 = unsafe { xgetbv0() };
    xcr0 >> 17 & 3 == 3
}

/// # Safety
/// OSXSAVE must be set (CPUID.1:ECX bit 27).
unsafe fn xgetbv0() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: the caller checked OSXSAVE; XGETBV with ECX = 0 reads XCR0.
    unsafe {
        asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi,
             options(nomem, nostack, preserves_flags));
    }
    (hi as u64) << 32 | lo as u64
}

#[cfg(target_os = "linux")]
fn request_tile_data() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: arch_prctl(ARCH_REQ_XCOMP_PERM, 18) only changes which extended states this
    // process may use; the syscall clobbers rcx and r11, declared below.
    unsafe {
        asm!("syscall",
             inlateout("rax") SYS_ARCH_PRCTL => ret,
             in("rdi") ARCH_REQ_XCOMP_PERM, in("rsi") XFEATURE_XTILEDATA,
             lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> bool {
    false
}

/// The 64-byte tile configuration (palette 1): bytes 16.. hold each tile's bytes per row
/// (u16), bytes 48.. its rows.
#[repr(C, align(64))]
pub(super) struct TileConfig(pub(super) [u8; 64]);

impl TileConfig {
    pub(super) const fn new(tiles: &[(u8, u16)]) -> TileConfig {
        let mut b = [0u8; 64];
        b[0] = 1;
        let mut i = 0;
        while i < tiles.len() {
            let (rows, colsb) = tiles[i];
            b[16 + 2 * i] = colsb as u8;
            b[17 + 2 * i] = (colsb >> 8) as u8;
            b[48 + i] = rows;
            i += 1;
        }
        TileConfig(b)
    }
}

/// The quantized tiles' configuration: tmm0-3 16 × 16 i32 block dots, tmm4-5 16 tokens ×
/// 32 activation bytes, tmm6-7 8 × 64 weight bytes (B layout). The 2 × 2 kernels use all
/// eight (two token tiles by two row groups); the 16 × 16 ones alternate tmm0 and tmm1
/// between blocks (so the next block's dot runs while the current one is scaled) with
/// tmm4 and tmm6.
static INT8_TILES: TileConfig = TileConfig::new(&[
    (16, 64),
    (16, 64),
    (16, 64),
    (16, 64),
    (AMX_TOKENS as u8, BLOCK as u16),
    (AMX_TOKENS as u8, BLOCK as u16),
    ((BLOCK / 4) as u8, 64),
    ((BLOCK / 4) as u8, 64),
]);

/// The tile configuration loaded on this thread for as long as the value lives (released
/// on drop, so the thread leaves no tile state behind for the OS to save). Not `Send`:
/// the configuration belongs to the thread that loaded it.
pub struct TileScope(std::marker::PhantomData<*const ()>);

impl TileScope {
    /// Loads the int8 tiles' configuration on this thread.
    ///
    /// # Safety
    /// [`available`] must have returned true in this process.
    pub unsafe fn int8() -> TileScope {
        // SAFETY: forwarded contract.
        unsafe { TileScope::load(&INT8_TILES) }
    }

    /// Loads `config` on this thread.
    ///
    /// # Safety
    /// [`available`] must have returned true in this process.
    pub(super) unsafe fn load(config: &'static TileConfig) -> TileScope {
        // SAFETY: AMX is available (caller); every `TileConfig` is a palette-1 block.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack, readonly));
        }
        TileScope(std::marker::PhantomData)
    }
}

impl Drop for TileScope {
    fn drop(&mut self) {
        // SAFETY: a TileScope exists only after `ldtilecfg` ran on this thread (AMX is
        // available), and TILERELEASE is valid in any tile state.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

#[repr(C, align(64))]
struct Dots([[i32; ROW_GROUP]; AMX_TOKENS]);

/// Issues a block's dot into tile `C` (zeroed, then `tdpbsud` of the activation and weight
/// tiles); [`store_dot`] writes it out later, so the float step of the previous block runs
/// while the tile unit works (storing right after the dot made the store wait for it).
///
/// # Safety
/// The int8 tile configuration is loaded; `a` points at 16 rows of 32 readable bytes
/// `stride` apart, `w` at 512 readable bytes.
#[inline(always)]
unsafe fn block_dot<const C: u8>(a: *const i8, stride: usize, w: *const u8) {
    // SAFETY: forwarded contract.
    unsafe {
        if C == 0 {
            asm!(
                "tilezero tmm0",
                "tileloadd tmm4, [{a} + {sa} * 1]",
                "tileloadd tmm6, [{w} + {s64} * 1]",
                "tdpbsud tmm0, tmm4, tmm6",
                a = in(reg) a, sa = in(reg) stride, w = in(reg) w, s64 = in(reg) 64usize,
                options(nostack, readonly),
            );
        } else {
            asm!(
                "tilezero tmm1",
                "tileloadd tmm4, [{a} + {sa} * 1]",
                "tileloadd tmm6, [{w} + {s64} * 1]",
                "tdpbsud tmm1, tmm4, tmm6",
                a = in(reg) a, sa = in(reg) stride, w = in(reg) w, s64 = in(reg) 64usize,
                options(nostack, readonly),
            );
        }
    }
}

/// Stores tile `C` (a [`block_dot`]) to `dots`.
///
/// # Safety
/// The int8 tile configuration is loaded and tile `C` holds a dot; `dots` is 16 rows of
/// 64 writable bytes.
#[inline(always)]
unsafe fn store_dot<const C: u8>(dots: *mut Dots) {
    // SAFETY: forwarded contract.
    unsafe {
        if C == 0 {
            asm!("tilestored [{d} + {s64} * 1], tmm0", d = in(reg) dots, s64 = in(reg) 64usize,
                 options(nostack));
        } else {
            asm!("tilestored [{d} + {s64} * 1], tmm1", d = in(reg) dots, s64 = in(reg) 64usize,
                 options(nostack));
        }
    }
}

/// The 16 × 16 kernels' dot buffers: block `b`'s dot goes through tile `b % 2` into
/// buffer `b % 2` (uninitialised until its first store; read only after it).
struct DotPair(std::mem::MaybeUninit<[Dots; 2]>);

impl DotPair {
    fn new() -> DotPair {
        DotPair(std::mem::MaybeUninit::uninit())
    }

    /// Issues block `b`'s dot (activations from `xq`, rows `stride` apart; weight tiles
    /// from `codes`).
    ///
    /// # Safety
    /// As [`block_dot`], for block `b` of `xq` and `codes`.
    #[inline(always)]
    unsafe fn issue(&self, b: usize, xq: *const i8, stride: usize, codes: *const u8) {
        // SAFETY: forwarded contract.
        unsafe {
            let (a, w) = (xq.add(b * BLOCK), codes.add(b * INT8_TILE_BYTES));
            if b.is_multiple_of(2) {
                block_dot::<0>(a, stride, w);
            } else {
                block_dot::<1>(a, stride, w);
            }
        }
    }

    /// Stores block `b`'s issued dot to its buffer.
    ///
    /// # Safety
    /// As [`store_dot`]: block `b`'s dot was issued last on its tile.
    #[inline(always)]
    unsafe fn store(&mut self, b: usize) {
        let d = self.0.as_mut_ptr() as *mut Dots;
        // SAFETY: forwarded contract; `d` holds two `Dots`.
        unsafe {
            if b.is_multiple_of(2) {
                store_dot::<0>(d);
            } else {
                store_dot::<1>(d.add(1));
            }
        }
    }

    /// Block `b`'s dots, token by token.
    ///
    /// # Safety
    /// Block `b`'s dot was stored ([`Self::store`]) since its buffer was last reused.
    #[inline(always)]
    unsafe fn dots(&self, b: usize) -> &[[i32; ROW_GROUP]; AMX_TOKENS] {
        // SAFETY: forwarded contract: the buffer was written by `tilestored`.
        unsafe { &(*(self.0.as_ptr() as *const Dots).add(b % 2)).0 }
    }
}

/// Rows `16g..16g+16` of `W · x` for tokens `t0..t0+16` into `out[token][row]`.
///
/// # Safety
/// AVX512F present, [`available`] true and a [`TileScope::int8`] alive on this thread;
/// `w` and `x` checked (`Int8Tiles::check`, `Q8Rows::check`), `g < w.n_groups()`,
/// `t0 + 16 <= x.n_tokens`.
#[target_feature(enable = "avx512f,avx512bw,f16c")]
pub unsafe fn int8_tile16(
    w: &Int8Tiles,
    x: &Q8Rows,
    g: usize,
    t0: usize,
    out: &mut [[f32; ROW_GROUP]; AMX_TOKENS],
) {
    let nb = w.n_blocks();
    let dim = x.dim;
    let mut dots = DotPair::new();
    // SAFETY: every pointer stays inside the slices the caller's checks validated: the
    // tiles and scales of group g (blocks < nb), the activations of tokens t0..t0+16;
    // each block's dots are stored before they are read.
    unsafe {
        let qs = w.qs.as_ptr().add(g * nb * INT8_TILE_BYTES);
        let sc = w.scales.as_ptr().add(g * nb * ROW_GROUP) as *const u16;
        let xq = x.quants.as_ptr().add(t0 * dim);
        let xs = x.scales.as_ptr().add(t0 * nb);
        let xbs = x.block_sums.as_ptr().add(t0 * nb);
        let mut acc = [_mm512_setzero_ps(); AMX_TOKENS];
        dots.issue(0, xq, dim, qs);
        dots.store(0);
        for b in 0..nb {
            if b + 1 < nb {
                dots.issue(b + 1, xq, dim, qs);
            }
            let d = dots.dots(b);
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(sc.add(b * ROW_GROUP) as *const _));
            for (t, acc_t) in acc.iter_mut().enumerate() {
                let c = _mm512_load_si512(d[t].as_ptr() as *const _);
                let dot = _mm512_add_epi32(c, _mm512_set1_epi32(-128 * *xbs.add(t * nb + b)));
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*xs.add(t * nb + b)));
                *acc_t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, *acc_t);
            }
            if b + 1 < nb {
                dots.store(b + 1);
            }
        }
        for (t, acc_t) in acc.iter().enumerate() {
            _mm512_storeu_ps(out[t].as_mut_ptr(), *acc_t);
        }
    }
}

/// Rows `16g..16g+16` of the low-bit matrix `w` times tokens `t0..t0+16` into
/// `out[token][row]`, from the group's codes in B layout (`widen_group_codes`, or the 8-bit
/// code tiles themselves); `s[t * n_col_groups + cg]` is token `t0 + t`'s minimum term `S`
/// of column group `cg`.
///
/// # Safety
/// AVX512F present, [`available`] true and a [`TileScope::int8`] alive on this thread;
/// `w`, `x` checked, `g < w.n_groups()`, `t0 + 16 <= x.n_tokens`.
#[target_feature(enable = "avx512f,avx512bw,f16c")]
pub unsafe fn lowbit_tile16(
    w: &LowBitTiles,
    codes: &[u8],
    x: &Q8Rows,
    s: &[f32],
    g: usize,
    t0: usize,
    out: &mut [[f32; ROW_GROUP]; AMX_TOKENS],
) {
    let nb = w.n_blocks();
    let ncg = w.n_col_groups();
    let bpg = w.group_size / BLOCK;
    let dim = x.dim;
    assert!(codes.len() >= nb * INT8_TILE_BYTES && s.len() >= AMX_TOKENS * ncg);
    let mut dots = DotPair::new();
    // SAFETY: as in `int8_tile16`, with the scale groups of group g, and `codes` and `s`
    // asserted above.
    unsafe {
        let gs = w.group_scales(g);
        let xq = x.quants.as_ptr().add(t0 * dim);
        let xs = x.scales.as_ptr().add(t0 * nb);
        let mut acc = [_mm512_setzero_ps(); AMX_TOKENS];
        let codes = codes.as_ptr();
        dots.issue(0, xq, dim, codes);
        dots.store(0);
        for cg in 0..ncg {
            let dw = scales_zmm(gs, cg);
            for b in cg * bpg..((cg + 1) * bpg).min(nb) {
                if b + 1 < nb {
                    dots.issue(b + 1, xq, dim, codes);
                }
                let d = dots.dots(b);
                for (t, acc_t) in acc.iter_mut().enumerate() {
                    let c = _mm512_load_si512(d[t].as_ptr() as *const _);
                    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*xs.add(t * nb + b)));
                    *acc_t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), scale, *acc_t);
                }
                if b + 1 < nb {
                    dots.store(b + 1);
                }
            }
            let m = mins_zmm(gs, cg);
            for (t, acc_t) in acc.iter_mut().enumerate() {
                *acc_t = _mm512_fmadd_ps(m, _mm512_set1_ps(s[t * ncg + cg]), *acc_t);
            }
        }
        for (t, acc_t) in acc.iter().enumerate() {
            _mm512_storeu_ps(out[t].as_mut_ptr(), *acc_t);
        }
    }
}

/// One block's four dots of the 2 × 2 kernels in one go (the first block of a call):
/// token tiles `a[0]`, `a[1]` (16 rows of 32 bytes, `stride` apart) by weight tiles `w[0]`,
/// `w[1]` (512 bytes each) into `dots[2 * i + j]` = tokens `i` × group `j`.
///
/// # Safety
/// The quantized tiles' configuration is loaded; the pointers are readable as stated and
/// each `dots` entry is 16 rows of 64 writable bytes.
#[inline(always)]
unsafe fn block_dots_2x2(a: [*const i8; 2], stride: usize, w: [*const u8; 2], dots: [*mut i32; 4]) {
    // SAFETY: forwarded contract.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "tileloadd tmm4, [{a0} + {sa} * 1]",
            "tileloadd tmm5, [{a1} + {sa} * 1]",
            "tileloadd tmm6, [{w0} + {s64} * 1]",
            "tileloadd tmm7, [{w1} + {s64} * 1]",
            "tdpbsud tmm0, tmm4, tmm6",
            "tdpbsud tmm1, tmm4, tmm7",
            "tdpbsud tmm2, tmm5, tmm6",
            "tdpbsud tmm3, tmm5, tmm7",
            "tilestored [{d0} + {s64} * 1], tmm0",
            "tilestored [{d1} + {s64} * 1], tmm1",
            "tilestored [{d2} + {s64} * 1], tmm2",
            "tilestored [{d3} + {s64} * 1], tmm3",
            a0 = in(reg) a[0], a1 = in(reg) a[1], sa = in(reg) stride,
            w0 = in(reg) w[0], w1 = in(reg) w[1], s64 = in(reg) 64usize,
            d0 = in(reg) dots[0], d1 = in(reg) dots[1], d2 = in(reg) dots[2], d3 = in(reg) dots[3],
            options(nostack),
        );
    }
}

/// Tokens per 2 × 2 kernel call.
pub const AMX_TOKENS_2X2: usize = 2 * AMX_TOKENS;

/// Where the 2 × 2 kernel writes its results: group `j`'s 16 rows for the call's token `t`
/// go to the 16 floats at `groups[j] + t * ld`, so the driver can point it straight into
/// the matmul's output.
pub struct TileOut {
    pub groups: [*mut f32; 2],
    pub ld: usize,
}

/// Two row groups of one matrix as the 2 × 2 kernel reads them: per group, its codes in B
/// layout (`nb` tiles of 512 bytes) and its scales: f16 bits, 16 per block, for
/// `Int8Tiles`; the two-level scales and minimums of low-bit codes; `ncg` scale groups of
/// `bpg` blocks.
pub struct GroupPair {
    pub codes: [*const u8; 2],
    pub scales: [PairScales; 2],
    pub nb: usize,
    pub ncg: usize,
    pub bpg: usize,
}

/// One row group's scales in a [`GroupPair`].
#[derive(Clone, Copy)]
pub enum PairScales {
    /// `Int8Tiles`: f16 bits, 16 per block.
    Sym(*const u16),
    /// Low-bit codes: the two levels ([`GroupScales`]).
    LowBit(GroupScales),
}

/// Row groups `pair` × tokens `t0..t0+32` into `out` ([`TileOut`]): for symmetric
/// 8-bit tiles (`SYM`, `Int8Tiles`: a scale per block, codes `q + 128`) `acc = fma(float(dot
/// − 128·Σa), d · d_a, acc)` per block; for low-bit codes the same without the correction
/// per block and `acc = fma(m, S, acc)` per scale group of `bpg` blocks (`s[t * ncg + cg]`
/// token `t0 + t`'s minimum term), the specifications' operations in their order.
///
/// # Safety
/// AVX512F present, [`available`] true and a [`TileScope::int8`] alive on this thread;
/// `x` checked, `t0 + 32 <= x.n_tokens`; the pair's pointers cover `nb` code tiles and
/// `ncg` scale groups (`ncg == nb`, `bpg == 1` for `SYM`); `s` holds `32 * ncg` values
/// unless `SYM`; `out`'s 2 × 32 rows of 16 floats are writable and no other thread
/// accesses them during the call.
#[target_feature(enable = "avx512f,avx512bw,f16c")]
pub unsafe fn tile_2x2<const SYM: bool>(
    pair: &GroupPair,
    x: &Q8Rows,
    s: &[f32],
    t0: usize,
    out: &TileOut,
) {
    let (nb, ncg, bpg) = (pair.nb, pair.ncg, pair.bpg);
    let dim = x.dim;
    // Two blocks' dots (current and next), each four 16 × 16 tiles; every tile is stored
    // by `tilestored` before the float step reads it.
    let mut dots = std::mem::MaybeUninit::<[[Dots; 4]; 2]>::uninit();
    let buf = dots.as_mut_ptr() as *mut i32;
    const TILE_I32: usize = AMX_TOKENS * ROW_GROUP;
    // SAFETY: every pointer stays inside what the caller guaranteed: tokens t0..t0+32,
    // blocks < nb, scale groups < ncg; `buf` holds 8 tiles of 256 i32 (64-byte aligned),
    // and each is written by its block's stores before its float step reads it; `acc`
    // holds 64 registers' worth, each written by block 0's float step (which covers every
    // group and token) before anything reads it. The tile
    // registers live across the `asm!` blocks below: nothing between them (inlined vector
    // code only, no calls) uses AMX.
    unsafe {
        let xq = x.quants.as_ptr().add(t0 * dim);
        let xs = x.scales.as_ptr().add(t0 * nb);
        let xbs = x.block_sums.as_ptr().add(t0 * nb);
        // The 64 accumulators (group j, token t at `j * 32 + t`) live in memory; block 0's
        // float step writes them first (from a zero addend, as the specification's acc
        // starts), so they are never zeroed: a zeroed array was a 4 KB `memset` call per
        // kernel call, 2.3 % of an int4 pp512 profile.
        let mut acc_store = std::mem::MaybeUninit::<[[__m512; AMX_TOKENS_2X2]; 2]>::uninit();
        let acc = acc_store.as_mut_ptr() as *mut __m512;
        // The last block's (low-bit codes: the last scale group's) results go straight to
        // `out`, not through `acc`.
        let out_at = |j: usize, t: usize| out.groups[j].add(t * out.ld);
        let a_of = |b: usize| [xq.add(b * BLOCK), xq.add(AMX_TOKENS * dim + b * BLOCK)];
        let w_of = |b: usize| {
            [
                pair.codes[0].add(b * INT8_TILE_BYTES),
                pair.codes[1].add(b * INT8_TILE_BYTES),
            ]
        };
        let tiles_of = |b: usize| {
            let d = buf.add((b % 2) * 4 * TILE_I32);
            [d, d.add(TILE_I32), d.add(2 * TILE_I32), d.add(3 * TILE_I32)]
        };
        block_dots_2x2(a_of(0), dim, w_of(0), tiles_of(0));
        for cg in 0..ncg {
            let dw = [0, 1].map(|j| match pair.scales[j] {
                PairScales::Sym(p) => {
                    _mm512_cvtph_ps(_mm256_loadu_si256(p.add(cg * ROW_GROUP) as *const _))
                }
                PairScales::LowBit(gs) => scales_zmm(gs, cg),
            });
            // Low-bit codes: the group's minimums, applied in its last block's float step.
            let mins = [0, 1].map(|j| match pair.scales[j] {
                PairScales::Sym(_) => _mm512_setzero_ps(),
                PairScales::LowBit(gs) => mins_zmm(gs, cg),
            });
            let group_end = ((cg + 1) * bpg).min(nb);
            for b in cg * bpg..group_end {
                let cur = tiles_of(b);
                let with_min = !SYM && b + 1 == group_end;
                // The float step of block b's dots `q` (tokens half · 16.., group j), and
                // at a scale group's last block of low-bit codes its minimum term
                // `acc = fma(m, S, acc)` (the specification's next operation) before the
                // accumulator is stored.
                macro_rules! float_step {
                    ($half:expr) => {{
                        let tok0 = $half * AMX_TOKENS;
                        let xs_b = xs.add(tok0 * nb + b);
                        let xbs_b = xbs.add(tok0 * nb + b);
                        for t in 0..AMX_TOKENS {
                            // The token's activation scale (and correction, minimum term)
                            // serve both groups.
                            let xsv = _mm512_set1_ps(*xs_b.add(t * nb));
                            let corr = if SYM {
                                _mm512_set1_epi32(-128 * *xbs_b.add(t * nb))
                            } else {
                                _mm512_setzero_si512()
                            };
                            let st = if with_min {
                                _mm512_set1_ps(*s.as_ptr().add((tok0 + t) * ncg + cg))
                            } else {
                                _mm512_setzero_ps()
                            };
                            for j in 0..2 {
                                let dq = cur[2 * $half + j];
                                let mut c = _mm512_load_si512(dq.add(t * ROW_GROUP) as *const _);
                                if SYM {
                                    c = _mm512_add_epi32(c, corr);
                                }
                                let scale = _mm512_mul_ps(dw[j], xsv);
                                let i = j * AMX_TOKENS_2X2 + tok0 + t;
                                let a = acc.add(i);
                                let prev = if b == 0 {
                                    _mm512_setzero_ps()
                                } else {
                                    a.read()
                                };
                                let mut v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), scale, prev);
                                if with_min {
                                    v = _mm512_fmadd_ps(mins[j], st, v);
                                }
                                if b + 1 == nb {
                                    _mm512_storeu_ps(out_at(j, tok0 + t), v);
                                } else {
                                    a.write(v);
                                }
                            }
                        }
                    }};
                }
                if b + 1 < nb {
                    // Block b + 1's four dots are issued between the float steps of block
                    // b's, so the tile unit and the vector units overlap (one `asm!` block
                    // for all four measured ~25 % slower: the stores waited on the dots).
                    let (a, w, d) = (a_of(b + 1), w_of(b + 1), tiles_of(b + 1));
                    asm!(
                        "tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3",
                        "tileloadd tmm4, [{a0} + {sa} * 1]",
                        "tileloadd tmm6, [{w0} + {s64} * 1]",
                        "tdpbsud tmm0, tmm4, tmm6",
                        a0 = in(reg) a[0], sa = in(reg) dim, w0 = in(reg) w[0],
                        s64 = in(reg) 64usize, options(nostack),
                    );
                    asm!(
                        "tileloadd tmm7, [{w1} + {s64} * 1]",
                        "tdpbsud tmm1, tmm4, tmm7",
                        w1 = in(reg) w[1], s64 = in(reg) 64usize, options(nostack),
                    );
                    float_step!(0);
                    asm!(
                        "tileloadd tmm5, [{a1} + {sa} * 1]",
                        "tdpbsud tmm2, tmm5, tmm6",
                        a1 = in(reg) a[1], sa = in(reg) dim, options(nostack),
                    );
                    asm!("tdpbsud tmm3, tmm5, tmm7", options(nostack, nomem));
                    float_step!(1);
                    asm!(
                        "tilestored [{d0} + {s64} * 1], tmm0",
                        "tilestored [{d1} + {s64} * 1], tmm1",
                        "tilestored [{d2} + {s64} * 1], tmm2",
                        "tilestored [{d3} + {s64} * 1], tmm3",
                        d0 = in(reg) d[0], d1 = in(reg) d[1], d2 = in(reg) d[2],
                        d3 = in(reg) d[3], s64 = in(reg) 64usize, options(nostack),
                    );
                } else {
                    float_step!(0);
                    float_step!(1);
                }
            }
        }
    }
}

/// The roofline's int8 loop on the `amx` tier: `iters` × 12 `tdpbssd` of full tiles
/// (16 × 64 bytes by 16 × 64, 16,384 multiply-adds each) into four accumulator tiles, A
/// tiles of 3s and B tiles of 5s; returns the sum of the accumulators, `iters · 12 · 4096
/// · 60` (as `roofline::expected_sum` counts: each of a tile's 4,096 (element, quad) pairs adds
/// four products 3·5 per instruction). The i32 accumulators wrap past about 700,000
/// iterations, which only the checksum notices.
///
/// # Safety
/// [`available`] must be true.
pub unsafe fn tdpbssd_peak(iters: u64) -> f64 {
    static FULL: TileConfig = TileConfig::new(&[(16, 64); 8]);
    let threes = [[3i8; 64]; 16];
    let fives = [[5i8; 64]; 16];
    let mut c = [[0i32; 16]; 64];
    // SAFETY: AMX available (caller); the configuration is valid; every tile load and
    // store covers 16 rows of 64 bytes of `ones` / `c` (c holds four such tiles).
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) FULL.0.as_ptr(), options(nostack, readonly));
        asm!(
            "tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3",
            "tileloadd tmm4, [{a} + {s} * 1]", "tileloadd tmm5, [{a} + {s} * 1]",
            "tileloadd tmm6, [{b} + {s} * 1]", "tileloadd tmm7, [{b} + {s} * 1]",
            a = in(reg) threes.as_ptr(), b = in(reg) fives.as_ptr(), s = in(reg) 64usize,
            options(nostack, readonly),
        );
        for _ in 0..iters {
            asm!(
                "tdpbssd tmm0, tmm4, tmm6",
                "tdpbssd tmm1, tmm4, tmm7",
                "tdpbssd tmm2, tmm5, tmm6",
                "tdpbssd tmm3, tmm5, tmm7",
                "tdpbssd tmm0, tmm5, tmm7",
                "tdpbssd tmm1, tmm5, tmm6",
                "tdpbssd tmm2, tmm4, tmm7",
                "tdpbssd tmm3, tmm4, tmm6",
                "tdpbssd tmm0, tmm4, tmm7",
                "tdpbssd tmm1, tmm5, tmm7",
                "tdpbssd tmm2, tmm4, tmm6",
                "tdpbssd tmm3, tmm5, tmm6",
                options(nostack, nomem),
            );
        }
        asm!(
            "tilestored [{c} + {s} * 1], tmm0",
            "tilestored [{c1} + {s} * 1], tmm1",
            "tilestored [{c2} + {s} * 1], tmm2",
            "tilestored [{c3} + {s} * 1], tmm3",
            c = in(reg) c.as_mut_ptr(), c1 = in(reg) c.as_mut_ptr().add(16),
            c2 = in(reg) c.as_mut_ptr().add(32), c3 = in(reg) c.as_mut_ptr().add(48),
            s = in(reg) 64usize, options(nostack),
        );
        asm!("tilerelease", options(nostack, nomem));
    }
    c.iter().flatten().map(|&v| v as f64).sum()
}

/// Operations (2 per multiply-add) of one `tdpbssd` of full tiles.
pub const TDP_OPS: f64 = (16 * 16 * 64 * 2) as f64;

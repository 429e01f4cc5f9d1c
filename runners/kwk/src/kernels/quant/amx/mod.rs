//! The `amx` tier's matmuls for prompts of `AMX_MIN_TOKENS` tokens or more: bf16 tiles
//! where the CPU has AMX-BF16 (`bf16.rs`, the decoder's path: the formats ask for bf16
//! token tiles, `format::quantized_input_kind`), else AMX-INT8 tiles on the
//! q8 activations (below; `tiles.rs` holds the tiles themselves, the tile configuration
//! and the CPU/OS probe): [`drive_amx`] walks row groups two at a time and their tokens 32 at a time on
//! the 2 × 2 kernel, 16 at a time on the 16 × 16 one, and hands the last `n % 16` to the
//! VNNI tiles the dispatcher passes in (the tier is `vnni` plus AMX).

pub mod bf16;
mod tiles;

pub use tiles::{available, tdpbssd_peak, TileOut, TileScope, AMX_TOKENS, AMX_TOKENS_2X2, TDP_OPS};

use tiles::{GroupPair, PairScales};

use super::driver::{write_group_row, Q8Rows, QuantIsa, TOKEN_TILE};
use super::layout::{
    Bits, Int8Tiles, LowBitTiles, BLOCK, BYTE_TILE_BYTES, INT8_TILE_BYTES, ROW_GROUP,
};
use super::zmm::widen_group_codes;
use crate::kernels::OutputMatrix;
use std::ops::Range;

/// The outputs of the `amx` tier's three kernel sizes.
pub type Out2x2 = [[[f32; ROW_GROUP]; AMX_TOKENS_2X2]; 2];
pub type Out16 = [[f32; ROW_GROUP]; AMX_TOKENS];
pub type Out8 = [[f32; ROW_GROUP]; TOKEN_TILE];

/// One matrix's kernels for [`drive_amx`].
pub trait AmxKernels {
    /// Readies row groups `g..g + groups` (1 or 2) before their tiles run.
    fn prepare(&mut self, g: usize, groups: usize);
    /// Groups `g`, `g + 1` × tokens `t0..t0 + 32` (2 × 2 AMX kernel).
    ///
    /// # Safety
    /// As `tiles::tile_2x2` for `out`: its
    /// 2 × 32 rows of 16 floats are writable and this thread's alone during the call.
    unsafe fn tile_2x2(&mut self, g: usize, t0: usize, out: &TileOut);
    /// Group `g` (`j`-th of its step) × tokens `t0..t0 + 16` (16 × 16 AMX kernel).
    fn tile16(&mut self, g: usize, j: usize, t0: usize, out: &mut Out16);
    /// Group `g` × tokens `t0..t0 + n`, `n <= 8` (VNNI tile).
    fn tile_vnni(&mut self, g: usize, t0: usize, n: usize, out: &mut Out8);
}

/// The `amx` tier's walk over `rows` for `n_tokens` tokens: row groups two at a time
/// (readied once, so each widening of codes serves the whole prompt), tokens 32 at a
/// time on the 2 × 2 kernel; then each group's remaining tokens 16 at a time on the
/// 16 × 16 one and the last `n % 16` on the VNNI tiles (an odd last group takes only
/// those two). Writes `y`'s columns of `rows`. Loads the tile configuration for the
/// call (this thread).
pub fn drive_amx(rows: Range<usize>, n_tokens: usize, y: &OutputMatrix, k: &mut impl AmxKernels) {
    assert!(available() && QuantIsa::Avx512Vnni.is_available());
    // SAFETY: AMX is available (asserted); the scope lives for this call, on this thread.
    let _tiles = unsafe { TileScope::int8() };
    let write = |t: usize, g: usize, o: &[f32; ROW_GROUP]| write_group_row(y, rows.end, t, g, o);
    let (mut out16, mut out8): (Out16, Out8) = Default::default();
    let groups = rows.start / ROW_GROUP..rows.end.div_ceil(ROW_GROUP);
    let mut g = groups.start;
    while g < groups.end {
        let step = if g + 1 < groups.end { 2 } else { 1 };
        k.prepare(g, step);
        let mut from = 0;
        if step == 2 {
            // Both groups whole in `rows`: the kernel writes into `y` itself. The copy
            // from a buffer here had 6 % of an int8 pp512 profile's samples; in place,
            // the kernel's stores take most of that (their cache misses stay), about
            // 1 % of the total is saved.
            let whole = (g + 2) * ROW_GROUP <= rows.end;
            while from + AMX_TOKENS_2X2 <= n_tokens {
                if whole {
                    let at = |j: usize| {
                        y.block_ptr(from, AMX_TOKENS_2X2, (g + j) * ROW_GROUP, ROW_GROUP)
                    };
                    let out = TileOut {
                        groups: [at(0), at(1)],
                        ld: y.ld(),
                    };
                    // SAFETY: `block_ptr` checked each group's 32 tokens × 16 columns;
                    // they are in `rows`, which this thread owns in `y`.
                    unsafe { k.tile_2x2(g, from, &out) };
                } else {
                    // A partial pair (only a matrix's or a slice's last rows): a
                    // buffer, made here so whole pairs never zero one.
                    let mut out2 = Out2x2::default();
                    let [b0, b1] = &mut out2;
                    let out = TileOut {
                        groups: [b0.as_mut_ptr().cast(), b1.as_mut_ptr().cast()],
                        ld: ROW_GROUP,
                    };
                    // SAFETY: `out2` holds each group's 32 rows of 16 floats.
                    unsafe { k.tile_2x2(g, from, &out) };
                    for (j, out_j) in out2.iter().enumerate() {
                        for (t, o) in out_j.iter().enumerate() {
                            write(from + t, g + j, o);
                        }
                    }
                }
                from += AMX_TOKENS_2X2;
            }
        }
        for j in 0..step {
            let mut t0 = from;
            while t0 + AMX_TOKENS <= n_tokens {
                k.tile16(g + j, j, t0, &mut out16);
                for (t, o) in out16.iter().enumerate() {
                    write(t0 + t, g + j, o);
                }
                t0 += AMX_TOKENS;
            }
            while t0 < n_tokens {
                let n = (n_tokens - t0).min(TOKEN_TILE);
                k.tile_vnni(g + j, t0, n, &mut out8);
                for (t, o) in out8.iter().take(n).enumerate() {
                    write(t0 + t, g + j, o);
                }
                t0 += n;
            }
        }
        g += step;
    }
}

/// [`int8_matmul`](super::int8_matmul) on the `amx` tier ([`drive_amx`]; the tiles are
/// AMX's B layout as they are, so nothing is readied); `vnni(g, t0, n, out)` runs the
/// `n <= 8` tokens the AMX tiles leave (the `vnni` tier's tile).
pub fn int8_matmul(
    w: &Int8Tiles,
    x: &Q8Rows,
    rows: Range<usize>,
    y: &OutputMatrix,
    vnni: impl FnMut(usize, usize, usize, &mut Out8),
) {
    struct Int8Amx<'a, V> {
        w: &'a Int8Tiles<'a>,
        x: &'a Q8Rows<'a>,
        vnni: V,
    }
    // SAFETY (every call below): `drive_amx` asserted AMX and the VNNI tier (AVX-512
    // F/BW/VNNI) and holds the tile configuration; the caller checked `w` and `x`; the
    // driver passes groups of `rows` (within the matrix) and tokens below n_tokens.
    impl<V: FnMut(usize, usize, usize, &mut Out8)> AmxKernels for Int8Amx<'_, V> {
        fn prepare(&mut self, _g: usize, _groups: usize) {}
        unsafe fn tile_2x2(&mut self, g: usize, t0: usize, out: &TileOut) {
            let nb = self.w.n_blocks();
            let codes = |j: usize| self.w.qs[(g + j) * nb * INT8_TILE_BYTES..].as_ptr();
            let scales = |j: usize| {
                PairScales::Sym(self.w.scales[(g + j) * nb * ROW_GROUP..].as_ptr() as *const u16)
            };
            let gp = GroupPair {
                codes: [codes(0), codes(1)],
                scales: [scales(0), scales(1)],
                nb,
                ncg: nb,
                bpg: 1,
            };
            // SAFETY: see the impl and the caller's contract for `out`; per-block scales,
            // so ncg = nb and one block a group.
            unsafe { tiles::tile_2x2::<true>(&gp, self.x, &[], t0, out) };
        }
        fn tile16(&mut self, g: usize, _j: usize, t0: usize, out: &mut Out16) {
            // SAFETY: see the impl.
            unsafe { tiles::int8_tile16(self.w, self.x, g, t0, out) };
        }
        fn tile_vnni(&mut self, g: usize, t0: usize, n: usize, out: &mut Out8) {
            (self.vnni)(g, t0, n, out);
        }
    }
    drive_amx(rows, x.n_tokens, y, &mut Int8Amx { w, x, vnni });
}

/// [`lowbit_matmul`](super::lowbit_matmul) on the `amx` tier ([`drive_amx`]): each pair
/// of row groups has its 3- to 6-bit codes widened to bytes once (8-bit codes are bytes
/// already). `s_all` holds every token's minimum terms; `vnni(g, t0, n, s, out)` runs the
/// `n <= 8` tokens the AMX tiles leave (`s` their minimum terms; the `vnni` tier's tile).
pub fn lowbit_matmul(
    w: &LowBitTiles,
    x: &Q8Rows,
    s_all: &[f32],
    rows: Range<usize>,
    y: &OutputMatrix,
    vnni: impl FnMut(usize, usize, usize, &[f32], &mut Out8),
) {
    struct LowBitAmx<'a, V> {
        w: &'a LowBitTiles<'a>,
        x: &'a Q8Rows<'a>,
        s_all: &'a [f32],
        /// The step's groups' codes widened to bytes (unused for 8-bit codes).
        widened: [Vec<u8>; 2],
        vnni: V,
    }
    impl<V> LowBitAmx<'_, V> {
        /// Group `g` (`j`-th of its step)'s codes in B layout.
        fn codes(&self, g: usize, j: usize) -> &[u8] {
            let nb = self.w.n_blocks();
            match self.w.bits {
                Bits::B8 => &self.w.nibbles[g * nb * BYTE_TILE_BYTES..][..nb * BYTE_TILE_BYTES],
                Bits::B3 | Bits::B4 | Bits::B5 | Bits::B6 => &self.widened[j],
            }
        }
        fn s(&self, t0: usize, n: usize) -> &[f32] {
            let ncg = self.w.n_col_groups();
            &self.s_all[t0 * ncg..(t0 + n) * ncg]
        }
    }
    // SAFETY (every call below): `drive_amx` asserted AMX and the VNNI tier (AVX-512
    // F/BW/VNNI) and holds the tile configuration; the caller checked `w` and `x`; the
    // driver passes groups of `rows` (within the matrix) and tokens below n_tokens, and
    // readies each step's groups before their tiles.
    impl<V: FnMut(usize, usize, usize, &[f32], &mut Out8)> AmxKernels for LowBitAmx<'_, V> {
        fn prepare(&mut self, g: usize, groups: usize) {
            if self.w.bits != Bits::B8 {
                for j in 0..groups {
                    // SAFETY: see the impl.
                    unsafe { widen_group_codes(self.w, g + j, &mut self.widened[j]) };
                }
            }
        }
        unsafe fn tile_2x2(&mut self, g: usize, t0: usize, out: &TileOut) {
            let w = self.w;
            let (ncg, bpg) = (w.n_col_groups(), w.group_size / BLOCK);
            let at = |j: usize| PairScales::LowBit(w.group_scales(g + j));
            let gp = GroupPair {
                codes: [self.codes(g, 0).as_ptr(), self.codes(g + 1, 1).as_ptr()],
                scales: [at(0), at(1)],
                nb: w.n_blocks(),
                ncg,
                bpg,
            };
            let s = self.s(t0, AMX_TOKENS_2X2);
            // SAFETY: see the impl, and the caller's contract for `out`.
            unsafe { tiles::tile_2x2::<false>(&gp, self.x, s, t0, out) };
        }
        fn tile16(&mut self, g: usize, j: usize, t0: usize, out: &mut Out16) {
            let (codes, s) = (self.codes(g, j), self.s(t0, AMX_TOKENS));
            // SAFETY: see the impl.
            unsafe { tiles::lowbit_tile16(self.w, codes, self.x, s, g, t0, out) };
        }
        fn tile_vnni(&mut self, g: usize, t0: usize, n: usize, out: &mut Out8) {
            let ncg = self.w.n_col_groups();
            (self.vnni)(g, t0, n, &self.s_all[t0 * ncg..(t0 + n) * ncg], out);
        }
    }
    let len = match w.bits {
        Bits::B8 => 0,
        Bits::B3 | Bits::B4 | Bits::B5 | Bits::B6 => w.n_blocks() * BYTE_TILE_BYTES,
    };
    let widened = [vec![0u8; len], vec![0u8; len]];
    drive_amx(
        rows,
        x.n_tokens,
        y,
        &mut LowBitAmx {
            w,
            x,
            s_all,
            widened,
            vnni,
        },
    );
}

//! The scalar tier's quantized matmuls (int8 tiles and 3-, 4-, 5-, 6-, 8-bit codes), bit-exact
//! with the integer specifications `int8_tile_scalar` and `lowbit_tile_scalar`, which take
//! one code at a time (the decoder's prompts ran 8-11x slower on them: int8 7.4, int4 4.4
//! tokens/s at pp128 on 2 AVX2 cores).
//!
//! A row group's codes are widened once into a panel and the activations once per call;
//! each 32-column block's 16 row dots then reuse every panel load for up to [`TOKENS`]
//! tokens ([`BlockDots`]). Generation (one token, each code used once) reads the packed
//! tiles directly instead, asking for the codes [`GEMV_PREFETCH_BYTES`] ahead. On x86-64
//! the panel holds i16 code pairs for SSE2's `pmaddwd` (`sse2.rs`: SSE2 is in
//! every x86-64 CPU); elsewhere ([`F32Dots`]) it is
//! `[column][16 rows]` f32, the float32 panel layout, and the dots are f32 multiply-adds
//! the compiler vectorizes (NEON on aarch64). Both are exact: a block dot `Σ q·a` has
//! codes `|q| <= 255` and activations `|a| <= 128`, so every partial sum is an integer of
//! magnitude below `32 · 255 · 128 < 2^24`, exact in i32 and in f32 whatever the order.
//! After the dot the specification's float steps follow in its order: per block
//! `acc = dot · (d_w · d_a) + acc`, and for low-bit codes per column group
//! `acc = m · S + acc`, rounded as this tier rounds ([`Rounding`]): twice on x86-64,
//! whose baseline has no FMA, once elsewhere.
//!
//! Measured (`speed`, `KWK_ISA=scalar`, 2 threads on an AMD Zen 3, pp512 / tg32 tokens/s):
//! f32 dots int8 60 / 13, int4 50 / 14; `pmaddwd` dots int8 94-95 / 31-32, int4 71 / 28;
//! float32 115-119 / 33-34, the steps then emulating a fused multiply-add in f64. Rounding
//! twice instead (a multiply and an add per 4 rows) took the prompts past float32 on a Zen 5
//! (see [`Rounding`] for the figures).

#[cfg(target_arch = "x86_64")]
mod sse2;

use super::driver::{Q8Rows, QuantIsa, Rounding, TileAt, TOKEN_TILE};
use super::layout::{
    code_tile_bytes, tile_code, Bits, Int8Tiles, LowBitTiles, BLOCK, INT8_TILE_BYTES, ROW_GROUP,
};
use crate::kernels::{prefetch_hint, GEMV_PREFETCH_BYTES};

/// Tokens that share each load of the weight panel.
const TOKENS: usize = 2;

/// How the scalar tier holds a row group's widened codes and a call's activations, and
/// takes a block's 16 row dots from them. Every implementation gives the exact integer
/// dots (as f32, exact below 2^24).
pub(crate) trait BlockDots {
    /// One element of the widened codes.
    type Lane: Copy + Default;
    /// One element of the widened activations.
    type Act: Copy;
    /// Lanes per 32-column block of 16 rows.
    const LANES_PER_BLOCK: usize;
    /// Activation elements per 32-column block of one token.
    const ACTS_PER_BLOCK: usize;
    /// The activations `[token][column]` as `[token][block][ACTS_PER_BLOCK]`.
    fn widen_acts(quants: &[i8]) -> Vec<Self::Act>;
    /// One block's code tile (and, for 3-, 5- and 6-bit codes, its high tile; layouts as
    /// `layout::tile_code` reads them) into its panel lanes as `code - offset`.
    fn widen_block(
        bits: Bits,
        tile: &[u8],
        high_bits: &[u8],
        offset: i16,
        lanes: &mut [Self::Lane],
    );
    /// The 16 rows' dots of one block with `N` tokens' activations of that block.
    fn block_dots<const N: usize>(
        lanes: &[Self::Lane],
        acts: [&[Self::Act]; N],
    ) -> [[f32; ROW_GROUP]; N];
    /// The 16 rows' dots of one block read straight from its packed tile (codes minus
    /// `offset`) with one token's 32 activations `acts` (`block_sum` their sum): for calls
    /// of too few tokens to repay widening the group (generation).
    fn packed_block_dots(
        bits: Bits,
        tile: &[u8],
        high_bits: &[u8],
        offset: i16,
        acts: &[i8],
        block_sum: i32,
    ) -> [f32; ROW_GROUP];
}

/// The block dots of the target's scalar tier: SSE2's `pmaddwd` on x86-64 (part of its
/// baseline), f32 multiply-adds elsewhere.
#[cfg(target_arch = "x86_64")]
pub(crate) type BaselineDots = sse2::PairDots;
#[cfg(not(target_arch = "x86_64"))]
pub(crate) type BaselineDots = F32Dots;

/// Block dots as f32 multiply-adds across the 16 rows of a `[column][row]` panel (the
/// float32 panel layout), which the compiler vectorizes with any SIMD it has. The scalar
/// tier's dots off x86-64; on x86-64 a test holds [`BaselineDots`] to it.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
pub(crate) struct F32Dots;

impl BlockDots for F32Dots {
    type Lane = f32;
    type Act = f32;
    const LANES_PER_BLOCK: usize = BLOCK * ROW_GROUP;
    const ACTS_PER_BLOCK: usize = BLOCK;

    fn widen_acts(quants: &[i8]) -> Vec<f32> {
        quants.iter().map(|&q| q as f32).collect()
    }

    fn widen_block(bits: Bits, tile: &[u8], high_bits: &[u8], offset: i16, lanes: &mut [f32]) {
        for c in 0..BLOCK {
            for r in 0..ROW_GROUP {
                let q = tile_code(bits, tile, high_bits, c / 4, r, c % 4);
                lanes[c * ROW_GROUP + r] = (q as i16 - offset) as f32;
            }
        }
    }

    fn packed_block_dots(
        bits: Bits,
        tile: &[u8],
        high_bits: &[u8],
        offset: i16,
        acts: &[i8],
        _block_sum: i32,
    ) -> [f32; ROW_GROUP] {
        let mut s = [0f32; ROW_GROUP];
        for (c, &a) in acts[..BLOCK].iter().enumerate() {
            for (r, s_r) in s.iter_mut().enumerate() {
                let q = tile_code(bits, tile, high_bits, c / 4, r, c % 4) as i16 - offset;
                *s_r += q as f32 * a as f32;
            }
        }
        s
    }

    /// Each panel column is loaded once for all `N` tokens.
    #[inline(always)]
    fn block_dots<const N: usize>(lanes: &[f32], acts: [&[f32]; N]) -> [[f32; ROW_GROUP]; N] {
        let mut s = [[0f32; ROW_GROUP]; N];
        for (c, w) in lanes.chunks_exact(ROW_GROUP).enumerate() {
            for (s_t, a_t) in s.iter_mut().zip(&acts) {
                let a = a_t[c];
                for (s_r, &w_r) in s_t.iter_mut().zip(w) {
                    *s_r += w_r * a;
                }
            }
        }
        s
    }
}

/// Calls of at most this many tokens read each block's codes straight from the packed
/// tile ([`BlockDots::packed_block_dots`]) instead of widening the row group first: in
/// generation each code is used once, and widening it (a store and a reload of twice its
/// bytes) took more time than the dots (35 % of a scalar int8 tg128 profile against 20 %
/// for the dots and float steps together; tg128 int8 48-50 -> 48-56, int4 47 -> 55-57
/// tokens/s before [`GEMV_PREFETCH_BYTES`]).
const PACKED_MAX_TOKENS: usize = 1;

/// The state of one matmul call on the scalar tier: the activations widened once and
/// the row group whose codes and scales are currently widened (calls of up to
/// [`PACKED_MAX_TOKENS`] tokens widen only the scales).
pub(crate) struct WidenedDots<D: BlockDots = BaselineDots> {
    /// `[token][block][D::ACTS_PER_BLOCK]` activations (empty when `packed`).
    acts: Vec<D::Act>,
    /// Whether the codes are read from their packed tiles.
    packed: bool,
    /// The group held in `panel`, `scales` and `mins`.
    group: Option<usize>,
    /// `[block][D::LANES_PER_BLOCK]` codes of the group (empty when `packed`).
    panel: Vec<D::Lane>,
    /// `[block or column group][row]` scales as f32.
    scales: Vec<f32>,
    /// `[column group][row]` minimums as f32 (low-bit codes).
    mins: Vec<f32>,
}

/// One row group's packed code tiles, for [`BlockDots::packed_block_dots`].
#[derive(Clone, Copy)]
struct PackedCodes<'a> {
    bits: Bits,
    /// The group's code tiles, `tile_bytes` each.
    tiles: &'a [u8],
    tile_bytes: usize,
    /// The group's high tiles (3-, 5- and 6-bit codes), `high_bytes` each, else empty.
    high_bits: &'a [u8],
    high_bytes: usize,
    offset: i16,
}

impl<D: BlockDots> WidenedDots<D> {
    /// Widens `x`'s activations (once per matmul call) unless the call is short enough to
    /// read codes packed.
    pub(crate) fn new(x: &Q8Rows) -> Self {
        let packed = x.n_tokens <= PACKED_MAX_TOKENS;
        WidenedDots {
            acts: if packed {
                Vec::new()
            } else {
                D::widen_acts(&x.quants[..x.n_tokens * x.dim])
            },
            packed,
            group: None,
            panel: Vec::new(),
            scales: Vec::new(),
            mins: Vec::new(),
        }
    }

    /// `int8_tile_scalar`'s result for the tile `at`.
    pub(crate) fn int8_tile(
        &mut self,
        w: &Int8Tiles,
        x: &Q8Rows,
        at: TileAt,
        out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
    ) {
        let TileAt { g, t0, n } = at;
        let nb = w.n_blocks();
        let tiles = &w.qs[g * nb * INT8_TILE_BYTES..][..nb * INT8_TILE_BYTES];
        if self.group != Some(g) {
            if !self.packed {
                self.panel
                    .resize(nb * D::LANES_PER_BLOCK, D::Lane::default());
                for (b, tile) in tiles.chunks_exact(INT8_TILE_BYTES).enumerate() {
                    let lanes = &mut self.panel[b * D::LANES_PER_BLOCK..][..D::LANES_PER_BLOCK];
                    D::widen_block(Bits::B8, tile, &[], 128, lanes);
                }
            }
            let scales = &w.scales[g * nb * ROW_GROUP..][..nb * ROW_GROUP];
            widen_f16(scales, &mut self.scales);
            self.group = Some(g);
        }
        let groups = Groups {
            blocks_per_group: 1,
            n_groups: nb,
            min_terms: None,
        };
        let codes = PackedCodes {
            bits: Bits::B8,
            tiles,
            tile_bytes: INT8_TILE_BYTES,
            high_bits: &[],
            high_bytes: 0,
            offset: 128,
        };
        self.tokens(x, groups, codes, t0, n, out);
    }

    /// `lowbit_tile_scalar`'s result for the tile `at`; `s` holds the tokens' minimum
    /// terms `[t * n_col_groups + cg]`.
    pub(crate) fn lowbit_tile(
        &mut self,
        w: &LowBitTiles,
        x: &Q8Rows,
        s: &[f32],
        at: TileAt,
        out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
    ) {
        let TileAt { g, t0, n } = at;
        let nb = w.n_blocks();
        let ncg = w.n_col_groups();
        let tile_bytes = code_tile_bytes(w.bits);
        let tiles = &w.nibbles[g * nb * tile_bytes..][..nb * tile_bytes];
        let high_bytes = w.bits.high_tile_bytes();
        let high_bits = &w.high_bits[g * nb * high_bytes..][..nb * high_bytes];
        if self.group != Some(g) {
            if !self.packed {
                self.panel
                    .resize(nb * D::LANES_PER_BLOCK, D::Lane::default());
                for b in 0..nb {
                    let lanes = &mut self.panel[b * D::LANES_PER_BLOCK..][..D::LANES_PER_BLOCK];
                    let (tile, high) = block_tiles((tiles, tile_bytes), (high_bits, high_bytes), b);
                    D::widen_block(w.bits, tile, high, 0, lanes);
                }
            }
            // `d = D · sc`, `m = M · mc` (exact in f32).
            self.scales.clear();
            self.mins.clear();
            for cg in 0..ncg {
                self.scales
                    .extend((0..ROW_GROUP).map(|r| w.scale(g, cg, r)));
                self.mins.extend((0..ROW_GROUP).map(|r| w.min(g, cg, r)));
            }
            self.group = Some(g);
        }
        let groups = Groups {
            blocks_per_group: w.group_size / BLOCK,
            n_groups: ncg,
            min_terms: Some(s),
        };
        let codes = PackedCodes {
            bits: w.bits,
            tiles,
            tile_bytes,
            high_bits,
            high_bytes,
            offset: 0,
        };
        self.tokens(x, groups, codes, t0, n, out);
    }

    /// Runs tokens `t0..t0 + n` on the widened group, [`TOKENS`] at a time, or one by one
    /// on the packed `codes`.
    fn tokens(
        &self,
        x: &Q8Rows,
        groups: Groups,
        codes: PackedCodes,
        t0: usize,
        n: usize,
        out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
    ) {
        let step = if self.packed { 1 } else { TOKENS };
        let mut t = 0;
        while t < n {
            let m = (n - t).min(step);
            let o = &mut out[t..t + m];
            let run = TokenRun {
                x,
                groups,
                first: t,
                tok: t0 + t,
            };
            if self.packed {
                let nb = x.n_blocks();
                self.token_run::<1>(run, o, |b| {
                    let (tile, high) = block_tiles(
                        (codes.tiles, codes.tile_bytes),
                        (codes.high_bits, codes.high_bytes),
                        b,
                    );
                    // A group's tiles follow each other, the next group's the last.
                    let ahead = tile.as_ptr().wrapping_add(GEMV_PREFETCH_BYTES);
                    prefetch_hint(ahead, codes.tile_bytes);
                    if !high.is_empty() {
                        // The high tiles are a stream of their own.
                        let ahead = high.as_ptr().wrapping_add(GEMV_PREFETCH_BYTES);
                        prefetch_hint(ahead, codes.high_bytes);
                    }
                    let at = run.tok * nb + b;
                    let acts = &x.quants[at * BLOCK..][..BLOCK];
                    [D::packed_block_dots(
                        codes.bits,
                        tile,
                        high,
                        codes.offset,
                        acts,
                        x.block_sums[at],
                    )]
                });
            } else {
                match m {
                    1 => self.widened_run::<1>(run, o),
                    2 => self.widened_run::<2>(run, o),
                    3 => self.widened_run::<3>(run, o),
                    _ => self.widened_run::<4>(run, o),
                }
            }
            t += m;
        }
    }

    /// [`Self::token_run`] on the widened group's panel and activations.
    fn widened_run<const N: usize>(&self, run: TokenRun, out: &mut [[f32; ROW_GROUP]]) {
        let nb = run.x.n_blocks();
        self.token_run::<N>(run, out, |b| {
            let acts: [&[D::Act]; N] = std::array::from_fn(|t| {
                &self.acts[((run.tok + t) * nb + b) * D::ACTS_PER_BLOCK..][..D::ACTS_PER_BLOCK]
            });
            let lanes = &self.panel[b * D::LANES_PER_BLOCK..][..D::LANES_PER_BLOCK];
            D::block_dots(lanes, acts)
        });
    }

    /// `N` tokens over every block of the group, `block_dots(b)` giving block `b`'s exact
    /// dots: then the specification's scale and minimum steps in its order.
    fn token_run<const N: usize>(
        &self,
        run: TokenRun,
        out: &mut [[f32; ROW_GROUP]],
        block_dots: impl Fn(usize) -> [[f32; ROW_GROUP]; N],
    ) {
        let x = run.x;
        let nb = x.n_blocks();
        let ncg = run.groups.n_groups;
        let bpg = run.groups.blocks_per_group;
        let mut acc = [[0f32; ROW_GROUP]; N];
        for cg in 0..ncg {
            let ds = &self.scales[cg * ROW_GROUP..][..ROW_GROUP];
            for b in cg * bpg..((cg + 1) * bpg).min(nb) {
                let dots = block_dots(b);
                for (t, (acc_t, dot_t)) in acc.iter_mut().zip(&dots).enumerate() {
                    let da = x.scales[(run.tok + t) * nb + b];
                    step_rows(acc_t, dot_t, &std::array::from_fn(|r| ds[r] * da));
                }
            }
            if let Some(s) = run.groups.min_terms {
                let ms = self.mins[cg * ROW_GROUP..][..ROW_GROUP].try_into().unwrap();
                for (t, acc_t) in acc.iter_mut().enumerate() {
                    let st = s[(run.first + t) * ncg + cg];
                    step_rows(acc_t, ms, &[st; ROW_GROUP]);
                }
            }
        }
        out.copy_from_slice(&acc);
    }
}

/// `src` as f32 into `dst` (resized to match), the slice at once: value by value the
/// conversions took a third of the scalar tier's int4 generation profile (each one a call
/// that checks the CPU's features), since generation converts each group's scales once
/// per 16 rows × 32 codes.
fn widen_f16(src: &[half::f16], dst: &mut Vec<f32>) {
    use half::slice::HalfFloatSliceExt;
    dst.resize(src.len(), 0.0);
    src.convert_to_f32_slice(dst);
}

/// Block `b`'s code tile and (3-, 5- and 6-bit codes) high tile within a group's tiles
/// (each given with its bytes per block).
fn block_tiles<'a>(
    (tiles, tile_bytes): (&'a [u8], usize),
    (high_bits, high_bytes): (&'a [u8], usize),
    b: usize,
) -> (&'a [u8], &'a [u8]) {
    (
        &tiles[b * tile_bytes..][..tile_bytes],
        &high_bits[b * high_bytes..][..high_bytes],
    )
}

/// `acc[r] = a[r] · b[r] + acc[r]` for a row group, rounded as the scalar tier rounds
/// ([`QuantIsa::rounding`]: twice on x86-64 without FMA, where the compiler makes it a
/// multiply and an add per 4 rows; once elsewhere).
#[inline(always)]
fn step_rows(acc: &mut [f32; ROW_GROUP], a: &[f32; ROW_GROUP], b: &[f32; ROW_GROUP]) {
    const ROUNDING: Rounding = QuantIsa::Scalar.rounding();
    for r in 0..ROW_GROUP {
        acc[r] = ROUNDING.step(a[r], b[r], acc[r]);
    }
}

/// How blocks share scales: int8 tiles have a scale per block, low-bit codes per column
/// group of `blocks_per_group` blocks, and a minimum whose terms `min_terms` holds
/// (`[t * n_groups + cg]` for the call's token `t`).
#[derive(Clone, Copy)]
struct Groups<'a> {
    blocks_per_group: usize,
    n_groups: usize,
    min_terms: Option<&'a [f32]>,
}

/// The tokens of one [`WidenedDots::token_run`]: the first at `tok` in `x`, at `first` in
/// the call's minimum terms.
#[derive(Clone, Copy)]
struct TokenRun<'a> {
    x: &'a Q8Rows<'a>,
    groups: Groups<'a>,
    first: usize,
    tok: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both block-dot implementations widen every code layout (or read it packed) and give
    /// the exact integer dots, extremes included (codes 0 and 255, activations -128 and 127).
    #[test]
    fn block_dots_are_the_exact_integer_dots() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for (bits, offset) in [
            (Bits::B3, 0i16),
            (Bits::B4, 0),
            (Bits::B5, 0),
            (Bits::B6, 0),
            (Bits::B8, 0),
            (Bits::B8, 128),
        ] {
            for trial in 0..20 {
                let mut byte = |extreme: bool| match (extreme, next() % 3) {
                    (true, 0) => 0u8,
                    (true, _) => 255,
                    _ => next() as u8,
                };
                let tile: Vec<u8> = (0..code_tile_bytes(bits))
                    .map(|_| byte(trial < 2))
                    .collect();
                let high: Vec<u8> = (0..bits.high_tile_bytes())
                    .map(|_| byte(trial < 2))
                    .collect();
                let quants: Vec<i8> = (0..2 * BLOCK)
                    .map(|_| match (trial, next() % 2) {
                        (0, 0) => -128,
                        (0, _) => 127,
                        _ => next() as i8,
                    })
                    .collect();
                let high_bits: &[u8] = &high;
                let want: [[f32; ROW_GROUP]; 2] = std::array::from_fn(|t| {
                    std::array::from_fn(|r| {
                        (0..BLOCK)
                            .map(|c| {
                                let q = tile_code(bits, &tile, high_bits, c / 4, r, c % 4);
                                (q as i32 - offset as i32) * quants[t * BLOCK + c] as i32
                            })
                            .sum::<i32>() as f32
                    })
                });
                fn dots<D: BlockDots>(
                    bits: Bits,
                    tile: &[u8],
                    high_bits: &[u8],
                    offset: i16,
                    quants: &[i8],
                ) -> [[f32; ROW_GROUP]; 2] {
                    let mut lanes = vec![D::Lane::default(); D::LANES_PER_BLOCK];
                    D::widen_block(bits, tile, high_bits, offset, &mut lanes);
                    let acts = D::widen_acts(quants);
                    let (a0, a1) = acts.split_at(D::ACTS_PER_BLOCK);
                    let two = D::block_dots::<2>(&lanes, [a0, a1]);
                    assert_eq!(D::block_dots::<1>(&lanes, [a1])[0], two[1]);
                    for (t, q) in quants.chunks_exact(BLOCK).enumerate() {
                        let sum = q.iter().map(|&a| a as i32).sum();
                        let packed = D::packed_block_dots(bits, tile, high_bits, offset, q, sum);
                        assert_eq!(packed, two[t], "packed, token {t}");
                    }
                    two
                }
                let what = format!("{bits:?} codes, offset {offset}, trial {trial}");
                assert_eq!(
                    dots::<F32Dots>(bits, &tile, high_bits, offset, &quants),
                    want,
                    "f32 {what}"
                );
                assert_eq!(
                    dots::<BaselineDots>(bits, &tile, high_bits, offset, &quants),
                    want,
                    "baseline {what}"
                );
            }
        }
    }
}

//! The quantized weights' packed layout, the one thing every tier reads: row groups of
//! [`ROW_GROUP`] rows, blocks of [`BLOCK`] columns, the byte order of each tile, and the
//! views the kernels take of a packed matrix ([`Int8Tiles`], [`LowBitTiles`]). The
//! formats (`format::int8`, `format::int4`) make these layouts; no kernel lives here.
//!
//! ## int8 tiles (symmetric 8-bit, `Int8Tiles`)
//! Made by `format::int8`: rows are interleaved in groups of
//! [`ROW_GROUP`] = 16. For each row group and each 32-column block there is one 512-byte
//! tile: byte `quad * 64 + row * 4 + k` holds column `4 * quad + k` of row `row` as
//! `q + 128` (`q` in -127..=127), so one 64-byte load gives 16 rows × 4 columns, and one
//! broadcast 4-byte activation quad serves all 16 rows: `vpdpbusd` (u8 × i8, four products
//! summed per 32-bit lane) accumulates the 16 row dots in the 16 lanes of one register, and
//! no horizontal sum is ever needed. The +128 offset makes weights the unsigned operand;
//! the dot is corrected by `-128 · Σa`, the activation block sum that the q8 blocks carry
//! (the accumulator starts at that value). One f16 scale per row and block (8.5 bits per
//! weight, the size of llama.cpp's Q8_0).
//!
//! ## 3-, 4-, 5-, 6- and 8-bit codes (`LowBitTiles`)
//! Unsigned codes `q` in `0..2^bits` with a per-group scale `d` and minimum `m`
//! (`w = d · q + m`, llama.cpp's Q4_1 form), groups of 32, 64 or 128 columns (the last
//! group of a row may be shorter, e.g. 576 = 4 · 128 + 64). Scales and minimums have two
//! levels, as llama.cpp's k-quants do: every [`SUPER_GROUPS`] consecutive groups of a row
//! (a super-block) share an f16 super-scale `D` and an f16 super-minimum `M`, and each
//! group stores an 8-bit sub-scale `sc` (0..=255) and a signed 8-bit sub-minimum `mc`
//! (-127..=127): `d = D · sc`, `m = M · mc`. Both products are exact in f32 (an f16
//! significand of 11 bits times an 8-bit integer), so every tier forms them in any order
//! and agrees to the bit. A group of 32 thus costs 16 bits of scale and minimum, not the
//! 32 of two f16 values, plus 32 bits per super-block: at the same size the groups can be
//! twice as fine (4-bit g32: 4.625 bits per weight where one level cost 5.0). Made by `format::int4`: row
//! groups of 16 as for int8 tiles. Each row group × 32-column block has a code tile and,
//! for 3-, 5- and 6-bit codes, a high tile, built from three kinds of tile that all keep
//! the int8 tile's `row * 4 + k` order inside each 64-byte line (16 rows × 4 columns,
//! one `vpdpbusd` operand once unpacked):
//! - **nibble tile** (256 bytes): byte `j * 64 + row * 4 + k` (`j` in 0..4) holds column
//!   `4j + k` in its low nibble and column `4(j + 4) + k` in its high nibble, so one
//!   64-byte load and two mask/shift ops give two operands;
//! - **pair tile** (128 bytes): byte `h * 64 + row * 4 + k` holds two bits of the code of
//!   quad `4h + j` in its bits `2j..2j + 1`;
//! - **bit tile** (64 bytes): byte `row * 4 + k` holds one bit of the code of quad `q`
//!   (column `4q + k`) in its bit `q`.
//!
//! | bits | code tile | high tile | bytes per block |
//! |---|---|---|---|
//! | 3 | pair tile: bits 0..1 | bit tile: bit 2 | 192 |
//! | 4 | nibble tile | - | 256 |
//! | 5 | nibble tile: bits 0..3 | bit tile: bit 4 | 320 |
//! | 6 | nibble tile: bits 0..3 | pair tile: bits 4..5 | 384 |
//! | 8 | byte tile (the int8 layout, byte `quad * 64 + row * 4 + k`) | - | 512 |
//!
//! Every width thus packs to exactly `bits / 8` bytes per code, and every code is a few
//! whole-register ops away from the byte operand `vpdpbusd`/`vpmaddubsw` take: a nibble
//! is a mask (and a 16-bit shift for quads 4..7); a pair or a bit is a 16-bit shift to
//! its place in the code and a byte mask (the bits a 16-bit shift carries across a byte
//! are masked off), then an OR. A 3-bit code is a pair and a bit (two 64-byte loads
//! cover a block's pairs, one its bits), so 3-bit blocks are 192 bytes with no wasted
//! bit, where a nibble per code would have cost 4. `vpmaddubsw` would saturate on
//! `255 · 127 · 2`, so the paths without VNNI take 8-bit codes as `code - 128` with the
//! sign trick and add back `128 · Σa` (exact integers either way), and sum 5- and 6-bit
//! codes' products over fewer quads in i16 than 3- and 4-bit ones'. Sub-scales and
//! sub-minimums: `[(group * n_col_groups + cg) * 16 + row]`; super-scales and
//! super-minimums: `[(group * n_supers + cg / SUPER_GROUPS) * 16 + row]`.

use half::f16;

/// Rows per interleave group (the packed formats' `row_align`).
pub const ROW_GROUP: usize = 16;
/// Columns per quantization block (the q8 activation block).
pub const BLOCK: usize = 32;
/// Bytes of one int8 tile (16 rows × 32 columns).
pub const INT8_TILE_BYTES: usize = ROW_GROUP * BLOCK;
/// Bytes of the nibble tile of one row group × 32-column block.
pub const NIBBLE_TILE_BYTES: usize = ROW_GROUP * BLOCK / 2;
/// Bytes of a pair tile (two bits of each code of a row group × block): the 6-bit codes'
/// high tile and the 3-bit codes' code tile.
pub const HIGH_BITS_TILE_BYTES: usize = ROW_GROUP * BLOCK / 4;
/// Bytes of a pair tile (the name the layout table uses).
pub const PAIR_TILE_BYTES: usize = HIGH_BITS_TILE_BYTES;
/// Bytes of a bit tile (one bit of each code of a row group × block): the 3- and 5-bit
/// codes' high tile.
pub const BIT_TILE_BYTES: usize = ROW_GROUP * BLOCK / 8;

/// Bytes of an 8-bit code tile.
pub const BYTE_TILE_BYTES: usize = ROW_GROUP * BLOCK;

/// Column groups per super-block: they share one f16 super-scale and super-minimum per row.
pub const SUPER_GROUPS: usize = 8;
/// The largest sub-scale (`d = D · sc`, `sc` in `0..=MAX_SUB_SCALE`).
pub const MAX_SUB_SCALE: i32 = 255;
/// The largest sub-minimum's magnitude (`m = M · mc`, `mc` in `-MAX_SUB_MIN..=MAX_SUB_MIN`).
pub const MAX_SUB_MIN: i32 = 127;

/// The width of a matrix's codes. Every tier matches it exhaustively where it picks a
/// kernel (most kernels take it on as a const generic), so a new width fails to compile
/// at each tier that has no kernel for it yet. Its debug form is the number (`4`): the
/// pack cache's keys hold grids' debug forms, written when the width was a `u32`, and
/// stay as they were.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bits {
    /// 3-bit codes: pair tiles (bits 0..1) and bit tiles (bit 2).
    B3,
    /// 4-bit codes in nibble tiles.
    B4,
    /// 5-bit codes: nibble tiles and bit tiles (bit 4).
    B5,
    /// 6-bit codes: nibble tiles and pair tiles (bits 4..5).
    B6,
    /// 8-bit codes in byte tiles (the int8 tile layout).
    B8,
}

impl std::fmt::Debug for Bits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.get())
    }
}

impl Bits {
    /// The width of `bits`-bit codes, if it is one.
    pub const fn from_u32(bits: u32) -> Option<Bits> {
        match bits {
            3 => Some(Bits::B3),
            4 => Some(Bits::B4),
            5 => Some(Bits::B5),
            6 => Some(Bits::B6),
            8 => Some(Bits::B8),
            _ => None,
        }
    }

    /// Bits per code.
    pub const fn get(self) -> u32 {
        match self {
            Bits::B3 => 3,
            Bits::B4 => 4,
            Bits::B5 => 5,
            Bits::B6 => 6,
            Bits::B8 => 8,
        }
    }

    /// The largest code, `2^bits - 1`.
    pub const fn max_code(self) -> u32 {
        (1 << self.get()) - 1
    }

    /// Bytes of the code tile of one row group × block (pairs for 3-bit codes, nibbles
    /// for 4- to 6-bit, bytes for 8-bit).
    pub const fn code_tile_bytes(self) -> usize {
        code_bytes(self.get())
    }

    /// Bytes of the high tile of one row group × block (bits for 3- and 5-bit codes,
    /// pairs for 6-bit), 0 for widths without one.
    pub const fn high_tile_bytes(self) -> usize {
        high_bytes(self.get())
    }

    /// Whether the codes have a high tile per block (3-, 5- and 6-bit codes).
    pub const fn has_high_bits(self) -> bool {
        self.high_tile_bytes() > 0
    }
}

/// Super-blocks of a row of `n_col_groups` column groups.
pub const fn n_supers(n_col_groups: usize) -> usize {
    n_col_groups.div_ceil(SUPER_GROUPS)
}

/// [`Bits::code_tile_bytes`] of `bits`-bit codes, for the kernels that take the width as
/// a const generic (0 for a number that is no width).
pub const fn code_bytes(bits: u32) -> usize {
    match bits {
        3 => PAIR_TILE_BYTES,
        4..=6 => NIBBLE_TILE_BYTES,
        8 => BYTE_TILE_BYTES,
        _ => 0,
    }
}

/// [`Bits::high_tile_bytes`] of `bits`-bit codes (as [`code_bytes`]).
pub const fn high_bytes(bits: u32) -> usize {
    match bits {
        3 | 5 => BIT_TILE_BYTES,
        6 => PAIR_TILE_BYTES,
        _ => 0,
    }
}

/// Bytes of the code tile (nibbles, or bytes for 8-bit) of one row group × block.
pub fn code_tile_bytes(bits: Bits) -> usize {
    bits.code_tile_bytes()
}

/// A 3-, 4-, 5-, 6- or 8-bit matrix in the packed layout described in the module doc.
#[derive(Debug, Clone, Copy)]
pub struct LowBitTiles<'a> {
    pub bits: Bits,
    /// Code tiles ([`Bits::code_tile_bytes`] each): pairs (3-bit), nibbles (4- to 6-bit)
    /// or bytes (8-bit).
    pub nibbles: &'a [u8],
    /// High tiles ([`Bits::high_tile_bytes`] each); empty for 4- and 8-bit codes.
    pub high_bits: &'a [u8],
    /// Sub-scales `sc`, `[(group * n_col_groups + cg) * 16 + row]`: `d = D · sc`.
    pub scales: &'a [u8],
    /// Sub-minimums `mc`, in the order of `scales`: `m = M · mc`.
    pub mins: &'a [i8],
    /// Super-scales `D`, `[(group * n_supers + cg / SUPER_GROUPS) * 16 + row]`.
    pub super_scales: &'a [f16],
    /// Super-minimums `M`, in the order of `super_scales`.
    pub super_mins: &'a [f16],
    pub rows: usize,
    pub cols: usize,
    /// Columns per scale group (a multiple of 32).
    pub group_size: usize,
}

/// One row group's two-level scales as the kernels read them: raw pointers to column
/// group 0's 16 sub-scales and sub-minimums (column group `cg` at `cg * ROW_GROUP`) and to
/// super-block 0's 16 super-scales and super-minimums as f16 bits (super-block `s` at
/// `s * ROW_GROUP`). Made by [`LowBitTiles::group_scales`]; reading through it is the
/// kernels' `unsafe`.
#[derive(Clone, Copy)]
pub struct GroupScales {
    pub sc: *const u8,
    pub mc: *const i8,
    pub sd: *const u16,
    pub sm: *const u16,
}

impl LowBitTiles<'_> {
    /// Row group `g`'s scales ([`GroupScales`]); `g < n_groups()` for the pointers to be
    /// readable.
    pub fn group_scales(&self, g: usize) -> GroupScales {
        let (ncg, ns) = (self.n_col_groups(), self.n_supers());
        GroupScales {
            sc: self.scales.as_ptr().wrapping_add(g * ncg * ROW_GROUP),
            mc: self.mins.as_ptr().wrapping_add(g * ncg * ROW_GROUP),
            sd: self.super_scales.as_ptr().wrapping_add(g * ns * ROW_GROUP) as *const u16,
            sm: self.super_mins.as_ptr().wrapping_add(g * ns * ROW_GROUP) as *const u16,
        }
    }

    pub fn n_groups(&self) -> usize {
        self.rows.div_ceil(ROW_GROUP)
    }
    pub fn n_blocks(&self) -> usize {
        self.cols / BLOCK
    }
    pub fn n_col_groups(&self) -> usize {
        self.cols.div_ceil(self.group_size)
    }
    /// Super-blocks per row ([`SUPER_GROUPS`] column groups each, the last maybe fewer).
    pub fn n_supers(&self) -> usize {
        n_supers(self.n_col_groups())
    }
    /// The scale `d = D · sc` of row `r` (0..16) of row group `g` in column group `cg`:
    /// exact in f32.
    #[inline]
    pub fn scale(&self, g: usize, cg: usize, r: usize) -> f32 {
        let sup = (g * self.n_supers() + cg / SUPER_GROUPS) * ROW_GROUP + r;
        self.super_scales[sup].to_f32()
            * self.scales[(g * self.n_col_groups() + cg) * ROW_GROUP + r] as f32
    }
    /// The minimum `m = M · mc` of row `r` of row group `g` in column group `cg`: exact.
    #[inline]
    pub fn min(&self, g: usize, cg: usize, r: usize) -> f32 {
        let sup = (g * self.n_supers() + cg / SUPER_GROUPS) * ROW_GROUP + r;
        self.super_mins[sup].to_f32()
            * self.mins[(g * self.n_col_groups() + cg) * ROW_GROUP + r] as f32
    }
    pub(crate) fn check(&self) {
        assert!(
            self.cols.is_multiple_of(BLOCK)
                && self.group_size.is_multiple_of(BLOCK)
                && self.group_size > 0
        );
        let tiles = self.n_groups() * self.n_blocks();
        assert!(self.nibbles.len() >= tiles * code_tile_bytes(self.bits));
        assert!(self.high_bits.len() >= tiles * self.bits.high_tile_bytes());
        let ng = self.n_groups() * self.n_col_groups() * ROW_GROUP;
        assert!(self.scales.len() >= ng && self.mins.len() >= ng);
        let ns = self.n_groups() * self.n_supers() * ROW_GROUP;
        assert!(self.super_scales.len() >= ns && self.super_mins.len() >= ns);
    }

    /// The code of (row `r`, column `c`) from the packed tiles.
    pub fn code(&self, r: usize, c: usize) -> u8 {
        let (g, rr) = (r / ROW_GROUP, r % ROW_GROUP);
        let (b, cc) = (c / BLOCK, c % BLOCK);
        let tile = g * self.n_blocks() + b;
        let bytes = code_tile_bytes(self.bits);
        let high = self.bits.high_tile_bytes();
        let high_bits = &self.high_bits[tile * high..][..high];
        tile_code(
            self.bits,
            &self.nibbles[tile * bytes..][..bytes],
            high_bits,
            cc / 4,
            rr,
            cc % 4,
        )
    }
}

/// The code of row `r` (0..16) and column `4 · quad + k` of one block, from its code tile
/// and, for 3-, 5- and 6-bit codes, its high tile (layouts in the module doc; int8 tiles
/// share the 8-bit layout).
#[inline(always)]
pub(crate) fn tile_code(
    bits: Bits,
    tile: &[u8],
    high_bits: &[u8],
    quad: usize,
    r: usize,
    k: usize,
) -> u8 {
    let at = r * 4 + k;
    let nibble = || {
        let byte = tile[(quad % 4) * 64 + at];
        if quad < 4 {
            byte & 0x0F
        } else {
            byte >> 4
        }
    };
    let pair = |t: &[u8]| (t[(quad / 4) * 64 + at] >> (2 * (quad % 4))) & 3;
    let bit = |t: &[u8]| (t[at] >> quad) & 1;
    match bits {
        Bits::B3 => pair(tile) | (bit(high_bits) << 2),
        Bits::B4 => nibble(),
        Bits::B5 => nibble() | (bit(high_bits) << 4),
        Bits::B6 => nibble() | (pair(high_bits) << 4),
        Bits::B8 => tile[quad * 64 + at],
    }
}

/// Writes `code` as row `r` and column `4 · quad + k` of one block into its zeroed code
/// tile and high tile: the inverse of [`tile_code`] (the formats pack with it).
#[inline]
pub fn put_tile_code(
    bits: Bits,
    tile: &mut [u8],
    high_bits: &mut [u8],
    (quad, r, k): (usize, usize, usize),
    code: u8,
) {
    let at = r * 4 + k;
    let nibble = |tile: &mut [u8], v: u8| {
        let shift = if quad < 4 { 0 } else { 4 };
        tile[(quad % 4) * 64 + at] |= (v & 0x0F) << shift;
    };
    let pair = |t: &mut [u8], v: u8| t[(quad / 4) * 64 + at] |= (v & 3) << (2 * (quad % 4));
    let bit = |t: &mut [u8], v: u8| t[at] |= (v & 1) << quad;
    match bits {
        Bits::B3 => {
            pair(tile, code);
            bit(high_bits, code >> 2);
        }
        Bits::B4 => nibble(tile, code),
        Bits::B5 => {
            nibble(tile, code);
            bit(high_bits, code >> 4);
        }
        Bits::B6 => {
            nibble(tile, code);
            pair(high_bits, code >> 4);
        }
        Bits::B8 => tile[quad * 64 + at] = code,
    }
}

/// An int8 matrix in the packed layout described in the module doc.
#[derive(Debug, Clone, Copy)]
pub struct Int8Tiles<'a> {
    /// `n_groups * n_blocks` tiles of [`INT8_TILE_BYTES`].
    pub qs: &'a [u8],
    /// `scales[(group * n_blocks + block) * 16 + row]`.
    pub scales: &'a [f16],
    pub rows: usize,
    pub cols: usize,
}

impl Int8Tiles<'_> {
    pub fn n_groups(&self) -> usize {
        self.rows.div_ceil(ROW_GROUP)
    }
    pub fn n_blocks(&self) -> usize {
        self.cols / BLOCK
    }
    pub(crate) fn check(&self) {
        assert_eq!(self.cols % BLOCK, 0);
        let tiles = self.n_groups() * self.n_blocks();
        assert!(self.qs.len() >= tiles * INT8_TILE_BYTES && self.scales.len() >= tiles * 16);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every width packs to `bits / 8` bytes per code, and [`put_tile_code`] and
    /// [`tile_code`] are inverses at every place of a block: each code reads back as
    /// written whatever its neighbours hold (all zeros, all ones, random).
    #[test]
    fn every_width_packs_its_bits_and_reads_back_every_code() {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for bits in [Bits::B3, Bits::B4, Bits::B5, Bits::B6, Bits::B8] {
            let (code, high) = (bits.code_tile_bytes(), bits.high_tile_bytes());
            assert_eq!((code + high) * 8, bits.get() as usize * ROW_GROUP * BLOCK);
            assert_eq!(bits.has_high_bits(), high > 0, "{bits:?}");
            assert_eq!(Bits::from_u32(bits.get()), Some(bits));
            for fill in 0..3 {
                let codes: Vec<u8> = (0..ROW_GROUP * BLOCK)
                    .map(|_| match fill {
                        0 => 0,
                        1 => bits.max_code() as u8,
                        _ => (next() as u32 & bits.max_code()) as u8,
                    })
                    .collect();
                let (mut t, mut h) = (vec![0u8; code], vec![0u8; high]);
                for r in 0..ROW_GROUP {
                    for c in 0..BLOCK {
                        let at = (c / 4, r, c % 4);
                        put_tile_code(bits, &mut t, &mut h, at, codes[r * BLOCK + c]);
                    }
                }
                for r in 0..ROW_GROUP {
                    for c in 0..BLOCK {
                        let got = tile_code(bits, &t, &h, c / 4, r, c % 4);
                        assert_eq!(got, codes[r * BLOCK + c], "{bits:?} row {r} col {c}");
                    }
                }
                if fill == 1 {
                    // All codes at their maximum set every bit of both tiles: none wasted.
                    assert!(t.iter().chain(&h).all(|&b| b == 0xFF), "{bits:?}");
                }
            }
        }
        for n in [0, 1, 2, 7, 9, 16, 32] {
            assert_eq!(Bits::from_u32(n), None, "{n}");
        }
    }
}

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
//! ## 4-, 6- and 8-bit codes (`LowBitTiles`)
//! Unsigned codes `q` in `0..2^bits` with a per-group f16 scale `d` and minimum `m`
//! (`w = d · q + m`, llama.cpp's Q4_1 form), groups of 32, 64 or 128 columns (the last
//! group of a row may be shorter, e.g. 576 = 4 · 128 + 64). Made by `format::int4`: row groups of 16 as for int8 tiles. Per row
//! group and 32-column block, a 256-byte nibble tile: byte `j * 64 + row * 4 + k`
//! (`j` in 0..4) holds column `4j + k` in its low nibble and column `4(j + 4) + k` in its
//! high nibble, so one 64-byte load and two mask/shift ops give two 16-row × 4-column
//! operands for `vpdpbusd` (codes are naturally unsigned). 6-bit codes add a 128-byte tile of
//! high bit pairs: byte `h * 64 + row * 4 + k` holds bits 4..5 of the code of quad
//! `4h + j` in its bits `2j..2j + 1`. 8-bit codes use the int8 tile layout instead (512
//! bytes, byte `quad * 64 + row * 4 + k`); `vpmaddubsw` would saturate on `255 · 127 · 2`,
//! so the paths without VNNI take 8-bit codes as `code - 128` with the sign trick and add
//! back `128 · Σa` (exact integers either way). Scales and minimums: `[(group * n_col_groups + cg) * 16
//! + row]`.

use half::f16;

/// Rows per interleave group (the packed formats' `row_align`).
pub const ROW_GROUP: usize = 16;
/// Columns per quantization block (the q8 activation block).
pub const BLOCK: usize = 32;
/// Bytes of one int8 tile (16 rows × 32 columns).
pub const INT8_TILE_BYTES: usize = ROW_GROUP * BLOCK;
/// Bytes of the nibble tile of one row group × 32-column block.
pub const NIBBLE_TILE_BYTES: usize = ROW_GROUP * BLOCK / 2;
/// Bytes of the 6-bit codes' high-bit-pair tile.
pub const HIGH_BITS_TILE_BYTES: usize = ROW_GROUP * BLOCK / 4;

/// Bytes of an 8-bit code tile.
pub const BYTE_TILE_BYTES: usize = ROW_GROUP * BLOCK;

/// The width of a matrix's codes. Every tier matches it exhaustively where it picks a
/// kernel (most kernels take it on as a const generic), so a new width fails to compile
/// at each tier that has no kernel for it yet. Its debug form is the number (`4`): the
/// pack cache's keys hold grids' debug forms, written when the width was a `u32`, and
/// stay as they were.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bits {
    /// 4-bit codes in nibble tiles.
    B4,
    /// 6-bit codes: nibble tiles and high-bit-pair tiles.
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
            4 => Some(Bits::B4),
            6 => Some(Bits::B6),
            8 => Some(Bits::B8),
            _ => None,
        }
    }

    /// Bits per code.
    pub const fn get(self) -> u32 {
        match self {
            Bits::B4 => 4,
            Bits::B6 => 6,
            Bits::B8 => 8,
        }
    }

    /// The largest code, `2^bits - 1`.
    pub const fn max_code(self) -> u32 {
        (1 << self.get()) - 1
    }

    /// Bytes of the code tile (nibbles, or bytes for 8-bit) of one row group × block.
    pub const fn code_tile_bytes(self) -> usize {
        match self {
            Bits::B4 | Bits::B6 => NIBBLE_TILE_BYTES,
            Bits::B8 => BYTE_TILE_BYTES,
        }
    }

    /// Whether the codes have a high-bit-pair tile per block (6-bit codes).
    pub const fn has_high_bits(self) -> bool {
        match self {
            Bits::B6 => true,
            Bits::B4 | Bits::B8 => false,
        }
    }
}

/// Bytes of the code tile (nibbles, or bytes for 8-bit) of one row group × block.
pub fn code_tile_bytes(bits: Bits) -> usize {
    bits.code_tile_bytes()
}

/// A 4-, 6- or 8-bit matrix in the packed layout described in the module doc.
#[derive(Debug, Clone, Copy)]
pub struct LowBitTiles<'a> {
    pub bits: Bits,
    /// Code tiles: nibbles (4/6-bit) or bytes (8-bit).
    pub nibbles: &'a [u8],
    /// Empty for 4-bit.
    pub high_bits: &'a [u8],
    pub scales: &'a [f16],
    pub mins: &'a [f16],
    pub rows: usize,
    pub cols: usize,
    /// Columns per scale group (a multiple of 32).
    pub group_size: usize,
}

impl LowBitTiles<'_> {
    pub fn n_groups(&self) -> usize {
        self.rows.div_ceil(ROW_GROUP)
    }
    pub fn n_blocks(&self) -> usize {
        self.cols / BLOCK
    }
    pub fn n_col_groups(&self) -> usize {
        self.cols.div_ceil(self.group_size)
    }
    pub(crate) fn check(&self) {
        assert!(
            self.cols.is_multiple_of(BLOCK)
                && self.group_size.is_multiple_of(BLOCK)
                && self.group_size > 0
        );
        let tiles = self.n_groups() * self.n_blocks();
        assert!(self.nibbles.len() >= tiles * code_tile_bytes(self.bits));
        if self.bits.has_high_bits() {
            assert!(self.high_bits.len() >= tiles * HIGH_BITS_TILE_BYTES);
        }
        let ng = self.n_groups() * self.n_col_groups() * ROW_GROUP;
        assert!(self.scales.len() >= ng && self.mins.len() >= ng);
    }

    /// The code of (row `r`, column `c`) from the packed tiles.
    pub fn code(&self, r: usize, c: usize) -> u8 {
        let (g, rr) = (r / ROW_GROUP, r % ROW_GROUP);
        let (b, cc) = (c / BLOCK, c % BLOCK);
        let tile = g * self.n_blocks() + b;
        let bytes = code_tile_bytes(self.bits);
        let high_bits = if self.bits.has_high_bits() {
            &self.high_bits[tile * HIGH_BITS_TILE_BYTES..][..HIGH_BITS_TILE_BYTES]
        } else {
            &[]
        };
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
/// and, for 6-bit codes, its high-bit tile (layouts in the module doc; int8 tiles share the
/// 8-bit layout).
#[inline(always)]
pub(crate) fn tile_code(
    bits: Bits,
    tile: &[u8],
    high_bits: &[u8],
    quad: usize,
    r: usize,
    k: usize,
) -> u8 {
    let nibble = || {
        let byte = tile[(quad % 4) * 64 + r * 4 + k];
        if quad < 4 {
            byte & 0x0F
        } else {
            byte >> 4
        }
    };
    match bits {
        Bits::B8 => tile[quad * 64 + r * 4 + k],
        Bits::B4 => nibble(),
        Bits::B6 => {
            let hb = high_bits[(quad / 4) * 64 + r * 4 + k];
            nibble() | (((hb >> (2 * (quad % 4))) & 3) << 4)
        }
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

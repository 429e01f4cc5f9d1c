//! 4-, 6- and 8-bit asymmetric weight × int8-activation matmul kernels (the `int4` format
//! and its 6-/8-bit mix tensors): unsigned codes `q` in `0..2^bits` with a per-group f16 scale `d`
//! and minimum `m` (`w = d · q + m`, llama.cpp's Q4_1 form), groups of 32, 64 or 128
//! columns (the last group of a row may be shorter, e.g. 576 = 4 · 128 + 64).
//!
//! Packed layout (made by `format::int4`): row groups of 16 as in `int8_matmul`. Per row
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
//!
//! Math per row and column group `cg`: `Σ_b d_a[b] · (d · Σ q·a + m · Σ a)`; the integer
//! dot of each block goes through `acc = fma(float(dot), d · d_a[b], acc)` and the minimum's
//! part once per group, `acc = fma(m, S[cg], acc)`, where `S[cg] = Σ_{b in cg} d_a[b] ·
//! blocksum[b]` is computed once per token (shared code, so every path sees the same
//! value). The scalar specification and every SIMD path (AVX512-VNNI here, AMX for
//! prompts in `x86_64/amx.rs`; AVX-512BW,
//! 256-bit VNNI and AVX2 in `x86_64/`, see `int8_matmul` for the tiers and the measurement
//! behind the prompt path) perform the same float operations in the same order and agree to
//! the bit.

use super::int8_matmul::{
    check_operands, drive_row_groups, GemvPair, PairedGemv, Q8Rows, QuantIsa, Rounding, BLOCK,
    ROW_GROUP, TOKEN_TILE,
};
use crate::kernels::quant_portable::{BaselineDots, WidenedDots};
#[cfg(target_arch = "x86_64")]
use crate::kernels::x86_64::{quant256, quant512bw};
use crate::kernels::OutputMatrix;
use half::f16;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

/// Bytes of the nibble tile of one row group × 32-column block.
pub const NIBBLE_TILE_BYTES: usize = ROW_GROUP * BLOCK / 2;
/// Bytes of the 6-bit codes' high-bit-pair tile.
pub const HIGH_BITS_TILE_BYTES: usize = ROW_GROUP * BLOCK / 4;

/// Bytes of an 8-bit code tile.
pub const BYTE_TILE_BYTES: usize = ROW_GROUP * BLOCK;

/// Bytes of the code tile (nibbles, or bytes for 8-bit) of one row group × block.
pub fn code_tile_bytes(bits: u32) -> usize {
    if bits == 8 {
        BYTE_TILE_BYTES
    } else {
        NIBBLE_TILE_BYTES
    }
}

/// A 4-, 6- or 8-bit matrix in the packed layout described in the module doc.
#[derive(Debug, Clone, Copy)]
pub struct LowBitTiles<'a> {
    /// 4, 6 or 8.
    pub bits: u32,
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
    fn check(&self) {
        assert!(self.bits == 4 || self.bits == 6 || self.bits == 8);
        assert!(
            self.cols.is_multiple_of(BLOCK)
                && self.group_size.is_multiple_of(BLOCK)
                && self.group_size > 0
        );
        let tiles = self.n_groups() * self.n_blocks();
        assert!(self.nibbles.len() >= tiles * code_tile_bytes(self.bits));
        if self.bits == 6 {
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
        let high_bits = if self.bits == 6 {
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
    bits: u32,
    tile: &[u8],
    high_bits: &[u8],
    quad: usize,
    r: usize,
    k: usize,
) -> u8 {
    if bits == 8 {
        return tile[quad * 64 + r * 4 + k];
    }
    let byte = tile[(quad % 4) * 64 + r * 4 + k];
    let mut q = if quad < 4 { byte & 0x0F } else { byte >> 4 };
    if bits == 6 {
        let hb = high_bits[(quad / 4) * 64 + r * 4 + k];
        q |= ((hb >> (2 * (quad % 4))) & 3) << 4;
    }
    q
}

/// `S[t][cg] = Σ_{b in cg} d_a[t][b] · blocksum[t][b]` for tokens `t0..t0 + n` (each sum
/// from 0 in block order). A prompt's matmuls read it through [`InputMemo`], so each
/// prepared input computes it once per group size: recomputed by each of a matrix's ~16
/// claimed row pieces it took about 4 % of an int8 pp512 profile on an Intel Xeon.
fn min_terms(x: &Q8Rows, t0: usize, n: usize, group_size: usize, n_col_groups: usize) -> Vec<f32> {
    let nb = x.n_blocks();
    let bpg = group_size / BLOCK;
    let mut s = vec![0f32; n * n_col_groups];
    for (t, s_t) in s.chunks_exact_mut(n_col_groups).enumerate() {
        let row = (t0 + t) * nb;
        let (da, bs) = (&x.scales[row..row + nb], &x.block_sums[row..row + nb]);
        if bpg == 1 {
            // One block a group (g32, the int4 mix's default): a plain vector map.
            for ((s_cg, &d), &sum) in s_t.iter_mut().zip(da).zip(bs) {
                *s_cg += d * sum as f32;
            }
            continue;
        }
        for ((s_cg, d_g), b_g) in s_t.iter_mut().zip(da.chunks(bpg)).zip(bs.chunks(bpg)) {
            for (&d, &sum) in d_g.iter().zip(b_g) {
                *s_cg += d * sum as f32;
            }
        }
    }
    s
}

/// What the quantized kernels derive from one prepared q8 input, kept so that every row
/// piece of every matrix reading the input shares one computation: its minimum terms per
/// (group size, token count), and (the `avx512bw` tier's 8-bit prompts) its quants widened
/// to i16. The owner of the activations clears it whenever it encodes new ones
/// ([`InputMemo::clear`]).
#[derive(Default, Debug)]
pub struct InputMemo {
    min_terms: Mutex<Vec<MemoEntry>>,
    /// (token count, `quants` as i16).
    acts_i16: Mutex<Option<(usize, Arc<[i16]>)>>,
}

/// (group size, tokens, `S` of every token).
type MemoEntry = (usize, usize, Arc<[f32]>);

impl InputMemo {
    /// Forgets every entry (the activations they were computed from changed).
    pub fn clear(&mut self) {
        self.min_terms
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        *self
            .acts_i16
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// Every token's minimum terms for groups of `group_size`: from `x`'s memo when it has
/// one (computed by the first caller, under the lock, so the others wait instead of
/// redoing it), else computed here.
fn min_terms_all(x: &Q8Rows, group_size: usize, n_col_groups: usize) -> Arc<[f32]> {
    let compute = || Arc::from(min_terms(x, 0, x.n_tokens, group_size, n_col_groups));
    let Some(memo) = x.memo else {
        return compute();
    };
    let mut held = memo
        .min_terms
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let key = (group_size, x.n_tokens);
    if let Some((_, _, s)) = held.iter().find(|e| (e.0, e.1) == key) {
        return Arc::clone(s);
    }
    let s = compute();
    held.push((key.0, key.1, Arc::clone(&s)));
    s
}

/// `x`'s quants (`[token][column]`) as i16, through its memo as [`min_terms_all`] (the
/// 8-bit-code prompt paths of `avx512bw` and `avx2` share them; once per call, so a plain
/// loop, which the compiler vectorizes, does).
pub(crate) fn acts_i16_all(x: &Q8Rows) -> Arc<[i16]> {
    let quants = &x.quants[..x.n_tokens * x.dim];
    let widen = |q: &[i8]| q.iter().map(|&v| v as i16).collect::<Vec<i16>>();
    let Some(memo) = x.memo else {
        return Arc::from(widen(quants));
    };
    let mut held = memo.acts_i16.lock().unwrap_or_else(PoisonError::into_inner);
    match &*held {
        Some((n, a)) if *n == x.n_tokens => Arc::clone(a),
        _ => {
            let a: Arc<[i16]> = Arc::from(widen(quants));
            *held = Some((x.n_tokens, Arc::clone(&a)));
            a
        }
    }
}

/// `y[t][r] = W[r] · x[t]` for `r` in `rows` (start a multiple of 16) on path `isa`.
pub fn lowbit_matmul(
    isa: QuantIsa,
    w: &LowBitTiles,
    x: &Q8Rows,
    rows: Range<usize>,
    y: &OutputMatrix,
) {
    w.check();
    check_operands(x, w.cols, w.rows, &rows);
    assert!(isa.is_available(), "{} path not available", isa.name());
    let ncg = w.n_col_groups();
    let s_all = min_terms_all(x, w.group_size, ncg);
    #[cfg(target_arch = "x86_64")]
    if isa == QuantIsa::Amx && x.n_tokens >= super::int8_matmul::AMX_MIN_TOKENS {
        return x86::lowbit_matmul_amx(w, x, &s_all, rows, y);
    }
    #[cfg(target_arch = "x86_64")]
    if isa == QuantIsa::Avx512Bw && w.bits == 8 && x.n_tokens > TOKEN_TILE {
        // SAFETY: the tier has AVX-512 F/BW (checked above); `w` and `x` were checked.
        unsafe { quant512bw::code8_matmul_i16(w, x, &s_all, rows, y) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == QuantIsa::Avx2 && w.bits == 8 && x.n_tokens > TOKEN_TILE {
        // SAFETY: the tier has AVX2/FMA/F16C (checked above); `w` and `x` were checked.
        unsafe { quant256::avx2::code8_matmul_i16(w, x, &s_all, rows, y) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, QuantIsa::Avx512Vnni | QuantIsa::Amx) && x.n_tokens > TOKEN_TILE {
        // SAFETY: the tier has AVX512F/BW/VNNI (checked above); `w` and `x` were checked.
        unsafe { x86::lowbit_matmul_vnni_pairs(w, x, &s_all, rows, y) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    let vex = super::int8_matmul::avx_vnni_vex();
    #[cfg(target_arch = "x86_64")]
    let paired = isa.paired_gemv();
    #[cfg(target_arch = "x86_64")]
    let mut gemv_pair = |ga: usize, gb: usize, out: &mut [[f32; ROW_GROUP]; 2]| {
        let s = &s_all[..ncg];
        match paired {
            // SAFETY (every arm): `paired_gemv` names a path whose features the tier has;
            // as for the tiles below, for both groups and token 0.
            Some(PairedGemv::Avx2) => unsafe {
                quant256::avx2::lowbit_gemv_pair(w, x, s, ga, gb, 0, out)
            },
            Some(PairedGemv::VnniVex) => unsafe {
                quant256::avxvnni::lowbit_gemv_pair(w, x, s, ga, gb, 0, out)
            },
            Some(PairedGemv::VnniEvex) => unsafe {
                quant256::vnni_evex::lowbit_gemv_pair(w, x, s, ga, gb, 0, out)
            },
            None => unreachable!("no paired GEMV on {}", isa.name()),
        }
    };
    #[cfg(target_arch = "x86_64")]
    let pair = paired.map(|_| &mut gemv_pair as GemvPair);
    #[cfg(not(target_arch = "x86_64"))]
    let pair = None;
    let mut widened_dots = (isa == QuantIsa::Scalar).then(|| WidenedDots::<BaselineDots>::new(x));
    drive_row_groups(
        rows,
        x.n_tokens,
        y,
        |g, t0, n, out| {
            let s = &s_all[t0 * ncg..(t0 + n) * ncg];
            match isa {
                QuantIsa::Scalar => match widened_dots.as_mut() {
                    Some(f) => f.lowbit_tile(w, x, s, g, t0, n, out),
                    None => unreachable!("the scalar tier's state is made above"),
                },
                #[cfg(target_arch = "x86_64")]
                // SAFETY (every arm): the path's CPU features were checked above (`avxvnni`
                // runs the VEX encoding only when AVX-VNNI is present, else the EVEX one);
                // `check` guaranteed the slices cover group `g`, tokens `t0..t0 + n`, every
                // block and column group; `s` holds `n` tokens' minimum terms.
                QuantIsa::Avx2 => unsafe { quant256::avx2::lowbit_tile(w, x, s, g, t0, n, out) },
                #[cfg(target_arch = "x86_64")]
                QuantIsa::AvxVnni if vex => unsafe {
                    quant256::avxvnni::lowbit_tile(w, x, s, g, t0, n, out)
                },
                #[cfg(target_arch = "x86_64")]
                QuantIsa::AvxVnni => unsafe {
                    quant256::vnni_evex::lowbit_tile(w, x, s, g, t0, n, out)
                },
                #[cfg(target_arch = "x86_64")]
                QuantIsa::Avx512Bw => unsafe { quant512bw::lowbit_tile(w, x, s, g, t0, n, out) },
                #[cfg(target_arch = "x86_64")]
                QuantIsa::Avx512Vnni | QuantIsa::Amx => unsafe {
                    x86::lowbit_tile_vnni_dispatch(w, x, s, g, t0, n, out)
                },
                #[cfg(not(target_arch = "x86_64"))]
                _ => unreachable!(),
            }
        },
        pair,
    );
}

/// One row group's 4-/6-bit codes widened to byte tiles, kept while a prompt's token
/// tiles of that group run (the driver walks a group's tokens before the next group).
#[cfg(target_arch = "x86_64")]
struct WidenedGroup {
    group: Option<usize>,
    codes: Vec<u8>,
}

#[cfg(target_arch = "x86_64")]
impl WidenedGroup {
    fn new(w: &LowBitTiles) -> WidenedGroup {
        WidenedGroup {
            group: None,
            codes: vec![0; w.n_blocks() * BYTE_TILE_BYTES],
        }
    }

    /// Group `g`'s widened codes (widened now unless they already are).
    ///
    /// # Safety
    /// AVX512F/BW present; `w` checked, `g < w.n_groups()`, and `w` the matrix this was
    /// made for.
    unsafe fn group(&mut self, w: &LowBitTiles, g: usize) -> &[u8] {
        if self.group != Some(g) {
            // SAFETY: forwarded contract (the buffer holds `n_blocks` byte tiles of `w`).
            unsafe { x86::widen_group_codes(w, g, &mut self.codes) };
            self.group = Some(g);
        }
        &self.codes
    }
}

/// [`lowbit_matmul`] on the specification ([`lowbit_tile_scalar`], one code at a time)
/// with `rounding`: the reference the tests hold every path to, the scalar tier's included.
pub fn lowbit_matmul_spec(
    rounding: Rounding,
    w: &LowBitTiles,
    x: &Q8Rows,
    rows: Range<usize>,
    y: &OutputMatrix,
) {
    w.check();
    check_operands(x, w.cols, w.rows, &rows);
    let ncg = w.n_col_groups();
    let s_all = min_terms(x, 0, x.n_tokens, w.group_size, ncg);
    drive_row_groups(
        rows,
        x.n_tokens,
        y,
        |g, t0, n, out| {
            let s = &s_all[t0 * ncg..(t0 + n) * ncg];
            lowbit_tile_scalar(rounding, w, x, s, g, t0, n, out)
        },
        None,
    );
}

/// The specification (see the module doc for the order of operations), its float steps
/// rounded as `rounding` says.
#[allow(clippy::too_many_arguments)]
pub fn lowbit_tile_scalar(
    rounding: Rounding,
    w: &LowBitTiles,
    x: &Q8Rows,
    s: &[f32],
    g: usize,
    t0: usize,
    n: usize,
    out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
) {
    let nb = w.n_blocks();
    let ncg = w.n_col_groups();
    let bpg = w.group_size / BLOCK;
    for t in 0..n {
        let tok = t0 + t;
        let mut acc = [0f32; ROW_GROUP];
        for cg in 0..ncg {
            let ds = &w.scales[(g * ncg + cg) * ROW_GROUP..][..ROW_GROUP];
            let ms = &w.mins[(g * ncg + cg) * ROW_GROUP..][..ROW_GROUP];
            for b in cg * bpg..((cg + 1) * bpg).min(nb) {
                let a = &x.quants[tok * x.dim + b * BLOCK..][..BLOCK];
                let da = x.scales[tok * nb + b];
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    let mut dot = 0i32;
                    for (c, &av) in a.iter().enumerate() {
                        dot += w.code(g * ROW_GROUP + r, b * BLOCK + c) as i32 * av as i32;
                    }
                    *acc_r = rounding.step(dot as f32, ds[r].to_f32() * da, *acc_r);
                }
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                *acc_r = rounding.step(ms[r].to_f32(), s[t * ncg + cg], *acc_r);
            }
        }
        out[t] = acc;
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::*;
    use crate::kernels::int8_matmul::drive_row_group_pairs;
    use std::arch::x86_64::*;
    use std::array::from_mut;

    /// [`lowbit_matmul`] on the `amx` tier (`int8_matmul`'s `drive_amx`): each pair of
    /// row groups has its 4- or 6-bit codes widened to bytes once (8-bit codes are bytes
    /// already). `s_all` holds every token's minimum terms.
    pub fn lowbit_matmul_amx(
        w: &LowBitTiles,
        x: &Q8Rows,
        s_all: &[f32],
        rows: Range<usize>,
        y: &OutputMatrix,
    ) {
        use crate::kernels::int8_matmul::x86::{drive_amx, AmxKernels, Out16, Out8};
        use crate::kernels::x86_64::amx::{self, AMX_TOKENS, AMX_TOKENS_2X2};
        struct LowBitAmx<'a> {
            w: &'a LowBitTiles<'a>,
            x: &'a Q8Rows<'a>,
            s_all: &'a [f32],
            /// The step's groups' codes widened to bytes (unused for 8-bit codes).
            widened: [Vec<u8>; 2],
        }
        impl LowBitAmx<'_> {
            /// Group `g` (`j`-th of its step)'s codes in B layout.
            fn codes(&self, g: usize, j: usize) -> &[u8] {
                let nb = self.w.n_blocks();
                match self.w.bits {
                    8 => &self.w.nibbles[g * nb * BYTE_TILE_BYTES..][..nb * BYTE_TILE_BYTES],
                    _ => &self.widened[j],
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
        impl AmxKernels for LowBitAmx<'_> {
            fn prepare(&mut self, g: usize, groups: usize) {
                if self.w.bits != 8 {
                    for j in 0..groups {
                        // SAFETY: see the impl.
                        unsafe { widen_group_codes(self.w, g + j, &mut self.widened[j]) };
                    }
                }
            }
            unsafe fn tile_2x2(&mut self, g: usize, t0: usize, out: &amx::TileOut) {
                let w = self.w;
                let (ncg, bpg) = (w.n_col_groups(), w.group_size / BLOCK);
                let at =
                    |v: &[f16], j: usize| v[(g + j) * ncg * ROW_GROUP..].as_ptr() as *const u16;
                let gp = amx::GroupPair {
                    codes: [self.codes(g, 0).as_ptr(), self.codes(g + 1, 1).as_ptr()],
                    scales: [at(w.scales, 0), at(w.scales, 1)],
                    mins: [at(w.mins, 0), at(w.mins, 1)],
                };
                let s = self.s(t0, AMX_TOKENS_2X2);
                // SAFETY: see the impl, and the caller's contract for `out`.
                unsafe { amx::tile_2x2::<false>(&gp, w.n_blocks(), ncg, bpg, self.x, s, t0, out) };
            }
            fn tile16(&mut self, g: usize, j: usize, t0: usize, out: &mut Out16) {
                let (codes, s) = (self.codes(g, j), self.s(t0, AMX_TOKENS));
                // SAFETY: see the impl.
                unsafe { amx::lowbit_tile16(self.w, codes, self.x, s, g, t0, out) };
            }
            fn tile_vnni(&mut self, g: usize, t0: usize, n: usize, out: &mut Out8) {
                // SAFETY: see the impl.
                unsafe { lowbit_tile_vnni_dispatch(self.w, self.x, self.s(t0, n), g, t0, n, out) };
            }
        }
        let len = if w.bits == 8 {
            0
        } else {
            w.n_blocks() * BYTE_TILE_BYTES
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
            },
        );
    }

    /// [`lowbit_matmul`] for prompts on the VNNI tiles: row groups two at a time
    /// ([`drive_row_group_pairs`], [`byte_tiles_vnni`]), each group's 4- or 6-bit codes
    /// widened to bytes once (8-bit codes are bytes already). `s_all` holds every token's
    /// minimum terms.
    ///
    /// # Safety
    /// AVX512F/BW/VNNI present; `w` and `x` checked against each other and `rows`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn lowbit_matmul_vnni_pairs(
        w: &LowBitTiles,
        x: &Q8Rows,
        s_all: &[f32],
        rows: Range<usize>,
        y: &OutputMatrix,
    ) {
        let nb = w.n_blocks();
        let ncg = w.n_col_groups();
        let mut widened = (w.bits != 8).then(|| [WidenedGroup::new(w), WidenedGroup::new(w)]);
        drive_row_group_pairs(rows, x.n_tokens, y, |g, count, t0, n, out| {
            let s = &s_all[t0 * ncg..(t0 + n) * ncg];
            let mut codes = [std::ptr::null(); 2];
            for (j, c) in codes.iter_mut().enumerate().take(count) {
                *c = match widened.as_mut() {
                    // SAFETY: forwarded contract (`g + j` is a group of `rows`).
                    Some(wd) => unsafe { wd[j].group(w, g + j) }.as_ptr(),
                    None => w.nibbles[(g + j) * nb * BYTE_TILE_BYTES..].as_ptr(),
                };
            }
            // SAFETY: forwarded contract; `codes[..count]` cover the groups' byte tiles.
            unsafe {
                match (count, n) {
                    (2, 1) => byte_tiles_vnni::<2, 1>(w, codes, x, s, [g, g + 1], t0, out),
                    (2, 2) => byte_tiles_vnni::<2, 2>(w, codes, x, s, [g, g + 1], t0, out),
                    (2, 3) => byte_tiles_vnni::<2, 3>(w, codes, x, s, [g, g + 1], t0, out),
                    (2, 4) => byte_tiles_vnni::<2, 4>(w, codes, x, s, [g, g + 1], t0, out),
                    (2, 5) => byte_tiles_vnni::<2, 5>(w, codes, x, s, [g, g + 1], t0, out),
                    (2, 6) => byte_tiles_vnni::<2, 6>(w, codes, x, s, [g, g + 1], t0, out),
                    (1, n) => {
                        let one = from_mut(&mut out[0]);
                        let c = [codes[0]];
                        match n {
                            1 => byte_tiles_vnni::<1, 1>(w, c, x, s, [g], t0, one),
                            2 => byte_tiles_vnni::<1, 2>(w, c, x, s, [g], t0, one),
                            3 => byte_tiles_vnni::<1, 3>(w, c, x, s, [g], t0, one),
                            4 => byte_tiles_vnni::<1, 4>(w, c, x, s, [g], t0, one),
                            5 => byte_tiles_vnni::<1, 5>(w, c, x, s, [g], t0, one),
                            _ => byte_tiles_vnni::<1, 6>(w, c, x, s, [g], t0, one),
                        }
                    }
                    _ => unreachable!("{count} groups × {n} tokens"),
                }
            }
        });
    }

    /// Tokens `t0..t0 + n` of row group `g` on the VNNI tiles (short batches and the
    /// `amx` tier's leftover tokens; longer prompts take [`lowbit_matmul_vnni_pairs`]):
    /// 8-bit codes on the byte tiles, 4-/6-bit codes unpacked block by block.
    ///
    /// # Safety
    /// AVX512F/BW/VNNI present; `w`, `x` checked, `g < w.n_groups()`,
    /// `t0 + n <= x.n_tokens`, `1 <= n <= TOKEN_TILE`, `s` holds `n * n_col_groups` values.
    pub unsafe fn lowbit_tile_vnni_dispatch(
        w: &LowBitTiles,
        x: &Q8Rows,
        s: &[f32],
        g: usize,
        t0: usize,
        n: usize,
        out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
    ) {
        let nb = w.n_blocks();
        let bytes = (w.bits == 8).then(|| w.nibbles[g * nb * BYTE_TILE_BYTES..].as_ptr());
        // SAFETY: forwarded contract; `bytes` covers the group's byte tiles (the 8-bit
        // codes `check` validated).
        unsafe {
            match (bytes, w.bits, n) {
                (Some(c), _, 1) => byte_tiles_vnni::<1, 1>(w, [c], x, s, [g], t0, from_mut(out)),
                (Some(c), _, 2) => byte_tiles_vnni::<1, 2>(w, [c], x, s, [g], t0, from_mut(out)),
                (Some(c), _, 3) => byte_tiles_vnni::<1, 3>(w, [c], x, s, [g], t0, from_mut(out)),
                (Some(c), _, 4) => byte_tiles_vnni::<1, 4>(w, [c], x, s, [g], t0, from_mut(out)),
                (Some(c), _, 5) => byte_tiles_vnni::<1, 5>(w, [c], x, s, [g], t0, from_mut(out)),
                (Some(c), _, 6) => byte_tiles_vnni::<1, 6>(w, [c], x, s, [g], t0, from_mut(out)),
                (Some(c), _, 7) => byte_tiles_vnni::<1, 7>(w, [c], x, s, [g], t0, from_mut(out)),
                (Some(c), _, 8) => byte_tiles_vnni::<1, 8>(w, [c], x, s, [g], t0, from_mut(out)),
                (None, 4, 1) => lowbit_tile_vnni::<1, false>(w, x, s, g, t0, out),
                (None, 4, 2) => lowbit_tile_vnni::<2, false>(w, x, s, g, t0, out),
                (None, 4, 3) => lowbit_tile_vnni::<3, false>(w, x, s, g, t0, out),
                (None, 4, 4) => lowbit_tile_vnni::<4, false>(w, x, s, g, t0, out),
                (None, 4, 5) => lowbit_tile_vnni::<5, false>(w, x, s, g, t0, out),
                (None, 4, 6) => lowbit_tile_vnni::<6, false>(w, x, s, g, t0, out),
                (None, 4, 7) => lowbit_tile_vnni::<7, false>(w, x, s, g, t0, out),
                (None, 4, 8) => lowbit_tile_vnni::<8, false>(w, x, s, g, t0, out),
                (None, 6, 1) => lowbit_tile_vnni::<1, true>(w, x, s, g, t0, out),
                (None, 6, 2) => lowbit_tile_vnni::<2, true>(w, x, s, g, t0, out),
                (None, 6, 3) => lowbit_tile_vnni::<3, true>(w, x, s, g, t0, out),
                (None, 6, 4) => lowbit_tile_vnni::<4, true>(w, x, s, g, t0, out),
                (None, 6, 5) => lowbit_tile_vnni::<5, true>(w, x, s, g, t0, out),
                (None, 6, 6) => lowbit_tile_vnni::<6, true>(w, x, s, g, t0, out),
                (None, 6, 7) => lowbit_tile_vnni::<7, true>(w, x, s, g, t0, out),
                (None, 6, 8) => lowbit_tile_vnni::<8, true>(w, x, s, g, t0, out),
                _ => unreachable!("bits {} token tile {n}", w.bits),
            }
        }
    }

    /// Widens row group `g`'s 4- or 6-bit codes into `dst` as byte tiles (the 8-bit codes'
    /// layout, which is also AMX's B layout: byte `quad * 64 + row * 4 + k` of each block's
    /// 512), so a prompt decodes each code once instead of once per token tile.
    ///
    /// # Safety
    /// AVX512F/BW present; `w` checked (`LowBitTiles::check`), `g < w.n_groups()`.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn widen_group_codes(w: &LowBitTiles, g: usize, dst: &mut [u8]) {
        let nb = w.n_blocks();
        assert!(dst.len() >= nb * BYTE_TILE_BYTES && (w.bits == 4 || w.bits == 6));
        // SAFETY: group g's tiles lie inside the slices `check` validated; `dst` was
        // asserted long enough.
        unsafe {
            for b in 0..nb {
                let tile = g * nb + b;
                let nib = w.nibbles.as_ptr().add(tile * NIBBLE_TILE_BYTES);
                let wv = if w.bits == 6 {
                    let hb = w.high_bits.as_ptr().add(tile * HIGH_BITS_TILE_BYTES);
                    unpack_zmm::<true>(nib, hb)
                } else {
                    unpack_zmm::<false>(nib, std::ptr::null())
                };
                let out = dst.as_mut_ptr().add(b * BYTE_TILE_BYTES);
                for (quad, v) in wv.iter().enumerate() {
                    _mm512_storeu_si512(out.add(quad * 64) as *mut _, *v);
                }
            }
        }
    }

    /// Unpacks one block's codes into 8 operands of 16 rows × 4 columns (quad order).
    ///
    /// # Safety
    /// AVX512F/BW; `nib` points at a nibble tile, `hb` (6-bit only) at its high-bit tile.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(crate) unsafe fn unpack_zmm<const SIX: bool>(
        nib: *const u8,
        hb: *const u8,
    ) -> [__m512i; 8] {
        let low4 = _mm512_set1_epi8(0x0F);
        let bits45 = _mm512_set1_epi8(0x30);
        let mut wv = [_mm512_setzero_si512(); 8];
        // SAFETY: the caller's contract covers 256 bytes at `nib` and 128 at `hb`.
        unsafe {
            let h = if SIX {
                [
                    _mm512_loadu_si512(hb as *const _),
                    _mm512_loadu_si512(hb.add(64) as *const _),
                ]
            } else {
                [_mm512_setzero_si512(); 2]
            };
            for j in 0..4 {
                let v = _mm512_loadu_si512(nib.add(j * 64) as *const _);
                let mut lo = _mm512_and_si512(v, low4);
                let mut hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
                if SIX {
                    // Bits 2j..2j+1 of each byte to bits 4..5 (16-bit shifts: the bits
                    // that cross a byte boundary are masked off by 0x30).
                    let place = |x: __m512i| match j {
                        0 => _mm512_and_si512(_mm512_slli_epi16(x, 4), bits45),
                        1 => _mm512_and_si512(_mm512_slli_epi16(x, 2), bits45),
                        2 => _mm512_and_si512(x, bits45),
                        _ => _mm512_and_si512(_mm512_srli_epi16(x, 2), bits45),
                    };
                    lo = _mm512_or_si512(lo, place(h[0]));
                    hi = _mm512_or_si512(hi, place(h[1]));
                }
                wv[j] = lo;
                wv[j + 4] = hi;
            }
        }
        wv
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn lowbit_tile_vnni<const N: usize, const SIX: bool>(
        w: &LowBitTiles,
        x: &Q8Rows,
        s: &[f32],
        g: usize,
        t0: usize,
        out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
    ) {
        let nb = w.n_blocks();
        let ncg = w.n_col_groups();
        let bpg = w.group_size / BLOCK;
        let dim = x.dim;
        // SAFETY: every pointer stays inside the slices `check` validated: tiles of group g
        // (blocks < nb), its scales/mins (column groups < ncg), tokens t0..t0+N.
        unsafe {
            let nib = w.nibbles.as_ptr().add(g * nb * NIBBLE_TILE_BYTES);
            let hbp = if SIX {
                w.high_bits.as_ptr().add(g * nb * HIGH_BITS_TILE_BYTES)
            } else {
                std::ptr::null()
            };
            let sc = w.scales.as_ptr().add(g * ncg * ROW_GROUP) as *const u16;
            let mn = w.mins.as_ptr().add(g * ncg * ROW_GROUP) as *const u16;
            let xq = x.quants.as_ptr().add(t0 * dim);
            let xs = x.scales.as_ptr().add(t0 * nb);
            let mut acc = [_mm512_setzero_ps(); N];
            for cg in 0..ncg {
                let dw = _mm512_cvtph_ps(_mm256_loadu_si256(sc.add(cg * ROW_GROUP) as *const _));
                for b in cg * bpg..((cg + 1) * bpg).min(nb) {
                    let hb = if SIX {
                        hbp.add(b * HIGH_BITS_TILE_BYTES)
                    } else {
                        hbp
                    };
                    let wv = unpack_zmm::<SIX>(nib.add(b * NIBBLE_TILE_BYTES), hb);
                    for (t, acc_t) in acc.iter_mut().enumerate() {
                        let a = xq.add(t * dim + b * BLOCK) as *const i32;
                        let mut d = _mm512_setzero_si512();
                        for (quad, v) in wv.iter().enumerate() {
                            d = _mm512_dpbusd_epi32(
                                d,
                                *v,
                                _mm512_set1_epi32(a.add(quad).read_unaligned()),
                            );
                        }
                        let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*xs.add(t * nb + b)));
                        *acc_t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), scale, *acc_t);
                    }
                }
                let mw = _mm512_cvtph_ps(_mm256_loadu_si256(mn.add(cg * ROW_GROUP) as *const _));
                for (t, acc_t) in acc.iter_mut().enumerate() {
                    *acc_t = _mm512_fmadd_ps(mw, _mm512_set1_ps(s[t * ncg + cg]), *acc_t);
                }
            }
            for (t, acc_t) in acc.iter().enumerate() {
                _mm512_storeu_ps(out[t].as_mut_ptr(), *acc_t);
            }
        }
    }

    /// The 8-bit codes' tiles of `G` row groups: the same math as `lowbit_tile_vnni` with
    /// byte tiles, read from `codes[j]` (row group `groups[j]`'s `n_blocks` tiles of
    /// [`BYTE_TILE_BYTES`]: its 8-bit codes, or its 4-/6-bit codes widened by
    /// [`widen_group_codes`]), tokens `t0..t0 + N` into `out[j][..N]`.
    ///
    /// Register blocking: each 64-byte weight load serves `N` tokens and each broadcast
    /// activation quad serves `G` groups, quad by quad, so one block holds `G · N` integer
    /// and `G · N` float accumulators. `G = 2, N = 6` leaves enough independent `vpdpbusd`
    /// chains and loads per instruction to run near the float step's bound (see
    /// [`PAIR_TOKENS`](crate::kernels::int8_matmul::PAIR_TOKENS)).
    ///
    /// # Safety
    /// AVX512F/BW/VNNI present; `w`, `x` checked, each `groups[j] < w.n_groups()`,
    /// `t0 + N <= x.n_tokens`, each `codes[j]` readable for `n_blocks` byte tiles, `s`
    /// holds `N` tokens' terms, `N <= TOKEN_TILE`.
    // Index loops: each index addresses several register arrays at once.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn byte_tiles_vnni<const G: usize, const N: usize>(
        w: &LowBitTiles,
        codes: [*const u8; G],
        x: &Q8Rows,
        s: &[f32],
        groups: [usize; G],
        t0: usize,
        out: &mut [[[f32; ROW_GROUP]; TOKEN_TILE]; G],
    ) {
        let dim = x.dim;
        // SAFETY: the activation reads stay in tokens t0..t0+N, the code reads in the
        // caller's tiles (blocks < nb); the rest is `code_tiles_zmm`'s contract.
        unsafe {
            let xq = x.quants.as_ptr().add(t0 * dim);
            code_tiles_zmm::<G, N>(w, x, s, groups, t0, out, |b| {
                let mut d = [[_mm512_setzero_si512(); N]; G];
                for quad in 0..BLOCK / 4 {
                    let mut wv = [_mm512_setzero_si512(); G];
                    for j in 0..G {
                        wv[j] = _mm512_loadu_si512(
                            codes[j].add(b * BYTE_TILE_BYTES + quad * 64) as *const _
                        );
                    }
                    for t in 0..N {
                        let a =
                            (xq.add(t * dim + b * BLOCK + quad * 4) as *const i32).read_unaligned();
                        let a = _mm512_set1_epi32(a);
                        for j in 0..G {
                            d[j][t] = _mm512_dpbusd_epi32(d[j][t], wv[j], a);
                        }
                    }
                }
                d
            })
        }
    }

    /// The float steps shared by the zmm prompt tiles of codes (`G` row groups × `N`
    /// tokens): per block `acc = fma(float(dot), d_w · d_a, acc)` and per column group
    /// `acc = fma(m, S, acc)`, the specification's order, around `block_dots(b)`, block
    /// `b`'s exact integer dots `[group][token]`; results into `out[j][..N]`. Inlined into
    /// each kernel, whose target features it then runs with.
    ///
    /// # Safety
    /// AVX-512 F/BW present; `w`, `x` checked, each `groups[j] < w.n_groups()`, `t0 + N <=
    /// x.n_tokens`, `s` holds `N` tokens' minimum terms, `N <= TOKEN_TILE`.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    pub(crate) unsafe fn code_tiles_zmm<const G: usize, const N: usize>(
        w: &LowBitTiles,
        x: &Q8Rows,
        s: &[f32],
        groups: [usize; G],
        t0: usize,
        out: &mut [[[f32; ROW_GROUP]; TOKEN_TILE]; G],
        mut block_dots: impl FnMut(usize) -> [[__m512i; N]; G],
    ) {
        let nb = w.n_blocks();
        let ncg = w.n_col_groups();
        let bpg = w.group_size / BLOCK;
        // SAFETY: every pointer stays inside the slices `check` validated: scales and
        // minimums of each group's column groups < ncg, activation scales of tokens
        // t0..t0+N; the intrinsics need AVX-512 F (the caller's contract).
        unsafe {
            let mut sc = [std::ptr::null::<u16>(); G];
            let mut mn = [std::ptr::null::<u16>(); G];
            for j in 0..G {
                sc[j] = w.scales.as_ptr().add(groups[j] * ncg * ROW_GROUP) as *const u16;
                mn[j] = w.mins.as_ptr().add(groups[j] * ncg * ROW_GROUP) as *const u16;
            }
            let xs = x.scales.as_ptr().add(t0 * nb);
            let mut acc = [[_mm512_setzero_ps(); N]; G];
            for cg in 0..ncg {
                let mut dw = [_mm512_setzero_ps(); G];
                for j in 0..G {
                    dw[j] =
                        _mm512_cvtph_ps(_mm256_loadu_si256(sc[j].add(cg * ROW_GROUP) as *const _));
                }
                for b in cg * bpg..((cg + 1) * bpg).min(nb) {
                    let d = block_dots(b);
                    for t in 0..N {
                        let da = _mm512_set1_ps(*xs.add(t * nb + b));
                        for j in 0..G {
                            let scale = _mm512_mul_ps(dw[j], da);
                            acc[j][t] =
                                _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[j][t]), scale, acc[j][t]);
                        }
                    }
                }
                for j in 0..G {
                    let mw =
                        _mm512_cvtph_ps(_mm256_loadu_si256(mn[j].add(cg * ROW_GROUP) as *const _));
                    for t in 0..N {
                        acc[j][t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(s[t * ncg + cg]), acc[j][t]);
                    }
                }
            }
            for j in 0..G {
                for t in 0..N {
                    _mm512_storeu_ps(out[j][t].as_mut_ptr(), acc[j][t]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::int4::LowBitWeights;
    use crate::format::PackedLinear;
    use crate::kernels::int8_matmul::test_support::*;
    use crate::model::Tensor;

    #[test]
    fn lowbit_paths_agree_with_the_specification_and_float32_at_odd_sizes() {
        for bits in [4u32, 6, 8] {
            for gs in [32usize, 64, 128] {
                for &(rows, cols, tokens) in &[
                    (1, 32, 1),
                    (17, 96, 3),
                    (37, 160, 9),
                    (16, 576, 2),
                    (33, 64, 8),
                    (50, 128, 6),
                    (19, 192, 7),
                    // The amx tier's 16-token tiles with tails, partial row groups, a
                    // short last scale group (576 = 4 · 128 + 64).
                    (37, 160, 33),
                    (20, 576, 16),
                    (48, 96, 40),
                    (40, 128, 70),
                    // A pair of row groups whose second is partial, with 32+ tokens.
                    (20, 96, 40),
                    // One token over several row groups: the paired GEMV (groups g and
                    // g + half in lock step), an odd group left over, a partial last group.
                    (100, 128, 1),
                    (65, 64, 1),
                ] {
                    let w = pseudo(rows * cols, (rows * 31 + cols) as u64 + gs as u64, 0.05);
                    let t = Tensor::new(vec![rows, cols], w.clone());
                    let packed = LowBitWeights::quantize(&t, bits, gs, None, "test").unwrap();
                    let f = |path, x: &crate::format::PreparedInput, r, y: &OutputMatrix| match path
                    {
                        Path::Tier(isa) => packed.matmul_rows_isa(isa, x, r, y),
                        Path::Spec(rounding) => {
                            let x = crate::format::int8::q8_rows(x, y.n_tokens(), "int4");
                            lowbit_matmul_spec(rounding, &packed.tiles(), &x, r, y)
                        }
                    };
                    check_paths(&packed, &f, &w, rows, cols, tokens, bits as u64);
                }
            }
        }
    }

    #[test]
    fn one_prepared_input_keeps_minimum_terms_per_group_size() {
        // Matrices of different group sizes read one prepared input (the int4 mix's q/k/v
        // or gate/up): each group size gets its own terms, reused by later calls.
        let (rows, cols, tokens) = (32, 256, 5);
        let mut q8 = Q8::new(&pseudo(tokens * cols, 9, 1.0), cols);
        for gs in [32usize, 64, 128, 64, 32] {
            let w = pseudo(rows * cols, gs as u64, 0.05);
            let t = Tensor::new(vec![rows, cols], w);
            let packed = LowBitWeights::quantize(&t, 4, gs, None, "t").unwrap();
            let f = |path, x: &crate::format::PreparedInput, r, y: &OutputMatrix| match path {
                Path::Tier(isa) => packed.matmul_rows_isa(isa, x, r, y),
                Path::Spec(rounding) => {
                    let x = crate::format::int8::q8_rows(x, y.n_tokens(), "int4");
                    lowbit_matmul_spec(rounding, &packed.tiles(), &x, r, y)
                }
            };
            let best = QuantIsa::best();
            let spec = run(
                &f,
                Path::Spec(best.rounding()),
                &q8,
                tokens,
                rows,
                &[0..16, 16..rows],
            );
            let got = run(&f, Path::Tier(best), &q8, tokens, rows, &[0..16, 16..rows]);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&spec), "groups of {gs}");
        }
        let held = |q8: &Q8| q8.memo.min_terms.lock().unwrap().len();
        assert_eq!(held(&q8), 3);
        q8.memo.clear();
        assert_eq!(held(&q8), 0);
    }

    #[test]
    fn lowbit_round_trip_error_bounds() {
        // Every weight is within one step (max - min) / (2^bits - 1) of its group: the
        // least-squares refit may trade an extreme weight's error (up to a step) for a lower
        // total error (`rounding` tests that the total never exceeds the min/max grid's).
        let (rows, cols) = (21, 160);
        let w = pseudo(rows * cols, 5, 0.1);
        for bits in [4u32, 6, 8] {
            for gs in [32usize, 64, 128] {
                let packed = LowBitWeights::quantize(
                    &Tensor::new(vec![rows, cols], w.clone()),
                    bits,
                    gs,
                    None,
                    "t",
                )
                .unwrap();
                let mut out = vec![0f32; cols];
                for r in 0..rows {
                    packed.dequantize_row(r, &mut out);
                    for c0 in (0..cols).step_by(gs) {
                        let c1 = (c0 + gs).min(cols);
                        let xs = &w[r * cols + c0..r * cols + c1];
                        let (lo, hi) = xs
                            .iter()
                            .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
                        let step = (hi - lo) / ((1 << bits) - 1) as f32;
                        for c in c0..c1 {
                            let err = (out[c] - w[r * cols + c]).abs();
                            assert!(
                                err <= step,
                                "bits {bits} g{gs} row {r} col {c}: {err} vs step {step}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bits_per_weight_of_each_group_size() {
        let (rows, cols) = (64, 1536);
        let t = Tensor::new(vec![rows, cols], pseudo(rows * cols, 1, 0.1));
        for (bits, gs, bpw) in [
            (4, 32, 5.0),
            (4, 64, 4.5),
            (4, 128, 4.25),
            (6, 64, 6.5),
            (8, 32, 9.0),
            (8, 64, 8.5),
        ] {
            let p = LowBitWeights::quantize(&t, bits, gs, None, "t").unwrap();
            assert_eq!(p.bytes() as f64 * 8.0 / (rows * cols) as f64, bpw);
        }
    }
}

//! GGML tensor types as they are stored in GGUF files: the table of every type id with its
//! block size and bytes per block (so the GGUF reader can size and bounds-check any tensor,
//! and report the type mix of files kwk cannot dequantize; ik_llama.cpp's own types too, for
//! the GGUFs its llama-quantize makes), and the dequantization to
//! float32 of the types kwk loads as master weights: F32, F16, BF16, Q8_0, Q4_0, Q4_1,
//! Q5_0, Q5_1, Q4_K, Q5_K, Q6_K.
//!
//! Sources: type ids from `ggml/include/ggml.h` (`enum ggml_type`); block sizes and bytes
//! per block from `gguf-py/gguf/constants.py` (`GGML_QUANT_SIZES`), which matches the
//! `static_assert(sizeof(block_*))` lines of `ggml/src/ggml-common.h`; block layouts from
//! the `block_*` structs in `ggml-common.h` and the arithmetic from `dequantize_row_*` in
//! `ggml/src/ggml-quants.c` (llama.cpp b0.3.36 sources as installed by our set-up script).
//! The arithmetic is written in the same order as ggml's (e.g. `(d * sc) * q` for Q6_K,
//! `q * d + m` for Q4_1) so that results are bit-identical to llama.cpp's own
//! dequantization, which the tests check against gguf-py's independent implementation and
//! against a float32 GGUF written by `llama-quantize`.

use rayon::prelude::*;
use std::fmt;

/// A ggml tensor type id (`enum ggml_type`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GgmlType(pub u32);

/// How a ggml type stores its values: `block_size` values in `type_size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockLayout {
    pub name: &'static str,
    pub block_size: usize,
    pub type_size: usize,
    /// Bytes every row carries before its blocks (ik_llama.cpp's row scales; 0 elsewhere).
    pub row_meta: usize,
}

/// Super-block size of the k-quants (`QK_K` in ggml-common.h).
const QK_K: usize = 256;

/// (id, name, values per block, bytes per block) for every type a GGUF file may hold.
/// Ids 4, 5, 31-33 and 36-38 were removed from ggml and are not valid in GGUF files.
const LAYOUTS: &[(u32, &str, usize, usize)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 2 + 16),
    (3, "Q4_1", 32, 2 + 2 + 16),
    (6, "Q5_0", 32, 2 + 4 + 16),
    (7, "Q5_1", 32, 2 + 2 + 4 + 16),
    (8, "Q8_0", 32, 2 + 32),
    (9, "Q8_1", 32, 2 + 2 + 32),
    (10, "Q2_K", 256, 2 + 2 + QK_K / 16 + QK_K / 4),
    (11, "Q3_K", 256, 2 + QK_K / 4 + QK_K / 8 + 12),
    (12, "Q4_K", 256, 2 + 2 + QK_K / 2 + 12),
    (13, "Q5_K", 256, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
    (14, "Q6_K", 256, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
    (15, "Q8_K", 256, 4 + QK_K + QK_K / 8),
    (16, "IQ2_XXS", 256, 2 + QK_K / 4),
    (17, "IQ2_XS", 256, 2 + QK_K / 4 + QK_K / 32),
    (18, "IQ3_XXS", 256, 2 + QK_K / 4 + QK_K / 8),
    (19, "IQ1_S", 256, 2 + QK_K / 8 + QK_K / 16),
    (20, "IQ4_NL", 32, 2 + 16),
    (21, "IQ3_S", 256, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
    (22, "IQ2_S", 256, 2 + QK_K / 4 + QK_K / 16),
    (23, "IQ4_XS", 256, 2 + 2 + QK_K / 2 + QK_K / 64),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, QK_K / 8 + QK_K / 16 + QK_K / 32),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 2 + 4 * 13),
    (35, "TQ2_0", 256, 2 + 64),
    (39, "MXFP4", 32, 1 + 16),
    (40, "NVFP4", 64, 4 + 32),
    (41, "Q1_0", 128, 2 + 16),
    (42, "Q2_0", 64, 2 + 16),
];

/// ik_llama.cpp's own types, (id, name, values per block, bytes per block, bytes per row
/// before the blocks): ids from its `ggml/include/ggml.h` (`enum ggml_type`, 133 and up, so
/// they never meet mainline's), sizes from its `gguf-py/gguf/constants.py`
/// (`GGML_QUANT_SIZES`) and the per-row scale bytes from `.row_meta_size` in its
/// `ggml/src/ggml.c` (ik_llama.cpp 0.1.5 as vendored by ik-llama-cpp-python). A row of such a
/// type is `row_meta + blocks × bytes per block` (its `ggml_row_size`). kwk reads these
/// GGUFs' headers (sizes, type mix) to run them with ik_llama.cpp; it never dequantizes them.
const IK_LAYOUTS: &[(u32, &str, usize, usize, usize)] = &[
    (133, "Q6_0", 32, 26, 0),
    (137, "IQ2_K", 256, 76, 0),
    (138, "IQ3_K", 256, 110, 0),
    (139, "IQ4_K", 256, 144, 0),
    (140, "IQ5_K", 256, 176, 0),
    (141, "IQ6_K", 256, 212, 0),
    (144, "IQ4_KS", 256, 136, 4),
    (145, "IQ2_KS", 256, 70, 2),
    (146, "IQ4_KSS", 256, 128, 4),
    (152, "IQ5_KS", 256, 168, 4),
    (153, "IQ2_KT", 256, 68, 4),
    (154, "IQ3_KT", 256, 100, 4),
    (155, "IQ4_KT", 256, 128, 4),
    (156, "IQ3_KS", 256, 102, 2),
    (157, "IQ2_KL", 256, 86, 2),
    (158, "IQ1_KT", 256, 56, 4),
];

impl GgmlType {
    pub const F32: GgmlType = GgmlType(0);
    pub const F16: GgmlType = GgmlType(1);
    pub const Q4_0: GgmlType = GgmlType(2);
    pub const Q4_1: GgmlType = GgmlType(3);
    pub const Q5_0: GgmlType = GgmlType(6);
    pub const Q5_1: GgmlType = GgmlType(7);
    pub const Q8_0: GgmlType = GgmlType(8);
    pub const Q4_K: GgmlType = GgmlType(12);
    pub const Q5_K: GgmlType = GgmlType(13);
    pub const Q6_K: GgmlType = GgmlType(14);
    pub const BF16: GgmlType = GgmlType(30);

    /// Block size and bytes per block, or `None` for an id ggml does not define.
    pub fn layout(self) -> Option<BlockLayout> {
        let mainline = LAYOUTS
            .iter()
            .find(|l| l.0 == self.0)
            .map(|&(_, n, b, t)| (n, b, t, 0));
        let ik = || {
            IK_LAYOUTS
                .iter()
                .find(|l| l.0 == self.0)
                .map(|&(_, n, b, t, m)| (n, b, t, m))
        };
        mainline
            .or_else(ik)
            .map(|(name, block_size, type_size, row_meta)| BlockLayout {
                name,
                block_size,
                type_size,
                row_meta,
            })
    }

    /// ggml's name of the type ("Q4_K"), or "type N" for an unknown id.
    pub fn name(self) -> String {
        match self.layout() {
            Some(l) => l.name.to_string(),
            None => format!("type {}", self.0),
        }
    }

    /// Whether [`dequantize`] can convert this type to float32.
    pub fn can_dequantize(self) -> bool {
        matches!(
            self,
            GgmlType::F32
                | GgmlType::F16
                | GgmlType::BF16
                | GgmlType::Q8_0
                | GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q4_K
                | GgmlType::Q5_K
                | GgmlType::Q6_K
        )
    }

    /// Bytes of a tensor of `dims` (`dims[0]` values per row, a multiple of the block size):
    /// its rows' blocks, plus each row's leading bytes in ik_llama.cpp's types with them.
    /// `None` when the size overflows or the rows are not whole blocks.
    pub fn bytes_for_dims(self, dims: &[u64]) -> Option<u64> {
        let l = self.layout()?;
        let n_values = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
        if !n_values.is_multiple_of(l.block_size as u64) {
            return None;
        }
        let blocks = (n_values / l.block_size as u64).checked_mul(l.type_size as u64)?;
        if l.row_meta == 0 {
            return Some(blocks);
        }
        let row = *dims.first()?;
        if row == 0 || !row.is_multiple_of(l.block_size as u64) {
            return None;
        }
        (n_values / row)
            .checked_mul(l.row_meta as u64)?
            .checked_add(blocks)
    }
}

impl fmt::Debug for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// Why a dequantization could not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DequantizeError {
    /// kwk has no float32 conversion for this type.
    Unsupported(GgmlType),
    /// `bytes` does not hold exactly `values` values of the type.
    SizeMismatch {
        ty: GgmlType,
        bytes: usize,
        values: usize,
    },
}

impl fmt::Display for DequantizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DequantizeError::Unsupported(t) => write!(
                f,
                "ggml type {t} cannot be dequantized by kwk (it reads F32, F16, BF16, Q8_0, \
                 Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)"
            ),
            DequantizeError::SizeMismatch { ty, bytes, values } => {
                write!(f, "{bytes} bytes do not hold {values} values of type {ty}")
            }
        }
    }
}

/// A weight's blocks as its GGUF stored them: the ggml type and the bytes of its rows, in
/// the row order of the float32 tensor they were dequantized into (the loader's q/k
/// un-permutation moves whole rows, so it moves these too). Packing reads them to copy a
/// source grid a kwk layout holds exactly (`format::source_grid`).
#[derive(Clone, PartialEq, Eq)]
pub struct SourceBlocks {
    pub ty: GgmlType,
    pub bytes: Vec<u8>,
}

impl fmt::Debug for SourceBlocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SourceBlocks({}, {} bytes)", self.ty, self.bytes.len())
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Q4_0: `d: f16, qs[16]`; value j = (low nibble - 8) * d, value j+16 = (high nibble - 8) * d.
fn block_q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

/// Q4_1: `d: f16, m: f16, qs[16]`; value = nibble * d + m.
fn block_q4_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        y[j] = (qs[j] & 0x0F) as f32 * d + m;
        y[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

/// The fifth bits of Q5_0/Q5_1: bit j of `qh` for value j, bit j+16 for value j+16.
pub(crate) fn fifth_bits(qh: u32, j: usize) -> (u8, u8) {
    (
        (((qh >> j) << 4) & 0x10) as u8,
        ((qh >> (j + 12)) & 0x10) as u8,
    )
}

/// Q5_0: `d: f16, qh: [u8; 4], qs[16]`; value = ((nibble | fifth bit << 4) - 16) * d.
fn block_q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let (h0, h1) = fifth_bits(qh, j);
        y[j] = (((qs[j] & 0x0F) | h0) as i32 - 16) as f32 * d;
        y[j + 16] = (((qs[j] >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

/// Q5_1: `d: f16, m: f16, qh: [u8; 4], qs[16]`; value = (nibble | fifth bit << 4) * d + m.
fn block_q5_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let (h0, h1) = fifth_bits(qh, j);
        y[j] = ((qs[j] & 0x0F) | h0) as f32 * d + m;
        y[j + 16] = ((qs[j] >> 4) | h1) as f32 * d + m;
    }
}

/// Q8_0: `d: f16, qs: [i8; 32]`; value = q * d.
fn block_q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, &q) in y.iter_mut().zip(&b[2..34]) {
        *o = (q as i8) as f32 * d;
    }
}

/// The 6-bit scale and min of sub-block `j` of a Q4_K/Q5_K super-block
/// (`get_scale_min_k4` in ggml-quants.c): 12 bytes pack 8 scales and 8 mins.
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K: `d: f16, dmin: f16, scales[12], qs[128]`; 8 sub-blocks of 32 values, value =
/// (d * sc) * q - dmin * m. Each 32 bytes of `qs` hold two sub-blocks (low, high nibbles).
fn block_q4_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let min = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (chunk, (q, out)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        for l in 0..32 {
            out[l] = d1 * (q[l] & 0x0F) as f32 - m1;
            out[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// Q5_K: `d: f16, dmin: f16, scales[12], qh[32], qs[128]`; like Q4_K with a fifth bit from
/// `qh` (bits 2c and 2c+1 for the two sub-blocks of chunk c).
fn block_q5_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let min = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (chunk, (ql, out)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let u1 = 1u8 << (2 * chunk);
        let u2 = 2u8 << (2 * chunk);
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            out[l] = d1 * ((ql[l] & 0x0F) + h1) as f32 - m1;
            out[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
        }
    }
}

/// Q6_K: `ql[128], qh[64], scales: [i8; 16], d: f16`; two halves of 128 values, each value
/// q = (4 low bits | 2 high bits << 4) - 32, scaled by (d * scale) of its 16-value group.
fn block_q6_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 208);
    for half in 0..2 {
        let ql = &b[half * 64..half * 64 + 64];
        let qh = &b[128 + half * 32..128 + half * 32 + 32];
        let sc = &b[192 + half * 8..192 + half * 8 + 8];
        let out = &mut y[half * 128..half * 128 + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let s = |k: usize| d * (sc[is + k] as i8) as f32;
            out[l] = s(0) * q1 as f32;
            out[l + 32] = s(2) * q2 as f32;
            out[l + 64] = s(4) * q3 as f32;
            out[l + 96] = s(6) * q4 as f32;
        }
    }
}

fn convert_plain(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        _ => unreachable!("convert_plain handles F32/F16/BF16 only"),
    }
}

/// Dequantizes one block: its bytes into its values.
type BlockFn = fn(&[u8], &mut [f32]);

/// The per-block function of a block-quantized type.
fn block_fn(ty: GgmlType) -> Option<BlockFn> {
    Some(match ty {
        GgmlType::Q4_0 => block_q4_0,
        GgmlType::Q4_1 => block_q4_1,
        GgmlType::Q5_0 => block_q5_0,
        GgmlType::Q5_1 => block_q5_1,
        GgmlType::Q8_0 => block_q8_0,
        GgmlType::Q4_K => block_q4_k,
        GgmlType::Q5_K => block_q5_k,
        GgmlType::Q6_K => block_q6_k,
        _ => return None,
    })
}

/// Checks that `bytes` holds exactly `out.len()` values of `ty` and that kwk reads `ty`.
fn check(ty: GgmlType, bytes: &[u8], out: &[f32]) -> Result<BlockLayout, DequantizeError> {
    if !ty.can_dequantize() {
        return Err(DequantizeError::Unsupported(ty));
    }
    let layout = ty.layout().ok_or(DequantizeError::Unsupported(ty))?;
    let mismatch = DequantizeError::SizeMismatch {
        ty,
        bytes: bytes.len(),
        values: out.len(),
    };
    if !out.len().is_multiple_of(layout.block_size)
        || (out.len() / layout.block_size).checked_mul(layout.type_size) != Some(bytes.len())
    {
        return Err(mismatch);
    }
    Ok(layout)
}

/// Dequantizes `bytes` (whole blocks of `ty`) into `out`, on the calling thread.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), DequantizeError> {
    let layout = check(ty, bytes, out)?;
    match block_fn(ty) {
        None => convert_plain(ty, bytes, out),
        Some(f) => {
            for (b, y) in bytes
                .chunks_exact(layout.type_size)
                .zip(out.chunks_exact_mut(layout.block_size))
            {
                f(b, y);
            }
        }
    }
    Ok(())
}

/// Like [`dequantize`], split over the rayon pool in chunks of whole blocks (for big
/// tensors; small ones run on the calling thread).
pub fn dequantize_parallel(
    ty: GgmlType,
    bytes: &[u8],
    out: &mut [f32],
) -> Result<(), DequantizeError> {
    /// Values per task: big enough that scheduling costs nothing, small enough to balance.
    const CHUNK_VALUES: usize = 1 << 16;
    let layout = check(ty, bytes, out)?;
    if out.len() <= CHUNK_VALUES {
        return dequantize(ty, bytes, out);
    }
    let blocks_per_chunk = CHUNK_VALUES / layout.block_size;
    out.par_chunks_mut(blocks_per_chunk * layout.block_size)
        .zip(bytes.par_chunks(blocks_per_chunk * layout.type_size))
        .try_for_each(|(y, b)| dequantize(ty, b, y))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn layouts_match_ggml_block_structs() {
        // sizeof(block_*) from ggml-common.h's static_asserts.
        for (ty, bs, ts) in [
            (GgmlType::Q4_0, 32, 18),
            (GgmlType::Q4_1, 32, 20),
            (GgmlType::Q5_0, 32, 22),
            (GgmlType::Q5_1, 32, 24),
            (GgmlType::Q8_0, 32, 34),
            (GgmlType::Q4_K, 256, 144),
            (GgmlType::Q5_K, 256, 176),
            (GgmlType::Q6_K, 256, 210),
            (GgmlType::BF16, 1, 2),
        ] {
            let l = ty.layout().unwrap();
            assert_eq!((l.block_size, l.type_size), (bs, ts), "{ty}");
        }
        assert!(GgmlType(4).layout().is_none());
        assert_eq!(GgmlType(31).name(), "type 31");
    }

    /// ik_llama.cpp's types: a row of IQ4_KS is its float row scale and the blocks
    /// (`ggml_row_size`), IQ4_K has no row bytes; kwk only sizes them, never dequantizes.
    #[test]
    fn ik_types_are_sized_with_their_row_bytes() {
        let iq4_ks = GgmlType(144);
        assert_eq!(iq4_ks.name(), "IQ4_KS");
        // 576 rows of 768: 3 blocks of 136 bytes and 4 bytes of row scale each.
        assert_eq!(
            iq4_ks.bytes_for_dims(&[768, 576]),
            Some(576 * (4 + 3 * 136))
        );
        assert_eq!(iq4_ks.bytes_for_dims(&[576, 2]), None, "not whole blocks");
        assert_eq!(GgmlType(139).bytes_for_dims(&[512, 3]), Some(3 * 2 * 144));
        assert_eq!(GgmlType::Q8_0.bytes_for_dims(&[64, 5]), Some(5 * 2 * 34));
        assert!(!iq4_ks.can_dequantize());
        // ik's ids never meet mainline's.
        for &(id, ..) in IK_LAYOUTS {
            assert!(LAYOUTS.iter().all(|l| l.0 != id), "{id}");
        }
    }

    #[test]
    fn size_mismatch_and_unsupported_are_errors() {
        let mut out = vec![0f32; 32];
        assert!(matches!(
            dequantize(GgmlType::Q4_0, &[0u8; 17], &mut out),
            Err(DequantizeError::SizeMismatch { .. })
        ));
        assert_eq!(
            dequantize(GgmlType(10), &[0u8; 84], &mut vec![0f32; 256]),
            Err(DequantizeError::Unsupported(GgmlType(10)))
        );
        let mut odd = vec![0f32; 33];
        assert!(dequantize(GgmlType::Q8_0, &[0u8; 34], &mut odd).is_err());
    }

    /// Reference vectors from gguf-py's `gguf.quants.dequantize` (an independent numpy
    /// port of ggml's `dequantize_row_*`), written by `scripts/gen_ggml_block_vectors.py`.
    #[test]
    fn every_type_matches_gguf_py_bit_for_bit() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ggml_blocks");
        let types = [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ];
        for ty in types {
            let read = |ext: &str| {
                let p = dir.join(format!("{ty}.{ext}"));
                std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            };
            let bytes = read("bin");
            let expected: Vec<f32> = read("f32")
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            let mut got = vec![f32::NAN; expected.len()];
            dequantize(ty, &bytes, &mut got).unwrap();
            for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                assert_eq!(g.to_bits(), e.to_bits(), "{ty} value {i}: {g} vs {e}");
            }
            assert!(
                expected.iter().any(|v| *v != 0.0),
                "{ty}: all-zero reference"
            );
        }
    }

    /// `MODELS/SmolLM2-135M-Instruct` (MODELS: [`crate::paths::default_models_dir`], as
    /// scripts/setup-model.sh installs it), or a panic naming the set-up script.
    pub(crate) fn smollm2_dir() -> std::path::PathBuf {
        let models = crate::paths::default_models_dir()
            .expect("none of KWK_MODELS_DIR, KWK_CACHE, XDG_CACHE_HOME, HOME is set");
        let dir = models.join("SmolLM2-135M-Instruct");
        assert!(
            dir.join("SmolLM2-135M-Instruct.Q4_1.gguf").is_file()
                && dir.join("SmolLM2-135M-Instruct-F32.gguf").is_file(),
            "SmolLM2-135M-Instruct GGUFs not found in {}: run scripts/setup-model.sh \
             (with the same KWK_MODELS_DIR / KWK_CACHE, docs/paths.md)",
            dir.display()
        );
        dir
    }

    /// The distributed Q4_1 GGUF, dequantized here, equals bit for bit the float32 GGUF
    /// `llama-quantize` made from it (llama.cpp's own dequantization).
    #[test]
    fn smollm2_q4_1_dequantizes_to_llama_quantize_f32() {
        let dir = smollm2_dir();
        let q = crate::gguf::GgufFile::open(&dir.join("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
        let f = crate::gguf::GgufFile::open(&dir.join("SmolLM2-135M-Instruct-F32.gguf")).unwrap();
        assert_eq!(q.tensors().len(), f.tensors().len());
        let mut types = std::collections::BTreeSet::new();
        for t in q.tensors() {
            types.insert(t.ggml_type);
            let r = f
                .tensor(&t.name)
                .unwrap_or_else(|| panic!("{} not in F32 file", t.name));
            assert_eq!(r.ggml_type, GgmlType::F32, "{}", t.name);
            assert_eq!(r.dims, t.dims, "{}", t.name);
            let mut got = vec![0f32; t.n_elements() as usize];
            dequantize_parallel(t.ggml_type, q.tensor_bytes(t).unwrap(), &mut got).unwrap();
            let want = f.tensor_bytes(r).unwrap();
            let mismatches = got
                .iter()
                .zip(want.chunks_exact(4))
                .filter(|(g, w)| g.to_bits() != u32::from_le_bytes((*w).try_into().unwrap()))
                .count();
            assert_eq!(
                mismatches, 0,
                "{} ({}): {mismatches} values differ",
                t.name, t.ggml_type
            );
        }
        assert!(types.contains(&GgmlType::Q4_1), "{types:?}");
    }

    #[test]
    fn q8_0_by_hand() {
        let mut b = vec![0u8; 34];
        b[..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        for i in 0..32 {
            b[2 + i] = (i as i8 - 16) as u8;
        }
        let mut out = vec![0f32; 32];
        dequantize(GgmlType::Q8_0, &b, &mut out).unwrap();
        for (i, v) in out.iter().enumerate() {
            assert_eq!(*v, (i as f32 - 16.0) * 0.5);
        }
    }

    #[test]
    fn parallel_equals_serial() {
        let n_blocks = 1000;
        let bytes: Vec<u8> = (0..n_blocks * 210)
            .map(|i| ((i * 7919) % 251) as u8)
            .collect();
        // Keep the f16 scale finite: byte 208/209 of each Q6_K block is `d`.
        let mut bytes = bytes;
        for b in bytes.chunks_exact_mut(210) {
            b[208..210].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        }
        let mut a = vec![0f32; n_blocks * 256];
        let mut p = vec![0f32; n_blocks * 256];
        dequantize(GgmlType::Q6_K, &bytes, &mut a).unwrap();
        dequantize_parallel(GgmlType::Q6_K, &bytes, &mut p).unwrap();
        assert_eq!(a, p);
    }
}

//! The GGUF container: header, metadata, tensor directory, memory-mapped tensor data, and
//! the weight bytes a token reads from that directory ([`gguf_weight_bytes_per_token`],
//! re-exported by `model::cost`; `gguf` reads nothing of `model`).
//!
//! [`GgufFile::open`] maps the file and parses everything but the tensor data: the header
//! (magic `GGUF`, version 2 or 3, tensor and key counts), every metadata key-value pair
//! (all 13 value types, arrays included), and the tensor directory (name, dimensions in
//! ggml order with `ne[0]` innermost, ggml type, offset into the data section, which
//! starts at the next multiple of `general.alignment` (default 32) after the directory).
//! Every count and length is checked against the bytes left in the file before anything
//! is allocated, and every tensor's extent against the file size, so a truncated or
//! corrupt file is a `BadModel` error naming the file, never a panic, an out-of-bounds
//! read (all reads go through bounds-checked slices of the map) or a huge allocation.
//!
//! Memory bounds: the header (metadata and tensor directory, everything before the data
//! section) may be at most [`MAX_HEADER_BYTES`] (128 MiB; real headers, 256k-token
//! vocabularies included, are under 16 MiB). What the parsed header holds is at most
//! [`HEADER_MEMORY_PER_BYTE`] (8) bytes of heap per header byte: arrays of numbers and
//! bools are kept as typed vectors (one element of heap per element on disk), string
//! arrays as one text buffer plus end offsets ([`GgufStrings`]: 8 bytes per string that
//! takes at least 8 on disk), and the key and tensor-name lookups are sorted index vectors
//! (4 bytes per entry) rather than hash maps holding copies of the names. So a header
//! costs at most 8 × 128 MiB = 1 GiB, and at most 8 × the file's size. Nested arrays are
//! read one level deep, as no writer produces more ([`MAX_ARRAY_DEPTH`]). The format follows `ggml/src/gguf.cpp` (`gguf_init_from_file_impl`)
//! and `docs/gguf.md` of llama.cpp.
//!
//! [`GgufFile::summary`] gives what a report says about a GGUF without loading it
//! (architecture, parameters, tensor bytes, type mix, bits per weight), for the llama.cpp
//! rows of the harness. Also home of [`map_file`], the one place the loaders memory-map a
//! model file.

use crate::error::{KwkError, Result};
use crate::format::ggml_blocks::GgmlType;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Maps `path` read-only. Model files are mapped rather than read so that a multi-gigabyte
/// checkpoint costs no heap copy: tensors are converted straight from the page cache.
pub(crate) fn map_file(path: &Path) -> Result<memmap2::Mmap> {
    // A named pipe would block `open` (and a device has no length): regular files only.
    let file = crate::files::open_regular(path).map_err(|e| KwkError::io(path, e))?;
    // SAFETY: the map is read-only and private to this process; the loaders only read
    // bytes through bounds-checked slices. A concurrent writer truncating the file
    // would be undefined behaviour, as for every mmap-based model loader (llama.cpp,
    // candle); model files are not modified while a run reads them.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| KwkError::io(path, e))?;
    Ok(map)
}

/// Drops the pages of a read-only file mapping from this process's resident set (the page
/// cache keeps them; a later read faults them back in). A streaming loader calls it after
/// each layer so that the source it has read does not count as its memory.
pub(crate) fn release_pages(map: &memmap2::Mmap) {
    // SAFETY: `map` is a read-only, file-backed mapping of a file nobody modifies while it
    // is read (see `map_file`); MADV_DONTNEED on such a mapping only drops page-table
    // entries, and the next access reads the same file bytes again. No reference into the
    // mapping is invalidated.
    let _ = unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
}

/// `GGUF` read as a little-endian u32.
const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// `GGUF_DEFAULT_ALIGNMENT` in ggml/src/gguf.cpp.
const DEFAULT_ALIGNMENT: u64 = 32;
/// `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;
/// Arrays nested deeper than this are refused: an array of arrays is read (depth 2), an
/// array of arrays of arrays is not (llama.cpp's `gguf_init_from_file_impl` refuses any
/// nesting).
pub const MAX_ARRAY_DEPTH: usize = 2;
/// The most bytes a GGUF header (metadata and tensor directory) may take.
pub const MAX_HEADER_BYTES: usize = 128 << 20;
/// Heap bytes the parsed header may hold per header byte (see the module docs; the fuzz
/// tests measure it with a counting allocator on crafted worst cases).
pub const HEADER_MEMORY_PER_BYTE: usize = 8;

/// The type tag of a metadata value (`enum gguf_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl GgufValueType {
    fn from_u32(t: u32) -> Option<GgufValueType> {
        use GgufValueType::*;
        Some(match t {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The fewest bytes one value of this type occupies (for allocation guards).
    fn min_size(self) -> usize {
        use GgufValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
            String => 8,    // u64 length
            Array => 4 + 8, // element type + count
        }
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array, stored compactly by element type: numbers and bools as typed vectors,
/// strings as one buffer ([`GgufStrings`]), nested arrays (one level) as arrays.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(GgufStrings),
    Array(Vec<GgufArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

/// The strings of a string array: their texts one after another and where each ends.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufStrings {
    text: String,
    ends: Vec<usize>,
}

impl GgufStrings {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.text.get(start..end)
    }

    /// The strings in order (an exact-size iterator, so collecting allocates once).
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i).unwrap_or_default())
    }
}

impl<S: AsRef<str>> FromIterator<S> for GgufStrings {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let mut out = GgufStrings::default();
        for s in iter {
            out.text.push_str(s.as_ref());
            out.ends.push(out.text.len());
        }
        out
    }
}

impl GgufArray {
    pub fn element_type(&self) -> GgufValueType {
        use GgufValueType as T;
        match self {
            GgufArray::U8(_) => T::U8,
            GgufArray::I8(_) => T::I8,
            GgufArray::U16(_) => T::U16,
            GgufArray::I16(_) => T::I16,
            GgufArray::U32(_) => T::U32,
            GgufArray::I32(_) => T::I32,
            GgufArray::F32(_) => T::F32,
            GgufArray::Bool(_) => T::Bool,
            GgufArray::String(_) => T::String,
            GgufArray::Array(_) => T::Array,
            GgufArray::U64(_) => T::U64,
            GgufArray::I64(_) => T::I64,
            GgufArray::F64(_) => T::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::Array(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as a value (strings and nested arrays are copied).
    pub fn get(&self, i: usize) -> Option<GgufValue> {
        Some(match self {
            GgufArray::U8(v) => GgufValue::U8(*v.get(i)?),
            GgufArray::I8(v) => GgufValue::I8(*v.get(i)?),
            GgufArray::U16(v) => GgufValue::U16(*v.get(i)?),
            GgufArray::I16(v) => GgufValue::I16(*v.get(i)?),
            GgufArray::U32(v) => GgufValue::U32(*v.get(i)?),
            GgufArray::I32(v) => GgufValue::I32(*v.get(i)?),
            GgufArray::F32(v) => GgufValue::F32(*v.get(i)?),
            GgufArray::Bool(v) => GgufValue::Bool(*v.get(i)?),
            GgufArray::String(v) => GgufValue::String(v.get(i)?.to_string()),
            GgufArray::Array(v) => GgufValue::Array(v.get(i)?.clone()),
            GgufArray::U64(v) => GgufValue::U64(*v.get(i)?),
            GgufArray::I64(v) => GgufValue::I64(*v.get(i)?),
            GgufArray::F64(v) => GgufValue::F64(*v.get(i)?),
        })
    }
}

impl GgufValue {
    pub fn value_type(&self) -> GgufValueType {
        match self {
            GgufValue::U8(_) => GgufValueType::U8,
            GgufValue::I8(_) => GgufValueType::I8,
            GgufValue::U16(_) => GgufValueType::U16,
            GgufValue::I16(_) => GgufValueType::I16,
            GgufValue::U32(_) => GgufValueType::U32,
            GgufValue::I32(_) => GgufValueType::I32,
            GgufValue::F32(_) => GgufValueType::F32,
            GgufValue::Bool(_) => GgufValueType::Bool,
            GgufValue::String(_) => GgufValueType::String,
            GgufValue::Array(_) => GgufValueType::Array,
            GgufValue::U64(_) => GgufValueType::U64,
            GgufValue::I64(_) => GgufValueType::I64,
            GgufValue::F64(_) => GgufValueType::F64,
        }
    }

    /// Any integer type, if the value is a non-negative integer that fits in a u64.
    /// (Writers differ: `context_length` is u32 in most files, u64 or i32 in some.)
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v as u64),
            GgufValue::U16(v) => Some(v as u64),
            GgufValue::U32(v) => Some(v as u64),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type, if it fits in an i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::I8(v) => Some(v as i64),
            GgufValue::I16(v) => Some(v as i64),
            GgufValue::I32(v) => Some(v as i64),
            GgufValue::I64(v) => Some(v),
            GgufValue::U8(v) => Some(v as i64),
            GgufValue::U16(v) => Some(v as i64),
            GgufValue::U32(v) => Some(v as i64),
            GgufValue::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// F32 or F64 (narrowed) values.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            GgufValue::F32(v) => Some(v),
            GgufValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One entry of the tensor directory.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` (`ne[0]`) is the innermost, contiguous one. A
    /// Hugging Face `[out, in]` weight is stored with `dims = [in, out]`.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Bytes of data (whole blocks of `ggml_type`).
    pub n_bytes: u64,
}

impl GgufTensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The shape in row-major order (outermost first), as Hugging Face writes it.
    pub fn shape_row_major(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// What a report says about a GGUF file.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GgufSummary {
    /// `general.architecture`, when present.
    pub architecture: Option<String>,
    /// `general.name`, when present.
    pub name: Option<String>,
    /// Elements of all tensors (llama.cpp's "model params").
    pub n_params: u64,
    /// Bytes of tensor data (llama.cpp's "model size").
    pub tensor_bytes: u64,
    pub file_bytes: u64,
    /// ggml type name → number of tensors of that type.
    pub type_counts: BTreeMap<String, usize>,
    /// ggml type name → elements stored in that type.
    pub type_params: BTreeMap<String, u64>,
    /// `8 * tensor_bytes / n_params` (llama.cpp's "BPW"); 0 for a file without tensors.
    pub bits_per_weight: f64,
}

/// An open GGUF file: parsed metadata and tensor directory over the mapped bytes.
pub struct GgufFile {
    path: PathBuf,
    map: memmap2::Mmap,
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    /// Indices of `metadata` sorted by key.
    metadata_index: Vec<u32>,
    tensors: Vec<GgufTensorInfo>,
    /// Indices of `tensors` sorted by name.
    tensor_index: Vec<u32>,
    alignment: u64,
    data_offset: u64,
}

/// A cursor over the header bytes whose reads fail, naming what was being read, instead of
/// running past the end.
struct HeaderReader<'a> {
    path: &'a Path,
    /// The first [`MAX_HEADER_BYTES`] of the file (or all of it, when shorter).
    bytes: &'a [u8],
    pos: usize,
    /// Whether the file goes on past `bytes` (the header limit, not the file, ended).
    limited: bool,
}

/// `n` bytes as "N MiB" (or "N bytes" below a MiB).
fn mib(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{} MiB", n >> 20)
    } else {
        format!("{n} bytes")
    }
}

/// Fixed-size little-endian values an array can hold.
trait LeValue: Sized {
    const SIZE: usize;
    fn from_le(b: &[u8]) -> Self;
}

macro_rules! le_value {
    ($($t:ty),*) => {$(
        impl LeValue for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn from_le(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                <$t>::from_le_bytes(a)
            }
        }
    )*};
}
le_value!(u8, i8, u16, i16, u32, i32, f32, u64, i64, f64);

impl<'a> HeaderReader<'a> {
    fn new(path: &'a Path, file: &'a [u8], max_header_bytes: usize) -> Self {
        let limit = file.len().min(max_header_bytes);
        HeaderReader {
            path,
            bytes: &file[..limit],
            pos: 0,
            limited: limit < file.len(),
        }
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// Why the bytes ran out: the end of the file, or the header limit.
    fn out_of_bytes(&self, what: &str) -> String {
        if self.limited {
            format!(
                "the GGUF header is longer than kwk's limit of {} while reading {what}; \
                 the file is corrupt (real headers are a few MiB; re-download or re-convert it)",
                mib(self.bytes.len())
            )
        } else {
            format!(
                "GGUF file ends at byte {} while reading {what}; the file is truncated \
                 (re-download or re-convert it)",
                self.bytes.len()
            )
        }
    }

    fn truncated(&self, what: &str) -> KwkError {
        KwkError::bad_model(self.path, self.out_of_bytes(what))
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.truncated(what));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items each taking at least `min_item_bytes`: refused when the rest of
    /// the header could not hold that many (guards every allocation sized by the file).
    fn count(&mut self, min_item_bytes: usize, what: &str) -> Result<usize> {
        let n = self.u64(what)?;
        let fits = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(min_item_bytes))
            .is_some_and(|bytes| bytes <= self.remaining());
        if !fits {
            let why = if self.limited {
                format!(
                    "more than kwk's header limit of {} can hold; the file is corrupt",
                    mib(self.bytes.len())
                )
            } else {
                format!(
                    "more than the {} bytes left in the file can hold; the file is corrupt \
                     or truncated",
                    self.remaining()
                )
            };
            return Err(KwkError::bad_model(
                self.path,
                format!("{what} is {n}, {why}"),
            ));
        }
        Ok(n as usize)
    }

    fn str(&mut self, what: &str) -> Result<&'a str> {
        let len = self.count(1, &format!("length of {what}"))?;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes)
            .map_err(|_| KwkError::bad_model(self.path, format!("{what} is not valid UTF-8")))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        Ok(self.str(what)?.to_string())
    }

    fn value(&mut self, ty: GgufValueType, what: &str) -> Result<GgufValue> {
        use GgufValueType as T;
        Ok(match ty {
            T::U8 => GgufValue::U8(self.array::<1>(what)?[0]),
            T::I8 => GgufValue::I8(self.array::<1>(what)?[0] as i8),
            T::U16 => GgufValue::U16(u16::from_le_bytes(self.array(what)?)),
            T::I16 => GgufValue::I16(i16::from_le_bytes(self.array(what)?)),
            T::U32 => GgufValue::U32(self.u32(what)?),
            T::I32 => GgufValue::I32(i32::from_le_bytes(self.array(what)?)),
            T::F32 => GgufValue::F32(f32::from_le_bytes(self.array(what)?)),
            T::Bool => {
                let [b] = self.array::<1>(what)?;
                GgufValue::Bool(self.bool(b, what)?)
            }
            T::String => GgufValue::String(self.string(what)?),
            T::U64 => GgufValue::U64(self.u64(what)?),
            T::I64 => GgufValue::I64(i64::from_le_bytes(self.array(what)?)),
            T::F64 => GgufValue::F64(f64::from_le_bytes(self.array(what)?)),
            T::Array => GgufValue::Array(self.array_value(what, 1)?),
        })
    }

    fn bool(&self, b: u8, what: &str) -> Result<bool> {
        match b {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(KwkError::bad_model(
                self.path,
                format!("{what} is a bool with byte value {b}"),
            )),
        }
    }

    /// `n` fixed-size values, read into a vector of exactly `n` elements.
    fn numbers<T: LeValue>(&mut self, n: usize, what: &str) -> Result<Vec<T>> {
        // `count` checked n * SIZE against the bytes left, so this cannot overflow.
        let bytes = self.take(n * T::SIZE, what)?;
        Ok(bytes.chunks_exact(T::SIZE).map(T::from_le).collect())
    }

    /// An array (element type, count, elements); `depth` is 1 for a key's value.
    fn array_value(&mut self, what: &str, depth: usize) -> Result<GgufArray> {
        use GgufValueType as T;
        if depth > MAX_ARRAY_DEPTH {
            return Err(KwkError::bad_model(
                self.path,
                format!("{what} nests arrays more than {MAX_ARRAY_DEPTH} deep"),
            ));
        }
        let raw = self.u32(what)?;
        let element_type = GgufValueType::from_u32(raw).ok_or_else(|| {
            KwkError::bad_model(self.path, format!("{what} has unknown element type {raw}"))
        })?;
        let n = self.count(element_type.min_size(), &format!("element count of {what}"))?;
        Ok(match element_type {
            T::U8 => GgufArray::U8(self.numbers(n, what)?),
            T::I8 => GgufArray::I8(self.numbers(n, what)?),
            T::U16 => GgufArray::U16(self.numbers(n, what)?),
            T::I16 => GgufArray::I16(self.numbers(n, what)?),
            T::U32 => GgufArray::U32(self.numbers(n, what)?),
            T::I32 => GgufArray::I32(self.numbers(n, what)?),
            T::F32 => GgufArray::F32(self.numbers(n, what)?),
            T::U64 => GgufArray::U64(self.numbers(n, what)?),
            T::I64 => GgufArray::I64(self.numbers(n, what)?),
            T::F64 => GgufArray::F64(self.numbers(n, what)?),
            T::Bool => {
                let bytes = self.take(n, what)?;
                GgufArray::Bool(
                    bytes
                        .iter()
                        .map(|&b| self.bool(b, what))
                        .collect::<Result<_>>()?,
                )
            }
            T::String => {
                // Two passes: check every length first, then copy into buffers of the
                // exact size (no growth, so no transient double allocation).
                let start = self.pos;
                let mut total = 0usize;
                for _ in 0..n {
                    total += self.str(what)?.len();
                }
                self.pos = start;
                let mut text = String::with_capacity(total);
                let mut ends = Vec::with_capacity(n);
                for _ in 0..n {
                    text.push_str(self.str(what)?);
                    ends.push(text.len());
                }
                GgufArray::String(GgufStrings { text, ends })
            }
            T::Array => {
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.array_value(what, depth + 1)?);
                }
                GgufArray::Array(items)
            }
        })
    }
}

/// Indices of `names` in sorted order (for binary search), or the first name that appears
/// twice.
fn sorted_index<'a>(n: usize, name: impl Fn(usize) -> &'a str) -> Result<Vec<u32>, &'a str> {
    // The header limit keeps every count far below u32::MAX.
    let mut index: Vec<u32> = (0..n as u32).collect();
    index.sort_unstable_by(|&a, &b| name(a as usize).cmp(name(b as usize)).then(a.cmp(&b)));
    match index
        .windows(2)
        .find(|w| name(w[0] as usize) == name(w[1] as usize))
    {
        Some(w) => Err(name(w[1] as usize)),
        None => Ok(index),
    }
}

/// Binary search of a [`sorted_index`].
fn lookup<'a>(index: &[u32], key: &str, name: impl Fn(usize) -> &'a str) -> Option<usize> {
    index
        .binary_search_by(|&i| name(i as usize).cmp(key))
        .ok()
        .map(|p| index[p] as usize)
}

impl GgufFile {
    /// Maps and parses a GGUF file (versions 2 and 3).
    pub fn open(path: &Path) -> Result<GgufFile> {
        let map = map_file(path)?;
        Self::parse(path, map)
    }

    fn parse(path: &Path, map: memmap2::Mmap) -> Result<GgufFile> {
        Self::parse_limited(path, map, MAX_HEADER_BYTES)
    }

    /// [`Self::parse`] with another header limit (tests use a small one).
    fn parse_limited(path: &Path, map: memmap2::Mmap, max_header: usize) -> Result<GgufFile> {
        let mut r = HeaderReader::new(path, &map, max_header);
        let magic = r.array::<4>("the magic number")?;
        if magic != GGUF_MAGIC {
            return Err(KwkError::bad_model(
                path,
                format!(
                    "not a GGUF file (starts with {:?}, expected \"GGUF\")",
                    String::from_utf8_lossy(&magic)
                ),
            ));
        }
        let version = r.u32("the version")?;
        if version != 2 && version != 3 {
            let hint = if version & 0xFFFF == 0 {
                " (a big-endian file?)"
            } else if version == 1 {
                " (GGUF v1 is obsolete; re-convert the model)"
            } else {
                ""
            };
            return Err(KwkError::bad_model(
                path,
                format!("GGUF version {version} is not supported (kwk reads 2 and 3){hint}"),
            ));
        }
        // Minimum directory entry: name length, n_dims, type, offset.
        let n_tensors = r.count(8 + 4 + 4 + 8, "the tensor count")?;
        // Minimum key-value pair: key length, value type, one byte of value.
        let n_kv = r.count(8 + 4 + 1, "the metadata key count")?;

        let mut metadata: Vec<(String, GgufValue)> = Vec::with_capacity(n_kv);
        for i in 0..n_kv {
            let key = r.string(&format!("metadata key {i}"))?;
            let raw = r.u32(&format!("the type of metadata key '{key}'"))?;
            let ty = GgufValueType::from_u32(raw).ok_or_else(|| {
                KwkError::bad_model(path, format!("metadata key '{key}' has unknown type {raw}"))
            })?;
            let value = r.value(ty, &format!("metadata key '{key}'"))?;
            metadata.push((key, value));
        }
        let metadata_index = sorted_index(metadata.len(), |i| &metadata[i].0).map_err(|key| {
            KwkError::bad_model(path, format!("metadata key '{key}' appears twice"))
        })?;

        let alignment = match lookup(&metadata_index, "general.alignment", |i| &metadata[i].0) {
            None => DEFAULT_ALIGNMENT,
            Some(i) => match metadata[i].1 {
                GgufValue::U32(a) if a > 0 && a.is_power_of_two() => a as u64,
                ref v => {
                    return Err(KwkError::bad_model(
                        path,
                        format!("general.alignment is {v:?}; it must be a u32 power of two"),
                    ))
                }
            },
        };

        let mut tensors = Vec::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let name = r.string(&format!("the name of tensor {i}"))?;
            let n_dims = r.u32(&format!("the dimension count of tensor '{name}'"))?;
            if n_dims > MAX_DIMS {
                return Err(KwkError::bad_model(
                    path,
                    format!("tensor '{name}' has {n_dims} dimensions (ggml allows {MAX_DIMS})"),
                ));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64(&format!("the dimensions of tensor '{name}'"))?);
            }
            let ggml_type = GgmlType(r.u32(&format!("the type of tensor '{name}'"))?);
            let offset = r.u64(&format!("the offset of tensor '{name}'"))?;
            let layout = ggml_type.layout().ok_or_else(|| {
                KwkError::bad_model(
                    path,
                    format!("tensor '{name}' has unknown ggml type {}", ggml_type.0),
                )
            })?;
            let n_elements = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let n_bytes = n_elements
                .and_then(|n| ggml_type.bytes_for(n))
                .ok_or_else(|| {
                    KwkError::bad_model(
                        path,
                        format!(
                            "tensor '{name}' of type {ggml_type} has dimensions {dims:?}, which \
                         overflow or are not whole blocks of {}",
                            layout.block_size
                        ),
                    )
                })?;
            if dims
                .first()
                .is_some_and(|&d0| d0 % layout.block_size as u64 != 0)
            {
                return Err(KwkError::bad_model(
                    path,
                    format!(
                        "tensor '{name}' of type {ggml_type} has rows of {} values, not a \
                         multiple of the block size {}",
                        dims[0], layout.block_size
                    ),
                ));
            }
            if offset % alignment != 0 {
                return Err(KwkError::bad_model(
                    path,
                    format!("tensor '{name}' has offset {offset}, not a multiple of the alignment {alignment}"),
                ));
            }
            tensors.push(GgufTensorInfo {
                name,
                dims,
                ggml_type,
                offset,
                n_bytes,
            });
        }

        let tensor_index = sorted_index(tensors.len(), |i| &tensors[i].name)
            .map_err(|name| KwkError::bad_model(path, format!("tensor '{name}' appears twice")))?;

        let data_offset = (r.pos as u64).div_ceil(alignment) * alignment;
        let file_size = map.len() as u64;
        // As llama.cpp (`gguf_init_from_file_impl`): tensors lie in directory order, each at
        // the padded end of the one before, so they cannot overlap and their sizes sum to at
        // most the file's (which bounds what loading them can allocate).
        let mut expected = 0u64;
        for t in &tensors {
            if t.offset != expected {
                return Err(KwkError::bad_model(
                    path,
                    format!(
                        "tensor '{}' has data offset {}, expected {expected} (the padded end of \
                         the tensor before it); the file is corrupt",
                        t.name, t.offset
                    ),
                ));
            }
            expected = t
                .n_bytes
                .checked_next_multiple_of(alignment)
                .and_then(|n| expected.checked_add(n))
                .unwrap_or(u64::MAX);
            let end = data_offset
                .checked_add(t.offset)
                .and_then(|s| s.checked_add(t.n_bytes));
            if !matches!(end, Some(e) if e <= file_size) {
                return Err(KwkError::bad_model(
                    path,
                    format!(
                        "tensor '{}' ({} bytes at data offset {}) runs past the end of the \
                         {file_size}-byte file; the file is truncated",
                        t.name, t.n_bytes, t.offset
                    ),
                ));
            }
        }

        Ok(GgufFile {
            path: path.to_path_buf(),
            map,
            version,
            metadata,
            metadata_index,
            tensors,
            tensor_index,
            alignment,
            data_offset,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Byte offset of the data section in the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    pub fn file_size(&self) -> u64 {
        self.map.len() as u64
    }

    /// All metadata pairs in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        lookup(&self.metadata_index, key, |i| &self.metadata[i].0).map(|i| &self.metadata[i].1)
    }

    fn wrong_type(&self, key: &str, want: &str, got: &GgufValue) -> KwkError {
        KwkError::bad_model(
            &self.path,
            format!(
                "metadata key '{key}' should be {want}, found {:?}",
                got.value_type()
            ),
        )
    }

    /// A typed key: `Ok(None)` when absent, `BadModel` naming the key when of another type.
    fn typed<T>(
        &self,
        key: &str,
        want: &str,
        f: impl Fn(&GgufValue) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or_else(|| self.wrong_type(key, want, v)),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, "a string", v)),
        }
    }

    /// Any integer type whose value fits in a u32.
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>> {
        self.typed(key, "an integer that fits in u32", |v| {
            v.as_u64().and_then(|x| u32::try_from(x).ok())
        })
    }

    /// Any non-negative integer type.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, "a non-negative integer", GgufValue::as_u64)
    }

    /// F32 (or F64, narrowed).
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>> {
        self.typed(key, "a float", GgufValue::as_f32)
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "a bool", GgufValue::as_bool)
    }

    pub fn get_array(&self, key: &str) -> Result<Option<&GgufArray>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, "an array", v)),
        }
    }

    /// An array of strings (e.g. `tokenizer.ggml.tokens`).
    pub fn get_string_array(&self, key: &str) -> Result<Option<Vec<String>>> {
        match self.get_array(key)? {
            None => Ok(None),
            Some(GgufArray::String(s)) => Ok(Some(s.iter().map(str::to_string).collect())),
            Some(other) => match other.get(0) {
                None => Ok(Some(Vec::new())),
                Some(v) => Err(self.wrong_type(key, "an array of strings", &v)),
            },
        }
    }

    /// An array of floats (e.g. `tokenizer.ggml.scores`).
    pub fn get_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>> {
        self.typed_array(key, "an array of floats", GgufValue::as_f32)
    }

    /// An array of integers that fit in i32 (e.g. `tokenizer.ggml.token_type`).
    pub fn get_i32_array(&self, key: &str) -> Result<Option<Vec<i32>>> {
        self.typed_array(key, "an array of i32", |v| {
            v.as_i64().and_then(|x| i32::try_from(x).ok())
        })
    }

    fn typed_array<T>(
        &self,
        key: &str,
        want: &str,
        f: impl Fn(&GgufValue) -> Option<T>,
    ) -> Result<Option<Vec<T>>> {
        let Some(a) = self.get_array(key)? else {
            return Ok(None);
        };
        (0..a.len())
            .map_while(|i| a.get(i))
            .map(|v| f(&v).ok_or_else(|| self.wrong_type(key, want, &v)))
            .collect::<Result<Vec<T>>>()
            .map(Some)
    }

    /// The tensor directory in file order.
    /// Weight bytes one generated token reads ([`gguf_weight_bytes_per_token`]),
    /// experts counted at `{arch}.expert_used_count / {arch}.expert_count` when present.
    pub fn weight_bytes_read_per_token(&self) -> f64 {
        let arch = self
            .get_str("general.architecture")
            .ok()
            .flatten()
            .unwrap_or("");
        let key = |k: &str| self.get_u64(&format!("{arch}.{k}")).ok().flatten();
        let share = match (key("expert_used_count"), key("expert_count")) {
            (Some(used), Some(n)) if n > 0 && used <= n => used as f64 / n as f64,
            _ => 1.0,
        };
        gguf_weight_bytes_per_token(&self.tensors, share)
    }

    /// Drops the mapped pages read so far from the resident set ([`release_pages`]).
    pub(crate) fn release_pages(&self) {
        release_pages(&self.map);
    }

    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        lookup(&self.tensor_index, name, |i| &self.tensors[i].name).map(|i| &self.tensors[i])
    }

    /// The data bytes of a tensor of this file. Extents were checked at open; an `info`
    /// that does not fit this file (from another file) is a `BadModel` error.
    pub fn tensor_bytes(&self, info: &GgufTensorInfo) -> Result<&[u8]> {
        let range = self
            .data_offset
            .checked_add(info.offset)
            .and_then(|s| Some((s, s.checked_add(info.n_bytes)?)))
            .and_then(|(s, e)| Some(usize::try_from(s).ok()?..usize::try_from(e).ok()?));
        range.and_then(|r| self.map.get(r)).ok_or_else(|| {
            KwkError::bad_model(
                &self.path,
                format!("tensor '{}' lies outside the file", info.name),
            )
        })
    }

    /// Architecture, parameter count, tensor bytes, type mix and bits per weight.
    pub fn summary(&self) -> GgufSummary {
        let mut type_counts = BTreeMap::new();
        let mut type_params = BTreeMap::new();
        let (mut n_params, mut tensor_bytes) = (0u64, 0u64);
        for t in &self.tensors {
            let name = t.ggml_type.name();
            *type_counts.entry(name.clone()).or_insert(0) += 1;
            // Saturating: tensors of a corrupt file may overlap, so their sum is unbounded.
            let p = type_params.entry(name).or_insert(0u64);
            *p = p.saturating_add(t.n_elements());
            n_params = n_params.saturating_add(t.n_elements());
            tensor_bytes = tensor_bytes.saturating_add(t.n_bytes);
        }
        let bits_per_weight = if n_params == 0 {
            0.0
        } else {
            8.0 * tensor_bytes as f64 / n_params as f64
        };
        let string = |k: &str| self.get(k).and_then(|v| v.as_str()).map(str::to_string);
        GgufSummary {
            architecture: string("general.architecture"),
            name: string("general.name"),
            n_params,
            tensor_bytes,
            file_bytes: self.file_size(),
            type_counts,
            type_params,
            bits_per_weight,
        }
    }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// Weight bytes a generated token reads from a GGUF file's tensors (llama.cpp's names):
/// expert tensors (`*_exps`) at `expert_share` (experts used per token / experts; 1 for a
/// dense model), `token_embd` one row when an `output` tensor exists (else it is the
/// output too, read whole), the rest whole.
pub fn gguf_weight_bytes_per_token(tensors: &[GgufTensorInfo], expert_share: f64) -> f64 {
    let has_output = tensors.iter().any(|t| t.name == "output.weight");
    tensors
        .iter()
        .map(|t| {
            let bytes = t.n_bytes as f64;
            if t.name == "token_embd.weight" && has_output {
                bytes / t.dims.get(1).copied().unwrap_or(1).max(1) as f64
            } else if t.name.contains("_exps") {
                bytes * expert_share
            } else {
                bytes
            }
        })
        .sum()
}

/// A minimal GGUF writer for tests (here and in the loader's tests): metadata and tensors
/// laid out as llama.cpp's `gguf_write_to_file` does.
#[cfg(test)]
pub(crate) mod test_writer {
    use super::*;

    pub(crate) struct TestTensor {
        pub name: String,
        pub dims: Vec<u64>,
        pub ggml_type: GgmlType,
        pub data: Vec<u8>,
    }

    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    fn type_id(t: GgufValueType) -> u32 {
        use GgufValueType::*;
        match t {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
        match v {
            GgufValue::U8(x) => out.push(*x),
            GgufValue::I8(x) => out.push(*x as u8),
            GgufValue::U16(x) => out.extend(x.to_le_bytes()),
            GgufValue::I16(x) => out.extend(x.to_le_bytes()),
            GgufValue::U32(x) => out.extend(x.to_le_bytes()),
            GgufValue::I32(x) => out.extend(x.to_le_bytes()),
            GgufValue::F32(x) => out.extend(x.to_le_bytes()),
            GgufValue::Bool(x) => out.push(*x as u8),
            GgufValue::String(s) => put_str(out, s),
            GgufValue::U64(x) => out.extend(x.to_le_bytes()),
            GgufValue::I64(x) => out.extend(x.to_le_bytes()),
            GgufValue::F64(x) => out.extend(x.to_le_bytes()),
            GgufValue::Array(a) => {
                out.extend(type_id(a.element_type()).to_le_bytes());
                out.extend((a.len() as u64).to_le_bytes());
                for v in (0..a.len()).filter_map(|i| a.get(i)) {
                    put_value(out, &v);
                }
            }
        }
    }

    /// The bytes of a GGUF v3 file with these metadata pairs and tensors (alignment 32
    /// unless `general.alignment` says otherwise).
    pub(crate) fn gguf_bytes(metadata: &[(String, GgufValue)], tensors: &[TestTensor]) -> Vec<u8> {
        let alignment = metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            .unwrap_or(32) as usize;
        let mut out = Vec::new();
        out.extend(b"GGUF");
        out.extend(3u32.to_le_bytes());
        out.extend((tensors.len() as u64).to_le_bytes());
        out.extend((metadata.len() as u64).to_le_bytes());
        for (k, v) in metadata {
            put_str(&mut out, k);
            out.extend(type_id(v.value_type()).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0usize;
        for t in tensors {
            put_str(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ggml_type.0.to_le_bytes());
            out.extend((offset as u64).to_le_bytes());
            offset += t.data.len().div_ceil(alignment) * alignment;
        }
        out.resize(out.len().div_ceil(alignment) * alignment, 0);
        for t in tensors {
            out.extend(&t.data);
            out.resize(out.len().div_ceil(alignment) * alignment, 0);
        }
        out
    }

    pub(crate) fn f32_tensor(name: &str, dims: &[u64], values: &[f32]) -> TestTensor {
        TestTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ggml_type: GgmlType::F32,
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_writer::*;
    use super::*;

    fn kv(k: &str, v: GgufValue) -> (String, GgufValue) {
        (k.to_string(), v)
    }

    fn sample_metadata() -> Vec<(String, GgufValue)> {
        vec![
            kv("general.architecture", GgufValue::String("llama".into())),
            kv("general.name", GgufValue::String("tiny test".into())),
            kv("a.u8", GgufValue::U8(200)),
            kv("a.i8", GgufValue::I8(-3)),
            kv("a.u16", GgufValue::U16(65000)),
            kv("a.i16", GgufValue::I16(-30000)),
            kv("a.u32", GgufValue::U32(4_000_000_000)),
            kv("a.i32", GgufValue::I32(-7)),
            kv("a.f32", GgufValue::F32(1.5e-5)),
            kv("a.bool", GgufValue::Bool(true)),
            kv("a.u64", GgufValue::U64(1 << 40)),
            kv("a.i64", GgufValue::I64(-(1 << 40))),
            kv("a.f64", GgufValue::F64(0.125)),
            kv(
                "a.strings",
                GgufValue::Array(GgufArray::String(["<s>", "é"].into_iter().collect())),
            ),
            kv(
                "a.floats",
                GgufValue::Array(GgufArray::F32(vec![-1.0, 2.0])),
            ),
            kv(
                "a.nested",
                GgufValue::Array(GgufArray::Array(vec![GgufArray::I32(vec![1, 2])])),
            ),
        ]
    }

    fn sample_tensors() -> Vec<TestTensor> {
        vec![
            f32_tensor("w", &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            TestTensor {
                name: "q".into(),
                dims: vec![64, 2],
                ggml_type: GgmlType::Q8_0,
                data: (0..4 * 34).map(|i| i as u8).collect(),
            },
            f32_tensor("n", &[5], &[0.5; 5]),
        ]
    }

    fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn reads_every_value_type_and_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let meta = sample_metadata();
        let bytes = gguf_bytes(&meta, &sample_tensors());
        let path = write(&dir, "ok.gguf", &bytes);
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.metadata(), &meta[..]);
        assert_eq!(f.get_str("general.architecture").unwrap(), Some("llama"));
        assert_eq!(f.get_u32("a.u32").unwrap(), Some(4_000_000_000));
        assert_eq!(f.get_u32("a.u8").unwrap(), Some(200));
        assert!(f.get_u32("a.i32").is_err(), "negative is not a u32");
        assert!(f.get_u32("a.u64").is_err(), "too big for u32");
        assert_eq!(f.get_u64("a.u64").unwrap(), Some(1 << 40));
        assert_eq!(f.get_f32("a.f32").unwrap(), Some(1.5e-5));
        assert_eq!(f.get_f32("a.f64").unwrap(), Some(0.125));
        assert_eq!(f.get_bool("a.bool").unwrap(), Some(true));
        assert_eq!(f.get_u32("missing").unwrap(), None);
        let err = f.get_str("a.u8").unwrap_err().to_string();
        assert!(err.contains("'a.u8'") && err.contains("ok.gguf"), "{err}");
        assert_eq!(
            f.get_string_array("a.strings").unwrap().unwrap(),
            vec!["<s>".to_string(), "é".to_string()]
        );
        assert_eq!(
            f.get_f32_array("a.floats").unwrap().unwrap(),
            vec![-1.0, 2.0]
        );
        assert!(f.get_f32_array("a.strings").is_err());

        assert_eq!(f.tensors().len(), 3);
        let w = f.tensor("w").unwrap();
        assert_eq!(w.dims, vec![3, 2]);
        assert_eq!(w.shape_row_major(), vec![2, 3]);
        let wb = f.tensor_bytes(w).unwrap();
        assert_eq!(wb, &sample_tensors()[0].data[..]);
        let q = f.tensor("q").unwrap();
        assert_eq!(
            (q.ggml_type, q.n_bytes, q.offset),
            (GgmlType::Q8_0, 136, 32)
        );
        assert_eq!(f.tensor_bytes(q).unwrap(), &sample_tensors()[1].data[..]);
        assert_eq!(f.tensor("n").unwrap().offset, 32 + 160);
        assert_eq!(f.data_offset() % 32, 0);
        assert_eq!(f.file_size(), bytes.len() as u64);

        let s = f.summary();
        assert_eq!(s.architecture.as_deref(), Some("llama"));
        assert_eq!(s.n_params, 6 + 128 + 5);
        assert_eq!(s.tensor_bytes, 24 + 136 + 20);
        assert_eq!(s.type_counts.get("F32"), Some(&2));
        assert_eq!(s.type_counts.get("Q8_0"), Some(&1));
        assert_eq!(s.type_params.get("Q8_0"), Some(&128));
        assert!((s.bits_per_weight - 8.0 * 180.0 / 139.0).abs() < 1e-12);
    }

    #[test]
    fn version_2_reads_like_3() {
        // v2 and v3 share the layout (v3 only allowed big-endian files); v1 used u32 counts.
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = gguf_bytes(&sample_metadata(), &sample_tensors());
        bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
        let f = GgufFile::open(&write(&dir, "v2.gguf", &bytes)).unwrap();
        assert_eq!(f.version(), 2);
        assert_eq!(f.metadata(), &sample_metadata()[..]);
        assert_eq!(f.tensors().len(), 3);
    }

    #[test]
    fn custom_alignment_is_honoured() {
        let dir = tempfile::tempdir().unwrap();
        let mut meta = sample_metadata();
        meta.push(kv("general.alignment", GgufValue::U32(64)));
        let path = write(&dir, "a64.gguf", &gguf_bytes(&meta, &sample_tensors()));
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.alignment(), 64);
        assert_eq!(f.data_offset() % 64, 0);
        assert_eq!(f.tensor("q").unwrap().offset, 64);
        assert_eq!(
            f.tensor_bytes(f.tensor("n").unwrap()).unwrap(),
            &sample_tensors()[2].data[..]
        );
    }

    fn open_err(bytes: &[u8]) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "bad.gguf", bytes);
        match GgufFile::open(&path) {
            Ok(_) => panic!("opened a bad file"),
            Err(e) => {
                let msg = e.to_string();
                assert!(matches!(e, KwkError::BadModel { .. }), "{msg}");
                assert!(msg.contains("bad.gguf"), "{msg}");
                msg
            }
        }
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = gguf_bytes(&sample_metadata(), &sample_tensors());
        // Every prefix shorter than the end of the last tensor's data fails cleanly.
        let last = bytes.len() - (32 - 20); // "n" has 20 bytes, padded to 32
        for len in 0..last {
            open_err(&bytes[..len]);
        }
    }

    #[test]
    fn bad_magic_and_version() {
        let mut bytes = gguf_bytes(&sample_metadata(), &sample_tensors());
        bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
        assert!(open_err(&bytes).contains("version 1"));
        bytes[4..8].copy_from_slice(&(3u32 << 24).to_le_bytes());
        assert!(open_err(&bytes).contains("big-endian"));
        bytes[..4].copy_from_slice(b"GGML");
        assert!(open_err(&bytes).contains("not a GGUF file"));
    }

    #[test]
    fn absurd_counts_and_lengths_are_refused_before_allocating() {
        let good = gguf_bytes(&sample_metadata(), &sample_tensors());
        // tensor count, kv count
        for at in [8usize, 16] {
            let mut b = good.clone();
            b[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
            assert!(open_err(&b).contains("count"));
        }
        // first key's length
        let mut b = good.clone();
        b[24..32].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        assert!(open_err(&b).contains("length"));
        // an array's element count: find "a.floats" and patch its count
        let key = b"a.floats";
        let pos = good.windows(key.len()).position(|w| w == key).unwrap() + key.len();
        let mut b = good.clone();
        b[pos + 8..pos + 16].copy_from_slice(&(1u64 << 62).to_le_bytes());
        assert!(open_err(&b).contains("element count"));
    }

    #[test]
    fn arrays_are_stored_compactly_by_type() {
        let dir = tempfile::tempdir().unwrap();
        let meta = vec![
            kv("u8s", GgufValue::Array(GgufArray::U8(vec![7; 1000]))),
            kv(
                "bools",
                GgufValue::Array(GgufArray::Bool(vec![true, false])),
            ),
            kv(
                "strs",
                GgufValue::Array(GgufArray::String(["", "ab", "", "c"].into_iter().collect())),
            ),
        ];
        let f = GgufFile::open(&write(&dir, "c.gguf", &gguf_bytes(&meta, &[]))).unwrap();
        match f.get_array("u8s").unwrap().unwrap() {
            GgufArray::U8(v) => assert_eq!((v.len(), v.capacity()), (1000, 1000)),
            other => panic!("{other:?}"),
        }
        let strs = f.get_array("strs").unwrap().unwrap();
        assert_eq!(strs.len(), 4);
        assert_eq!(strs.get(1), Some(GgufValue::String("ab".into())));
        assert_eq!(strs.get(4), None);
        assert_eq!(
            f.get_string_array("strs").unwrap().unwrap(),
            vec!["", "ab", "", "c"]
        );
        assert_eq!(f.metadata(), &meta[..]);
        // A u8 array is not an array of strings or of floats; an i32 array of u8 works.
        assert!(f
            .get_string_array("u8s")
            .unwrap_err()
            .to_string()
            .contains("'u8s'"));
        assert!(f.get_f32_array("bools").is_err());
        assert_eq!(f.get_i32_array("u8s").unwrap().unwrap().len(), 1000);
    }

    #[test]
    fn arrays_nest_at_most_two_deep() {
        let two = GgufValue::Array(GgufArray::Array(vec![GgufArray::U8(vec![1])]));
        let ok = gguf_bytes(&[kv("two", two)], &[]);
        let dir = tempfile::tempdir().unwrap();
        GgufFile::open(&write(&dir, "two.gguf", &ok)).unwrap();
        let three = GgufValue::Array(GgufArray::Array(vec![GgufArray::Array(vec![
            GgufArray::U8(vec![1]),
        ])]));
        let msg = open_err(&gguf_bytes(&[kv("three", three)], &[]));
        assert!(
            msg.contains("'three' nests arrays more than 2 deep"),
            "{msg}"
        );
    }

    #[test]
    fn a_header_longer_than_the_limit_is_refused() {
        let meta = vec![kv("big", GgufValue::String("x".repeat(5000)))];
        let bytes = gguf_bytes(&meta, &[]);
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "big.gguf", &bytes);
        let map = || map_file(&path).unwrap();
        // Within the limit it opens; with a 4 KiB limit the 5000-byte string does not fit.
        GgufFile::parse_limited(&path, map(), 8192).unwrap();
        let msg = GgufFile::parse_limited(&path, map(), 4096)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(
                "length of metadata key 'big' is 5000, more than kwk's header limit of 4096 bytes"
            ),
            "{msg}"
        );
        // A file that merely ends inside the header is truncated, not over the limit.
        let msg = open_err(&bytes[..100]);
        assert!(msg.contains("left in the file"), "{msg}");
    }

    #[test]
    fn bad_tensor_entries_are_named() {
        let meta = vec![kv(
            "general.architecture",
            GgufValue::String("llama".into()),
        )];
        let mut t = sample_tensors();
        t[1].ggml_type = GgmlType(31);
        assert!(open_err(&gguf_bytes(&meta, &t)).contains("'q' has unknown ggml type 31"));
        let mut t = sample_tensors();
        t[1].dims = vec![48, 2]; // not whole Q8_0 blocks
        t[1].data.truncate(3 * 34);
        assert!(open_err(&gguf_bytes(&meta, &t)).contains("'q'"));
        let mut t = sample_tensors();
        t[0].dims = vec![1 << 40, 1 << 40]; // claims far more data than the file has
        assert!(open_err(&gguf_bytes(&meta, &t)).contains("'w'"));
        let mut t = sample_tensors();
        t[2].name = "w".into();
        assert!(open_err(&gguf_bytes(&meta, &t)).contains("appears twice"));
        let mut t = sample_tensors();
        t[0].dims = vec![1, 1, 1, 1, 6];
        assert!(open_err(&gguf_bytes(&meta, &t)).contains("5 dimensions"));
    }

    #[test]
    fn overlapping_or_gapped_tensors_are_refused() {
        let good = gguf_bytes(&sample_metadata(), &sample_tensors());
        // The directory entry of "n": name length 1, "n", 1 dimension, 5, F32, offset.
        let mut entry = 1u64.to_le_bytes().to_vec();
        entry.extend(b"n");
        entry.extend(1u32.to_le_bytes());
        entry.extend(5u64.to_le_bytes());
        entry.extend(0u32.to_le_bytes());
        let at = good.windows(entry.len()).position(|w| w == entry).unwrap() + entry.len();
        assert_eq!(good[at..at + 8], 192u64.to_le_bytes());
        for offset in [0u64, 32, 224] {
            let mut b = good.clone();
            b[at..at + 8].copy_from_slice(&offset.to_le_bytes());
            let msg = open_err(&b);
            assert!(
                msg.contains(&format!(
                    "tensor 'n' has data offset {offset}, expected 192"
                )),
                "{msg}"
            );
        }
    }

    #[test]
    fn tensor_info_from_another_file_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            &dir,
            "ok.gguf",
            &gguf_bytes(&sample_metadata(), &sample_tensors()),
        );
        let f = GgufFile::open(&path).unwrap();
        let mut foreign = f.tensor("w").unwrap().clone();
        foreign.offset = 1 << 50;
        assert!(f.tensor_bytes(&foreign).is_err());
    }

    /// Size and bits per weight as llama.cpp reports them for the same files
    /// (`llama_model_quantize_impl: quant size = X MiB (Y BPW)` in the set-up logs).
    #[test]
    fn smollm2_summaries_match_llama_cpp() {
        let dir = crate::format::ggml_blocks::tests::smollm2_dir();
        for (file, mib, bpw) in [
            ("SmolLM2-135M-Instruct.Q4_1.gguf", 92.10, 5.74),
            ("SmolLM2-135M-Instruct-F32.gguf", 513.13, 32.00),
            ("SmolLM2-135M-Instruct-Q4_0.gguf", 85.77, 5.35),
            ("SmolLM2-135M-Instruct-Q4_K_M.gguf", 98.87, 6.17),
        ] {
            let path = dir.join(file);
            if !path.exists() {
                panic!("{} missing: run scripts/setup-model.sh", path.display());
            }
            let s = GgufFile::open(&path).unwrap().summary();
            assert_eq!(s.architecture.as_deref(), Some("llama"));
            assert_eq!(s.n_params, 134_515_008, "{file}");
            let got_mib = s.tensor_bytes as f64 / (1024.0 * 1024.0);
            assert!(
                (got_mib - mib).abs() < 0.006,
                "{file}: {got_mib} MiB vs {mib}"
            );
            assert!(
                (s.bits_per_weight - bpw).abs() < 0.006,
                "{file}: {} BPW",
                s.bits_per_weight
            );
        }
    }

    #[test]
    fn opens_the_fixture_ggufs() {
        for name in ["tiny-llama", "tiny-qwen2", "tiny-mixtral"] {
            let path = kwk_fixtures::model_dir(name).join("model.gguf");
            let f = GgufFile::open(&path).unwrap();
            let s = f.summary();
            assert_eq!(
                s.type_counts.keys().collect::<Vec<_>>(),
                vec!["F32"],
                "{name}"
            );
            assert_eq!(s.tensor_bytes, 4 * s.n_params);
            assert!(
                f.get_string_array("tokenizer.ggml.tokens")
                    .unwrap()
                    .unwrap()
                    .len()
                    == 512
            );
        }
    }

    fn info(name: &str, dims: &[u64], n_bytes: u64) -> GgufTensorInfo {
        GgufTensorInfo {
            name: name.into(),
            dims: dims.to_vec(),
            ggml_type: crate::format::ggml_blocks::GgmlType::F32,
            offset: 0,
            n_bytes,
        }
    }

    #[test]
    fn gguf_bytes_read_per_token() {
        let tensors = [
            info("token_embd.weight", &[8, 10], 320),
            info("output.weight", &[8, 10], 320),
            info("blk.0.attn_q.weight", &[8, 8], 256),
            info("blk.0.ffn_up_exps.weight", &[8, 16, 4], 2048),
        ];
        // One embedding row (32), the output, q, and half of the experts.
        assert_eq!(
            gguf_weight_bytes_per_token(&tensors, 0.5),
            32.0 + 320.0 + 256.0 + 1024.0
        );
        // Without an output tensor the embedding is read whole (it is the output).
        assert_eq!(gguf_weight_bytes_per_token(&tensors[..1], 0.5), 320.0);
    }
}

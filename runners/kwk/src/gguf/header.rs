//! Reading a GGUF header: the bounds-checked cursor over the first [`MAX_HEADER_BYTES`]
//! of the map, the metadata key-value pairs, and the tensor directory with its checks
//! (dimensions, types, alignment, extents in directory order), as llama.cpp's
//! `gguf_init_from_file_impl` reads them.

use super::value::{GgufArray, GgufStrings, GgufValue, GgufValueType};
use super::{GgufFile, GgufTensorInfo};
use crate::error::{KwkError, Result};
use crate::format::ggml_blocks::GgmlType;
use std::path::Path;

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
pub(super) fn lookup<'a>(
    index: &[u32],
    key: &str,
    name: impl Fn(usize) -> &'a str,
) -> Option<usize> {
    index
        .binary_search_by(|&i| name(i as usize).cmp(key))
        .ok()
        .map(|p| index[p] as usize)
}

impl GgufFile {
    pub(super) fn parse(path: &Path, map: memmap2::Mmap) -> Result<GgufFile> {
        Self::parse_limited(path, map, MAX_HEADER_BYTES)
    }

    /// [`Self::parse`] with another header limit (tests use a small one).
    pub(super) fn parse_limited(
        path: &Path,
        map: memmap2::Mmap,
        max_header: usize,
    ) -> Result<GgufFile> {
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
            let n_bytes = ggml_type.bytes_for_dims(&dims).ok_or_else(|| {
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
}

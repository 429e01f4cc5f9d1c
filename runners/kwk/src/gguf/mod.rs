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
//! model file: this module holds the file map (its `unsafe`, with SAFETY comments, is in
//! `map.rs` and nowhere else in `gguf/`).
//!
//! The rooms: this file is the public API ([`GgufFile`] and its typed getters);
//! `map.rs` the memory map of a model file; `header.rs` the header and metadata parsing
//! (the bounds-checked reader, the directory checks); `value.rs` the metadata value types
//! (`enum gguf_type`); `tensor.rs` a directory entry and the weight bytes per token.
//! The ggml tensor type table (block sizes, bytes per block) is
//! [`crate::format::ggml_blocks::GgmlType`].

mod header;
mod map;
mod tensor;
#[cfg(test)]
pub(crate) mod test_writer;
#[cfg(test)]
mod tests;
mod value;

pub use header::{HEADER_MEMORY_PER_BYTE, MAX_ARRAY_DEPTH, MAX_HEADER_BYTES};
pub(crate) use map::{map_file, release_pages};
pub use tensor::{gguf_weight_bytes_per_token, GgufTensorInfo};
pub use value::{GgufArray, GgufStrings, GgufValue, GgufValueType};

use crate::error::{KwkError, Result};
use header::lookup;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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

impl GgufFile {
    /// Maps and parses a GGUF file (versions 2 and 3).
    pub fn open(path: &Path) -> Result<GgufFile> {
        let map = map_file(path)?;
        Self::parse(path, map)
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

    /// The tensor directory in file order.
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

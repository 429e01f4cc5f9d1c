//! The pack file's format: header (`KWKPACK\0`, version), 64-byte-aligned arrays, the JSON
//! index and its trailer; reading a file (checked, memory-mapped) and writing one under a
//! temporary name.

use super::key::SourceIdentity;
use super::PACK_VERSION;
use crate::format::ggml_blocks::GgmlType;
use crate::format::int4::{LowBitParts, LowBitWeights};
use crate::format::int8::Int8Weights;
use crate::format::quantized::QuantizedTensor;
use crate::format::storage::Store;
use crate::kernels::quant::Bits;
use half::f16;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(super) const MAGIC: &[u8; 8] = b"KWKPACK\0";
pub(super) const TRAILER_MAGIC: &[u8; 8] = b"KWKINDEX";
pub(super) const HEADER_LEN: u64 = 64;
pub(super) const TRAILER_LEN: usize = 8 + 8 + 8 + 32;
/// Every array starts on a multiple of this many bytes (a cache line; kernels' loads).
pub(super) const ALIGN: u64 = 64;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct TensorEntry {
    pub(super) name: String,
    /// 0: symmetric int8 blocks ([`Int8Weights`]); 1: asymmetric groups ([`LowBitWeights`]).
    pub(super) kind: u8,
    pub(super) bits: u32,
    pub(super) group_size: usize,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) dep: String,
    /// The bytes `offset..offset + len` hold the arrays; `crc` is their CRC-32.
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) crc: u32,
    /// Each array: absolute byte offset and length in elements.
    pub(super) arrays: Vec<(u64, u64)>,
    /// The ggml type id of the GGUF blocks the tensor was copied from unchanged
    /// (`format::source_grid`); `None`: rounded by kwk.
    #[serde(default)]
    pub(super) copied_from: Option<u32>,
    /// Whether that copy's scales were fitted (`format::near_copy`), not copied exactly.
    #[serde(default)]
    pub(super) near_copy: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct FloatEntry {
    pub(super) name: String,
    pub(super) offset: u64,
    pub(super) count: u64,
    pub(super) crc: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Section {
    pub(super) recipe: String,
    pub(super) tensors: Vec<TensorEntry>,
    pub(super) floats: Vec<FloatEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Index {
    pub(super) version: u32,
    pub(super) source: SourceIdentity,
    pub(super) file_hashes: Vec<String>,
    pub(super) sections: Vec<Section>,
}

/// An opened, index-checked cache file.
pub(super) struct PackFile {
    pub(super) map: Arc<memmap2::Mmap>,
    pub(super) index: Index,
}

pub(super) fn map_read_only(path: &Path, populate: bool) -> std::io::Result<memmap2::Mmap> {
    let file = File::open(path)?;
    let mut opts = memmap2::MmapOptions::new();
    if populate {
        opts.populate();
    }
    // SAFETY: the map is read-only. Cache files are never modified in place: writers
    // create a new file and rename it over the old one, which leaves this mapping's inode
    // intact; deleting a mapped file keeps its pages until unmapped.
    unsafe { opts.map(&file) }
}

impl PackFile {
    pub(super) fn open(path: &Path) -> std::result::Result<PackFile, String> {
        let map = map_read_only(path, false).map_err(|e| format!("cannot map: {e}"))?;
        let n = map.len();
        if n < HEADER_LEN as usize + TRAILER_LEN || &map[..8] != MAGIC {
            return Err("not a kwk pack file (bad magic or too short)".into());
        }
        let version = u32::from_le_bytes(map[8..12].try_into().unwrap());
        if version != PACK_VERSION {
            return Err(format!(
                "pack layout version {version}, this kwk writes {PACK_VERSION}"
            ));
        }
        let t = &map[n - TRAILER_LEN..];
        if &t[..8] != TRAILER_MAGIC {
            return Err("bad trailer (file truncated or overwritten)".into());
        }
        let off = u64::from_le_bytes(t[8..16].try_into().unwrap());
        let len = u64::from_le_bytes(t[16..24].try_into().unwrap());
        let end = off
            .checked_add(len)
            .filter(|&e| e == (n - TRAILER_LEN) as u64);
        if end.is_none() || off < HEADER_LEN {
            return Err("index out of place (file truncated or overwritten)".into());
        }
        let raw = &map[off as usize..(off + len) as usize];
        if Sha256::digest(raw).as_slice() != &t[24..56] {
            return Err("index checksum mismatch".into());
        }
        let index: Index =
            serde_json::from_slice(raw).map_err(|e| format!("unreadable index: {e}"))?;
        if index.version != PACK_VERSION {
            return Err(format!("index version {}", index.version));
        }
        for s in &index.sections {
            let ranges = s
                .tensors
                .iter()
                .map(|t| (t.offset, t.len))
                .map(|(o, l)| (o, Some(l)))
                .chain(s.floats.iter().map(|f| (f.offset, f.count.checked_mul(4))));
            for (o, l) in ranges {
                let end = l.and_then(|l| o.checked_add(l));
                if o < HEADER_LEN || end.is_none_or(|e| e > off) {
                    return Err("an entry lies outside the data".into());
                }
            }
            // Each array starts inside its tensor's bytes (copying an entry to a new file
            // moves its arrays by the entry's offset).
            for t in &s.tensors {
                if t.arrays
                    .iter()
                    .any(|&(a, _)| a < t.offset || a - t.offset > t.len)
                {
                    return Err(format!(
                        "{}: an array lies outside the tensor's bytes",
                        t.name
                    ));
                }
            }
        }
        Ok(PackFile {
            map: Arc::new(map),
            index,
        })
    }

    pub(super) fn section(&self, recipe: &str) -> Option<&Section> {
        self.index.sections.iter().find(|s| s.recipe == recipe)
    }

    pub(super) fn bytes(&self, offset: u64, len: u64) -> &[u8] {
        &self.map[offset as usize..(offset + len) as usize]
    }

    /// The tensor of `e`, mapped, after its CRC is checked.
    pub(super) fn tensor(&self, e: &TensorEntry) -> std::result::Result<QuantizedTensor, String> {
        if crc32fast::hash(self.bytes(e.offset, e.len)) != e.crc {
            return Err(format!("{}: CRC mismatch (corrupted file)", e.name));
        }
        let bad = || format!("{}: arrays do not fit {}x{}", e.name, e.rows, e.cols);
        let u8s = |i: usize| -> std::result::Result<Store<u8>, String> {
            let (o, n) = *e.arrays.get(i).ok_or_else(bad)?;
            Store::mapped(self.map.clone(), o as usize, n as usize).ok_or_else(bad)
        };
        let f16s = |i: usize| -> std::result::Result<Store<f16>, String> {
            let (o, n) = *e.arrays.get(i).ok_or_else(bad)?;
            Store::mapped(self.map.clone(), o as usize, n as usize).ok_or_else(bad)
        };
        let i8s = |i: usize| -> std::result::Result<Store<i8>, String> {
            let (o, n) = *e.arrays.get(i).ok_or_else(bad)?;
            Store::mapped(self.map.clone(), o as usize, n as usize).ok_or_else(bad)
        };
        let t = match (e.kind, e.arrays.len()) {
            (0, 2) => Int8Weights::from_parts(e.rows, e.cols, u8s(0)?, f16s(1)?)
                .map(QuantizedTensor::Int8),
            (1, 6) => {
                let parts = LowBitParts {
                    nibbles: u8s(0)?,
                    high_bits: u8s(1)?,
                    scales: u8s(2)?,
                    mins: i8s(3)?,
                    super_scales: f16s(4)?,
                    super_mins: f16s(5)?,
                };
                // The file stores the width as a number; a number no layout has is
                // refused by name, not read as some other width.
                let bits = Bits::from_u32(e.bits).ok_or_else(|| {
                    format!(
                        "{}: {}-bit codes are not a layout of this build (a newer kwk's pack?)",
                        e.name, e.bits
                    )
                })?;
                LowBitWeights::from_parts(bits, e.group_size, e.rows, e.cols, parts)
                    .map(QuantizedTensor::LowBit)
            }
            _ => None,
        };
        let copied_from = e.copied_from.map(GgmlType);
        t.map(|t| match t {
            QuantizedTensor::Int8(mut w) => {
                w.set_copied_from(copied_from);
                QuantizedTensor::Int8(w)
            }
            QuantizedTensor::LowBit(mut w) => {
                w.set_copied_from(copied_from);
                w.set_near_copy(e.near_copy);
                QuantizedTensor::LowBit(w)
            }
        })
        .ok_or_else(bad)
    }

    pub(super) fn floats(&self, e: &FloatEntry) -> std::result::Result<Vec<f32>, String> {
        let b = self.bytes(e.offset, e.count * 4);
        if crc32fast::hash(b) != e.crc {
            return Err(format!("{}: CRC mismatch (corrupted file)", e.name));
        }
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

#[cfg(test)]
thread_local! {
    /// Tests: a write fails once this many more bytes have been written (a full disk).
    pub(super) static FAIL_WRITE_AFTER: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Writes a new cache file under a temporary name; [`Writer::finish`] renames it. Past
/// `limit` bytes the temporary file is deleted and the rest only counted (a pack larger
/// than the whole cache is not kept).
pub(super) struct Writer {
    pub(super) tmp: PathBuf,
    /// `None` once the file passed `limit`.
    pub(super) file: Option<BufWriter<File>>,
    pub(super) pos: u64,
    pub(super) limit: u64,
}

/// How [`Writer::finish`] ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Finished {
    Kept,
    /// The file would have had this many bytes, over the writer's limit: not kept.
    OverLimit(u64),
}

impl Writer {
    pub(super) fn create(path: &Path, limit: u64) -> std::io::Result<Writer> {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.tmp.{}.{n}", std::process::id()));
        let file = File::options().write(true).create_new(true).open(&tmp)?;
        let mut w = Writer {
            tmp,
            file: Some(BufWriter::with_capacity(1 << 20, file)),
            pos: 0,
            limit,
        };
        let mut header = [0u8; HEADER_LEN as usize];
        header[..8].copy_from_slice(MAGIC);
        header[8..12].copy_from_slice(&PACK_VERSION.to_le_bytes());
        if let Err(e) = w.put(&header) {
            let _ = std::fs::remove_file(&w.tmp);
            return Err(e);
        }
        Ok(w)
    }

    pub(super) fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        #[cfg(test)]
        if let Some(left) = FAIL_WRITE_AFTER.with(|c| c.get()) {
            if (b.len() as u64) > left {
                return Err(std::io::Error::other("injected write error (disk full)"));
            }
            FAIL_WRITE_AFTER.with(|c| c.set(Some(left - b.len() as u64)));
        }
        if self.pos + b.len() as u64 > self.limit {
            if self.file.take().is_some() {
                std::fs::remove_file(&self.tmp)?;
            }
        } else if let Some(f) = self.file.as_mut() {
            f.write_all(b)?;
        }
        self.pos += b.len() as u64;
        Ok(())
    }

    pub(super) fn align(&mut self) -> std::io::Result<()> {
        let pad = (ALIGN - self.pos % ALIGN) % ALIGN;
        self.put(&[0u8; ALIGN as usize][..pad as usize])
    }

    /// Writes `arrays` (each aligned); returns (offset, length, CRC, per-array offsets).
    pub(super) fn region(
        &mut self,
        arrays: &[&[u8]],
    ) -> std::io::Result<(u64, u64, u32, Vec<u64>)> {
        self.align()?;
        let start = self.pos;
        let mut crc = crc32fast::Hasher::new();
        let mut offsets = Vec::with_capacity(arrays.len());
        for (i, a) in arrays.iter().enumerate() {
            if i > 0 {
                let pad = ((ALIGN - self.pos % ALIGN) % ALIGN) as usize;
                crc.update(&[0u8; ALIGN as usize][..pad]);
                self.align()?;
            }
            offsets.push(self.pos);
            crc.update(a);
            self.put(a)?;
        }
        Ok((start, self.pos - start, crc.finalize(), offsets))
    }

    pub(super) fn tensor(
        &mut self,
        name: &str,
        dep: &str,
        t: &QuantizedTensor,
    ) -> std::io::Result<TensorEntry> {
        // (kind, bits, group size, [(array bytes, element count)])
        type Layout<'a> = (u8, u32, usize, Vec<(&'a [u8], u64)>);
        let (kind, bits, group_size, parts): Layout = match t {
            QuantizedTensor::Int8(w) => (
                0,
                8,
                32,
                vec![
                    (w.codes(), w.codes().len() as u64),
                    (bytemuck::cast_slice(w.scales()), w.scales().len() as u64),
                ],
            ),
            QuantizedTensor::LowBit(w) => {
                let p = w.parts();
                (
                    1,
                    w.bits().get(),
                    w.group_size(),
                    vec![
                        (p.nibbles, p.nibbles.len() as u64),
                        (p.high_bits, p.high_bits.len() as u64),
                        (p.scales, p.scales.len() as u64),
                        (bytemuck::cast_slice(p.mins), p.mins.len() as u64),
                        (
                            bytemuck::cast_slice(p.super_scales),
                            p.super_scales.len() as u64,
                        ),
                        (
                            bytemuck::cast_slice(p.super_mins),
                            p.super_mins.len() as u64,
                        ),
                    ],
                )
            }
        };
        let (copied_from, near_copy) = match t {
            QuantizedTensor::Int8(w) => (w.copied_from(), false),
            QuantizedTensor::LowBit(w) => (w.copied_from(), w.near_copy()),
        };
        let raw: Vec<&[u8]> = parts.iter().map(|p| p.0).collect();
        let (offset, len, crc, offsets) = self.region(&raw)?;
        Ok(TensorEntry {
            name: name.to_string(),
            kind,
            bits,
            group_size,
            rows: t.rows(),
            cols: t.cols(),
            dep: dep.to_string(),
            offset,
            len,
            crc,
            arrays: offsets.into_iter().zip(parts.iter().map(|p| p.1)).collect(),
            copied_from: copied_from.map(|ty| ty.0),
            near_copy,
        })
    }

    /// Copies an entry of another file byte for byte (its arrays keep their alignment).
    pub(super) fn copy_tensor(
        &mut self,
        from: &PackFile,
        e: &TensorEntry,
    ) -> std::io::Result<TensorEntry> {
        self.align()?;
        let start = self.pos;
        self.put(from.bytes(e.offset, e.len))?;
        let mut out = e.clone();
        out.offset = start;
        for a in &mut out.arrays {
            a.0 = a.0 - e.offset + start;
        }
        Ok(out)
    }

    pub(super) fn floats(&mut self, name: &str, v: &[f32]) -> std::io::Result<FloatEntry> {
        let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let (offset, _, crc, _) = self.region(&[&raw])?;
        Ok(FloatEntry {
            name: name.to_string(),
            offset,
            count: v.len() as u64,
            crc,
        })
    }

    pub(super) fn copy_section(
        &mut self,
        from: &PackFile,
        s: &Section,
    ) -> std::io::Result<Section> {
        let mut out = Section {
            recipe: s.recipe.clone(),
            tensors: Vec::new(),
            floats: Vec::new(),
        };
        for t in &s.tensors {
            out.tensors.push(self.copy_tensor(from, t)?);
            // The copied pages are not this process's weights: drop them from its
            // resident set (the page cache keeps them).
            crate::gguf::release_pages(&from.map);
        }
        for f in &s.floats {
            self.align()?;
            let start = self.pos;
            self.put(from.bytes(f.offset, f.count * 4))?;
            out.floats.push(FloatEntry {
                offset: start,
                ..f.clone()
            });
        }
        Ok(out)
    }

    pub(super) fn finish(mut self, index: &Index, path: &Path) -> std::io::Result<Finished> {
        let raw = serde_json::to_vec(index).map_err(std::io::Error::other)?;
        self.align()?;
        let off = self.pos;
        self.put(&raw)?;
        let mut trailer = Vec::with_capacity(TRAILER_LEN);
        trailer.extend_from_slice(TRAILER_MAGIC);
        trailer.extend_from_slice(&off.to_le_bytes());
        trailer.extend_from_slice(&(raw.len() as u64).to_le_bytes());
        trailer.extend_from_slice(&Sha256::digest(&raw));
        self.put(&trailer)?;
        let Some(file) = self.file else {
            return Ok(Finished::OverLimit(self.pos));
        };
        let file = file.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&self.tmp, path)?;
        Ok(Finished::Kept)
    }
}

/// Rewrites `pf` to `path` with a new identity, keeping its sections (dropping `drop_recipe`).
pub(super) fn rewrite(
    pf: &PackFile,
    path: &Path,
    id: &SourceIdentity,
    hashes: &[String],
    drop_recipe: Option<&str>,
) -> std::io::Result<()> {
    let mut w = Writer::create(path, u64::MAX)?;
    let result = (|| {
        let mut sections = Vec::new();
        for s in &pf.index.sections {
            if Some(s.recipe.as_str()) != drop_recipe {
                sections.push(w.copy_section(pf, s)?);
            }
        }
        let index = Index {
            version: PACK_VERSION,
            source: id.clone(),
            file_hashes: hashes.to_vec(),
            sections,
        };
        Ok(index)
    })();
    match result {
        Ok(index) => {
            let tmp = w.tmp.clone();
            w.finish(&index, path)
                .inspect_err(|_| {
                    let _ = std::fs::remove_file(tmp);
                })
                .map(|_| ())
        }
        Err(e) => {
            let _ = std::fs::remove_file(&w.tmp);
            Err(e)
        }
    }
}

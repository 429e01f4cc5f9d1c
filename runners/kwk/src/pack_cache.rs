//! The pack cache: int8/int4 weights packed once are kept in `pack_cache_dir`, and the next
//! start maps them from there instead of reading the model and quantizing again.
//!
//! **One file per model** (`kwk-pack-<sha256(canonical source path)[..12]>.kwkpack`), holding one
//! section per recipe packed for it. A warm start ([`try_load`]) reads only that file: the
//! source is identified by `stat` alone and never read, and every packed array is
//! memory-mapped in the layout the kernels use (each array starts on a 64-byte boundary),
//! not copied.
//!
//! **Identity.** The source is its canonical path (symlinks resolved; a hub model resolves
//! to its snapshot folder `models--ORG--NAME/snapshots/COMMIT`, so repo id and commit are
//! both in it) and, per weight/config file, size, mtime, ctime, inode and device. When they
//! all match the index, the file is used as is (fast path). On any difference the files are
//! hashed (SHA-256 in 64 MiB chunks on all threads, about 1 s per GB on two threads): same
//! contents → the index's stats are refreshed and the file used; different contents → the
//! model is read and every tensor whose key is unchanged is reused, the others packed again.
//! A model held in memory (a `transformers` object, no files) is named by the SHA-256 of its
//! config and tensors ([`memory_source`], `kwk-memory:HASH`, about 1 s per GB of weights on
//! two threads): that name is its whole identity, a changed tensor gives a new name (the old
//! file is then left to the size limit, as no file can say it is gone).
//!
//! **Key of a packed tensor** (`dep`): SHA-256 of the recipe ([`recipe_key`]: layout version
//! [`PACK_VERSION`], format with all its options, calibration-text hash), the tensor's
//! place, its grid, its per-column importance, and the float32 values it was quantized from
//! (after channel equalization). Equal keys mean the packing would write the same bytes,
//! so a tensor changed at the same size and mtime is repacked and the rest reused (a tensor
//! GPTQ rounded depends on its input's Hessian too, which the key does not hold: such
//! tensors are always written anew, never reused). Bump
//! [`PACK_VERSION`] whenever a packed layout or the rounding changes: the test
//! `layout_golden_hash_pins_pack_version` fails until you do.
//!
//! **File layout.** A 64-byte header (`KWKPACK\0`, version u32), the arrays (each padded
//! to 64 bytes), a JSON index (source identity, file hashes, sections: per tensor its name,
//! layout, shape, key, array offsets, CRC-32 of its bytes; per float vector the same), and
//! a trailer: `KWKINDEX`, index offset u64, index length u64, SHA-256 of the index. Little
//! endian. **Integrity**: the index by its SHA-256; each tensor of the section being loaded
//! by its CRC-32 (hardware CRC, about 0.1 s per GB; it also faults the pages in, which the
//! first token would do anyway). A file failing any check is deleted at once and rewritten
//! by the same run (never warned about twice).
//!
//! **Directory.** kwk touches only the files its own naming scheme made: every file it
//! writes starts with `kwk-pack-` (packs `kwk-pack-HEX.kwkpack`, locks `kwk-pack-HEX.lock`,
//! temporaries `.kwk-pack-HEX.kwkpack.tmp.PID.N`), and a folder kwk created (or found empty
//! or holding only kwk's files) gets the marker file [`MARKER`]. Packs of the older naming
//! scheme (`HEX.kwkpack`, `.HEX.kwkpack.tmp.PID.N`, `HEX.lock`) are recognised by that exact
//! pattern *and* by their contents (the `KWKPACK` magic; a lock or an unflushed temporary
//! is empty), and a pack of the old name is renamed to the new one when its model is used.
//! Any other file (`Cargo.lock`, `.notes.tmp.999999`) is never deleted; [`clear`] refuses a
//! folder without the marker that holds such files. Writes go to the temporary name and
//! are renamed into place when complete (a failed write removes its temporary file).
//! Packers of one model serialise on its lock (`flock`): the second one waiting finds the
//! first one's file and loads it. Last use is the file's mtime (set on every hit).
//!
//! **Limit.** `KWK_PACK_CACHE_GB` (default 16). After each write and each hit the folder is
//! swept (temporary files of dead processes, files of older layouts, files whose source no
//! longer exists) and least recently used files are deleted until the total is at or
//! under the limit. A pack larger than the whole limit is used for the run and not kept
//! ([`PackOutcome::NotKept`]): its writing stops at the limit (the bytes are counted, not
//! written), and a cached one is deleted after it was mapped. The library prints none of
//! this; the caller reports the outcome. [`list`], [`prune`] and [`clear`] back
//! `kwk-eval cache`.

use crate::error::{KwkError, Result};
use crate::format::int4::LowBitWeights;
use crate::format::int8::Int8Weights;
use crate::format::quantized::{quantize_on, Grid, QuantizedTensor};
use crate::format::storage::Store;
use crate::format::Precision;
use crate::format::{PackedLinear, TensorPlace};
use crate::model::Tensor;
use half::f16;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// Version of the packed layouts, the rounding and this file format; part of every key.
pub const PACK_VERSION: u32 = 3;

const MAGIC: &[u8; 8] = b"KWKPACK\0";
const TRAILER_MAGIC: &[u8; 8] = b"KWKINDEX";
const HEADER_LEN: u64 = 64;
const TRAILER_LEN: usize = 8 + 8 + 8 + 32;
/// Every array starts on a multiple of this many bytes (a cache line; kernels' loads).
const ALIGN: u64 = 64;
const EXT: &str = "kwkpack";
/// Every file kwk writes in the cache folder starts with this.
pub const PREFIX: &str = "kwk-pack-";
/// The marker file of a folder kwk created (see the module doc).
pub const MARKER: &str = "KWK-PACK-CACHE";
/// Hex digits of a cache file's name (12 bytes of SHA-256).
const NAME_HEX: usize = 24;
/// Bytes hashed per task when source files are hashed.
const HASH_CHUNK: u64 = 64 << 20;
/// Default size limit of the cache folder, in GB (`KWK_PACK_CACHE_GB`).
pub const DEFAULT_LIMIT_GB: f64 = 16.0;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------------------------------
// Recipe and keys

/// Everything besides the weights that decides packed bytes: layout version, the format
/// with all its options (group, mix, calibration and GPTQ switches and settings: the
/// `Precision` value in full), and the calibration tokens. One string per recipe; a new
/// setting is a new field here.
pub fn recipe_key(precision: &Precision, calibration: Option<&[u32]>) -> String {
    // Tokens handed to a format that does not calibrate do not change its bytes: such a
    // pack is found again with or without `--calib-text`.
    let calibration = calibration.filter(|_| precision.needs_calibration());
    let calib = match calibration {
        None => "none".to_string(),
        Some(tokens) => {
            let mut h = Sha256::new();
            for t in tokens {
                h.update(t.to_le_bytes());
            }
            hex(&h.finalize()[..16])
        }
    };
    // GPTQ's constants change its output: they are part of the recipe (with the
    // calibration tokens' hash above and the format, whose debug form names `gptq`).
    let gptq = match precision {
        Precision::Int4(o) if o.gptq => {
            format!("; {}", crate::quantize::gptq::settings(o.act_order))
        }
        Precision::Int8(o) if o.gptq => format!("; {}", crate::quantize::gptq::settings(false)),
        _ => String::new(),
    };
    format!("kwk-pack layout v{PACK_VERSION}; format {precision:?}; calibration {calib}{gptq}")
}

/// The key of one packed tensor (see the module doc).
fn dep_key(
    recipe: &str,
    tensor: &Tensor,
    place: &TensorPlace,
    grid: Option<Grid>,
    importance: Option<&[f32]>,
) -> String {
    let mut h = Sha256::new();
    h.update(recipe.as_bytes());
    h.update(format!("; {place:?}; {grid:?}; {:?}", tensor.shape).as_bytes());
    match importance {
        None => h.update(b"; no importance"),
        Some(v) => {
            h.update(b"; importance");
            h.update(bytemuck::cast_slice::<f32, u8>(v));
        }
    }
    h.update(b"; values");
    h.update(bytemuck::cast_slice::<f32, u8>(&tensor.data));
    hex(&h.finalize()[..16])
}

// ---------------------------------------------------------------------------------------
// Source identity

/// `stat` of one weight/config file of a source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    pub name: String,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
    pub inode: u64,
    pub dev: u64,
}

/// What a source is on disk (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceIdentity {
    pub canonical: String,
    pub files: Vec<FileStat>,
}

fn stat_of(name: String, m: &std::fs::Metadata) -> FileStat {
    FileStat {
        name,
        size: m.len(),
        mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
        inode: m.ino(),
        dev: m.dev(),
    }
}

/// How [`memory_source`] names start.
pub const MEMORY_SOURCE_PREFIX: &str = "kwk-memory:";

fn is_memory_source(name: &str) -> bool {
    name.starts_with(MEMORY_SOURCE_PREFIX)
}

/// The source name of a model held in memory: `kwk-memory:` and the SHA-256 of its config
/// (JSON text) and of every tensor (name, dtype, shape, little-endian bytes; by name),
/// tensors hashed in parallel. Pass it as the `source` of the decoder's constructors so
/// the pack cache keys the model by its contents.
pub fn memory_source(
    config_json: &str,
    tensors: &crate::model::memory::NamedTensors<'_>,
) -> PathBuf {
    use crate::model::memory::TensorData;
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let digests: Vec<Vec<u8>> = names
        .par_iter()
        .map(|name| {
            let t = &tensors[*name];
            let mut h = Sha256::new();
            h.update((name.len() as u64).to_le_bytes());
            h.update(name.as_bytes());
            h.update((t.shape.len() as u64).to_le_bytes());
            for d in &t.shape {
                h.update((*d as u64).to_le_bytes());
            }
            match t.data {
                TensorData::F32(d) => {
                    h.update(b"f32");
                    h.update(bytemuck::cast_slice::<_, u8>(d));
                }
                TensorData::F16(d) => {
                    h.update(b"f16");
                    h.update(bytemuck::cast_slice::<_, u8>(d));
                }
                TensorData::Bf16(d) => {
                    h.update(b"bf16");
                    h.update(bytemuck::cast_slice::<_, u8>(d));
                }
            }
            h.finalize().to_vec()
        })
        .collect();
    let mut h = Sha256::new();
    h.update((config_json.len() as u64).to_le_bytes());
    h.update(config_json.as_bytes());
    for d in digests {
        h.update(d);
    }
    PathBuf::from(format!("{MEMORY_SOURCE_PREFIX}{}", hex(&h.finalize())))
}

/// The identity of `source` (a model file or folder), from `stat` only; a
/// [`memory_source`] name is its own identity (no files).
pub fn source_identity(source: &Path) -> Result<SourceIdentity> {
    if let Some(name) = source.to_str().filter(|n| is_memory_source(n)) {
        return Ok(SourceIdentity {
            canonical: name.to_string(),
            files: Vec::new(),
        });
    }
    let canonical = std::fs::canonicalize(source).map_err(|e| KwkError::io(source, e))?;
    let meta = std::fs::metadata(&canonical).map_err(|e| KwkError::io(source, e))?;
    let mut files = Vec::new();
    if meta.is_dir() {
        let rd = std::fs::read_dir(&canonical).map_err(|e| KwkError::io(source, e))?;
        for entry in rd {
            let entry = entry.map_err(|e| KwkError::io(source, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if [".safetensors", ".json", ".gguf"]
                .iter()
                .any(|s| name.ends_with(s))
            {
                // Follows symlinks (hub snapshots link into blobs/): a retargeted link
                // changes the inode.
                let p = entry.path();
                let m = std::fs::metadata(&p).map_err(|e| KwkError::io(&p, e))?;
                files.push(stat_of(name, &m));
            }
        }
        files.sort_by(|a, b| a.name.cmp(&b.name));
    } else {
        files.push(stat_of(String::new(), &meta));
    }
    Ok(SourceIdentity {
        canonical: canonical.to_string_lossy().into_owned(),
        files,
    })
}

/// SHA-256 of each file of `id` (chunks hashed in parallel, then the chunk digests).
fn content_hashes(id: &SourceIdentity) -> Result<Vec<String>> {
    let root = Path::new(&id.canonical);
    id.files
        .iter()
        .map(|f| {
            let path = if f.name.is_empty() {
                root.to_path_buf()
            } else {
                root.join(&f.name)
            };
            let file = File::open(&path).map_err(|e| KwkError::io(&path, e))?;
            let len = file.metadata().map_err(|e| KwkError::io(&path, e))?.len();
            let chunks: Vec<u64> = (0..len.div_ceil(HASH_CHUNK)).collect();
            let digests = chunks
                .par_iter()
                .map(|&c| {
                    use std::os::unix::fs::FileExt;
                    let start = c * HASH_CHUNK;
                    let n = HASH_CHUNK.min(len - start) as usize;
                    let mut buf = vec![0u8; n];
                    file.read_exact_at(&mut buf, start)?;
                    Ok(Sha256::digest(&buf).to_vec())
                })
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(|e| KwkError::io(&path, e))?;
            let mut h = Sha256::new();
            h.update(len.to_le_bytes());
            for d in digests {
                h.update(d);
            }
            Ok(hex(&h.finalize()))
        })
        .collect()
}

/// The cache file of a source in `dir`.
pub fn cache_file(dir: &Path, id: &SourceIdentity) -> PathBuf {
    let digest = Sha256::digest(id.canonical.as_bytes());
    dir.join(format!("{PREFIX}{}.{EXT}", hex(&digest[..12])))
}

/// The cache file of a source in `dir`; a pack of the older naming scheme (`HEX.kwkpack`,
/// proven kwk's by its magic) is renamed to the new name first.
fn cache_file_migrated(dir: &Path, id: &SourceIdentity) -> PathBuf {
    let path = cache_file(dir, id);
    if !path.exists() {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if let Some(old_name) = name.as_deref().and_then(|n| n.strip_prefix(PREFIX)) {
            let old = dir.join(old_name);
            if starts_with_magic(&old) && std::fs::rename(&old, &path).is_ok() {
                let old_lock = lock_path(&old);
                if is_empty_file(&old_lock) {
                    let _ = std::fs::remove_file(old_lock);
                }
            }
        }
    }
    path
}

/// What a file of the cache folder is, by its name alone ([`FileKind::proven`] checks the
/// contents of the older scheme's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileKind {
    Marker,
    Pack { old: bool },
    Lock { old: bool },
    Temporary { old: bool, pid: Option<u32> },
}

fn is_hex_name(s: &str) -> bool {
    s.len() == NAME_HEX
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `kwk-pack-HEX.kwkpack` / `kwk-pack-HEX.lock` / `.kwk-pack-HEX.kwkpack.tmp.PID.N`, or the
/// same without `kwk-pack-` (the older scheme); anything else is not kwk's.
fn file_kind(name: &str) -> Option<FileKind> {
    if name == MARKER {
        return Some(FileKind::Marker);
    }
    let (hidden, rest) = match name.strip_prefix('.') {
        Some(r) => (true, r),
        None => (false, name),
    };
    let (old, rest) = match rest.strip_prefix(PREFIX) {
        Some(r) => (false, r),
        None => (true, rest),
    };
    let (hex_part, tail) = rest.split_at_checked(NAME_HEX)?;
    if !is_hex_name(hex_part) {
        return None;
    }
    match (hidden, tail) {
        (false, ".kwkpack") => Some(FileKind::Pack { old }),
        (false, ".lock") => Some(FileKind::Lock { old }),
        (true, t) => {
            let (pid, n) = t.strip_prefix(".kwkpack.tmp.")?.split_once('.')?;
            let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            (digits(pid) && digits(n)).then(|| FileKind::Temporary {
                old,
                pid: pid.parse().ok(),
            })
        }
        _ => None,
    }
}

fn starts_with_magic(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 8];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| &head == MAGIC)
}

fn is_empty_file(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file() && m.len() == 0)
}

impl FileKind {
    /// Whether the file at `path` of this kind is kwk's: always for the current scheme
    /// (regular files only); for the older one, a pack must start with the magic, a lock
    /// must be empty, a temporary must be either.
    fn proven(self, path: &Path) -> bool {
        let regular = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file());
        regular
            && match self {
                FileKind::Marker
                | FileKind::Pack { old: false }
                | FileKind::Lock { old: false }
                | FileKind::Temporary { old: false, .. } => true,
                FileKind::Pack { old: true } => starts_with_magic(path),
                FileKind::Lock { old: true } => is_empty_file(path),
                FileKind::Temporary { old: true, .. } => {
                    is_empty_file(path) || starts_with_magic(path)
                }
            }
    }
}

/// Creates the cache folder (with its [`MARKER`]) when missing; a folder found empty or
/// holding only kwk's files gets the marker too.
fn ensure_dir(dir: &Path) -> std::io::Result<()> {
    let existed = dir.is_dir();
    std::fs::create_dir_all(dir)?;
    let marker = dir.join(MARKER);
    if marker.exists() {
        return Ok(());
    }
    if existed && !foreign_files(dir)?.is_empty() {
        return Ok(());
    }
    match File::options().write(true).create_new(true).open(&marker) {
        Ok(mut f) => f.write_all(
            b"This folder is kwk's pack cache (kwk-eval cache list | prune | clear).\n\
              kwk writes and deletes only files named kwk-pack-* here.\n",
        ),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// The names of the entries of `dir` that are not kwk's (sorted).
fn foreign_files(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !file_kind(&name).is_some_and(|k| k.proven(&entry.path())) {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// The file

#[derive(Debug, Clone, Serialize, Deserialize)]
struct TensorEntry {
    name: String,
    /// 0: symmetric int8 blocks ([`Int8Weights`]); 1: asymmetric groups ([`LowBitWeights`]).
    kind: u8,
    bits: u32,
    group_size: usize,
    rows: usize,
    cols: usize,
    dep: String,
    /// The bytes `offset..offset + len` hold the arrays; `crc` is their CRC-32.
    offset: u64,
    len: u64,
    crc: u32,
    /// Each array: absolute byte offset and length in elements.
    arrays: Vec<(u64, u64)>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct FloatEntry {
    name: String,
    offset: u64,
    count: u64,
    crc: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Section {
    recipe: String,
    tensors: Vec<TensorEntry>,
    floats: Vec<FloatEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Index {
    version: u32,
    source: SourceIdentity,
    file_hashes: Vec<String>,
    sections: Vec<Section>,
}

/// An opened, index-checked cache file.
struct PackFile {
    map: Arc<memmap2::Mmap>,
    index: Index,
}

fn map_read_only(path: &Path, populate: bool) -> std::io::Result<memmap2::Mmap> {
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
    fn open(path: &Path) -> std::result::Result<PackFile, String> {
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

    fn section(&self, recipe: &str) -> Option<&Section> {
        self.index.sections.iter().find(|s| s.recipe == recipe)
    }

    fn bytes(&self, offset: u64, len: u64) -> &[u8] {
        &self.map[offset as usize..(offset + len) as usize]
    }

    /// The tensor of `e`, mapped, after its CRC is checked.
    fn tensor(&self, e: &TensorEntry) -> std::result::Result<QuantizedTensor, String> {
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
        let t = match (e.kind, e.arrays.len()) {
            (0, 2) => Int8Weights::from_parts(e.rows, e.cols, u8s(0)?, f16s(1)?)
                .map(QuantizedTensor::Int8),
            (1, 4) => LowBitWeights::from_parts(
                e.bits,
                e.group_size,
                e.rows,
                e.cols,
                u8s(0)?,
                u8s(1)?,
                f16s(2)?,
                f16s(3)?,
            )
            .map(QuantizedTensor::LowBit),
            _ => None,
        };
        t.ok_or_else(bad)
    }

    fn floats(&self, e: &FloatEntry) -> std::result::Result<Vec<f32>, String> {
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
    static FAIL_WRITE_AFTER: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Writes a new cache file under a temporary name; [`Writer::finish`] renames it. Past
/// `limit` bytes the temporary file is deleted and the rest only counted (a pack larger
/// than the whole cache is not kept).
struct Writer {
    tmp: PathBuf,
    /// `None` once the file passed `limit`.
    file: Option<BufWriter<File>>,
    pos: u64,
    limit: u64,
}

/// How [`Writer::finish`] ended.
#[derive(Debug, PartialEq, Eq)]
enum Finished {
    Kept,
    /// The file would have had this many bytes, over the writer's limit: not kept.
    OverLimit(u64),
}

impl Writer {
    fn create(path: &Path, limit: u64) -> std::io::Result<Writer> {
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

    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
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

    fn align(&mut self) -> std::io::Result<()> {
        let pad = (ALIGN - self.pos % ALIGN) % ALIGN;
        self.put(&[0u8; ALIGN as usize][..pad as usize])
    }

    /// Writes `arrays` (each aligned); returns (offset, length, CRC, per-array offsets).
    fn region(&mut self, arrays: &[&[u8]]) -> std::io::Result<(u64, u64, u32, Vec<u64>)> {
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

    fn tensor(
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
                let (nib, hb, sc, mn) = w.parts();
                (
                    1,
                    w.bits(),
                    w.group_size(),
                    vec![
                        (nib, nib.len() as u64),
                        (hb, hb.len() as u64),
                        (bytemuck::cast_slice(sc), sc.len() as u64),
                        (bytemuck::cast_slice(mn), mn.len() as u64),
                    ],
                )
            }
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
        })
    }

    /// Copies an entry of another file byte for byte (its arrays keep their alignment).
    fn copy_tensor(&mut self, from: &PackFile, e: &TensorEntry) -> std::io::Result<TensorEntry> {
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

    fn floats(&mut self, name: &str, v: &[f32]) -> std::io::Result<FloatEntry> {
        let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let (offset, _, crc, _) = self.region(&[&raw])?;
        Ok(FloatEntry {
            name: name.to_string(),
            offset,
            count: v.len() as u64,
            crc,
        })
    }

    fn copy_section(&mut self, from: &PackFile, s: &Section) -> std::io::Result<Section> {
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

    fn finish(mut self, index: &Index, path: &Path) -> std::io::Result<Finished> {
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

// ---------------------------------------------------------------------------------------
// Loading (warm start)

/// How a decoder's weights were obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PackOutcome {
    /// No cache folder was given.
    NoCache,
    /// Every tensor came from this cache file (mapped).
    Loaded(PathBuf),
    /// Every tensor was quantized and the cache file written.
    Written(PathBuf),
    /// The source changed: `reused` tensors were kept, `repacked` quantized again, and
    /// the file rewritten.
    Updated {
        path: PathBuf,
        reused: usize,
        repacked: usize,
    },
    /// Tensors were quantized; the cache could not be used or written (why).
    NotWritten(String),
    /// The pack (`path`, `bytes` long) is larger than the whole cache limit (`limit` bytes):
    /// it was used for this run and is not kept (never written, or deleted once mapped).
    NotKept {
        path: PathBuf,
        bytes: u64,
        limit: u64,
    },
}

/// The packed tensors and float vectors of one recipe, read from a cache file.
pub struct CachedModel {
    pub path: PathBuf,
    tensors: HashMap<String, QuantizedTensor>,
    floats: HashMap<String, Vec<f32>>,
    /// `(bytes, limit)` when the file is larger than the whole cache limit: it was deleted
    /// after it was mapped (used for this run, not kept).
    pub not_kept: Option<(u64, u64)>,
}

impl CachedModel {
    /// What the pack cache did for a decoder built from this entry.
    pub fn outcome(&self) -> PackOutcome {
        match self.not_kept {
            Some((bytes, limit)) => PackOutcome::NotKept {
                path: self.path.clone(),
                bytes,
                limit,
            },
            None => PackOutcome::Loaded(self.path.clone()),
        }
    }
}

/// After a hit on `path`: sweeps its folder and applies `limit`, this file going last;
/// `Some((bytes, limit))` when the file itself had to go (its mapping stays valid).
fn enforce_limit_after_hit(path: &Path, limit: u64) -> Option<(u64, u64)> {
    let dir = path.parent()?;
    let bytes = std::fs::metadata(path).ok()?.len();
    let report = prune(dir, limit, Some(path)).ok()?;
    report
        .evicted
        .iter()
        .any(|p| p == path)
        .then_some((bytes, limit))
}

impl CachedModel {
    /// The packed tensor stored as `name` (each can be taken once).
    pub fn take_tensor(&mut self, name: &str) -> Option<Box<dyn PackedLinear>> {
        self.tensors.remove(name).map(QuantizedTensor::into_packed)
    }
    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
    /// The float vector stored as `name` (norms, biases, routers).
    pub fn take_floats(&mut self, name: &str) -> Option<Vec<f32>> {
        self.floats.remove(name)
    }
    pub fn has_floats(&self, name: &str) -> bool {
        self.floats.contains_key(name)
    }
    /// Entries nobody took (a complete build takes all).
    pub fn left_over(&self) -> usize {
        self.tensors.len() + self.floats.len()
    }
}

/// Reports a cache file that failed a check and deletes it (it is rewritten by this run).
fn discard(path: &Path, why: &str) {
    eprintln!(
        "warning: pack cache {}: {why}; deleting it (it is written again by this run)",
        path.display()
    );
    let _ = std::fs::remove_file(path);
}

/// Sets the file's mtime to now: the last use the eviction order reads.
fn touch(path: &Path) {
    if let Ok(f) = File::options().append(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// Opens and checks the cache file of `id`, refreshing a stale identity when the contents
/// hash the same. `Ok(None)`: no usable file.
fn open_checked(path: &Path, id: &SourceIdentity) -> Result<Option<PackFile>> {
    if !path.exists() {
        return Ok(None);
    }
    let pf = match PackFile::open(path) {
        Ok(pf) => pf,
        Err(why) => {
            discard(path, &why);
            return Ok(None);
        }
    };
    if pf.index.source.canonical != id.canonical {
        return Ok(None);
    }
    if pf.index.source == *id {
        return Ok(Some(pf));
    }
    // Doubt: hash the contents. Same → record the new stats (rewrite the index).
    let hashes = content_hashes(id)?;
    if hashes != pf.index.file_hashes || pf.index.source.files.len() != id.files.len() {
        return Ok(None);
    }
    match rewrite(&pf, path, id, &hashes, None) {
        Ok(()) => {}
        Err(e) => eprintln!(
            "warning: pack cache {}: could not record the model's new file times: {e}",
            path.display()
        ),
    }
    Ok(PackFile::open(path).ok())
}

/// Rewrites `pf` to `path` with a new identity, keeping its sections (dropping `drop_recipe`).
fn rewrite(
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

/// Loads every entry of a section, CRC-checked; `Err` names the bad one.
fn load_section(
    pf: &PackFile,
    s: &Section,
    path: &Path,
) -> std::result::Result<CachedModel, String> {
    let tensors = s
        .tensors
        .par_iter()
        .map(|e| Ok((e.name.clone(), pf.tensor(e)?)))
        .collect::<Vec<std::result::Result<_, String>>>()
        .into_iter()
        .collect::<std::result::Result<HashMap<_, _>, String>>()?; // the first bad entry
    let floats = s
        .floats
        .iter()
        .map(|e| Ok((e.name.clone(), pf.floats(e)?)))
        .collect::<std::result::Result<HashMap<_, _>, String>>()?;
    Ok(CachedModel {
        path: path.to_path_buf(),
        tensors,
        floats,
        not_kept: None,
    })
}

/// A warm start: the packed tensors of `source` in `precision` from `dir`, reading only the
/// cache file (see the module doc); `Ok(None)` when there is no valid entry.
pub fn try_load(
    dir: &Path,
    source: &Path,
    precision: &Precision,
    calibration: Option<&[u32]>,
) -> Result<Option<CachedModel>> {
    let id = source_identity(source)?;
    let path = cache_file_migrated(dir, &id);
    let Some(pf) = open_checked(&path, &id)? else {
        return Ok(None);
    };
    let recipe = recipe_key(precision, calibration);
    let Some(section) = pf.section(&recipe) else {
        return Ok(None);
    };
    match load_section(&pf, section, &path) {
        Ok(mut m) => {
            touch(&path);
            m.not_kept = enforce_limit_after_hit(&path, limit_bytes());
            Ok(Some(m))
        }
        Err(why) => {
            discard(&path, &why);
            Ok(None)
        }
    }
}

// ---------------------------------------------------------------------------------------
// Packing (cold start)

/// Packs a decoder's quantized weights and writes them to the cache (see the module doc).
/// Holds the model's lock from `open` to `finish`.
pub struct PackSession {
    path: PathBuf,
    recipe: String,
    id: SourceIdentity,
    hashes: Vec<String>,
    old: Option<PackFile>,
    /// Reusable entries of the old file for this recipe, by name.
    reusable: HashMap<String, TensorEntry>,
    /// Other recipes' sections to keep (the source is unchanged).
    keep: Vec<Section>,
    writer: Option<Writer>,
    section: Section,
    reused: usize,
    repacked: usize,
    abandoned: Option<String>,
    _lock: Option<File>,
    /// Another process wrote this recipe while we waited for the lock.
    hit: Option<CachedModel>,
    /// The folder's size limit in bytes (`KWK_PACK_CACHE_GB`, [`PackSession::set_limit`]).
    limit: u64,
}

/// The lock file of a cache file.
fn lock_path(path: &Path) -> PathBuf {
    path.with_extension("lock")
}

impl PackSession {
    /// Opens the cache of `source` for writing `precision`: waits for the model's lock,
    /// then loads a file another process completed meanwhile ([`PackSession::take_hit`]),
    /// else prepares the reuse of the old file's unchanged tensors.
    pub fn open(
        dir: &Path,
        source: &Path,
        precision: &Precision,
        calibration: Option<&[u32]>,
    ) -> Result<PackSession> {
        let id = source_identity(source)?;
        ensure_dir(dir).map_err(|e| KwkError::io(dir, e))?;
        let path = cache_file_migrated(dir, &id);
        let lock = File::create(lock_path(&path)).map_err(|e| KwkError::io(lock_path(&path), e))?;
        lock.lock().map_err(|e| KwkError::io(lock_path(&path), e))?;
        let recipe = recipe_key(precision, calibration);
        let mut s = PackSession {
            path: path.clone(),
            recipe: recipe.clone(),
            id: id.clone(),
            hashes: Vec::new(),
            old: None,
            reusable: HashMap::new(),
            keep: Vec::new(),
            writer: None,
            section: Section {
                recipe: recipe.clone(),
                tensors: Vec::new(),
                floats: Vec::new(),
            },
            reused: 0,
            repacked: 0,
            abandoned: None,
            _lock: Some(lock),
            hit: None,
            limit: limit_bytes(),
        };
        if let Some(pf) = open_checked(&path, &id)? {
            // Unchanged source: keep other recipes; this one may be complete already.
            if let Some(sec) = pf.section(&recipe) {
                match load_section(&pf, sec, &path) {
                    Ok(mut m) => {
                        touch(&path);
                        m.not_kept = enforce_limit_after_hit(&path, s.limit);
                        s.hit = Some(m);
                        return Ok(s);
                    }
                    Err(why) => {
                        discard(&path, &why);
                        s.hashes = content_hashes(&id)?;
                        s.start_writer();
                        return Ok(s);
                    }
                }
            }
            s.hashes = pf.index.file_hashes.clone();
            s.keep = pf.index.sections.clone();
            s.old = Some(pf);
        } else {
            s.hashes = content_hashes(&id)?;
            // A file of another version of this source: its tensors may be reused by key.
            if let Ok(pf) = PackFile::open(&path) {
                if let Some(sec) = pf.section(&recipe) {
                    s.reusable = sec
                        .tensors
                        .iter()
                        .map(|t| (t.name.clone(), t.clone()))
                        .collect();
                }
                s.old = Some(pf);
            }
        }
        s.start_writer();
        Ok(s)
    }

    /// Sets the folder's size limit (bytes) for this session, instead of
    /// `KWK_PACK_CACHE_GB`'s.
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
        if let Some(w) = self.writer.as_mut() {
            w.limit = limit;
        }
    }

    fn start_writer(&mut self) {
        match Writer::create(&self.path, self.limit) {
            Ok(w) => self.writer = Some(w),
            Err(e) => self.abandoned = Some(format!("cannot write {}: {e}", self.path.display())),
        }
    }

    /// The cached tensors when another process completed this recipe while we waited.
    pub fn take_hit(&mut self) -> Option<CachedModel> {
        self.hit.take()
    }

    fn write_failed(&mut self, e: std::io::Error) {
        self.abandoned = Some(format!("writing the pack cache: {e}"));
        if let Some(w) = self.writer.take() {
            let _ = std::fs::remove_file(&w.tmp);
        }
    }

    /// The packed form of `tensor`, stored as `name`: reused from the old file when its key
    /// is unchanged, else quantized on `grid` (or the mix rule's) with `importance`.
    pub fn pack(
        &mut self,
        name: &str,
        tensor: &Tensor,
        place: TensorPlace,
        grid: Option<Grid>,
        importance: Option<&[f32]>,
        precision: &Precision,
    ) -> Result<Box<dyn PackedLinear>> {
        self.pack_with(name, tensor, place, grid, importance, precision, None)
    }

    /// [`PackSession::pack`], or, when `made` is given (a tensor the caller quantized,
    /// e.g. with GPTQ, whose bytes depend on more than its key holds: the Hessian of its
    /// input), that tensor, written as is and never reused from an older file.
    #[allow(clippy::too_many_arguments)]
    pub fn pack_with(
        &mut self,
        name: &str,
        tensor: &Tensor,
        place: TensorPlace,
        grid: Option<Grid>,
        importance: Option<&[f32]>,
        precision: &Precision,
        made: Option<QuantizedTensor>,
    ) -> Result<Box<dyn PackedLinear>> {
        // Between tensors: a stop request abandons the pack (the session's drop removes
        // its temporary file).
        crate::interrupt::check()?;
        let dep = dep_key(&self.recipe, tensor, &place, grid, importance);
        let reusable = if made.is_some() {
            None
        } else {
            self.reusable.get(name)
        };
        if let (Some(old), Some(e)) = (&self.old, reusable) {
            if e.dep == dep && e.rows == tensor.rows() && e.cols == tensor.cols() {
                if let Ok(t) = old.tensor(e) {
                    let copied = self.writer.as_mut().map(|w| w.copy_tensor(old, e));
                    match copied {
                        Some(Ok(entry)) => self.section.tensors.push(entry),
                        Some(Err(err)) => self.write_failed(err),
                        None => {}
                    }
                    self.reused += 1;
                    return Ok(t.into_packed());
                }
            }
        }
        let t = match made {
            Some(t) => t,
            None => quantize_on(tensor, precision, place, grid, importance)?,
        };
        self.repacked += 1;
        if let Some(w) = self.writer.as_mut() {
            match w.tensor(name, &dep, &t) {
                Ok(entry) => self.section.tensors.push(entry),
                Err(e) => self.write_failed(e),
            }
        }
        Ok(t.into_packed())
    }

    /// Stores a float vector (norm, bias, router) as `name`.
    pub fn put_floats(&mut self, name: &str, v: &[f32]) {
        if let Some(w) = self.writer.as_mut() {
            match w.floats(name, v) {
                Ok(entry) => self.section.floats.push(entry),
                Err(e) => self.write_failed(e),
            }
        }
    }

    /// Ends the session: writes the file (other recipes of an unchanged source copied),
    /// then sweeps the folder and applies the size limit.
    pub fn finish(mut self) -> PackOutcome {
        if let Some(why) = self.abandoned.take() {
            return PackOutcome::NotWritten(why);
        }
        let Some(mut w) = self.writer.take() else {
            return PackOutcome::NotWritten("no writer".into());
        };
        let mut sections = Vec::new();
        if let Some(old) = &self.old {
            for s in &self.keep {
                if s.recipe == self.recipe {
                    continue;
                }
                match w.copy_section(old, s) {
                    Ok(c) => sections.push(c),
                    Err(e) => {
                        let _ = std::fs::remove_file(&w.tmp);
                        return PackOutcome::NotWritten(format!("writing the pack cache: {e}"));
                    }
                }
            }
        }
        sections.push(std::mem::replace(
            &mut self.section,
            Section {
                recipe: String::new(),
                tensors: Vec::new(),
                floats: Vec::new(),
            },
        ));
        let index = Index {
            version: PACK_VERSION,
            source: self.id.clone(),
            file_hashes: self.hashes.clone(),
            sections,
        };
        let tmp = w.tmp.clone();
        let not_kept = match w.finish(&index, &self.path) {
            Ok(Finished::Kept) => None,
            Ok(Finished::OverLimit(bytes)) => Some(bytes),
            Err(e) => {
                let _ = std::fs::remove_file(tmp);
                return PackOutcome::NotWritten(format!("writing {}: {e}", self.path.display()));
            }
        };
        // Also when this pack is not kept: an older file of this model (other formats) may
        // stay, and the limit holds all the same.
        if let Some(dir) = self.path.parent() {
            if let Err(e) = prune(dir, self.limit, Some(&self.path)) {
                eprintln!("warning: pack cache {}: {e}", dir.display());
            }
        }
        if let Some(bytes) = not_kept {
            return PackOutcome::NotKept {
                path: self.path.clone(),
                bytes,
                limit: self.limit,
            };
        }
        if self.reused > 0 {
            PackOutcome::Updated {
                path: self.path.clone(),
                reused: self.reused,
                repacked: self.repacked,
            }
        } else {
            PackOutcome::Written(self.path.clone())
        }
    }
}

impl Drop for PackSession {
    fn drop(&mut self) {
        if let Some(w) = self.writer.take() {
            let _ = std::fs::remove_file(&w.tmp);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The folder: limit, sweep, list

/// The size limit from `KWK_PACK_CACHE_GB` (default [`DEFAULT_LIMIT_GB`]); an unreadable
/// value is reported and the default used.
pub fn limit_bytes() -> u64 {
    let gb = match std::env::var("KWK_PACK_CACHE_GB") {
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(x) if x >= 0.0 && x.is_finite() => x,
            _ => {
                eprintln!(
                    "warning: KWK_PACK_CACHE_GB='{v}' is not a number of GB; using {DEFAULT_LIMIT_GB}"
                );
                DEFAULT_LIMIT_GB
            }
        },
        Err(_) => DEFAULT_LIMIT_GB,
    };
    (gb * 1e9) as u64
}

/// One cache file, for `kwk-eval cache list`.
#[derive(Debug, Clone, Serialize)]
pub struct CacheEntryInfo {
    pub path: PathBuf,
    /// The model's canonical path (`None`: unreadable or older layout).
    pub model: Option<String>,
    /// The recipes packed in it.
    pub formats: Vec<String>,
    pub bytes: u64,
    /// Last use (seconds since the Unix epoch).
    pub last_use_unix: u64,
}

/// The cache files in `dir`, most recently used first.
pub fn list(dir: &Path) -> Result<Vec<CacheEntryInfo>> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(KwkError::io(dir, e)),
    };
    for entry in rd {
        let entry = entry.map_err(|e| KwkError::io(dir, e))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let pack = file_kind(&name).filter(|k| matches!(k, FileKind::Pack { .. }));
        if !pack.is_some_and(|k| k.proven(&path)) {
            continue;
        }
        let Ok(m) = entry.metadata() else { continue };
        let last_use_unix = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        let (model, formats) = match PackFile::open(&path) {
            Ok(pf) => (
                Some(pf.index.source.canonical.clone()),
                pf.index
                    .sections
                    .iter()
                    .map(|s| {
                        let f = s.recipe.split("; format ").nth(1).unwrap_or(&s.recipe);
                        f.to_string()
                    })
                    .collect(),
            ),
            Err(_) => (None, Vec::new()),
        };
        out.push(CacheEntryInfo {
            path,
            model,
            formats,
            bytes: m.len(),
            last_use_unix,
        });
    }
    out.sort_by(|a, b| {
        b.last_use_unix
            .cmp(&a.last_use_unix)
            .then(a.path.cmp(&b.path))
    });
    Ok(out)
}

/// What [`prune`] removed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PruneReport {
    /// Temporary files of processes no longer running.
    pub temporary: Vec<PathBuf>,
    /// Unreadable files, older layouts, files whose model no longer exists.
    pub orphaned: Vec<PathBuf>,
    /// Least recently used files over the limit.
    pub evicted: Vec<PathBuf>,
    /// Bytes left in the folder.
    pub bytes_left: u64,
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Sweeps `dir` (temporary files of dead processes, unreadable or older files, files whose
/// model is gone), then deletes least recently used files until at most `limit` bytes are
/// left; `keep` (the file just written) goes last.
pub fn prune(dir: &Path, limit: u64, keep: Option<&Path>) -> Result<PruneReport> {
    let mut report = PruneReport::default();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(report),
        Err(e) => return Err(KwkError::io(dir, e)),
    };
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        // `.kwk-pack-HEX.kwkpack.tmp.PID.N` (or the older `.HEX.kwkpack.tmp.PID.N`) only.
        let Some(kind @ FileKind::Temporary { pid, .. }) = file_kind(&name) else {
            continue;
        };
        if pid.is_some_and(|p| !pid_alive(p))
            && kind.proven(&path)
            && std::fs::remove_file(&path).is_ok()
        {
            report.temporary.push(path);
        }
    }
    let locked = |p: &Path| -> Option<File> {
        let f = File::create(lock_path(p)).ok()?;
        f.try_lock().ok()?;
        Some(f)
    };
    for e in list(dir)? {
        if Some(e.path.as_path()) == keep {
            continue;
        }
        let gone = match &e.model {
            None => true,
            // A model held in memory has no file to be gone: the size limit alone evicts it.
            Some(m) => !is_memory_source(m) && !Path::new(m).exists(),
        };
        if gone {
            // Not while a packer of that model holds its lock.
            if let Some(_l) = locked(&e.path) {
                if std::fs::remove_file(&e.path).is_ok() {
                    let _ = std::fs::remove_file(lock_path(&e.path));
                    report.orphaned.push(e.path);
                }
            }
        }
    }
    let mut entries = list(dir)?;
    // Most recently used first; the file just written counts as the most recent.
    entries.sort_by_key(|e| {
        (
            Some(e.path.as_path()) != keep,
            std::cmp::Reverse(e.last_use_unix),
        )
    });
    let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
    // `keep` goes last, and only when it alone is over the limit (its user has it mapped
    // or in memory; its lock stays for the holder).
    while total > limit {
        let Some(e) = entries.pop() else { break };
        let kept = Some(e.path.as_path()) == keep;
        if std::fs::remove_file(&e.path).is_ok() {
            if !kept {
                let _ = std::fs::remove_file(lock_path(&e.path));
            }
            total -= e.bytes;
            report.evicted.push(e.path);
        }
    }
    report.bytes_left = total;
    Ok(report)
}

/// Deletes every cache file (and lock and temporary file) kwk wrote in `dir` (see the
/// module doc: its naming scheme, older packs proven by their magic); returns how many
/// packs. Any other file is left; a folder without the [`MARKER`] that holds other files is
/// refused (not kwk's folder, most likely), deleting nothing.
pub fn clear(dir: &Path) -> Result<usize> {
    let foreign = match foreign_files(dir) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(KwkError::io(dir, e)),
    };
    if !foreign.is_empty() && !dir.join(MARKER).is_file() {
        let shown: Vec<&str> = foreign.iter().take(3).map(String::as_str).collect();
        let more = if foreign.len() > 3 { ", ..." } else { "" };
        return Err(KwkError::InvalidArgument(format!(
            "{} is not a folder kwk created (no {MARKER} file) and holds files that are not \
             kwk's ({}{more}): nothing deleted; pass kwk's pack cache folder, or delete its \
             {PREFIX}* files yourself",
            dir.display(),
            shown.join(", ")
        )));
    }
    let rd = std::fs::read_dir(dir).map_err(|e| KwkError::io(dir, e))?;
    let mut n = 0;
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let Some(kind) = file_kind(&name) else {
            continue;
        };
        if kind == FileKind::Marker || !kind.proven(&path) {
            continue;
        }
        if std::fs::remove_file(&path).is_ok() && matches!(kind, FileKind::Pack { .. }) {
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests;

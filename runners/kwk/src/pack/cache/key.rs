//! The pack cache's identities and keys: what a source is (its canonical path and file
//! stats, or a model in memory by its contents' hash), the recipe of a pack, the key of one
//! packed tensor, and the name of a source's cache file.

use super::{hex, PACK_VERSION, PREFIX};
use crate::error::{KwkError, Result};
use crate::format::quantized::Grid;
use crate::format::Precision;
use crate::format::TensorPlace;
use crate::kernels::quant::Bits;
use crate::model::Tensor;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The extension of a pack file.
pub(super) const EXT: &str = "kwkpack";
/// Bytes hashed per task when source files are hashed.
pub(super) const HASH_CHUNK: u64 = 64 << 20;

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
        Precision::LowBit(o) if o.gptq => {
            format!("; {}", crate::quantize::gptq::settings(o.act_order))
        }
        Precision::Int8(o) if o.gptq => format!("; {}", crate::quantize::gptq::settings(false)),
        _ => String::new(),
    };
    let format = format_key(precision);
    format!("kwk-pack layout v{PACK_VERSION}; format {format}; calibration {calib}{gptq}")
}

/// The format in a recipe: its debug form, except that int4 reads as it did when its
/// options were the type `Int4Options` (before the low-bit family had other widths), so
/// packs made then are found again; every other width is `LowBit(..)` with its `bits`.
fn format_key(precision: &Precision) -> String {
    match precision {
        Precision::LowBit(o) if o.bits == Bits::B4 => format!(
            "Int4(Int4Options {{ group_size: {}, mix_bits: {:?}, calibrate: {}, gptq: {}, act_order: {} }})",
            o.group_size, o.mix_bits, o.calibrate, o.gptq, o.act_order
        ),
        p => format!("{p:?}"),
    }
}

/// The key of one packed tensor (see the module doc).
pub(super) fn dep_key(
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
    // The same values from a quantized GGUF may pack differently (copied from its blocks).
    if let Some(src) = &tensor.source {
        h.update(format!("; source {}", src.ty).as_bytes());
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

pub(super) fn stat_of(name: String, m: &std::fs::Metadata) -> FileStat {
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

pub(super) fn is_memory_source(name: &str) -> bool {
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
pub(super) fn content_hashes(id: &SourceIdentity) -> Result<Vec<String>> {
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

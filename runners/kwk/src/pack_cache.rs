//! The pack cache: int8/int4 weights packed once are written to `pack_cache_dir` and read
//! back on the next start instead of being quantized again.
//!
//! One file per (model, format): the name is a hash of the key string
//! `kwk-pack v{PACK_VERSION}; source {path}; files {name:size:mtime...}; format {precision};
//! calibration {hash}`, and the key string itself is stored in the file and compared on
//! read, so a changed model file (size or mtime), format spec, calibration text or packing
//! code (bump [`PACK_VERSION`] whenever a packed layout or the rounding changes) never
//! reuses stale weights.
//!
//! Layout: magic `KWKPACK\0`, version u32, key length u32, key bytes, then the channel
//! equalization factors (`quantize::equalize`; an entry of kind 2: per layer the f32
//! vectors, each length-prefixed) and one entry per
//! packed tensor in the order the decoder packs them (role, layer, kind, bits, group size,
//! rows, cols, then the packed arrays, each length-prefixed), then a trailer: `KWKEND\0\0`,
//! entry count u64, body length u64 and the SHA-256 of the body. All integers little
//! endian. A file is trusted only if magic, version, key, length, checksum and every
//! entry's bounds check out, and each entry must match the tensor the decoder asks for
//! (role, layer, shape); otherwise it is ignored with a warning on stderr and rewritten.
//! Writes go to a temporary file in the same folder, renamed into place when complete.
//!
//! Use ([`PackSession`]): `open` once per decoder, `pack` each linear weight in order,
//! `finish` at the end (writes the file after a miss).

use crate::decoder::Precision;
use crate::error::{KwkError, Result};
use crate::format::int4::LowBitWeights;
use crate::format::int8::Int8Weights;
use crate::format::quantized::{quantize_on, Grid, QuantizedTensor};
use crate::format::{PackedLinear, TensorPlace, TensorRole};
use crate::model::Tensor;
use crate::quantize::equalize::{ChannelScales, LayerScales};
use half::f16;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// Version of the packed layouts and rounding; part of every cache key.
pub const PACK_VERSION: u32 = 2;

const MAGIC: &[u8; 8] = b"KWKPACK\0";
const TRAILER_MAGIC: &[u8; 8] = b"KWKEND\0\0";
const TRAILER_LEN: usize = 8 + 8 + 8 + 32;

const ROLES: [TensorRole; 10] = [
    TensorRole::Embedding,
    TensorRole::LmHead,
    TensorRole::AttnQ,
    TensorRole::AttnK,
    TensorRole::AttnV,
    TensorRole::AttnOutput,
    TensorRole::FfnGate,
    TensorRole::FfnUp,
    TensorRole::FfnDown,
    TensorRole::Router,
];

fn role_code(role: TensorRole) -> u8 {
    ROLES.iter().position(|&r| r == role).unwrap_or(255) as u8
}

/// What identifies the weights: the source path and the size and modification time of
/// each weight/config file in it.
pub fn source_fingerprint(source: &Path) -> Result<String> {
    let meta = std::fs::metadata(source).map_err(|e| KwkError::io(source, e))?;
    let mut files = Vec::new();
    if meta.is_dir() {
        let rd = std::fs::read_dir(source).map_err(|e| KwkError::io(source, e))?;
        for entry in rd {
            let entry = entry.map_err(|e| KwkError::io(source, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if [".safetensors", ".json", ".gguf"]
                .iter()
                .any(|s| name.ends_with(s))
            {
                let m = entry
                    .metadata()
                    .map_err(|e| KwkError::io(entry.path(), e))?;
                files.push((name, m));
            }
        }
        files.sort_by(|a, b| a.0.cmp(&b.0));
    } else {
        files.push((String::new(), meta));
    }
    let mut out = format!("source {}; files", source.display());
    for (name, m) in files {
        let mtime = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        out.push_str(&format!(" {name}:{}:{mtime}", m.len()));
    }
    Ok(out)
}

/// The cache key string of a source, format and calibration text.
pub fn cache_key(
    source: &Path,
    precision: &Precision,
    calibration: Option<&[u32]>,
) -> Result<String> {
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
    // GPTQ's constants change its output: they are part of the key (with the
    // calibration tokens' hash above and the format, whose debug form names `gptq`).
    let gptq = match precision {
        Precision::Int4(o) if o.gptq => format!("; {}", crate::quantize::gptq::settings()),
        _ => String::new(),
    };
    Ok(format!(
        "kwk-pack v{PACK_VERSION}; {}; format {precision:?}; calibration {calib}{gptq}",
        source_fingerprint(source)?
    ))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The cache file for a key in `dir`.
pub fn cache_file(dir: &Path, key: &str) -> PathBuf {
    let digest = Sha256::digest(key.as_bytes());
    dir.join(format!("{}.kwkpack", hex(&digest[..12])))
}

/// One cached tensor and where it belongs.
#[derive(Debug)]
struct CachedEntry {
    role: u8,
    layer: i64,
    payload: Payload,
}

#[derive(Debug)]
enum Payload {
    Tensor(QuantizedTensor),
    /// The channel-equalization factors the packed tensors were made with (first entry).
    Scales(ChannelScales),
}

/// Role code of the channel-scales entry.
const SCALES_ROLE: u8 = 254;

/// A bounds-checked reader over the file body.
struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| format!("truncated at byte {}", self.at))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> std::result::Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn bytes(&mut self) -> std::result::Result<Vec<u8>, String> {
        let n = self.u64()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    fn floats(&mut self) -> std::result::Result<Vec<f32>, String> {
        let n = self.u64()? as usize;
        let raw = self.take(n.checked_mul(4).ok_or("bad length")?)?;
        Ok(raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
    fn halves(&mut self) -> std::result::Result<Vec<f16>, String> {
        let n = self.u64()? as usize;
        let raw = self.take(n.checked_mul(2).ok_or("bad length")?)?;
        Ok(raw
            .chunks_exact(2)
            .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
            .collect())
    }
}

/// Reads the factors of `n_layers` layers: per layer the attention-input, v→o and
/// feed-forward-input vectors, then a count of MLPs and one vector each.
fn read_scales(c: &mut Cursor, n_layers: usize) -> std::result::Result<ChannelScales, String> {
    let mut layers = Vec::new();
    for _ in 0..n_layers {
        let (attn_in, v_to_o, ffn_in) = (c.floats()?, c.floats()?, c.floats()?);
        let n = c.u64()? as usize;
        if n > c.buf.len() {
            return Err("bad MLP count".into());
        }
        let up_to_down = (0..n)
            .map(|_| c.floats())
            .collect::<std::result::Result<_, _>>()?;
        layers.push(LayerScales {
            attn_in,
            v_to_o,
            ffn_in,
            up_to_down,
        });
    }
    Ok(ChannelScales { layers })
}

/// Reads and validates a cache file; `Err` says why it cannot be trusted.
fn read_cache(path: &Path, key: &str) -> std::result::Result<Vec<CachedEntry>, String> {
    let mut buf = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut buf))
        .map_err(|e| format!("cannot read: {e}"))?;
    if buf.len() < MAGIC.len() + 8 + TRAILER_LEN || &buf[..8] != MAGIC {
        return Err("not a kwk pack file (bad magic or too short)".into());
    }
    let body_len = buf.len() - TRAILER_LEN;
    let (body, trailer) = buf.split_at(body_len);
    if &trailer[..8] != TRAILER_MAGIC {
        return Err("bad trailer (file truncated or overwritten)".into());
    }
    let n_entries = u64::from_le_bytes(trailer[8..16].try_into().unwrap());
    let recorded_len = u64::from_le_bytes(trailer[16..24].try_into().unwrap());
    if recorded_len != body_len as u64 {
        return Err(format!(
            "length {body_len} differs from the recorded {recorded_len}"
        ));
    }
    if Sha256::digest(body).as_slice() != &trailer[24..56] {
        return Err("checksum mismatch".into());
    }
    let mut c = Cursor { buf: body, at: 8 };
    let version = c.u32()?;
    if version != PACK_VERSION {
        return Err(format!(
            "pack version {version}, this kwk writes {PACK_VERSION}"
        ));
    }
    let key_len = c.u32()? as usize;
    if c.take(key_len)? != key.as_bytes() {
        return Err("written for another model, format or kwk version (key differs)".into());
    }
    let mut entries = Vec::new();
    for i in 0..n_entries {
        let role = c.u8()?;
        let layer = c.u64()? as i64;
        let kind = c.u8()?;
        let bits = c.u8()? as u32;
        let group_size = c.u32()? as usize;
        let rows = c.u64()? as usize;
        let cols = c.u64()? as usize;
        if kind == 2 {
            let scales = read_scales(&mut c, rows).map_err(|e| format!("entry {i}: {e}"))?;
            entries.push(CachedEntry {
                role,
                layer,
                payload: Payload::Scales(scales),
            });
            continue;
        }
        let tensor = match kind {
            0 => {
                let (qs, scales) = (c.bytes()?, c.halves()?);
                Int8Weights::from_parts(rows, cols, qs, scales).map(QuantizedTensor::Int8)
            }
            1 => {
                let (nib, hb, sc, mn) = (c.bytes()?, c.bytes()?, c.halves()?, c.halves()?);
                LowBitWeights::from_parts(bits, group_size, rows, cols, nib, hb, sc, mn)
                    .map(QuantizedTensor::LowBit)
            }
            k => return Err(format!("entry {i}: unknown kind {k}")),
        };
        let tensor =
            tensor.ok_or_else(|| format!("entry {i}: array lengths do not fit {rows}x{cols}"))?;
        entries.push(CachedEntry {
            role,
            layer,
            payload: Payload::Tensor(tensor),
        });
    }
    if c.at != body.len() {
        return Err(format!(
            "{} unexpected bytes after the last entry",
            body.len() - c.at
        ));
    }
    Ok(entries)
}

/// Writes entries as they are packed, hashing on the way; renamed into place by `finish`.
struct CacheWriter {
    tmp: PathBuf,
    file: BufWriter<File>,
    hasher: Sha256,
    len: u64,
    n_entries: u64,
}

impl CacheWriter {
    fn create(path: &Path, key: &str) -> std::io::Result<CacheWriter> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = path.with_file_name(format!(".{name}.tmp.{}", std::process::id()));
        let file = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        let mut w = CacheWriter {
            tmp,
            file,
            hasher: Sha256::new(),
            len: 0,
            n_entries: 0,
        };
        w.put(MAGIC)?;
        w.put(&PACK_VERSION.to_le_bytes())?;
        w.put(&(key.len() as u32).to_le_bytes())?;
        w.put(key.as_bytes())?;
        Ok(w)
    }

    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.hasher.update(b);
        self.len += b.len() as u64;
        self.file.write_all(b)
    }

    fn put_bytes(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.put(&(b.len() as u64).to_le_bytes())?;
        self.put(b)
    }

    fn put_halves(&mut self, h: &[f16]) -> std::io::Result<()> {
        self.put(&(h.len() as u64).to_le_bytes())?;
        let raw: Vec<u8> = h.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
        self.put(&raw)
    }

    fn put_floats(&mut self, v: &[f32]) -> std::io::Result<()> {
        self.put(&(v.len() as u64).to_le_bytes())?;
        let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.put(&raw)
    }

    fn scales_entry(&mut self, scales: &ChannelScales) -> std::io::Result<()> {
        self.put(&[SCALES_ROLE])?;
        self.put(&(-1i64 as u64).to_le_bytes())?;
        self.put(&[2, 0])?;
        self.put(&0u32.to_le_bytes())?;
        self.put(&(scales.layers.len() as u64).to_le_bytes())?;
        self.put(&0u64.to_le_bytes())?;
        for l in &scales.layers {
            self.put_floats(&l.attn_in)?;
            self.put_floats(&l.v_to_o)?;
            self.put_floats(&l.ffn_in)?;
            self.put(&(l.up_to_down.len() as u64).to_le_bytes())?;
            for a in &l.up_to_down {
                self.put_floats(a)?;
            }
        }
        self.n_entries += 1;
        Ok(())
    }

    fn entry(&mut self, place: &TensorPlace, t: &QuantizedTensor) -> std::io::Result<()> {
        self.put(&[role_code(place.role)])?;
        self.put(&(place.layer.map_or(-1i64, |l| l as i64) as u64).to_le_bytes())?;
        match t {
            QuantizedTensor::Int8(w) => {
                self.put(&[0, 8])?;
                self.put(&0u32.to_le_bytes())?;
                self.put(&(w.rows() as u64).to_le_bytes())?;
                self.put(&(w.cols() as u64).to_le_bytes())?;
                self.put_bytes(w.codes())?;
                self.put_halves(w.scales())?;
            }
            QuantizedTensor::LowBit(w) => {
                self.put(&[1, w.bits() as u8])?;
                self.put(&(w.group_size() as u32).to_le_bytes())?;
                self.put(&(w.rows() as u64).to_le_bytes())?;
                self.put(&(w.cols() as u64).to_le_bytes())?;
                let (nib, hb, sc, mn) = w.parts();
                self.put_bytes(nib)?;
                self.put_bytes(hb)?;
                self.put_halves(sc)?;
                self.put_halves(mn)?;
            }
        }
        self.n_entries += 1;
        Ok(())
    }

    fn finish(mut self, path: &Path) -> std::io::Result<()> {
        let digest = std::mem::take(&mut self.hasher).finalize();
        let mut trailer = Vec::with_capacity(TRAILER_LEN);
        trailer.extend_from_slice(TRAILER_MAGIC);
        trailer.extend_from_slice(&self.n_entries.to_le_bytes());
        trailer.extend_from_slice(&self.len.to_le_bytes());
        trailer.extend_from_slice(&digest);
        self.file.write_all(&trailer)?;
        let file = self.file.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&self.tmp, path)
    }
}

/// How a decoder's weights were obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PackOutcome {
    /// No cache folder was given.
    NoCache,
    /// Every tensor came from this cache file.
    Loaded(PathBuf),
    /// Tensors were quantized and the cache file written.
    Written(PathBuf),
    /// Tensors were quantized; the cache could not be used or written (why).
    NotWritten(String),
}

/// Packs a decoder's quantized weights through the cache (see the module doc).
pub struct PackSession {
    precision: Precision,
    path: Option<PathBuf>,
    cached: Option<std::vec::IntoIter<CachedEntry>>,
    writer: Option<CacheWriter>,
    /// Set when the cache had to be abandoned mid-way (written nothing).
    abandoned: Option<String>,
}

impl PackSession {
    /// Opens the cache for `source` (the model's file or folder) in `precision` (int8 or
    /// int4); `cache_dir = None` packs without a cache. A cache file that cannot be trusted
    /// is reported on stderr and rewritten.
    pub fn open(
        cache_dir: Option<&Path>,
        source: &Path,
        precision: &Precision,
        calibration: Option<&[u32]>,
    ) -> PackSession {
        let mut s = PackSession {
            precision: *precision,
            path: None,
            cached: None,
            writer: None,
            abandoned: None,
        };
        let Some(dir) = cache_dir else { return s };
        let key = match cache_key(source, precision, calibration) {
            Ok(k) => k,
            Err(e) => {
                s.abandoned = Some(format!("cannot fingerprint the model: {e}"));
                return s;
            }
        };
        let path = cache_file(dir, &key);
        if path.exists() {
            match read_cache(&path, &key) {
                Ok(entries) => {
                    s.cached = Some(entries.into_iter());
                    s.path = Some(path);
                    return s;
                }
                Err(why) => eprintln!(
                    "warning: pack cache {}: {why}; ignoring it and packing again (it will be rewritten)",
                    path.display()
                ),
            }
        }
        match CacheWriter::create(&path, &key) {
            Ok(w) => s.writer = Some(w),
            Err(e) => s.abandoned = Some(format!("cannot write {}: {e}", path.display())),
        }
        s.path = Some(path);
        s
    }

    /// The channel-equalization factors stored first in the cache file being read; `None`
    /// when writing, or when the file holds none (it is then abandoned and everything is
    /// packed again).
    pub fn take_scales(&mut self) -> Option<ChannelScales> {
        let entries = self.cached.as_mut()?;
        match entries.next() {
            Some(CachedEntry {
                payload: Payload::Scales(s),
                ..
            }) => Some(s),
            _ => {
                let why = format!(
                    "{}: no channel scales where the first entry should be",
                    self.path
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                );
                eprintln!("warning: pack cache {why}; packing again");
                self.cached = None;
                self.abandoned = Some(why);
                None
            }
        }
    }

    /// Records the channel-equalization factors (the first entry of a file being written).
    pub fn put_scales(&mut self, scales: &ChannelScales) {
        if let Some(w) = self.writer.as_mut() {
            if let Err(e) = w.scales_entry(scales) {
                self.abandoned = Some(format!("writing the pack cache: {e}"));
                self.writer = None;
            }
        }
    }

    /// Whether weights are being read from the cache.
    pub fn is_loading(&self) -> bool {
        self.cached.is_some()
    }

    /// The packed form of `tensor` at `place`: the next cached entry when loading, else
    /// quantized now (and appended to the cache being written).
    pub fn pack(
        &mut self,
        tensor: &Tensor,
        place: TensorPlace,
        importance: Option<&[f32]>,
    ) -> Result<Box<dyn PackedLinear>> {
        self.pack_on(tensor, place, None, importance)
    }

    /// [`PackSession::pack`] on `grid` when given (else the mix rule's grid for `place`).
    pub fn pack_on(
        &mut self,
        tensor: &Tensor,
        place: TensorPlace,
        grid: Option<Grid>,
        importance: Option<&[f32]>,
    ) -> Result<Box<dyn PackedLinear>> {
        let precision = self.precision;
        self.pack_with(tensor, place, || {
            quantize_on(tensor, &precision, place, grid, importance)
        })
    }

    /// The packed form of `tensor` at `place`: the next cached entry when loading, else
    /// `make()` (quantized by the caller, e.g. with GPTQ), appended to the cache being
    /// written.
    pub fn pack_with(
        &mut self,
        tensor: &Tensor,
        place: TensorPlace,
        make: impl FnOnce() -> Result<QuantizedTensor>,
    ) -> Result<Box<dyn PackedLinear>> {
        if let Some(entries) = self.cached.as_mut() {
            let next = entries.next();
            let layer = place.layer.map_or(-1, |l| l as i64);
            match next {
                Some(CachedEntry {
                    role,
                    layer: l,
                    payload: Payload::Tensor(t),
                }) if role == role_code(place.role)
                    && l == layer
                    && t.rows() == tensor.rows()
                    && t.cols() == tensor.cols() =>
                {
                    return Ok(t.into_packed());
                }
                _ => {
                    let why = format!(
                        "{}: entry does not match the {:?} weight of layer {:?}",
                        self.path
                            .as_ref()
                            .map(|p| p.display().to_string())
                            .unwrap_or_default(),
                        place.role,
                        place.layer
                    );
                    eprintln!("warning: pack cache {why}; packing the remaining weights again");
                    self.cached = None;
                    self.abandoned = Some(why);
                }
            }
        }
        let t = make()?;
        if let Some(w) = self.writer.as_mut() {
            if let Err(e) = w.entry(&place, &t) {
                self.abandoned = Some(format!("writing the pack cache: {e}"));
                self.writer = None;
            }
        }
        Ok(t.into_packed())
    }

    /// Ends the session: writes the cache file after a miss.
    pub fn finish(mut self) -> PackOutcome {
        if let Some(why) = self.abandoned.take() {
            if let Some(w) = self.writer.take() {
                let _ = std::fs::remove_file(&w.tmp);
            }
            return PackOutcome::NotWritten(why);
        }
        let Some(path) = self.path.take() else {
            return PackOutcome::NoCache;
        };
        if let Some(entries) = self.cached.as_mut() {
            if entries.next().is_some() {
                eprintln!(
                    "warning: pack cache {} holds more tensors than the model; it will be rewritten next time",
                    path.display()
                );
                let _ = std::fs::remove_file(&path);
                return PackOutcome::NotWritten("cache held extra tensors".into());
            }
            return PackOutcome::Loaded(path);
        }
        match self.writer.take() {
            Some(w) => {
                let tmp = w.tmp.clone();
                match w.finish(&path) {
                    Ok(()) => PackOutcome::Written(path),
                    Err(e) => {
                        let _ = std::fs::remove_file(tmp);
                        PackOutcome::NotWritten(format!("writing {}: {e}", path.display()))
                    }
                }
            }
            None => PackOutcome::NotWritten("no writer".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decoder::Int4Options;

    fn tensors() -> Vec<(Tensor, TensorPlace)> {
        let place = |role, layer| TensorPlace {
            role,
            layer,
            n_layers: 2,
            model_params: 1000,
        };
        let t = |rows: usize, cols: usize, seed: usize| {
            Tensor::new(
                vec![rows, cols],
                (0..rows * cols)
                    .map(|i| (((i * 31 + seed) % 97) as f32 - 48.0) * 0.001)
                    .collect(),
            )
        };
        vec![
            (t(40, 64, 1), place(TensorRole::LmHead, None)),
            (t(17, 64, 2), place(TensorRole::AttnQ, Some(0))),
            (t(32, 96, 3), place(TensorRole::FfnDown, Some(0))),
            (t(16, 128, 4), place(TensorRole::FfnUp, Some(1))),
        ]
    }

    fn pack_all(
        dir: &Path,
        source: &Path,
        p: &Precision,
    ) -> (Vec<Box<dyn PackedLinear>>, PackOutcome) {
        let mut s = PackSession::open(Some(dir), source, p, None);
        let out = tensors()
            .iter()
            .map(|(t, pl)| s.pack(t, *pl, None).unwrap())
            .collect();
        (out, s.finish())
    }

    fn same(a: &[Box<dyn PackedLinear>], b: &[Box<dyn PackedLinear>]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert_eq!(
                (x.rows(), x.cols(), x.bytes()),
                (y.rows(), y.cols(), y.bytes())
            );
            let (mut rx, mut ry) = (vec![0f32; x.cols()], vec![0f32; y.cols()]);
            for r in 0..x.rows() {
                x.dequantize_row(r, &mut rx);
                y.dequantize_row(r, &mut ry);
                assert_eq!(rx, ry);
            }
        }
    }

    #[test]
    fn round_trip_then_corruption_is_detected_and_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("model.gguf");
        std::fs::write(&source, b"weights").unwrap();
        let cache = dir.path().join("cache");
        let p = Precision::Int4(Int4Options {
            group_size: 32,
            mix_bits: None,
            calibrate: false,
            gptq: false,
        });
        let (first, o1) = pack_all(&cache, &source, &p);
        let PackOutcome::Written(path) = o1 else {
            panic!("{o1:?}")
        };
        let (second, o2) = pack_all(&cache, &source, &p);
        assert_eq!(o2, PackOutcome::Loaded(path.clone()));
        same(&first, &second);

        // Flip one byte in the body: checksum mismatch, ignored, rewritten.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[100] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let (third, o3) = pack_all(&cache, &source, &p);
        assert_eq!(o3, PackOutcome::Written(path.clone()));
        same(&first, &third);
        // Truncated file: also rewritten.
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        assert_eq!(
            pack_all(&cache, &source, &p).1,
            PackOutcome::Written(path.clone())
        );
        assert_eq!(
            pack_all(&cache, &source, &p).1,
            PackOutcome::Loaded(path.clone())
        );
        // No temporary files left behind.
        let names: Vec<_> = std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn key_changes_with_format_and_model_file() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("model.gguf");
        std::fs::write(&source, b"weights").unwrap();
        let a = cache_key(&source, &Precision::Int8, None).unwrap();
        let b = cache_key(
            &source,
            &Precision::Int4(Int4Options {
                group_size: 64,
                mix_bits: None,
                calibrate: false,
                gptq: false,
            }),
            None,
        )
        .unwrap();
        let c = cache_key(&source, &Precision::Int8, Some(&[1, 2, 3])).unwrap();
        std::fs::write(&source, b"other weights").unwrap();
        let d = cache_key(&source, &Precision::Int8, None).unwrap();
        let keys = [&a, &b, &c, &d];
        for i in 0..4 {
            for j in i + 1..4 {
                assert_ne!(keys[i], keys[j]);
            }
        }
        // A file written under one key is refused under another.
        let cache = dir.path().join("cache");
        let (_, o) = pack_all(&cache, &source, &Precision::Int8);
        let PackOutcome::Written(path) = o else {
            panic!()
        };
        assert!(read_cache(&path, &a).unwrap_err().contains("key differs"));
    }
}

//! The pack cache's sessions: a warm start ([`try_load`]: open, check, heal a stale
//! identity, map a recipe's section) and a cold one ([`PackSession`]: the model's lock,
//! reuse of unchanged tensors, writing, finishing and the limit after it).

use super::dir::{cache_file_migrated, ensure_dir, limit_bytes, lock_path, prune};
use super::file::{rewrite, Finished, Index, PackFile, Section, TensorEntry, Writer};
use super::key::{content_hashes, dep_key, recipe_key, source_identity, SourceIdentity};
use super::PACK_VERSION;
use crate::error::{KwkError, Result};
use crate::format::quantized::{quantize_on, Grid, QuantizedTensor};
use crate::format::Precision;
use crate::format::{PackedLinear, TensorPlace};
use crate::model::Tensor;
use rayon::prelude::*;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

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
pub(super) fn enforce_limit_after_hit(path: &Path, limit: u64) -> Option<(u64, u64)> {
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
pub(super) fn discard(path: &Path, why: &str) {
    crate::notices::warn(format!(
        "pack cache {}: {why}; deleting it (it is written again by this run)",
        path.display()
    ));
    let _ = std::fs::remove_file(path);
}

/// Sets the file's mtime to now: the last use the eviction order reads.
pub(super) fn touch(path: &Path) {
    if let Ok(f) = File::options().append(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// Opens and checks the cache file of `id`, refreshing a stale identity when the contents
/// hash the same. `Ok(None)`: no usable file.
pub(super) fn open_checked(path: &Path, id: &SourceIdentity) -> Result<Option<PackFile>> {
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
        Err(e) => crate::notices::warn(format!(
            "pack cache {}: could not record the model's new file times: {e}",
            path.display()
        )),
    }
    Ok(PackFile::open(path).ok())
}

/// Loads every entry of a section, CRC-checked; `Err` names the bad one.
pub(super) fn load_section(
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

/// One tensor for [`PackSession::pack_with`]: stored as `name`, quantized for `place` on
/// `grid` (or the mix rule's) in `precision`, its rounding weighted by `importance`.
pub struct TensorToPack<'a> {
    pub name: &'a str,
    pub tensor: &'a Tensor,
    pub place: TensorPlace,
    pub grid: Option<Grid>,
    pub importance: Option<&'a [f32]>,
    pub precision: &'a Precision,
}

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
        let t = TensorToPack {
            name,
            tensor,
            place,
            grid,
            importance,
            precision,
        };
        self.pack_with(t, None)
    }

    /// [`PackSession::pack`], or, when `made` is given (a tensor the caller quantized,
    /// e.g. with GPTQ, whose bytes depend on more than its key holds: the Hessian of its
    /// input), that tensor, written as is and never reused from an older file.
    pub fn pack_with(
        &mut self,
        t: TensorToPack<'_>,
        made: Option<QuantizedTensor>,
    ) -> Result<Box<dyn PackedLinear>> {
        let TensorToPack {
            name,
            tensor,
            place,
            grid,
            importance,
            precision,
        } = t;
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
                crate::notices::warn(format!("pack cache {}: {e}", dir.display()));
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

//! The pack cache's folder: which files are kwk's (its naming scheme, older packs proven by
//! their magic), the marker, the size limit, and listing, sweeping and pruning (LRU).

use super::file::{PackFile, MAGIC};
use super::key::{cache_file, is_memory_source, SourceIdentity};
use super::{DEFAULT_LIMIT_GB, MARKER, PREFIX};
use crate::error::{KwkError, Result};
use serde::Serialize;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Hex digits of a cache file's name (12 bytes of SHA-256).
pub(super) const NAME_HEX: usize = 24;
/// The lock file of a cache file.
pub(super) fn lock_path(path: &Path) -> PathBuf {
    path.with_extension("lock")
}

/// The cache file of a source in `dir`; a pack of the older naming scheme (`HEX.kwkpack`,
/// proven kwk's by its magic) is renamed to the new name first.
pub(super) fn cache_file_migrated(dir: &Path, id: &SourceIdentity) -> PathBuf {
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
pub(super) enum FileKind {
    Marker,
    Pack { old: bool },
    Lock { old: bool },
    Temporary { old: bool, pid: Option<u32> },
}

pub(super) fn is_hex_name(s: &str) -> bool {
    s.len() == NAME_HEX
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `kwk-pack-HEX.kwkpack` / `kwk-pack-HEX.lock` / `.kwk-pack-HEX.kwkpack.tmp.PID.N`, or the
/// same without `kwk-pack-` (the older scheme); anything else is not kwk's.
pub(super) fn file_kind(name: &str) -> Option<FileKind> {
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

pub(super) fn starts_with_magic(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 8];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| &head == MAGIC)
}

pub(super) fn is_empty_file(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file() && m.len() == 0)
}

impl FileKind {
    /// Whether the file at `path` of this kind is kwk's: always for the current scheme
    /// (regular files only); for the older one, a pack must start with the magic, a lock
    /// must be empty, a temporary must be either.
    pub(super) fn proven(self, path: &Path) -> bool {
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
pub(super) fn ensure_dir(dir: &Path) -> std::io::Result<()> {
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
pub(super) fn foreign_files(dir: &Path) -> std::io::Result<Vec<String>> {
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

/// The size limit from `KWK_PACK_CACHE_GB` (default [`DEFAULT_LIMIT_GB`]); an unreadable
/// value is reported and the default used.
pub fn limit_bytes() -> u64 {
    let gb = match std::env::var("KWK_PACK_CACHE_GB") {
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(x) if x >= 0.0 && x.is_finite() => x,
            _ => {
                crate::notices::warn(format!(
                    "KWK_PACK_CACHE_GB='{v}' is not a number of GB; using {DEFAULT_LIMIT_GB}"
                ));
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

pub(super) fn pid_alive(pid: u32) -> bool {
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

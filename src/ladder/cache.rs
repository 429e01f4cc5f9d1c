//! The folder of GGUFs (and importance matrices) the ladder made: `ROOT/gguf`, ROOT being
//! the kwk cache root (docs/paths.md). One file per key, named `kwk-gguf-HEX.gguf` (or
//! `.imatrix`), beside its record `kwk-gguf-HEX.json` (what it was made from, by which tool,
//! how long it took, its size). A key is the SHA-256 of everything that decides the bytes:
//! the source's content, the tool's own files, the type and the importance matrix's key
//! ([`key`]), so a changed source, tool or calibration text makes new files and a second run
//! reuses the old ones.
//!
//! Files are made under a hidden temporary name and renamed into place, the record written
//! last: an entry counts only when both exist and the file has the size the record states,
//! so a run killed while making a file leaves nothing that looks finished. Each use touches
//! the record (its modification time is the last use), and [`prune`] evicts the least
//! recently used entries; the made GGUFs count towards the same size limit as the pack cache
//! (`kwk-eval cache`).

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The name every file of this folder starts with.
const PREFIX: &str = "kwk-gguf-";
/// Hex digits of a key in a file name (12 bytes of SHA-256).
const NAME_HEX: usize = 24;
/// The folder's marker, so `cache clear` knows it is kwk's.
const MARKER: &str = "KWK_GGUF_CACHE";

/// The key of a made file: SHA-256 over the named parts, in order.
pub fn key(parts: &[(&str, &str)]) -> String {
    let mut text = String::from("kwk-ladder-v1\n");
    for (k, v) in parts {
        text.push_str(k);
        text.push('=');
        text.push_str(v);
        text.push('\n');
    }
    crate::digest::sha256_hex(text.as_bytes())
}

/// What a cached file is and how it was made (the `.json` beside it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// `gguf` or `imatrix`.
    pub kind: String,
    /// The llama.cpp type (`Q4_K_M`, `F32`), or the calibration text's name for an imatrix.
    pub what: String,
    /// The inputs the key was made of, for a person reading the folder.
    pub inputs: Vec<(String, String)>,
    /// Bytes of the file.
    pub bytes: u64,
    /// Seconds making it took.
    pub make_s: f64,
    /// UTC time it was made.
    pub made_utc: String,
    /// The tool's log, as much as a person needs (fallback lines included).
    pub log: String,
}

/// A cached file and its record.
#[derive(Debug, Clone)]
pub struct Entry {
    pub path: PathBuf,
    pub record: Record,
}

/// The made-GGUF folder.
#[derive(Debug, Clone)]
pub struct GgufCache {
    dir: PathBuf,
}

fn stem(key: &str) -> String {
    format!("{PREFIX}{}", &key[..NAME_HEX.min(key.len())])
}

impl GgufCache {
    /// The folder (created with its marker when missing).
    pub fn open(dir: &Path) -> Result<GgufCache> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the GGUF cache folder '{}'", dir.display()))?;
        let marker = dir.join(MARKER);
        if !marker.exists() {
            std::fs::write(
                &marker,
                "This folder holds the GGUFs kwk-eval's ladder made (kwk-eval cache list | prune | clear).\n\
                 kwk writes and deletes only files named kwk-gguf-* here.\n",
            )
            .with_context(|| format!("writing '{}'", marker.display()))?;
        }
        Ok(GgufCache {
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn record_path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{}.json", stem(key)))
    }

    fn file_path(&self, key: &str, ext: &str) -> PathBuf {
        self.dir.join(format!("{}.{ext}", stem(key)))
    }

    /// The entry of `key`, if it is complete (file present with the recorded size); its use
    /// is recorded (the record's time is touched).
    pub fn lookup(&self, key: &str, ext: &str) -> Option<Entry> {
        let path = self.file_path(key, ext);
        let rec_path = self.record_path(key);
        let record: Record = serde_json::from_slice(&std::fs::read(&rec_path).ok()?).ok()?;
        let len = std::fs::metadata(&path).ok()?.len();
        if len != record.bytes {
            return None;
        }
        touch(&rec_path);
        Some(Entry { path, record })
    }

    /// Makes the file of `key`: `make` writes it at the path it is given (a temporary
    /// name) and returns the record's fields but `bytes`; it is renamed into place and the
    /// record written. A failed `make` leaves nothing behind.
    pub fn store(
        &self,
        key: &str,
        ext: &str,
        make: impl FnOnce(&Path) -> Result<Record>,
    ) -> Result<Entry> {
        let path = self.file_path(key, ext);
        let tmp = self
            .dir
            .join(format!(".{}.{ext}.tmp.{}", stem(key), std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let made = make(&tmp);
        let mut record = match made {
            Ok(r) => r,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let bytes = match std::fs::metadata(&tmp) {
            Ok(m) => m.len(),
            Err(e) => {
                bail!("the made file '{}' is missing: {e}", tmp.display())
            }
        };
        record.bytes = bytes;
        // The record goes last: until it exists the entry does not count.
        let rec_path = self.record_path(key);
        let _ = std::fs::remove_file(&rec_path);
        std::fs::rename(&tmp, &path).with_context(|| {
            let _ = std::fs::remove_file(&tmp);
            format!("moving the made file into '{}'", path.display())
        })?;
        let rec_tmp = self
            .dir
            .join(format!(".{}.json.tmp.{}", stem(key), std::process::id()));
        std::fs::write(&rec_tmp, serde_json::to_vec_pretty(&record)?)
            .and_then(|()| std::fs::rename(&rec_tmp, &rec_path))
            .with_context(|| {
                let _ = std::fs::remove_file(&rec_tmp);
                format!("writing '{}'", rec_path.display())
            })?;
        Ok(Entry { path, record })
    }
}

/// Marks a file used now (its modification time).
fn touch(path: &Path) {
    if let Ok(f) = std::fs::File::options().append(true).open(path) {
        let _ = f.set_modified(std::time::SystemTime::now());
    }
}

/// One entry of the folder, for `cache list`.
#[derive(Debug, Clone)]
pub struct Listed {
    pub path: PathBuf,
    pub record: Option<Record>,
    /// Bytes of the file and its record.
    pub bytes: u64,
    pub last_use_unix: u64,
}

fn is_ours(name: &str) -> bool {
    let rest = name.strip_prefix('.').unwrap_or(name);
    rest.starts_with(PREFIX)
}

fn unix(t: std::io::Result<std::time::SystemTime>) -> u64 {
    t.ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs())
}

/// The entries of `dir` (a missing folder has none): one per record or orphaned file.
pub fn list(dir: &Path) -> Result<Vec<Listed>> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut by_stem: std::collections::BTreeMap<String, Listed> = Default::default();
    for e in read {
        let e = e.with_context(|| format!("listing '{}'", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !is_ours(&name) || name.starts_with('.') {
            continue;
        }
        let Some((st, ext)) = name.split_once('.') else {
            continue;
        };
        let meta = e.metadata()?;
        let item = by_stem.entry(st.to_string()).or_insert_with(|| Listed {
            path: e.path(),
            record: None,
            bytes: 0,
            last_use_unix: 0,
        });
        item.bytes += meta.len();
        if ext == "json" {
            item.record = std::fs::read(e.path())
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            item.last_use_unix = item.last_use_unix.max(unix(meta.modified()));
        } else {
            item.path = e.path();
        }
    }
    let mut out: Vec<Listed> = by_stem.into_values().collect();
    out.sort_by_key(|l| std::cmp::Reverse(l.last_use_unix));
    Ok(out)
}

/// Bytes of every kwk file in `dir`.
pub fn total_bytes(dir: &Path) -> u64 {
    list(dir).map_or(0, |l| l.iter().map(|x| x.bytes).sum())
}

/// What [`prune`] removed.
#[derive(Debug, Clone, Default)]
pub struct Pruned {
    pub temporary: usize,
    pub evicted: Vec<PathBuf>,
    pub bytes_left: u64,
}

fn remove_stem(dir: &Path, stem: &str) {
    for ext in ["json", "gguf", "imatrix"] {
        let _ = std::fs::remove_file(dir.join(format!("{stem}.{ext}")));
    }
}

/// Removes temporaries of processes no longer running, entries without a complete file,
/// then the least recently used entries until the folder holds at most `limit` bytes;
/// `keep` (files this run uses) are never evicted.
pub fn prune(dir: &Path, limit: u64, keep: &[PathBuf]) -> Result<Pruned> {
    let mut out = Pruned::default();
    if let Ok(read) = std::fs::read_dir(dir) {
        for e in read.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix('.') else {
                continue;
            };
            if !rest.starts_with(PREFIX) {
                continue;
            }
            let pid = rest.rsplit('.').next().and_then(|p| p.parse::<u32>().ok());
            let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
            if !alive {
                let _ = std::fs::remove_file(e.path());
                out.temporary += 1;
            }
        }
    }
    let mut entries = list(dir)?;
    // Oldest use first.
    entries.sort_by_key(|l| l.last_use_unix);
    let mut total: u64 = entries.iter().map(|l| l.bytes).sum();
    for l in &entries {
        let stem = l
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .and_then(|n| n.split_once('.').map(|(s, _)| s.to_string()))
            .unwrap_or_default();
        let complete = l.record.as_ref().is_some_and(|r| {
            std::fs::metadata(&l.path).is_ok_and(|m| m.len() == r.bytes)
                && l.path.extension().is_none_or(|x| x != "json")
        });
        let kept = keep.iter().any(|k| k == &l.path);
        if kept {
            continue;
        }
        if !complete || total > limit {
            remove_stem(dir, &stem);
            total = total.saturating_sub(l.bytes);
            out.evicted.push(l.path.clone());
        }
    }
    out.bytes_left = total;
    Ok(out)
}

/// Deletes every kwk file of `dir` (and its marker); returns how many.
pub fn clear(dir: &Path) -> Result<usize> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Ok(0);
    };
    let mut n = 0;
    for e in read.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if is_ours(&name) || name == MARKER {
            std::fs::remove_file(e.path())
                .with_context(|| format!("deleting '{}'", e.path().display()))?;
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(what: &str) -> Record {
        Record {
            kind: "gguf".into(),
            what: what.into(),
            inputs: vec![("type".into(), what.into())],
            bytes: 0,
            make_s: 1.0,
            made_utc: "2026-12-06T00:00:00Z".into(),
            log: String::new(),
        }
    }

    #[test]
    fn a_key_changes_with_every_input() {
        let a = key(&[("source", "aa"), ("type", "Q4_K_M"), ("imatrix", "none")]);
        assert_eq!(
            a,
            key(&[("source", "aa"), ("type", "Q4_K_M"), ("imatrix", "none")])
        );
        assert_ne!(
            a,
            key(&[("source", "ab"), ("type", "Q4_K_M"), ("imatrix", "none")])
        );
        assert_ne!(
            a,
            key(&[("source", "aa"), ("type", "Q4_K_M"), ("imatrix", "x1")])
        );
        assert_ne!(
            a,
            key(&[("source", "aa"), ("type", "Q4_K_S"), ("imatrix", "none")])
        );
    }

    #[test]
    fn stored_files_are_found_again_and_failed_ones_leave_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let c = GgufCache::open(tmp.path()).unwrap();
        let k = key(&[("type", "Q8_0")]);
        assert!(c.lookup(&k, "gguf").is_none());
        let e = c
            .store(&k, "gguf", |p| {
                std::fs::write(p, b"GGUF1234").unwrap();
                Ok(record("Q8_0"))
            })
            .unwrap();
        assert_eq!(e.record.bytes, 8);
        let again = c.lookup(&k, "gguf").unwrap();
        assert_eq!(again.path, e.path);
        // A failure while making: no file, no record, no temporary.
        let k2 = key(&[("type", "Q2_K")]);
        let r = c.store(&k2, "gguf", |p| {
            std::fs::write(p, b"half").unwrap();
            bail!("llama-quantize failed")
        });
        assert!(r.is_err());
        assert!(c.lookup(&k2, "gguf").is_none());
        let names: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 3, "{names:?}"); // marker, the Q8_0 file, its record
                                                 // A file whose size differs from its record does not count.
        std::fs::write(&e.path, b"GGUF12").unwrap();
        assert!(c.lookup(&k, "gguf").is_none());
    }

    #[test]
    fn prune_evicts_the_least_recently_used_but_keeps_what_the_run_uses() {
        let tmp = tempfile::tempdir().unwrap();
        let c = GgufCache::open(tmp.path()).unwrap();
        let mut paths = Vec::new();
        for (i, t) in ["A", "B", "C"].iter().enumerate() {
            let k = key(&[("type", t)]);
            let e = c
                .store(&k, "gguf", |p| {
                    std::fs::write(p, vec![0u8; 1000]).unwrap();
                    Ok(record(t))
                })
                .unwrap();
            let rec = tmp.path().join(format!("{}.json", stem(&k)));
            let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1000 + i as u64);
            std::fs::File::options()
                .append(true)
                .open(&rec)
                .unwrap()
                .set_modified(when)
                .unwrap();
            paths.push(e.path);
        }
        assert_eq!(list(tmp.path()).unwrap().len(), 3);
        // Room for about two entries; A is the oldest but kept, so B goes.
        let total = total_bytes(tmp.path());
        let r = prune(tmp.path(), total * 2 / 3 + 1, &paths[..1]).unwrap();
        assert_eq!(r.evicted, vec![paths[1].clone()]);
        assert!(paths[0].exists() && !paths[1].exists() && paths[2].exists());
        assert_eq!(clear(tmp.path()).unwrap(), 5); // two files, two records, the marker
    }
}

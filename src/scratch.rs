//! Files a run creates for itself in a folder it shares with the user (the run folder):
//! temporaries before their rename, a tool's own log-probs, the private copy of `--text`.
//! Each is created with an exclusive create (`O_CREAT|O_EXCL`, [`OpenOptions::create_new`])
//! under a name no one else uses: a kwk prefix, the process id, a per-process counter, a
//! random suffix, and the purpose (bounded, see [`bounded_name`]). A name that exists
//! already is never opened, truncated or removed: the next name is tried. A [`Scratch`]
//! removes its file when dropped unless it was [`Scratch::persist`]ed or
//! [`Scratch::keep`]t, so a run deletes only what it created itself.

use anyhow::{bail, Context, Result};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The prefix of every file name [`Scratch`] makes.
pub const PREFIX: &str = ".kwk-tmp";

/// Longest file name (in bytes) kwk derives from a user's name (a GGUF file name, a row
/// label): well under the 255 bytes most file systems allow, leaving room for the prefix.
pub const MAX_DERIVED_NAME_BYTES: usize = 120;

/// `name` when it has at most `max` bytes; otherwise its longest prefix that ends on a
/// char boundary and leaves room for `~` and 12 hex digits of its SHA-256, so two long names
/// that differ only at the end stay distinct.
pub fn bounded_name(name: &str, max: usize) -> String {
    if name.len() <= max {
        return name.to_string();
    }
    let hash = &crate::digest::sha256_hex(name.as_bytes())[..12];
    let mut end = max.saturating_sub(hash.len() + 1);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}~{hash}", &name[..end])
}

/// A file name safe in any folder: ASCII letters, digits, `.`, `-` and `_` kept, anything
/// else `_`, bounded by [`bounded_name`] (a leading `.` is kept off).
pub fn file_safe(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    bounded_name(safe.trim_start_matches('.'), MAX_DERIVED_NAME_BYTES)
}

/// A random 64-bit value (std's per-process random hasher keys, mixed with the clock).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Files made by this process so far (part of every name).
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A file this process created in `dir`, removed when dropped unless persisted or kept.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
    file: Option<File>,
    owned: bool,
}

impl Scratch {
    /// Creates a new, empty file in `dir` named `.kwk-tmp-<pid>-<n>-<random>.<purpose>`
    /// (`purpose` made [`file_safe`], so its extension stays last: plotters picks the
    /// image encoding from it).
    pub fn create(dir: &Path, purpose: &str) -> Result<Scratch> {
        let purpose = file_safe(purpose);
        for _ in 0..100 {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let name = format!(
                "{PREFIX}-{}-{n}-{:016x}.{purpose}",
                std::process::id(),
                random_u64()
            );
            let path = dir.join(name);
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => {
                    return Ok(Scratch {
                        path,
                        file: Some(file),
                        owned: true,
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e).with_context(|| format!("creating '{}'", path.display())),
            }
        }
        bail!(
            "could not create a temporary file in '{}': 100 fresh names were all taken",
            dir.display()
        )
    }

    /// Creates exactly `path` (which must not exist yet): a file with a fixed name this run
    /// owns from now on and removes when dropped, unless kept.
    pub fn create_at(path: &Path) -> std::io::Result<Scratch> {
        let file = OpenOptions::new().write(true).create_new(true).open(path)?;
        Ok(Scratch {
            path: path.to_path_buf(),
            file: Some(file),
            owned: true,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open file (write access), until [`Scratch::close`].
    pub fn file(&mut self) -> Option<&mut File> {
        self.file.as_mut()
    }

    /// Closes the file (it stays on disk until the [`Scratch`] is dropped).
    pub fn close(&mut self) {
        self.file = None;
    }

    /// Renames the file to `to` (in the same folder); from then on it is not removed.
    pub fn persist(mut self, to: &Path) -> Result<()> {
        self.file = None;
        std::fs::rename(&self.path, to)
            .with_context(|| format!("renaming '{}' to '{}'", self.path.display(), to.display()))?;
        self.owned = false;
        Ok(())
    }

    /// Leaves the file where it is when dropped.
    pub fn keep(mut self) -> PathBuf {
        self.owned = false;
        std::mem::take(&mut self.path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.file = None;
        if self.owned {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_fresh_and_only_own_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let a = Scratch::create(dir.path(), "results.json").unwrap();
        let b = Scratch::create(dir.path(), "results.json").unwrap();
        assert_ne!(a.path(), b.path());
        let name = a.path().file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with(PREFIX) && name.ends_with(".results.json"),
            "{name}"
        );
        let (pa, pb) = (a.path().to_path_buf(), b.path().to_path_buf());
        drop(a);
        assert!(!pa.exists());
        b.persist(&dir.path().join("results.json")).unwrap();
        assert!(!pb.exists() && dir.path().join("results.json").exists());
        // A file that exists is never taken over.
        let theirs = dir.path().join("theirs.bin");
        std::fs::write(&theirs, "theirs").unwrap();
        let e = Scratch::create_at(&theirs).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "theirs");
        let kept = Scratch::create_at(&dir.path().join("mine.bin"))
            .unwrap()
            .keep();
        assert!(kept.exists());
    }

    #[test]
    fn long_names_are_bounded_at_a_char_boundary_and_stay_distinct() {
        let long_a = "ä".repeat(200) + "a.gguf";
        let long_b = "ä".repeat(200) + "b.gguf";
        let (a, b) = (bounded_name(&long_a, 100), bounded_name(&long_b, 100));
        assert!(a.len() <= 100 && b.len() <= 100, "{a}");
        assert_ne!(a, b);
        assert_eq!(bounded_name("short", 100), "short");
        let f = file_safe(&format!("gguf:{}", "模".repeat(100)));
        assert!(f.len() <= MAX_DERIVED_NAME_BYTES && f.is_ascii(), "{f}");
        let dir = tempfile::tempdir().unwrap();
        // A 300-byte purpose still makes a file name under 255 bytes.
        let s = Scratch::create(dir.path(), &"x".repeat(300)).unwrap();
        assert!(s.path().file_name().unwrap().len() < 255);
    }
}

//! The run folder a run owns: created (or, for the default `runs/<UTC timestamp>`, given a
//! fresh name atomically: `create_dir` fails on an existing folder, so two runs started in
//! the same second get `<stamp>` and `<stamp>-2`), locked for the whole run (an exclusive
//! `flock` on the folder itself, so a second run with the same `--out` stops at once
//! instead of interleaving its rows), and checked to hold none of the files the run writes
//! (it never overwrites or deletes a file it did not write). The lock is released when the
//! [`RunFolder`] is dropped or the process ends.

use crate::report::REPORT_FILES;
use anyhow::{bail, Context, Result};
use std::fs::File;
use std::path::{Path, PathBuf};

/// The name of the float32 reference's log-prob file in the run folder.
pub const REFERENCE_LOGITS: &str = "float32-kl-divergence-base.bin";

/// A run folder this process holds the lock of.
#[derive(Debug)]
pub struct RunFolder {
    pub path: PathBuf,
    /// Whether this run created the folder (it removes it again if it wrote nothing).
    pub created: bool,
    _lock: File,
}

impl RunFolder {
    /// `--out DIR`: created when missing, locked, and refused when it holds a report file
    /// or reference log-probs already.
    pub fn claim(dir: &Path) -> Result<RunFolder> {
        let created = !dir.exists();
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating --out '{}'", dir.display()))?;
        let lock = lock(dir)?;
        for name in REPORT_FILES.iter().copied().chain([REFERENCE_LOGITS]) {
            if dir.join(name).exists() {
                bail!(
                    "--out '{}' already holds {name}, which this run would overwrite; pass a new folder (or remove the old run)",
                    dir.display()
                );
            }
        }
        Ok(RunFolder {
            path: dir.to_path_buf(),
            created,
            _lock: lock,
        })
    }

    /// The default folder `parent/<stamp>`: the first of `<stamp>`, `<stamp>-2`, ... that
    /// this process creates itself (never one another run made).
    pub fn fresh(parent: &Path, stamp: &str) -> Result<RunFolder> {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating '{}'", parent.display()))?;
        for n in 1..=1000u32 {
            let name = if n == 1 {
                stamp.to_string()
            } else {
                format!("{stamp}-{n}")
            };
            let path = parent.join(name);
            match std::fs::create_dir(&path) {
                Ok(()) => {
                    let lock = lock(&path)?;
                    return Ok(RunFolder {
                        path,
                        created: true,
                        _lock: lock,
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e).with_context(|| format!("creating '{}'", path.display())),
            }
        }
        bail!(
            "'{}' holds 1000 run folders named {stamp}*; pass --out DIR",
            parent.display()
        )
    }

    /// Removes the folder when this run created it and it is still empty (a run that
    /// stopped before writing anything leaves nothing behind).
    pub fn remove_if_empty(&self) {
        if self.created {
            let _ = std::fs::remove_dir(&self.path);
        }
    }
}

/// An exclusive, non-blocking lock on `dir` itself.
fn lock(dir: &Path) -> Result<File> {
    let f = File::open(dir).with_context(|| format!("opening --out '{}'", dir.display()))?;
    #[cfg(unix)]
    {
        use rustix::fs::{flock, FlockOperation};
        match flock(&f, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => bail!(
                "--out '{}' is in use by another kwk-eval run; wait for it or pass another folder",
                dir.display()
            ),
            Err(e) => {
                return Err(std::io::Error::from(e))
                    .with_context(|| format!("locking --out '{}'", dir.display()))
            }
        }
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_claim_of_a_held_folder_fails_and_succeeds_once_released() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let first = RunFolder::claim(&dir).unwrap();
        assert!(first.created);
        let e = format!("{:#}", RunFolder::claim(&dir).unwrap_err());
        assert!(e.contains("is in use by another kwk-eval run"), "{e}");
        drop(first);
        let again = RunFolder::claim(&dir).unwrap();
        assert!(!again.created);
    }

    #[test]
    fn a_folder_holding_a_report_file_is_refused_and_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        for name in ["report.md", "speed.svg", REFERENCE_LOGITS] {
            let dir = tmp.path().join(name.replace('.', "_"));
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join(name), "someone else's").unwrap();
            let e = format!("{:#}", RunFolder::claim(&dir).unwrap_err());
            assert!(e.contains(&format!("already holds {name}")), "{e}");
            assert_eq!(
                std::fs::read_to_string(dir.join(name)).unwrap(),
                "someone else's"
            );
        }
    }

    #[test]
    fn default_folders_of_the_same_second_get_fresh_names() {
        let tmp = tempfile::tempdir().unwrap();
        let a = RunFolder::fresh(tmp.path(), "20261201T000000Z").unwrap();
        let b = RunFolder::fresh(tmp.path(), "20261201T000000Z").unwrap();
        assert_eq!(a.path, tmp.path().join("20261201T000000Z"));
        assert_eq!(b.path, tmp.path().join("20261201T000000Z-2"));
        b.remove_if_empty();
        assert!(!b.path.exists());
    }
}

//! Writing report files so a reader never sees half of one, and no temporary file is left
//! when a write fails.

use anyhow::{Context, Result};
use std::path::Path;

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .with_context(|| format!("'{}' has no file name", path.display()))?;
    let tmp = path.with_file_name(format!(".{}.tmp", name.to_string_lossy()));
    let written = std::fs::write(&tmp, bytes)
        .with_context(|| format!("writing '{}'", path.display()))
        .and_then(|()| {
            std::fs::rename(&tmp, path)
                .with_context(|| format!("renaming '{}' to '{}'", tmp.display(), path.display()))
        });
    if written.is_err() {
        // A full disk leaves a partial temporary file; never leave it behind.
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

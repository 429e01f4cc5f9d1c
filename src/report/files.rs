//! Writing report files so a reader never sees half of one.

use anyhow::{Context, Result};
use std::path::Path;

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .with_context(|| format!("'{}' has no file name", path.display()))?;
    let tmp = path.with_file_name(format!(".{}.tmp", name.to_string_lossy()));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing '{}'", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming '{}' to '{}'", tmp.display(), path.display()))?;
    Ok(())
}

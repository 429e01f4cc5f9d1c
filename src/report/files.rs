//! Writing report files so a reader never sees half of one, and no temporary file is left
//! when a write fails. The temporary is a [`Scratch`]: created exclusively under a fresh
//! kwk name, so no file of the user's is ever written to or removed on the way.

use crate::scratch::Scratch;
use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;

/// Test hook (tests/cli_lifetime.rs): `KWK_TEST_REPORT_WRITE_FAILS=NAME` makes every write
/// of the report file NAME fail as on a full disk (ENOSPC), to prove such a failure neither
/// stops a run nor leaves temporary files. Never set in normal use.
pub const TEST_WRITE_FAILS_ENV: &str = "KWK_TEST_REPORT_WRITE_FAILS";

/// Whether the test hook asks writes of `name` to fail.
fn hooked_to_fail(name: &std::ffi::OsStr) -> bool {
    std::env::var_os(TEST_WRITE_FAILS_ENV).is_some_and(|v| v == name)
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .with_context(|| format!("'{}' has no file name", path.display()))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let writing = || format!("writing '{}'", path.display());
    // Dropped on every error path: the temporary goes with it.
    let mut tmp = Scratch::create(dir, &name.to_string_lossy()).with_context(writing)?;
    if let Some(f) = tmp.file() {
        let written = if hooked_to_fail(name) {
            Err(std::io::Error::from_raw_os_error(28))
        } else {
            f.write_all(bytes)
        };
        written.with_context(writing)?;
    }
    tmp.persist(path)
}

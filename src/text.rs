//! The evaluation text as llama-perplexity reads it: raw bytes (no newline translation;
//! wiki.test.raw has CRLF endings and they matter), decoded as UTF-8, with exactly one
//! trailing `\n` removed. Also the SHA-256 of the file's bytes, for the report.
//!
//! The file is read once. Tools that read a text by path (llama.cpp's) are given a private
//! copy of exactly those bytes in the run folder ([`private_copy`]), never `--text` itself,
//! so a file replaced during the run cannot be scored under the first file's hash; the copy
//! is checked against the hash again before each use ([`check_copy`]).

pub use crate::digest::{file_sha256, sha256_hex};
use crate::scratch::Scratch;
use anyhow::{bail, ensure, Context, Result};
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct EvalText {
    pub path: PathBuf,
    /// The file name, for reports.
    pub name: String,
    pub sha256: String,
    /// The decoded text, one trailing `\n` removed.
    pub text: String,
    /// Whether the file ended in the `\n` removed from `text` (so the bytes hashed are
    /// `text` plus it).
    pub trailing_newline: bool,
}

/// Largest text file read (`--text`, `--calib-text`): 1 GiB, some 250 million tokens, far
/// past what a perplexity run scores (wiki.test.raw is 1.3 MB).
pub const MAX_TEXT_BYTES: u64 = 1 << 30;

/// What a non-regular file is, for the error message.
fn file_kind(t: &std::fs::FileType) -> &'static str {
    kwk::files::kind(t)
}

/// `what` must be a regular file: `stat` (which never blocks, even on a named pipe) before
/// anything opens it. Otherwise one line: `{what} is not a regular file (a named pipe);
/// {fix}`. A missing file is the I/O error, with `reading {what}` as context.
pub fn regular_file(path: &Path, what: &str, fix: &str) -> Result<std::fs::Metadata> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {what}"))?;
    if !meta.is_file() {
        bail!(
            "{what} is not a regular file (a {}); {fix}",
            file_kind(&meta.file_type())
        );
    }
    Ok(meta)
}

/// Opens an input file for reading without ever blocking in `open` (`O_NONBLOCK`, which
/// changes nothing for a regular file), then checks what was opened is a regular file: a
/// file replaced by a named pipe after [`regular_file`] looked is refused, not waited on.
pub fn open_input(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)?;
    let t = file.metadata()?.file_type();
    if !t.is_file() {
        return Err(kwk::files::not_regular(&t));
    }
    Ok(file)
}

/// Reads `path` (the `flag` names where it came from in error messages).
pub fn read_text(path: &Path, flag: &str) -> Result<EvalText> {
    if path.is_dir() {
        bail!(
            "{flag} '{}' is a directory; pass a text file",
            path.display()
        );
    }
    let reading = || format!("reading {flag} '{}'", path.display());
    let meta = std::fs::metadata(path).with_context(reading)?;
    if !meta.is_file() {
        bail!(
            "{flag} '{}' is not a regular file (a {}); pass a text file",
            path.display(),
            file_kind(&meta.file_type())
        );
    }
    if meta.len() > MAX_TEXT_BYTES {
        bail!(
            "{flag} '{}' is {} bytes, more than the limit of {MAX_TEXT_BYTES} (1 GiB); pass a smaller text",
            path.display(),
            meta.len()
        );
    }
    let mut bytes = Vec::new();
    open_input(path)
        .and_then(|f| f.take(MAX_TEXT_BYTES + 1).read_to_end(&mut bytes))
        .with_context(reading)?;
    if bytes.len() as u64 > MAX_TEXT_BYTES {
        bail!(
            "{flag} '{}' grew past the limit of {MAX_TEXT_BYTES} bytes (1 GiB) while being read; pass a smaller text",
            path.display()
        );
    }
    if bytes.is_empty() {
        bail!(
            "{flag} '{}' is empty; pass a text with at least 2×ctx tokens",
            path.display()
        );
    }
    let sha256 = sha256_hex(&bytes);
    let mut text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => bail!(
            "{flag} '{}' is not UTF-8 (invalid byte at offset {}); convert it to UTF-8",
            path.display(),
            e.utf8_error().valid_up_to()
        ),
    };
    let trailing_newline = text.ends_with('\n');
    if trailing_newline {
        text.pop();
    }
    if text.is_empty() {
        bail!(
            "{flag} '{}' holds only a newline; pass a text with at least 2×ctx tokens",
            path.display()
        );
    }
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    Ok(EvalText {
        path: path.to_path_buf(),
        name,
        sha256,
        text,
        trailing_newline,
    })
}

/// Writes the bytes of `text` that were hashed (its text and the trailing `\n` removed
/// from it) into a new file of this run in `dir` (exclusive create, a fresh kwk name; see
/// [`crate::scratch`]), makes it read-only and checks it hashes to `text.sha256`. The
/// copy is removed when the returned [`Scratch`] is dropped.
pub fn private_copy(text: &EvalText, dir: &Path) -> Result<Scratch> {
    use std::io::Write;
    let mut copy = Scratch::create(dir, &format!("text.{}", text.name))
        .context("making the run's private copy of --text")?;
    let path = copy.path().to_path_buf();
    let writing = || format!("writing the private copy of --text '{}'", path.display());
    if let Some(f) = copy.file() {
        f.write_all(text.text.as_bytes())
            .and_then(|()| {
                if text.trailing_newline {
                    f.write_all(b"\n")
                } else {
                    Ok(())
                }
            })
            .and_then(|()| f.sync_all())
            .with_context(writing)?;
        let mut perms = f.metadata().with_context(writing)?.permissions();
        perms.set_readonly(true);
        f.set_permissions(perms).with_context(writing)?;
    }
    copy.close();
    check_copy(&path, &text.sha256)?;
    Ok(copy)
}

/// Fails, naming the file, unless `path` still hashes to `sha256` (the bytes of `--text`
/// as read at the start of the run).
pub fn check_copy(path: &Path, sha256: &str) -> Result<()> {
    let now = file_sha256(path)
        .with_context(|| format!("reading the private copy of --text '{}'", path.display()))?;
    ensure!(
        now == sha256,
        "the text '{}' changed during the run: its sha256 is {now}, the --text read at the start had {sha256}; \
         nothing was scored from it. Leave the run folder alone while a run goes on, and run again",
        path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_exactly_one_newline_and_keeps_crlf() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.txt");
        std::fs::write(&p, b"a\r\nb\n\n").unwrap();
        let t = read_text(&p, "--text").unwrap();
        assert_eq!(t.text, "a\r\nb\n");
        assert_eq!(t.name, "t.txt");
        assert_eq!(t.sha256, sha256_hex(b"a\r\nb\n\n"));
        assert!(t.trailing_newline);
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(read_text(&p, "--text").unwrap().text, "abc");
    }

    /// The copy holds exactly the bytes hashed, is read-only, does not follow the original
    /// when that is replaced, and a change of the copy itself is an error naming it.
    #[test]
    fn the_private_copy_is_the_hashed_bytes_and_independent_of_the_original() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.txt");
        for bytes in [&b"a\r\nb\n\n"[..], b"no newline", b"one\n"] {
            std::fs::write(&p, bytes).unwrap();
            let t = read_text(&p, "--text").unwrap();
            let copy = private_copy(&t, dir.path()).unwrap();
            assert_ne!(copy.path(), p.as_path());
            std::fs::write(&p, b"replaced").unwrap();
            assert_eq!(std::fs::read(copy.path()).unwrap(), bytes);
            assert_eq!(file_sha256(copy.path()).unwrap(), t.sha256);
            let mode = std::fs::metadata(copy.path()).unwrap().permissions().mode();
            assert_eq!(mode & 0o222, 0, "{mode:o}");
            check_copy(copy.path(), &t.sha256).unwrap();
            let e = format!(
                "{:#}",
                check_copy(copy.path(), &"0".repeat(64)).unwrap_err()
            );
            assert!(
                e.contains(&copy.path().display().to_string())
                    && e.contains("changed during the run"),
                "{e}"
            );
            let path = copy.path().to_path_buf();
            drop(copy);
            assert!(!path.exists());
        }
    }

    #[test]
    fn bad_texts_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.txt");
        std::fs::write(&p, b"ok \xff\xfe").unwrap();
        let e = format!("{:#}", read_text(&p, "--text").unwrap_err());
        assert!(
            e.contains("bad.txt") && e.contains("not UTF-8") && e.contains("offset 3"),
            "{e}"
        );
        std::fs::write(&p, b"").unwrap();
        assert!(format!("{:#}", read_text(&p, "--text").unwrap_err()).contains("is empty"));
        std::fs::write(&p, b"\n").unwrap();
        assert!(read_text(&p, "--text").is_err());
        assert!(read_text(&dir.path().join("missing.txt"), "--text").is_err());
        assert!(read_text(dir.path(), "--text").is_err());
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}

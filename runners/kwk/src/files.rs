//! Input files are regular files. A named pipe given where a model, tokenizer or config file
//! belongs would block `open` until some other program writes to it (forever, in practice),
//! and a device such as `/dev/zero` would be read without end; so every file kwk reads is
//! checked with `stat` (which never blocks) before it is opened, and anything but a regular
//! file is refused with an error that says what it is ([`kind`]).

use std::fs::{File, FileType, Metadata};
use std::io::Read;
use std::path::Path;

/// What a file is, in words, for messages: `directory`, `named pipe`, `character device`,
/// `block device`, `socket`, `regular file`, or `special file`.
pub fn kind(t: &FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "named pipe";
        } else if t.is_char_device() {
            return "character device";
        } else if t.is_block_device() {
            return "block device";
        } else if t.is_socket() {
            return "socket";
        }
    }
    if t.is_dir() {
        "directory"
    } else if t.is_file() {
        "regular file"
    } else {
        "special file"
    }
}

/// The error for a path that exists but is not a regular file: `not a regular file (a named
/// pipe)` (kind `InvalidInput`).
pub fn not_regular(t: &FileType) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("not a regular file (a {})", kind(t)),
    )
}

/// `stat(path)` (following symlinks), and an error unless it is a regular file. Never
/// blocks, whatever `path` is.
pub fn regular_metadata(path: &Path) -> std::io::Result<Metadata> {
    let meta = std::fs::metadata(path)?;
    if meta.is_file() {
        Ok(meta)
    } else {
        Err(not_regular(&meta.file_type()))
    }
}

/// Opens `path` for reading once [`regular_metadata`] says it is a regular file; checks the
/// opened file again (it may have been replaced in between).
pub fn open_regular(path: &Path) -> std::io::Result<File> {
    regular_metadata(path)?;
    let file = File::open(path)?;
    let t = file.metadata()?.file_type();
    if t.is_file() {
        Ok(file)
    } else {
        Err(not_regular(&t))
    }
}

/// The whole of the regular file `path` (as `std::fs::read`, without blocking on a pipe).
pub fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open_regular(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// [`read_regular`] as UTF-8 text (as `std::fs::read_to_string`).
pub fn read_regular_to_string(path: &Path) -> std::io::Result<String> {
    let mut text = String::new();
    open_regular(path)?.read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_are_opened_and_pipes_never_block() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "abc").unwrap();
        assert_eq!(read_regular_to_string(&file).unwrap(), "abc");
        let fifo = dir.path().join("p");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Would block forever in open() without the check.
        let e = read_regular(&fifo).unwrap_err();
        assert_eq!(e.to_string(), "not a regular file (a named pipe)");
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        let e = open_regular(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e.to_string(), "not a regular file (a character device)");
        let e = open_regular(dir.path()).unwrap_err();
        assert_eq!(e.to_string(), "not a regular file (a directory)");
        let e = open_regular(&dir.path().join("missing")).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }
}

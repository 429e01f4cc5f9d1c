//! The memory map of a model file: [`map_file`] maps a GGUF or safetensors file read-only
//! (the loaders' one `mmap`), and [`release_pages`] drops the pages read so far from the
//! resident set. The `unsafe` of the file map lives here, each block with its SAFETY
//! comment.

use crate::error::{KwkError, Result};
use std::path::Path;

/// Maps `path` read-only. Model files are mapped rather than read so that a multi-gigabyte
/// checkpoint costs no heap copy: tensors are converted straight from the page cache.
pub(crate) fn map_file(path: &Path) -> Result<memmap2::Mmap> {
    // A named pipe would block `open` (and a device has no length): regular files only.
    let file = crate::files::open_regular(path).map_err(|e| KwkError::io(path, e))?;
    // SAFETY: the map is read-only and private to this process; the loaders only read
    // bytes through bounds-checked slices. A concurrent writer truncating the file
    // would be undefined behaviour, as for every mmap-based model loader (llama.cpp,
    // candle); model files are not modified while a run reads them.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| KwkError::io(path, e))?;
    Ok(map)
}

/// Drops the pages of a read-only file mapping from this process's resident set (the page
/// cache keeps them; a later read faults them back in). A streaming loader calls it after
/// each layer so that the source it has read does not count as its memory.
pub(crate) fn release_pages(map: &memmap2::Mmap) {
    // SAFETY: `map` is a read-only, file-backed mapping of a file nobody modifies while it
    // is read (see `map_file`); MADV_DONTNEED on such a mapping only drops page-table
    // entries, and the next access reads the same file bytes again. No reference into the
    // mapping is invalidated.
    let _ = unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
}

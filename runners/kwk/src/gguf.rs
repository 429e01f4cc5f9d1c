//! The GGUF container: header, metadata, tensor directory, memory-mapped tensor data.
//!
//! Also home of [`map_file`], the one place the loaders memory-map a model file.

use crate::error::{KwkError, Result};
use std::path::Path;

/// Maps `path` read-only. Model files are mapped rather than read so that a multi-gigabyte
/// checkpoint costs no heap copy: tensors are converted straight from the page cache.
pub(crate) fn map_file(path: &Path) -> Result<memmap2::Mmap> {
    let file = std::fs::File::open(path).map_err(|e| KwkError::io(path, e))?;
    // SAFETY: the map is read-only and private to this process; the loaders only read
    // bytes through bounds-checked slices. A concurrent writer truncating the file
    // would be undefined behaviour, as for every mmap-based model loader (llama.cpp,
    // candle); model files are not modified while a run reads them.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| KwkError::io(path, e))?;
    Ok(map)
}

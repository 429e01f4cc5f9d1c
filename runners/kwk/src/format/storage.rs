//! Where a packed weight's arrays live: [`Store`] is either an owned vector (weights
//! quantized in this process) or a slice of a memory-mapped pack-cache file (a warm start
//! maps the packed layout the kernels read instead of copying it). Both dereference to the
//! same `&[T]`, so formats and kernels never see the difference.

use bytemuck::Pod;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// An array of packed values, owned or mapped.
pub enum Store<T: Pod> {
    Owned(Vec<T>),
    /// `len` values at byte `start` of `map` (checked aligned for `T` when made).
    Mapped {
        map: Arc<memmap2::Mmap>,
        start: usize,
        len: usize,
    },
}

impl<T: Pod> Store<T> {
    /// `len` values of `T` at byte `start` of `map`; `None` when the range is out of the map
    /// or `start` is not aligned for `T`.
    pub fn mapped(map: Arc<memmap2::Mmap>, start: usize, len: usize) -> Option<Self> {
        let end = len
            .checked_mul(std::mem::size_of::<T>())
            .and_then(|n| n.checked_add(start))?;
        let bytes = map.get(start..end)?;
        bytemuck::try_cast_slice::<u8, T>(bytes).ok()?;
        Some(Store::Mapped { map, start, len })
    }

    /// Whether the values are read from a mapped file.
    pub fn is_mapped(&self) -> bool {
        matches!(self, Store::Mapped { .. })
    }
}

impl<T: Pod> Deref for Store<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Store::Owned(v) => v,
            Store::Mapped { map, start, len } => {
                // Checked in `mapped`: in range and aligned.
                bytemuck::cast_slice(&map[*start..*start + *len * std::mem::size_of::<T>()])
            }
        }
    }
}

impl<T: Pod> From<Vec<T>> for Store<T> {
    fn from(v: Vec<T>) -> Self {
        Store::Owned(v)
    }
}

impl<T: Pod> Clone for Store<T> {
    fn clone(&self) -> Self {
        match self {
            Store::Owned(v) => Store::Owned(v.clone()),
            Store::Mapped { map, start, len } => Store::Mapped {
                map: map.clone(),
                start: *start,
                len: *len,
            },
        }
    }
}

impl<T: Pod + PartialEq> PartialEq for Store<T> {
    fn eq(&self, other: &Self) -> bool {
        self[..] == other[..]
    }
}

impl<T: Pod> fmt::Debug for Store<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.is_mapped() { "mapped" } else { "owned" };
        write!(f, "Store({kind}, {} values)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn mapped_slices_check_range_and_alignment() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&[1, 0, 2, 0, 3, 0, 4, 0]).unwrap();
        // SAFETY (test): the temporary file is not modified while mapped.
        let map = Arc::new(unsafe { memmap2::Mmap::map(f.as_file()) }.unwrap());
        let s = Store::<u16>::mapped(map.clone(), 2, 3).unwrap();
        assert_eq!(&s[..], &[2, 3, 4]);
        assert!(s.is_mapped());
        assert_eq!(s, Store::from(vec![2u16, 3, 4]));
        assert!(
            Store::<u16>::mapped(map.clone(), 1, 1).is_none(),
            "misaligned"
        );
        assert!(
            Store::<u16>::mapped(map.clone(), 4, 3).is_none(),
            "past the end"
        );
        assert!(Store::<u8>::mapped(map, 7, 1).is_some());
    }
}

//! Packing: turning float32 weights into the packed formats the kernels read, and keeping
//! them. `cache/` is the pack cache (identity and keys, the file format, sessions, the
//! folder).

pub mod cache;

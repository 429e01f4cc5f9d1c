//! How the roofline's read loops walk a buffer (the scalar twin in `roofline/mod.rs` and
//! the SIMD loops in `roofline/x86_64.rs` alike): [`READ_STREAMS`] lock-step streams of
//! [`read_part_len`] values each.

/// Concurrent sequential streams each read loop walks its slice as: the slice is cut
/// into this many equal parts, read in lock step. One stream per thread under-reads the
/// memory system of some CPUs: on an AMD Zen 3 (2 threads) a single stream read 11.6-18
/// GB/s where 4 read 15.4-19.4 in the same minute, and kwk's own float32 GEMV (two
/// panels in lock step) streamed 22 GB/s past a single-stream probe's 15.
pub const READ_STREAMS: usize = 4;

/// u64 values of each of the [`READ_STREAMS`] parts a read loop walks in `len` values:
/// a multiple of 32 (the widest loop's block); what is left over is not read.
pub fn read_part_len(len: usize) -> usize {
    len / (READ_STREAMS * 32) * 32
}

//! The worker pool every kernel runs on. A matmul is split into static, contiguous
//! slices of output rows, one per thread; `run` hands the same closure to every thread and
//! returns when all are done.
//!
//! This first version sits on rayon's `broadcast`; the decoder issue replaces it with a
//! persistent spin-then-park pool (a 135M model issues hundreds of matmuls per token, so
//! per-operation hand-off cost matters). The API stays.

use std::ops::Range;

pub struct ThreadPool {
    n_threads: usize,
    pool: rayon::ThreadPool,
}

impl ThreadPool {
    /// A pool of `n_threads` (at least 1) workers.
    pub fn new(n_threads: usize) -> Self {
        let n_threads = n_threads.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n_threads)
            .thread_name(|i| format!("kwk-worker-{i}"))
            .build()
            .expect("spawning worker threads");
        ThreadPool { n_threads, pool }
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(thread_index, n_threads)` once on each worker; returns when all have finished.
    pub fn run(&self, f: impl Fn(usize, usize) + Sync) {
        if self.n_threads == 1 {
            f(0, 1);
            return;
        }
        self.pool.broadcast(|ctx| f(ctx.index(), ctx.num_threads()));
    }
}

/// The `part`-th of `parts` contiguous slices of `0..len`, with slice boundaries on
/// multiples of `align` (the last slice takes the remainder).
pub fn split_range(len: usize, parts: usize, part: usize, align: usize) -> Range<usize> {
    let align = align.max(1);
    let blocks = len.div_ceil(align);
    let start = (blocks * part / parts) * align;
    let end = ((blocks * (part + 1) / parts) * align).min(len);
    start.min(len)..end
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn split_range_covers_everything_once() {
        for len in [0, 1, 7, 64, 100, 577] {
            for parts in 1..5 {
                for align in [1, 4, 16] {
                    let mut next = 0;
                    for p in 0..parts {
                        let r = split_range(len, parts, p, align);
                        assert_eq!(r.start, next, "len {len} parts {parts} align {align}");
                        next = r.end;
                    }
                    assert_eq!(next, len);
                }
            }
        }
    }

    #[test]
    fn run_calls_every_thread_once() {
        let pool = ThreadPool::new(3);
        let seen = AtomicUsize::new(0);
        pool.run(|i, n| {
            assert_eq!(n, 3);
            seen.fetch_add(1 << (i * 4), Ordering::SeqCst);
        });
        assert_eq!(seen.load(Ordering::SeqCst), 0x111);
    }
}

//! The worker pool every kernel runs on. A matmul is split into static, contiguous
//! slices of output rows, one per thread; `run` hands the same closure to every thread and
//! returns when all are done.
//!
//! Persistent workers that spin, then yield, then park between jobs (the hand-off itself
//! is [`crate::kernels::broadcast::Broadcast`]): a 135M model issues hundreds of matmuls
//! per token, so the per-operation cost of waking threads matters. The calling thread is
//! worker 0, so a pool of `n` threads spawns `n - 1`.

use crate::kernels::broadcast::Broadcast;
use std::ops::Range;
use std::sync::Arc;
use std::thread::JoinHandle;

pub struct ThreadPool {
    shared: Arc<Broadcast>,
    workers: Vec<JoinHandle<()>>,
}

impl ThreadPool {
    /// A pool of `n_threads` (at least 1) workers, the caller included.
    pub fn new(n_threads: usize) -> Self {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Broadcast::new(n_threads));
        let workers = (1..n_threads)
            .map(|i| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("kwk-worker-{i}"))
                    .spawn(move || shared.worker_loop(i))
                    .expect("spawning a worker thread")
            })
            .collect();
        ThreadPool { shared, workers }
    }

    pub fn n_threads(&self) -> usize {
        self.shared.n_threads()
    }

    /// Runs `f(thread_index, n_threads)` once on each worker; returns when all have finished.
    /// Not reentrant: `f` must not call `run` on the same pool.
    pub fn run(&self, f: impl Fn(usize, usize) + Sync) {
        self.shared.run(&f);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shut_down();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
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

    #[test]
    fn many_back_to_back_runs_see_borrowed_data() {
        let pool = ThreadPool::new(3);
        let mut total = 0usize;
        for round in 0..2000 {
            let data: Vec<usize> = (0..30).map(|i| i * round).collect();
            let sum = AtomicUsize::new(0);
            pool.run(|i, n| {
                let r = split_range(data.len(), n, i, 1);
                sum.fetch_add(data[r].iter().sum::<usize>(), Ordering::Relaxed);
            });
            let s = sum.load(Ordering::Relaxed);
            assert_eq!(s, data.iter().sum::<usize>());
            total += s;
        }
        assert!(total > 0);
    }

    #[test]
    fn parked_workers_wake_up() {
        let pool = ThreadPool::new(2);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let seen = AtomicUsize::new(0);
        pool.run(|_, _| {
            seen.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(seen.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_worker_panic_reaches_the_caller() {
        let pool = ThreadPool::new(2);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(|i, _| {
                if i == 1 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        // The pool still works afterwards.
        let seen = AtomicUsize::new(0);
        pool.run(|_, _| {
            seen.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(seen.load(Ordering::SeqCst), 2);
    }
}

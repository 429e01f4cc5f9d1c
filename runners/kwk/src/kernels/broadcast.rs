//! The hand-off at the heart of the worker pool ([`crate::threads::ThreadPool`]): the
//! caller publishes a borrowed closure, every worker runs it once, and the caller returns
//! only after all of them have finished. Handing a *borrowed* closure to long-lived
//! threads needs its lifetime erased, which is `unsafe`; it lives here, under `kernels/`
//! (the crate's only place for `unsafe`), behind a safe API whose `run` cannot return
//! before the last worker has dropped its use of the closure.
//!
//! Workers wait for a new job by spinning (~50 µs), then yielding (~2 ms), then parking
//! on a condition variable, so back-to-back matmuls hand off in well under a microsecond
//! while an idle pool costs no CPU.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

type Job = dyn Fn(usize, usize) + Sync;

const SPIN_FOR: Duration = Duration::from_micros(50);
const YIELD_FOR: Duration = Duration::from_millis(2);

/// Shared state of one pool: worker `i` (1..n) runs [`Broadcast::worker_loop`], the caller
/// of [`Broadcast::run`] acts as worker 0.
pub struct Broadcast {
    n_threads: usize,
    /// The current job; written by `run` only while no worker can read it (before the
    /// generation bump, after every worker reported done).
    job: UnsafeCell<Option<*const Job>>,
    generation: AtomicU64,
    done: AtomicUsize,
    worker_panicked: AtomicBool,
    shutdown: AtomicBool,
    /// Serialises concurrent `run` callers.
    caller: Mutex<()>,
    sleepers: AtomicUsize,
    park_lock: Mutex<()>,
    park_cv: Condvar,
}

// SAFETY: `job` is only written by the single `run` caller holding `caller` while no
// worker reads it (workers read it between observing a generation bump and incrementing
// `done`, and `run` waits for all `done` before clearing it); the pointee is `Sync`.
unsafe impl Sync for Broadcast {}
// SAFETY: as above; the raw pointer is only dereferenced while `run` keeps it alive.
unsafe impl Send for Broadcast {}

impl Broadcast {
    /// State for `n_threads` participants (the caller plus `n_threads - 1` workers).
    pub fn new(n_threads: usize) -> Self {
        Broadcast {
            n_threads: n_threads.max(1),
            job: UnsafeCell::new(None),
            generation: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            worker_panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            caller: Mutex::new(()),
            sleepers: AtomicUsize::new(0),
            park_lock: Mutex::new(()),
            park_cv: Condvar::new(),
        }
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(i, n_threads)` for every `i` in `0..n_threads` (0 on the calling thread)
    /// and returns when all calls have returned. Re-raises a panic of any call. Must not be
    /// called from inside a job of the same pool (it would wait for itself).
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let n = self.n_threads;
        if n == 1 {
            f(0, 1);
            return;
        }
        let _caller = self.caller.lock().unwrap_or_else(|e| e.into_inner());
        let ptr: *const (dyn Fn(usize, usize) + Sync + '_) = f;
        // SAFETY: only the lifetime is erased (same fat-pointer layout). The pointer is
        // dereferenced by workers only until they increment `done`, and this function
        // does not return (not even by unwinding: the own call is caught) before `done`
        // reaches n-1, so `f` outlives every use.
        let ptr: *const Job = unsafe { std::mem::transmute(ptr) };
        // SAFETY: no worker reads `job` now: the previous run waited for all `done`.
        unsafe { *self.job.get() = Some(ptr) };
        self.done.store(0, Ordering::Relaxed);
        self.worker_panicked.store(false, Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.park_lock.lock().unwrap_or_else(|e| e.into_inner());
            self.park_cv.notify_all();
        }
        let own = catch_unwind(AssertUnwindSafe(|| f(0, n)));
        let start = Instant::now();
        while self.done.load(Ordering::Acquire) < n - 1 {
            if start.elapsed() < SPIN_FOR {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // SAFETY: every worker has finished with the job (done == n-1).
        unsafe { *self.job.get() = None };
        if let Err(payload) = own {
            resume_unwind(payload);
        }
        if self.worker_panicked.load(Ordering::Relaxed) {
            panic!("a worker thread panicked while running a job");
        }
    }

    /// The loop of worker `index` (1..n_threads); returns after [`Broadcast::shut_down`].
    pub fn worker_loop(&self, index: usize) {
        // Generation 0 is "no job yet": workers are spawned before the first `run`, and a
        // worker that starts late must still see that first job.
        let mut seen = 0;
        loop {
            let start = Instant::now();
            loop {
                let g = self.generation.load(Ordering::Acquire);
                if g != seen {
                    seen = g;
                    break;
                }
                if self.shutdown.load(Ordering::Acquire) {
                    return;
                }
                let waited = start.elapsed();
                if waited < SPIN_FOR {
                    for _ in 0..32 {
                        std::hint::spin_loop();
                    }
                } else if waited < YIELD_FOR {
                    std::thread::yield_now();
                } else {
                    let guard = self.park_lock.lock().unwrap_or_else(|e| e.into_inner());
                    self.sleepers.fetch_add(1, Ordering::SeqCst);
                    if self.generation.load(Ordering::SeqCst) == seen
                        && !self.shutdown.load(Ordering::SeqCst)
                    {
                        let _g = self
                            .park_cv
                            .wait_timeout(guard, Duration::from_millis(100))
                            .unwrap_or_else(|e| e.into_inner());
                    }
                    self.sleepers.fetch_sub(1, Ordering::SeqCst);
                }
            }
            // SAFETY: the generation bump (Acquire above pairs with run's SeqCst store)
            // published `job`, which stays valid until this worker increments `done`.
            let job = unsafe { *self.job.get() };
            if let Some(job) = job {
                // SAFETY: see above; the closure is alive until `done` counts this worker.
                let f = unsafe { &*job };
                if catch_unwind(AssertUnwindSafe(|| f(index, self.n_threads))).is_err() {
                    self.worker_panicked.store(true, Ordering::Relaxed);
                }
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }

    /// Makes every `worker_loop` return (after the job in flight, if any).
    pub fn shut_down(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        let _g = self.park_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.park_cv.notify_all();
    }
}

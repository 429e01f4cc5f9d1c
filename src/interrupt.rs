//! Stopping a run cleanly on SIGINT (Ctrl-C), SIGTERM or SIGHUP (the terminal closed).
//! [`install`] registers handlers that only set flags (`signal-hook`): kwk's
//! ([`kwk::interrupt`], polled by the decoder between tensors, calibration windows and the
//! harness's chunks and speed repetitions) and llama.cpp's
//! ([`llamacpp::process::interrupt_flag`], polled every 20 ms while a tool runs, which then
//! kills the tool's whole process group). The run then unwinds through its ordinary error
//! paths, so temporary files are removed, and [`crate::session`] writes the reports with
//! `complete: false` and the rows that finished. A second signal exits at once, after
//! killing the process group of every llama.cpp tool still running
//! ([`llamacpp::process::kill_running`]); the tools also carry a parent-death signal, so
//! not even a SIGKILL of kwk-eval leaves one running. The exit status is 128 + the signal
//! number: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

static SIGINT_SEEN: LazyLock<Arc<AtomicBool>> = LazyLock::new(Arc::default);
static SIGTERM_SEEN: LazyLock<Arc<AtomicBool>> = LazyLock::new(Arc::default);
static SIGHUP_SEEN: LazyLock<Arc<AtomicBool>> = LazyLock::new(Arc::default);
/// Signals the signal thread has taken since the last [`reset`].
static RECEIVED: AtomicUsize = AtomicUsize::new(0);

/// Registers the SIGINT, SIGTERM and SIGHUP handlers, once per process (later calls return
/// the first one's outcome).
pub fn install() -> anyhow::Result<()> {
    static INSTALLED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            register().map_err(|e| format!("installing the SIGINT/SIGTERM/SIGHUP handlers: {e}"))
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

fn register() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        use signal_hook::flag;
        let signals = [
            (SIGINT, &*SIGINT_SEEN),
            (SIGTERM, &*SIGTERM_SEEN),
            (SIGHUP, &*SIGHUP_SEEN),
        ];
        // In the handler itself: the stop request, seen by the run at its next poll.
        for (sig, seen) in signals {
            flag::register(sig, Arc::clone(seen))?;
            flag::register(sig, kwk::interrupt::flag())?;
            flag::register(sig, llamacpp::process::interrupt_flag())?;
        }
        // On a thread of its own (killing process groups and exiting are no work for a
        // signal handler): the second signal kills the tools still running and exits.
        let mut iter = signal_hook::iterator::Signals::new(signals.map(|(sig, _)| sig))?;
        std::thread::Builder::new()
            .name("kwk-eval signals".into())
            .spawn(move || {
                for sig in iter.forever() {
                    if RECEIVED.fetch_add(1, Ordering::SeqCst) >= 1 {
                        llamacpp::process::kill_running();
                        std::process::exit(128 + sig);
                    }
                }
            })?;
    }
    Ok(())
}

/// Whether a stop was requested (by a signal, or by [`request`]).
pub fn requested() -> bool {
    kwk::interrupt::requested()
}

/// Clears a stop request (and which signal it was). [`crate::run`] calls it before and
/// after an evaluation, so a process that runs several (the Python package's
/// `python -m kwk.bench` in a long-lived interpreter) is not stopped by an old request, and
/// the decoder it keeps using afterwards is not interrupted either.
pub fn reset() {
    kwk::interrupt::flag().store(false, Ordering::SeqCst);
    llamacpp::process::interrupt_flag().store(false, Ordering::SeqCst);
    SIGINT_SEEN.store(false, Ordering::SeqCst);
    SIGTERM_SEEN.store(false, Ordering::SeqCst);
    SIGHUP_SEEN.store(false, Ordering::SeqCst);
    RECEIVED.store(0, Ordering::SeqCst);
}

/// Requests a stop as a signal would (without one: tests, embedders).
pub fn request() {
    kwk::interrupt::flag().store(true, Ordering::SeqCst);
    llamacpp::process::interrupt_flag().store(true, Ordering::SeqCst);
}

/// The run was stopped by a signal; carried as the error of [`crate::session::evaluate`].
#[derive(Debug)]
pub struct Interrupted {
    /// What was kept, for the message (the run folder, or that none was made yet).
    pub kept: String,
}

impl Interrupted {
    /// 130 after SIGINT, 143 after SIGTERM, 129 after SIGHUP (128 + the signal number, as
    /// shells report); SIGINT wins over SIGTERM over SIGHUP, and a [`request`] without a
    /// signal is 130.
    pub fn exit_code(&self) -> u8 {
        let seen = |s: &LazyLock<Arc<AtomicBool>>| s.load(Ordering::SeqCst);
        if seen(&SIGINT_SEEN) {
            130
        } else if seen(&SIGTERM_SEEN) {
            143
        } else if seen(&SIGHUP_SEEN) {
            129
        } else {
            130
        }
    }

    fn signal_name(&self) -> &'static str {
        match self.exit_code() {
            143 => "SIGTERM",
            129 => "SIGHUP",
            _ => "SIGINT",
        }
    }
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "interrupted by {}; {}", self.signal_name(), self.kept)
    }
}

impl std::error::Error for Interrupted {}

//! Stopping a run cleanly on SIGINT (Ctrl-C) or SIGTERM. [`install`] registers handlers
//! that only set flags (`signal-hook`): kwk's ([`kwk::interrupt`], polled by the decoder
//! between tensors, calibration windows and the harness's chunks and speed repetitions) and
//! llama.cpp's ([`llamacpp::process::interrupt_flag`], polled every 20 ms while a tool runs,
//! which then kills the tool's whole process group). The run then unwinds through its
//! ordinary error paths, so temporary files are removed, and [`crate::session`] writes the
//! reports with `complete: false` and the rows that finished. A second signal exits at
//! once. The exit status is 128 + the signal number: 130 for SIGINT, 143 for SIGTERM.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};

static SIGINT_SEEN: LazyLock<Arc<AtomicBool>> = LazyLock::new(Arc::default);
static SIGTERM_SEEN: LazyLock<Arc<AtomicBool>> = LazyLock::new(Arc::default);

/// Registers the SIGINT and SIGTERM handlers, once per process (later calls return the
/// first one's outcome).
pub fn install() -> anyhow::Result<()> {
    static INSTALLED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            register().map_err(|e| format!("installing the SIGINT/SIGTERM handlers: {e}"))
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

fn register() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGINT, SIGTERM};
        use signal_hook::flag;
        for (sig, seen, code) in [(SIGINT, &*SIGINT_SEEN, 130), (SIGTERM, &*SIGTERM_SEEN, 143)] {
            // Registered first, so it sees the flag as it was before this signal: the
            // second signal exits at once.
            flag::register_conditional_shutdown(sig, code, kwk::interrupt::flag())?;
            flag::register(sig, Arc::clone(seen))?;
            flag::register(sig, kwk::interrupt::flag())?;
            flag::register(sig, llamacpp::process::interrupt_flag())?;
        }
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
    /// 130 after SIGINT, 143 after SIGTERM (128 + the signal number, as shells report).
    pub fn exit_code(&self) -> u8 {
        if SIGTERM_SEEN.load(Ordering::SeqCst) && !SIGINT_SEEN.load(Ordering::SeqCst) {
            143
        } else {
            130
        }
    }

    fn signal_name(&self) -> &'static str {
        if self.exit_code() == 143 {
            "SIGTERM"
        } else {
            "SIGINT"
        }
    }
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "interrupted by {}; {}", self.signal_name(), self.kept)
    }
}

impl std::error::Error for Interrupted {}

//! The process-wide stop request: a flag a program's SIGINT/SIGTERM handler sets (e.g.
//! `signal_hook::flag::register(SIGINT, kwk::interrupt::flag())`) and the decoder's long
//! loops (packing layer by layer, calibration passes, the harness's chunk loop) poll
//! between units of work, returning [`KwkError::Interrupted`] so every temporary file is
//! removed by the ordinary error path (destructors run) rather than left by an abrupt exit.

use crate::error::{KwkError, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};

static FLAG: LazyLock<Arc<AtomicBool>> = LazyLock::new(Arc::default);

/// The flag itself, for a signal handler to set.
pub fn flag() -> Arc<AtomicBool> {
    Arc::clone(&FLAG)
}

/// Whether a stop was requested.
pub fn requested() -> bool {
    FLAG.load(Ordering::SeqCst)
}

/// `Err(Interrupted)` once a stop was requested: called between units of work.
pub fn check() -> Result<()> {
    if requested() {
        Err(KwkError::Interrupted)
    } else {
        Ok(())
    }
}

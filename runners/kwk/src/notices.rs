//! Warnings the library cannot act on itself (a damaged pack cache file it will rewrite, an
//! unusable `KWK_ISA` or `KWK_PACK_CACHE_GB`): kwk never prints. It hands each warning to
//! the sink the program installed ([`set_sink`]), and holds them until one is installed, so
//! none is lost and none reaches a terminal the program did not choose.
//!
//! A leaf module: it depends on nothing in the crate, and every floor may call [`warn`].

use std::sync::{Mutex, MutexGuard};

/// Where warnings go: the program's renderer (kwk-eval prints one `warning: ...` line;
/// the Python package raises a Python warning).
pub type Sink = Box<dyn Fn(&str) + Send + Sync>;

static SINK: Mutex<Option<Sink>> = Mutex::new(None);
static PENDING: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A sink that panicked leaves the lock poisoned; the data (a sink, a list of strings)
    // is still whole, so carry on with it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Installs the program's sink, replacing any earlier one, and hands it every warning
/// held so far, in order.
pub fn set_sink(sink: Sink) {
    let held = std::mem::take(&mut *lock(&PENDING));
    for message in &held {
        sink(message);
    }
    *lock(&SINK) = Some(sink);
}

/// Removes the sink; later warnings are held again.
pub fn clear_sink() {
    *lock(&SINK) = None;
}

/// Reports one warning: to the sink if one is installed, else held for [`take_pending`]
/// or the next [`set_sink`]. `message` is one line without the `warning: ` prefix. The
/// sink must not call `warn` itself (the sink's lock is held while it runs).
pub fn warn(message: impl Into<String>) {
    let message = message.into();
    let sink = lock(&SINK);
    match sink.as_ref() {
        Some(s) => s(&message),
        None => lock(&PENDING).push(message),
    }
}

/// The warnings held because no sink was installed, oldest first; they are removed.
pub fn take_pending() -> Vec<String> {
    std::mem::take(&mut *lock(&PENDING))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    // One test only: the sink is process-wide and tests run in parallel, so other tests'
    // warnings may arrive too; only this test's tagged messages are checked.
    #[test]
    fn warnings_are_held_until_a_sink_is_installed_then_delivered_in_order() {
        const TAG: &str = "notices-test:";
        let mine = |v: Vec<String>| -> Vec<String> {
            v.into_iter().filter(|m| m.starts_with(TAG)).collect()
        };
        clear_sink();
        let _ = take_pending();
        warn(format!("{TAG}first"));
        warn(format!("{TAG}second"));
        let got = Arc::new(Mutex::new(Vec::<String>::new()));
        let g = Arc::clone(&got);
        set_sink(Box::new(move |m| g.lock().unwrap().push(m.to_string())));
        warn(format!("{TAG}third"));
        let delivered = mine(got.lock().unwrap().clone());
        assert_eq!(
            delivered,
            [
                format!("{TAG}first"),
                format!("{TAG}second"),
                format!("{TAG}third")
            ]
        );
        assert!(mine(take_pending()).is_empty());
        clear_sink();
        warn(format!("{TAG}fourth"));
        assert_eq!(mine(take_pending()), [format!("{TAG}fourth")]);
        assert_eq!(mine(got.lock().unwrap().clone()).len(), 3);
    }
}

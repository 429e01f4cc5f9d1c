//! Progress bars on stderr (indicatif) for the long steps: chunks of a perplexity run and
//! repetitions of a speed test. Hidden when stderr is not a terminal, so logs and CI
//! output stay clean.

use crate::protocol::Progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// One bar for one step of one runner.
pub struct Bar {
    bar: ProgressBar,
}

impl Bar {
    /// A bar titled `label` (e.g. "int4 perplexity").
    pub fn new(label: &str) -> Self {
        let bar = ProgressBar::with_draw_target(Some(0), draw_target());
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:>24} [{bar:30}] {pos}/{len} {msg} ({elapsed}, eta {eta})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_prefix(label.to_string());
        Bar { bar }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

fn draw_target() -> ProgressDrawTarget {
    if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

impl Progress for Bar {
    fn set_total(&self, total: u64, what: &str) {
        self.bar.set_length(total);
        self.bar.set_message(what.to_string());
        self.bar.set_position(0);
    }
    fn advance(&self, done: u64) {
        self.bar.set_position(done);
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

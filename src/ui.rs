//! The reporting interface: how the library tells whoever runs it what is happening
//! (progress bars, status lines, notes and warnings on stderr) and hands over its output
//! proper (the table, a streamed completion on stdout) without printing itself. A program
//! renders it: [`crate::console::Terminal`] for the binary and the Python package
//! (indicatif bars on a terminal, one line per message, stdout as written); tests hand in
//! [`Silent`] or a recorder. A leaf beside `protocol`, whose [`Progress`] its bars are.

use crate::protocol::Progress;
use anyhow::{Context, Result};

/// Where the library's messages and output go.
pub trait Reporter {
    /// Writes `bytes` to stdout and flushes them; the error is the stream's, as it is
    /// (a closed stdout is `BrokenPipe`).
    fn stdout(&self, bytes: &[u8]) -> std::io::Result<()>;
    /// Writes `text` to stderr as it is (no newline added).
    fn stderr(&self, text: &str);
    /// One whole line on stderr, unless this process showed the same line already (a
    /// cache folder that cannot be used is one warning, not one per row).
    fn line_once(&self, line: &str);
    /// A progress bar titled `label` (e.g. "int4 perplexity") for one step of one runner;
    /// it goes when dropped.
    fn progress(&self, label: &str) -> Box<dyn Progress>;

    /// One line on stderr: a status (`loading model '...'`, `[2/4] int8: packing`).
    fn line(&self, line: &str) {
        self.stderr(&format!("{line}\n"));
    }
    /// `note: {message}`.
    fn note(&self, message: &str) {
        self.line(&format!("note: {message}"));
    }
    /// `warning: {message}`.
    fn warn(&self, message: &str) {
        self.line(&format!("warning: {message}"));
    }
    /// `warning: {message}`, once per process.
    fn warn_once(&self, message: &str) {
        self.line_once(&format!("warning: {message}"));
    }
}

/// Writes `text` to stdout. A closed stdout (`kwk-eval ... | head -1`) ends the output
/// quietly: the reports are on disk already and the run's outcome stands. Any other write
/// error is an error naming stdout.
pub fn print_stdout(ui: &dyn Reporter, text: &str) -> Result<()> {
    match ui.stdout(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("writing the table to stdout"),
    }
}

/// A reporter's stdout as a [`std::io::Write`] (a completion streamed token by token).
pub struct Stdout<'a>(pub &'a dyn Reporter);

impl std::io::Write for Stdout<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.stdout(buf)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A reporter that shows nothing and drops the output (tests, and callers that only want
/// the files).
pub struct Silent;

impl Reporter for Silent {
    fn stdout(&self, _bytes: &[u8]) -> std::io::Result<()> {
        Ok(())
    }
    fn stderr(&self, _text: &str) {}
    fn line_once(&self, _line: &str) {}
    fn progress(&self, _label: &str) -> Box<dyn Progress> {
        Box::new(crate::protocol::NoProgress)
    }
}

//! What the commands print, shared below all of them: text on stdout that a closed pipe
//! ends quietly ([`print_stdout`]), and warnings printed once per process ([`warn_once`]).
//! A leaf: it imports nothing from the crate, so a command never calls another command's
//! printing.

use anyhow::{Context, Result};

/// Writes `text` to stdout. A closed stdout (`kwk-eval ... | head -1`) ends the output
/// quietly: the reports are on disk already and the run's outcome stands. Any other write
/// error is an error naming stdout.
pub fn print_stdout(text: &str) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("writing the table to stdout"),
    }
}

/// Prints `line` on stderr unless this process printed the same line already (a cache
/// folder that cannot be used is one warning, not one per row).
pub fn warn_once(line: String) {
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if !seen.contains(&line) {
        eprintln!("{line}");
        seen.push(line);
    }
}

//! The program: kwk-eval's command line run in this process and rendered on its terminal.
//! [`run`] parses (`cli`), runs the command, renders what the library reports through
//! [`Terminal`] (the [`Reporter`]: indicatif bars on stderr when it is a terminal, one line
//! per status, note and warning, stdout as written) and maps the outcome to an exit code.
//! The binary (`src/main.rs`) and the Python package (`python -m kwk.bench`, which must
//! print the same bytes) both call it. The only module of the library that writes to the
//! process's streams: no other module refers to it (tests/house.rs checks both).

use crate::protocol::Progress;
use crate::session::Outcome;
use crate::ui::Reporter;
use crate::{cache, cli, compare, generate, interrupt, merge, session, sweep};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{IsTerminal, Write};

/// Runs kwk-eval with `args` (the program name first, as `std::env::args_os`): parses,
/// runs, prints as the binary does, and returns the exit status (0 ok, 1 the regression
/// gate failed, 2 error, printed as one `error: ...` line; 130, 143 or 129 when SIGINT,
/// SIGTERM or SIGHUP stopped an evaluation, [`interrupt`]).
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    install_notice_sink();
    // Fixes the program's own resident size before anything is read (rows' peaks add it).
    let _ = crate::machine::startup_rss_bytes();
    let ui = Terminal;
    let invocation = match cli::parse_from(args) {
        Ok(i) => i,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return 0;
            }
            ui.line(&format!("error: {}", cli::one_line(&e)));
            return 2;
        }
    };
    let result = match invocation {
        cli::Invocation::Evaluate(args) => {
            interrupt::reset();
            interrupt::install().and_then(|()| session::evaluate(&args, &ui))
        }
        cli::Invocation::Compare(args) => compare::run(&args, &ui).map(|()| Outcome::Passed),
        cli::Invocation::Generate(cfg) => generate::generate(&cfg, &ui).map(|()| Outcome::Passed),
        cli::Invocation::Cache(cfg) => cache::run(&cfg, &ui).map(|()| Outcome::Passed),
        cli::Invocation::Merge(args) => merge::run(&args, &ui).map(|()| Outcome::Passed),
        cli::Invocation::Sweep(action) => sweep::run(&action, &ui).map(|()| Outcome::Passed),
    };
    let code = match result {
        Ok(Outcome::Passed) => 0,
        Ok(Outcome::GateFailed) => 1,
        Err(e) => {
            let code = e
                .downcast_ref::<interrupt::Interrupted>()
                .map_or(2, interrupt::Interrupted::exit_code);
            // One line: tool errors may carry a stderr tail over several lines.
            let msg = format!("{e:#}");
            let one: Vec<&str> = msg
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            ui.line(&format!("error: {}", one.join(" | ")));
            code
        }
    };
    interrupt::reset();
    code
}

/// Hands the decoder crate's warnings (`kwk::notices`: a damaged pack cache file, an
/// unusable `KWK_ISA`) to stderr as `warning: ...` lines, where kwk printed them before it
/// stopped printing. The Python package installs it too, for its decoders.
pub fn install_notice_sink() {
    kwk::notices::set_sink(Box::new(|m| eprintln!("warning: {m}")));
}

/// The terminal's [`Reporter`]: stdout and stderr of this process.
pub struct Terminal;

impl Reporter for Terminal {
    fn stdout(&self, bytes: &[u8]) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        out.write_all(bytes).and_then(|()| out.flush())
    }

    fn stderr(&self, text: &str) {
        eprint!("{text}");
    }

    fn line_once(&self, line: &str) {
        static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
        let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
        if !seen.iter().any(|s| s == line) {
            eprintln!("{line}");
            seen.push(line.to_string());
        }
    }

    fn progress(&self, label: &str) -> Box<dyn Progress> {
        Box::new(Bar::new(label))
    }
}

/// A progress bar on stderr (indicatif) for one long step of one runner: the chunks of a
/// perplexity run, the repetitions of a speed test. Hidden when stderr is not a terminal,
/// so logs and CI output stay clean.
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
    fn message(&self, line: &str) {
        self.bar.suspend(|| eprintln!("{line}"));
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

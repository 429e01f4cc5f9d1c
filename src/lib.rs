//! kwk-eval: what a weight format costs in quality and buys in speed, measured on the same
//! tokens for kwk's in-tree decoder and for llama.cpp.
//!
//! Data flows one way: each layer uses only the layers below it (`tests/house.rs` fails on
//! a module cycle).
//! 1. `cli`: the flags parsed into plain options defined below it; it prints and runs
//!    nothing.
//! 2. The commands, none calling another: `session` (an evaluation run), `compare`,
//!    `generate`, `cache`.
//! 3. The evaluation's stages, each using the next (a run meets them the other way round):
//!    `measure` (the runners' quality, then interleaved speed) → `prepare` (model header,
//!    tokens, chunk plan, identity) → `plan` (the options checked into an immutable run
//!    plan, nothing loaded); and `run_folder` (the folder a run claims).
//! 4. `runner` (kwk's decoder and llama.cpp behind one trait) → `eval` (the measurements
//!    every runner shares).
//! 5. `report`: the exporters, `compare` and the `--baseline` gate.
//! 6. The leaves any layer may use: `protocol` (the types the stages pass along),
//!    `limits` (the bounds of every number), `cache_dir` (the pack
//!    cache folder), `ui` (printing shared by the commands), `machine`, `text`, `scratch`,
//!    `stats`, `digest`, `interrupt`, `progress`.
//!
//! [`run`] is the whole command line (the binary and the Python package's
//! `python -m kwk.bench` call it) and maps the outcome to an exit code.
#![forbid(unsafe_code)]

pub mod cache;
pub mod cache_dir;
pub mod cli;
pub mod compare;
pub mod digest;
pub mod eval;
pub mod generate;
pub mod interrupt;
pub mod limits;
pub mod machine;
pub mod measure;
pub mod plan;
pub mod prepare;
pub mod progress;
pub mod protocol;
pub mod report;
pub mod run_folder;
pub mod runner;
pub mod scratch;
pub mod session;
pub mod stats;
pub mod text;
pub mod ui;

use session::Outcome;

/// Runs kwk-eval with `args` (the program name first, as `std::env::args_os`): parses,
/// runs, prints as the binary does, and returns the exit status (0 ok, 1 the regression
/// gate failed, 2 error, printed as one `error: ...` line; 130, 143 or 129 when SIGINT,
/// SIGTERM or SIGHUP stopped an evaluation, [`interrupt`]).
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let invocation = match cli::parse_from(args) {
        Ok(i) => i,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return 0;
            }
            eprintln!("error: {}", cli::one_line(&e));
            return 2;
        }
    };
    let result = match invocation {
        cli::Invocation::Evaluate(args) => {
            interrupt::reset();
            interrupt::install().and_then(|()| session::evaluate(&args))
        }
        cli::Invocation::Compare(args) => compare::run(&args).map(|()| Outcome::Passed),
        cli::Invocation::Generate(cfg) => generate::generate(&cfg).map(|()| Outcome::Passed),
        cli::Invocation::Cache(cfg) => cache::run(&cfg).map(|()| Outcome::Passed),
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
            eprintln!("error: {}", one.join(" | "));
            code
        }
    };
    interrupt::reset();
    code
}

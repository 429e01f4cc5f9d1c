//! The kwk-eval binary: parse, run, and map the outcome to an exit status
//! (0 ok, 1 the regression gate failed, 2 error, printed as one `error: ...` line).
#![forbid(unsafe_code)]

use kwk_eval::cli::{self, Invocation};
use kwk_eval::session::{self, Outcome};
use std::process::ExitCode;

fn run() -> ExitCode {
    let invocation = match cli::parse() {
        Ok(i) => i,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {}", cli::one_line(&e));
            return ExitCode::from(2);
        }
    };
    let result = match invocation {
        Invocation::Evaluate(args) => session::evaluate(&args),
        Invocation::Compare(args) => session::compare(&args).map(|()| Outcome::Passed),
        Invocation::Generate(cfg) => kwk_eval::generate::generate(&cfg).map(|()| Outcome::Passed),
        Invocation::Cache(cfg) => kwk_eval::cache::run(&cfg).map(|()| Outcome::Passed),
    };
    match result {
        Ok(Outcome::Passed) => ExitCode::SUCCESS,
        Ok(Outcome::GateFailed) => ExitCode::from(1),
        Err(e) => {
            // One line: tool errors may carry a stderr tail over several lines.
            let msg = format!("{e:#}");
            let one: Vec<&str> = msg
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            eprintln!("error: {}", one.join(" | "));
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    run()
}

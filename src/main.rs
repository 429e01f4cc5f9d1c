//! The kwk-eval binary: [`kwk_eval::run`] on the process's arguments, its result the exit
//! status (0 ok, 1 the regression gate failed, 2 error, printed as one `error: ...` line).
#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(kwk_eval::run(std::env::args_os()))
}

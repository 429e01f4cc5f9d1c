//! `kwk-eval compare`: each later results.json against the first, printed as a table (the
//! comparison itself and its rendering are [`crate::report::compare`]; the checks that two
//! files can be compared are [`crate::report::gate`]).

use crate::report;
use crate::report::compare::TableFormat;
use crate::report::gate::GateLimits;
use crate::ui::{print_stdout, Reporter};
use anyhow::{Context, Result};
use std::path::PathBuf;

/// What `kwk-eval compare` was asked for.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// results.json files: OLD NEW [NEWER ...].
    pub files: Vec<PathBuf>,
    pub format: TableFormat,
    pub limits: GateLimits,
}

/// `kwk-eval compare`: each later results.json against the first, printed in `args.format`.
/// The limits and every file are checked first (as `--baseline` is): limits finite and
/// non-negative, every file of the same model, text and protocol as the first and sharing
/// a row with it; otherwise an error naming what differs, and nothing is printed.
pub fn run(args: &CompareOptions, ui: &dyn Reporter) -> Result<()> {
    let limits = args.limits;
    limits.check()?;
    let old = report::json::read(&args.files[0])?;
    let mut news = Vec::new();
    for path in &args.files[1..] {
        let new = report::json::read(path)?;
        report::gate::check_comparable(&old, &new).with_context(|| {
            format!(
                "'{}' cannot be compared with '{}'",
                path.display(),
                args.files[0].display()
            )
        })?;
        news.push((path, new));
    }
    for (path, new) in news {
        if args.files.len() > 2 {
            print_stdout(
                ui,
                &format!("{} → {}\n", args.files[0].display(), path.display()),
            )?;
        }
        let c = report::compare::compare(&old, &new, &limits);
        print_stdout(ui, &report::compare::render(&c, args.format))?;
    }
    Ok(())
}

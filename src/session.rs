//! One evaluation run, as a one-way pipeline: [`crate::plan::make`] checks every input
//! and resolves the run (no folder is created for bad input), [`crate::prepare::prepare`]
//! loads the model, tokenizes and checks the baseline's identity, [`crate::measure::run`]
//! measures every runner (rewriting the reports after each row), and the exporters and
//! the gate ([`crate::report`]) finish. Until the last runner has finished every report
//! says `complete: false`; a runner that failed makes the process exit 2 at the end.

use crate::cli::EvalArgs;
use crate::{measure, plan, prepare, report};
use anyhow::{bail, Context, Result};

/// How a run ended when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    GateFailed,
}

/// Runs the evaluation `args` describe.
pub fn evaluate(args: &EvalArgs) -> Result<Outcome> {
    let plan = plan::make(args)?;
    // GGUF headers are read before the model loads, so a bad file fails first.
    measure::build_llamacpp(&plan)?;
    let prep = prepare::prepare(&plan)?;
    std::fs::create_dir_all(&plan.out_dir)
        .with_context(|| format!("creating --out '{}'", plan.out_dir.display()))?;
    eprintln!("run folder: {}", plan.out_dir.display());
    let mut results = prep.results.clone();
    report::write_all(&plan.out_dir, &results)?;
    measure::run(&plan, &prep, &mut results)?;
    results.complete = true;
    report::write_all(&plan.out_dir, &results)?;
    if let Some(reference) = &prep.protocol.reference_logits {
        if reference.exists() && !plan.keep_logits {
            std::fs::remove_file(reference)
                .with_context(|| format!("removing '{}'", reference.display()))?;
        }
    }
    print_stdout(&report::terminal::render(&results))?;
    print_stdout(&format!("reports: {}\n", plan.out_dir.display()))?;
    let mut outcome = Outcome::Passed;
    if let Some(b) = &plan.baseline {
        let gate = report::gate::run(&b.results, &results, &plan.limits);
        print_stdout(&gate.summary(&b.path.display().to_string()))?;
        if !gate.passed() {
            outcome = Outcome::GateFailed;
        }
    }
    let failures: Vec<String> = results
        .failures()
        .map(|r| format!("{}: {}", r.name, r.error.as_deref().unwrap_or_default()))
        .collect();
    if !failures.is_empty() {
        bail!(
            "{} runner(s) failed: {}",
            failures.len(),
            failures.join("; ")
        );
    }
    Ok(outcome)
}

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

/// `kwk-eval compare`: each later results.json against the first, printed in `args.format`.
pub fn compare(args: &crate::cli::CompareArgs) -> Result<()> {
    let old = report::json::read(&args.files[0])?;
    let limits = args.gate.limits();
    for path in &args.files[1..] {
        let new = report::json::read(path)?;
        if args.files.len() > 2 {
            print_stdout(&format!(
                "{} → {}\n",
                args.files[0].display(),
                path.display()
            ))?;
        }
        let c = report::compare::compare(&old, &new, &limits);
        print_stdout(&report::compare::render(&c, args.format))?;
    }
    Ok(())
}

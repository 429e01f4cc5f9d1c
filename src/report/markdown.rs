//! report.md: the table, the protocol in one line, loud warnings (incomplete run, tokens
//! that differ between kwk-eval and llama.cpp, failed runners), and the plots.

use super::plot::PlotFiles;
use super::{table_rows, write_atomically, Results};
use anyhow::Result;
use std::fmt::Write as _;
use std::path::Path;

/// The protocol in one line (also printed under the terminal table).
pub fn protocol_line(r: &Results) -> String {
    let p = &r.protocol;
    let sha = &p.text_sha256[..p.text_sha256.len().min(12)];
    let speed = if p.speed {
        format!("speed pp{} / tg{} × {} reps", p.pp, p.tg, p.reps)
    } else {
        "speed not measured (--no-speed)".to_string()
    };
    format!(
        "ctx {} × {} chunks = {} scored tokens of '{}' (sha256 {sha}…, {} tokens, BOS {}); \
         {speed}; {} threads; KLD vs float32: {}",
        p.ctx,
        p.chunks,
        p.scored_tokens,
        p.text,
        p.text_tokens,
        if p.add_bos { "added" } else { "none" },
        r.machine.threads,
        if p.kld { "yes" } else { "no" },
    )
}

/// The calibration in one line (`None` when no calibrated format ran): the text, the
/// tokens, whether it is the scored text, and per calibrated row the calibration and
/// packing seconds.
pub fn calibration_line(r: &Results) -> Option<String> {
    let c = r.protocol.calibration.as_ref()?;
    let sha = &c.text_sha256[..c.text_sha256.len().min(12)];
    let range = c
        .range
        .as_deref()
        .map(|x| format!(", tokens {x}"))
        .unwrap_or_default();
    let times: Vec<String> = r
        .runners
        .iter()
        .filter_map(|row| {
            let cal = row.calibration_s?;
            let pack = row
                .load_pack_s
                .map(|p| format!(" of {p:.1} s packing"))
                .unwrap_or_default();
            Some(format!("{} {cal:.1} s{pack}", row.name))
        })
        .collect();
    let on_eval = if c.on_eval {
        " **CALIBRATED ON THE SCORED TEXT (--calib-on-eval): the calibrated rows are flattered.**"
    } else {
        " (no run of 64 tokens shared with the scored text)"
    };
    Some(format!(
        "'{}' (sha256 {sha}…{range}): {} tokens given, {} used{on_eval}; calibration time: {}",
        c.text,
        c.tokens,
        c.tokens_used,
        if times.is_empty() {
            "-".to_string()
        } else {
            times.join(", ")
        }
    ))
}

pub fn render(r: &Results, plots: &PlotFiles) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# kwk-eval: {}\n", r.model);
    if !r.complete {
        let _ = writeln!(
            s,
            "> **INCOMPLETE RUN.** This run was interrupted or is still going: only the rows \
             below were measured, and the run's other runners are missing.\n"
        );
    }
    for row in r.runners.iter().filter(|x| x.tokens_match == Some(false)) {
        let _ = writeln!(
            s,
            "> **WARNING: TOKENS DIFFER.** {} ({}) tokenized the text to other ids than \
             kwk-eval; its perplexity is not comparable with the other rows.\n",
            row.name, row.engine
        );
    }
    for row in r.failures() {
        let _ = writeln!(
            s,
            "> **FAILED: {}** — {}\n",
            row.name,
            row.error.as_deref().unwrap_or_default()
        );
    }
    let _ = writeln!(s, "**Protocol:** {}\n", protocol_line(r));
    if let Some(c) = calibration_line(r) {
        let _ = writeln!(s, "**Calibration:** {c}\n");
    }
    let (header, rows) = table_rows(r);
    let _ = writeln!(s, "| {} |", header.join(" | "));
    let _ = writeln!(
        s,
        "|{}|",
        header
            .iter()
            .enumerate()
            .map(|(i, _)| if i < 2 { "---" } else { "---:" })
            .collect::<Vec<_>>()
            .join("|")
    );
    for row in rows {
        let cells: Vec<String> = row.iter().map(|c| c.replace('|', "\\|")).collect();
        let _ = writeln!(s, "| {} |", cells.join(" | "));
    }
    let reference = r.ppl_delta_reference.as_deref().unwrap_or("-");
    let _ = writeln!(
        s,
        "\nPPL ± its uncertainty as llama-perplexity computes it; ΔPPL relative to `{reference}`; \
         KLD: mean KL divergence against the float32 reference's distributions; top-1: how often \
         the most likely token agrees with the reference; speeds are mean ± sample stddev of \
         per-repetition tokens/s (llama-bench's definitions); '-' = not measured.\n"
    );
    if let Some(q) = &plots.quality {
        let _ = writeln!(s, "![perplexity change vs bits per weight]({q})\n");
    }
    if let Some(sp) = &plots.speed {
        let _ = writeln!(s, "![prompt and generation speed]({sp})\n");
    }
    let _ = writeln!(
        s,
        "Machine: {} ({} threads; kwk kernels {}; CPU features {}). Versions: kwk {}, kwk-eval {}, llama.cpp {}. Started {}.",
        r.machine.cpu,
        r.machine.threads,
        r.machine.kernels.as_deref().unwrap_or("-"),
        if r.machine.isa.is_empty() { "-".into() } else { r.machine.isa.join(", ") },
        r.versions.kwk.as_deref().unwrap_or("unknown"),
        r.versions.kwk_eval,
        match (&r.versions.llama_cpp, &r.versions.llama_cpp_version) {
            (Some(b), _) => format!("build {b}"),
            (None, Some(v)) => format!("'{v}'"),
            (None, None) => "-".into(),
        },
        r.started_utc
    );
    s
}

pub fn write(path: &Path, r: &Results, plots: &PlotFiles) -> Result<()> {
    write_atomically(path, render(r, plots).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::testdata::sample_results;

    #[test]
    fn incomplete_runs_and_token_mismatches_are_loud() {
        let mut r = sample_results();
        let md = render(&r, &PlotFiles::default());
        assert!(!md.contains("INCOMPLETE"));
        assert!(md.contains("| int4 | kwk |"));
        assert!(md.contains("+2.500"));
        r.complete = false;
        r.runners[1].tokens_match = Some(false);
        let md = render(
            &r,
            &PlotFiles {
                quality: Some("q.svg".into()),
                speed: None,
            },
        );
        assert!(md.contains("INCOMPLETE RUN"));
        assert!(md.contains("TOKENS DIFFER"));
        assert!(md.contains("![perplexity change vs bits per weight](q.svg)"));
    }
}

//! The table printed at the end of a run: the same rows as report.md, aligned for a
//! terminal.

use super::{markdown::protocol_line, table_rows, Results};

/// `header` and `rows` as aligned columns (the first two left-aligned, the rest right).
pub fn aligned(header: &[String], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| -> String {
        let cells: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                let pad = " ".repeat(w.saturating_sub(c.chars().count()));
                if i < 2 {
                    format!("{c}{pad}")
                } else {
                    format!("{pad}{c}")
                }
            })
            .collect();
        cells.join("  ").trim_end().to_string()
    };
    let mut out = line(header);
    out.push('\n');
    out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len().max(1) - 1)));
    out.push('\n');
    for row in rows {
        out.push_str(&line(row));
        out.push('\n');
    }
    out
}

/// The lines under the table: which rows differ beyond 2 SE, failures, token warnings.
pub fn notes(r: &Results) -> Vec<String> {
    let mut out = Vec::new();
    let reference = r.ppl_delta_reference.as_deref().unwrap_or("the reference");
    let differ: Vec<&str> = r
        .runners
        .iter()
        .filter(|x| x.differs_from_reference() == Some(true))
        .map(|x| x.name.as_str())
        .collect();
    if r.runners.iter().any(|x| x.ln_ppl_ratio.is_some()) {
        out.push(format!(
            "differ from {reference} beyond 2 SE (ln PPL, KLD or top-1, paired on the same tokens): {}",
            if differ.is_empty() { "none".into() } else { differ.join(", ") }
        ));
    }
    if let Some(row) = &r.compare_to {
        for x in &r.runners {
            if let Some(c) = &x.compare_to {
                out.push(format!(
                    "{} vs {row}: Δln PPL {:+.5} ± {:.5}, ΔKLD {:+.5} ± {:.5}, Δtop-1 {:+.2} ± {:.2} pts{}",
                    x.name,
                    c.ln_ppl_ratio,
                    c.ln_ppl_ratio_err,
                    c.kld_diff,
                    c.kld_diff_err,
                    100.0 * c.top1_diff,
                    100.0 * c.top1_diff_err,
                    if c.beyond_2se() { " (differs beyond 2 SE)" } else { "" }
                ));
            }
        }
    }
    if let Some(line) = super::peaks_line(r) {
        out.push(line);
    }
    for row in r.failures() {
        out.push(format!(
            "FAILED {}: {}",
            row.name,
            row.error.as_deref().unwrap_or_default()
        ));
    }
    for row in r.runners.iter().filter(|x| x.tokens_match == Some(false)) {
        out.push(format!(
            "WARNING: {} tokenized the text to other ids than kwk-eval; its perplexity is not comparable",
            row.name
        ));
    }
    out
}

pub fn render(r: &Results) -> String {
    let (header, rows) = table_rows(r);
    let head: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    let mut out = aligned(&head, &rows);
    out.push_str(&protocol_line(r));
    out.push('\n');
    for n in notes(r) {
        out.push_str(&n);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::results::testdata::sample_results;

    #[test]
    fn aligned_rows() {
        let t = render(&sample_results());
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("runner"));
        assert!(lines[2].starts_with("float32"));
        assert!(lines[3].contains("20.5000 ± 0.5100"));
        assert!(lines[3].contains("+0.02470 ± 0.00400") && lines[3].contains("≠ref"));
        assert!(t.contains("beyond 2 SE (ln PPL, KLD or top-1, paired on the same tokens): int4"));
    }
}

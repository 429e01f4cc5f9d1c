//! The table printed at the end of a run: the same rows as report.md, aligned for a
//! terminal.

use super::{markdown::protocol_line, table_rows, Results};

pub fn render(r: &Results) -> String {
    let (header, rows) = table_rows(r);
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| -> String {
        cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                let pad = w.saturating_sub(c.chars().count());
                if i < 2 {
                    format!("{c}{}", " ".repeat(pad))
                } else {
                    format!("{}{c}", " ".repeat(pad))
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = String::new();
    let head: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    out.push_str(&line(&head));
    out.push('\n');
    out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
    out.push('\n');
    for row in &rows {
        out.push_str(&line(row));
        out.push('\n');
    }
    out.push_str(&protocol_line(r));
    out.push('\n');
    for row in r.failures() {
        out.push_str(&format!(
            "FAILED {}: {}\n",
            row.name,
            row.error.as_deref().unwrap_or_default()
        ));
    }
    for row in r.runners.iter().filter(|x| x.tokens_match == Some(false)) {
        out.push_str(&format!(
            "WARNING: {} tokenized the text to other ids than kwk-eval; its perplexity is not comparable\n",
            row.name
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::testdata::sample_results;

    #[test]
    fn aligned_rows() {
        let t = render(&sample_results());
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("runner"));
        assert!(lines[2].starts_with("float32"));
        assert!(lines[3].contains("20.5000 ± 0.5100"));
    }
}

//! The table printed at the end of a run: the same rows as report.md, aligned for a
//! terminal.

use super::table::{aligned, notes, protocol_line, ratio_note, ratio_rows, table_rows};
use crate::protocol::results::Results;

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
    if let Some((header, rows)) = ratio_rows(r) {
        out.push('\n');
        out.push_str(&aligned(&header, &rows));
        out.push_str("(a row's tokens/s over the other's in the same round: median [lowest–highest] of the rounds)\n");
        if let Some(note) = ratio_note(r) {
            out.push_str(&note);
            out.push('\n');
        }
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
        assert!(t.contains("beyond 2 SE (ln PPL/PPL_ref, paired on the same tokens): int4"));
        let ratio = t.lines().find(|l| l.starts_with("int4 / float32")).unwrap();
        assert!(
            ratio.contains("1.50 [1.49–1.50]") && ratio.contains("3.00 [2.99–3.01]"),
            "{t}"
        );
    }
}

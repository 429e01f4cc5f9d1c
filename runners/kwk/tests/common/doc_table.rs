//! The rows of the bad-input tables in docs/bad-inputs.md, read by the loader's test
//! (`bad_inputs.rs`) and by kwk-eval's (`tests/common/mod.rs`, which includes this file by
//! path). A row is `| <mark>id<mark> | ... | `message` |`: the id between `mark`s (a
//! backtick or `**`), the message in backticks in the last cell.
#![allow(dead_code)]

/// `(id, message)` of every row among `lines` whose id is in backticks, with three cells
/// (id, input, message).
pub fn table_rows<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<(String, String)> {
    rows_with(lines, "`", 3)
        .into_iter()
        .map(|(id, _, msg)| (id, msg))
        .collect()
}

/// `(id, middle cells, message)` of every row among `lines` whose id is between `mark`s;
/// panics on such a row that has not `n_cells` cells or whose message is not in backticks.
pub fn rows_with<'a>(
    lines: impl Iterator<Item = &'a str>,
    mark: &str,
    n_cells: usize,
) -> Vec<(String, Vec<String>, String)> {
    let mut rows = Vec::new();
    for line in lines {
        let Some(rest) = line.strip_prefix("| ").and_then(|r| r.strip_prefix(mark)) else {
            continue;
        };
        let cells: Vec<&str> = rest.split(" | ").collect();
        assert_eq!(cells.len(), n_cells, "a row needs {n_cells} cells: {line}");
        let id = cells[0].trim_end_matches(mark).to_string();
        let msg = cells[n_cells - 1]
            .trim_end_matches('|')
            .trim()
            .strip_prefix('`')
            .and_then(|m| m.strip_suffix('`'))
            .unwrap_or_else(|| panic!("the message of {id} is not in backticks: {line}"))
            .to_string();
        let middle = cells[1..n_cells - 1]
            .iter()
            .map(|c| c.to_string())
            .collect();
        rows.push((id, middle, msg));
    }
    rows
}

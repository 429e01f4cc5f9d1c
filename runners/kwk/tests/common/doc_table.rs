//! The rows of a bad-input table in docs/bad-inputs.md: lines
//! `| `id` | description | `message` |`, read by the loader's test (`bad_inputs.rs`) and by
//! kwk-eval's (`tests/cli_bounds.rs`, which includes this file by path).

/// `(id, message)` of every table row among `lines`; panics on a row that is not three
/// cells with the message in backticks.
pub fn table_rows<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    for line in lines {
        let Some(rest) = line.strip_prefix("| `") else {
            continue;
        };
        let cells: Vec<&str> = rest.split(" | ").collect();
        assert_eq!(cells.len(), 3, "a row needs id, input, message: {line}");
        let id = cells[0].trim_end_matches('`').to_string();
        let msg = cells[2]
            .trim_end_matches('|')
            .trim()
            .strip_prefix('`')
            .and_then(|m| m.strip_suffix('`'))
            .unwrap_or_else(|| panic!("the message of {id} is not in backticks: {line}"))
            .to_string();
        rows.push((id, msg));
    }
    rows
}

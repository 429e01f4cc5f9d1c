//! Property tests: arbitrary Unicode runner names (combining marks, wide characters, emoji,
//! right-to-left text and its controls, newlines, `<script>`, Markdown's own characters,
//! identical stems) through every exporter: nothing panics, the terminal columns align by
//! display width, Markdown table rows keep their column count, CSV and JSON give the
//! names back.

use super::table::{display_width, one_line};
use super::*;
use crate::protocol::results::testdata::sample_results;
use proptest::prelude::*;

const PIECES: &[&str] = &[
    "ä",
    "ö",
    "模型",
    "e\u{301}",
    "\u{301}",
    "👍🏽",
    "👨‍👩‍👧",
    "עברית",
    "مرحبا",
    "\u{202e}",
    "\u{2067}",
    "\n",
    "\r\n",
    "\t",
    "\u{1b}[31m",
    "<script>",
    "</td>",
    "|",
    "\\|",
    "`",
    "``",
    "*",
    "_",
    "[x](y)",
    "&amp;",
    "-",
    ".",
    "Q4_0",
    "gguf",
    ".gguf",
    " ",
    "\u{200b}",
    "\u{feff}",
    "ｗｉｄｅ",
    "a",
];

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::collection::vec(prop::sample::select(PIECES), 0..6).prop_map(|v| v.concat()),
        any::<String>(),
        "\\PC{0,10}",
    ]
    .prop_flat_map(|n| {
        // Some rows as llama.cpp's GGUF rows (their labels lose a common prefix).
        prop_oneof![Just(n.clone()), Just(format!("gguf:{n}.gguf"))]
    })
}

fn names() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(name(), 1..5).prop_filter("distinct rows", |v| {
        let mut s = v.clone();
        s.sort();
        s.dedup();
        s.len() == v.len()
    })
}

/// The sample results with one row per name (alternating its two rows' figures), in
/// speed rounds by those names, the model named `names[0]`.
fn results_named(names: &[String]) -> Results {
    let mut r = sample_results();
    let rows = r.runners.clone();
    r.model = names[0].clone();
    r.runners = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let mut row = rows[i % 2].clone();
            row.name = n.clone();
            if n.starts_with("gguf:") {
                row.engine = Engine::LlamaCpp;
            }
            if i == 3 {
                row.error = Some(format!("{n} failed\nsecond line <b>"));
            }
            row
        })
        .collect();
    r.speed_rounds = vec![names.to_vec(), names.iter().rev().cloned().collect()];
    r.update_deltas();
    r.speed_ratios = crate::protocol::speed_ratios::paired_speed_ratios(&r);
    r
}

/// `want` characters of a Markdown line that are not escaped with `\`.
fn unescaped(line: &str, want: char) -> usize {
    let (mut n, mut escaped) = (0, false);
    for c in line.chars() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == want {
            n += 1;
        }
    }
    n
}

fn check_terminal(r: &Results) {
    let t = terminal::render(r);
    let lines: Vec<&str> = t.lines().collect();
    // Header, rule, then one line per row; the engine column starts at the same display
    // column on every line.
    let firsts: Vec<String> = std::iter::once("runner".to_string())
        .chain(r.runners.iter().map(|x| one_line(&x.name)))
        .collect();
    let mut columns = Vec::new();
    for (i, first) in firsts.iter().enumerate() {
        let line = lines[if i == 0 { 0 } else { i + 1 }];
        assert!(
            line.starts_with(first.as_str()),
            "{line:?} / {first:?}\n{t}"
        );
        let rest = &line[first.len()..];
        let spaces = rest.len() - rest.trim_start_matches(' ').len();
        columns.push(display_width(first) + spaces);
    }
    assert!(columns.iter().all(|&c| c == columns[0]), "{columns:?}\n{t}");
}

fn check_markdown(r: &Results) {
    let md = markdown::render(r, &plot::PlotFiles::default());
    let lines: Vec<&str> = md.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("| runner | engine |"))
        .expect("the table");
    let columns = unescaped(lines[at], '|');
    for i in 0..=r.runners.len() {
        let row = lines[at + 1 + i];
        assert!(row.starts_with('|') && row.ends_with('|'), "{row:?}\n{md}");
        assert_eq!(unescaped(row, '|'), columns, "{row:?}\n{md}");
        assert!(!row.contains('<') && unescaped(row, '`') == 0, "{row:?}");
    }
    assert_eq!(lines[at + 2 + r.runners.len()], "", "{md}");
    assert!(!md.contains("<script>"), "{md}");
}

fn check_csv_json(r: &Results) {
    let bytes = csv::to_bytes(r).unwrap();
    let mut rd = ::csv::Reader::from_reader(bytes.as_slice());
    let back: Vec<String> = rd
        .records()
        .map(|rec| rec.unwrap()[0].to_string())
        .collect();
    let want: Vec<String> = r.runners.iter().map(|x| x.name.clone()).collect();
    assert_eq!(back, want);
    csv::ratios_to_bytes(r).unwrap();
    let json = serde_json::to_string(r).unwrap();
    let again: Results = serde_json::from_str(&json).unwrap();
    let names: Vec<String> = again.runners.iter().map(|x| x.name.clone()).collect();
    assert_eq!(names, want);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn text_exporters_take_any_name(names in names()) {
        let r = results_named(&names);
        check_terminal(&r);
        check_markdown(&r);
        check_csv_json(&r);
    }
}

proptest! {
    // Drawing PNG and SVG is slower: fewer cases.
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn plots_take_any_name(names in names()) {
        let dir = tempfile::tempdir().unwrap();
        plot::write_plots(dir.path(), &results_named(&names)).unwrap();
    }
}

/// The case: two GGUFs whose names share a first byte inside 'ä'/'ö' (exit 101 in
/// the plot's common-prefix cut), and names with identical stems.
#[test]
fn gguf_names_sharing_a_partial_character_and_identical_stems() {
    for names in [
        vec![
            "gguf:ä-模型.gguf".to_string(),
            "gguf:ö-模型.gguf".to_string(),
        ],
        vec![
            "gguf:模型.gguf".to_string(),
            "模型".to_string(),
            "gguf:模型".to_string(),
        ],
    ] {
        let r = results_named(&names);
        let dir = tempfile::tempdir().unwrap();
        plot::write_plots(dir.path(), &r).unwrap();
        check_terminal(&r);
        check_markdown(&r);
        check_csv_json(&r);
    }
}

#[test]
fn markdown_escapes_what_it_must() {
    let md = markdown::md_text("a|b`c<script>\nd\\e*[x]&");
    assert_eq!(md, "a\\|b\\`c&lt;script&gt;\\\\nd\\\\e\\*\\[x\\]&amp;");
}

#[test]
fn terminal_widths_count_wide_and_combining_characters() {
    assert_eq!(display_width("模型"), 4);
    assert_eq!(display_width("e\u{301}"), 1);
    assert_eq!(display_width("a\nb"), 4, "shown as a\\nb");
}

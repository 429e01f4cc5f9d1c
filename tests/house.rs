//! A test that keeps the house (issue 36, item 6).
//!
//! Three rules, checked over the production sources of the three crates
//! (`src/`, `runners/kwk/src/`, `runners/llamacpp/src/`):
//!
//! 1. **No module cycles.** Each source file is a module (`a/b.rs` and
//!    `a/b/mod.rs` are both `a::b`). A file refers to another module through
//!    `crate::…`, `super::…` and `self::…` paths, in `use` items (groups
//!    included) and in code; a path points at the longest prefix of it that is
//!    a module. Edges between a module and its own ancestors or descendants are
//!    not counted: a parent declaring its children and a child reading its
//!    parent's items is how Rust modules are built, not a cycle. Every strongly
//!    connected component (Tarjan) of more than one module is a cycle.
//!    Test code does not count: files named `tests.rs` or `*_tests.rs`, and the
//!    item after each `#[cfg(test)]` line. Comments and string literals are
//!    skipped. The crate root (`lib.rs`, `main.rs`) is not a node.
//! 2. **No source file over [`MAX_LINES`] lines.**
//! 3. **Libraries never print**: no `println!`, `eprintln!`, `print!` or `eprint!` in
//!    non-test code, but in the program side of kwk-eval ([`MAY_PRINT`]: its binary and
//!    the console that renders the reporting interface), which no other module refers to.
//!
//! The rules are ratchets over today's debt. [`KNOWN_CYCLES`], [`OVERSIZED`] and
//! [`KNOWN_PRINTS`] list what existed when the test was written. The test fails
//! when a cycle appears that is not listed, when a listed cycle no longer
//! exists (delete its line: the list must stay true), when a file passes
//! [`MAX_LINES`] without being listed, when a listed file grows past its
//! listed count, and when a listed file is gone or back under the limit
//! (delete its line). When a failure message names the current cycles, it
//! prints them in the allowlist's own spelling, ready to compare or paste —
//! but only delete lines from these lists; never add one to make a new cycle or
//! a grown file pass.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The line limit for a non-test source file.
const MAX_LINES: usize = 900;

/// Module cycles that existed when this test was written: debt to pay.
/// One line per strongly connected component, its modules sorted. Remove a
/// line when the cycle is broken (the test insists).
const KNOWN_CYCLES: &[&str] = &[];

/// Non-test source files over [`MAX_LINES`] when this test was written, with
/// their line counts then: debt to pay. A file may shrink, never grow past its
/// count; remove its line when it is split under the limit.
const OVERSIZED: &[(&str, usize)] = &[];

/// The crates checked: a short name for messages, and the source root.
const CRATES: &[(&str, &str)] = &[
    ("kwk-eval", "src"),
    ("kwk", "runners/kwk/src"),
    ("llamacpp", "runners/llamacpp/src"),
];

fn is_test_file(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    name == "tests.rs" || name.ends_with("_tests.rs")
}

/// `a/b.rs` and `a/b/mod.rs` → `["a", "b"]`; `lib.rs`, `main.rs` → `[]`.
fn module_path(rel: &str) -> Vec<String> {
    let stem = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut parts: Vec<String> = stem.split('/').map(str::to_string).collect();
    if parts.last().is_some_and(|p| p == "mod") || parts == ["lib"] || parts == ["main"] {
        parts.pop();
    }
    parts
}

/// The source with comments and string/char literals blanked out (newlines
/// kept), so that only code is scanned.
fn strip_comments_and_strings(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c[i] == 'r'
            && (i == 0 || !ident(c[i - 1]))
            && matches!(c.get(i + 1), Some('"') | Some('#'))
        {
            // A raw string r"…" or r#"…"#, or an identifier such as r#type.
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            j += 1;
            while j < c.len() {
                if c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                if c[j] == '\n' {
                    out.push('\n');
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                if c.get(i) == Some(&'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c[i] == '\'' && (c.get(i + 2) == Some(&'\'') || c.get(i + 1) == Some(&'\\')) {
            // A char literal ('x', '\n', '\u{..}'); lifetimes are left alone.
            i += 2;
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The code without the item after each `#[cfg(test)]` line (a `mod tests;`
/// declaration, a `mod tests { … }` block, a test-only function or static).
fn without_test_items(code: &str) -> String {
    let mut out = String::new();
    let mut lines = code.split_inclusive('\n');
    while let Some(line) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            out.push_str(line);
            continue;
        }
        let mut depth = 0usize;
        'item: for line in lines.by_ref() {
            for ch in line.chars() {
                match ch {
                    '{' => depth += 1,
                    '}' => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            break 'item;
                        }
                    }
                    ';' if depth == 0 => break 'item,
                    _ => {}
                }
            }
        }
    }
    out
}

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Star,
    Other,
}

fn tokens(s: &str) -> impl Iterator<Item = Tok> + '_ {
    let mut rest = s;
    std::iter::from_fn(move || {
        rest = rest.trim_start();
        let ch = rest.chars().next()?;
        let (tok, len) = if ch.is_alphanumeric() || ch == '_' {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            (Tok::Ident(rest[..end].to_string()), end)
        } else if rest.starts_with("::") {
            (Tok::PathSep, 2)
        } else {
            let tok = match ch {
                '{' => Tok::Open,
                '}' => Tok::Close,
                ',' => Tok::Comma,
                '*' => Tok::Star,
                _ => Tok::Other,
            };
            (tok, ch.len_utf8())
        };
        rest = &rest[len..];
        Some(tok)
    })
}

/// Parses a path or use tree starting at `toks`, pushing every full path it
/// names onto `out`. `prefix` is the path so far.
fn parse_tree(
    toks: &mut std::iter::Peekable<impl Iterator<Item = Tok>>,
    prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) {
    let mut path = prefix;
    loop {
        match toks.peek() {
            Some(Tok::Ident(_)) => {
                let Some(Tok::Ident(id)) = toks.next() else {
                    unreachable!()
                };
                path.push(id);
                if toks.peek() == Some(&Tok::PathSep) {
                    toks.next();
                    continue;
                }
                // `as alias`
                if path.last().is_some_and(|l| l == "as") {
                    path.pop();
                }
                if toks.peek().is_some_and(|t| *t == Tok::Ident("as".into())) {
                    toks.next();
                    toks.next();
                }
                out.push(path);
                return;
            }
            Some(Tok::Open) => {
                toks.next();
                loop {
                    parse_tree(toks, path.clone(), out);
                    match toks.next() {
                        Some(Tok::Comma) => {
                            if toks.peek() == Some(&Tok::Close) {
                                toks.next();
                                return;
                            }
                        }
                        _ => return,
                    }
                }
            }
            _ => {
                // `*`, or the end of the path (`::<`, `(`, …).
                if toks.peek() == Some(&Tok::Star) {
                    toks.next();
                }
                out.push(path);
                return;
            }
        }
    }
}

/// Every module path that `code` names with `crate::`, `super::` or `self::`,
/// resolved from the module `here`.
fn referenced_paths(code: &str, here: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let bytes = code.as_bytes();
    for kw in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(kw) {
            let before = at.checked_sub(1).map(|b| bytes[b]);
            if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$') {
                continue;
            }
            // Skip the tail of a longer path (`super::super::x`, counted from its
            // first `super`).
            if before == Some(b':') {
                continue;
            }
            let mut paths = Vec::new();
            parse_tree(&mut tokens(&code[at..]).peekable(), Vec::new(), &mut paths);
            for p in paths {
                let mut it = p.into_iter().peekable();
                let mut base: Vec<String> = match it.peek().map(String::as_str) {
                    Some("crate") => {
                        it.next();
                        Vec::new()
                    }
                    _ => here.to_vec(),
                };
                while let Some(seg) = it.peek() {
                    match seg.as_str() {
                        "super" => {
                            base.pop();
                        }
                        "self" => {}
                        _ => break,
                    }
                    it.next();
                }
                base.extend(it);
                found.push(base);
            }
        }
    }
    found
}

/// The module graph of one crate: module name → modules it refers to.
/// `files` holds (path relative to the source root, contents).
fn module_graph(files: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let files: Vec<_> = files
        .iter()
        .filter(|(rel, _)| !is_test_file(rel) && rel != "main.rs")
        .collect();
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(rel, _)| module_path(rel)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, src) in files {
        let here = module_path(rel);
        if here.is_empty() {
            continue;
        }
        let code = without_test_items(&strip_comments_and_strings(src));
        let edges = graph.entry(here.join("::")).or_default();
        for path in referenced_paths(&code, &here) {
            let Some(target) = (1..=path.len())
                .rev()
                .map(|n| &path[..n])
                .find(|p| modules.contains(*p))
            else {
                continue;
            };
            if target.starts_with(&here) || here.starts_with(target) {
                continue;
            }
            edges.insert(target.join("::"));
        }
    }
    graph
}

/// Tarjan's strongly connected components of more than one node, each sorted.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        let graph = s.graph;
        for w in graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                s.out.push(scc);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

/// A cycle in the allowlist's spelling: `"kwk: a <-> b <-> c"`.
fn spell(krate: &str, scc: &[String]) -> String {
    format!("{krate}: {}", scc.join(" <-> "))
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, as (path relative to `dir` with `/`, contents).
fn read_tree(dir: &Path) -> Vec<(String, String)> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(base, &path, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                let rel = path.strip_prefix(base).unwrap();
                let rel: Vec<_> = rel.iter().map(|p| p.to_string_lossy()).collect();
                let src = std::fs::read_to_string(&path).unwrap();
                out.push((rel.join("/"), src));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out
}

#[test]
fn no_new_module_cycles() {
    let mut now = BTreeSet::new();
    for (krate, dir) in CRATES {
        let graph = module_graph(&read_tree(&root().join(dir)));
        assert!(graph.len() > 3, "{krate}: too few modules found in {dir}");
        for scc in cycles(&graph) {
            now.insert(spell(krate, &scc));
        }
    }
    let known: BTreeSet<String> = KNOWN_CYCLES.iter().map(|s| s.to_string()).collect();
    let new: Vec<_> = now.difference(&known).collect();
    let gone: Vec<_> = known.difference(&now).collect();
    let listing: String = now.iter().map(|c| format!("    \"{c}\",\n")).collect();
    assert!(
        new.is_empty() && gone.is_empty(),
        "module cycles changed.\n\
         new cycles (break them; do not list them): {new:#?}\n\
         cycles broken (delete their lines from KNOWN_CYCLES): {gone:#?}\n\
         the cycles today:\n{listing}"
    );
}

/// The faults of a ratchet: `now` (file -> count) against its `allowed` list. A file not
/// listed is `new(file, n)`, one over its listed count is `grown(file, n, allowed)`, and a
/// listed file no longer in `now` is `paid(file)` (its line must go).
fn ratchet_faults(
    now: &BTreeMap<String, usize>,
    allowed: &[(&str, usize)],
    new: impl Fn(&str, usize) -> String,
    grown: impl Fn(&str, usize, usize) -> String,
    paid: impl Fn(&str) -> String,
) -> Vec<String> {
    let mut faults = Vec::new();
    for (file, &n) in now {
        match allowed.iter().find(|(f, _)| f == file) {
            None => faults.push(new(file, n)),
            Some(&(_, max)) if n > max => faults.push(grown(file, n, max)),
            Some(_) => {}
        }
    }
    for (file, _) in allowed {
        if !now.contains_key(*file) {
            faults.push(paid(file));
        }
    }
    faults
}

#[test]
fn no_new_oversized_files() {
    let mut now = BTreeMap::new();
    for (_, dir) in CRATES {
        for (rel, src) in read_tree(&root().join(dir)) {
            let lines = src.lines().count();
            if !is_test_file(&rel) && lines > MAX_LINES {
                now.insert(format!("{dir}/{rel}"), lines);
            }
        }
    }
    let faults = ratchet_faults(
        &now,
        OVERSIZED,
        |file, lines| format!("{file}: {lines} lines, over {MAX_LINES}; split it"),
        |file, lines, allowed| {
            format!("{file}: {lines} lines, grown past its allowlisted {allowed}")
        },
        |file| {
            format!("{file}: gone or now under {MAX_LINES} lines; delete its line from OVERSIZED")
        },
    );
    let listing: String = now
        .iter()
        .map(|(f, n)| format!("    (\"{f}\", {n}),\n"))
        .collect();
    assert!(
        faults.is_empty(),
        "{}\nthe oversized files today:\n{listing}",
        faults.join("\n")
    );
}

/// Library source files that may print: the program side of kwk-eval, its binary and the
/// console that renders the reporting interface (`kwk_eval::ui::Reporter`) for the binary
/// and for the Python package, which must print the same bytes (python/tests/test_bench.py).
/// No other module of the library may refer to the console.
const MAY_PRINT: &[&str] = &["src/main.rs", "src/console.rs"];

/// Print macros left in non-test library code when this rule was written, with their
/// counts then: debt to pay. A file's count may drop, never grow; remove its line when
/// the file prints no more.
const KNOWN_PRINTS: &[(&str, usize)] = &[];

/// The print macros (`println!`, `eprintln!`, `print!`, `eprint!`) called in `code`.
fn print_calls(code: &str) -> usize {
    let bytes = code.as_bytes();
    ["println!", "eprintln!", "print!", "eprint!"]
        .iter()
        .map(|m| {
            code.match_indices(m)
                .filter(|(at, _)| {
                    let before = at.checked_sub(1).map(|b| bytes[b]);
                    !before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
                })
                .count()
        })
        .sum()
}

#[test]
fn libraries_never_print() {
    let mut now = BTreeMap::new();
    for (krate, dir) in CRATES {
        for (rel, src) in read_tree(&root().join(dir)) {
            let file = format!("{dir}/{rel}");
            if is_test_file(&rel) || MAY_PRINT.contains(&file.as_str()) {
                continue;
            }
            let n = print_calls(&without_test_items(&strip_comments_and_strings(&src)));
            if n > 0 {
                now.insert(file, n);
            }
        }
        // The console is the program's: no library module may print through it.
        if *krate == "kwk-eval" {
            let graph = module_graph(&read_tree(&root().join(dir)));
            let users: Vec<_> = graph
                .iter()
                .filter(|(_, to)| to.contains("console"))
                .map(|(m, _)| m.clone())
                .collect();
            assert!(
                users.is_empty(),
                "library modules use the console (the program's renderer): {users:?}; \
                 report through kwk_eval::ui::Reporter instead"
            );
        }
    }
    let faults = ratchet_faults(
        &now,
        KNOWN_PRINTS,
        |file, n| {
            format!(
                "{file}: {n} print macro(s) in library code; report through the program's \
                 sink instead (kwk: kwk::notices; kwk-eval: kwk_eval::ui::Reporter)"
            )
        },
        |file, n, allowed| format!("{file}: {n} print macros, more than its allowlisted {allowed}"),
        |file| format!("{file}: prints no more; delete its line from KNOWN_PRINTS"),
    );
    let listing: String = now
        .iter()
        .map(|(f, n)| format!("    (\"{f}\", {n}),\n"))
        .collect();
    assert!(
        faults.is_empty(),
        "{}\nthe library files that print today:\n{listing}",
        faults.join("\n")
    );
}

#[cfg(test)]
mod detector {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(p, s)| (p.to_string(), s.to_string()))
            .collect()
    }

    #[test]
    fn finds_a_deliberate_cycle() {
        let graph = module_graph(&files(&[
            ("lib.rs", "mod a; mod b; mod c; mod d;"),
            ("a.rs", "use crate::b::inner::Thing;\nfn f() {}"),
            // A grouped use, an alias and a path in code.
            (
                "b/mod.rs",
                "mod inner;\nuse crate::{c::{self, X as Y}, d};\nfn g() { crate::c::h(); }",
            ),
            ("b/inner.rs", "use super::super::a::F; use super::Z;"),
            ("c.rs", "pub fn h() {}"),
            ("d.rs", "use crate::c::h;"),
        ]));
        assert_eq!(graph["a"], BTreeSet::from(["b::inner".to_string()]));
        assert_eq!(
            graph["b"],
            BTreeSet::from(["c".to_string(), "d".to_string()])
        );
        // A parent and its child: not an edge.
        assert_eq!(graph["b::inner"], BTreeSet::from(["a".to_string()]));
        assert_eq!(
            cycles(&graph),
            vec![vec!["a".to_string(), "b::inner".into()]]
        );
        assert_eq!(spell("t", &cycles(&graph)[0]), "t: a <-> b::inner");
    }

    #[test]
    fn ignores_tests_comments_and_strings() {
        let graph = module_graph(&files(&[
            ("lib.rs", "mod a; mod b;"),
            (
                "a.rs",
                "// use crate::b::X;\n/* crate::b::Y */\nconst S: &str = \"crate::b::Z\";\n\
                 const R: &str = r#\"crate::b::W\"#;\n\
                 #[cfg(test)]\nmod tests;\n\
                 #[cfg(test)]\nmod more {\n    use crate::b::V;\n}\nfn after() {}\n",
            ),
            ("a/tests.rs", "use crate::b::T;"),
            ("b.rs", "use crate::a::after;"),
            ("b_tests.rs", "use crate::a::U;"),
        ]));
        assert!(graph["a"].is_empty(), "{graph:?}");
        assert!(cycles(&graph).is_empty());
    }

    #[test]
    fn counts_print_macros_in_code_only() {
        let code = without_test_items(&strip_comments_and_strings(
            "fn f() { println!(\"a\"); eprint!(\"b\"); eprintln!(); print!(\"c\"); }\n\
             // println!(\"in a comment\")\n\
             const S: &str = \"eprintln!(x)\";\n\
             fn g() { writeln!(w, \"x\"); my_println!(); }\n\
             #[cfg(test)]\nmod tests { fn t() { println!(); } }\n",
        ));
        assert_eq!(print_calls(&code), 4);
    }

    #[test]
    fn resolves_self_and_longest_module_prefix() {
        let graph = module_graph(&files(&[
            ("k/mod.rs", "mod x; mod y;"),
            ("k/x/mod.rs", "mod p; use self::p::Q;"),
            ("k/x/p.rs", "use crate::k::y::z::Deep;"),
            ("k/y.rs", "use crate::k::x::p;"),
        ]));
        assert_eq!(graph["k::x::p"], BTreeSet::from(["k::y".to_string()]));
        assert_eq!(
            cycles(&graph),
            vec![vec!["k::x::p".to_string(), "k::y".into()]]
        );
    }
}

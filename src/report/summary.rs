//! The answer at a glance, kwk-eval's default stdout: one line per row that fits 100
//! columns (engine, type, bits per weight, ΔPPL %, KLD, pp and tg, and for each kwk row its
//! paired speed ratios over the llama.cpp row nearest in size), then one verdict line per
//! size ("at ≤ X bpw the lowest loss is …, the fastest is …"). Every other column is in
//! `--output wide`, report.md and the data files. A leaf of `report`: it reads
//! [`Results`] and writes strings.

use super::table::notes;
use crate::protocol::results::{Engine, Results, RowStatus, RunnerRecord};
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

/// The width the compact table keeps to.
pub const WIDTH: usize = 100;
/// The widest a row's type label may be before it is cut (with `…`).
const TYPE_WIDTH: usize = 22;

pub use super::labels::{plot_label, type_label};

/// `s` cut to at most `width` terminal columns, ending in `…` when cut; line breaks and
/// tabs shown as spaces, other control characters and bidirectional overrides (which would
/// reorder the rest of the line) as `?`.
pub fn fit(s: &str, width: usize) -> String {
    let bidi = |c: char| matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    let clean: String = s
        .chars()
        .map(|c| match c {
            '\n' | '\t' | '\r' => ' ',
            c if c.is_control() || bidi(c) => '?',
            c => c,
        })
        .collect();
    if clean.width() <= width {
        return clean;
    }
    let mut out = String::new();
    let mut used = 0;
    for c in clean.chars() {
        let w = c.width().unwrap_or(0);
        if used + w + 1 > width {
            break;
        }
        out.push(c);
        used += w;
    }
    out.push('…');
    out
}

/// The llama.cpp row nearest to `r` in bits per weight that `r` has paired speed ratios
/// against.
fn nearest_peer<'a>(results: &'a Results, r: &RunnerRecord) -> Option<&'a RunnerRecord> {
    let bpw = r.bits_per_weight?;
    results
        .runners
        .iter()
        .filter(|x| x.engine.is_external() && x.error.is_none())
        .filter(|x| {
            results
                .speed_ratios
                .iter()
                .any(|s| s.row == r.name && s.vs == x.name)
        })
        .filter_map(|x| Some((x, (x.bits_per_weight? - bpw).abs())))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(x, _)| x)
}

fn ratio(results: &Results, row: &str, vs: &str, test: &str) -> String {
    results
        .speed_ratios
        .iter()
        .find(|s| s.row == row && s.vs == vs && s.test == test)
        .map_or_else(String::new, |s| format!("{:.2}x", s.median))
}

fn num(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.decimals$}"))
}

fn rate(v: Option<f64>) -> String {
    // Three significant figures are what a run's spread supports.
    v.map_or_else(
        || "-".into(),
        |x| {
            if x >= 100.0 {
                format!("{x:.0}")
            } else {
                format!("{x:.1}")
            }
        },
    )
}

/// The compact table's cells: header and one row per runner.
fn cells(r: &Results) -> (Vec<String>, Vec<Vec<String>>) {
    let header = [
        "engine", "type", "bpw", "ΔPPL %", "KLD", "pp t/s", "tg t/s", "vs", "pp ×", "tg ×",
    ]
    .map(String::from)
    .to_vec();
    let rows = r
        .runners
        .iter()
        .map(|x| {
            let engine = fit(x.engine.as_str(), 9);
            let ty = fit(&type_label(x), TYPE_WIDTH);
            if x.status != RowStatus::Ok || x.error.is_some() {
                let why = x.status_reason.as_deref().or(x.error.as_deref());
                let status = if x.status == RowStatus::Skipped {
                    "SKIPPED"
                } else {
                    "FAILED"
                };
                let mut c = vec![engine, ty, status.into(), fit(why.unwrap_or("-"), 60)];
                c.resize(header.len(), String::new());
                return c;
            }
            let (vs, pp, tg) = match nearest_peer(r, x) {
                Some(p) if x.engine == Engine::Kwk => (
                    fit(&type_label(p), 14),
                    ratio(r, &x.name, &p.name, &r.protocol.primary_ratio_test("pp")),
                    ratio(r, &x.name, &p.name, &r.protocol.primary_ratio_test("tg")),
                ),
                _ => Default::default(),
            };
            vec![
                engine,
                ty,
                num(x.bits_per_weight, 2),
                x.ppl_delta_pct.map_or("-".into(), |d| format!("{d:+.2}")),
                num(x.kld_mean, 4),
                rate(x.pp_tokens_per_s),
                rate(x.tg_tokens_per_s),
                vs,
                pp,
                tg,
            ]
        })
        .collect();
    (header, rows)
}

/// Every cell padded to its column's display width: engine, type and `vs` left-aligned,
/// figures right; a failed row's message runs on unpadded after its type.
fn padded(header: &[String], rows: &[Vec<String>]) -> Vec<Vec<String>> {
    let failed = |c: &[String]| c.get(2).is_some_and(|s| s == "FAILED" || s == "SKIPPED");
    let mut widths: Vec<usize> = header.iter().map(|h| h.width()).collect();
    for row in rows.iter().filter(|c| !failed(c)) {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.width());
        }
    }
    std::iter::once(header)
        .chain(rows.iter().map(Vec::as_slice))
        .map(|cells| {
            let mut out = Vec::new();
            for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
                if failed(cells) && i == 3 {
                    out.push(c.clone());
                    break;
                }
                let fill = " ".repeat(w.saturating_sub(c.width()));
                out.push(if i < 2 || i == 7 {
                    format!("{c}{fill}")
                } else {
                    format!("{fill}{c}")
                });
            }
            out
        })
        .collect()
}

/// The header, a rule and the rows as aligned lines.
fn aligned(header: &[String], rows: &[Vec<String>]) -> String {
    let lines: Vec<String> = padded(header, rows)
        .iter()
        .map(|c| c.join("  ").trim_end().to_string())
        .collect();
    let mut s = lines[0].clone();
    s.push('\n');
    s.push_str(&"-".repeat(lines[0].width()));
    s.push('\n');
    for l in &lines[1..] {
        s.push_str(l);
        s.push('\n');
    }
    s
}

/// One line per size: among the rows at or under each row's bits per weight, the one
/// that loses least (ΔPPL) and the fastest at generating (tg). Sizes whose answer is the
/// same as the size below are left out.
pub fn verdicts(r: &Results) -> Vec<String> {
    let ok: Vec<&RunnerRecord> = r
        .runners
        .iter()
        .filter(|x| x.status == RowStatus::Ok && x.error.is_none() && x.bits_per_weight.is_some())
        .collect();
    let mut sizes: Vec<f64> = ok.iter().filter_map(|x| x.bits_per_weight).collect();
    sizes.sort_by(f64::total_cmp);
    sizes.dedup_by(|a, b| (*a - *b).abs() < 0.005);
    let label = |x: &RunnerRecord| format!("{} {}", x.engine, type_label(x));
    let mut out = Vec::new();
    let mut last = None;
    for size in sizes {
        let within: Vec<&&RunnerRecord> = ok
            .iter()
            .filter(|x| x.bits_per_weight.is_some_and(|b| b <= size + 0.005))
            .collect();
        let best = within
            .iter()
            .filter(|x| x.ppl_delta_pct.is_some())
            .min_by(|a, b| {
                a.ppl_delta_pct
                    .unwrap()
                    .total_cmp(&b.ppl_delta_pct.unwrap())
            });
        let fastest = within
            .iter()
            .filter(|x| x.tg_tokens_per_s.is_some())
            .max_by(|a, b| {
                a.tg_tokens_per_s
                    .unwrap()
                    .total_cmp(&b.tg_tokens_per_s.unwrap())
            });
        let key = (
            best.map(|x| x.name.clone()),
            fastest.map(|x| x.name.clone()),
        );
        if best.is_none() && fastest.is_none() || last.as_ref() == Some(&key) {
            continue;
        }
        last = Some(key);
        let mut line = format!("at ≤ {size:.2} bpw:");
        if let Some(b) = best {
            line.push_str(&format!(
                " lowest loss {} ({:+.2} %)",
                label(b),
                b.ppl_delta_pct.unwrap_or_default()
            ));
        }
        if let Some(f) = fastest {
            line.push_str(&format!(
                "{} fastest {} (tg {} t/s)",
                if best.is_some() { ";" } else { "" },
                label(f),
                rate(f.tg_tokens_per_s)
            ));
        }
        out.push(line);
    }
    out
}

/// The default stdout: the compact table, the verdicts, and the notes (failures, the
/// noisy-host warning, rows that differ), each line cut to [`WIDTH`] columns except the
/// notes, which wrap as the terminal likes.
pub fn render(r: &Results) -> String {
    let (header, rows) = cells(r);
    let mut s = aligned(&header, &rows);
    for v in verdicts(r) {
        s.push_str(&v);
        s.push('\n');
    }
    // With llama.cpp's ladder, what each engine's best loses at each of its sizes.
    if r.runners.iter().any(|x| x.made.is_some()) {
        for l in super::pareto::size_lines(r) {
            s.push_str(&l);
            s.push('\n');
        }
    }
    let speed = r.runners.iter().any(|x| x.tg_tokens_per_s.is_some());
    if speed {
        s.push_str("pp × / tg ×: a kwk row's tokens/s over the llama.cpp row named in `vs` (nearest in size), median of the rounds paired by time\n");
        if !r.cells.is_empty() {
            s.push_str("(merged: between rows of different cells the ratio is unpaired, median over median, same CPU and threads only)\n");
        }
        if r.protocol.speed_axes.is_some() {
            let tests = r
                .runners
                .iter()
                .map(|x| x.speed_points.len())
                .max()
                .unwrap_or(0);
            let p = &r.protocol;
            s.push_str(&format!(
                "speed sweep: the columns are {} and {}; all {tests} tests of every row in speed_points.csv\n",
                p.primary_test_label("pp"),
                p.primary_test_label("tg")
            ));
        }
    }
    let loud = ["SPEED UNRELIABLE", "FAILED", "SKIPPED", "WARNING"];
    for n in notes(r)
        .into_iter()
        .filter(|n| loud.iter().any(|p| n.starts_with(p)))
    {
        s.push_str(&n);
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::results::testdata::sample_results;
    use crate::protocol::speed_ratios::SpeedRatio;

    fn gguf(name: &str, bpw: f64, dppl: f64, tg: f64) -> RunnerRecord {
        let mut r = sample_results().runners[1].clone();
        r.name = format!("gguf:{name}");
        r.engine = Engine::LlamaCpp;
        r.bits_per_weight = Some(bpw);
        r.ppl_delta_pct = Some(dppl);
        r.tg_tokens_per_s = Some(tg);
        r
    }

    fn results() -> Results {
        let mut r = sample_results();
        r.runners[0].bits_per_weight = Some(32.0);
        r.runners[1].bits_per_weight = Some(5.74);
        r.runners[1].ppl_delta_pct = Some(0.37);
        r.runners[1].tg_tokens_per_s = Some(383.1);
        r.runners
            .push(gguf("SmolLM2-135M-Instruct-Q8_0.gguf", 8.51, 0.42, 151.2));
        r.runners.push(gguf(
            "SmolLM2-135M-Instruct-Q4_K_M-imatrix.gguf",
            6.17,
            5.59,
            146.6,
        ));
        r.runners
            .push(gguf("SmolLM2-135M-Instruct-Q4_0.gguf", 5.35, 25.8, 204.9));
        for (vs, pp, tg) in [
            ("gguf:SmolLM2-135M-Instruct-Q8_0.gguf", 3.5, 1.9),
            ("gguf:SmolLM2-135M-Instruct-Q4_K_M-imatrix.gguf", 3.9, 2.6),
            ("gguf:SmolLM2-135M-Instruct-Q4_0.gguf", 2.4, 1.8),
        ] {
            for (test, m) in [("pp", pp), ("tg", tg)] {
                r.speed_ratios.push(SpeedRatio {
                    test: test.into(),
                    row: "int4".into(),
                    vs: vs.into(),
                    rounds: 2,
                    median: m,
                    min: m,
                    max: m,
                });
            }
        }
        r
    }

    #[test]
    fn type_labels_name_engine_types() {
        let mut r = sample_results().runners[1].clone();
        assert_eq!(type_label(&r), "int4");
        for (file, want) in [
            ("gguf:SmolLM2-135M-Instruct-Q8_0.gguf", "Q8_0"),
            (
                "gguf:SmolLM2-135M-Instruct-Q4_K_M-imatrix.gguf",
                "Q4_K_M-imatrix",
            ),
            ("gguf:model.q4_k_m.gguf", "q4_k_m"),
            ("gguf:Q4_0-then-Q8_0.gguf", "Q8_0"),
            ("gguf:my-model.gguf", "my-model"),
            ("gguf:ä-模型-IQ4_XS.gguf", "IQ4_XS"),
            ("gguf:BF16X.gguf", "BF16X"),
        ] {
            r.name = file.into();
            assert_eq!(type_label(&r), want, "{file}");
        }
    }

    /// Rows named by engine (`--peer llama.cpp,ik`), and ik_llama.cpp's own types.
    #[test]
    fn type_labels_of_rows_named_by_engine() {
        let mut r = sample_results().runners[1].clone();
        for (engine, name, want) in [
            (Engine::LlamaCpp, "llama.cpp:Q4_K_M", "Q4_K_M"),
            (Engine::Ik, "ik:Q4_K_M", "Q4_K_M"),
            (Engine::Ik, "ik:SmolLM2-IQ4_KS.gguf", "IQ4_KS"),
            (Engine::Ik, "ik:m-IQ4_KSS-imatrix.gguf", "IQ4_KSS-imatrix"),
            (Engine::Ik, "ik:m-IQ3_K.gguf", "IQ3_K"),
            (Engine::Kwk, "ik:Q4_K_M", "ik:Q4_K_M"),
        ] {
            r.engine = engine;
            r.name = name.into();
            assert_eq!(type_label(&r), want, "{name}");
        }
        // The plots tell ik's points from llama.cpp's by their label.
        r.engine = Engine::Ik;
        r.name = "ik:Q4_K_M".into();
        assert_eq!(plot_label(&r), "ik:Q4_K_M");
        r.engine = Engine::LlamaCpp;
        r.name = "llama.cpp:Q4_K_M".into();
        assert_eq!(plot_label(&r), "Q4_K_M");
    }

    #[test]
    fn the_table_fits_100_columns_for_long_and_wide_names() {
        let mut r = results();
        r.runners.push(gguf(
            &format!("{}-Q5_K_M-{}.gguf", "x".repeat(80), "模型".repeat(30)),
            6.6,
            1.0,
            150.0,
        ));
        r.runners.push(gguf(
            "emoji-😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀.gguf",
            9.0,
            1.0,
            150.0,
        ));
        r.runners.push(gguf(
            "line\nbreak-and-\u{202e}rtl-\u{301}.gguf",
            9.0,
            1.0,
            150.0,
        ));
        let t = render(&r);
        for l in t.lines().take(2 + r.runners.len()) {
            assert!(l.width() <= WIDTH, "{} columns: {l}", l.width());
            assert!(
                !l.contains('\u{202e}'),
                "bidi overrides are shown as '?': {l}"
            );
        }
        assert!(t.contains('…'), "long names are cut: {t}");
        // Columns align by display width: every cell of a column is as wide as the others.
        let (header, rows) = cells(&r);
        let p = padded(&header, &rows);
        for col in 0..header.len() {
            let w: Vec<usize> = p.iter().map(|c| c[col].width()).collect();
            assert!(w.iter().all(|x| *x == w[0]), "column {col}: {w:?}");
        }
    }

    #[test]
    fn kwk_rows_carry_ratios_over_the_nearest_size() {
        let t = render(&results());
        let int4 = t
            .lines()
            .find(|l| l.starts_with("kwk") && l.contains("int4"))
            .unwrap();
        // int4 (5.74) is nearest to Q4_0 (5.35).
        assert!(
            int4.contains("Q4_0") && int4.contains("2.40x") && int4.contains("1.80x"),
            "{int4}"
        );
        assert!(t.contains("Q4_K_M-imatrix"), "{t}");
    }

    #[test]
    fn verdict_lines_per_size() {
        let v = verdicts(&results());
        assert_eq!(
            v[0],
            "at ≤ 5.35 bpw: lowest loss llama.cpp Q4_0 (+25.80 %); fastest llama.cpp Q4_0 (tg 205 t/s)"
        );
        assert_eq!(
            v[1],
            "at ≤ 5.74 bpw: lowest loss kwk int4 (+0.37 %); fastest kwk int4 (tg 383 t/s)"
        );
        // 6.17 and 8.51 change nothing: int4 stays best and fastest; 32 bpw brings float32.
        assert_eq!(v.len(), 3, "{v:?}");
        assert!(
            v[2].starts_with("at ≤ 32.00 bpw: lowest loss kwk float32"),
            "{v:?}"
        );
    }

    #[test]
    fn a_failed_row_says_so_in_its_line() {
        let mut r = results();
        r.runners[2].error = Some("llama-perplexity exited with status 1".into());
        let t = render(&r);
        let l = t.lines().find(|l| l.contains("Q8_0")).unwrap();
        assert!(
            l.contains("FAILED") && l.contains("exited with status 1"),
            "{l}"
        );
    }
}

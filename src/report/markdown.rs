//! report.md: the table, the protocol and the calibration in one line each, loud warnings (incomplete run, tokens
//! that differ between kwk-eval and llama.cpp, failed runners), and the plots.

use super::exporter::{Exporter, Run};
use super::plot::PlotFiles;
use super::table::{
    calibration_line, distinct, notes, one_line, protocol_line, ratio_cell, table_rows,
};
use crate::protocol::points::{kv_bytes_per_value, kv_cache_bytes, size};
use crate::protocol::results::{Engine, Results, RunnerRecord};
use anyhow::Result;
use std::fmt::Write as _;

/// `s` as Markdown text that renders as itself on one line: `\`, `|`, `` ` ``, `*`, `[`,
/// `]` escaped, `<`, `>`, `&` as entities (no HTML), line breaks and other control
/// characters shown escaped ([`one_line`]), so a name keeps a table row's columns.
pub fn md_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in one_line(s).chars() {
        match c {
            '\\' | '|' | '`' | '*' | '[' | ']' => {
                out.push('\\');
                out.push(c);
            }
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            _ => out.push(c),
        }
    }
    out
}

/// Loud lines first: an incomplete run, tokens that differ, failed runners.
fn warnings(r: &Results) -> String {
    let mut s = String::new();
    if !r.complete {
        let _ = writeln!(
            s,
            "> **INCOMPLETE RUN.** Not every planned row was measured (the run was interrupted, \
             is still going, or a row failed or was skipped): see each row's status.\n"
        );
    }
    if let Some(w) = r.machine.steadiness.as_ref().and_then(|x| x.warning()) {
        let _ = writeln!(s, "> **SPEED UNRELIABLE.** {w}.\n");
    }
    for row in r.runners.iter().filter(|x| x.tokens_match == Some(false)) {
        let _ = writeln!(
            s,
            "> **WARNING: TOKENS DIFFER.** {} ({}) tokenized the text to other ids than \
             kwk-eval; its perplexity is not comparable with the other rows.\n",
            md_text(&row.name),
            md_text(row.engine.as_str())
        );
    }
    for row in r.failures() {
        let _ = writeln!(
            s,
            "> **FAILED: {}** — {}\n",
            md_text(&row.name),
            md_text(row.error.as_deref().unwrap_or_default())
        );
    }
    for row in r.skipped() {
        let _ = writeln!(
            s,
            "> **SKIPPED: {}** — {}\n",
            row.name,
            row.status_reason.as_deref().unwrap_or_default()
        );
    }
    s
}

/// The llama.cpp build, with its commit and how it was judged new enough when known.
fn llama_cpp_version(v: &crate::protocol::results::Versions) -> String {
    let build = match (&v.llama_cpp, &v.llama_cpp_version) {
        (Some(b), _) => format!("build {b}"),
        (None, Some(v)) => format!("'{v}'"),
        (None, None) => return "-".into(),
    };
    match &v.llama_cpp_build {
        Some(b) => format!(
            "{build} (commit {}; judged new enough by {})",
            b.commit.as_deref().unwrap_or("unknown"),
            b.judged_by
        ),
        None => build,
    }
}

/// The machine and versions, in one sentence.
fn machine_line(r: &Results) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Machine: {} ({} threads; kwk kernels {}; CPU features {}). Versions: kwk {}, kwk-eval {}, llama.cpp {}{}. Started {}.",
        r.machine.cpu,
        r.machine.threads_label(),
        r.machine.kernels.as_deref().unwrap_or("-"),
        if r.machine.isa.is_empty() { "-".into() } else { r.machine.isa.join(", ") },
        r.versions.kwk.as_deref().unwrap_or("unknown"),
        r.versions.kwk_eval,
        llama_cpp_version(&r.versions),
        r.versions
            .ik_llama_cpp
            .as_ref()
            .map_or(String::new(), |v| format!(", ik_llama.cpp {v}")),
        r.started_utc
    );
    // Every GGUF row of an engine runs the same tools, so one build; its features, as it
    // reports them, and the settings its rows passed.
    for engine in [Engine::LlamaCpp, Engine::Ik] {
        let distinct = |field: fn(&RunnerRecord) -> Option<&str>| {
            let mut v: Vec<&str> = r
                .runners
                .iter()
                .filter(|row| row.engine == engine)
                .filter_map(field)
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let builds = distinct(|row| row.kernels.as_deref());
        if !builds.is_empty() {
            let _ = writeln!(
                s,
                "\n{engine} kernels (it picks its best among those its build has): {}.",
                builds.join("; ")
            );
        }
        let flags = distinct(|row| row.engine_flags.as_deref());
        if !flags.is_empty() {
            let _ = writeln!(s, "\n{engine} rows ran with: {}.", flags.join("; "));
        }
    }
    if let Some(cleared) = &r.versions.llama_cpp_env_cleared {
        let _ = writeln!(
            s,
            "\nllama.cpp environment: {}.",
            if cleared.is_empty() {
                "no variable needed clearing".to_string()
            } else {
                format!("cleared {} before every tool ran", cleared.join(", "))
            }
        );
    }
    s
}

/// The paired speed ratios (`results.speed_ratios`) as one table per test: in-tree rows
/// down, the rows they are compared with across.
fn ratio_tables(r: &Results) -> String {
    let mut s = String::new();
    if r.speed_ratios.is_empty() {
        return s;
    }
    let _ = writeln!(
        s,
        "**Speed ratios, paired by round:** a row's tokens/s over the column's in the same \
         round, median [lowest–highest] over the rounds both ran (the host's drift between \
         rounds cancels in each ratio; its drift within a round does not).\n"
    );
    // One table per test: the plain `pp`/`tg` of the primary point, then every point of a
    // speed sweep (`pp512@d4096`), each headed by its test's name.
    for test in distinct(r.speed_ratios.iter(), |x| x.test.as_str()) {
        let of_test = || r.speed_ratios.iter().filter(move |x| x.test == test);
        let rows = distinct(of_test(), |x| x.row.as_str());
        let columns = distinct(of_test(), |x| x.vs.as_str());
        if rows.is_empty() {
            continue;
        }
        let head = match test {
            "pp" | "tg" => r.protocol.primary_test_label(test),
            t => t.to_string(),
        };
        let names: Vec<String> = columns.iter().map(|c| md_text(c)).collect();
        let _ = writeln!(s, "| {} | {} |", md_text(&head), names.join(" | "));
        let _ = writeln!(s, "|---|{}|", vec!["---:"; columns.len()].join("|"));
        for row in rows {
            let cells: Vec<String> = columns
                .iter()
                .map(|c| ratio_cell(r, row, c, test))
                .collect();
            let _ = writeln!(s, "| {} | {} |", md_text(row), cells.join(" | "));
        }
        let _ = writeln!(s);
    }
    s
}

/// The speed sweep (issue 39): its points, the KV cache's bytes per token and size at the
/// largest depth for each KV type the rows ran, the long CSV and the sweep's plots; empty
/// for a run of one point at depth 0 (its KV line then only with a depth).
fn sweep_section(r: &Results) -> String {
    let mut s = String::new();
    let plots = |s: &mut String| {
        for svg in super::plot_sweep::sweep_plot_svgs(r) {
            let _ = writeln!(s, "![speed across the sweep]({svg})\n");
        }
    };
    // A merged report whose cells ran at different depths has no one sweep, but its
    // speed-against-depth plot.
    let Some(a) = &r.protocol.speed_axes else {
        plots(&mut s);
        return s;
    };
    let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let _ = writeln!(
        s,
        "**Speed sweep:** pp {}, tg {}, depth {}, threads {} (depth: tokens prefilled, \
         untimed, before each timed test, llama-bench's -d); every figure, one line per row, \
         test, depth and threads: speed_points.csv.\n",
        list(&a.pp),
        list(&a.tg),
        list(&a.depth),
        list(&a.threads)
    );
    if let Some(values) = r.protocol.kv_values_per_token {
        let longest = a.longest_test();
        let mut types: Vec<&str> = Vec::new();
        for t in r.runners.iter().filter_map(|x| x.kv_type.as_deref()) {
            if !types.contains(&t) {
                types.push(t);
            }
        }
        for t in types {
            let (Some(per), Some(total)) = (
                kv_bytes_per_value(t).map(|b| b * values as f64),
                kv_cache_bytes(values, t, longest),
            ) else {
                continue;
            };
            let _ = writeln!(
                s,
                "- KV cache {t}: {per} bytes per token; {} at the largest depth ({} + {} \
                 tokens of the longest test)",
                size(total),
                a.max_depth(),
                longest - a.max_depth()
            );
        }
        let _ = writeln!(s);
    }
    plots(&mut s);
    s
}

/// A Markdown table: the header, left-aligned first three columns, right-aligned numbers,
/// every cell escaped.
fn table<H: AsRef<str>>(s: &mut String, header: &[H], rows: &[Vec<String>]) {
    let names: Vec<&str> = header.iter().map(AsRef::as_ref).collect();
    let _ = writeln!(s, "| {} |", names.join(" | "));
    let align: Vec<&str> = (0..names.len())
        .map(|i| if i < 3 { "---" } else { "---:" })
        .collect();
    let _ = writeln!(s, "|{}|", align.join("|"));
    for row in rows {
        let cells: Vec<String> = row.iter().map(|c| md_text(c)).collect();
        let _ = writeln!(s, "| {} |", cells.join(" | "));
    }
}

pub fn render(r: &Results, plots: &PlotFiles) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# kwk-eval: {}\n", md_text(&r.model));
    s.push_str(&warnings(r));
    let _ = writeln!(s, "**Protocol:** {}\n", protocol_line(r));
    if let Some(c) = calibration_line(r) {
        let _ = writeln!(s, "**Calibration:** {c}\n");
    }
    if let Some(kv) = kv_line(r) {
        let _ = writeln!(s, "**KV caches:** {kv}\n");
    }
    let (header, rows) = table_rows(r);
    table(&mut s, &header, &rows);
    let _ = writeln!(s);
    // Failures, token warnings and a busy machine are in the banner at the top, the
    // roofline's ceilings under the machine line at the end.
    let elsewhere = [
        "FAILED",
        "SKIPPED",
        "WARNING",
        "SPEED UNRELIABLE",
        "Roofline ceilings",
    ];
    for n in notes(r)
        .iter()
        .filter(|n| !elsewhere.iter().any(|e| n.starts_with(e)))
    {
        let _ = writeln!(s, "- {}", one_line(n).replace('<', "&lt;"));
    }
    let reference = md_text(r.ppl_delta_reference.as_deref().unwrap_or("-"));
    let _ = writeln!(
        s,
        "\ntensor MiB: bytes of weight data (kwk: packed tensors; GGUF: the sum of its tensor data \
         sizes, metadata excluded; file sizes are in results.csv), the same measure for both engines; bpw: \
         8 · tensor bytes / parameters; PPL ± its uncertainty as llama-perplexity computes it; \
         Δln PPL: ln(PPL/PPL_ref) against {reference} from per-token NLL differences on the \
         same tokens, ± its paired standard error; KLD: mean KL divergence from the reference's \
         distributions ± SE; top-1: how often the most likely token agrees with the reference ± SE \
         (all three from 16-bit log-prob records, llama.cpp's KL-divergence format, for both \
         engines); >2SE: ≠ref: ln(PPL/PPL_ref) beyond two paired standard errors; ≠cmp: ln PPL, KLD or top-1 \
         differs from the --compare-to row beyond two paired standard errors; speeds are mean ± sample stddev of per-repetition tokens/s \
         (llama-bench's definitions), repetitions interleaved across runners (one per runner per \
         round, rotating the order; per-round order in results.json `speed_rounds`, median and \
         range in results.csv); peak RSS: the row's engine's resident peak during its perplexity (kwk: \
         the row's own share of the harness process, measured; llama.cpp: the child's); '-' = not measured.\n"
    );
    if let Some(line) = flash_attn_line(r) {
        let _ = writeln!(s, "{line}\n");
    }
    s.push_str(&ratio_tables(r));
    s.push_str(&pareto_section(r));
    if let Some(q) = &plots.quality {
        let _ = writeln!(s, "![perplexity change vs bits per weight]({q})\n");
    }
    if let Some(t) = &plots.tradeoff {
        let _ = writeln!(s, "![quality against generation speed]({t})\n");
    }
    if let Some(sp) = &plots.speed {
        let _ = writeln!(s, "![prompt and generation speed]({sp})\n");
    }
    s.push_str(&sweep_section(r));
    s.push_str(&machine_line(r));
    if let Some(line) = super::table::peaks_line(r) {
        let _ = writeln!(s, "\n{line}");
    }
    s.push_str(&cells_section(r));
    s
}

/// How the llama.cpp rows' speeds were measured for flash attention (`--llama-fa`), and
/// which setting each test kept: `-fa 1` for every row, or the rows of each setting.
/// `None` when no llama-bench ran.
pub fn flash_attn_line(r: &Results) -> Option<String> {
    let choice = r.protocol.llama_bench_fa.as_deref()?;
    let how = match choice {
        "best" => "the faster of -fa 0 and -fa 1 per test (--llama-fa best: both measured in \
                   each round; the other's figures are in results.json `by_flash_attn`)"
            .to_string(),
        forced => format!(
            "-fa {} alone (--llama-fa {forced})",
            u8::from(forced == "on")
        ),
    };
    let mut tests: Vec<(String, Vec<(bool, String)>)> = Vec::new();
    for row in r.runners.iter().filter(|x| x.engine.is_external()) {
        for p in &row.speed_points {
            let Some(fa) = p.flash_attn else { continue };
            match tests.iter_mut().find(|(t, _)| *t == p.test) {
                Some((_, v)) => v.push((fa, row.name.clone())),
                None => tests.push((p.test.clone(), vec![(fa, row.name.clone())])),
            }
        }
    }
    let kept: Vec<String> = tests
        .iter()
        .map(|(test, rows)| {
            let of = |fa: bool| {
                rows.iter()
                    .filter(|(f, _)| *f == fa)
                    .map(|(_, n)| md_text(n))
                    .collect::<Vec<_>>()
            };
            let (off, on) = (of(false), of(true));
            match (off.is_empty(), on.is_empty()) {
                (true, _) => format!("{test} -fa 1"),
                (_, true) => format!("{test} -fa 0"),
                _ => format!(
                    "{test} -fa 0 ({}), -fa 1 ({})",
                    off.join(", "),
                    on.join(", ")
                ),
            }
        })
        .collect();
    let kept = match kept.is_empty() {
        true => String::new(),
        false => format!("; kept: {}", kept.join("; ")),
    };
    Some(format!("GGUF rows' speeds (llama-bench): {how}{kept}."))
}

/// The rows by KV cache type (`f32: float32; q8: float32+kv:q8, int8`) when they differ,
/// so a row's KLD and ΔPPL can be read as its cache's cost too; `None` when every row
/// keeps the same type (or none records one).
fn kv_line(r: &Results) -> Option<String> {
    let mut types: Vec<(&str, Vec<String>)> = Vec::new();
    for row in &r.runners {
        let Some(t) = row.kv_type.as_deref() else {
            continue;
        };
        let name = md_text(&row.name);
        match types.iter_mut().find(|(x, _)| *x == t) {
            Some((_, names)) => names.push(name),
            None => types.push((t, vec![name])),
        }
    }
    (types.len() > 1).then(|| {
        types
            .iter()
            .map(|(t, names)| format!("{t}: {}", names.join(", ")))
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// A merged report's cells (`kwk-eval merge`): each run folder's model, machine, threads,
/// start and rows; empty for a single run.
fn cells_section(r: &Results) -> String {
    if r.cells.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\n## Cells\n\nThis report merges the run folders below (each row's figures as its cell \
         measured them; ratios with 0 rounds are unpaired, the median of one cell's samples over \
         another's on the same CPU and thread count).\n\n",
    );
    let header = [
        "cell",
        "model",
        "CPU",
        "threads",
        "kernels",
        "started",
        "float32 reference",
        "rows",
    ];
    let rows: Vec<Vec<String>> = r
        .cells
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                c.model.clone(),
                c.machine.cpu.clone(),
                c.machine.threads.to_string(),
                c.machine.kernels.clone().unwrap_or_else(|| "-".into()),
                c.started_utc.clone(),
                reference_cell(&c.protocol),
                c.rows.join(", "),
            ]
        })
        .collect();
    table(&mut s, &header, &rows);
    s
}

/// Which float32 reference a cell compared against: `computed` or `loaded FILE`, and the
/// first 12 hex digits of its digest; `-` without one.
fn reference_cell(p: &crate::protocol::results::Protocol) -> String {
    match &p.reference {
        Some(r) => {
            let what = match (r.source.as_str(), &r.file) {
                ("loaded", Some(f)) => format!("loaded {f}"),
                (s, _) => s.to_string(),
            };
            format!("{what} (sha256 {})", &r.sha256[..r.sha256.len().min(12)])
        }
        None => "-".into(),
    }
}

/// "Size against quality": the frontier table and one line per llama.cpp size
/// ([`super::pareto`]); empty with fewer than two quantized rows.
fn pareto_section(r: &Results) -> String {
    let (header, rows) = super::pareto::table(r);
    if rows.is_empty() {
        return String::new();
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## Size against quality\n\n★ on the frontier of all rows (nothing no larger loses less), ☆ on its own engine's; ΔPPL ± its paired uncertainty against {}; ΔH: the mean change of the predicted distribution's entropy in nats (below 0 the row is surer of itself than the reference, above 0 less sure).\n",
        md_text(r.ppl_delta_reference.as_deref().unwrap_or("the reference"))
    );
    table(&mut s, &header, &rows);
    s.push('\n');
    for l in super::pareto::size_lines(r) {
        let _ = writeln!(s, "- {}", md_text(&l));
    }
    s.push('\n');
    s
}

/// report.md as an [`Exporter`]: [`render`], with the plots drawn beside it.
pub struct Markdown;

impl Exporter for Markdown {
    fn file_name(&self) -> &'static str {
        "report.md"
    }
    fn serialize(&self, run: &Run<'_>) -> Result<Vec<u8>> {
        Ok(render(run.results, run.plots).into_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::results::testdata::sample_results;

    /// The roofline's ceilings are said once, under the machine line.
    #[test]
    fn roofline_ceilings_once() {
        let mut r = sample_results();
        r.machine.peaks = Some(
            serde_json::from_value(serde_json::json!({
                "threads": 2, "isa": "avx2", "fp32_gflops": 100.0, "fp32_instruction": "vfmadd231ps",
                "int8_gops": 400.0, "int8_instruction": "vpmaddubsw", "bf16_gflops": null,
                "read_gbps": 30.0, "read_gbps_probes": [30.0, 20.0], "read_buffer_bytes": 1,
                "compute_probes": 1, "seconds": 1.0
            }))
            .unwrap(),
        );
        let md = render(&r, &PlotFiles::default());
        assert_eq!(md.matches("Roofline ceilings").count(), 1, "{md}");
    }

    /// The flash-attention line: absent without llama-bench, the setting kept per test
    /// otherwise (one setting for all rows, or the rows of each).
    #[test]
    fn flash_attn_line_names_the_setting_kept_per_test() {
        use crate::protocol::points::PointSpeed;
        let mut r = sample_results();
        assert_eq!(flash_attn_line(&r), None);
        r.protocol.llama_bench_fa = Some("best".into());
        let point = |test: &str, fa| PointSpeed {
            test: test.into(),
            flash_attn: Some(fa),
            ..Default::default()
        };
        for (i, fa) in [(0, false), (1, true)] {
            r.runners[i].engine = Engine::LlamaCpp;
            r.runners[i].speed_points = vec![point("pp16", true), point("tg4@d64", fa)];
        }
        let (a, b) = (r.runners[0].name.clone(), r.runners[1].name.clone());
        let line = flash_attn_line(&r).unwrap();
        assert!(
            line.contains("the faster of -fa 0 and -fa 1 per test"),
            "{line}"
        );
        assert!(
            line.ends_with(&format!(
                "kept: pp16 -fa 1; tg4@d64 -fa 0 ({a}), -fa 1 ({b})."
            )),
            "{line}"
        );
        r.protocol.llama_bench_fa = Some("off".into());
        let line = flash_attn_line(&r).unwrap();
        assert!(line.contains("-fa 0 alone (--llama-fa off)"), "{line}");
    }

    #[test]
    fn incomplete_runs_and_token_mismatches_are_loud() {
        let mut r = sample_results();
        let md = render(&r, &PlotFiles::default());
        assert!(!md.contains("INCOMPLETE"));
        assert!(md.contains("| int4 | kwk |"));
        assert!(md.contains("+0.02470 ± 0.00400"));
        assert!(md.contains("2 interleaved rounds"));
        // int4's samples over float32's, round by round: 1480/990 and 1520/1010.
        assert!(md.contains("| pp16 | float32 |"), "{md}");
        assert!(md.contains("| int4 | 1.50 [1.49–1.50] |"), "{md}");
        assert!(md.contains("| tg4 | float32 |"), "{md}");
        assert!(
            md.contains("llama.cpp environment: cleared LLAMA_ARG_CTX_SIZE before every tool ran.")
        );
        r.complete = false;
        r.runners[1].tokens_match = Some(false);
        let md = render(
            &r,
            &PlotFiles {
                quality: Some("q.svg".into()),
                ..PlotFiles::default()
            },
        );
        assert!(md.contains("INCOMPLETE RUN"));
        assert!(md.contains("TOKENS DIFFER"));
        assert!(md.contains("![perplexity change vs bits per weight](q.svg)"));
    }
}

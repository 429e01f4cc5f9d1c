//! The size/quality frontier of a run: every measured row of both engines sorted by bits
//! per weight, with ΔPPL and its paired uncertainty, KLD, top-1, pp, tg and peak memory, the
//! rows no other row beats marked ([`frontier`]), and one line per llama.cpp size saying what
//! each engine's best loses within it ([`size_lines`]). A leaf of `report`: it reads
//! [`Results`] and writes strings.
//!
//! A row is on the frontier when no other row is at most as large (bits per weight, every
//! tensor counted) and loses less (lower ΔPPL). "Both" marks the frontier over all rows, an
//! engine's own frontier is marked too, so "kwk's frontier lies below llama.cpp's" can be
//! read off the table row by row.

use super::labels::type_label;
use crate::protocol::results::{Engine, Results, RowStatus, RunnerRecord};

/// Rows quantized below this many bits per weight take part; the float references (16 and
/// 32) are kept in the table but are not a choice the frontier is about.
const QUANTIZED_BELOW: f64 = 12.0;

fn measured(r: &Results) -> Vec<&RunnerRecord> {
    let mut rows: Vec<&RunnerRecord> = r
        .runners
        .iter()
        .filter(|x| {
            x.status == RowStatus::Ok
                && x.error.is_none()
                && x.bits_per_weight.is_some()
                && x.ppl_delta_pct.is_some()
        })
        .collect();
    rows.sort_by(|a, b| {
        a.bits_per_weight
            .unwrap_or(0.0)
            .total_cmp(&b.bits_per_weight.unwrap_or(0.0))
            .then(a.name.cmp(&b.name))
    });
    rows
}

/// Whether `row` is beaten among `others`: one no larger that loses less (or as little and
/// is smaller).
fn beaten(row: &RunnerRecord, others: &[&RunnerRecord]) -> bool {
    let (b, d) = (
        row.bits_per_weight.unwrap_or(0.0),
        row.ppl_delta_pct.unwrap_or(0.0),
    );
    others.iter().any(|o| {
        if o.name == row.name {
            return false;
        }
        let (ob, od) = (
            o.bits_per_weight.unwrap_or(0.0),
            o.ppl_delta_pct.unwrap_or(0.0),
        );
        (ob <= b + 1e-9 && od < d) || (ob < b - 1e-9 && od <= d)
    })
}

/// Where a row stands: on the frontier of all rows, on its engine's own, or neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    Both,
    OwnEngine,
    None,
}

impl Mark {
    pub fn symbol(self) -> &'static str {
        match self {
            Mark::Both => "★",
            Mark::OwnEngine => "☆",
            Mark::None => "",
        }
    }
}

/// The frontier mark of every quantized measured row, in size order.
pub fn frontier(r: &Results) -> Vec<(&RunnerRecord, Mark)> {
    let rows = measured(r);
    let quantized: Vec<&RunnerRecord> = rows
        .iter()
        .copied()
        .filter(|x| x.bits_per_weight.unwrap_or(0.0) < QUANTIZED_BELOW)
        .collect();
    rows.iter()
        .map(|&x| {
            if x.bits_per_weight.unwrap_or(0.0) >= QUANTIZED_BELOW {
                return (x, Mark::None);
            }
            let own: Vec<&RunnerRecord> = quantized
                .iter()
                .copied()
                .filter(|o| o.engine == x.engine)
                .collect();
            let mark = if !beaten(x, &quantized) {
                Mark::Both
            } else if !beaten(x, &own) {
                Mark::OwnEngine
            } else {
                Mark::None
            };
            (x, mark)
        })
        .collect()
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// A signed figure, e.g. `-0.022`; `-` when absent.
fn signed(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:+.digits$}"))
}

/// ΔPPL % and its paired uncertainty (from ln PPL/PPL_ref ± SE), e.g. `+1.23 ± 0.40`.
fn delta(x: &RunnerRecord) -> String {
    let d = num(x.ppl_delta_pct, 2);
    match (x.ln_ppl_ratio, x.ln_ppl_ratio_err) {
        (Some(l), Some(e)) => format!(
            "{:+.2} ± {:.2}",
            100.0 * (l.exp() - 1.0),
            100.0 * l.exp() * e
        ),
        _ => d,
    }
}

/// The frontier table's header and cells (empty when fewer than two quantized rows were
/// measured); report.md renders it under "Size against quality".
pub fn table(r: &Results) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let rows = frontier(r);
    let header = vec![
        "", "engine", "type", "bpw", "ΔPPL %", "KLD", "top-1 %", "ΔH", "pp t/s", "tg t/s",
        "peak MiB",
    ];
    let quantized = rows
        .iter()
        .filter(|(x, _)| x.bits_per_weight.unwrap_or(0.0) < QUANTIZED_BELOW)
        .count();
    if quantized < 2 {
        return (header, Vec::new());
    }
    let cells = rows
        .iter()
        .map(|(x, m)| {
            vec![
                m.symbol().to_string(),
                x.engine.to_string(),
                type_label(x),
                num(x.bits_per_weight, 2),
                delta(x),
                num(x.kld_mean, 4),
                num(x.top1_agreement.map(|t| 100.0 * t), 1),
                signed(x.entropy_delta, 3),
                num(x.pp_tokens_per_s, 0),
                num(x.tg_tokens_per_s, 1),
                num(x.peak_rss_bytes.map(|b| b as f64 / (1u64 << 20) as f64), 0),
            ]
        })
        .collect();
    (header, cells)
}

/// The row of `engine` that loses least within `size` bits per weight.
fn best_within<'a>(
    rows: &[&'a RunnerRecord],
    engine: Engine,
    size: f64,
) -> Option<&'a RunnerRecord> {
    rows.iter()
        .copied()
        .filter(|x| x.engine == engine && x.bits_per_weight.is_some_and(|b| b <= size + 0.005))
        .min_by(|a, b| {
            a.ppl_delta_pct
                .unwrap_or(f64::INFINITY)
                .total_cmp(&b.ppl_delta_pct.unwrap_or(f64::INFINITY))
        })
}

/// One line per external engine's size under [`QUANTIZED_BELOW`] bits: "at ≤ X bpw, kwk's
/// best loses a % (its type), llama.cpp's b % (its type)", and ik's with `--peer ik`; empty
/// unless kwk and an external engine have quantized rows.
pub fn size_lines(r: &Results) -> Vec<String> {
    let rows: Vec<&RunnerRecord> = measured(r)
        .into_iter()
        .filter(|x| x.bits_per_weight.unwrap_or(0.0) < QUANTIZED_BELOW)
        .collect();
    let has = |e: Engine| rows.iter().any(|x| x.engine == e);
    // The external engines in the run (llama.cpp, ik_llama.cpp with `--peer ik`), each
    // with its best at every size of theirs.
    let peers: Vec<Engine> = [Engine::LlamaCpp, Engine::Ik]
        .into_iter()
        .filter(|&e| has(e))
        .collect();
    if !has(Engine::Kwk) || peers.is_empty() {
        return Vec::new();
    }
    let mut sizes: Vec<f64> = rows
        .iter()
        .filter(|x| x.engine.is_external())
        .filter_map(|x| x.bits_per_weight)
        .collect();
    sizes.sort_by(f64::total_cmp);
    sizes.dedup_by(|a, b| (*a - *b).abs() < 0.005);
    let show = |x: Option<&RunnerRecord>| match x {
        Some(x) => format!(
            "{:+.2} % ({}, {:.2} bpw)",
            x.ppl_delta_pct.unwrap_or_default(),
            type_label(x),
            x.bits_per_weight.unwrap_or_default()
        ),
        None => "nothing this small".into(),
    };
    sizes
        .into_iter()
        .map(|size| {
            let theirs: Vec<String> = peers
                .iter()
                .map(|&e| format!("{e}'s {}", show(best_within(&rows, e, size))))
                .collect();
            format!(
                "at ≤ {size:.2} bpw: kwk's best loses {}, {}",
                show(best_within(&rows, Engine::Kwk, size)),
                theirs.join(", ")
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::results::testdata::sample_results;

    fn row(name: &str, engine: Engine, bpw: f64, d: f64) -> RunnerRecord {
        RunnerRecord {
            name: name.into(),
            engine,
            bits_per_weight: Some(bpw),
            ppl_delta_pct: Some(d),
            ..Default::default()
        }
    }

    fn results(rows: Vec<RunnerRecord>) -> Results {
        let mut r = sample_results();
        r.runners = rows;
        r
    }

    #[test]
    fn the_frontier_marks_rows_nothing_smaller_beats() {
        let r = results(vec![
            row("float32", Engine::Kwk, 32.0, 0.0),
            row("int8", Engine::Kwk, 8.5, 0.3),
            row("int4", Engine::Kwk, 5.0, 1.0),
            row("gguf:Q8_0", Engine::LlamaCpp, 8.5, 0.2),
            row("gguf:Q4_K_M", Engine::LlamaCpp, 4.9, 3.0),
            row("gguf:Q5_K_M", Engine::LlamaCpp, 5.7, 1.5),
        ]);
        let marks: Vec<(&str, Mark)> = frontier(&r)
            .into_iter()
            .map(|(x, m)| (x.name.as_str(), m))
            .collect();
        assert_eq!(
            marks,
            vec![
                ("gguf:Q4_K_M", Mark::Both),
                ("int4", Mark::Both),
                ("gguf:Q5_K_M", Mark::OwnEngine),
                ("gguf:Q8_0", Mark::Both),
                ("int8", Mark::OwnEngine),
                ("float32", Mark::None),
            ]
        );
        let (_, cells) = table(&r);
        assert_eq!(cells[1][..4], ["★", "kwk", "int4", "5.00"]);
    }

    #[test]
    fn one_line_per_llama_cpp_size_names_each_engines_best() {
        let r = results(vec![
            row("int4", Engine::Kwk, 5.0, 1.0),
            row("gguf:Q4_K_M", Engine::LlamaCpp, 4.9, 3.0),
            row("gguf:Q5_K_M", Engine::LlamaCpp, 5.7, 1.5),
        ]);
        assert_eq!(
            size_lines(&r),
            vec![
                "at ≤ 4.90 bpw: kwk's best loses nothing this small, llama.cpp's +3.00 % (Q4_K_M, 4.90 bpw)".to_string(),
                "at ≤ 5.70 bpw: kwk's best loses +1.00 % (int4, 5.00 bpw), llama.cpp's +1.50 % (Q5_K_M, 5.70 bpw)".to_string(),
            ]
        );
        // With ik_llama.cpp's rows too (`--peer llama.cpp,ik`): its best at each size.
        let r = results(vec![
            row("int4", Engine::Kwk, 5.0, 1.0),
            row("llama.cpp:Q4_K_M", Engine::LlamaCpp, 4.9, 3.0),
            row("ik:Q4_K_M", Engine::Ik, 4.9, 2.5),
        ]);
        assert_eq!(
            size_lines(&r),
            vec!["at ≤ 4.90 bpw: kwk's best loses nothing this small, llama.cpp's +3.00 % (Q4_K_M, 4.90 bpw), ik's +2.50 % (Q4_K_M, 4.90 bpw)".to_string()]
        );
        // One engine alone: no comparison lines.
        let r = results(vec![row("int4", Engine::Kwk, 5.0, 1.0)]);
        assert!(size_lines(&r).is_empty());
        assert!(table(&r).1.is_empty());
    }
}

//! The plots, as PNG and SVG (plotters): perplexity change against bits per weight, every
//! runner a labelled point with its generation speed, each engine's frontier a line (the
//! size/quality trade-off at a glance), and prompt/generation
//! speed as bars with ±1 stddev error bars and a roofline marker (the rate at 100 % of the
//! row's ceiling, labelled with the share reached). Each engine is a series of its own
//! colour and marker: kwk, llama.cpp, and ik_llama.cpp with `--peer ik`. PNG text is drawn with DejaVu Sans, embedded
//! in the binary (assets/fonts, Bitstream Vera licence), so a machine without fonts still
//! gets labelled plots.

use super::summary::{fit, plot_label, type_label};
use crate::protocol::results::{Engine, Results, RunnerRecord};
use crate::scratch::Scratch;
use anyhow::{anyhow, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;
use std::sync::Once;

pub(super) const FONT: &str = "sans-serif";
static REGISTER_FONT: Once = Once::new();

pub(super) fn register_font() {
    REGISTER_FONT.call_once(|| {
        let bytes: &'static [u8] = include_bytes!("../../../assets/fonts/DejaVuSans.ttf");
        // The font is compiled in and known to parse (tested); a failure would only lose
        // PNG text, so it is not fatal here.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, bytes);
    });
}

/// The plot files written (names relative to the run folder), `None` when a plot had no
/// data (e.g. no runner has both a size and a perplexity change yet).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlotFiles {
    pub quality: Option<String>,
    pub speed: Option<String>,
    /// Quality against generation speed.
    pub tradeoff: Option<String>,
}

pub(super) fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing a plot: {e}")
}

/// One row as the plots show it: its label (engine type, as the table names it), engine,
/// size and figures.
struct Point {
    label: String,
    engine: Engine,
    bpw: Option<f64>,
    delta_pct: Option<f64>,
    kld: Option<f64>,
    tg: Option<f64>,
}

fn points(results: &Results) -> Vec<Point> {
    results
        .runners
        .iter()
        .filter(|r| r.error.is_none())
        .map(|r| Point {
            label: fit(&plot_label(r), 28),
            engine: r.engine,
            bpw: r.bits_per_weight,
            delta_pct: r.ppl_delta_pct,
            kld: r.kld_mean.filter(|k| *k > 0.0),
            tg: r.tg_tokens_per_s,
        })
        .collect()
}

/// Rows with both a size and a perplexity change (the quality plot's points).
fn quality_points(results: &Results) -> Vec<Point> {
    points(results)
        .into_iter()
        .filter(|p| p.bpw.is_some() && p.delta_pct.is_some())
        .collect()
}

/// The model's name for titles: the last path component without `.gguf` and without a
/// trailing llama.cpp type (`SmolLM2-135M-Instruct.Q4_1.gguf` reads
/// `SmolLM2-135M-Instruct`).
pub(super) fn model_short_name(model: &str) -> String {
    let last = model
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(model);
    let stem = last.strip_suffix(".gguf").unwrap_or(last);
    let probe = RunnerRecord::failed(&format!("gguf:{stem}"), Engine::LlamaCpp, String::new());
    let ty = type_label(&probe);
    let cut = if ty != stem && stem.ends_with(&ty) {
        stem[..stem.len() - ty.len()].trim_end_matches(['-', '.', '_'])
    } else {
        stem
    };
    fit(if cut.is_empty() { stem } else { cut }, 60)
}

/// The top of a value axis that shows the interesting range: above the largest value,
/// unless a few values (at most a third of them) stand far above the rest (one bad row 25x
/// the others would flatten every other point), in which case the axis stops above the
/// rest and those rows are clipped (drawn at the edge, marked). Returns (axis top, clip at).
fn clipped_top(values: &[f64]) -> (f64, Option<f64>) {
    let mut v: Vec<f64> = values
        .iter()
        .copied()
        .filter(|x| x.is_finite() && *x > 0.0)
        .collect();
    v.sort_by(f64::total_cmp);
    let floor = 0.5;
    let n = v.len();
    for i in (2 * n).div_ceil(3).max(1)..n {
        if v[i] > 4.0 * v[i - 1].max(floor) {
            let top = v[i - 1].max(floor) * 1.5;
            return (top, Some(top));
        }
    }
    (v.last().copied().unwrap_or(floor).max(floor) * 1.15, None)
}

const KWK_COLOR: RGBColor = RGBColor(31, 90, 200);
const LLAMA_COLOR: RGBColor = RGBColor(210, 50, 40);
const IK_COLOR: RGBColor = RGBColor(30, 140, 70);

/// The engines in the order their series are drawn and listed.
const ENGINES: [Engine; 3] = [Engine::Kwk, Engine::LlamaCpp, Engine::Ik];

/// An engine's colour and legend name.
pub(super) fn engine_style(engine: Engine) -> (RGBColor, &'static str) {
    let color = match engine {
        Engine::Kwk => KWK_COLOR,
        Engine::LlamaCpp => LLAMA_COLOR,
        Engine::Ik => IK_COLOR,
    };
    (color, engine.as_str())
}

/// Draws `points` (an iterator of ((x, y), label)) as one engine's series on `chart`, in
/// the engine's colour and shape (kwk circles labelled above, llama.cpp triangles labelled
/// below, ik_llama.cpp squares labelled further below, so rows of one size do not print
/// over each other), with its legend entry.
macro_rules! engine_series {
    ($chart:expr, $points:expr, $engine:expr) => {{
        let (color, name) = engine_style($engine);
        let text = (FONT, 13).into_font().color(&color);
        match $engine {
            Engine::LlamaCpp => {
                $chart
                    .draw_series($points.map(|(at, label): ((f64, f64), String)| {
                        EmptyElement::at(at)
                            + TriangleMarker::new((0, 0), 6, color.filled())
                            + Text::new(label, (7, 2), text.clone())
                    }))
                    .map_err(err)?
                    .label(name)
                    .legend(move |(x, y)| TriangleMarker::new((x + 8, y), 6, color.filled()));
            }
            Engine::Ik => {
                $chart
                    .draw_series($points.map(|(at, label): ((f64, f64), String)| {
                        EmptyElement::at(at)
                            + Rectangle::new([(-5, -5), (5, 5)], color.filled())
                            + Text::new(label, (7, 14), text.clone())
                    }))
                    .map_err(err)?
                    .label(name)
                    .legend(move |(x, y)| {
                        Rectangle::new([(x + 3, y - 5), (x + 13, y + 5)], color.filled())
                    });
            }
            Engine::Kwk => {
                $chart
                    .draw_series($points.map(|(at, label): ((f64, f64), String)| {
                        EmptyElement::at(at)
                            + Circle::new((0, 0), 5, color.filled())
                            + Text::new(label, (7, -15), text.clone())
                    }))
                    .map_err(err)?
                    .label(name)
                    .legend(move |(x, y)| Circle::new((x + 8, y), 5, color.filled()));
            }
        }
    }};
}

fn draw_quality<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, results: &Results) -> Result<()> {
    let all = quality_points(results);
    root.fill(&WHITE).map_err(err)?;
    // The reference formats (16 and 32 bits) would stretch the axis over the 2-9 bits where
    // the choice is made: they are named in a note instead, unless nothing else is there.
    let (on, off): (Vec<&Point>, Vec<&Point>) =
        all.iter().partition(|p| p.bpw.unwrap_or(0.0) <= 12.0);
    let off_axis = !on.is_empty() && !off.is_empty();
    let shown: Vec<&Point> = if on.is_empty() {
        all.iter().collect()
    } else {
        on
    };
    let bpw = |p: &&Point| p.bpw.unwrap_or(0.0);
    let dp = |p: &&Point| p.delta_pct.unwrap_or(0.0);
    let x_lo = (shown.iter().map(bpw).fold(f64::INFINITY, f64::min) - 0.6)
        .floor()
        .max(0.0);
    let x_hi = (shown.iter().map(bpw).fold(0.0, f64::max) + 0.9).ceil();
    let ups: Vec<f64> = shown.iter().map(dp).collect();
    let (y_hi, clip) = clipped_top(&ups);
    let y_lo = shown.iter().map(dp).fold(0.0f64, f64::min);
    let y_lo = y_lo - 0.08 * (y_hi - y_lo).max(0.1);
    let reference = results.ppl_delta_reference.clone().unwrap_or_default();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Quality lost against size: {}",
                model_short_name(&results.model)
            ),
            (FONT, 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(x_lo..x_hi, y_lo..y_hi)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("bits per weight (every tensor counted, embeddings and output included)")
        .y_desc(format!("ΔPPL % vs {reference} (lower is better)"))
        .x_labels(((x_hi - x_lo) as usize + 1).min(24))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FONT, 14))
        .draw()
        .map_err(err)?;
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(x_lo, 0.0), (x_hi, 0.0)],
            BLACK.mix(0.3),
        )))
        .map_err(err)?;
    // Each engine's frontier (its rows that nothing of its own no larger beats) as a
    // line, so whose frontier lies lower reads at a glance.
    for engine in ENGINES {
        let mine: Vec<&&Point> = shown.iter().filter(|p| p.engine == engine).collect();
        let beats = |o: &&&Point, p: &&&Point| {
            (bpw(o) <= bpw(p) && dp(o) < dp(p)) || (bpw(o) < bpw(p) && dp(o) <= dp(p))
        };
        let mut front: Vec<(f64, f64)> = mine
            .iter()
            .filter(|p| !mine.iter().any(|o| beats(o, p)))
            .map(|p| (bpw(p), clip.map_or(dp(p), |c| dp(p).min(c * 0.93))))
            .collect();
        front.sort_by(|a, b| a.0.total_cmp(&b.0));
        if front.len() > 1 {
            let (color, _) = engine_style(engine);
            chart
                .draw_series(std::iter::once(PathElement::new(
                    front,
                    color.mix(0.45).stroke_width(2),
                )))
                .map_err(err)?;
        }
    }
    for engine in ENGINES {
        if !shown.iter().any(|p| p.engine == engine) {
            continue;
        }
        let pts = shown.iter().filter(|p| p.engine == engine).map(|p| {
            // Speed beside the name: generation tokens/s where measured.
            let name = match p.tg {
                Some(tg) => format!("{} · tg {tg:.0}", p.label),
                None => p.label.clone(),
            };
            let (y, label) = match clip {
                Some(c) if dp(p) > c => (c * 0.93, format!("{name} ↑ {:+.1} %", dp(p))),
                _ => (dp(p), name),
            };
            ((bpw(p), y), label)
        });
        engine_series!(chart, pts, engine);
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.4))
        .label_font((FONT, 14))
        .draw()
        .map_err(err)?;
    let mut notes = Vec::new();
    if off_axis {
        let names: Vec<String> = off
            .iter()
            .map(|p| format!("{} {:.0} bpw {:+.2} %", p.label, bpw(p), dp(p)))
            .collect();
        notes.push(format!("off the axis: {}", names.join(", ")));
    }
    if clip.is_some() {
        notes.push("↑: beyond the axis, drawn at its top with its value".to_string());
    }
    for (i, n) in notes.iter().enumerate() {
        // Bottom left, inside the plot, clear of the title and the legend.
        let bottom = root.dim_in_pixel().1 as i32 - 100;
        root.draw(&Text::new(
            n.clone(),
            (95, bottom - 18 * (notes.len() - 1 - i) as i32),
            (FONT, 13).into_font().color(&BLACK.mix(0.7)),
        ))
        .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Rows with a generation speed and a quality figure (the trade-off plot's points).
fn tradeoff_points(results: &Results) -> Vec<Point> {
    points(results)
        .into_iter()
        .filter(|p| p.tg.is_some() && (p.kld.is_some() || p.delta_pct.is_some()))
        .collect()
}

/// Quality against generation speed, the trade-off the tool exists for: KLD (log axis)
/// when at least two rows with a speed have one (rows without are left out), else ΔPPL %,
/// against tg tokens/s; each point labelled with its type and bits per weight.
fn draw_tradeoff<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    results: &Results,
) -> Result<()> {
    let all = tradeoff_points(results);
    root.fill(&WHITE).map_err(err)?;
    let use_kld = all.iter().filter(|p| p.kld.is_some()).count() >= 2;
    let pts: Vec<&Point> = all.iter().filter(|p| !use_kld || p.kld.is_some()).collect();
    let quality = |p: &&Point| {
        if use_kld {
            p.kld.unwrap_or(f64::NAN)
        } else {
            p.delta_pct.unwrap_or(f64::NAN)
        }
    };
    let tg = |p: &&Point| p.tg.unwrap_or(0.0);
    let x_hi = pts.iter().map(tg).fold(1.0, f64::max) * 1.3;
    let label = |p: &&Point| match p.bpw {
        Some(b) => format!("{} · {b:.1} bpw", p.label),
        None => p.label.clone(),
    };
    let title = format!(
        "Quality against speed: {} (lower right is better)",
        model_short_name(&results.model)
    );
    let x_desc = format!("generation tg{} tokens/s (mean)", results.protocol.tg);
    let series = |engine: Engine, y: &dyn Fn(&&Point) -> f64| -> Vec<((f64, f64), String)> {
        pts.iter()
            .filter(|p| p.engine == engine)
            .map(|p| ((tg(p), y(p)), label(p)))
            .collect()
    };
    macro_rules! finish {
        ($chart:expr, $y:expr) => {{
            for engine in ENGINES {
                let points = series(engine, $y);
                if !points.is_empty() {
                    engine_series!($chart, points.into_iter(), engine);
                }
            }
            $chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.9))
                .border_style(BLACK.mix(0.4))
                .label_font((FONT, 14))
                .draw()
                .map_err(err)?;
        }};
    }
    if use_kld {
        // Four decades below the worst row are enough; a row closer to the reference (an
        // F32 GGUF's KLD of 1e-7) sits on the axis's floor.
        let hi = pts.iter().map(quality).fold(0.0, f64::max) * 2.0;
        let lo = (pts.iter().map(quality).fold(f64::INFINITY, f64::min) / 2.0).max(hi * 2e-5);
        let quality = |p: &&Point| quality(p).max(lo);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_hi, (lo..hi).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc("mean KLD vs the reference (log; lower is better)")
            .y_label_formatter(&|v| format!("{v:.0e}"))
            .label_style((FONT, 14))
            .draw()
            .map_err(err)?;
        finish!(chart, &quality);
    } else {
        let ups: Vec<f64> = pts.iter().map(quality).collect();
        let (hi, clip) = clipped_top(&ups);
        let lo = ups.iter().copied().fold(0.0f64, f64::min) - 0.05 * hi;
        let y = |p: &&Point| clip.map_or(quality(p), |c| quality(p).min(c));
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_hi, lo..hi)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc("ΔPPL % (lower is better; rows beyond the axis at its top)")
            .label_style((FONT, 14))
            .draw()
            .map_err(err)?;
        finish!(chart, &y);
    }
    root.present().map_err(err)?;
    Ok(())
}

/// A bar of the speed plot.
struct Bar {
    label: String,
    mean: f64,
    std: f64,
    engine: Engine,
    /// The rate as a percentage of the machine's roofline for this row, when known.
    roofline_pct: Option<f64>,
}

impl Bar {
    /// The rate at 100 % of the roofline (the marker drawn above the bar).
    fn ceiling(&self) -> Option<f64> {
        self.roofline_pct
            .filter(|p| *p > 0.0 && p.is_finite())
            .map(|p| self.mean * 100.0 / p)
    }
}

/// A bar per runner with a figure: `pick` gives (mean, stddev, % of roofline). Ordered
/// by size, largest first, kwk before llama.cpp at the same size, so rows of one size
/// (int8 and Q8_0) stand side by side.
fn speed_bars(
    results: &Results,
    pick: impl Fn(&RunnerRecord) -> Option<(f64, f64, Option<f64>)>,
) -> Vec<Bar> {
    let mut rows: Vec<(Option<f64>, Bar)> = results
        .runners
        .iter()
        .filter_map(|r| {
            pick(r).map(|(mean, std, roofline_pct)| {
                (
                    r.bits_per_weight,
                    Bar {
                        label: fit(&plot_label(r), 16),
                        mean,
                        std,
                        engine: r.engine,
                        roofline_pct,
                    },
                )
            })
        })
        .collect();
    rows.sort_by(|(a, x), (b, y)| {
        b.unwrap_or(0.0)
            .total_cmp(&a.unwrap_or(0.0))
            .then(engine_rank(x.engine).cmp(&engine_rank(y.engine)))
    });
    rows.into_iter().map(|(_, b)| b).collect()
}

/// An engine's place in [`ENGINES`] (kwk first).
fn engine_rank(engine: Engine) -> usize {
    ENGINES
        .iter()
        .position(|e| *e == engine)
        .unwrap_or(ENGINES.len())
}

fn draw_bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    bars: &[Bar],
) -> Result<()> {
    let n = bars.len().max(1);
    // The bars set the scale; a roofline far above them is marked at the top instead, so
    // slow rows stay visible.
    let y_max = bars.iter().map(|b| b.mean + b.std).fold(1.0f64, f64::max) * 1.3;
    let names: Vec<String> = bars.iter().map(|b| b.label.clone()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 17))
        .margin(12)
        .x_label_area_size(60)
        .y_label_area_size(60)
        .build_cartesian_2d((0..n - 1).into_segmented(), 0.0..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc("tokens/s")
        .x_labels(n)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .x_label_style((FONT, 12))
        .label_style((FONT, 13))
        .draw()
        .map_err(err)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let mut r = Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), b.mean),
                ],
                engine_style(b.engine).0.mix(0.75).filled(),
            );
            r.set_margin(0, 0, 5, 5);
            r
        }))
        .map_err(err)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            ErrorBar::new_vertical(
                SegmentValue::CenterOf(i),
                b.mean - b.std,
                b.mean,
                b.mean + b.std,
                BLACK.filled(),
                8,
            )
        }))
        .map_err(err)?;
    // The value of each bar above it.
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            Text::new(
                if b.mean >= 100.0 {
                    format!("{:.0}", b.mean)
                } else {
                    format!("{:.1}", b.mean)
                },
                (SegmentValue::CenterOf(i), b.mean + b.std),
                (FONT, 12)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Bottom)),
            )
        }))
        .map_err(err)?;
    // The roofline marker: a dark line across the bar's slot at the rate 100 % of the
    // row's ceiling would give (grey, at the top edge, when that is beyond the axis), and
    // the share the bar reaches written inside it.
    chart
        .draw_series(bars.iter().enumerate().filter_map(|(i, b)| {
            let ceiling = b.ceiling()?;
            let style = if ceiling > y_max {
                BLACK.mix(0.35).stroke_width(3)
            } else {
                BLACK.stroke_width(2)
            };
            Some(PathElement::new(
                vec![
                    (SegmentValue::Exact(i), ceiling.min(y_max)),
                    (SegmentValue::Exact(i + 1), ceiling.min(y_max)),
                ],
                style,
            ))
        }))
        .map_err(err)?;
    chart
        .draw_series(bars.iter().enumerate().filter_map(|(i, b)| {
            let pct = b.roofline_pct?;
            Some(Text::new(
                format!("{pct:.0}%"),
                (SegmentValue::CenterOf(i), b.mean * 0.5),
                (FONT, 11)
                    .into_font()
                    .color(&WHITE)
                    .pos(Pos::new(HPos::Center, VPos::Center)),
            ))
        }))
        .map_err(err)?;
    Ok(())
}

fn draw_speed<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, results: &Results) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let (head, body) = root.split_vertically(62);
    let panels = body.split_evenly((1, 2));
    let pp = speed_bars(results, |r| {
        Some((
            r.pp_tokens_per_s?,
            r.pp_tokens_per_s_std.unwrap_or(0.0),
            r.pp_roofline_pct,
        ))
    });
    let tg = speed_bars(results, |r| {
        Some((
            r.tg_tokens_per_s?,
            r.tg_tokens_per_s_std.unwrap_or(0.0),
            r.tg_roofline_pct,
        ))
    });
    let p = &results.protocol;
    let title = format!(
        "Speed: {} ({} threads; mean ± stddev of {} rounds)",
        model_short_name(&results.model),
        results.machine.threads_label(),
        p.reps
    );
    head.draw(&Text::new(title, (20, 8), (FONT, 20).into_font()))
        .map_err(err)?;
    // One legend for both panels: kwk and llama.cpp always, ik_llama.cpp when it ran.
    let mut x = 20;
    let ran = |e: Engine| pp.iter().chain(&tg).any(|b| b.engine == e);
    for engine in ENGINES {
        if engine == Engine::Ik && !ran(engine) {
            continue;
        }
        let (color, name) = engine_style(engine);
        head.draw(&Rectangle::new(
            [(x, 38), (x + 14, 52)],
            color.mix(0.75).filled(),
        ))
        .map_err(err)?;
        head.draw(&Text::new(name, (x + 20, 37), (FONT, 14).into_font()))
            .map_err(err)?;
        x += 110;
    }
    head.draw(&Text::new(
        "black line: the rate at 100 % of the row's roofline (grey at the top: beyond the axis); % in a bar: the share reached",
        (x + 10, 38),
        (FONT, 13).into_font().color(&BLACK.mix(0.7)),
    ))
    .map_err(err)?;
    draw_bars(&panels[0], &format!("prompt pp{} tokens/s", p.pp), &pp)?;
    draw_bars(&panels[1], &format!("generation tg{} tokens/s", p.tg), &tg)?;
    root.present().map_err(err)?;
    Ok(())
}

/// A fresh temporary a plot is drawn to (its name ends in `.<name>`, the same extension:
/// plotters picks the image encoding from it) before [`publish`] renames it into place;
/// removed when dropped unpublished.
pub(super) fn tmp(dir: &Path, name: &str) -> Result<Scratch> {
    let mut s = Scratch::create(dir, name)?;
    s.close();
    Ok(s)
}

pub(super) fn publish(dir: &Path, drawn: Vec<(Scratch, &str)>) -> Result<()> {
    for (from, name) in drawn {
        from.persist(&dir.join(name))
            .context("putting a plot into place")?;
    }
    Ok(())
}

/// Every file [`write_plots`] may draw.
pub const PLOT_FILES: &[&str] = &[
    "quality_vs_bpw.png",
    "quality_vs_bpw.svg",
    "quality_vs_speed.png",
    "quality_vs_speed.svg",
    "speed.png",
    "speed.svg",
];

/// Draws both plots into `dir` (PNG and SVG each); returns the SVG names for report.md.
pub fn write_plots(dir: &Path, results: &Results) -> Result<PlotFiles> {
    register_font();
    let mut files = PlotFiles::default();
    if !quality_points(results).is_empty() {
        let png = tmp(dir, "quality_vs_bpw.png")?;
        draw_quality(
            BitMapBackend::new(png.path(), (900, 600)).into_drawing_area(),
            results,
        )?;
        let svg = tmp(dir, "quality_vs_bpw.svg")?;
        draw_quality(
            SVGBackend::new(svg.path(), (900, 600)).into_drawing_area(),
            results,
        )?;
        publish(
            dir,
            vec![(png, "quality_vs_bpw.png"), (svg, "quality_vs_bpw.svg")],
        )?;
        files.quality = Some("quality_vs_bpw.svg".into());
    }
    if tradeoff_points(results).len() >= 2 {
        let png = tmp(dir, "quality_vs_speed.png")?;
        draw_tradeoff(
            BitMapBackend::new(png.path(), (900, 600)).into_drawing_area(),
            results,
        )?;
        let svg = tmp(dir, "quality_vs_speed.svg")?;
        draw_tradeoff(
            SVGBackend::new(svg.path(), (900, 600)).into_drawing_area(),
            results,
        )?;
        publish(
            dir,
            vec![(png, "quality_vs_speed.png"), (svg, "quality_vs_speed.svg")],
        )?;
        files.tradeoff = Some("quality_vs_speed.svg".into());
    }
    let has_speed = results
        .runners
        .iter()
        .any(|r| r.pp_tokens_per_s.is_some() || r.tg_tokens_per_s.is_some());
    if has_speed {
        let png = tmp(dir, "speed.png")?;
        draw_speed(
            BitMapBackend::new(png.path(), (1200, 560)).into_drawing_area(),
            results,
        )?;
        let svg = tmp(dir, "speed.svg")?;
        draw_speed(
            SVGBackend::new(svg.path(), (1200, 560)).into_drawing_area(),
            results,
        )?;
        publish(dir, vec![(png, "speed.png"), (svg, "speed.svg")])?;
        files.speed = Some("speed.svg".into());
    }
    Ok(files)
}

#[cfg(test)]
mod tests;

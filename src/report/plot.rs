//! The plots, as PNG and SVG (plotters): perplexity change against bits per weight, every
//! runner a labelled point (the size/quality trade-off at a glance), and prompt/generation
//! speed as bars with ±1 stddev error bars and a roofline marker (the rate at 100 % of the
//! row's ceiling, labelled with the share reached). PNG text is drawn with DejaVu Sans, embedded
//! in the binary (assets/fonts, Bitstream Vera licence), so a machine without fonts still
//! gets labelled plots.

use crate::protocol::results::{Results, RunnerRecord};
use anyhow::{anyhow, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;
use std::sync::Once;

const FONT: &str = "sans-serif";
static REGISTER_FONT: Once = Once::new();

fn register_font() {
    REGISTER_FONT.call_once(|| {
        let bytes: &'static [u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
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
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing a plot: {e}")
}

/// A point of the quality plot: label, bits per weight, ΔPPL %, whether llama.cpp ran it.
struct QualityPoint {
    label: String,
    bpw: f64,
    delta_pct: f64,
    llama_cpp: bool,
}

/// A short label per runner (aligned with `results.runners`) and whether llama.cpp ran it.
/// GGUF rows lose `gguf:`, `.gguf` and the prefix all GGUF names share (the model name),
/// so `gguf:SmolLM2-135M-Instruct-Q8_0.gguf` reads `Q8_0`; the colour tells the engine.
fn runner_labels(results: &Results) -> Vec<(String, bool)> {
    let stems: Vec<&str> = results
        .runners
        .iter()
        .filter_map(|r| r.name.strip_prefix("gguf:"))
        .map(|n| n.strip_suffix(".gguf").unwrap_or(n))
        .collect();
    let common = if stems.len() >= 2 {
        let first = stems[0];
        let mut n = first.len();
        for s in &stems[1..] {
            n = n.min(
                first
                    .bytes()
                    .zip(s.bytes())
                    .take_while(|(a, b)| a == b)
                    .count(),
            );
        }
        // The bytes agree up to `n`, which may fall inside a character ('ä' and 'ö' share
        // their first byte): back to a boundary, then to a '-' or '.' so "Q4_0"/"Q4_1" keep
        // their "Q4_".
        while !first.is_char_boundary(n) {
            n -= 1;
        }
        first[..n].rfind(['-', '.']).map_or(0, |i| i + 1)
    } else {
        0
    };
    results
        .runners
        .iter()
        .map(|r| match r.name.strip_prefix("gguf:") {
            Some(n) => {
                let stem = n.strip_suffix(".gguf").unwrap_or(n);
                let short = stem.get(common..).filter(|s| !s.is_empty()).unwrap_or(stem);
                (short.to_string(), true)
            }
            None => (r.name.clone(), false),
        })
        .collect()
}

/// Every row that has both a size and a perplexity change.
fn quality_points(results: &Results) -> Vec<QualityPoint> {
    results
        .runners
        .iter()
        .zip(runner_labels(results))
        .filter_map(|(r, (label, llama_cpp))| {
            Some(QualityPoint {
                label,
                bpw: r.bits_per_weight?,
                delta_pct: r.ppl_delta_pct?,
                llama_cpp,
            })
        })
        .collect()
}

/// The model's short name for captions: the last path component.
fn model_short_name(model: &str) -> &str {
    model
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(model)
}

/// A bar of the speed plot.
struct Bar {
    label: String,
    mean: f64,
    std: f64,
    llama_cpp: bool,
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

/// A bar per runner with a figure: `pick` gives (mean, stddev, % of roofline).
fn speed_bars(
    results: &Results,
    pick: impl Fn(&RunnerRecord) -> Option<(f64, f64, Option<f64>)>,
) -> Vec<Bar> {
    results
        .runners
        .iter()
        .zip(runner_labels(results))
        .filter_map(|(r, (label, llama_cpp))| {
            pick(r).map(|(mean, std, roofline_pct)| Bar {
                label,
                mean,
                std,
                llama_cpp,
                roofline_pct,
            })
        })
        .collect()
}

const KWK_COLOR: RGBColor = BLUE;
const LLAMA_COLOR: RGBColor = RED;

fn draw_quality<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, results: &Results) -> Result<()> {
    let pts = quality_points(results);
    root.fill(&WHITE).map_err(err)?;
    // Log scale: the formats that matter sit between 4 and 9 bits, the reference at 32.
    let x_lo = pts
        .iter()
        .map(|p| p.bpw)
        .fold(f64::INFINITY, f64::min)
        .min(4.0)
        * 0.8;
    let x_hi = pts.iter().map(|p| p.bpw).fold(0.0f64, f64::max).max(8.0) * 1.6;
    let y_lo = pts.iter().map(|p| p.delta_pct).fold(0.0f64, f64::min);
    let y_hi = pts.iter().map(|p| p.delta_pct).fold(0.0f64, f64::max);
    let pad = ((y_hi - y_lo) * 0.15).max(0.05);
    let reference = results.ppl_delta_reference.clone().unwrap_or_default();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Perplexity change vs size: {}",
                model_short_name(&results.model)
            ),
            (FONT, 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d((x_lo..x_hi).log_scale(), (y_lo - pad)..(y_hi + pad))
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("bits per weight (log scale)")
        .y_desc(format!("ΔPPL % vs {reference}"))
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
    // kwk points blue with labels above, llama.cpp points red with labels below, so a kwk
    // format and the GGUF of the same size do not print over each other.
    chart
        .draw_series(pts.iter().map(|p| {
            let (color, offset) = if p.llama_cpp {
                (RED, (7, 4))
            } else {
                (BLUE, (7, -16))
            };
            EmptyElement::at((p.bpw, p.delta_pct))
                + Circle::new((0, 0), 4, color.filled())
                + Text::new(
                    p.label.clone(),
                    offset,
                    (FONT, 13).into_font().color(&color),
                )
        }))
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

fn draw_bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    bars: &[Bar],
) -> Result<()> {
    let n = bars.len().max(1);
    let y_max = bars
        .iter()
        .map(|b| (b.mean + b.std).max(b.ceiling().unwrap_or(0.0)))
        .fold(1.0f64, f64::max)
        * 1.15;
    let names: Vec<String> = bars.iter().map(|b| b.label.clone()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
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
                if b.llama_cpp { LLAMA_COLOR } else { KWK_COLOR }
                    .mix(0.7)
                    .filled(),
            );
            r.set_margin(0, 0, 12, 12);
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
                10,
            )
        }))
        .map_err(err)?;
    // The roofline marker: a black line across the bar's slot at the rate 100 % of the
    // row's ceiling would give, labelled with the share the bar reaches.
    chart
        .draw_series(bars.iter().enumerate().filter_map(|(i, b)| {
            let ceiling = b.ceiling()?;
            Some(PathElement::new(
                vec![
                    (SegmentValue::Exact(i), ceiling),
                    (SegmentValue::Exact(i + 1), ceiling),
                ],
                BLACK.stroke_width(2),
            ))
        }))
        .map_err(err)?;
    chart
        .draw_series(bars.iter().enumerate().filter_map(|(i, b)| {
            let pct = b.roofline_pct?;
            Some(Text::new(
                format!("{pct:.0}%"),
                (SegmentValue::CenterOf(i), b.mean + b.std),
                (FONT, 12)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Bottom)),
            ))
        }))
        .map_err(err)?;
    Ok(())
}

fn draw_speed<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, results: &Results) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((1, 2));
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
    draw_bars(
        &panels[0],
        &format!(
            "prompt pp{} tokens/s (mean ± stddev, {} reps)",
            p.pp, p.reps
        ),
        &pp,
    )?;
    draw_bars(
        &panels[1],
        &format!(
            "generation tg{} tokens/s (blue kwk, red llama.cpp; — roofline)",
            p.tg
        ),
        &tg,
    )?;
    root.present().map_err(err)?;
    Ok(())
}

/// The temporary name a plot is drawn to (same extension: plotters picks the image
/// encoding from it) before [`publish`] renames it into place.
fn tmp(dir: &Path, name: &str) -> std::path::PathBuf {
    dir.join(format!(".tmp.{name}"))
}

fn publish(dir: &Path, names: &[&str]) -> Result<()> {
    for name in names {
        let from = tmp(dir, name);
        std::fs::rename(&from, dir.join(name))
            .with_context(|| format!("renaming '{}' into place", from.display()))?;
    }
    Ok(())
}

/// Draws both plots into `dir` (PNG and SVG each); returns the SVG names for report.md.
pub fn write_plots(dir: &Path, results: &Results) -> Result<PlotFiles> {
    register_font();
    let mut files = PlotFiles::default();
    if !quality_points(results).is_empty() {
        let png = tmp(dir, "quality_vs_bpw.png");
        draw_quality(
            BitMapBackend::new(&png, (900, 600)).into_drawing_area(),
            results,
        )?;
        let svg = tmp(dir, "quality_vs_bpw.svg");
        draw_quality(
            SVGBackend::new(&svg, (900, 600)).into_drawing_area(),
            results,
        )?;
        publish(dir, &["quality_vs_bpw.png", "quality_vs_bpw.svg"])?;
        files.quality = Some("quality_vs_bpw.svg".into());
    }
    let has_speed = results
        .runners
        .iter()
        .any(|r| r.pp_tokens_per_s.is_some() || r.tg_tokens_per_s.is_some());
    if has_speed {
        let png = tmp(dir, "speed.png");
        draw_speed(
            BitMapBackend::new(&png, (1100, 500)).into_drawing_area(),
            results,
        )?;
        let svg = tmp(dir, "speed.svg");
        draw_speed(
            SVGBackend::new(&svg, (1100, 500)).into_drawing_area(),
            results,
        )?;
        publish(dir, &["speed.png", "speed.svg"])?;
        files.speed = Some("speed.svg".into());
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::results::testdata::sample_results;

    #[test]
    fn writes_png_and_svg_with_text() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_plots(dir.path(), &sample_results()).unwrap();
        assert_eq!(files.quality.as_deref(), Some("quality_vs_bpw.svg"));
        assert_eq!(files.speed.as_deref(), Some("speed.svg"));
        for f in ["quality_vs_bpw.png", "speed.png"] {
            let bytes = std::fs::read(dir.path().join(f)).unwrap();
            assert_eq!(&bytes[1..4], b"PNG", "{f}");
        }
        let svg = std::fs::read_to_string(dir.path().join("quality_vs_bpw.svg")).unwrap();
        assert!(svg.contains("int4") && svg.contains("bits per weight"));
        let mut r = sample_results();
        for (i, n) in ["gguf:M-Q4_0.gguf", "gguf:M-Q4_1.gguf"].iter().enumerate() {
            r.runners[i].name = n.to_string();
        }
        let labels: Vec<String> = quality_points(&r).into_iter().map(|p| p.label).collect();
        assert_eq!(labels, ["Q4_0", "Q4_1"]);
        assert_eq!(model_short_name("/a/b/SmolLM2.gguf"), "SmolLM2.gguf");
        let svg = std::fs::read_to_string(dir.path().join("speed.svg")).unwrap();
        assert!(svg.contains("float32") && svg.contains("tokens/s"));
        // To look at the plots: KWK_KEEP_PLOTS=DIR cargo test -p kwk-eval --lib plot
        if let Some(keep) = std::env::var_os("KWK_KEEP_PLOTS") {
            std::fs::create_dir_all(&keep).unwrap();
            write_plots(Path::new(&keep), &sample_results()).unwrap();
        }
    }

    /// Rows with a roofline share get the marker at mean × 100 / share and the share's
    /// label; rows without one get neither.
    #[test]
    fn speed_plot_marks_the_roofline() {
        let mut r = sample_results();
        for row in r.runners.iter_mut() {
            row.pp_roofline_pct = None;
            row.tg_roofline_pct = None;
        }
        r.runners[0].tg_tokens_per_s = Some(50.0);
        r.runners[0].tg_roofline_pct = Some(37.0);
        let tg = speed_bars(&r, |row| {
            Some((row.tg_tokens_per_s?, 0.0, row.tg_roofline_pct))
        });
        assert!((tg[0].ceiling().unwrap() - 50.0 * 100.0 / 37.0).abs() < 1e-9);
        assert!(tg.iter().skip(1).all(|b| b.ceiling().is_none()));
        let dir = tempfile::tempdir().unwrap();
        write_plots(dir.path(), &r).unwrap();
        let svg = std::fs::read_to_string(dir.path().join("speed.svg")).unwrap();
        assert_eq!(svg.matches("37%").count(), 1, "one roofline label");
    }

    #[test]
    fn a_single_runner_plots_too() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = sample_results();
        r.runners.truncate(1);
        r.update_deltas();
        let files = write_plots(dir.path(), &r).unwrap();
        assert!(files.quality.is_some() && files.speed.is_some());
    }

    #[test]
    fn no_data_no_plot() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = sample_results();
        for row in &mut r.runners {
            *row = crate::report::RunnerRecord::failed(&row.name, "kwk", "x".into());
        }
        r.update_deltas();
        assert_eq!(write_plots(dir.path(), &r).unwrap(), PlotFiles::default());
    }
}

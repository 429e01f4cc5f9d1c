//! The plots, as PNG and SVG (plotters): perplexity change against bits per weight, every
//! runner a labelled point (the size/quality trade-off at a glance), and prompt/generation
//! speed as bars with ±1 stddev error bars. PNG text is drawn with DejaVu Sans, embedded
//! in the binary (assets/fonts, Bitstream Vera licence), so a machine without fonts still
//! gets labelled plots.

use super::Results;
use anyhow::{anyhow, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
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

/// (name, bits per weight, ΔPPL %) of every row that has both.
fn quality_points(results: &Results) -> Vec<(String, f64, f64)> {
    results
        .runners
        .iter()
        .filter_map(|r| Some((r.name.clone(), r.bits_per_weight?, r.ppl_delta_pct?)))
        .collect()
}

/// (name, mean, std) per runner with a figure.
fn speed_bars(
    results: &Results,
    pick: impl Fn(&super::RunnerRecord) -> Option<(f64, f64)>,
) -> Vec<(String, f64, f64)> {
    results
        .runners
        .iter()
        .filter_map(|r| pick(r).map(|(m, s)| (r.name.clone(), m, s)))
        .collect()
}

fn draw_quality<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, results: &Results) -> Result<()> {
    let pts = quality_points(results);
    root.fill(&WHITE).map_err(err)?;
    let x_max = pts.iter().map(|p| p.1).fold(1.0f64, f64::max) * 1.15;
    let y_lo = pts.iter().map(|p| p.2).fold(0.0f64, f64::min);
    let y_hi = pts.iter().map(|p| p.2).fold(0.0f64, f64::max);
    let pad = ((y_hi - y_lo) * 0.15).max(0.05);
    let reference = results.ppl_delta_reference.clone().unwrap_or_default();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Perplexity change vs size ({})", results.model),
            (FONT, 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(0.0..x_max, (y_lo - pad)..(y_hi + pad))
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("bits per weight")
        .y_desc(format!("ΔPPL % vs {reference}"))
        .label_style((FONT, 14))
        .draw()
        .map_err(err)?;
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(0.0, 0.0), (x_max, 0.0)],
            BLACK.mix(0.3),
        )))
        .map_err(err)?;
    chart
        .draw_series(pts.iter().map(|(name, x, y)| {
            EmptyElement::at((*x, *y))
                + Circle::new((0, 0), 4, BLUE.filled())
                + Text::new(name.clone(), (6, -14), (FONT, 13))
        }))
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

fn draw_bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    bars: &[(String, f64, f64)],
    color: RGBColor,
) -> Result<()> {
    let n = bars.len().max(1);
    let y_max = bars.iter().map(|b| b.1 + b.2).fold(1.0f64, f64::max) * 1.15;
    let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
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
                    (SegmentValue::Exact(i + 1), b.1),
                ],
                color.mix(0.7).filled(),
            );
            r.set_margin(0, 0, 12, 12);
            r
        }))
        .map_err(err)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            ErrorBar::new_vertical(
                SegmentValue::CenterOf(i),
                b.1 - b.2,
                b.1,
                b.1 + b.2,
                BLACK.filled(),
                10,
            )
        }))
        .map_err(err)?;
    Ok(())
}

fn draw_speed<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, results: &Results) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((1, 2));
    let pp = speed_bars(results, |r| {
        Some((r.pp_tokens_per_s?, r.pp_tokens_per_s_std.unwrap_or(0.0)))
    });
    let tg = speed_bars(results, |r| {
        Some((r.tg_tokens_per_s?, r.tg_tokens_per_s_std.unwrap_or(0.0)))
    });
    let p = &results.protocol;
    draw_bars(
        &panels[0],
        &format!("prompt pp{} (mean ± stddev, {} reps)", p.pp, p.reps),
        &pp,
        BLUE,
    )?;
    draw_bars(
        &panels[1],
        &format!("generation tg{} (mean ± stddev, {} reps)", p.tg, p.reps),
        &tg,
        RED,
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
    use crate::report::testdata::sample_results;

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
        let svg = std::fs::read_to_string(dir.path().join("speed.svg")).unwrap();
        assert!(svg.contains("float32") && svg.contains("tokens/s"));
        // To look at the plots: KWK_KEEP_PLOTS=DIR cargo test -p kwk-eval --lib plot
        if let Some(keep) = std::env::var_os("KWK_KEEP_PLOTS") {
            std::fs::create_dir_all(&keep).unwrap();
            write_plots(Path::new(&keep), &sample_results()).unwrap();
        }
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

//! The speed sweep's plots (issue 39), PNG and SVG like the others ([`super::plot`]): speed
//! against depth, pp and tg side by side, one line per row (at the sweep's first thread
//! count and first pp/tg length), when more than one depth was measured; and speed against
//! threads (at the first depth) when thread counts were swept. Each row's figures come from
//! its `speed_points`; in a merged report whose cells ran at different depths (a sweep
//! over depths, one cell each), a row's cells join into one line along depth; each row is drawn in its engine's colour (kwk, llama.cpp, ik),
//! with the row named at the end of its line.

use super::plot::{engine_style, err, model_short_name, publish, register_font, tmp, FONT};
use crate::protocol::points::{PointSpeed, SpeedAxes};
use crate::protocol::results::{Engine, Results};
use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// Every file [`write_sweep_plots`] may draw.
pub const SWEEP_PLOT_FILES: &[&str] = &[
    "speed_vs_depth.png",
    "speed_vs_depth.svg",
    "speed_vs_threads.png",
    "speed_vs_threads.svg",
];

/// What a sweep plot puts on its x axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    Depth,
    Threads,
}

impl Axis {
    fn name(self) -> &'static str {
        match self {
            Axis::Depth => "depth",
            Axis::Threads => "threads",
        }
    }

    /// The plot's file stem.
    fn stem(self) -> &'static str {
        match self {
            Axis::Depth => "speed_vs_depth",
            Axis::Threads => "speed_vs_threads",
        }
    }

    fn x(self, p: &PointSpeed) -> f64 {
        match self {
            Axis::Depth => p.depth as f64,
            Axis::Threads => p.threads as f64,
        }
    }

    /// Whether `p` lies on this plot's line: the other axis at its first value, and the
    /// first pp/tg length.
    fn on_line(self, a: &SpeedAxes, p: &PointSpeed) -> bool {
        let first = if p.kind == "pp" { a.pp[0] } else { a.tg[0] };
        p.tokens == first
            && match self {
                Axis::Depth => p.threads == a.threads[0],
                Axis::Threads => p.depth == a.depth[0],
            }
    }
}

/// One line: a row's name, its engine, and its (x, tokens/s) points.
type Line = (String, Engine, Vec<(f64, f64)>);

/// Whether `results` is a merged report whose cells ran at different depths (a sweep over
/// depths, one depth a cell): it has no one sweep (`speed_axes` is none), and its rows are
/// one per cell, named with the cell's `@dD` (`crate::merge`).
fn cells_differ_in_depth(results: &Results) -> bool {
    results.protocol.speed_axes.is_none()
        && results
            .cells
            .iter()
            .map(|c| c.protocol.depth_key())
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            > 1
}

/// The depth lines of the `kind` panel of a merged report whose cells differ in depth: one
/// line per row measured at several depths, its cells' rows joined (the name without the
/// cell's `@dD`), each cell's points read along that cell's own axes (its sweep, or the
/// single point of a cell at depth 0: its pp/tg figures).
fn cell_lines(results: &Results, kind: &str) -> Vec<Line> {
    let mut out: Vec<Line> = Vec::new();
    for r in results.runners.iter().filter(|r| r.error.is_none()) {
        let Some(cell) = results
            .cells
            .iter()
            .find(|c| r.cell.as_ref() == Some(&c.name))
        else {
            continue;
        };
        let p = &cell.protocol;
        let suffix = format!("@d{}", p.depth_key());
        let name = match r.name.rfind(&suffix) {
            Some(i) => format!("{}{}", &r.name[..i], &r.name[i + suffix.len()..]),
            None => r.name.clone(),
        };
        let pts: Vec<(f64, f64)> = match &p.speed_axes {
            Some(a) => r
                .speed_points
                .iter()
                .filter(|x| x.kind == kind && Axis::Depth.on_line(a, x))
                .filter_map(|x| Some((x.depth as f64, x.tokens_per_s?)))
                .collect(),
            None => match kind {
                "pp" => r.pp_tokens_per_s,
                _ => r.tg_tokens_per_s,
            }
            .map(|t| (0.0, t))
            .into_iter()
            .collect(),
        };
        match out.iter_mut().find(|l| l.0 == name) {
            Some(l) => l.2.extend(pts),
            None => out.push((name, r.engine, pts)),
        }
    }
    for l in &mut out {
        l.2.sort_by(|x, y| x.0.total_cmp(&y.0));
    }
    out.retain(|l| l.2.len() >= 2);
    out
}

/// The lines of the `kind` (pp/tg) panel of the plot along `axis`.
fn lines(results: &Results, axis: Axis, kind: &str) -> Vec<Line> {
    if axis == Axis::Depth && cells_differ_in_depth(results) {
        return cell_lines(results, kind);
    }
    let Some(a) = &results.protocol.speed_axes else {
        return Vec::new();
    };
    results
        .runners
        .iter()
        .filter(|r| r.error.is_none())
        .filter_map(|r| {
            let mut pts: Vec<(f64, f64)> = r
                .speed_points
                .iter()
                .filter(|p| p.kind == kind && axis.on_line(a, p))
                .filter_map(|p| Some((axis.x(p), p.tokens_per_s?)))
                .collect();
            pts.sort_by(|x, y| x.0.total_cmp(&y.0));
            (pts.len() >= 2).then(|| (r.name.clone(), r.engine, pts))
        })
        .collect()
}

/// The plots the results call for: along depth when several depths were measured (by one
/// run, or by the cells of a merged report), along threads when threads were swept (and
/// each has a line to draw).
pub fn sweep_plots(results: &Results) -> Vec<Axis> {
    let has_lines = |axis| {
        ["pp", "tg"]
            .iter()
            .any(|k| !lines(results, axis, k).is_empty())
    };
    if cells_differ_in_depth(results) {
        return [Axis::Depth]
            .into_iter()
            .filter(|&a| has_lines(a))
            .collect();
    }
    let Some(a) = &results.protocol.speed_axes else {
        return Vec::new();
    };
    [
        (Axis::Depth, a.depth.len()),
        (Axis::Threads, a.threads.len()),
    ]
    .into_iter()
    .filter(|&(axis, n)| n >= 2 && has_lines(axis))
    .map(|(axis, _)| axis)
    .collect()
}

/// The SVG names of the plots [`write_sweep_plots`] draws for `results` (report.md shows them).
pub fn sweep_plot_svgs(results: &Results) -> Vec<String> {
    sweep_plots(results)
        .into_iter()
        .map(|a| format!("{}.svg", a.stem()))
        .collect()
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    axis: Axis,
    lines: &[Line],
) -> Result<()> {
    let xs = lines.iter().flat_map(|l| l.2.iter().map(|p| p.0));
    let x_max = xs.fold(1.0_f64, f64::max);
    let y_max = lines
        .iter()
        .flat_map(|l| l.2.iter().map(|p| p.1))
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    let x_min = match axis {
        Axis::Depth => 0.0,
        Axis::Threads => 1.0,
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(x_min..x_max * 1.15 + 1.0, 0.0..y_max * 1.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(axis.name())
        .y_desc("tokens/s")
        .label_style((FONT, 12))
        .draw()
        .map_err(err)?;
    for (name, engine, pts) in lines {
        let (color, _) = engine_style(*engine);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(err)?;
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(err)?;
        if let Some(&last) = pts.last() {
            chart
                .draw_series(std::iter::once(Text::new(
                    name.clone(),
                    last,
                    (FONT, 12).into_font().color(&color),
                )))
                .map_err(err)?;
        }
    }
    Ok(())
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    results: &Results,
    axis: Axis,
) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let (head, body) = root.split_vertically(40);
    let title = format!(
        "Speed against {}: {} (mean of {} rounds)",
        axis.name(),
        model_short_name(&results.model),
        results.protocol.reps
    );
    head.draw(&Text::new(title, (20, 10), (FONT, 20).into_font()))
        .map_err(err)?;
    let panels = body.split_evenly((1, 2));
    for (panel, kind) in panels.iter().zip(["pp", "tg"]) {
        // A merged report's cells share their pp and tg (the protocol merge checks).
        let p = &results.protocol;
        let n = p
            .speed_axes
            .as_ref()
            .map_or(if kind == "pp" { p.pp } else { p.tg }, |a| {
                if kind == "pp" {
                    a.pp[0]
                } else {
                    a.tg[0]
                }
            });
        let caption = match kind {
            "pp" => format!("prompt pp{n}"),
            _ => format!("generation tg{n}"),
        };
        draw_panel(panel, &caption, axis, &lines(results, axis, kind))?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Draws the sweep's plots into `dir` (PNG and SVG each, [`sweep_plots`]).
pub fn write_sweep_plots(dir: &Path, results: &Results) -> Result<Vec<String>> {
    register_font();
    let mut out = Vec::new();
    for axis in sweep_plots(results) {
        let (png_name, svg_name) = (
            format!("{}.png", axis.stem()),
            format!("{}.svg", axis.stem()),
        );
        let png = tmp(dir, &png_name)?;
        draw(
            BitMapBackend::new(png.path(), (1200, 520)).into_drawing_area(),
            results,
            axis,
        )?;
        let svg = tmp(dir, &svg_name)?;
        draw(
            SVGBackend::new(svg.path(), (1200, 520)).into_drawing_area(),
            results,
            axis,
        )?;
        publish(dir, vec![(png, &png_name), (svg, &svg_name)])?;
        out.push(svg_name);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::results::testdata::sample_results;

    /// A sweep over two depths and two thread counts draws both plots, PNG and SVG, each
    /// naming its rows; a run without a sweep draws none.
    #[test]
    fn a_sweep_draws_depth_and_threads_plots() {
        let dir = tempfile::tempdir().unwrap();
        assert!(write_sweep_plots(dir.path(), &sample_results())
            .unwrap()
            .is_empty());
        let mut r = sample_results();
        let axes = SpeedAxes {
            pp: vec![16],
            tg: vec![4],
            depth: vec![0, 64],
            threads: vec![1, 2],
        };
        for (i, row) in r.runners.iter_mut().enumerate() {
            row.speed_points = axes
                .specs(1)
                .iter()
                .flat_map(|s| {
                    [("pp", s.pp), ("tg", s.tg)].map(|(kind, n)| PointSpeed {
                        test: axes.test_name(kind, n, s.depth, s.threads),
                        kind: kind.into(),
                        tokens: n,
                        depth: s.depth,
                        threads: s.threads,
                        tokens_per_s: Some(100.0 * (i + 1) as f64 / (1.0 + s.depth as f64)),
                        ..Default::default()
                    })
                })
                .collect();
        }
        r.protocol.speed_axes = Some(axes);
        assert_eq!(sweep_plots(&r), [Axis::Depth, Axis::Threads]);
        let svgs = write_sweep_plots(dir.path(), &r).unwrap();
        assert_eq!(svgs, ["speed_vs_depth.svg", "speed_vs_threads.svg"]);
        for f in SWEEP_PLOT_FILES {
            assert!(dir.path().join(f).exists(), "{f}");
        }
        let svg = std::fs::read_to_string(dir.path().join("speed_vs_depth.svg")).unwrap();
        assert!(svg.contains(&r.runners[0].name), "the row is named");
        assert!(svg.contains("depth"));
    }
}

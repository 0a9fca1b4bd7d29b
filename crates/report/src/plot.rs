//! The figures: per metric an empirical-CDF plot with quantile confidence
//! bands and a box plot, each drawn once on an SVG backend and once on a
//! bitmap backend (PNG).
//!
//! Text in the PNGs is rendered by plotters' `ab_glyph` feature from the
//! DejaVu Sans font that the `dejavu` crate embeds in the binary, so no
//! system fonts are needed. The SVGs carry text as `<text>` elements with
//! `font-family="sans-serif"`, rendered by the viewer's fonts.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use onionlab_stats::{quantile_band, QuantileBandPoint};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::analysis::{MetricAnalysis, VariantRow};
use crate::layout::{Layout, ALL};
use crate::{Error, Figure, FigureKind, Result};

/// Width and height of a figure with one panel, in pixels.
pub const FIGURE_SIZE: (u32, u32) = (800, 500);
/// Width and height of each panel of a figure with several.
const PANEL_SIZE: (u32, u32) = (420, 300);
/// Panels per row at most.
const MAX_COLUMNS: usize = 3;
/// Height of the figure's title line.
const TITLE_HEIGHT: u32 = 36;
/// Height of one line of the legend above the panels.
const LEGEND_LINE: u32 = 24;
/// Opacity of the quantile bands: light enough to leave the curves visible.
const BAND_OPACITY: f64 = 0.10;

const FONT: &str = "sans-serif";
/// Confidence of the shaded quantile bands.
const BAND_CONFIDENCE: f64 = 0.95;
/// Probability levels at which the band is evaluated.
const BAND_STEPS: usize = 200;
/// Above this many distinct values an ECDF is drawn through this many
/// quantiles instead of every step (keeps SVGs small).
const MAX_STEPS: usize = 2000;

/// The Okabe–Ito colour-blind-safe palette (without its yellow and black).
const PALETTE: [RGBColor; 6] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
];

fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Registers the embedded font with plotters once per process.
fn ensure_fonts() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
            && register_font(FONT, FontStyle::Bold, dejavu::sans::bold()).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(Error::Font)
    }
}

type DrawResult<DB> =
    std::result::Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// Range of all values of all variants, padded by 3% (or by 1 for a single
/// distinct value); `None` when there are no values.
fn value_range(rows: &[VariantRow]) -> Option<(f64, f64)> {
    let lo = rows
        .iter()
        .filter_map(|r| r.sorted.first())
        .copied()
        .reduce(f64::min)?;
    let hi = rows
        .iter()
        .filter_map(|r| r.sorted.last())
        .copied()
        .reduce(f64::max)?;
    let pad = if hi > lo {
        (hi - lo) * 0.03
    } else {
        (lo.abs() * 0.05).max(1.0)
    };
    Some((lo - pad, hi + pad))
}

/// Axis tick text: at most 6 decimals, without trailing zeros.
fn tick(x: &f64) -> String {
    let s = format!("{x:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

fn axis_label(m: &MetricAnalysis) -> String {
    if m.metric.unit.is_empty() {
        m.metric.title.clone()
    } else {
        format!("{} ({})", m.metric.title, m.metric.unit)
    }
}

/// Where the parts of a figure go: the legend's lines, the panel grid and
/// the figure's size.
struct Frame {
    /// Legend entries (group index, text) per line.
    legend: Vec<Vec<(usize, String)>>,
    columns: usize,
    rows: usize,
    size: (u32, u32),
}

/// Approximate width of legend text at 14 px (DejaVu Sans averages about
/// 0.6 em per character), plus the swatch and the gap to the next entry.
fn legend_entry_width(text: &str) -> u32 {
    text.chars().count() as u32 * 8 + 48
}

fn frame(layout: &Layout) -> Frame {
    let k = layout.conditions.len().max(1);
    let columns = k.min(MAX_COLUMNS);
    let rows = k.div_ceil(columns);
    let width = if k == 1 {
        FIGURE_SIZE.0
    } else {
        PANEL_SIZE.0 * columns as u32
    };
    let mut legend: Vec<Vec<(usize, String)>> = vec![Vec::new()];
    let mut used = 0;
    for (g, text) in layout.groups.iter().enumerate() {
        let w = legend_entry_width(text);
        if used > 0 && used + w > width.saturating_sub(24) {
            legend.push(Vec::new());
            used = 0;
        }
        used += w;
        if let Some(line) = legend.last_mut() {
            line.push((g, text.clone()));
        }
    }
    let header = TITLE_HEIGHT + LEGEND_LINE * legend.len() as u32 + 8;
    let height = if k == 1 {
        FIGURE_SIZE.1.max(header + 360)
    } else {
        header + PANEL_SIZE.1 * rows as u32
    };
    Frame {
        legend,
        columns,
        rows,
        size: (width, height),
    }
}

/// The size of a metric's figures for this layout.
pub(crate) fn figure_size(layout: &Layout) -> (u32, u32) {
    frame(layout).size
}

/// Draws the title and the legend (one swatch per group, outside the
/// data), and returns the panel areas, one per condition.
fn header_and_panels<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    f: &Frame,
    caption: &str,
    layout: &Layout,
) -> std::result::Result<Vec<DrawingArea<DB, Shift>>, DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    root.draw(&Text::new(
        caption.to_string(),
        (12, 8),
        (FONT, 20).into_font(),
    ))?;
    for (line, entries) in f.legend.iter().enumerate() {
        let y = (TITLE_HEIGHT + LEGEND_LINE * line as u32) as i32 + 4;
        let mut x = 16i32;
        for (g, text) in entries {
            let c = colour(*g);
            root.draw(&Rectangle::new([(x, y + 3), (x + 22, y + 13)], c.filled()))?;
            root.draw(&Text::new(
                text.clone(),
                (x + 28, y),
                (FONT, 14).into_font(),
            ))?;
            x += legend_entry_width(text) as i32;
        }
    }
    let header = TITLE_HEIGHT + LEGEND_LINE * f.legend.len() as u32 + 8;
    let (_, body) = root.split_vertically(header);
    let mut panels = body.split_evenly((f.rows, f.columns));
    panels.truncate(layout.conditions.len().max(1));
    Ok(panels)
}

/// A panel's caption: the condition, unless there is only one.
fn panel_caption(layout: &Layout, condition: usize) -> Option<String> {
    let label = &layout.conditions.get(condition)?.label;
    (label != ALL).then(|| label.clone())
}

fn draw_no_data<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    caption: &str,
) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    root.draw(&Text::new(
        caption.to_string(),
        (20, 20),
        (FONT, 22).into_font(),
    ))?;
    let (w, h) = root.dim_in_pixel();
    root.draw(&Text::new(
        "no data for any variant".to_string(),
        (w as i32 / 2 - 100, h as i32 / 2),
        (FONT, 18).into_font(),
    ))?;
    Ok(())
}

/// The ECDF of sorted values as a step path from `x0` (at 0) to `x1` (at 1).
fn ecdf_path(sorted: &[f64], x0: f64, x1: f64) -> Vec<(f64, f64)> {
    let n = sorted.len();
    let mut path = vec![(x0, 0.0)];
    if n > MAX_STEPS {
        for j in 0..=MAX_STEPS {
            let p = j as f64 / MAX_STEPS as f64;
            let h = (n - 1) as f64 * p;
            let i = h.floor() as usize;
            let x = if i + 1 < n {
                sorted[i] + (h - i as f64) * (sorted[i + 1] - sorted[i])
            } else {
                sorted[n - 1]
            };
            path.push((x, p));
        }
    } else {
        let mut f = 0.0;
        let mut i = 0;
        while i < n {
            let x = sorted[i];
            while i < n && sorted[i] == x {
                i += 1;
            }
            path.push((x, f));
            f = i as f64 / n as f64;
            path.push((x, f));
        }
    }
    path.push((x1, 1.0));
    path
}

/// Per variant, the pointwise quantile band (`None` without data).
fn cdf_bands(m: &MetricAnalysis) -> Vec<Option<Vec<QuantileBandPoint>>> {
    let probs: Vec<f64> = (1..BAND_STEPS)
        .map(|j| j as f64 / BAND_STEPS as f64)
        .collect();
    m.rows
        .iter()
        .map(|row| quantile_band(&row.sorted, &probs, BAND_CONFIDENCE).ok())
        .collect()
}

fn draw_cdf<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    m: &MetricAnalysis,
    layout: &Layout,
    bands: &[Option<Vec<QuantileBandPoint>>],
) -> DrawResult<DB> {
    let caption = format!("{}: CDF", axis_label(m));
    let Some((x0, x1)) = value_range(&m.rows) else {
        return draw_no_data(root, &caption);
    };
    let f = frame(layout);
    let panels = header_and_panels(root, &f, &caption, layout)?;
    for (ci, panel) in panels.iter().enumerate() {
        let members: Vec<usize> = match layout.conditions.get(ci) {
            Some(c) => c.members.iter().flatten().copied().collect(),
            None => (0..m.rows.len()).collect(),
        };
        let mut builder = ChartBuilder::on(panel);
        if let Some(c) = panel_caption(layout, ci) {
            builder.caption(c, (FONT, 15));
        }
        let mut chart = builder
            .margin(10)
            .x_label_area_size(32)
            .y_label_area_size(44)
            .build_cartesian_2d(x0..x1, 0f64..1.02f64)?;
        chart
            .configure_mesh()
            .label_style((FONT, 12))
            .x_labels(5)
            .y_labels(6)
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .bold_line_style(RGBColor(225, 225, 225))
            .light_line_style(TRANSPARENT)
            .draw()?;
        let clamp = |x: f64| x.clamp(x0, x1);
        for &i in &members {
            let Some(band) = &bands[i] else {
                continue; // no data
            };
            // Levels at which the sample bounds neither side carry no
            // information (e.g. every level for one value): shade only the
            // runs of levels with at least one finite side.
            let informative = |b: &&QuantileBandPoint| b.lo.is_finite() || b.hi.is_finite();
            for run in band.split(|b| !informative(&b)) {
                if run.is_empty() {
                    continue;
                }
                let mut outline: Vec<(f64, f64)> = run.iter().map(|b| (clamp(b.lo), b.p)).collect();
                outline.extend(run.iter().rev().map(|b| (clamp(b.hi), b.p)));
                chart.draw_series(std::iter::once(Polygon::new(
                    outline,
                    colour(layout.group_of[i]).mix(BAND_OPACITY).filled(),
                )))?;
            }
        }
        for &i in &members {
            let row = &m.rows[i];
            if row.sorted.is_empty() {
                continue;
            }
            let style = colour(layout.group_of[i]).stroke_width(2);
            chart.draw_series(std::iter::once(PathElement::new(
                ecdf_path(&row.sorted, x0, x1),
                style,
            )))?;
        }
    }
    Ok(())
}

/// What a box plot shows for one variant.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BoxStats {
    pub q1: f64,
    pub median: f64,
    pub q3: f64,
    /// Most extreme values within 1.5 IQR of the box (Tukey).
    pub whisker_lo: f64,
    pub whisker_hi: f64,
    /// Values beyond the whiskers.
    pub outliers: Vec<f64>,
    pub mean: f64,
}

fn type7(sorted: &[f64], q: f64) -> f64 {
    let h = (sorted.len() - 1) as f64 * q;
    let i = h.floor() as usize;
    if i + 1 < sorted.len() {
        sorted[i] + (h - i as f64) * (sorted[i + 1] - sorted[i])
    } else {
        sorted[sorted.len() - 1]
    }
}

/// Box-plot statistics of non-empty sorted values: type-7 quartiles,
/// Tukey whiskers (1.5 IQR), outliers beyond them.
pub(crate) fn box_stats(sorted: &[f64]) -> Option<BoxStats> {
    if sorted.is_empty() {
        return None;
    }
    let (q1, median, q3) = (type7(sorted, 0.25), type7(sorted, 0.5), type7(sorted, 0.75));
    let iqr = q3 - q1;
    let (fence_lo, fence_hi) = (q1 - 1.5 * iqr, q3 + 1.5 * iqr);
    let inside = || {
        sorted
            .iter()
            .copied()
            .filter(|&v| v >= fence_lo && v <= fence_hi)
    };
    let whisker_lo = inside().next().unwrap_or(q1).min(q1);
    let whisker_hi = inside().next_back().unwrap_or(q3).max(q3);
    let outliers = sorted
        .iter()
        .copied()
        .filter(|&v| v < fence_lo || v > fence_hi)
        .collect();
    let mean = sorted.iter().sum::<f64>() / sorted.len() as f64;
    Some(BoxStats {
        q1,
        median,
        q3,
        whisker_lo,
        whisker_hi,
        outliers,
        mean,
    })
}

fn draw_one_box<DB: DrawingBackend>(
    chart: &mut ChartContext<DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    x: f64,
    c: RGBColor,
    b: &BoxStats,
) -> DrawResult<DB> {
    let (half, cap) = (0.28, 0.12);
    chart.draw_series([
        Rectangle::new([(x - half, b.q1), (x + half, b.q3)], c.mix(0.25).filled()),
        Rectangle::new([(x - half, b.q1), (x + half, b.q3)], c.stroke_width(2)),
    ])?;
    chart.draw_series([
        PathElement::new(vec![(x, b.q3), (x, b.whisker_hi)], c.stroke_width(2)),
        PathElement::new(vec![(x, b.q1), (x, b.whisker_lo)], c.stroke_width(2)),
        PathElement::new(
            vec![(x - cap, b.whisker_hi), (x + cap, b.whisker_hi)],
            c.stroke_width(2),
        ),
        PathElement::new(
            vec![(x - cap, b.whisker_lo), (x + cap, b.whisker_lo)],
            c.stroke_width(2),
        ),
        PathElement::new(
            vec![(x - half, b.median), (x + half, b.median)],
            BLACK.stroke_width(3),
        ),
    ])?;
    chart.draw_series(
        b.outliers
            .iter()
            .map(|&v| Circle::new((x, v), 3, c.stroke_width(1))),
    )?;
    chart.draw_series(std::iter::once(Cross::new(
        (x, b.mean),
        5,
        BLACK.stroke_width(2),
    )))?;
    Ok(())
}

/// Box plots: one panel per condition, one box per group in a fixed slot
/// (the same position and colour in every panel), a shared value axis.
fn draw_box<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    m: &MetricAnalysis,
    layout: &Layout,
) -> DrawResult<DB> {
    let caption = format!("{}: distribution", axis_label(m));
    let Some((y0, y1)) = value_range(&m.rows) else {
        return draw_no_data(root, &caption);
    };
    let f = frame(layout);
    let panels = header_and_panels(root, &f, &caption, layout)?;
    let slots = layout.groups.len();
    for (ci, panel) in panels.iter().enumerate() {
        let members: Vec<Option<usize>> = match layout.conditions.get(ci) {
            Some(c) if layout.compared => c.members.clone(),
            // Without a compared parameter every variant is its own group.
            _ => (0..m.rows.len()).map(Some).collect(),
        };
        let mut builder = ChartBuilder::on(panel);
        if let Some(c) = panel_caption(layout, ci) {
            builder.caption(c, (FONT, 15));
        }
        let mut chart = builder
            .margin(10)
            .x_label_area_size(if layout.compared { 8 } else { 32 })
            .y_label_area_size(52)
            .build_cartesian_2d(-0.5f64..(slots as f64 - 0.5), y0..y1)?;
        // With a compared parameter the legend names the slots; without
        // one, each box is a variant named under it.
        let names: Vec<String> = if layout.compared {
            Vec::new()
        } else {
            layout.groups.clone()
        };
        let x_fmt = |x: &f64| -> String {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(slots)
            .x_label_formatter(&x_fmt)
            .y_labels(6)
            .y_label_formatter(&tick)
            .label_style((FONT, 12))
            .bold_line_style(RGBColor(225, 225, 225))
            .light_line_style(TRANSPARENT)
            .draw()?;
        for (slot, member) in members.iter().enumerate() {
            let Some(i) = *member else { continue };
            let Some(b) = box_stats(&m.rows[i].sorted) else {
                continue;
            };
            draw_one_box(&mut chart, slot as f64, colour(layout.group_of[i]), &b)?;
        }
    }
    Ok(())
}

fn plot_error(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Plot {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

fn draw_kind<DB: DrawingBackend>(
    kind: FigureKind,
    root: &DrawingArea<DB, Shift>,
    m: &MetricAnalysis,
    layout: &Layout,
    bands: &[Option<Vec<QuantileBandPoint>>],
) -> DrawResult<DB> {
    match kind {
        FigureKind::Cdf => draw_cdf(root, m, layout, bands),
        FigureKind::Box => draw_box(root, m, layout),
    }
}

fn render(
    kind: FigureKind,
    svg: &Path,
    png: &Path,
    m: &MetricAnalysis,
    layout: &Layout,
) -> Result<(u32, u32)> {
    let bands = match kind {
        FigureKind::Cdf => cdf_bands(m),
        FigureKind::Box => Vec::new(),
    };
    let size = figure_size(layout);
    {
        let root = SVGBackend::new(svg, size).into_drawing_area();
        draw_kind(kind, &root, m, layout, &bands).map_err(|e| plot_error(svg, e))?;
        root.present().map_err(|e| plot_error(svg, e))?;
    }
    {
        let root = BitMapBackend::new(png, size).into_drawing_area();
        draw_kind(kind, &root, m, layout, &bands).map_err(|e| plot_error(png, e))?;
        root.present().map_err(|e| plot_error(png, e))?;
    }
    Ok(size)
}

/// File stem of a figure: `<metric key>_cdf` or `<metric key>_box`.
pub(crate) fn stem(key: &str, kind: FigureKind) -> String {
    match kind {
        FigureKind::Cdf => format!("{key}_cdf"),
        FigureKind::Box => format!("{key}_box"),
    }
}

/// Draws both figures of one metric into `dir`.
pub(crate) fn write_figures(
    dir: &Path,
    m: &MetricAnalysis,
    layout: &Layout,
) -> Result<Vec<Figure>> {
    ensure_fonts()?;
    [FigureKind::Cdf, FigureKind::Box]
        .into_iter()
        .map(|kind| {
            let stem = stem(&m.metric.key, kind);
            let svg: PathBuf = dir.join(format!("{stem}.svg"));
            let png: PathBuf = dir.join(format!("{stem}.png"));
            let size = render(kind, &svg, &png, m, layout)?;
            Ok(Figure {
                metric: m.metric.key.clone(),
                kind,
                svg,
                png,
                size,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn box_stats_tukey_whiskers() {
        // Quartiles (type 7) of 1..=9 and 100: q1 = 3.25, q3 = 7.75,
        // IQR = 4.5, fences -3.5 and 14.5: 100 is an outlier, whiskers 1 and 9.
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 100.0];
        let b = box_stats(&v).unwrap();
        assert_eq!((b.q1, b.median, b.q3), (3.25, 5.5, 7.75));
        assert_eq!((b.whisker_lo, b.whisker_hi), (1.0, 9.0));
        assert_eq!(b.outliers, vec![100.0]);
        assert_eq!(b.mean, 14.5);
        let one = box_stats(&[2.0]).unwrap();
        assert_eq!(
            (one.whisker_lo, one.whisker_hi, one.outliers.len()),
            (2.0, 2.0, 0)
        );
        assert!(box_stats(&[]).is_none());
    }

    #[test]
    fn ecdf_path_steps() {
        let p = ecdf_path(&[1.0, 2.0, 2.0], 0.0, 3.0);
        assert_eq!(
            p,
            vec![
                (0.0, 0.0),
                (1.0, 0.0),
                (1.0, 1.0 / 3.0),
                (2.0, 1.0 / 3.0),
                (2.0, 1.0),
                (3.0, 1.0)
            ]
        );
    }
}

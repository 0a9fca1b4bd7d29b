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
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::analysis::{MetricAnalysis, VariantRow};
use crate::{Error, Figure, FigureKind, Result};

/// Width and height of every figure, in pixels.
pub const FIGURE_SIZE: (u32, u32) = (800, 500);

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

fn legend_label(row: &VariantRow) -> String {
    if row.sorted.is_empty() {
        format!("{} (no data)", row.label)
    } else {
        format!("{} (n = {})", row.label, row.sorted.len())
    }
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
    root.draw(&Text::new(
        "no data for any variant".to_string(),
        (FIGURE_SIZE.0 as i32 / 2 - 100, FIGURE_SIZE.1 as i32 / 2),
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
    bands: &[Option<Vec<QuantileBandPoint>>],
) -> DrawResult<DB> {
    let caption = format!("{}: CDF with 95% quantile bands", m.metric.title);
    let Some((x0, x1)) = value_range(&m.rows) else {
        return draw_no_data(root, &caption);
    };
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(root)
        .caption(caption, (FONT, 22))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1, 0f64..1.02f64)?;
    let x_desc = axis_label(m);
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("cumulative fraction")
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .bold_line_style(RGBColor(225, 225, 225))
        .light_line_style(TRANSPARENT)
        .draw()?;

    let clamp = |x: f64| x.clamp(x0, x1);
    for (i, band) in bands.iter().enumerate() {
        let Some(band) = band else {
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
                colour(i).mix(0.18).filled(),
            )))?;
        }
    }
    for (i, row) in m.rows.iter().enumerate() {
        let style = colour(i).stroke_width(2);
        let series: Vec<PathElement<(f64, f64)>> = if row.sorted.is_empty() {
            Vec::new()
        } else {
            vec![PathElement::new(ecdf_path(&row.sorted, x0, x1), style)]
        };
        chart
            .draw_series(series)?
            .label(legend_label(row))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.4))
        .label_font((FONT, 14))
        .draw()?;
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

fn draw_box<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    m: &MetricAnalysis,
) -> DrawResult<DB> {
    let caption = format!("{}: distribution per variant", m.metric.title);
    let Some((y0, y1)) = value_range(&m.rows) else {
        return draw_no_data(root, &caption);
    };
    root.fill(&WHITE)?;
    let k = m.rows.len();
    let mut chart = ChartBuilder::on(root)
        .caption(caption, (FONT, 22))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(-0.5f64..(k as f64 - 0.5), y0..y1)?;
    let labels: Vec<String> = m.rows.iter().map(legend_label).collect();
    let x_fmt = |x: &f64| -> String {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
            labels[i as usize].clone()
        } else {
            String::new()
        }
    };
    let y_desc = axis_label(m);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(k)
        .x_label_formatter(&x_fmt)
        .y_desc(y_desc)
        .y_label_formatter(&tick)
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .bold_line_style(RGBColor(225, 225, 225))
        .light_line_style(TRANSPARENT)
        .draw()?;

    for (i, row) in m.rows.iter().enumerate() {
        let Some(b) = box_stats(&row.sorted) else {
            continue;
        };
        let x = i as f64;
        let c = colour(i);
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
    bands: &[Option<Vec<QuantileBandPoint>>],
) -> DrawResult<DB> {
    match kind {
        FigureKind::Cdf => draw_cdf(root, m, bands),
        FigureKind::Box => draw_box(root, m),
    }
}

fn render(kind: FigureKind, svg: &Path, png: &Path, m: &MetricAnalysis) -> Result<()> {
    let bands = match kind {
        FigureKind::Cdf => cdf_bands(m),
        FigureKind::Box => Vec::new(),
    };
    {
        let root = SVGBackend::new(svg, FIGURE_SIZE).into_drawing_area();
        draw_kind(kind, &root, m, &bands).map_err(|e| plot_error(svg, e))?;
        root.present().map_err(|e| plot_error(svg, e))?;
    }
    {
        let root = BitMapBackend::new(png, FIGURE_SIZE).into_drawing_area();
        draw_kind(kind, &root, m, &bands).map_err(|e| plot_error(png, e))?;
        root.present().map_err(|e| plot_error(png, e))?;
    }
    Ok(())
}

/// File stem of a figure: `<metric key>_cdf` or `<metric key>_box`.
pub(crate) fn stem(key: &str, kind: FigureKind) -> String {
    match kind {
        FigureKind::Cdf => format!("{key}_cdf"),
        FigureKind::Box => format!("{key}_box"),
    }
}

/// Draws both figures of one metric into `dir`.
pub(crate) fn write_figures(dir: &Path, m: &MetricAnalysis) -> Result<Vec<Figure>> {
    ensure_fonts()?;
    [FigureKind::Cdf, FigureKind::Box]
        .into_iter()
        .map(|kind| {
            let stem = stem(&m.metric.key, kind);
            let svg: PathBuf = dir.join(format!("{stem}.svg"));
            let png: PathBuf = dir.join(format!("{stem}.png"));
            render(kind, &svg, &png, m)?;
            Ok(Figure {
                metric: m.metric.key.clone(),
                kind,
                svg,
                png,
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

//! The lab's report: from per-variant measurements to figures and a
//! Markdown and HTML report with honest statistics.
//!
//! [`write_report`] takes a [`ReportInput`] (what the lab runner measured:
//! per metric the values of each variant, per variant the event counts,
//! the scenario and facts about the run) and writes into a directory:
//!
//! * per metric `<key>_cdf.svg`/`.png`: small multiples, one panel per
//!   condition (see [`Design`]), the empirical CDF of each variant in the
//!   colour of its compared value (the same in every figure), with the
//!   pointwise 95% distribution-free confidence interval of its quantiles
//!   lightly shaded, and the legend above the panels;
//! * per metric `<key>_box.svg`/`.png`: box plots in the same panels and
//!   colours (quartiles, median, mean, Tukey whiskers at 1.5 IQR, outliers
//!   as points);
//! * `report.md` and `report.html` (self-contained: inline CSS, figures by
//!   relative path): title, facts, the variants' short labels and what
//!   they stand for, findings tables (per headline metric, one row per
//!   condition and one column per compared value: the median ratio against
//!   the baseline of the same condition, its 95% interval and Mann–Whitney
//!   p-value), findings, warnings, per metric a table (n, median, p10,
//!   p90, mean with its 95% bootstrap interval, the median's 95% interval,
//!   the ratio of medians to its baseline with its interval and the
//!   p-value, flagged below 0.05) and the figures; the counts; how each
//!   number was computed; the scenario file.
//!
//! The statistics come from [`onionlab_stats`]. A one-panel figure is
//! 800 x 500 pixels ([`FIGURE_SIZE`]), a panel of several 420 x 300, three
//! panels a row; figures are drawn with `plotters`; PNG text is rendered from the DejaVu Sans
//! font embedded by the `dejavu` crate (its files are under the Bitstream
//! Vera / DejaVu licence, which allows redistribution), so no system fonts
//! are needed. The same input always gives the same files.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod analysis;
mod compare;
mod error;
mod format;
mod html;
mod layout;
mod markdown;
mod model;
mod plot;
mod tables;

use std::path::Path;

pub use compare::{compare_runs, RunComparison};
pub use error::{Error, Result};
pub use layout::short_labels;
pub use model::{
    Compare, Design, Figure, FigureKind, Metric, Parameter, ReportFiles, ReportInput, VariantCounts,
};
pub use plot::FIGURE_SIZE;

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes the figures, `report.md` and `report.html` for `input` into
/// `out_dir` (created if missing; existing files of the same names are
/// replaced).
///
/// Variants without values for a metric are shown as having no data; a
/// variant with one value gets unbounded intervals rather than made-up
/// ones.
///
/// # Errors
///
/// Invalid input ([`Error::NoVariants`], [`Error::BadVariant`],
/// [`Error::BadMetricKey`], [`Error::UnknownVariant`],
/// [`Error::NotFinite`]) before anything is written; [`Error::Io`],
/// [`Error::Plot`] or [`Error::Font`] while writing.
pub fn write_report(input: &ReportInput, out_dir: &Path) -> Result<ReportFiles> {
    let analysis = analysis::analyse(input)?;
    std::fs::create_dir_all(out_dir).map_err(|source| Error::Io {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let mut figures = Vec::new();
    for m in &analysis.metrics {
        figures.extend(plot::write_figures(out_dir, m, &analysis.layout)?);
    }
    let markdown = out_dir.join("report.md");
    write_file(&markdown, &markdown::render(&analysis))?;
    let html = out_dir.join("report.html");
    write_file(&html, &html::render(&analysis))?;
    Ok(ReportFiles {
        markdown,
        html,
        figures,
        findings_text: tables::findings_text(&analysis),
    })
}

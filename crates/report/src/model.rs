//! What a report is made from, and what writing it produces.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Everything a report shows; the lab runner fills it from a run's records.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReportInput {
    /// Report title (first heading).
    pub title: String,
    /// The scenario file, embedded verbatim at the end of the report.
    pub scenario_toml: String,
    /// Key/value facts about the run, in display order: versions, seeds,
    /// machine, date, repetitions...
    pub meta: Vec<(String, String)>,
    /// Variant labels in display order; the first is the baseline that
    /// ratios and tests compare against.
    pub variants: Vec<String>,
    /// The measured metrics, one table and two figures each.
    pub metrics: Vec<Metric>,
    /// Per-variant event counts (at most one row per variant).
    pub counts: Vec<VariantCounts>,
    /// Warnings printed prominently near the top of the report.
    pub notes: Vec<String>,
    /// Summary facts listed near the top (not warnings), under the
    /// findings tables: stall rates...
    #[serde(default)]
    pub findings: Vec<String>,
    /// How the variants were made from matrix parameters: short labels,
    /// conditions and the compared parameter. The default (no parameters)
    /// shows the labels as they are and compares every variant with the
    /// first.
    #[serde(default)]
    pub design: Design,
}

/// How the variants were made from the matrix parameters of a scenario.
///
/// A variant's *condition* is its values of every varying parameter but
/// the compared one; each variant is compared with the variant of the same
/// condition whose compared parameter has the baseline value (e.g. `quic`
/// at 1% loss with `tls` at 1% loss).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Design {
    /// The matrix parameters, in label order.
    pub parameters: Vec<Parameter>,
    /// Per variant of [`ReportInput::variants`], in the same order, its
    /// value of each parameter, in [`Design::parameters`] order.
    pub assignments: Vec<Vec<String>>,
    /// The compared parameter and its baseline; `None`: every variant is
    /// compared with the first.
    pub compare: Option<Compare>,
}

/// One matrix parameter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parameter {
    /// Its name in the scenario (e.g. `loss:guard-middle`).
    pub name: String,
    /// Its name in short labels (e.g. `loss`); empty: the value alone
    /// (e.g. `quic` for `transport`).
    pub short: String,
}

/// The parameter a report compares, and the value compared against.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compare {
    /// A [`Parameter::name`] (e.g. `transport`).
    pub parameter: String,
    /// One of its values (e.g. `tls`).
    pub baseline: String,
}

/// One measured quantity, with its values per variant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// Short identifier, used in file names: ASCII letters, digits, `_`,
    /// `-` (e.g. `ttfb_ms`).
    pub key: String,
    /// Human-readable name (e.g. "Time to first byte").
    pub title: String,
    /// Unit of the values (e.g. "ms", "MiB/s").
    pub unit: String,
    /// Whether smaller values are better (times) or larger (goodput); used
    /// to word the comparison with the baseline.
    pub lower_is_better: bool,
    /// Whether the metric gets a findings table at the top of the report
    /// (one row per condition, one column per compared value).
    #[serde(default)]
    pub headline: bool,
    /// `(variant label, values)`; a variant without an entry, or with no
    /// values, is shown as having no data.
    pub values: Vec<(String, Vec<f64>)>,
    /// `(variant label, repetition of each value)`, in the order of its
    /// [`Metric::values`]. Where a variant and its baseline both have them
    /// and a repetition holds more than one value (several transfers of a
    /// workload, every relay's memory), the values are not independent:
    /// the comparison resamples repetitions, paired (repetition r of every
    /// variant ran on the same seed), and tests the repetitions' medians.
    /// A variant without an entry counts its values as independent; an
    /// entry must have one repetition per value.
    #[serde(default)]
    pub repetitions: Vec<(String, Vec<u32>)>,
}

/// Event counts of one variant over all its repetitions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariantCounts {
    /// Variant label (one of [`ReportInput::variants`]).
    pub variant: String,
    /// Repetitions run.
    pub repetitions: u64,
    /// Transfers attempted.
    pub transfers: u64,
    /// Transfers that failed with an error.
    pub errors: u64,
    /// Transfers that timed out.
    pub timeouts: u64,
    /// Stalls (no payload progress for the configured time).
    pub stalls: u64,
    /// Transfers whose end-to-end checksum did not match: any is a failed run.
    pub checksum_failures: u64,
    /// Repetitions during which the CPU was saturated (timings suspect).
    pub cpu_saturated_repetitions: u64,
    /// Repetitions in which a host's kernel dropped packets by itself (a
    /// full TUN queue or socket buffer): the machine limited the result.
    #[serde(default)]
    pub host_dropped_repetitions: u64,
    /// Repetitions of a C tor conflux variant in which some workload
    /// streams ran over plain circuits, not linked sets.
    #[serde(default)]
    pub conflux_fallback_repetitions: u64,
}

/// The kind of a figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FigureKind {
    /// Empirical CDFs of all variants with quantile confidence bands.
    Cdf,
    /// Box plots, one per variant.
    Box,
}

/// One figure, written in two formats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Figure {
    /// The metric's key.
    pub metric: String,
    /// CDF or box plot.
    pub kind: FigureKind,
    /// The SVG file.
    pub svg: PathBuf,
    /// The PNG file.
    pub png: PathBuf,
    /// Width and height in pixels (the PNG's; the SVG's user units).
    pub size: (u32, u32),
}

/// The files [`crate::write_report`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportFiles {
    /// `report.md`.
    pub markdown: PathBuf,
    /// `report.html`.
    pub html: PathBuf,
    /// Per metric, its CDF figure then its box plot.
    pub figures: Vec<Figure>,
    /// The findings tables as plain text for a terminal (empty when the
    /// report has none).
    pub findings_text: String,
}

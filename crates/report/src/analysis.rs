//! Validating the input and computing every number the report shows.

use std::collections::HashSet;

use onionlab_stats::{
    cluster_medians, has_repeated_cluster, mann_whitney_u, ratio_of_medians,
    ratio_of_medians_clustered, sorted, MannWhitney, RatioCi, Summary,
};

use crate::layout::{layout, Layout};
use crate::{Error, Metric, ReportInput, Result, VariantCounts};

/// Statistics of one variant for one metric.
pub(crate) struct VariantRow {
    /// The variant's short label.
    pub label: String,
    /// Values sorted ascending (empty: no data).
    pub sorted: Vec<f64>,
    pub summary: Option<Summary>,
    /// Comparison with its baseline (see [`Layout::baseline_of`]); `None`
    /// for a baseline, without one, and when either side has no data.
    pub vs_baseline: Option<Comparison>,
}

pub(crate) struct Comparison {
    /// The ratio of medians, or why there is none.
    pub ratio: std::result::Result<RatioCi, String>,
    pub test: MannWhitney,
    /// `Some(n)`: the values came several to a repetition, so the interval
    /// resampled repetitions (n of them, both sides' together) and the test
    /// compared the repetitions' medians; `None`: values as independent.
    pub by_repetition: Option<usize>,
}

pub(crate) struct MetricAnalysis<'a> {
    pub metric: &'a Metric,
    pub rows: Vec<VariantRow>,
}

pub(crate) struct Analysis<'a> {
    pub input: &'a ReportInput,
    /// Short labels, conditions, baselines and colours of the variants.
    pub layout: Layout,
    pub metrics: Vec<MetricAnalysis<'a>>,
    /// The input's notes followed by warnings derived from the counts.
    pub warnings: Vec<String>,
    /// Count rows in variant order (zeros for variants without a row).
    pub counts: Vec<VariantCounts>,
}

/// FNV-1a over the metric key and variant label: a fixed, documented seed
/// per (metric, variant) so the same input gives the same report.
pub(crate) fn seed_for(metric: &str, variant: &str) -> u64 {
    onionlab_stats::seed_of_names(&[metric, variant])
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn validate(input: &ReportInput) -> Result<()> {
    if input.variants.is_empty() {
        return Err(Error::NoVariants);
    }
    let mut seen = HashSet::new();
    for v in &input.variants {
        if v.is_empty() || !seen.insert(v.as_str()) {
            return Err(Error::BadVariant(v.clone()));
        }
    }
    let mut keys = HashSet::new();
    for m in &input.metrics {
        if !valid_key(&m.key) || !keys.insert(m.key.as_str()) {
            return Err(Error::BadMetricKey(m.key.clone()));
        }
        let mut named = HashSet::new();
        for (variant, values) in &m.values {
            if !seen.contains(variant.as_str()) || !named.insert(variant.as_str()) {
                return Err(Error::UnknownVariant {
                    context: format!("metric {:?}", m.key),
                    variant: variant.clone(),
                });
            }
            if let Some(index) = values.iter().position(|v| !v.is_finite()) {
                return Err(Error::NotFinite {
                    metric: m.key.clone(),
                    variant: variant.clone(),
                    index,
                    value: values[index],
                });
            }
        }
        validate_repetitions(m, &seen)?;
    }
    let mut counted = HashSet::new();
    for c in &input.counts {
        if !seen.contains(c.variant.as_str()) || !counted.insert(c.variant.as_str()) {
            return Err(Error::UnknownVariant {
                context: "counts".to_string(),
                variant: c.variant.clone(),
            });
        }
    }
    Ok(())
}

/// A variant's values of a metric (empty: none).
pub(crate) fn values_of<'a>(metric: &'a Metric, variant: &str) -> &'a [f64] {
    metric
        .values
        .iter()
        .find(|(v, _)| v == variant)
        .map_or(&[], |(_, v)| v.as_slice())
}

/// The repetition of each of a variant's values, when the metric records
/// them (validated: one per value).
pub(crate) fn repetitions_of<'a>(metric: &'a Metric, variant: &str) -> Option<&'a [u32]> {
    metric
        .repetitions
        .iter()
        .find(|(v, _)| v == variant)
        .map(|(_, r)| r.as_slice())
}

/// `a` against `b` by repetition (the clustered ratio of medians and the U
/// test of repetition medians) when both record repetitions and one has
/// several values in a repetition; `None` otherwise, where the values
/// count as independent.
pub(crate) fn by_repetition(
    (a, ra): (&[f64], Option<&[u32]>),
    (b, rb): (&[f64], Option<&[u32]>),
    seed: u64,
) -> Option<(
    onionlab_stats::Result<RatioCi>,
    onionlab_stats::Result<MannWhitney>,
)> {
    let (ra, rb) = (ra?, rb?);
    if !(has_repeated_cluster(ra) || has_repeated_cluster(rb)) {
        return None;
    }
    let test = cluster_medians(a, ra).and_then(|ma| mann_whitney_u(&ma, &cluster_medians(b, rb)?));
    Some((ratio_of_medians_clustered(a, ra, b, rb, seed), test))
}

/// A variant against its baseline by repetition (see [`by_repetition`]),
/// with the number of repetitions both sides have together.
fn compare_by_repetition(
    metric: &Metric,
    variant: &str,
    baseline: &str,
    seed: u64,
) -> Option<Comparison> {
    let (a, ra) = (values_of(metric, variant), repetitions_of(metric, variant));
    let (b, rb) = (
        values_of(metric, baseline),
        repetitions_of(metric, baseline),
    );
    let (ratio, test) = by_repetition((a, ra), (b, rb), seed)?;
    let mut all: Vec<u32> = ra?.iter().chain(rb?).copied().collect();
    all.sort_unstable();
    all.dedup();
    Some(Comparison {
        ratio: ratio.map_err(|e| e.to_string()),
        test: test.ok()?,
        by_repetition: Some(all.len()),
    })
}

/// Every repetition list of a metric names a known variant once and has
/// one number per value.
fn validate_repetitions(m: &Metric, variants: &HashSet<&str>) -> Result<()> {
    let mut named = HashSet::new();
    for (variant, reps) in &m.repetitions {
        if !variants.contains(variant.as_str()) || !named.insert(variant.as_str()) {
            return Err(Error::UnknownVariant {
                context: format!("metric {:?} (repetitions)", m.key),
                variant: variant.clone(),
            });
        }
        let values = values_of(m, variant).len();
        if reps.len() != values {
            return Err(Error::RepetitionCount {
                metric: m.key.clone(),
                variant: variant.clone(),
                values,
                repetitions: reps.len(),
            });
        }
    }
    Ok(())
}

fn analyse_metric(input: &ReportInput, layout: &Layout, metric: &Metric) -> Vec<VariantRow> {
    let mut rows: Vec<VariantRow> = input
        .variants
        .iter()
        .zip(&layout.short)
        .map(|(label, short)| {
            let values = values_of(metric, label);
            // Values were checked finite and repetitions one per value:
            // `sorted` and the summaries fail only on empty input here.
            let sorted = sorted(values).unwrap_or_default();
            let seed = seed_for(&metric.key, label);
            let summary = match repetitions_of(metric, label) {
                Some(reps) if has_repeated_cluster(reps) => {
                    Summary::of_clustered(values, reps, seed).ok()
                }
                _ => Summary::of(&sorted, seed).ok(),
            };
            VariantRow {
                label: short.clone(),
                sorted,
                summary,
                vs_baseline: None,
            }
        })
        .collect();
    for (i, full) in input.variants.iter().enumerate() {
        let Some(b) = layout.baseline_of[i] else {
            continue;
        };
        let (row, base) = (&rows[i], &rows[b]);
        if row.sorted.is_empty() || base.sorted.is_empty() {
            continue;
        }
        let seed = seed_for(&metric.key, full) ^ 0x5a5a;
        if let Some(c) = compare_by_repetition(metric, full, &input.variants[b], seed) {
            rows[i].vs_baseline = Some(c);
            continue;
        }
        let Ok(test) = mann_whitney_u(&row.sorted, &base.sorted) else {
            continue;
        };
        let ratio = ratio_of_medians(&row.sorted, &base.sorted, seed).map_err(|e| e.to_string());
        rows[i].vs_baseline = Some(Comparison {
            ratio,
            test,
            by_repetition: None,
        });
    }
    rows
}

/// Below this many repetitions a comparison by repetition can hardly
/// decide anything (the exact U test of 4 against 4 medians reaches p =
/// 0.029 at best, of 3 against 3 only 0.1), and the bootstrap over so few
/// repetitions is too narrow.
const MIN_REPETITIONS: usize = 5;

/// The fewest repetitions of any comparison made by repetition, when below
/// [`MIN_REPETITIONS`].
fn fewest_repetitions_compared(metrics: &[MetricAnalysis]) -> Option<usize> {
    metrics
        .iter()
        .flat_map(|m| &m.rows)
        .filter_map(|r| r.vs_baseline.as_ref()?.by_repetition)
        .min()
        .filter(|&n| n < MIN_REPETITIONS)
}

/// Checks the input and computes all statistics.
pub(crate) fn analyse(input: &ReportInput) -> Result<Analysis<'_>> {
    validate(input)?;
    crate::layout::validate(input)?;
    let layout = layout(input);
    let metrics: Vec<MetricAnalysis> = input
        .metrics
        .iter()
        .map(|metric| MetricAnalysis {
            metric,
            rows: analyse_metric(input, &layout, metric),
        })
        .collect();
    let counts: Vec<VariantCounts> = input
        .variants
        .iter()
        .map(|v| {
            input
                .counts
                .iter()
                .find(|c| &c.variant == v)
                .cloned()
                .unwrap_or_else(|| VariantCounts {
                    variant: v.clone(),
                    ..VariantCounts::default()
                })
        })
        .collect();
    let mut warnings = input.notes.clone();
    if let Some(few) = fewest_repetitions_compared(&metrics) {
        warnings.push(format!(
            "Some comparisons are by repetition (several values to a repetition) over only {few} repetitions: a bootstrap over so few repetitions gives intervals too narrow, and a U test of so few repetition medians can hardly decide (3 against 3 reach p = 0.1 at best, 4 against 4 p = 0.029). Run at least {MIN_REPETITIONS} repetitions, more for small differences."
        ));
    }
    for (c, label) in counts.iter().zip(&layout.short) {
        if c.checksum_failures > 0 {
            warnings.push(format!(
                "Variant {}: {} transfer(s) failed the end-to-end checksum: data was corrupted, the run has failed.",
                label, c.checksum_failures
            ));
        }
        if c.cpu_saturated_repetitions > 0 {
            warnings.push(format!(
                "Variant {}: {} of {} repetition(s) ran on a saturated CPU; their timings are not to be trusted.",
                label, c.cpu_saturated_repetitions, c.repetitions
            ));
        }
        if c.host_dropped_repetitions > 0 {
            warnings.push(format!(
                "Variant {}: in {} of {} repetition(s) a host's kernel dropped packets itself (a full TUN queue or socket buffer, see host_drops in repetitions.jsonl): the machine, not the emulated network, limited those results.",
                label, c.host_dropped_repetitions, c.repetitions
            ));
        }
        if c.conflux_fallback_repetitions > 0 {
            warnings.push(format!(
                "Variant {}: in {} of {} repetition(s) C tor ran some workload streams over plain (or unrecorded) circuits, not conflux sets (see ctor_streams in repetitions.jsonl): those transfers did not measure conflux.",
                label, c.conflux_fallback_repetitions, c.repetitions
            ));
        }
    }
    Ok(Analysis {
        input,
        layout,
        metrics,
        warnings,
        counts,
    })
}

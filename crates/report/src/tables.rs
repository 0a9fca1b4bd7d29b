//! The report's tables as plain cells, rendered by both writers.

use onionlab_stats::PMethod;

use crate::analysis::{Analysis, Comparison, MetricAnalysis};
use crate::format::{interval, num, p_value};

/// Significance level at which p-values are flagged.
pub(crate) const ALPHA: f64 = 0.05;

/// One table cell.
pub(crate) struct Cell {
    pub text: String,
    /// Emphasised (significant p-value, non-zero checksum failures...).
    pub strong: bool,
}

impl Cell {
    fn plain(text: impl Into<String>) -> Cell {
        Cell {
            text: text.into(),
            strong: false,
        }
    }
}

pub(crate) struct Table {
    pub header: Vec<String>,
    /// Right-align this column (numbers).
    pub numeric: Vec<bool>,
    pub rows: Vec<Vec<Cell>>,
}

const DASH: &str = "—";

fn ratio_cell(c: &Comparison, lower_is_better: bool) -> Cell {
    match &c.ratio {
        Ok(r) => {
            let (lo, hi) = r.ci95;
            let verdict = if hi < 1.0 {
                if lower_is_better {
                    " lower (better)"
                } else {
                    " lower (worse)"
                }
            } else if lo > 1.0 {
                if lower_is_better {
                    " higher (worse)"
                } else {
                    " higher (better)"
                }
            } else {
                ""
            };
            Cell::plain(format!("{} {}{verdict}", num(r.ratio), interval(r.ci95)))
        }
        Err(why) => Cell::plain(format!("{DASH} ({why})")),
    }
}

fn p_cell(c: &Comparison) -> Cell {
    let method = match c.test.method {
        PMethod::Exact => "exact",
        PMethod::Normal => "normal",
    };
    let significant = c.test.p_two_sided < ALPHA;
    let flag = if significant { " ✱" } else { "" };
    Cell {
        text: format!("{}{flag} ({method})", p_value(c.test.p_two_sided)),
        strong: significant,
    }
}

/// Per-variant statistics of one metric.
pub(crate) fn metric_table(m: &MetricAnalysis) -> Table {
    let baseline = &m.rows[0].label;
    let header = vec![
        "variant".to_string(),
        "n".to_string(),
        "median".to_string(),
        "p10".to_string(),
        "p90".to_string(),
        "mean [95% CI]".to_string(),
        "median 95% CI".to_string(),
        format!("median ratio vs {baseline} [95% CI]"),
        "Mann–Whitney p".to_string(),
    ];
    let numeric = vec![false, true, true, true, true, true, true, false, false];
    let rows = m
        .rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let label = if i == 0 {
                format!("{} (baseline)", row.label)
            } else {
                row.label.clone()
            };
            let mut cells = vec![Cell::plain(label)];
            match &row.summary {
                Some(s) => cells.extend([
                    Cell::plain(s.n.to_string()),
                    Cell::plain(num(s.median)),
                    Cell::plain(num(s.p10)),
                    Cell::plain(num(s.p90)),
                    Cell::plain(format!("{} {}", num(s.mean), interval(s.mean_ci95))),
                    Cell::plain(interval(s.median_ci95)),
                ]),
                None => {
                    cells.push(Cell::plain("0"));
                    cells.extend((0..5).map(|_| Cell::plain(DASH)));
                }
            }
            match (&row.vs_baseline, i) {
                (_, 0) => cells.extend([Cell::plain(DASH), Cell::plain(DASH)]),
                (Some(c), _) => {
                    cells.push(ratio_cell(c, m.metric.lower_is_better));
                    cells.push(p_cell(c));
                }
                (None, _) => cells.extend([Cell::plain("no data"), Cell::plain(DASH)]),
            }
            cells
        })
        .collect();
    Table {
        header,
        numeric,
        rows,
    }
}

/// Event counts per variant.
pub(crate) fn counts_table(a: &Analysis) -> Table {
    let header = [
        "variant",
        "repetitions",
        "transfers",
        "errors",
        "timeouts",
        "stalls",
        "checksum failures",
        "CPU-saturated repetitions",
        "host-dropped repetitions",
    ]
    .map(String::from)
    .to_vec();
    let mut numeric = vec![true; header.len()];
    numeric[0] = false;
    let rows = a
        .counts
        .iter()
        .map(|c| {
            let flagged = |v: u64| Cell {
                text: v.to_string(),
                strong: v > 0,
            };
            vec![
                Cell::plain(c.variant.clone()),
                Cell::plain(c.repetitions.to_string()),
                Cell::plain(c.transfers.to_string()),
                Cell::plain(c.errors.to_string()),
                Cell::plain(c.timeouts.to_string()),
                Cell::plain(c.stalls.to_string()),
                flagged(c.checksum_failures),
                flagged(c.cpu_saturated_repetitions),
                flagged(c.host_dropped_repetitions),
            ]
        })
        .collect();
    Table {
        header,
        numeric,
        rows,
    }
}

/// How the numbers were computed, one sentence per item.
pub(crate) fn method_notes(a: &Analysis) -> Vec<String> {
    let comparisons: usize = a
        .metrics
        .iter()
        .map(|m| m.rows.iter().filter(|r| r.vs_baseline.is_some()).count())
        .sum();
    vec![
        "Quantiles (median, p10, p90, quartiles) are sample quantiles of type 7 (linear interpolation between order statistics, R's and NumPy's default).".to_string(),
        format!(
            "Mean 95% CI: percentile bootstrap, {} resamples, seeded per metric and variant (FNV-1a of the metric key and variant label), so the same input gives the same report.",
            onionlab_stats::BOOTSTRAP_RESAMPLES
        ),
        "Median 95% CI: distribution-free, from order statistics (binomial); a side shown as ∞ cannot be bounded with so few values (fewer than 6 for the median).".to_string(),
        format!(
            "Median ratio: median(variant) / median(baseline) with a 95% percentile-bootstrap interval ({} resamples, each sample resampled independently); \"lower\"/\"higher\" is shown when the interval excludes 1.",
            onionlab_stats::BOOTSTRAP_RESAMPLES
        ),
        format!(
            "Mann–Whitney U test, two-sided, variant against baseline: exact p without ties for at most {} values in all, otherwise the normal approximation with tie and continuity corrections. ✱ marks p < {ALPHA}; the {comparisons} comparison(s) in this report are not corrected for multiple testing.",
            onionlab_stats::EXACT_MAX_TOTAL
        ),
        "CDF plots: empirical CDF per variant; the shaded band is the pointwise 95% distribution-free confidence interval of each quantile (order statistics), clipped to the plot.".to_string(),
        "Box plots: box from the first to the third quartile, black line at the median, × at the mean, whiskers to the most extreme values within 1.5 IQR of the box (Tukey), circles for values beyond the whiskers.".to_string(),
    ]
}

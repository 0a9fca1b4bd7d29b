//! The report's tables as plain cells, rendered by both writers.

use onionlab_stats::PMethod;

use crate::analysis::{Analysis, Comparison, MetricAnalysis};
use crate::format::{interval, num, p_value, ratio, ratio_interval};

/// Significance level at which p-values are flagged.
pub(crate) const ALPHA: f64 = 0.05;

/// One table cell.
pub(crate) struct Cell {
    pub text: String,
    /// Emphasised (significant p-value, non-zero checksum failures...).
    pub strong: bool,
}

impl Cell {
    pub(crate) fn plain(text: impl Into<String>) -> Cell {
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
    let method = match c.by_repetition {
        Some(n) => format!("{method}, medians of {n} repetitions"),
        None => method.to_string(),
    };
    let significant = c.test.p_two_sided < ALPHA;
    let flag = if significant { " ✱" } else { "" };
    Cell {
        text: format!("{}{flag} ({method})", p_value(c.test.p_two_sided)),
        strong: significant,
    }
}

/// Per-variant statistics of one metric, by condition.
pub(crate) fn metric_table(a: &Analysis, m: &MetricAnalysis) -> Table {
    let l = &a.layout;
    let against = if l.compared {
        format!("median ratio vs {} [95% CI]", l.groups[0])
    } else {
        format!("median ratio vs {} [95% CI]", l.short[0])
    };
    let header = vec![
        "variant".to_string(),
        "n".to_string(),
        "median".to_string(),
        "p10".to_string(),
        "p90".to_string(),
        "mean [95% CI]".to_string(),
        "median 95% CI".to_string(),
        against,
        "Mann–Whitney p".to_string(),
    ];
    let numeric = vec![false, true, true, true, true, true, true, false, false];
    let rows = l
        .display_order()
        .into_iter()
        .map(|i| {
            let row = &m.rows[i];
            let is_baseline = if l.compared {
                l.group_of[i] == 0
            } else {
                i == 0
            };
            let label = if is_baseline {
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
            match &row.vs_baseline {
                _ if is_baseline => cells.extend([Cell::plain(DASH), Cell::plain(DASH)]),
                Some(c) => {
                    cells.push(ratio_cell(c, m.metric.lower_is_better));
                    cells.push(p_cell(c));
                }
                None if l.baseline_of[i].is_none() => {
                    cells.extend([Cell::plain("no baseline"), Cell::plain(DASH)])
                }
                None => cells.extend([Cell::plain("no data"), Cell::plain(DASH)]),
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

/// The legend: each short label with its value of every varying parameter;
/// `None` when the variants have no design.
pub(crate) fn legend_table(a: &Analysis) -> Option<Table> {
    let l = &a.layout;
    if l.legend_header.is_empty() {
        return None;
    }
    Some(Table {
        header: l.legend_header.clone(),
        numeric: vec![false; l.legend_header.len()],
        rows: l
            .display_order()
            .into_iter()
            .map(|i| l.legend_rows[i].iter().map(Cell::plain).collect())
            .collect(),
    })
}

/// One findings cell: the ratio, its interval and the p-value adjusted
/// for the table's comparisons (`p_adjusted`, Holm). ✱ marks an adjusted
/// p < [`ALPHA`]; the cell is bold only when the median ratio's interval
/// also excludes 1. The two tests ask different questions (the U test
/// whether one distribution tends to lie above the other, the interval
/// where the ratio of medians lies), so they can disagree, and a bold cell
/// must not read as a decided ratio whose interval includes 1.
fn finding_cell(c: &Comparison, p_adjusted: f64) -> Cell {
    let significant = p_adjusted < ALPHA;
    let flag = if significant { " ✱" } else { "" };
    let interval_excludes_one = c
        .ratio
        .as_ref()
        .is_ok_and(|r| r.ci95.0 > 1.0 || r.ci95.1 < 1.0);
    let p = p_value(p_adjusted);
    let p = if p.starts_with('<') {
        format!("p adj. {p}")
    } else {
        format!("p adj. = {p}")
    };
    let text = match &c.ratio {
        Ok(r) => format!("{} {}, {p}{flag}", ratio(r.ratio), ratio_interval(r.ci95)),
        Err(why) => format!("{DASH} ({why}), {p}{flag}"),
    };
    Cell {
        text,
        strong: significant && interval_excludes_one,
    }
}

/// Holm-adjusted p-values of a findings table's comparisons, in the order
/// the table shows them (conditions, then compared values).
fn adjusted_p_values<'m>(comparisons: impl Iterator<Item = &'m Comparison>) -> Vec<f64> {
    let raw: Vec<f64> = comparisons.map(|c| c.test.p_two_sided).collect();
    // p-values are in [0, 1] by construction; fall back to the raw ones.
    onionlab_stats::holm_adjust(&raw).unwrap_or(raw)
}

/// A findings table of one headline metric: one row per condition with
/// data, the baseline's median, then per compared value its median ratio
/// against the baseline of the same condition; `None` when nothing is
/// compared or no condition has data.
pub(crate) fn findings_table(a: &Analysis, m: &MetricAnalysis) -> Option<Table> {
    let l = &a.layout;
    if !l.compared || l.groups.len() < 2 {
        return None;
    }
    let unit = if m.metric.unit.is_empty() {
        String::new()
    } else {
        format!(" ({})", m.metric.unit)
    };
    let mut header = vec![
        "condition".to_string(),
        format!("{} median{unit}", l.groups[0]),
    ];
    header.extend(
        l.groups[1..]
            .iter()
            .map(|g| format!("{g} / {} [95% CI], p", l.groups[0])),
    );
    let mut numeric = vec![false, true];
    numeric.extend(vec![false; l.groups.len() - 1]);
    let has_data = |i: &Option<usize>| i.is_some_and(|i| m.rows[i].summary.is_some());
    let shown = || {
        l.conditions
            .iter()
            .filter(|c| c.members.iter().any(has_data))
    };
    let mut adjusted = adjusted_p_values(
        shown()
            .flat_map(|c| c.members[1..].iter())
            .filter_map(|member| member.and_then(|i| m.rows[i].vs_baseline.as_ref())),
    )
    .into_iter();
    let rows: Vec<Vec<Cell>> = shown()
        .map(|c| {
            let mut cells = vec![Cell::plain(c.label.clone())];
            cells.push(Cell::plain(
                c.members[0]
                    .and_then(|b| m.rows[b].summary.as_ref())
                    .map_or(DASH.to_string(), |s| num(s.median)),
            ));
            for member in &c.members[1..] {
                let cell = match member.map(|i| &m.rows[i]) {
                    None => Cell::plain("not run"),
                    Some(row) => match &row.vs_baseline {
                        Some(cmp) => finding_cell(cmp, adjusted.next().unwrap_or(1.0)),
                        None if row.summary.is_none() => Cell::plain("no data"),
                        None => Cell::plain(DASH),
                    },
                };
                cells.push(cell);
            }
            cells
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    Some(Table {
        header,
        numeric,
        rows,
    })
}

/// The findings tables: per headline metric its title (with the direction
/// that is better) and table.
pub(crate) fn findings_tables(a: &Analysis) -> Vec<(String, Table)> {
    a.metrics
        .iter()
        .filter(|m| m.metric.headline)
        .filter_map(|m| {
            let direction = if m.metric.lower_is_better {
                "below 1: faster or smaller"
            } else {
                "above 1: better"
            };
            let t = findings_table(a, m)?;
            Some((format!("{} ({direction})", m.metric.title), t))
        })
        .collect()
}

/// A table as aligned plain text (for a terminal).
pub(crate) fn plain_text(t: &Table) -> String {
    let width = |s: &str| s.chars().count();
    let mut widths: Vec<usize> = t.header.iter().map(|h| width(h)).collect();
    for r in &t.rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(width(&c.text));
            }
        }
    }
    let line = |cells: Vec<&str>| -> String {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let pad = widths[i].saturating_sub(width(text));
                if t.numeric.get(i).copied().unwrap_or(false) {
                    format!("{}{text}", " ".repeat(pad))
                } else {
                    format!("{text}{}", " ".repeat(pad))
                }
            })
            .collect();
        format!("{}\n", parts.join("  ").trim_end())
    };
    let mut out = line(t.header.iter().map(String::as_str).collect());
    out.push_str(&format!(
        "{}\n",
        widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("  ")
    ));
    for r in &t.rows {
        out.push_str(&line(r.iter().map(|c| c.text.as_str()).collect()));
    }
    out
}

/// The findings tables as plain text.
pub(crate) fn findings_text(a: &Analysis) -> String {
    let mut out = String::new();
    for (title, t) in findings_tables(a) {
        out.push_str(&title);
        out.push('\n');
        out.push_str(&plain_text(&t));
        out.push('\n');
    }
    out
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
        .layout
        .display_order()
        .into_iter()
        .map(|i| {
            let c = &a.counts[i];
            let flagged = |v: u64| Cell {
                text: v.to_string(),
                strong: v > 0,
            };
            vec![
                Cell::plain(a.layout.short[i].clone()),
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

/// Which metrics were summarised and compared by repetition, and how.
fn by_repetition_note(a: &Analysis) -> String {
    let titles: Vec<&str> = a
        .metrics
        .iter()
        .filter(|m| {
            m.rows.iter().any(|r| {
                r.summary.is_some_and(|s| s.clusters.is_some())
                    || r.vs_baseline
                        .as_ref()
                        .is_some_and(|c| c.by_repetition.is_some())
            })
        })
        .map(|m| m.metric.title.as_str())
        .collect();
    let which = if titles.is_empty() {
        "none in this report".to_string()
    } else {
        titles.join("; ")
    };
    format!(
        "Several values to a repetition (several transfers of one workload, one value per relay) share the repetition's network and are not independent. Where a metric records each value's repetition and a repetition holds more than one, the comparison is by repetition instead: the ratio's interval resamples repetitions ({} times, the same repetitions for the variant and its baseline, which ran on the same seed, pooling all their values), the U test compares the repetitions' medians, and a variant's mean and median intervals resample its repetitions likewise (percentile intervals). By repetition: {which}. The quantiles themselves and the CDF bands treat values as independent; the bands may be narrower than the repetitions allow.",
        onionlab_stats::BOOTSTRAP_RESAMPLES
    )
}

/// How the numbers were computed, one sentence per item.
pub(crate) fn method_notes(a: &Analysis) -> Vec<String> {
    let comparisons: usize = a
        .metrics
        .iter()
        .map(|m| m.rows.iter().filter(|r| r.vs_baseline.is_some()).count())
        .sum();
    let against = if a.layout.compared {
        format!(
            "each variant against the variant of the same condition with {} = {}",
            a.input
                .design
                .compare
                .as_ref()
                .map_or("", |c| c.parameter.as_str()),
            a.layout.groups[0]
        )
    } else {
        "each variant against the first".to_string()
    };
    vec![
        "Quantiles (median, p10, p90, quartiles) are sample quantiles of type 7 (linear interpolation between order statistics, R's and NumPy's default).".to_string(),
        format!(
            "Mean 95% CI: percentile bootstrap, {} resamples, seeded per metric and variant (FNV-1a of the metric key and variant label), so the same input gives the same report; by repetition for the metrics named below.",
            onionlab_stats::BOOTSTRAP_RESAMPLES
        ),
        "Median 95% CI: distribution-free, from order statistics (binomial); a side shown as ∞ cannot be bounded with so few values (fewer than 6 for the median); for the metrics named below, a percentile bootstrap over repetitions instead (∞ with fewer than two).".to_string(),
        format!(
            "Median ratio: median(variant) / median(baseline), {against}, with a 95% percentile-bootstrap interval ({} resamples, each sample resampled independently); \"lower\"/\"higher\" is shown when the interval excludes 1.",
            onionlab_stats::BOOTSTRAP_RESAMPLES
        ),
        format!(
            "Mann–Whitney U test, two-sided, {against}: exact p without ties for at most {} values in all, otherwise the normal approximation with tie and continuity corrections. In the findings tables the p-values are Holm-adjusted over the comparisons of each table (family-wise error rate), and ✱ and bold use the adjusted p; the per-variant tables show the raw p ({comparisons} comparison(s) in this report).",
            onionlab_stats::EXACT_MAX_TOTAL
        ),
        by_repetition_note(a),
        "CDF plots: one panel per condition, one colour per compared variant (the same colour in every figure); the empirical CDF per variant, and a light band for the pointwise 95% distribution-free confidence interval of each quantile (order statistics), clipped to the plot.".to_string(),
        "Box plots: box from the first to the third quartile, black line at the median, × at the mean, whiskers to the most extreme values within 1.5 IQR of the box (Tukey), circles for values beyond the whiskers.".to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use onionlab_stats::{MannWhitney, RatioCi};

    use super::*;

    fn comparison(p: f64, ci95: (f64, f64)) -> Comparison {
        Comparison {
            ratio: Ok(RatioCi { ratio: 0.95, ci95 }),
            test: MannWhitney {
                u: 0.0,
                z: 0.0,
                p_two_sided: p,
                method: PMethod::Normal,
                cles: 0.5,
                rank_biserial: 0.0,
            },
            by_repetition: None,
        }
    }

    #[test]
    fn a_finding_is_bold_only_when_the_u_test_and_the_interval_agree() {
        let cell = |c: &Comparison| finding_cell(c, c.test.p_two_sided);
        let both = cell(&comparison(0.01, (0.90, 0.98)));
        assert!(both.strong && both.text.contains('✱'), "{}", both.text);
        // p < 0.05 but the ratio's interval includes 1: starred, not bold.
        let p_only = cell(&comparison(0.043, (0.759, 1.026)));
        assert!(
            !p_only.strong && p_only.text.contains('✱'),
            "{}",
            p_only.text
        );
        let interval_only = cell(&comparison(0.2, (1.01, 1.2)));
        assert!(!interval_only.strong && !interval_only.text.contains('✱'));
        let no_ratio = cell(&Comparison {
            ratio: Err("no data".into()),
            ..comparison(0.01, (0.0, 0.0))
        });
        assert!(!no_ratio.strong && no_ratio.text.contains('✱'));
    }

    #[test]
    fn findings_are_decided_on_the_adjusted_p() {
        // Raw p = 0.01, but 8 comparisons: Holm makes it 0.08.
        let c = comparison(0.01, (0.90, 0.98));
        let adjusted = adjusted_p_values(std::iter::repeat_n(&c, 8));
        assert!((adjusted[0] - 0.08).abs() < 1e-12);
        let cell = finding_cell(&c, adjusted[0]);
        assert!(!cell.strong && !cell.text.contains('✱'), "{}", cell.text);
        assert!(cell.text.contains("p adj. = 0.08"), "{}", cell.text);
    }
}

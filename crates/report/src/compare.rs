//! Two runs of the same scenario side by side (e.g. two commits): per
//! headline metric and variant, run B's median against run A's, for
//! regressions.

use std::fmt::Write;

use onionlab_stats::{mann_whitney_u, ratio_of_medians, sorted, MannWhitney, RatioCi};

use crate::analysis::{by_repetition, repetitions_of, seed_for, values_of};
use crate::format::{md, num, p_value, ratio, ratio_interval};
use crate::layout::layout;
use crate::tables::{plain_text, Cell, Table, ALPHA};
use crate::{Metric, ReportInput, Result};

/// Two runs compared, as text for a terminal and as Markdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunComparison {
    /// Aligned plain-text tables.
    pub text: String,
    /// The same tables in Markdown, with the runs' facts.
    pub markdown: String,
}

/// B's values against A's (both non-empty): the ratio of medians and the U
/// test, by repetition where a repetition has several values (see
/// [`crate::analysis::by_repetition`]; repetition r of two runs of one
/// scenario ran on the same seed), else as independent values.
fn b_against_a(
    (ma, mb): (&Metric, &Metric),
    variant: &str,
    seed: u64,
) -> (
    onionlab_stats::Result<RatioCi>,
    onionlab_stats::Result<MannWhitney>,
) {
    let (va, vb) = (values_of(ma, variant), values_of(mb, variant));
    let a = (va, repetitions_of(ma, variant));
    let b = (vb, repetitions_of(mb, variant));
    by_repetition(b, a, seed).unwrap_or_else(|| {
        let (sa, sb) = (
            sorted(va).unwrap_or_default(),
            sorted(vb).unwrap_or_default(),
        );
        (ratio_of_medians(&sb, &sa, seed), mann_whitney_u(&sb, &sa))
    })
}

fn median_cell(values: &[f64]) -> Cell {
    match onionlab_stats::median(values) {
        Ok(m) => Cell::plain(num(m)),
        Err(_) => Cell::plain("no data"),
    }
}

/// One metric's table: a row per variant both runs have, named by its
/// short label in run A (`short_a`).
fn metric_table(
    a: &ReportInput,
    short_a: &[String],
    b: &ReportInput,
    ma: &Metric,
    mb: &Metric,
) -> Table {
    let mut rows = Vec::new();
    for (label, full) in short_a.iter().zip(&a.variants) {
        if !b.variants.contains(full) {
            continue;
        }
        let (va, vb) = (values_of(ma, full), values_of(mb, full));
        let mut row = vec![Cell::plain(label.clone()), median_cell(va), median_cell(vb)];
        match (sorted(va), sorted(vb)) {
            (Ok(_), Ok(_)) => {
                let (b_over_a, test) =
                    b_against_a((ma, mb), full, seed_for(&ma.key, full) ^ 0xb0b0);
                row.push(Cell::plain(match b_over_a {
                    Ok(r) => format!("{} {}", ratio(r.ratio), ratio_interval(r.ci95)),
                    Err(e) => format!("— ({e})"),
                }));
                row.push(match test {
                    Ok(t) => Cell {
                        text: format!(
                            "{}{}",
                            p_value(t.p_two_sided),
                            if t.p_two_sided < ALPHA { " ✱" } else { "" }
                        ),
                        strong: t.p_two_sided < ALPHA,
                    },
                    Err(_) => Cell::plain("—"),
                });
            }
            _ => row.extend([Cell::plain("—"), Cell::plain("—")]),
        }
        rows.push(row);
    }
    Table {
        header: [
            "variant",
            "A median",
            "B median",
            "B / A [95% CI]",
            "Mann–Whitney p",
        ]
        .map(String::from)
        .to_vec(),
        numeric: vec![false, true, true, false, false],
        rows,
    }
}

/// Compares run `b` with run `a` (two report inputs of the same scenario):
/// for every headline metric both have, per variant both ran, the two
/// medians, the ratio of B's median to A's with a 95% bootstrap interval,
/// and the Mann–Whitney p-value (✱ below 0.05); by repetition where a
/// metric has several values to a repetition (see [`Metric::repetitions`]). `names` are the runs'
/// names (e.g. their directories) for the Markdown heading.
///
/// # Errors
///
/// Either input fails [`crate::write_report`]'s checks.
pub fn compare_runs(
    a: &ReportInput,
    b: &ReportInput,
    names: (&str, &str),
) -> Result<RunComparison> {
    crate::analysis::analyse(a)?;
    crate::analysis::analyse(b)?;
    let mut text = String::new();
    let mut markdown = format!("# {}: B against A\n\n", md(&a.title));
    let _ = writeln!(markdown, "- **A**: {}", md(names.0));
    let _ = writeln!(markdown, "- **B**: {}", md(names.1));
    for (input, name) in [(a, "A"), (b, "B")] {
        for (k, v) in input
            .meta
            .iter()
            .filter(|(k, _)| k == "commit" || k == "repetitions")
        {
            let _ = writeln!(markdown, "- {name} {}: {}", md(k), md(v));
        }
    }
    markdown.push('\n');
    let (la, lb) = (layout(a), layout(b));
    let only: Vec<&String> = a
        .variants
        .iter()
        .zip(&la.short)
        .filter(|(v, _)| !b.variants.contains(v))
        .chain(
            b.variants
                .iter()
                .zip(&lb.short)
                .filter(|(v, _)| !a.variants.contains(v)),
        )
        .map(|(_, short)| short)
        .collect();
    if !only.is_empty() {
        let list: Vec<&str> = only.iter().map(|v| v.as_str()).collect();
        let note = format!(
            "Variants in one run only (not compared): {}",
            list.join("; ")
        );
        let _ = writeln!(text, "{note}\n");
        let _ = writeln!(markdown, "{}\n", md(&note));
    }
    for ma in a.metrics.iter().filter(|m| m.headline) {
        let Some(mb) = b.metrics.iter().find(|m| m.key == ma.key) else {
            continue;
        };
        let t = metric_table(a, &la.short, b, ma, mb);
        if t.rows.is_empty() {
            continue;
        }
        let unit = if ma.unit.is_empty() {
            String::new()
        } else {
            format!(" ({})", ma.unit)
        };
        let _ = writeln!(text, "{}{unit}", ma.title);
        text.push_str(&plain_text(&t));
        text.push('\n');
        let _ = writeln!(markdown, "## {}{}\n", md(&ma.title), md(&unit));
        crate::markdown::table(&mut markdown, &t);
    }
    Ok(RunComparison { text, markdown })
}

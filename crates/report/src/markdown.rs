//! `report.md`.

use std::fmt::Write;

use crate::analysis::Analysis;
use crate::format::{fence_for, md};
use crate::plot::stem;
use crate::tables::{
    counts_table, findings_tables, legend_table, method_notes, metric_table, Table,
};
use crate::FigureKind;

/// Appends `t` as a Markdown table (bold for emphasised cells).
pub(crate) fn table(out: &mut String, t: &Table) {
    let row = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
    out.push_str(&row(t.header.iter().map(|h| md(h)).collect()));
    out.push_str(&row(t
        .numeric
        .iter()
        .map(|&n| if n { "---:" } else { "---" }.to_string())
        .collect()));
    for r in &t.rows {
        out.push_str(&row(r
            .iter()
            .map(|c| {
                if c.strong {
                    format!("**{}**", md(&c.text))
                } else {
                    md(&c.text)
                }
            })
            .collect()));
    }
    out.push('\n');
}

/// Renders the whole Markdown report.
pub(crate) fn render(a: &Analysis) -> String {
    let input = a.input;
    let mut out = String::new();
    let _ = writeln!(out, "# {}\n", md(&input.title));

    if !input.meta.is_empty() {
        table(
            &mut out,
            &Table {
                header: vec!["".to_string(), "".to_string()],
                numeric: vec![false, false],
                rows: input
                    .meta
                    .iter()
                    .map(|(k, v)| {
                        vec![
                            crate::tables::Cell {
                                text: k.clone(),
                                strong: true,
                            },
                            crate::tables::Cell {
                                text: v.clone(),
                                strong: false,
                            },
                        ]
                    })
                    .collect(),
            },
        );
    }

    if let Some(t) = legend_table(a) {
        out.push_str("## Variants\n\n");
        table(&mut out, &t);
    }

    let findings = findings_tables(a);
    if !findings.is_empty() || !input.findings.is_empty() {
        out.push_str("## Findings\n\n");
        for (title, t) in &findings {
            let _ = writeln!(out, "**{}**\n", md(title));
            table(&mut out, t);
        }
        if !findings.is_empty() {
            let _ = writeln!(
                out,
                "Median ratios with 95% bootstrap intervals and Mann–Whitney p-values, Holm-adjusted over each table's comparisons; ✱: adjusted p < {0}; bold: adjusted p < {0} and the interval excludes 1 (the two tests can disagree: the U test compares whole distributions, the interval the medians). Where a workload has several transfers in a repetition, both are by repetition (see How the numbers were computed).\n",
                crate::tables::ALPHA
            );
        }
        for f in &input.findings {
            let _ = writeln!(out, "- {}", md(f));
        }
        out.push('\n');
    }

    if !a.warnings.is_empty() {
        out.push_str("## Warnings\n\n");
        for w in &a.warnings {
            let _ = writeln!(out, "> **⚠ Warning:** {}\n>", md(w));
        }
        out.push('\n');
    }

    for m in &a.metrics {
        let unit = if m.metric.unit.is_empty() {
            String::new()
        } else {
            format!(" ({})", md(&m.metric.unit))
        };
        let direction = if m.metric.lower_is_better {
            "lower is better"
        } else {
            "higher is better"
        };
        let _ = writeln!(out, "## {}{unit}\n", md(&m.metric.title));
        let _ = writeln!(out, "Metric `{}`, {direction}.\n", m.metric.key);
        table(&mut out, &metric_table(a, m));
        let cdf = stem(&m.metric.key, FigureKind::Cdf);
        let bx = stem(&m.metric.key, FigureKind::Box);
        let _ = writeln!(
            out,
            "![{t}: CDF]({cdf}.png)\n\n![{t}: box plot]({bx}.png)\n\nSVG: [CDF]({cdf}.svg), [box plot]({bx}.svg)\n",
            t = md(&m.metric.title)
        );
    }

    out.push_str("## Counts\n\n");
    table(&mut out, &counts_table(a));

    out.push_str("## How the numbers were computed\n\n");
    for n in method_notes(a) {
        let _ = writeln!(out, "- {}", md(&n));
    }
    out.push('\n');

    out.push_str("## Scenario\n\n");
    let fence = fence_for(&input.scenario_toml);
    let _ = write!(out, "{fence}toml\n{}", input.scenario_toml);
    if !input.scenario_toml.ends_with('\n') {
        out.push('\n');
    }
    let _ = writeln!(out, "{fence}");
    out
}

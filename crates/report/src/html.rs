//! `report.html`: one self-contained page (inline CSS, figures referenced
//! by relative path).

use std::fmt::Write;

use crate::analysis::Analysis;
use crate::format::html;
use crate::plot::{figure_size, stem};
use crate::tables::{
    counts_table, findings_tables, legend_table, method_notes, metric_table, Table, ALPHA,
};
use crate::FigureKind;

const STYLE: &str = "\
body{font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}
h1{border-bottom:2px solid #0072b2;padding-bottom:.2em}
h2{margin-top:1.8em;border-bottom:1px solid #ddd}
h3{margin:1.2em 0 .3em;font-size:1.02em}
table{border-collapse:collapse;margin:1em 0;font-size:.92em;display:block;max-width:100%;overflow-x:auto}
th,td{border:1px solid #ccc;padding:.3em .6em;vertical-align:top}
th{background:#f2f5f8;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.meta th{background:#fafafa}
.warn{border:2px solid #d55e00;background:#fff4ec;padding:.6em 1em;margin:1em 0;border-radius:4px}
.warn p{margin:.3em 0}
strong.sig{color:#b03000}
figure{margin:1em 0}
figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.9em;color:#555}
pre{background:#f6f8fa;border:1px solid #ddd;padding:1em;overflow:auto}
";

fn table(out: &mut String, t: &Table, class: &str) {
    let _ = write!(out, "<table class=\"{class}\">\n<thead><tr>");
    for h in &t.header {
        let _ = write!(out, "<th>{}</th>", html(h));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for r in &t.rows {
        out.push_str("<tr>");
        for (i, c) in r.iter().enumerate() {
            let class = if t.numeric.get(i).copied().unwrap_or(false) {
                " class=\"num\""
            } else {
                ""
            };
            if c.strong {
                let _ = write!(
                    out,
                    "<td{class}><strong class=\"sig\">{}</strong></td>",
                    html(&c.text)
                );
            } else {
                let _ = write!(out, "<td{class}>{}</td>", html(&c.text));
            }
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n");
}

fn figure(out: &mut String, size: (u32, u32), file_stem: &str, alt: &str, caption: &str) {
    let (w, h) = size;
    let _ = writeln!(
        out,
        "<figure><img src=\"{s}.svg\" width=\"{w}\" height=\"{h}\" alt=\"{alt}\">\
<figcaption>{caption} (<a href=\"{s}.png\">PNG</a>, <a href=\"{s}.svg\">SVG</a>)</figcaption></figure>",
        s = html(file_stem),
        alt = html(alt),
        caption = html(caption),
    );
}

/// Renders the whole HTML report.
pub(crate) fn render(a: &Analysis) -> String {
    let input = a.input;
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
<title>{t}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n<h1>{t}</h1>\n",
        t = html(&input.title)
    );

    if !input.meta.is_empty() {
        out.push_str("<table class=\"meta\">\n<tbody>\n");
        for (k, v) in &input.meta {
            let _ = writeln!(out, "<tr><th>{}</th><td>{}</td></tr>", html(k), html(v));
        }
        out.push_str("</tbody>\n</table>\n");
    }

    if let Some(t) = legend_table(a) {
        out.push_str("<h2>Variants</h2>\n");
        table(&mut out, &t, "legend");
    }

    let findings = findings_tables(a);
    if !findings.is_empty() || !input.findings.is_empty() {
        out.push_str("<h2>Findings</h2>\n");
        for (title, t) in &findings {
            let _ = writeln!(out, "<h3>{}</h3>", html(title));
            table(&mut out, t, "findings");
        }
        if !findings.is_empty() {
            let _ = writeln!(
                out,
                "<p>Median ratios with 95% bootstrap intervals and Mann–Whitney p-values, Holm-adjusted over each table's comparisons; ✱: adjusted p &lt; {ALPHA}; bold: adjusted p &lt; {ALPHA} and the interval excludes 1 (the two tests can disagree: the U test compares whole distributions, the interval the medians). Where a workload has several transfers in a repetition, both are by repetition (see How the numbers were computed).</p>"
            );
        }
        if !input.findings.is_empty() {
            out.push_str("<ul>\n");
            for f in &input.findings {
                let _ = writeln!(out, "<li>{}</li>", html(f));
            }
            out.push_str("</ul>\n");
        }
    }

    if !a.warnings.is_empty() {
        out.push_str("<div class=\"warn\" role=\"alert\">\n<h2 style=\"margin-top:0;border:0\">⚠ Warnings</h2>\n");
        for w in &a.warnings {
            let _ = writeln!(out, "<p>{}</p>", html(w));
        }
        out.push_str("</div>\n");
    }

    for m in &a.metrics {
        let unit = if m.metric.unit.is_empty() {
            String::new()
        } else {
            format!(" ({})", m.metric.unit)
        };
        let direction = if m.metric.lower_is_better {
            "lower is better"
        } else {
            "higher is better"
        };
        let _ = writeln!(
            out,
            "<h2 id=\"{k}\">{}</h2>\n<p>Metric <code>{k}</code>, {direction}.</p>",
            html(&format!("{}{unit}", m.metric.title)),
            k = html(&m.metric.key)
        );
        table(&mut out, &metric_table(a, m), "stats");
        let size = figure_size(&a.layout);
        figure(
            &mut out,
            size,
            &stem(&m.metric.key, FigureKind::Cdf),
            &format!("{}: CDF", m.metric.title),
            "Empirical CDF per variant, one panel per condition, with light pointwise 95% quantile confidence bands.",
        );
        figure(
            &mut out,
            size,
            &stem(&m.metric.key, FigureKind::Box),
            &format!("{}: box plot", m.metric.title),
            "Quartile boxes, median line, × mean, whiskers at 1.5 IQR (Tukey), circles beyond.",
        );
    }

    out.push_str("<h2>Counts</h2>\n");
    table(&mut out, &counts_table(a), "counts");

    out.push_str("<h2>How the numbers were computed</h2>\n<ul>\n");
    for n in method_notes(a) {
        let _ = writeln!(out, "<li>{}</li>", html(&n));
    }
    out.push_str("</ul>\n");

    let _ = write!(
        out,
        "<h2>Scenario</h2>\n<pre><code class=\"language-toml\">{}</code></pre>\n</body>\n</html>\n",
        html(&input.scenario_toml)
    );
    out
}

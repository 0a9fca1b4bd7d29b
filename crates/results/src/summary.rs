//! `onionlab lab table --summary`: each variant's centre of each metric
//! with a 95% interval by repetition, as papers give "mean ± 95% CI".
//!
//! The interval is a cluster bootstrap over the variant's repetitions
//! (`onionlab_stats::Summary::of_clustered`): the transfers of one
//! repetition share its network and are never treated as independent
//! draws. Seeded per cell by name, so the same data gives the same table.

use std::fmt::Write as _;

use onionlab_lab::rundata::RunData;
use onionlab_stats::{center_clustered, BOOTSTRAP_RESAMPLES};

use crate::args::TableArgs;
use crate::common::FIRST_LOOK_BELOW;
use crate::common::{left_out_note, sample_of, sharing_note, values_text, VariantRows};
use crate::select::{MetricKind, Selection};
use crate::{Error, Result};

/// One cell: the centre, its interval and the repetitions it rests on.
struct Cell {
    center: f64,
    ci95: (f64, f64),
    repetitions: usize,
}

fn cell(
    sel: &Selection,
    args: &TableArgs,
    metric: MetricKind,
    variant: &str,
    part: Option<&str>,
) -> Result<Option<Cell>> {
    let sample = sample_of(sel, args, metric, variant, part);
    if sample.values.is_empty() {
        return Ok(None);
    }
    let seed =
        onionlab_stats::seed_of_names(&["summary", metric.name(), part.unwrap_or("-"), variant]);
    let (center, ci95) = center_clustered(
        &sample.values,
        &sample.repetitions,
        seed,
        args.center.stats(),
    )
    .map_err(|source| Error::Stats {
        context: format!("{} of {variant}", metric.name()),
        source,
    })?;
    Ok(Some(Cell {
        center,
        ci95,
        repetitions: sample.repetition_set().len(),
    }))
}

/// `x [lo, hi]` with the decimals three significant figures of `x` take
/// (at most three, none from 100 on).
fn interval_text(c: &Cell) -> String {
    let decimals = match c.center.abs() {
        a if a >= 100.0 => 0,
        a if a >= 10.0 => 1,
        a if a >= 1.0 => 2,
        _ => 3,
    };
    let end = |x: f64| {
        if x.is_finite() {
            format!("{x:.decimals$}")
        } else if x > 0.0 {
            "∞".into()
        } else {
            "-∞".into()
        }
    };
    format!("{} [{}, {}]", end(c.center), end(c.ci95.0), end(c.ci95.1))
}

/// The summary table `args` asks for (`args.summary`), as Markdown with
/// its caption.
///
/// # Errors
///
/// The arguments do not fit the run, or a statistic fails.
pub fn summary_of(data: &RunData, args: &TableArgs) -> Result<String> {
    let rows = VariantRows::new(data, args)?;
    let mut head = rows.head();
    head.push("reps".into());
    let center = args.center.name();
    let of = args.per_repetition.map_or_else(String::new, |a| {
        format!(" of each repetition's {}", a.name())
    });
    for m in &args.metric {
        head.push(format!("{} {}, {center}{of} [95% CI]", m.title(), m.unit()));
    }
    let mut out = String::new();
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(head.len()));
    let mut fewest = usize::MAX;
    for v in &rows.variants {
        for part in &rows.parts {
            let mut line = rows.labels(v, part.as_ref());
            let mut reps = 0;
            let mut cells = Vec::new();
            for &m in &args.metric {
                match cell(&rows.sel, args, m, v, part.as_deref())? {
                    None => cells.push("-".to_string()),
                    Some(c) => {
                        reps = reps.max(c.repetitions);
                        fewest = fewest.min(c.repetitions);
                        cells.push(interval_text(&c));
                    }
                }
            }
            line.push(reps.to_string());
            line.extend(cells);
            let _ = writeln!(out, "| {} |", line.join(" | "));
        }
    }
    out.push('\n');
    out.push_str(&caption(data, args, &rows, fewest));
    Ok(out)
}

fn caption(data: &RunData, args: &TableArgs, rows: &VariantRows, fewest: usize) -> String {
    let center = args.center.name();
    let values = values_text(args);
    let mut out = format!(
        "{} Cells: the {center} of {values} with a 95% cluster-bootstrap interval \
         over repetitions ({BOOTSTRAP_RESAMPLES} resamples).",
        data.caption_names(),
    );
    out.push_str(&sharing_note(args));
    if fewest < FIRST_LOOK_BELOW {
        out.push_str(&format!(
            " **First look**: some cells rest on fewer than {FIRST_LOOK_BELOW} repetitions."
        ));
    }
    let variants: Vec<&str> = rows.variants.iter().map(String::as_str).collect();
    let failed: usize = if args.metric.iter().any(|m| m.per_repetition()) {
        0
    } else {
        variants.iter().map(|v| rows.sel.failed(v, None)).sum()
    };
    out.push_str(&left_out_note(&rows.sel, args, &variants, failed));
    out.push('\n');
    out
}

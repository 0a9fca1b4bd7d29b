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
use crate::common::{
    parts_of, sample_of, selected_variants, selection, sharing_note, values_text,
    varying_parameters,
};
use crate::select::{MetricKind, Selection};
use crate::table::FIRST_LOOK_BELOW;
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
    let sel = selection(data, args)?;
    let (parts, kind) = parts_of(&sel, data, args)?;
    let variants = selected_variants(data, args)?;
    let columns = varying_parameters(&variants, |_| true);
    let value = |v: &str, key: &str| {
        crate::select::params_of(v)
            .into_iter()
            .find(|(k, _)| k == key)
            .map_or_else(|| "-".to_string(), |(_, x)| x)
    };

    let mut head = columns.clone();
    if parts.iter().any(Option::is_some) {
        head.push(kind.column().into());
    }
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
    for v in &variants {
        for part in &parts {
            let mut line: Vec<String> = columns.iter().map(|c| value(v, c)).collect();
            if let Some(p) = part {
                line.push(p.clone());
            }
            let mut reps = 0;
            let mut cells = Vec::new();
            for &m in &args.metric {
                match cell(&sel, args, m, v, part.as_deref())? {
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
    out.push_str(&caption(data, args, &sel, &variants, fewest));
    Ok(out)
}

fn caption(
    data: &RunData,
    args: &TableArgs,
    sel: &Selection,
    variants: &[String],
    fewest: usize,
) -> String {
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
    let failed: usize = if args.metric.iter().any(|m| m.per_repetition()) {
        0
    } else {
        variants.iter().map(|v| sel.failed(v, None)).sum()
    };
    let saturated: usize = variants.iter().map(|v| sel.left_out(v)).sum();
    let mut left = Vec::new();
    if failed > 0 {
        left.push(format!("{failed} failed transfers"));
    }
    if args.while_loaded {
        let after: usize = variants.iter().map(|v| sel.after_load_count(v, None)).sum();
        left.push(format!(
            "{after} transfers that ended after their repetition's first stream (the load) did"
        ));
    }
    if saturated > 0 {
        left.push(format!("{saturated} repetitions on a saturated CPU"));
    }
    if !left.is_empty() {
        out.push_str(&format!(" Left out: {}.", left.join(", ")));
    }
    out.push('\n');
    out
}

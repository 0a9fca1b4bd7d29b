//! `onionlab lab table --slope-over X`: what each unit of a per-repetition
//! quantity costs, per variant: the least-squares slope of each
//! repetition's mean of the metric over the repetition's X (ms per lost
//! packet for `--slope-over lost-packets --metric ttlb`), with a 95%
//! bootstrap interval over repetitions (a repetition is one point, so
//! the transfers within it are never independent draws).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use onionlab_lab::rundata::RunData;
use onionlab_stats::{slope_bootstrap, BOOTSTRAP_RESAMPLES};

use crate::args::TableArgs;
use crate::common::{left_out_note, num, sample_of, table_err, VariantRows};
use crate::select::{Aggregate, MetricKind, Selection};
use crate::{Error, Result};

/// One row's numbers.
struct Fit {
    points: usize,
    x_median: f64,
    y_median: f64,
    slope: Option<onionlab_stats::SlopeCi>,
}

/// Each repetition's (x, y) of `variant`: x the sum of `x_metric`'s values
/// in the repetition, y the repetition's mean of `metric` (or its
/// `--per-repetition` value); repetitions without either are left out.
fn points(
    sel: &Selection,
    args: &TableArgs,
    (metric, x_metric): (MetricKind, MetricKind),
    variant: &str,
    part: Option<&str>,
) -> Vec<(f64, f64)> {
    let x = sel.sample(x_metric, variant, None);
    let mut xs: BTreeMap<u32, f64> = BTreeMap::new();
    for (v, r) in x.values.iter().zip(&x.repetitions) {
        *xs.entry(*r).or_default() += v;
    }
    let y = sample_of(sel, args, metric, variant, part);
    let y = if args.per_repetition.is_some() {
        y
    } else {
        let failed = sel.failed_repetitions(variant, part);
        y.per_repetition(Aggregate::Mean, &failed)
    };
    y.values
        .iter()
        .zip(&y.repetitions)
        .filter_map(|(v, r)| xs.get(r).map(|x| (*x, *v)))
        .collect()
}

fn fit(points: &[(f64, f64)], seed: u64, context: &str) -> Result<Option<Fit>> {
    if points.is_empty() {
        return Ok(None);
    }
    let stats = |source| Error::Stats {
        context: context.to_string(),
        source,
    };
    let xs: Vec<f64> = points.iter().map(|p| p.0).collect();
    let ys: Vec<f64> = points.iter().map(|p| p.1).collect();
    Ok(Some(Fit {
        points: points.len(),
        x_median: onionlab_stats::median(&xs).map_err(stats)?,
        y_median: onionlab_stats::median(&ys).map_err(stats)?,
        slope: slope_bootstrap(points, seed).map_err(stats)?,
    }))
}

fn slope_text(f: &Fit) -> String {
    match f.slope {
        None => "- (x does not vary)".into(),
        Some(s) => match s.ci95 {
            Some((lo, hi)) => format!("{} [{}, {}]", num(s.slope), num(lo), num(hi)),
            None => format!("{} (too few distinct points for an interval)", num(s.slope)),
        },
    }
}

/// The slope table `args` asks for, over `x_metric`, as Markdown with its
/// caption.
///
/// # Errors
///
/// The arguments do not fit the run (one metric, per transfer or per
/// repetition; `x_metric` per repetition), or a statistic fails.
pub fn slope_of(data: &RunData, args: &TableArgs, x_metric: MetricKind) -> Result<String> {
    if !x_metric.per_repetition() {
        return Err(table_err(
            data,
            format!(
                "--slope-over {}: a metric per repetition is needed",
                x_metric.name()
            ),
        ));
    }
    let [metric] = args.metric[..] else {
        return Err(table_err(data, "--slope-over fits one --metric"));
    };
    let rows = VariantRows::new(data, args)?;
    let y_of = args
        .per_repetition
        .map_or_else(|| "mean".to_string(), |a| a.name().to_string());
    let mut head = rows.head();
    head.extend([
        "reps".to_string(),
        format!(
            "{} {}, median a repetition",
            x_metric.title(),
            x_metric.unit()
        ),
        format!(
            "{} {}, median of the repetitions' {y_of}s",
            metric.title(),
            metric.unit()
        ),
        format!(
            "{} {} per {} [95% CI]",
            metric.title(),
            metric.unit(),
            x_metric.title()
        ),
    ]);
    let mut out = String::new();
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(head.len()));
    for v in &rows.variants {
        for part in &rows.parts {
            let context = format!("{} over {} of {v}", metric.name(), x_metric.name());
            let seed = onionlab_stats::seed_of_names(&[
                "slope",
                metric.name(),
                x_metric.name(),
                part.as_deref().unwrap_or("-"),
                v,
            ]);
            let pts = points(&rows.sel, args, (metric, x_metric), v, part.as_deref());
            let mut line = rows.labels(v, part.as_ref());
            match fit(&pts, seed, &context)? {
                None => line.extend(["0".into(), "-".into(), "-".into(), "-".into()]),
                Some(f) => line.extend([
                    f.points.to_string(),
                    num(f.x_median),
                    num(f.y_median),
                    slope_text(&f),
                ]),
            }
            let _ = writeln!(out, "| {} |", line.join(" | "));
        }
    }
    let _ = write!(
        out,
        "\n{} \
         Each repetition is a point (its {} against its {}); the slope is a \
         least-squares fit with a 95% percentile-bootstrap interval over \
         repetitions ({BOOTSTRAP_RESAMPLES} resamples). A slope is an association \
         across repetitions, not a cause: what else differs between repetitions \
         moves with it.",
        data.caption_names(),
        metric.name(),
        x_metric.name(),
    );
    let variants: Vec<&str> = rows.variants.iter().map(String::as_str).collect();
    out.push_str(&crate::common::sharing_note(args));
    out.push_str(&left_out_note(&rows.sel, args, &variants, 0));
    out.push('\n');
    Ok(out)
}

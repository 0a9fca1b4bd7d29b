//! `onionlab lab table`: one comparison table of a run, as the results
//! pages show them.
//!
//! Rows are comparisons: each value of the compared matrix parameter
//! against the baseline value under the same other parameters (a
//! *condition*), per workload; or explicit pairs of variants (`--pair`).
//! Per metric a row shows both medians and their ratio with a 95% interval
//! and a p-value:
//!
//! - the interval is a paired cluster bootstrap over the repetitions both
//!   variants have (`onionlab_stats::ratio_of_medians_clustered`):
//!   transfers of one repetition share its network and are never treated
//!   as independent draws; repetition r of every variant has the same
//!   seed, so they are paired by repetition;
//! - the p-value is a two-sided Mann-Whitney U test of the repetitions'
//!   medians, adjusted for the number of comparisons in the table (Holm by
//!   default, Benjamini-Hochberg with `--correction bh`);
//! - a ratio is bold only where the adjusted p is below 0.05 *and* the
//!   interval excludes 1, and never in a table from fewer than
//!   [`FIRST_LOOK_BELOW`] repetitions (a "first look").
//!
//! The bootstrap's seed is fixed per cell (an FNV-1a hash of the metric,
//! condition, workload and variant), so the same data gives the same
//! table, byte for byte.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use onionlab_lab::rundata::RunData;
use onionlab_stats::{
    benjamini_hochberg_adjust, cluster_medians, holm_adjust, mann_whitney_u, ratio_clustered,
    RatioCi, BOOTSTRAP_RESAMPLES,
};

pub use crate::args::{CenterArg, Correction, TableArgs};
use crate::common::{
    left_out_note, num, parts_of, sample_of, selected_variants, selection, sharing_note, table_err,
    values_text, varying_parameters, PartKind,
};
use crate::select::{params_of, MetricKind, Sample, Selection};
use crate::{Error, Result};

pub use crate::common::FIRST_LOOK_BELOW;
/// Significance level of the adjusted p-values.
pub const ALPHA: f64 = 0.05;

/// One row: a comparison of variant `a` with variant `b`.
struct Row {
    /// The condition's values (one per condition column) or the pair.
    labels: Vec<String>,
    /// The workload (metrics per transfer) or relays (relay metrics) the
    /// row covers; `None`: all.
    part: Option<String>,
    a: String,
    b: String,
}

/// One metric's numbers in one row.
struct Cell {
    center_a: f64,
    center_b: f64,
    ratio: RatioCi,
    p: f64,
    repetitions: usize,
}

/// The compared parameter and baseline: the arguments', else the
/// scenario's design.
fn compared(data: &RunData, args: &TableArgs, variants: &[String]) -> Result<(String, String)> {
    let design = onionlab_lab::labels::design_of_run(&data.scenario_toml, &data.variants());
    let from_design = design.compare.as_ref();
    let param = args
        .compare
        .clone()
        .or_else(|| from_design.map(|c| c.parameter.clone()))
        .unwrap_or_else(|| "transport".into());
    let values: Vec<String> = variants
        .iter()
        .filter_map(|v| params_of(v).into_iter().find(|(k, _)| *k == param))
        .map(|(_, v)| v)
        .collect();
    if values.is_empty() {
        return Err(table_err(
            data,
            format!("no variant has the matrix parameter {param:?} (--compare)"),
        ));
    }
    let baseline = match (&args.baseline, from_design) {
        (Some(b), _) => b.clone(),
        (None, Some(c)) if c.parameter == param => c.baseline.clone(),
        _ if param == "transport" && values.iter().any(|v| v == "tls") => "tls".into(),
        _ => values[0].clone(),
    };
    if !values.contains(&baseline) {
        return Err(table_err(
            data,
            format!("no variant has {param}={baseline} (the baseline)"),
        ));
    }
    Ok((param, baseline))
}

/// Rows comparing each value of the compared parameter with the baseline,
/// condition by condition; and the columns' names (the conditions', the
/// ignored parameters', the compared parameter's).
fn condition_rows(
    data: &RunData,
    args: &TableArgs,
    parts: &[Option<String>],
) -> Result<(Vec<String>, Vec<Row>)> {
    let variants = selected_variants(data, args)?;
    let (param, baseline) = compared(data, args, &variants)?;
    if let Some(p) = args.ignore.iter().find(|p| **p == param) {
        return Err(table_err(
            data,
            format!("--ignore {p}: it is the compared parameter"),
        ));
    }
    let condition = |v: &str| -> Vec<(String, String)> {
        params_of(v)
            .into_iter()
            .filter(|(k, _)| *k != param && !args.ignore.contains(k))
            .collect()
    };
    let mut columns = varying_parameters(&variants, |k| {
        k != param && !args.ignore.iter().any(|i| i == k)
    });
    let value = |v: &str, key: &str| {
        params_of(v)
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, x)| x)
    };
    let baselines: Vec<&String> = variants
        .iter()
        .filter(|v| value(v, &param).is_some_and(|x| x == baseline))
        .collect();
    // With parameters ignored, one condition may have several baselines
    // (seed 003's Normal and Prioritized Tor): a column says which.
    let several = baselines.iter().any(|b| {
        baselines
            .iter()
            .filter(|o| condition(o) == condition(b))
            .count()
            > 1
    });
    let mut rows = Vec::new();
    for b in baselines {
        let cond = condition(b);
        let labels: Vec<String> = columns
            .iter()
            .map(|c| {
                cond.iter()
                    .find(|(k, _)| k == c)
                    .map_or("-".into(), |(_, v)| v.clone())
            })
            .collect();
        for part in parts {
            for a in variants
                .iter()
                .filter(|a| condition(a) == cond && *a != b && value(a, &param).is_some())
            {
                let mut labels = labels.clone();
                if several {
                    let against: Vec<String> = args
                        .ignore
                        .iter()
                        .filter_map(|k| value(b, k).map(|x| format!("{k}={x}")))
                        .collect();
                    labels.push(against.join(" "));
                }
                for key in args.ignore.iter().chain([&param]) {
                    labels.push(value(a, key).unwrap_or_else(|| "-".into()));
                }
                rows.push(Row {
                    labels,
                    part: part.clone(),
                    a: a.clone(),
                    b: b.clone(),
                });
            }
        }
    }
    if several {
        columns.push("against".into());
    }
    columns.extend(args.ignore.iter().cloned());
    columns.push(param);
    if rows.is_empty() {
        return Err(table_err(
            data,
            format!("no variant to compare with its {baseline} counterpart"),
        ));
    }
    Ok((columns, rows))
}

/// Rows of explicit pairs.
fn pair_rows(data: &RunData, args: &TableArgs, parts: &[Option<String>]) -> Result<Vec<Row>> {
    let variants = data.variants();
    let mut rows = Vec::new();
    for pair in args.pair.chunks(2) {
        for v in pair {
            if !variants.contains(v) {
                return Err(table_err(data, format!("no variant {v:?} in the run")));
            }
        }
        for part in parts {
            rows.push(Row {
                labels: vec![pair[0].clone(), pair[1].clone()],
                part: part.clone(),
                a: pair[0].clone(),
                b: pair[1].clone(),
            });
        }
    }
    Ok(rows)
}

/// The numbers of one metric in one row; `None` without values on a side
/// or a repetition in common.
fn cell(sel: &Selection, args: &TableArgs, metric: MetricKind, row: &Row) -> Result<Option<Cell>> {
    let w = row.part.as_deref();
    let sample = |v: &str| sample_of(sel, args, metric, v, w);
    let (a, b) = (sample(&row.a), sample(&row.b));
    let common: BTreeSet<u32> = a
        .repetition_set()
        .intersection(&b.repetition_set())
        .copied()
        .collect();
    if common.is_empty() {
        return Ok(None);
    }
    let (a, b): (Sample, Sample) = (a.restricted_to(&common), b.restricted_to(&common));
    let context = || format!("{} of {} against {}", metric.name(), row.a, row.b);
    let stats = |source| Error::Stats {
        context: context(),
        source,
    };
    let seed = onionlab_stats::seed_of_names(&[metric.name(), w.unwrap_or("-"), &row.a, &row.b]);
    let center = args.center.stats();
    let ratio = ratio_clustered(
        &a.values,
        &a.repetitions,
        &b.values,
        &b.repetitions,
        seed,
        center,
    )
    .map_err(stats)?;
    let ma = cluster_medians(&a.values, &a.repetitions).map_err(stats)?;
    let mb = cluster_medians(&b.values, &b.repetitions).map_err(stats)?;
    let test = mann_whitney_u(&ma, &mb).map_err(stats)?;
    Ok(Some(Cell {
        center_a: center.of_values(&a.values).map_err(stats)?,
        center_b: center.of_values(&b.values).map_err(stats)?,
        ratio,
        p: test.p_two_sided,
        repetitions: common.len(),
    }))
}

fn p_text(p: f64) -> String {
    if p < 0.001 {
        "< 0.001".into()
    } else {
        format!("{p:.3}")
    }
}

fn ci_text(r: &RatioCi) -> String {
    let end = |x: f64| {
        if x.is_finite() {
            format!("{x:.2}")
        } else {
            "∞".into()
        }
    };
    format!("[{}, {}]", end(r.ci95.0), end(r.ci95.1))
}

/// The table `args` asks for, as Markdown: the table, then a caption that
/// names the run, its commit and repetitions and how to read the numbers.
///
/// # Errors
///
/// The run cannot be read, the arguments do not fit it, or a statistic
/// fails.
pub fn table(args: &TableArgs) -> Result<String> {
    let mut runs = args.runs.iter();
    let first = runs.next().ok_or_else(|| Error::Table {
        run: "-".into(),
        message: "no run given".into(),
    })?;
    let mut data = RunData::load(first)?;
    for run in runs {
        data.join(RunData::load(run)?)?;
    }
    table_of(&data, args)
}

/// [`table`] of data already read.
///
/// # Errors
///
/// As [`table`].
pub fn table_of(data: &RunData, args: &TableArgs) -> Result<String> {
    if args.summary {
        return crate::summary::summary_of(data, args);
    }
    if let Some(x) = args.slope_over {
        return crate::slope::slope_of(data, args, x);
    }
    if args.by_jobs {
        return crate::jobs::by_jobs_of(data, args);
    }
    let sel = selection(data, args)?;
    let (parts, kind) = parts_of(&sel, data, args)?;
    let (columns, rows) = if args.pair.is_empty() {
        condition_rows(data, args, &parts)?
    } else {
        (vec!["A".into(), "B".into()], pair_rows(data, args, &parts)?)
    };
    let mut cells = Vec::new();
    for row in &rows {
        for &m in &args.metric {
            cells.push(cell(&sel, args, m, row)?);
        }
    }
    let raw_p: Vec<f64> = cells.iter().flatten().map(|c| c.p).collect();
    let adjusted = match args.correction {
        Correction::Holm => holm_adjust(&raw_p),
        Correction::Bh => benjamini_hochberg_adjust(&raw_p),
    }
    .map_err(|source| Error::Stats {
        context: "adjusting p-values".into(),
        source,
    })?;
    let thin_cells = cells
        .iter()
        .flatten()
        .filter(|c| c.repetitions < FIRST_LOOK_BELOW)
        .count();

    let mut out = String::new();
    let mut head: Vec<String> = columns.clone();
    if parts.iter().any(Option::is_some) {
        head.push(kind.column().into());
    }
    head.push("reps".into());
    let baseline_name = if args.pair.is_empty() {
        rows.first()
            .map(|r| {
                params_of(&r.b)
                    .into_iter()
                    .find(|(k, _)| Some(k) == columns.last())
                    .map_or_else(String::new, |(_, v)| v)
            })
            .unwrap_or_default()
    } else {
        "B".into()
    };
    let per_rep = args
        .per_repetition
        .map_or_else(String::new, |a| format!(", {} a repetition", a.name()));
    for m in &args.metric {
        head.push(format!(
            "{} {}{per_rep} ({baseline_name})",
            m.title(),
            m.unit()
        ));
        head.push(format!("{} ratio [95% CI]", m.title()));
        head.push("p adj.".into());
    }
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(head.len()));
    let mut adjusted = adjusted.into_iter();
    let mut cells = cells.into_iter();
    let mut bold_count = 0;
    for row in &rows {
        let mut line = row.labels.clone();
        if let Some(w) = &row.part {
            line.push(w.clone());
        }
        let mut reps = 0;
        let mut parts = Vec::new();
        for _ in &args.metric {
            match cells.next().flatten() {
                None => parts.extend(["-".to_string(), "-".into(), "-".into()]),
                Some(c) => {
                    let p = adjusted.next().unwrap_or(1.0);
                    reps = reps.max(c.repetitions);
                    let excludes_one = c.ratio.ci95.0 > 1.0 || c.ratio.ci95.1 < 1.0;
                    // A cell from fewer repetitions (after leaving some
                    // out) is a first look, whatever the table's count.
                    let bold = c.repetitions >= FIRST_LOOK_BELOW && p < ALPHA && excludes_one;
                    bold_count += usize::from(bold);
                    let ratio = format!("{:.2}", c.ratio.ratio);
                    let ratio = if bold { format!("**{ratio}**") } else { ratio };
                    parts.push(format!("{} ({})", num(c.center_a), num(c.center_b)));
                    parts.push(format!("{ratio} {}", ci_text(&c.ratio)));
                    parts.push(p_text(p));
                }
            }
        }
        line.push(reps.to_string());
        line.extend(parts);
        let _ = writeln!(out, "| {} |", line.join(" | "));
    }
    out.push('\n');
    out.push_str(&caption(
        data,
        args,
        &sel,
        (&rows, kind),
        (raw_p.len(), bold_count, thin_cells),
    ));
    Ok(out)
}

/// The lines under a table: which run, how the numbers were made, what
/// was left out.
/// `counts`: the table's comparisons, bold cells, and cells from fewer
/// than [`FIRST_LOOK_BELOW`] repetitions.
fn caption(
    data: &RunData,
    args: &TableArgs,
    sel: &Selection,
    (rows, kind): (&[Row], PartKind),
    counts: (usize, usize, usize),
) -> String {
    let (comparisons, bold, thin_cells) = counts;
    let mut variants: Vec<&str> = Vec::new();
    for r in rows {
        for v in [&r.a, &r.b] {
            if !variants.contains(&v.as_str()) {
                variants.push(v);
            }
        }
    }
    let workload = |r: &Row| match kind {
        PartKind::Workloads => r.part.clone(),
        PartKind::Relays => None,
    };
    let failed: usize = rows
        .iter()
        .flat_map(|r| [(r.a.clone(), workload(r)), (r.b.clone(), workload(r))])
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(|(v, w)| sel.failed(&v, w.as_deref()))
        .sum();
    let correction = match args.correction {
        Correction::Holm => "Holm-adjusted",
        Correction::Bh => "Benjamini-Hochberg-adjusted (false discovery rate 5%)",
    };
    let center = args.center.name();
    let values = values_text(args);
    let mut out = format!(
        "{} Cells `x (y)`: the {center}s of {values}, the variant's and the baseline's; \
         ratio of {center}s with a 95% paired cluster-bootstrap interval over \
         repetitions ({BOOTSTRAP_RESAMPLES} resamples); p: Mann-Whitney U of \
         repetition medians, {correction} over the {comparisons} comparisons of \
         this table. ",
        data.caption_names(),
    );
    out.push_str(sharing_note(args).trim_start());
    if !out.ends_with(' ') {
        out.push(' ');
    }
    if thin_cells == comparisons {
        out.push_str(&format!(
            "**First look**: fewer than {FIRST_LOOK_BELOW} repetitions, nothing is bold.",
        ));
    } else {
        out.push_str(&format!(
            "Bold ({bold}): adjusted p < {ALPHA} and the interval excludes 1."
        ));
        if thin_cells > 0 {
            out.push_str(&format!(
                " {thin_cells} cells rest on fewer than {FIRST_LOOK_BELOW} repetitions \
                 (after leaving some out): first looks, never bold."
            ));
        }
    }
    out.push_str(&left_out_note(sel, args, &variants, failed));
    out.push('\n');
    out
}

#[cfg(test)]
mod tests;

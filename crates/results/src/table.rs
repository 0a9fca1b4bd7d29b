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
use std::path::PathBuf;

use onionlab_lab::rundata::RunData;
use onionlab_stats::{
    benjamini_hochberg_adjust, cluster_medians, holm_adjust, mann_whitney_u, ratio_clustered,
    Center, RatioCi, BOOTSTRAP_RESAMPLES,
};

use crate::select::{matches_pattern, params_of, Aggregate, MetricKind, Sample, Selection};
use crate::{Error, Result};

/// Tables from fewer repetitions than this are a "first look": nothing in
/// them is bold.
pub const FIRST_LOOK_BELOW: usize = 5;
/// Significance level of the adjusted p-values.
pub const ALPHA: f64 = 0.05;

/// How p-values are adjusted for the number of comparisons in a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Correction {
    /// Holm's step-down: the family-wise error rate.
    Holm,
    /// Benjamini-Hochberg: the false discovery rate, at 5%.
    Bh,
}

/// What a ratio compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CenterArg {
    /// Medians (robust).
    Median,
    /// Means (as papers that give "mean ± CI" compare).
    Mean,
    /// 75th percentiles (the slowest quarter's edge).
    P75,
    /// 95th percentiles (the slowest 5%'s edge).
    P95,
}

impl CenterArg {
    pub(crate) fn stats(self) -> Center {
        match self {
            CenterArg::Median => Center::Median,
            CenterArg::Mean => Center::Mean,
            CenterArg::P75 => Center::P75,
            CenterArg::P95 => Center::P95,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            CenterArg::Median => "median",
            CenterArg::Mean => "mean",
            CenterArg::P75 => "75th percentile",
            CenterArg::P95 => "95th percentile",
        }
    }
}

/// What `lab table` shows (also what a results page's marker command
/// parses to).
#[derive(clap::Args, Debug, Clone)]
pub struct TableArgs {
    /// The run: a stored run (`docs/results/data/ID`) or a run directory;
    /// several are read together (presets made to be compared, whose
    /// repetition r shares its seed, such as seed 001's loaded toy and its
    /// companions), each variant from the one run that has it.
    #[arg(required = true, num_args = 1..)]
    pub runs: Vec<PathBuf>,
    /// The matrix parameter compared (default: the scenario's `[report]
    /// compare`, else `transport`).
    #[arg(long)]
    pub compare: Option<String>,
    /// The value of `--compare` the others are compared with (default:
    /// the scenario's `[report] baseline`, else `tls` for transport, else
    /// its first value).
    #[arg(long)]
    pub baseline: Option<String>,
    /// Instead of `--compare`: variant A against variant B (full labels,
    /// as in records.jsonl); repeat for more rows.
    #[arg(long, num_args = 2, value_names = ["A", "B"], conflicts_with_all = ["compare", "baseline"])]
    pub pair: Vec<String>,
    /// Metrics, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "ttfb,ttlb")]
    pub metric: Vec<MetricKind>,
    /// Only these workloads, comma-separated, in this order (default:
    /// all, in the run's order); a `*` in a name stands for any run of
    /// characters, and the workloads a pattern matches are pooled into
    /// one row (`--workload 'light-*,heavy-*'`).
    #[arg(long, value_delimiter = ',')]
    pub workload: Vec<String>,
    /// Every workload of a variant counts as one, `all` (clients that do
    /// the same thing).
    #[arg(long)]
    pub pool: bool,
    /// Only variants with this matrix value (`PARAM=VALUE`, the names of
    /// the full labels: `loss:guard-middle=1%`); repeatable.
    #[arg(long = "where", value_name = "PARAM=VALUE")]
    pub filter: Vec<String>,
    /// The relays of the relay metrics (`relay-cpu`, `relay-cpu-s`,
    /// `relay-core`, `relay-rss`), comma-separated name patterns such as
    /// `g1,m1,exit` or `g*`: one row each (default: all relays, one row).
    #[arg(long, value_delimiter = ',')]
    pub relay: Vec<String>,
    /// Matrix parameters left out of the conditions: a variant is set
    /// against the baseline whatever its value of these (which a column
    /// shows). For variants the baseline has no counterpart of: seed
    /// 004's leg schedulers against the one path, which has no scheduler
    /// to vary. Comma-separated.
    #[arg(long, value_delimiter = ',', conflicts_with = "pair")]
    pub ignore: Vec<String>,
    /// Instead of comparisons: each variant's centre of each metric with
    /// its 95% cluster-bootstrap interval over repetitions (a table of
    /// absolute values, as papers give "mean ± 95% CI").
    #[arg(long, conflicts_with_all = ["pair", "baseline", "ignore"])]
    pub summary: bool,
    /// Instead of comparisons: per variant, the least-squares slope of each
    /// repetition's mean of the `--metric` (or its `--per-repetition`
    /// value) over the repetition's value of this metric per repetition,
    /// with a 95% bootstrap interval over repetitions: what each unit of
    /// it costs (`--slope-over lost-packets --metric ttlb`: ms per lost
    /// packet).
    #[arg(long, value_enum, value_name = "METRIC", conflicts_with_all = ["pair", "baseline", "ignore", "summary"])]
    pub slope_over: Option<MetricKind>,
    /// Instead of comparisons between variants: each variant's
    /// repetitions made beside other runs (`lab run --jobs` above 1)
    /// against those it made alone (unpaired: different repetitions), to
    /// check whether running several at once moved the results.
    #[arg(long, conflicts_with_all = ["pair", "baseline", "ignore", "summary", "slope_over", "alone"])]
    pub by_jobs: bool,
    /// Only repetitions made alone (`lab run --jobs 1`), not beside other
    /// runs.
    #[arg(long)]
    pub alone: bool,
    /// Reduce each repetition's values to one first: `min` (with
    /// `--pool --metric goodput`: the slowest client), `max`, `median`,
    /// `mean`, `sum` (the network's throughput), `p95` or `p99`. A repetition
    /// with a failed transfer among those values is left out.
    #[arg(long, value_enum)]
    pub per_repetition: Option<Aggregate>,
    /// Reduce each workload's values in a repetition to one first (each
    /// client's, where every client has a workload of its own): `median`
    /// with `--center median` is seed 001's "median of the clients'
    /// medians". Applied before `--per-repetition`.
    #[arg(long, value_enum, value_name = "AGGREGATE")]
    pub per_workload: Option<Aggregate>,
    /// Only the transfers that ended before the first stream of their
    /// repetition did (the network loaded throughout them: seed 001's
    /// loaded toy, whose background load is streams of a fixed length);
    /// the others are counted in the caption.
    #[arg(long)]
    pub while_loaded: bool,
    /// Only the web clients whose circuit shares this with a bulk
    /// client's circuit in their repetition: `connection` (a pair of
    /// adjacent relays, so a link connection), `relay` (a relay only) or
    /// `apart` (nothing). From the circuits the lab records of onionlab's
    /// clients; C tor's variants have none and drop out.
    #[arg(long, value_enum)]
    pub sharing: Option<crate::sharing::Sharing>,
    /// What the ratio compares (and a summary shows): medians, means, or
    /// the 75th or 95th percentiles of the pooled values.
    #[arg(long, value_enum, default_value = "median")]
    pub center: CenterArg,
    /// The adjustment for multiple comparisons.
    #[arg(long, value_enum, default_value = "holm")]
    pub correction: Correction,
}

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

pub(crate) fn table_err(data: &RunData, message: impl Into<String>) -> Error {
    Error::Table {
        run: data.source.display().to_string(),
        message: message.into(),
    }
}

/// The variants the filters keep, in the scenario's order.
pub(crate) fn selected_variants(data: &RunData, args: &TableArgs) -> Result<Vec<String>> {
    let mut wanted = Vec::new();
    for f in &args.filter {
        let (k, v) = f
            .split_once('=')
            .ok_or_else(|| table_err(data, format!("--where {f:?}: expected PARAM=VALUE")))?;
        wanted.push((k.to_string(), v.to_string()));
    }
    let variants: Vec<String> = data
        .variants()
        .into_iter()
        .filter(|v| {
            let p = params_of(v);
            wanted.iter().all(|w| p.contains(w))
        })
        .collect();
    if variants.is_empty() {
        return Err(table_err(data, "no variant of the run matches --where"));
    }
    Ok(variants)
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

/// The matrix parameters whose value varies among `variants` (in
/// first-seen order), of those `keep` keeps.
pub(crate) fn varying_parameters(variants: &[String], keep: impl Fn(&str) -> bool) -> Vec<String> {
    let mut columns: Vec<String> = Vec::new();
    for v in variants {
        for (k, val) in params_of(v) {
            let varies = variants
                .iter()
                .any(|o| params_of(o).iter().any(|(ok, ov)| *ok == k && *ov != val));
            if varies && keep(&k) && !columns.contains(&k) {
                columns.push(k);
            }
        }
    }
    columns
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

/// What a table's centres are of, for its caption.
pub(crate) fn values_text(args: &TableArgs) -> String {
    let per_workload = match args.per_workload {
        Some(a) if !args.metric.iter().any(|m| m.per_repetition()) => {
            format!("each workload's {} in a repetition", a.name())
        }
        _ => String::new(),
    };
    match (args.per_repetition, per_workload.is_empty()) {
        (Some(a), true) => format!(
            "each repetition's {} (repetitions with a failed transfer left out)",
            a.name()
        ),
        (Some(a), false) => format!(
            "each repetition's {} of {per_workload} (repetitions with a failed transfer left out)",
            a.name()
        ),
        (None, false) => per_workload,
        (None, true) if args.metric.iter().any(|m| m.per_repetition()) => {
            "the repetitions' values".into()
        }
        (None, true) => "the transfers' values".into(),
    }
}

/// The caption's sentence on a `--sharing` filter (empty without one).
pub(crate) fn sharing_note(args: &TableArgs) -> String {
    use crate::sharing::Sharing;
    match args.sharing {
        None => String::new(),
        Some(class) => format!(
            " Only web clients whose circuit shares {} with a bulk client's in their repetition.",
            match class {
                Sharing::Connection => "a link connection (two adjacent relays)",
                Sharing::Relay => "a relay but no link connection",
                Sharing::Apart => "no relay",
            }
        ),
    }
}

/// Which records of `data` count, as `args` says.
///
/// # Errors
///
/// Arguments that do not go together.
pub(crate) fn selection<'a>(data: &'a RunData, args: &TableArgs) -> Result<Selection<'a>> {
    if args.per_workload.is_some() && args.pool {
        return Err(table_err(
            data,
            "--per-workload needs the workloads apart: instead of --pool, name a pattern with --workload",
        ));
    }
    let sel = Selection::new(data, args.alone, args.pool);
    let sel = if args.while_loaded {
        sel.while_loaded()
    } else {
        sel
    };
    Ok(match args.sharing {
        Some(class) => sel.sharing(class),
        None => sel,
    })
}

/// The values of `metric` for `variant` and `part` that a table uses:
/// reduced to one a repetition where `args` says so.
pub(crate) fn sample_of(
    sel: &Selection,
    args: &TableArgs,
    metric: MetricKind,
    variant: &str,
    part: Option<&str>,
) -> Sample {
    let s = match args.per_workload {
        Some(agg) if !metric.per_repetition() => {
            let mut out = Sample::default();
            for w in sel
                .workloads()
                .iter()
                .filter(|w| part.is_none_or(|p| matches_pattern(p, w)))
            {
                let each = sel.sample(metric, variant, Some(w));
                let one = each.per_repetition(agg, &sel.failed_repetitions(variant, Some(w)));
                out.values.extend(one.values);
                out.repetitions.extend(one.repetitions);
            }
            out
        }
        _ => sel.sample(metric, variant, part),
    };
    // A failed transfer biases a minimum or a sum of transfers; the
    // metrics per repetition have none to fail.
    let failed = if metric.per_repetition() {
        BTreeSet::new()
    } else {
        sel.failed_repetitions(variant, part)
    };
    match args.per_repetition {
        Some(agg) => s.per_repetition(agg, &failed),
        None => s,
    }
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

/// A number with three significant figures at most (no exponent).
pub(crate) fn num(x: f64) -> String {
    match x.abs() {
        a if a >= 100.0 => format!("{x:.0}"),
        a if a >= 10.0 => format!("{x:.1}"),
        a if a >= 1.0 => format!("{x:.2}"),
        _ => format!("{x:.3}"),
    }
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

/// What the rows of a table are split by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PartKind {
    /// Workloads (metrics per transfer).
    Workloads,
    /// Relays (the relay metrics) or nothing (other metrics per
    /// repetition).
    Relays,
}

impl PartKind {
    pub(crate) fn column(self) -> &'static str {
        match self {
            PartKind::Workloads => "workload",
            PartKind::Relays => "relays",
        }
    }
}

/// The parts the rows cover: workloads for metrics per transfer, relay
/// patterns for the relay metrics (`None`: all).
pub(crate) fn parts_of(
    sel: &Selection,
    data: &RunData,
    args: &TableArgs,
) -> Result<(Vec<Option<String>>, PartKind)> {
    let per_rep = args.metric.iter().filter(|m| m.per_repetition()).count();
    if per_rep > 0 && per_rep < args.metric.len() {
        return Err(table_err(
            data,
            "metrics per repetition (relay-*, tcp-*, torchestra-moves, circuit-build, wire-overhead, lost-packets, loss-rate, queue-drop-rate) and per transfer go in separate tables",
        ));
    }
    if per_rep > 0 {
        if !args.workload.is_empty() {
            return Err(table_err(
                data,
                "--workload narrows metrics per transfer; metrics per repetition cover the whole repetition",
            ));
        }
        if args.relay.is_empty() {
            return Ok((vec![None], PartKind::Relays));
        }
        let relays: Vec<&String> = data
            .repetitions
            .iter()
            .flat_map(|r| r.relay_cpu_s.iter().map(|(n, _)| n))
            .collect();
        for p in &args.relay {
            if !relays.iter().any(|name| matches_pattern(p, name)) {
                return Err(table_err(data, format!("no relay matches --relay {p:?}")));
            }
        }
        return Ok((
            args.relay.iter().cloned().map(Some).collect(),
            PartKind::Relays,
        ));
    }
    if !args.relay.is_empty() {
        return Err(table_err(
            data,
            "--relay chooses the relays of the relay metrics only",
        ));
    }
    if args.pool && !args.workload.is_empty() {
        return Err(table_err(
            data,
            "--pool counts every workload as one: with --workload, name a pattern instead (`--workload 'light-*'`)",
        ));
    }
    let all = sel.workloads();
    if args.workload.is_empty() {
        return Ok((all.into_iter().map(Some).collect(), PartKind::Workloads));
    }
    for w in &args.workload {
        if !all.iter().any(|name| matches_pattern(w, name)) {
            return Err(table_err(
                data,
                format!("no workload {w:?} (the run has {})", all.join(", ")),
            ));
        }
    }
    Ok((
        args.workload.iter().cloned().map(Some).collect(),
        PartKind::Workloads,
    ))
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
    let saturated: usize = variants.iter().map(|v| sel.left_out(v)).sum();
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
        let why = if args.alone {
            "on a saturated CPU or beside other runs"
        } else {
            "on a saturated CPU"
        };
        left.push(format!("{saturated} repetitions {why}"));
    }
    if !left.is_empty() {
        out.push_str(&format!(" Left out: {}.", left.join(", ")));
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests;

//! What every kind of table shares: which variants and records count,
//! each metric's values as a table uses them, what its rows are split by,
//! the caption's shared sentences, and number formatting.

use std::collections::BTreeSet;

use onionlab_lab::rundata::RunData;

use crate::args::TableArgs;
use crate::select::{matches_pattern, params_of, MetricKind, Sample, Selection};
use crate::{Error, Result};

/// Tables from fewer repetitions than this are a "first look": nothing in
/// them is bold.
pub const FIRST_LOOK_BELOW: usize = 5;

/// A table that does not fit its run, naming the run.
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

/// The matrix parameters whose value varies among `variants` (in
/// first-seen order), of those `keep` keeps; a parameter some variants
/// lack (runs read together) varies too.
pub(crate) fn varying_parameters(variants: &[String], keep: impl Fn(&str) -> bool) -> Vec<String> {
    let mut columns: Vec<String> = Vec::new();
    for v in variants {
        for (k, val) in params_of(v) {
            let varies = variants.iter().any(|o| {
                params_of(o)
                    .iter()
                    .find(|(ok, _)| *ok == k)
                    .is_none_or(|(_, ov)| *ov != val)
            });
            if varies && keep(&k) && !columns.contains(&k) {
                columns.push(k);
            }
        }
    }
    columns
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

/// The caption's sentences on the `--index` and `--sharing` filters
/// (empty without them).
pub(crate) fn sharing_note(args: &TableArgs) -> String {
    const ORDINALS: [&str; 5] = ["first", "second", "third", "fourth", "fifth"];
    let index = match args.index.map(|i| i as usize) {
        Some(i) if i < ORDINALS.len() => format!(
            " Only each workload's {} transfer in its repetition.",
            ORDINALS[i]
        ),
        Some(i) => format!(
            " Only each workload's transfer {} (from 0) in its repetition.",
            i
        ),
        None => String::new(),
    };
    index + &sharing_class_note(args)
}

fn sharing_class_note(args: &TableArgs) -> String {
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
    let sel = match args.index {
        Some(i) => sel.index(i),
        None => sel,
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

/// A number with three significant figures at most (no exponent).
pub(crate) fn num(x: f64) -> String {
    match x.abs() {
        a if a >= 100.0 => format!("{x:.0}"),
        a if a >= 10.0 => format!("{x:.1}"),
        a if a >= 1.0 => format!("{x:.2}"),
        _ => format!("{x:.3}"),
    }
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
            "metrics per repetition (relay-*, tcp-*, torchestra-moves, circuit-build, wire-overhead, lost-packets, loss-rate, queue-drop-rate, sim-wall, sim-memory) and per transfer go in separate tables",
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

/// Where a table of variants (one row per variant and part: `--summary`,
/// `--slope-over`, `--by-jobs`) starts: what counts, the rows' variants
/// and parts, and the parameter columns that tell them apart.
pub(crate) struct VariantRows<'a> {
    /// Which records count.
    pub sel: Selection<'a>,
    /// The parts each variant's rows cover.
    pub parts: Vec<Option<String>>,
    /// What the parts are.
    pub kind: PartKind,
    /// The variants, in the scenario's order.
    pub variants: Vec<String>,
    /// The matrix parameters whose value varies among them.
    pub columns: Vec<String>,
}

impl<'a> VariantRows<'a> {
    /// As `args` asks of `data`.
    pub(crate) fn new(data: &'a RunData, args: &TableArgs) -> Result<VariantRows<'a>> {
        let sel = selection(data, args)?;
        let (parts, kind) = parts_of(&sel, data, args)?;
        let variants = selected_variants(data, args)?;
        let columns = varying_parameters(&variants, |_| true);
        Ok(VariantRows {
            sel,
            parts,
            kind,
            variants,
            columns,
        })
    }

    /// The head's first cells: the parameter columns, then the part's.
    pub(crate) fn head(&self) -> Vec<String> {
        let mut head = self.columns.clone();
        if self.parts.iter().any(Option::is_some) {
            head.push(self.kind.column().into());
        }
        head
    }

    /// A row's first cells: `variant`'s values of the columns, then the
    /// part.
    pub(crate) fn labels(&self, variant: &str, part: Option<&String>) -> Vec<String> {
        let params = params_of(variant);
        let mut line: Vec<String> = self
            .columns
            .iter()
            .map(|c| {
                params
                    .iter()
                    .find(|(k, _)| k == c)
                    .map_or_else(|| "-".to_string(), |(_, x)| x.clone())
            })
            .collect();
        if let Some(p) = part {
            line.push(p.clone());
        }
        line
    }
}

/// The caption's " Left out: ..." sentence (empty when nothing was):
/// `failed` transfers, transfers after the load (`--while-loaded`), and
/// the repetitions of `variants` that did not count.
pub(crate) fn left_out_note(
    sel: &Selection,
    args: &TableArgs,
    variants: &[&str],
    failed: usize,
) -> String {
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
    let saturated: usize = variants.iter().map(|v| sel.left_out(v)).sum();
    if saturated > 0 {
        let why = if args.alone {
            "on a saturated CPU or beside other runs"
        } else {
            "on a saturated CPU"
        };
        left.push(format!("{saturated} repetitions {why}"));
    }
    if left.is_empty() {
        String::new()
    } else {
        format!(" Left out: {}.", left.join(", "))
    }
}

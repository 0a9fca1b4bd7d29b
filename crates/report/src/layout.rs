//! From a [`Design`] to what the report shows: short variant labels, the
//! conditions (groups of variants that differ only in the compared
//! parameter), each variant's baseline and colour.

use std::collections::HashSet;

use crate::{Design, Error, ReportInput, Result};

/// Label of the one condition when nothing but the compared parameter
/// varies.
pub(crate) const ALL: &str = "all";

/// Variants that differ only in the compared parameter.
pub(crate) struct Condition {
    /// Short label of the condition (the varying parameters but the
    /// compared one), or [`ALL`].
    pub label: String,
    /// Per compared value (in [`Layout::groups`] order), the index of the
    /// variant with that value, if the run has it.
    pub members: Vec<Option<usize>>,
}

/// The report's view of the variants.
pub(crate) struct Layout {
    /// Short label of each variant, in input order.
    pub short: Vec<String>,
    /// The colour groups: the compared parameter's values as in labels
    /// (baseline first; e.g. `tls`, `quic` or `loss 0%`, `loss 1%`) or,
    /// without a compared parameter, one short label per variant.
    pub groups: Vec<String>,
    /// Per variant, its group (its colour in every figure).
    pub group_of: Vec<usize>,
    /// Per variant, the variant it is compared with (`None`: it is a
    /// baseline, or its condition has no baseline).
    pub baseline_of: Vec<Option<usize>>,
    /// The conditions, in order of first appearance.
    pub conditions: Vec<Condition>,
    /// Per variant, its condition.
    pub condition_of: Vec<usize>,
    /// Whether a compared parameter is set (findings tables are made).
    pub compared: bool,
    /// Rows of the legend: per variant its short label and its value of
    /// each varying parameter; and the header (parameter names).
    pub legend_header: Vec<String>,
    /// See `legend_header`.
    pub legend_rows: Vec<Vec<String>>,
}

fn part(short: &str, value: &str) -> String {
    if short.is_empty() {
        value.to_string()
    } else {
        format!("{short} {value}")
    }
}

/// Checks a design against the variants.
pub(crate) fn validate(input: &ReportInput) -> Result<()> {
    let d = &input.design;
    if d.parameters.is_empty() {
        if d.compare.is_some() || !d.assignments.is_empty() {
            return Err(Error::BadDesign(
                "assignments or a compared parameter without parameters".into(),
            ));
        }
        return Ok(());
    }
    let mut names = HashSet::new();
    for p in &d.parameters {
        if p.name.is_empty() || !names.insert(p.name.as_str()) {
            return Err(Error::BadDesign(format!(
                "parameter {:?} is empty or repeated",
                p.name
            )));
        }
    }
    if d.assignments.len() != input.variants.len() {
        return Err(Error::BadDesign(format!(
            "{} assignments for {} variants",
            d.assignments.len(),
            input.variants.len()
        )));
    }
    let mut seen = HashSet::new();
    for (v, a) in input.variants.iter().zip(&d.assignments) {
        if a.len() != d.parameters.len() {
            return Err(Error::BadDesign(format!(
                "variant {v:?} has {} values for {} parameters",
                a.len(),
                d.parameters.len()
            )));
        }
        if !seen.insert(a) {
            return Err(Error::BadDesign(format!(
                "variant {v:?} has the same values as another"
            )));
        }
    }
    if let Some(c) = &d.compare {
        if !names.contains(c.parameter.as_str()) {
            return Err(Error::BadDesign(format!(
                "compared parameter {:?} is not a parameter",
                c.parameter
            )));
        }
    }
    Ok(())
}

/// Short labels of variants: their values of the parameters that vary,
/// the compared parameter first, each as `short value` (the value alone
/// when the short name is empty), joined by `, `. A variant whose
/// parameters do not vary keeps its full label, as does every variant of a
/// design without parameters.
///
/// `design` must be valid for `variants` (one assignment per variant).
pub fn short_labels(design: &Design, variants: &[String]) -> Vec<String> {
    let order = label_order(design);
    variants
        .iter()
        .enumerate()
        .map(|(i, full)| {
            let parts: Vec<String> = order
                .iter()
                .filter_map(|&p| {
                    let value = design.assignments.get(i)?.get(p)?;
                    Some(part(&design.parameters[p].short, value))
                })
                .collect();
            if parts.is_empty() {
                full.clone()
            } else {
                parts.join(", ")
            }
        })
        .collect()
}

/// Indices of the parameters that take more than one value.
fn varying(design: &Design) -> Vec<usize> {
    (0..design.parameters.len())
        .filter(|&p| {
            let mut values = design.assignments.iter().filter_map(|a| a.get(p));
            let first = values.next();
            values.any(|v| Some(v) != first)
        })
        .collect()
}

fn compared_index(design: &Design) -> Option<usize> {
    let c = design.compare.as_ref()?;
    design.parameters.iter().position(|p| p.name == c.parameter)
}

/// Varying parameters, the compared one first.
fn label_order(design: &Design) -> Vec<usize> {
    let mut order = varying(design);
    if let Some(c) = compared_index(design) {
        if let Some(pos) = order.iter().position(|&p| p == c) {
            order.remove(pos);
            order.insert(0, c);
        }
    }
    order
}

fn without_design(input: &ReportInput) -> Layout {
    let n = input.variants.len();
    Layout {
        short: input.variants.clone(),
        groups: input.variants.clone(),
        group_of: (0..n).collect(),
        baseline_of: (0..n).map(|i| (i > 0).then_some(0)).collect(),
        conditions: vec![Condition {
            label: ALL.to_string(),
            members: (0..n).map(Some).collect(),
        }],
        condition_of: vec![0; n],
        compared: false,
        legend_header: Vec::new(),
        legend_rows: Vec::new(),
    }
}

/// The layout of a validated input.
pub(crate) fn layout(input: &ReportInput) -> Layout {
    let d = &input.design;
    let Some(c) = compared_index(d) else {
        let mut l = without_design(input);
        if !d.parameters.is_empty() {
            l.short = short_labels(d, &input.variants);
            l.groups = l.short.clone();
            (l.legend_header, l.legend_rows) = legend(d, &l.short, &input.variants);
        }
        return l;
    };
    // The baseline value; when no variant has it (a run stopped early, say),
    // the first value a variant has.
    let wanted = d.compare.as_ref().map_or("", |c| c.baseline.as_str());
    let baseline = if d.assignments.iter().any(|a| a[c] == wanted) {
        wanted.to_string()
    } else {
        d.assignments
            .first()
            .map(|a| a[c].clone())
            .unwrap_or_default()
    };
    let short = short_labels(d, &input.variants);
    let mut values: Vec<String> = vec![baseline];
    for a in &d.assignments {
        if !values.contains(&a[c]) {
            values.push(a[c].clone());
        }
    }
    let group_of: Vec<usize> = d
        .assignments
        .iter()
        .map(|a| values.iter().position(|g| *g == a[c]).unwrap_or(0))
        .collect();
    let groups: Vec<String> = values
        .iter()
        .map(|v| part(&d.parameters[c].short, v))
        .collect();
    let others: Vec<usize> = varying(d).into_iter().filter(|&p| p != c).collect();
    let key = |a: &Vec<String>| -> Vec<String> { others.iter().map(|&p| a[p].clone()).collect() };
    let mut keys: Vec<Vec<String>> = Vec::new();
    let mut conditions: Vec<Condition> = Vec::new();
    let mut condition_of = Vec::new();
    for (i, a) in d.assignments.iter().enumerate() {
        let k = key(a);
        let ci = match keys.iter().position(|x| *x == k) {
            Some(ci) => ci,
            None => {
                let label = if others.is_empty() {
                    ALL.to_string()
                } else {
                    others
                        .iter()
                        .map(|&p| part(&d.parameters[p].short, &a[p]))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                keys.push(k);
                conditions.push(Condition {
                    label,
                    members: vec![None; groups.len()],
                });
                keys.len() - 1
            }
        };
        conditions[ci].members[group_of[i]] = Some(i);
        condition_of.push(ci);
    }
    let baseline_of = (0..input.variants.len())
        .map(|i| {
            if group_of[i] == 0 {
                None
            } else {
                conditions[condition_of[i]].members[0]
            }
        })
        .collect();
    let (legend_header, legend_rows) = legend(d, &short, &input.variants);
    Layout {
        short,
        groups,
        group_of,
        baseline_of,
        conditions,
        condition_of,
        compared: true,
        legend_header,
        legend_rows,
    }
}

/// The legend table: per variant its short label, its value of every
/// varying parameter (full parameter names as the header) and its full
/// label (as `records.jsonl` names it).
fn legend(d: &Design, short: &[String], full: &[String]) -> (Vec<String>, Vec<Vec<String>>) {
    let order = label_order(d);
    if order.is_empty() {
        return (Vec::new(), Vec::new());
    }
    let mut header = vec!["label".to_string()];
    header.extend(order.iter().map(|&p| d.parameters[p].name.clone()));
    header.push("full label".to_string());
    let rows = d
        .assignments
        .iter()
        .zip(short)
        .zip(full)
        .map(|((a, s), f)| {
            let mut row = vec![s.clone()];
            row.extend(order.iter().map(|&p| a[p].clone()));
            row.push(f.clone());
            row
        })
        .collect();
    (header, rows)
}

impl Layout {
    /// Variant indices in display order: by condition, then by group.
    pub(crate) fn display_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.short.len()).collect();
        order.sort_by_key(|&i| (self.condition_of[i], self.group_of[i], i));
        order
    }
}

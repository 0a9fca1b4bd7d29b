//! How a scenario's variants are named and compared in reports and
//! progress lines: the matrix's combinations and full labels, short names
//! of matrix parameters, and the compared parameter with its baseline (the
//! scenario's optional `[report]` table):
//!
//! ```toml
//! [report]
//! compare = "transport"     # default: transport, when the matrix varies it
//! baseline = "tls"          # default: tls for transport, else the first value
//! [report.labels]           # short names in labels (default: see default_short)
//! "latency:client-guard,guard-middle,middle-exit" = "per hop"
//! ```

use std::collections::BTreeMap;

use onionlab_report::{Compare, Design, Parameter};
use serde::Deserialize;

/// One matrix parameter: its name and values.
pub type MatrixEntry = (String, Vec<String>);

/// The matrix: parameter names and their values, in name order.
pub type Matrix = [MatrixEntry];

/// The `[report]` table of a scenario.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportSettings {
    /// The matrix parameter whose values are compared (findings tables,
    /// figure colours).
    #[serde(default)]
    pub compare: Option<String>,
    /// The value of `compare` the others are compared with.
    #[serde(default)]
    pub baseline: Option<String>,
    /// Short names of matrix parameters in variant labels (an empty name
    /// shows the value alone).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// Every combination of matrix values, in a fixed order (the last
/// parameter varies fastest).
pub fn combinations(matrix: &Matrix) -> Vec<Vec<(String, String)>> {
    let mut combos: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for (key, values) in matrix {
        combos = combos
            .into_iter()
            .flat_map(|c| {
                values.iter().map(move |v| {
                    let mut c = c.clone();
                    c.push((key.clone(), v.clone()));
                    c
                })
            })
            .collect();
    }
    combos
}

/// The full label of a combination (`name=value` pairs joined by spaces;
/// `default` without a matrix): what records and journals name variants by.
pub fn full_label(params: &[(String, String)]) -> String {
    if params.is_empty() {
        "default".into()
    } else {
        params
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The part of a parameter name before `:` (`loss` of `loss:a-b`).
fn base_name(name: &str) -> &str {
    name.split(':').next().unwrap_or(name)
}

/// The default short name of `name` among the matrix's `names`: the value
/// alone for `transport` and `scheduler`; `cc` for QUIC's `congestion`,
/// `tcp` for `tcp_congestion`, `circuit cc` for `circuit_cc`; otherwise the
/// name before `:` (`loss` for `loss:guard-middle`), unless another
/// parameter has the same one, when the pairs or host are kept
/// (`loss guard-middle`).
pub fn default_short(name: &str, names: &[&str]) -> String {
    let base = base_name(name);
    let short = crate::matrix::short_name(base);
    let shared = names.iter().filter(|n| base_name(n) == base).count() > 1;
    match name.split_once(':') {
        Some((_, rest)) if shared => {
            if short.is_empty() {
                rest.to_string()
            } else {
                format!("{short} {rest}")
            }
        }
        _ => short.to_string(),
    }
}

impl ReportSettings {
    /// Checks the settings against the matrix: names must be matrix
    /// parameters, the baseline one of the compared parameter's values.
    pub fn check(&self, matrix: &Matrix) -> Result<(), String> {
        let values_of = |name: &str| matrix.iter().find(|(k, _)| k == name).map(|(_, v)| v);
        if let Some(c) = &self.compare {
            let Some(values) = values_of(c) else {
                return Err(format!("report.compare: {c:?} is not a matrix parameter"));
            };
            if let Some(b) = &self.baseline {
                if !values.contains(b) {
                    return Err(format!(
                        "report.baseline: {b:?} is not one of {c:?}'s values ({})",
                        values.join(", ")
                    ));
                }
            }
        } else if let Some(b) = &self.baseline {
            return Err(format!(
                "report.baseline {b:?} without report.compare (the parameter it is a value of)"
            ));
        }
        if let Some(name) = self.labels.keys().find(|k| values_of(k.as_str()).is_none()) {
            return Err(format!("report.labels: {name:?} is not a matrix parameter"));
        }
        Ok(())
    }

    /// The compared parameter and baseline: as set, or `transport` against
    /// `tls` (or its first value) when the matrix has two transports or
    /// more; none otherwise.
    pub fn compare(&self, matrix: &Matrix) -> Option<Compare> {
        let (parameter, values) = match &self.compare {
            Some(c) => matrix.iter().find(|(k, _)| k == c)?,
            None => matrix
                .iter()
                .find(|(k, v)| k == "transport" && v.len() > 1)?,
        };
        let baseline = match &self.baseline {
            Some(b) => b.clone(),
            None if values.iter().any(|v| v == "tls") => "tls".to_string(),
            None => values.first()?.clone(),
        };
        Some(Compare {
            parameter: parameter.clone(),
            baseline,
        })
    }

    /// The report design of the variants `combos` (each a combination of
    /// `matrix`, as from [`combinations`]).
    pub fn design(&self, matrix: &Matrix, combos: &[Vec<(String, String)>]) -> Design {
        if matrix.is_empty() {
            return Design::default();
        }
        let names: Vec<&str> = matrix.iter().map(|(k, _)| k.as_str()).collect();
        let parameters = matrix
            .iter()
            .map(|(name, _)| Parameter {
                name: name.clone(),
                short: self
                    .labels
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| default_short(name, &names)),
            })
            .collect();
        let assignments = combos
            .iter()
            .map(|c| {
                matrix
                    .iter()
                    .map(|(name, _)| {
                        c.iter()
                            .find(|(k, _)| k == name)
                            .map(|(_, v)| v.clone())
                            .unwrap_or_default()
                    })
                    .collect()
            })
            .collect();
        Design {
            parameters,
            assignments,
            compare: self.compare(matrix),
        }
    }
}

/// What a run directory's scenario text needs for its report: the matrix
/// and the `[report]` table (other fields are not read, so a run made by
/// an older onionlab still gets its design).
#[derive(Deserialize)]
struct MatrixAndReport {
    #[serde(default)]
    matrix: BTreeMap<String, Vec<toml::Value>>,
    #[serde(default)]
    report: ReportSettings,
}

/// A matrix value as text (a string as it is, other values in TOML).
pub fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The matrix and `[report]` table of scenario text.
fn matrix_of_text(scenario_text: &str) -> Option<(Vec<MatrixEntry>, ReportSettings)> {
    let raw = toml::from_str::<MatrixAndReport>(scenario_text).ok()?;
    let matrix = raw
        .matrix
        .into_iter()
        .map(|(k, v)| (k, v.iter().map(value_text).collect()))
        .collect();
    Some((matrix, raw.report))
}

/// The full labels of every variant scenario text expands to, in its
/// order; `None` if its matrix cannot be read.
pub fn variants_of_text(scenario_text: &str) -> Option<Vec<String>> {
    let (matrix, _) = matrix_of_text(scenario_text)?;
    Some(
        combinations(&matrix)
            .iter()
            .map(|c| full_label(c))
            .collect(),
    )
}

/// A workload of scenario text as a table needs it: its name, kind
/// (`web`, `bulk`, `stream`, ...) and client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadClient {
    /// The workload's name (the records' `workload`).
    pub name: String,
    /// Its kind as the scenario writes it.
    pub kind: String,
    /// The client that runs it.
    pub client: String,
}

/// The `[[workload]]` entries of scenario text (empty if unreadable).
pub fn workloads_of_text(scenario_text: &str) -> Vec<WorkloadClient> {
    let Ok(table) = toml::from_str::<toml::Table>(scenario_text) else {
        return Vec::new();
    };
    let text = |w: &toml::Table, key: &str| w.get(key).and_then(|v| v.as_str()).map(str::to_string);
    table
        .get("workload")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .filter_map(|w| {
            let w = w.as_table()?;
            Some(WorkloadClient {
                name: text(w, "name")?,
                kind: text(w, "kind")?,
                client: text(w, "client")?,
            })
        })
        .collect()
}

/// The `name` of scenario text.
pub fn name_of_text(scenario_text: &str) -> Option<String> {
    let table = toml::from_str::<toml::Table>(scenario_text).ok()?;
    table.get("name")?.as_str().map(str::to_string)
}

/// The `repetitions` of scenario text (the scenario's planned
/// repetitions): its default, 10, when absent or unreadable.
pub fn repetitions_of_text(scenario_text: &str) -> u32 {
    toml::from_str::<toml::Table>(scenario_text)
        .ok()
        .and_then(|t| t.get("repetitions")?.as_integer())
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(10)
}

/// Sorts the full labels of a run's variants into the order its scenario
/// expands them in (labels it does not make go last, in their order).
pub fn sort_as_scenario(scenario_text: &str, labels: &mut [String]) {
    let Some((matrix, _)) = matrix_of_text(scenario_text) else {
        return;
    };
    let order: Vec<String> = combinations(&matrix)
        .iter()
        .map(|c| full_label(c))
        .collect();
    labels.sort_by_key(|l| order.iter().position(|o| o == l).unwrap_or(usize::MAX));
}

/// The design of a finished run from its scenario text and the full labels
/// of the variants it ran (in report order); the default design (labels
/// shown as they are, compared with the first) when the text cannot be
/// read or a label is not one of its combinations.
pub fn design_of_run(scenario_text: &str, labels: &[String]) -> Design {
    let Some((matrix, report)) = matrix_of_text(scenario_text) else {
        return Design::default();
    };
    let all = combinations(&matrix);
    let mut combos = Vec::new();
    for l in labels {
        match all.iter().find(|c| full_label(c) == *l) {
            Some(c) => combos.push(c.clone()),
            None => return Design::default(),
        }
    }
    report.design(&matrix, &combos)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix() -> Vec<(String, Vec<String>)> {
        vec![
            (
                "latency:client-guard,guard-middle,middle-exit".into(),
                vec!["20ms".into(), "40ms".into()],
            ),
            ("loss:guard-middle".into(), vec!["0%".into(), "1%".into()]),
            ("transport".into(), vec!["tls".into(), "quic".into()]),
        ]
    }

    #[test]
    fn default_short_names() {
        let names = ["loss:a-b", "loss:b-c", "latency:a-b", "transport"];
        assert_eq!(default_short("loss:a-b", &names), "loss a-b");
        assert_eq!(default_short("latency:a-b", &names), "latency");
        assert_eq!(default_short("transport", &names), "");
        assert_eq!(
            default_short("tcp_congestion:exit", &["tcp_congestion:exit"]),
            "tcp"
        );
        assert_eq!(default_short("circuit_cc", &["circuit_cc"]), "circuit cc");
    }

    #[test]
    fn combinations_and_labels_match_the_scenario_order() {
        let c = combinations(&matrix());
        assert_eq!(c.len(), 8);
        assert_eq!(
            full_label(&c[1]),
            "latency:client-guard,guard-middle,middle-exit=20ms loss:guard-middle=0% transport=quic"
        );
        assert_eq!(full_label(&[]), "default");
    }

    #[test]
    fn settings_are_checked_against_the_matrix() {
        let m = matrix();
        let s = |compare: Option<&str>, baseline: Option<&str>| ReportSettings {
            compare: compare.map(String::from),
            baseline: baseline.map(String::from),
            labels: BTreeMap::new(),
        };
        assert!(s(Some("transport"), Some("tls")).check(&m).is_ok());
        assert!(s(Some("loss:guard-middle"), None).check(&m).is_ok());
        let e = s(Some("transport"), Some("pctcp")).check(&m).unwrap_err();
        assert!(e.contains("not one of"), "{e}");
        assert!(s(Some("size"), None)
            .check(&m)
            .unwrap_err()
            .contains("not a matrix"));
        assert!(s(None, Some("tls"))
            .check(&m)
            .unwrap_err()
            .contains("without"));
        let mut l = s(None, None);
        l.labels.insert("latency".into(), "per hop".into());
        assert!(l.check(&m).unwrap_err().contains("\"latency\""));
    }

    #[test]
    fn default_compare_is_transport_against_tls() {
        let m = matrix();
        let c = ReportSettings::default().compare(&m).unwrap();
        assert_eq!(
            (c.parameter.as_str(), c.baseline.as_str()),
            ("transport", "tls")
        );
        let quic_only = vec![("transport".to_string(), vec!["quic".to_string()])];
        assert_eq!(ReportSettings::default().compare(&quic_only), None);
        let sched = vec![(
            "scheduler".to_string(),
            vec!["ewma".to_string(), "round-robin".to_string()],
        )];
        assert_eq!(ReportSettings::default().compare(&sched), None);
        let set = ReportSettings {
            compare: Some("scheduler".into()),
            ..ReportSettings::default()
        };
        assert_eq!(set.compare(&sched).unwrap().baseline, "ewma");
    }

    #[test]
    fn a_run_gets_its_design_and_short_labels_from_its_scenario() {
        let text = r#"
name = "x"
[matrix]
"latency:client-guard,guard-middle,middle-exit" = ["20ms", "40ms"]
"loss:guard-middle" = ["0%", "1%"]
transport = ["tls", "quic"]
[report.labels]
"latency:client-guard,guard-middle,middle-exit" = "per hop"
"#;
        let labels: Vec<String> = combinations(&matrix())
            .iter()
            .map(|c| full_label(c))
            .collect();
        let d = design_of_run(text, &labels);
        assert_eq!(d.parameters[0].short, "per hop");
        assert_eq!(d.compare.as_ref().unwrap().baseline, "tls");
        let short = onionlab_report::short_labels(&d, &labels);
        assert_eq!(short[0], "tls, per hop 20ms, loss 0%");
        assert_eq!(short[7], "quic, per hop 40ms, loss 1%");
        // A label the scenario does not make: no design, labels as they are.
        assert_eq!(
            design_of_run(text, &["transport=pctcp".to_string()]),
            Design::default()
        );
        assert_eq!(design_of_run("not toml [", &labels), Design::default());
        let mut shuffled = vec![labels[3].clone(), "other".to_string(), labels[0].clone()];
        sort_as_scenario(text, &mut shuffled);
        assert_eq!(
            shuffled,
            [labels[0].clone(), labels[3].clone(), "other".to_string()]
        );
    }
}

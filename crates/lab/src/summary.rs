//! From a run's records to a report: metrics per workload and variant,
//! counts of failures, warnings, and the run's facts.
//!
//! Metrics (one table and two figures each):
//! - per workload: TTFB and TTLB (ms from SOCKS established, as seed 000
//!   measures), goodput (MiB/s), of the transfers that completed;
//! - per repetition: circuit build time (ms, every circuit the clients
//!   built), relay CPU per payload MiB, relay peak memory, packets the
//!   emulated links dropped, wire overhead (IP bytes on the clients'
//!   access links per payload byte) and stall rate (fraction of the
//!   repetition's transfers that stalled).
//!
//! Findings tables (near the top of the report): per workload its time to
//! last byte (and first byte, for up to three workloads) and the wire
//! overhead, each variant against the baseline of the same condition (see
//! [`crate::labels`]: by default each transport against `tls`). Below
//! them, the stall rate of the variants that stalled.

use std::collections::BTreeMap;
use std::path::Path;

use onionlab_report::{Design, Metric, ReportFiles, ReportInput, RunComparison, VariantCounts};

use crate::agent::TransferRecord;
use crate::run::RepetitionRecord;

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file of the run could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line of a records file is not a record.
    #[error("{path}:{line}: {message}")]
    Record {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// Writing the report failed.
    #[error(transparent)]
    Report(#[from] onionlab_report::Error),
    /// Two runs cannot be compared.
    #[error("{0}")]
    Mismatch(String),
}

fn read(path: &Path) -> Result<String, ReportError> {
    std::fs::read_to_string(path).map_err(|source| ReportError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn read_jsonl<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>, ReportError> {
    let text = read(path)?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| ReportError::Record {
                path: path.display().to_string(),
                line: i + 1,
                message: e.to_string(),
            })
        })
        .collect()
}

/// Whether a failed transfer failed its end-to-end check.
pub fn is_checksum_failure(r: &TransferRecord) -> bool {
    r.error
        .as_deref()
        .is_some_and(|e| e.contains("corrupt") || e.contains("SHA-256"))
}

/// What a report is made of, besides the records.
pub struct RunFacts<'a> {
    /// The report's title.
    pub title: &'a str,
    /// The scenario file's text.
    pub scenario_toml: &'a str,
    /// Facts about the run, in display order.
    pub meta: Vec<(String, String)>,
    /// The variants' full labels, in report order.
    pub variants: &'a [String],
    /// How they are labelled and compared (one assignment per variant).
    pub design: Design,
}

/// The stream workloads' throughput summed per repetition (seed 002's
/// "network throughput"; a workload of several streams counts with their
/// mean, as they ran one after another); a repetition with a failed
/// stream is left out (the failures are counted with the transfers).
fn network_throughput(variants: &[String], records: &[TransferRecord]) -> Metric {
    use std::collections::BTreeMap;
    let values = variants
        .iter()
        .map(|v| {
            // (repetition, workload) -> throughputs, None once one failed.
            let mut streams: BTreeMap<(u32, &str), Option<Vec<f64>>> = BTreeMap::new();
            for r in records
                .iter()
                .filter(|r| &r.variant == v && r.kind == "stream")
            {
                let entry = streams
                    .entry((r.repetition, r.workload.as_str()))
                    .or_insert_with(|| Some(Vec::new()));
                match (
                    entry.as_mut(),
                    r.error.is_none().then_some(r.goodput_mib_s).flatten(),
                ) {
                    (Some(list), Some(g)) => list.push(g * 1024.0),
                    _ => *entry = None,
                }
            }
            let mut per_rep: BTreeMap<u32, Option<f64>> = BTreeMap::new();
            for ((rep, _), list) in streams {
                let sum = per_rep.entry(rep).or_insert(Some(0.0));
                *sum = match (*sum, list) {
                    (Some(total), Some(l)) if !l.is_empty() => {
                        Some(total + l.iter().sum::<f64>() / l.len() as f64)
                    }
                    _ => None,
                };
            }
            (v.clone(), per_rep.into_values().flatten().collect())
        })
        .collect();
    Metric {
        key: "network_throughput".into(),
        title: "network throughput (all streams of a repetition)".into(),
        unit: "KiB/s".into(),
        lower_is_better: false,
        headline: true,
        values,
    }
}

/// Build the report input from the records of a run.
pub fn report_input(
    facts: RunFacts,
    records: &[TransferRecord],
    reps: &[RepetitionRecord],
) -> ReportInput {
    let variants = facts.variants;
    let mut workloads: Vec<String> = Vec::new();
    for r in records {
        if !workloads.contains(&r.workload) {
            workloads.push(r.workload.clone());
        }
    }
    let ok = |r: &&TransferRecord| r.error.is_none();
    let per_variant =
        |f: &dyn Fn(&TransferRecord) -> Option<f64>, workload: &str| -> Vec<(String, Vec<f64>)> {
            variants
                .iter()
                .map(|v| {
                    let vals = records
                        .iter()
                        .filter(|r| &r.variant == v && r.workload == workload)
                        .filter(ok)
                        .filter_map(f)
                        .filter(|x| x.is_finite())
                        .collect();
                    (v.clone(), vals)
                })
                .collect()
        };
    let mut metrics = Vec::new();
    let many = workloads.len() > 1;
    let ttfb_headline = workloads.len() <= 3;
    for w in &workloads {
        let (kp, tp) = if many {
            (format!("{w}_"), format!("{w}: "))
        } else {
            (String::new(), String::new())
        };
        let kind = records
            .iter()
            .find(|r| &r.workload == w)
            .map_or("", |r| r.kind.as_str());
        let is_probe = kind == "probe" || kind == "trace" || kind == "stream";
        if kind == "stream" {
            metrics.push(Metric {
                key: format!("{kp}stream_throughput"),
                title: format!("{tp}stream throughput per circuit"),
                unit: "KiB/s".into(),
                lower_is_better: false,
                headline: true,
                values: per_variant(&|r| r.goodput_mib_s.map(|g| g * 1024.0), w),
            });
        }
        if is_probe {
            let values = variants
                .iter()
                .map(|v| {
                    let vals = records
                        .iter()
                        .filter(|r| &r.variant == v && &r.workload == w)
                        .filter(ok)
                        .flat_map(|r| r.probe_latency_ms.iter().copied())
                        .filter(|x| x.is_finite())
                        .collect();
                    (v.clone(), vals)
                })
                .collect();
            metrics.push(Metric {
                key: format!("{kp}{kind}_delay_ms"),
                title: format!("{tp}{kind} message one-way delay"),
                unit: "ms".into(),
                lower_is_better: true,
                headline: true,
                values,
            });
            continue;
        }
        metrics.push(Metric {
            key: format!("{kp}ttfb_ms"),
            title: format!("{tp}time to first byte"),
            unit: "ms".into(),
            lower_is_better: true,
            headline: ttfb_headline,
            values: per_variant(&|r| r.ttfb_ms, w),
        });
        metrics.push(Metric {
            key: format!("{kp}ttlb_ms"),
            title: format!("{tp}time to last byte"),
            unit: "ms".into(),
            lower_is_better: true,
            headline: true,
            values: per_variant(&|r| r.ttlb_ms, w),
        });
        metrics.push(Metric {
            key: format!("{kp}goodput"),
            title: format!("{tp}goodput"),
            unit: "MiB/s".into(),
            lower_is_better: false,
            headline: false,
            values: per_variant(&|r| r.goodput_mib_s, w),
        });
    }
    let per_rep = |f: &dyn Fn(&RepetitionRecord) -> Vec<f64>| -> Vec<(String, Vec<f64>)> {
        variants
            .iter()
            .map(|v| {
                let vals = reps
                    .iter()
                    .filter(|r| &r.variant == v)
                    .flat_map(f)
                    .filter(|x| x.is_finite())
                    .collect();
                (v.clone(), vals)
            })
            .collect()
    };
    if records.iter().any(|r| r.kind == "stream") {
        metrics.push(network_throughput(variants, records));
    }
    metrics.push(Metric {
        key: "circuit_build_ms".into(),
        title: "circuit build time".into(),
        unit: "ms".into(),
        lower_is_better: true,
        headline: false,
        values: per_rep(&|r| r.circuit_build_ms.clone()),
    });
    metrics.push(Metric {
        key: "relay_cpu".into(),
        title: "relay CPU per payload MiB (all relays)".into(),
        unit: "ms/MiB".into(),
        lower_is_better: true,
        headline: false,
        values: per_rep(&|r| {
            let cpu: f64 = r.relay_cpu_s.iter().map(|(_, s)| s).sum();
            if r.payload_bytes == 0 {
                Vec::new()
            } else {
                vec![cpu * 1e3 / (r.payload_bytes as f64 / 1048576.0)]
            }
        }),
    });
    metrics.push(Metric {
        key: "relay_peak_rss".into(),
        title: "relay peak memory (each relay)".into(),
        unit: "MiB".into(),
        lower_is_better: true,
        headline: false,
        values: per_rep(&|r| {
            r.relay_peak_rss
                .iter()
                .map(|(_, b)| *b as f64 / 1048576.0)
                .collect()
        }),
    });
    metrics.push(Metric {
        key: "link_drops".into(),
        title: "packets dropped by the emulated links (per repetition, all links)".into(),
        unit: "packets".into(),
        lower_is_better: true,
        headline: false,
        values: per_rep(&|r| vec![r.links.iter().map(|l| l.3 as f64).sum()]),
    });
    metrics.push(Metric {
        key: "wire_overhead".into(),
        title: "wire bytes per payload byte (client access links)".into(),
        unit: "ratio".into(),
        lower_is_better: true,
        headline: true,
        values: per_rep(&|r| r.wire_overhead.into_iter().collect()),
    });

    metrics.push(Metric {
        key: "stall_rate".into(),
        title: "stalled transfers (per repetition)".into(),
        unit: "%".into(),
        lower_is_better: true,
        headline: false,
        values: variants
            .iter()
            .map(|v| {
                let mut per_rep: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
                for r in records.iter().filter(|r| &r.variant == v) {
                    let e = per_rep.entry(r.repetition).or_default();
                    e.0 += u64::from(r.stalled);
                    e.1 += 1;
                }
                let vals = per_rep
                    .values()
                    .map(|&(s, n)| 100.0 * s as f64 / n as f64)
                    .collect();
                (v.clone(), vals)
            })
            .collect(),
    });

    let mut counts = Vec::new();
    let mut notes = Vec::new();
    for v in variants {
        let recs: Vec<&TransferRecord> = records.iter().filter(|r| &r.variant == v).collect();
        let vreps: Vec<&RepetitionRecord> = reps.iter().filter(|r| &r.variant == v).collect();
        let c = VariantCounts {
            variant: v.clone(),
            repetitions: vreps.len() as u64,
            transfers: recs.len() as u64,
            errors: recs
                .iter()
                .filter(|r| r.error.is_some() && !r.timed_out)
                .count() as u64,
            timeouts: recs.iter().filter(|r| r.timed_out).count() as u64,
            stalls: recs.iter().filter(|r| r.stalled).count() as u64,
            checksum_failures: recs.iter().filter(|r| is_checksum_failure(r)).count() as u64,
            cpu_saturated_repetitions: vreps.iter().filter(|r| r.cpu_saturated).count() as u64,
            host_dropped_repetitions: vreps.iter().filter(|r| r.host_dropped).count() as u64,
            conflux_fallback_repetitions: vreps
                .iter()
                .filter(|r| r.conflux_fallback_streams > 0)
                .count() as u64,
        };
        if c.checksum_failures > 0 {
            notes.push(format!(
                "FAILED RUN: {} transfer(s) of {v} delivered wrong bytes",
                c.checksum_failures
            ));
        }
        counts.push(c);
    }
    let short = onionlab_report::short_labels(&facts.design, variants);
    let findings = stall_rate_notes(&counts, &short);
    // CPU saturation is flagged per variant by the report from `counts`.
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for r in records.iter().filter(|r| r.error.is_some()) {
        *errors
            .entry(r.error.clone().unwrap_or_default())
            .or_default() += 1;
    }
    for (e, n) in errors.iter().take(5) {
        notes.push(format!("{n} transfer(s) failed: {e}"));
    }
    ReportInput {
        title: facts.title.to_string(),
        scenario_toml: facts.scenario_toml.to_string(),
        meta: facts.meta,
        variants: variants.to_vec(),
        metrics,
        counts,
        notes,
        findings,
        design: facts.design,
    }
}

/// One note: the stall rate (stalled transfers of all transfers) of every
/// variant that stalled, by its label in `short` (in `counts` order); or
/// that none stalled; none if no variant has transfers.
pub fn stall_rate_notes(counts: &[VariantCounts], short: &[String]) -> Vec<String> {
    let transfers: u64 = counts.iter().map(|c| c.transfers).sum();
    if transfers == 0 {
        return Vec::new();
    }
    let parts: Vec<String> = counts
        .iter()
        .zip(short)
        .filter(|(c, _)| c.stalls > 0)
        .map(|(c, label)| {
            format!(
                "{label}: {:.1}% ({}/{})",
                100.0 * c.stalls as f64 / c.transfers as f64,
                c.stalls,
                c.transfers
            )
        })
        .collect();
    if parts.is_empty() {
        return vec![format!("No transfer stalled ({transfers} transfers).")];
    }
    vec![format!(
        "Stall rate (transfers with a stall, of all transfers) of the variants that stalled: {}; the others had none.",
        parts.join("; ")
    )]
}

/// Facts about this machine and build, for the report.
pub fn machine_meta() -> Vec<(String, String)> {
    let mut meta = vec![(
        "onionlab".to_string(),
        env!("CARGO_PKG_VERSION").to_string(),
    )];
    if let Ok(k) = std::fs::read_to_string("/proc/sys/kernel/osrelease") {
        meta.push(("kernel".into(), k.trim().to_string()));
    }
    if let Ok(n) = std::thread::available_parallelism() {
        meta.push(("CPUs".into(), n.to_string()));
    }
    meta
}

/// The report input of the run in `dir`, from its records.
pub fn input_of_dir(dir: &Path) -> Result<ReportInput, ReportError> {
    let records: Vec<TransferRecord> = read_jsonl(&dir.join("records.jsonl"))?;
    let reps: Vec<RepetitionRecord> = read_jsonl(&dir.join("repetitions.jsonl"))?;
    let scenario = read(&dir.join("scenario.toml"))?;
    let title = scenario
        .lines()
        .find_map(|l| l.strip_prefix("name = "))
        .map_or("onionlab lab run".to_string(), |n| {
            n.trim_matches('"').to_string()
        });
    let mut variants: Vec<String> = Vec::new();
    for r in &reps {
        if !variants.contains(&r.variant) {
            variants.push(r.variant.clone());
        }
    }
    let mut meta = machine_meta();
    let mut seeds: Vec<u64> = reps.iter().map(|r| r.seed).collect();
    seeds.dedup();
    meta.push((
        "repetitions".into(),
        (reps.len() / variants.len().max(1)).to_string(),
    ));
    meta.push(("variants".into(), variants.len().to_string()));
    meta.push((
        "seeds".into(),
        seeds
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    ));
    let segments = crate::journal::segments(dir);
    if !segments.is_empty() {
        let mut commits: Vec<&str> = Vec::new();
        for s in &segments {
            if !commits.contains(&s.commit.as_str()) {
                commits.push(&s.commit);
            }
        }
        meta.push(("commit".into(), commits.join(", ")));
        if segments.len() > 1 {
            meta.push((
                "segments".into(),
                format!("{} (continued with --resume)", segments.len()),
            ));
        }
    }
    if let Some(jobs) = reps.iter().map(|r| r.jobs).max().filter(|&j| j > 1) {
        meta.push((
            "concurrent runs".into(),
            format!("up to {jobs} at once (lab run --jobs), each in a network of its own"),
        ));
    }
    meta.push((
        "raw records".into(),
        "records.jsonl, records.csv, repetitions.jsonl".into(),
    ));
    crate::labels::sort_as_scenario(&scenario, &mut variants);
    let design = crate::labels::design_of_run(&scenario, &variants);
    let facts = RunFacts {
        title: &title,
        scenario_toml: &scenario,
        meta,
        variants: &variants,
        design,
    };
    Ok(report_input(facts, &records, &reps))
}

/// (Re)write the report of the run in `dir` into `dir/report`.
pub fn report_dir(dir: &Path) -> Result<ReportFiles, ReportError> {
    let input = input_of_dir(dir)?;
    Ok(onionlab_report::write_report(&input, &dir.join("report"))?)
}

/// Compares run `b` with run `a` of the same scenario ([`onionlab_report::compare_runs`]);
/// the text starts with a warning when the scenario files differ.
pub fn compare_dirs(a: &Path, b: &Path) -> Result<RunComparison, ReportError> {
    let (ia, ib) = (input_of_dir(a)?, input_of_dir(b)?);
    if ia.title != ib.title {
        return Err(ReportError::Mismatch(format!(
            "{} is a run of {:?}, {} of {:?}: compare runs of one scenario",
            a.display(),
            ia.title,
            b.display(),
            ib.title
        )));
    }
    let names = (a.display().to_string(), b.display().to_string());
    let mut c = onionlab_report::compare_runs(&ia, &ib, (&names.0, &names.1))?;
    if ia.scenario_toml != ib.scenario_toml {
        let warning = "WARNING: the two runs' scenario files differ (see scenario.toml in each): a difference may come from the scenario, not the code.\n\n";
        c.text.insert_str(0, warning);
        c.markdown.insert_str(0, &format!("> {warning}"));
    }
    Ok(c)
}

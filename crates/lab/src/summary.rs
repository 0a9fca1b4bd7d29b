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

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use onionlab_report::{Design, Metric, ReportFiles, ReportInput, RunComparison, VariantCounts};

use crate::agent::TransferRecord;
use crate::error::Error;
use crate::run::RepetitionRecord;

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

/// A metric's values per variant, with the repetition of each value (see
/// [`Metric::repetitions`]: where a repetition has several, the report
/// compares by repetition).
#[derive(Default)]
struct Series {
    values: Vec<(String, Vec<f64>)>,
    repetitions: Vec<(String, Vec<u32>)>,
}

impl Series {
    /// Per variant in `variants` order, the finite values `f` gives for each
    /// of `items` (variant label, repetition, item) of that variant.
    fn collect<'a, T: 'a>(
        variants: &[String],
        items: impl Iterator<Item = (&'a str, u32, &'a T)> + Clone,
        f: impl Fn(&T) -> Vec<f64>,
    ) -> Series {
        let mut series = Series::default();
        for v in variants {
            let (mut values, mut reps) = (Vec::new(), Vec::new());
            for (_, rep, item) in items.clone().filter(|(label, _, _)| *label == v) {
                for x in f(item).into_iter().filter(|x| x.is_finite()) {
                    values.push(x);
                    reps.push(rep);
                }
            }
            series.values.push((v.clone(), values));
            series.repetitions.push((v.clone(), reps));
        }
        series
    }

    /// The metric of these values.
    fn metric(
        self,
        key: String,
        title: String,
        unit: &str,
        lower_is_better: bool,
        headline: bool,
    ) -> Metric {
        Metric {
            key,
            title,
            unit: unit.into(),
            lower_is_better,
            headline,
            values: self.values,
            repetitions: self.repetitions,
        }
    }
}

/// The stream workloads' throughput summed per repetition (seed 002's
/// "network throughput"; a workload of several streams counts with their
/// mean, as they ran one after another); a repetition with a failed
/// stream is left out (the failures are counted with the transfers).
fn network_throughput(variants: &[String], records: &[TransferRecord]) -> Metric {
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
            per_rep
                .into_iter()
                .filter_map(|(rep, sum)| Some((rep, sum?)))
                .collect::<Vec<(u32, f64)>>()
        })
        .collect::<Vec<_>>();
    let series = Series {
        values: variants
            .iter()
            .zip(&values)
            .map(|(v, sums)| (v.clone(), sums.iter().map(|(_, x)| *x).collect()))
            .collect(),
        repetitions: variants
            .iter()
            .zip(&values)
            .map(|(v, sums)| (v.clone(), sums.iter().map(|(rep, _)| *rep).collect()))
            .collect(),
    };
    series.metric(
        "network_throughput".into(),
        "network throughput (all streams of a repetition)".into(),
        "KiB/s",
        false,
        true,
    )
}

/// Above this many workloads, the report's metrics are per family of
/// workloads (`web1` ... `web360` are `web*`), not per workload: a
/// Shadow network's hundreds of clients would otherwise make a thousand
/// metrics of one client each. Every namespace preset has fewer (20 at
/// most), and keeps a metric per workload.
const MAX_WORKLOAD_METRICS: usize = 24;

/// A workload's family: its name without trailing digits (`web12` is in
/// `web`); `None` for a name without them (or only digits).
fn workload_family(name: &str) -> Option<&str> {
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    (!stem.is_empty() && stem.len() < name.len()).then_some(stem)
}

/// A group of workloads the report has metrics for.
struct WorkloadGroup<'a> {
    /// Whether it is a family (never merged with a workload of that name).
    family: bool,
    /// Its workloads' kind (a family of two kinds is two groups).
    kind: &'a str,
    /// Prefix of its metrics' keys (file names too).
    key: String,
    /// Prefix of its metrics' titles.
    title: String,
    /// Its workloads.
    members: HashSet<&'a str>,
}

/// The groups of workloads the report has metrics for, in order of first
/// appearance: each workload alone, or (above [`MAX_WORKLOAD_METRICS`]
/// workloads) each family, as `web*` (keys `web_all`; a name without
/// trailing digits stays alone).
fn workload_groups(records: &[TransferRecord]) -> Vec<WorkloadGroup<'_>> {
    let mut workloads: Vec<(&str, &str)> = Vec::new();
    for r in records {
        if !workloads.iter().any(|(w, _)| *w == r.workload) {
            workloads.push((&r.workload, &r.kind));
        }
    }
    let by_family = workloads.len() > MAX_WORKLOAD_METRICS;
    let kinds_of = |f: &str| {
        let mut kinds: Vec<&str> = workloads
            .iter()
            .filter(|(w, _)| workload_family(w) == Some(f))
            .map(|(_, k)| *k)
            .collect();
        kinds.dedup();
        kinds.len()
    };
    let mut groups: Vec<WorkloadGroup<'_>> = Vec::new();
    for &(w, kind) in &workloads {
        let (family, key, title) = match workload_family(w).filter(|_| by_family) {
            Some(f) if kinds_of(f) > 1 => (true, format!("{f}_{kind}_all"), format!("{f}* {kind}")),
            Some(f) => (true, format!("{f}_all"), format!("{f}*")),
            None => (false, w.to_string(), w.to_string()),
        };
        match groups
            .iter_mut()
            .find(|g| g.family == family && g.key == key)
        {
            Some(g) => {
                g.members.insert(w);
            }
            None => groups.push(WorkloadGroup {
                family,
                kind,
                key,
                title,
                members: HashSet::from([w]),
            }),
        }
    }
    for g in groups.iter_mut().filter(|g| g.members.len() > 1) {
        g.title = format!("{} ({} workloads)", g.title, g.members.len());
    }
    groups
}

/// Per workload (or family of workloads, see [`workload_groups`]): TTFB,
/// TTLB and goodput (or, for streams and probes, throughput and message
/// delay), of the transfers that completed.
fn transfer_metrics(variants: &[String], records: &[TransferRecord]) -> Vec<Metric> {
    let groups = workload_groups(records);
    let of_workload = |members: &HashSet<&str>, f: &dyn Fn(&TransferRecord) -> Vec<f64>| {
        let completed = records
            .iter()
            .filter(|r| r.error.is_none() && members.contains(r.workload.as_str()))
            .map(|r| (r.variant.as_str(), r.repetition, r));
        Series::collect(variants, completed, f)
    };
    let mut metrics = Vec::new();
    let many = groups.len() > 1;
    let ttfb_headline = groups.len() <= 3;
    for g in &groups {
        let members = &g.members;
        let (kp, tp) = if many {
            (format!("{}_", g.key), format!("{}: ", g.title))
        } else {
            (String::new(), String::new())
        };
        let kind = g.kind;
        if kind == "stream" {
            let kib_s =
                |r: &TransferRecord| r.goodput_mib_s.map(|g| g * 1024.0).into_iter().collect();
            metrics.push(of_workload(members, &kib_s).metric(
                format!("{kp}stream_throughput"),
                format!("{tp}stream throughput per circuit"),
                "KiB/s",
                false,
                true,
            ));
        }
        if kind == "probe" || kind == "trace" || kind == "stream" {
            metrics.push(
                of_workload(members, &|r| r.probe_latency_ms.clone()).metric(
                    format!("{kp}{kind}_delay_ms"),
                    format!("{tp}{kind} message one-way delay"),
                    "ms",
                    true,
                    true,
                ),
            );
            continue;
        }
        metrics.push(
            of_workload(members, &|r| r.ttfb_ms.into_iter().collect()).metric(
                format!("{kp}ttfb_ms"),
                format!("{tp}time to first byte"),
                "ms",
                true,
                ttfb_headline,
            ),
        );
        metrics.push(
            of_workload(members, &|r| r.ttlb_ms.into_iter().collect()).metric(
                format!("{kp}ttlb_ms"),
                format!("{tp}time to last byte"),
                "ms",
                true,
                true,
            ),
        );
        metrics.push(
            of_workload(members, &|r| r.goodput_mib_s.into_iter().collect()).metric(
                format!("{kp}goodput"),
                format!("{tp}goodput"),
                "MiB/s",
                false,
                false,
            ),
        );
    }
    if records.iter().any(|r| r.kind == "stream") {
        metrics.push(network_throughput(variants, records));
    }
    metrics
}

/// Per repetition: circuit build times, relay CPU and memory, emulated
/// drops, wire overhead and the stall rate.
fn repetition_metrics(
    variants: &[String],
    records: &[TransferRecord],
    reps: &[RepetitionRecord],
) -> Vec<Metric> {
    let per_rep = |f: &dyn Fn(&RepetitionRecord) -> Vec<f64>| {
        let items = reps.iter().map(|r| (r.variant.as_str(), r.repetition, r));
        Series::collect(variants, items, f)
    };
    let relay_cpu = |r: &RepetitionRecord| {
        let cpu: f64 = r.relay_cpu_s.iter().map(|(_, s)| s).sum();
        if r.payload_bytes == 0 {
            Vec::new()
        } else {
            vec![cpu * 1e3 / (r.payload_bytes as f64 / 1048576.0)]
        }
    };
    let peak_rss = |r: &RepetitionRecord| {
        r.relay_peak_rss
            .iter()
            .map(|(_, b)| *b as f64 / 1048576.0)
            .collect()
    };
    // (variant, repetition) -> (stalled, transfers)
    let mut stalls: BTreeMap<(&str, u32), (u64, u64)> = BTreeMap::new();
    for r in records {
        let e = stalls.entry((&r.variant, r.repetition)).or_default();
        e.0 += u64::from(r.stalled);
        e.1 += 1;
    }
    let stall_items = stalls.iter().map(|((v, rep), counts)| (*v, *rep, counts));
    vec![
        per_rep(&|r| r.circuit_build_ms.clone()).metric(
            "circuit_build_ms".into(),
            "circuit build time".into(),
            "ms",
            true,
            false,
        ),
        per_rep(&relay_cpu).metric(
            "relay_cpu".into(),
            "relay CPU per payload MiB (all relays)".into(),
            "ms/MiB",
            true,
            false,
        ),
        per_rep(&peak_rss).metric(
            "relay_peak_rss".into(),
            "relay peak memory (each relay)".into(),
            "MiB",
            true,
            false,
        ),
        per_rep(&|r| vec![r.links.iter().map(|l| l.3 as f64).sum()]).metric(
            "link_drops".into(),
            "packets dropped by the emulated links (per repetition, all links)".into(),
            "packets",
            true,
            false,
        ),
        per_rep(&|r| r.wire_overhead.into_iter().collect()).metric(
            "wire_overhead".into(),
            "wire bytes per payload byte (client access links)".into(),
            "ratio",
            true,
            true,
        ),
        Series::collect(variants, stall_items, |&(s, n): &(u64, u64)| {
            vec![100.0 * s as f64 / n as f64]
        })
        .metric(
            "stall_rate".into(),
            "stalled transfers (per repetition)".into(),
            "%",
            true,
            false,
        ),
    ]
}

/// Build the report input from the records of a run.
pub fn report_input(
    facts: RunFacts,
    records: &[TransferRecord],
    reps: &[RepetitionRecord],
) -> ReportInput {
    let variants = facts.variants;
    let mut metrics = transfer_metrics(variants, records);
    metrics.extend(repetition_metrics(variants, records, reps));

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

/// The report input of the run at `dir` (a run directory or a stored
/// run), from its records.
pub fn input_of_dir(dir: &Path) -> Result<ReportInput, Error> {
    Ok(input_of_run(&crate::rundata::RunData::load(dir)?))
}

/// The report input of a run's data.
pub fn input_of_run(data: &crate::rundata::RunData) -> ReportInput {
    let (records, reps, scenario) = (&data.records, &data.repetitions, &data.scenario_toml);
    let title = data.scenario_name();
    let variants = data.variants();
    let mut meta = machine_meta();
    let mut seeds: Vec<u64> = reps.iter().map(|r| r.seed).collect();
    seeds.dedup();
    meta.push((
        "repetitions".into(),
        format!(
            "{} (planned {})",
            data.repetitions_done(),
            data.planned_repetitions()
        ),
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
    let engines = data.engines();
    if engines.iter().any(|e| e.name != crate::engine::NAMESPACES) {
        let names: Vec<String> = engines.iter().map(|e| e.describe()).collect();
        meta.push((
            "engine".into(),
            format!(
                "{}: simulated time and Shadow's TCP (Reno); Shadow's seed is the low 32 bits of \
                 each repetition's; no link, host or relay CPU counters",
                names.join(", ")
            ),
        ));
    }
    if !data.segments.is_empty() {
        meta.push(("commit".into(), data.commits().join(", ")));
        if data.segments.len() > 1 {
            meta.push((
                "segments".into(),
                format!("{} (continued with --resume)", data.segments.len()),
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
        if data.manifest.is_some() {
            format!("stored run {} (lab store)", data.source.display())
        } else {
            "records.jsonl, records.csv, repetitions.jsonl".into()
        },
    ));
    let design = crate::labels::design_of_run(scenario, &variants);
    let facts = RunFacts {
        title: &title,
        scenario_toml: scenario,
        meta,
        variants: &variants,
        design,
    };
    report_input(facts, records, reps)
}

/// (Re)write the report of the run at `dir` into `out` (default: the run
/// directory's `report/`; a stored run needs `out`, as the repository's
/// copy is not written to).
pub fn report_dir(dir: &Path, out: Option<&Path>) -> Result<ReportFiles, Error> {
    let data = crate::rundata::RunData::load(dir)?;
    let out = match (out, data.manifest.is_some()) {
        (Some(o), _) => o.to_path_buf(),
        (None, false) => dir.join("report"),
        (None, true) => {
            return Err(Error::Stored {
                path: dir.display().to_string(),
                message: "a stored run's report is written elsewhere: give --out DIR".into(),
            })
        }
    };
    Ok(onionlab_report::write_report(&input_of_run(&data), &out)?)
}

/// Compares run `b` with run `a` of the same scenario ([`onionlab_report::compare_runs`]);
/// the text starts with a warning when the scenario files differ.
pub fn compare_dirs(a: &Path, b: &Path) -> Result<RunComparison, Error> {
    let (ia, ib) = (input_of_dir(a)?, input_of_dir(b)?);
    if ia.title != ib.title {
        return Err(Error::Mismatch(format!(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn records(names: &[String]) -> Vec<TransferRecord> {
        names
            .iter()
            .map(|w| TransferRecord {
                workload: w.clone(),
                variant: "v".into(),
                ttfb_ms: Some(1.0),
                ttlb_ms: Some(2.0),
                ..TransferRecord::default()
            })
            .collect()
    }

    /// A few workloads have metrics each; hundreds (a Shadow network's
    /// clients) have them per family, named and titled as such.
    #[test]
    fn many_workloads_are_reported_by_family() {
        let few: Vec<String> = ["light", "bulk1", "bulk2"].map(String::from).to_vec();
        let recs = records(&few);
        let groups = workload_groups(&recs);
        let keys: Vec<&str> = groups.iter().map(|g| g.key.as_str()).collect();
        assert_eq!(keys, ["light", "bulk1", "bulk2"]);

        let mut many: Vec<String> = (1..=36).map(|i| format!("web{i}")).collect();
        many.extend((1..=4).map(|i| format!("bulk{i}")));
        many.push("probe".into());
        let recs = records(&many);
        let groups = workload_groups(&recs);
        let keys: Vec<&str> = groups.iter().map(|g| g.key.as_str()).collect();
        assert_eq!(keys, ["web_all", "bulk_all", "probe"]);
        assert_eq!(groups[0].title, "web* (36 workloads)");
        assert_eq!(groups[2].title, "probe", "a name without digits is its own");
        let metrics = transfer_metrics(&["v".to_string()], &recs);
        let ttlb: Vec<&str> = metrics
            .iter()
            .filter(|m| m.key.ends_with("ttlb_ms"))
            .map(|m| m.key.as_str())
            .collect();
        assert_eq!(
            ttlb,
            ["web_all_ttlb_ms", "bulk_all_ttlb_ms", "probe_ttlb_ms"]
        );
    }
}

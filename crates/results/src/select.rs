//! From a run's records to the values a table compares: which records
//! count, and each metric's values with the repetition of each.

use std::collections::BTreeSet;

use onionlab_lab::agent::TransferRecord;
use onionlab_lab::run::RepetitionRecord;
use onionlab_lab::rundata::RunData;

/// A metric a table can show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricKind {
    /// Time to first byte (ms from SOCKS success), per transfer.
    Ttfb,
    /// Time to last byte (ms from SOCKS success), per transfer.
    Ttlb,
    /// SOCKS request to SOCKS success (ms, includes building the circuit),
    /// per transfer.
    Connect,
    /// Payload MiB/s over the time to last byte, per transfer.
    Goodput,
    /// Time to last byte per KiB of payload (ms/KiB; seed 003's "time per
    /// KB"), per transfer.
    TimePerKib,
    /// One-way delay of each probe or trace message, or of a stream's
    /// record sampled every 100 ms (ms).
    ProbeDelay,
    /// All relays' CPU per payload MiB (ms/MiB), per repetition.
    RelayCpu,
    /// Circuit build times the clients saw (ms), per repetition.
    CircuitBuild,
    /// IP bytes on the clients' access links per payload byte, per
    /// repetition.
    WireOverhead,
    /// CPU seconds of the relays (`--relay` chooses which), summed per
    /// repetition.
    RelayCpuS,
    /// Peak memory of each relay (`--relay` chooses which), MiB.
    RelayRss,
    /// Packets the emulated links' loss models dropped, all links, per
    /// repetition.
    LostPackets,
    /// Each relay's CPU (`--relay` chooses which) as a percentage of one
    /// core over its repetition, one value per relay and repetition (seed
    /// 004's "CPU %"; a repetition ends when its transfers do, so a faster
    /// variant's is shorter: compare `relay-cpu-s` for the work done).
    RelayCore,
    /// Circuits Torchestra's relays (`--relay` chooses which) moved between
    /// light and heavy connections, summed per repetition (0 for other
    /// transports).
    TorchestraMoves,
    /// TCP retransmission timeouts on the relays' hosts (`--relay`
    /// chooses which), summed per repetition.
    TcpTimeouts,
    /// TCP segments the relays' hosts (`--relay` chooses which)
    /// retransmitted, summed per repetition.
    TcpRetransmits,
    /// Packets the emulated links' loss models dropped over all packets
    /// sent into all links, per repetition (%; seed 002's "effective drop
    /// rate").
    LossRate,
    /// Packets the emulated links' queues dropped (full) over all packets
    /// sent into all links, per repetition (%).
    QueueDropRate,
    /// Wall seconds a Shadow simulation took, per repetition (what the
    /// machine paid for the simulated time; none on the namespace engine).
    SimWall,
    /// Peak memory of a Shadow simulation (the machine's memory in use
    /// above the start), MiB, per repetition.
    SimMemory,
}

impl MetricKind {
    /// The column title.
    pub fn title(self) -> &'static str {
        match self {
            MetricKind::Ttfb => "TTFB",
            MetricKind::Ttlb => "TTLB",
            MetricKind::Connect => "connect",
            MetricKind::Goodput => "goodput",
            MetricKind::TimePerKib => "time per KiB",
            MetricKind::ProbeDelay => "delay",
            MetricKind::RelayCpu => "relay CPU",
            MetricKind::CircuitBuild => "circuit build",
            MetricKind::WireOverhead => "wire bytes",
            MetricKind::RelayCpuS => "relay CPU",
            MetricKind::RelayRss => "relay peak RSS",
            MetricKind::LostPackets => "lost packets",
            MetricKind::RelayCore => "relay CPU",
            MetricKind::TorchestraMoves => "Torchestra moves",
            MetricKind::TcpTimeouts => "TCP timeouts",
            MetricKind::TcpRetransmits => "TCP retransmits",
            MetricKind::LossRate => "lost packets",
            MetricKind::QueueDropRate => "queue drops",
            MetricKind::SimWall => "simulation wall time",
            MetricKind::SimMemory => "simulation memory",
        }
    }

    /// The unit.
    pub fn unit(self) -> &'static str {
        match self {
            MetricKind::Goodput => "MiB/s",
            MetricKind::TimePerKib => "ms/KiB",
            MetricKind::RelayCpu => "ms/MiB",
            MetricKind::WireOverhead => "per payload byte",
            MetricKind::RelayCpuS => "s",
            MetricKind::RelayRss => "MiB",
            MetricKind::LostPackets => "packets",
            MetricKind::RelayCore => "% of a core",
            MetricKind::TorchestraMoves => "circuits a repetition",
            MetricKind::TcpTimeouts => "a repetition",
            MetricKind::TcpRetransmits => "segments a repetition",
            MetricKind::LossRate | MetricKind::QueueDropRate => "% of packets",
            MetricKind::SimWall => "s",
            MetricKind::SimMemory => "MiB",
            _ => "ms",
        }
    }

    /// Whether it is measured per repetition (not per transfer of a
    /// workload).
    pub fn per_repetition(self) -> bool {
        matches!(
            self,
            MetricKind::RelayCpu
                | MetricKind::CircuitBuild
                | MetricKind::WireOverhead
                | MetricKind::RelayCpuS
                | MetricKind::RelayRss
                | MetricKind::LostPackets
                | MetricKind::RelayCore
                | MetricKind::TorchestraMoves
                | MetricKind::TcpTimeouts
                | MetricKind::TcpRetransmits
                | MetricKind::LossRate
                | MetricKind::QueueDropRate
                | MetricKind::SimWall
                | MetricKind::SimMemory
        )
    }

    /// The name the command line uses.
    pub fn name(self) -> &'static str {
        match self {
            MetricKind::Ttfb => "ttfb",
            MetricKind::Ttlb => "ttlb",
            MetricKind::Connect => "connect",
            MetricKind::Goodput => "goodput",
            MetricKind::TimePerKib => "time-per-kib",
            MetricKind::ProbeDelay => "probe-delay",
            MetricKind::RelayCpu => "relay-cpu",
            MetricKind::CircuitBuild => "circuit-build",
            MetricKind::WireOverhead => "wire-overhead",
            MetricKind::RelayCpuS => "relay-cpu-s",
            MetricKind::RelayRss => "relay-rss",
            MetricKind::LostPackets => "lost-packets",
            MetricKind::RelayCore => "relay-core",
            MetricKind::TorchestraMoves => "torchestra-moves",
            MetricKind::TcpTimeouts => "tcp-timeouts",
            MetricKind::TcpRetransmits => "tcp-retransmits",
            MetricKind::LossRate => "loss-rate",
            MetricKind::QueueDropRate => "queue-drop-rate",
            MetricKind::SimWall => "sim-wall",
            MetricKind::SimMemory => "sim-memory",
        }
    }

    fn of_transfer(self, r: &TransferRecord) -> Vec<f64> {
        match self {
            MetricKind::Ttfb => r.ttfb_ms.into_iter().collect(),
            MetricKind::Ttlb => r.ttlb_ms.into_iter().collect(),
            MetricKind::Connect => r.connect_ms.into_iter().collect(),
            MetricKind::Goodput => r.goodput_mib_s.into_iter().collect(),
            MetricKind::TimePerKib if r.size > 0 => r
                .ttlb_ms
                .map(|t| t / (r.size as f64 / 1024.0))
                .into_iter()
                .collect(),
            MetricKind::ProbeDelay => r.probe_latency_ms.clone(),
            _ => Vec::new(),
        }
    }

    /// The metric's values in a repetition record; `relay` chooses the
    /// relays of the relay metrics (by name pattern, all without one).
    fn of_repetition(self, r: &RepetitionRecord, relay: Option<&str>) -> Vec<f64> {
        let chosen = |name: &str| relay.is_none_or(|p| matches_pattern(p, name));
        let cpu_s: f64 = r
            .relay_cpu_s
            .iter()
            .filter(|(name, _)| chosen(name))
            .map(|(_, s)| s)
            .sum();
        match self {
            MetricKind::RelayCpu if r.payload_bytes > 0 => {
                vec![cpu_s * 1e3 / (r.payload_bytes as f64 / 1_048_576.0)]
            }
            MetricKind::RelayCpuS if r.relay_cpu_s.iter().any(|(n, _)| chosen(n)) => vec![cpu_s],
            MetricKind::RelayCore if r.wall_s > 0.0 => r
                .relay_cpu_s
                .iter()
                .filter(|(name, _)| chosen(name))
                .map(|(_, s)| s / r.wall_s * 100.0)
                .collect(),
            MetricKind::RelayRss => r
                .relay_peak_rss
                .iter()
                .filter(|(name, _)| chosen(name))
                .map(|(_, b)| *b as f64 / 1_048_576.0)
                .collect(),
            MetricKind::CircuitBuild => r.circuit_build_ms.clone(),
            MetricKind::WireOverhead => r.wire_overhead.into_iter().collect(),
            MetricKind::TorchestraMoves => vec![r
                .torchestra_moves
                .iter()
                .filter(|(name, _)| chosen(name))
                .fold(0.0, |sum, (_, n)| sum + *n as f64)],
            MetricKind::TcpTimeouts | MetricKind::TcpRetransmits => {
                let relays: Vec<&str> = r.relay_cpu_s.iter().map(|(n, _)| n.as_str()).collect();
                let hosts: Vec<_> = r
                    .tcp_counters
                    .iter()
                    .filter(|c| relays.contains(&c.host.as_str()) && chosen(&c.host))
                    .collect();
                if hosts.is_empty() {
                    return Vec::new();
                }
                let count = |c: &onionlab_lab::hostnet::HostTcpCounters| match self {
                    MetricKind::TcpTimeouts => c.timeouts,
                    _ => c.retrans_segs,
                };
                vec![hosts.iter().map(|c| count(c) as f64).sum()]
            }
            MetricKind::LossRate | MetricKind::QueueDropRate => {
                let sent: u64 = r.link_packets.iter().map(|l| l.packets).sum();
                let dropped: u64 = r
                    .link_packets
                    .iter()
                    .map(|l| match self {
                        MetricKind::LossRate => l.lost,
                        _ => l.queue_dropped,
                    })
                    .sum();
                if sent == 0 {
                    return Vec::new();
                }
                vec![100.0 * dropped as f64 / sent as f64]
            }
            MetricKind::LostPackets if !r.link_packets.is_empty() => {
                vec![r.link_packets.iter().map(|l| l.lost as f64).sum()]
            }
            MetricKind::SimWall => r.simulation.iter().map(|c| c.wall_s).collect(),
            MetricKind::SimMemory => r
                .simulation
                .iter()
                .filter_map(|c| c.peak_memory_bytes)
                .map(|b| b as f64 / 1_048_576.0)
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// How a repetition's values of a metric become one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Aggregate {
    /// The smallest (the slowest client's goodput).
    Min,
    /// The largest (the slowest client's download time).
    Max,
    /// The median.
    Median,
    /// The mean.
    Mean,
    /// The sum (the network's throughput over its streams).
    Sum,
    /// The 95th percentile (type 7).
    P95,
    /// The 99th percentile (type 7).
    P99,
}

impl Aggregate {
    /// The name the command line uses.
    pub fn name(self) -> &'static str {
        match self {
            Aggregate::Min => "min",
            Aggregate::Max => "max",
            Aggregate::Median => "median",
            Aggregate::Mean => "mean",
            Aggregate::Sum => "sum",
            Aggregate::P95 => "p95",
            Aggregate::P99 => "p99",
        }
    }

    fn of(self, values: &[f64]) -> f64 {
        let sorted = onionlab_stats::sorted(values).unwrap_or_default();
        let q = |p| onionlab_stats::quantile(&sorted, p).unwrap_or(f64::NAN);
        match self {
            Aggregate::Min => sorted.first().copied().unwrap_or(f64::NAN),
            Aggregate::Max => sorted.last().copied().unwrap_or(f64::NAN),
            Aggregate::Median => q(0.5),
            Aggregate::Mean => onionlab_stats::mean(values).unwrap_or(f64::NAN),
            Aggregate::Sum => values.iter().sum(),
            Aggregate::P95 => q(0.95),
            Aggregate::P99 => q(0.99),
        }
    }
}

/// Whether the workload `name` matches `pattern`: the same name, or with
/// each `*` standing for any run of characters (`light-*`).
pub fn matches_pattern(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return pattern == name;
    }
    if name.len() < first.len() + last.len() || !name.starts_with(first) || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(i) => rest = &rest[i + middle.len()..],
            None => return false,
        }
    }
    true
}

/// A variant's matrix parameters, from its full label (`name=value`
/// pairs joined by spaces).
pub fn params_of(label: &str) -> Vec<(String, String)> {
    label
        .split_whitespace()
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Which repetitions and transfers of a run count.
pub struct Selection<'a> {
    data: &'a RunData,
    /// (variant, repetition) left out: ran on a saturated CPU, or beside
    /// other runs when only runs made alone count.
    left_out: BTreeSet<(&'a str, u32)>,
    /// Workloads pooled into one, `all`.
    pool: bool,
    /// With `while_loaded`: per (variant, repetition) with streams, when
    /// its first stream ended (Unix ms); transfers that ended later are
    /// left out.
    load_end: Option<std::collections::BTreeMap<(&'a str, u32), f64>>,
    /// With `sharing`: the class wanted and each web client's class (by
    /// variant, repetition and workload); other transfers are left out.
    sharing: Option<(crate::sharing::Sharing, crate::sharing::Classes)>,
    /// With `index`: only each workload's transfer of this number.
    index: Option<u32>,
}

/// Values of one metric with the repetition of each.
#[derive(Debug, Default, Clone)]
pub struct Sample {
    /// The values.
    pub values: Vec<f64>,
    /// `repetitions[i]` is the repetition of `values[i]`.
    pub repetitions: Vec<u32>,
}

impl Sample {
    /// Only the values of these repetitions.
    pub fn restricted_to(&self, keep: &BTreeSet<u32>) -> Sample {
        let mut out = Sample::default();
        for (v, r) in self.values.iter().zip(&self.repetitions) {
            if keep.contains(r) {
                out.values.push(*v);
                out.repetitions.push(*r);
            }
        }
        out
    }

    /// The repetitions it has values of.
    pub fn repetition_set(&self) -> BTreeSet<u32> {
        self.repetitions.iter().copied().collect()
    }

    /// One value per repetition, `agg` of its values; the repetitions in
    /// `left_out` (a failed transfer would bias a minimum or a sum) are
    /// left out.
    pub fn per_repetition(&self, agg: Aggregate, left_out: &BTreeSet<u32>) -> Sample {
        let mut out = Sample::default();
        for rep in self.repetition_set().difference(left_out) {
            let values: Vec<f64> = self
                .values
                .iter()
                .zip(&self.repetitions)
                .filter(|(_, r)| *r == rep)
                .map(|(v, _)| *v)
                .collect();
            let v = agg.of(&values);
            if v.is_finite() {
                out.values.push(v);
                out.repetitions.push(*rep);
            }
        }
        out
    }
}

impl<'a> Selection<'a> {
    /// Repetitions on a saturated CPU are left out (they measured the
    /// machine); with `alone`, those made beside other runs too.
    pub fn new(data: &'a RunData, alone: bool, pool: bool) -> Selection<'a> {
        let left_out = data
            .repetitions
            .iter()
            .filter(|r| r.cpu_saturated || (alone && r.jobs > 1))
            .map(|r| (r.variant.as_str(), r.repetition))
            .collect();
        Selection {
            data,
            left_out,
            pool,
            load_end: None,
            sharing: None,
            index: None,
        }
    }

    /// Only each workload's transfer number `index` (from 0) in its
    /// repetition; streams and probes, one transfer each, are number 0.
    pub fn index(mut self, index: u32) -> Selection<'a> {
        self.index = Some(index);
        self
    }

    /// Only the web clients whose circuit shares `class` with a bulk
    /// client's circuit in their repetition (`crate::sharing`); transfers
    /// of other clients, and of variants without recorded paths (C tor),
    /// are left out.
    pub fn sharing(mut self, class: crate::sharing::Sharing) -> Selection<'a> {
        self.sharing = Some((class, crate::sharing::classes(self.data)));
        self
    }

    /// Whether `r` is of a client of the wanted sharing class (or no class
    /// is wanted).
    fn of_sharing_class(&self, r: &TransferRecord) -> bool {
        let Some((class, classes)) = &self.sharing else {
            return true;
        };
        classes.get(&(r.variant.clone(), r.repetition, r.workload.clone())) == Some(class)
    }

    /// Only the transfers (other than streams) that ended before the first
    /// stream of their repetition ended: the network was loaded throughout
    /// them (seed 001's loaded toy). Variants without streams keep all.
    pub fn while_loaded(mut self) -> Selection<'a> {
        let mut ends = std::collections::BTreeMap::new();
        for r in self
            .data
            .records
            .iter()
            .filter(|r| r.kind == "stream" && r.error.is_none())
        {
            if let Some(ttlb) = r.ttlb_ms {
                let end = r.start_unix_ms + ttlb;
                let e = ends
                    .entry((r.variant.as_str(), r.repetition))
                    .or_insert(f64::INFINITY);
                *e = f64::min(*e, end);
            }
        }
        self.load_end = Some(ends);
        self
    }

    /// Whether `r` ended after its repetition's load (`while_loaded`).
    fn after_load(&self, r: &TransferRecord) -> bool {
        let Some(ends) = &self.load_end else {
            return false;
        };
        if r.kind == "stream" {
            return false;
        }
        match (ends.get(&(r.variant.as_str(), r.repetition)), r.ttlb_ms) {
            (Some(end), Some(ttlb)) => r.start_unix_ms + ttlb > *end,
            _ => false,
        }
    }

    /// Transfers of `variant` (and `workload`) that completed after their
    /// repetition's load ended, in repetitions that count: left out by
    /// `while_loaded`.
    pub fn after_load_count(&self, variant: &str, workload: Option<&str>) -> usize {
        self.data
            .records
            .iter()
            .filter(|r| {
                r.variant == variant
                    && r.error.is_none()
                    && self.workload_matches(r, workload)
                    && self.counts(variant, r.repetition)
                    && self.after_load(r)
            })
            .count()
    }

    fn counts(&self, variant: &str, repetition: u32) -> bool {
        !self.left_out.contains(&(variant, repetition))
    }

    fn workload_matches(&self, r: &TransferRecord, workload: Option<&str>) -> bool {
        self.pool || workload.is_none_or(|w| matches_pattern(w, &r.workload))
    }

    /// The workloads of the run in first-seen order (`all` when pooled).
    pub fn workloads(&self) -> Vec<String> {
        if self.pool {
            return vec!["all".into()];
        }
        let mut out: Vec<String> = Vec::new();
        for r in &self.data.records {
            if !out.contains(&r.workload) {
                out.push(r.workload.clone());
            }
        }
        out
    }

    /// The values of `metric` for `variant` from the transfers that
    /// completed and the repetitions that count. `part` narrows them: for
    /// a metric per transfer, to the workloads it matches (a name or a
    /// pattern); for the relay metrics, to the relays it matches; `None`
    /// keeps all.
    pub fn sample(&self, metric: MetricKind, variant: &str, part: Option<&str>) -> Sample {
        let mut s = Sample::default();
        let mut push = |rep: u32, values: Vec<f64>| {
            for v in values.into_iter().filter(|v| v.is_finite()) {
                s.values.push(v);
                s.repetitions.push(rep);
            }
        };
        if metric.per_repetition() {
            for r in self
                .data
                .repetitions
                .iter()
                .filter(|r| r.variant == variant)
            {
                if self.counts(variant, r.repetition) {
                    push(r.repetition, metric.of_repetition(r, part));
                }
            }
        } else {
            for r in self.data.records.iter().filter(|r| {
                r.variant == variant
                    && r.error.is_none()
                    && self.workload_matches(r, part)
                    && !self.after_load(r)
                    && self.of_sharing_class(r)
                    && self.index.is_none_or(|i| r.index == i)
            }) {
                if self.counts(variant, r.repetition) {
                    push(r.repetition, metric.of_transfer(r));
                }
            }
        }
        s
    }

    /// The failed transfers of `variant` (and `workload`) in repetitions
    /// that count.
    fn failed_transfers<'s>(
        &'s self,
        variant: &'s str,
        workload: Option<&'s str>,
    ) -> impl Iterator<Item = &'s TransferRecord> + 's {
        self.data.records.iter().filter(move |r| {
            r.variant == variant
                && r.error.is_some()
                && self.workload_matches(r, workload)
                && self.counts(variant, r.repetition)
        })
    }

    /// How many transfers of `variant` (and `workload`) failed in
    /// repetitions that count.
    pub fn failed(&self, variant: &str, workload: Option<&str>) -> usize {
        self.failed_transfers(variant, workload).count()
    }

    /// Repetitions of `variant` that count and have a failed transfer (of
    /// `workload`).
    pub fn failed_repetitions(&self, variant: &str, workload: Option<&str>) -> BTreeSet<u32> {
        self.failed_transfers(variant, workload)
            .map(|r| r.repetition)
            .collect()
    }

    /// Repetitions of `variant` left out.
    pub fn left_out(&self, variant: &str) -> usize {
        self.left_out.iter().filter(|(v, _)| *v == variant).count()
    }
}

#[cfg(test)]
mod tests {
    use super::matches_pattern;

    #[test]
    fn workload_patterns() {
        assert!(matches_pattern("light", "light"));
        assert!(!matches_pattern("light", "light-1"));
        assert!(matches_pattern("light-*", "light-1"));
        assert!(matches_pattern("light-*", "light-"));
        assert!(!matches_pattern("light-*", "heavy-1"));
        assert!(matches_pattern("*", "anything"));
        assert!(matches_pattern("*-1", "heavy-1"));
        assert!(matches_pattern("a*b*c", "a-b-b-c"));
        assert!(!matches_pattern("a*b*c", "a-c"));
        assert!(!matches_pattern("ab*ba", "aba"));
    }
}

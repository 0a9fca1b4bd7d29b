//! What a run measures besides the transfers: the relays' CPU time, the
//! links', hosts' TCP and drop counters since the workload started, and
//! what the nodes' logs say (circuit build times, paths, Torchestra's
//! moves).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use onionlab_netem::Network;

use crate::agent::TransferRecord;
use crate::error::Error;
use crate::hostnet::{self, HostDrops, HostTcp, HostTcpCounters};
use crate::plan::{AgentPlan, Plan};
use crate::process::{cpu_seconds, Proc};
use crate::run::{EmulatorTiming, LinkPackets, RepetitionRecord, SATURATED_BUSY_FRACTION};

/// What an engine observed of one run besides the agents' records, after
/// its processes stopped and its network went down.
pub(super) struct Observed {
    /// When the engine started the run (writing its files); the plan was
    /// made just before, in milliseconds.
    pub(super) started: Instant,
    /// The share of all CPUs busy during the workload.
    pub(super) busy: f64,
    /// Each relay's CPU seconds during the workload.
    pub(super) relay_cpu_s: Vec<(String, f64)>,
    /// Each relay's peak resident memory.
    pub(super) relay_peak_rss: Vec<(String, u64)>,
    /// Each host's TCP set-up.
    pub(super) tcp: Vec<HostTcp>,
    /// The machine's TCP module parameters.
    pub(super) tcp_module_parameters: BTreeMap<String, String>,
    /// Each host's TCP counters during the workload.
    pub(super) tcp_counters: Vec<HostTcpCounters>,
    /// Each host's own drops during the workload.
    pub(super) host_drops: Vec<HostDrops>,
    /// Each relay's Torchestra moves.
    pub(super) torchestra_moves: Vec<(String, u64)>,
    /// Each onionlab client's first circuit.
    pub(super) client_paths: Vec<(String, Vec<String>)>,
    /// The emulated links' counters during the workload (the namespace
    /// engine's emulator; Shadow has none).
    pub(super) counters: Option<onionlab_netem::Counters>,
    /// The onionlab clients' logs (complete: the clients stopped), for
    /// their circuit build times.
    pub(super) client_logs: Vec<PathBuf>,
    /// C tor clients' control ports, watched for circuit build times and
    /// the circuits of their streams.
    pub(super) circuit_watches: Vec<crate::ctor::CircuitWatch>,
    /// Whether the run's clock was simulated (Shadow): the machine's load
    /// did not skew its timings, so it is never flagged as saturated.
    pub(super) simulated: bool,
}

/// The repetition record of a run of `plan` whose agents reported
/// `records`.
pub(super) fn repetition_record(
    plan: &Plan,
    records: &[TransferRecord],
    mut seen: Observed,
) -> RepetitionRecord {
    let emulator = seen.counters.as_ref().map(|c| {
        let late = &c.forwarder.release_error;
        EmulatorTiming {
            late_p50_us: late.p50_us,
            late_p99_us: late.p99_us,
            late_max_us: late.max_us,
            cpu_s: c.forwarder.cpu_s,
        }
    });
    let mut circuit_build_ms = circuit_build_times(&seen.client_logs);
    let mut ctor_streams = Vec::new();
    for w in std::mem::take(&mut seen.circuit_watches) {
        let watched = w.finish();
        circuit_build_ms.extend(watched.build_ms);
        ctor_streams.extend(watched.streams);
    }
    // A C tor plan with conflux runs linked sets.
    let conflux = plan.ctor.as_ref().is_some_and(|c| c.conflux.is_some());
    let conflux_fallback_streams = if conflux {
        ctor_streams
            .iter()
            .filter(|s| s.purpose != "CONFLUX_LINKED")
            .map(|s| s.streams)
            .sum()
    } else {
        0
    };
    let payload_bytes: u64 = records
        .iter()
        .filter(|r| r.error.is_none())
        .map(|r| if r.kind == "echo" { 2 * r.size } else { r.size })
        .sum();
    let (links, link_packets) = seen
        .counters
        .as_ref()
        .map(link_summaries)
        .unwrap_or_default();
    // Wire overhead where the payload crosses exactly once: the clients'
    // access links (both directions: requests, SENDMEs, TLS and TCP/IP
    // headers, retransmissions) per payload byte delivered.
    let client_hosts = plan.client_hosts();
    let on_client = |host: &str| client_hosts.contains(&host);
    let wire: u64 = links
        .iter()
        .filter(|l| on_client(&l.0) || on_client(&l.1))
        .map(|l| l.2)
        .sum();
    RepetitionRecord {
        variant: plan.variant.clone(),
        repetition: plan.repetition,
        seed: plan.seed,
        // From set-up to the end of tear-down (C tor's watches included).
        wall_s: seen.started.elapsed().as_secs_f64(),
        cpu_busy_fraction: seen.busy,
        cpu_saturated: !seen.simulated && seen.busy > SATURATED_BUSY_FRACTION,
        relay_cpu_s: seen.relay_cpu_s,
        relay_peak_rss: seen.relay_peak_rss,
        circuit_build_ms,
        links,
        link_packets,
        payload_bytes,
        // Only where links were counted (not under Shadow).
        wire_overhead: (payload_bytes > 0 && seen.counters.is_some())
            .then(|| wire as f64 / payload_bytes as f64),
        tcp: seen.tcp,
        tcp_module_parameters: seen.tcp_module_parameters,
        tcp_counters: seen.tcp_counters,
        host_dropped: !seen.host_drops.is_empty(),
        host_drops: seen.host_drops,
        jobs: 1,
        emulator,
        ctor_streams,
        conflux_fallback_streams,
        torchestra_moves: seen.torchestra_moves,
        client_paths: seen.client_paths,
        simulator_seed: None,
        simulation: None,
    }
}

/// The share of all CPUs' time busy since `start` ([`crate::process::cpu_jiffies`]).
pub(super) fn busy_since(start: Option<(u64, u64)>) -> f64 {
    match (start, crate::process::cpu_jiffies()) {
        (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => (b1 - b0) as f64 / (t1 - t0) as f64,
        _ => 0.0,
    }
}

/// Each onionlab client's first circuit (client name, relays in order),
/// from the `circuit built` lines of the clients' logs
/// (`client-NAME.log`, `path=A,B,C`).
pub(super) fn client_paths(client_logs: &[PathBuf]) -> Vec<(String, Vec<String>)> {
    client_logs
        .iter()
        .filter_map(|log| {
            let name = log
                .file_name()?
                .to_str()?
                .strip_prefix("client-")?
                .strip_suffix(".log")?
                .to_string();
            let text = fs::read_to_string(log).ok()?;
            let path = text
                .lines()
                .filter(|l| l.contains("circuit built"))
                .find_map(|l| l.split_whitespace().find_map(|f| f.strip_prefix("path=")))?;
            Some((name, path.split(',').map(str::to_string).collect()))
        })
        .collect()
}

/// The log line of a relay moving a circuit (`onionlab_node`'s relay logs
/// it at info, always).
const TORCHESTRA_MOVE: &str = "torchestra: moving a circuit";

/// Per relay whose log (`dir/NAME.log`) has any, its Torchestra moves
/// (the relays stopped, their logs complete).
pub(super) fn torchestra_moves<'a>(
    relays: impl Iterator<Item = &'a str>,
    dir: &Path,
) -> Vec<(String, u64)> {
    relays
        .filter_map(|name| {
            let text = fs::read_to_string(dir.join(format!("{name}.log"))).ok()?;
            let n = text.lines().filter(|l| l.contains(TORCHESTRA_MOVE)).count() as u64;
            (n > 0).then(|| (name.to_string(), n))
        })
        .collect()
}

/// The transfer records the agents wrote (their `out`, relative to the
/// repetition's directory `dir`), and a failure for every transfer an
/// agent did not report.
pub(super) fn agent_records(agents: &[AgentPlan], dir: &Path) -> Vec<TransferRecord> {
    let mut records = Vec::new();
    for a in agents {
        let spec = &a.spec;
        let text = fs::read_to_string(dir.join(&spec.out));
        let finished = text.is_ok();
        let mut got: Vec<TransferRecord> = text
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        for (w, _) in &spec.workloads {
            // A workload that runs for a time has as many transfers as
            // fit: an agent that wrote its records reported all of them,
            // one that did not fails the workload once.
            let expected = match w.until {
                Some(_) if finished => 0,
                Some(_) => 1,
                None => w.count,
            };
            for index in 0..expected {
                if !got.iter().any(|r| r.workload == w.name && r.index == index) {
                    got.push(TransferRecord {
                        workload: w.name.clone(),
                        kind: format!("{:?}", w.kind).to_lowercase(),
                        index,
                        size: w.size,
                        timed_out: true,
                        stalled: true,
                        error: Some("no record: the agent did not finish in time".into()),
                        ..TransferRecord::default()
                    });
                }
            }
        }
        records.extend(got);
    }
    records
}

/// Circuit build times from the clients' logs (onionlab's
/// `circuit built ... ms=` lines; C tor's come from its control port).
fn circuit_build_times(client_logs: &[PathBuf]) -> Vec<f64> {
    let mut ms = Vec::new();
    for log in client_logs {
        let text = fs::read_to_string(log).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains("circuit built")) {
            if let Some(v) = line
                .split_whitespace()
                .find_map(|f| f.strip_prefix("ms="))
                .and_then(|v| v.parse::<f64>().ok())
            {
                ms.push(v);
            }
        }
    }
    ms
}

/// Per directed link: (src, dst, delivered bytes, dropped packets), and
/// its packet counts.
#[allow(clippy::type_complexity)]
fn link_summaries(
    counters: &onionlab_netem::Counters,
) -> (Vec<(String, String, u64, u64)>, Vec<LinkPackets>) {
    let links = counters
        .paths
        .iter()
        .map(|p| {
            (
                p.src.clone(),
                p.dst.clone(),
                p.delivered_bytes,
                p.drops.total(),
            )
        })
        .collect();
    let packets = counters
        .paths
        .iter()
        .map(|p| LinkPackets {
            src: p.src.clone(),
            dst: p.dst.clone(),
            packets: p.submitted_packets,
            lost: p.drops.loss,
            queue_dropped: p.drops.uplink_queue + p.drops.path_queue + p.drops.downlink_queue,
        })
        .collect();
    (links, packets)
}

/// The relays and clients of one repetition, whichever implementation
/// runs them.
pub(super) struct Nodes {
    /// Relay processes and their hosts.
    pub(super) relays: Vec<(Proc, String)>,
    /// Client processes and their logs.
    pub(super) clients: Vec<(Proc, PathBuf)>,
    /// Other processes of the network (C tor's directory authority).
    pub(super) others: Vec<Proc>,
    /// C tor clients' control ports, watched for circuit build times
    /// (onionlab's clients log theirs) and the circuits of their streams.
    pub(super) circuit_watches: Vec<crate::ctor::CircuitWatch>,
}

impl Nodes {
    /// Stops the clients, then the relays, `servers` and the rest (C
    /// tor's authority).
    pub(super) fn stop(&mut self, servers: &mut [Proc]) {
        for (p, _) in &mut self.clients {
            p.stop();
        }
        let relays = self.relays.iter_mut().map(|(p, _)| p);
        for p in relays
            .chain(servers.iter_mut())
            .chain(self.others.iter_mut())
        {
            p.stop();
        }
    }
}

/// The emulated links' counters and the relays' CPU time when the
/// workload starts: what came before (start-up, C tor's bootstrap and
/// test downloads) is left out of the repetition's records.
pub(super) struct Baseline {
    counters: onionlab_netem::Counters,
    relay_cpu_s: Vec<f64>,
    tcp: Vec<HostTcpCounters>,
    drops: Vec<HostDrops>,
}

impl Baseline {
    pub(super) fn take(net: &Network, nodes: &Nodes) -> Result<Baseline, Error> {
        Ok(Baseline {
            counters: net.counters()?,
            tcp: read_tcp_counters(net)?,
            drops: read_host_drops(net)?,
            relay_cpu_s: nodes
                .relays
                .iter()
                .map(|(p, _)| cpu_seconds(p.child.id()).unwrap_or(f64::NAN))
                .collect(),
        })
    }

    /// Each relay's CPU seconds since the baseline; a relay whose CPU
    /// time could not be read (it exited) is left out and logged, never
    /// written as NaN (JSON has none).
    pub(super) fn relay_cpu_since(&self, nodes: &Nodes) -> Vec<(String, f64)> {
        nodes
            .relays
            .iter()
            .zip(&self.relay_cpu_s)
            .filter_map(|((p, n), before)| {
                let used = cpu_seconds(p.child.id()).map(|now| now - before);
                match used {
                    Some(s) if s.is_finite() => Some((n.clone(), s)),
                    _ => {
                        tracing::warn!(relay = %n, "no CPU time: the relay process is gone");
                        None
                    }
                }
            })
            .collect()
    }

    /// Each host's TCP counters since the baseline (hosts that sent
    /// segments since).
    pub(super) fn tcp_since(&self, end: Vec<HostTcpCounters>) -> Vec<HostTcpCounters> {
        end.into_iter()
            .map(|mut c| {
                if let Some(b) = self.tcp.iter().find(|b| b.host == c.host) {
                    c.out_segs = c.out_segs.saturating_sub(b.out_segs);
                    c.retrans_segs = c.retrans_segs.saturating_sub(b.retrans_segs);
                    c.timeouts = c.timeouts.saturating_sub(b.timeouts);
                    c.loss_probes = c.loss_probes.saturating_sub(b.loss_probes);
                    c.fast_retrans = c.fast_retrans.saturating_sub(b.fast_retrans);
                }
                c
            })
            .filter(|c| c.out_segs > 0)
            .collect()
    }

    /// Each host's own drops since the baseline (hosts that dropped any).
    pub(super) fn drops_since(&self, end: Vec<HostDrops>) -> Vec<HostDrops> {
        end.into_iter()
            .map(|mut d| {
                if let Some(b) = self.drops.iter().find(|b| b.host == d.host) {
                    d.tun_tx_dropped = d.tun_tx_dropped.saturating_sub(b.tun_tx_dropped);
                    d.udp_rcvbuf_errors = d.udp_rcvbuf_errors.saturating_sub(b.udp_rcvbuf_errors);
                    d.tcp_queue_drops = d.tcp_queue_drops.saturating_sub(b.tcp_queue_drops);
                }
                d
            })
            .filter(HostDrops::any)
            .collect()
    }

    /// Take the baseline's packet and byte counts off `end`'s paths.
    pub(super) fn subtract_from(&self, end: &mut onionlab_netem::Counters) {
        for p in &mut end.paths {
            let Some(b) = self.counters.path(&p.src, &p.dst) else {
                continue;
            };
            p.submitted_packets = p.submitted_packets.saturating_sub(b.submitted_packets);
            p.submitted_bytes = p.submitted_bytes.saturating_sub(b.submitted_bytes);
            p.delivered_packets = p.delivered_packets.saturating_sub(b.delivered_packets);
            p.delivered_bytes = p.delivered_bytes.saturating_sub(b.delivered_bytes);
            let (d, bd) = (&mut p.drops, &b.drops);
            d.uplink_queue = d.uplink_queue.saturating_sub(bd.uplink_queue);
            d.path_queue = d.path_queue.saturating_sub(bd.path_queue);
            d.downlink_queue = d.downlink_queue.saturating_sub(bd.downlink_queue);
            d.loss = d.loss.saturating_sub(bd.loss);
            d.link_down = d.link_down.saturating_sub(bd.link_down);
            d.overflow = d.overflow.saturating_sub(bd.overflow);
            d.blocked = d.blocked.saturating_sub(bd.blocked);
        }
    }
}

/// Each host's TCP counters (hosts that sent TCP segments only).
pub(super) fn read_tcp_counters(net: &Network) -> Result<Vec<HostTcpCounters>, Error> {
    let mut all = Vec::new();
    for h in &net.topology().hosts {
        all.push(net.run_in(&h.name, || hostnet::read_tcp_counters(&h.name))?);
    }
    Ok(all)
}

/// Every host's own packet drops.
pub(super) fn read_host_drops(net: &Network) -> Result<Vec<HostDrops>, Error> {
    let mut drops = Vec::new();
    for h in &net.topology().hosts {
        drops.push(net.run_in(&h.name, || {
            hostnet::read_drops(&h.name, onionlab_netem::netns::TUN_NAME)
        })?);
    }
    Ok(drops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use onionlab_netem::counters::PathCounters;
    use onionlab_netem::Counters;

    fn path(src: &str, bytes: u64, loss: u64) -> PathCounters {
        let mut p = PathCounters {
            src: src.into(),
            dst: "b".into(),
            submitted_packets: bytes / 100,
            submitted_bytes: bytes,
            delivered_packets: bytes / 100,
            delivered_bytes: bytes,
            ..PathCounters::default()
        };
        p.drops.loss = loss;
        p
    }

    /// What came before the workload (C tor's bootstrap, say) is taken
    /// off every count; a path or host first seen after it keeps all.
    #[test]
    fn the_baseline_is_taken_off_links_tcp_and_drops() {
        let tcp = |host: &str, segs: u64| HostTcpCounters {
            host: host.into(),
            out_segs: segs,
            retrans_segs: segs / 10,
            ..HostTcpCounters::default()
        };
        let drops = |host: &str, n: u64| HostDrops {
            host: host.into(),
            udp_rcvbuf_errors: n,
            ..HostDrops::default()
        };
        let before = Baseline {
            counters: Counters {
                paths: vec![path("a", 50_000, 2)],
                ..Counters::default()
            },
            relay_cpu_s: Vec::new(),
            tcp: vec![tcp("a", 300), tcp("c", 40)],
            drops: vec![drops("a", 5)],
        };
        let mut end = Counters {
            paths: vec![path("a", 1_050_000, 3), path("new", 7_000, 0)],
            ..Counters::default()
        };
        before.subtract_from(&mut end);
        assert_eq!(end.paths[0].delivered_bytes, 1_000_000);
        assert_eq!(end.paths[0].submitted_packets, 10_000);
        assert_eq!(end.paths[0].drops.loss, 1);
        assert_eq!(end.paths[1].delivered_bytes, 7_000);
        let t = before.tcp_since(vec![tcp("a", 1300), tcp("c", 40)]);
        assert_eq!(t.len(), 1, "c sent nothing since: left out");
        assert_eq!((t[0].out_segs, t[0].retrans_segs), (1000, 100));
        let d = before.drops_since(vec![drops("a", 5), drops("b", 2)]);
        assert_eq!(d.len(), 1, "a dropped nothing since");
        assert_eq!((d[0].host.as_str(), d[0].udp_rcvbuf_errors), ("b", 2));
    }

    /// A workload that runs for a time has no count to fill up to: a
    /// finished agent's records are all there is; an agent that wrote
    /// none fails the workload once, and a counted workload once per
    /// transfer.
    #[test]
    fn missing_records_are_failures_by_count_or_once_for_a_timed_workload() {
        use crate::workload::{Workload, WorkloadKind};
        use std::time::Duration;
        let workload = |name: &str, until: Option<Duration>| Workload {
            name: name.into(),
            kind: WorkloadKind::Download,
            client: "c".into(),
            server: "s".into(),
            size: 1000,
            count: if until.is_some() { u32::MAX } else { 3 },
            think_min: Duration::ZERO,
            think_max: Duration::ZERO,
            start: Duration::ZERO,
            until,
            probes: 0,
            probe_interval: Duration::ZERO,
            trace: Vec::new(),
            stream_duration: Duration::ZERO,
        };
        let addr: std::net::SocketAddr = "10.0.0.1:80".parse().expect("an address");
        let agent = |out: &str| AgentPlan {
            client: "c".into(),
            host: "c".into(),
            spec: crate::agent::AgentSpec {
                socks: addr,
                workloads: vec![
                    (workload("timed", Some(Duration::from_secs(60))), addr),
                    (workload("counted", None), addr),
                ],
                seed: 1,
                stall_threshold: Duration::from_secs(5),
                transfer_timeout: Duration::from_secs(60),
                out: out.into(),
            },
        };
        let dir =
            std::env::temp_dir().join(format!("onionlab-agent-records-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("a folder");
        let done = |w: &str, index: u32| TransferRecord {
            workload: w.into(),
            index,
            ttlb_ms: Some(1.0),
            ..TransferRecord::default()
        };
        let lines: String = [done("timed", 0), done("timed", 1), done("counted", 0)]
            .iter()
            .map(|r| serde_json::to_string(r).expect("json") + "\n")
            .collect();
        fs::write(dir.join("finished.jsonl"), lines).expect("records");

        let finished = agent_records(&[agent("finished.jsonl")], &dir);
        let failed = |rs: &[TransferRecord], w: &str| {
            rs.iter()
                .filter(|r| r.workload == w && r.error.is_some())
                .count()
        };
        assert_eq!(
            finished.len(),
            5,
            "2 timed, 1 counted and 2 counted missing"
        );
        assert_eq!(failed(&finished, "timed"), 0);
        assert_eq!(failed(&finished, "counted"), 2);

        let silent = agent_records(&[agent("never-written.jsonl")], &dir);
        assert_eq!(failed(&silent, "timed"), 1);
        assert_eq!(failed(&silent, "counted"), 3);
        let _ = fs::remove_dir_all(&dir);
    }
}

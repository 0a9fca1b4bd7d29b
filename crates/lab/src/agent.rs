//! The workload agent: runs inside a client's host, drives the scenario's
//! workloads through the client's SOCKS port and writes one record per
//! transfer (JSON lines).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::{Rng as _, SeedableRng};
use rand_xoshiro::Xoshiro256StarStar;
use serde::{Deserialize, Serialize};

use crate::traffic::{self, OP_DOWNLOAD, OP_ECHO, OP_PROBE, OP_UPLOAD};
use crate::workload::{Workload, WorkloadKind};

/// What one agent does (written by the runner as JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentSpec {
    /// The client's SOCKS port (inside the client's host).
    pub socks: SocketAddr,
    /// Workloads with their server's address.
    pub workloads: Vec<(Workload, SocketAddr)>,
    /// Seed of think times.
    pub seed: u64,
    /// No payload progress for this long is a stall.
    pub stall_threshold: Duration,
    /// A transfer not done by then is a timeout.
    pub transfer_timeout: Duration,
    /// Where records go.
    pub out: PathBuf,
}

/// One transfer's measurements. Times are milliseconds; the start is wall
/// clock (ms since the Unix epoch) so records of one repetition can be
/// lined up; durations are from the SOCKS request (`connect_ms`) or from
/// SOCKS success (`ttfb_ms`, `ttlb_ms`), as seed 000 measures.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TransferRecord {
    /// Workload name.
    pub workload: String,
    /// download, upload, echo, probe, trace or stream.
    pub kind: String,
    /// Index of the transfer within its workload.
    pub index: u32,
    /// Payload bytes.
    pub size: u64,
    /// When the SOCKS request started (ms since the epoch).
    pub start_unix_ms: f64,
    /// SOCKS request to SOCKS success (includes circuit building).
    pub connect_ms: Option<f64>,
    /// SOCKS success to first payload byte.
    pub ttfb_ms: Option<f64>,
    /// SOCKS success to last payload byte.
    pub ttlb_ms: Option<f64>,
    /// Payload MiB per second over `ttlb_ms`.
    pub goodput_mib_s: Option<f64>,
    /// Longest time without payload progress.
    pub longest_gap_ms: Option<f64>,
    /// A gap longer than the stall threshold, or a timeout.
    pub stalled: bool,
    /// The transfer did not finish in time.
    pub timed_out: bool,
    /// One-way delay of each probe or trace message, or of a stream's
    /// record sampled every 100 ms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probe_latency_ms: Vec<f64>,
    /// Why it failed, if it did (a checksum mismatch says so here).
    pub error: Option<String>,
    /// Variant label (filled by the runner).
    #[serde(default)]
    pub variant: String,
    /// Repetition (filled by the runner).
    #[serde(default)]
    pub repetition: u32,
    /// Seed of the repetition (filled by the runner).
    #[serde(default)]
    pub seed: u64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Think times drawn from a seeded stream of a fixed algorithm
/// (xoshiro256**), so a repetition's seed gives the same pauses everywhere.
struct Think(Xoshiro256StarStar);

impl Think {
    fn new(seed: u64) -> Think {
        Think(Xoshiro256StarStar::seed_from_u64(seed))
    }

    /// Uniform in [lo, hi).
    fn next_between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let frac = (self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo).mul_f64(frac)
    }
}

/// The least pause after a failed transfer of a workload that runs for
/// a time (`until`).
const TIMED_RETRY_PAUSE: Duration = Duration::from_secs(1);

/// Run one workload's transfers one after another.
async fn run_workload(
    spec: &AgentSpec,
    w: &Workload,
    server: SocketAddr,
    seed: u64,
) -> Vec<TransferRecord> {
    let op = match w.kind {
        WorkloadKind::Download => OP_DOWNLOAD,
        WorkloadKind::Upload => OP_UPLOAD,
        WorkloadKind::Echo => OP_ECHO,
        WorkloadKind::Probe => OP_PROBE,
        WorkloadKind::Trace => traffic::OP_TRACE,
        WorkloadKind::Stream => crate::stream::OP_STREAM,
    };
    let len = if w.kind == WorkloadKind::Probe {
        traffic::probe_request_len(w.probes, w.probe_interval)
    } else {
        w.size
    };
    let mut think = Think::new(seed);
    let mut out = Vec::new();
    let began = tokio::time::Instant::now();
    tokio::time::sleep(w.start).await;
    let mut failed = false;
    for index in 0..w.count {
        if index > 0 {
            let mut pause = think.next_between(w.think_min, w.think_max);
            // A workload that runs for a time must not spin on transfers
            // that fail at once (its client gone): it waits a little.
            if failed && w.until.is_some() {
                pause = pause.max(TIMED_RETRY_PAUSE);
            }
            // A pause that would end past `until` ends the workload now,
            // so that it ends within its deadline.
            if w.until
                .is_some_and(|until| began.elapsed() + pause >= until)
            {
                break;
            }
            tokio::time::sleep(pause).await;
        }
        if w.until.is_some_and(|until| began.elapsed() >= until) {
            break;
        }
        let start_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3);
        // Each workload is its own SOCKS identity, so it gets its own
        // circuit (IsolateSOCKSAuth), as separate applications would.
        let auth = Some((w.name.as_str(), "onionlab"));
        let result = tokio::time::timeout(spec.transfer_timeout, async {
            match w.kind {
                WorkloadKind::Trace => traffic::replay(spec.socks, server, &w.trace, auth)
                    .await
                    .map(|t| (t, w.size)),
                WorkloadKind::Stream => {
                    crate::stream::stream(spec.socks, server, w.stream_duration, auth).await
                }
                _ => traffic::transfer(op, spec.socks, server, len, auth)
                    .await
                    .map(|t| (t, w.size)),
            }
        })
        .await;
        let mut rec = TransferRecord {
            workload: w.name.clone(),
            kind: format!("{:?}", w.kind).to_lowercase(),
            index,
            size: w.size,
            start_unix_ms,
            ..TransferRecord::default()
        };
        match result {
            Ok(Ok((t, size))) => {
                // A stream's size is what arrived.
                rec.size = size;
                rec.connect_ms = Some(ms(t.connect));
                rec.ttfb_ms = Some(ms(t.first_byte));
                rec.ttlb_ms = Some(ms(t.last_byte));
                rec.goodput_mib_s =
                    Some(size as f64 / 1048576.0 / t.last_byte.as_secs_f64().max(1e-9));
                rec.longest_gap_ms = Some(ms(t.longest_gap));
                // Quiet periods the schedule itself asks for are not stalls.
                let scheduled_gap = w
                    .trace
                    .windows(2)
                    .map(|p| p[1].0 - p[0].0)
                    .max()
                    .unwrap_or_default()
                    .max(w.probe_interval);
                rec.stalled = t.longest_gap > spec.stall_threshold + scheduled_gap;
                rec.probe_latency_ms = t.probe_latencies.iter().map(|d| ms(*d)).collect();
            }
            Ok(Err(e)) => rec.error = Some(e.to_string()),
            Err(_) => {
                rec.timed_out = true;
                rec.stalled = true;
                rec.error = Some(format!("not done after {:?}", spec.transfer_timeout));
            }
        }
        failed = rec.error.is_some();
        out.push(rec);
    }
    out
}

/// Run every workload of `spec` concurrently and write the records.
pub async fn run(spec: &AgentSpec) -> std::io::Result<usize> {
    let mut set = tokio::task::JoinSet::new();
    for (i, (w, server)) in spec.workloads.iter().enumerate() {
        let (spec, w, server) = (spec.clone(), w.clone(), *server);
        let seed = spec.seed.wrapping_add(i as u64 * 0x9E37_79B9);
        set.spawn(async move { (i, run_workload(&spec, &w, server, seed).await) });
    }
    let mut results = Vec::new();
    while let Some(r) = set.join_next().await {
        results.push(r.map_err(std::io::Error::other)?);
    }
    results.sort_by_key(|(i, _)| *i);
    let mut text = String::new();
    let mut n = 0;
    for rec in results.into_iter().flat_map(|(_, r)| r) {
        text.push_str(&serde_json::to_string(&rec).map_err(std::io::Error::other)?);
        text.push('\n');
        n += 1;
    }
    std::fs::write(&spec.out, text)?;
    Ok(n)
}

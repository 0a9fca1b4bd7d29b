//! Workloads: what a client's transfers do, as a scenario's
//! `[[workload]]` describes them and a variant may change them.

use std::time::Duration;

/// What a workload's transfers do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    /// The client requests `size` bytes (tgen-style).
    Download,
    /// The client sends `size` bytes.
    Upload,
    /// The client sends `size` bytes; the server echoes them (seed 000).
    Echo,
    /// The server streams timestamped probes; one-way latency per probe
    /// while other traffic runs (seed 002).
    Probe,
    /// The server replays a trace of message times and sizes; delay per
    /// message (seed 003).
    Trace,
    /// The server streams timestamped records as fast as the circuit
    /// takes them for `duration`; throughput and latency (seed 002's
    /// timestamp server).
    Stream,
}

/// One workload of a variant: transfers one after another.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Workload {
    /// Name in records and reports.
    pub name: String,
    /// What each transfer does.
    pub kind: WorkloadKind,
    /// Which client runs it.
    pub client: String,
    /// Which server it talks to.
    pub server: String,
    /// Bytes per transfer.
    pub size: u64,
    /// Transfers per repetition (at most, with `until`).
    pub count: u32,
    /// Pause between transfers: uniform in `[think_min, think_max]`.
    pub think_min: Duration,
    /// Upper end of the pause.
    pub think_max: Duration,
    /// Delay before the first transfer.
    pub start: Duration,
    /// No transfer starts this long or later after the agent's start
    /// (a workload that runs for a time, as Shadow's tgen clients do);
    /// `None`: `count` transfers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Duration>,
    /// Probe workloads: probes per transfer.
    #[serde(default)]
    pub probes: u32,
    /// Probe workloads: time between probes.
    #[serde(default)]
    pub probe_interval: Duration,
    /// Trace workloads: the schedule (offset, message bytes).
    #[serde(default)]
    pub trace: Vec<(Duration, u32)>,
    /// Stream workloads: how long the server streams.
    #[serde(default)]
    pub stream_duration: Duration,
}

/// Parse a size such as `320KiB`, `5 MiB`, `1MB` or `1000` (bytes).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let mult: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1048576.0,
        "GiB" => 1073741824.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        other => {
            return Err(format!(
                "invalid size {s:?}: unknown unit {other:?} (B, KiB, MiB, GiB, KB, MB, GB)"
            ))
        }
    };
    let v = num * mult;
    if !(v.is_finite() && (1.0..=1e12).contains(&v)) {
        return Err(format!("invalid size {s:?}: must be 1 byte to 1 TB"));
    }
    Ok(v.round() as u64)
}

//! The loopback benchmark's measurement: push data through the network
//! behind a SOCKS5 proxy and read goodput, latency and the CPU and memory
//! of the processes that carry it.
//!
//! [`measure`] only needs a SOCKS5 proxy and the PIDs of the processes to
//! watch, so the same code measures onionlab and any other onion proxy
//! (C tor, see `scripts/bench-ctor.sh`):
//!
//! 1. a 4 KiB warm-up download (builds the circuit);
//! 2. `small` downloads of [`SMALL_SIZE`], each on a new stream, for time
//!    to first byte and download time;
//! 3. one bulk download, with user+system CPU seconds of every watched
//!    process read from `/proc/PID/stat` right before and right after it,
//!    and each process's peak RSS (`VmHWM`) read after it.
//!
//! Every download comes from a workload server and every byte is checked
//! against the expected pattern. A run is one JSON line
//! ([`RunResult::to_json`], read back by [`RunResult::from_json`]).

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;

/// Size of each small download.
pub const SMALL_SIZE: u64 = 5 << 20;

/// One watched process's figures for one run.
#[derive(Debug, Clone)]
pub struct ProcessResult {
    /// Name given on the command line (or the node's nickname).
    pub name: String,
    /// Process ID.
    pub pid: u32,
    /// User+system CPU seconds spent during the bulk download.
    pub cpu_seconds: f64,
    /// The same per GiB downloaded.
    pub cpu_s_per_gib: f64,
    /// Peak resident memory over the process's life so far (VmHWM), MiB.
    pub peak_rss_mib: f64,
}

impl ProcessResult {
    /// CPU milliseconds per MiB downloaded.
    pub fn cpu_ms_per_mib(&self) -> f64 {
        self.cpu_s_per_gib * 1000.0 / 1024.0
    }
}

/// One run's measurements.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// Bytes of the bulk download.
    pub size: u64,
    /// Bulk download time, from SOCKS success to the last byte.
    pub bulk_seconds: f64,
    /// Bulk goodput, MiB/s.
    pub goodput_mib_s: f64,
    /// Per watched process.
    pub processes: Vec<ProcessResult>,
    /// Small downloads: SOCKS connect time (request to SOCKS success), ms.
    pub small_connect_ms: Vec<f64>,
    /// Small downloads: time to first byte after SOCKS success, ms.
    pub small_ttfb_ms: Vec<f64>,
    /// Small downloads: time to last byte after SOCKS success, ms.
    pub small_total_ms: Vec<f64>,
}

/// Median of `v` (NaN if empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn cpu_of(processes: &[(String, u32)]) -> std::result::Result<Vec<f64>, String> {
    processes
        .iter()
        .map(|(name, pid)| {
            crate::cpu_seconds(*pid)
                .ok_or_else(|| format!("cannot read /proc/{pid}/stat of {name} (not running?)"))
        })
        .collect()
}

/// Measure the network behind the SOCKS5 proxy `socks` once: warm-up,
/// `small` 5 MiB downloads, then one bulk download of `size` bytes with
/// the CPU of every process in `processes` (name, PID) read around it.
/// Downloads come from the workload server at `server`; every byte is
/// checked.
pub async fn measure(
    socks: SocketAddr,
    server: SocketAddr,
    processes: &[(String, u32)],
    size: u64,
    small: usize,
) -> std::result::Result<RunResult, String> {
    // Fail early on a wrong PID rather than after the downloads.
    cpu_of(processes)?;
    // Warm-up: builds the circuit.
    crate::download(socks, server, 4096, None)
        .await
        .map_err(|e| format!("warm-up download: {e}"))?;

    let mut small_connect_ms = Vec::with_capacity(small);
    let mut small_ttfb_ms = Vec::with_capacity(small);
    let mut small_total_ms = Vec::with_capacity(small);
    for i in 0..small {
        let t = crate::download(socks, server, SMALL_SIZE, None)
            .await
            .map_err(|e| format!("5 MiB download {i}: {e}"))?;
        small_connect_ms.push(t.connect.as_secs_f64() * 1e3);
        small_ttfb_ms.push(t.first_byte.as_secs_f64() * 1e3);
        small_total_ms.push(t.last_byte.as_secs_f64() * 1e3);
    }

    let before = cpu_of(processes)?;
    let t = crate::download(socks, server, size, None)
        .await
        .map_err(|e| format!("bulk download: {e}"))?;
    let after = cpu_of(processes)?;
    let gib = size as f64 / (1u64 << 30) as f64;
    let processes = processes
        .iter()
        .zip(before.iter().zip(&after))
        .map(|((name, pid), (b, a))| ProcessResult {
            name: name.clone(),
            pid: *pid,
            cpu_seconds: a - b,
            cpu_s_per_gib: (a - b) / gib,
            peak_rss_mib: onionlab_lab::process::peak_rss(*pid)
                .map_or(f64::NAN, |b| b as f64 / 1048576.0),
        })
        .collect();
    let bulk_seconds = t.last_byte.as_secs_f64();
    Ok(RunResult {
        size,
        bulk_seconds,
        goodput_mib_s: size as f64 / 1048576.0 / bulk_seconds,
        processes,
        small_connect_ms,
        small_ttfb_ms,
        small_total_ms,
    })
}

impl RunResult {
    /// The JSON object of run number `run` of benchmark `kind`, labelled `label`.
    pub fn to_json(&self, kind: &str, label: &str, run: usize) -> serde_json::Value {
        let r = self;
        let processes: Vec<serde_json::Value> = r
            .processes
            .iter()
            .map(|p| {
                json!({
                    "name": p.name,
                    "pid": p.pid,
                    "cpu_s": p.cpu_seconds,
                    "cpu_s_per_gib": p.cpu_s_per_gib,
                    "cpu_ms_per_mib": p.cpu_ms_per_mib(),
                    "peak_rss_mib": p.peak_rss_mib,
                })
            })
            .collect();
        let unix_time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        json!({
            "kind": kind,
            "label": label,
            "run": run,
            "unix_time": unix_time,
            "size_mib": r.size as f64 / 1048576.0,
            "bulk_s": r.bulk_seconds,
            "goodput_mib_s": r.goodput_mib_s,
            "processes": processes,
            "small": {
                "count": r.small_total_ms.len(),
                "size_mib": SMALL_SIZE as f64 / 1048576.0,
                "connect_ms": r.small_connect_ms,
                "ttfb_ms": r.small_ttfb_ms,
                "time_ms": r.small_total_ms,
                "connect_ms_median": median(r.small_connect_ms.clone()),
                "ttfb_ms_median": median(r.small_ttfb_ms.clone()),
                "time_ms_median": median(r.small_total_ms.clone()),
            },
        })
    }
    /// A run read back from a JSON line written by [`RunResult::to_json`],
    /// with its label.
    pub fn from_json(v: &serde_json::Value) -> Option<(String, RunResult)> {
        let num = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
        let processes = v["processes"]
            .as_array()?
            .iter()
            .map(|p| ProcessResult {
                name: p["name"].as_str().unwrap_or("?").to_string(),
                pid: p["pid"].as_u64().unwrap_or(0) as u32,
                cpu_seconds: num(&p["cpu_s"]),
                cpu_s_per_gib: num(&p["cpu_s_per_gib"]),
                peak_rss_mib: num(&p["peak_rss_mib"]),
            })
            .collect();
        let r = RunResult {
            size: (num(&v["size_mib"]) * 1048576.0) as u64,
            bulk_seconds: num(&v["bulk_s"]),
            goodput_mib_s: v["goodput_mib_s"].as_f64()?,
            processes,
            small_connect_ms: f64_list(&v["small"]["connect_ms"]),
            small_ttfb_ms: f64_list(&v["small"]["ttfb_ms"]),
            small_total_ms: f64_list(&v["small"]["time_ms"]),
        };
        Some((v["label"].as_str().unwrap_or("?").to_string(), r))
    }
}

fn f64_list(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_f64().unwrap_or(f64::NAN)).collect())
        .unwrap_or_default()
}

/// Medians over the runs of one JSON-lines file.
pub struct Medians {
    /// The runs' label.
    pub label: String,
    /// How many runs.
    pub runs: usize,
    /// Bulk download size, MiB.
    pub size_mib: f64,
    /// Bulk goodput, MiB/s.
    pub goodput_mib_s: f64,
    /// Per process name, in first-seen order: (CPU ms/MiB, peak RSS MiB).
    pub processes: Vec<(String, f64, f64)>,
    /// Small downloads over all runs.
    pub small: usize,
    /// Small downloads' SOCKS connect time, ms.
    pub connect_ms: f64,
    /// Small downloads' time to first byte, ms.
    pub ttfb_ms: f64,
    /// Small downloads' time to last byte, ms.
    pub time_ms: f64,
}

impl Medians {
    /// The medians of `runs`, labelled `label`.
    pub fn of(label: String, runs: &[RunResult]) -> Self {
        let mut names: Vec<String> = Vec::new();
        for p in runs.iter().flat_map(|r| &r.processes) {
            if !names.contains(&p.name) {
                names.push(p.name.clone());
            }
        }
        let per = |name: &str, f: fn(&ProcessResult) -> f64| {
            median(
                runs.iter()
                    .flat_map(|r| r.processes.iter().filter(|p| p.name == name).map(f))
                    .collect(),
            )
        };
        let processes = names
            .iter()
            .map(|n| {
                (
                    n.clone(),
                    per(n, ProcessResult::cpu_ms_per_mib),
                    per(n, |p| p.peak_rss_mib),
                )
            })
            .collect();
        let connect: Vec<f64> = runs
            .iter()
            .flat_map(|r| r.small_connect_ms.clone())
            .collect();
        let ttfb: Vec<f64> = runs.iter().flat_map(|r| r.small_ttfb_ms.clone()).collect();
        let time: Vec<f64> = runs.iter().flat_map(|r| r.small_total_ms.clone()).collect();
        Medians {
            label,
            runs: runs.len(),
            size_mib: median(runs.iter().map(|r| r.size as f64 / 1048576.0).collect()),
            goodput_mib_s: median(runs.iter().map(|r| r.goodput_mib_s).collect()),
            processes,
            small: time.len(),
            connect_ms: median(connect),
            ttfb_ms: median(ttfb),
            time_ms: median(time),
        }
    }

    /// One process's (name, CPU ms/MiB, peak RSS MiB).
    pub fn process(&self, name: &str) -> Option<&(String, f64, f64)> {
        self.processes.iter().find(|p| p.0 == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip() {
        let r = RunResult {
            size: 8 << 20,
            bulk_seconds: 0.5,
            goodput_mib_s: 16.0,
            processes: vec![ProcessResult {
                name: "relay0".into(),
                pid: 7,
                cpu_seconds: 0.08,
                cpu_s_per_gib: 10.24,
                peak_rss_mib: 9.5,
            }],
            small_connect_ms: vec![1.0],
            small_ttfb_ms: vec![2.0, 4.0],
            small_total_ms: vec![30.0, 50.0],
        };
        let v = r.to_json("socks", "tor", 3);
        assert_eq!(v["small"]["ttfb_ms_median"], 3.0);
        assert_eq!(v["processes"][0]["cpu_ms_per_mib"], 10.0);
        let text = v.to_string();
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        let (label, back) = RunResult::from_json(&back).unwrap();
        assert_eq!(label, "tor");
        assert_eq!(back.size, r.size);
        assert_eq!(back.small_total_ms, r.small_total_ms);
        assert_eq!(back.processes[0].name, "relay0");
        let m = Medians::of(label, &[back]);
        assert_eq!(m.process("relay0").map(|p| p.1), Some(10.0));
        assert_eq!(m.time_ms, 40.0);
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(Vec::new()).is_nan());
    }
}

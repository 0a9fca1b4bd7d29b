//! `onionlab bench`: push data through real relay processes on loopback
//! and report goodput, latency and CPU per process.
//!
//! The measurement itself ([`measure`]) only needs a SOCKS5 proxy and the
//! PIDs of the processes to watch, so the same code measures onionlab and
//! any other onion proxy (C tor, see `scripts/bench-ctor.sh`):
//!
//! 1. a 4 KiB warm-up download (builds the circuit);
//! 2. `--small-downloads` downloads of 5 MiB, each on a new stream, for
//!    time to first byte and download time;
//! 3. one bulk download of `--size-mib`, with user+system CPU seconds of
//!    every watched process read from `/proc/PID/stat` right before and
//!    right after it, and each process's peak RSS (`VmHWM`) read after it.
//!
//! Every download comes from an in-process workload server on 127.0.0.1
//! and every byte is checked against the expected pattern.
//!
//! `bench chain` starts a fresh onionlab network per run (three relays, a
//! client with the pinned path relay0 → relay1 → relay2) and measures it;
//! `bench socks` measures one already-running network once.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};
use onionlab::testnet::{self, LocalNetwork};
use serde_json::json;

use crate::cmd::runtime;
use crate::error::{Error, Result};

/// Size of the small downloads, in bytes.
const SMALL_SIZE: u64 = 5 << 20;

/// Benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Bulk download through a 3-hop chain of relay processes on loopback.
    Chain(ChainArgs),
    /// Measure one already-running network through its SOCKS5 port (one
    /// run), watching the CPU and memory of the given processes.
    Socks(SocksArgs),
    /// Medians of the runs in JSON-lines files written with `--json`; with
    /// two files, also a comparison table (ratios second / first).
    Report(ReportArgs),
    /// Start a private C tor network on loopback (an authority, three
    /// relays on one pinned path, a client) with the lab's C tor set-up;
    /// print `ready socks=... relay0=PID ...` once its client bootstrapped
    /// and keep it running until interrupted (scripts/bench-ctor.sh).
    CtorNetwork(crate::cmd::ctornet::CtorNetworkArgs),
}

/// What both commands measure per run.
#[derive(Args, Debug, Clone)]
pub struct WorkloadArgs {
    /// Bytes of the measured bulk download, in MiB.
    #[arg(long, default_value_t = 1024)]
    size_mib: u64,
    /// 5 MiB downloads per run for time-to-first-byte and download time
    /// (as in tor's reference figures); 0 to skip.
    #[arg(long, default_value_t = 20)]
    small_downloads: usize,
    /// Append one JSON object per run to this file (JSON lines).
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Arguments of `onionlab bench chain`.
#[derive(Args, Debug)]
pub struct ChainArgs {
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Number of runs (fresh processes each); medians are reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Label of the runs in the JSON output.
    #[arg(long, default_value = "onionlab")]
    label: String,
    /// Working directory for the networks and logs (default: a new
    /// directory under the system's temp dir).
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// Transport of every link: `auto` or a registered transport.
    #[arg(long, default_value = "tls",
          long_help = format!("Transport of every link.\n\n{}", onionlab_transport::registry::help_text()),
          value_parser = clap::builder::PossibleValuesParser::new(onionlab_transport::Choice::names()))]
    transport: String,
    /// Circuit-level flow control of the network: fixed or vegas.
    #[arg(long, default_value = "fixed", value_parser = ["fixed", "vegas"])]
    circuit_cc: String,
}

/// Arguments of `onionlab bench socks`.
#[derive(Args, Debug)]
pub struct SocksArgs {
    /// The SOCKS5 proxy (the network's client), e.g. 127.0.0.1:9050.
    #[arg(long)]
    socks: SocketAddr,
    /// A process to watch, as NAME=PID (repeatable), e.g. `relay0=1234`.
    #[arg(long = "process", value_parser = parse_process)]
    processes: Vec<(String, u32)>,
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Label of the run in the output and the JSON.
    #[arg(long, default_value = "socks")]
    label: String,
    /// Run number recorded in the JSON (for scripts calling this per run).
    #[arg(long, default_value_t = 0)]
    run: usize,
}

/// Arguments of `onionlab bench report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// One or two JSON-lines files (the reference first).
    #[arg(required = true, num_args = 1..=2)]
    files: Vec<PathBuf>,
}

fn parse_process(s: &str) -> std::result::Result<(String, u32), String> {
    let (name, pid) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=PID, got {s:?}"))?;
    let pid: u32 = pid
        .trim()
        .parse()
        .map_err(|e| format!("bad PID in {s:?}: {e}"))?;
    if name.is_empty() {
        return Err(format!("empty process name in {s:?}"));
    }
    Ok((name.to_string(), pid))
}

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

fn median(mut v: Vec<f64>) -> f64 {
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
            testnet::cpu_seconds(*pid)
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
    testnet::download(socks, server, 4096, None)
        .await
        .map_err(|e| format!("warm-up download: {e}"))?;

    let mut small_connect_ms = Vec::with_capacity(small);
    let mut small_ttfb_ms = Vec::with_capacity(small);
    let mut small_total_ms = Vec::with_capacity(small);
    for i in 0..small {
        let t = testnet::download(socks, server, SMALL_SIZE, None)
            .await
            .map_err(|e| format!("5 MiB download {i}: {e}"))?;
        small_connect_ms.push(t.connect.as_secs_f64() * 1e3);
        small_ttfb_ms.push(t.first_byte.as_secs_f64() * 1e3);
        small_total_ms.push(t.last_byte.as_secs_f64() * 1e3);
    }

    let before = cpu_of(processes)?;
    let t = testnet::download(socks, server, size, None)
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

/// Run a benchmark command.
pub fn run(cmd: BenchCommand) -> Result<ExitCode> {
    match cmd {
        BenchCommand::Chain(args) => chain(args),
        BenchCommand::Socks(args) => socks(args),
        BenchCommand::Report(args) => report(args),
        BenchCommand::CtorNetwork(args) => crate::cmd::ctornet::run(args),
    }
}

/// The JSON object of one run.
fn run_json(kind: &str, label: &str, run: usize, r: &RunResult) -> serde_json::Value {
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

fn append_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let write_err = |source| Error::Write {
        path: path.display().to_string(),
        source,
    };
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(write_err)?;
    writeln!(f, "{value}").map_err(write_err)
}

fn print_run(prefix: &str, r: &RunResult) {
    let cpu: Vec<String> = r
        .processes
        .iter()
        .map(|p| format!("{} {:.2}", p.name, p.cpu_s_per_gib))
        .collect();
    println!(
        "{prefix}: {:.1} MiB/s; CPU-s per GiB: {}; 5 MiB: TTFB {:.1} ms, total {:.1} ms (medians)",
        r.goodput_mib_s,
        cpu.join(", "),
        median(r.small_ttfb_ms.clone()),
        median(r.small_total_ms.clone()),
    );
}

fn print_summary(results: &[RunResult], small: usize) {
    println!();
    println!("medians over {} runs:", results.len());
    println!(
        "  goodput             {:8.1} MiB/s",
        median(results.iter().map(|r| r.goodput_mib_s).collect())
    );
    if let Some(first) = results.first() {
        for (i, p) in first.processes.iter().enumerate() {
            let cpu = median(
                results
                    .iter()
                    .map(|r| r.processes[i].cpu_s_per_gib)
                    .collect(),
            );
            println!(
                "  {:<8} CPU       {:8.2} s/GiB  ({:.2} ms/MiB); peak RSS {:.1} MiB",
                p.name,
                cpu,
                cpu * 1000.0 / 1024.0,
                median(
                    results
                        .iter()
                        .map(|r| r.processes[i].peak_rss_mib)
                        .collect()
                ),
            );
        }
    }
    if small > 0 {
        let all_ttfb: Vec<f64> = results
            .iter()
            .flat_map(|r| r.small_ttfb_ms.clone())
            .collect();
        let all_total: Vec<f64> = results
            .iter()
            .flat_map(|r| r.small_total_ms.clone())
            .collect();
        println!(
            "  5 MiB downloads     TTFB {:.1} ms, download time {:.1} ms (medians of {})",
            median(all_ttfb),
            median(all_total.clone()),
            all_total.len()
        );
    }
}

fn chain(args: ChainArgs) -> Result<ExitCode> {
    let bin = std::env::current_exe()
        .map_err(|e| Error::Usage(format!("finding onionlab's own path: {e}")))?;
    let workdir = args.workdir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("onionlab-bench-{}", std::process::id()))
    });
    let w = &args.workload;
    let size = w.size_mib * 1024 * 1024;
    println!(
        "bench chain: {} run(s) of {} MiB through relay0 -> relay1 -> relay2 on loopback ({})",
        args.runs,
        w.size_mib,
        workdir.display()
    );
    let rt = runtime::multi_thread()?;
    let mut results = Vec::new();
    for run in 0..args.runs {
        let dir = workdir.join(format!("run-{run}"));
        // On SIGINT/SIGTERM the run's future is dropped, which stops its
        // processes (LocalNetwork's Drop).
        let r = rt.block_on(async {
            tokio::select! {
                r = one_chain_run(&bin, &dir, &args, size) => r,
                () = runtime::shutdown_signal() => {
                    Err(Error::Usage("bench: interrupted".into()))
                }
            }
        })?;
        print_run(&format!("run {run}"), &r);
        if let Some(path) = &w.json {
            append_json(path, &run_json("chain", &args.label, run, &r))?;
        }
        results.push(r);
    }
    print_summary(&results, w.small_downloads);
    Ok(ExitCode::SUCCESS)
}

async fn one_chain_run(bin: &Path, dir: &Path, args: &ChainArgs, size: u64) -> Result<RunResult> {
    let (transport, small) = (&args.transport, args.workload.small_downloads);
    let fail = |e: String| Error::Usage(format!("bench: {e}"));
    if dir.exists() {
        std::fs::remove_dir_all(dir)
            .map_err(|e| fail(format!("clearing {}: {e}", dir.display())))?;
    }
    let mut net = LocalNetwork::init_with(bin, dir, 3, 1, &["--circuit-cc", &args.circuit_cc])
        .map_err(|e| fail(e.to_string()))?;
    net.set_transport(transport)
        .map_err(|e| fail(e.to_string()))?;
    net.set_log_filter("warn");
    net.start_relays().map_err(|e| fail(e.to_string()))?;
    net.start_client(Some(&["relay0", "relay1", "relay2"]), "")
        .map_err(|e| fail(e.to_string()))?;
    let server = testnet::workload_server()
        .await
        .map_err(|e| fail(format!("workload server: {e}")))?;
    let processes: Vec<(String, u32)> = net
        .relays
        .iter()
        .chain(net.client.iter())
        .filter_map(|p| Some((p.name.clone(), p.pid()?)))
        .collect();
    let r = measure(net.socks_addr(), server, &processes, size, small)
        .await
        .map_err(fail)?;
    net.stop();
    // Give sockets a moment to close before the next run.
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(r)
}

fn socks(args: SocksArgs) -> Result<ExitCode> {
    let w = &args.workload;
    let size = w.size_mib * 1024 * 1024;
    let names: Vec<&str> = args.processes.iter().map(|(n, _)| n.as_str()).collect();
    println!(
        "bench socks ({}): 1 run of {} MiB through SOCKS {}; watching {}",
        args.label,
        w.size_mib,
        args.socks,
        if names.is_empty() {
            "no processes".to_string()
        } else {
            names.join(", ")
        }
    );
    let rt = runtime::multi_thread()?;
    let r = rt
        .block_on(async {
            let server = testnet::workload_server()
                .await
                .map_err(|e| format!("workload server: {e}"))?;
            measure(args.socks, server, &args.processes, size, w.small_downloads).await
        })
        .map_err(|e| Error::Usage(format!("bench: {e}")))?;
    print_run(&args.label, &r);
    if let Some(path) = &w.json {
        append_json(path, &run_json("socks", &args.label, args.run, &r))?;
    }
    print_summary(std::slice::from_ref(&r), w.small_downloads);
    Ok(ExitCode::SUCCESS)
}

fn f64_list(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_f64().unwrap_or(f64::NAN)).collect())
        .unwrap_or_default()
}

/// One run read back from a JSON line written by [`run_json`], with its
/// label.
fn run_from_json(v: &serde_json::Value) -> Option<(String, RunResult)> {
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

/// Medians over the runs of one JSON-lines file.
struct Medians {
    label: String,
    runs: usize,
    size_mib: f64,
    goodput_mib_s: f64,
    /// Per process name, in first-seen order: (CPU ms/MiB, peak RSS MiB).
    processes: Vec<(String, f64, f64)>,
    small: usize,
    connect_ms: f64,
    ttfb_ms: f64,
    time_ms: f64,
}

impl Medians {
    fn of(label: String, runs: &[RunResult]) -> Self {
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

    fn process(&self, name: &str) -> Option<&(String, f64, f64)> {
        self.processes.iter().find(|p| p.0 == name)
    }
}

fn report(args: ReportArgs) -> Result<ExitCode> {
    let mut all = Vec::new();
    for path in &args.files {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Usage(format!("reading {}: {e}", path.display())))?;
        let mut label = None;
        let mut runs = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let (l, r) = serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .as_ref()
                .and_then(run_from_json)
                .ok_or_else(|| {
                    Error::Usage(format!("{}:{}: not a bench run", path.display(), i + 1))
                })?;
            label.get_or_insert(l);
            runs.push(r);
        }
        if runs.is_empty() {
            return Err(Error::Usage(format!("{}: no runs", path.display())));
        }
        let label = label.unwrap_or_default();
        println!("== {label} ({})", path.display());
        let small = runs
            .iter()
            .map(|r| r.small_total_ms.len())
            .max()
            .unwrap_or(0);
        print_summary(&runs, small);
        println!();
        all.push(Medians::of(label, &runs));
    }
    if let [a, b] = &all[..] {
        print_comparison(a, b);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_comparison(a: &Medians, b: &Medians) {
    println!(
        "comparison: medians over runs ({} run(s) of {:.0} MiB vs {} run(s) of {:.0} MiB); ratio = {} / {}",
        a.runs, a.size_mib, b.runs, b.size_mib, b.label, a.label
    );
    let cell = |v: f64, width: usize| {
        if v.is_finite() {
            format!("{v:>width$.2}")
        } else {
            format!("{:>width$}", "-")
        }
    };
    let row = |what: &str, x: f64, y: f64| {
        println!(
            "  {what:<28} {} {} {}",
            cell(x, 10),
            cell(y, 10),
            cell(y / x, 8)
        );
    };
    println!(
        "  {:<28} {:>10} {:>10} {:>8}",
        "", a.label, b.label, "ratio"
    );
    row("goodput (MiB/s)", a.goodput_mib_s, b.goodput_mib_s);
    let mut names: Vec<&str> = a.processes.iter().map(|p| p.0.as_str()).collect();
    for p in &b.processes {
        if !names.contains(&p.0.as_str()) {
            names.push(&p.0);
        }
    }
    let value = |m: &Medians, n: &str, rss: bool| {
        m.process(n)
            .map_or(f64::NAN, |p| if rss { p.2 } else { p.1 })
    };
    for n in &names {
        row(
            &format!("{n} CPU (ms/MiB)"),
            value(a, n, false),
            value(b, n, false),
        );
    }
    for n in &names {
        row(
            &format!("{n} peak RSS (MiB)"),
            value(a, n, true),
            value(b, n, true),
        );
    }
    if a.small > 0 || b.small > 0 {
        row("5 MiB SOCKS connect (ms)", a.connect_ms, b.connect_ms);
        row("5 MiB TTFB (ms)", a.ttfb_ms, b.ttfb_ms);
        row("5 MiB download time (ms)", a.time_ms, b.time_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_processes() {
        assert_eq!(parse_process("relay0=42"), Ok(("relay0".into(), 42)));
        assert!(parse_process("relay0").is_err());
        assert!(parse_process("=42").is_err());
        assert!(parse_process("x=-1").is_err());
    }

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
        let v = run_json("socks", "tor", 3, &r);
        assert_eq!(v["small"]["ttfb_ms_median"], 3.0);
        assert_eq!(v["processes"][0]["cpu_ms_per_mib"], 10.0);
        let text = v.to_string();
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        let (label, back) = run_from_json(&back).unwrap();
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

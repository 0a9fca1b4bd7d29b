//! `onionlab bench`: push data through real relay processes on loopback
//! and report goodput, latency and CPU per process.
//!
//! The measurement itself (`onionlab_testnet::bench::measure`) only needs a
//! SOCKS5 proxy and the PIDs of the processes to watch, so the same code
//! measures onionlab and any other onion proxy (C tor, see
//! `scripts/bench-ctor.sh`):
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
use std::time::Duration;

use clap::{Args, Subcommand};
use onionlab_testnet::bench::{measure, median, Medians, RunResult};
use onionlab_testnet::{self as testnet, LocalNetwork};

use crate::cmd::runtime;
use crate::error::{Error, Result};

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

/// Run a benchmark command.
pub fn run(cmd: BenchCommand) -> Result<ExitCode> {
    match cmd {
        BenchCommand::Chain(args) => chain(args),
        BenchCommand::Socks(args) => socks(args),
        BenchCommand::Report(args) => report(args),
        BenchCommand::CtorNetwork(args) => crate::cmd::ctornet::run(args),
    }
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
            append_json(path, &r.to_json("chain", &args.label, run))?;
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
        append_json(path, &r.to_json("socks", &args.label, args.run))?;
    }
    print_summary(std::slice::from_ref(&r), w.small_downloads);
    Ok(ExitCode::SUCCESS)
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
                .and_then(RunResult::from_json)
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
}

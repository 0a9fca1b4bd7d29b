//! `onionlab bench chain`: push bulk data through a 3-hop chain of real
//! relay processes on loopback and report goodput and CPU per relay.
//!
//! Each run starts a fresh network (`network init`, three relays, a client
//! with the pinned path relay0 → relay1 → relay2), builds the circuit with
//! a small warm-up download, then downloads `--size` bytes from a local
//! server through SOCKS, checking every byte. CPU seconds of each process
//! are read from `/proc` around the measured download only.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use onionlab::testnet::{self, LocalNetwork};

use crate::cmd::runtime;
use crate::error::{Error, Result};

/// Benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Bulk download through a 3-hop chain of relay processes on loopback.
    Chain(ChainArgs),
}

/// Arguments of `onionlab bench chain`.
#[derive(Args, Debug)]
pub struct ChainArgs {
    /// Bytes per measured download, in MiB.
    #[arg(long, default_value_t = 1024)]
    size_mib: u64,
    /// Number of runs (fresh processes each); medians are reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// 5 MiB downloads per run for time-to-first-byte and download time
    /// (as in tor's reference figures); 0 to skip.
    #[arg(long, default_value_t = 20)]
    small_downloads: usize,
    /// Working directory for the networks and logs (default: a new
    /// directory under the system's temp dir).
    #[arg(long)]
    workdir: Option<PathBuf>,
}

/// One run's measurements.
struct RunResult {
    goodput_mib_s: f64,
    cpu_per_gib: Vec<(String, f64)>,
    peak_rss_mib: Vec<(String, f64)>,
    small_ttfb_ms: Vec<f64>,
    small_total_ms: Vec<f64>,
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

/// Run a benchmark command.
pub fn run(cmd: BenchCommand) -> Result<ExitCode> {
    match cmd {
        BenchCommand::Chain(args) => chain(args),
    }
}

fn chain(args: ChainArgs) -> Result<ExitCode> {
    let bin = std::env::current_exe()
        .map_err(|e| Error::Usage(format!("finding onionlab's own path: {e}")))?;
    let workdir = args.workdir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("onionlab-bench-{}", std::process::id()))
    });
    let size = args.size_mib * 1024 * 1024;
    println!(
        "bench chain: {} run(s) of {} MiB through relay0 -> relay1 -> relay2 on loopback ({})",
        args.runs,
        args.size_mib,
        workdir.display()
    );
    let rt = runtime::multi_thread()?;
    let mut results = Vec::new();
    for run in 0..args.runs {
        let dir = workdir.join(format!("run-{run}"));
        let r = rt.block_on(one_run(&bin, &dir, size, args.small_downloads))?;
        let cpu: Vec<String> = r
            .cpu_per_gib
            .iter()
            .map(|(n, c)| format!("{n} {c:.2}"))
            .collect();
        println!(
            "run {run}: {:.1} MiB/s; CPU-s per GiB: {}; 5 MiB: TTFB {:.1} ms, total {:.1} ms (medians)",
            r.goodput_mib_s,
            cpu.join(", "),
            median(r.small_ttfb_ms.clone()),
            median(r.small_total_ms.clone()),
        );
        results.push(r);
    }
    println!();
    println!("medians over {} runs:", results.len());
    println!(
        "  goodput             {:8.1} MiB/s",
        median(results.iter().map(|r| r.goodput_mib_s).collect())
    );
    if let Some(first) = results.first() {
        for (i, (name, _)) in first.cpu_per_gib.iter().enumerate() {
            println!(
                "  {name:<8} CPU       {:8.2} s/GiB  ({:.2} ms/MiB); peak RSS {:.1} MiB",
                median(results.iter().map(|r| r.cpu_per_gib[i].1).collect()),
                median(results.iter().map(|r| r.cpu_per_gib[i].1).collect()) * 1000.0 / 1024.0,
                median(results.iter().map(|r| r.peak_rss_mib[i].1).collect()),
            );
        }
    }
    if args.small_downloads > 0 {
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
    Ok(ExitCode::SUCCESS)
}

async fn one_run(
    bin: &std::path::Path,
    dir: &std::path::Path,
    size: u64,
    small: usize,
) -> Result<RunResult> {
    let fail = |e: String| Error::Usage(format!("bench: {e}"));
    if dir.exists() {
        std::fs::remove_dir_all(dir)
            .map_err(|e| fail(format!("clearing {}: {e}", dir.display())))?;
    }
    let mut net = LocalNetwork::init(bin, dir, 3, 1).map_err(|e| fail(e.to_string()))?;
    net.set_log_filter("warn");
    net.start_relays().map_err(|e| fail(e.to_string()))?;
    net.start_client(Some(&["relay0", "relay1", "relay2"]), "")
        .map_err(|e| fail(e.to_string()))?;
    let server = testnet::workload_server()
        .await
        .map_err(|e| fail(format!("workload server: {e}")))?;
    let socks = net.socks_addr();
    // Warm-up: builds the circuit.
    testnet::download(socks, server, 4096, None)
        .await
        .map_err(fail)?;

    let mut small_ttfb_ms = Vec::new();
    let mut small_total_ms = Vec::new();
    for _ in 0..small {
        let t = testnet::download(socks, server, 5 << 20, None)
            .await
            .map_err(fail)?;
        small_ttfb_ms.push(t.first_byte.as_secs_f64() * 1e3);
        small_total_ms.push(t.last_byte.as_secs_f64() * 1e3);
    }

    let procs: Vec<&testnet::NodeProcess> = net.relays.iter().chain(net.client.iter()).collect();
    let before: Vec<f64> = procs
        .iter()
        .map(|p| p.cpu_seconds().unwrap_or(f64::NAN))
        .collect();
    let t = testnet::download(socks, server, size, None)
        .await
        .map_err(fail)?;
    let after: Vec<f64> = procs
        .iter()
        .map(|p| p.cpu_seconds().unwrap_or(f64::NAN))
        .collect();
    let gib = size as f64 / (1u64 << 30) as f64;
    let cpu_per_gib = procs
        .iter()
        .zip(before.iter().zip(&after))
        .map(|(p, (b, a))| (p.name.clone(), (a - b) / gib))
        .collect();
    let peak_rss_mib = procs
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                p.peak_rss_bytes().unwrap_or(0) as f64 / 1048576.0,
            )
        })
        .collect();
    net.stop();
    // Give sockets a moment to close before the next run.
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(RunResult {
        goodput_mib_s: size as f64 / 1048576.0 / t.last_byte.as_secs_f64(),
        cpu_per_gib,
        peak_rss_mib,
        small_ttfb_ms,
        small_total_ms,
    })
}

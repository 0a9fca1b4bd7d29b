//! `onionlab schedulers`: a bulk download and a light ping stream share
//! every channel of a 3-hop path on the deterministic in-memory network,
//! once per circuit scheduler.

use std::time::Duration;

use clap::Args;
use onionlab_circuit::scheduler::SchedulerKind;
use onionlab_sim::demo::{self, DemoConfig};

use crate::error::{Error, Result};

/// Options of `onionlab schedulers`.
#[derive(Args, Debug)]
pub struct SchedulersArgs {
    /// MiB the bulk circuit downloads (checked byte for byte).
    #[arg(long, default_value_t = 64)]
    bulk_mib: usize,
    /// Seed of the simulated network.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Simulated milliseconds between pings on the light circuit.
    #[arg(long, default_value_t = 20)]
    ping_interval_ms: u64,
}

/// Run the comparison and print a table.
pub fn run(args: SchedulersArgs) -> Result<std::process::ExitCode> {
    let config = DemoConfig {
        seed: args.seed,
        bulk_bytes: args.bulk_mib * 1024 * 1024,
        ping_interval: Duration::from_millis(args.ping_interval_ms),
        ..DemoConfig::default()
    };
    println!(
        "onionlab schedulers: in-memory 3-hop network (simulated time, seed {}), \
         {} MiB bulk download + {}-byte pings every {} ms on a second circuit \
         sharing every channel",
        config.seed, args.bulk_mib, config.ping_bytes, args.ping_interval_ms
    );
    let mut reports = Vec::new();
    for scheduler in [
        SchedulerKind::RoundRobin,
        SchedulerKind::Ewma {
            half_life: Duration::from_secs(30),
        },
    ] {
        let r = demo::run(&config, scheduler)
            .map_err(|e| Error::Usage(format!("scheduler comparison failed: {e}")))?;
        reports.push(r);
    }
    println!();
    println!(
        "| scheduler | bulk goodput (MiB/s, simulated) | ping RTT p50 / p90 / max (ms, simulated) | pings | wall-clock throughput (MiB/s through 3 hops) |"
    );
    println!("|---|---|---|---|---|");
    for r in &reports {
        println!(
            "| {} | {:.1} | {} / {} / {} | {} | {:.1} |",
            name(r.scheduler),
            r.bulk_goodput_sim(),
            ms(r.ping_quantile(0.5)),
            ms(r.ping_quantile(0.9)),
            ms(r.ping_quantile(1.0)),
            r.ping_rtts.len(),
            r.wall_throughput()
        );
    }
    println!();
    println!(
        "Every bulk byte was checked against its generator. Channel capacity here is the \
         simulator's per-tick burst limit, not a real link: per-circuit queues already keep \
         the light circuit out of the bulk queue, and the transport-level head-of-line effects \
         the papers study need the emulated network (onionlab netem) and real transports."
    );
    Ok(std::process::ExitCode::SUCCESS)
}

fn name(s: SchedulerKind) -> String {
    match s {
        SchedulerKind::RoundRobin => "round robin".into(),
        SchedulerKind::Ewma { half_life } => format!("EWMA (half-life {} s)", half_life.as_secs()),
    }
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.2}", d.as_secs_f64() * 1000.0))
}

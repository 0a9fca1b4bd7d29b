//! `onionlab bench ctor-network`: a private C tor network on loopback,
//! set up by the lab's C tor code (`onionlab_lab::ctor`), for
//! `scripts/bench-ctor.sh` to measure with `onionlab bench socks`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use onionlab_lab::ctor::{self, NetPlan, Place};

use crate::error::{Error, Result};

/// Arguments of `onionlab bench ctor-network`.
#[derive(Args, Debug)]
pub struct CtorNetworkArgs {
    /// Directory for the network's keys, configurations and logs
    /// (`DIR/ctor/...`).
    #[arg(long)]
    dir: PathBuf,
    /// Circuit congestion control of the network: fixed (SENDME windows)
    /// or vegas (proposal 324, C tor's default).
    #[arg(long, default_value = "fixed", value_parser = ["fixed", "vegas"])]
    circuit_cc: String,
}

/// Start the network, print one line once its client bootstrapped, and
/// keep it running until SIGINT or SIGTERM (then every tor stops):
///
/// `ready socks=ADDR control=ADDR cookie=PATH relay0=PID relay1=PID relay2=PID client=PID auth=PID`
pub fn run(args: CtorNetworkArgs) -> Result<ExitCode> {
    let version = ctor::tor_version().map_err(|e| Error::Usage(e.to_string()))?;
    eprintln!("{version}: starting a network in {}", args.dir.display());
    // Before the network starts: a signal during its bootstrap must still
    // stop the tors (they also die with this process: PR_SET_PDEATHSIG).
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| Error::Usage(format!("installing a signal handler: {e}")))?;
    }
    let plan = NetPlan::chain(args.circuit_cc == "vegas");
    let status = |s: &str| eprintln!("{s}");
    let place = Place::Loopback(ctor::PortPool::default());
    let mut network = ctor::start(&place, &plan, &args.dir, None, &status)
        .map_err(|e| Error::Usage(format!("bench ctor-network: {e}")))?;
    if stop.load(Ordering::Relaxed) {
        return Ok(ExitCode::FAILURE);
    }
    let mut line = format!("ready socks={}", network.socks[0]);
    if let Some((addr, cookie)) = &network.control[0] {
        line.push_str(&format!(" control={addr} cookie={}", cookie.display()));
    }
    for (p, host) in &network.relays {
        line.push_str(&format!(" {host}={}", p.pid()));
    }
    line.push_str(&format!(
        " client={} auth={}",
        network.clients[0].0.pid(),
        network.authority.pid()
    ));
    let mut out = std::io::stdout();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| Error::Usage(format!("writing to stdout: {e}")))?;
    while !stop.load(Ordering::Relaxed) {
        if let Some(why) = ctor::exited(&mut network) {
            return Err(Error::Usage(format!("bench ctor-network: {why}")));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(network);
    Ok(ExitCode::SUCCESS)
}

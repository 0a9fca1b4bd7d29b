//! `onionlab netem ...`: bring an emulated network up and down, run commands
//! in its hosts, change links at run time.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use onionlab_netem::control::{self, ControlServer, Request};
use onionlab_netem::netns::{self, LabState};
use onionlab_netem::units::{parse_duration, parse_probability};
use onionlab_netem::{
    ForwarderOptions, HostUpdate, LossModel, Network, NetworkOptions, PathUpdate, QueueLimit, Rate,
    Topology,
};

use crate::error::{Error, Result};

/// Subcommands of `onionlab netem`.
#[derive(Subcommand, Debug)]
pub enum NetCommand {
    /// Create the network of TOPOLOGY and run it until Ctrl-C or `netem down`.
    Up(UpArgs),
    /// Run a command inside a host's namespace (like `ip netns exec`).
    Exec(ExecArgs),
    /// Change a path (`netem set A B ...`) or a host's access links (`netem set A --up ...`).
    Set(SetArgs),
    /// Stop a running network (or remove what a crashed one left behind).
    Down(LabArg),
    /// Show the hosts and current counters of a running network.
    Status(LabArg),
}

/// Selects a lab.
#[derive(Args, Debug)]
pub struct LabArg {
    /// Lab name (the topology's `name`); optional if only one lab runs.
    #[arg(long)]
    lab: Option<String>,
    /// State directory (default /run/onionlab/LAB, or per-user when not root).
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

/// Arguments of `netem up`.
#[derive(Args, Debug)]
pub struct UpArgs {
    /// Topology file (TOML, see docs/netem.md).
    topology: PathBuf,
    /// Override the lab name of the topology.
    #[arg(long)]
    lab: Option<String>,
    /// Override the topology's seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Where to write the counters (JSON) at the end [default: LAB.counters.json].
    #[arg(long)]
    counters: Option<PathBuf>,
    /// State directory (default /run/onionlab/LAB, or per-user when not root).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Busy-wait when the next packet release is closer than this.
    #[arg(long, value_parser = parse_duration, default_value = "50us")]
    spin: Duration,
    /// Do not run the forwarder thread with SCHED_FIFO priority.
    #[arg(long)]
    no_realtime: bool,
}

/// Arguments of `netem exec`.
#[derive(Args, Debug)]
pub struct ExecArgs {
    #[command(flatten)]
    lab: LabArg,
    /// Host to run in.
    host: String,
    /// Command and arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Arguments of `netem set`.
#[derive(Args, Debug)]
pub struct SetArgs {
    #[command(flatten)]
    lab: LabArg,
    /// Host A.
    a: String,
    /// Host B: if given, the path A<->B changes; otherwise A's access links.
    b: Option<String>,
    /// Only change A -> B.
    #[arg(long)]
    oneway: bool,
    /// One-way latency, e.g. 20ms.
    #[arg(long, value_parser = parse_duration)]
    latency: Option<Duration>,
    /// Jitter, e.g. 2ms.
    #[arg(long, value_parser = parse_duration)]
    jitter: Option<Duration>,
    /// Loss: 0.01, 1%, ge:RATE:BURST (e.g. ge:1%:4) or ge:p,r,loss_good,loss_bad.
    #[arg(long, value_parser = LossModel::parse)]
    loss: Option<LossModel>,
    /// Reordering probability.
    #[arg(long, value_parser = parse_probability)]
    reorder: Option<f64>,
    /// Extra delay of reordered packets.
    #[arg(long, value_parser = parse_duration)]
    reorder_delay: Option<Duration>,
    /// Path bottleneck rate (with B) e.g. 10Mbit or unlimited.
    #[arg(long, value_parser = Rate::parse)]
    rate: Option<Rate>,
    /// Queue limit of the path bottleneck (with B), e.g. "100 packets", 64KiB, 50ms.
    #[arg(long, value_parser = QueueLimit::parse)]
    queue: Option<QueueLimit>,
    /// Cut the path.
    #[arg(long, conflicts_with = "restore")]
    cut: bool,
    /// Restore a cut path.
    #[arg(long)]
    restore: bool,
    /// Uplink rate of host A (without B).
    #[arg(long, value_parser = Rate::parse)]
    up: Option<Rate>,
    /// Downlink rate of host A (without B).
    #[arg(long, value_parser = Rate::parse)]
    down: Option<Rate>,
    /// Uplink queue of host A (without B).
    #[arg(long, value_parser = QueueLimit::parse)]
    up_queue: Option<QueueLimit>,
    /// Downlink queue of host A (without B).
    #[arg(long, value_parser = QueueLimit::parse)]
    down_queue: Option<QueueLimit>,
}

/// Runs a `net` subcommand.
pub fn run(cmd: NetCommand) -> Result<ExitCode> {
    match cmd {
        NetCommand::Up(a) => up(a),
        NetCommand::Exec(a) => exec(a),
        NetCommand::Set(a) => set(a),
        NetCommand::Down(a) => down(a),
        NetCommand::Status(a) => status(a),
    }
}

fn up(args: UpArgs) -> Result<ExitCode> {
    let mut topology = Topology::from_file(&args.topology)?;
    if let Some(l) = &args.lab {
        if !onionlab_netem::topology::valid_name(l) {
            return Err(Error::Usage(format!("bad lab name {l:?}")));
        }
        topology.name = l.clone();
    }
    let lab = topology.name.clone();
    // Decided before entering a user namespace, where getuid() would say 0.
    let state_dir = args
        .state_dir
        .clone()
        .unwrap_or_else(|| netns::default_state_dir(&lab));
    let counters_path = args
        .counters
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{lab}.counters.json")));
    let counters_path = std::env::current_dir()
        .map(|d| d.join(&counters_path))
        .unwrap_or(counters_path);
    if is_unprivileged() {
        tracing::info!("not root: entering an unprivileged user namespace (rootless mode)");
        netns::enter_rootless_userns()?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(sig, stop.clone()).map_err(Error::Signal)?;
    }
    let net = Network::up(
        topology,
        NetworkOptions {
            state_dir: Some(state_dir.clone()),
            forwarder: ForwarderOptions {
                spin: args.spin,
                realtime: !args.no_realtime,
                ..ForwarderOptions::default()
            },
            seed: args.seed,
        },
    )?;
    let server = ControlServer::bind(&state_dir)?;
    for h in &net.topology().hosts {
        println!(
            "{}\t{}\t{}",
            h.name,
            h.address,
            netns::ns_name(&lab, &h.name)
        );
    }
    println!("ready: lab {lab} (stop with Ctrl-C or `onionlab netem down --lab {lab}`)");
    let mut failed = false;
    while !stop.load(Ordering::Relaxed) {
        if server.poll(&net) {
            break;
        }
        if !net.is_running() {
            tracing::error!("the forwarder stopped unexpectedly");
            failed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(server);
    let counters = net.shutdown()?;
    let text = serde_json::to_string_pretty(&counters).map_err(|e| Error::Usage(e.to_string()))?;
    std::fs::write(&counters_path, text).map_err(|source| Error::Write {
        path: counters_path.display().to_string(),
        source,
    })?;
    println!("counters written to {}", counters_path.display());
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn is_unprivileged() -> bool {
    !nix::unistd::geteuid().is_root()
}

/// Finds the state directory of the selected lab.
fn resolve_lab(arg: &LabArg) -> Result<(String, PathBuf)> {
    if let Some(lab) = &arg.lab {
        let dir = arg
            .state_dir
            .clone()
            .unwrap_or_else(|| netns::default_state_dir(lab));
        return Ok((lab.clone(), dir));
    }
    if let Some(dir) = &arg.state_dir {
        let state = LabState::load(dir)?
            .ok_or_else(|| Error::Usage(format!("no lab state in {}", dir.display())))?;
        return Ok((state.lab, dir.clone()));
    }
    let root = netns::default_state_dir("x");
    let root = root.parent().unwrap_or(Path::new("/run/onionlab"));
    let labs: Vec<String> = std::fs::read_dir(root)
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().join(LabState::FILE).exists())
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default();
    match labs.as_slice() {
        [one] => Ok((one.clone(), root.join(one))),
        [] => Err(Error::Usage("no running lab found; pass --lab".into())),
        _ => Err(Error::Usage(format!(
            "several labs run ({}); pass --lab",
            labs.join(", ")
        ))),
    }
}

fn running_state(arg: &LabArg) -> Result<(String, PathBuf, LabState)> {
    let (lab, dir) = resolve_lab(arg)?;
    let state =
        LabState::load(&dir)?.ok_or_else(|| onionlab_netem::Error::NotRunning(lab.clone()))?;
    if !state.is_alive() {
        return Err(Error::Usage(format!(
            "lab {lab} is not running any more (stale state); clean up with `onionlab netem down --lab {lab}`"
        )));
    }
    Ok((lab, dir, state))
}

fn exec(args: ExecArgs) -> Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    let (_, _, state) = running_state(&args.lab)?;
    netns::enter_host(&state, &args.host)?;
    let (prog, rest) = args
        .command
        .split_first()
        .ok_or_else(|| Error::Usage("no command given".into()))?;
    let err = std::process::Command::new(prog).args(rest).exec();
    Err(Error::Usage(format!("cannot run {prog}: {err}")))
}

fn set(args: SetArgs) -> Result<ExitCode> {
    let (_, dir, _) = running_state(&args.lab)?;
    let req = match &args.b {
        Some(b) => {
            if args.up.is_some()
                || args.down.is_some()
                || args.up_queue.is_some()
                || args.down_queue.is_some()
            {
                return Err(Error::Usage(
                    "--up/--down/--up-queue/--down-queue change a host: omit B".into(),
                ));
            }
            let update = PathUpdate {
                latency: args.latency,
                jitter: args.jitter,
                loss: args.loss,
                reorder: args.reorder,
                reorder_delay: args.reorder_delay,
                rate: args.rate,
                queue: args.queue,
                block: None,
                up: if args.cut {
                    Some(false)
                } else if args.restore {
                    Some(true)
                } else {
                    None
                },
            };
            if update == PathUpdate::default() {
                return Err(Error::Usage("nothing to change".into()));
            }
            Request::SetPath {
                a: args.a.clone(),
                b: b.clone(),
                both: !args.oneway,
                update,
            }
        }
        None => {
            let update = HostUpdate {
                up: args.up,
                down: args.down,
                up_queue: args.up_queue,
                down_queue: args.down_queue,
            };
            if update == HostUpdate::default() {
                return Err(Error::Usage(
                    "nothing to change (path options need host B)".into(),
                ));
            }
            Request::SetHost {
                host: args.a.clone(),
                update,
            }
        }
    };
    control::request(&dir, &req)?;
    Ok(ExitCode::SUCCESS)
}

fn down(arg: LabArg) -> Result<ExitCode> {
    let (lab, dir) = resolve_lab(&arg)?;
    match LabState::load(&dir)? {
        Some(state) if state.is_alive() => {
            control::request(&dir, &Request::Down)?;
            let deadline = Instant::now() + Duration::from_secs(15);
            while state.is_alive() {
                if Instant::now() > deadline {
                    return Err(Error::Usage(format!(
                        "lab {lab} (pid {}) did not stop",
                        state.pid
                    )));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            println!("lab {lab} stopped");
        }
        _ => {
            let removed = netns::cleanup_stale(&lab, &dir)?;
            if removed.is_empty() {
                println!("lab {lab} is not running; nothing to clean up");
            } else {
                println!(
                    "lab {lab} was not running; removed stale state: {}",
                    removed.join(", ")
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn status(arg: LabArg) -> Result<ExitCode> {
    let (lab, dir, state) = running_state(&arg)?;
    println!(
        "lab {lab}: pid {}{}",
        state.pid,
        if state.rootless { " (rootless)" } else { "" }
    );
    for h in &state.hosts {
        println!("  {}\t{}\t{}", h.name, h.address, h.ns_path.display());
    }
    let resp = control::request(&dir, &Request::Counters)?;
    if let Some(c) = resp.counters {
        println!(
            "{}",
            serde_json::to_string_pretty(&c).map_err(|e| Error::Usage(e.to_string()))?
        );
    }
    Ok(ExitCode::SUCCESS)
}

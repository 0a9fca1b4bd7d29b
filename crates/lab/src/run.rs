//! Running a scenario: for every repetition and variant, a fresh emulated
//! network, fresh keys and processes (relays, servers, clients, workload
//! agents) in their hosts, and the measurements collected.
//!
//! Variants are interleaved (repetition-major, with the variant order
//! rotated each repetition) so a drift in machine speed hits all of them
//! alike. All variants of one repetition share its seed (the same loss
//! pattern and think times): common random numbers make differences
//! between variants sharper.

use std::collections::BTreeMap;
use std::fs;
use std::io::IsTerminal;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use onionlab_config::{ClientConfig, ConfigFile, NetworkSource, RelayConfig};
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_netdoc::exit_targets::PrivateTargets;
use onionlab_netdoc::{ExitPolicy, Flags, NetworkDocument, RelayEntry, TransportAddress};
use onionlab_netem::{Network, NetworkOptions};
use onionlab_transport::addrs::EndpointAddrs;
use onionlab_transport::endpoint::EndpointKind;
use onionlab_transport::tcp::TcpCongestion;
use onionlab_transport::{Choice as TransportChoice, LinkSettings};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::agent::{AgentSpec, TransferRecord};
use crate::hostnet::{self, HostDrops, HostTcp, HostTcpCounters};
use crate::journal::Journal;
use crate::scenario::{Implementation, Scenario, Variant};

/// Port relays listen on in their hosts.
pub(crate) const RELAY_PORT: u16 = 9001;
/// Port workload servers listen on.
const SERVER_PORT: u16 = 8000;
/// The client's SOCKS port (on the client host's loopback).
pub(crate) const SOCKS_PORT: u16 = 9050;
/// Busy fraction of all CPUs above which a repetition is flagged.
pub const SATURATED_BUSY_FRACTION: f64 = 0.90;
/// Most runs `lab run --jobs` runs at once.
pub const MAX_JOBS: usize = 8;

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Output directory (created; must not exist or be empty, unless
    /// resuming the run in it).
    pub out: PathBuf,
    /// The `onionlab` binary (started inside the hosts).
    pub bin: PathBuf,
    /// Override the scenario's repetitions.
    pub repetitions: Option<u32>,
    /// Print progress to stderr.
    pub progress: bool,
    /// Continue the run already in `out` (same scenario and topology):
    /// run only what it lacks, up to `repetitions`.
    pub resume: bool,
    /// When resuming, which complete runs run again (saturated, beside
    /// others).
    pub redo: crate::journal::Redo,
    /// Runs under way at once, each in a network of its own (1: one after
    /// another). For link-bound scenarios whose runs leave the CPU mostly
    /// idle; every run records the setting and the machine's busy
    /// fraction, and runs on a saturated CPU are flagged as always.
    pub jobs: usize,
    /// Set (by a signal handler) to stop after the runs under way; what
    /// ran is written out as usual.
    pub stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// Set (by a second signal) to end the runs under way at once: their
    /// processes are stopped, their namespaces removed, and they are not
    /// recorded (`--resume` runs them again); `run` then fails with
    /// [`RunError::Interrupted`].
    pub abort: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

/// Why a run failed as a whole (individual transfer failures are records).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// File system.
    #[error("{what}: {source}")]
    Io {
        /// What we were doing.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The emulated network.
    #[error("emulated network: {0}")]
    Netem(#[from] onionlab_netem::Error),
    /// Keys or the network document.
    #[error("network document: {0}")]
    Netdoc(#[from] onionlab_netdoc::Error),
    /// A node's configuration file.
    #[error("node configuration: {0}")]
    NodeConfig(#[from] onionlab_config::Error),
    /// A node did not start.
    #[error("{0}")]
    Start(String),
    /// A variant's node configuration could not be made (its values are
    /// checked when the scenario is read, so this is a lab bug).
    #[error("node configuration: {0}")]
    Config(String),
    /// A variant's `[link]` settings are refused by the transports.
    #[error("[link] settings: {0}")]
    Link(#[from] onionlab_transport::Error),
    /// The scenario's `[relay_settings.link]` does not fit the settings.
    #[error("[relay_settings.link]: {0}")]
    LinkTable(#[from] toml::de::Error),
    /// A second signal ended the runs under way before their workloads
    /// finished; nothing of them is recorded.
    #[error("interrupted: the runs under way were ended and not recorded")]
    Interrupted,
}

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunError {
    let what = what.into();
    move |source| RunError::Io { what, source }
}

/// Per-repetition measurements besides transfers.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct RepetitionRecord {
    /// Variant label.
    pub variant: String,
    /// Repetition.
    pub repetition: u32,
    /// Seed.
    pub seed: u64,
    /// Wall time of the repetition (s).
    pub wall_s: f64,
    /// Busy fraction of all CPUs during the workloads.
    pub cpu_busy_fraction: f64,
    /// Whether the machine was saturated (timings untrustworthy).
    pub cpu_saturated: bool,
    /// CPU seconds per relay process (name, seconds).
    pub relay_cpu_s: Vec<(String, f64)>,
    /// Peak RSS per relay process (name, bytes).
    pub relay_peak_rss: Vec<(String, u64)>,
    /// Circuit build times seen by the clients (ms).
    pub circuit_build_ms: Vec<f64>,
    /// Per directed link: (src, dst, delivered bytes, dropped packets).
    pub links: Vec<(String, String, u64, u64)>,
    /// Per directed link: packets sent into it and dropped by its loss
    /// model and by its queues (seed 002's effective drop rate).
    #[serde(default)]
    pub link_packets: Vec<LinkPackets>,
    /// Payload bytes delivered by successful transfers.
    pub payload_bytes: u64,
    /// IP bytes on the clients' access links (both directions) per payload
    /// byte delivered.
    pub wire_overhead: Option<f64>,
    /// Each host's TCP congestion control and metrics caching, as read
    /// back after setting them.
    #[serde(default)]
    pub tcp: Vec<HostTcp>,
    /// The machine's TCP congestion control module parameters during the
    /// repetition (Cubic's HyStart: `cubic_hystart`).
    #[serde(default)]
    pub tcp_module_parameters: BTreeMap<String, String>,
    /// Each host's TCP retransmission counters over the repetition (hosts
    /// that sent TCP segments only).
    #[serde(default)]
    pub tcp_counters: Vec<HostTcpCounters>,
    /// Packets each host's kernel dropped by itself (hosts with drops only).
    #[serde(default)]
    pub host_drops: Vec<HostDrops>,
    /// Whether any host dropped packets itself: the machine, not the
    /// emulated network, limited this repetition.
    #[serde(default)]
    pub host_dropped: bool,
    /// The `lab run --jobs` setting this run was made under: at most this
    /// many runs were under way at once (the last runs of a part, and
    /// those after a stop, may have run with fewer beside them).
    #[serde(default = "one_job")]
    pub jobs: usize,
    /// How punctual the emulated network was (absent in older runs).
    #[serde(default)]
    pub emulator: Option<EmulatorTiming>,
    /// C tor variants: each client's user streams by workload and the
    /// purpose of the circuit each ran over (its control port's events).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ctor_streams: Vec<crate::ctor::StreamCircuits>,
    /// C tor's conflux variants: user streams that ran over anything but
    /// a linked set. C tor falls back to a plain circuit silently when no
    /// set is ready; those streams did not measure conflux.
    #[serde(default)]
    pub conflux_fallback_streams: u64,
    /// Torchestra: per relay that moved any, the circuits it moved between
    /// a link's light and heavy connections (its log's moves; the exit
    /// decides, the middle follows). Runs before this field read as none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub torchestra_moves: Vec<(String, u64)>,
    /// onionlab clients: each client's first circuit, its relays from
    /// guard to exit (its log's first `circuit built`): what circuits
    /// shared (seed 001's loaded toy). C tor clients are not in it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_paths: Vec<(String, Vec<String>)>,
}

/// How late the emulator released packets against their scheduled time,
/// over the whole run (start-up included), and the CPU its thread used:
/// tells a late network from late nodes when the machine was busy.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct EmulatorTiming {
    /// Median lateness (µs).
    pub late_p50_us: f64,
    /// 99th percentile of lateness (µs).
    pub late_p99_us: f64,
    /// Largest lateness (µs).
    pub late_max_us: f64,
    /// CPU seconds of the forwarder thread.
    pub cpu_s: f64,
}

fn one_job() -> usize {
    1
}

/// Packet counts of one directed link over a repetition.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq, Eq)]
pub struct LinkPackets {
    /// Sending host.
    pub src: String,
    /// Receiving host.
    pub dst: String,
    /// Packets that entered the link.
    pub packets: u64,
    /// Packets its loss model dropped.
    pub lost: u64,
    /// Packets its queues dropped (full up-, path or downlink queue).
    pub queue_dropped: u64,
}

/// The run's environment, written once to `environment.json`: the kernel
/// and the TCP sysctls of the machine and of a host namespace as the lab
/// set it up (per-host congestion control is in each repetition record).
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Environment {
    /// `uname -r`.
    pub kernel: String,
    /// [`hostnet::RECORDED_SYSCTLS`] outside the lab's namespaces.
    pub machine_sysctls: BTreeMap<String, String>,
    /// The same inside the first host of the first repetition, after the
    /// lab's settings.
    pub host_sysctls: BTreeMap<String, String>,
    /// The machine's TCP congestion control module parameters
    /// ([`hostnet::recorded_tcp_module_parameters`]; Cubic's HyStart).
    #[serde(default)]
    pub tcp_module_parameters: BTreeMap<String, String>,
    /// What each transport puts on the wire, for parity: the emulated
    /// links' MTU (every packet of either transport is at most this), the
    /// largest TCP segment it allows (MTU less the IPv4 and TCP headers;
    /// TCP timestamps, when on, take 12 more), Linux's initial TCP window
    /// in segments, and each endpoint's own account (the UDP payload of
    /// QUIC's first packets and QUIC's initial window in bytes, dtls-utcp's
    /// lanes).
    pub wire: WireParity,
    /// C tor's version (`tor --version`), when a variant runs C tor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctor_version: Option<String>,
}

/// See [`Environment::wire`].
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq, Eq)]
pub struct WireParity {
    /// The emulated links' MTU.
    pub link_mtu: u32,
    /// Largest TCP segment payload (MSS) without options.
    pub tcp_mss: u32,
    /// Linux's initial congestion window (segments; `TCP_INIT_CWND`).
    pub tcp_initial_window_segments: u32,
    /// What each endpoint kind the variants use puts on the wire (its
    /// transport's own account, `EndpointSetup::wire`: QUIC's first
    /// packets and initial window, dtls-utcp's lanes), by the document's
    /// name of the endpoint, for the first variant that uses it on its
    /// first relay.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub endpoints: BTreeMap<String, BTreeMap<String, String>>,
}

impl WireParity {
    /// The kernel's TCP on links of `mtu` bytes (the endpoints' own
    /// accounts depend on the variants: [`WireParity::endpoints_of`]).
    pub fn for_mtu(mtu: u32) -> Self {
        WireParity {
            link_mtu: mtu,
            tcp_mss: mtu.saturating_sub(40),
            tcp_initial_window_segments: 10,
            endpoints: BTreeMap::new(),
        }
    }

    /// Each endpoint kind's account of its wire, from the first of
    /// `variants` that uses it, on `host` ([`link_settings`]; checked when
    /// the scenario was read).
    pub fn endpoints_of(
        variants: &[Variant],
        host: &str,
    ) -> BTreeMap<String, BTreeMap<String, String>> {
        let mut endpoints = BTreeMap::new();
        for v in variants {
            let Ok(link) = link_settings(v, host) else {
                continue;
            };
            for (kind, facts) in onionlab_transport::node_endpoints::wire_facts(&link) {
                if facts.is_empty() {
                    continue;
                }
                endpoints
                    .entry(kind.doc_name().to_string())
                    .or_insert_with(|| {
                        facts.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
                    });
            }
        }
        endpoints
    }
}

/// What a whole run produced.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// Output directory.
    pub out: PathBuf,
    /// Transfer records.
    pub records: Vec<TransferRecord>,
    /// Per-repetition records.
    pub repetitions: Vec<RepetitionRecord>,
    /// Variant labels in order.
    pub variants: Vec<String>,
}

/// A process the lab started in a host; stopped (SIGTERM, then SIGKILL
/// after 3 s) when dropped.
pub struct Proc {
    pub(crate) name: String,
    pub(crate) child: Child,
}

impl Proc {
    pub(crate) fn new(name: &str, child: Child) -> Proc {
        Proc {
            name: name.into(),
            child,
        }
    }

    /// Its process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stop(&mut self) {
        // SAFETY: kill(2) on our own child's PID.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
    }
}

/// User plus system CPU seconds of process `pid` (from `/proc/PID/stat`).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks / hz)
}

/// Peak resident memory (VmHWM) of process `pid` in bytes.
pub fn peak_rss(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// (busy, total) jiffies of all CPUs.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// Run every repetition of every variant (with [`RunOptions::resume`], those
/// not yet in the output directory).
pub fn run(scenario: &Scenario, opts: &RunOptions) -> Result<RunOutcome, RunError> {
    let variants = scenario.variants();
    if opts.jobs > 1 && variants.iter().any(|v| v.cubic_hystart.is_some()) {
        return Err(RunError::Start(
            "cubic_hystart changes a machine-wide setting for each run: run this scenario with \
             --jobs 1"
                .into(),
        ));
    }
    // C tor must be there before anything runs.
    let ctor_version = variants
        .iter()
        .any(|v| v.implementation == Implementation::Ctor)
        .then(crate::ctor::tor_version)
        .transpose()?;
    let reps = opts.repetitions.unwrap_or(scenario.repetitions);
    let mut journal = if opts.resume {
        Journal::resume(&opts.out, scenario, reps, opts.redo)?
    } else {
        Journal::create(&opts.out, scenario, reps)?
    };
    let total = reps as usize * variants.len();
    let short = scenario.short_labels();
    let width = short.iter().map(|s| s.chars().count()).max().unwrap_or(0);
    let started = Instant::now();
    let skipped = journal.runs_done();
    let left = total.saturating_sub(skipped);
    if opts.resume && opts.progress {
        eprintln!("resuming: {skipped} of {total} runs done, {left} to go");
    }
    let pending = pending_runs(&journal, reps, &variants)?;
    let jobs = opts.jobs.clamp(1, MAX_JOBS).min(pending.len().max(1));
    // Set on the first failed run: the others finish the run under way and
    // take no more.
    let abort = AtomicBool::new(false);
    let stopping = || {
        abort.load(Ordering::Relaxed)
            || opts
                .stop
                .as_ref()
                .is_some_and(|f| f.load(Ordering::Relaxed))
    };
    let interrupted = || {
        opts.abort
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Relaxed))
    };
    let next = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let mut done = 0;
    let mut first_error = None;
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        for slot in 0..jobs {
            let tx = tx.clone();
            let (pending, next, finished, stopping) = (&pending, &next, &finished, &stopping);
            let interrupted = &interrupted;
            let abort = &abort;
            let (variants, short) = (&variants, &short);
            s.spawn(move || loop {
                if stopping() {
                    break;
                }
                let Some(p) = pending.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    break;
                };
                let label = format!("rep {}: {:<width$}", p.rep, short[p.variant]);
                // What the run is doing before its workload (C tor's
                // bootstrap), after the label.
                let status = |what: &str| {
                    if opts.progress {
                        let now = if what.is_empty() {
                            label.clone()
                        } else {
                            format!("{label} ({what})")
                        };
                        progress(finished.load(Ordering::Relaxed), left, started, &now);
                    }
                };
                status("");
                let seed = repetition_seed(scenario.seed, p.rep);
                let lab = format!("l{}-{slot}", std::process::id());
                let variant = &variants[p.variant];
                let hooks = RunHooks {
                    status: &status,
                    interrupted,
                };
                let result = run_one(
                    scenario,
                    variant,
                    (p.rep, seed),
                    &p.dir,
                    &opts.bin,
                    &lab,
                    &hooks,
                );
                finished.fetch_add(1, Ordering::Relaxed);
                // A failed run stops every worker before it takes another.
                if result.is_err() {
                    abort.store(true, Ordering::Relaxed);
                }
                if tx.send((variant, p.rep, seed, result)).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        // The journal is written here only, as runs finish (in any order
        // with several jobs).
        for (variant, rep, seed, result) in rx {
            // After the first error nothing more is written: a journal
            // write may have failed halfway through a line.
            if first_error.is_some() {
                continue;
            }
            let recorded = result.and_then(|(mut recs, mut r, host_sysctls)| {
                if !opts.out.join("environment.json").exists() {
                    write_environment(
                        &opts.out,
                        environment_parts(
                            &variants,
                            scenario,
                            variant,
                            host_sysctls,
                            &ctor_version,
                        ),
                    )?;
                }
                for rec in &mut recs {
                    rec.variant = variant.label.clone();
                    rec.repetition = rep;
                    rec.seed = seed;
                }
                r.jobs = jobs;
                journal.append(recs, r)
            });
            match recorded {
                Ok(()) => done += 1,
                Err(e) => {
                    abort.store(true, Ordering::Relaxed);
                    first_error.get_or_insert(e);
                }
            }
        }
    });
    if let Some(e) = first_error {
        return Err(e);
    }
    if done < pending.len() && opts.progress {
        eprintln!(
            "\nstopped: {} of {total} runs done (continue with --resume)",
            skipped + done
        );
    }
    if opts.progress {
        progress(
            done,
            left,
            started,
            &format!("{:<w$}", "done", w = width + 9),
        );
        eprintln!();
    }
    write_csv(&opts.out.join("records.csv"), &journal.records)?;
    Ok(RunOutcome {
        out: opts.out.clone(),
        records: journal.records,
        repetitions: journal.repetitions,
        variants: variants.iter().map(|v| v.label.clone()).collect(),
    })
}

/// A run still to do: repetition, index of the variant, raw directory.
struct PendingRun {
    rep: u32,
    variant: usize,
    dir: PathBuf,
}

/// The runs `journal` lacks, in the order one job runs them: repetition
/// by repetition, each starting one variant further on (so that no
/// variant always runs first).
fn pending_runs(
    journal: &Journal,
    reps: u32,
    variants: &[Variant],
) -> Result<Vec<PendingRun>, RunError> {
    let mut pending = Vec::new();
    for rep in 0..reps {
        for k in 0..variants.len() {
            let vi = (k + rep as usize) % variants.len();
            if !journal.is_done(rep, &variants[vi].label) {
                let dir = journal.fresh_raw_dir(rep, vi)?;
                pending.push(PendingRun {
                    rep,
                    variant: vi,
                    dir,
                });
            }
        }
    }
    Ok(pending)
}

/// What environment.json records, from the first run to finish.
fn environment_parts(
    variants: &[Variant],
    scenario: &Scenario,
    variant: &Variant,
    host_sysctls: Sysctls,
    ctor_version: &Option<String>,
) -> EnvironmentParts {
    let endpoints = scenario
        .relays
        .first()
        .map(|r| WireParity::endpoints_of(variants, &r.host))
        .unwrap_or_default();
    EnvironmentParts {
        host_sysctls,
        mtu: variant.topology.mtu,
        endpoints,
        ctor_version: ctor_version.clone(),
    }
}

/// The seed of repetition `rep`: the same for every variant (common random
/// numbers), and independent of how the run was split into segments.
fn repetition_seed(scenario_seed: u64, rep: u32) -> u64 {
    scenario_seed
        .wrapping_mul(1_000_003)
        .wrapping_add(u64::from(rep))
}

/// What [`write_environment`] takes from the run.
struct EnvironmentParts {
    host_sysctls: Sysctls,
    mtu: u32,
    endpoints: BTreeMap<String, BTreeMap<String, String>>,
    ctor_version: Option<String>,
}

/// Write `environment.json` ([`Environment`]).
fn write_environment(out: &Path, parts: EnvironmentParts) -> Result<(), RunError> {
    let env = Environment {
        kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        machine_sysctls: hostnet::recorded_sysctls(),
        host_sysctls: parts.host_sysctls,
        tcp_module_parameters: hostnet::recorded_tcp_module_parameters(),
        wire: WireParity {
            endpoints: parts.endpoints,
            ..WireParity::for_mtu(parts.mtu)
        },
        ctor_version: parts.ctor_version,
    };
    let text = serde_json::to_string_pretty(&env).unwrap_or_default();
    // Through a renamed temporary file: a half-written file would stop a
    // resumed run from writing it again.
    let tmp = out.join("environment.json.tmp");
    fs::write(&tmp, text).map_err(io_err("writing environment.json"))?;
    fs::rename(&tmp, out.join("environment.json")).map_err(io_err("writing environment.json"))
}

/// Minutes and seconds, e.g. `12m05s`.
fn min_sec(secs: f64) -> String {
    format!("{}m{:02}s", (secs / 60.0) as u64, (secs % 60.0) as u64)
}

/// One progress line (redrawn in place): a bar, runs done, time elapsed,
/// the estimated time left (from the mean time per run so far) and what
/// runs now.
fn progress(done: usize, total: usize, started: Instant, now: &str) {
    let frac = done as f64 / total.max(1) as f64;
    let width = 30;
    let filled = ((frac * width as f64) as usize).min(width);
    let elapsed = started.elapsed().as_secs_f64();
    let eta = if done == 0 {
        "?".to_string()
    } else {
        min_sec(elapsed / done as f64 * total.saturating_sub(done) as f64)
    };
    // On a terminal, clear what a longer earlier line left behind.
    let clear = if std::io::stderr().is_terminal() {
        "\x1b[K"
    } else {
        ""
    };
    eprint!(
        "\r[{}{}] {done}/{total} {} elapsed, ETA {eta}  {now}{clear}",
        "#".repeat(filled),
        " ".repeat(width - filled),
        min_sec(elapsed),
    );
}

fn write_csv(path: &Path, records: &[TransferRecord]) -> Result<(), RunError> {
    let opt = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.3}"));
    let mut out = String::from(
        "variant,repetition,seed,workload,kind,index,size,start_unix_ms,connect_ms,ttfb_ms,ttlb_ms,goodput_mib_s,longest_gap_ms,stalled,timed_out,error\n",
    );
    for r in records {
        let error = r.error.as_deref().unwrap_or("").replace(['"', '\n'], " ");
        out.push_str(&format!(
            "\"{}\",{},{},\"{}\",{},{},{},{:.3},{},{},{},{},{},{},{},\"{}\"\n",
            r.variant,
            r.repetition,
            r.seed,
            r.workload,
            r.kind,
            r.index,
            r.size,
            r.start_unix_ms,
            opt(r.connect_ms),
            opt(r.ttfb_ms),
            opt(r.ttlb_ms),
            opt(r.goodput_mib_s),
            opt(r.longest_gap_ms),
            r.stalled,
            r.timed_out,
            error
        ));
    }
    fs::write(path, out).map_err(io_err("writing records.csv"))
}

/// Where a relay on `addr` listens under a variant's transport, and so
/// what it advertises: its TCP endpoint (`tls`) always (EXTEND2 names it,
/// and `wait_ready` checks it), and every endpoint the transport may use,
/// on `addr`'s port of its protocol (each relay is a host of its own; a
/// second endpoint of one protocol would take the next port).
pub fn relay_listen(transport: TransportChoice, addr: SocketAddr) -> EndpointAddrs {
    let mut kinds = vec![EndpointKind::TCP];
    for kind in transport.endpoints() {
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    EndpointAddrs::on_ports(addr.ip(), addr.port(), 1, &kinds)
        .expect("the lab's relay port leaves room for every endpoint")
}

/// The addresses a relay on `addr` advertises in the network document
/// under a variant's transport: where it listens ([`relay_listen`]).
pub fn relay_addresses(transport: TransportChoice, addr: SocketAddr) -> Vec<TransportAddress> {
    relay_listen(transport, addr)
        .iter()
        .map(|(kind, addr)| TransportAddress {
            transport: kind.doc_name().into(),
            addr,
        })
        .collect()
}

/// The network parameters of a variant: its circuit congestion control
/// (checked when the scenario was read), and multi-path sets enabled with
/// its leg scheduler when it asks for more than one leg.
pub fn network_params(variant: &Variant) -> onionlab_netdoc::NetworkParams {
    let mut params =
        onionlab_netdoc::NetworkParams::with_circuit_cc(&variant.circuit_cc).unwrap_or_default();
    params.cfx_enabled = variant.legs > 1;
    params.cfx_scheduler = variant.leg_scheduler;
    params
}

/// A client's paths under a variant of `legs` legs: its first `legs`
/// pinned legs (`paths`) or its pinned path, and `legs` for random legs.
pub fn set_client_paths(cfg: &mut ClientConfig, c: &crate::scenario::ClientSpec, legs: usize) {
    match (&c.paths, c.first_path()) {
        (Some(pinned), _) if legs > 1 => {
            cfg.paths = Some(pinned.iter().take(legs).cloned().collect());
        }
        (_, Some(path)) => cfg.path = Some(path.to_vec()),
        (_, None) if legs > 1 => cfg.legs = legs,
        (_, None) => {}
    }
}

/// The `[link]` section of a variant's node on `host`: the variant's
/// transport; congestion control, the node's TCP one
/// ([`Variant::tcp_congestion_of`]) and the variant's for transports with
/// their own ([`LinkSettings::set_congestion`]; the scenario refuses one a
/// transport lacks); TCP pacing; packets that fill the links' MTU
/// ([`LinkSettings::fit_to_link_mtu`]). The scenario's `[relay_settings.link]` is set
/// over it last, so it may change what the matrix does not set.
///
/// # Errors
///
/// [`RunError::Link`] or [`RunError::LinkTable`] naming the bad value
/// (checked when the scenario was read).
pub fn link_settings(variant: &Variant, host: &str) -> Result<LinkSettings, RunError> {
    let mut link = LinkSettings {
        transport: variant.transport,
        ..LinkSettings::default()
    };
    let tcp = TcpCongestion::parse(variant.tcp_congestion_of(host))
        .map_err(onionlab_transport::Error::from)?;
    link.set_congestion(tcp, &variant.congestion)?;
    link.tcp.pacing = variant.tcp_pacing;
    link.fit_to_link_mtu(variant.topology.mtu);
    let Some(extra) = variant
        .relay_settings
        .get("link")
        .and_then(toml::Value::as_table)
    else {
        link.check()?;
        return Ok(link);
    };
    let mut table = toml::Table::try_from(&link).map_err(|e| RunError::Config(e.to_string()))?;
    onionlab_config::merge_tables(&mut table, extra);
    let link: LinkSettings = table.try_into()?;
    link.check()?;
    Ok(link)
}

/// A relay's configuration for a variant: its endpoints listen where
/// [`relay_listen`] says (`[listen]`). Exits refuse private
/// addresses except `servers`, the workload servers the lab starts
/// (`exit_allow_private`). The scenario's `[relay_settings]` is set over
/// it.
///
/// # Errors
///
/// [`RunError::NodeConfig`] for values a relay would refuse (checked when the
/// scenario was read).
pub fn relay_config(
    nickname: &str,
    addr: SocketAddr,
    network_key_hex: &str,
    variant: &Variant,
    servers: &[SocketAddr],
) -> Result<RelayConfig, RunError> {
    let network = NetworkSource::File("../network.doc".into());
    let mut cfg = RelayConfig::new(
        nickname,
        "keys.secret".into(),
        addr,
        network,
        network_key_hex,
    )?;
    cfg.scheduler = variant
        .scheduler
        .parse()
        .map_err(|e: onionlab_config::UnknownScheduler| RunError::Config(e.to_string()))?;
    cfg.exit_packaging = variant.exit_packaging;
    cfg.listen = relay_listen(variant.transport, addr);
    let allowed: Vec<String> = servers.iter().map(ToString::to_string).collect();
    cfg.exit_allow_private = PrivateTargets::parse(&allowed)?;
    let cfg = cfg.with_overrides(&variant.relay_settings, "[relay_settings]")?;
    let link = link_settings(variant, nickname)?;
    Ok(RelayConfig { link, ..cfg })
}

/// A client's configuration for a variant: SOCKS on the client host's
/// loopback, its paths ([`set_client_paths`]), `path_seed` and
/// circuit build timeout, and its `[link]` ([`link_settings`]).
///
/// # Errors
///
/// As [`relay_config`].
pub fn client_config(
    c: &crate::scenario::ClientSpec,
    variant: &Variant,
    network_key_hex: &str,
    path_seed: u64,
    build_timeout: Duration,
) -> Result<ClientConfig, RunError> {
    let socks = SocketAddr::from(([127, 0, 0, 1], SOCKS_PORT));
    let network = NetworkSource::File("../network.doc".into());
    let mut cfg = ClientConfig::new(socks, network, network_key_hex)?;
    cfg.circuit_build_timeout_ms = build_timeout.as_millis().min(60_000) as u64;
    set_client_paths(&mut cfg, c, variant.legs);
    cfg.path_seed = Some(path_seed);
    cfg.link = link_settings(variant, &c.host)?;
    Ok(cfg)
}

/// Files and addresses of one repetition's network.
struct Layout {
    relay_configs: Vec<(String, PathBuf, SocketAddr)>,
    client_configs: Vec<(String, String, PathBuf)>,
}

fn write_network(
    scenario: &Scenario,
    variant: &Variant,
    net: &Network,
    dir: &Path,
    seed: u64,
) -> Result<Layout, RunError> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x005e_ed0f_ce11);
    let network_key = onionlab_netdoc::keys::generate_network_key(&mut rng);
    let network_key_hex = onionlab_netdoc::keys::public_key_hex(&network_key.verifying_key());
    let mut entries = Vec::new();
    let mut relay_configs = Vec::new();
    let servers = scenario
        .servers
        .iter()
        .map(|s| {
            Ok(SocketAddr::new(
                IpAddr::V4(net.address(&s.host)?),
                SERVER_PORT,
            ))
        })
        .collect::<Result<Vec<_>, RunError>>()?;
    for r in &scenario.relays {
        let keys = RelaySecretKeys::generate(&mut rng);
        let ip = IpAddr::V4(net.address(&r.host)?);
        let addr = SocketAddr::new(ip, RELAY_PORT);
        let mut e = RelayEntry::new(r.host.clone(), &keys.public());
        e.addresses = relay_addresses(variant.transport, addr);
        // A relay with a datagram address can run MORE: its Sphinx key.
        if e.address(EndpointKind::DGRAM.doc_name()).is_some() {
            e.sphinx_key = Some(keys.sphinx_public());
        }
        e.flags = Flags {
            guard: r.guard,
            exit: r.exit,
        };
        e.bandwidth = 1000;
        if r.exit {
            e.exit_policy = ExitPolicy::accept_all();
        }
        entries.push(e);
        let rdir = dir.join(&r.host);
        fs::create_dir_all(&rdir).map_err(io_err("creating a relay directory"))?;
        onionlab_netdoc::keys::save_relay_keys(&rdir.join("keys.secret"), &keys)?;
        let config = relay_config(&r.host, addr, &network_key_hex, variant, &servers)?;
        let path = rdir.join("relay.toml");
        fs::write(&path, config.to_toml()?).map_err(io_err("writing a relay config"))?;
        relay_configs.push((r.host.clone(), path, addr));
    }
    let now = onionlab_config::unix_now();
    let doc = NetworkDocument {
        network_name: "lab".into(),
        created_unix: now,
        valid_after_unix: now,
        valid_until_unix: now + onionlab_netdoc::DEFAULT_LIFETIME.as_secs(),
        params: network_params(variant),
        relays: entries,
    };
    fs::write(dir.join("network.doc"), doc.to_signed_text(&network_key))
        .map_err(io_err("writing network.doc"))?;

    let mut client_configs = Vec::new();
    // Random paths drawn from the repetition's seed: every variant of one
    // repetition gets the same paths (as long as its clients ask for
    // circuits in the same order), so variants compare on the same paths.
    for (i, c) in variant.active_clients(&scenario.clients).iter().enumerate() {
        let cdir = dir.join(&c.name);
        fs::create_dir_all(&cdir).map_err(io_err("creating a client directory"))?;
        let config = client_config(
            c,
            variant,
            &network_key_hex,
            client_path_seed(seed, i),
            scenario.transfer_timeout,
        )?;
        let path = cdir.join("client.toml");
        fs::write(&path, config.to_toml()?).map_err(io_err("writing a client config"))?;
        client_configs.push((c.name.clone(), c.host.clone(), path));
    }
    Ok(Layout {
        relay_configs,
        client_configs,
    })
}

/// The `path_seed` of the `index`-th client of a repetition whose seed is
/// `seed` (a different stream per client, the same in every variant);
/// below 2^63, as TOML's integers are signed.
fn client_path_seed(seed: u64, index: usize) -> u64 {
    let mixed =
        (seed ^ 0x9a75_5eed).wrapping_add((index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    mixed & (i64::MAX as u64)
}

fn spawn_in(
    net: &Network,
    host: &str,
    bin: &Path,
    args: &[&str],
    log: &Path,
    name: &str,
) -> Result<Proc, RunError> {
    let file = fs::File::create(log).map_err(io_err(format!("creating {}", log.display())))?;
    let child = net
        .command(host, bin)?
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .map_err(io_err(format!("starting {name} in {host}")))?;
    Ok(Proc {
        name: name.into(),
        child,
    })
}

/// Wait until `addr` accepts connections from inside `host`.
fn wait_ready(
    net: &Network,
    host: &str,
    addr: SocketAddr,
    p: &mut Proc,
    log: &Path,
) -> Result<(), RunError> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ok = net.run_in(host, || {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        })?;
        if ok {
            return Ok(());
        }
        if let Ok(Some(status)) = p.child.try_wait() {
            let text = fs::read_to_string(log).unwrap_or_default();
            return Err(RunError::Start(format!(
                "{} exited ({status}): {text}",
                p.name
            )));
        }
        if Instant::now() > deadline {
            return Err(RunError::Start(format!(
                "{} did not listen on {addr}",
                p.name
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How a run under way shows what it does and learns it must end.
struct RunHooks<'a> {
    /// What the run is doing before its workload (shown after its label).
    status: &'a dyn Fn(&str),
    /// True once the run must end at once, unrecorded (a second signal).
    interrupted: &'a dyn Fn() -> bool,
}

/// Run repetition `rep` (with `seed`) of `variant` in `dir`; `hooks.status`
/// hears what it is doing before the workload starts.
fn run_one(
    scenario: &Scenario,
    variant: &Variant,
    (rep, seed): (u32, u64),
    dir: &Path,
    bin: &Path,
    lab: &str,
    hooks: &RunHooks,
) -> Result<(Vec<TransferRecord>, RepetitionRecord, Sysctls), RunError> {
    let status = hooks.status;
    let t0 = Instant::now();
    fs::create_dir_all(dir).map_err(io_err("creating the repetition directory"))?;
    let mut topology = variant.topology.clone();
    // Unique among concurrent runs: it names the hosts' namespaces.
    topology.name = lab.to_string();
    topology.seed = seed;
    // Held to the end of the run, then the machine's value is back.
    let _hystart = variant
        .cubic_hystart
        .map(hostnet::CubicHystart::set)
        .transpose()
        .map_err(|e| RunError::Start(format!("variant {}: {e}", variant.label)))?;
    if let Some(on) = variant.cubic_hystart {
        tracing::info!(
            on,
            "Linux Cubic's HyStart set for this run (machine-wide, restored after)"
        );
    }
    let tcp_module_parameters = hostnet::recorded_tcp_module_parameters();
    let net = Network::up(topology, NetworkOptions::default())?;
    let (tcp, host_sysctls) = prepare_hosts(&net, variant)?;
    let (mut servers, server_addrs) = start_servers(scenario, variant, &net, dir, bin)?;
    let mut nodes = match variant.implementation {
        Implementation::Onionlab => start_onionlab(scenario, variant, &net, dir, seed, bin)?,
        Implementation::Ctor => {
            let plan = crate::ctor::NetPlan::of_variant(scenario, variant)
                .map_err(|why| RunError::Start(format!("variant {}: {why}", variant.label)))?;
            let place = crate::ctor::Place::Lab(&net);
            let test_server = servers.first().map(|s| s.1);
            let c = crate::ctor::start(&place, &plan, dir, test_server, status)?;
            status("");
            let mut circuit_watches = Vec::new();
            for (client, control) in plan.clients.iter().zip(&c.control) {
                if let Some((addr, cookie)) = control {
                    let who = (client.name.as_str(), client.host.as_str());
                    let w = crate::ctor::CircuitWatch::start(&place, who, *addr, cookie)?;
                    circuit_watches.push(w);
                }
            }
            Nodes {
                relays: c.relays,
                clients: c.clients,
                others: vec![c.authority],
                circuit_watches,
            }
        }
    };
    // What the nodes did before the workload (bootstrap, C tor's test
    // downloads) is not the workload's.
    let before = Baseline::take(&net, &nodes)?;

    // Workload agents, one per client with workloads.
    let cpu_start = cpu_jiffies();
    let agents = run_agents(
        scenario,
        variant,
        &net,
        (dir, bin, seed),
        &server_addrs,
        hooks.interrupted,
    )?;
    let cpu_end = cpu_jiffies();
    let busy = match (cpu_start, cpu_end) {
        (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => (b1 - b0) as f64 / (t1 - t0) as f64,
        _ => 0.0,
    };

    let relay_cpu_s = before.relay_cpu_since(&nodes);
    let relay_peak_rss = nodes
        .relays
        .iter()
        .map(|(p, n)| (n.clone(), peak_rss(p.child.id()).unwrap_or(0)))
        .collect();
    for (p, _) in &mut nodes.clients {
        p.stop();
    }
    let procs = nodes.relays.iter_mut().map(|(p, _)| p);
    for p in procs
        .chain(servers.iter_mut().map(|s| &mut s.0))
        .chain(nodes.others.iter_mut())
    {
        p.stop();
    }
    let host_drops = before.drops_since(read_host_drops(&net)?);
    let tcp_counters = before.tcp_since(read_tcp_counters(&net)?);
    let torchestra_moves = torchestra_moves(&nodes, dir);
    let client_paths = client_paths(&nodes);
    let mut counters = net.shutdown()?;
    before.subtract_from(&mut counters);
    let late = &counters.forwarder.release_error;
    let emulator = EmulatorTiming {
        late_p50_us: late.p50_us,
        late_p99_us: late.p99_us,
        late_max_us: late.max_us,
        cpu_s: counters.forwarder.cpu_s,
    };

    let records = agent_records(&agents);
    let mut circuit_build_ms = circuit_build_times(&nodes);
    let mut ctor_streams = Vec::new();
    for w in std::mem::take(&mut nodes.circuit_watches) {
        let seen = w.finish();
        circuit_build_ms.extend(seen.build_ms);
        ctor_streams.extend(seen.streams);
    }
    // A C tor variant with legs runs conflux (NetPlan::of_variant).
    let conflux = variant.implementation == Implementation::Ctor && variant.legs > 1;
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
    let (links, link_packets) = link_summaries(&counters);
    // Wire overhead where the payload crosses exactly once: the clients'
    // access links (both directions: requests, SENDMEs, TLS and TCP/IP
    // headers, retransmissions) per payload byte delivered.
    let client_hosts: Vec<&str> = variant
        .active_clients(&scenario.clients)
        .iter()
        .map(|c| c.host.as_str())
        .collect();
    let wire: u64 = links
        .iter()
        .filter(|l| client_hosts.contains(&l.0.as_str()) || client_hosts.contains(&l.1.as_str()))
        .map(|l| l.2)
        .sum();
    let repetition = RepetitionRecord {
        variant: variant.label.clone(),
        repetition: rep,
        seed,
        wall_s: t0.elapsed().as_secs_f64(),
        cpu_busy_fraction: busy,
        cpu_saturated: busy > SATURATED_BUSY_FRACTION,
        relay_cpu_s,
        relay_peak_rss,
        circuit_build_ms,
        links,
        link_packets,
        payload_bytes,
        wire_overhead: (payload_bytes > 0).then(|| wire as f64 / payload_bytes as f64),
        tcp,
        tcp_module_parameters,
        tcp_counters,
        host_dropped: !host_drops.is_empty(),
        host_drops,
        jobs: 1,
        emulator: Some(emulator),
        ctor_streams,
        conflux_fallback_streams,
        torchestra_moves,
        client_paths,
    };
    Ok((records, repetition, host_sysctls))
}

/// Each onionlab client's first circuit (client name, relays in order),
/// from the `circuit built` lines of the clients' logs
/// (`client-NAME.log`, `path=A,B,C`).
fn client_paths(nodes: &Nodes) -> Vec<(String, Vec<String>)> {
    nodes
        .clients
        .iter()
        .filter_map(|(_, log)| {
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

/// Per relay whose log has any, its Torchestra moves (the relays stopped,
/// their logs complete).
fn torchestra_moves(nodes: &Nodes, dir: &Path) -> Vec<(String, u64)> {
    nodes
        .relays
        .iter()
        .filter_map(|(_, name)| {
            let text = fs::read_to_string(dir.join(format!("{name}.log"))).ok()?;
            let n = text.lines().filter(|l| l.contains(TORCHESTRA_MOVE)).count() as u64;
            (n > 0).then(|| (name.clone(), n))
        })
        .collect()
}

/// Start a workload agent per client with workloads and wait for them
/// all (each stopped past the workloads' deadline); returns them with
/// their specs. Once `interrupted` says so, stops them and fails with
/// [`RunError::Interrupted`] (the caller's nodes and network go with it).
fn run_agents(
    scenario: &Scenario,
    variant: &Variant,
    net: &Network,
    (dir, bin, seed): (&Path, &Path, u64),
    server_addrs: &std::collections::HashMap<String, SocketAddr>,
    interrupted: &dyn Fn() -> bool,
) -> Result<Vec<(Proc, AgentSpec)>, RunError> {
    let mut agents = Vec::new();
    let mut deadline = Duration::from_secs(30);
    for c in variant.active_clients(&scenario.clients) {
        let workloads: Vec<_> = variant
            .workloads
            .iter()
            .filter(|w| w.client == c.name)
            .map(|w| (w.clone(), server_addrs[&w.server]))
            .collect();
        if workloads.is_empty() {
            continue;
        }
        for (w, _) in &workloads {
            let per = scenario.transfer_timeout + w.think_max;
            deadline = deadline.max(w.start + per * w.count + Duration::from_secs(30));
        }
        let spec = AgentSpec {
            socks: SocketAddr::from(([127, 0, 0, 1], SOCKS_PORT)),
            workloads,
            seed,
            stall_threshold: scenario.stall_threshold,
            transfer_timeout: scenario.transfer_timeout,
            out: dir.join(format!("records-{}.jsonl", c.name)),
        };
        let spec_path = dir.join(format!("agent-{}.json", c.name));
        let text = serde_json::to_string_pretty(&spec).unwrap_or_default();
        fs::write(&spec_path, text).map_err(io_err("writing an agent spec"))?;
        let log = dir.join(format!("agent-{}.log", c.name));
        let sp = spec_path.to_string_lossy().into_owned();
        let p = spawn_in(
            net,
            &c.host,
            bin,
            &["lab", "agent", "--spec", &sp],
            &log,
            &format!("agent-{}", c.name),
        )?;
        agents.push((p, spec));
    }
    let wait_until = Instant::now() + deadline;
    for (p, _) in &mut agents {
        loop {
            if let Ok(Some(_)) = p.child.try_wait() {
                break;
            }
            if Instant::now() > wait_until {
                p.stop();
                break;
            }
            if interrupted() {
                // Dropping them stops them.
                return Err(RunError::Interrupted);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(agents)
}

/// The transfer records the agents wrote, and a failure for every
/// transfer an agent did not report.
fn agent_records(agents: &[(Proc, AgentSpec)]) -> Vec<TransferRecord> {
    let mut records = Vec::new();
    for (_, spec) in agents {
        let text = fs::read_to_string(&spec.out).unwrap_or_default();
        let mut got: Vec<TransferRecord> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        for (w, _) in &spec.workloads {
            for index in 0..w.count {
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
fn circuit_build_times(nodes: &Nodes) -> Vec<f64> {
    let mut ms = Vec::new();
    for (_, log) in &nodes.clients {
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
struct Nodes {
    /// Relay processes and their hosts.
    relays: Vec<(Proc, String)>,
    /// Client processes and their logs.
    clients: Vec<(Proc, PathBuf)>,
    /// Other processes of the network (C tor's directory authority).
    others: Vec<Proc>,
    /// C tor clients' control ports, watched for circuit build times
    /// (onionlab's clients log theirs) and the circuits of their streams.
    circuit_watches: Vec<crate::ctor::CircuitWatch>,
}

/// Start the scenario's workload servers and wait until they listen;
/// returns them (process, address, log, host) and their addresses by name.
#[allow(clippy::type_complexity)]
fn start_servers(
    scenario: &Scenario,
    variant: &Variant,
    net: &Network,
    dir: &Path,
    bin: &Path,
) -> Result<
    (
        Vec<(Proc, SocketAddr, PathBuf, String)>,
        std::collections::HashMap<String, SocketAddr>,
    ),
    RunError,
> {
    let mut servers = Vec::new();
    let mut server_addrs = std::collections::HashMap::new();
    for s in &scenario.servers {
        let addr = SocketAddr::new(IpAddr::V4(net.address(&s.host)?), SERVER_PORT);
        let log = dir.join(format!("server-{}.log", s.name));
        let p = spawn_in(
            net,
            &s.host,
            bin,
            &[
                "lab",
                "serve",
                "--listen",
                &addr.to_string(),
                "--tcp-congestion",
                variant.tcp_congestion_of(&s.host),
            ],
            &log,
            &s.name,
        )?;
        servers.push((p, addr, log, s.host.clone()));
        server_addrs.insert(s.name.clone(), addr);
    }
    for (p, addr, log, host) in &mut servers {
        wait_ready(net, host, *addr, p, log)?;
    }
    Ok((servers, server_addrs))
}

/// Write an onionlab network for the variant, start its relays and
/// clients, and wait until they listen.
fn start_onionlab(
    scenario: &Scenario,
    variant: &Variant,
    net: &Network,
    dir: &Path,
    seed: u64,
    bin: &Path,
) -> Result<Nodes, RunError> {
    let layout = write_network(scenario, variant, net, dir, seed)?;
    let mut relays = Vec::new();
    for (name, config, addr) in &layout.relay_configs {
        let log = dir.join(format!("{name}.log"));
        let cfg = config.to_string_lossy().into_owned();
        let p = spawn_in(
            net,
            name,
            bin,
            &["--log", "info", "relay", "--config", &cfg],
            &log,
            name,
        )?;
        relays.push((p, *addr, log, name.clone()));
    }
    for (p, addr, log, host) in &mut relays {
        wait_ready(net, host, *addr, p, log)?;
    }
    let mut clients = Vec::new();
    for (name, host, config) in &layout.client_configs {
        let log = dir.join(format!("client-{name}.log"));
        let cfg = config.to_string_lossy().into_owned();
        let mut p = spawn_in(
            net,
            host,
            bin,
            &["--log", "info", "client", "--config", &cfg],
            &log,
            name,
        )?;
        let socks = SocketAddr::from(([127, 0, 0, 1], SOCKS_PORT));
        wait_ready(net, host, socks, &mut p, &log)?;
        clients.push((p, log));
    }
    Ok(Nodes {
        relays: relays.into_iter().map(|(p, _, _, n)| (p, n)).collect(),
        clients,
        others: Vec::new(),
        circuit_watches: Vec::new(),
    })
}

/// The emulated links' counters and the relays' CPU time when the
/// workload starts: what came before (start-up, C tor's bootstrap and
/// test downloads) is left out of the repetition's records.
struct Baseline {
    counters: onionlab_netem::Counters,
    relay_cpu_s: Vec<f64>,
    tcp: Vec<HostTcpCounters>,
    drops: Vec<HostDrops>,
}

impl Baseline {
    fn take(net: &Network, nodes: &Nodes) -> Result<Baseline, RunError> {
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
    fn relay_cpu_since(&self, nodes: &Nodes) -> Vec<(String, f64)> {
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
    fn tcp_since(&self, end: Vec<HostTcpCounters>) -> Vec<HostTcpCounters> {
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
    fn drops_since(&self, end: Vec<HostDrops>) -> Vec<HostDrops> {
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
    fn subtract_from(&self, end: &mut onionlab_netem::Counters) {
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

/// Sysctl names and values.
type Sysctls = BTreeMap<String, String>;

/// Set every host's TCP up for `variant` ([`hostnet::prepare_host`]);
/// returns each host's set-up, and the first host's recorded sysctls.
/// The nodes set their congestion control per socket (`tcp_congestion`
/// in their configurations, `lab serve --tcp-congestion`): a namespace's
/// default may only be an algorithm the machine allows unprivileged
/// users, which Cubic here is not.
///
/// C tor sets no congestion control on its sockets: for C tor variants
/// each namespace's default is set to the host's algorithm instead.
fn prepare_hosts(net: &Network, variant: &Variant) -> Result<(Vec<HostTcp>, Sysctls), RunError> {
    let ctor = variant.implementation == Implementation::Ctor;
    let mut tcp = Vec::new();
    let mut sysctls = BTreeMap::new();
    for h in &variant.topology.hosts {
        let congestion = variant.tcp_congestion_of(&h.name);
        let set_default = ctor && congestion != "system";
        if set_default {
            hostnet::allow_congestion(congestion).map_err(io_err(format!(
                "allowing {congestion} as a namespace default for C tor (needs root; \
                 or set tcp_congestion = \"system\")"
            )))?;
        }
        let first = tcp.is_empty();
        let (got, recorded) = net
            .run_in(&h.name, || {
                let set = if set_default {
                    hostnet::set_default_congestion(congestion)
                } else {
                    Ok(())
                };
                let got = hostnet::prepare_host(&h.name, congestion, variant.kernel_tcp);
                (set, got, first.then(hostnet::recorded_sysctls))
            })
            .map(|(set, got, recorded)| set.map(|()| (got, recorded)))?
            .map_err(io_err(format!(
                "setting {}'s TCP congestion control",
                h.name
            )))?;
        tcp.push(got);
        sysctls.extend(recorded.unwrap_or_default());
    }
    Ok((tcp, sysctls))
}

/// Each host's TCP counters (hosts that sent TCP segments only).
fn read_tcp_counters(net: &Network) -> Result<Vec<HostTcpCounters>, RunError> {
    let mut all = Vec::new();
    for h in &net.topology().hosts {
        all.push(net.run_in(&h.name, || hostnet::read_tcp_counters(&h.name))?);
    }
    Ok(all)
}

/// Every host's own packet drops.
fn read_host_drops(net: &Network) -> Result<Vec<HostDrops>, RunError> {
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

    #[test]
    fn client_path_seeds_fit_a_client_config_and_differ_per_client() {
        let key = "0".repeat(64);
        for seed in [0, 1002003006, u64::MAX] {
            let seeds: Vec<u64> = (0..16).map(|i| client_path_seed(seed, i)).collect();
            for (i, s) in seeds.iter().enumerate() {
                assert!(!seeds[..i].contains(s), "two clients share {s}");
                let text = format!(
                    "socks_listen = \"127.0.0.1:9050\"\nnetwork = \"n.doc\"\nnetwork_key = \"{key}\"\npath_seed = {s}\n"
                );
                let cfg = onionlab_config::ClientConfig::from_toml_str(
                    &text,
                    "client.toml",
                    Path::new("."),
                )
                .expect("a client config takes the seed");
                assert_eq!(cfg.path_seed, Some(*s));
            }
        }
    }

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
}

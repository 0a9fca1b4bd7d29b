//! Running a scenario: for every repetition and variant, a fresh emulated
//! network, fresh keys and processes (relays, servers, clients, workload
//! agents) in their hosts, and the measurements collected.
//!
//! Variants are interleaved (repetition-major, with the variant order
//! rotated each repetition) so a drift in machine speed hits all of them
//! alike. All variants of one repetition share its seed (the same loss
//! pattern and think times): common random numbers make differences
//! between variants sharper.

mod jobs;
mod progress;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;

use serde::{Deserialize, Serialize};

use self::jobs::{pending_runs, Finished, Jobs};
use self::progress::Progress;
use crate::agent::TransferRecord;
use crate::engine::{Engine, EngineId, Sysctls};
use crate::error::{io_err, Error};
use crate::hostnet::{self, HostDrops, HostTcp, HostTcpCounters};
use crate::journal::Journal;
use crate::scenario::Scenario;
use crate::variant::{Implementation, Variant};

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
    /// [`Error::Interrupted`].
    pub abort: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// The Shadow engine to run the plans on (`lab run --engine shadow`);
    /// none: the namespace engine, on this machine's network namespaces.
    pub shadow: Option<crate::engine::shadow::Shadow>,
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
    /// The simulator's own seed, for runs on the Shadow engine (the low 32
    /// bits of `seed`: Shadow's seed is 32 bits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulator_seed: Option<u64>,
    /// What the simulation cost, for runs on the Shadow engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulation: Option<SimulationCost>,
}

/// What one simulated run cost the machine: how a Shadow network's size
/// turns into wall time and memory.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct SimulationCost {
    /// Simulated seconds (Shadow's stop time).
    pub simulated_s: f64,
    /// Wall seconds the simulator ran.
    pub wall_s: f64,
    /// The machine's memory in use at its highest during the simulation,
    /// above what was in use when it started (MemTotal less MemAvailable,
    /// sampled every 50 ms: Shadow, its processes and their shared
    /// memory, and anything else the machine ran meanwhile: runs beside
    /// it with `--jobs` above 1 too), in bytes; `None` if the machine's
    /// memory could not be read.
    pub peak_memory_bytes: Option<u64>,
    /// Processes Shadow ran.
    pub processes: usize,
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
    /// [`crate::hostnet::RECORDED_SYSCTLS`] outside the lab's namespaces.
    pub machine_sysctls: BTreeMap<String, String>,
    /// The same inside the first host of the first repetition, after the
    /// lab's settings.
    pub host_sysctls: BTreeMap<String, String>,
    /// The machine's TCP congestion control module parameters
    /// ([`crate::hostnet::recorded_tcp_module_parameters`]; Cubic's HyStart).
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
    /// `LD_PRELOAD` of the lab, which every process it starts inherits
    /// (a results page's shim such as `scripts/ctor-nodelay.c`), when set:
    /// a run made with a preloaded library says so in its stored data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ld_preload: Option<String>,
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
    /// `variants` that uses it, on `host` ([`Variant::link_settings`]; checked when
    /// the scenario was read).
    pub fn endpoints_of(
        variants: &[Variant],
        host: &str,
    ) -> BTreeMap<String, BTreeMap<String, String>> {
        let mut endpoints = BTreeMap::new();
        for v in variants {
            let Ok(link) = v.link_settings(host) else {
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

/// Run every repetition of every variant (with [`RunOptions::resume`], those
/// not yet in the output directory).
pub fn run(scenario: &Scenario, opts: &RunOptions) -> Result<RunOutcome, Error> {
    let variants = scenario.variants();
    let engine = match &opts.shadow {
        Some(shadow) => {
            // Refused (a C tor variant, a link Shadow cannot model) before
            // anything runs; what it runs its own way is said first.
            for note in shadow.check(scenario, &variants)? {
                if opts.progress {
                    eprintln!("note (Shadow): {note}");
                }
            }
            shadow.id()
        }
        None => EngineId::namespaces(),
    };
    let on_shadow = opts.shadow.is_some();
    if !on_shadow && opts.jobs > 1 && variants.iter().any(|v| v.cubic_hystart.is_some()) {
        return Err(Error::Start(
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
        Journal::resume(&opts.out, scenario, reps, opts.redo, &engine)?
    } else {
        Journal::create(&opts.out, scenario, reps, &engine)?
    };
    let total = reps as usize * variants.len();
    let short = scenario.short_labels();
    let width = short.iter().map(|s| s.chars().count()).max().unwrap_or(0);
    let skipped = journal.runs_done();
    let left = total.saturating_sub(skipped);
    if opts.resume && opts.progress {
        eprintln!("resuming: {skipped} of {total} runs done, {left} to go");
    }
    let pending = pending_runs(&journal, reps, &variants)?;
    let n_jobs = opts.jobs.clamp(1, MAX_JOBS).min(pending.len().max(1));
    let progress = Progress::new(opts.progress, left, width);
    let jobs = Jobs::new((scenario, opts), (&variants, &short), &pending, &progress);
    let (done, first_error) = std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        for slot in 0..n_jobs {
            let (tx, jobs) = (tx.clone(), &jobs);
            s.spawn(move || jobs.work(slot, &tx));
        }
        drop(tx);
        let mut journal_writer = JournalWriter {
            journal: &mut journal,
            jobs: &jobs,
            ctor_version: &ctor_version,
            n_jobs,
        };
        journal_writer.record(rx)
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
    progress.done(done);
    write_csv(&opts.out.join("records.csv"), &journal.records)?;
    Ok(RunOutcome {
        out: opts.out.clone(),
        records: journal.records,
        repetitions: journal.repetitions,
        variants: variants.iter().map(|v| v.label.clone()).collect(),
    })
}

/// Writes finished runs to the journal, here only, as they finish (in
/// any order with several jobs).
struct JournalWriter<'a, 'j> {
    journal: &'a mut Journal,
    jobs: &'a Jobs<'j>,
    ctor_version: &'a Option<String>,
    n_jobs: usize,
}

impl<'j> JournalWriter<'_, 'j> {
    /// Records every run `rx` brings until the jobs are done; returns how
    /// many it recorded and the first error. After the first error
    /// nothing more is written (a journal write may have failed halfway
    /// through a line), and no job takes another run.
    fn record(&mut self, rx: Receiver<Finished<'j>>) -> (usize, Option<Error>) {
        let mut done = 0;
        let mut first_error = None;
        for finished in rx {
            if first_error.is_some() {
                continue;
            }
            match self.append(finished) {
                Ok(()) => done += 1,
                Err(e) => {
                    self.jobs.failed.store(true, Ordering::Relaxed);
                    first_error = Some(e);
                }
            }
        }
        (done, first_error)
    }

    /// Appends one finished run (and writes environment.json with the
    /// first).
    fn append(&mut self, finished: Finished<'j>) -> Result<(), Error> {
        let Finished {
            variant,
            rep,
            seed,
            result,
        } = finished;
        let (mut recs, mut r, host_sysctls) = result?;
        let out = &self.jobs.opts.out;
        if !out.join("environment.json").exists() {
            let parts = environment_parts(
                self.jobs.variants,
                self.jobs.scenario,
                variant,
                host_sysctls,
                self.ctor_version,
            );
            write_environment(out, parts)?;
        }
        for rec in &mut recs {
            rec.variant = variant.label.clone();
            rec.repetition = rep;
            rec.seed = seed;
        }
        r.jobs = self.n_jobs;
        self.journal.append(recs, r)
    }
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
pub fn repetition_seed(scenario_seed: u64, rep: u32) -> u64 {
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
fn write_environment(out: &Path, parts: EnvironmentParts) -> Result<(), Error> {
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
        ld_preload: std::env::var("LD_PRELOAD").ok().filter(|v| !v.is_empty()),
    };
    let text = serde_json::to_string_pretty(&env).unwrap_or_default();
    // Through a renamed temporary file: a half-written file would stop a
    // resumed run from writing it again.
    let tmp = out.join("environment.json.tmp");
    fs::write(&tmp, text).map_err(io_err("writing environment.json"))?;
    fs::rename(&tmp, out.join("environment.json")).map_err(io_err("writing environment.json"))
}

fn write_csv(path: &Path, records: &[TransferRecord]) -> Result<(), Error> {
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

#[cfg(test)]
mod tests {
    use super::Environment;

    #[test]
    fn environment_records_a_preload_and_reads_runs_stored_before_it() {
        let old = r#"{"kernel": "6.1", "machine_sysctls": {}, "host_sysctls": {},
            "wire": {"link_mtu": 1500, "tcp_mss": 1460, "tcp_initial_window_segments": 10}}"#;
        let env: Environment =
            serde_json::from_str(old).expect("an environment without ld_preload");
        assert_eq!(env.ld_preload, None);
        let text = serde_json::to_string(&env).expect("serialise");
        assert!(!text.contains("ld_preload"), "{text}");

        let with = Environment {
            ld_preload: Some("/tmp/ctor-nodelay.so".into()),
            ..env
        };
        let text = serde_json::to_string(&with).expect("serialise");
        let back: Environment = serde_json::from_str(&text).expect("read back");
        assert_eq!(back.ld_preload.as_deref(), Some("/tmp/ctor-nodelay.so"));
    }
}

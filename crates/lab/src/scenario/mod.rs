//! Scenario files: what to run, where, how often, and which variants to
//! compare.
//!
//! ```toml
//! name = "seed000-s3"
//! description = "A light and a bulk client share the whole path"
//! topology = "topologies/seed000-path.toml"  # the emulated network's format; relative to this file
//! repetitions = 10
//! seed = 1
//! transfer_timeout = "120s"    # a transfer not done by then is a timeout
//! stall_threshold = "5s"       # no payload progress for this long is a stall
//!
//! [relay_settings]             # optional: more relay.toml settings for every relay
//! torchestra_thresh_light = 0.4 # (not those the lab writes, such as transport)
//!
//! [ctor]                       # optional: more torrc lines for C tor variants
//! relay_torrc = ["KISTSchedRunInterval 2 msec"] # every relay (not what the lab
//! client_torrc = []            # writes, such as ORPort or Schedulers); every client
//! consensus_params = ["cellq_high=1000"] # the authority's ConsensusParams
//!                              # (not cc_alg, cfx_enabled, cfx_num_legs_set,
//!                              # cfx_max_prebuilt_set, cfx_max_linked_set)
//!
//! [[relay]]                    # nickname = host name
//! host = "guard"
//! guard = true
//! bandwidth = 2500             # optional: weight in path selection, KB/s as
//!                              # a consensus's (default 1000, all alike; onionlab
//!                              # clients only: C tor measures its own)
//! [[relay]]
//! host = "exit"
//! exit = true
//!
//! [[client]]
//! name = "light"
//! host = "client1"
//! path = ["guard", "middle", "exit"]   # optional: relay hosts, guard first
//! # paths = [["guard", "middle", "exit"], ["guard2", "middle2", "exit"]]
//!                              # optional instead of path: pinned multi-path legs,
//!                              # one exit; the matrix's legs = N uses the first N
//!
//! [[server]]
//! name = "web"
//! host = "server"
//!
//! [[workload]]
//! name = "light"               # default: the client's name
//! kind = "download"            # download | upload | echo | web | bulk | probe | trace | stream
//! client = "light"
//! server = "web"
//! size = "320KiB"
//! count = 20                   # transfers, one after another
//! think = "0s"                 # pause between transfers: "2s" or a range "0s-20s"
//! start = "0s"                 # delay before the first transfer
//! # until = "1800s"            # optional: no transfer starts this long after
//!                              # the agents' start (count then bounds it, or
//!                              # is unbounded if left out); not for trace or stream
//!
//! [[workload]]                 # seed 002's latency probes next to other traffic
//! name = "probe"
//! kind = "probe"
//! client = "light"
//! server = "web"
//! probes = 100                 # per transfer (default 100)
//! interval = "100ms"           # between probes (default 100 ms)
//!
//! [[workload]]                 # seed 002's timestamp server (crate::stream)
//! name = "stream"
//! kind = "stream"
//! client = "light"
//! server = "web"
//! duration = "60s"             # default 60 s
//!
//! [[workload]]                 # seed 003's trace replay
//! name = "interactive"
//! kind = "trace"
//! client = "light"
//! server = "web"
//! trace = "traces/interactive.csv"   # CSV `time_ms,bytes`; relative to this file
//!
//! [matrix]                     # every combination is a variant
//! transport = ["tls", "quic"]  # "auto" or any transport: onionlab lab run --help lists them;
//!                              # "ctor": C tor's relays and clients instead (docs/ctor.md)
//! congestion = ["cubic", "bbr"] # QUIC congestion control: cubic (default), newreno, bbr
//! tcp_congestion = ["cubic"]   # kernel TCP congestion control of every host: cubic, reno,
//!                              # bbr, system; default: congestion's match (cubic, reno, bbr)
//! "tcp_congestion:exit" = ["bbr"] # the same for some hosts only
//! slow_start_after_idle = ["on", "off"] # net.ipv4.tcp_slow_start_after_idle of
//!                              # every host; default: the kernel's (1, on)
//! tcp_notsent_lowat = ["kernel", "16KiB"] # net.ipv4.tcp_notsent_lowat of every
//!                              # host (the unsent bytes a socket holds before it
//!                              # stops being writable); default: the kernel's
//! tcp_pacing = ["off", "on"]   # Linux paces onionlab's channel TCP sockets, as quinn
//!                              # paces QUIC (nodes' tcp_pacing); default off
//! cubic_hystart = ["on", "off"] # Linux Cubic's HyStart (machine-wide module
//!                              # parameter, restored after each run); default: the machine's
//! scheduler = ["ewma", "round-robin"]
//! circuit_cc = ["fixed", "vegas"] # circuit flow control: tor-spec's fixed windows (default)
//!                              # or proposal 324's Vegas with XON/XOFF
//! ctor_scheduler = ["kist", "vanilla"] # C tor variants only: its Schedulers
//!                              # option (kist, kistlite, vanilla); default: tor's
//! exit_packaging = ["lazy", "eager"] # onionlab's exits: when DATA cells are made
//!                              # (lazy: when the channel takes them, the default;
//!                              # eager: as bytes arrive, C tor's; C tor variants
//!                              # are eager and only take "eager")
//! latency = ["20ms", "40ms"]   # every path's one-way latency
//! "loss:middle-exit" = ["0%", "1%"]   # one pair (both directions); also "latency:A-B"
//! "latency:a-b,b-c" = ["20ms", "40ms"] # several pairs at once
//! size = ["320KiB", "5MiB"]    # every workload's transfer size
//! "block:guard-middle" = ["none", "udp"] # drop UDP on a pair (netem `block`); "block" = every path
//! "rate:guard,middle,exit" = ["100Mbit", "10Mbit"] # these hosts' up- and downlink
//!                              # rates (a relay's capacity); "rate" = every host
//! "queue:guard,middle,exit" = ["100ms"] # their up- and downlink queues
//!                              # (packets, bytes or time, netem's units); "queue" = every host
//! clients = [1, 2, 4, 8]       # only the first N [[client]] entries (and their workloads) run
//! legs = [1, 2, 3]             # multi-path (docs/conflux.md): circuits per linked set
//!                              # (1: plain circuits; above 1 the document enables sets;
//!                              # for ctor, C tor's conflux: needs circuit_cc = "vegas"
//!                              # and lowrtt or minrtt, docs/ctor.md)
//! leg_scheduler = ["round-robin", "mtor"] # the sets' leg scheduler (default lowrtt):
//!                              # round-robin[:N], random, conflux-2013, mtor, minrtt,
//!                              # lowrtt, cwndrtt
//!
//! [[exclude]]                  # combinations left out: every pair of one entry matches
//! "loss:middle-exit" = "1%"
//! latency = "40ms"
//!
//! [report]                     # optional: how reports label and compare variants
//! compare = "transport"        # default: transport against tls, when the matrix varies it
//! baseline = "tls"
//! [report.labels]              # short names in variant labels (see crate::labels)
//! "latency:client-guard,guard-middle,middle-exit" = "per hop"
//! ```
//!
//! Errors name the file, line and column.

mod checks;
mod nodes;
mod raw;
mod settings;
mod torrc;
mod workloads;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use onionlab_circuit::conflux::sched::LegSchedulerKind;
use onionlab_circuit::relay::ExitPackaging;
use onionlab_netem::units::parse_duration;
use onionlab_netem::Topology;
use onionlab_transport::datagram::tunnel::EndToEnd;
use onionlab_transport::{Choice as TransportChoice, TransportKind};
use toml::Spanned;

use self::raw::RawScenario;
use crate::error::{Error, Result};
use crate::hostnet::KernelTcp;
use crate::labels::{combinations, full_label, ReportSettings};
use crate::matrix;
use crate::variant::{Implementation, Variant};
use crate::workload::Workload;

/// Largest scenario file read.
const MAX_SCENARIO_LEN: u64 = 1 << 20;

/// A file the scenario refers to must be a regular file of bounded size
/// (not a device, FIFO or directory that could block or never end).
fn check_small_file(path: &Path, max: u64) -> std::result::Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() > max {
        return Err(format!("larger than {max} bytes"));
    }
    Ok(())
}

/// The span of the scenario's first header of table `name` or of one of
/// its subtables (`[report]` or `[report.labels]`), for errors in its
/// settings. (toml's `Spanned` cannot take a table defined only through
/// its subtables' headers.)
fn table_header_span(src: &str, name: &str) -> std::ops::Range<usize> {
    let mut offset = 0;
    for line in src.split_inclusive('\n') {
        let trimmed = line.trim();
        let named = trimmed
            .strip_prefix('[')
            .and_then(|t| t.strip_prefix(name))
            .is_some_and(|rest| rest.starts_with(']') || rest.starts_with('.'));
        if named {
            return offset..offset + trimmed.len();
        }
        offset += line.len();
    }
    0..0
}

/// A relay of the scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelaySpec {
    /// Topology host (also the relay's nickname).
    pub host: String,
    /// Guard flag.
    pub guard: bool,
    /// Exit flag.
    pub exit: bool,
    /// Its weight in path selection, in KB/s as the network document's
    /// `bandwidth` ([`DEFAULT_RELAY_BANDWIDTH`] unless the scenario says).
    pub bandwidth: u64,
}

/// A relay's weight in path selection when the scenario gives none: all
/// relays alike.
pub const DEFAULT_RELAY_BANDWIDTH: u64 = 1000;

/// A client (an onionlab SOCKS proxy plus the workload agent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSpec {
    /// Name used by workloads.
    pub name: String,
    /// Topology host.
    pub host: String,
    /// Pinned path (relay hosts), if any.
    pub path: Option<Vec<String>>,
    /// Pinned multi-path legs (relay hosts, guard first; one exit), if
    /// any: a variant with `legs = N` uses the first N.
    pub paths: Option<Vec<Vec<String>>>,
}

impl ClientSpec {
    /// Its pinned path when it builds one circuit: `path`, or the first
    /// of its pinned legs.
    pub fn first_path(&self) -> Option<&Vec<String>> {
        self.path
            .as_ref()
            .or_else(|| self.paths.as_ref().and_then(|p| p.first()))
    }
}

/// A workload server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    /// Name used by workloads.
    pub name: String,
    /// Topology host.
    pub host: String,
}

/// A validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name.
    pub name: String,
    /// One-line description.
    pub description: String,
    /// The file it was read from.
    pub path: PathBuf,
    /// Its text (recorded with the results).
    pub text: String,
    /// The topology (before variant changes).
    pub topology: Topology,
    /// The topology file.
    pub topology_path: PathBuf,
    /// Repetitions of every variant.
    pub repetitions: u32,
    /// Base seed.
    pub seed: u64,
    /// Transfer deadline.
    pub transfer_timeout: Duration,
    /// No progress for this long is a stall.
    pub stall_threshold: Duration,
    /// Relays.
    pub relays: Vec<RelaySpec>,
    /// Clients.
    pub clients: Vec<ClientSpec>,
    /// Servers.
    pub servers: Vec<ServerSpec>,
    /// Settings set over every relay's `relay.toml` (the scenario's
    /// `[relay_settings]`), such as Torchestra's thresholds; its `[link]`
    /// part over every client's too.
    pub relay_settings: toml::Table,
    /// Workloads, as written (sizes may be replaced by a variant).
    pub workloads: Vec<Workload>,
    /// The matrix: parameter name and its values, in name order.
    pub matrix: Vec<(String, Vec<String>)>,
    /// Combinations left out (`[[exclude]]`): a variant matching every
    /// pair of one entry is not run.
    pub exclude: Vec<Vec<(String, String)>>,
    /// How reports label and compare the variants (`[report]`).
    pub report: ReportSettings,
    /// torrc lines added to every C tor relay of a `ctor` variant
    /// (`[ctor] relay_torrc`), after the lab's own.
    pub ctor_relay_torrc: Vec<String>,
    /// torrc lines added to every C tor client (`[ctor] client_torrc`).
    pub ctor_client_torrc: Vec<String>,
    /// Consensus parameters the C tor authority adds to its own
    /// (`[ctor] consensus_params`, each `name=value`).
    pub ctor_consensus_params: Vec<String>,
}

struct Ctx<'a> {
    src: &'a str,
    origin: String,
}

impl Ctx<'_> {
    fn err(&self, span: std::ops::Range<usize>, message: impl Into<String>) -> Error {
        let (line, column) = line_col(self.src, span.start);
        Error::Scenario {
            origin: self.origin.clone(),
            line,
            column,
            message: message.into(),
        }
    }

    /// A duration setting: its value, or `default` when it is not set.
    fn duration(&self, v: &Option<Spanned<String>>, default: Duration) -> Result<Duration> {
        match v {
            None => Ok(default),
            Some(s) => parse_duration(s.get_ref()).map_err(|e| self.err(s.span(), e.to_string())),
        }
    }
}

/// The scenario's topology file (`topology`, relative to `base`), read
/// and checked.
fn read_topology(
    ctx: &Ctx<'_>,
    topology: &Spanned<String>,
    base: &Path,
) -> Result<(Topology, PathBuf)> {
    let topology_path = base.join(topology.get_ref());
    check_small_file(&topology_path, MAX_SCENARIO_LEN).map_err(|m| {
        ctx.err(
            topology.span(),
            format!("topology {}: {m}", topology_path.display()),
        )
    })?;
    let parsed = Topology::from_file(&topology_path).map_err(|e| match e {
        onionlab_netem::Error::ReadTopology { .. } => ctx.err(
            topology.span(),
            format!("cannot read topology {}: {e}", topology_path.display()),
        ),
        other => Error::Topology(other),
    })?;
    Ok((parsed, topology_path))
}

fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let before = &src[..offset.min(src.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map_or(before.len(), |i| before.len() - i - 1)
        + 1;
    (line, column)
}

impl Scenario {
    /// Read and validate a scenario file.
    pub fn from_file(path: &Path) -> Result<Scenario> {
        let meta = std::fs::metadata(path).map_err(|source| Error::ReadScenario {
            path: path.to_path_buf(),
            source,
        })?;
        if meta.len() > MAX_SCENARIO_LEN {
            return Err(Error::Scenario {
                origin: path.display().to_string(),
                line: 1,
                column: 1,
                message: format!("file is larger than {MAX_SCENARIO_LEN} bytes"),
            });
        }
        let text = std::fs::read_to_string(path).map_err(|source| Error::ReadScenario {
            path: path.to_path_buf(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Scenario::from_toml_str(&text, &path.display().to_string(), base)
    }

    /// Parse and validate scenario text; `origin` names it in errors and
    /// `base` is where the topology path is relative to.
    pub fn from_toml_str(src: &str, origin: &str, base: &Path) -> Result<Scenario> {
        let ctx = Ctx {
            src,
            origin: origin.to_string(),
        };
        let raw: RawScenario = toml::from_str(src)
            .map_err(|e| ctx.err(e.span().unwrap_or(0..0), e.message().to_string()))?;
        if raw.name.get_ref().is_empty() {
            return Err(ctx.err(raw.name.span(), "name is empty"));
        }
        if *raw.repetitions.get_ref() == 0 {
            return Err(ctx.err(raw.repetitions.span(), "repetitions must be at least 1"));
        }
        let (topology, topology_path) = read_topology(&ctx, &raw.topology, base)?;
        let hosts: HashSet<&str> = topology.hosts.iter().map(|h| h.name.as_str()).collect();
        let relay_settings = settings::relay_settings(&ctx, raw.relay_settings.as_ref(), src)?;
        let (ctor_relay_torrc, ctor_client_torrc, ctor_consensus_params) =
            torrc::ctor_section(&ctx, raw.ctor.as_ref())?;
        let transfer_timeout = ctx.duration(&raw.transfer_timeout, Duration::from_secs(120))?;
        let stall_threshold = ctx.duration(&raw.stall_threshold, Duration::from_secs(5))?;
        let relays = nodes::relays(&ctx, &raw.relay, &hosts)?;
        let clients = nodes::clients(&ctx, &raw.client, &hosts, &relays)?;
        let servers = nodes::servers(&ctx, &raw.server, &hosts)?;
        let workload_context = workloads::WorkloadContext {
            clients: &clients,
            servers: &servers,
            base,
            transfer_timeout,
        };
        let workloads = workloads::workloads(&ctx, &raw.workload, &workload_context)?;
        let matrix = checks::check_matrix(&ctx, &raw.matrix, &hosts, clients.len())?;
        let exclude = checks::check_exclude(&ctx, &raw.exclude, &matrix)?;
        let report = raw.report.unwrap_or_default();
        report
            .check(&matrix)
            .map_err(|m| ctx.err(table_header_span(src, "report"), m))?;
        let congestion_span = ["congestion", "tcp_congestion"]
            .iter()
            .find_map(|k| raw.matrix.get(*k).map(|v| v.span()))
            .unwrap_or(0..0);
        let scenario = Scenario {
            name: raw.name.get_ref().clone(),
            description: raw.description,
            path: PathBuf::from(origin),
            text: src.to_string(),
            topology,
            topology_path,
            repetitions: *raw.repetitions.get_ref(),
            seed: raw.seed,
            transfer_timeout,
            stall_threshold,
            relays,
            clients,
            servers,
            workloads,
            matrix,
            exclude,
            report,
            relay_settings,
            ctor_relay_torrc,
            ctor_client_torrc,
            ctor_consensus_params,
        };
        scenario
            .check_links()
            .map_err(|m| ctx.err(congestion_span, m))?;
        scenario.check_ctor().map_err(|m| ctx.err(0..0, m))?;
        scenario.check_legs().map_err(|m| ctx.err(0..0, m))?;
        scenario.check_end_to_end().map_err(|m| ctx.err(0..0, m))?;
        Ok(scenario)
    }

    /// The matrix's combinations less the excluded ones, in a fixed order.
    fn combinations(&self) -> Vec<Vec<(String, String)>> {
        combinations(&self.matrix)
            .into_iter()
            .filter(|c| !checks::excluded(c, &self.exclude))
            .collect()
    }

    /// Every combination of matrix values, in a fixed order.
    pub fn variants(&self) -> Vec<Variant> {
        self.combinations()
            .into_iter()
            .map(|params| self.resolve(params))
            .collect()
    }

    /// How reports and progress lines label and compare the variants, in
    /// [`Scenario::variants`] order.
    pub fn design(&self) -> onionlab_report::Design {
        self.report.design(&self.matrix, &self.combinations())
    }

    /// The short label of every variant, in [`Scenario::variants`] order
    /// (e.g. `quic, loss 1%` for `loss:guard-middle=1% transport=quic`).
    pub fn short_labels(&self) -> Vec<String> {
        let full: Vec<String> = self.combinations().iter().map(|c| full_label(c)).collect();
        onionlab_report::short_labels(&self.design(), &full)
    }

    fn resolve(&self, params: Vec<(String, String)>) -> Variant {
        let mut v = Variant {
            label: String::new(),
            transport: TransportChoice::Only(TransportKind::TLS),
            implementation: Implementation::Onionlab,
            congestion: "cubic".into(),
            scheduler: "ewma".into(),
            circuit_cc: "fixed".into(),
            legs: 1,
            leg_scheduler: LegSchedulerKind::default(),
            end_to_end: EndToEnd::default(),
            exit_packaging: ExitPackaging::default(),
            ctor_scheduler: None,
            tcp_congestion: None,
            tcp_congestion_hosts: BTreeMap::new(),
            kernel_tcp: KernelTcp::default(),
            tcp_pacing: false,
            cubic_hystart: None,
            clients: None,
            topology: self.topology.clone(),
            workloads: self.workloads.clone(),
            params: Vec::new(),
            relay_settings: self.relay_settings.clone(),
        };
        for (key, value) in &params {
            // Values were checked when the file was read.
            let _ = matrix::apply(&mut v, key, value);
        }
        if let Some(n) = v.clients {
            let active: HashSet<&str> = self
                .clients
                .iter()
                .take(n)
                .map(|c| c.name.as_str())
                .collect();
            v.workloads.retain(|w| active.contains(w.client.as_str()));
        }
        v.label = full_label(&params);
        v.params = params;
        v
    }
}

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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use onionlab_circuit::conflux::sched::LegSchedulerKind;
use onionlab_circuit::relay::ExitPackaging;
use onionlab_config::ConfigFile;
use onionlab_netem::units::parse_duration;
use onionlab_netem::{Block, HostUpdate, LossModel, PathUpdate, QueueLimit, Rate, Topology};
use onionlab_transport::registry::UnknownTransport;
use onionlab_transport::{Choice as TransportChoice, TransportKind};
use serde::Deserialize;
use toml::Spanned;

use crate::error::{Error, Result};
use crate::hostnet::KernelTcp;
use crate::labels::{combinations, full_label, value_text, ReportSettings};

/// Largest scenario file read.
const MAX_SCENARIO_LEN: u64 = 1 << 20;

/// Largest trace file read.
const MAX_TRACE_FILE_LEN: u64 = 16 << 20;

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

/// QUIC congestion controls of the matrix's `congestion`
/// ([`onionlab_config::Congestion`]).
pub const CONGESTIONS: &[&str] = &["cubic", "newreno", "bbr"];
/// TCP congestion controls of the matrix's `tcp_congestion` (`system`:
/// the kernel's default, left alone).
pub const TCP_CONGESTIONS: &[&str] = &["cubic", "reno", "bbr", "system"];
/// Circuit-level flow controls of the matrix's `circuit_cc` (the network
/// document's `[params] circuit_cc`).
pub const CIRCUIT_CCS: &[&str] = &["fixed", "vegas"];
/// Values of the matrix's `slow_start_after_idle`.
pub const SLOW_START_AFTER_IDLE: &[&str] = &["on", "off"];
/// Circuit schedulers.
pub const SCHEDULERS: &[&str] = &["ewma", "round-robin"];
/// C tor's channel schedulers (its `Schedulers` option), for the matrix's
/// `ctor_scheduler`: KIST (tor's default on Linux) writes to a socket only
/// what TCP can send soon, every 10 ms; Vanilla writes as soon as cells
/// are queued.
pub const CTOR_SCHEDULERS: &[&str] = &["kist", "kistlite", "vanilla"];
/// The matrix's `transport` value that runs C tor instead of onionlab.
pub const CTOR: &str = "ctor";

/// Which onion-routing implementation runs a variant's relays and clients.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Implementation {
    /// onionlab's relays and clients, over the variant's transport.
    #[default]
    Onionlab,
    /// C tor (Debian's `tor`) in a private network with a directory
    /// authority of its own (`transport = "ctor"`; docs/ctor.md). Its
    /// channels are TLS over TCP.
    Ctor,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: Spanned<String>,
    #[serde(default)]
    description: String,
    topology: Spanned<String>,
    #[serde(default = "default_repetitions")]
    repetitions: Spanned<u32>,
    #[serde(default = "default_seed")]
    seed: u64,
    #[serde(default)]
    transfer_timeout: Option<Spanned<String>>,
    #[serde(default)]
    stall_threshold: Option<Spanned<String>>,
    #[serde(default)]
    relay: Vec<RawRelay>,
    #[serde(default)]
    client: Vec<RawClient>,
    #[serde(default)]
    server: Vec<RawServer>,
    #[serde(default)]
    workload: Vec<RawWorkload>,
    #[serde(default)]
    matrix: BTreeMap<String, Spanned<Vec<Spanned<toml::Value>>>>,
    #[serde(default)]
    exclude: Vec<Spanned<BTreeMap<String, toml::Value>>>,
    #[serde(default)]
    // Not `Spanned`: toml cannot span a table that only `[report.labels]`
    // defines; errors point at the table's header line instead.
    report: Option<ReportSettings>,
    #[serde(default)]
    relay_settings: Option<toml::Table>,
    #[serde(default)]
    ctor: Option<Spanned<RawCtor>>,
}

/// `[ctor]`: more torrc lines for a C tor variant's tors.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawCtor {
    #[serde(default)]
    relay_torrc: Vec<String>,
    #[serde(default)]
    client_torrc: Vec<String>,
    #[serde(default)]
    consensus_params: Vec<String>,
}

/// Consensus parameters the lab's authority sets from the variant
/// (`circuit_cc`, `legs`) or that would overrule it (`cfx_enabled`), which
/// `[ctor] consensus_params` may not set.
const LAB_CONSENSUS_PARAMS: &[&str] = &[
    "cc_alg",
    "cfx_enabled",
    "cfx_num_legs_set",
    "cfx_max_prebuilt_set",
    "cfx_max_linked_set",
];

/// `[ctor] consensus_params`: each `name=value` as C tor's
/// `ConsensusParams` takes it (a name of letters, digits and `_`, a
/// 32-bit integer value), none of the lab's own and no name twice.
fn consensus_params(params: &[String]) -> std::result::Result<Vec<String>, String> {
    let mut names: Vec<&str> = Vec::new();
    params
        .iter()
        .map(|param| {
            let param = param.trim();
            let valid = param.split_once('=').filter(|(name, value)| {
                !name.is_empty()
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && value.parse::<i32>().is_ok()
            });
            let Some((name, _)) = valid else {
                return Err(format!(
                    "[ctor] consensus_params: {param:?} is not `name=integer` (for example \
                     \"cellq_high=1000\")"
                ));
            };
            if LAB_CONSENSUS_PARAMS.contains(&name) {
                return Err(format!(
                    "[ctor] consensus_params may not set {name}: the lab sets it from the matrix \
                     (circuit_cc, legs)"
                ));
            }
            if names.contains(&name) {
                return Err(format!("[ctor] consensus_params: {name} set twice"));
            }
            names.push(name);
            Ok(param.to_string())
        })
        .collect()
}

/// torrc options the lab writes for C tor variants, which `[ctor]` lines
/// may not set: they place the tors in the lab's network and hosts.
const LAB_TORRC_OPTIONS: &[&str] = &[
    "DataDirectory",
    "DirAuthority",
    "Address",
    "ORPort",
    "DirPort",
    "SocksPort",
    "ControlPort",
    "Nickname",
    "TestingTorNetwork",
    "EntryNodes",
    "MiddleNodes",
    "ExitNodes",
    "StrictNodes",
    "RunAsDaemon",
    "Log",
    "CookieAuthentication",
    // What the matrix sets (`ctor_scheduler`).
    "Schedulers",
];

/// A `[ctor]` list of torrc lines, checked: one option per line, none the
/// lab writes itself.
fn torrc_lines(lines: &[String], what: &str) -> std::result::Result<Vec<String>, String> {
    lines
        .iter()
        .map(|line| {
            let line = line.trim();
            // torrc's `+Option` appends to and `/Option` clears an option:
            // the same option all the same.
            let option = line
                .split_whitespace()
                .next()
                .unwrap_or("")
                .trim_start_matches(['+', '/']);
            if option.is_empty() || line.contains('\n') || option.starts_with('#') {
                return Err(format!(
                    "[ctor] {what}: {line:?} is not one torrc line (`Option value`)"
                ));
            }
            if let Some(own) = LAB_TORRC_OPTIONS
                .iter()
                .find(|o| o.eq_ignore_ascii_case(option))
            {
                return Err(format!(
                    "[ctor] {what} may not set {own}: the lab writes it (to place the tors, or \
                     from the matrix)"
                ));
            }
            Ok(line.to_string())
        })
        .collect()
}

/// Time a stream workload needs beyond its duration (circuit, SOCKS,
/// draining): `transfer_timeout` must leave at least this much.
const STREAM_MARGIN: Duration = Duration::from_secs(10);

/// Settings the lab writes itself into every `relay.toml`, as key paths:
/// a scenario's `[relay_settings]` may not set them (the matrix does).
const LAB_RELAY_SETTINGS: &[&str] = &[
    "nickname",
    "keys",
    "listen",
    "network",
    "network_key",
    "scheduler",
    "exit_packaging",
    "exit_allow_private",
    "link.transport",
    "link.quic.congestion",
    "link.quic.initial_mtu",
    "link.tcp.congestion",
    "link.tcp.pacing",
];

/// A scenario's `[relay_settings]`, checked now: the lab's own keys are
/// refused, and the table set over a relay configuration must make a
/// valid one (unknown keys, wrong types and ranges are errors here, not
/// when the relays start). Its `[link]` part goes to clients too
/// ([`crate::run::link_settings`]).
fn relay_settings(ctx: &Ctx<'_>, raw: Option<&toml::Table>, src: &str) -> Result<toml::Table> {
    let Some(table) = raw else {
        return Ok(toml::Table::new());
    };
    let span = table_header_span(src, "relay_settings");
    let set = |path: &str| {
        let mut at = Some(table);
        let mut keys = path.split('.').peekable();
        while let Some(key) = keys.next() {
            let value = at.and_then(|t| t.get(key));
            if keys.peek().is_none() {
                return value.is_some();
            }
            at = value.and_then(toml::Value::as_table);
        }
        false
    };
    if let Some(key) = LAB_RELAY_SETTINGS.iter().find(|k| set(k)) {
        return Err(ctx.err(
            span,
            format!("[relay_settings] may not set {key:?}: the lab writes it (use the matrix)"),
        ));
    }
    relay_settings_config(table).map_err(|e| ctx.err(span, format!("[relay_settings]: {e}")))?;
    Ok(table.clone())
}

/// A relay configuration with placeholders for what the lab writes and
/// `settings` (a scenario's `[relay_settings]`) set over it.
pub(crate) fn relay_settings_config(
    settings: &toml::Table,
) -> std::result::Result<onionlab_config::RelayConfig, onionlab_config::Error> {
    onionlab_config::RelayConfig::new(
        "probe",
        "k".into(),
        SocketAddr::from(([127, 0, 0, 1], 1)),
        onionlab_config::NetworkSource::File("n".into()),
        &"0".repeat(64),
    )?
    .with_overrides(settings, "[relay_settings]")
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

fn default_repetitions() -> Spanned<u32> {
    Spanned::new(0..0, 10)
}

fn default_seed() -> u64 {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRelay {
    host: Spanned<String>,
    #[serde(default)]
    guard: bool,
    #[serde(default)]
    exit: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClient {
    name: Spanned<String>,
    host: Spanned<String>,
    #[serde(default)]
    path: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    paths: Option<Vec<Vec<Spanned<String>>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    name: Spanned<String>,
    host: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkload {
    #[serde(default)]
    name: Option<Spanned<String>>,
    kind: Spanned<String>,
    client: Spanned<String>,
    server: Spanned<String>,
    #[serde(default)]
    size: Option<Spanned<String>>,
    #[serde(default)]
    count: Option<Spanned<u32>>,
    #[serde(default)]
    think: Option<Spanned<String>>,
    #[serde(default)]
    start: Option<Spanned<String>>,
    #[serde(default)]
    probes: Option<Spanned<u32>>,
    #[serde(default)]
    interval: Option<Spanned<String>>,
    #[serde(default)]
    trace: Option<Spanned<String>>,
    #[serde(default)]
    duration: Option<Spanned<String>>,
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
}

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

/// What a workload's transfers do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    /// The client requests `size` bytes (tgen-style).
    Download,
    /// The client sends `size` bytes.
    Upload,
    /// The client sends `size` bytes; the server echoes them (seed 000).
    Echo,
    /// The server streams timestamped probes; one-way latency per probe
    /// while other traffic runs (seed 002).
    Probe,
    /// The server replays a trace of message times and sizes; delay per
    /// message (seed 003).
    Trace,
    /// The server streams timestamped records as fast as the circuit
    /// takes them for `duration`; throughput and latency (seed 002's
    /// timestamp server).
    Stream,
}

/// One workload of a variant: transfers one after another.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Workload {
    /// Name in records and reports.
    pub name: String,
    /// What each transfer does.
    pub kind: WorkloadKind,
    /// Which client runs it.
    pub client: String,
    /// Which server it talks to.
    pub server: String,
    /// Bytes per transfer.
    pub size: u64,
    /// Transfers per repetition.
    pub count: u32,
    /// Pause between transfers: uniform in `[think_min, think_max]`.
    pub think_min: Duration,
    /// Upper end of the pause.
    pub think_max: Duration,
    /// Delay before the first transfer.
    pub start: Duration,
    /// Probe workloads: probes per transfer.
    #[serde(default)]
    pub probes: u32,
    /// Probe workloads: time between probes.
    #[serde(default)]
    pub probe_interval: Duration,
    /// Trace workloads: the schedule (offset, message bytes).
    #[serde(default)]
    pub trace: Vec<(Duration, u32)>,
    /// Stream workloads: how long the server streams.
    #[serde(default)]
    pub stream_duration: Duration,
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

/// One combination of matrix values, resolved.
#[derive(Debug, Clone)]
pub struct Variant {
    /// Short label such as `scheduler=ewma latency=20ms`.
    pub label: String,
    /// Parameter values of this variant.
    pub params: Vec<(String, String)>,
    /// Transport of every channel: the nodes' `transport` setting (`auto`
    /// or a registered transport; TLS for C tor).
    pub transport: TransportChoice,
    /// Which implementation runs the relays and clients.
    pub implementation: Implementation,
    /// QUIC congestion control of every node (one of [`CONGESTIONS`];
    /// default `cubic`; no effect on TLS).
    pub congestion: String,
    /// Circuit scheduler of every relay.
    pub scheduler: String,
    /// Circuit-level flow control of the network (one of [`CIRCUIT_CCS`]).
    pub circuit_cc: String,
    /// Circuits per multi-path set (`legs`; 1: plain circuits, and the
    /// document does not enable sets).
    pub legs: usize,
    /// The sets' leg scheduler (`leg_scheduler`; the document's
    /// `cfx_scheduler`).
    pub leg_scheduler: LegSchedulerKind,
    /// When the exits package DATA cells (`exit_packaging`; onionlab's
    /// lazy packaging unless the matrix says otherwise).
    pub exit_packaging: ExitPackaging,
    /// C tor's channel scheduler (one of [`CTOR_SCHEDULERS`]; `None`:
    /// tor's default). Only for `ctor` variants.
    pub ctor_scheduler: Option<String>,
    /// TCP congestion control of every host, if the matrix sets it (one of
    /// [`TCP_CONGESTIONS`]); see [`Variant::tcp_congestion_of`].
    pub tcp_congestion: Option<String>,
    /// TCP congestion control of single hosts (`tcp_congestion:HOST`).
    pub tcp_congestion_hosts: BTreeMap<String, String>,
    /// Kernel TCP settings of every host the matrix sets
    /// (`slow_start_after_idle`, `tcp_notsent_lowat`).
    pub kernel_tcp: KernelTcp,
    /// Whether onionlab's nodes have Linux pace their channel TCP sockets
    /// (`tcp_pacing`, the nodes' setting of that name).
    pub tcp_pacing: bool,
    /// Linux Cubic's HyStart on or off during this variant's runs
    /// (`cubic_hystart`; `None`: the machine's, left alone).
    pub cubic_hystart: Option<bool>,
    /// Only the first this many clients (file order) run, with their
    /// workloads (`clients`); `None`: all.
    pub clients: Option<usize>,
    /// The topology with this variant's changes.
    pub topology: Topology,
    /// The workloads with this variant's changes.
    pub workloads: Vec<Workload>,
    /// The scenario's `[relay_settings]`, set over every `relay.toml`
    /// (its `[link]` part over every `client.toml` too).
    pub relay_settings: toml::Table,
}

impl Variant {
    /// The clients this variant runs: the first
    /// [`clients`](Self::clients) of `all`, or all of them.
    pub fn active_clients<'a>(&self, all: &'a [ClientSpec]) -> &'a [ClientSpec] {
        &all[..self.clients.unwrap_or(all.len()).min(all.len())]
    }

    /// The kernel TCP congestion control of `host`'s sockets: its own
    /// setting, else every host's, else the match of the QUIC congestion
    /// control (cubic with cubic, reno with newreno, bbr with bbr), so
    /// that TLS and QUIC run the same algorithm unless asked otherwise.
    pub fn tcp_congestion_of(&self, host: &str) -> &str {
        self.tcp_congestion_hosts
            .get(host)
            .or(self.tcp_congestion.as_ref())
            .map_or_else(|| tcp_match(&self.congestion), String::as_str)
    }
}

/// The Linux TCP congestion control matching a QUIC one.
fn tcp_match(quic: &str) -> &'static str {
    match quic {
        "newreno" => "reno",
        "bbr" => "bbr",
        _ => "cubic",
    }
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

/// Parse a size such as `320KiB`, `5 MiB`, `1MB` or `1000` (bytes).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let mult: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1048576.0,
        "GiB" => 1073741824.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        other => {
            return Err(format!(
                "invalid size {s:?}: unknown unit {other:?} (B, KiB, MiB, GiB, KB, MB, GB)"
            ))
        }
    };
    let v = num * mult;
    if !(v.is_finite() && (1.0..=1e12).contains(&v)) {
        return Err(format!("invalid size {s:?}: must be 1 byte to 1 TB"));
    }
    Ok(v.round() as u64)
}

/// A `tcp_notsent_lowat` value: `kernel` (leave it) or a size from one
/// byte to 4 GiB (the kernel's own default is 4 GiB less one: no limit).
fn parse_notsent_lowat(value: &str) -> std::result::Result<Option<u64>, String> {
    if value == "kernel" {
        return Ok(None);
    }
    match parse_size(value) {
        Ok(n) if n <= u64::from(u32::MAX) => Ok(Some(n)),
        _ => Err(format!(
            "tcp_notsent_lowat = {value:?}: \"kernel\" or a size from 1 byte to 4 GiB"
        )),
    }
}

fn parse_think(s: &str) -> std::result::Result<(Duration, Duration), String> {
    let (lo, hi) = match s.split_once('-') {
        Some((a, b)) => (a, b),
        None => (s, s),
    };
    let lo = parse_duration(lo.trim()).map_err(|e| e.to_string())?;
    let hi = parse_duration(hi.trim()).map_err(|e| e.to_string())?;
    if lo > hi {
        return Err(format!("think range {s:?} goes backwards"));
    }
    Ok((lo, hi))
}

impl Scenario {
    /// Read and validate a scenario file.
    pub fn from_file(path: &Path) -> Result<Scenario> {
        let meta = std::fs::metadata(path).map_err(|source| Error::Read {
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
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
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
        let topology_path = base.join(raw.topology.get_ref());
        check_small_file(&topology_path, MAX_SCENARIO_LEN).map_err(|m| {
            ctx.err(
                raw.topology.span(),
                format!("topology {}: {m}", topology_path.display()),
            )
        })?;
        let topology = Topology::from_file(&topology_path).map_err(|e| match e {
            onionlab_netem::Error::ReadTopology { .. } => ctx.err(
                raw.topology.span(),
                format!("cannot read topology {}: {e}", topology_path.display()),
            ),
            other => Error::Topology(other),
        })?;
        let hosts: HashSet<&str> = topology.hosts.iter().map(|h| h.name.as_str()).collect();
        let host_ok = |h: &Spanned<String>| -> Result<String> {
            if hosts.contains(h.get_ref().as_str()) {
                Ok(h.get_ref().clone())
            } else {
                Err(ctx.err(
                    h.span(),
                    format!("unknown host {:?} (not in the topology)", h.get_ref()),
                ))
            }
        };

        if *raw.repetitions.get_ref() == 0 {
            return Err(ctx.err(raw.repetitions.span(), "repetitions must be at least 1"));
        }
        let duration = |v: &Option<Spanned<String>>, default: Duration| -> Result<Duration> {
            match v {
                None => Ok(default),
                Some(s) => {
                    parse_duration(s.get_ref()).map_err(|e| ctx.err(s.span(), e.to_string()))
                }
            }
        };
        let relay_settings = relay_settings(&ctx, raw.relay_settings.as_ref(), src)?;
        let (ctor_relay_torrc, ctor_client_torrc, ctor_consensus_params) = match &raw.ctor {
            None => (Vec::new(), Vec::new(), Vec::new()),
            Some(c) => {
                let err = |m| ctx.err(c.span(), m);
                (
                    torrc_lines(&c.get_ref().relay_torrc, "relay_torrc").map_err(err)?,
                    torrc_lines(&c.get_ref().client_torrc, "client_torrc").map_err(err)?,
                    consensus_params(&c.get_ref().consensus_params).map_err(err)?,
                )
            }
        };
        let transfer_timeout = duration(&raw.transfer_timeout, Duration::from_secs(120))?;
        let stall_threshold = duration(&raw.stall_threshold, Duration::from_secs(5))?;

        let mut relays = Vec::new();
        let mut used_hosts = HashSet::new();
        for r in &raw.relay {
            let host = host_ok(&r.host)?;
            if !used_hosts.insert(host.clone()) {
                return Err(ctx.err(r.host.span(), format!("host {host:?} already runs a relay")));
            }
            relays.push(RelaySpec {
                host,
                guard: r.guard,
                exit: r.exit,
            });
        }
        let relay_hosts: HashSet<&str> = relays.iter().map(|r| r.host.as_str()).collect();
        if relays.len() < 3 {
            return Err(ctx.err(0..0, "a scenario needs at least 3 relays ([[relay]])"));
        }
        if !relays.iter().any(|r| r.exit) {
            return Err(ctx.err(0..0, "no relay has exit = true"));
        }

        let mut clients = Vec::new();
        for c in &raw.client {
            let host = host_ok(&c.host)?;
            if clients
                .iter()
                .any(|x: &ClientSpec| &x.name == c.name.get_ref())
            {
                return Err(ctx.err(
                    c.name.span(),
                    format!("duplicate client name {:?}", c.name.get_ref()),
                ));
            }
            let path = match &c.path {
                None => None,
                Some(p) => Some(pinned_path(&ctx, &c.name, p, &relay_hosts)?),
            };
            let paths = match &c.paths {
                None => None,
                Some(_) if path.is_some() => {
                    return Err(ctx.err(
                        c.name.span(),
                        "give a client either path or paths (pinned legs), not both",
                    ))
                }
                Some(legs) => Some(pinned_legs(&ctx, &c.name, legs, &relay_hosts)?),
            };
            clients.push(ClientSpec {
                name: c.name.get_ref().clone(),
                host,
                path,
                paths,
            });
        }
        let mut servers = Vec::new();
        for s in &raw.server {
            let host = host_ok(&s.host)?;
            if servers
                .iter()
                .any(|x: &ServerSpec| &x.name == s.name.get_ref())
            {
                return Err(ctx.err(
                    s.name.span(),
                    format!("duplicate server name {:?}", s.name.get_ref()),
                ));
            }
            servers.push(ServerSpec {
                name: s.name.get_ref().clone(),
                host,
            });
        }

        let mut workloads = Vec::new();
        for w in &raw.workload {
            let client = clients
                .iter()
                .find(|c| &c.name == w.client.get_ref())
                .ok_or_else(|| {
                    ctx.err(
                        w.client.span(),
                        format!("unknown client {:?}", w.client.get_ref()),
                    )
                })?;
            if !servers.iter().any(|s| &s.name == w.server.get_ref()) {
                return Err(ctx.err(
                    w.server.span(),
                    format!("unknown server {:?}", w.server.get_ref()),
                ));
            }
            let (kind, default_size, default_think) = match w.kind.get_ref().as_str() {
                "download" => (WorkloadKind::Download, 320 * 1024, "0s"),
                "upload" => (WorkloadKind::Upload, 1 << 20, "0s"),
                "echo" => (WorkloadKind::Echo, 320 * 1024, "0s"),
                // Seed 004's web clients: 320 KiB with 0-20 s think time.
                "web" => (WorkloadKind::Download, 320 * 1024, "0s-20s"),
                // Back-to-back downloads.
                "bulk" => (WorkloadKind::Download, 5 << 20, "0s"),
                "probe" => (WorkloadKind::Probe, 0, "0s"),
                "trace" => (WorkloadKind::Trace, 0, "0s"),
                "stream" => (WorkloadKind::Stream, 0, "0s"),
                other => {
                    return Err(ctx.err(
                        w.kind.span(),
                        format!(
                            "unknown workload kind {other:?} (download, upload, echo, web, bulk, \
                             probe, trace, stream)"
                        ),
                    ))
                }
            };
            let size = match &w.size {
                None => default_size,
                Some(s) => parse_size(s.get_ref()).map_err(|m| ctx.err(s.span(), m))?,
            };
            let (think_min, think_max) = match &w.think {
                None => parse_think(default_think).map_err(|m| ctx.err(w.kind.span(), m))?,
                Some(s) => parse_think(s.get_ref()).map_err(|m| ctx.err(s.span(), m))?,
            };
            let count = match &w.count {
                None => 1,
                Some(c) if *c.get_ref() == 0 => {
                    return Err(ctx.err(c.span(), "count must be at least 1"))
                }
                Some(c) => *c.get_ref(),
            };
            let name = w
                .name
                .as_ref()
                .map_or_else(|| client.name.clone(), |n| n.get_ref().clone());
            if workloads.iter().any(|x: &Workload| x.name == name) {
                let span = w.name.as_ref().map_or(w.client.span(), |n| n.span());
                return Err(ctx.err(
                    span,
                    format!("duplicate workload name {name:?} (set `name`)"),
                ));
            }
            let probes = match &w.probes {
                None => 100,
                Some(p)
                    if *p.get_ref() == 0
                        || u64::from(*p.get_ref()) > crate::traffic::MAX_PROBES =>
                {
                    return Err(ctx.err(p.span(), "probes must be 1 to 1000000"))
                }
                Some(p) => *p.get_ref(),
            };
            let probe_interval = duration(&w.interval, Duration::from_millis(100))?;
            if probe_interval.is_zero() || probe_interval > Duration::from_secs(3600) {
                let span = w.interval.as_ref().map_or(w.kind.span(), |i| i.span());
                return Err(ctx.err(span, "interval must be between 1 ms and 1 h"));
            }
            if kind != WorkloadKind::Probe && (w.probes.is_some() || w.interval.is_some()) {
                let span = w
                    .probes
                    .as_ref()
                    .map_or_else(|| w.kind.span(), |p| p.span());
                return Err(ctx.err(span, "`probes` and `interval` belong to kind = \"probe\""));
            }
            let trace = match (&w.trace, kind) {
                (Some(t), WorkloadKind::Trace) => {
                    let path = base.join(t.get_ref());
                    check_small_file(&path, MAX_TRACE_FILE_LEN).map_err(|m| {
                        ctx.err(
                            t.span(),
                            format!("cannot read trace {}: {m}", path.display()),
                        )
                    })?;
                    let text = std::fs::read_to_string(&path).map_err(|e| {
                        ctx.err(
                            t.span(),
                            format!("cannot read trace {}: {e}", path.display()),
                        )
                    })?;
                    crate::traffic::read_trace(&text, &path.display().to_string())
                        .map_err(|m| ctx.err(t.span(), m))?
                }
                (None, WorkloadKind::Trace) => {
                    return Err(ctx.err(
                        w.kind.span(),
                        "kind = \"trace\" needs `trace = \"FILE.csv\"`",
                    ))
                }
                (Some(t), _) => {
                    return Err(ctx.err(t.span(), "`trace` belongs to kind = \"trace\""))
                }
                (None, _) => Vec::new(),
            };
            let stream_duration = duration(&w.duration, Duration::from_secs(60))?;
            match (&w.duration, kind) {
                (Some(d), WorkloadKind::Stream)
                    if stream_duration.as_millis() == 0
                        || stream_duration.as_millis()
                            > u128::from(crate::stream::MAX_STREAM_MS) =>
                {
                    return Err(ctx.err(d.span(), "duration must be between 1 ms and 1 h"));
                }
                (d, WorkloadKind::Stream) if stream_duration + STREAM_MARGIN > transfer_timeout => {
                    let span = d.as_ref().map_or(w.kind.span(), |d| d.span());
                    return Err(ctx.err(
                        span,
                        format!(
                            "a {stream_duration:?} stream cannot finish within transfer_timeout \
                             ({transfer_timeout:?}; allow {STREAM_MARGIN:?} more for the circuit)"
                        ),
                    ));
                }
                (Some(d), k) if k != WorkloadKind::Stream => {
                    return Err(ctx.err(d.span(), "`duration` belongs to kind = \"stream\""));
                }
                _ => {}
            }
            if kind == WorkloadKind::Stream && w.size.is_some() {
                let span = w.size.as_ref().map_or(w.kind.span(), |s| s.span());
                return Err(ctx.err(
                    span,
                    "a stream has no size: it runs for `duration` as fast as the circuit goes",
                ));
            }
            let size = match kind {
                WorkloadKind::Stream => 0,
                WorkloadKind::Probe => u64::from(probes) * crate::traffic::PROBE_LEN as u64,
                WorkloadKind::Trace => trace.iter().map(|(_, b)| u64::from(*b)).sum(),
                _ => size,
            };
            workloads.push(Workload {
                trace,
                stream_duration,
                probes,
                probe_interval,
                name,
                kind,
                client: client.name.clone(),
                server: w.server.get_ref().clone(),
                size,
                count,
                think_min,
                think_max,
                start: duration(&w.start, Duration::ZERO)?,
            });
        }
        if workloads.is_empty() {
            return Err(ctx.err(0..0, "no [[workload]]"));
        }

        let mut matrix = Vec::new();
        for (key, values) in &raw.matrix {
            if values.get_ref().is_empty() {
                return Err(ctx.err(values.span(), format!("matrix {key:?} has no values")));
            }
            let texts: Vec<String> = values
                .get_ref()
                .iter()
                .map(|v| value_text(v.get_ref()))
                .collect();
            // Check every value now, so a typo fails before any run.
            for (i, (v, text)) in values.get_ref().iter().zip(&texts).enumerate() {
                if texts[..i].contains(text) {
                    return Err(ctx.err(v.span(), format!("matrix {key:?} lists {text:?} twice")));
                }
                check_param(key, text, &hosts).map_err(|m| ctx.err(v.span(), m))?;
                if key == "clients" {
                    check_client_count(text, clients.len()).map_err(|m| ctx.err(v.span(), m))?;
                }
            }
            matrix.push((key.clone(), texts));
        }
        if let Some((key, _)) = raw
            .matrix
            .iter()
            .find(|(k, _)| check_key(k, &hosts).is_err())
        {
            let span = raw.matrix[key].span();
            return Err(ctx.err(span, check_key(key, &hosts).err().unwrap_or_default()));
        }
        let exclude = check_exclude(&ctx, &raw.exclude, &matrix)?;
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
        Ok(scenario)
    }

    /// Every variant's `legs` fits: a client with pinned legs has at least
    /// that many, and a C tor variant with several legs is one C tor's
    /// conflux can run.
    fn check_legs(&self) -> std::result::Result<(), String> {
        for v in self.variants() {
            if v.legs > 1 && v.implementation == Implementation::Ctor {
                self.check_ctor_conflux(&v)?;
            }
            for c in v.active_clients(&self.clients) {
                if v.legs > 1 && c.path.is_some() {
                    return Err(format!(
                        "variant {:?} asks for {} legs, but client {:?} pins one path: pin its \
                         legs with paths, or leave path out for random legs",
                        v.label, v.legs, c.name
                    ));
                }
                if v.legs > 1 && c.paths.is_none() {
                    // Random legs: distinct guards, and distinct middles
                    // among the relays that are neither those nor an exit.
                    let guards = self.relays.iter().filter(|r| r.guard && !r.exit).count();
                    let others = self.relays.iter().filter(|r| !r.exit).count();
                    if guards < v.legs || others < 2 * v.legs {
                        return Err(format!(
                            "variant {:?} asks for {} random legs for client {:?}: that needs {} \
                             guard relays and {} non-exit relays in all, and the scenario has \
                             {guards} and {others}",
                            v.label,
                            v.legs,
                            c.name,
                            v.legs,
                            2 * v.legs
                        ));
                    }
                }
                let pinned = c.paths.as_ref().map_or(0, Vec::len);
                if pinned > 0 && pinned < v.legs {
                    return Err(format!(
                        "variant {:?} asks for {} legs, but client {:?} pins only {pinned} \
                         (its paths)",
                        v.label, v.legs, c.name
                    ));
                }
            }
        }
        Ok(())
    }

    /// A C tor variant with `legs` above 1 runs C tor's conflux: its leg
    /// scheduler and circuit congestion control must be ones C tor has
    /// ([`crate::ctor::CtorConflux::of`]), and pinned legs must have
    /// distinct guards and distinct middles (C tor never puts two legs of
    /// a set through one guard or one middle, so shared ones would leave a
    /// leg unbuildable).
    fn check_ctor_conflux(&self, v: &Variant) -> std::result::Result<(), String> {
        crate::ctor::CtorConflux::of(v.legs, v.leg_scheduler, &v.circuit_cc).map_err(|why| {
            format!(
                "variant {:?}: {why} (leave the combination out with [[exclude]])",
                v.label
            )
        })?;
        for c in v.active_clients(&self.clients) {
            let Some(paths) = &c.paths else { continue };
            let legs = &paths[..v.legs.min(paths.len())];
            for hop in [0, 1] {
                let mut seen = HashSet::new();
                if let Some(dup) = legs
                    .iter()
                    .filter_map(|p| p.get(hop))
                    .find(|h| !seen.insert(*h))
                {
                    return Err(format!(
                        "variant {:?}: client {:?}'s legs share the {} {dup:?}, and C tor's \
                         conflux never builds two legs of a set through one",
                        v.label,
                        c.name,
                        if hop == 0 { "guard" } else { "middle" }
                    ));
                }
            }
        }
        Ok(())
    }

    /// C tor builds three-hop circuits: a pinned path (or conflux leg) of
    /// a C tor variant must name three relays (guard, middle, exit).
    fn check_ctor(&self) -> std::result::Result<(), String> {
        // onionlab variants ignore ctor_scheduler: two that differ only in
        // it would run the same thing twice.
        let mut onionlab: HashMap<Vec<(String, String)>, String> = HashMap::new();
        for v in self.variants() {
            if v.implementation != Implementation::Ctor {
                let rest: Vec<_> = v
                    .params
                    .iter()
                    .filter(|(k, _)| k != "ctor_scheduler")
                    .cloned()
                    .collect();
                if let Some(other) = onionlab.insert(rest, v.label.clone()) {
                    return Err(format!(
                        "variants {other:?} and {:?} differ only in ctor_scheduler, which \
                         onionlab's transports ignore: leave one out with [[exclude]]",
                        v.label
                    ));
                }
                continue;
            }
            let sets_packaging = v.params.iter().any(|(k, _)| k == "exit_packaging");
            if sets_packaging && v.exit_packaging != ExitPackaging::Eager {
                return Err(format!(
                    "variant {:?}: C tor's exits package eagerly (its exit_packaging is \
                     \"eager\"): leave the combination out with [[exclude]]",
                    v.label
                ));
            }
            if v.tcp_pacing {
                return Err(format!(
                    "variant {:?}: tcp_pacing is onionlab's setting (C tor's sockets are not \
                     paced unless the kernel's qdisc does it): leave the combination out with \
                     [[exclude]]",
                    v.label
                ));
            }
            if v.scheduler == "round-robin" {
                return Err(format!(
                    "variant {:?}: C tor cannot schedule circuits round robin (since 0.4.x it \
                     raises CircuitPriorityHalflife 0 to its 30 s default, EWMA): leave the \
                     combination out with [[exclude]]",
                    v.label
                ));
            }
            for c in v.active_clients(&self.clients) {
                // Its pinned path, or with conflux every pinned leg it uses.
                let paths: Vec<&Vec<String>> = match (&c.paths, v.legs > 1) {
                    (Some(legs), true) => legs.iter().take(v.legs).collect(),
                    _ => c.first_path().into_iter().collect(),
                };
                for path in paths {
                    if path.len() != 3 {
                        return Err(format!(
                        "client {:?} has a {}-hop path, and C tor (variant {:?}) builds three-hop \
                         circuits: give it three relays, or leave the combination out with \
                         [[exclude]]",
                        c.name,
                        path.len(),
                        v.label
                    ));
                    }
                    // C tor takes only Guard relays first and Exit relays last,
                    // and the lab's authority votes those flags by role.
                    let role = |host: &str, f: fn(&RelaySpec) -> bool| {
                        self.relays.iter().any(|r| r.host == host && f(r))
                    };
                    if !role(&path[0], |r| r.guard) || !role(&path[2], |r| r.exit) {
                        return Err(format!(
                        "client {:?}'s path must start at a `guard = true` relay and end at an \
                         `exit = true` relay for C tor (variant {:?}), which takes only Guard \
                         and Exit relays there",
                        c.name, v.label
                    ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The `[link]` section the lab writes for every variant and node
    /// ([`crate::run::link_settings`]) must be valid: congestion control
    /// every transport in use has (dtls-utcp's smoltcp lanes have only
    /// Cubic and Reno), settings in range.
    fn check_links(&self) -> std::result::Result<(), String> {
        let hosts: Vec<&str> = self
            .relays
            .iter()
            .map(|r| r.host.as_str())
            .chain(self.clients.iter().map(|c| c.host.as_str()))
            .collect();
        for v in self.variants() {
            for host in &hosts {
                crate::run::link_settings(&v, host).map_err(|e| {
                    // The transport's own error, without the run's prefix.
                    let why = match e {
                        crate::run::RunError::Link(e) => e.to_string(),
                        other => other.to_string(),
                    };
                    format!(
                        "the [link] settings of {host} in variant {:?}: {why}: leave the \
                         combination out with [[exclude]]",
                        v.label
                    )
                })?;
            }
        }
        Ok(())
    }

    /// The matrix's combinations less the excluded ones, in a fixed order.
    fn combinations(&self) -> Vec<Vec<(String, String)>> {
        combinations(&self.matrix)
            .into_iter()
            .filter(|c| !excluded(c, &self.exclude))
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
            let _ = apply_param(&mut v, key, value);
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

/// A client's pinned path: relay hosts, each once, at least one.
fn pinned_path(
    ctx: &Ctx<'_>,
    client: &Spanned<String>,
    hops: &[Spanned<String>],
    relay_hosts: &HashSet<&str>,
) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for hop in hops {
        if !relay_hosts.contains(hop.get_ref().as_str()) {
            return Err(ctx.err(hop.span(), format!("{:?} is not a relay", hop.get_ref())));
        }
        if names.contains(hop.get_ref()) {
            return Err(ctx.err(
                hop.span(),
                format!("{:?} appears twice in the path", hop.get_ref()),
            ));
        }
        names.push(hop.get_ref().clone());
    }
    if names.is_empty() {
        return Err(ctx.err(client.span(), "an empty path; omit `path` for random paths"));
    }
    Ok(names)
}

/// A client's pinned legs: 1 to [`MAX_LEGS`] paths as [`pinned_path`]
/// checks them, all ending at the same exit.
fn pinned_legs(
    ctx: &Ctx<'_>,
    client: &Spanned<String>,
    legs: &[Vec<Spanned<String>>],
    relay_hosts: &HashSet<&str>,
) -> Result<Vec<Vec<String>>> {
    if legs.is_empty() || legs.len() > MAX_LEGS {
        return Err(ctx.err(
            client.span(),
            format!("paths: 1 to {MAX_LEGS} pinned legs, not {}", legs.len()),
        ));
    }
    let legs = legs
        .iter()
        .map(|hops| pinned_path(ctx, client, hops, relay_hosts))
        .collect::<Result<Vec<_>>>()?;
    if legs.iter().any(|l| l.last() != legs[0].last()) {
        return Err(ctx.err(
            client.span(),
            "the pinned legs (paths) of a client must all end at the same exit",
        ));
    }
    Ok(legs)
}

/// Most legs of a set ([`onionlab_config::MAX_LEGS`]).
pub const MAX_LEGS: usize = onionlab_config::MAX_LEGS;

/// A `legs` matrix value: 1 to [`MAX_LEGS`].
fn parse_legs(value: &str) -> std::result::Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if (1..=MAX_LEGS).contains(&n) => Ok(n),
        _ => Err(format!(
            "legs = {value:?}: circuits per multi-path set, 1 to {MAX_LEGS}"
        )),
    }
}

/// A `clients` matrix value: how many of the scenario's `total` clients
/// (the first ones, in file order) run.
fn check_client_count(value: &str, total: usize) -> std::result::Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if (1..=total).contains(&n) => Ok(n),
        _ => Err(format!(
            "clients = {value:?}: a number of clients from 1 to {total} (the [[client]] entries, first ones first)"
        )),
    }
}

fn check_key(key: &str, hosts: &HashSet<&str>) -> std::result::Result<(), String> {
    let (name, pair) = match key.split_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (key, None),
    };
    match (name, pair) {
        (
            "transport" | "congestion" | "tcp_congestion" | "slow_start_after_idle"
            | "tcp_notsent_lowat" | "tcp_pacing" | "cubic_hystart" | "scheduler"
            | "circuit_cc" | "ctor_scheduler" | "size" | "latency" | "loss" | "block"
            | "clients" | "legs" | "leg_scheduler" | "exit_packaging",
            None,
        ) => Ok(()),
        ("rate" | "queue", None) => Ok(()),
        ("tcp_congestion" | "rate" | "queue", Some(list)) => {
            for h in list.split(',') {
                if !hosts.contains(h.trim()) {
                    return Err(format!("matrix key {key:?}: unknown host {:?}", h.trim()));
                }
            }
            Ok(())
        }
        ("latency" | "loss" | "block", Some(pairs)) => {
            for pair in pairs.split(',') {
                let (a, b) = pair.trim().split_once('-').ok_or_else(|| {
                    format!("matrix key {key:?}: write pairs as HOST-HOST[,HOST-HOST...]")
                })?;
                for h in [a, b] {
                    if !hosts.contains(h) {
                        return Err(format!("matrix key {key:?}: unknown host {h:?}"));
                    }
                }
            }
            Ok(())
        }
        _ => Err(format!(
            "unknown matrix parameter {key:?} (transport, congestion, tcp_congestion, slow_start_after_idle, tcp_notsent_lowat, tcp_pacing, cubic_hystart, scheduler, circuit_cc, ctor_scheduler, size, latency, loss, block, clients, legs, leg_scheduler, exit_packaging, rate, queue, tcp_congestion:HOST, rate:HOST, queue:HOST, latency:A-B, loss:A-B, block:A-B)"
        )),
    }
}

/// Applies `update` to the access links of the hosts named in `list`
/// (comma-separated), or of every host when there is no list.
fn update_hosts(
    topology: &mut Topology,
    list: Option<&str>,
    update: &HostUpdate,
) -> std::result::Result<(), String> {
    match list {
        None => topology.hosts.iter_mut().for_each(|h| update.apply(h)),
        Some(list) => {
            for name in list.split(',').map(str::trim) {
                let id = topology.host_id(name).map_err(|e| e.to_string())?;
                update.apply(&mut topology.hosts[id]);
            }
        }
    }
    Ok(())
}

/// Whether `combo` matches every pair of one of `exclude`'s entries.
fn excluded(combo: &[(String, String)], exclude: &[Vec<(String, String)>]) -> bool {
    exclude
        .iter()
        .any(|e| e.iter().all(|pair| combo.contains(pair)))
}

/// `[[exclude]]` entries as (key, value text) pairs: every key a matrix
/// parameter, every value one of its values, and some variant left.
fn check_exclude(
    ctx: &Ctx<'_>,
    raw: &[Spanned<BTreeMap<String, toml::Value>>],
    matrix: &[(String, Vec<String>)],
) -> Result<Vec<Vec<(String, String)>>> {
    let mut out = Vec::new();
    for entry in raw {
        if entry.get_ref().is_empty() {
            return Err(ctx.err(
                entry.span(),
                "an empty [[exclude]] would exclude everything",
            ));
        }
        let mut pairs = Vec::new();
        for (key, value) in entry.get_ref() {
            let text = value_text(value);
            let Some((_, values)) = matrix.iter().find(|(k, _)| k == key) else {
                return Err(ctx.err(
                    entry.span(),
                    format!("[[exclude]] names {key:?}, which is not a matrix parameter"),
                ));
            };
            if !values.contains(&text) {
                return Err(ctx.err(
                    entry.span(),
                    format!("[[exclude]]: {text:?} is not one of the matrix's values of {key:?}"),
                ));
            }
            pairs.push((key.clone(), text));
        }
        out.push(pairs);
    }
    if !raw.is_empty() && combinations(matrix).iter().all(|c| excluded(c, &out)) {
        return Err(ctx.err(raw[0].span(), "[[exclude]] leaves no variant to run"));
    }
    Ok(out)
}

fn check_param(key: &str, value: &str, hosts: &HashSet<&str>) -> std::result::Result<(), String> {
    check_key(key, hosts)?;
    let name = key.split(':').next().unwrap_or(key);
    match name {
        "transport" if value == CTOR => Ok(()),
        "transport" => value
            .parse::<TransportChoice>()
            .map(|_| ())
            .map_err(|e| format!("{e}, or {CTOR} (C tor)")),
        "congestion" if !CONGESTIONS.contains(&value) => Err(format!(
            "unknown congestion control {value:?} ({})",
            CONGESTIONS.join(", ")
        )),
        "tcp_congestion" if !TCP_CONGESTIONS.contains(&value) => Err(format!(
            "unknown TCP congestion control {value:?} ({})",
            TCP_CONGESTIONS.join(", ")
        )),
        "slow_start_after_idle" if !SLOW_START_AFTER_IDLE.contains(&value) => {
            Err(format!("slow_start_after_idle = {value:?}: on or off"))
        }
        "tcp_notsent_lowat" => parse_notsent_lowat(value).map(|_| ()),
        "tcp_pacing" | "cubic_hystart" if !["on", "off"].contains(&value) => {
            Err(format!("{name} = {value:?}: on or off"))
        }
        "block" => Block::parse(value).map(|_| ()).map_err(|e| e.to_string()),
        "circuit_cc" if !CIRCUIT_CCS.contains(&value) => Err(format!(
            "unknown circuit congestion control {value:?} ({})",
            CIRCUIT_CCS.join(", ")
        )),
        "ctor_scheduler" if !CTOR_SCHEDULERS.contains(&value) => Err(format!(
            "unknown C tor scheduler {value:?} ({})",
            CTOR_SCHEDULERS.join(", ")
        )),
        "scheduler" if !SCHEDULERS.contains(&value) => Err(format!(
            "unknown scheduler {value:?} ({})",
            SCHEDULERS.join(", ")
        )),
        "exit_packaging" if ExitPackaging::parse(value).is_none() => Err(format!(
            "exit_packaging {value:?} is not one of {}",
            ExitPackaging::NAMES.join(", ")
        )),
        "size" => parse_size(value).map(|_| ()),
        "rate" => Rate::parse(value).map(|_| ()).map_err(|e| e.to_string()),
        "queue" => QueueLimit::parse(value)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "legs" => parse_legs(value).map(|_| ()),
        "leg_scheduler" => LegSchedulerKind::parse(value).map(|_| ()).ok_or_else(|| {
            format!(
                "unknown leg scheduler {value:?} ({})",
                LegSchedulerKind::names()
            )
        }),
        "latency" => parse_duration(value).map(|_| ()).map_err(|e| e.to_string()),
        "loss" => LossModel::parse(value)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        _ => Ok(()),
    }
}

fn apply_param(v: &mut Variant, key: &str, value: &str) -> std::result::Result<(), String> {
    let (name, pair) = match key.split_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (key, None),
    };
    let update = match name {
        "transport" if value == CTOR => {
            v.implementation = Implementation::Ctor;
            v.transport = TransportChoice::Only(TransportKind::TLS);
            return Ok(());
        }
        "transport" => {
            v.implementation = Implementation::Onionlab;
            v.transport = value.parse().map_err(|e: UnknownTransport| e.to_string())?;
            return Ok(());
        }
        "congestion" => {
            v.congestion = value.into();
            return Ok(());
        }
        "scheduler" => {
            v.scheduler = value.into();
            return Ok(());
        }
        "circuit_cc" => {
            v.circuit_cc = value.into();
            return Ok(());
        }
        "legs" => {
            v.legs = parse_legs(value)?;
            return Ok(());
        }
        "leg_scheduler" => {
            v.leg_scheduler = LegSchedulerKind::parse(value)
                .ok_or_else(|| format!("unknown leg scheduler {value:?}"))?;
            return Ok(());
        }
        "ctor_scheduler" => {
            v.ctor_scheduler = Some(value.into());
            return Ok(());
        }
        "exit_packaging" => {
            v.exit_packaging = ExitPackaging::parse(value)
                .ok_or_else(|| format!("unknown exit_packaging {value:?}"))?;
            return Ok(());
        }
        "slow_start_after_idle" => {
            v.kernel_tcp.slow_start_after_idle = Some(value == "on");
            return Ok(());
        }
        "tcp_notsent_lowat" => {
            v.kernel_tcp.notsent_lowat = parse_notsent_lowat(value)?;
            return Ok(());
        }
        "tcp_pacing" => {
            v.tcp_pacing = value == "on";
            return Ok(());
        }
        "cubic_hystart" => {
            v.cubic_hystart = Some(value == "on");
            return Ok(());
        }
        "clients" => {
            v.clients = Some(
                value
                    .parse()
                    .map_err(|_| format!("bad client count {value}"))?,
            );
            return Ok(());
        }
        "tcp_congestion" => {
            match pair {
                None => v.tcp_congestion = Some(value.into()),
                Some(list) => {
                    for h in list.split(',') {
                        v.tcp_congestion_hosts
                            .insert(h.trim().to_string(), value.into());
                    }
                }
            }
            return Ok(());
        }
        "rate" | "queue" => {
            let update = if name == "rate" {
                let rate = Rate::parse(value).map_err(|e| e.to_string())?;
                HostUpdate {
                    up: Some(rate),
                    down: Some(rate),
                    ..HostUpdate::default()
                }
            } else {
                let queue = QueueLimit::parse(value).map_err(|e| e.to_string())?;
                HostUpdate {
                    up_queue: Some(queue),
                    down_queue: Some(queue),
                    ..HostUpdate::default()
                }
            };
            update_hosts(&mut v.topology, pair, &update)?;
            return Ok(());
        }
        "size" => {
            let size = parse_size(value)?;
            for w in v.workloads.iter_mut().filter(|w| {
                !matches!(
                    w.kind,
                    WorkloadKind::Probe | WorkloadKind::Stream | WorkloadKind::Trace
                )
            }) {
                w.size = size;
            }
            return Ok(());
        }
        "latency" => PathUpdate {
            latency: Some(parse_duration(value).map_err(|e| e.to_string())?),
            ..PathUpdate::default()
        },
        "loss" => PathUpdate {
            loss: Some(LossModel::parse(value).map_err(|e| e.to_string())?),
            ..PathUpdate::default()
        },
        "block" => PathUpdate {
            block: Some(Block::parse(value).map_err(|e| e.to_string())?),
            ..PathUpdate::default()
        },
        other => return Err(format!("unknown parameter {other}")),
    };
    let t = &mut v.topology;
    match pair {
        None => {
            update.apply(&mut t.default_path);
            for spec in t.overrides.values_mut() {
                update.apply(spec);
            }
        }
        Some(pairs) => {
            for pair in pairs.split(',') {
                let (a, b) = pair.trim().split_once('-').ok_or("bad pair")?;
                let (a, b) = (
                    t.host_id(a).map_err(|e| e.to_string())?,
                    t.host_id(b).map_err(|e| e.to_string())?,
                );
                for (x, y) in [(a, b), (b, a)] {
                    let mut spec = *t.path(x, y);
                    update.apply(&mut spec);
                    t.overrides.insert((x, y), spec);
                }
            }
        }
    }
    Ok(())
}

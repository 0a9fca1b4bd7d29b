//! What one repetition deploys, as data: a [`Plan`].
//!
//! A plan is a pure function of the scenario, one of its variants, the
//! repetition's number and seed, and the time the network document starts
//! to be valid ([`Plan::of`]). It holds the emulated network (hosts,
//! addresses, access links, paths), each host's kernel TCP settings, every
//! file to write under the repetition's directory (keys, node
//! configurations, the network document, the agents' specs), and every
//! process with its program, arguments, log and what says it is ready.
//! An engine ([`crate::engine`]) runs it; `onionlab lab plan` prints it.
//!
//! Paths in a plan are relative to the repetition's directory, where an
//! engine runs every process of the plan (C tor's tors, started from
//! [`Plan::ctor`], use absolute paths under `ctor/` there).
//!
//! C tor variants: `tor` makes its own keys when it starts, and the
//! authority's torrc needs the relays' fingerprints, so a C tor plan holds
//! the network's description ([`crate::ctor::NetPlan`]) and the engine
//! writes the torrc files after the keys exist.

mod onionlab;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use onionlab_netem::Topology;
use serde::{Deserialize, Serialize};

pub use self::onionlab::{
    client_config, network_params, relay_addresses, relay_config, relay_listen, set_client_paths,
};
use crate::agent::AgentSpec;
use crate::ctor::NetPlan;
use crate::error::{io_err, Error, Result};
use crate::scenario::Scenario;
use crate::variant::{Implementation, Variant};

/// Port relays listen on in their hosts.
pub(crate) const RELAY_PORT: u16 = 9001;
/// Port workload servers listen on.
pub(crate) const SERVER_PORT: u16 = 8000;
/// The client's SOCKS port (on the client host's loopback).
pub(crate) const SOCKS_PORT: u16 = 9050;
/// Time the agents get beyond their workloads' longest schedule.
const AGENT_SLACK: Duration = Duration::from_secs(30);

/// One repetition of one variant, as an engine runs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The scenario's name.
    pub scenario: String,
    /// The variant's label.
    pub variant: String,
    /// The repetition (0-based).
    pub repetition: u32,
    /// The repetition's seed (links' random processes, keys, paths, think
    /// times).
    pub seed: u64,
    /// Which implementation runs the relays and clients.
    pub implementation: Implementation,
    /// The emulated network: hosts, their addresses and access links, and
    /// the paths between them, with the variant's changes and the
    /// repetition's seed. An engine names the network itself.
    pub topology: Topology,
    /// Each host's kernel TCP settings.
    pub hosts: Vec<HostSettings>,
    /// Linux Cubic's HyStart during the run (machine-wide; `None`: left
    /// alone).
    pub cubic_hystart: Option<bool>,
    /// Files to write under the repetition's directory before anything
    /// starts.
    pub files: Vec<PlanFile>,
    /// Processes, in the order they start (servers, relays, clients,
    /// then the agents; a C tor network starts between the servers and
    /// the agents from [`Plan::ctor`]).
    pub processes: Vec<PlanProcess>,
    /// A C tor variant's network (its tors are not in
    /// [`Plan::processes`]).
    pub ctor: Option<NetPlan>,
    /// Each agent (its spec is also in its file), whose records the
    /// engine reads when the agents are done.
    pub agents: Vec<AgentPlan>,
    /// How long the agents may take before the engine stops them.
    pub workload_deadline: Duration,
}

/// A client's workload agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentPlan {
    /// The client whose workloads it runs.
    pub client: String,
    /// The client's host, where it runs.
    pub host: String,
    /// What it does; its records go to `spec.out`, relative to the
    /// repetition's directory.
    pub spec: AgentSpec,
}

/// A host's kernel TCP settings for a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostSettings {
    /// The host.
    pub host: String,
    /// Its sockets' TCP congestion control (`system`: the kernel's
    /// default, left alone).
    pub tcp_congestion: String,
    /// Whether the algorithm is also the namespace's default (C tor's
    /// sockets cannot choose their own).
    pub default_congestion: bool,
    /// The variant's other kernel TCP settings.
    pub kernel_tcp: crate::hostnet::KernelTcp,
}

/// A file an engine writes before the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanFile {
    /// Where, relative to the repetition's directory.
    pub path: String,
    /// What.
    pub text: String,
    /// A secret: written readable by its owner only.
    pub secret: bool,
}

impl PlanFile {
    /// A plain file.
    fn text(path: impl Into<String>, text: String) -> PlanFile {
        PlanFile {
            path: path.into(),
            text,
            secret: false,
        }
    }

    /// A file only its owner may read (keys).
    fn secret(path: impl Into<String>, text: String) -> PlanFile {
        PlanFile {
            path: path.into(),
            text,
            secret: true,
        }
    }
}

/// What a process is to the run: it decides when the engine starts and
/// stops it and what it measures of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// A workload server.
    Server,
    /// A relay: its CPU time and peak memory are measured.
    Relay,
    /// A client (SOCKS proxy): its log gives circuit build times and paths.
    Client,
    /// A workload agent: the run lasts until the agents are done.
    Agent,
}

/// The program a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Program {
    /// onionlab itself (the binary the engine is given).
    Onionlab,
}

/// When a started process counts as ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ready {
    /// It accepts TCP connections on this address (from inside its host).
    Listening(SocketAddr),
    /// At once.
    Started,
}

/// A process of the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanProcess {
    /// Its name in logs and errors.
    pub name: String,
    /// The host it runs in.
    pub host: String,
    /// What it is to the run.
    pub role: Role,
    /// Its program.
    pub program: Program,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its standard error, relative to the repetition's directory.
    pub log: String,
    /// When it counts as ready.
    pub ready: Ready,
}

/// The address of `host` in `topology`.
pub(crate) fn address_of(topology: &Topology, host: &str) -> Result<Ipv4Addr> {
    let id = topology.host_id(host).map_err(Error::Netem)?;
    Ok(topology.hosts[id].address)
}

impl Plan {
    /// The plan of repetition `rep` (seed `seed`) of `variant`, with its
    /// network document valid from `now_unix`.
    ///
    /// # Errors
    ///
    /// A node configuration the variant cannot make ([`Error::Config`],
    /// [`Error::Link`], [`Error::NodeConfig`]; the scenario checks these
    /// when it is read), or a C tor network it cannot describe.
    pub fn of(
        scenario: &Scenario,
        variant: &Variant,
        (rep, seed): (u32, u64),
        now_unix: u64,
    ) -> Result<Plan> {
        let mut topology = variant.topology.clone();
        topology.seed = seed;
        let mut processes = Vec::new();
        let mut server_addrs = HashMap::new();
        for s in &scenario.servers {
            let addr = SocketAddr::new(IpAddr::V4(address_of(&topology, &s.host)?), SERVER_PORT);
            server_addrs.insert(s.name.clone(), addr);
            processes.push(PlanProcess {
                name: s.name.clone(),
                host: s.host.clone(),
                role: Role::Server,
                program: Program::Onionlab,
                args: vec![
                    "lab".into(),
                    "serve".into(),
                    "--listen".into(),
                    addr.to_string(),
                    "--tcp-congestion".into(),
                    variant.tcp_congestion_of(&s.host).into(),
                ],
                log: format!("server-{}.log", s.name),
                ready: Ready::Listening(addr),
            });
        }
        let mut files = Vec::new();
        let ctor = match variant.implementation {
            Implementation::Onionlab => {
                let servers: Vec<SocketAddr> = scenario
                    .servers
                    .iter()
                    .map(|s| server_addrs[&s.name])
                    .collect();
                let (node_files, nodes) =
                    onionlab::network(scenario, variant, seed, now_unix, &servers)?;
                files.extend(node_files);
                processes.extend(nodes);
                None
            }
            Implementation::Ctor => Some(
                NetPlan::of_variant(scenario, variant)
                    .map_err(|why| Error::Start(format!("variant {}: {why}", variant.label)))?,
            ),
        };
        let (agents, workload_deadline) = agents(scenario, variant, seed, &server_addrs);
        for a in &agents {
            let path = format!("agent-{}.json", a.client);
            let text = serde_json::to_string_pretty(&a.spec)
                .map_err(|e| Error::Config(format!("an agent spec: {e}")))?;
            files.push(PlanFile::text(&path, text));
            processes.push(PlanProcess {
                name: format!("agent-{}", a.client),
                host: a.host.clone(),
                role: Role::Agent,
                program: Program::Onionlab,
                args: vec!["lab".into(), "agent".into(), "--spec".into(), path],
                log: format!("agent-{}.log", a.client),
                ready: Ready::Started,
            });
        }
        let hosts = host_settings(variant);
        Ok(Plan {
            scenario: scenario.name.clone(),
            variant: variant.label.clone(),
            repetition: rep,
            seed,
            implementation: variant.implementation,
            topology,
            hosts,
            cubic_hystart: variant.cubic_hystart,
            files,
            processes,
            ctor,
            agents,
            workload_deadline,
        })
    }

    /// Its processes of one role, in start order.
    pub fn processes_of(&self, role: Role) -> impl Iterator<Item = &PlanProcess> {
        self.processes.iter().filter(move |p| p.role == role)
    }

    /// The hosts of its clients (onionlab's or C tor's).
    pub fn client_hosts(&self) -> Vec<&str> {
        match &self.ctor {
            Some(ctor) => ctor.clients.iter().map(|c| c.host.as_str()).collect(),
            None => self
                .processes_of(Role::Client)
                .map(|p| p.host.as_str())
                .collect(),
        }
    }

    /// Writes its files under `dir`; a secret is created readable by its
    /// owner only, and never over an existing file.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] naming the file.
    pub fn write_files(&self, dir: &Path) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        for f in &self.files {
            let path = dir.join(&f.path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(io_err(format!("creating {}", parent.display())))?;
            }
            let written = if f.secret {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
                    .and_then(|mut file| file.write_all(f.text.as_bytes()))
            } else {
                std::fs::write(&path, &f.text)
            };
            written.map_err(io_err(format!("writing {}", path.display())))?;
        }
        Ok(())
    }
}

/// Each host's TCP settings under `variant`: its congestion control
/// ([`Variant::tcp_congestion_of`]), set as the namespace's default for C
/// tor unless it is `system`, and the variant's kernel TCP settings.
fn host_settings(variant: &Variant) -> Vec<HostSettings> {
    let ctor = variant.implementation == Implementation::Ctor;
    variant
        .topology
        .hosts
        .iter()
        .map(|h| {
            let congestion = variant.tcp_congestion_of(&h.name);
            HostSettings {
                host: h.name.clone(),
                tcp_congestion: congestion.to_string(),
                default_congestion: ctor && congestion != "system",
                kernel_tcp: variant.kernel_tcp,
            }
        })
        .collect()
}

/// The agents of the variant's active clients that have workloads (each
/// records into `records-CLIENT.jsonl`), and how long they may take: the
/// longest schedule of any workload, with every transfer at its timeout
/// and longest think time, and some slack.
fn agents(
    scenario: &Scenario,
    variant: &Variant,
    seed: u64,
    server_addrs: &HashMap<String, SocketAddr>,
) -> (Vec<AgentPlan>, Duration) {
    let mut agents = Vec::new();
    let mut deadline = AGENT_SLACK;
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
            let by_count = w.start.saturating_add(per.saturating_mul(w.count));
            // The last transfer starts before `until` and ends by its timeout.
            let by_time = w.until.map(|u| u + scenario.transfer_timeout);
            let end = by_time.map_or(by_count, |t| t.min(by_count));
            deadline = deadline.max(end + AGENT_SLACK);
        }
        let spec = AgentSpec {
            socks: SocketAddr::from(([127, 0, 0, 1], SOCKS_PORT)),
            workloads,
            seed,
            stall_threshold: scenario.stall_threshold,
            transfer_timeout: scenario.transfer_timeout,
            out: format!("records-{}.jsonl", c.name).into(),
        };
        agents.push(AgentPlan {
            client: c.name.clone(),
            host: c.host.clone(),
            spec,
        });
    }
    (agents, deadline)
}

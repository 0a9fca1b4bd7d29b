//! The namespace engine: a network namespace per host of the plan, joined
//! by the user-space link emulator, with the plan's processes started in
//! their hosts.

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use onionlab_netem::{Network, NetworkOptions};

use super::measure::{
    agent_records, busy_since, client_paths, read_host_drops, read_tcp_counters, repetition_record,
    torchestra_moves, Baseline, Nodes, Observed,
};
use super::{Engine, EngineId, Measured, RunHooks, Sysctls};
use crate::error::{io_err, Error, Result};
use crate::hostnet::{self, HostTcp};
use crate::plan::{Plan, PlanProcess, Program, Ready, Role};
use crate::process::{cpu_jiffies, peak_rss, Proc};

/// How long a process may take to listen.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs plans in network namespaces on this machine (root, or a user
/// namespace of its own).
pub struct Namespaces {
    /// The onionlab binary the plans' processes run.
    pub bin: PathBuf,
    /// The emulated network's name: unique among runs at once, as it
    /// names the hosts' namespaces.
    pub lab: String,
}

impl Engine for Namespaces {
    fn id(&self) -> EngineId {
        EngineId::namespaces()
    }

    fn run(&self, plan: &Plan, dir: &Path, hooks: &RunHooks) -> Result<Measured> {
        let t0 = Instant::now();
        fs::create_dir_all(dir).map_err(io_err("creating the repetition directory"))?;
        plan.write_files(dir)?;
        let mut topology = plan.topology.clone();
        topology.name = self.lab.clone();
        // Held to the end of the run, then the machine's value is back.
        let _hystart = plan
            .cubic_hystart
            .map(hostnet::CubicHystart::set)
            .transpose()
            .map_err(|e| Error::Start(format!("variant {}: {e}", plan.variant)))?;
        if let Some(on) = plan.cubic_hystart {
            tracing::info!(
                on,
                "Linux Cubic's HyStart set for this run (machine-wide, restored after)"
            );
        }
        let tcp_module_parameters = hostnet::recorded_tcp_module_parameters();
        let net = Network::up(topology, NetworkOptions::default())?;
        let (tcp, sysctls) = prepare_hosts(&net, plan)?;
        let mut servers = self.start_role(&net, plan, dir, Role::Server)?;
        let mut nodes = self.start_nodes(&net, plan, dir, hooks.status)?;
        // What the nodes did before the workload (bootstrap, C tor's test
        // downloads) is not the workload's.
        let before = Baseline::take(&net, &nodes)?;
        let cpu_start = cpu_jiffies();
        let _agents = self.run_agents(&net, plan, dir, hooks.interrupted)?;
        let busy = busy_since(cpu_start);
        let relay_cpu_s = before.relay_cpu_since(&nodes);
        let relay_peak_rss = nodes
            .relays
            .iter()
            .map(|(p, n)| (n.clone(), peak_rss(p.pid()).unwrap_or(0)))
            .collect();
        nodes.stop(&mut servers);
        let host_drops = before.drops_since(read_host_drops(&net)?);
        let tcp_counters = before.tcp_since(read_tcp_counters(&net)?);
        let relay_names = nodes.relays.iter().map(|(_, n)| n.as_str());
        let torchestra_moves = torchestra_moves(relay_names, dir);
        let client_logs: Vec<PathBuf> = nodes.clients.iter().map(|(_, l)| l.clone()).collect();
        let client_paths = client_paths(&client_logs);
        let mut counters = net.shutdown()?;
        before.subtract_from(&mut counters);
        let records = agent_records(&plan.agents, dir);
        let seen = Observed {
            started: t0,
            busy,
            relay_cpu_s,
            relay_peak_rss,
            tcp,
            tcp_module_parameters,
            tcp_counters,
            host_drops,
            torchestra_moves,
            client_paths,
            counters: Some(counters),
            client_logs,
            circuit_watches: std::mem::take(&mut nodes.circuit_watches),
            simulated: false,
        };
        let repetition = repetition_record(plan, &records, seen);
        Ok(Measured {
            records,
            repetition,
            sysctls,
        })
    }
}

impl Namespaces {
    /// Starts `p` in its host, with the repetition's directory as its
    /// working directory and its standard error in its log.
    fn spawn(&self, net: &Network, p: &PlanProcess, dir: &Path) -> Result<Proc> {
        let log = dir.join(&p.log);
        let file = fs::File::create(&log).map_err(io_err(format!("creating {}", log.display())))?;
        let program = match p.program {
            Program::Onionlab => &self.bin,
        };
        let child = net
            .command(&p.host, program)?
            .args(&p.args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .map_err(io_err(format!("starting {} in {}", p.name, p.host)))?;
        Ok(Proc::new(&p.name, child))
    }

    /// Starts the plan's processes of `role` and waits until each is
    /// ready: servers and relays all at once, then waiting for each;
    /// clients one after another, each ready before the next starts (so
    /// their circuits are not all built at once).
    fn start_role(&self, net: &Network, plan: &Plan, dir: &Path, role: Role) -> Result<Vec<Proc>> {
        let one_by_one = role == Role::Client;
        let mut started = Vec::new();
        for p in plan.processes_of(role) {
            started.push((self.spawn(net, p, dir)?, p));
            if one_by_one {
                if let Some((proc_, p)) = started.last_mut() {
                    wait_for(net, p, proc_, dir)?;
                }
            }
        }
        if !one_by_one {
            for (proc_, p) in &mut started {
                wait_for(net, p, proc_, dir)?;
            }
        }
        Ok(started.into_iter().map(|(proc_, _)| proc_).collect())
    }

    /// Starts the relays and clients: onionlab's from the plan's
    /// processes, or a C tor network from its description.
    fn start_nodes(
        &self,
        net: &Network,
        plan: &Plan,
        dir: &Path,
        status: &dyn Fn(&str),
    ) -> Result<Nodes> {
        let Some(ctor) = &plan.ctor else {
            let relays = self.start_role(net, plan, dir, Role::Relay)?;
            let relay_hosts = plan.processes_of(Role::Relay).map(|p| p.host.clone());
            let clients = self.start_role(net, plan, dir, Role::Client)?;
            let client_logs = plan.processes_of(Role::Client).map(|p| dir.join(&p.log));
            return Ok(Nodes {
                relays: relays.into_iter().zip(relay_hosts).collect(),
                clients: clients.into_iter().zip(client_logs).collect(),
                others: Vec::new(),
                circuit_watches: Vec::new(),
            });
        };
        let place = crate::ctor::Place::Lab(net);
        let test_server = plan.processes_of(Role::Server).find_map(|p| match p.ready {
            Ready::Listening(addr) => Some(addr),
            Ready::Started => None,
        });
        let c = crate::ctor::start(&place, ctor, dir, test_server, status)?;
        status("");
        let mut circuit_watches = Vec::new();
        for (client, control) in ctor.clients.iter().zip(&c.control) {
            if let Some((addr, cookie)) = control {
                let who = (client.name.as_str(), client.host.as_str());
                let w = crate::ctor::CircuitWatch::start(&place, who, *addr, cookie)?;
                circuit_watches.push(w);
            }
        }
        Ok(Nodes {
            relays: c.relays,
            clients: c.clients,
            others: vec![c.authority],
            circuit_watches,
        })
    }

    /// Starts the agents and waits for them all (each stopped past the
    /// plan's workload deadline). Once `interrupted` says so, stops them
    /// and fails with [`Error::Interrupted`] (the caller's nodes and
    /// network go with it).
    fn run_agents(
        &self,
        net: &Network,
        plan: &Plan,
        dir: &Path,
        interrupted: &dyn Fn() -> bool,
    ) -> Result<Vec<Proc>> {
        let mut agents = self.start_role(net, plan, dir, Role::Agent)?;
        let wait_until = Instant::now() + plan.workload_deadline;
        for p in &mut agents {
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
                    return Err(Error::Interrupted);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(agents)
    }
}

/// Waits until the plan's process `p`, started as `proc_`, is ready.
fn wait_for(net: &Network, p: &PlanProcess, proc_: &mut Proc, dir: &Path) -> Result<()> {
    match p.ready {
        Ready::Listening(addr) => wait_ready(net, &p.host, addr, proc_, &dir.join(&p.log)),
        Ready::Started => Ok(()),
    }
}

/// Waits until `addr` accepts connections from inside `host`; fails if
/// `p` exits first (with its log) or after [`READY_TIMEOUT`].
fn wait_ready(net: &Network, host: &str, addr: SocketAddr, p: &mut Proc, log: &Path) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let ok = net.run_in(host, || {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        })?;
        if ok {
            return Ok(());
        }
        if let Ok(Some(status)) = p.child.try_wait() {
            let text = fs::read_to_string(log).unwrap_or_default();
            return Err(Error::Start(format!(
                "{} exited ({status}): {text}",
                p.name
            )));
        }
        if Instant::now() > deadline {
            return Err(Error::Start(format!("{} did not listen on {addr}", p.name)));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sets every host's TCP up as the plan says ([`hostnet::prepare_host`]);
/// returns each host's set-up, and the first host's recorded sysctls.
/// The nodes set their congestion control per socket (`tcp_congestion`
/// in their configurations, `lab serve --tcp-congestion`): a namespace's
/// default may only be an algorithm the machine allows unprivileged
/// users, which Cubic here is not.
///
/// C tor sets no congestion control on its sockets: for C tor plans each
/// namespace's default is set to the host's algorithm instead
/// ([`crate::plan::HostSettings::default_congestion`]).
fn prepare_hosts(net: &Network, plan: &Plan) -> Result<(Vec<HostTcp>, Sysctls)> {
    let mut tcp = Vec::new();
    let mut sysctls = BTreeMap::new();
    for h in &plan.hosts {
        let congestion = h.tcp_congestion.as_str();
        if h.default_congestion {
            hostnet::allow_congestion(congestion).map_err(io_err(format!(
                "allowing {congestion} as a namespace default for C tor (needs root; \
                 or set tcp_congestion = \"system\")"
            )))?;
        }
        let first = tcp.is_empty();
        let (got, recorded) = net
            .run_in(&h.host, || {
                let set = if h.default_congestion {
                    hostnet::set_default_congestion(congestion)
                } else {
                    Ok(())
                };
                let got = hostnet::prepare_host(&h.host, congestion, h.kernel_tcp);
                (set, got, first.then(hostnet::recorded_sysctls))
            })
            .map(|(set, got, recorded)| set.map(|()| (got, recorded)))?
            .map_err(io_err(format!(
                "setting {}'s TCP congestion control",
                h.host
            )))?;
        tcp.push(got);
        sysctls.extend(recorded.unwrap_or_default());
    }
    Ok((tcp, sysctls))
}

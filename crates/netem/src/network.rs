//! A running emulated network: host namespaces, TUNs and the forwarder.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::forwarder::{self, Forwarder, ForwarderOptions};
use crate::netns::{self, HostNs, HostRecord, LabState};
use crate::sys;
use crate::topology::{HostId, HostUpdate, PathUpdate, Topology};

/// How to bring a network up.
#[derive(Debug, Clone, Default)]
pub struct NetworkOptions {
    /// Directory for the state file and control socket
    /// (default: [`netns::default_state_dir`]).
    pub state_dir: Option<PathBuf>,
    /// Forwarder tuning.
    pub forwarder: ForwarderOptions,
    /// Overrides the topology's seed.
    pub seed: Option<u64>,
}

/// A running emulated network. Dropping it (or [`Network::shutdown`]) stops
/// the forwarder, terminates processes left in the host namespaces and
/// removes the namespaces and TUN devices.
pub struct Network {
    topology: Topology,
    hosts: Vec<HostNs>,
    forwarder: Option<Forwarder>,
    state_dir: PathBuf,
    rootless: bool,
    closed: bool,
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Network")
            .field("lab", &self.topology.name)
            .field("hosts", &self.topology.hosts.len())
            .field("rootless", &self.rootless)
            .finish()
    }
}

/// True if this process can create namespaces and TUN devices: it is root
/// (possibly inside a user namespace) and /dev/net/tun can be opened.
pub fn check_privileges() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Err(Error::Unsupported(
            "not root: run as root or in rootless mode (onionlab enters a user namespace by itself)".into(),
        ));
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(|e| Error::Unsupported(format!("cannot open /dev/net/tun: {e}")))?;
    Ok(())
}

fn in_child_userns() -> bool {
    // In the initial user namespace uid_map is "0 0 4294967295".
    std::fs::read_to_string("/proc/self/uid_map")
        .map(|m| !m.split_whitespace().eq(["0", "0", "4294967295"]))
        .unwrap_or(false)
}

impl Network {
    /// Creates the namespaces and TUNs of `topology` and starts the forwarder.
    ///
    /// Stale state of an earlier run of the same lab (crashed process) is
    /// removed first; a live run of the same lab is an error.
    pub fn up(mut topology: Topology, opts: NetworkOptions) -> Result<Network> {
        check_privileges()?;
        if let Some(seed) = opts.seed {
            topology.seed = seed;
        }
        let rootless = in_child_userns();
        let state_dir = opts
            .state_dir
            .clone()
            .unwrap_or_else(|| netns::default_state_dir(&topology.name));
        netns::cleanup_stale(&topology.name, &state_dir)?;
        let named = !rootless;
        let mut net = Network {
            topology,
            hosts: Vec::new(),
            forwarder: None,
            state_dir,
            rootless,
            closed: false,
        };
        for h in net.topology.hosts.clone() {
            let name = netns::ns_name(&net.topology.name, &h.name);
            let ns = netns::create_host(&name, h.address, net.topology.mtu, named)?;
            net.hosts.push(ns);
        }
        let tuns: Vec<tun_rs::SyncDevice> =
            net.hosts.iter_mut().filter_map(|h| h.tun.take()).collect();
        net.forwarder = Some(Forwarder::spawn(&net.topology, tuns, opts.forwarder)?);
        net.write_state()?;
        tracing::info!(lab = %net.topology.name, hosts = net.hosts.len(), rootless, "network up");
        Ok(net)
    }

    fn write_state(&self) -> Result<()> {
        let pid = std::process::id() as i32;
        let hosts = self
            .topology
            .hosts
            .iter()
            .zip(&self.hosts)
            .map(|(h, ns)| HostRecord {
                name: h.name.clone(),
                address: h.address,
                ns_path: ns.bind_path.clone().unwrap_or_else(|| {
                    PathBuf::from(format!("/proc/{pid}/fd/{}", ns.ns.as_raw_fd()))
                }),
                inode: ns.inode,
            })
            .collect();
        LabState {
            lab: self.topology.name.clone(),
            pid,
            pid_start: netns::process_start_time(pid).unwrap_or(0),
            rootless: self.rootless,
            userns_path: self
                .rootless
                .then(|| PathBuf::from(format!("/proc/{pid}/ns/user"))),
            hosts,
        }
        .store(&self.state_dir)
    }

    /// The topology this network runs.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Directory holding the state file and control socket.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Address of a host.
    pub fn address(&self, host: &str) -> Result<Ipv4Addr> {
        Ok(self.topology.hosts[self.topology.host_id(host)?].address)
    }

    fn ns_fd(&self, host: &str) -> Result<&OwnedFd> {
        let id = self.topology.host_id(host)?;
        self.hosts
            .get(id)
            .map(|h| &h.ns)
            .ok_or_else(|| Error::UnknownHost(host.to_string()))
    }

    /// A command that will run inside `host`'s namespace.
    pub fn command(&self, host: &str, program: impl AsRef<std::ffi::OsStr>) -> Result<Command> {
        // The command owns a duplicate of the namespace file (close-on-exec),
        // so it may outlive this network.
        let ns = self
            .ns_fd(host)?
            .try_clone()
            .map_err(|e| Error::io("dup namespace fd", e))?;
        let mut cmd = Command::new(program);
        // SAFETY: the closure only calls setns(2), which is async-signal-safe,
        // on a descriptor it owns.
        unsafe {
            cmd.pre_exec(move || sys::enter_net(&ns));
        }
        Ok(cmd)
    }

    /// Runs `f` on a thread inside `host`'s namespace and returns its result.
    /// Sockets created there stay in that namespace and can be used anywhere.
    pub fn run_in<F, R>(&self, host: &str, f: F) -> Result<R>
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        let ns = self.ns_fd(host)?;
        std::thread::scope(|s| {
            s.spawn(move || -> Result<R> {
                sys::enter_net(ns).map_err(|e| Error::io("setns(net)", e))?;
                Ok(f())
            })
            .join()
            .map_err(|_| Error::Control("closure panicked inside a host namespace".into()))?
        })
    }

    fn fwd(&self) -> Result<&Forwarder> {
        self.forwarder.as_ref().ok_or(Error::ForwarderGone)
    }

    /// Changes the path `a -> b` (and `b -> a` if `both`).
    pub fn update_path(&self, a: &str, b: &str, update: PathUpdate, both: bool) -> Result<()> {
        let (a, b) = (self.topology.host_id(a)?, self.topology.host_id(b)?);
        self.fwd()?
            .send(forwarder::Command::UpdatePath(a, b, update))?;
        if both {
            self.fwd()?
                .send(forwarder::Command::UpdatePath(b, a, update))?;
        }
        Ok(())
    }

    /// Changes a host's access links.
    pub fn update_host(&self, host: &str, update: HostUpdate) -> Result<()> {
        let h: HostId = self.topology.host_id(host)?;
        self.fwd()?.send(forwarder::Command::UpdateHost(h, update))
    }

    /// Current counters.
    pub fn counters(&self) -> Result<Counters> {
        self.fwd()?.counters()
    }

    /// True while the forwarder thread runs.
    pub fn is_running(&self) -> bool {
        self.forwarder.as_ref().is_some_and(|f| f.is_running())
    }

    /// Stops everything and returns the final counters.
    pub fn shutdown(mut self) -> Result<Counters> {
        self.close()
    }

    fn close(&mut self) -> Result<Counters> {
        if self.closed {
            return Err(Error::ForwarderGone);
        }
        self.closed = true;
        let counters = match self.forwarder.take() {
            Some(mut f) => f.stop(),
            None => Err(Error::ForwarderGone),
        };
        let inodes: Vec<u64> = self.hosts.iter().map(|h| h.inode).collect();
        netns::kill_processes_in(&inodes, Duration::from_secs(1));
        for h in self.hosts.drain(..) {
            if let Some(p) = &h.bind_path {
                netns::remove_named(p);
            }
        }
        let _ = std::fs::remove_dir_all(&self.state_dir);
        tracing::info!(lab = %self.topology.name, "network down");
        counters
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        if !self.closed {
            let _ = self.close();
        }
    }
}

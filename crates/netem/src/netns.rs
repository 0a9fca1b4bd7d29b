//! Network namespaces of the emulated hosts: creation, state on disk, entry
//! (`exec`), and cleanup, including of state left by a crashed run.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sched::CloneFlags;
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::sys;

/// Name of the TUN interface inside every host namespace.
pub const TUN_NAME: &str = "olab0";
/// Directory where `ip netns` keeps named namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// Name of a host's namespace: `olab-<lab>-<host>`.
pub fn ns_name(lab: &str, host: &str) -> String {
    format!("olab-{lab}-{host}")
}

/// A host namespace created by this process, with its TUN device.
pub(crate) struct HostNs {
    pub(crate) ns: OwnedFd,
    pub(crate) tun: Option<tun_rs::SyncDevice>,
    pub(crate) inode: u64,
    pub(crate) bind_path: Option<PathBuf>,
}

/// Creates a namespace with lo up and a TUN `olab0` carrying `addr`/32 and
/// the default route. With `named`, bind-mounts it at /run/netns/`name`.
pub(crate) fn create_host(name: &str, addr: Ipv4Addr, mtu: u32, named: bool) -> Result<HostNs> {
    let (ns, tun) = std::thread::spawn(move || -> Result<(OwnedFd, tun_rs::SyncDevice)> {
        sys::unshare_net()?;
        // IPv6 is not emulated; keep the kernel from sending ND/MLD noise.
        for f in ["all", "default"] {
            let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{f}/disable_ipv6"), "1");
        }
        let tun = sys::set_up_host_links(TUN_NAME, addr, mtu)?;
        let ns = open_ro(Path::new("/proc/thread-self/ns/net"))?;
        Ok((ns, tun))
    })
    .join()
    .map_err(|_| Error::Unsupported("namespace setup thread panicked".into()))??;
    let inode = sys::inode(&ns)?;
    let mut host = HostNs {
        ns,
        tun: Some(tun),
        inode,
        bind_path: None,
    };
    if named {
        std::fs::create_dir_all(NETNS_DIR)
            .map_err(|e| Error::io(format!("mkdir {NETNS_DIR}"), e))?;
        let path = Path::new(NETNS_DIR).join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| Error::io(format!("create {}", path.display()), e))?;
        let src = format!("/proc/self/fd/{}", host.ns.as_raw_fd());
        if let Err(e) = sys::bind_mount(&src, &path.to_string_lossy()) {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        host.bind_path = Some(path);
    }
    Ok(host)
}

/// Opens `path` read-only (close-on-exec, as every file std opens).
fn open_ro(path: &Path) -> Result<OwnedFd> {
    std::fs::File::open(path)
        .map(OwnedFd::from)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))
}

/// Sends `sig` to process `pid`; one that has already gone is no error.
fn signal(pid: i32, sig: Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

/// Processes whose network namespace has inode `inode` (except ourselves).
pub fn processes_in_ns(inode: u64) -> Vec<i32> {
    let me = std::process::id() as i32;
    let want = format!("net:[{inode}]");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/net"))
                .map(|l| l.to_string_lossy() == want)
                .unwrap_or(false)
        })
        .collect()
}

/// Terminates every process in the namespaces with the given inodes:
/// SIGTERM, then SIGKILL after `grace`. Returns how many were found.
pub fn kill_processes_in(inodes: &[u64], grace: Duration) -> usize {
    let find = || -> Vec<i32> { inodes.iter().flat_map(|&i| processes_in_ns(i)).collect() };
    let pids = find();
    if pids.is_empty() {
        return 0;
    }
    tracing::info!(
        count = pids.len(),
        "terminating processes left in host namespaces"
    );
    for &p in &pids {
        signal(p, Signal::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if find().is_empty() {
            return pids.len();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in find() {
        signal(p, Signal::SIGKILL);
    }
    // Wait briefly for the kernel to reap them (they may be our zombies).
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline && !find().is_empty() {
        std::thread::sleep(Duration::from_millis(20));
    }
    pids.len()
}

/// Removes a bind-mounted namespace file.
pub(crate) fn remove_named(path: &Path) {
    sys::umount_detach(&path.to_string_lossy());
    let _ = std::fs::remove_file(path);
}

/// One host as recorded in the state file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostRecord {
    /// Host name.
    pub name: String,
    /// Host address.
    pub address: Ipv4Addr,
    /// Path that opens the host's network namespace.
    pub ns_path: PathBuf,
    /// Inode of the namespace.
    pub inode: u64,
}

/// What a running lab leaves on disk so that other processes (`netem exec`,
/// `netem set`, `netem down`, the next `netem up`) can find it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabState {
    /// Lab name.
    pub lab: String,
    /// Process running the forwarder.
    pub pid: i32,
    /// Start time of that process (clock ticks since boot), against PID reuse.
    pub pid_start: u64,
    /// Whether the lab runs in an unprivileged user namespace.
    pub rootless: bool,
    /// User namespace to join first (rootless mode).
    pub userns_path: Option<PathBuf>,
    /// Hosts.
    pub hosts: Vec<HostRecord>,
}

/// Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat).
pub fn process_start_time(pid: i32) -> Option<u64> {
    let stat = procfs::process::Process::new(pid).ok()?.stat().ok()?;
    Some(stat.starttime)
}

/// Default directory for the state of `lab`: `/run/onionlab/<lab>` as root,
/// else `$XDG_RUNTIME_DIR/onionlab/<lab>` or `/tmp/onionlab-<uid>/<lab>`.
pub fn default_state_dir(lab: &str) -> PathBuf {
    let uid = nix::unistd::getuid();
    if uid.is_root() {
        return PathBuf::from("/run/onionlab").join(lab);
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("onionlab").join(lab),
        _ => PathBuf::from(format!("/tmp/onionlab-{uid}")).join(lab),
    }
}

impl LabState {
    /// File name of the state inside the state directory.
    pub const FILE: &'static str = "state.json";

    /// Reads the state of a lab, if any.
    pub fn load(dir: &Path) -> Result<Option<LabState>> {
        let path = dir.join(Self::FILE);
        match std::fs::read_to_string(&path) {
            Ok(s) => serde_json::from_str(&s)
                .map(Some)
                .map_err(|e| Error::Control(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
        }
    }

    /// Writes the state atomically.
    pub fn store(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("mkdir {}", dir.display()), e))?;
        let tmp = dir.join(".state.json.tmp");
        let text = serde_json::to_string_pretty(self).map_err(|e| Error::Control(e.to_string()))?;
        std::fs::write(&tmp, text).map_err(|e| Error::io(format!("write {}", tmp.display()), e))?;
        std::fs::rename(&tmp, dir.join(Self::FILE))
            .map_err(|e| Error::io("rename state file", e))?;
        Ok(())
    }

    /// True if the recorded process is still the one that wrote the state.
    pub fn is_alive(&self) -> bool {
        process_start_time(self.pid) == Some(self.pid_start)
    }

    /// Looks up a host.
    pub fn host(&self, name: &str) -> Result<&HostRecord> {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .ok_or_else(|| Error::UnknownHost(name.to_string()))
    }
}

/// Removes what a dead run of `lab` left: processes in its namespaces, named
/// namespaces `olab-<lab>-*` in /run/netns, and the state directory.
/// Returns a description of what was removed.
pub fn cleanup_stale(lab: &str, state_dir: &Path) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    let state = LabState::load(state_dir).ok().flatten();
    if let Some(s) = &state {
        if s.is_alive() {
            return Err(Error::AlreadyRunning {
                lab: lab.to_string(),
                pid: s.pid,
            });
        }
    }
    let mut inodes: Vec<u64> = state
        .iter()
        .flat_map(|s| s.hosts.iter().map(|h| h.inode))
        .collect();
    let prefix = ns_name(lab, "");
    let mut named = Vec::new();
    if let Ok(dir) = std::fs::read_dir(NETNS_DIR) {
        for e in dir.flatten() {
            let n = e.file_name().to_string_lossy().to_string();
            if n.starts_with(&prefix) {
                if let Ok(fd) = open_ro(&e.path()) {
                    if let Ok(i) = sys::inode(&fd) {
                        inodes.push(i);
                    }
                }
                named.push(e.path());
            }
        }
    }
    inodes.sort_unstable();
    inodes.dedup();
    let killed = kill_processes_in(&inodes, Duration::from_millis(500));
    if killed > 0 {
        removed.push(format!("{killed} process(es)"));
    }
    for p in named {
        remove_named(&p);
        removed.push(p.display().to_string());
    }
    if state_dir.exists() {
        let _ = std::fs::remove_dir_all(state_dir);
        removed.push(state_dir.display().to_string());
    }
    if !removed.is_empty() {
        tracing::warn!(lab, ?removed, "removed stale state of an earlier run");
    }
    Ok(removed)
}

/// Joins the namespace of `host` in the lab described by `state` (the user
/// namespace first in rootless mode). Only for single-threaded processes
/// that are about to exec (like `ip netns exec`).
pub fn enter_host(state: &LabState, host: &str) -> Result<()> {
    let h = state.host(host)?;
    let ns = open_ro(&h.ns_path)?;
    if let Some(u) = &state.userns_path {
        if state.rootless && !nix::unistd::geteuid().is_root() {
            let user = open_ro(u)?;
            nix::sched::setns(user, CloneFlags::CLONE_NEWUSER)
                .map_err(|e| Error::io("setns(user)", e.into()))?;
        }
    }
    sys::enter_net(ns).map_err(|e| Error::io(format!("setns(net) into {host}"), e))?;
    Ok(())
}

/// Moves the current, still single-threaded process into a fresh user
/// namespace in which it is root (uid/gid 0 mapped to the caller's ids), so
/// that it can create network namespaces and TUN devices without privileges.
///
/// Needs unprivileged user namespaces (see docs/netem.md) and a
/// world-accessible /dev/net/tun.
pub fn enter_rootless_userns() -> Result<()> {
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    nix::sched::unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| {
        Error::Unsupported(format!(
            "unprivileged user namespaces are not available: {e}"
        ))
    })?;
    let w =
        |p: &str, s: String| std::fs::write(p, s).map_err(|e| Error::io(format!("write {p}"), e));
    w("/proc/self/setgroups", "deny".into())?;
    w("/proc/self/uid_map", format!("0 {uid} 1"))?;
    w("/proc/self/gid_map", format!("0 {gid} 1"))?;
    Ok(())
}

//! C tor as a variant of the lab (`transport = "ctor"`): the scenario's
//! relays and clients run as Debian's `tor` in the same hosts, over the
//! same emulated links, measured by the same workload agents.
//!
//! Each repetition gets a fresh private tor network: a directory
//! authority beside the first relay (its own ports; it carries no
//! circuits), the relays with the scenario's guard and exit roles voted by
//! the authority, and one tor client per scenario client, its SOCKS port
//! where the agents expect onionlab's. A client is ready when it says
//! "Bootstrapped 100%" *and* a test download through it succeeded.
//! Every torrc line the lab writes, and why, is in `docs/ctor.md`.
//!
//! The external programs are `tor` and `tor-gencert` (the authority's
//! keys); nothing of C tor is linked.

use std::fs;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use onionlab_netem::Network;

use crate::error::{io_err, Error};
use crate::process::Proc;
use crate::scenario::Scenario;
use crate::variant::Variant;
use onionlab_circuit::conflux::sched::LegSchedulerKind;

mod control;
pub use control::{CircuitWatch, StreamCircuits, Watched};

/// The authority's ports, beside the first relay's own.
const AUTH_OR_PORT: u16 = 9101;
const AUTH_DIR_PORT: u16 = 9130;
/// A client's control port, when the plan asks for one.
const CONTROL_PORT: u16 = 9051;
/// The most linked sets a C tor client prebuilds or keeps
/// (`cfx_max_prebuilt_set` and `cfx_max_linked_set` are at most 255).
const MAX_CONFLUX_SETS: usize = 255;
/// How long a tor client may take to bootstrap and pass its test fetch.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// The test fetch's size.
const TEST_FETCH_BYTES: u64 = 16 * 1024;

/// `tor --version`'s first line, e.g. `Tor version 0.4.9.11.`.
///
/// # Errors
///
/// [`Error::Start`] naming what to install if `tor` or `tor-gencert`
/// is missing.
pub fn tor_version() -> Result<String, Error> {
    let missing = |what: &str, e: std::io::Error| {
        Error::Start(format!(
            "C tor variants need `{what}` ({e}): install Debian's tor (`apt-get install tor`; \
             scripts/test.sh does it as root)"
        ))
    };
    let out = Command::new("tor")
        .arg("--version")
        .output()
        .map_err(|e| missing("tor", e))?;
    Command::new("tor-gencert")
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| missing("tor-gencert", e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .next()
        .unwrap_or("")
        .trim_end_matches('.')
        .to_string())
}

/// A tor nickname for scenario host `host` (1-19 letters and digits),
/// unique by its index.
fn nickname(index: usize, host: &str) -> String {
    let alnum: String = host.chars().filter(char::is_ascii_alphanumeric).collect();
    let mut nick = format!("r{index}{alnum}");
    nick.truncate(19);
    nick
}

/// A data directory tor accepts (mode 700).
fn data_dir(path: &Path) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir_all(path).map_err(io_err(format!("creating {}", path.display())))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o700))
        .map_err(io_err(format!("chmod {}", path.display())))
}

/// The relay identity fingerprint of a data directory (tor creates the
/// keys).
fn fingerprint(dir: &Path, nick: &str) -> Result<String, Error> {
    let torrc = dir.join("fingerprint.torrc");
    let text = format!(
        "DataDirectory {}\nORPort 127.0.0.1:1\nAddress 127.0.0.1\nNickname {nick}\nSocksPort 0\nLog err stderr\n",
        dir.display()
    );
    fs::write(&torrc, text).map_err(io_err("writing a torrc"))?;
    let out = Command::new("tor")
        .args(["--defaults-torrc", "/dev/null", "-f"])
        .arg(&torrc)
        .arg("--list-fingerprint")
        .output()
        .map_err(io_err("running tor --list-fingerprint"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| {
            let (name, fp) = l.split_once(' ')?;
            (name == nick).then(|| fp.replace(' ', ""))
        })
        .filter(|fp| fp.len() == 40)
        .ok_or_else(|| {
            Error::Start(format!(
                "tor --list-fingerprint for {nick} printed no fingerprint: {}{}",
                text,
                String::from_utf8_lossy(&out.stderr)
            ))
        })
}

/// The authority's v3 identity (creates its keys and certificate).
fn authority_keys(dir: &Path, dir_addr: SocketAddr) -> Result<String, Error> {
    let keys = dir.join("keys");
    data_dir(&keys)?;
    let mut child = Command::new("tor-gencert")
        .current_dir(&keys)
        .args(["--create-identity-key", "-m", "12", "-a"])
        .arg(dir_addr.to_string())
        .args(["--passphrase-fd", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io_err("running tor-gencert"))?;
    // An empty passphrase.
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        let _ = stdin.write_all(b"\n");
    }
    let out = child
        .wait_with_output()
        .map_err(io_err("running tor-gencert"))?;
    let cert = fs::read_to_string(keys.join("authority_certificate")).map_err(|e| {
        Error::Start(format!(
            "tor-gencert made no certificate ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    })?;
    cert.lines()
        .find_map(|l| l.strip_prefix("fingerprint "))
        .map(|f| f.trim().to_string())
        .ok_or_else(|| Error::Start("the authority certificate has no fingerprint".into()))
}

/// Where a C tor network runs.
pub enum Place<'a> {
    /// In the lab's hosts: each node at its host's address, with the
    /// lab's fixed ports.
    Lab(&'a Network),
    /// Every node on 127.0.0.1 in this namespace, each with free ports of
    /// its own (`onionlab bench ctor-network`).
    Loopback(PortPool),
}

/// Free loopback ports for a network's nodes: each stays bound (so no two
/// nodes get the same one, and nothing else takes it) until the tors are
/// about to start.
#[derive(Default)]
pub struct PortPool(std::sync::Mutex<Vec<std::net::TcpListener>>);

impl PortPool {
    fn take(&self) -> Result<u16, Error> {
        let l =
            std::net::TcpListener::bind("127.0.0.1:0").map_err(io_err("finding a free port"))?;
        let port = l
            .local_addr()
            .map_err(io_err("finding a free port"))?
            .port();
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(l);
        Ok(port)
    }

    fn release(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

impl Place<'_> {
    fn ip(&self, host: &str) -> Result<IpAddr, Error> {
        match self {
            Place::Lab(net) => Ok(IpAddr::V4(net.address(host)?)),
            Place::Loopback(_) => Ok(IpAddr::from([127, 0, 0, 1])),
        }
    }

    /// `fixed` in the lab's hosts; a free port on loopback.
    fn port(&self, fixed: u16) -> Result<u16, Error> {
        match self {
            Place::Lab(_) => Ok(fixed),
            Place::Loopback(pool) => pool.take(),
        }
    }

    fn tor_command(&self, host: &str) -> Result<Command, Error> {
        match self {
            Place::Lab(net) => Ok(net.command(host, "tor")?),
            Place::Loopback(_) => Ok(Command::new("tor")),
        }
    }

    fn run_in<R: Send>(&self, host: &str, f: impl FnOnce() -> R + Send) -> Result<R, Error> {
        match self {
            Place::Lab(net) => Ok(net.run_in(host, f)?),
            Place::Loopback(_) => Ok(f()),
        }
    }
}

/// A relay of a C tor network: its host and roles.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RelayRole {
    /// The host it runs in (its name in logs and records).
    pub host: String,
    /// Voted Guard.
    pub guard: bool,
    /// Voted Exit.
    pub exit: bool,
}

/// A client of a C tor network.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClientRole {
    /// Its name.
    pub name: String,
    /// The host it runs in.
    pub host: String,
    /// Guard, middle and exit hosts, or `None`: tor chooses.
    pub path: Option<Vec<String>>,
    /// With conflux: the pinned legs it may use (guard, middle, exit
    /// hosts; one exit), or none: tor chooses.
    pub legs: Vec<Vec<String>>,
    /// Its workloads: each has a SOCKS username of its own, so C tor
    /// gives each a circuit (with conflux, a linked set) of its own.
    pub isolated_streams: usize,
}

/// C tor's conflux (proposal 329) for every client of a network.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CtorConflux {
    /// Circuits per linked set (consensus parameter `cfx_num_legs_set`).
    pub legs: usize,
    /// The clients' `ConfluxClientUX`, which picks the exit's scheduler.
    pub ux: String,
}

impl CtorConflux {
    /// C tor's conflux with `legs` legs and the leg scheduler `kind`, or
    /// why C tor cannot run it. C tor has two of the lab's schedulers:
    /// the client asks for one by its UX (`ConfluxClientUX`; C tor's
    /// `conflux_choose_algorithm`: throughput is LowRTT, latency MinRTT),
    /// and conflux needs circuit congestion control (C tor turns conflux
    /// off without it).
    pub fn of(
        legs: usize,
        kind: LegSchedulerKind,
        circuit_cc: &str,
    ) -> Result<CtorConflux, String> {
        let ux = match kind {
            LegSchedulerKind::LowRtt => "throughput",
            LegSchedulerKind::MinRtt => "latency",
            other => {
                return Err(format!(
                    "C tor's conflux schedules by lowrtt or minrtt, not {other}"
                ))
            }
        };
        if circuit_cc != "vegas" {
            return Err(format!(
                "C tor runs conflux only with circuit congestion control: \
                 circuit_cc = \"vegas\", not {circuit_cc:?}"
            ));
        }
        Ok(CtorConflux {
            legs,
            ux: ux.into(),
        })
    }
}

/// What a C tor network is made of.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetPlan {
    /// The relays; the authority runs beside the first.
    pub relays: Vec<RelayRole>,
    /// The clients.
    pub clients: Vec<ClientRole>,
    /// Proposal 324's Vegas (`cc_alg=2`), or SENDME windows (`cc_alg=0`).
    pub vegas: bool,
    /// Conflux on the clients (`ConfluxEnabled 1`), or off.
    pub conflux: Option<CtorConflux>,
    /// Every tor's channel scheduler (`Schedulers`; None: tor's default,
    /// KIST on Linux).
    pub schedulers: Option<String>,
    /// Give each client a control port (cookie authentication).
    pub control_port: bool,
    /// More torrc lines for every relay, after the lab's (`[ctor]`).
    pub relay_torrc: Vec<String>,
    /// More torrc lines for every client, after the lab's.
    pub client_torrc: Vec<String>,
    /// More consensus parameters (`name=value`), after the lab's.
    pub consensus_params: Vec<String>,
}

impl NetPlan {
    /// The `Schedulers` line of every relay and client, if the plan
    /// chooses one.
    fn scheduler_lines(&self) -> Vec<String> {
        let name = match self.schedulers.as_deref() {
            None => return Vec::new(),
            Some("kist") => "KIST",
            Some("kistlite") => "KISTLite",
            Some("vanilla") => "Vanilla",
            Some(other) => other,
        };
        vec![format!("Schedulers {name}")]
    }

    /// The relays and active clients of a scenario's variant (with
    /// `legs` above 1, conflux), or why C tor cannot run it (the
    /// scenario's checks refuse such variants already).
    pub fn of_variant(scenario: &Scenario, variant: &Variant) -> Result<NetPlan, String> {
        let conflux = match variant.legs {
            0 | 1 => None,
            legs => Some(CtorConflux::of(
                legs,
                variant.leg_scheduler,
                &variant.circuit_cc,
            )?),
        };
        let workloads_of = |c: &crate::scenario::ClientSpec| {
            let names: std::collections::BTreeSet<&str> = variant
                .workloads
                .iter()
                .filter(|w| w.client == c.name)
                .map(|w| w.name.as_str())
                .collect();
            names.len()
        };
        let legs_of = |c: &crate::scenario::ClientSpec| match (&conflux, &c.paths) {
            (Some(cfx), Some(paths)) => paths.iter().take(cfx.legs).cloned().collect(),
            _ => Vec::new(),
        };
        let plan = NetPlan {
            relays: scenario
                .relays
                .iter()
                .map(|r| RelayRole {
                    host: r.host.clone(),
                    guard: r.guard,
                    exit: r.exit,
                })
                .collect(),
            clients: variant
                .active_clients(&scenario.clients)
                .iter()
                .map(|c| ClientRole {
                    name: c.name.clone(),
                    host: c.host.clone(),
                    path: conflux.is_none().then(|| c.first_path().cloned()).flatten(),
                    legs: legs_of(c),
                    isolated_streams: workloads_of(c),
                })
                .collect(),
            vegas: variant.circuit_cc == "vegas",
            conflux,
            schedulers: variant.ctor_scheduler.clone(),
            // For the circuits' build times (CircuitWatch).
            control_port: true,
            relay_torrc: scenario.ctor_relay_torrc.clone(),
            client_torrc: scenario.ctor_client_torrc.clone(),
            consensus_params: scenario.ctor_consensus_params.clone(),
        };
        if plan.conflux.is_some() && plan.prebuilt_sets() > MAX_CONFLUX_SETS {
            return Err(format!(
                "C tor's conflux keeps at most {MAX_CONFLUX_SETS} sets prebuilt, and a client \
                 needs one per workload and one more: {} here",
                plan.prebuilt_sets()
            ));
        }
        Ok(plan)
    }

    /// With conflux, the linked sets client `c` needs ready before its
    /// workloads start: one for the test download (no SOCKS username:
    /// isolated from the workloads) and one per workload.
    fn sets_needed(&self, c: &ClientRole) -> usize {
        1 + c.isolated_streams
    }

    /// With conflux, the sets each client keeps prebuilt (consensus
    /// parameter `cfx_max_prebuilt_set`, C tor's default 3): what the
    /// client with the most workloads needs. C tor counts an isolated set
    /// as prebuilt, so with fewer it would not build a set for every
    /// workload, and a workload without one silently takes a plain
    /// circuit.
    fn prebuilt_sets(&self) -> usize {
        self.clients
            .iter()
            .map(|c| self.sets_needed(c))
            .max()
            .unwrap_or(1)
            .max(3)
    }

    /// Three relays (`relay0` guard, `relay1`, `relay2` exit) and one
    /// client (`client`) pinned to them, as `onionlab bench chain` runs.
    pub fn chain(vegas: bool) -> NetPlan {
        let relay = |i: usize| RelayRole {
            host: format!("relay{i}"),
            guard: i == 0,
            exit: i == 2,
        };
        NetPlan {
            relays: (0..3).map(relay).collect(),
            clients: vec![ClientRole {
                name: "client".into(),
                host: "client".into(),
                path: Some((0..3).map(|i| format!("relay{i}")).collect()),
                legs: Vec::new(),
                isolated_streams: 0,
            }],
            vegas,
            conflux: None,
            schedulers: None,
            control_port: true,
            relay_torrc: Vec::new(),
            client_torrc: Vec::new(),
            consensus_params: Vec::new(),
        }
    }
}

/// The C tor processes of a running network; they stop when it is
/// dropped.
pub struct CtorNetwork {
    /// Relays, by host.
    pub relays: Vec<(Proc, String)>,
    /// Clients and their notice logs.
    pub clients: Vec<(Proc, PathBuf)>,
    /// Each client's SOCKS port (same order).
    pub socks: Vec<SocketAddr>,
    /// Each client's control port, if the plan asked for one, and its
    /// cookie file.
    pub control: Vec<Option<(SocketAddr, PathBuf)>>,
    /// The directory authority (not a relay of the plan).
    pub authority: Proc,
}

/// One relay's place in the network.
struct RelayPlan {
    host: String,
    nick: String,
    dir: PathBuf,
    addr: IpAddr,
    or_port: u16,
    fingerprint: String,
    guard: bool,
    exit: bool,
}

/// The authority's place in the network.
struct AuthPlan {
    host: String,
    dir: PathBuf,
    addr: IpAddr,
    or_port: u16,
    dir_port: u16,
    /// The `DirAuthority` line every tor gets.
    line: String,
}

/// One client's place in the network.
struct ClientPlan {
    name: String,
    host: String,
    dir: PathBuf,
    socks: SocketAddr,
    control: Option<SocketAddr>,
}

/// What every tor of the network shares.
/// `ONIONLAB_CTOR_LOG=info` (or `debug`) adds a second log at that level,
/// `LEVEL.log` beside `notice.log`, for debugging a C tor network.
fn common_torrc(dir: &Path, dir_authority: &str) -> String {
    let mut t = format!(
        "TestingTorNetwork 1\n{dir_authority}\nDataDirectory {}\nLog notice file {}\n\
         SafeLogging 0\nRunAsDaemon 0\nShutdownWaitLength 0\nSandbox 0\n\
         ContactInfo onionlab-lab@localhost\n",
        dir.display(),
        dir.join("notice.log").display()
    );
    if let Ok(level) = std::env::var("ONIONLAB_CTOR_LOG") {
        if level == "info" || level == "debug" {
            t.push_str(&format!(
                "Log {level} file {}\n",
                dir.join(format!("{level}.log")).display()
            ));
        }
    }
    t
}

/// The authority's torrc: quick votes, the plan's roles as flags, and
/// its circuit congestion control, conflux sets and the scenario's own
/// consensus parameters.
fn authority_torrc(auth: &AuthPlan, relays: &[RelayPlan], plan: &NetPlan) -> String {
    let list = |f: fn(&RelayPlan) -> bool| {
        relays
            .iter()
            .filter(|r| f(r))
            .map(|r| r.fingerprint.clone())
            .collect::<Vec<_>>()
            .join(",")
    };
    let cc_alg = if plan.vegas { 2 } else { 0 };
    // Conflux's legs per set (C tor's default is 2) and the sets each
    // client prebuilds (at most 10 linked sets by default).
    let cfx = plan.conflux.as_ref().map_or(String::new(), |c| {
        let sets = plan.prebuilt_sets();
        let linked = if sets > 10 {
            format!(" cfx_max_linked_set={sets}")
        } else {
            String::new()
        };
        format!(
            " cfx_num_legs_set={} cfx_max_prebuilt_set={sets}{linked}",
            c.legs
        )
    });
    let own: String = plan
        .consensus_params
        .iter()
        .map(|p| format!(" {p}"))
        .collect();
    let (addr, or_port, dir_port) = (auth.addr, auth.or_port, auth.dir_port);
    let mut t = format!(
        "{}Nickname auth\nAddress {addr}\nORPort {addr}:{or_port}\n\
         DirPort {addr}:{dir_port}\nSocksPort 0\nAuthoritativeDirectory 1\n\
         V3AuthoritativeDirectory 1\nAssumeReachable 1\n__DisablePredictedCircuits 1\n\
         ExitRelay 0\nExitPolicy reject *:*\n\
         TestingV3AuthInitialVotingInterval 5\nTestingV3AuthInitialVoteDelay 2\n\
         TestingV3AuthInitialDistDelay 2\nV3AuthVotingInterval 10\nV3AuthVoteDelay 2\n\
         V3AuthDistDelay 2\nAuthDirVoteStableGuaranteeMinUptime 0\n\
         AuthDirVoteStableGuaranteeMTBF 0\n\
         ConsensusParams cc_alg={cc_alg}{cfx}{own}\n",
        common_torrc(&auth.dir, &auth.line)
    );
    let guards = list(|r| r.guard);
    if !guards.is_empty() {
        t.push_str(&format!(
            "TestingDirAuthVoteGuard {guards}\nTestingDirAuthVoteGuardIsStrict 1\n"
        ));
    }
    let exits = list(|r| r.exit);
    if !exits.is_empty() {
        t.push_str(&format!(
            "TestingDirAuthVoteExit {exits}\nTestingDirAuthVoteExitIsStrict 1\n"
        ));
    }
    t
}

fn relay_torrc(auth: &AuthPlan, r: &RelayPlan, plan: &NetPlan) -> String {
    let mut t = format!(
        "{}Nickname {}\nAddress {}\nORPort {}:{}\nSocksPort 0\nAssumeReachable 1\n\
         __DisablePredictedCircuits 1\n",
        common_torrc(&r.dir, &auth.line),
        r.nick,
        r.addr,
        r.addr,
        r.or_port
    );
    if r.exit {
        t.push_str(
            "ExitRelay 1\nExitPolicyRejectPrivate 0\nExitPolicyRejectLocalInterfaces 0\n\
             RefuseUnknownExits 0\n",
        );
        // The network has only the lab's hosts (or loopback): accepting
        // everything lets the policy's summary in the consensus say so,
        // which clients that use microdescriptors (the default) need.
        t.push_str("ExitPolicy accept *:*\n");
    } else {
        t.push_str("ExitRelay 0\nExitPolicy reject *:*\n");
    }
    push_lines(&mut t, &plan.scheduler_lines());
    push_lines(&mut t, &plan.relay_torrc);
    t
}

/// Append torrc lines of the scenario (its matrix and `[ctor]`), each on
/// its own line.
fn push_lines(torrc: &mut String, lines: &[String]) {
    for line in lines {
        torrc.push_str(line);
        torrc.push('\n');
    }
}

/// The relays a client's circuits may use, as torrc's node lists
/// (comma-separated fingerprints).
struct PinnedNodes {
    entry: String,
    middle: String,
    exit: String,
}

/// A client's torrc: `pinned` limits its circuits' guards, middles and
/// exits; without it tor chooses, with middles among `relays` (never the
/// authority, which is no relay of the plan). With `conflux`, it builds
/// linked sets.
fn client_torrc(
    auth: &AuthPlan,
    c: &ClientPlan,
    pinned: Option<PinnedNodes>,
    relays: &[&str],
    conflux: Option<&CtorConflux>,
    extra: &[String],
) -> String {
    // With conflux, KeepAliveIsolateSOCKSAuth: each use by a workload
    // (its own SOCKS username) keeps its set fresh. Otherwise a set dirty
    // for MaxCircuitDirtiness (10 min) takes no new streams but still
    // counts as prebuilt, and later transfers take plain circuits.
    let (conflux_lines, socks_flags) = match conflux {
        Some(cfx) => (
            format!("ConfluxEnabled 1\nConfluxClientUX {}\n", cfx.ux),
            " KeepAliveIsolateSOCKSAuth",
        ),
        None => ("ConfluxEnabled 0\n".to_string(), ""),
    };
    let mut t = format!(
        "{}SocksPort {}{socks_flags}\nClientOnly 1\n{conflux_lines}\
         FetchDirInfoEarly 1\nFetchDirInfoExtraEarly 1\nLearnCircuitBuildTimeout 0\n\
         CircuitBuildTimeout 60\nUseEntryGuards 1\n",
        common_torrc(&c.dir, &auth.line),
        c.socks
    );
    if let Some(control) = c.control {
        t.push_str(&format!("ControlPort {control}\nCookieAuthentication 1\n"));
    }
    match pinned {
        Some(PinnedNodes {
            entry,
            middle,
            exit,
        }) => t.push_str(&format!(
            "EntryNodes {entry}\nMiddleNodes {middle}\nExitNodes {exit}\nStrictNodes 1\n"
        )),
        None => t.push_str(&format!("MiddleNodes {}\n", relays.join(","))),
    }
    push_lines(&mut t, extra);
    t
}

/// Start `tor -f torrc` of data directory `dir` in `host`; its stdout
/// and stderr go to `stdout.log` there.
fn spawn_tor(place: &Place, host: &str, dir: &Path, name: &str) -> Result<Proc, Error> {
    let log = fs::File::create(dir.join("stdout.log")).map_err(io_err("creating a tor log"))?;
    let err = log.try_clone().map_err(io_err("creating a tor log"))?;
    let mut cmd = place.tor_command(host)?;
    crate::process::die_with_parent(&mut cmd, nix::sys::signal::Signal::SIGTERM);
    cmd.args(["--defaults-torrc", "/dev/null", "-f"])
        .arg(dir.join("torrc"))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err);
    let child = cmd
        .spawn()
        .map_err(io_err(format!("starting tor {name} in {host}")))?;
    Ok(Proc::new(name, child))
}

/// The last lines of a tor's logs, for errors.
fn log_tail(dir: &Path) -> String {
    let mut out = String::new();
    for f in ["notice.log", "stdout.log"] {
        let text = fs::read_to_string(dir.join(f)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(8)..];
        if !tail.is_empty() {
            out.push_str(&format!("\n  {f}:\n    {}", tail.join("\n    ")));
        }
    }
    out
}

/// Data directories, keys and fingerprints of the authority (beside the
/// first relay) and the relays, under `base`.
fn plan_nodes(
    place: &Place,
    plan: &NetPlan,
    base: &Path,
) -> Result<(AuthPlan, Vec<RelayPlan>), Error> {
    let first = plan
        .relays
        .first()
        .ok_or_else(|| Error::Start("a C tor network needs a relay".into()))?;
    let auth_dir = base.join("auth");
    data_dir(&auth_dir)?;
    let auth_addr = place.ip(&first.host)?;
    let (auth_or, auth_dirport) = (place.port(AUTH_OR_PORT)?, place.port(AUTH_DIR_PORT)?);
    let v3ident = authority_keys(&auth_dir, SocketAddr::new(auth_addr, auth_dirport))?;
    let mut relays = Vec::new();
    for (i, r) in plan.relays.iter().enumerate() {
        let rdir = base.join(&r.host);
        data_dir(&rdir)?;
        relays.push(RelayPlan {
            host: r.host.clone(),
            nick: nickname(i, &r.host),
            dir: rdir,
            addr: place.ip(&r.host)?,
            or_port: place.port(crate::plan::RELAY_PORT)?,
            fingerprint: String::new(),
            guard: r.guard,
            exit: r.exit,
        });
    }
    // tor makes each identity; in parallel, as each takes a while.
    let (auth_fp, fps) = std::thread::scope(|s| {
        let auth = s.spawn(|| fingerprint(&auth_dir, "auth"));
        let each: Vec<_> = relays
            .iter()
            .map(|p| s.spawn(|| fingerprint(&p.dir, &p.nick)))
            .collect();
        let join = |h: std::thread::ScopedJoinHandle<'_, Result<String, Error>>| {
            h.join()
                .unwrap_or_else(|_| Err(Error::Start("fingerprint thread panicked".into())))
        };
        (join(auth), each.into_iter().map(join).collect::<Vec<_>>())
    });
    let auth_fp = auth_fp?;
    for (p, fp) in relays.iter_mut().zip(fps) {
        p.fingerprint = fp?;
    }
    let auth = AuthPlan {
        host: first.host.clone(),
        line: format!(
            "DirAuthority auth orport={auth_or} v3ident={v3ident} {auth_addr}:{auth_dirport} {auth_fp}"
        ),
        dir: auth_dir,
        addr: auth_addr,
        or_port: auth_or,
        dir_port: auth_dirport,
    };
    Ok((auth, relays))
}

/// Write every torrc of the network; returns the clients' places.
fn write_torrcs(
    place: &Place,
    plan: &NetPlan,
    base: &Path,
    auth: &AuthPlan,
    relays: &[RelayPlan],
) -> Result<Vec<ClientPlan>, Error> {
    let write = |d: &Path, text: String| {
        fs::write(d.join("torrc"), text).map_err(io_err("writing a torrc"))
    };
    write(&auth.dir, authority_torrc(auth, relays, plan))?;
    for r in relays {
        write(&r.dir, relay_torrc(auth, r, plan))?;
    }
    let fp_of = |host: &str| {
        relays
            .iter()
            .find(|p| p.host == host)
            .map(|p| p.fingerprint.as_str())
            .unwrap_or("")
    };
    let all: Vec<&str> = relays.iter().map(|p| p.fingerprint.as_str()).collect();
    let mut clients = Vec::new();
    for c in &plan.clients {
        let dir = base.join(format!("client-{}", c.name));
        data_dir(&dir)?;
        let local = |port| SocketAddr::from(([127, 0, 0, 1], port));
        let control = if plan.control_port {
            Some(local(place.port(CONTROL_PORT)?))
        } else {
            None
        };
        let cp = ClientPlan {
            name: c.name.clone(),
            host: c.host.clone(),
            socks: local(place.port(crate::plan::SOCKS_PORT)?),
            control,
            dir,
        };
        let extra = [plan.scheduler_lines(), plan.client_torrc.clone()].concat();
        let torrc = client_torrc(
            auth,
            &cp,
            pinned_nodes(c, &fp_of),
            &all,
            plan.conflux.as_ref(),
            &extra,
        );
        write(&cp.dir, torrc)?;
        clients.push(cp);
    }
    Ok(clients)
}

/// The node lists of a client's pinned path, or of its pinned conflux
/// legs: their guards, their middles and their exit. C tor pairs guards
/// and middles itself (no two legs of a set share either), so a set's
/// legs use the pinned relays but not necessarily the pinned pairs.
/// Paths have three hops (the lab checks its scenarios when it reads
/// them).
fn pinned_nodes<'a>(c: &ClientRole, fp_of: &impl Fn(&str) -> &'a str) -> Option<PinnedNodes> {
    let paths = match &c.path {
        Some(p) => std::slice::from_ref(p),
        None if !c.legs.is_empty() => &c.legs[..],
        None => return None,
    };
    let hop = |i: usize| {
        let mut fps: Vec<&str> = Vec::new();
        for p in paths {
            let fp = fp_of(p.get(i)?);
            if !fps.contains(&fp) {
                fps.push(fp);
            }
        }
        Some(fps.join(","))
    };
    Some(PinnedNodes {
        entry: hop(0)?,
        middle: hop(1)?,
        exit: hop(2)?,
    })
}

/// Write a C tor network for `plan` into `dir/ctor` and start it: the
/// authority, the relays and the clients, each in its host. Returns once
/// every client is ready: bootstrapped and, given a `test_server`, a test
/// download from it through the client succeeded. `status` hears each
/// client's bootstrap progress.
pub fn start(
    place: &Place,
    plan: &NetPlan,
    dir: &Path,
    test_server: Option<SocketAddr>,
    status: &dyn Fn(&str),
) -> Result<CtorNetwork, Error> {
    let base = dir.join("ctor");
    let (auth, relays) = plan_nodes(place, plan, &base)?;
    let clients = write_torrcs(place, plan, &base, &auth, &relays)?;
    if let Place::Loopback(pool) = place {
        pool.release();
    }
    let authority = spawn_tor(place, &auth.host, &auth.dir, "ctor-auth")?;
    let mut network = CtorNetwork {
        relays: Vec::new(),
        clients: Vec::new(),
        socks: clients.iter().map(|c| c.socks).collect(),
        control: clients
            .iter()
            .map(|c| c.control.map(|a| (a, c.dir.join("control_auth_cookie"))))
            .collect(),
        authority,
    };
    for r in &relays {
        let p = spawn_tor(place, &r.host, &r.dir, &r.host)?;
        network.relays.push((p, r.host.clone()));
    }
    wait_consensus(&mut network, &auth, &relays, status)?;
    for c in &clients {
        let p = spawn_tor(place, &c.host, &c.dir, &c.name)?;
        network.clients.push((p, c.dir.join("notice.log")));
    }
    for (i, (c, role)) in clients.iter().zip(&plan.clients).enumerate() {
        let sets = plan
            .conflux
            .as_ref()
            .map(|cfx| (cfx.legs, plan.sets_needed(role)));
        wait_ready(place, &mut network, (i, c), sets, test_server, status)?;
    }
    Ok(network)
}

/// Wait until the authority has published a consensus that lists every
/// relay. Relays upload their descriptors a second or two after they
/// start, often after the authority's first vote: that consensus lists only
/// the authority, and a client that bootstrapped from it waited for its
/// next consensus fetch (up to a voting interval and its fetch delay, 10 to
/// 35 s). Clients started after this find a usable consensus at once.
fn wait_consensus(
    network: &mut CtorNetwork,
    auth: &AuthPlan,
    relays: &[RelayPlan],
    status: &dyn Fn(&str),
) -> Result<(), Error> {
    status("C tor authority: waiting for a consensus with every relay");
    let deadline = Instant::now() + READY_TIMEOUT;
    let path = auth.dir.join("cached-consensus");
    loop {
        let consensus = fs::read_to_string(&path).unwrap_or_default();
        let missing: Vec<&str> = relays
            .iter()
            .map(|r| r.nick.as_str())
            .filter(|nick| !lists_router(&consensus, nick))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let fail = |why: String| {
            Error::Start(format!(
                "C tor network not ready: {why}; the authority's (host {}) last log lines:{}",
                auth.host,
                log_tail(&auth.dir)
            ))
        };
        if let Some(why) = exited(network) {
            return Err(fail(why));
        }
        if Instant::now() > deadline {
            return Err(fail(format!(
                "no consensus listing {} in {READY_TIMEOUT:?}",
                missing.join(", ")
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether a consensus document lists a router called `nick` (its `r`
/// line: `r NICKNAME IDENTITY ...`).
fn lists_router(consensus: &str, nick: &str) -> bool {
    consensus
        .lines()
        .any(|l| l.strip_prefix("r ").and_then(|r| r.split(' ').next()) == Some(nick))
}

/// Whether every tor of `network` still runs; else which one exited.
pub fn exited(network: &mut CtorNetwork) -> Option<String> {
    let procs = std::iter::once(&mut network.authority)
        .chain(network.relays.iter_mut().map(|(p, _)| p))
        .chain(network.clients.iter_mut().map(|(p, _)| p));
    for p in procs {
        if let Ok(Some(status)) = p.child.try_wait() {
            return Some(format!("tor {} exited ({status})", p.name));
        }
    }
    None
}

/// Wait for client `i` to bootstrap, with conflux for `(legs, sets)`:
/// that many linked sets of that many circuits (a stream takes a linked
/// set only if one is ready, else a plain circuit; the test download takes
/// one), then for a test download through it.
fn wait_ready(
    place: &Place,
    network: &mut CtorNetwork,
    (i, c): (usize, &ClientPlan),
    linked_sets: Option<(usize, usize)>,
    test_server: Option<SocketAddr>,
    status: &dyn Fn(&str),
) -> Result<(), Error> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let fail = |why: String| {
        Error::Start(format!(
            "C tor client {} (host {}) not ready: {why}; the network's data directories \
             are under {} (rerun with ONIONLAB_CTOR_LOG=info for tor's info logs); the \
             client's last log lines:{}",
            c.name,
            c.host,
            c.dir.parent().unwrap_or(&c.dir).display(),
            log_tail(&c.dir)
        ))
    };
    let mut shown = String::new();
    loop {
        let log = fs::read_to_string(&network.clients[i].1).unwrap_or_default();
        let percent = log
            .lines()
            .rev()
            .find_map(|l| l.split("Bootstrapped ").nth(1)?.split('%').next())
            .unwrap_or("0");
        if percent != shown {
            status(&format!(
                "C tor client {} bootstrapping: {percent}%",
                c.name
            ));
            shown = percent.to_string();
        }
        if percent == "100" {
            break;
        }
        if let Some(why) = exited(network) {
            return Err(fail(why));
        }
        if Instant::now() > deadline {
            return Err(fail(format!(
                "no \"Bootstrapped 100%\" in {READY_TIMEOUT:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    if let Some((legs, sets)) = linked_sets {
        status(&format!(
            "C tor client {}: waiting for {sets} conflux set(s)",
            c.name
        ));
        let Some(control) = c.control else {
            return Err(fail("conflux needs the client's control port".into()));
        };
        let cookie = c.dir.join("control_auth_cookie");
        loop {
            let lines = place
                .run_in(&c.host, || {
                    control::query(control, &cookie, "GETINFO circuit-status")
                })?
                .map_err(|e| fail(format!("asking its control port for its circuits: {e}")))?;
            if control::linked_sets(&lines, legs) >= sets {
                break;
            }
            if let Some(why) = exited(network) {
                return Err(fail(why));
            }
            if Instant::now() > deadline {
                return Err(fail(format!(
                    "fewer than {sets} linked conflux sets of {legs} circuits in \
                     {READY_TIMEOUT:?} (C tor prebuilds only one set when too few \
                     exits support conflux, cfx_low_exit_threshold); its circuits: {}",
                    lines.join(" | ")
                )));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    let Some(server) = test_server else {
        return Ok(());
    };
    status(&format!("C tor client {}: test download", c.name));
    let mut last = String::new();
    while Instant::now() < deadline {
        match place.run_in(&c.host, || test_download(c.socks, server))? {
            Ok(()) => return Ok(()),
            Err(e) => last = e,
        }
        if let Some(why) = exited(network) {
            return Err(fail(why));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Err(fail(format!(
        "the test download from {server} kept failing for {READY_TIMEOUT:?} (last: {last})"
    )))
}

/// One [`TEST_FETCH_BYTES`] download from `server` through `socks`, on a
/// runtime of its own (the caller's thread may be in a host namespace).
fn test_download(socks: SocketAddr, server: SocketAddr) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let fetch = crate::traffic::transfer(
            crate::traffic::OP_DOWNLOAD,
            socks,
            server,
            TEST_FETCH_BYTES,
            None,
        );
        tokio::time::timeout(Duration::from_secs(30), fetch)
            .await
            .map_err(|_| "timed out".to_string())?
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consensus_lists_routers_by_their_r_lines() {
        let consensus =
            "network-status-version 3\nr relay1 AAAA BBBB 2026-11-26 07:18:54 10.0.0.1 9001 0\n\
                         s Fast Running\nr auth CCCC DDDD 2026-11-26 07:18:54 10.0.0.2 9101 9130\n";
        assert!(lists_router(consensus, "relay1"));
        assert!(lists_router(consensus, "auth"));
        assert!(!lists_router(consensus, "relay"));
        assert!(!lists_router(consensus, "Fast"));
        assert!(!lists_router("", "relay1"));
    }

    #[test]
    fn nicknames_are_what_tor_accepts_and_unique() {
        for (i, host) in ["guard", "or-5", "a_very_long_host_name_indeed"]
            .iter()
            .enumerate()
        {
            let n = nickname(i, host);
            assert!(!n.is_empty() && n.len() <= 19, "{n}");
            assert!(n.chars().all(|c| c.is_ascii_alphanumeric()), "{n}");
        }
        assert_ne!(nickname(0, "or-5"), nickname(1, "or5"));
    }

    #[test]
    fn pinned_legs_give_their_guards_middles_and_exit() {
        let fp = |h: &str| match h {
            "g1" => "G1",
            "g2" => "G2",
            "m1" => "M1",
            "m2" => "M2",
            _ => "X",
        };
        let leg = |g: &str, m: &str| vec![g.to_string(), m.to_string(), "exit".to_string()];
        let mut c = ClientRole {
            name: "op".into(),
            host: "op".into(),
            path: None,
            legs: vec![leg("g1", "m1"), leg("g2", "m2")],
            isolated_streams: 2,
        };
        let n = pinned_nodes(&c, &fp).expect("pinned");
        assert_eq!(
            (n.entry.as_str(), n.middle.as_str(), n.exit.as_str()),
            ("G1,G2", "M1,M2", "X")
        );
        c.path = Some(leg("g2", "m1"));
        c.legs.clear();
        let n = pinned_nodes(&c, &fp).expect("pinned");
        assert_eq!(
            (n.entry.as_str(), n.middle.as_str(), n.exit.as_str()),
            ("G2", "M1", "X")
        );
        c.path = None;
        assert!(pinned_nodes(&c, &fp).is_none());
    }

    #[test]
    fn conflux_prebuilds_a_set_per_workload_and_one_for_the_test_download() {
        let client = |isolated_streams| ClientRole {
            name: "c".into(),
            host: "c".into(),
            path: None,
            legs: Vec::new(),
            isolated_streams,
        };
        let mut plan = NetPlan::chain(true);
        plan.conflux = Some(CtorConflux::of(2, LegSchedulerKind::LowRtt, "vegas").expect("cfx"));
        plan.clients = vec![client(1), client(4)];
        assert_eq!(plan.sets_needed(&plan.clients[1]), 5);
        assert_eq!(plan.prebuilt_sets(), 5);
        plan.clients = vec![client(1)];
        // Never fewer than C tor's default.
        assert_eq!(plan.prebuilt_sets(), 3);
        let auth = AuthPlan {
            host: "auth".into(),
            dir: PathBuf::from("/nonexistent"),
            addr: IpAddr::from([10, 0, 0, 1]),
            or_port: AUTH_OR_PORT,
            dir_port: AUTH_DIR_PORT,
            line: String::new(),
        };
        let torrc = authority_torrc(&auth, &[], &plan);
        assert!(
            torrc.contains(" cfx_num_legs_set=2 cfx_max_prebuilt_set=3\n"),
            "{torrc}"
        );
        plan.clients = vec![client(12)];
        let torrc = authority_torrc(&auth, &[], &plan);
        assert!(
            torrc.contains(" cfx_max_prebuilt_set=13 cfx_max_linked_set=13\n"),
            "{torrc}"
        );
        plan.conflux = None;
        assert!(!authority_torrc(&auth, &[], &plan).contains("cfx_"));
        plan.consensus_params = vec!["cellq_high=1000".into(), "cellq_low=100".into()];
        let torrc = authority_torrc(&auth, &[], &plan);
        assert!(
            torrc.contains("ConsensusParams cc_alg=2 cellq_high=1000 cellq_low=100\n"),
            "{torrc}"
        );
    }

    #[test]
    fn c_tor_conflux_takes_its_own_schedulers_with_vegas_only() {
        let c = CtorConflux::of(2, LegSchedulerKind::LowRtt, "vegas").expect("lowrtt");
        assert_eq!(c.ux, "throughput");
        let c = CtorConflux::of(3, LegSchedulerKind::MinRtt, "vegas").expect("minrtt");
        assert_eq!((c.legs, c.ux.as_str()), (3, "latency"));
        assert!(CtorConflux::of(2, LegSchedulerKind::MTor, "vegas").is_err());
        assert!(CtorConflux::of(2, LegSchedulerKind::LowRtt, "fixed").is_err());
    }
}

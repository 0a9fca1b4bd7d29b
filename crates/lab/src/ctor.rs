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

use crate::run::{Proc, RunError};
use crate::scenario::{Scenario, Variant};

/// The authority's ports, beside the first relay's own.
const AUTH_OR_PORT: u16 = 9101;
const AUTH_DIR_PORT: u16 = 9130;
/// How long a tor client may take to bootstrap and pass its test fetch.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// The test fetch's size.
const TEST_FETCH_BYTES: u64 = 16 * 1024;

/// The C tor processes of one repetition.
pub(crate) struct CtorNodes {
    /// Relays, by scenario host.
    pub(crate) relays: Vec<(Proc, String)>,
    /// Clients and their notice logs.
    pub(crate) clients: Vec<(Proc, PathBuf)>,
    /// The directory authority (not a relay of the scenario).
    pub(crate) authority: Proc,
}

/// `tor --version`'s first line, e.g. `Tor version 0.4.9.11.`.
///
/// # Errors
///
/// [`RunError::Start`] naming what to install if `tor` or `tor-gencert`
/// is missing.
pub fn tor_version() -> Result<String, RunError> {
    let missing = |what: &str, e: std::io::Error| {
        RunError::Start(format!(
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

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunError {
    let what = what.into();
    move |source| RunError::Io { what, source }
}

/// A data directory tor accepts (mode 700).
fn data_dir(path: &Path) -> Result<(), RunError> {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir_all(path).map_err(io_err(format!("creating {}", path.display())))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o700))
        .map_err(io_err(format!("chmod {}", path.display())))
}

/// The relay identity fingerprint of a data directory (tor creates the
/// keys).
fn fingerprint(dir: &Path, nick: &str) -> Result<String, RunError> {
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
            RunError::Start(format!(
                "tor --list-fingerprint for {nick} printed no fingerprint: {}{}",
                text,
                String::from_utf8_lossy(&out.stderr)
            ))
        })
}

/// The authority's v3 identity (creates its keys and certificate).
fn authority_keys(dir: &Path, dir_addr: SocketAddr) -> Result<String, RunError> {
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
        RunError::Start(format!(
            "tor-gencert made no certificate ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    })?;
    cert.lines()
        .find_map(|l| l.strip_prefix("fingerprint "))
        .map(|f| f.trim().to_string())
        .ok_or_else(|| RunError::Start("the authority certificate has no fingerprint".into()))
}

/// One relay's place in the network.
struct RelayPlan {
    host: String,
    nick: String,
    dir: PathBuf,
    addr: IpAddr,
    fingerprint: String,
    guard: bool,
    exit: bool,
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

/// The authority's torrc: quick votes, the scenario's roles as flags,
/// and the variant's circuit congestion control as a consensus parameter.
fn authority_torrc(common: &str, addr: IpAddr, relays: &[RelayPlan], variant: &Variant) -> String {
    let list = |f: fn(&RelayPlan) -> bool| {
        relays
            .iter()
            .filter(|r| f(r))
            .map(|r| r.fingerprint.clone())
            .collect::<Vec<_>>()
            .join(",")
    };
    let cc_alg = if variant.circuit_cc == "vegas" { 2 } else { 0 };
    let mut t = format!(
        "{common}Nickname auth\nAddress {addr}\nORPort {addr}:{AUTH_OR_PORT}\n\
         DirPort {addr}:{AUTH_DIR_PORT}\nSocksPort 0\nAuthoritativeDirectory 1\n\
         V3AuthoritativeDirectory 1\nAssumeReachable 1\n__DisablePredictedCircuits 1\n\
         ExitRelay 0\nExitPolicy reject *:*\n\
         TestingV3AuthInitialVotingInterval 5\nTestingV3AuthInitialVoteDelay 2\n\
         TestingV3AuthInitialDistDelay 2\nV3AuthVotingInterval 20\nV3AuthVoteDelay 2\n\
         V3AuthDistDelay 2\nAuthDirVoteStableGuaranteeMinUptime 0\n\
         AuthDirVoteStableGuaranteeMTBF 0\n\
         ConsensusParams cc_alg={cc_alg}\n"
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

fn relay_torrc(common: &str, r: &RelayPlan, variant: &Variant) -> String {
    let mut t = format!(
        "{common}Nickname {}\nAddress {}\nORPort {}:{}\nSocksPort 0\nAssumeReachable 1\n\
         __DisablePredictedCircuits 1\n",
        r.nick,
        r.addr,
        r.addr,
        crate::run::RELAY_PORT
    );
    if variant.scheduler == "round-robin" {
        t.push_str("CircuitPriorityHalflife 0\n");
    }
    if r.exit {
        t.push_str(
            "ExitRelay 1\nExitPolicyRejectPrivate 0\nExitPolicyRejectLocalInterfaces 0\n\
             RefuseUnknownExits 0\n",
        );
        // The emulated network has only the lab's hosts: accepting
        // everything lets the policy's summary in the consensus say so,
        // which clients that use microdescriptors (the default) need.
        t.push_str("ExitPolicy accept *:*\n");
    } else {
        t.push_str("ExitRelay 0\nExitPolicy reject *:*\n");
    }
    t
}

/// A client's torrc: `path` pins its circuits (guard, middle, exit);
/// without one tor chooses, with middles among `relays` (never the
/// authority, which is no relay of the scenario).
fn client_torrc(
    common: &str,
    path: Option<[&str; 3]>,
    relays: &[&str],
    socks: SocketAddr,
) -> String {
    let mut t = format!(
        "{common}SocksPort {socks}\nClientOnly 1\nConfluxEnabled 0\n\
         FetchDirInfoEarly 1\nFetchDirInfoExtraEarly 1\nLearnCircuitBuildTimeout 0\n\
         CircuitBuildTimeout 60\nUseEntryGuards 1\n"
    );
    match path {
        Some([entry, middle, exit]) => t.push_str(&format!(
            "EntryNodes {entry}\nMiddleNodes {middle}\nExitNodes {exit}\nStrictNodes 1\n"
        )),
        None => t.push_str(&format!("MiddleNodes {}\n", relays.join(","))),
    }
    t
}

/// Start `tor -f torrc` inside `host`; its stdout and stderr go to
/// `stdout.log` in its data directory.
fn spawn_tor(net: &Network, host: &str, dir: &Path, name: &str) -> Result<Proc, RunError> {
    let log = fs::File::create(dir.join("stdout.log")).map_err(io_err("creating a tor log"))?;
    let err = log.try_clone().map_err(io_err("creating a tor log"))?;
    let mut cmd = net.command(host, "tor")?;
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

/// Write a network for `variant` into `dir/ctor` and start it: the
/// authority, the relays and the clients, each in its scenario host.
/// Returns once every client is ready (bootstrapped, and a test download
/// from `test_server` through it succeeded).
pub(crate) fn start(
    scenario: &Scenario,
    variant: &Variant,
    net: &Network,
    dir: &Path,
    servers: &[SocketAddr],
    status: &dyn Fn(&str),
) -> Result<CtorNodes, RunError> {
    let base = dir.join("ctor");
    let first = scenario
        .relays
        .first()
        .ok_or_else(|| RunError::Start("a C tor network needs a relay".into()))?;
    let auth_host = first.host.clone();
    let auth_ip = IpAddr::V4(net.address(&auth_host)?);
    let auth_dir = base.join("auth");
    data_dir(&auth_dir)?;
    let v3ident = authority_keys(&auth_dir, SocketAddr::new(auth_ip, AUTH_DIR_PORT))?;

    // Keys: tor makes each identity; in parallel, as each takes a while.
    let mut plans = Vec::new();
    for (i, r) in scenario.relays.iter().enumerate() {
        let rdir = base.join(&r.host);
        data_dir(&rdir)?;
        plans.push(RelayPlan {
            host: r.host.clone(),
            nick: nickname(i, &r.host),
            dir: rdir,
            addr: IpAddr::V4(net.address(&r.host)?),
            fingerprint: String::new(),
            guard: r.guard,
            exit: r.exit,
        });
    }
    let (auth_fp, fps) = std::thread::scope(|s| {
        let auth = s.spawn(|| fingerprint(&auth_dir, "auth"));
        let relays: Vec<_> = plans
            .iter()
            .map(|p| s.spawn(|| fingerprint(&p.dir, &p.nick)))
            .collect();
        let join = |h: std::thread::ScopedJoinHandle<'_, Result<String, RunError>>| {
            h.join()
                .unwrap_or_else(|_| Err(RunError::Start("fingerprint thread panicked".into())))
        };
        (join(auth), relays.into_iter().map(join).collect::<Vec<_>>())
    });
    let auth_fp = auth_fp?;
    for (p, fp) in plans.iter_mut().zip(fps) {
        p.fingerprint = fp?;
    }
    let dir_authority = format!(
        "DirAuthority auth orport={AUTH_OR_PORT} v3ident={v3ident} {auth_ip}:{AUTH_DIR_PORT} {auth_fp}"
    );

    let write = |d: &Path, text: String| {
        fs::write(d.join("torrc"), text).map_err(io_err("writing a torrc"))
    };
    write(
        &auth_dir,
        authority_torrc(
            &common_torrc(&auth_dir, &dir_authority),
            auth_ip,
            &plans,
            variant,
        ),
    )?;
    for p in &plans {
        let common = common_torrc(&p.dir, &dir_authority);
        write(&p.dir, relay_torrc(&common, p, variant))?;
    }
    let fp_of = |host: &str| {
        plans
            .iter()
            .find(|p| p.host == host)
            .map(|p| p.fingerprint.as_str())
            .unwrap_or("")
    };
    let socks = SocketAddr::from(([127, 0, 0, 1], crate::run::SOCKS_PORT));
    let all_relays: Vec<&str> = plans.iter().map(|p| p.fingerprint.as_str()).collect();
    let mut client_plans = Vec::new();
    for c in variant.active_clients(&scenario.clients) {
        let cdir = base.join(format!("client-{}", c.name));
        data_dir(&cdir)?;
        // Three hops (checked when the scenario was read).
        let path = c
            .path
            .as_ref()
            .and_then(|p| Some([fp_of(p.first()?), fp_of(p.get(1)?), fp_of(p.get(2)?)]));
        let common = common_torrc(&cdir, &dir_authority);
        write(&cdir, client_torrc(&common, path, &all_relays, socks))?;
        client_plans.push((c.name.clone(), c.host.clone(), cdir));
    }

    let authority = spawn_tor(net, &auth_host, &auth_dir, "ctor-auth")?;
    let mut relays = Vec::new();
    for p in &plans {
        relays.push((spawn_tor(net, &p.host, &p.dir, &p.host)?, p.host.clone()));
    }
    let mut clients = Vec::new();
    for (name, host, cdir) in &client_plans {
        let p = spawn_tor(net, host, cdir, name)?;
        clients.push((p, cdir.join("notice.log")));
    }
    let mut nodes = CtorNodes {
        relays,
        clients,
        authority,
    };
    let test_server = servers.first().copied();
    for (i, (name, host, cdir)) in client_plans.iter().enumerate() {
        let client = (name.as_str(), host.as_str(), cdir.as_path());
        wait_ready(net, &mut nodes, i, client, (socks, test_server), status)?;
    }
    Ok(nodes)
}

/// Whether every tor of `nodes` still runs; else which one exited.
fn exited(nodes: &mut CtorNodes) -> Option<String> {
    let procs = std::iter::once(&mut nodes.authority)
        .chain(nodes.relays.iter_mut().map(|(p, _)| p))
        .chain(nodes.clients.iter_mut().map(|(p, _)| p));
    for p in procs {
        if let Ok(Some(status)) = p.child.try_wait() {
            return Some(format!("tor {} exited ({status})", p.name));
        }
    }
    None
}

/// Wait for client `i` to bootstrap, then for a test download through it.
fn wait_ready(
    net: &Network,
    nodes: &mut CtorNodes,
    i: usize,
    (name, host, cdir): (&str, &str, &Path),
    (socks, test_server): (SocketAddr, Option<SocketAddr>),
    status: &dyn Fn(&str),
) -> Result<(), RunError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let fail = |why: String| {
        RunError::Start(format!(
            "C tor client {name} (host {host}) not ready: {why}; its last log lines:{}",
            log_tail(cdir)
        ))
    };
    let mut shown = String::new();
    loop {
        let log = fs::read_to_string(&nodes.clients[i].1).unwrap_or_default();
        let percent = log
            .lines()
            .rev()
            .find_map(|l| l.split("Bootstrapped ").nth(1)?.split('%').next())
            .unwrap_or("0");
        if percent != shown {
            status(&format!("C tor client {name} bootstrapping: {percent}%"));
            shown = percent.to_string();
        }
        if percent == "100" {
            break;
        }
        if let Some(why) = exited(nodes) {
            return Err(fail(why));
        }
        if Instant::now() > deadline {
            return Err(fail(format!(
                "no \"Bootstrapped 100%\" in {READY_TIMEOUT:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let Some(server) = test_server else {
        return Ok(());
    };
    status(&format!("C tor client {name}: test download"));
    let mut last = String::new();
    while Instant::now() < deadline {
        let fetched = net.run_in(host, || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(30),
                    crate::traffic::transfer(
                        crate::traffic::OP_DOWNLOAD,
                        socks,
                        server,
                        TEST_FETCH_BYTES,
                        None,
                    ),
                )
                .await
                .map_err(|_| "timed out".to_string())?
                .map_err(|e| e.to_string())
            })
        })?;
        match fetched {
            Ok(_) => return Ok(()),
            Err(e) => last = e,
        }
        if let Some(why) = exited(nodes) {
            return Err(fail(why));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Err(fail(format!(
        "the test download from {server} kept failing for {READY_TIMEOUT:?} (last: {last})"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

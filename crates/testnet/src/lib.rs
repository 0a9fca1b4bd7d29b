//! A local onionlab network of real processes on loopback, for the
//! end-to-end tests and the chain benchmark: `onionlab network init` into a
//! directory, relays and a client started as child processes, readiness
//! checks, CPU and memory readings from `/proc`, and clean shutdown.
//!
//! The traffic (workload server, SOCKS transfers with every byte checked)
//! is the lab's ([`onionlab_lab::traffic`]). [`bench`](mod@bench) measures a network
//! behind any SOCKS5 proxy (`onionlab bench`).

#![warn(missing_docs)]

pub mod bench;

use std::fs;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use onionlab_config::{ClientConfig, ConfigFile, RelayConfig};
use onionlab_lab::process::Proc;
use onionlab_transport::any::IpProtocol;
use onionlab_transport::endpoint::EndpointKind;

/// What can go wrong setting up or running a local network.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Running a command or touching a file failed.
    #[error("{what}: {source}")]
    Io {
        /// What we were doing.
        what: String,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// A node did not come up.
    #[error("{0}")]
    NotReady(String),
    /// A node's configuration could not be read or changed.
    #[error("{0}")]
    Config(#[from] onionlab_config::Error),
}

/// Settings given as TOML text.
fn settings_table(text: &str) -> Result<toml::Table, Error> {
    text.parse::<toml::Table>()
        .map_err(|e| Error::NotReady(format!("settings {text:?}: {e}")))
}

/// Write a configuration file.
fn write_config(file: &Path, text: &str) -> Result<(), Error> {
    fs::write(file, text).map_err(io_err(format!("writing {}", file.display())))
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// How long a node gets to stop after SIGTERM before SIGKILL.
const NODE_STOP_GRACE: Duration = Duration::from_secs(5);

/// One node process.
pub struct NodeProcess {
    /// Nickname (`relay0`...) or `client`.
    pub name: String,
    /// The address it listens on (TLS port or SOCKS port).
    pub addr: SocketAddr,
    /// Its log file.
    pub log: PathBuf,
    process: Option<Proc>,
}

impl NodeProcess {
    /// Process ID, while running.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Proc::pid)
    }

    /// User plus system CPU seconds used so far.
    pub fn cpu_seconds(&self) -> Option<f64> {
        cpu_seconds(self.pid()?)
    }

    /// Whether the process has exited (and with what status).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.process.as_mut()?.exited()
    }

    /// SIGKILL, as a crash would end it, and reap it. The OS closes its
    /// sockets (TCP peers see FIN or RST; QUIC peers see nothing).
    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }

    /// SIGTERM, then SIGKILL after 5 s.
    pub fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.stop_within(NODE_STOP_GRACE);
        }
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

pub use onionlab_lab::process::cpu_seconds;

/// A local network: the directory `onionlab network init` wrote, and the
/// processes started from it.
pub struct LocalNetwork {
    /// The network directory.
    pub dir: PathBuf,
    /// The `onionlab` binary.
    pub bin: PathBuf,
    /// Relays, in nickname order (`relay0` first; exits last).
    pub relays: Vec<NodeProcess>,
    /// The client, once started.
    pub client: Option<NodeProcess>,
    relay_addrs: Vec<SocketAddr>,
    socks: SocketAddr,
    log_filter: String,
    /// RLIMIT_NOFILE per node name, applied when the node is spawned.
    nofile: std::collections::HashMap<String, u64>,
    /// Extra environment variables per node name.
    env: std::collections::HashMap<String, Vec<(String, String)>>,
    /// Remove `dir` when dropped ([`LocalNetwork::remove_when_done`]).
    scratch: bool,
}

/// Find `n` consecutive free TCP ports on 127.0.0.1.
pub fn free_port_range(n: u16) -> Result<u16, Error> {
    // Different for every call, also between networks of one process
    // (tests that run in threads).
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let seed = (std::process::id() as u64) ^ now ^ call.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // Below the kernel's ephemeral range: a port in it can be taken as
    // the source port of any outgoing connection (another test's, while a
    // killed relay is down), and the relay could not listen on it again.
    let n = n.max(1);
    let (lowest, highest) = (10_000, ephemeral_ports_start().max(10_000 + 2 * n));
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    for _ in 0..200 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let base = lowest + (x >> 33) as u16 % (highest - lowest - n);
        let all_free = (0..n).all(|i| StdListener::bind(("127.0.0.1", base + i)).is_ok());
        if all_free {
            return Ok(base);
        }
    }
    Err(Error::NotReady("no free port range on 127.0.0.1".into()))
}

/// The first port of the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`), 32768 if it cannot be read.
fn ephemeral_ports_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

impl LocalNetwork {
    /// Run `onionlab network init` into `dir` (which must not exist or be
    /// empty) with free loopback ports.
    pub fn init(bin: &Path, dir: &Path, relays: usize, exits: usize) -> Result<Self, Error> {
        Self::init_with(bin, dir, relays, exits, &[])
    }

    /// [`init`](Self::init) with more arguments for `onionlab network
    /// init`, such as `["--circuit-cc", "vegas"]`.
    pub fn init_with(
        bin: &Path,
        dir: &Path,
        relays: usize,
        exits: usize,
        extra: &[&str],
    ) -> Result<Self, Error> {
        // `network init` gives a relay's second endpoint of a protocol the
        // port `relays` further (EndpointAddrs::on_ports): keep the TCP
        // ones and the SOCKS port free.
        let tcp_kinds = EndpointKind::all()
            .into_iter()
            .filter(|k| k.protocol() == IpProtocol::Tcp)
            .count();
        let n = u16::try_from(relays * tcp_kinds + 1)
            .map_err(|_| Error::NotReady("too many relays".into()))?;
        let base = free_port_range(n)?;
        let socks_port = base + n - 1;
        run_command(
            Command::new(bin)
                .args(["network", "init", "--relays", &relays.to_string()])
                .args(["--exits", &exits.to_string(), "--out"])
                .arg(dir)
                .args(["--base-port", &base.to_string()])
                .args(["--socks-port", &socks_port.to_string()])
                .args(["--allow-private-target", &format!("{TARGET_IP}:*")])
                .args(extra),
            "onionlab network init",
        )?;
        let relay_addrs = (0..relays as u16)
            .map(|i| SocketAddr::from(([127, 0, 0, 1], base + i)))
            .collect();
        Ok(LocalNetwork {
            dir: dir.to_path_buf(),
            bin: bin.to_path_buf(),
            relays: Vec::new(),
            client: None,
            relay_addrs,
            socks: SocketAddr::from(([127, 0, 0, 1], socks_port)),
            log_filter: "info".into(),
            nofile: Default::default(),
            env: Default::default(),
            scratch: false,
        })
    }

    /// Remove the network's directory when it is dropped, unless the
    /// thread is panicking (a failed test keeps its logs) or
    /// `ONIONLAB_KEEP_TEST_DIRS` is set. For tests: their directories
    /// under /tmp otherwise pile up (about a gigabyte a CI run).
    pub fn remove_when_done(&mut self) {
        self.scratch = true;
    }

    /// Make every node use transport `name` (`auto` or a registered
    /// transport; the nodes refuse other names) for the links it opens, by rewriting the
    /// `transport` line of the relay and client configurations. Call
    /// before starting nodes.
    pub fn set_transport(&mut self, name: &str) -> Result<(), Error> {
        for i in 0..self.relay_addrs.len() {
            self.set_node_transport(Some(i), name)?;
        }
        self.set_node_transport(None, name)
    }

    /// Make one node use transport `name` for the links it opens: relay
    /// `i` for `Some(i)`, the client for `None`. Call before starting it.
    pub fn set_node_transport(&mut self, node: Option<usize>, name: &str) -> Result<(), Error> {
        let transport =
            name.parse()
                .map_err(|e: onionlab_transport::registry::UnknownTransport| {
                    Error::NotReady(e.to_string())
                })?;
        match node {
            Some(i) => {
                let file = self.relay_config(i);
                let mut cfg = RelayConfig::load(&file)?;
                cfg.link.transport = transport;
                write_config(&file, &cfg.to_toml()?)
            }
            None => {
                let file = self.dir.join("client.toml");
                let mut cfg = ClientConfig::load(&file)?;
                cfg.link.transport = transport;
                write_config(&file, &cfg.to_toml()?)
            }
        }
    }

    /// Set `settings` (TOML, for example `"link.tcp.pacing = true"` or
    /// `"[torchestra]\nwindow_ms = 200"`) over relay `i`'s configuration,
    /// checked as the relay would check it. Call before starting it.
    pub fn set_relay_config(&mut self, i: usize, settings: &str) -> Result<(), Error> {
        let file = self.relay_config(i);
        let cfg = RelayConfig::load(&file)?.with_overrides(&settings_table(settings)?, settings)?;
        write_config(&file, &cfg.to_toml()?)
    }

    /// Log filter passed to the nodes (default `info`).
    pub fn set_log_filter(&mut self, filter: &str) {
        self.log_filter = filter.into();
    }

    /// The SOCKS address of the client.
    pub fn socks_addr(&self) -> SocketAddr {
        self.socks
    }

    /// The TLS address of relay `i`.
    pub fn relay_addr(&self, i: usize) -> SocketAddr {
        self.relay_addrs[i]
    }

    /// The config file of relay `i`.
    pub fn relay_config(&self, i: usize) -> PathBuf {
        self.dir.join(format!("relays/relay{i}/relay.toml"))
    }

    /// Run node `name` (`relay0`..., `client`) with at most `limit` open
    /// descriptors (RLIMIT_NOFILE, soft and hard) from its next start.
    pub fn set_nofile_limit(&mut self, name: &str, limit: u64) {
        self.nofile.insert(name.into(), limit);
    }

    /// Start node `name` with `key=value` in its environment (from its
    /// next start).
    pub fn set_node_env(&mut self, name: &str, key: &str, value: &str) {
        self.env
            .entry(name.into())
            .or_default()
            .push((key.into(), value.into()));
    }

    /// Start a node process with `args`, logging to `DIR/NAME.log`
    /// (appended to, so a restarted node keeps its earlier log).
    pub fn spawn(&self, name: &str, args: &[&str], addr: SocketAddr) -> Result<NodeProcess, Error> {
        let log = self.dir.join(format!("{name}.log"));
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(io_err(format!("creating {}", log.display())))?;
        let mut cmd = Command::new(&self.bin);
        cmd.args(["--log", &self.log_filter])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file);
        for (k, v) in self.env.get(name).into_iter().flatten() {
            cmd.env(k, v);
        }
        // The node dies with the test process, even when that is killed (a
        // test harness's timeout) and no Drop runs. (The signal comes when
        // the *thread* that started the node ends: start nodes from the
        // test's thread or a runtime worker.)
        onionlab_lab::process::die_with_parent(&mut cmd, nix::sys::signal::Signal::SIGKILL);
        if let Some(&limit) = self.nofile.get(name) {
            onionlab_lab::process::limit_open_files(&mut cmd, limit);
        }
        let child = cmd.spawn().map_err(io_err(format!("starting {name}")))?;
        Ok(NodeProcess {
            name: name.into(),
            addr,
            log,
            process: Some(Proc::new(name, child)),
        })
    }

    /// Start every relay and wait until each accepts connections.
    pub fn start_relays(&mut self) -> Result<(), Error> {
        for i in 0..self.relay_addrs.len() {
            let p = self.spawn_relay(i)?;
            self.relays.push(p);
        }
        for i in 0..self.relays.len() {
            wait_listening(&mut self.relays[i])?;
        }
        Ok(())
    }

    fn spawn_relay(&self, i: usize) -> Result<NodeProcess, Error> {
        let config = self.relay_config(i);
        let config = config.to_string_lossy().into_owned();
        self.spawn(
            &format!("relay{i}"),
            &["relay", "--config", &config],
            self.relay_addrs[i],
        )
    }

    /// Start relay `i` again (after [`NodeProcess::kill`] or
    /// [`NodeProcess::stop`]) with the same keys and addresses, and wait
    /// until it accepts connections.
    pub fn restart_relay(&mut self, i: usize) -> Result<(), Error> {
        self.relays[i].stop();
        let mut p = self.spawn_relay(i)?;
        wait_listening(&mut p)?;
        self.relays[i] = p;
        Ok(())
    }

    /// Start the client, optionally with a pinned path (nicknames) and
    /// `settings` set over its configuration (TOML, as for
    /// [`set_relay_config`](Self::set_relay_config)), and wait for its
    /// SOCKS port.
    pub fn start_client(&mut self, path: Option<&[&str]>, settings: &str) -> Result<(), Error> {
        let mut cfg = ClientConfig::load(&self.dir.join("client.toml"))?;
        if let Some(path) = path {
            cfg.path = Some(path.iter().map(ToString::to_string).collect());
        }
        let cfg = cfg.with_overrides(&settings_table(settings)?, settings)?;
        let run_config = self.dir.join("client-run.toml");
        write_config(&run_config, &cfg.to_toml()?)?;
        let run_config = run_config.to_string_lossy().into_owned();
        let mut p = self.spawn("client", &["client", "--config", &run_config], self.socks)?;
        wait_listening(&mut p)?;
        self.client = Some(p);
        Ok(())
    }

    /// Sign the network document again with the network key, valid from
    /// now for the default 30 days (`onionlab network resign --dir`).
    pub fn resign(&self) -> Result<(), Error> {
        run_command(
            Command::new(&self.bin)
                .args(["network", "resign", "--dir"])
                .arg(&self.dir),
            "onionlab network resign",
        )
    }

    /// The network document in the directory, verified with the network
    /// key (expired or not).
    pub fn document(&self) -> Result<onionlab_netdoc::NetworkDocument, Error> {
        let key = onionlab_netdoc::keys::load_network_key(&self.dir.join("network-key.secret"))
            .map_err(|e| Error::NotReady(e.to_string()))?;
        onionlab_netdoc::NetworkDocument::load_file(
            &self.dir.join("network.doc"),
            &key.verifying_key(),
        )
        .map_err(|e| Error::NotReady(e.to_string()))
    }

    /// Stop every process (client first).
    pub fn stop(&mut self) {
        if let Some(c) = self.client.as_mut() {
            c.stop();
        }
        for r in &mut self.relays {
            r.stop();
        }
    }
}

impl Drop for LocalNetwork {
    fn drop(&mut self) {
        self.stop();
        if self.scratch
            && !std::thread::panicking()
            && std::env::var_os("ONIONLAB_KEEP_TEST_DIRS").is_none()
        {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Run `cmd` (called `what` in errors) to its end; its failure is an
/// error with its stderr.
fn run_command(cmd: &mut Command, what: &str) -> Result<(), Error> {
    let out = cmd.output().map_err(io_err(format!("running {what}")))?;
    if !out.status.success() {
        return Err(Error::NotReady(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

/// Wait until `p` accepts TCP connections (or exits, or 20 s pass).
fn wait_listening(p: &mut NodeProcess) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if std::net::TcpStream::connect_timeout(&p.addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if let Some(status) = p.exited() {
            let log = fs::read_to_string(&p.log).unwrap_or_default();
            return Err(Error::NotReady(format!(
                "{} exited ({status}): {log}",
                p.name
            )));
        }
        if Instant::now() > deadline {
            return Err(Error::NotReady(format!(
                "{} did not listen on {}",
                p.name, p.addr
            )));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

pub use onionlab_lab::traffic::{
    fill_pattern, pattern_sha256, socks_connect, Transfer, OP_DOWNLOAD, OP_UPLOAD,
};

/// The loopback address test targets listen on: the exits of a
/// [`LocalNetwork`] refuse private addresses except this one (any port),
/// so they reach the servers a test starts but not the relays' or the
/// client's ports on 127.0.0.1.
pub const TARGET_IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

/// Start a workload server on [`TARGET_IP`].
pub async fn workload_server() -> std::io::Result<SocketAddr> {
    onionlab_lab::traffic::workload_server_at(TARGET_IP).await
}

/// Ask the workload server, through SOCKS, for a download of practically
/// unbounded length (2^40 bytes), as an HTTP response without
/// Content-Length: only a reset tells a broken one from a finished one.
/// Returns the connection, to read from.
pub async fn endless_download(
    socks: SocketAddr,
    server: SocketAddr,
) -> Result<tokio::net::TcpStream, String> {
    use tokio::io::AsyncWriteExt;
    let mut s = socks_connect(socks, &server.ip().to_string(), server.port(), None)
        .await
        .map_err(|e| format!("SOCKS connect: {e}"))?;
    let mut req = [0u8; 9];
    req[0] = OP_DOWNLOAD;
    req[1..].copy_from_slice(&(1u64 << 40).to_be_bytes());
    s.write_all(&req)
        .await
        .map_err(|e| format!("sending the request: {e}"))?;
    Ok(s)
}

/// Download `len` pattern bytes from the workload server through SOCKS,
/// checking every byte.
pub async fn download(
    socks: SocketAddr,
    server: SocketAddr,
    len: u64,
    auth: Option<(&str, &str)>,
) -> Result<Transfer, String> {
    onionlab_lab::traffic::transfer(OP_DOWNLOAD, socks, server, len, auth)
        .await
        .map_err(|e| e.to_string())
}

/// Upload `len` pattern bytes through SOCKS and check the server's SHA-256;
/// returns the time from SOCKS success to the server's answer.
pub async fn upload(
    socks: SocketAddr,
    server: SocketAddr,
    len: u64,
    auth: Option<(&str, &str)>,
) -> Result<Duration, String> {
    onionlab_lab::traffic::transfer(OP_UPLOAD, socks, server, len, auth)
        .await
        .map(|t| t.last_byte)
        .map_err(|e| e.to_string())
}

//! A local onionlab network of real processes on loopback, for the
//! end-to-end tests and the chain benchmark: `onionlab network init` into a
//! directory, relays and a client started as child processes, readiness
//! checks, CPU and memory readings from `/proc`, and clean shutdown.
//!
//! Also the workload server both use: a TCP server that answers a 9-byte
//! request (`op`, `len` as u64 big-endian) with a download of `len`
//! deterministic bytes (`op = 1`), or reads an upload of `len` bytes and
//! answers its SHA-256 (`op = 2`).

use std::fs;
use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// One node process.
pub struct NodeProcess {
    /// Nickname (`relay0`...) or `client`.
    pub name: String,
    /// The address it listens on (TLS port or SOCKS port).
    pub addr: SocketAddr,
    /// Its log file.
    pub log: PathBuf,
    child: Option<Child>,
}

impl NodeProcess {
    /// Process ID, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// User plus system CPU seconds used so far.
    pub fn cpu_seconds(&self) -> Option<f64> {
        cpu_seconds(self.pid()?)
    }

    /// Peak resident memory (VmHWM) in bytes.
    pub fn peak_rss_bytes(&self) -> Option<u64> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// Whether the process has exited (and with what status).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// SIGTERM, then SIGKILL after 5 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: kill(2) with a PID we own; no memory is touched.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// CPU seconds (user + system) of process `pid`, from `/proc/PID/stat`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start at ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 here.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some((utime + stime) / ticks.max(1) as f64)
}

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
}

/// Find `n` consecutive free TCP ports on 127.0.0.1.
pub fn free_port_range(n: u16) -> Result<u16, Error> {
    let seed = std::process::id() as u64 ^ Instant::now().elapsed().as_nanos() as u64;
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    for _ in 0..200 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let base = 20000 + (x >> 33) as u16 % 30000;
        let all_free = (0..n).all(|i| StdListener::bind(("127.0.0.1", base + i)).is_ok());
        if all_free {
            return Ok(base);
        }
    }
    Err(Error::NotReady("no free port range on 127.0.0.1".into()))
}

impl LocalNetwork {
    /// Run `onionlab network init` into `dir` (which must not exist or be
    /// empty) with free loopback ports.
    pub fn init(bin: &Path, dir: &Path, relays: usize, exits: usize) -> Result<Self, Error> {
        let n = u16::try_from(relays + 1).map_err(|_| Error::NotReady("too many relays".into()))?;
        let base = free_port_range(n)?;
        let socks_port = base + n - 1;
        let out = Command::new(bin)
            .args(["network", "init", "--relays", &relays.to_string()])
            .args(["--exits", &exits.to_string(), "--out"])
            .arg(dir)
            .args(["--base-port", &base.to_string()])
            .args(["--socks-port", &socks_port.to_string()])
            .output()
            .map_err(io_err("running onionlab network init"))?;
        if !out.status.success() {
            return Err(Error::NotReady(format!(
                "onionlab network init failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
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
        })
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

    /// Start a node process with `args`, logging to `DIR/NAME.log`.
    pub fn spawn(&self, name: &str, args: &[&str], addr: SocketAddr) -> Result<NodeProcess, Error> {
        let log = self.dir.join(format!("{name}.log"));
        let file = fs::File::create(&log).map_err(io_err(format!("creating {}", log.display())))?;
        let child = Command::new(&self.bin)
            .args(["--log", &self.log_filter])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .map_err(io_err(format!("starting {name}")))?;
        Ok(NodeProcess {
            name: name.into(),
            addr,
            log,
            child: Some(child),
        })
    }

    /// Start every relay and wait until each accepts connections.
    pub fn start_relays(&mut self) -> Result<(), Error> {
        for i in 0..self.relay_addrs.len() {
            let config = self.relay_config(i);
            let config = config.to_string_lossy().into_owned();
            let p = self.spawn(
                &format!("relay{i}"),
                &["relay", "--config", &config],
                self.relay_addrs[i],
            )?;
            self.relays.push(p);
        }
        for i in 0..self.relays.len() {
            wait_listening(&mut self.relays[i])?;
        }
        Ok(())
    }

    /// Start the client, optionally with a pinned path (nicknames) and
    /// extra `key = value` config lines (replacing those keys), and wait
    /// for its SOCKS port.
    pub fn start_client(&mut self, path: Option<&[&str]>, extra: &str) -> Result<(), Error> {
        let config = self.dir.join("client.toml");
        let mut text = fs::read_to_string(&config).map_err(io_err("reading client.toml"))?;
        if let Some(path) = path {
            let list: Vec<String> = path.iter().map(|n| format!("\"{n}\"")).collect();
            text.push_str(&format!("path = [{}]\n", list.join(", ")));
        }
        for line in extra.lines() {
            if let Some((key, _)) = line.split_once('=') {
                let key = key.trim();
                text = text
                    .lines()
                    .filter(|l| l.split_once('=').is_none_or(|(k, _)| k.trim() != key))
                    .map(|l| format!("{l}\n"))
                    .collect();
            }
            text.push_str(line);
            text.push('\n');
        }
        let run_config = self.dir.join("client-run.toml");
        fs::write(&run_config, text).map_err(io_err("writing client-run.toml"))?;
        let run_config = run_config.to_string_lossy().into_owned();
        let mut p = self.spawn("client", &["client", "--config", &run_config], self.socks)?;
        wait_listening(&mut p)?;
        self.client = Some(p);
        Ok(())
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
    }
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

/// Workload server operation: send `len` pattern bytes.
pub const OP_DOWNLOAD: u8 = 1;
/// Workload server operation: receive `len` bytes, answer their SHA-256.
pub const OP_UPLOAD: u8 = 2;

/// Period of the deterministic payload pattern: a prime, so the pattern
/// does not line up with cells, buffers or pages.
const PATTERN_PERIOD: usize = 1_048_573;

fn pattern_table() -> &'static [u8] {
    static TABLE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        (0..PATTERN_PERIOD)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    })
}

/// Fill `buf` with the payload pattern starting at stream offset `start`
/// (a copy from a precomputed table, so checking costs little CPU).
pub fn fill_pattern(start: u64, buf: &mut [u8]) {
    let table = pattern_table();
    let mut pos = (start % PATTERN_PERIOD as u64) as usize;
    let mut done = 0;
    while done < buf.len() {
        let n = (PATTERN_PERIOD - pos).min(buf.len() - done);
        buf[done..done + n].copy_from_slice(&table[pos..pos + n]);
        done += n;
        pos = 0;
    }
}

/// SHA-256 of the first `len` pattern bytes.
pub fn pattern_sha256(len: u64) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(buf.len() as u64) as usize;
        fill_pattern(off, &mut buf[..n]);
        h.update(&buf[..n]);
        off += n as u64;
    }
    h.finalize().into()
}

/// Start the workload server on 127.0.0.1; serves until the runtime ends.
pub async fn workload_server() -> io::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let _ = serve_one(s).await;
            });
        }
    });
    Ok(addr)
}

async fn serve_one(mut s: TcpStream) -> io::Result<()> {
    let _ = s.set_nodelay(true);
    let mut req = [0u8; 9];
    s.read_exact(&mut req).await?;
    let len = u64::from_be_bytes(req[1..9].try_into().unwrap_or([0; 8]));
    let mut buf = vec![0u8; 256 * 1024];
    match req[0] {
        OP_DOWNLOAD => {
            let mut off = 0;
            while off < len {
                let n = (len - off).min(buf.len() as u64) as usize;
                fill_pattern(off, &mut buf[..n]);
                s.write_all(&buf[..n]).await?;
                off += n as u64;
            }
            s.shutdown().await
        }
        OP_UPLOAD => {
            let mut h = Sha256::new();
            let mut got = 0;
            while got < len {
                let want = (len - got).min(buf.len() as u64) as usize;
                let n = s.read(&mut buf[..want]).await?;
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                h.update(&buf[..n]);
                got += n as u64;
            }
            let digest: [u8; 32] = h.finalize().into();
            s.write_all(&digest).await?;
            s.shutdown().await
        }
        _ => Err(io::ErrorKind::InvalidInput.into()),
    }
}

/// Connect to `host:port` through the SOCKS5 proxy at `socks`, with
/// optional username/password (stream isolation).
pub async fn socks_connect(
    socks: SocketAddr,
    host: &str,
    port: u16,
    auth: Option<(&str, &str)>,
) -> Result<TcpStream, tokio_socks::Error> {
    let s = match auth {
        None => tokio_socks::tcp::Socks5Stream::connect(socks, (host, port)).await?,
        Some((u, p)) => {
            tokio_socks::tcp::Socks5Stream::connect_with_password(socks, (host, port), u, p).await?
        }
    };
    let s = s.into_inner();
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// Timings of one download.
#[derive(Debug, Clone, Copy)]
pub struct Transfer {
    /// From starting the SOCKS connect to SOCKS success.
    pub connect: Duration,
    /// From SOCKS success to the first payload byte.
    pub first_byte: Duration,
    /// From SOCKS success to the last payload byte.
    pub last_byte: Duration,
}

/// Download `len` pattern bytes from the workload server through SOCKS,
/// checking every byte.
pub async fn download(
    socks: SocketAddr,
    server: SocketAddr,
    len: u64,
    auth: Option<(&str, &str)>,
) -> Result<Transfer, String> {
    let t0 = Instant::now();
    let mut s = socks_connect(socks, &server.ip().to_string(), server.port(), auth)
        .await
        .map_err(|e| format!("SOCKS connect: {e}"))?;
    let t1 = Instant::now();
    let mut req = [0u8; 9];
    req[0] = OP_DOWNLOAD;
    req[1..].copy_from_slice(&len.to_be_bytes());
    s.write_all(&req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut expect = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    let mut first = None;
    while got < len {
        let n = s
            .read(&mut buf)
            .await
            .map_err(|e| format!("read at {got}: {e}"))?;
        if n == 0 {
            return Err(format!("stream closed after {got} of {len} bytes"));
        }
        first.get_or_insert_with(Instant::now);
        fill_pattern(got, &mut expect[..n]);
        if buf[..n] != expect[..n] {
            return Err(format!("corrupt data near byte {got}"));
        }
        got += n as u64;
    }
    let t2 = Instant::now();
    Ok(Transfer {
        connect: t1 - t0,
        first_byte: first.unwrap_or(t2) - t1,
        last_byte: t2 - t1,
    })
}

/// Upload `len` pattern bytes through SOCKS and check the server's SHA-256.
pub async fn upload(
    socks: SocketAddr,
    server: SocketAddr,
    len: u64,
    auth: Option<(&str, &str)>,
) -> Result<Duration, String> {
    let mut s = socks_connect(socks, &server.ip().to_string(), server.port(), auth)
        .await
        .map_err(|e| format!("SOCKS connect: {e}"))?;
    let t1 = Instant::now();
    let mut req = [0u8; 9];
    req[0] = OP_UPLOAD;
    req[1..].copy_from_slice(&len.to_be_bytes());
    s.write_all(&req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(buf.len() as u64) as usize;
        fill_pattern(off, &mut buf[..n]);
        s.write_all(&buf[..n])
            .await
            .map_err(|e| format!("write at {off}: {e}"))?;
        off += n as u64;
    }
    let mut digest = [0u8; 32];
    s.read_exact(&mut digest)
        .await
        .map_err(|e| format!("reading the server's digest: {e}"))?;
    if digest != pattern_sha256(len) {
        return Err("the server saw different bytes (SHA-256 mismatch)".into());
    }
    Ok(t1.elapsed())
}

//! The traffic of experiments: a workload server and client transfers
//! through SOCKS, with every byte checked and the moments that matter
//! recorded.
//!
//! Protocol: the client sends a 9-byte request, `op` then `len` (u64 big
//! endian), and then:
//! - [`OP_DOWNLOAD`]: the server sends `len` bytes of the payload pattern;
//! - [`OP_UPLOAD`]: the client sends `len` pattern bytes, the server answers
//!   their SHA-256;
//! - [`OP_ECHO`]: the client sends `len` pattern bytes, the server sends
//!   each back as it arrives (seed 000's echo workload);
//! - [`OP_PROBE`]: `len` is `interval_ms << 32 | probes`; the server sends
//!   `probes` 16-byte probes (sequence number, wall-clock send time in ns),
//!   one every `interval_ms` (seed 002's latency probes). All hosts of the
//!   emulated network share one clock, so receive minus send time is the
//!   one-way latency;
//! - [`OP_TRACE`]: `len` is the number of schedule entries; the client then
//!   sends them (offset from the start in µs, message bytes: two u32 big
//!   endian) and the server sends each message at its time: a 16-byte header
//!   (sequence u32, payload length u32, send time in ns u64) and the payload
//!   (seed 003's trace replay; the delay of each message is measured when its
//!   last byte arrives);
//! - [`crate::stream::OP_STREAM`]: seed 002's timestamp server (see
//!   [`crate::stream`]).

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Send `len` pattern bytes.
pub const OP_DOWNLOAD: u8 = 1;
/// Receive `len` bytes, answer their SHA-256.
pub const OP_UPLOAD: u8 = 2;
/// Echo `len` bytes back as they arrive.
pub const OP_ECHO: u8 = 3;
/// Stream timestamped probes.
pub const OP_PROBE: u8 = 4;
/// Bytes of one probe: sequence (u64) and send time (ns since the epoch, u64).
pub const PROBE_LEN: usize = 16;
/// Replay a schedule of messages.
pub const OP_TRACE: u8 = 5;
/// Header of a trace message: sequence, payload length, send time.
pub const TRACE_HEADER_LEN: usize = 16;
/// Most entries in one trace schedule.
pub const MAX_TRACE_ENTRIES: u64 = 100_000;
/// Largest message of a trace.
pub const MAX_TRACE_MESSAGE: u32 = 1 << 20;
/// Most probes one request may ask for.
pub const MAX_PROBES: u64 = 1_000_000;

pub(crate) fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The `len` field of a probe request.
pub fn probe_request_len(probes: u32, interval: Duration) -> u64 {
    let ms = u64::try_from(interval.as_millis())
        .unwrap_or(u64::from(u32::MAX))
        .min(u64::from(u32::MAX));
    (ms << 32) | u64::from(probes)
}

/// Period of the payload pattern: a prime, so the pattern does not line
/// up with cells, buffers or pages.
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

/// Serve workload requests on `listener` until the runtime ends. A failed
/// accept (out of descriptors, say) is retried after a growing delay, so
/// the server neither stops nor spins.
pub async fn serve(listener: TcpListener) {
    let mut backoff = onionlab_ops::AcceptBackoff::new("workload server");
    loop {
        match listener.accept().await {
            Ok((s, _)) => {
                backoff.on_success();
                tokio::spawn(async move {
                    let _ = serve_one(s).await;
                });
            }
            Err(e) => {
                let delay = backoff.on_error(std::time::Instant::now(), &e);
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Start a workload server on 127.0.0.1 (an ephemeral port).
pub async fn workload_server() -> io::Result<SocketAddr> {
    workload_server_at(IpAddr::V4(Ipv4Addr::LOCALHOST)).await
}

/// [`workload_server`] on `ip` (a free port).
pub async fn workload_server_at(ip: IpAddr) -> io::Result<SocketAddr> {
    let l = TcpListener::bind((ip, 0)).await?;
    let addr = l.local_addr()?;
    tokio::spawn(serve(l));
    Ok(addr)
}

/// The largest write the workload's ends make at once: 65535 bytes, the
/// most Shadow's TCP takes in one call. A larger write is cut short there,
/// and tokio, having seen a short write, waits for the socket to become
/// writable again, which under Shadow never happens while it already is
/// (docs/shadow.md). The same size under every engine keeps the workload
/// one workload.
pub const MAX_WRITE: usize = 65_535;

async fn serve_one(mut s: TcpStream) -> io::Result<()> {
    let _ = s.set_nodelay(true);
    let mut req = [0u8; 9];
    s.read_exact(&mut req).await?;
    let len = u64::from_be_bytes(req[1..9].try_into().unwrap_or([0; 8]));
    let mut buf = vec![0u8; MAX_WRITE];
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
        OP_UPLOAD | OP_ECHO => {
            let mut h = Sha256::new();
            let mut got = 0;
            while got < len {
                let want = (len - got).min(buf.len() as u64) as usize;
                let n = s.read(&mut buf[..want]).await?;
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                if req[0] == OP_ECHO {
                    s.write_all(&buf[..n]).await?;
                } else {
                    h.update(&buf[..n]);
                }
                got += n as u64;
            }
            if req[0] == OP_UPLOAD {
                let digest: [u8; 32] = h.finalize().into();
                s.write_all(&digest).await?;
            }
            s.shutdown().await
        }
        OP_PROBE => {
            let probes = (len & 0xFFFF_FFFF).min(MAX_PROBES);
            let interval = Duration::from_millis(len >> 32);
            let mut tick = tokio::time::interval(interval.max(Duration::from_millis(1)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for seq in 0..probes {
                tick.tick().await;
                let mut probe = [0u8; PROBE_LEN];
                probe[..8].copy_from_slice(&seq.to_be_bytes());
                probe[8..].copy_from_slice(&unix_ns().to_be_bytes());
                s.write_all(&probe).await?;
            }
            s.shutdown().await
        }
        OP_TRACE => {
            if len > MAX_TRACE_ENTRIES {
                return Err(io::ErrorKind::InvalidInput.into());
            }
            let mut schedule = vec![0u8; len as usize * 8];
            s.read_exact(&mut schedule).await?;
            let start = tokio::time::Instant::now();
            for (seq, e) in schedule.chunks_exact(8).enumerate() {
                let at = u32::from_be_bytes([e[0], e[1], e[2], e[3]]);
                let bytes = u32::from_be_bytes([e[4], e[5], e[6], e[7]]).min(MAX_TRACE_MESSAGE);
                tokio::time::sleep_until(start + Duration::from_micros(u64::from(at))).await;
                let mut msg = Vec::with_capacity(TRACE_HEADER_LEN + bytes as usize);
                msg.extend_from_slice(&(seq as u32).to_be_bytes());
                msg.extend_from_slice(&bytes.to_be_bytes());
                msg.extend_from_slice(&unix_ns().to_be_bytes());
                let body = msg.len();
                msg.resize(body + bytes as usize, 0);
                fill_pattern(0, &mut msg[body..]);
                s.write_all(&msg).await?;
            }
            s.shutdown().await
        }
        crate::stream::OP_STREAM => crate::stream::serve_stream(&mut s, len).await,
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

/// Timings of one transfer, from the start of the SOCKS request.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Transfer {
    /// SOCKS request to SOCKS success.
    pub connect: Duration,
    /// SOCKS success to the first payload byte received.
    pub first_byte: Duration,
    /// SOCKS success to the last payload byte received.
    pub last_byte: Duration,
    /// Longest time without payload progress (either direction) after SOCKS success.
    pub longest_gap: Duration,
    /// One-way latency of each probe (probe transfers only).
    pub probe_latencies: Vec<Duration>,
}

/// Why a transfer failed.
#[derive(Debug, Clone)]
pub struct TransferError {
    /// What went wrong.
    pub message: String,
    /// Whether it was the SOCKS stage.
    pub at_connect: bool,
}

impl std::fmt::Display for TransferError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn fail(at_connect: bool) -> impl Fn(String) -> TransferError {
    move |message| TransferError {
        message,
        at_connect,
    }
}

/// Connect through SOCKS to the workload server; returns the stream, when
/// the SOCKS request started and when it succeeded.
pub(crate) async fn open(
    socks: SocketAddr,
    server: SocketAddr,
    auth: Option<(&str, &str)>,
) -> Result<(TcpStream, Instant, Instant), TransferError> {
    let t0 = Instant::now();
    let s = socks_connect(socks, &server.ip().to_string(), server.port(), auth)
        .await
        .map_err(|e| fail(true)(format!("SOCKS connect: {e}")))?;
    Ok((s, t0, Instant::now()))
}

/// Run one transfer of kind `op` and `len` bytes through SOCKS, checking
/// every byte received (download, echo) or the server's digest (upload).
pub async fn transfer(
    op: u8,
    socks: SocketAddr,
    server: SocketAddr,
    len: u64,
    auth: Option<(&str, &str)>,
) -> Result<Transfer, TransferError> {
    let (mut s, t0, t1) = open(socks, server, auth).await?;
    let mut req = [0u8; 9];
    req[0] = op;
    req[1..].copy_from_slice(&len.to_be_bytes());
    let (mut rd, mut wr) = s.split();
    let err = fail(false);
    wr.write_all(&req)
        .await
        .map_err(|e| err(format!("request: {e}")))?;
    let mut last_progress = Instant::now();
    let mut longest_gap = Duration::ZERO;
    let mut note = |now: Instant| {
        longest_gap = longest_gap.max(now - last_progress);
        last_progress = now;
    };

    let sender = async {
        if op == OP_DOWNLOAD || op == OP_PROBE {
            return Ok(());
        }
        let mut buf = vec![0u8; MAX_WRITE];
        let mut off = 0u64;
        while off < len {
            let n = (len - off).min(buf.len() as u64) as usize;
            fill_pattern(off, &mut buf[..n]);
            wr.write_all(&buf[..n])
                .await
                .map_err(|e| format!("write at {off}: {e}"))?;
            off += n as u64;
        }
        Ok::<(), String>(())
    };
    let receiver = async {
        let expect_len = match op {
            OP_UPLOAD => 32,
            OP_PROBE => (len & 0xFFFF_FFFF).min(MAX_PROBES) * PROBE_LEN as u64,
            _ => len,
        };
        let mut probe_buf = Vec::new();
        let mut latencies = Vec::new();
        let mut buf = vec![0u8; 256 * 1024];
        let mut expect = vec![0u8; 256 * 1024];
        let mut got = 0u64;
        let mut first = None;
        let mut digest = Vec::new();
        while got < expect_len {
            let n = rd
                .read(&mut buf)
                .await
                .map_err(|e| format!("read at {got}: {e}"))?;
            if n == 0 {
                return Err(format!("stream closed after {got} of {expect_len} bytes"));
            }
            let now = Instant::now();
            first.get_or_insert(now);
            note(now);
            if op == OP_PROBE {
                let received = unix_ns();
                probe_buf.extend_from_slice(&buf[..n]);
                let whole = probe_buf.len() / PROBE_LEN * PROBE_LEN;
                for p in probe_buf[..whole].chunks_exact(PROBE_LEN) {
                    let seq = u64::from_be_bytes(p[..8].try_into().unwrap_or([0; 8]));
                    let sent = u64::from_be_bytes(p[8..].try_into().unwrap_or([0; 8]));
                    if seq != latencies.len() as u64 {
                        return Err(format!(
                            "probe {seq} arrived where {} was due",
                            latencies.len()
                        ));
                    }
                    latencies.push(Duration::from_nanos(received.saturating_sub(sent)));
                }
                probe_buf.drain(..whole);
            } else if op == OP_UPLOAD {
                digest.extend_from_slice(&buf[..n]);
            } else {
                fill_pattern(got, &mut expect[..n]);
                if buf[..n] != expect[..n] {
                    return Err(format!("corrupt data near byte {got}"));
                }
            }
            got += n as u64;
        }
        if op == OP_UPLOAD && digest[..] != pattern_sha256(len)[..] {
            return Err("the server saw different bytes (SHA-256 mismatch)".into());
        }
        Ok((
            first.unwrap_or_else(Instant::now),
            Instant::now(),
            latencies,
        ))
    };
    let (sent, received) = tokio::join!(sender, receiver);
    sent.map_err(&err)?;
    let (first, last, probe_latencies) = received.map_err(&err)?;
    Ok(Transfer {
        connect: t1 - t0,
        first_byte: first - t1,
        last_byte: last - t1,
        longest_gap,
        probe_latencies,
    })
}

/// Replay `schedule` (offset from the start, message bytes) through SOCKS:
/// the server sends each message at its time; returns the usual timings
/// with the one-way delay of every message in `probe_latencies`.
pub async fn replay(
    socks: SocketAddr,
    server: SocketAddr,
    schedule: &[(Duration, u32)],
    auth: Option<(&str, &str)>,
) -> Result<Transfer, TransferError> {
    let (mut s, t0, t1) = open(socks, server, auth).await?;
    let err = fail(false);
    let n = schedule.len().min(MAX_TRACE_ENTRIES as usize);
    let mut req = Vec::with_capacity(9 + 8 * n);
    req.push(OP_TRACE);
    req.extend_from_slice(&(n as u64).to_be_bytes());
    for (at, bytes) in &schedule[..n] {
        let us = u32::try_from(at.as_micros()).unwrap_or(u32::MAX);
        req.extend_from_slice(&us.to_be_bytes());
        req.extend_from_slice(&(*bytes).min(MAX_TRACE_MESSAGE).to_be_bytes());
    }
    s.write_all(&req)
        .await
        .map_err(|e| err(format!("request: {e}")))?;
    let mut delays = Vec::with_capacity(n);
    let mut first = None;
    let mut last_progress = Instant::now();
    let mut longest_gap = Duration::ZERO;
    let mut header = [0u8; TRACE_HEADER_LEN];
    let mut body = Vec::new();
    let mut expect = Vec::new();
    for (seq, &(_, want_len)) in schedule[..n].iter().enumerate() {
        s.read_exact(&mut header)
            .await
            .map_err(|e| err(format!("message {seq} header: {e}")))?;
        let now = Instant::now();
        first.get_or_insert(now);
        longest_gap = longest_gap.max(now - last_progress);
        last_progress = now;
        let got_seq = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
        let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
        let sent = u64::from_be_bytes(header[8..16].try_into().unwrap_or([0; 8]));
        if got_seq as usize != seq || len != want_len.min(MAX_TRACE_MESSAGE) {
            return Err(err(format!(
                "message {seq}: got sequence {got_seq} with {len} bytes"
            )));
        }
        body.resize(len as usize, 0);
        s.read_exact(&mut body)
            .await
            .map_err(|e| err(format!("message {seq} body: {e}")))?;
        expect.resize(len as usize, 0);
        fill_pattern(0, &mut expect);
        if body != expect {
            return Err(err(format!("corrupt data in message {seq}")));
        }
        let now = Instant::now();
        longest_gap = longest_gap.max(now - last_progress);
        last_progress = now;
        delays.push(Duration::from_nanos(unix_ns().saturating_sub(sent)));
    }
    let end = Instant::now();
    Ok(Transfer {
        connect: t1 - t0,
        first_byte: first.unwrap_or(end) - t1,
        last_byte: end - t1,
        longest_gap,
        probe_latencies: delays,
    })
}

/// Read a trace file: CSV lines `time_ms,bytes` (a header line and `#`
/// comments are skipped), times non-decreasing from the first message.
pub fn read_trace(text: &str, origin: &str) -> Result<Vec<(Duration, u32)>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty()
            || line.starts_with('#')
            || (out.is_empty() && line.starts_with(|c: char| c.is_alphabetic()))
        {
            continue;
        }
        let bad = |m: &str| format!("{origin}:{}: {m}: {line:?}", i + 1);
        let (t, b) = line
            .split_once(',')
            .ok_or_else(|| bad("expected time_ms,bytes"))?;
        let t: f64 = t.trim().parse().map_err(|_| bad("bad time"))?;
        let b: u32 = b.trim().parse().map_err(|_| bad("bad byte count"))?;
        if !(0.0..=4_000_000.0).contains(&t) {
            return Err(bad("time must be 0 to 4000000 ms"));
        }
        if b > MAX_TRACE_MESSAGE {
            return Err(bad("message larger than 1 MiB"));
        }
        let at = Duration::from_secs_f64(t / 1e3);
        if out.last().is_some_and(|(prev, _)| *prev > at) {
            return Err(bad("times go backwards"));
        }
        out.push((at, b));
        if out.len() as u64 > MAX_TRACE_ENTRIES {
            return Err(bad("more than 100000 entries"));
        }
    }
    if out.is_empty() {
        return Err(format!("{origin}: no entries"));
    }
    Ok(out)
}

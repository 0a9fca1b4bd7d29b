//! Seed 002's timestamp server: the server streams timestamped records as
//! fast as the circuit takes them for a set time; the volume received is
//! the circuit's throughput and receive minus send time its latency (all
//! hosts of the emulated network share one clock).
//!
//! Wire format (after the request, `op` [`OP_STREAM`] and `len` = the
//! duration in milliseconds): records of [`STREAM_RECORD_LEN`] bytes, a
//! sequence number (u64 big endian, from 0), the send time (ns since the
//! epoch, u64) and the payload pattern; then one end record whose sequence
//! is `u64::MAX`, then the server closes. A stream that closes without its
//! end record failed: a cut circuit is never taken for a finished stream.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::traffic::{fill_pattern, open, unix_ns, Transfer, TransferError};

/// Stream timestamped records for `len` milliseconds.
pub const OP_STREAM: u8 = 6;
/// Bytes of one record: about one RELAY_DATA cell's payload.
pub const STREAM_RECORD_LEN: usize = 512;
/// Longest stream one request may ask for (one hour).
pub const MAX_STREAM_MS: u64 = 3_600_000;
/// The receiver keeps one latency sample per this much receive time (the
/// first record completed in each), not every record's.
pub const STREAM_SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// Unsent bytes the server's socket may hold (`TCP_NOTSENT_LOWAT`): a
/// record is stamped when the socket can take it, so the stamp is not
/// older than this much queued data ahead of it on the server host.
const SERVER_UNSENT_LIMIT: u32 = 16 * 1024;
const END_SEQ: u64 = u64::MAX;
/// How long the receiver waits for the close after the end record.
const CLOSE_WAIT: Duration = Duration::from_secs(5);
const HEADER: usize = 16;

fn record(seq: u64, payload: &[u8]) -> [u8; STREAM_RECORD_LEN] {
    let mut r = [0u8; STREAM_RECORD_LEN];
    r[..8].copy_from_slice(&seq.to_be_bytes());
    r[8..HEADER].copy_from_slice(&unix_ns().to_be_bytes());
    r[HEADER..].copy_from_slice(payload);
    r
}

fn payload() -> [u8; STREAM_RECORD_LEN - HEADER] {
    let mut p = [0u8; STREAM_RECORD_LEN - HEADER];
    fill_pattern(0, &mut p);
    p
}

fn limit_unsent(s: &TcpStream) {
    if let Err(e) = socket2::SockRef::from(s).set_tcp_notsent_lowat(SERVER_UNSENT_LIMIT) {
        tracing::warn!("workload server: TCP_NOTSENT_LOWAT: {e}");
    }
}

/// The server's side: stream records for `ms` milliseconds, then the end
/// record.
pub(crate) async fn serve_stream(s: &mut TcpStream, ms: u64) -> io::Result<()> {
    if ms == 0 || ms > MAX_STREAM_MS {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    limit_unsent(s);
    let p = payload();
    let end = tokio::time::Instant::now() + Duration::from_millis(ms);
    let mut seq = 0u64;
    while tokio::time::Instant::now() < end {
        write_stamped(s, seq, &p).await?;
        seq += 1;
    }
    write_stamped(s, END_SEQ, &p).await?;
    s.shutdown().await
}

/// Write record `seq`, stamped once the socket can take it (not before
/// waiting for room: the wait belongs to the server, not to the path).
async fn write_stamped(s: &mut TcpStream, seq: u64, payload: &[u8]) -> io::Result<()> {
    loop {
        s.writable().await?;
        let r = record(seq, payload);
        match s.try_write(&r) {
            Ok(n) if n == r.len() => return Ok(()),
            // Part of it went: the rest follows, its stamp already sent.
            Ok(n) => return s.write_all(&r[n..]).await,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// What the receiver keeps of a stream.
struct Received {
    bytes: u64,
    first: Option<Instant>,
    samples: Vec<Duration>,
    next_sample: Option<Instant>,
    longest_gap: Duration,
    last_progress: Instant,
}

impl Received {
    fn progress(&mut self, now: Instant) {
        self.first.get_or_insert(now);
        self.longest_gap = self.longest_gap.max(now - self.last_progress);
        self.last_progress = now;
    }

    /// Check one whole record; `Ok(true)` at the end record.
    fn record(&mut self, r: &[u8], expect_payload: &[u8]) -> Result<bool, String> {
        let seq = u64::from_be_bytes(r[..8].try_into().unwrap_or([0; 8]));
        let sent = u64::from_be_bytes(r[8..HEADER].try_into().unwrap_or([0; 8]));
        let due = self.bytes / STREAM_RECORD_LEN as u64;
        if r[HEADER..] != *expect_payload {
            return Err(format!("corrupt record {due}"));
        }
        if seq == END_SEQ {
            return Ok(true);
        }
        if seq != due {
            return Err(format!("record {seq} arrived where {due} was due"));
        }
        self.bytes += STREAM_RECORD_LEN as u64;
        let now = Instant::now();
        if self.next_sample.is_none_or(|t| now >= t) {
            self.samples
                .push(Duration::from_nanos(unix_ns().saturating_sub(sent)));
            self.next_sample = Some(now + STREAM_SAMPLE_EVERY);
        }
        Ok(false)
    }
}

/// Stream from the workload server for `duration` through SOCKS. Returns
/// the usual timings, the payload bytes received (whole records, the end
/// record not counted) and one latency sample per
/// [`STREAM_SAMPLE_EVERY`] in `probe_latencies`.
pub async fn stream(
    socks: SocketAddr,
    server: SocketAddr,
    duration: Duration,
    auth: Option<(&str, &str)>,
) -> Result<(Transfer, u64), TransferError> {
    let (s, t0, t1) = open(socks, server, auth).await?;
    let (mut transfer, bytes) = stream_on(s, duration).await?;
    transfer.connect = t1 - t0;
    Ok((transfer, bytes))
}

/// [`stream`] on a connection already open to the workload server (or
/// through SOCKS to it): sends the request and receives; times are from
/// the call (`connect` is zero).
pub async fn stream_on(
    mut s: TcpStream,
    duration: Duration,
) -> Result<(Transfer, u64), TransferError> {
    let t1 = Instant::now();
    let err = |m: String| TransferError {
        message: m,
        at_connect: false,
    };
    let ms = u64::try_from(duration.as_millis()).unwrap_or(MAX_STREAM_MS);
    let mut req = [0u8; 9];
    req[0] = OP_STREAM;
    req[1..].copy_from_slice(&ms.to_be_bytes());
    s.write_all(&req)
        .await
        .map_err(|e| err(format!("request: {e}")))?;
    let expect = payload();
    let mut rx = Received {
        bytes: 0,
        first: None,
        samples: Vec::new(),
        next_sample: None,
        longest_gap: Duration::ZERO,
        last_progress: Instant::now(),
    };
    let mut buf = vec![0u8; 64 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = s.read(&mut buf).await.map_err(|e| {
            err(format!(
                "read after {} records: {e}",
                rx.bytes / STREAM_RECORD_LEN as u64
            ))
        })?;
        if n == 0 {
            return Err(err(format!(
                "stream closed without its end record after {} records",
                rx.bytes / STREAM_RECORD_LEN as u64
            )));
        }
        rx.progress(Instant::now());
        pending.extend_from_slice(&buf[..n]);
        let whole = pending.len() / STREAM_RECORD_LEN;
        let mut ended = false;
        for (i, r) in pending.chunks_exact(STREAM_RECORD_LEN).enumerate() {
            if rx.record(r, &expect).map_err(err)? {
                if i + 1 != whole || !pending.len().is_multiple_of(STREAM_RECORD_LEN) {
                    return Err(err("bytes after the end record".into()));
                }
                ended = true;
                break;
            }
        }
        if ended {
            break;
        }
        pending.drain(..whole * STREAM_RECORD_LEN);
    }
    let end = Instant::now();
    // Nothing may follow the end record: read to the server's close.
    match tokio::time::timeout(CLOSE_WAIT, s.read(&mut buf)).await {
        Ok(Ok(0)) | Err(_) => {}
        Ok(Ok(_)) => return Err(err("bytes after the end record".into())),
        Ok(Err(e)) => return Err(err(format!("after the end record: {e}"))),
    }
    let transfer = Transfer {
        connect: Duration::ZERO,
        first_byte: rx.first.unwrap_or(end) - t1,
        last_byte: end - t1,
        longest_gap: rx.longest_gap,
        probe_latencies: rx.samples,
    };
    Ok((transfer, rx.bytes))
}

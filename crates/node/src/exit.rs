//! Exit streams: resolving, the exit policy, connecting, and moving bytes
//! between a TCP target and its circuit stream.

use std::cell::{Cell, RefCell};
use std::io::{self, ErrorKind};
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

use onionlab_cell::msg::{EndReason, ResolvedVal, StreamId};
use onionlab_circuit::node::CircKey;
use onionlab_netdoc::policy::ExitPolicy;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::task::{spawn_local, JoinHandle};
use tracing::{debug, warn};

use crate::relay::{process, Shared, State};

/// Default bound on resolving a name and on each connection attempt
/// ([`RelaySettings::exit_connect_timeout`](crate::RelaySettings)).
pub const DEFAULT_EXIT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Once a stream has ended, how long the bytes the client had sent may
/// take to reach a target that does not read them before the connection
/// is closed anyway (so a stalled target cannot pin a descriptor).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Addresses of one name tried before giving up.
const MAX_ATTEMPTS: usize = 4;
/// Bytes moved per read from the target or the circuit.
const CHUNK: usize = 16 * 1024;
/// TTL reported in RESOLVED answers.
const RESOLVED_TTL: u32 = 60;

/// One open exit stream: the connection to its target, shared by its two
/// pump tasks (target to circuit, circuit to target).
///
/// END closes both directions of a stream (tor-spec): once the client's
/// END arrived or ours is queued, the writer sends the target what the
/// client had sent, then drops the connection (a FIN) and the stream's
/// entry in `State::streams`. If the circuit dies instead, [`abort`]
/// resets the connection: the target sees RST, never a clean end.
///
/// The two tasks share the socket through `Rc<ExitStream>` (readable /
/// try_read and writable / try_write on `&TcpStream`) rather than owning
/// split halves, so that nothing sends a FIN behind our back: dropping
/// tokio's `OwnedWriteHalf` shuts the write side down, which would turn an
/// abortive close into a clean-looking one.
///
/// [`abort`]: ExitStream::abort
pub(crate) struct ExitStream {
    tcp: TcpStream,
    /// Woken when client bytes arrive for the target (or the stream ends).
    pub(crate) to_target: Notify,
    /// Woken when the circuit stream has room for target bytes.
    pub(crate) from_target: Notify,
    /// No more client bytes will come beyond those buffered: the client
    /// sent END, or we asked the circuit to send ours.
    ended: Cell<bool>,
    /// The reader, then the writer.
    tasks: RefCell<Vec<JoinHandle<()>>>,
}

impl ExitStream {
    fn new(tcp: TcpStream) -> Self {
        ExitStream {
            tcp,
            to_target: Notify::new(),
            from_target: Notify::new(),
            ended: Cell::new(false),
            tasks: RefCell::new(Vec::new()),
        }
    }

    /// The client sent END: stop reading the target; the writer drains
    /// what the client sent, then closes the connection.
    pub(crate) fn client_ended(&self) {
        self.ended.set(true);
        self.stop_reading();
        self.to_target.notify_one();
    }

    fn stop_reading(&self) {
        if let Some(reader) = self.tasks.borrow().first() {
            reader.abort();
        }
    }

    /// The circuit is gone: reset the target connection. With SO_LINGER 0
    /// the close (when the tasks' futures, the last owners, are dropped)
    /// sends RST and discards unsent bytes; no FIN goes out before it.
    pub(crate) fn abort(&self) {
        if let Err(e) = self.tcp.set_zero_linger() {
            debug!("SO_LINGER 0 on an exit connection: {e}");
        }
        for t in self.tasks.borrow_mut().drain(..) {
            t.abort();
        }
    }
}

/// The END reason that tells a client why connecting failed.
pub fn end_reason_for_io(e: &std::io::Error) -> EndReason {
    match e.kind() {
        ErrorKind::ConnectionRefused => EndReason::CONNECTREFUSED,
        ErrorKind::TimedOut => EndReason::TIMEOUT,
        ErrorKind::NetworkUnreachable | ErrorKind::HostUnreachable => EndReason::NOROUTE,
        ErrorKind::ConnectionReset => EndReason::CONNRESET,
        _ => EndReason::MISC,
    }
}

async fn resolve(host: &str, port: u16, timeout: Duration) -> Result<Vec<SocketAddr>, EndReason> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    match tokio::time::timeout(timeout, tokio::net::lookup_host((host, port))).await {
        Ok(Ok(addrs)) => Ok(addrs.collect()),
        Ok(Err(_)) => Err(EndReason::RESOLVEFAILED),
        Err(_) => Err(EndReason::TIMEOUT),
    }
}

/// Why the exit could not connect to a target.
struct ConnectFailed {
    /// The END reason for the client.
    reason: EndReason,
    /// The last connection error, if it came to connecting.
    error: Option<io::Error>,
}

impl From<EndReason> for ConnectFailed {
    fn from(reason: EndReason) -> Self {
        ConnectFailed {
            reason,
            error: None,
        }
    }
}

async fn connect_target(
    host: &str,
    port: u16,
    policy: &ExitPolicy,
    timeout: Duration,
) -> Result<TcpStream, ConnectFailed> {
    let addrs = resolve(host, port, timeout).await?;
    if addrs.is_empty() {
        return Err(EndReason::RESOLVEFAILED.into());
    }
    let allowed: Vec<SocketAddr> = addrs
        .into_iter()
        .filter(|a| policy.allows(a.ip(), port))
        .take(MAX_ATTEMPTS)
        .collect();
    let mut last = ConnectFailed::from(EndReason::EXITPOLICY);
    for addr in allowed {
        match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(tcp)) => {
                let _ = tcp.set_nodelay(true);
                return Ok(tcp);
            }
            // Out of descriptors (or buffer memory): the next address
            // would fail the same way.
            Ok(Err(e)) if onionlab_ops::is_resource_exhaustion(&e) => {
                return Err(ConnectFailed {
                    reason: EndReason::RESOURCELIMIT,
                    error: Some(e),
                });
            }
            Ok(Err(e)) => {
                last = ConnectFailed {
                    reason: end_reason_for_io(&e),
                    error: Some(e),
                }
            }
            Err(_) => last = EndReason::TIMEOUT.into(),
        }
    }
    Err(last)
}

/// BEGIN: connect in the background, then answer CONNECTED or END.
pub(crate) fn start_connect(
    shared: &Shared,
    st: &mut State,
    circ: CircKey,
    stream: StreamId,
    host: String,
    port: u16,
) {
    let Some(policy) = st.exit_policy.clone() else {
        let _ = st
            .node
            .exit_refused(Instant::now(), circ, stream, EndReason::EXITPOLICY);
        return;
    };
    let shared = shared.clone();
    let timeout = st.exit_connect_timeout;
    spawn_local(async move {
        let result = connect_target(&host, port, &policy, timeout).await;
        let mut st = shared.borrow_mut();
        let now = Instant::now();
        match result {
            Ok(tcp) => {
                let ip = tcp.peer_addr().ok().map(|a| a.ip());
                if st.node.exit_connected(now, circ, stream, ip).is_ok() {
                    debug!(?circ, stream = u16::from(stream), %host, port, "exit stream connected");
                    open_stream(&shared, &mut st, circ, stream, tcp);
                }
            }
            Err(failed) => {
                debug!(
                    ?circ,
                    stream = u16::from(stream),
                    %host,
                    port,
                    reason = ?failed.reason,
                    error = ?failed.error,
                    "exit connect failed"
                );
                if failed.reason == EndReason::RESOURCELIMIT {
                    note_exhaustion(&mut st, now, failed.error.as_ref());
                }
                let _ = st.node.exit_refused(now, circ, stream, failed.reason);
            }
        }
        process(&shared, &mut st);
    });
}

/// A connect failed for lack of descriptors or memory: count it, and warn
/// at most once per interval (with how many happened since the last line).
/// Streams still get END RESOURCELIMIT each; the exit recovers by itself as
/// soon as descriptors are free again.
fn note_exhaustion(st: &mut State, now: Instant, error: Option<&io::Error>) {
    st.stats.exit_resource_limit += 1;
    if let Some(held_back) = st.exhaustion_log.check(now) {
        let error = error.map_or_else(|| "?".to_string(), io::Error::to_string);
        warn!(
            nickname = %st.nickname,
            held_back,
            total = st.stats.exit_resource_limit,
            "exit cannot open connections to targets: {error} \
             (out of descriptors or memory): streams end with RESOURCELIMIT"
        );
    }
}

/// Start the two pump tasks of a connected stream and register it.
fn open_stream(shared: &Shared, st: &mut State, circ: CircKey, stream: StreamId, tcp: TcpStream) {
    let es = Rc::new(ExitStream::new(tcp));
    let reader = spawn_local(target_to_circuit(shared.clone(), circ, stream, es.clone()));
    let writer = spawn_local(circuit_to_target(shared.clone(), circ, stream, es.clone()));
    es.tasks.borrow_mut().extend([reader, writer]);
    // An entry left by an earlier stream with this ID that is still
    // draining is replaced; its writer sees that and stops.
    st.streams.insert((circ, stream.into()), es);
}

/// RESOLVE: look the name up and answer RESOLVED.
pub(crate) fn start_resolve(
    shared: &Shared,
    st: &mut State,
    circ: CircKey,
    stream: StreamId,
    host: String,
) {
    if st.exit_policy.is_none() {
        let _ = st.node.exit_resolved(
            Instant::now(),
            circ,
            stream,
            vec![(ResolvedVal::NontransientError, 0)],
        );
        return;
    }
    let shared = shared.clone();
    let timeout = st.exit_connect_timeout;
    spawn_local(async move {
        let answers = match resolve(&host, 0, timeout).await {
            Ok(addrs) if !addrs.is_empty() => addrs
                .iter()
                .map(|a| (ResolvedVal::Ip(a.ip()), RESOLVED_TTL))
                .collect(),
            Ok(_) | Err(EndReason::RESOLVEFAILED) => vec![(ResolvedVal::NontransientError, 0)],
            Err(_) => vec![(ResolvedVal::TransientError, 0)],
        };
        let mut st = shared.borrow_mut();
        let _ = st.node.exit_resolved(Instant::now(), circ, stream, answers);
        process(&shared, &mut st);
    });
}

/// Read some bytes from the target (0: it closed its side).
async fn read_some(tcp: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        tcp.readable().await?;
        match tcp.try_read(buf) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

/// Write all of `buf` to the target.
async fn write_all(tcp: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        tcp.writable().await?;
        match tcp.try_write(buf) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// We end the stream because the target side ended (`DONE`) or failed:
/// END with `reason` after the queued bytes, unless the stream has
/// already ended; the writer then drains and closes.
fn end_stream(
    shared: &Shared,
    circ: CircKey,
    stream: StreamId,
    es: &ExitStream,
    reason: EndReason,
) {
    if es.ended.replace(true) {
        return;
    }
    es.to_target.notify_one();
    let mut st = shared.borrow_mut();
    debug!(
        ?circ,
        stream = u16::from(stream),
        ?reason,
        "exit stream ends: END sent to the client"
    );
    let _ = st.node.exit_end(Instant::now(), circ, stream, reason);
    process(shared, &mut st);
}

/// Target bytes into the circuit stream, respecting its send buffer.
async fn target_to_circuit(shared: Shared, circ: CircKey, stream: StreamId, es: Rc<ExitStream>) {
    let mut buf = vec![0u8; CHUNK];
    let reason = loop {
        let n = match read_some(&es.tcp, &mut buf).await {
            Ok(0) => break EndReason::DONE,
            Ok(n) => n,
            Err(e) => {
                debug!(
                    ?circ,
                    stream = u16::from(stream),
                    "reading from the target: {e}"
                );
                break end_reason_for_io(&e);
            }
        };
        let mut off = 0;
        while off < n {
            let r = {
                let mut st = shared.borrow_mut();
                let r = st
                    .node
                    .exit_write(Instant::now(), circ, stream, &buf[off..n]);
                process(&shared, &mut st);
                r
            };
            match r {
                Ok(k) => {
                    off += k;
                    if off < n {
                        es.from_target.notified().await;
                    }
                }
                // The stream is gone (the client ended it): the writer
                // closes the connection.
                Err(_) => {
                    es.ended.set(true);
                    es.to_target.notify_one();
                    return;
                }
            }
        }
    };
    end_stream(&shared, circ, stream, &es, reason);
}

/// Client bytes to the target; once the stream has ended (either side's
/// END), drain what the client had sent, then close the connection.
async fn circuit_to_target(shared: Shared, circ: CircKey, stream: StreamId, es: Rc<ExitStream>) {
    let mut buf = vec![0u8; CHUNK];
    let mut drain_deadline = None;
    loop {
        let r = {
            let mut st = shared.borrow_mut();
            if !is_registered(&st, circ, stream, &es) {
                break;
            }
            let r = st.node.exit_read(Instant::now(), circ, stream, &mut buf);
            process(&shared, &mut st);
            r
        };
        match r {
            Ok(0) if !es.ended.get() => es.to_target.notified().await,
            Ok(n) if n > 0 => {
                if es.ended.get() && drain_deadline.is_none() {
                    drain_deadline = Some(Instant::now() + DRAIN_TIMEOUT);
                }
                let written = match drain_deadline {
                    None => write_all(&es.tcp, &buf[..n]).await,
                    Some(d) => tokio::time::timeout_at(d.into(), write_all(&es.tcp, &buf[..n]))
                        .await
                        .unwrap_or_else(|_| Err(ErrorKind::TimedOut.into())),
                };
                if let Err(e) = written {
                    debug!(
                        ?circ,
                        stream = u16::from(stream),
                        "writing to the target: {e}"
                    );
                    end_stream(&shared, circ, stream, &es, end_reason_for_io(&e));
                    break;
                }
            }
            // Ended and drained, or the stream is gone.
            Ok(_) | Err(_) => break,
        }
    }
    finish(&shared, circ, stream, &es);
}

/// Is `es` still the stream registered for `(circ, stream)`?
fn is_registered(st: &State, circ: CircKey, stream: StreamId, es: &Rc<ExitStream>) -> bool {
    st.streams
        .get(&(circ, stream.into()))
        .is_some_and(|s| Rc::ptr_eq(s, es))
}

/// The writer is done: stop the reader and forget the stream. The
/// connection closes (FIN) when the last task holding it is dropped, at
/// once: no descriptor outlives its stream.
fn finish(shared: &Shared, circ: CircKey, stream: StreamId, es: &Rc<ExitStream>) {
    es.ended.set(true);
    es.stop_reading();
    let mut st = shared.borrow_mut();
    if is_registered(&st, circ, stream, es) {
        st.streams.remove(&(circ, stream.into()));
    }
    debug!(?circ, stream = u16::from(stream), "exit stream closed");
}

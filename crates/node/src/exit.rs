//! Exit streams: resolving, the exit policy, connecting, and moving bytes
//! between a TCP target and its circuit stream.

use std::cell::{Cell, RefCell};
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

use onionlab_cell::msg::{EndReason, ResolvedVal, StreamId};
use onionlab_circuit::node::CircKey;
use onionlab_netdoc::policy::ExitPolicy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::task::{spawn_local, JoinHandle};
use tracing::debug;

use crate::relay::{process, Shared, State};

/// Bound on resolving a name and on each connection attempt.
const TARGET_TIMEOUT: Duration = Duration::from_secs(10);
/// Addresses of one name tried before giving up.
const MAX_ATTEMPTS: usize = 4;
/// Bytes moved per read from the target or the circuit.
const CHUNK: usize = 16 * 1024;
/// TTL reported in RESOLVED answers.
const RESOLVED_TTL: u32 = 60;

/// The tasks of one open exit stream.
#[derive(Default)]
pub(crate) struct ExitStream {
    /// Woken when client bytes arrive for the target (or the stream ends).
    pub(crate) to_target: Notify,
    /// Woken when the circuit stream has room for target bytes.
    pub(crate) from_target: Notify,
    ended: Cell<bool>,
    tasks: RefCell<Vec<JoinHandle<()>>>,
}

impl ExitStream {
    /// The client sent END: stop reading the target; the writer drains
    /// what the client sent, then closes the connection.
    pub(crate) fn client_ended(&self) {
        self.ended.set(true);
        if let Some(reader) = self.tasks.borrow_mut().first() {
            reader.abort();
        }
        self.to_target.notify_one();
    }

    /// The circuit is gone: drop the target connection.
    pub(crate) fn abort(&self) {
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

async fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, EndReason> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    match tokio::time::timeout(TARGET_TIMEOUT, tokio::net::lookup_host((host, port))).await {
        Ok(Ok(addrs)) => Ok(addrs.collect()),
        Ok(Err(_)) => Err(EndReason::RESOLVEFAILED),
        Err(_) => Err(EndReason::TIMEOUT),
    }
}

async fn connect_target(
    host: &str,
    port: u16,
    policy: &ExitPolicy,
) -> Result<TcpStream, EndReason> {
    let addrs = resolve(host, port).await?;
    if addrs.is_empty() {
        return Err(EndReason::RESOLVEFAILED);
    }
    let allowed: Vec<SocketAddr> = addrs
        .into_iter()
        .filter(|a| policy.allows(a.ip(), port))
        .take(MAX_ATTEMPTS)
        .collect();
    let mut last = EndReason::EXITPOLICY;
    for addr in allowed {
        match tokio::time::timeout(TARGET_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(tcp)) => {
                let _ = tcp.set_nodelay(true);
                return Ok(tcp);
            }
            Ok(Err(e)) => last = end_reason_for_io(&e),
            Err(_) => last = EndReason::TIMEOUT,
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
    spawn_local(async move {
        let result = connect_target(&host, port, &policy).await;
        let mut st = shared.borrow_mut();
        let now = Instant::now();
        match result {
            Ok(tcp) => {
                let ip = tcp.peer_addr().ok().map(|a| a.ip());
                if st.node.exit_connected(now, circ, stream, ip).is_ok() {
                    debug!(?circ, stream = u16::from(stream), %host, port, "exit stream connected");
                    let es = Rc::new(ExitStream::default());
                    let (rd, wr) = tcp.into_split();
                    let reader = spawn_local(target_to_circuit(
                        shared.clone(),
                        circ,
                        stream,
                        rd,
                        es.clone(),
                    ));
                    let writer = spawn_local(circuit_to_target(
                        shared.clone(),
                        circ,
                        stream,
                        wr,
                        es.clone(),
                    ));
                    es.tasks.borrow_mut().extend([reader, writer]);
                    st.streams.insert((circ, stream.into()), es);
                }
            }
            Err(reason) => {
                debug!(?circ, stream = u16::from(stream), %host, port, ?reason, "exit connect failed");
                let _ = st.node.exit_refused(now, circ, stream, reason);
            }
        }
        process(&shared, &mut st);
    });
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
    spawn_local(async move {
        let answers = match resolve(&host, 0).await {
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

/// Target bytes into the circuit stream, respecting its send buffer.
async fn target_to_circuit(
    shared: Shared,
    circ: CircKey,
    stream: StreamId,
    mut rd: OwnedReadHalf,
    es: Rc<ExitStream>,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match rd.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
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
                Err(_) => return,
            }
        }
    }
    // The target closed (or failed): END after the queued bytes.
    let mut st = shared.borrow_mut();
    let _ = st.node.exit_close(Instant::now(), circ, stream);
    process(&shared, &mut st);
}

/// Client bytes to the target; after the client's END, drain and close.
async fn circuit_to_target(
    shared: Shared,
    circ: CircKey,
    stream: StreamId,
    mut wr: OwnedWriteHalf,
    es: Rc<ExitStream>,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let r = {
            let mut st = shared.borrow_mut();
            let r = st.node.exit_read(Instant::now(), circ, stream, &mut buf);
            process(&shared, &mut st);
            r
        };
        match r {
            Ok(0) if !es.ended.get() => es.to_target.notified().await,
            Ok(0) => break,
            Ok(n) => {
                if wr.write_all(&buf[..n]).await.is_err() {
                    // The target is gone: stop the stream.
                    let mut st = shared.borrow_mut();
                    let _ = st.node.exit_close(Instant::now(), circ, stream);
                    process(&shared, &mut st);
                    return;
                }
            }
            // Ended and drained.
            Err(_) => break,
        }
    }
    let _ = wr.shutdown().await;
}

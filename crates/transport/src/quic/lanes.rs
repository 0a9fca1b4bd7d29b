//! QUIC in the lane framework ([`crate::lanes`]): a QUIC link's lanes are
//! streams of its connection (or, conn-per-circuit, of a connection each),
//! its main connection is the control stream, and what QUIC adds is here:
//! how lanes are opened, named and read ([`QuicDialer`]), the link's
//! connections ([`QuicConns`]), and the watchers of its end and of the
//! peer's silence. See the module docs of [`crate::quic`] for the layout.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use quinn::{Connection, ConnectionError, RecvStream, SendStream, VarInt};
use tokio::time::Instant;
use tor_llcrypto::pk::ed25519::Ed25519Identity;

use super::{
    quic_err, Mode, QuicLink, QuicTransport, CONNECTION_WINDOW, LANE_MAGIC, STREAM_WINDOW,
};
use crate::endpoint::BoxFuture;
use crate::lanes::{
    self, Lane, LaneDialer, LaneHeader, LaneRead, LaneRules, LinkShared, MainConn, NodeLanes,
};
use crate::sendbuf::{LaneWrite, SHUTDOWN_TIMEOUT};
use crate::{Error, PeerInfo};

/// Chunks (received STREAM frames) taken from a stream per read.
const READ_CHUNKS: usize = 32;
/// QUIC application error codes.
const CODE_DONE: u32 = 0;
const CODE_VIOLATION: u32 = 1;

/// Everything needed to start a link after its handshakes.
pub(crate) struct LinkSpec {
    pub(crate) conn: Connection,
    pub(crate) control_send: SendStream,
    pub(crate) control_recv: RecvStream,
    pub(crate) leftover: BytesMut,
    pub(crate) link_version: u16,
    pub(crate) peer: PeerInfo,
    pub(crate) mode: Mode,
    pub(crate) our_token: [u8; super::TOKEN_LEN],
    pub(crate) peer_token: [u8; super::TOKEN_LEN],
}

/// A QUIC link's connections: the link's own, and in conn-per-circuit
/// mode each lane's.
pub(crate) struct QuicConns {
    conn: Connection,
    mode: Mode,
    transport: QuicTransport,
    our_token: [u8; super::TOKEN_LEN],
    peer: SocketAddr,
    /// Lane connections (conn-per-circuit mode), to close with the link.
    lane_conns: Mutex<HashMap<usize, Connection>>,
    /// Packets received by lane connections that ended (so the link's
    /// count of received packets only grows).
    retired_packets: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl QuicConns {
    fn close_all(&self, code: u32, reason: &[u8]) {
        self.conn.close(VarInt::from_u32(code), reason);
        for c in lock(&self.lane_conns).values() {
            c.close(VarInt::from_u32(code), reason);
        }
    }

    /// Packets received so far on all of the link's connections, open or
    /// ended (never decreases: a lane connection's end is no sign of
    /// life).
    fn packets_received(&self) -> u64 {
        let conns = lock(&self.lane_conns);
        let open: u64 = conns.values().map(|c| c.stats().udp_rx.datagrams).sum();
        let retired = self.retired_packets.load(AtomicOrdering::Relaxed);
        self.conn.stats().udp_rx.datagrams + open + retired
    }

    /// A lane connection of this link (conn-per-circuit), counted while
    /// its lane is read.
    pub(crate) fn lane_conn(self: &Arc<Self>, conn: Connection, circ_id: u32) -> LaneConn {
        lock(&self.lane_conns).insert(conn.stable_id(), conn.clone());
        LaneConn {
            conn,
            conns: self.clone(),
            circ_id,
        }
    }
}

/// A lane's own connection (conn-per-circuit): when its lane's reading
/// ends, its packets move to the link's retired count and what its
/// congestion controller saw is logged. quinn closes it once our sending
/// half is gone too.
pub(crate) struct LaneConn {
    conn: Connection,
    conns: Arc<QuicConns>,
    circ_id: u32,
}

impl Drop for LaneConn {
    fn drop(&mut self) {
        let conns = &self.conns;
        if lock(&conns.lane_conns)
            .remove(&self.conn.stable_id())
            .is_some()
        {
            conns
                .retired_packets
                .fetch_add(self.conn.stats().udp_rx.datagrams, AtomicOrdering::Relaxed);
        }
        log_path_stats(
            &self.conn,
            conns.peer,
            Some(self.circ_id),
            "QUIC lane connection done",
        );
    }
}

/// A lane's receiving half: its stream (and, conn-per-circuit, its
/// connection).
pub(crate) struct QuicLaneRead {
    recv: RecvStream,
    _conn: Option<LaneConn>,
}

impl QuicLaneRead {
    pub(crate) fn new(recv: RecvStream, conn: Option<LaneConn>) -> Self {
        QuicLaneRead { recv, _conn: conn }
    }
}

/// Reads take quinn's received chunks without a buffer of our own, so a
/// lane waiting for data holds nothing.
impl LaneRead for QuicLaneRead {
    fn read_into<'a>(&'a mut self, buf: &'a mut BytesMut) -> BoxFuture<'a, std::io::Result<usize>> {
        Box::pin(async move {
            let mut chunks: [Bytes; READ_CHUNKS] = std::array::from_fn(|_| Bytes::new());
            loop {
                let Some(n) = self.recv.read_chunks(&mut chunks).await? else {
                    return Ok(0);
                };
                let read: usize = chunks[..n].iter().map(Bytes::len).sum();
                buf.reserve(read);
                for chunk in &mut chunks[..n] {
                    // Releases quinn's packet buffer.
                    buf.extend_from_slice(&std::mem::take(chunk));
                }
                if read > 0 {
                    return Ok(read);
                }
            }
        })
    }
}

/// A lane's QUIC stream as the shared writer task drives it.
impl LaneWrite for SendStream {
    fn set_priority(&mut self, priority: i32) {
        // Only fails on a stream already closed, which the next write
        // reports.
        let _ = SendStream::set_priority(self, priority);
    }

    /// Finish the stream, then wait (at most [`SHUTDOWN_TIMEOUT`]) until
    /// the peer acknowledged all of it: the link's connection is closed
    /// only after that, and a close would discard what is unacknowledged.
    async fn finish(&mut self) {
        let _ = SendStream::finish(self);
        let _ = tokio::time::timeout(SHUTDOWN_TIMEOUT, self.stopped()).await;
    }
}

/// How a QUIC link opens its lanes, and the rest QUIC adds to the lane
/// framework.
struct QuicDialer(Arc<QuicConns>);

impl LaneDialer for QuicDialer {
    fn rules(&self) -> LaneRules {
        LaneRules {
            name: self.0.mode.kind().name(),
            // The control stream carries link-level cells only.
            main_carries_circuits: false,
            // A stream's error is its connection's.
            lane_errors_end_circuit: false,
            // Streams of one connection share its congestion window.
            priorities: self.0.mode == Mode::StreamPerCircuit,
            // Every stream's end waited for the peer's acknowledgement.
            linger: false,
        }
    }

    /// quinn does not report what it buffers: for each lane waiting for
    /// room in the reader's queue (its stream not being read), a stream
    /// window, bounded by the connection's window where the lanes share
    /// one (see the memory notes of [`crate::quic`]).
    fn held(&self, blocked_lanes: usize) -> (usize, usize) {
        let per_stream = blocked_lanes.saturating_mul(STREAM_WINDOW as usize);
        let received = match self.0.mode {
            Mode::StreamPerCircuit => per_stream.min(CONNECTION_WINDOW as usize),
            Mode::ConnPerCircuit => per_stream,
        };
        (received, 0)
    }

    fn can_open(&self) -> bool {
        true
    }

    /// A stream on the link's connection, or (conn-per-circuit) a stream
    /// on a new connection to the peer's one UDP socket.
    fn open(
        &self,
        peer: SocketAddr,
        identity: Option<Ed25519Identity>,
        circ_id: u32,
    ) -> BoxFuture<'_, Result<Lane, Error>> {
        Box::pin(async move {
            let conns = &self.0;
            let (conn, lane_conn) = match conns.mode {
                Mode::StreamPerCircuit => (conns.conn.clone(), None),
                Mode::ConnPerCircuit => {
                    let id = identity.ok_or_else(|| Error::Protocol {
                        peer,
                        detail: "cannot open a lane connection to an anonymous client".into(),
                    })?;
                    let conn = conns
                        .transport
                        .open_connection(conns.conn.remote_address(), id)
                        .await?;
                    (conn.clone(), Some(conns.lane_conn(conn, circ_id)))
                }
            };
            let (send, recv) = conn.open_bi().await.map_err(|e| quic_err(peer, e))?;
            Ok(Lane {
                read: Box::new(QuicLaneRead::new(recv, lane_conn)),
                write: Box::new(send),
            })
        })
    }

    /// The circuit ID; on a lane connection, after its magic and the
    /// receiver's link token.
    fn header(&self, p: &LaneHeader) -> Vec<u8> {
        let mut header = Vec::with_capacity(4 + super::TOKEN_LEN + 4);
        if self.0.mode == Mode::ConnPerCircuit {
            header.extend_from_slice(LANE_MAGIC);
            header.extend_from_slice(&p.token);
        }
        header.extend_from_slice(&p.circ_id.to_be_bytes());
        header
    }

    /// The stream code's I/O errors (labelled TLS) are QUIC's.
    fn named(&self, e: Error) -> Error {
        match e {
            Error::Tls { peer, source } => quic_err(peer, source),
            e => e,
        }
    }

    fn closed(&self) -> bool {
        self.0.conn.close_reason().is_some()
    }

    fn ended(&self, failure: &Error) {
        match failure {
            Error::Protocol { .. } | Error::Cell { .. } => {
                self.0.close_all(CODE_VIOLATION, b"link failed")
            }
            _ => self.0.close_all(CODE_DONE, b"link closed"),
        }
    }

    fn dropped(&self) {
        let conns = &self.0;
        log_path_stats(&conns.conn, conns.peer, None, "QUIC link done");
        conns.close_all(CODE_DONE, b"link closed");
        conns.transport.forget_token(&conns.our_token);
    }
}

/// Start a link's tasks and return its halves, its shared state and its
/// connections.
pub(crate) fn start(
    spec: LinkSpec,
    transport: QuicTransport,
) -> (QuicLink, Arc<LinkShared>, Arc<QuicConns>) {
    let conns = Arc::new(QuicConns {
        conn: spec.conn.clone(),
        mode: spec.mode,
        transport,
        our_token: spec.our_token,
        peer: spec.peer.addr,
        lane_conns: Mutex::default(),
        retired_packets: AtomicU64::new(0),
    });
    let idle_timeout = conns.transport.settings().idle_timeout;
    let (link, shared) = lanes::start(
        lanes::LinkSpec {
            main: MainConn {
                read: Box::new(spec.control_recv),
                write: Box::new(spec.control_send),
            },
            leftover: spec.leftover,
            link_version: spec.link_version,
            peer: spec.peer,
            our_token: spec.our_token,
            peer_token: spec.peer_token,
            dialer: Box::new(QuicDialer(conns.clone())),
            // Packets, not bytes, tell that the peer lives
            // (`watch_packets`), and quinn's PINGs keep an idle link so.
            liveness: None,
        },
        // No cap: QUIC's stream credit and the lanes' connections are
        // QUIC's own limits.
        NodeLanes::new(lanes::LaneSettings {
            max_lanes: usize::MAX,
        }),
    );
    shared.spawn_background(accept_streams(shared.clone(), spec.conn));
    shared.spawn_background(watch_closed(shared.clone(), conns.clone()));
    shared.spawn_background(watch_packets(shared.clone(), conns.clone(), idle_timeout));
    (link, shared, conns)
}

/// Report the connection's end to the reader.
async fn watch_closed(link: Arc<LinkShared>, conns: Arc<QuicConns>) {
    let why = conns.conn.closed().await;
    let e = match why {
        ConnectionError::ApplicationClosed(ref c)
            if c.error_code == VarInt::from_u32(CODE_DONE) =>
        {
            Error::Closed
        }
        ConnectionError::LocallyClosed => Error::Closed,
        other => quic_err(conns.peer, other),
    };
    // Lane connections too (conn-per-circuit): their reading ends now,
    // not when the peer's close reaches each of them.
    conns.close_all(CODE_DONE, b"link closed");
    match e {
        // The cells the lanes decoded before the end (some may wait for
        // room in the inbox) come before it.
        Error::Closed => link.peer_closed().await,
        e => link.connection_closed(e),
    }
}

/// Fail the link once no packet arrived on any of its connections for
/// the idle timeout (see the module docs of [`super`], "Dead peers");
/// ends with the link's main connection.
async fn watch_packets(link: Arc<LinkShared>, conns: Arc<QuicConns>, limit: Duration) {
    let tick = (limit / 8).max(Duration::from_millis(10));
    let mut seen = conns.packets_received();
    let mut since = Instant::now();
    loop {
        tokio::time::sleep(tick).await;
        if conns.conn.close_reason().is_some() {
            return;
        }
        let now = conns.packets_received();
        if now > seen {
            seen = now;
            since = Instant::now();
        } else if since.elapsed() >= limit {
            let connections = 1 + lock(&conns.lane_conns).len();
            link.fail_with(Error::Silent {
                peer: conns.peer,
                silence: since.elapsed(),
                connections,
            });
            return;
        }
    }
}

/// Accept the streams the peer opens on the link's connection. Headers
/// are read in the order the streams were opened, so that the receive
/// order of reused circuit IDs is the opening order; a lane whose first
/// packet is late delays only the acceptance of lanes opened after it.
async fn accept_streams(link: Arc<LinkShared>, conn: Connection) {
    loop {
        let Ok((send, mut recv)) = conn.accept_bi().await else {
            return;
        };
        match super::read_lane_header(&mut recv, link.peer.addr).await {
            Ok(circ_id) => {
                let lane = Lane {
                    read: Box::new(QuicLaneRead::new(recv, None)),
                    write: Box::new(send),
                };
                lanes::accept_in_order(&link, circ_id, lane);
            }
            Err(e) => return link.fail_with(e),
        }
    }
}

/// Log what a connection's congestion controller saw (INFO), for
/// experiments: a lab run's relay logs keep it.
fn log_path_stats(conn: &Connection, peer: SocketAddr, circ_id: Option<u32>, what: &str) {
    let stats = conn.stats();
    let path = stats.path;
    tracing::info!(
        %peer,
        circ_id,
        rtt_ms = path.rtt.as_secs_f64() * 1e3,
        cwnd = path.cwnd,
        sent_packets = path.sent_packets,
        lost_packets = path.lost_packets,
        congestion_events = path.congestion_events,
        mtu = path.current_mtu,
        udp_tx_bytes = stats.udp_tx.bytes,
        "{what}"
    );
}

/// Incoming cells of a QUIC link, from all its lanes.
pub type QuicReader = lanes::LaneReader;
/// Outgoing cells of a QUIC link: one lane per circuit.
pub type QuicWriter = lanes::LaneWriter;

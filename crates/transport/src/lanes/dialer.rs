//! What a transport brings to the lane framework: how its lanes are
//! opened and read ([`LaneDialer`], [`Lane`], [`LaneRead`]), the rules it
//! keeps ([`LaneRules`]), and the node's lane budget ([`NodeLanes`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::BytesMut;
use onionlab_ops::LogLimiter;
use tokio::io::{AsyncRead, AsyncReadExt, ReadHalf};
use tor_llcrypto::pk::ed25519::Ed25519Identity;
use tracing::info;

use super::wire::LaneHeader;
use crate::endpoint::BoxFuture;
use crate::sendbuf::{BoxConn, BoxLaneWrite};
use crate::Error;

/// Default [`LaneSettings::max_lanes`]: well under the usual 1024
/// descriptors of a process's soft limit, leaving room for the exit's
/// connections and the links themselves.
pub const DEFAULT_MAX_LANES: usize = 512;

/// Bytes asked of a byte stream per read.
const READ_CHUNK: usize = 16 * 1024;

/// The lane transports' settings (pctcp's; dtls-utcp takes its cap). It is
/// also the `[link.pctcp]` section of relay and client configuration
/// files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LaneSettings {
    /// Lane connections this node keeps open at most (at least 1); above
    /// it new circuits share the main connection.
    pub max_lanes: usize,
}

impl Default for LaneSettings {
    fn default() -> Self {
        LaneSettings {
            max_lanes: DEFAULT_MAX_LANES,
        }
    }
}

/// A node's lanes, shared by its links: the lane connections open against
/// the cap.
pub(crate) struct NodeLanes {
    /// Lane connections open (opened or accepted).
    pub(crate) open: AtomicUsize,
    pub(crate) max: usize,
    fallbacks: AtomicU64,
    log: Mutex<LogLimiter>,
}

impl NodeLanes {
    pub(crate) fn new(settings: LaneSettings) -> Arc<Self> {
        Arc::new(NodeLanes {
            open: AtomicUsize::new(0),
            max: settings.max_lanes,
            fallbacks: AtomicU64::new(0),
            log: Mutex::default(),
        })
    }

    /// A new circuit to `peer` uses the main connection for lack of room.
    pub(crate) fn fell_back(&self, peer: SocketAddr, transport: &str) {
        let total = self.fallbacks.fetch_add(1, AtomicOrdering::Relaxed) + 1;
        let held_back = self
            .log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .check(Instant::now());
        if let Some(held_back) = held_back {
            info!(
                %peer,
                total,
                held_back,
                open = self.open.load(AtomicOrdering::Relaxed),
                max = self.max,
                "{transport} lane cap reached: new circuits share the main connection"
            );
        }
    }

    /// Circuits that used the main connection for lack of room so far.
    pub(crate) fn fallbacks(&self) -> u64 {
        self.fallbacks.load(AtomicOrdering::Relaxed)
    }
}

/// The rules a lane transport keeps, where the designs differ.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaneRules {
    /// The transport's name, for logs.
    pub(crate) name: &'static str,
    /// Circuits may use the main connection: above the lane caps, and
    /// wherever the peer put them (pctcp, dtls-utcp). Otherwise (QUIC's
    /// control stream) every circuit has a lane, there are no caps but
    /// the transport's own, and a circuit cell on the main connection
    /// breaks the protocol.
    pub(crate) main_carries_circuits: bool,
    /// A lane's socket error ends only its circuit: the lane is a
    /// connection of its own (pctcp, dtls-utcp). Otherwise (QUIC) a
    /// stream's error is its connection's and fails the link.
    pub(crate) lane_errors_end_circuit: bool,
    /// The lanes share one congestion controller, so the circuit
    /// scheduler's priorities are handed to them (QUIC's streams of one
    /// connection).
    pub(crate) priorities: bool,
    /// Our shutdown keeps reading until the peer closed (byte streams: a
    /// socket closed with unread input answers with a reset, which may
    /// destroy what the peer has not read yet); otherwise (QUIC, whose
    /// streams' ends waited for the peer's acknowledgement) the link
    /// closes once its writers are done.
    pub(crate) linger: bool,
}

/// How a link's transport opens its lanes, and what it adds to the lane
/// framework.
pub(crate) trait LaneDialer: Send + Sync {
    /// Where this transport's design differs from the others'.
    fn rules(&self) -> LaneRules;

    /// Bytes the lanes' transport holds in this process (received, to
    /// send), with `blocked_lanes` lanes waiting for room in the reader's
    /// queue: a dtls-utcp session's user-space TCP buffers, or QUIC's
    /// flow-control bound for the streams not being read; nothing for
    /// kernel TCP, whose buffers are the kernel's (as for tls links).
    fn held(&self, blocked_lanes: usize) -> (usize, usize) {
        let _ = blocked_lanes;
        (0, 0)
    }

    /// Whether a lane could be opened now (kernel TCP: the node's cap,
    /// checked apart, is all).
    fn has_room(&self) -> bool {
        true
    }

    /// Whether lanes can be opened to the peer at all.
    fn can_open(&self) -> bool;

    /// A lane taken at once when its circuit is assigned one, so that two
    /// new circuits cannot both pass the room check and one then fail to
    /// open (the check and the taking are one step); `None` for dialers
    /// that open lanes later ([`LaneDialer::open`]).
    fn take_now(&self) -> Option<Result<Lane, Error>> {
        None
    }

    /// A new lane to `peer` (which must prove `identity`, if it has one)
    /// for circuit `circ_id`, its kernel keep-alive off; its header is
    /// written after ([`LaneDialer::header`]).
    fn open(
        &self,
        peer: SocketAddr,
        identity: Option<Ed25519Identity>,
        circ_id: u32,
    ) -> BoxFuture<'_, Result<Lane, Error>>;

    /// What a lane we open starts with, naming its circuit (and, for
    /// numbered lanes, its order) to the peer.
    fn header(&self, header: &LaneHeader) -> Vec<u8>;

    /// An error of a lane's stream, named after the transport that failed
    /// (the stream code is shared).
    fn named(&self, e: Error) -> Error {
        e
    }

    /// Whether the link's connection is closed already (QUIC's): a lane
    /// that fails meanwhile fails as a consequence, and the transport
    /// reports the end itself ([`super::LinkShared::peer_closed`] or
    /// [`super::LinkShared::connection_closed`]).
    fn closed(&self) -> bool {
        false
    }

    /// The link ended with `end` ([`Error::Closed`]: cleanly, after our
    /// shutdown or the peer's): close what the transport holds beyond the
    /// lanes.
    fn ended(&self, end: &Error) {
        let _ = end;
    }

    /// Both the link's reader and writer are gone.
    fn dropped(&self) {}
}

/// A lane's receiving half as its reader drives it: a byte stream's read
/// half, or a stream of a multiplexed connection.
pub(crate) trait LaneRead: Send {
    /// Append what arrived to `buf`, waiting until something did: `Ok(0)`
    /// at the lane's clean end.
    fn read_into<'a>(&'a mut self, buf: &'a mut BytesMut) -> BoxFuture<'a, std::io::Result<usize>>;
}

impl<T: AsyncRead + Send> LaneRead for ReadHalf<T> {
    fn read_into<'a>(&'a mut self, buf: &'a mut BytesMut) -> BoxFuture<'a, std::io::Result<usize>> {
        Box::pin(async move {
            buf.reserve(READ_CHUNK);
            self.read_buf(buf).await
        })
    }
}

/// A lane's two halves, of whatever kind of stream it is.
pub(crate) struct Lane {
    pub(crate) read: Box<dyn LaneRead>,
    pub(crate) write: BoxLaneWrite,
}

impl Lane {
    /// A lane that is one byte stream (a TLS connection, a dtls-utcp
    /// lane).
    pub(crate) fn stream(conn: BoxConn) -> Lane {
        let (read, write) = tokio::io::split(conn);
        Lane {
            read: Box::new(read),
            write: Box::new(write),
        }
    }
}

/// A link's main connection: link-level cells, and the circuits without a
/// lane where the rules allow them.
pub(crate) struct MainConn {
    pub(crate) read: Box<dyn AsyncRead + Unpin + Send>,
    pub(crate) write: BoxLaneWrite,
}

impl MainConn {
    /// A main connection that is one byte stream (a TLS connection, a
    /// dtls-utcp session's control lane).
    pub(crate) fn stream(conn: BoxConn) -> MainConn {
        let (read, write) = tokio::io::split(conn);
        MainConn {
            read: Box::new(read),
            write: Box::new(write),
        }
    }
}

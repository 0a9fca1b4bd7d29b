//! The lane framework of pctcp, dtls-utcp and quic: a link's main
//! connection (link-level cells, and circuits that have no lane where the
//! transport allows it) and one lane per circuit (a connection, or a
//! stream of a multiplexed connection), with the link's reader and writer
//! halves. What differs between the designs is the transport's
//! ([`LaneDialer`]): how lanes are opened and named, and its
//! [`LaneRules`]. See [`crate::pctcp`] and [`crate::quic`] for the wire
//! layouts.
//!
//! Sending ([`send`]): [`LaneWriter::queue`] encodes a cell into its
//! route's buffer (its circuit's lane, or the main connection); one task
//! per connection or stream writes that buffer. Receiving ([`recv`]): one
//! task per lane decodes cells and hands batches to [`LaneReader`]
//! through the link's bounded inbox.

mod dialer;
mod recv;
mod send;
pub(crate) mod wire;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use onionlab_cell::chan::{AnyChanCell, AnyChanMsg, Destroy, DestroyReason};
use onionlab_cell::codec::CellCodec;
use tokio::sync::{oneshot, Notify};
use tracing::{debug, info};

pub(crate) use dialer::{Lane, LaneDialer, LaneRead, LaneRules, MainConn, NodeLanes};
pub use dialer::{LaneSettings, DEFAULT_MAX_LANES};
pub use recv::LaneReader;
pub(crate) use recv::{accept_in_order, accept_numbered};
pub use send::LaneWriter;
pub(crate) use wire::LaneHeader;

use crate::inbox::Inbox;
use crate::link::StreamCellReader;
use crate::liveness::{self, Heard, Liveness, LivenessTiming};
use crate::read_order::{ReadOrder, ReadSlot};
use crate::sendbuf::{write_task, LinkTasks, Owner, SendBuffer};
use crate::tcp_share::wire::TOKEN_LEN;
use crate::{CircId, Error, Link, PeerInfo};

/// Most lanes one link may have open, in either direction (a protocol
/// constant: an opener falls back to the main connection above it, an
/// acceptor closes a link whose peer opens more).
pub const MAX_LANES_PER_LINK: usize = 4096;
/// Bytes of encoded cells a connection's buffer holds before it reports
/// no room.
pub const LANE_HIGH_WATER: usize = 16 * 1024;
/// How long a clean end of the main connection waits for the lanes'
/// reading to end (the closing peer ends them at the same time) before
/// the link ends.
pub(crate) const LANE_CLOSE_WAIT: Duration = Duration::from_secs(10);
/// Lanes remembered for ordering reused circuit IDs (numbers of recent
/// lanes, per direction): the maps stay bounded on a long-lived link.
const ORDER_MEMORY: usize = 65_536;
/// Circuits remembered as carried on the main connection, at most (a
/// peer's junk IDs must not grow the set).
const MAX_ON_MAIN: usize = 65_536;
/// How long new circuits use the main connection after the peer refused
/// a lane (its lane or connection limit is reached, its lane listener is
/// gone): they would likely be refused too.
const REFUSED_BACKOFF: Duration = Duration::from_secs(60);

/// Everything needed to start a link after its handshakes.
pub(crate) struct LinkSpec {
    /// The main connection (its kernel keep-alive already off).
    pub(crate) main: MainConn,
    pub(crate) leftover: BytesMut,
    pub(crate) link_version: u16,
    pub(crate) peer: PeerInfo,
    /// Our token for this link, which the peer's lanes name.
    pub(crate) our_token: [u8; TOKEN_LEN],
    /// The peer's token for this link, which our lanes name.
    pub(crate) peer_token: [u8; TOKEN_LEN],
    /// How lanes to the peer are opened.
    pub(crate) dialer: Box<dyn LaneDialer>,
    /// Heartbeat and silence limit; `None`: the transport watches the
    /// peer's liveness itself (QUIC counts packets, and quinn's PINGs keep
    /// an idle link alive).
    pub(crate) liveness: Option<LivenessTiming>,
}

/// Where the circuits' incoming numbered lanes stand in their receive
/// order.
#[derive(Default)]
struct RecvOrder {
    /// Lanes the peer opened that took their slot, by their number,
    /// until the next lane of the same circuit ID took its own.
    admitted: HashSet<u64>,
    /// Lane numbers below this were forgotten from `admitted` (they count
    /// as admitted).
    forgotten_below: u64,
}

/// Lane numbers of the lanes we open.
#[derive(Default)]
struct SendSeq {
    next: u64,
    last_of: HashMap<u32, u64>,
}

/// State shared by a link's reader, writer and tasks.
pub(crate) struct LinkShared {
    pub(crate) peer: PeerInfo,
    link_version: u16,
    dialer: Box<dyn LaneDialer>,
    rules: LaneRules,
    liveness_timing: Option<LivenessTiming>,
    node: Arc<NodeLanes>,
    peer_token: [u8; TOKEN_LEN],
    main: Arc<SendBuffer>,
    /// Send lanes by circuit ID.
    lanes: Mutex<HashMap<u32, Arc<SendBuffer>>>,
    /// Circuits carried on the main connection (no lane, or received
    /// there): both directions stay there.
    on_main: Mutex<HashSet<u32>>,
    /// Circuits whose DESTROY arrived on their lane (or whose lane
    /// failed), and when.
    ended: Mutex<HashMap<u32, Instant>>,
    /// Until when new circuits stay on the main connection: the peer
    /// refused a lane.
    refused_until: Mutex<Option<Instant>>,
    send_seq: Mutex<SendSeq>,
    order: Mutex<RecvOrder>,
    admitted: Notify,
    /// Lane connections of this link, open or opening.
    lanes_open: AtomicUsize,
    /// Each circuit ID's latest lane in the receive order, and the lanes
    /// whose reading has not ended (opening, waiting for their turn, or
    /// reading): a clean end of the main connection waits for them, so
    /// that a closing peer's last cells on its lanes are delivered before
    /// the link's end.
    read_order: ReadOrder,
    /// The peer closed the main connection cleanly: the link is ending.
    closing: AtomicBool,
    /// Cells on their way to the reader, and the link's end.
    inbox: Inbox,
    room: Notify,
    /// Encoded cells in the send buffers, open or finishing.
    send_bytes: AtomicUsize,
    /// Partial cells in lane read buffers.
    partial_bytes: AtomicUsize,
    /// Lanes waiting for room in the inbox (not reading meanwhile).
    blocked_lanes: AtomicUsize,
    /// When the peer was last heard on any connection.
    liveness: Arc<Liveness>,
    tasks: LinkTasks,
}

/// The socket error behind `e`, if it is one (not a protocol error or
/// another identity).
fn io_kind(e: &Error) -> Option<std::io::ErrorKind> {
    match e {
        Error::Io { source, .. } | Error::Tls { source, .. } | Error::Utcp { source, .. } => {
            Some(source.kind())
        }
        Error::HandshakeTimeout { .. } => Some(std::io::ErrorKind::TimedOut),
        _ => None,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Owner for LinkShared {
    fn peer_addr(&self) -> SocketAddr {
        self.peer.addr
    }

    fn fail(&self, e: Error) {
        LinkShared::fail(self, e)
    }

    /// A lane's writing failed: drop it, if lane errors end only their
    /// circuit. The DESTROY for its circuit comes from the reading half
    /// of the same connection, which fails too, in its place in the
    /// circuit's receive order.
    fn conn_failed(self: &Arc<Self>, buffer: &Arc<SendBuffer>, e: Error) {
        if !self.circuit_scoped(buffer.circ_id, &e) {
            return self.fail(e);
        }
        debug!(peer = %self.addr(), circ_id = buffer.circ_id, "{} lane write failed: {}", self.rules.name, self.named(e));
        self.drop_send_lane(buffer);
    }

    fn drained(&self, bytes: usize) {
        self.send_bytes.fetch_sub(bytes, AtomicOrdering::Relaxed);
        self.room.notify_one();
    }
}

impl LinkShared {
    fn addr(&self) -> SocketAddr {
        self.peer.addr
    }

    /// The stream code is shared: name the transport that failed.
    fn named(&self, e: Error) -> Error {
        self.dialer.named(e)
    }

    /// Whether `e`, an error of the lane of `circ_id`, ends only that
    /// circuit: a socket error of a lane that is a connection of its own.
    fn circuit_scoped(&self, circ_id: u32, e: &Error) -> bool {
        circ_id != 0 && self.rules.lane_errors_end_circuit && io_kind(e).is_some()
    }

    /// The link is broken: tell the reader, stop every connection. Once
    /// the peer closed cleanly (`closing`), or the transport's connection
    /// is closed, what fails meanwhile is the closing's doing: the link
    /// ends as the closing says ([`LinkShared::peer_closed`]).
    fn fail(&self, e: Error) {
        if self.closing.load(AtomicOrdering::Acquire) || self.dialer.closed() {
            debug!(peer = %self.addr(), "while the link closes: {e}");
            return;
        }
        self.end(e);
    }

    /// The link is done: tell the reader, stop every connection.
    fn end(&self, e: Error) {
        let e = self.named(e);
        debug!(peer = %self.addr(), "{} link ended: {e}", self.rules.name);
        self.dialer.ended(&e);
        self.inbox.fail(e);
        self.tasks.abort_all();
    }

    /// The peer closed the link cleanly: its lanes' last cells come
    /// before the link's end (what fails meanwhile, such as a heartbeat to
    /// the closed peer, does not count). For the transports whose
    /// connection reports the close (QUIC).
    pub(crate) async fn peer_closed(&self) {
        self.closing.store(true, AtomicOrdering::Release);
        self.read_order.reading().all_ended(LANE_CLOSE_WAIT).await;
        self.end(Error::Closed);
    }

    /// The transport's connection closed with `e` (QUIC's): the link's
    /// end, unless the peer is closing it cleanly.
    pub(crate) fn connection_closed(&self, e: Error) {
        if !self.closing.load(AtomicOrdering::Acquire) {
            self.end(e);
        }
    }

    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(task);
    }

    fn spawn_writer(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.spawn_writer(task);
    }

    /// Stop routing `lane`'s circuit to it, if it is still the circuit's
    /// lane.
    fn unroute(&self, lane: &Arc<SendBuffer>) {
        let mut lanes = lock(&self.lanes);
        if lanes
            .get(&lane.circ_id)
            .is_some_and(|l| Arc::ptr_eq(l, lane))
        {
            lanes.remove(&lane.circ_id);
        }
    }

    /// Our send lane `lane` is dead: drop what it holds and stop routing
    /// its circuit to it (if it is still the circuit's lane).
    fn drop_send_lane(&self, lane: &Arc<SendBuffer>) {
        self.unroute(lane);
        self.send_bytes
            .fetch_sub(lane.kill(), AtomicOrdering::Relaxed);
        self.room.notify_one();
    }

    /// A lane of `circ_id` failed with `e` (`ours`: our send lane on it,
    /// if we send on it). Where lane errors end only their circuit, a
    /// socket error (reset, refused, timed out) ends only that circuit:
    /// our lane is dropped and the DESTROY (CHANNEL_CLOSED, "the
    /// connection carrying this circuit died") returned is for the caller
    /// to hand to the node as from the peer, in the circuit's receive
    /// order; the link and its other circuits go on. `refused` (nothing
    /// sent on it arrived) also keeps new circuits on the main connection
    /// for [`REFUSED_BACKOFF`]. Anything else (another identity, a
    /// protocol error, any error of a QUIC stream) is the link's failure.
    fn lane_failed(
        &self,
        circ_id: u32,
        ours: Option<&Arc<SendBuffer>>,
        e: Error,
        refused: bool,
    ) -> Option<AnyChanCell> {
        if !self.circuit_scoped(circ_id, &e) {
            self.fail(e);
            return None;
        }
        let e = self.named(e);
        match ours {
            Some(lane) => self.drop_send_lane(lane),
            // We send on a lane of our own: the circuit is over, so is it.
            None => self.close_lane(circ_id),
        }
        if refused {
            *lock(&self.refused_until) = Some(Instant::now() + REFUSED_BACKOFF);
        }
        // Once per circuit: the peer may have ended it already, or another
        // of its connections failed first.
        let first = lock(&self.ended).insert(circ_id, Instant::now()).is_none();
        if !first {
            return None;
        }
        info!(peer = %self.addr(), circ_id, refused, "{} lane failed, its circuit ends: {e}", self.rules.name);
        Some(AnyChanCell::new(
            CircId::new(circ_id),
            AnyChanMsg::Destroy(Destroy::new(DestroyReason::CHANNEL_CLOSED)),
        ))
    }

    /// Run `task` with the link's own until the link ends (a shutdown
    /// does not wait for it): for the transports built on this module,
    /// such as a loop accepting the peer's lanes.
    pub(crate) fn spawn_background(
        &self,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        self.tasks.spawn_background(task)
    }

    /// The link is broken (for the transports built on this module).
    pub(crate) fn fail_with(&self, e: Error) {
        self.fail(e)
    }

    /// Take the next receive slot of `circ_id`: the previous lane's end
    /// to wait for, and our own end signal.
    fn order_slot(&self, circ_id: u32) -> (Option<oneshot::Receiver<()>>, ReadSlot) {
        self.read_order.take(circ_id)
    }

    fn release_slot(&self, slot: &ReadSlot) {
        self.read_order.release(slot);
    }

    /// Finish our lane of `circ_id` after what it holds, if open.
    fn close_lane(&self, circ_id: u32) {
        if let Some(lane) = lock(&self.lanes).remove(&circ_id) {
            lane.close();
        }
    }

    /// Finish our send lane `lane` after what it holds, and stop routing
    /// its circuit to it (if it is still the circuit's lane).
    fn close_send_lane(&self, lane: &Arc<SendBuffer>) {
        self.unroute(lane);
        lane.close();
    }

    /// Count a new lane connection of this link and node.
    fn lane_opened(self: &Arc<Self>) -> LaneCount {
        self.lanes_open.fetch_add(1, AtomicOrdering::Relaxed);
        self.node.open.fetch_add(1, AtomicOrdering::Relaxed);
        LaneCount(self.clone())
    }
}

/// Counts one lane connection while it lives (held by its tasks).
struct LaneCount(Arc<LinkShared>);

impl Drop for LaneCount {
    fn drop(&mut self) {
        self.0.lanes_open.fetch_sub(1, AtomicOrdering::Relaxed);
        self.0.node.open.fetch_sub(1, AtomicOrdering::Relaxed);
    }
}

/// Start a link's tasks and return its halves.
pub(crate) fn start(
    spec: LinkSpec,
    node: Arc<NodeLanes>,
) -> (Link<LaneReader, LaneWriter>, Arc<LinkShared>) {
    let (inbox, inbox_reader) = Inbox::new();
    let rules = spec.dialer.rules();
    let shared = Arc::new(LinkShared {
        peer: spec.peer.clone(),
        link_version: spec.link_version,
        dialer: spec.dialer,
        rules,
        liveness_timing: spec.liveness,
        node,
        peer_token: spec.peer_token,
        main: SendBuffer::new(0),
        lanes: Mutex::default(),
        on_main: Mutex::default(),
        ended: Mutex::default(),
        refused_until: Mutex::default(),
        send_seq: Mutex::default(),
        order: Mutex::default(),
        admitted: Notify::new(),
        lanes_open: AtomicUsize::new(0),
        inbox,
        room: Notify::new(),
        send_bytes: AtomicUsize::new(0),
        partial_bytes: AtomicUsize::new(0),
        blocked_lanes: AtomicUsize::new(0),
        liveness: Liveness::new(),
        tasks: LinkTasks::default(),
        read_order: ReadOrder::default(),
        closing: AtomicBool::new(false),
    });
    let MainConn { read, write } = spec.main;
    shared
        .tasks
        .spawn_main_writer(write_task::<_, LaneCount, _>(
            shared.clone(),
            shared.main.clone(),
            write,
            None,
        ));
    let read = Heard::new(read, shared.liveness.clone());
    let reader = StreamCellReader::new(read, spec.link_version, spec.leftover, spec.peer.addr);
    shared.spawn(recv::read_main(shared.clone(), reader));
    if let Some(timing) = shared.liveness_timing {
        shared
            .tasks
            .spawn_background(watch_liveness(shared.clone(), timing));
    }
    let end = Arc::new(LinkEnd {
        shared: shared.clone(),
    });
    let link = Link {
        peer: spec.peer,
        link_version: spec.link_version,
        reader: LaneReader::new(inbox_reader, end.clone()),
        writer: LaneWriter::new(end, CellCodec::new(spec.link_version)),
    };
    (link, shared)
}

/// Stops the link's tasks when both its reader and writer are gone.
struct LinkEnd {
    shared: Arc<LinkShared>,
}

impl Drop for LinkEnd {
    fn drop(&mut self) {
        // A token's entry dies with the link: the token table finds no
        // link in it and drops it at the next registration.
        self.shared.tasks.abort_all();
        self.shared.dialer.dropped();
    }
}

/// Fail the link when nothing arrives on any of its connections for the
/// silence limit; meanwhile send heartbeats on the main connection
/// ([`crate::liveness`]).
async fn watch_liveness(link: Arc<LinkShared>, timing: LivenessTiming) {
    let heartbeat = liveness::Heartbeat {
        on: &link.main,
        buffered: &link.send_bytes,
        link_version: link.link_version,
    };
    let connections = || 1 + link.lanes_open.load(AtomicOrdering::Relaxed);
    liveness::watchdog(&*link, &link.liveness, timing, heartbeat, connections).await
}

//! The lane framework of pctcp and dtls-utcp: a link's main connection
//! (link-level cells, and circuits that have no lane) and one connection
//! (lane) per circuit, with its reader and writer halves; how lanes are
//! opened is the transport's ([`LaneDialer`]). See [`crate::pctcp`] for
//! the layout.
//!
//! Sending: [`LaneWriter::queue`] encodes a cell into its route's buffer
//! (its circuit's lane, or the main connection); one task per connection
//! writes that buffer. Receiving: one task per connection decodes cells
//! and hands batches to [`LaneReader`] through a bounded channel.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use onionlab_cell::chan::{AnyChanCell, AnyChanMsg, Destroy, DestroyReason};
use onionlab_cell::codec::CellCodec;
use onionlab_ops::LogLimiter;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf};
use tokio::sync::{oneshot, Notify};
use tracing::{debug, info};

use crate::endpoint::BoxFuture;
use crate::inbox::{Inbox, InboxReader};
use crate::link::StreamCellReader;
use crate::liveness::LivenessTiming;
use crate::liveness::{self, Heard, Liveness};
use crate::pctcp::wire::{self, LanePreamble};
use crate::quic::wire::{lane_end, next_lane_cell};
use crate::read_order::{ReadOrder, ReadSlot};
use crate::sendbuf::{write_task, BoxConn, LinkTasks, Owner, SendBuffer};
use crate::tcp_share::wire::TOKEN_LEN;
use crate::{CellReader, CellWriter, CircId, Error, Link, Ordering, PeerInfo};
use tor_llcrypto::pk::ed25519::Ed25519Identity;

/// Default [`LaneSettings::max_lanes`]: well under the usual 1024
/// descriptors of a process's soft limit, leaving room for the exit's
/// connections and the links themselves.
pub const DEFAULT_MAX_LANES: usize = 512;
/// Most lanes one link may have open, in either direction (a protocol
/// constant: an opener falls back to the main connection above it, an
/// acceptor closes a link whose peer opens more).
pub const MAX_LANES_PER_LINK: usize = 4096;

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

/// A node's pctcp lanes, shared by its links (and dtls-utcp's, which use
/// the same lanes): the lane connections open against the cap.
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
    pub(crate) fn fell_back(&self, peer: SocketAddr) {
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
                "pctcp lane cap reached: new circuits share the main connection"
            );
        }
    }

    /// Circuits that used the main connection for lack of room so far.
    pub(crate) fn fallbacks(&self) -> u64 {
        self.fallbacks.load(AtomicOrdering::Relaxed)
    }
}

/// Bytes of encoded cells a connection's buffer holds before it reports
/// no room.
pub const LANE_HIGH_WATER: usize = 16 * 1024;
/// Bytes asked of a lane's socket per read.
const READ_CHUNK: usize = 16 * 1024;
/// Most cells per batch handed to the reader.
const MAX_BATCH: usize = 64;
/// How long an accepted lane waits for the lane its opener opened before
/// it for the same circuit ID; a peer that never opens that one broke the
/// protocol.
const ORDER_TIMEOUT: Duration = Duration::from_secs(30);
/// Lanes remembered for ordering reused circuit IDs (numbers of recent
/// lanes, per direction): the maps stay bounded on a long-lived link.
const ORDER_MEMORY: usize = 65_536;
/// Circuits remembered as carried on the main connection, at most (a
/// peer's junk IDs must not grow the set).
const MAX_ON_MAIN: usize = 65_536;
/// How long cells for a circuit whose DESTROY arrived on its lane are
/// dropped instead of opening a lane again (the peer has forgotten it).
const ENDED_GRACE: Duration = Duration::from_secs(60);
/// How long new circuits use the main connection after the peer refused
/// a lane (its lane or connection limit is reached, its lane listener is
/// gone): they would likely be refused too.
const REFUSED_BACKOFF: Duration = Duration::from_secs(60);
/// How long a clean end of the main connection waits for the lanes'
/// reading to end (the closing peer ends them at the same time) before
/// the link ends.
pub(crate) const LANE_CLOSE_WAIT: Duration = Duration::from_secs(10);

/// Everything needed to start a link after its handshakes.
pub(crate) struct LinkSpec {
    /// The main connection (its kernel keep-alive already off).
    pub(crate) conn: BoxConn,
    pub(crate) leftover: BytesMut,
    pub(crate) link_version: u16,
    pub(crate) peer: PeerInfo,
    pub(crate) our_token: [u8; TOKEN_LEN],
    pub(crate) peer_token: [u8; TOKEN_LEN],
    /// How lanes to the peer are opened.
    pub(crate) dialer: Box<dyn LaneDialer>,
    /// Heartbeat and silence limit.
    pub(crate) liveness: LivenessTiming,
}

/// How a link's transport opens its lanes.
pub(crate) trait LaneDialer: Send + Sync {
    /// Bytes the lanes' transport holds in this process (received, to
    /// send): a dtls-utcp session's user-space TCP buffers; nothing for
    /// kernel TCP, whose buffers are the kernel's (as for tls links).
    fn held(&self) -> (usize, usize) {
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
    fn take_now(&self) -> Option<Result<BoxConn, Error>> {
        None
    }

    /// A new lane to `peer` (which must prove `identity`), its kernel
    /// keep-alive off.
    fn open(
        &self,
        peer: SocketAddr,
        identity: Ed25519Identity,
    ) -> BoxFuture<'_, Result<BoxConn, Error>>;

    /// An error of a lane's stream, named after the transport that failed
    /// (the stream code is shared).
    fn named(&self, e: Error) -> Error {
        e
    }
}

/// Where the circuits' incoming lanes stand in their receive order.
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
    liveness_timing: LivenessTiming,
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
    send_bytes: AtomicUsize,
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

    /// A lane's writing failed: drop it. The DESTROY for its circuit
    /// comes from the reading half of the same connection, which fails
    /// too, in its place in the circuit's receive order.
    fn conn_failed(self: &Arc<Self>, buffer: &Arc<SendBuffer>, e: Error) {
        if buffer.circ_id == 0 || io_kind(&e).is_none() {
            return self.fail(e);
        }
        debug!(peer = %self.addr(), circ_id = buffer.circ_id, "pctcp lane write failed: {}", self.named(e));
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

    /// The stream code below is shared with TLS lanes: name the
    /// transport that failed.
    fn named(&self, e: Error) -> Error {
        self.dialer.named(e)
    }

    /// The link is broken: tell the reader, stop every connection. Once
    /// the peer closed cleanly (`closing`), what fails meanwhile is the
    /// closing's doing: the link ends as closed when the lanes' reading
    /// has ended (`read_main`).
    fn fail(&self, e: Error) {
        if self.closing.load(AtomicOrdering::Acquire) {
            debug!(peer = %self.addr(), "while the peer closes the link: {e}");
            return;
        }
        self.end(e);
    }

    /// The link is done: tell the reader, stop every connection.
    fn end(&self, e: Error) {
        let e = self.named(e);
        debug!(peer = %self.addr(), "pctcp link failed: {e}");
        self.inbox.fail(e);
        self.tasks.abort_all();
    }

    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(task);
    }

    fn spawn_writer(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.spawn_writer(task);
    }

    /// Our send lane `lane` is dead: drop what it holds and stop routing
    /// its circuit to it (if it is still the circuit's lane).
    fn drop_send_lane(&self, lane: &Arc<SendBuffer>) {
        {
            let mut lanes = lock(&self.lanes);
            if lanes
                .get(&lane.circ_id)
                .is_some_and(|l| Arc::ptr_eq(l, lane))
            {
                lanes.remove(&lane.circ_id);
            }
        }
        self.send_bytes
            .fetch_sub(lane.kill(), AtomicOrdering::Relaxed);
        self.room.notify_one();
    }

    /// A lane connection of `circ_id` failed with `e` (`ours`: our send
    /// lane on that connection, if we send on it). A socket error (reset,
    /// refused, timed out) ends only that circuit: our lane is dropped and
    /// the DESTROY (CHANNEL_CLOSED, "the connection carrying this circuit
    /// died") returned is for the caller to hand to the node as from the
    /// peer, in the circuit's receive order; the link and its other
    /// circuits go on. `refused` (nothing sent on it arrived) also keeps
    /// new circuits on the main connection for [`REFUSED_BACKOFF`].
    /// Anything else (another identity, a protocol error) is the link's
    /// failure, and so is a failure of the main connection.
    fn lane_failed(
        &self,
        circ_id: u32,
        ours: Option<&Arc<SendBuffer>>,
        e: Error,
        refused: bool,
    ) -> Option<AnyChanCell> {
        if circ_id == 0 || io_kind(&e).is_none() {
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
        info!(peer = %self.addr(), circ_id, refused, "pctcp lane failed, its circuit ends: {e}");
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
    let shared = Arc::new(LinkShared {
        peer: spec.peer.clone(),
        link_version: spec.link_version,
        dialer: spec.dialer,
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
        liveness: Liveness::new(),
        tasks: LinkTasks::default(),
        read_order: ReadOrder::default(),
        closing: AtomicBool::new(false),
    });
    let (r, w) = tokio::io::split(spec.conn);
    shared
        .tasks
        .spawn_main_writer(write_task::<_, LaneCount, _>(
            shared.clone(),
            shared.main.clone(),
            w,
            None,
        ));
    let r = Heard::new(r, shared.liveness.clone());
    let reader = StreamCellReader::new(r, spec.link_version, spec.leftover, spec.peer.addr);
    shared.spawn(read_main(shared.clone(), reader));
    shared
        .tasks
        .spawn_background(watch_liveness(shared.clone()));
    let end = Arc::new(LinkEnd {
        shared: shared.clone(),
    });
    let link = Link {
        peer: spec.peer,
        link_version: spec.link_version,
        reader: LaneReader {
            inbox: inbox_reader,
            end: end.clone(),
        },
        writer: LaneWriter {
            end,
            codec: CellCodec::new(spec.link_version),
        },
    };
    (link, shared)
}

/// Stops the link's tasks when both its reader and writer are gone.
struct LinkEnd {
    shared: Arc<LinkShared>,
}

impl Drop for LinkEnd {
    fn drop(&mut self) {
        // Its token's entry dies with the link: the token table finds no
        // link in it and drops it at the next registration.
        self.shared.tasks.abort_all();
    }
}

/// Fail the link when nothing arrives on any of its connections for the
/// silence limit; meanwhile send heartbeats on the main connection
/// ([`crate::liveness`]).
async fn watch_liveness(link: Arc<LinkShared>) {
    let heartbeat = liveness::Heartbeat {
        on: &link.main,
        buffered: &link.send_bytes,
        link_version: link.link_version,
    };
    let timing = link.liveness_timing;
    let connections = || 1 + link.lanes_open.load(AtomicOrdering::Relaxed);
    liveness::watchdog(&*link, &link.liveness, timing, heartbeat, connections).await
}

/// Read the main connection: cells of any circuit. Its end is the link's.
async fn read_main(link: Arc<LinkShared>, mut reader: StreamCellReader<Heard<ReadHalf<BoxConn>>>) {
    let mut cells = Vec::new();
    loop {
        cells.clear();
        if let Err(e) = reader.read_cells(&mut cells).await {
            if matches!(e, Error::Closed) {
                // The peer closed cleanly, its lanes too: their last cells
                // come before the link's end (and what fails meanwhile,
                // such as a heartbeat to the closed peer, does not count).
                link.closing.store(true, AtomicOrdering::Release);
                link.read_order.reading().all_ended(LANE_CLOSE_WAIT).await;
                return link.end(e);
            }
            link.fail(e);
            return;
        }
        {
            let lanes = lock(&link.lanes);
            let mut on_main = lock(&link.on_main);
            let mut ended = lock(&link.ended);
            for cell in &cells {
                let Some(id) = cell.circid().map(u32::from) else {
                    continue;
                };
                if matches!(cell.msg(), AnyChanMsg::Destroy(_)) {
                    // As on a lane: cells the node still sends for it are
                    // dropped, not given a lane of their own.
                    on_main.remove(&id);
                    ended.insert(id, Instant::now());
                } else if !lanes.contains_key(&id) && on_main.len() < MAX_ON_MAIN {
                    on_main.insert(id);
                }
            }
        }
        if !deliver(&link, std::mem::take(&mut cells)).await {
            return;
        }
    }
}

/// Hand decoded cells to the reader; false if the link is gone.
async fn deliver(link: &LinkShared, cells: Vec<AnyChanCell>) -> bool {
    // Counted as full cells (what the node's memory cap needs).
    let bytes = cells.len() * 514;
    // Not reading while the node is behind: not the peer's silence.
    link.inbox
        .deliver(cells, bytes, || link.liveness.pause())
        .await
}

/// Open a lane to the peer for `lane` and run it: connect (the peer must
/// prove the link's identity), send the lane preamble, then read the
/// peer's side of the circuit in its order and write ours.
async fn open_lane(
    link: Arc<LinkShared>,
    lane: Arc<SendBuffer>,
    (preamble, pre): (LanePreamble, Option<BoxConn>),
    slot: (Option<oneshot::Receiver<()>>, ReadSlot),
    count: Arc<LaneCount>,
) {
    let opened = async {
        let identity = link.peer.identity.ok_or_else(|| Error::Protocol {
            peer: link.addr(),
            detail: "a lane to an anonymous peer".into(),
        })?;
        let mut conn = match pre {
            Some(conn) => conn,
            None => link.dialer.open(link.addr(), identity).await?,
        };
        conn.write_all(&wire::encode_lane_preamble(&preamble))
            .await
            .map_err(|source| Error::Tls {
                peer: link.addr(),
                source,
            })?;
        Ok::<_, Error>(conn)
    };
    let conn = match opened.await {
        Ok(conn) => conn,
        Err(e) => {
            let refused = io_kind(&e) == Some(std::io::ErrorKind::ConnectionRefused);
            let destroy = link.lane_failed(lane.circ_id, Some(&lane), e, refused);
            let (prev, slot) = slot;
            if let Some(destroy) = destroy {
                // After whatever an earlier lane of this circuit ID holds.
                if let Some(prev) = prev {
                    let _ = prev.await;
                }
                deliver(&link, vec![destroy]).await;
            }
            link.release_slot(&slot);
            return;
        }
    };
    debug!(peer = %link.addr(), circ_id = lane.circ_id, seq = preamble.seq, "pctcp lane opened");
    let (r, w) = tokio::io::split(conn);
    let r = Heard::new(r, link.liveness.clone());
    let (prev, slot) = slot;
    link.spawn(read_lane(
        link.clone(),
        lane.circ_id,
        Some(lane.clone()),
        r,
        prev,
        slot,
        count.clone(),
    ));
    write_task(link, lane, w, Some(count)).await;
}

/// A lane the peer opened (its preamble read and checked): wait for its
/// turn among the peer's lanes of the same circuit ID, read it, and send
/// our side of the circuit on it unless we have a lane of our own.
pub(crate) fn accept_lane(link: &Arc<LinkShared>, preamble: LanePreamble, conn: BoxConn) {
    if link.lanes_open.load(AtomicOrdering::Relaxed) >= MAX_LANES_PER_LINK {
        link.fail(Error::Protocol {
            peer: link.addr(),
            detail: format!("more than {MAX_LANES_PER_LINK} lanes on one link"),
        });
        return;
    }
    let count = Arc::new(link.lane_opened());
    let link2 = link.clone();
    let waiting = link.read_order.reading().start();
    link.spawn(async move {
        let link = link2;
        if !wait_for_predecessor(&link, &preamble).await {
            return;
        }
        let (prev, slot) = link.order_slot(preamble.circ_id);
        drop(waiting);
        {
            let mut order = lock(&link.order);
            order.admitted.remove(&preamble.prev);
            order.admitted.insert(preamble.seq);
            if order.admitted.len() > 2 * ORDER_MEMORY {
                // Lanes whose circuit ID was not reused since: forget all
                // but the latest; a predecessor older than that counts as
                // admitted (`forgotten_below`).
                let keep_from = preamble.seq.saturating_sub(ORDER_MEMORY as u64);
                order.admitted.retain(|s| *s >= keep_from);
                order.forgotten_below = order.forgotten_below.max(keep_from);
            }
        }
        link.admitted.notify_waiters();
        // A new circuit with this ID: whatever ended before is past.
        lock(&link.ended).remove(&preamble.circ_id);
        debug!(peer = %link.addr(), circ_id = preamble.circ_id, seq = preamble.seq, "pctcp lane accepted");
        let (r, mut w) = tokio::io::split(conn);
        let r = Heard::new(r, link.liveness.clone());
        let circ_id = preamble.circ_id;
        let ours = match lock(&link.lanes).entry(circ_id) {
            std::collections::hash_map::Entry::Occupied(_) => None,
            std::collections::hash_map::Entry::Vacant(v) => Some(v.insert(SendBuffer::new(circ_id)).clone()),
        };
        match ours.clone() {
            Some(lane) => link.spawn_writer(write_task(link.clone(), lane, w, Some(count.clone()))),
            // We opened one for this circuit too: keep ours.
            None => {
                let _ = w.shutdown().await;
            }
        }
        read_lane(link, circ_id, ours, r, prev, slot, count).await;
    });
}

/// Wait until the lane the peer opened before this one for the same
/// circuit ID took its slot; false (the link failed) after
/// [`ORDER_TIMEOUT`].
async fn wait_for_predecessor(link: &LinkShared, p: &LanePreamble) -> bool {
    let deadline = tokio::time::Instant::now() + ORDER_TIMEOUT;
    loop {
        let notified = link.admitted.notified();
        let admitted = {
            let order = lock(&link.order);
            order.admitted.contains(&p.prev) || p.prev < order.forgotten_below
        };
        if p.prev == 0 || admitted {
            return true;
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            link.fail(Error::Protocol {
                peer: link.addr(),
                detail: format!(
                    "lane {} of circuit {} came without its predecessor {}",
                    p.seq, p.circ_id, p.prev
                ),
            });
            return false;
        }
    }
}

/// Read one lane's cells (all of circuit `circ_id`) after the previous
/// lane of that circuit ID ended. `ours`: our send lane on the same
/// connection, if we send on it.
async fn read_lane(
    link: Arc<LinkShared>,
    circ_id: u32,
    ours: Option<Arc<SendBuffer>>,
    mut r: Heard<ReadHalf<BoxConn>>,
    prev: Option<oneshot::Receiver<()>>,
    slot: ReadSlot,
    count: Arc<LaneCount>,
) {
    if let Some(prev) = prev {
        let _ = prev.await;
    }
    let mut buf = BytesMut::new();
    let peer = link.addr();
    let mut codec = CellCodec::new(link.link_version);
    loop {
        let mut batch = Vec::new();
        let mut destroy = false;
        loop {
            match next_lane_cell(&mut codec, circ_id, &mut buf, peer) {
                Ok(Some(cell)) => {
                    destroy |= matches!(cell.msg(), AnyChanMsg::Destroy(_));
                    batch.push(cell);
                    if batch.len() == MAX_BATCH {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => return link.fail(e),
            }
        }
        if destroy {
            // The peer forgot the circuit: end our side of the lane.
            lock(&link.ended).insert(circ_id, Instant::now());
            link.close_lane(circ_id);
        }
        if !batch.is_empty() {
            if !deliver(&link, batch).await {
                return;
            }
            continue;
        }
        buf.reserve(READ_CHUNK);
        match r.read_buf(&mut buf).await {
            Ok(0) => {
                if let Err(e) = lane_end(circ_id, buf.len(), peer) {
                    link.fail(e);
                }
                link.release_slot(&slot);
                drop(count);
                return;
            }
            Ok(_) => {}
            Err(source) => {
                let refused = source.kind() == std::io::ErrorKind::ConnectionRefused;
                let e = Error::Tls { peer, source };
                if let Some(destroy) = link.lane_failed(circ_id, ours.as_ref(), e, refused) {
                    // Before the slot is released: ahead of any later lane
                    // of this circuit ID.
                    deliver(&link, vec![destroy]).await;
                }
                link.release_slot(&slot);
                return;
            }
        }
    }
}

/// Incoming cells of a pctcp link, from every connection.
pub struct LaneReader {
    inbox: InboxReader,
    end: Arc<LinkEnd>,
}

impl CellReader for LaneReader {
    async fn read_cells(&mut self, out: &mut Vec<AnyChanCell>) -> Result<(), Error> {
        self.inbox.read_cells(&self.end.shared.inbox, out).await
    }

    fn buffered_bytes(&self) -> usize {
        let link = &self.end.shared;
        link.inbox.bytes() + link.dialer.held().0
    }
}

/// Outgoing cells of a pctcp link: one lane per circuit, the main
/// connection for the rest.
pub struct LaneWriter {
    end: Arc<LinkEnd>,
    codec: CellCodec,
}

impl LaneWriter {
    fn link(&self) -> &Arc<LinkShared> {
        &self.end.shared
    }

    /// The buffer `circ_id`'s cells go to, a new lane opened if the
    /// circuit has none yet and the caps allow; `None`: drop the cell
    /// (its circuit ended at the peer).
    fn route(&self, circ_id: u32, creates: bool) -> Option<Arc<SendBuffer>> {
        let link = self.link();
        if circ_id == 0 {
            return Some(link.main.clone());
        }
        if let Some(lane) = lock(&link.lanes).get(&circ_id) {
            return Some(lane.clone());
        }
        if lock(&link.on_main).contains(&circ_id) {
            return Some(link.main.clone());
        }
        {
            let mut ended = lock(&link.ended);
            ended.retain(|_, at| at.elapsed() < ENDED_GRACE);
            if !creates && ended.contains_key(&circ_id) {
                return None;
            }
            ended.remove(&circ_id);
        }
        if let Some(lane) = self
            .may_open_lane()
            .then(|| self.new_lane(circ_id))
            .flatten()
        {
            return Some(lane);
        }
        lock(&link.on_main).insert(circ_id);
        Some(link.main.clone())
    }

    /// Whether a new circuit may have a lane: the peer accepts lanes and
    /// neither this link's bound nor the node's cap is reached (the
    /// fallback to the main connection is counted and logged).
    fn may_open_lane(&self) -> bool {
        let link = self.link();
        if !link.dialer.can_open() || link.peer.identity.is_none() {
            return false;
        }
        let node_full = link.node.open.load(AtomicOrdering::Relaxed) >= link.node.max;
        let link_full = link.lanes_open.load(AtomicOrdering::Relaxed) >= MAX_LANES_PER_LINK;
        let refusing = lock(&link.refused_until).is_some_and(|until| Instant::now() < until);
        if node_full || link_full || refusing || !link.dialer.has_room() {
            link.node.fell_back(link.addr());
            return false;
        }
        true
    }

    /// A lane for `circ_id`, or `None` (the circuit goes on the main
    /// connection): a dtls-utcp lane is taken from its session here, at
    /// once, so two new circuits cannot both pass the room check and one
    /// then fail to open (the check and the taking are one step).
    fn new_lane(&self, circ_id: u32) -> Option<Arc<SendBuffer>> {
        let link = self.link();
        let pre: Option<BoxConn> = match link.dialer.take_now() {
            Some(Ok(stream)) => Some(stream),
            Some(Err(e)) => {
                debug!(peer = %link.addr(), circ_id, "no lane: {e}");
                link.node.fell_back(link.addr());
                return None;
            }
            None => None,
        };
        let lane = SendBuffer::new(circ_id);
        lock(&link.lanes).insert(circ_id, lane.clone());
        let (seq, prev) = {
            let mut s = lock(&link.send_seq);
            s.next += 1;
            let seq = s.next;
            let prev = s.last_of.insert(circ_id, seq).unwrap_or(0);
            if s.last_of.len() > 2 * ORDER_MEMORY {
                // Circuit IDs are not reused soon: only the latest lanes'
                // numbers can still be someone's predecessor.
                s.last_of.retain(|_, l| *l + ORDER_MEMORY as u64 > seq);
            }
            (seq, prev)
        };
        let preamble = LanePreamble {
            token: link.peer_token,
            circ_id,
            seq,
            prev,
        };
        // The receive slot is taken now, so a circuit ID's lanes are read
        // in the order they were opened here.
        let slot = link.order_slot(circ_id);
        let count = Arc::new(link.lane_opened());
        link.spawn_writer(open_lane(
            link.clone(),
            lane.clone(),
            (preamble, pre),
            slot,
            count,
        ));
        Some(lane)
    }

    /// Lane connections open on this link.
    pub fn open_lanes(&self) -> usize {
        self.link().lanes_open.load(AtomicOrdering::Relaxed)
    }
}

impl CellWriter for LaneWriter {
    fn queue(&mut self, cell: AnyChanCell) -> Result<(), Error> {
        let peer = self.link().addr();
        let circ_id = cell.circid().map_or(0, u32::from);
        let msg = cell.msg();
        let destroy = circ_id != 0 && matches!(msg, AnyChanMsg::Destroy(_));
        let creates = matches!(msg, AnyChanMsg::Create2(_) | AnyChanMsg::CreateFast(_));
        let Some(lane) = self.route(circ_id, creates) else {
            return Ok(());
        };
        {
            let mut st = lane.state();
            if st.dead {
                return Ok(());
            }
            let before = st.buf.len();
            self.codec
                .encode(cell, &mut st.buf)
                .map_err(|source| Error::Cell { peer, source })?;
            let added = st.buf.len() - before;
            self.link()
                .send_bytes
                .fetch_add(added, AtomicOrdering::Relaxed);
        }
        if destroy {
            let link = self.link();
            if lane.circ_id == 0 {
                lock(&link.on_main).remove(&circ_id);
            } else {
                link.close_lane(circ_id);
            }
        }
        lane.wake();
        Ok(())
    }

    fn has_room(&self) -> bool {
        self.link().main.buffered() < LANE_HIGH_WATER
    }

    fn has_pending(&self) -> bool {
        false
    }

    fn buffered_bytes(&self) -> usize {
        self.link().send_bytes.load(AtomicOrdering::Relaxed) + self.link().dialer.held().1
    }

    async fn flush(&mut self) -> Result<(), Error> {
        Ok(())
    }

    async fn shutdown(&mut self) -> Result<(), Error> {
        let link = self.link().clone();
        for (_, lane) in lock(&link.lanes).drain() {
            lane.close();
        }
        // The lanes end first: the peer then sees the main connection's
        // end after their last cells (and waits for its lanes' reading to
        // end, `read_main`).
        link.tasks.drain(|| link.main.close()).await;
        Ok(())
    }

    fn ordering(&self) -> Ordering {
        Ordering::PerCircuit
    }

    fn has_room_for(&self, circ_id: CircId) -> bool {
        let link = self.link();
        let id = u32::from(circ_id);
        if let Some(lane) = lock(&link.lanes).get(&id) {
            return lane.buffered() < LANE_HIGH_WATER;
        }
        if lock(&link.on_main).contains(&id) {
            return self.has_room();
        }
        true
    }

    async fn writable(&mut self) {
        self.link().room.notified().await
    }
}

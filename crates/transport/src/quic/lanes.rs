//! A QUIC link's lanes (one QUIC stream per circuit) and its reader and
//! writer halves. See the module docs of [`crate::quic`] for the layout.
//!
//! Sending: [`QuicWriter::queue`] encodes a cell into its circuit's lane
//! buffer; one task per lane moves the buffer into the lane's QUIC stream
//! (the send buffer and its task are the other lane transports' too,
//! [`crate::sendbuf`]).
//! Receiving: one task per incoming stream decodes cells and hands batches
//! to [`QuicReader`] through a bounded channel.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use onionlab_cell::chan::{AnyChanCell, AnyChanMsg, ChanMsg};
use onionlab_cell::codec::CellCodec;
use quinn::{Connection, ConnectionError, RecvStream, SendStream, VarInt};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;
use tracing::debug;

use super::{
    quic_err, wire, write_lane_header, Mode, QuicLink, QuicTransport, CONNECTION_WINDOW,
    LANE_HIGH_WATER, STREAM_WINDOW,
};
use crate::inbox::{Inbox, InboxReader};
use crate::link::StreamCellReader;
use crate::read_order::{ReadOrder, ReadSlot};
use crate::sendbuf::{write_task, LaneWrite, LinkTasks, Owner, SendBuffer, SHUTDOWN_TIMEOUT};
use crate::{CellReader, CellWriter, CircId, Error, Link, Ordering, PeerInfo};

/// Chunks (received STREAM frames) taken from a stream per read.
const READ_CHUNKS: usize = 32;
/// A lane read buffer left with more capacity than this is replaced by
/// one holding just its partial cell, so idle lanes hold almost nothing.
const MAX_IDLE_READ_BUF: usize = 1024;
/// Most cells per batch handed to the reader.
const MAX_BATCH: usize = 64;
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

/// State shared by a link's reader, writer and tasks.
pub(crate) struct LinkShared {
    pub(crate) peer: PeerInfo,
    link_version: u16,
    mode: Mode,
    conn: Connection,
    transport: QuicTransport,
    our_token: [u8; super::TOKEN_LEN],
    peer_token: [u8; super::TOKEN_LEN],
    /// Open send lanes by circuit ID (0: the control stream).
    lanes: Mutex<HashMap<u32, Arc<SendBuffer>>>,
    /// Latest receive slot per circuit ID.
    read_order: ReadOrder,
    /// Lane connections (conn-per-circuit mode), to close with the link.
    lane_conns: Mutex<HashMap<usize, Connection>>,
    /// Packets received by lane connections that ended (so the link's
    /// count of received packets only grows).
    retired_packets: AtomicU64,
    /// Send-lane tasks, drained by shutdown, aborted when the link ends.
    tasks: LinkTasks,
    /// Cells on their way to the reader, and the link's end.
    inbox: Inbox,
    /// Signalled when a lane's buffer drained.
    room: Notify,
    memory: LinkMemory,
}

/// What a link's buffers hold, kept up to date as they change, so that
/// the relay can count it toward its memory cap in O(1).
#[derive(Default)]
struct LinkMemory {
    /// Encoded cells in send lanes, open or finishing.
    send: AtomicUsize,
    /// Partial cells in lane read buffers (decoded cells waiting for the
    /// reader are the inbox's count).
    partial: AtomicUsize,
    /// Incoming lanes waiting for room in the reader queue. Their streams
    /// are not read meanwhile, so quinn may hold up to a stream window of
    /// data for each: quinn does not report what it buffers, so that
    /// bound is what is counted.
    blocked_lanes: AtomicUsize,
}

impl LinkMemory {
    fn add(counter: &AtomicUsize, bytes: usize) {
        counter.fetch_add(bytes, AtomicOrdering::Relaxed);
    }

    fn sub(counter: &AtomicUsize, bytes: usize) {
        counter.fetch_sub(bytes, AtomicOrdering::Relaxed);
    }

    /// Receive-side bytes: ours (`queued` in the inbox, partial cells),
    /// plus quinn's flow-control bound for the lanes not being read.
    fn received(&self, mode: Mode, queued: usize) -> usize {
        let blocked = self.blocked_lanes.load(AtomicOrdering::Relaxed);
        let per_stream = blocked.saturating_mul(STREAM_WINDOW as usize);
        let quinn = match mode {
            // All lanes share one connection window.
            Mode::StreamPerCircuit => per_stream.min(CONNECTION_WINDOW as usize),
            // Each lane has its own connection.
            Mode::ConnPerCircuit => per_stream,
        };
        queued + self.partial.load(AtomicOrdering::Relaxed) + quinn
    }
}

/// Counts a lane as blocked while it lives.
struct BlockedLane<'a>(&'a AtomicUsize);

impl<'a> BlockedLane<'a> {
    fn new(counter: &'a AtomicUsize) -> Self {
        LinkMemory::add(counter, 1);
        BlockedLane(counter)
    }
}

impl Drop for BlockedLane<'_> {
    fn drop(&mut self) {
        LinkMemory::sub(self.0, 1);
    }
}

/// A lane's partial cell, counted in [`LinkMemory::partial`] while it
/// lives.
struct HeldBytes<'a> {
    counter: &'a AtomicUsize,
    bytes: usize,
}

impl HeldBytes<'_> {
    fn set(&mut self, bytes: usize) {
        if bytes >= self.bytes {
            LinkMemory::add(self.counter, bytes - self.bytes);
        } else {
            LinkMemory::sub(self.counter, self.bytes - bytes);
        }
        self.bytes = bytes;
    }
}

impl Drop for HeldBytes<'_> {
    fn drop(&mut self) {
        LinkMemory::sub(self.counter, self.bytes);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LinkShared {
    fn addr(&self) -> SocketAddr {
        self.peer.addr
    }

    /// A lane failed with `e`: the link's failure, unless the link's
    /// connection was closed (by the peer, cleanly or not, or by us): a
    /// lane's writing then fails as a consequence, and `watch_closed`
    /// reports the end itself, after the cells that came before it.
    fn fail_unless_closed(&self, e: Error) {
        if self.conn.close_reason().is_some() {
            debug!(peer = %self.addr(), "lane failed as its link closed: {e}");
            return;
        }
        self.fail(e);
    }

    /// Report a broken link to the reader and close the connection.
    fn fail(&self, e: Error) {
        debug!(peer = %self.addr(), "QUIC link failed: {e}");
        let code = match e {
            Error::Protocol { .. } | Error::Cell { .. } => CODE_VIOLATION,
            _ => CODE_DONE,
        };
        self.inbox.fail(e);
        self.close_all(code, b"link failed");
    }

    fn close_all(&self, code: u32, reason: &[u8]) {
        self.conn.close(VarInt::from_u32(code), reason);
        for c in lock(&self.lane_conns).values() {
            c.close(VarInt::from_u32(code), reason);
        }
    }

    /// Finish our lane for `circ_id` (after what it holds), if open.
    fn close_lane(&self, circ_id: u32) {
        if let Some(lane) = lock(&self.lanes).remove(&circ_id) {
            lane.close();
        }
    }

    /// Take a receive slot for a new stream of `circ_id`: the previous
    /// stream's end to wait for, and our own end signal.
    fn order_slot(&self, circ_id: u32) -> (Option<oneshot::Receiver<()>>, ReadSlot) {
        self.read_order.take(circ_id)
    }

    fn release_slot(&self, slot: &ReadSlot) {
        self.read_order.release(slot);
    }
}

impl Owner for LinkShared {
    fn peer_addr(&self) -> SocketAddr {
        self.peer.addr
    }

    fn fail(&self, e: Error) {
        LinkShared::fail(self, e)
    }

    /// A stream's writing failed: the link fails (the stream code is
    /// shared, so its errors are named QUIC's here), unless its connection
    /// is closed already, whose end `watch_closed` reports.
    fn conn_failed(self: &Arc<Self>, _buffer: &Arc<SendBuffer>, e: Error) {
        let e = match e {
            Error::Tls { peer, source } => quic_err(peer, source),
            e => e,
        };
        self.fail_unless_closed(e);
    }

    fn drained(&self, bytes: usize) {
        LinkMemory::sub(&self.memory.send, bytes);
        self.room.notify_one();
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

/// Start a link's tasks and return its halves.
pub(crate) fn start(spec: LinkSpec, transport: QuicTransport) -> (QuicLink, Arc<LinkShared>) {
    let (inbox, inbox_reader) = Inbox::new();
    let shared = Arc::new(LinkShared {
        peer: spec.peer.clone(),
        link_version: spec.link_version,
        mode: spec.mode,
        conn: spec.conn.clone(),
        transport,
        our_token: spec.our_token,
        peer_token: spec.peer_token,
        lanes: Mutex::default(),
        read_order: ReadOrder::default(),
        lane_conns: Mutex::default(),
        retired_packets: AtomicU64::new(0),
        tasks: LinkTasks::default(),
        inbox,
        room: Notify::new(),
        memory: LinkMemory::default(),
    });
    // The control stream: link-level cells only.
    let control = SendBuffer::new(0);
    lock(&shared.lanes).insert(0, control.clone());
    shared
        .tasks
        .spawn_writer(lane_task(shared.clone(), control, Some(spec.control_send)));
    tokio::spawn(control_reader(
        shared.clone(),
        StreamCellReader::new(
            spec.control_recv,
            spec.link_version,
            spec.leftover,
            spec.peer.addr,
        ),
    ));
    tokio::spawn(accept_streams(shared.clone()));
    tokio::spawn(watch_closed(shared.clone()));
    tokio::spawn(watch_packets(shared.clone()));
    let end = Arc::new(LinkEnd {
        shared: shared.clone(),
    });
    let link = Link {
        peer: spec.peer,
        link_version: spec.link_version,
        reader: QuicReader {
            inbox: inbox_reader,
            end: end.clone(),
        },
        writer: QuicWriter {
            end,
            codec: CellCodec::new(spec.link_version),
        },
    };
    (link, shared)
}

/// Closes the link when both its reader and writer are gone.
struct LinkEnd {
    shared: Arc<LinkShared>,
}

impl Drop for LinkEnd {
    fn drop(&mut self) {
        log_path_stats(
            &self.shared.conn,
            self.shared.addr(),
            None,
            "QUIC link done",
        );
        self.shared.close_all(CODE_DONE, b"link closed");
        // Lane tasks waiting for cells would otherwise wait forever.
        self.shared.tasks.abort_all();
        self.shared.transport.forget_token(&self.shared.our_token);
    }
}

/// Report the connection's end to the reader.
async fn watch_closed(link: Arc<LinkShared>) {
    let why = link.conn.closed().await;
    let e = match why {
        ConnectionError::ApplicationClosed(ref c)
            if c.error_code == VarInt::from_u32(CODE_DONE) =>
        {
            Error::Closed
        }
        ConnectionError::LocallyClosed => Error::Closed,
        other => quic_err(link.addr(), other),
    };
    // Lane connections too (conn-per-circuit): their reading ends now,
    // not when the peer's close reaches each of them.
    link.close_all(CODE_DONE, b"link closed");
    if matches!(e, Error::Closed) {
        // The cells the lanes decoded before the end (some may wait for
        // room in the inbox) come before it.
        link.read_order
            .reading()
            .all_ended(crate::lanes::LANE_CLOSE_WAIT)
            .await;
    }
    link.inbox.fail(e);
}

/// Packets received so far on all of the link's connections, open or
/// ended (never decreases: a lane connection's end is no sign of life).
fn packets_received(link: &LinkShared) -> u64 {
    let conns = lock(&link.lane_conns);
    let open: u64 = conns.values().map(|c| c.stats().udp_rx.datagrams).sum();
    let retired = link.retired_packets.load(AtomicOrdering::Relaxed);
    link.conn.stats().udp_rx.datagrams + open + retired
}

/// Fail the link once no packet arrived on any of its connections for
/// the idle timeout (see the module docs of [`super`], "Dead peers");
/// ends with the link's main connection.
async fn watch_packets(link: Arc<LinkShared>) {
    let limit = link.transport.settings().idle_timeout;
    let tick = (limit / 8).max(Duration::from_millis(10));
    let mut seen = packets_received(&link);
    let mut since = Instant::now();
    loop {
        tokio::time::sleep(tick).await;
        if link.conn.close_reason().is_some() {
            return;
        }
        let now = packets_received(&link);
        if now > seen {
            seen = now;
            since = Instant::now();
        } else if since.elapsed() >= limit {
            let connections = 1 + lock(&link.lane_conns).len();
            link.fail(Error::Silent {
                peer: link.addr(),
                silence: since.elapsed(),
                connections,
            });
            return;
        }
    }
}

/// The control stream after the handshake carries padding only.
async fn control_reader(link: Arc<LinkShared>, mut reader: StreamCellReader<RecvStream>) {
    let mut cells = Vec::new();
    match reader.read_cells(&mut cells).await {
        Ok(()) => {
            let cmd = cells.first().map(|c| c.msg().cmd());
            link.fail(Error::Protocol {
                peer: link.addr(),
                detail: format!("{cmd:?} cell on the QUIC control stream"),
            });
        }
        // The peer finished its control stream: the link is closing, and
        // the connection's end tells the reader.
        Err(Error::Closed) => {}
        // The connection's end: `watch_closed` reports it, clean or not.
        // Otherwise the stream reader's I/O errors (labelled TLS) are
        // QUIC's.
        Err(Error::Tls { .. }) if link.conn.close_reason().is_some() => {}
        Err(Error::Tls { peer, source }) => link.fail(quic_err(peer, source)),
        Err(e) => link.fail(e),
    }
}

/// Accept the streams the peer opens on the link's connection. Headers
/// are read in the order the streams were opened, so that the receive
/// order of reused circuit IDs is the opening order; a lane whose first
/// packet is late delays only the acceptance of lanes opened after it.
async fn accept_streams(link: Arc<LinkShared>) {
    loop {
        let Ok((send, mut recv)) = link.conn.accept_bi().await else {
            return;
        };
        match super::read_lane_header(&mut recv, link.addr()).await {
            Ok(circ_id) => accept_lane(&link, circ_id, send, recv, None),
            Err(e) => {
                link.fail(e);
                return;
            }
        }
    }
}

/// A lane the peer opened: read it, and send our side of the circuit on
/// its other half (unless we already have a lane for that circuit).
pub(crate) fn accept_lane(
    link: &Arc<LinkShared>,
    circ_id: u32,
    send: SendStream,
    recv: RecvStream,
    lane_conn: Option<Connection>,
) {
    if let Some(c) = &lane_conn {
        lock(&link.lane_conns).insert(c.stable_id(), c.clone());
    }
    let (prev, slot) = link.order_slot(circ_id);
    tokio::spawn(read_lane(
        link.clone(),
        circ_id,
        recv,
        prev,
        slot,
        lane_conn,
    ));
    let mut lanes = lock(&link.lanes);
    if lanes.contains_key(&circ_id) {
        // We opened one too: keep ours, end this half.
        drop(lanes);
        let mut send = send;
        let _ = send.finish();
        return;
    }
    let lane = SendBuffer::new(circ_id);
    lanes.insert(circ_id, lane.clone());
    drop(lanes);
    link.tasks
        .spawn_writer(lane_task(link.clone(), lane, Some(send)));
}

/// Open a lane we send first on: a stream on the link's connection, or
/// (conn-per-circuit) a stream on a new connection to the peer.
async fn open_lane(link: &Arc<LinkShared>, lane: &SendBuffer) -> Result<SendStream, Error> {
    let circ_id = lane.circ_id;
    let peer = link.addr();
    let (conn, token) = match link.mode {
        Mode::StreamPerCircuit => (link.conn.clone(), None),
        Mode::ConnPerCircuit => {
            let Some(id) = link.peer.identity else {
                return Err(Error::Protocol {
                    peer,
                    detail: "cannot open a lane connection to an anonymous client".into(),
                });
            };
            // The peer's one UDP socket is where this link came from.
            let conn = link
                .transport
                .open_connection(link.conn.remote_address(), id)
                .await?;
            lock(&link.lane_conns).insert(conn.stable_id(), conn.clone());
            (conn, Some(&link.peer_token))
        }
    };
    let (mut send, recv) = conn.open_bi().await.map_err(|e| quic_err(peer, e))?;
    write_lane_header(&mut send, peer, circ_id, token).await?;
    let (prev, slot) = link.order_slot(circ_id);
    let lane_conn = (link.mode == Mode::ConnPerCircuit).then_some(conn);
    tokio::spawn(read_lane(
        link.clone(),
        circ_id,
        recv,
        prev,
        slot,
        lane_conn,
    ));
    Ok(send)
}

/// Move a lane's buffer into its QUIC stream until the lane closes,
/// opening the stream first if the peer did not.
async fn lane_task(link: Arc<LinkShared>, lane: Arc<SendBuffer>, stream: Option<SendStream>) {
    let send = match stream {
        Some(s) => s,
        None => match open_lane(&link, &lane).await {
            Ok(s) => s,
            Err(e) => {
                link.drained(lane.kill());
                link.fail_unless_closed(e);
                return;
            }
        },
    };
    write_task::<_, (), _>(link, lane, send, None).await
}

/// Decode the cells of one circuit's incoming stream.
async fn read_lane(
    link: Arc<LinkShared>,
    circ_id: u32,
    mut recv: RecvStream,
    prev: Option<oneshot::Receiver<()>>,
    slot: ReadSlot,
    lane_conn: Option<Connection>,
) {
    if let Some(prev) = prev {
        // The previous stream for this ID must be read to its end first
        // (its sender dropped or the link closed).
        let _ = prev.await;
    }
    let result = read_lane_cells(&link, circ_id, &mut recv).await;
    link.release_slot(&slot);
    match result {
        // The peer is done with this circuit: finish our half too.
        Ok(()) => link.close_lane(circ_id),
        Err(None) => {}
        Err(Some(e)) => link.fail(e),
    }
    if let Some(c) = lane_conn {
        // quinn closes the lane's connection once our sending half (held
        // by its lane task) is gone too.
        if lock(&link.lane_conns).remove(&c.stable_id()).is_some() {
            link.retired_packets
                .fetch_add(c.stats().udp_rx.datagrams, AtomicOrdering::Relaxed);
        }
        log_path_stats(&c, link.addr(), Some(circ_id), "QUIC lane connection done");
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

/// `Ok` at a clean end of stream, `Err(None)` if the reader or the
/// connection is gone, `Err(Some(e))` for a violation.
///
/// Reads take quinn's received chunks without a buffer of our own, so a
/// lane waiting for data holds nothing; between reads it keeps only a
/// partial cell.
async fn read_lane_cells(
    link: &LinkShared,
    circ_id: u32,
    recv: &mut RecvStream,
) -> Result<(), Option<Error>> {
    let peer = link.addr();
    let mut codec = CellCodec::new(link.link_version);
    let mut chunks: [Bytes; READ_CHUNKS] = std::array::from_fn(|_| Bytes::new());
    let mut buf = BytesMut::new();
    let mut held = HeldBytes {
        counter: &link.memory.partial,
        bytes: 0,
    };
    loop {
        let n = match recv.read_chunks(&mut chunks).await {
            Ok(Some(n)) => n,
            Ok(None) => return wire::lane_end(circ_id, buf.len(), peer).map_err(Some),
            Err(e) => {
                return match link.conn.close_reason() {
                    Some(_) => Err(None),
                    None => Err(Some(quic_err(peer, e))),
                }
            }
        };
        let read: usize = chunks[..n].iter().map(Bytes::len).sum();
        tracing::trace!(circ_id, bytes = read, "lane read");
        buf.reserve(read);
        for chunk in &mut chunks[..n] {
            // Releases quinn's packet buffer.
            buf.extend_from_slice(&std::mem::take(chunk));
        }
        held.set(buf.len());
        let (mut cells, mut bytes) = (Vec::new(), 0);
        loop {
            let before = buf.len();
            let cell = match wire::next_lane_cell(&mut codec, circ_id, &mut buf, peer) {
                Ok(Some(cell)) => cell,
                Ok(None) => break,
                Err(e) => return Err(Some(e)),
            };
            if matches!(cell.msg(), AnyChanMsg::Destroy(_)) {
                link.close_lane(circ_id);
            }
            bytes += before - buf.len();
            cells.push(cell);
            if cells.len() == MAX_BATCH {
                // The cells' bytes move from the partial buffer to the
                // inbox.
                held.set(buf.len());
                deliver(link, std::mem::take(&mut cells), std::mem::take(&mut bytes)).await?;
            }
        }
        held.set(buf.len());
        if !cells.is_empty() {
            deliver(link, cells, bytes).await?;
        }
        if buf.capacity() > MAX_IDLE_READ_BUF {
            buf = BytesMut::from(&buf[..]);
        }
    }
}

/// Hand a lane's cells (`bytes` of them) to the reader, waiting for room
/// in its queue (counted as a blocked lane meanwhile). `Err(None)` if the
/// reader is gone.
async fn deliver(
    link: &LinkShared,
    cells: Vec<AnyChanCell>,
    bytes: usize,
) -> Result<(), Option<Error>> {
    let blocked = || BlockedLane::new(&link.memory.blocked_lanes);
    match link.inbox.deliver(cells, bytes, blocked).await {
        true => Ok(()),
        false => Err(None),
    }
}

/// Incoming cells of a QUIC link, from all its lanes.
pub struct QuicReader {
    inbox: InboxReader,
    end: Arc<LinkEnd>,
}

impl CellReader for QuicReader {
    async fn read_cells(&mut self, out: &mut Vec<AnyChanCell>) -> Result<(), Error> {
        self.inbox.read_cells(&self.end.shared.inbox, out).await
    }

    /// Decoded cells waiting, partial cells in lane buffers, and a stream
    /// window for each lane waiting for room in the queue (see
    /// [`crate::quic`]'s memory notes).
    fn buffered_bytes(&self) -> usize {
        let shared = &self.end.shared;
        shared.memory.received(shared.mode, shared.inbox.bytes())
    }
}

/// Outgoing cells of a QUIC link: one lane per circuit.
pub struct QuicWriter {
    end: Arc<LinkEnd>,
    codec: CellCodec,
}

impl QuicWriter {
    fn link(&self) -> &Arc<LinkShared> {
        &self.end.shared
    }

    /// The lane of `circ_id`, opened if it has none.
    fn lane(&self, circ_id: u32) -> Arc<SendBuffer> {
        let link = self.link();
        let mut lanes = lock(&link.lanes);
        if let Some(lane) = lanes.get(&circ_id) {
            return lane.clone();
        }
        let lane = SendBuffer::new(circ_id);
        lanes.insert(circ_id, lane.clone());
        drop(lanes);
        link.tasks
            .spawn_writer(lane_task(link.clone(), lane.clone(), None));
        lane
    }

    /// Which QUIC mode this link uses.
    pub fn kind(&self) -> crate::TransportKind {
        self.link().mode.kind()
    }

    /// Circuit lanes open for sending (the control stream not counted).
    pub fn open_lanes(&self) -> usize {
        lock(&self.link().lanes).len().saturating_sub(1)
    }
}

impl CellWriter for QuicWriter {
    fn queue(&mut self, cell: AnyChanCell) -> Result<(), Error> {
        let peer = self.link().addr();
        let circ_id = cell.circid().map_or(0, u32::from);
        let destroy = circ_id != 0 && matches!(cell.msg(), AnyChanMsg::Destroy(_));
        let lane = self.lane(circ_id);
        {
            let mut st = lane.state();
            if st.dead {
                // The link is failing; its reader reports why.
                return Ok(());
            }
            let before = st.buf.len();
            self.codec
                .encode(cell, &mut st.buf)
                .map_err(|source| Error::Cell { peer, source })?;
            LinkMemory::add(&self.link().memory.send, st.buf.len() - before);
        }
        if destroy {
            self.link().close_lane(circ_id);
        }
        lane.wake();
        Ok(())
    }

    fn has_room(&self) -> bool {
        lock(&self.link().lanes)
            .get(&0)
            .is_none_or(|l| l.buffered() < LANE_HIGH_WATER)
    }

    fn has_pending(&self) -> bool {
        false
    }

    /// Bytes buffered in all send lanes, including those of closed
    /// circuits still draining (for memory accounting; O(1)).
    fn buffered_bytes(&self) -> usize {
        self.link().memory.send.load(AtomicOrdering::Relaxed)
    }

    async fn flush(&mut self) -> Result<(), Error> {
        Ok(())
    }

    async fn shutdown(&mut self) -> Result<(), Error> {
        let link = self.link().clone();
        let lanes: Vec<Arc<SendBuffer>> = lock(&link.lanes).drain().map(|(_, l)| l).collect();
        for lane in lanes {
            lane.close();
        }
        // Every lane, the control stream among them, ends at once: the
        // connection's close, after they are acknowledged, is the link's
        // end.
        link.tasks.drain(|| {}).await;
        link.close_all(CODE_DONE, b"link closed");
        Ok(())
    }

    fn ordering(&self) -> Ordering {
        Ordering::PerCircuit
    }

    fn has_room_for(&self, circ_id: CircId) -> bool {
        lock(&self.link().lanes)
            .get(&u32::from(circ_id))
            .is_none_or(|l| l.buffered() < LANE_HIGH_WATER)
    }

    /// Streams of one connection share its congestion window, so quinn's
    /// stream priorities carry the circuit scheduler's order onto the
    /// wire. Lanes that are connections of their own have nothing to
    /// share, and ignore it.
    fn set_lane_priority(&mut self, circ_id: CircId, priority: i32) {
        if self.link().mode != Mode::StreamPerCircuit {
            return;
        }
        self.lane(u32::from(circ_id)).set_priority(priority);
    }

    async fn writable(&mut self) {
        self.link().room.notified().await
    }
}

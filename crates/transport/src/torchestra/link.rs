//! A torchestra link: the light connection (the link's first) and the
//! heavy one, the switch protocol between them ([`super::switch`]), and
//! the link's reader and writer halves. Layout and rules:
//! `docs/torchestra.md`.
//!
//! Both connections' read tasks pass every cell through the link's
//! [`Switches`] and append what it releases to one inbox under the same
//! lock, so the order the state machine decides is the order the node
//! reads. The writer routes each cell by the same state, so a circuit's
//! cells follow its switches exactly.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::BytesMut;
use onionlab_cell::chan::AnyChanCell;
use onionlab_cell::codec::CellCodec;
use tokio::io::{AsyncWriteExt, ReadHalf};
use tokio::sync::Notify;
use tracing::debug;

use super::switch::{Conn, Control, Switches};
use super::wire;
use crate::link::StreamCellReader;
use crate::liveness::{self, Heard, Liveness};
use crate::sendbuf::{write_task, LinkTasks, Owner, Reading, Readings, SendBuffer, Tls};
use crate::tcp_share::wire::TOKEN_LEN;
use crate::tls::{keepalive_off, TlsTransport};
use crate::{
    CellReader, CellWriter, CircId, CircuitMover, Error, Link, LinkEvent, Ordering, PeerInfo,
};

/// Bytes of encoded cells a connection's buffer holds before it reports
/// no room.
pub const HIGH_WATER: usize = 32 * 1024;
/// Cells waiting for the node at most before the connections stop being
/// read (one batch more may arrive).
const INBOX_CELLS: usize = 256;
/// Cells held for switches at most per link (about 32 MiB). An honest
/// peer holds back at most the cells its switching circuits send while
/// the old connection drains (their windows: the exit may move several
/// bulk circuits at once); the held cells count toward the relay's memory
/// cap as received data, which closes the link holding the most long
/// before this bound. A peer past it loses the circuit.
pub const MAX_PENDING: usize = 65_536;
/// Circuits with a switch state at most per link.
pub const MAX_SWITCH_STATES: usize = 65_536;
/// Encoded size counted per cell held or waiting (a fixed cell; the
/// memory cap's estimate).
const CELL_BYTES: usize = 514;

/// Everything needed to start a link after its handshakes.
pub(crate) struct LinkSpec {
    pub(crate) tls: Tls,
    pub(crate) leftover: BytesMut,
    pub(crate) link_version: u16,
    pub(crate) peer: PeerInfo,
    pub(crate) our_token: [u8; TOKEN_LEN],
    pub(crate) peer_token: [u8; TOKEN_LEN],
    /// Both ends switch circuits, and the peer is a relay.
    pub(crate) switching: bool,
    /// We opened the link: we open the heavy connection.
    pub(crate) opener: bool,
}

/// What the read tasks and the writer share under one lock.
struct State {
    switches: Switches,
    inbox: VecDeque<AnyChanCell>,
    events: VecDeque<LinkEvent>,
    codec: CellCodec,
}

/// State shared by a link's reader, writer and tasks.
pub(crate) struct LinkShared {
    pub(crate) peer: PeerInfo,
    link_version: u16,
    transport: TlsTransport,
    peer_token: [u8; TOKEN_LEN],
    switching: bool,
    /// We opened the link (and so its heavy connection; we accept none).
    opener: bool,
    /// The reader half is gone: the read tasks stop.
    reader_gone: AtomicBool,
    state: Mutex<State>,
    light: Arc<SendBuffer>,
    heavy: Arc<SendBuffer>,
    heavy_up: AtomicBool,
    /// Switches asked for that could not run (no heavy connection yet).
    pub(crate) refused_moves: AtomicU64,
    inbox_ready: Notify,
    inbox_room: Notify,
    failure: Mutex<Option<Error>>,
    room: Notify,
    send_bytes: AtomicUsize,
    /// When the peer was last heard on either connection.
    liveness: Arc<Liveness>,
    tasks: LinkTasks,
    /// Connections still being read: a clean end of one waits for the
    /// other's, so that a closing peer's last cells on it come before the
    /// link's end.
    reading: Arc<Readings>,
    /// The peer closed a connection cleanly: the link is ending.
    closing: AtomicBool,
}

/// How long a connection's clean end waits for the other's reading to end
/// (the closing peer ends both at once) before the link ends.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Owner for LinkShared {
    fn peer_addr(&self) -> SocketAddr {
        self.peer.addr
    }

    /// Once the peer closed a connection cleanly (`closing`), what fails
    /// meanwhile is the closing's doing: the link ends as closed when
    /// the other connection's reading has ended (`read_conn`).
    fn fail(&self, e: Error) {
        if self.closing.load(AtomicOrdering::Acquire) {
            debug!(peer = %self.peer.addr, "while the peer closes the link: {e}");
            return;
        }
        self.end(e);
    }

    fn drained(&self, bytes: usize) {
        self.send_bytes.fetch_sub(bytes, AtomicOrdering::Relaxed);
        self.room.notify_one();
        // Read tasks waiting for our answers to drain.
        self.inbox_room.notify_waiters();
    }
}

impl LinkShared {
    /// The link is done: tell the reader, stop every connection.
    fn end(&self, e: Error) {
        debug!(peer = %self.peer.addr, "torchestra link failed: {e}");
        lock(&self.failure).get_or_insert(e);
        self.inbox_ready.notify_one();
        self.tasks.abort_all();
    }

    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(task);
    }

    fn spawn_writer(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.spawn_writer(task);
    }

    fn buffer(&self, conn: Conn) -> &Arc<SendBuffer> {
        match conn {
            Conn::Light => &self.light,
            Conn::Heavy => &self.heavy,
        }
    }

    /// Encode `cell` onto `conn`'s buffer (the state lock held, so the
    /// order of buffers and state agree).
    fn push(&self, st: &mut State, conn: Conn, cell: AnyChanCell) -> Result<(), Error> {
        let buffer = self.buffer(conn);
        let mut b = buffer.state();
        if b.dead {
            return Ok(());
        }
        let before = b.buf.len();
        st.codec
            .encode(cell, &mut b.buf)
            .map_err(|source| Error::Cell {
                peer: self.peer.addr,
                source,
            })?;
        // Counted before the buffer is released, so the writer task never
        // subtracts bytes not yet added.
        self.send_bytes
            .fetch_add(b.buf.len() - before, AtomicOrdering::Relaxed);
        drop(b);
        buffer.wake();
        Ok(())
    }

    /// The peer opened the link's heavy connection: accepted only when we
    /// switch and did not open the link (the opener opens it).
    pub(crate) fn accept_heavy(self: &Arc<Self>, tls: Tls) -> Result<(), Error> {
        if !self.switching || self.opener {
            return Err(Error::Protocol {
                peer: self.peer.addr,
                detail: "a heavy connection this link does not have".into(),
            });
        }
        self.attach_heavy(tls)
    }

    /// The heavy connection is open: start its tasks.
    fn attach_heavy(self: &Arc<Self>, tls: Tls) -> Result<(), Error> {
        if self.heavy_up.swap(true, AtomicOrdering::AcqRel) {
            return Err(Error::Protocol {
                peer: self.peer.addr,
                detail: "a second heavy connection".into(),
            });
        }
        keepalive_off(&tls);
        let (r, w) = tokio::io::split(tls);
        self.spawn_writer(write_task::<_, (), _>(
            self.clone(),
            self.heavy.clone(),
            w,
            None,
        ));
        let r = Heard::new(r, self.liveness.clone());
        let reader = StreamCellReader::new(r, self.link_version, BytesMut::new(), self.peer.addr);
        let reading = self.reading.start();
        self.spawn(read_conn(self.clone(), reading, Conn::Heavy, reader));
        self.transport
            .mode_state::<super::NodeState>()
            .heavy_attached();
        debug!(peer = %self.peer.addr, "torchestra heavy connection up");
        Ok(())
    }
}

/// Start a link's tasks (and, as its opener between relays, its heavy
/// connection) and return its halves.
pub(crate) fn start(
    spec: LinkSpec,
    transport: TlsTransport,
) -> (Link<TorchestraReader, TorchestraWriter>, Arc<LinkShared>) {
    let shared = Arc::new(LinkShared {
        peer: spec.peer.clone(),
        link_version: spec.link_version,
        transport,
        peer_token: spec.peer_token,
        switching: spec.switching,
        opener: spec.opener,
        reader_gone: AtomicBool::new(false),
        state: Mutex::new(State {
            switches: Switches::new(MAX_PENDING, MAX_SWITCH_STATES),
            inbox: VecDeque::new(),
            events: VecDeque::new(),
            codec: CellCodec::new(spec.link_version),
        }),
        light: SendBuffer::new(0),
        heavy: SendBuffer::new(0),
        heavy_up: AtomicBool::new(false),
        refused_moves: AtomicU64::new(0),
        inbox_ready: Notify::new(),
        inbox_room: Notify::new(),
        failure: Mutex::new(None),
        room: Notify::new(),
        send_bytes: AtomicUsize::new(0),
        liveness: Liveness::new(),
        tasks: LinkTasks::default(),
        reading: Arc::default(),
        closing: AtomicBool::new(false),
    });
    keepalive_off(&spec.tls);
    let (r, w) = tokio::io::split(spec.tls);
    shared.tasks.spawn_main_writer(write_task::<_, (), _>(
        shared.clone(),
        shared.light.clone(),
        w,
        None,
    ));
    let r = Heard::new(r, shared.liveness.clone());
    let reader = StreamCellReader::new(r, spec.link_version, spec.leftover, spec.peer.addr);
    let reading = shared.reading.start();
    shared.spawn(read_conn(shared.clone(), reading, Conn::Light, reader));
    shared
        .tasks
        .spawn_background(watch_liveness(shared.clone()));
    if spec.switching && spec.opener {
        shared.spawn_writer(open_heavy(shared.clone()));
    }
    let _ = spec.our_token;
    let end = Arc::new(LinkEnd {
        shared: shared.clone(),
    });
    let link = Link {
        peer: spec.peer,
        link_version: spec.link_version,
        reader: TorchestraReader { end: end.clone() },
        writer: TorchestraWriter { end },
    };
    (link, shared)
}

/// Open the heavy connection to the peer, which must prove the link's
/// identity; a failure fails the link.
async fn open_heavy(link: Arc<LinkShared>) {
    let opened = async {
        let identity = link.peer.identity.ok_or_else(|| Error::Protocol {
            peer: link.peer.addr,
            detail: "a heavy connection to an anonymous peer".into(),
        })?;
        let mut tls = link.transport.connect_tls(link.peer.addr, identity).await?;
        tls.write_all(&wire::encode_heavy_preamble(&link.peer_token))
            .await
            .map_err(|source| Error::Tls {
                peer: link.peer.addr,
                source,
            })?;
        Ok::<_, Error>(tls)
    };
    match opened.await.and_then(|tls| link.attach_heavy(tls)) {
        Ok(()) => {}
        Err(e) => link.fail(e),
    }
}

/// Stops the link's tasks when both its reader and writer are gone.
struct LinkEnd {
    shared: Arc<LinkShared>,
}

impl Drop for LinkEnd {
    fn drop(&mut self) {
        self.shared.tasks.abort_all();
    }
}

/// Fail the link when nothing arrives on either connection for the
/// silence limit; meanwhile send heartbeats on the light connection
/// ([`crate::liveness`]).
async fn watch_liveness(link: Arc<LinkShared>) {
    let heartbeat = liveness::Heartbeat {
        on: &link.light,
        buffered: &link.send_bytes,
        link_version: link.link_version,
    };
    let timing = link.transport.liveness_timing();
    let connections = || 1 + usize::from(link.heavy_up.load(AtomicOrdering::Relaxed));
    liveness::watchdog(&*link, &link.liveness, timing, heartbeat, connections).await
}

/// Read one connection: every cell through the switch state, what it
/// releases into the inbox, its answers onto the buffers.
async fn read_conn(
    link: Arc<LinkShared>,
    reading: Reading,
    conn: Conn,
    mut reader: StreamCellReader<Heard<ReadHalf<Tls>>>,
) {
    let mut cells = Vec::new();
    loop {
        // Back-pressure: stop reading while the node is behind, or while
        // our answers (switch cells) wait behind a full send buffer; stop
        // for good once the node dropped the reader.
        loop {
            let room = link.inbox_room.notified();
            if link.reader_gone.load(AtomicOrdering::Acquire) {
                return;
            }
            let answers_fit =
                link.light.buffered() < 4 * HIGH_WATER && link.heavy.buffered() < 4 * HIGH_WATER;
            if lock(&link.state).inbox.len() < INBOX_CELLS && answers_fit {
                break;
            }
            // Not reading while the node is behind: not the peer's silence.
            let _paused = link.liveness.pause();
            room.await;
        }
        cells.clear();
        if let Err(e) = reader.read_cells(&mut cells).await {
            if matches!(e, Error::Closed) {
                // The peer closed cleanly, both connections at once: the
                // other's last cells come before the link's end (and what
                // fails meanwhile does not count).
                link.closing.store(true, AtomicOrdering::Release);
                drop(reading);
                link.reading.all_ended(CLOSE_WAIT).await;
                return link.end(e);
            }
            link.fail(e);
            return;
        }
        if let Err(e) = take_cells(&link, conn, cells.drain(..)) {
            link.fail(e);
            return;
        }
        link.inbox_ready.notify_one();
    }
}

fn take_cells(
    link: &LinkShared,
    conn: Conn,
    cells: impl Iterator<Item = AnyChanCell>,
) -> Result<(), Error> {
    let mut guard = lock(&link.state);
    let st = &mut *guard;
    for cell in cells {
        if !link.switching {
            // A link without a heavy connection (a client's, or a peer
            // that does not switch): a switch cell is the peer's mistake.
            // (On a switching link the peer's SWITCH may come before its
            // heavy connection is attached here: our answers wait in the
            // heavy buffer, whose writer starts when it is.)
            match (cell.circid(), Control::parse(cell.msg())) {
                (Some(circ_id), Some(_)) => st.events.push_back(LinkEvent::CircuitViolation {
                    circ_id,
                    detail: "a Torchestra switch cell on a link that does not switch".into(),
                }),
                _ => st.inbox.push_back(cell),
            }
            continue;
        }
        let r = st.switches.receive(conn, cell);
        st.inbox.extend(r.deliver);
        for (to, cell) in r.send {
            link.push(st, to, cell)?;
        }
        if let Some((circ_id, to, propagate)) = r.switched {
            st.events.push_back(LinkEvent::Switched {
                circ_id,
                heavy: to == Conn::Heavy,
                propagate,
            });
        }
        if let Some(v) = r.violation {
            st.events.push_back(LinkEvent::CircuitViolation {
                circ_id: v.circ,
                detail: v.what.to_string(),
            });
        }
    }
    Ok(())
}

impl Drop for TorchestraReader {
    fn drop(&mut self) {
        let link = &self.end.shared;
        link.reader_gone.store(true, AtomicOrdering::Release);
        link.inbox_room.notify_waiters();
    }
}

/// Incoming cells of a torchestra link, from both connections, in the
/// order the switch protocol releases them.
pub struct TorchestraReader {
    end: Arc<LinkEnd>,
}

impl CellReader for TorchestraReader {
    async fn read_cells(&mut self, out: &mut Vec<AnyChanCell>) -> Result<(), Error> {
        let link = &self.end.shared;
        loop {
            let ready = link.inbox_ready.notified();
            {
                let mut st = lock(&link.state);
                if !st.inbox.is_empty() || !st.events.is_empty() {
                    let n = st.inbox.len().min(64);
                    out.extend(st.inbox.drain(..n));
                    drop(st);
                    link.inbox_room.notify_waiters();
                    return Ok(());
                }
            }
            if let Some(e) = lock(&link.failure).take() {
                return Err(e);
            }
            ready.await;
        }
    }

    fn buffered_bytes(&self) -> usize {
        let st = lock(&self.end.shared.state);
        (st.inbox.len() + st.switches.pending()) * CELL_BYTES
    }

    fn poll_event(&mut self) -> Option<LinkEvent> {
        lock(&self.end.shared.state).events.pop_front()
    }
}

/// Outgoing cells of a torchestra link: each circuit's cells on the
/// connection the switch protocol says.
pub struct TorchestraWriter {
    end: Arc<LinkEnd>,
}

impl TorchestraWriter {
    fn link(&self) -> &Arc<LinkShared> {
        &self.end.shared
    }

    /// Whether the heavy connection is open (switches can run).
    pub fn heavy_up(&self) -> bool {
        self.link().heavy_up.load(AtomicOrdering::Acquire)
    }
}

impl CellWriter for TorchestraWriter {
    fn queue(&mut self, cell: AnyChanCell) -> Result<(), Error> {
        let link = self.link();
        let mut guard = lock(&link.state);
        let st = &mut *guard;
        let conn = st.switches.route(&cell);
        link.push(st, conn, cell)
    }

    fn has_room(&self) -> bool {
        self.link().light.buffered() < HIGH_WATER
    }

    fn has_pending(&self) -> bool {
        false
    }

    fn buffered_bytes(&self) -> usize {
        self.link().send_bytes.load(AtomicOrdering::Relaxed)
    }

    async fn flush(&mut self) -> Result<(), Error> {
        Ok(())
    }

    async fn shutdown(&mut self) -> Result<(), Error> {
        let link = self.link().clone();
        // Heavy first: the peer then sees light's end after heavy's last
        // cells (and waits for heavy's reading to end, `read_conn`).
        link.heavy.close();
        link.tasks.drain(|| link.light.close()).await;
        Ok(())
    }

    /// Per circuit: the two connections are two lanes, each circuit on
    /// one of them; the circuit scheduler orders the circuits of each.
    fn ordering(&self) -> Ordering {
        Ordering::PerCircuit
    }

    fn has_room_for(&self, circ_id: CircId) -> bool {
        let link = self.link();
        let conn = lock(&link.state).switches.send_on(circ_id);
        link.buffer(conn).buffered() < HIGH_WATER
    }

    async fn writable(&mut self) {
        self.link().room.notified().await
    }

    fn circuit_mover(&mut self) -> Option<&mut dyn CircuitMover> {
        Some(self)
    }
}

impl CircuitMover for TorchestraWriter {
    fn move_circuit(&mut self, circ_id: CircId, heavy: bool, propagate: bool) {
        let link = self.link();
        if !link.switching || !self.heavy_up() {
            link.refused_moves.fetch_add(1, AtomicOrdering::Relaxed);
            return;
        }
        let to = if heavy { Conn::Heavy } else { Conn::Light };
        let mut guard = lock(&link.state);
        let st = &mut *guard;
        for (conn, cell) in st.switches.start(circ_id, to, propagate) {
            if let Err(e) = link.push(st, conn, cell) {
                drop(guard);
                link.fail(e);
                return;
            }
        }
    }
}

//! The receiving side of a lane link: the main connection's reader, the
//! lanes the peer opens ([`accept_numbered`], [`accept_in_order`]), each
//! lane's reader in its circuit's receive order, and [`LaneReader`], the
//! link's half the node reads.

use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use onionlab_cell::chan::{AnyChanCell, AnyChanMsg, ChanMsg};
use onionlab_cell::codec::CellCodec;
use tokio::io::AsyncRead;
use tokio::sync::oneshot;
use tracing::debug;

use super::{
    lock, LaneCount, LaneHeader, LaneRead, LinkEnd, LinkShared, MAX_LANES_PER_LINK, MAX_ON_MAIN,
    ORDER_MEMORY,
};
use crate::inbox::InboxReader;
use crate::link::StreamCellReader;
use crate::liveness::Heard;
use crate::read_order::ReadSlot;
use crate::sendbuf::{write_task, BoxLaneWrite, LaneWrite, SendBuffer};
use crate::{CellReader, Error};

use super::wire::{lane_end, next_lane_cell};
use super::Lane;

/// Most cells per batch handed to the reader.
const MAX_BATCH: usize = 64;
/// A lane read buffer left with more capacity than this is replaced by
/// one holding just its partial cell, so idle lanes hold almost nothing.
const MAX_IDLE_READ_BUF: usize = 1024;
/// How long an accepted numbered lane waits for the lane its opener
/// opened before it for the same circuit ID; a peer that never opens that
/// one broke the protocol.
const ORDER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Read the main connection: link-level cells, and cells of the circuits
/// that have no lane where the rules allow it. Its clean end is the
/// link's, after the lanes' last cells.
pub(super) async fn read_main(
    link: Arc<LinkShared>,
    mut reader: StreamCellReader<Heard<Box<dyn AsyncRead + Unpin + Send>>>,
) {
    let mut cells = Vec::new();
    loop {
        cells.clear();
        if let Err(e) = reader.read_cells(&mut cells).await {
            if matches!(e, Error::Closed) {
                return link.peer_closed().await;
            }
            return link.fail(e);
        }
        if !link.rules.main_carries_circuits {
            let cmd = cells.first().map(|c| c.msg().cmd());
            return link.fail(Error::Protocol {
                peer: link.addr(),
                detail: format!(
                    "{cmd:?} cell on the {} control stream (every circuit has a lane)",
                    link.rules.name
                ),
            });
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
        // Counted as full cells (what the node's memory cap needs).
        let bytes = cells.len() * 514;
        if !deliver(&link, std::mem::take(&mut cells), bytes).await {
            return;
        }
    }
}

/// Counts a lane as waiting for room in the inbox while it lives.
struct Blocked<'a>(&'a AtomicUsize);

impl Drop for Blocked<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, AtomicOrdering::Relaxed);
    }
}

/// Hand decoded cells (`bytes` of them) to the reader; false if the link
/// is gone.
async fn deliver(link: &LinkShared, cells: Vec<AnyChanCell>, bytes: usize) -> bool {
    let blocked = || {
        link.blocked_lanes.fetch_add(1, AtomicOrdering::Relaxed);
        // Not reading while the node is behind: not the peer's silence.
        (link.liveness.pause(), Blocked(&link.blocked_lanes))
    };
    link.inbox.deliver(cells, bytes, blocked).await
}

/// Hand over the DESTROY of a circuit whose lane failed.
pub(super) async fn deliver_destroy(link: &LinkShared, destroy: AnyChanCell) {
    deliver(link, vec![destroy], 514).await;
}

/// A lane the peer opened, numbered (its header read and checked): wait
/// for its turn among the peer's lanes of the same circuit ID, read it,
/// and send our side of the circuit on it unless we have a lane of our
/// own.
pub(crate) fn accept_numbered(link: &Arc<LinkShared>, header: &LaneHeader, lane: Lane) {
    let order = (header.seq, header.prev);
    accept(link, header.circ_id, Some(order), lane)
}

/// A lane the peer opened, for circuit `circ_id`, whose turn among the
/// lanes of the same circuit ID is its arrival (call in that order).
pub(crate) fn accept_in_order(link: &Arc<LinkShared>, circ_id: u32, lane: Lane) {
    accept(link, circ_id, None, lane)
}

/// Where an accepted lane's turn among its circuit ID's lanes comes from.
enum Turn {
    /// Its receive slot, taken as it arrived.
    Taken((Option<oneshot::Receiver<()>>, ReadSlot)),
    /// After numbered lane `prev` of the peer's took its slot.
    After { seq: u64, prev: u64 },
}

fn accept(link: &Arc<LinkShared>, circ_id: u32, order: Option<(u64, u64)>, lane: Lane) {
    if link.lanes_open.load(AtomicOrdering::Relaxed) >= MAX_LANES_PER_LINK {
        link.fail(Error::Protocol {
            peer: link.addr(),
            detail: format!("more than {MAX_LANES_PER_LINK} lanes on one link"),
        });
        return;
    }
    let count = Arc::new(link.lane_opened());
    let waiting = link.read_order.reading().start();
    let turn = match order {
        // In arrival order: the slot is taken now.
        None => Turn::Taken(link.order_slot(circ_id)),
        Some((seq, prev)) => Turn::After { seq, prev },
    };
    let link2 = link.clone();
    link.spawn(async move {
        let link = link2;
        let (prev, slot) = match turn {
            Turn::Taken(slot) => slot,
            Turn::After { seq, prev } => {
                if !wait_for_predecessor(&link, circ_id, seq, prev).await {
                    return;
                }
                // Our slot first: the next lane of this circuit ID, woken
                // by the admission, takes its slot after ours.
                let slot = link.order_slot(circ_id);
                admit(&link, seq, prev);
                slot
            }
        };
        drop(waiting);
        // A new circuit with this ID: whatever ended before is past.
        lock(&link.ended).remove(&circ_id);
        debug!(peer = %link.addr(), circ_id, "{} lane accepted", link.rules.name);
        let Lane { read, write } = lane;
        let ours = match lock(&link.lanes).entry(circ_id) {
            std::collections::hash_map::Entry::Occupied(_) => None,
            std::collections::hash_map::Entry::Vacant(v) => {
                Some(v.insert(SendBuffer::new(circ_id)).clone())
            }
        };
        match ours.clone() {
            Some(lane) => {
                link.spawn_writer(write_task(link.clone(), lane, write, Some(count.clone())))
            }
            // We opened one for this circuit too: keep ours.
            None => link.spawn_writer(finish(write)),
        }
        read_lane(link, circ_id, ours, read, prev, slot, count).await;
    });
}

/// End a lane's sending half we do not use.
async fn finish(mut write: BoxLaneWrite) {
    write.finish().await
}

/// Record that numbered lane `seq` took its slot (its predecessor `prev`
/// is past), and wake the lanes waiting for theirs.
fn admit(link: &LinkShared, seq: u64, prev: u64) {
    {
        let mut order = lock(&link.order);
        order.admitted.remove(&prev);
        order.admitted.insert(seq);
        if order.admitted.len() > 2 * ORDER_MEMORY {
            // Lanes whose circuit ID was not reused since: forget all but
            // the latest; a predecessor older than that counts as
            // admitted (`forgotten_below`).
            let keep_from = seq.saturating_sub(ORDER_MEMORY as u64);
            order.admitted.retain(|s| *s >= keep_from);
            order.forgotten_below = order.forgotten_below.max(keep_from);
        }
    }
    link.admitted.notify_waiters();
}

/// Wait until the lane the peer opened before lane `seq` for the same
/// circuit ID (`prev`) took its slot; false (the link failed) after
/// [`ORDER_TIMEOUT`].
async fn wait_for_predecessor(link: &LinkShared, circ_id: u32, seq: u64, prev: u64) -> bool {
    let deadline = tokio::time::Instant::now() + ORDER_TIMEOUT;
    loop {
        let notified = link.admitted.notified();
        let admitted = {
            let order = lock(&link.order);
            order.admitted.contains(&prev) || prev < order.forgotten_below
        };
        if prev == 0 || admitted {
            return true;
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            link.fail(Error::Protocol {
                peer: link.addr(),
                detail: format!(
                    "lane {seq} of circuit {circ_id} came without its predecessor {prev}"
                ),
            });
            return false;
        }
    }
}

/// A lane's partial cell, counted in the link's partial bytes while it
/// lives.
struct Partial<'a> {
    counter: &'a AtomicUsize,
    bytes: usize,
}

impl Partial<'_> {
    fn set(&mut self, bytes: usize) {
        if bytes >= self.bytes {
            self.counter
                .fetch_add(bytes - self.bytes, AtomicOrdering::Relaxed);
        } else {
            self.counter
                .fetch_sub(self.bytes - bytes, AtomicOrdering::Relaxed);
        }
        self.bytes = bytes;
    }
}

impl Drop for Partial<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.bytes, AtomicOrdering::Relaxed);
    }
}

/// Read one lane's cells (all of circuit `circ_id`) after the previous
/// lane of that circuit ID ended. `ours`: our send lane on the same
/// connection or stream, if we send on it.
pub(super) async fn read_lane(
    link: Arc<LinkShared>,
    circ_id: u32,
    ours: Option<Arc<SendBuffer>>,
    mut r: Box<dyn LaneRead>,
    prev: Option<oneshot::Receiver<()>>,
    slot: ReadSlot,
    count: Arc<LaneCount>,
) {
    if let Some(prev) = prev {
        let _ = prev.await;
    }
    read_lane_cells(&link, circ_id, ours.as_ref(), &mut *r).await;
    link.release_slot(&slot);
    drop(count);
}

/// Decode a lane's cells and hand them over until its end: a clean end
/// (our half of the lane then finishes too), a failure (the circuit's
/// DESTROY handed over, or the link's failure reported), or the link
/// gone.
async fn read_lane_cells(
    link: &Arc<LinkShared>,
    circ_id: u32,
    ours: Option<&Arc<SendBuffer>>,
    r: &mut dyn LaneRead,
) {
    let mut buf = BytesMut::new();
    let peer = link.addr();
    let mut codec = CellCodec::new(link.link_version);
    let mut partial = Partial {
        counter: &link.partial_bytes,
        bytes: 0,
    };
    loop {
        let (mut batch, mut bytes) = (Vec::new(), 0);
        let mut destroy = false;
        loop {
            let before = buf.len();
            match next_lane_cell(&mut codec, circ_id, &mut buf, peer) {
                Ok(Some(cell)) => {
                    destroy |= matches!(cell.msg(), AnyChanMsg::Destroy(_));
                    bytes += before - buf.len();
                    batch.push(cell);
                    if batch.len() == MAX_BATCH {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => return link.fail(e),
            }
        }
        // The cells' bytes move from the partial buffer to the inbox.
        partial.set(buf.len());
        if destroy {
            // The peer forgot the circuit: end our side of the lane.
            lock(&link.ended).insert(circ_id, Instant::now());
            link.close_lane(circ_id);
        }
        if !batch.is_empty() {
            if !deliver(link, batch, bytes).await {
                return;
            }
            continue;
        }
        if buf.capacity() > MAX_IDLE_READ_BUF {
            buf = BytesMut::from(&buf[..]);
        }
        match r.read_into(&mut buf).await {
            Ok(0) => {
                if let Err(e) = lane_end(circ_id, buf.len(), peer) {
                    return link.fail(e);
                }
                // The peer is done with this lane: so are we.
                if let Some(ours) = ours {
                    link.close_send_lane(ours);
                }
                return;
            }
            Ok(_) => {
                link.liveness.heard();
                partial.set(buf.len());
            }
            Err(source) => {
                let refused = source.kind() == std::io::ErrorKind::ConnectionRefused;
                let e = Error::Tls { peer, source };
                if let Some(destroy) = link.lane_failed(circ_id, ours, e, refused) {
                    // Before the slot is released: ahead of any later lane
                    // of this circuit ID.
                    deliver_destroy(link, destroy).await;
                }
                return;
            }
        }
    }
}

/// Incoming cells of a lane link, from every connection.
pub struct LaneReader {
    inbox: InboxReader,
    end: Arc<LinkEnd>,
}

impl LaneReader {
    pub(super) fn new(inbox: InboxReader, end: Arc<LinkEnd>) -> Self {
        LaneReader { inbox, end }
    }
}

impl CellReader for LaneReader {
    async fn read_cells(&mut self, out: &mut Vec<AnyChanCell>) -> Result<(), Error> {
        self.inbox.read_cells(&self.end.shared.inbox, out).await
    }

    /// Decoded cells waiting, partial cells in lane buffers, and what the
    /// lanes' transport holds (`LaneDialer::held`).
    fn buffered_bytes(&self) -> usize {
        let link = &self.end.shared;
        let blocked = link.blocked_lanes.load(AtomicOrdering::Relaxed);
        link.inbox.bytes()
            + link.partial_bytes.load(AtomicOrdering::Relaxed)
            + link.dialer.held(blocked).0
    }
}

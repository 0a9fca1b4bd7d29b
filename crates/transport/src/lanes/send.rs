//! The sending side of a lane link: [`LaneWriter`], which routes each
//! cell to its circuit's lane (opening one) or to the main connection,
//! and the task that opens a lane and writes it.

use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_cell::chan::{AnyChanCell, AnyChanMsg};
use onionlab_cell::codec::CellCodec;
use tokio::io::AsyncWriteExt;
use tokio::sync::oneshot;
use tracing::debug;

use super::{
    io_kind, lock, Lane, LaneCount, LaneHeader, LinkEnd, LinkShared, LANE_HIGH_WATER,
    MAX_LANES_PER_LINK, ORDER_MEMORY,
};
use crate::read_order::ReadSlot;
use crate::sendbuf::{write_task, Owner, SendBuffer};
use crate::{CellWriter, CircId, Error, Ordering};

/// How long cells for a circuit whose DESTROY arrived on its lane are
/// dropped instead of opening a lane again (the peer has forgotten it).
const ENDED_GRACE: Duration = Duration::from_secs(60);

/// Open a lane to the peer for `lane` and run it: connect (the peer must
/// prove the link's identity), send the lane's header, then read the
/// peer's side of the circuit in its order and write ours.
async fn open_lane(
    link: Arc<LinkShared>,
    lane: Arc<SendBuffer>,
    (header, pre): (LaneHeader, Option<Lane>),
    slot: (Option<oneshot::Receiver<()>>, ReadSlot),
    count: Arc<LaneCount>,
) {
    let opened = async {
        let mut conn = match pre {
            Some(conn) => conn,
            None => {
                let (addr, identity) = (link.addr(), link.peer.identity);
                link.dialer.open(addr, identity, lane.circ_id).await?
            }
        };
        conn.write
            .write_all(&link.dialer.header(&header))
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
            link.drained(lane.kill());
            let refused = io_kind(&e) == Some(std::io::ErrorKind::ConnectionRefused);
            let destroy = link.lane_failed(lane.circ_id, Some(&lane), e, refused);
            let (prev, slot) = slot;
            if let Some(destroy) = destroy {
                // After whatever an earlier lane of this circuit ID holds.
                if let Some(prev) = prev {
                    let _ = prev.await;
                }
                super::recv::deliver_destroy(&link, destroy).await;
            }
            link.release_slot(&slot);
            return;
        }
    };
    debug!(peer = %link.addr(), circ_id = lane.circ_id, seq = header.seq, "{} lane opened", link.rules.name);
    let Lane { read, write } = conn;
    let (prev, slot) = slot;
    link.spawn(super::recv::read_lane(
        link.clone(),
        lane.circ_id,
        Some(lane.clone()),
        read,
        prev,
        slot,
        count.clone(),
    ));
    write_task(link, lane, write, Some(count)).await;
}

/// Outgoing cells of a lane link: one lane per circuit, the main
/// connection for the rest.
pub struct LaneWriter {
    end: Arc<LinkEnd>,
    codec: CellCodec,
}

impl LaneWriter {
    pub(super) fn new(end: Arc<LinkEnd>, codec: CellCodec) -> Self {
        LaneWriter { end, codec }
    }

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
        if !link.rules.main_carries_circuits {
            // Every circuit has a lane: the transport's own limits (QUIC's
            // stream credit) hold a new one back meanwhile.
            return Some(self.new_lane(circ_id, None));
        }
        if self.may_open_lane() {
            match link.dialer.take_now() {
                None => return Some(self.new_lane(circ_id, None)),
                Some(Ok(lane)) => return Some(self.new_lane(circ_id, Some(lane))),
                Some(Err(e)) => {
                    debug!(peer = %link.addr(), circ_id, "no lane: {e}");
                    link.node.fell_back(link.addr(), link.rules.name);
                }
            }
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
            link.node.fell_back(link.addr(), link.rules.name);
            return false;
        }
        true
    }

    /// A new lane for `circ_id` (`pre`: the lane, if the dialer took it at
    /// once; dtls-utcp's are, so that two new circuits cannot both pass
    /// the room check and one then fail to open).
    fn new_lane(&self, circ_id: u32, pre: Option<Lane>) -> Arc<SendBuffer> {
        let link = self.link();
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
        let header = LaneHeader {
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
            (header, pre),
            slot,
            count,
        ));
        lane
    }

    /// Lane connections (or streams) open on this link.
    pub fn open_lanes(&self) -> usize {
        self.link().lanes_open.load(AtomicOrdering::Relaxed)
    }

    /// Circuits with a send lane open on this link.
    pub fn send_lanes(&self) -> usize {
        lock(&self.link().lanes).len()
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
                // The lane failed, or the link is failing; its reader
                // reports why.
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

    /// Bytes buffered in every send lane, those of closed circuits still
    /// draining among them, and what the lanes' transport holds to send
    /// (for memory accounting; O(1)).
    fn buffered_bytes(&self) -> usize {
        let link = self.link();
        let blocked = link.blocked_lanes.load(AtomicOrdering::Relaxed);
        link.send_bytes.load(AtomicOrdering::Relaxed) + link.dialer.held(blocked).1
    }

    async fn flush(&mut self) -> Result<(), Error> {
        Ok(())
    }

    async fn shutdown(&mut self) -> Result<(), Error> {
        let link = self.link().clone();
        let lanes: Vec<_> = lock(&link.lanes).drain().map(|(_, lane)| lane).collect();
        for lane in lanes {
            lane.close();
        }
        // The lanes end first: the peer then sees the main connection's
        // end after their last cells (and waits for its lanes' reading to
        // end, `read_main`).
        let linger = link.rules.linger;
        link.tasks.drain_and(|| link.main.close(), linger).await;
        // Closed, if the peer's end did not come first.
        link.end(Error::Closed);
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

    /// Where the lanes share a congestion controller (QUIC's streams of
    /// one connection), their priorities carry the circuit scheduler's
    /// order onto the wire; lanes that are connections of their own have
    /// nothing to share, and ignore it.
    fn set_lane_priority(&mut self, circ_id: CircId, priority: i32) {
        if !self.link().rules.priorities {
            return;
        }
        if let Some(lane) = self.route(u32::from(circ_id), false) {
            lane.set_priority(priority);
        }
    }

    async fn writable(&mut self) {
        self.link().room.notified().await
    }
}

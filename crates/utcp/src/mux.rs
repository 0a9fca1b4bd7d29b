//! One peer's lanes: a user-space TCP connection per lane (smoltcp), fed
//! TORTP segments and time, producing TORTP segments.
//!
//! smoltcp runs TCP over IP packets on a device; here the device is two
//! queues. An arriving segment becomes a TCP/IPv4 packet (addresses and
//! ports are constants: the session stands for the addresses, the lane
//! for the ports) pushed on the receive queue, and only that lane's
//! socket is polled, so every packet the stack emits during the poll is
//! that lane's and leaves as a TORTP segment of it. Each lane has its own
//! socket set: congestion control, retransmission and reordering are the
//! lane's alone, and a poll costs one socket, not all of them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, ChecksumCapabilities, Device, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::wire::{
    HardwareAddress, IpAddress, IpCidr, IpProtocol, Ipv4Address, Ipv4Packet, TcpPacket,
    TcpSeqNumber,
};

use crate::tortp::{LaneId, Segment, ACK, FIN, PSH, RST, SYN};
use crate::{Error, Settings};

/// Our address and the peer's, as the stack sees them (never on a wire).
const LOCAL: Ipv4Address = Ipv4Address::new(10, 0, 0, 1);
const REMOTE: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);
/// The lane opener's port and the accepter's.
const OPENER_PORT: u16 = 1;
const ACCEPTER_PORT: u16 = 2;
/// A lane whose handshake has not completed after this long is reset.
/// Only the handshake: smoltcp's timeout counts from the last segment
/// received, so on an established lane it would also reset a circuit that
/// is merely idle (found by the seed 002 experiments: a circuit idle for a
/// minute took its link down). Established lanes are watched by their
/// link's liveness (a heartbeat, and silence on every lane).
const LANE_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest segment handed in: what a TCP/IPv4 packet can carry.
const MAX_SEGMENT_IN: usize = 65_535 - 40 + crate::tortp::HEADER_LEN;
/// IPv4 and TCP headers without options; TORTP's header is 16 bytes.
const IP_TCP_HEADERS: usize = 40;
const TORTP_SAVING: usize = IP_TCP_HEADERS - crate::tortp::HEADER_LEN;

/// Which side of the DTLS session we are: lane numbers are per side.
pub use onionlab_dtls::Role;

/// A lane's state as the application sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaneState {
    /// Opened by us; the handshake is under way (data may be queued).
    Connecting,
    /// Both ways open.
    Open,
    /// The peer sent FIN: no more data will arrive once the queue is read.
    PeerClosed,
    /// Reset or closed both ways; the lane is gone once its data is read.
    Closed,
}

/// What happened to lanes, for the owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaneEvent {
    /// The peer opened a lane.
    Accepted(LaneId),
    /// A lane ended and was forgotten: `reset` if by RST (or abort), else
    /// by FIN both ways.
    Closed {
        /// The lane.
        lane: LaneId,
        /// Whether it was reset rather than closed.
        reset: bool,
        /// Whether it was a lane we opened that the peer reset before it
        /// ever opened (refused: nothing sent on it arrived).
        refused: bool,
    },
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MuxStats {
    /// Segments handed to [`Mux::handle_segment`].
    pub segments_in: u64,
    /// Segments produced by [`Mux::poll_transmit`].
    pub segments_out: u64,
    /// Segments dropped: for no lane, a lane number already used, or a
    /// lane over the limit.
    pub segments_dropped: u64,
    /// Lanes refused for [`Settings::max_lanes`].
    pub lanes_refused: u64,
    /// Segments sent that carried data.
    pub data_segments_out: u64,
    /// Of those, segments whose data starts before the end of what the
    /// lane had sent already: the stack's retransmissions (after a
    /// timeout, which resends from the oldest unacknowledged byte, or
    /// three duplicate ACKs).
    pub data_segments_resent: u64,
    /// Segments sent with neither data nor SYN, FIN or RST: ACKs and
    /// window updates.
    pub acks_out: u64,
}

impl std::ops::AddAssign for MuxStats {
    fn add_assign(&mut self, o: MuxStats) {
        self.segments_in += o.segments_in;
        self.segments_out += o.segments_out;
        self.segments_dropped += o.segments_dropped;
        self.lanes_refused += o.lanes_refused;
        self.data_segments_out += o.data_segments_out;
        self.data_segments_resent += o.data_segments_resent;
        self.acks_out += o.acks_out;
    }
}

/// The stack's device: what the stack sends and what it should receive.
#[derive(Default)]
struct Queues {
    rx: VecDeque<Vec<u8>>,
    tx: VecDeque<Vec<u8>>,
    mtu: usize,
}

impl Device for Queues {
    type RxToken<'a> = RxToken;
    type TxToken<'a> = TxToken<'a>;

    fn receive(
        &mut self,
        _now: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let packet = self.rx.pop_front()?;
        Some((RxToken(packet), TxToken(&mut self.tx)))
    }

    fn transmit(&mut self, _now: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        Some(TxToken(&mut self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ip;
        caps.max_transmission_unit = self.mtu;
        // DTLS authenticates every record.
        caps.checksum = ChecksumCapabilities::ignored();
        caps
    }
}

struct RxToken(Vec<u8>);

impl phy::RxToken for RxToken {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

struct TxToken<'a>(&'a mut VecDeque<Vec<u8>>);

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut packet = vec![0; len];
        let r = f(&mut packet);
        self.0.push_back(packet);
        r
    }
}

struct Lane {
    sockets: SocketSet<'static>,
    handle: SocketHandle,
    opened_by_us: bool,
    /// When the stack wants to be polled again (`None`: on input only).
    poll_at: Option<Instant>,
    /// Whether an RST was seen or sent.
    reset: bool,
    /// Whether its handshake completed (both sides synchronised).
    synchronized: bool,
    /// The newest acknowledgement the peer sent, and the window with it.
    peer_ack: Option<(u32, u16)>,
    /// The sequence number after the last data byte sent so far.
    sent_end: Option<u32>,
}

impl Lane {
    fn socket(&self) -> &tcp::Socket<'static> {
        self.sockets.get::<tcp::Socket>(self.handle)
    }

    fn socket_mut(&mut self) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut::<tcp::Socket>(self.handle)
    }
}

/// Peer lane numbers seen so far: every number up to `floor`, and those
/// in `above`. A number is accepted once, so a delayed or repeated SYN
/// cannot open a lane again.
#[derive(Default)]
struct SeenNumbers {
    floor: u32,
    above: BTreeSet<u32>,
}

impl SeenNumbers {
    /// Record `n`; false if it was seen before. Numbers the peer skipped
    /// (a SYN lost and given up) leave gaps; past `max_above` numbers
    /// above the oldest gap, the gap is forgotten (its number can no
    /// longer open a lane), so the record stays bounded and new lanes keep
    /// being accepted.
    fn insert(&mut self, n: u32, max_above: usize) -> bool {
        if n <= self.floor || !self.above.insert(n) {
            return false;
        }
        while self.above.len() > max_above {
            if let Some(lowest) = self.above.pop_first() {
                self.floor = lowest;
            }
        }
        while self.above.remove(&(self.floor + 1)) {
            self.floor += 1;
        }
        true
    }
}

/// Lanes a node may hold across all its sessions: each lane holds its
/// receive and send buffers from its SYN on, so a per-session limit alone
/// lets many sessions add up without bound. Shared by the sessions of a
/// node (cheap to clone). Its limit can move ([`LaneBudget::set_max`]):
/// a node whose memory is shared with other queues lowers it as they
/// grow.
#[derive(Clone, Debug)]
pub struct LaneBudget(Arc<LaneCount>);

#[derive(Debug)]
struct LaneCount {
    used: AtomicUsize,
    max: AtomicUsize,
}

impl LaneBudget {
    /// At most `max` lanes at once.
    pub fn new(max: usize) -> LaneBudget {
        LaneBudget(Arc::new(LaneCount {
            used: AtomicUsize::new(0),
            max: AtomicUsize::new(max),
        }))
    }

    /// Lanes held now.
    pub fn used(&self) -> usize {
        self.0.used.load(Ordering::Acquire)
    }

    /// Lanes allowed at once now.
    pub fn max(&self) -> usize {
        self.0.max.load(Ordering::Acquire)
    }

    /// Allow `max` lanes at once from now on. Lanes already open stay;
    /// below their number, new ones are refused until enough end.
    pub fn set_max(&self, max: usize) {
        self.0.max.store(max, Ordering::Release);
    }

    fn has_room(&self) -> bool {
        self.used() < self.max()
    }

    fn try_take(&self) -> bool {
        let max = self.max();
        self.0
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u < max).then_some(u + 1)
            })
            .is_ok()
    }

    fn give_back(&self, n: usize) {
        self.0.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// The lanes of one DTLS session (see the module docs).
pub struct Mux {
    settings: Settings,
    role: Role,
    epoch: Instant,
    iface: Interface,
    device: Queues,
    lanes: BTreeMap<LaneId, Lane>,
    next_number: u32,
    peer_numbers: SeenNumbers,
    out: VecDeque<Vec<u8>>,
    events: VecDeque<LaneEvent>,
    stats: MuxStats,
    budget: Option<LaneBudget>,
}

impl Drop for Mux {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.give_back(self.lanes.len());
        }
    }
}

impl Mux {
    /// Count this session's lanes against `budget` too (before any lane
    /// is open): a lane it has no room for is refused, as one beyond
    /// [`Settings::max_lanes`].
    pub fn set_budget(&mut self, budget: LaneBudget) {
        debug_assert!(self.lanes.is_empty());
        self.budget = Some(budget);
    }

    /// Whether a lane could be opened now (below [`Settings::max_lanes`]
    /// and, with a budget, below the node's lanes in all).
    pub fn has_room(&self) -> bool {
        self.lanes.len() < self.settings.max_lanes
            && self.budget.as_ref().is_none_or(LaneBudget::has_room)
    }

    /// Take a place for a new lane (false: refused and counted).
    fn take_place(&mut self) -> bool {
        let fits = self.lanes.len() < self.settings.max_lanes
            && self.budget.as_ref().is_none_or(LaneBudget::try_take);
        if !fits {
            self.stats.lanes_refused += 1;
        }
        fits
    }

    /// A lane is forgotten: its place goes back to the budget.
    fn forget(&mut self, id: LaneId) -> bool {
        let gone = self.lanes.remove(&id).is_some();
        if let (true, Some(b)) = (gone, &self.budget) {
            b.give_back(1);
        }
        gone
    }

    /// A session's lanes, with `seed` for the stack's initial sequence
    /// numbers (take it from a CSPRNG outside tests), starting at `now`.
    pub fn new(settings: Settings, role: Role, seed: u64, now: Instant) -> Result<Mux, Error> {
        settings.check()?;
        let mut device = Queues {
            mtu: settings.max_segment + TORTP_SAVING,
            ..Queues::default()
        };
        let mut config = Config::new(HardwareAddress::Ip);
        config.random_seed = seed;
        let mut iface = Interface::new(config, &mut device, smoltcp::time::Instant::ZERO);
        iface.update_ip_addrs(|addrs| {
            // One address; the list holds at least one.
            let _ = addrs.push(IpCidr::new(IpAddress::Ipv4(LOCAL), 24));
        });
        Ok(Mux {
            settings,
            role,
            epoch: now,
            iface,
            device,
            lanes: BTreeMap::new(),
            next_number: 1,
            peer_numbers: SeenNumbers::default(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: MuxStats::default(),
            budget: None,
        })
    }

    fn stack_time(&self, now: Instant) -> smoltcp::time::Instant {
        let micros = now.saturating_duration_since(self.epoch).as_micros();
        smoltcp::time::Instant::from_micros(i64::try_from(micros).unwrap_or(i64::MAX))
    }

    fn new_socket(&self) -> tcp::Socket<'static> {
        let s = &self.settings;
        let mut socket = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; s.rx_buffer]),
            tcp::SocketBuffer::new(vec![0; s.tx_buffer]),
        );
        socket.set_congestion_control(s.congestion.into());
        socket.set_nagle_enabled(s.nagle);
        socket.set_ack_delay(s.ack_delay.map(smoltcp::time::Duration::from));
        socket.set_keep_alive(s.keep_alive.map(smoltcp::time::Duration::from));
        // A peer that never completes the handshake ends the lane
        // instead of holding it forever (until it is established).
        socket.set_timeout(Some(smoltcp::time::Duration::from(LANE_TIMEOUT)));
        socket
    }

    fn add_lane(&mut self, lane: LaneId, socket: tcp::Socket<'static>, opened_by_us: bool) {
        let mut sockets = SocketSet::new(Vec::with_capacity(1));
        let handle = sockets.add(socket);
        self.lanes.insert(
            lane,
            Lane {
                sockets,
                handle,
                opened_by_us,
                poll_at: None,
                reset: false,
                synchronized: false,
                peer_ack: None,
                sent_end: None,
            },
        );
    }

    /// Open a lane to the peer (its SYN leaves with the next
    /// [`poll_transmit`](Self::poll_transmit)); data may be sent at once
    /// and waits for the handshake.
    pub fn open(&mut self, now: Instant) -> Result<LaneId, Error> {
        let lane = LaneId::new(self.next_number, self.role == Role::Initiator)
            .ok_or(Error::LaneNumbersExhausted)?;
        if !self.take_place() {
            return Err(Error::TooManyLanes(self.settings.max_lanes));
        }
        self.next_number += 1;
        let mut socket = self.new_socket();
        let connected = socket.connect(
            self.iface.context(),
            (IpAddress::Ipv4(REMOTE), ACCEPTER_PORT),
            OPENER_PORT,
        );
        if let Err(e) = connected {
            if let Some(b) = &self.budget {
                b.give_back(1);
            }
            return Err(Error::Stack(format!("connect: {e}")));
        }
        self.add_lane(lane, socket, true);
        self.poll_lane(lane, now);
        Ok(lane)
    }

    /// Take a segment the peer sent.
    pub fn handle_segment(&mut self, bytes: &[u8], now: Instant) -> Result<(), Error> {
        self.stats.segments_in += 1;
        if bytes.len() > MAX_SEGMENT_IN {
            return Err(crate::TortpError::TooLong(bytes.len()).into());
        }
        let seg = Segment::parse(bytes)?;
        if !self.lanes.contains_key(&seg.lane) && !self.accept(&seg) {
            self.stats.segments_dropped += 1;
            self.refuse(&seg);
            return Ok(());
        }
        let Some(lane) = self.lanes.get_mut(&seg.lane) else {
            return Ok(());
        };
        let seg = newest_ack(&mut lane.peer_ack, seg);
        let (src_port, dst_port) = if lane.opened_by_us {
            (ACCEPTER_PORT, OPENER_PORT)
        } else {
            (OPENER_PORT, ACCEPTER_PORT)
        };
        let before = lane.socket().state();
        self.device
            .rx
            .push_back(ip_packet(&seg, src_port, dst_port));
        let reset_by_peer =
            seg.flags & RST != 0 && !matches!(before, tcp::State::Closed | tcp::State::TimeWait);
        self.poll_lane_with(seg.lane, now, reset_by_peer);
        Ok(())
    }

    /// A segment for no lane: a SYN of the peer's next lanes opens one.
    fn accept(&mut self, seg: &Segment<'_>) -> bool {
        let peers = seg.lane.opened_by_initiator() == (self.role == Role::Responder);
        if !peers || seg.flags & (SYN | ACK | RST | FIN) != SYN {
            return false;
        }
        // Recorded even when refused below: a refused number is used.
        if !self
            .peer_numbers
            .insert(seg.lane.number(), 4 * self.settings.max_lanes)
        {
            return false;
        }
        if !self.take_place() {
            return false;
        }
        let mut socket = self.new_socket();
        if socket.listen(ACCEPTER_PORT).is_err() {
            if let Some(b) = &self.budget {
                b.give_back(1);
            }
            return false;
        }
        self.add_lane(seg.lane, socket, false);
        self.events.push_back(LaneEvent::Accepted(seg.lane));
        true
    }

    /// Answer a segment for no lane with a reset (never a reset with one).
    fn refuse(&mut self, seg: &Segment<'_>) {
        if seg.flags & RST != 0 {
            return;
        }
        let (seq, ack, flags) = if seg.flags & ACK != 0 {
            (seg.ack, 0, RST)
        } else {
            let len = seg.payload.len() as u32
                + u32::from(seg.flags & SYN != 0)
                + u32::from(seg.flags & FIN != 0);
            (0, seg.seq.wrapping_add(len), RST | ACK)
        };
        let reset = Segment {
            lane: seg.lane,
            seq,
            ack,
            flags,
            window: 0,
            options: &[],
            payload: &[],
        };
        let mut out = Vec::with_capacity(crate::tortp::HEADER_LEN);
        if reset.encode(&mut out).is_ok() {
            self.out.push_back(out);
        }
    }

    /// Run lane `id`'s stack: take what it received, send what it may.
    fn poll_lane(&mut self, id: LaneId, now: Instant) {
        self.poll_lane_with(id, now, false);
    }

    /// [`poll_lane`](Self::poll_lane); `rst_in`: the segment just handed
    /// to the stack is a reset, so a lane it closes was reset by the peer.
    fn poll_lane_with(&mut self, id: LaneId, now: Instant, rst_in: bool) {
        let t = self.stack_time(now);
        let Some(lane) = self.lanes.get_mut(&id) else {
            return;
        };
        self.iface.poll(t, &mut self.device, &mut lane.sockets);
        if rst_in && lane.socket().state() == tcp::State::Closed {
            lane.reset = true;
        }
        let handshaking = matches!(
            lane.socket().state(),
            tcp::State::SynSent | tcp::State::SynReceived | tcp::State::Listen
        );
        if !handshaking {
            // Past the handshake: no timeout (see LANE_TIMEOUT).
            lane.socket_mut().set_timeout(None);
            lane.synchronized |= lane.socket().state() != tcp::State::Closed;
        }
        // Anything left for the stack was not for this socket.
        self.device.rx.clear();
        while let Some(packet) = self.device.tx.pop_front() {
            match tortp_of(id, &packet) {
                Some(seg) => {
                    if seg.starts_with_reset() {
                        lane.reset = true;
                    }
                    count_out(&mut self.stats, &mut lane.sent_end, &seg);
                    self.out.push_back(seg.bytes);
                }
                None => debug_assert!(false, "the stack emitted a non-TCP packet"),
            }
        }
        let next = self.iface.poll_at(t, &lane.sockets);
        lane.poll_at = next.map(|at| {
            self.epoch + Duration::from_micros(u64::try_from(at.total_micros()).unwrap_or(0))
        });
        let state = lane.socket().state();
        // smoltcp sends a half-open lane that is reset back to LISTEN:
        // a lane the peer opened never listens again.
        let back_to_listen = !lane.opened_by_us && state == tcp::State::Listen;
        if back_to_listen {
            lane.reset = true;
        }
        if back_to_listen || (state == tcp::State::Closed && !lane.socket().can_recv()) {
            // Reset, or closed both ways and read: forget it.
            let reset = lane.reset;
            let refused = reset && lane.opened_by_us && !lane.synchronized;
            self.forget(id);
            self.events.push_back(LaneEvent::Closed {
                lane: id,
                reset,
                refused,
            });
        }
    }

    /// Run every lane whose timer (retransmission, delayed ACK) is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<LaneId> = self
            .lanes
            .iter()
            .filter(|(_, l)| l.poll_at.is_some_and(|t| t <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            self.poll_lane(id, now);
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next run
    /// (`None`: nothing until input).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.lanes.values().filter_map(|l| l.poll_at).min()
    }

    /// Whether [`poll_transmit`](Self::poll_transmit) has a segment.
    pub fn has_transmit(&self) -> bool {
        !self.out.is_empty()
    }

    /// Segments waiting for [`poll_transmit`](Self::poll_transmit).
    pub fn queued(&self) -> usize {
        self.out.len()
    }

    /// The next TORTP segment to send to the peer.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        let seg = self.out.pop_front()?;
        self.stats.segments_out += 1;
        Some(seg)
    }

    /// The next lane event.
    pub fn poll_event(&mut self) -> Option<LaneEvent> {
        self.events.pop_front()
    }

    fn lane_mut(&mut self, id: LaneId) -> Result<&mut Lane, Error> {
        self.lanes.get_mut(&id).ok_or(Error::NoLane(id))
    }

    /// Queue `data` on lane `id`; returns how much fit (0: the lane is
    /// still opening, or its send buffer is full: wait for the peer).
    pub fn send(&mut self, id: LaneId, data: &[u8], now: Instant) -> Result<usize, Error> {
        let lane = self.lane_mut(id)?;
        if matches!(
            lane.socket().state(),
            tcp::State::SynSent | tcp::State::SynReceived | tcp::State::Listen
        ) {
            return Ok(0);
        }
        let n = lane
            .socket_mut()
            .send_slice(data)
            .map_err(|_| Error::LaneClosed(id))?;
        self.poll_lane(id, now);
        Ok(n)
    }

    /// Bytes queued on lane `id` and not yet acknowledged.
    pub fn send_queued(&self, id: LaneId) -> usize {
        self.lanes.get(&id).map_or(0, |l| l.socket().send_queue())
    }

    /// Read what lane `id` received, in order.
    pub fn recv(&mut self, id: LaneId, buf: &mut [u8], now: Instant) -> Result<usize, Error> {
        let lane = self.lane_mut(id)?;
        if matches!(
            lane.socket().state(),
            tcp::State::SynSent | tcp::State::SynReceived | tcp::State::Listen
        ) {
            return Ok(0);
        }
        let n = match lane.socket_mut().recv_slice(buf) {
            Ok(n) => n,
            Err(tcp::RecvError::Finished) => 0,
            Err(tcp::RecvError::InvalidState) => return Err(Error::LaneClosed(id)),
        };
        // Reading opens the window: an update may be due.
        self.poll_lane(id, now);
        Ok(n)
    }

    /// Bytes received on lane `id` and not read yet.
    pub fn recv_queued(&self, id: LaneId) -> usize {
        self.lanes.get(&id).map_or(0, |l| l.socket().recv_queue())
    }

    /// Lane `id`'s state (`None`: no such lane, or forgotten).
    pub fn lane_state(&self, id: LaneId) -> Option<LaneState> {
        let s = self.lanes.get(&id)?.socket();
        Some(match s.state() {
            tcp::State::SynSent | tcp::State::SynReceived | tcp::State::Listen => {
                LaneState::Connecting
            }
            tcp::State::Established | tcp::State::FinWait1 | tcp::State::FinWait2 => {
                LaneState::Open
            }
            tcp::State::CloseWait | tcp::State::LastAck | tcp::State::Closing => {
                LaneState::PeerClosed
            }
            tcp::State::TimeWait | tcp::State::Closed => LaneState::Closed,
        })
    }

    /// Whether the peer closed lane `id` cleanly (its FIN arrived, after
    /// all its data), whichever side closed first; false for a lane that
    /// is gone.
    pub fn peer_finished(&self, id: LaneId) -> bool {
        self.lanes.get(&id).is_some_and(|l| {
            matches!(
                l.socket().state(),
                tcp::State::CloseWait
                    | tcp::State::LastAck
                    | tcp::State::Closing
                    | tcp::State::TimeWait
            )
        })
    }

    /// Send FIN on lane `id` after what is queued.
    pub fn close(&mut self, id: LaneId, now: Instant) -> Result<(), Error> {
        self.lane_mut(id)?.socket_mut().close();
        self.poll_lane(id, now);
        Ok(())
    }

    /// Reset lane `id` and forget it.
    pub fn abort(&mut self, id: LaneId, now: Instant) -> Result<(), Error> {
        let lane = self.lane_mut(id)?;
        lane.socket_mut().abort();
        lane.reset = true;
        self.poll_lane(id, now);
        if self.forget(id) {
            self.events.push_back(LaneEvent::Closed {
                lane: id,
                reset: true,
                refused: false,
            });
        }
        Ok(())
    }

    /// Lanes open now.
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// Counters.
    pub fn stats(&self) -> MuxStats {
        self.stats
    }
}

/// A TORTP segment made from a packet the stack sent.
struct OutSegment {
    bytes: Vec<u8>,
    /// Its sequence number, data length and flags.
    seq: u32,
    data_len: u32,
    flags: u8,
}

/// Count `seg` in `stats`: data (new or resent, against `sent_end`, the
/// lane's end of data sent so far) or a bare ACK.
fn count_out(stats: &mut MuxStats, sent_end: &mut Option<u32>, seg: &OutSegment) {
    if seg.data_len == 0 {
        if seg.flags & (SYN | FIN | RST) == 0 {
            stats.acks_out += 1;
        }
        return;
    }
    stats.data_segments_out += 1;
    let end = seg.seq.wrapping_add(seg.data_len);
    match *sent_end {
        // Serial-number order (RFC 1982): `seq` before the end sent.
        Some(e) if (e.wrapping_sub(seg.seq) as i32) > 0 => {
            stats.data_segments_resent += 1;
            if (end.wrapping_sub(e) as i32) > 0 {
                *sent_end = Some(end);
            }
        }
        _ => *sent_end = Some(end),
    }
}

impl OutSegment {
    fn starts_with_reset(&self) -> bool {
        self.bytes.get(12).is_some_and(|f| f & RST != 0)
    }
}

/// The TORTP form of the stack's TCP/IPv4 `packet` on `lane` (`None` if
/// it is not one: the stack sends nothing else).
fn tortp_of(lane: LaneId, packet: &[u8]) -> Option<OutSegment> {
    let ip = Ipv4Packet::new_checked(packet).ok()?;
    if ip.next_header() != IpProtocol::Tcp {
        return None;
    }
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    let flags = u8::from(tcp.fin())
        | u8::from(tcp.syn()) << 1
        | u8::from(tcp.rst()) << 2
        | u8::from(tcp.psh()) << 3
        | u8::from(tcp.ack()) << 4;
    let seg = Segment {
        lane,
        seq: tcp.seq_number().0 as u32,
        ack: if tcp.ack() {
            tcp.ack_number().0 as u32
        } else {
            0
        },
        flags,
        window: tcp.window_len(),
        options: tcp.options(),
        payload: tcp.payload(),
    };
    let mut bytes = Vec::with_capacity(seg.encoded_len());
    seg.encode(&mut bytes).ok()?;
    Some(OutSegment {
        bytes,
        seq: seg.seq,
        data_len: u32::try_from(seg.payload.len()).ok()?,
        flags,
    })
}

/// The TCP/IPv4 packet the stack expects for `seg` from the peer.
fn ip_packet(seg: &Segment<'_>, src_port: u16, dst_port: u16) -> Vec<u8> {
    let tcp_len = 20 + seg.options.len() + seg.payload.len();
    let mut packet = vec![0u8; 20 + tcp_len];
    {
        let mut ip = Ipv4Packet::new_unchecked(&mut packet[..]);
        ip.set_version(4);
        ip.set_header_len(20);
        // At most 20 + 60 + a DTLS record's payload: fits in 16 bits.
        ip.set_total_len((20 + tcp_len) as u16);
        ip.set_hop_limit(64);
        ip.set_next_header(IpProtocol::Tcp);
        ip.set_src_addr(REMOTE);
        ip.set_dst_addr(LOCAL);
        ip.set_dont_frag(true);
    }
    let mut tcp = TcpPacket::new_unchecked(&mut packet[20..]);
    tcp.set_src_port(src_port);
    tcp.set_dst_port(dst_port);
    tcp.set_seq_number(TcpSeqNumber(seg.seq as i32));
    tcp.set_ack_number(TcpSeqNumber(seg.ack as i32));
    tcp.set_header_len((20 + seg.options.len()) as u8);
    tcp.clear_flags();
    tcp.set_fin(seg.flags & FIN != 0);
    tcp.set_syn(seg.flags & SYN != 0);
    tcp.set_rst(seg.flags & RST != 0);
    tcp.set_psh(seg.flags & PSH != 0);
    tcp.set_ack(seg.flags & ACK != 0);
    tcp.set_window_len(seg.window);
    tcp.options_mut().copy_from_slice(seg.options);
    tcp.payload_mut().copy_from_slice(seg.payload);
    packet
}

/// `seg` as the lane's stack should see it: if it acknowledges less than
/// the peer already has (it was overtaken on the way: per-packet routes
/// and several circuits reorder), it carries the peer's newest
/// acknowledgement and window instead.
///
/// Written here because smoltcp drops a whole segment whose ACK is below
/// SND.UNA, data and all, and answers nothing, so the sender waits for
/// its retransmission timeout; RFC 9293 (3.10.7.4) ignores such an ACK
/// and keeps the data. An old ACK says nothing new, so the newest one in
/// its place changes nothing else.
fn newest_ack<'a>(peer_ack: &mut Option<(u32, u16)>, mut seg: Segment<'a>) -> Segment<'a> {
    if seg.flags & ACK == 0 {
        return seg;
    }
    match *peer_ack {
        // Older (sequence numbers wrap: compare by distance).
        Some((ack, window)) if (seg.ack.wrapping_sub(ack) as i32) < 0 => {
            seg.ack = ack;
            seg.window = window;
        }
        _ => *peer_ack = Some((seg.ack, seg.window)),
    }
    seg
}

#[cfg(test)]
mod newest_ack_tests {
    use super::*;

    fn seg(ack: u32, window: u16, flags: u8) -> Segment<'static> {
        Segment {
            lane: LaneId::new(1, true).expect("a lane number"),
            seq: 7,
            ack,
            flags,
            window,
            options: &[],
            payload: b"data",
        }
    }

    #[test]
    fn an_overtaken_segment_carries_the_newest_ack_and_keeps_its_data() {
        let mut newest = None;
        assert_eq!(newest_ack(&mut newest, seg(100, 10, ACK)).ack, 100);
        assert_eq!(newest_ack(&mut newest, seg(500, 20, ACK)).ack, 500);
        // Overtaken on the way: an older ACK, and its old window.
        let late = newest_ack(&mut newest, seg(300, 5, ACK));
        assert_eq!(
            (late.ack, late.window, late.payload),
            (500, 20, &b"data"[..])
        );
        // Across the wrap of sequence numbers.
        let mut newest = Some((5, 1));
        assert_eq!(newest_ack(&mut newest, seg(u32::MAX - 10, 9, ACK)).ack, 5);
        assert_eq!(newest_ack(&mut newest, seg(40, 9, ACK)).ack, 40);
        // No ACK flag: left alone.
        assert_eq!(newest_ack(&mut newest, seg(1, 1, SYN)).ack, 1);
    }
}

#[cfg(test)]
mod count_tests {
    use super::*;

    #[test]
    fn resent_data_and_bare_acks_are_counted() {
        let out = |seq: u32, data_len: u32, flags: u8| OutSegment {
            bytes: Vec::new(),
            seq,
            data_len,
            flags,
        };
        let mut stats = MuxStats::default();
        let mut end = None;
        for seg in [
            out(u32::MAX - 99, 100, ACK), // new, ending past the wrap at 0
            out(0, 100, ACK | PSH),       // new
            out(u32::MAX - 99, 100, ACK), // resent after a timeout
            out(50, 100, ACK),            // resent, half new: the end moves to 150
            out(150, 0, ACK),             // a bare ACK
            out(150, 0, ACK | FIN),       // a FIN is no bare ACK
            out(150, 100, ACK),           // new
        ] {
            count_out(&mut stats, &mut end, &seg);
        }
        assert_eq!(
            (
                stats.data_segments_out,
                stats.data_segments_resent,
                stats.acks_out
            ),
            (5, 2, 1)
        );
        assert_eq!(end, Some(250));
    }
}

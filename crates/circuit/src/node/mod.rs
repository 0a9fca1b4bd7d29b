//! A whole relay as a sans-IO state machine: its channels, the circuit-ID
//! maps of each channel, one circuit scheduler per channel, and the
//! circuits themselves ([`RelayCircuit`]).
//!
//! The driver owns the real connections. It tells the node when a channel
//! opens or closes, hands it every cell read from a channel, writes whatever
//! [`RelayNode::poll_transmit`] gives for a channel when that channel can take
//! a cell (this is where the transport's back-pressure enters), and acts on
//! [`NodeEvent`]s (open a channel to the next relay, connect an exit stream).
//!
//! # Two kinds of transport
//!
//! * A transport that carries a channel as one ordered byte stream (TLS over
//!   TCP, as tor does) writes cells in the order
//!   [`RelayNode::poll_transmit`] gives them: link-level DESTROYs first,
//!   then one cell at a time from the circuit the channel's scheduler
//!   picks (round robin or EWMA). It calls it whenever the connection can
//!   take a cell, for the channels [`RelayNode::channels_with_work`] lists.
//! * A transport that gives each circuit its own lane (a QUIC stream, or a
//!   TCP connection, per circuit) writes each cell on the lane of its
//!   circuit ID. It still lets the channel's scheduler choose which lane
//!   gets the next cell: [`RelayNode::poll_transmit_lanes`] is
//!   `poll_transmit` restricted to the circuits whose lane has room; a
//!   circuit behind a full lane is set aside until
//!   [`RelayNode::lanes_writable`] (a lane drained) puts it back. A
//!   transport that multiplexes its lanes by priority itself (quinn's
//!   stream priorities) gives each lane [`RelayNode::lane_priority`], so
//!   EWMA's preference for light circuits holds on the connection too.
//!   The older style bypasses the scheduler:
//!   [`RelayNode::circuits_with_work`] lists the circuits of a channel with
//!   cells, and [`RelayNode::poll_transmit_circuit`] gives a lane its
//!   circuit's next cell; the scheduler's state is kept consistent, so the
//!   styles may be mixed.
//!
//! # Determinism
//!
//! Outputs depend only on inputs and the seeded RNG, never on a hash seed:
//! whatever the node iterates in an order that can show (channels,
//! circuits, a channel's circuits) is an ordered map.
//!
//! # Memory limit
//!
//! The node keeps a running total of the memory its queues hold
//! ([`RelayNode::total_queued_bytes`]). When an input leaves it above
//! [`NodeConfig::max_mem_in_queues`], the node kills the circuits holding
//! the most queued bytes (DESTROY with reason RESOURCELIMIT both ways,
//! [`NodeEvent::CircuitClosed`] with [`CloseKind::OutOfMemory`](crate::CloseKind::OutOfMemory))
//! until the total is below 3/4 of the limit, as tor does for
//! `MaxMemInQueues`. Below the limit this costs O(1) per input.
//!
//! The limit is the relay's, shared with what its other engines hold (its
//! datagram circuits and sets), which they publish in a gauge the node
//! reads at each check ([`RelayNode::share_limit_with`]): the node may
//! hold the limit less what they hold, and never less than half of it
//! ([`allowance`]); the other engines live by the same rule.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Instant;

use onionlab_cell::chan::{
    AnyChanCell, AnyChanMsg, ChanCell, ChanMsg, CircId, Destroy, DestroyReason,
};
use onionlab_cell::msg::{EncodedLinkSpec, EndReason, ResolvedVal, StreamId};
use onionlab_crypto::identity::RelaySecretKeys;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::err::{CloseReason, Error};
use crate::relay::{RelayCircEvent, RelayCircuit, RelayConfig, Side};
use crate::scheduler::{CircuitScheduler, SchedulerKind};
use crate::stream::StreamEvent;
use crate::torchestra::ClassifierParams;

/// Identifies a channel (one link to a peer) for the driver and the node.
pub type ChannelId = u64;

/// Identifies a circuit within one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CircKey(pub u64);

/// Settings of a relay node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Circuit scheduler used on every channel.
    pub scheduler: SchedulerKind,
    /// Settings of each circuit.
    pub circuit: RelayConfig,
    /// Most circuits one channel may create at this node.
    pub max_circuits_per_channel: usize,
    /// Most bytes the node's queues may hold, like tor's `MaxMemInQueues`
    /// (see [`RelayNode::total_queued_bytes`] for what is counted). When
    /// input leaves more than this queued, the node kills the circuits
    /// holding the most bytes until the total is below 3/4 of the limit
    /// (tor's low-water mark). `0` or `usize::MAX`: no limit. Default
    /// [`DEFAULT_MAX_MEM_IN_QUEUES`] (256 MiB).
    pub max_mem_in_queues: usize,
    /// Leg scheduler of the sets this node is the exit of (when
    /// [`RelayConfig::conflux`] lets circuits link).
    pub conflux_scheduler: crate::conflux::sched::LegSchedulerKind,
    /// Torchestra's exit classifier (`None`: off): every window, the
    /// circuits this node is the exit of are classified light or heavy on
    /// each link to a middle, and the link's transport is asked to move
    /// them ([`RelayNode::poll_move`]).
    pub torchestra: Option<ClassifierParams>,
}

/// Default [`NodeConfig::max_mem_in_queues`]: 256 MiB.
pub const DEFAULT_MAX_MEM_IN_QUEUES: usize = 256 << 20;

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            scheduler: SchedulerKind::default(),
            circuit: RelayConfig::default(),
            max_circuits_per_channel: 4096,
            max_mem_in_queues: DEFAULT_MAX_MEM_IN_QUEUES,
            conflux_scheduler: crate::conflux::sched::LegSchedulerKind::default(),
            torchestra: None,
        }
    }
}

/// What the node asks of its driver.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeEvent {
    /// Find or open a channel to the relay described by `linkspecs`, then
    /// call [`RelayNode::extend_channel_ready`] or
    /// [`RelayNode::extend_channel_failed`] with `circ`.
    ConnectRelay {
        /// The circuit waiting for the channel.
        circ: CircKey,
        /// Where and who the next relay is (from EXTEND2).
        linkspecs: Vec<EncodedLinkSpec>,
    },
    /// Exit: connect `host:port` for a stream.
    ExitConnect {
        /// The circuit.
        circ: CircKey,
        /// The stream.
        stream: StreamId,
        /// Host name or address literal.
        host: String,
        /// TCP port.
        port: u16,
    },
    /// Exit: resolve a name.
    ExitResolve {
        /// The circuit.
        circ: CircKey,
        /// The RESOLVE's stream ID.
        stream: StreamId,
        /// The name.
        host: String,
    },
    /// Exit: an event on a stream.
    ExitStream {
        /// The circuit.
        circ: CircKey,
        /// What happened.
        event: StreamEvent,
    },
    /// A circuit closed (for logs and metrics).
    CircuitClosed {
        /// The circuit.
        circ: CircKey,
        /// Why.
        reason: CloseReason,
    },
    /// The peer on a channel broke the link protocol: close the channel.
    ChannelViolation {
        /// The channel.
        chan: ChannelId,
        /// What it did.
        detail: String,
    },
    /// The out-of-memory handler closed a channel whose transport held
    /// the most received data; the node has already forgotten it (and
    /// destroyed its circuits): close the link.
    ChannelOutOfMemory {
        /// The channel.
        chan: ChannelId,
        /// How much it held, against which limit.
        detail: String,
    },
}

/// Which of a channel's transport buffers a
/// [`RelayNode::set_transport_buffered`] report is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportBuffer {
    /// Cells handed to the transport, not yet sent (a QUIC link's lane
    /// buffers, a TLS link's send buffer).
    Send,
    /// Data received by the transport, not yet handed to the node (a QUIC
    /// link's reader queue and the flow-control windows of its blocked
    /// lanes, a TLS link's read buffer).
    Receive,
}

/// What one of a relay's engines may hold under its memory limit `limit`
/// when the others hold `others`: the limit less what they hold, and
/// never less than half the limit (rounded down). Two engines under this
/// rule hold at most the limit together, and each keeps half of it
/// whatever the other holds; over its allowance an engine frees down to
/// 3/4 of it.
pub fn allowance(limit: usize, others: usize) -> usize {
    limit - others.min(limit - limit / 2)
}

/// What the out-of-memory handler may free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum OomVictim {
    Circuit(Reverse<CircKey>),
    Channel(ChannelId),
}

mod torchestra;
pub use torchestra::CircuitMove;

mod conflux;
pub use conflux::MAX_LEGS_PER_SET;

/// Key a channel's scheduler orders: a circuit and which of its sides
/// (a circuit could in principle have both sides on one channel).
type SchedKey = (CircKey, Side);

/// Who is at the other end of a channel, as its link handshake proved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelPeer {
    /// A peer that did not authenticate: a client (or a relay acting as
    /// one). Circuits it creates have us as their first hop.
    Client,
    /// A peer that authenticated with a relay identity.
    Relay,
}

struct Channel {
    /// Did we open the connection? (Decides the circuit-ID high bit.)
    initiated_by_us: bool,
    /// Who is at the other end.
    peer: ChannelPeer,
    circuits: ChanCircuits,
    scheduler: Box<dyn CircuitScheduler<SchedKey>>,
    /// Link-level cells waiting (DESTROYs for circuits already gone).
    control: VecDeque<AnyChanCell>,
    next_circ_id: u32,
    /// Cells dropped because their circuit was unknown.
    unknown_circuit_cells: u64,
    /// Bytes the channel's transport holds to send (reported by the
    /// driver).
    transport_send: usize,
    /// Bytes the channel's transport holds received (reported by the
    /// driver).
    transport_recv: usize,
}

/// The circuits of one channel, by circuit ID, iterated in ID order: when
/// the channel closes (which orders the circuits' DESTROYs and events) and
/// in [`RelayNode::circuits_with_work`] and [`RelayNode::lanes_writable`].
/// An ordered map, so the order never depends on a hash seed (`CircId` is
/// not `Ord`: the key is its value).
#[derive(Default)]
struct ChanCircuits(BTreeMap<u32, (CircId, SchedKey)>);

impl ChanCircuits {
    fn get(&self, id: &CircId) -> Option<&SchedKey> {
        self.0.get(&u32::from(*id)).map(|(_, k)| k)
    }
    fn insert(&mut self, id: CircId, key: SchedKey) {
        self.0.insert(u32::from(id), (id, key));
    }
    fn remove(&mut self, id: &CircId) -> Option<SchedKey> {
        self.0.remove(&u32::from(*id)).map(|(_, k)| k)
    }
    fn contains_key(&self, id: &CircId) -> bool {
        self.0.contains_key(&u32::from(*id))
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    /// In ascending circuit-ID order.
    fn iter(&self) -> impl Iterator<Item = (CircId, SchedKey)> + '_ {
        self.0.values().copied()
    }
}

struct CircEntry {
    circ: RelayCircuit,
    inbound: (ChannelId, CircId),
    outbound: Option<(ChannelId, CircId)>,
    /// `circ.queued_bytes()` when last added to [`RelayNode::circ_bytes`].
    accounted: usize,
    /// Cells on each side's channel in the current classification window
    /// (Torchestra; counted only when the classifier is on), indexed by
    /// [`side_index`].
    window_cells: [u64; 2],
}

/// Index of a side in [`CircEntry::window_cells`].
fn side_index(side: Side) -> usize {
    match side {
        Side::Inbound => 0,
        Side::Outbound => 1,
    }
}

/// A relay: channels, circuits and their scheduling.
///
/// Deterministic: given the same inputs (and the same seeded RNG), it gives
/// the same outputs in the same order. Every collection whose iteration
/// order can reach an output (channels, circuits, a channel's circuits) is
/// an ordered map, never a `HashMap`, whose order varies with its random
/// seed.
pub struct RelayNode {
    keys: RelaySecretKeys,
    config: NodeConfig,
    channels: BTreeMap<ChannelId, Channel>,
    circuits: BTreeMap<CircKey, CircEntry>,
    next_key: u64,
    events: VecDeque<NodeEvent>,
    rng: StdRng,
    /// Sum of every circuit's `accounted` bytes.
    circ_bytes: usize,
    /// Cells in all channels' `control` queues.
    control_cells: usize,
    /// Sum of every channel's `transport_send` and `transport_recv`.
    transport_bytes: usize,
    /// Sum of every channel's `transport_recv`.
    transport_recv: usize,
    /// What the relay's other engines hold, read at each check: it
    /// lowers this node's allowance, and is never freed here.
    external: Option<Arc<AtomicUsize>>,
    /// Circuits killed by the out-of-memory handler.
    oom_killed: u64,
    oom_channels_closed: u64,
    /// Torchestra's exit classifiers (`None`: off).
    torchestra: Option<torchestra::Torchestra>,
    /// Circuits to move between a link's connections (Torchestra).
    moves: torchestra::Moves,
    /// Linked sets this node is the exit of.
    sets: conflux::ExitSets,
}

impl std::fmt::Debug for RelayNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayNode")
            .field("channels", &self.channels.len())
            .field("circuits", &self.circuits.len())
            .finish_non_exhaustive()
    }
}

impl RelayNode {
    /// A relay with these keys.
    pub fn new(keys: RelaySecretKeys, config: NodeConfig, rng: StdRng) -> Self {
        RelayNode {
            keys,
            channels: BTreeMap::new(),
            circuits: BTreeMap::new(),
            next_key: 1,
            events: VecDeque::new(),
            rng,
            circ_bytes: 0,
            transport_bytes: 0,
            transport_recv: 0,
            external: None,
            control_cells: 0,
            oom_killed: 0,
            oom_channels_closed: 0,
            torchestra: config.torchestra.map(torchestra::Torchestra::new),
            moves: torchestra::Moves::new(),
            sets: conflux::ExitSets::default(),
            config,
        }
    }

    /// This relay's keys.
    pub fn keys(&self) -> &RelaySecretKeys {
        &self.keys
    }

    /// A channel finished its link handshake with `peer`.
    pub fn add_channel(&mut self, chan: ChannelId, initiated_by_us: bool, peer: ChannelPeer) {
        self.channels.insert(
            chan,
            Channel {
                initiated_by_us,
                peer,
                circuits: ChanCircuits::default(),
                scheduler: self.config.scheduler.build(),
                control: VecDeque::new(),
                // A random start, so IDs do not reveal how many circuits
                // the channel has carried.
                next_circ_id: self.rng.next_u32(),
                unknown_circuit_cells: 0,
                transport_send: 0,
                transport_recv: 0,
            },
        );
    }

    /// A channel is gone: every circuit using it closes, DESTROY going out
    /// on their other side.
    pub fn remove_channel(&mut self, now: Instant, chan: ChannelId) {
        self.detach_channel(now, chan);
        self.enforce_mem_limit(now);
    }

    /// [`remove_channel`](Self::remove_channel) without the memory limit.
    fn detach_channel(&mut self, now: Instant, chan: ChannelId) {
        let Some(ch) = self.channels.remove(&chan) else {
            return;
        };
        self.control_cells -= ch.control.len();
        self.transport_bytes -= ch.transport_send + ch.transport_recv;
        self.transport_recv -= ch.transport_recv;
        for (_, (key, side)) in ch.circuits.iter() {
            let Some(entry) = self.circuits.get_mut(&key) else {
                continue;
            };
            match side {
                Side::Inbound => entry.circ.destroy(CloseReason::local(
                    DestroyReason::CHANNEL_CLOSED,
                    "channel to the previous hop closed",
                )),
                Side::Outbound => {
                    entry.outbound = None;
                    entry
                        .circ
                        .handle_outbound(now, Destroy::new(DestroyReason::CHANNEL_CLOSED).into());
                }
            }
            self.refresh_circuit(now, key);
        }
    }

    /// Channels with something to send, in ascending ID order.
    ///
    /// A circuit behind a full lane is not counted (see
    /// [`poll_transmit_lanes`](Self::poll_transmit_lanes)), so a channel
    /// whose only busy circuits wait for their lanes is not listed.
    pub fn channels_with_work(&self) -> impl Iterator<Item = ChannelId> + '_ {
        self.channels
            .iter()
            .filter(|(id, c)| {
                !c.control.is_empty() || !c.scheduler.is_idle() || self.has_moves(**id)
            })
            .map(|(id, _)| *id)
    }

    /// Cells dropped on `chan` because they named no known circuit.
    pub fn unknown_circuit_cells(&self, chan: ChannelId) -> u64 {
        self.channels
            .get(&chan)
            .map_or(0, |c| c.unknown_circuit_cells)
    }

    /// Number of circuits.
    pub fn n_circuits(&self) -> usize {
        self.circuits.len()
    }

    /// Number of circuits on channel `chan` (0 for an unknown channel).
    pub fn channel_circuits(&self, chan: ChannelId) -> usize {
        self.channels.get(&chan).map_or(0, |c| c.circuits.len())
    }

    /// Handle a cell read from `chan`.
    pub fn handle_cell(&mut self, now: Instant, chan: ChannelId, cell: AnyChanCell) {
        let (circid, msg) = cell.into_circid_and_msg();
        let Some(ch) = self.channels.get_mut(&chan) else {
            return;
        };
        let Some(circid) = circid else {
            match msg {
                AnyChanMsg::Padding(_) | AnyChanMsg::Vpadding(_) => {}
                other => self.events.push_back(NodeEvent::ChannelViolation {
                    chan,
                    detail: format!("unexpected link cell {} after the handshake", other.cmd()),
                }),
            }
            return;
        };
        if let Some(&(key, side)) = ch.circuits.get(&circid) {
            if let AnyChanMsg::Create2(_) = msg {
                self.events.push_back(NodeEvent::ChannelViolation {
                    chan,
                    detail: format!("CREATE2 for existing circuit {circid}"),
                });
                return;
            }
            if let Some(entry) = self.circuits.get_mut(&key) {
                if self.torchestra.is_some() {
                    entry.window_cells[side_index(side)] += 1;
                }
                match side {
                    Side::Inbound => entry.circ.handle_inbound(now, msg),
                    Side::Outbound => entry.circ.handle_outbound(now, msg),
                }
            }
            self.refresh(now, key);
            return;
        }
        match msg {
            AnyChanMsg::Create2(create) => {
                // The initiator of a link uses IDs with the high bit set.
                let peer_high_bit = !ch.initiated_by_us;
                if (u32::from(circid) & 0x8000_0000 != 0) != peer_high_bit {
                    self.events.push_back(NodeEvent::ChannelViolation {
                        chan,
                        detail: format!("CREATE2 with circuit ID {circid} of the wrong half"),
                    });
                    return;
                }
                if ch.circuits.len() >= self.config.max_circuits_per_channel {
                    let refusal = queue_destroy(
                        ch,
                        &mut self.control_cells,
                        circid,
                        DestroyReason::RESOURCELIMIT,
                    );
                    self.events
                        .extend(refusal.map(|detail| NodeEvent::ChannelViolation { chan, detail }));
                    self.enforce_mem_limit(now);
                    return;
                }
                let rng = StdRng::from_rng(&mut self.rng);
                match RelayCircuit::accept(self.config.circuit.clone(), &self.keys, &create, rng) {
                    Ok(mut circ) => {
                        circ.set_first_hop(ch.peer == ChannelPeer::Client);
                        let key = CircKey(self.next_key);
                        self.next_key += 1;
                        ch.circuits.insert(circid, (key, Side::Inbound));
                        self.circuits.insert(
                            key,
                            CircEntry {
                                circ,
                                inbound: (chan, circid),
                                outbound: None,
                                accounted: 0,
                                window_cells: [0; 2],
                            },
                        );
                        self.refresh(now, key);
                    }
                    Err(reason) => {
                        tracing::debug!(%reason, "refused CREATE2");
                        let refusal =
                            queue_destroy(ch, &mut self.control_cells, circid, reason.reason);
                        self.events.extend(
                            refusal.map(|detail| NodeEvent::ChannelViolation { chan, detail }),
                        );
                        self.enforce_mem_limit(now);
                    }
                }
            }
            // A DESTROY for a circuit we already forgot needs no answer.
            AnyChanMsg::Destroy(_) => {}
            _ => ch.unknown_circuit_cells += 1,
        }
    }

    /// Answer a CREATE2 on `chan` for `circid` with DESTROY `reason`
    /// without creating the circuit (the driver's denial-of-service limits
    /// refused it). A peer that does not read its DESTROYs is a violation,
    /// as for every refusal.
    pub fn refuse_create(
        &mut self,
        now: Instant,
        chan: ChannelId,
        circid: CircId,
        reason: DestroyReason,
    ) {
        let Some(ch) = self.channels.get_mut(&chan) else {
            return;
        };
        if ch.circuits.contains_key(&circid) {
            return self.events.push_back(NodeEvent::ChannelViolation {
                chan,
                detail: format!("CREATE2 for existing circuit {circid}"),
            });
        }
        let refusal = queue_destroy(ch, &mut self.control_cells, circid, reason);
        self.events
            .extend(refusal.map(|detail| NodeEvent::ChannelViolation { chan, detail }));
        self.enforce_mem_limit(now);
    }

    /// The next cell to write on `chan`, chosen by its circuit scheduler:
    /// link-level DESTROYs first, then one cell of the circuit the
    /// scheduler picks. For transports that carry a channel as one ordered
    /// byte stream.
    pub fn poll_transmit(&mut self, now: Instant, chan: ChannelId) -> Option<AnyChanCell> {
        self.poll_transmit_lanes(now, chan, &mut |_| true)
    }

    /// The next cell to write on `chan` for a transport that gives each
    /// circuit its own lane (a QUIC stream per circuit): chosen by the
    /// channel's circuit scheduler as [`poll_transmit`](Self::poll_transmit)
    /// does, but only among circuits whose lane has room
    /// (`has_room(circ_id)`). Link-level DESTROYs (of circuits that are
    /// gone) come first whatever the room, since one held back behind a
    /// full lane would keep the channel busy for ever. The cell goes on
    /// the lane of its circuit ID.
    ///
    /// A circuit the scheduler picks whose lane is full leaves the active
    /// set (keeping its EWMA history, as [`lane_full`](Self::lane_full)
    /// does) and the next one is tried, so once this returns `None` the
    /// channel is out of [`channels_with_work`](Self::channels_with_work)
    /// unless new input arrives: a writer that fills until `None` sleeps
    /// instead of spinning on full lanes. The circuits set aside this way
    /// are not lost: [`lanes_writable`](Self::lanes_writable) (called when a
    /// lane drains, or before each fill) puts them back, and so does the
    /// circuit's next input.
    pub fn poll_transmit_lanes(
        &mut self,
        now: Instant,
        chan: ChannelId,
        has_room: &mut dyn FnMut(CircId) -> bool,
    ) -> Option<AnyChanCell> {
        let ch = self.channels.get_mut(&chan)?;
        if let Some(cell) = ch.control.pop_front() {
            self.control_cells -= 1;
            return Some(cell);
        }
        let blocked_signal = self.blocked_signal();
        loop {
            // `next` takes the circuit out of the active set.
            let (key, side) = self.channels.get_mut(&chan)?.scheduler.next(now)?;
            let Some(entry) = self.circuits.get_mut(&key) else {
                continue;
            };
            let circid = match side {
                Side::Inbound => entry.inbound.1,
                Side::Outbound => match entry.outbound {
                    Some((_, id)) => id,
                    None => continue,
                },
            };
            if !has_room(circid) {
                // Its lane is full: it stays out of the active set until
                // `lanes_writable` or its next input puts it back.
                if blocked_signal {
                    entry.circ.set_channel_blocked(side, true);
                }
                continue;
            }
            if blocked_signal {
                entry.circ.set_channel_blocked(side, false);
            }
            let Some(msg) = entry.circ.poll_transmit(now, side) else {
                // Nothing after all: handle its events but do not put it
                // back in the scheduler, or a disagreement between
                // `wants_transmit` and `poll_transmit` would spin here.
                self.refresh_events(key);
                continue;
            };
            if self.torchestra.is_some() {
                entry.window_cells[side_index(side)] += 1;
            }
            if let Some(ch) = self.channels.get_mut(&chan) {
                ch.scheduler.on_sent((key, side), 1, now);
            }
            self.refresh(now, key);
            return Some(ChanCell::new(Some(circid), msg));
        }
    }

    /// The transport of `chan` takes no more cells now (a per-connection
    /// transport's writer is full) while the node may have more: every
    /// circuit on `chan` is blocked on it until it next sends a cell
    /// ([`RelayCircuit::set_channel_blocked`], a congestion signal to the
    /// exit's circuit congestion control, as C tor's "streams blocked on
    /// the channel"). O(circuits on the channel).
    pub fn channel_full(&mut self, chan: ChannelId) {
        if !self.blocked_signal() {
            return;
        }
        let Some(ch) = self.channels.get(&chan) else {
            return;
        };
        for (_, (key, side)) in ch.circuits.iter() {
            if let Some(e) = self.circuits.get_mut(&key) {
                e.circ.set_channel_blocked(side, true);
            }
        }
    }

    /// Whether circuits here take the blocked-channel signal: only under
    /// an RTT-based congestion control (fixed windows ignore it, so the
    /// per-cell path skips it).
    fn blocked_signal(&self) -> bool {
        !matches!(self.config.circuit.cc, crate::flow::CircuitCc::Fixed)
    }

    /// Lanes of `chan` may have room again (one drained, or the driver is
    /// about to fill them): every circuit on `chan` that still has cells to
    /// send becomes active again, including those
    /// [`poll_transmit_lanes`](Self::poll_transmit_lanes) or
    /// [`lane_full`](Self::lane_full) set aside. Idempotent (an active
    /// circuit keeps its place); O(circuits on the channel).
    pub fn lanes_writable(&mut self, now: Instant, chan: ChannelId) {
        let Some(ch) = self.channels.get_mut(&chan) else {
            return;
        };
        for (_, (key, side)) in ch.circuits.iter() {
            let busy = self
                .circuits
                .get(&key)
                .is_some_and(|e| e.circ.wants_transmit(side));
            if busy {
                ch.scheduler.activate((key, side), now);
            }
        }
    }

    /// The priority to give circuit `circ_id`'s lane on `chan`, for
    /// transports that share a connection among lanes by priority (quinn's
    /// `SendStream::set_priority`: higher goes first, equal priorities
    /// share fairly). From the channel's scheduler
    /// ([`CircuitScheduler::priority`]): 0 for every circuit under round
    /// robin; under EWMA `-floor(log2(1 + recent cells))`, at most
    /// [`MAX_LANE_PRIORITY_LEVEL`](crate::scheduler::MAX_LANE_PRIORITY_LEVEL)
    /// below 0, so light circuits go before bulk ones and bulk circuits of
    /// similar weight share. Changes slowly: a driver may refresh it
    /// whenever it fills the lane. 0 for an unknown channel or circuit.
    pub fn lane_priority(&self, now: Instant, chan: ChannelId, circ_id: CircId) -> i32 {
        let Some(ch) = self.channels.get(&chan) else {
            return 0;
        };
        ch.circuits
            .get(&circ_id)
            .map_or(0, |key| ch.scheduler.priority(key, now))
    }

    /// Circuit IDs on `chan` with a cell to send: IDs with a link-level
    /// DESTROY waiting (in the order they were queued), then circuits with
    /// queued cells on that side, by ascending circuit ID; each ID once.
    /// For transports that carry each circuit on its own lane and write
    /// them without the channel's scheduler; pass each to
    /// [`poll_transmit_circuit`](Self::poll_transmit_circuit) (or use
    /// [`poll_transmit_lanes`](Self::poll_transmit_lanes), which keeps the
    /// scheduler's order). O(circuits on the channel). The iterator does
    /// not borrow the node.
    pub fn circuits_with_work(&self, chan: ChannelId) -> impl Iterator<Item = CircId> {
        let mut ids = Vec::new();
        if let Some(ch) = self.channels.get(&chan) {
            // Only for membership: the order comes from `ids`.
            let mut seen = BTreeSet::new();
            let destroys = ch.control.iter().filter_map(ChanCell::circid);
            let busy = ch.circuits.iter().filter_map(|(id, (key, side))| {
                self.circuits
                    .get(&key)
                    .is_some_and(|e| e.circ.wants_transmit(side))
                    .then_some(id)
            });
            ids.extend(
                destroys
                    .chain(busy)
                    .filter(|id| seen.insert(u32::from(*id))),
            );
        }
        ids.into_iter()
    }

    /// The next cell of circuit `circ_id` on `chan`, bypassing the
    /// channel's circuit scheduler: for transports that carry each circuit
    /// on its own lane (a QUIC stream or a TCP connection per circuit),
    /// which write a circuit's cells when that lane can take them.
    ///
    /// A DESTROY queued for `circ_id` at link level (a circuit that had the
    /// ID and is gone) comes first, before any cell of a newer circuit
    /// with the same ID. The scheduler's view stays consistent: the cell
    /// counts toward the circuit's EWMA, and a circuit left with nothing
    /// to send stops being active, so [`channels_with_work`](Self::channels_with_work)
    /// and [`poll_transmit`](Self::poll_transmit) may still be used on the
    /// same channel.
    pub fn poll_transmit_circuit(
        &mut self,
        now: Instant,
        chan: ChannelId,
        circ_id: CircId,
    ) -> Option<AnyChanCell> {
        let ch = self.channels.get_mut(&chan)?;
        if let Some(pos) = ch.control.iter().position(|c| c.circid() == Some(circ_id)) {
            let cell = ch.control.remove(pos)?;
            self.control_cells -= 1;
            return Some(cell);
        }
        let &(key, side) = ch.circuits.get(&circ_id)?;
        let entry = self.circuits.get_mut(&key)?;
        let msg = entry.circ.poll_transmit(now, side);
        if msg.is_some() {
            ch.scheduler.on_sent((key, side), 1, now);
            if self.torchestra.is_some() {
                entry.window_cells[side_index(side)] += 1;
            }
        }
        self.refresh(now, key);
        let still_busy = self
            .circuits
            .get(&key)
            .is_some_and(|e| e.circ.wants_transmit(side));
        if !still_busy {
            if let Some(ch) = self.channels.get_mut(&chan) {
                ch.scheduler.deactivate((key, side));
            }
        }
        msg.map(|m| ChanCell::new(Some(circ_id), m))
    }

    /// The lane of `circ_id` on `chan` is full: take the circuit out of
    /// the channel's active set, so [`channels_with_work`](Self::channels_with_work)
    /// stops reporting the channel for it and its writer sleeps until the
    /// lane drains ([`lanes_writable`](Self::lanes_writable)) or the
    /// circuit's next input activates it again. Its EWMA history is kept.
    /// [`circuits_with_work`](Self::circuits_with_work) still lists it.
    /// ([`poll_transmit_lanes`](Self::poll_transmit_lanes) does this
    /// itself.)
    pub fn lane_full(&mut self, chan: ChannelId, circ_id: CircId) {
        if let Some(ch) = self.channels.get_mut(&chan) {
            if let Some(&(key, side)) = ch.circuits.get(&circ_id) {
                ch.scheduler.deactivate((key, side));
            }
        }
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<NodeEvent> {
        self.events.pop_front()
    }

    /// A channel to the next hop of `circ` is ready: attach the circuit's
    /// outbound side to it (its CREATE2 goes out first).
    pub fn extend_channel_ready(&mut self, now: Instant, circ: CircKey, chan: ChannelId) {
        let Some(entry) = self.circuits.get_mut(&circ) else {
            return;
        };
        let Some(ch) = self.channels.get_mut(&chan) else {
            return self.extend_channel_failed(now, circ, DestroyReason::CHANNEL_CLOSED);
        };
        if entry.outbound.is_some() || !entry.circ.has_outbound() {
            return;
        }
        let Some(circid) = allocate_circ_id(ch) else {
            return self.extend_channel_failed(now, circ, DestroyReason::RESOURCELIMIT);
        };
        ch.circuits.insert(circid, (circ, Side::Outbound));
        entry.outbound = Some((chan, circid));
        self.refresh(now, circ);
    }

    /// No channel to the next hop of `circ` could be had.
    ///
    /// If the outbound side was already attached (the channel failed after
    /// [`extend_channel_ready`](Self::extend_channel_ready)), it is detached
    /// and a DESTROY goes to the next hop.
    pub fn extend_channel_failed(&mut self, now: Instant, circ: CircKey, reason: DestroyReason) {
        let Some(entry) = self.circuits.get_mut(&circ) else {
            return;
        };
        entry.circ.extend_failed(now, reason);
        if let Some((chan, id)) = entry.outbound.take() {
            if let Some(ch) = self.channels.get_mut(&chan) {
                ch.circuits.remove(&id);
                ch.scheduler.remove((circ, Side::Outbound));
                if let Some(detail) = queue_destroy(ch, &mut self.control_cells, id, reason) {
                    self.events
                        .push_back(NodeEvent::ChannelViolation { chan, detail });
                }
            }
        }
        self.refresh(now, circ);
    }

    /// Close a circuit for a local reason (e.g. the out-of-memory killer).
    pub fn close_circuit(&mut self, now: Instant, circ: CircKey, reason: CloseReason) {
        if let Some(entry) = self.circuits.get_mut(&circ) {
            entry.circ.destroy(reason);
            self.refresh(now, circ);
        }
    }

    /// Bytes queued by each circuit ([`RelayCircuit::queued_bytes`]), for
    /// memory accounting.
    pub fn queued_bytes(&self) -> impl Iterator<Item = (CircKey, usize)> + '_ {
        self.circuits
            .iter()
            .map(|(k, e)| (*k, e.circ.queued_bytes()))
    }

    /// Memory held by all the node's queues, in O(1) (a running total kept
    /// as queues change). Counted, as tor counts for `MaxMemInQueues`:
    ///
    /// * every cell queued by a circuit, either direction, at
    ///   [`QUEUED_CELL_BYTES`](crate::QUEUED_CELL_BYTES) each;
    /// * exit stream buffers by their length (bytes from targets not yet
    ///   packaged into DATA, bytes from clients not yet read by the driver);
    /// * link-level DESTROYs waiting on each channel, at
    ///   `QUEUED_CELL_BYTES` each;
    /// * what each channel's transport holds, either direction, as last
    ///   reported with [`set_transport_buffered`](Self::set_transport_buffered)
    ///   (see [`TransportBuffer`]).
    ///
    /// Not counted: circuit and stream state, crypto, scheduler entries,
    /// the transport library's own buffers. Equals the sum of
    /// [`queued_bytes`](Self::queued_bytes), plus
    /// [`queued_destroys`](Self::queued_destroys) of every channel times
    /// `QUEUED_CELL_BYTES`, plus the transport bytes.
    pub fn total_queued_bytes(&self) -> usize {
        self.circ_bytes + self.control_cells * crate::QUEUED_CELL_BYTES + self.transport_bytes
    }

    /// The driver reports that `chan`'s transport now holds `bytes` in its
    /// `which` buffers; they count toward
    /// [`NodeConfig::max_mem_in_queues`]. Received bytes make the channel
    /// a candidate for the out-of-memory handler, which closes it if it
    /// holds more than any circuit.
    pub fn set_transport_buffered(
        &mut self,
        now: Instant,
        chan: ChannelId,
        which: TransportBuffer,
        bytes: usize,
    ) {
        let Some(ch) = self.channels.get_mut(&chan) else {
            return;
        };
        let slot = match which {
            TransportBuffer::Send => &mut ch.transport_send,
            TransportBuffer::Receive => {
                self.transport_recv = self.transport_recv - ch.transport_recv + bytes;
                &mut ch.transport_recv
            }
        };
        self.transport_bytes = self.transport_bytes - *slot + bytes;
        *slot = bytes;
        self.enforce_mem_limit(now);
    }

    /// Share [`NodeConfig::max_mem_in_queues`] with the relay's other
    /// engines (its datagram circuits and sets), which keep what they
    /// hold in `held`: from the next input on, this node may hold the
    /// limit less that, and never less than half of it ([`allowance`]).
    pub fn share_limit_with(&mut self, held: Arc<AtomicUsize>) {
        self.external = Some(held);
    }

    /// What the relay's other engines hold now (0 when the limit is not
    /// shared).
    pub fn external_held(&self) -> usize {
        self.external
            .as_ref()
            .map_or(0, |held| held.load(AtomicOrdering::Relaxed))
    }

    /// Link-level DESTROYs waiting to be written on `chan`.
    pub fn queued_destroys(&self, chan: ChannelId) -> usize {
        self.channels.get(&chan).map_or(0, |c| c.control.len())
    }

    /// Circuits killed so far by the out-of-memory handler (see
    /// [`NodeConfig::max_mem_in_queues`]).
    pub fn oom_circuits_killed(&self) -> u64 {
        self.oom_killed
    }

    /// Channels closed so far by the out-of-memory handler because their
    /// transports held the most received data.
    pub fn oom_channels_closed(&self) -> u64 {
        self.oom_channels_closed
    }

    /// Run `f` on the streams of set `circ` (None if `circ` is not a
    /// set), then move the set's messages.
    fn with_set<R>(
        &mut self,
        now: Instant,
        circ: CircKey,
        f: impl FnOnce(&mut crate::relay::exit_streams::ExitStreams) -> R,
    ) -> Option<R> {
        let r = f(self.sets.streams(circ)?);
        self.pump_set(now, circ);
        self.enforce_mem_limit(now);
        Some(r)
    }

    fn circuit_mut(&mut self, circ: CircKey) -> Result<&mut RelayCircuit, Error> {
        self.circuits
            .get_mut(&circ)
            .map(|e| &mut e.circ)
            .ok_or(Error::Closed)
    }

    /// Exit: stream connected to its target.
    pub fn exit_connected(
        &mut self,
        now: Instant,
        circ: CircKey,
        stream: StreamId,
        addr: Option<IpAddr>,
    ) -> Result<(), Error> {
        if let Some(r) = self.with_set(now, circ, |s| s.connected(stream, addr)) {
            return r;
        }
        let r = self.circuit_mut(circ)?.exit_connected(now, stream, addr);
        self.refresh(now, circ);
        r
    }

    /// Exit: stream could not be opened, or its target failed.
    pub fn exit_refused(
        &mut self,
        now: Instant,
        circ: CircKey,
        stream: StreamId,
        reason: EndReason,
    ) -> Result<(), Error> {
        if let Some(r) = self.with_set(now, circ, |s| s.refused(stream, reason)) {
            return r;
        }
        let r = self.circuit_mut(circ)?.exit_refused(now, stream, reason);
        self.refresh(now, circ);
        r
    }

    /// Exit: answer to a RESOLVE.
    pub fn exit_resolved(
        &mut self,
        now: Instant,
        circ: CircKey,
        stream: StreamId,
        answers: Vec<(ResolvedVal, u32)>,
    ) -> Result<(), Error> {
        let answers = match self.sets.streams(circ) {
            Some(s) => {
                s.resolved(stream, answers);
                self.pump_set(now, circ);
                return Ok(());
            }
            None => answers,
        };
        self.circuit_mut(circ)?.exit_resolved(now, stream, answers);
        self.refresh(now, circ);
        Ok(())
    }

    /// Exit: bytes from the target toward the client.
    pub fn exit_write(
        &mut self,
        now: Instant,
        circ: CircKey,
        stream: StreamId,
        data: &[u8],
    ) -> Result<usize, Error> {
        if let Some(r) = self.with_set(now, circ, |s| s.write(stream, data, now)) {
            return r;
        }
        let r = self.circuit_mut(circ)?.exit_write(now, stream, data);
        self.refresh(now, circ);
        r
    }

    /// Exit: bytes from the client for the target.
    pub fn exit_read(
        &mut self,
        now: Instant,
        circ: CircKey,
        stream: StreamId,
        buf: &mut [u8],
    ) -> Result<usize, Error> {
        if self.sets.contains(circ) {
            return self
                .with_set(now, circ, |s| s.read(stream, buf, now))
                .unwrap_or(Err(Error::Closed));
        }
        let r = self.circuit_mut(circ)?.exit_read(now, stream, buf);
        self.refresh(now, circ);
        r
    }

    /// Exit: hand the client's bytes for the target (up to
    /// [`READ_WITH_CHUNKS`](crate::stream::READ_WITH_CHUNKS) cells, in order)
    /// to `consume`, which returns how many it took (written to the
    /// target, say); those are removed. Unlike
    /// [`exit_read`](Self::exit_read) the driver needs no buffer of its
    /// own per stream, so every byte a client sends stays in the counted
    /// queues until the target takes it.
    pub fn exit_read_with(
        &mut self,
        now: Instant,
        circ: CircKey,
        stream: StreamId,
        consume: impl FnOnce(&[&[u8]]) -> usize,
    ) -> Result<usize, Error> {
        if self.sets.contains(circ) {
            return self
                .with_set(now, circ, |s| s.read_with(stream, now, consume))
                .unwrap_or(Err(Error::Closed));
        }
        let r = self.circuit_mut(circ)?.exit_read_with(now, stream, consume);
        self.refresh(now, circ);
        r
    }

    /// Exit: bytes from the target that [`exit_write`](Self::exit_write)
    /// would accept now (0 for a closing stream). With no room, the
    /// stream's writer gets [`StreamEvent::Writable`] once there is some,
    /// so a driver can read from its target only what the circuit takes
    /// at once, and hold nothing of its own per stream.
    ///
    /// # Errors
    ///
    /// The circuit or stream is gone.
    pub fn exit_write_room(
        &mut self,
        now: Instant,
        circ: CircKey,
        stream: StreamId,
    ) -> Result<usize, Error> {
        if let Some(s) = self.sets.streams(circ) {
            return s.write_room(stream, now);
        }
        self.circuit_mut(circ)?.exit_write_room(now, stream)
    }

    /// Exit: when the client's XON rate (proposal 324) will let
    /// [`exit_write`](Self::exit_write) take bytes again, if it does not
    /// now. No event marks that moment: a driver refused for the rate
    /// waits until then, or for [`StreamEvent::Writable`], whichever comes
    /// first. `None`: no rate limits the stream now (or no such stream).
    pub fn exit_write_resumes_at(&self, circ: CircKey, stream: StreamId) -> Option<Instant> {
        if let Some(s) = self.sets.streams_ref(circ) {
            return s.write_resumes_at(stream);
        }
        self.circuits.get(&circ)?.circ.exit_write_resumes_at(stream)
    }

    /// Exit: bytes from the client not yet read for the target.
    pub fn exit_readable_bytes(&self, circ: CircKey, stream: StreamId) -> usize {
        if let Some(s) = self.sets.streams_ref(circ) {
            return s.readable_bytes(stream);
        }
        self.circuits
            .get(&circ)
            .map_or(0, |e| e.circ.exit_readable_bytes(stream))
    }

    /// The channel circuit `circ` came in on (toward the client).
    pub fn inbound_channel(&self, circ: CircKey) -> Option<ChannelId> {
        self.circuits.get(&circ).map(|e| e.inbound.0)
    }

    /// Exit: the congestion control of circuit `circ`'s sending side (see
    /// [`RelayCircuit::exit_cc_snapshot`](crate::relay::RelayCircuit::exit_cc_snapshot)).
    pub fn exit_cc_snapshot(&self, circ: CircKey) -> Option<crate::cc::CcSnapshot> {
        self.circuits.get(&circ)?.circ.exit_cc_snapshot()
    }

    /// Exit: the target closed; END (DONE) after queued bytes.
    pub fn exit_close(
        &mut self,
        now: Instant,
        circ: CircKey,
        stream: StreamId,
    ) -> Result<(), Error> {
        self.exit_end(now, circ, stream, EndReason::DONE)
    }

    /// Exit: the connection to the target ended, cleanly (`DONE`) or not
    /// (e.g. `CONNRESET` when the target reset it): END with `reason` after
    /// the bytes already queued for the client.
    pub fn exit_end(
        &mut self,
        now: Instant,
        circ: CircKey,
        stream: StreamId,
        reason: EndReason,
    ) -> Result<(), Error> {
        if let Some(r) = self.with_set(now, circ, |s| s.end(stream, reason)) {
            return r;
        }
        let r = self.circuit_mut(circ)?.exit_end(now, stream, reason);
        self.refresh(now, circ);
        r
    }

    /// After anything touched circuit `key`: turn its events into node
    /// events, tear down what closed, keep the schedulers' active sets and
    /// the memory total in step with the circuit's queues, then enforce the
    /// memory limit. Every input that can grow a queue passes here.
    fn refresh(&mut self, now: Instant, key: CircKey) {
        self.refresh_circuit(now, key);
        self.enforce_mem_limit(now);
    }

    /// Run the out-of-memory handler if the queues hold more than
    /// [`NodeConfig::max_mem_in_queues`]. O(1) unless over the limit.
    fn enforce_mem_limit(&mut self, now: Instant) {
        let limit = self.config.max_mem_in_queues;
        if limit == 0 {
            return;
        }
        let limit = allowance(limit, self.external_held());
        if self.total_queued_bytes() > limit {
            self.handle_oom(now, limit);
        }
    }

    /// Kill the circuits holding the most queued bytes, and close the
    /// channels whose transports hold the most received bytes, largest
    /// first, until the total is below 3/4 of `limit` (the node's
    /// [`allowance`]). Circuits and channels holding nothing are spared:
    /// killing them frees nothing.
    /// (Tor picks victims by the age of their oldest queued cell or
    /// buffered byte, circuits and connections alike; here the largest go
    /// first, which frees the limit with the fewest kills.)
    #[cold]
    fn handle_oom(&mut self, now: Instant, limit: usize) {
        if self.circ_bytes == 0 && self.transport_recv == 0 {
            // Only link-level DESTROYs and cells on their way out are
            // queued: nothing to kill (and no scan of the circuits on
            // every input while it lasts).
            return;
        }
        let low_water = limit - limit / 4;
        let before = self.total_queued_bytes();
        // Most bytes first; among equals, channels, then the oldest
        // circuit. Building the heap is O(circuits + channels), each kill
        // O(log n).
        let circuits = self
            .circuits
            .iter()
            .filter(|(_, e)| e.accounted > 0)
            .map(|(k, e)| (e.accounted, OomVictim::Circuit(Reverse(*k))));
        let channels = self
            .channels
            .iter()
            .filter(|(_, c)| c.transport_recv > 0)
            .map(|(id, c)| (c.transport_recv, OomVictim::Channel(*id)));
        let mut victims: BinaryHeap<(usize, OomVictim)> = circuits.chain(channels).collect();
        let (mut circuits_killed, mut channels_closed) = (0u64, 0u64);
        while self.total_queued_bytes() >= low_water {
            let Some((held, victim)) = victims.pop() else {
                break;
            };
            match victim {
                OomVictim::Circuit(Reverse(key)) => {
                    let Some(entry) = self.circuits.get_mut(&key) else {
                        continue;
                    };
                    entry.circ.destroy(CloseReason::out_of_memory(format!(
                        "out of memory: queues held {before} bytes, over the limit of {limit}; \
                         this circuit held {held}"
                    )));
                    self.refresh_circuit(now, key);
                    circuits_killed += 1;
                }
                OomVictim::Channel(chan) => {
                    if !self.channels.contains_key(&chan) {
                        continue;
                    }
                    self.detach_channel(now, chan);
                    self.events.push_back(NodeEvent::ChannelOutOfMemory {
                        chan,
                        detail: format!(
                            "out of memory: queues held {before} bytes, over the limit of \
                             {limit}; this channel's transport held {held} received bytes"
                        ),
                    });
                    channels_closed += 1;
                }
            }
        }
        self.oom_killed += circuits_killed;
        self.oom_channels_closed += channels_closed;
        tracing::warn!(
            before,
            after = self.total_queued_bytes(),
            limit,
            circuits_killed,
            channels_closed,
            "queued data over the memory limit: killed the circuits and closed the channels \
             holding the most"
        );
    }

    /// [`refresh`](Self::refresh) without the memory limit.
    fn refresh_circuit(&mut self, now: Instant, key: CircKey) {
        self.refresh_circuit_alone(now, key);
        self.settle_sets(now, key);
    }

    /// [`refresh_circuit`](Self::refresh_circuit) without the sets.
    fn refresh_circuit_alone(&mut self, now: Instant, key: CircKey) {
        self.refresh_events(key);
        let Some(entry) = self.circuits.get(&key) else {
            return;
        };
        let sides = [
            (Some(entry.inbound), Side::Inbound),
            (entry.outbound, Side::Outbound),
        ];
        for (place, side) in sides {
            let Some((chan, _)) = place else { continue };
            let Some(ch) = self.channels.get_mut(&chan) else {
                continue;
            };
            // The scheduler's active set is exactly the circuits with a
            // cell to send. A circuit can stop wanting to send without
            // sending (an XOFF, a closing window): left active, it would
            // keep its channel in `channels_with_work` while a per-circuit
            // writer, which only asks `circuits_with_work`, never takes it
            // out, and the writer would be woken for ever.
            if entry.circ.wants_transmit(side) {
                ch.scheduler.activate((key, side), now);
            } else {
                ch.scheduler.deactivate((key, side));
            }
        }
    }

    /// Turn circuit `key`'s events into node events and tear it down if it
    /// closed.
    fn refresh_events(&mut self, key: CircKey) {
        let Some(entry) = self.circuits.get_mut(&key) else {
            return;
        };
        while let Some(ev) = entry.circ.poll_event() {
            if self.sets.note(key, &ev) {
                continue;
            }
            match ev {
                RelayCircEvent::Extend { linkspecs } => {
                    self.events.push_back(NodeEvent::ConnectRelay {
                        circ: key,
                        linkspecs,
                    });
                }
                RelayCircEvent::OutboundClosed {
                    send_destroy,
                    reason,
                } => {
                    if let Some((chan, id)) = entry.outbound.take() {
                        if let Some(ch) = self.channels.get_mut(&chan) {
                            ch.circuits.remove(&id);
                            ch.scheduler.remove((key, Side::Outbound));
                            if send_destroy {
                                if let Some(detail) =
                                    queue_destroy(ch, &mut self.control_cells, id, reason)
                                {
                                    self.events
                                        .push_back(NodeEvent::ChannelViolation { chan, detail });
                                }
                            }
                        }
                    }
                }
                RelayCircEvent::Connect { stream, host, port } => {
                    self.events.push_back(NodeEvent::ExitConnect {
                        circ: key,
                        stream,
                        host,
                        port,
                    });
                }
                RelayCircEvent::Resolve { stream, host } => {
                    self.events.push_back(NodeEvent::ExitResolve {
                        circ: key,
                        stream,
                        host,
                    });
                }
                RelayCircEvent::Stream(event) => {
                    self.events
                        .push_back(NodeEvent::ExitStream { circ: key, event });
                }
                // Taken by `self.sets.note` above.
                RelayCircEvent::Link { .. } => {}
                RelayCircEvent::Closed {
                    reason,
                    notify_inbound,
                    notify_outbound,
                } => {
                    let sides = [
                        (Some(entry.inbound), Side::Inbound, notify_inbound),
                        (entry.outbound, Side::Outbound, notify_outbound),
                    ];
                    for (place, side, notify) in sides {
                        let Some((chan, id)) = place else { continue };
                        if let Some(ch) = self.channels.get_mut(&chan) {
                            ch.circuits.remove(&id);
                            ch.scheduler.remove((key, side));
                            if notify {
                                if let Some(detail) =
                                    queue_destroy(ch, &mut self.control_cells, id, reason.reason)
                                {
                                    self.events
                                        .push_back(NodeEvent::ChannelViolation { chan, detail });
                                }
                            }
                        }
                    }
                    self.circ_bytes -= entry.accounted;
                    self.circuits.remove(&key);
                    self.events
                        .push_back(NodeEvent::CircuitClosed { circ: key, reason });
                    return;
                }
            }
        }
        // Every change to a circuit's queues ends here (or in the removal
        // above), so the total follows them with O(1) work per call.
        let bytes = entry.circ.queued_bytes();
        self.circ_bytes = self.circ_bytes - entry.accounted + bytes;
        entry.accounted = bytes;
    }
}

/// Most DESTROYs queued on one channel (refusals of CREATE2 and notices of
/// closed circuits). A peer that keeps making circuits fail without reading
/// our answers loses the channel instead of growing this queue.
const MAX_QUEUED_DESTROYS: usize = 1024;

/// Queue a DESTROY for circuit `circid` on `ch`; `Some(detail)` if the peer
/// has overrun [`MAX_QUEUED_DESTROYS`] and the channel must close.
/// `control_cells` is the node's count of cells in all control queues.
fn queue_destroy(
    ch: &mut Channel,
    control_cells: &mut usize,
    circid: CircId,
    reason: DestroyReason,
) -> Option<String> {
    if ch.control.len() >= MAX_QUEUED_DESTROYS {
        return Some(format!(
            "over {MAX_QUEUED_DESTROYS} DESTROYs waiting: peer does not read"
        ));
    }
    ch.control
        .push_back(ChanCell::new(Some(circid), Destroy::new(reason).into()));
    *control_cells += 1;
    None
}

/// A free circuit ID for a circuit we create on `ch` (tor-spec: the link's
/// initiator sets the high bit, the other side clears it).
fn allocate_circ_id(ch: &mut Channel) -> Option<CircId> {
    let high = if ch.initiated_by_us { 0x8000_0000 } else { 0 };
    for _ in 0..1_000_000 {
        let low = ch.next_circ_id & 0x7fff_ffff;
        ch.next_circ_id = ch.next_circ_id.wrapping_add(1);
        if low == 0 {
            continue;
        }
        let id = CircId::new(high | low)?;
        if !ch.circuits.contains_key(&id) {
            return Some(id);
        }
    }
    None
}

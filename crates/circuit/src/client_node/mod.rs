//! A whole client (onion proxy) as a sans-IO state machine: its channels to
//! guards, the circuit-ID map and circuit scheduler of each channel, its
//! circuits ([`ClientCircuit`]) built hop by hop along a given path, build
//! timeouts, and the streams on those circuits. The counterpart of
//! [`RelayNode`](crate::node::RelayNode).
//!
//! What stays with the driver: choosing paths (the node takes a path, it
//! does not pick one), which circuit a stream goes on (isolation, exit
//! policies, dirtiness), the connections themselves, and the clock.
//!
//! # Driving it
//!
//! * [`ClientNode::launch`] starts a circuit on a path. If no channel to the
//!   path's guard exists, the node makes one and asks for its connection
//!   with [`ClientNodeEvent::ChannelWanted`]; the driver answers with
//!   [`ClientNode::channel_opened`] or [`ClientNode::channel_closed`]. Hops
//!   are added one after the other; [`ClientNodeEvent::Built`] says the
//!   whole path is there, [`ClientNodeEvent::Closed`] (with a build failure)
//!   that it never will be.
//! * Cells read from a channel go to [`ClientNode::handle_cell`].
//! * [`ClientNode::poll_channel_ready`] names channels that got cells to
//!   send. A transport that carries a channel as one ordered byte stream
//!   writes what [`ClientNode::poll_transmit`] gives (the channel's circuit
//!   scheduler picks the circuit) while its connection has room. A
//!   transport with a lane per circuit asks
//!   [`ClientNode::circuits_with_work`] and fills each lane with
//!   [`ClientNode::poll_transmit_circuit`], giving lanes that share one
//!   connection [`ClientNode::lane_priority`].
//! * [`ClientNode::poll_timeout`] / [`ClientNode::handle_timeout`]: build
//!   and hop timeouts.
//! * Streams: [`ClientNode::begin`], [`ClientNode::write`],
//!   [`ClientNode::read`], [`ClientNode::close_stream`]; their events come
//!   out as [`ClientNodeEvent::Circuit`].
//!
//! # Determinism
//!
//! Outputs depend only on inputs and the seeded RNG: everything the node
//! iterates is an ordered map.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use onionlab_cell::chan::{AnyChanCell, ChanCell, CircId, Destroy, DestroyReason};
use onionlab_cell::msg::{EncodedLinkSpec, StreamId};
use onionlab_crypto::identity::RelayPublicKeys;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tor_llcrypto::pk::ed25519::Ed25519Identity;

use crate::client::{ClientCircuit, ClientConfig, ClientEvent};
use crate::err::{CloseReason, Error};
use crate::flow::CircuitCc;
use crate::node::{ChannelId, CircKey};
use crate::scheduler::{CircuitScheduler, SchedulerKind};

mod sets;
#[cfg(test)]
mod tests;

/// Settings of a client node.
#[derive(Debug, Clone)]
pub struct ClientNodeConfig {
    /// Circuit scheduler of every channel.
    pub scheduler: SchedulerKind,
    /// How long a whole build (every hop of the path) may take.
    pub build_timeout: Duration,
    /// Settings of each circuit (its `cc` is overridden per launch).
    pub circuit: ClientConfig,
}

impl Default for ClientNodeConfig {
    fn default() -> Self {
        ClientNodeConfig {
            scheduler: SchedulerKind::default(),
            build_timeout: Duration::from_secs(60),
            circuit: ClientConfig::default(),
        }
    }
}

/// One relay of a path: what CREATE2 and EXTEND2 need, and a name for
/// failure reports.
#[derive(Debug, Clone)]
pub struct PathHop {
    /// The relay's keys (identity and ntor onion key).
    pub keys: RelayPublicKeys,
    /// Link specifiers for the EXTEND2 that reaches it (unused for the
    /// guard).
    pub linkspecs: Vec<EncodedLinkSpec>,
    /// Its name in logs and failure reports (a nickname).
    pub name: String,
}

/// Why a build failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildFailure {
    /// Not built within the build timeout.
    Timeout,
    /// Something else, described.
    Failed(String),
}

/// What a client node reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientNodeEvent {
    /// Open a connection to the guard with this identity for channel
    /// `chan`, then call [`ClientNode::channel_opened`] (or
    /// [`ClientNode::channel_closed`] if it cannot be opened).
    ChannelWanted {
        /// The new channel.
        chan: ChannelId,
        /// The guard's Ed25519 identity.
        guard: Ed25519Identity,
    },
    /// Every hop of the circuit's path is there: streams may attach.
    Built {
        /// The circuit.
        circ: CircKey,
        /// Time since its launch (or since the last
        /// [`ClientNode::extend`] of a built circuit).
        elapsed: Duration,
    },
    /// An event of the circuit, after the node acted on it (hops added or
    /// failed, stream events, RESOLVE answers). Its closing is reported as
    /// [`ClientNodeEvent::Closed`] instead.
    Circuit {
        /// The circuit.
        circ: CircKey,
        /// What happened.
        event: ClientEvent,
    },
    /// Hop `hop` of leg `leg` (in the order of the paths given to
    /// [`ClientNode::launch_set`]) of set `set` failed: the relay there
    /// may be at fault, as [`ClientEvent::HopFailed`] says for a plain
    /// circuit. The set closes right after.
    LegHopFailed {
        /// The set.
        set: CircKey,
        /// The leg's index.
        leg: usize,
        /// The hop's index in the leg's path.
        hop: usize,
    },
    /// The circuit is closed; nothing more will happen on it, and the node
    /// forgets it once its DESTROY is out.
    Closed {
        /// The circuit.
        circ: CircKey,
        /// The DESTROY (or TRUNCATED) behind it.
        reason: CloseReason,
        /// Set if it closed before it was built: why the build failed.
        build_failure: Option<BuildFailure>,
        /// What first went wrong (a relay that failed, an extension that
        /// could not be made, a channel that closed), if the node knows
        /// more than `reason` says.
        detail: Option<String>,
    },
}

/// One channel to a guard.
#[derive(Debug)]
struct Channel {
    guard: Ed25519Identity,
    /// The guard's name, for failure reports.
    guard_name: String,
    open: bool,
    /// Shutting down: no new circuits, closes once nothing is left to send.
    closing: bool,
    circuits: BTreeMap<u32, CircKey>,
    scheduler: Box<dyn CircuitScheduler<CircKey>>,
}

/// One circuit.
struct Circ {
    circ: ClientCircuit,
    chan: ChannelId,
    circ_id: u32,
    path: Vec<PathHop>,
    /// When the current build started.
    started: Instant,
    /// Set while hops of the path are missing.
    build_deadline: Option<Instant>,
    timed_out: bool,
    /// What first went wrong, for the close report.
    failure: Option<String>,
    closed: bool,
    /// The set this circuit is a leg of.
    set: Option<CircKey>,
}

impl Circ {
    fn is_building(&self) -> bool {
        !self.closed && self.build_deadline.is_some()
    }

    /// Send the EXTEND2 to the next hop of the path if the circuit has
    /// every hop before it and is not extending; on failure, destroy the
    /// circuit with the reason noted.
    fn extend_to_next(&mut self) {
        if self.closed || self.circ.is_extending() {
            return;
        }
        let Some(next) = self.path.get(self.circ.n_hops()) else {
            return;
        };
        if let Err(e) = self.circ.extend(&next.keys, next.linkspecs.clone()) {
            self.failure
                .get_or_insert_with(|| format!("cannot extend to {}: {e}", next.name));
            self.circ.destroy();
        }
    }
}

/// The client's channels, circuits and streams.
pub struct ClientNode {
    config: ClientNodeConfig,
    rng: StdRng,
    channels: BTreeMap<ChannelId, Channel>,
    by_guard: BTreeMap<Ed25519Identity, ChannelId>,
    circuits: BTreeMap<CircKey, Circ>,
    next_circ: u64,
    next_chan: ChannelId,
    events: VecDeque<ClientNodeEvent>,
    /// Channels that got cells to send since the driver last asked.
    ready: BTreeSet<ChannelId>,
    /// A deadline may have moved earlier since the driver last asked
    /// ([`ClientNode::take_deadline_changed`]).
    deadline_changed: bool,
    /// Linked sets (see `sets.rs`), by their own key.
    sets: BTreeMap<CircKey, sets::ClientSet>,
    /// Set while a set moves its messages (its legs' touches do not start
    /// another round).
    pumping: bool,
}

impl std::fmt::Debug for ClientNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientNode")
            .field("channels", &self.channels.len())
            .field("circuits", &self.circuits.len())
            .finish_non_exhaustive()
    }
}

impl ClientNode {
    /// A client with no channels or circuits.
    pub fn new(config: ClientNodeConfig, rng: StdRng) -> Self {
        ClientNode {
            config,
            rng,
            channels: BTreeMap::new(),
            by_guard: BTreeMap::new(),
            circuits: BTreeMap::new(),
            next_circ: 1,
            next_chan: 1,
            events: VecDeque::new(),
            ready: BTreeSet::new(),
            deadline_changed: false,
            sets: BTreeMap::new(),
            pumping: false,
        }
    }

    /// Start building a circuit along `path` (guard first) with circuit
    /// congestion control `cc`: CREATE2 on the guard's channel (made, and
    /// asked for with [`ClientNodeEvent::ChannelWanted`], if there is
    /// none), then an EXTEND2 per hop as each is added. The build is
    /// abandoned after the build timeout. An empty path is refused.
    pub fn launch(
        &mut self,
        now: Instant,
        path: Vec<PathHop>,
        cc: CircuitCc,
    ) -> Result<CircKey, Error> {
        let Some(guard) = path.first() else {
            return Err(Error::BadState("a path needs at least one hop"));
        };
        let chan = self.channel_for(guard);
        let key = CircKey(self.next_circ);
        self.next_circ += 1;
        let config = ClientConfig {
            cc,
            ..self.config.circuit.clone()
        };
        let circ = ClientCircuit::new(config, &guard.keys, StdRng::from_rng(&mut self.rng));
        let ch = self.channels.get_mut(&chan).expect("channel_for made it");
        // Link protocol 4+: the initiator's IDs have the high bit set.
        let circ_id = loop {
            let id = self.rng.random::<u32>() | 0x8000_0000;
            if !ch.circuits.contains_key(&id) {
                break id;
            }
        };
        ch.circuits.insert(circ_id, key);
        self.circuits.insert(
            key,
            Circ {
                circ,
                chan,
                circ_id,
                path,
                started: now,
                build_deadline: Some(now + self.config.build_timeout),
                timed_out: false,
                failure: None,
                closed: false,
                set: None,
            },
        );
        self.deadline_changed = true;
        self.touch(now, key, true);
        Ok(key)
    }

    /// Add `hop` to the end of circuit `circ`'s path. A built circuit is
    /// extended at once (and is being built again until the hop is
    /// there, with a fresh build timeout); one being built reaches it after
    /// the hops before it. For drivers that extend hop by hop.
    pub fn extend(&mut self, now: Instant, circ: CircKey, hop: PathHop) -> Result<(), Error> {
        let build_timeout = self.config.build_timeout;
        let c = self.live(circ)?;
        c.path.push(hop);
        if c.build_deadline.is_none() {
            c.build_deadline = Some(now + build_timeout);
            c.started = now;
        }
        c.extend_to_next();
        self.deadline_changed = true;
        self.touch(now, circ, true);
        Ok(())
    }

    /// The channel to `guard`, made if there is none (or only a closing
    /// one).
    fn channel_for(&mut self, guard: &PathHop) -> ChannelId {
        let identity = guard.keys.ed_identity;
        if let Some(&chan) = self.by_guard.get(&identity) {
            if self.channels.get(&chan).is_some_and(|c| !c.closing) {
                return chan;
            }
        }
        let chan = self.next_chan;
        self.next_chan += 1;
        self.channels.insert(
            chan,
            Channel {
                guard: identity,
                guard_name: guard.name.clone(),
                open: false,
                closing: false,
                circuits: BTreeMap::new(),
                scheduler: self.config.scheduler.build(),
            },
        );
        self.by_guard.insert(identity, chan);
        self.events.push_back(ClientNodeEvent::ChannelWanted {
            chan,
            guard: identity,
        });
        chan
    }

    /// The connection of channel `chan` is up: its circuits' cells may go
    /// out.
    pub fn channel_opened(&mut self, chan: ChannelId) {
        if let Some(ch) = self.channels.get_mut(&chan) {
            ch.open = true;
            self.ready.insert(chan);
        }
    }

    /// Channel `chan` is gone (its connection failed or closed): its
    /// circuits close, and the next circuit through its guard gets a new
    /// channel. Returns how many circuits it carried.
    pub fn channel_closed(&mut self, now: Instant, chan: ChannelId, why: &str) -> usize {
        let Some(ch) = self.channels.remove(&chan) else {
            return 0;
        };
        let carried = ch.circuits.len();
        if self.by_guard.get(&ch.guard) == Some(&chan) {
            self.by_guard.remove(&ch.guard);
        }
        self.ready.remove(&chan);
        for key in ch.circuits.into_values() {
            if let Some(c) = self.circuits.get_mut(&key) {
                c.failure.get_or_insert_with(|| {
                    format!("channel to guard {} closed: {why}", ch.guard_name)
                });
                c.circ
                    .handle_cell(now, Destroy::new(DestroyReason::CHANNEL_CLOSED).into());
            }
            self.touch(now, key, true);
        }
        carried
    }

    /// Whether channel `chan` exists (opening, open or closing).
    pub fn has_channel(&self, chan: ChannelId) -> bool {
        self.channels.contains_key(&chan)
    }

    /// Whether channel `chan` is closing (after [`ClientNode::shutdown`])
    /// and none of its circuits has a cell left: its connection may close.
    pub fn channel_done(&self, chan: ChannelId) -> bool {
        self.channels.get(&chan).is_some_and(|ch| {
            ch.closing
                && ch.circuits.values().all(|k| {
                    self.circuits
                        .get(k)
                        .is_none_or(|c| !c.circ.wants_transmit())
                })
        })
    }

    /// A cell read from channel `chan`: to its circuit. Cells without a
    /// circuit ID and cells for circuits the node forgot are dropped.
    pub fn handle_cell(&mut self, now: Instant, chan: ChannelId, cell: AnyChanCell) {
        let (id, msg) = cell.into_circid_and_msg();
        let Some(ch) = self.channels.get(&chan) else {
            return;
        };
        let Some(&key) = id.and_then(|id| ch.circuits.get(&u32::from(id))) else {
            return;
        };
        if let Some(c) = self.circuits.get_mut(&key) {
            c.circ.handle_cell(now, msg);
        }
        self.touch(now, key, true);
    }

    /// The next channel that got cells to send (or became able to send
    /// them, or, after [`ClientNode::shutdown`], may have nothing left:
    /// see [`ClientNode::channel_done`]) since the last call.
    pub fn poll_channel_ready(&mut self) -> Option<ChannelId> {
        self.ready.pop_first()
    }

    /// The next cell to write on channel `chan` (an open channel carried
    /// as one ordered byte stream), from the circuit its scheduler picks.
    pub fn poll_transmit(&mut self, now: Instant, chan: ChannelId) -> Option<AnyChanCell> {
        loop {
            let ch = self.channels.get_mut(&chan).filter(|ch| ch.open)?;
            let key = ch.scheduler.next(now)?;
            let Some(c) = self.circuits.get_mut(&key) else {
                continue;
            };
            match c.circ.poll_transmit(now) {
                Some(msg) => {
                    ch.scheduler.on_sent(key, 1, now);
                    // A CREATE2 or EXTEND2 going out arms a hop deadline.
                    self.deadline_changed |= c.circ.is_extending();
                    let cell = ChanCell::new(CircId::new(c.circ_id), msg);
                    self.touch(now, key, true);
                    return Some(cell);
                }
                // Not put back in the scheduler: a circuit that claims
                // work and yields no cell cannot spin the writer. Its next
                // input re-activates it.
                None => self.touch(now, key, false),
            }
        }
    }

    /// Circuit IDs of channel `chan`'s circuits with cells to send, for a
    /// transport with a lane per circuit.
    pub fn circuits_with_work(&self, chan: ChannelId) -> Vec<CircId> {
        let Some(ch) = self.channels.get(&chan).filter(|ch| ch.open) else {
            return Vec::new();
        };
        ch.circuits
            .iter()
            .filter(|(_, k)| {
                self.circuits
                    .get(k)
                    .is_some_and(|c| c.circ.wants_transmit())
            })
            .filter_map(|(id, _)| CircId::new(*id))
            .collect()
    }

    /// The priority of circuit `id`'s lane on channel `chan`, as its
    /// scheduler ranks it (higher goes first).
    pub fn lane_priority(&self, now: Instant, chan: ChannelId, id: CircId) -> i32 {
        let Some(ch) = self.channels.get(&chan) else {
            return 0;
        };
        ch.circuits
            .get(&u32::from(id))
            .map_or(0, |k| ch.scheduler.priority(k, now))
    }

    /// The next cell of circuit `id` on channel `chan`, for its lane.
    pub fn poll_transmit_circuit(
        &mut self,
        now: Instant,
        chan: ChannelId,
        id: CircId,
    ) -> Option<AnyChanCell> {
        let ch = self.channels.get_mut(&chan).filter(|ch| ch.open)?;
        let key = *ch.circuits.get(&u32::from(id))?;
        let c = self.circuits.get_mut(&key)?;
        let msg = c.circ.poll_transmit(now);
        if msg.is_some() {
            ch.scheduler.on_sent(key, 1, now);
            self.deadline_changed |= c.circ.is_extending();
        }
        self.touch(now, key, false);
        msg.map(|m| ChanCell::new(Some(id), m))
    }

    /// Open a stream to `host:port` on circuit (or set) `circ` (BEGIN to
    /// its last hop).
    pub fn begin(
        &mut self,
        now: Instant,
        circ: CircKey,
        host: &str,
        port: u16,
    ) -> Result<StreamId, Error> {
        if let Some(streams) = self.set_streams(circ) {
            let r = streams?.begin(host, port);
            return self.set_opened(now, circ, r);
        }
        let r = self.live(circ)?.circ.begin(host, port);
        self.touch(now, circ, true);
        r
    }

    /// Resolve `host` on circuit (or set) `circ` (RESOLVE to its last
    /// hop); the answer comes as [`ClientEvent::Resolved`].
    pub fn resolve(&mut self, now: Instant, circ: CircKey, host: &str) -> Result<StreamId, Error> {
        if let Some(streams) = self.set_streams(circ) {
            let r = streams?.resolve(host);
            return self.set_opened(now, circ, r);
        }
        let r = self.live(circ)?.circ.resolve(host);
        self.touch(now, circ, true);
        r
    }

    /// A set's BEGIN or RESOLVE: a full queue closes the set.
    fn set_opened(
        &mut self,
        now: Instant,
        circ: CircKey,
        r: Result<StreamId, crate::client::streams::BeginError>,
    ) -> Result<StreamId, Error> {
        use crate::client::streams::BeginError;
        match r {
            Ok(id) => {
                self.pump_set(now, circ);
                Ok(id)
            }
            Err(BeginError::Refused(e)) => Err(e),
            Err(BeginError::Overflow) => {
                self.set_overflow(now, circ);
                Err(Error::Closed)
            }
        }
    }

    /// Offer `data` to stream `stream` of circuit (or set) `circ`: how many
    /// bytes it took (0 when its windows or the exit's XON rate are full).
    pub fn write(
        &mut self,
        now: Instant,
        circ: CircKey,
        stream: StreamId,
        data: &[u8],
    ) -> Result<usize, Error> {
        if let Some(streams) = self.set_streams(circ) {
            let r = streams?
                .write(stream, data, now)
                .ok_or(Error::NoStream(stream.into()));
            self.pump_set(now, circ);
            return r;
        }
        let r = self.live(circ)?.circ.write(now, stream, data);
        self.touch(now, circ, true);
        r
    }

    /// When the exit's XON rate lets `stream` take bytes again, if it
    /// refuses them now for the rate.
    pub fn write_resumes_at(&self, circ: CircKey, stream: StreamId) -> Option<Instant> {
        if let Some(s) = self.sets.get(&circ) {
            return s.streams.write_resumes_at(stream);
        }
        self.circuits.get(&circ)?.circ.write_resumes_at(stream)
    }

    /// Read what stream `stream` of circuit (or set) `circ` received.
    pub fn read(
        &mut self,
        now: Instant,
        circ: CircKey,
        stream: StreamId,
        buf: &mut [u8],
    ) -> Result<usize, Error> {
        if let Some(streams) = self.set_streams(circ) {
            let (n, queued) = streams?.read(stream, buf, now)?;
            if queued.is_err() {
                // The bytes read are still the caller's.
                self.set_overflow(now, circ);
            } else {
                self.pump_set(now, circ);
            }
            return Ok(n);
        }
        let r = self.live(circ)?.circ.read(now, stream, buf);
        self.touch(now, circ, true);
        r
    }

    /// Bytes received on `stream` and not read yet.
    pub fn readable_bytes(&self, circ: CircKey, stream: StreamId) -> usize {
        if let Some(s) = self.sets.get(&circ) {
            return s.streams.readable_bytes(stream);
        }
        self.circuits
            .get(&circ)
            .map_or(0, |c| c.circ.readable_bytes(stream))
    }

    /// End `stream` (END after its queued bytes).
    pub fn close_stream(
        &mut self,
        now: Instant,
        circ: CircKey,
        stream: StreamId,
    ) -> Result<(), Error> {
        if let Some(streams) = self.set_streams(circ) {
            let closed = streams?.close(stream);
            self.pump_set(now, circ);
            return if closed {
                Ok(())
            } else {
                Err(Error::NoStream(stream.into()))
            };
        }
        let r = self.live(circ)?.circ.close_stream(stream);
        self.touch(now, circ, true);
        r
    }

    /// Close circuit (or set) `circ` (DESTROY on every leg).
    pub fn destroy(&mut self, now: Instant, circ: CircKey) {
        if self.sets.contains_key(&circ) {
            let reason = CloseReason::local(
                onionlab_cell::chan::DestroyReason::NONE,
                "closed by the client",
            );
            return self.close_set(now, circ, reason, false, None);
        }
        if let Some(c) = self.circuits.get_mut(&circ) {
            c.circ.destroy();
            self.touch(now, circ, true);
        }
    }

    /// Stop: destroy every circuit, and let open channels close once their
    /// DESTROYs are out ([`ClientNode::channel_done`]). Channels not open
    /// yet are dropped at once; their IDs are returned.
    pub fn shutdown(&mut self, now: Instant) -> Vec<ChannelId> {
        let keys: Vec<CircKey> = self.circuits.keys().copied().collect();
        for key in keys {
            self.destroy(now, key);
        }
        let mut dropped = Vec::new();
        let chans: Vec<(ChannelId, bool)> =
            self.channels.iter().map(|(k, c)| (*k, c.open)).collect();
        for (chan, open) in chans {
            if open {
                if let Some(ch) = self.channels.get_mut(&chan) {
                    ch.closing = true;
                    self.ready.insert(chan);
                }
            } else {
                self.channel_closed(now, chan, "shutting down");
                dropped.push(chan);
            }
        }
        dropped
    }

    /// Whether a deadline may have moved earlier (a launch, an extension,
    /// a CREATE2 or EXTEND2 sent) since the last call: a driver that
    /// sleeps until [`ClientNode::poll_timeout`] asks again then. Cheap,
    /// unlike `poll_timeout`, which looks at every circuit.
    pub fn take_deadline_changed(&mut self) -> bool {
        std::mem::take(&mut self.deadline_changed)
    }

    /// When [`ClientNode::handle_timeout`] must next be called (the
    /// earliest build or hop deadline; O(circuits)).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.circuits
            .values()
            .filter(|c| !c.closed)
            .flat_map(|c| [c.build_deadline, c.circ.poll_timeout()])
            .flatten()
            .min()
    }

    /// Let time pass: builds past the build timeout, and hops that did not
    /// answer in time, close their circuits.
    pub fn handle_timeout(&mut self, now: Instant) {
        let keys: Vec<CircKey> = self.circuits.keys().copied().collect();
        for key in keys {
            let Some(c) = self.circuits.get_mut(&key) else {
                continue;
            };
            if c.is_building() && c.build_deadline.is_some_and(|d| now >= d) {
                c.timed_out = true;
                c.circ.destroy();
            } else if c.circ.poll_timeout().is_some_and(|d| now >= d) {
                c.circ.handle_timeout(now);
            } else {
                continue;
            }
            self.touch(now, key, true);
        }
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<ClientNodeEvent> {
        self.events.pop_front()
    }

    /// Circuit `circ`, to look at.
    pub fn circuit(&self, circ: CircKey) -> Option<&ClientCircuit> {
        self.circuits.get(&circ).map(|c| &c.circ)
    }

    /// Whether circuit `circ` has every hop of its path and is not closed
    /// (a set: every leg is linked, and it is not closed).
    pub fn is_built(&self, circ: CircKey) -> bool {
        if let Some(s) = self.sets.get(&circ) {
            return s.built;
        }
        self.circuits
            .get(&circ)
            .is_some_and(|c| !c.closed && c.build_deadline.is_none())
    }

    /// Messages set `set` holds behind a gap (None: no such set).
    pub fn set_out_of_order_len(&self, set: CircKey) -> Option<usize> {
        self.sets.get(&set).map(|s| s.core.out_of_order_len())
    }

    /// The channel circuit `circ` runs on.
    pub fn channel_of(&self, circ: CircKey) -> Option<ChannelId> {
        self.circuits.get(&circ).map(|c| c.chan)
    }

    /// Circuits the node holds (closed ones until their DESTROY is out).
    pub fn n_circuits(&self) -> usize {
        self.circuits.len()
    }

    /// Circuit `circ` if it is not closed.
    fn live(&mut self, circ: CircKey) -> Result<&mut Circ, Error> {
        self.circuits
            .get_mut(&circ)
            .filter(|c| !c.closed)
            .ok_or(Error::Closed)
    }

    /// After anything happened to circuit `key`: act on its events (extend
    /// to the next hop, note failures) and pass them on, put it in its
    /// channel's scheduler if it has cells (unless `activate` is false:
    /// after a transmit that gave nothing), and forget it once it is closed
    /// with nothing left to send.
    fn touch(&mut self, now: Instant, key: CircKey, activate: bool) {
        let Some(c) = self.circuits.get_mut(&key) else {
            return;
        };
        let set = c.set;
        let mut leg_events = Vec::new();
        while let Some(event) = c.circ.poll_event() {
            if set.is_some() {
                if let ClientEvent::Closed(_) = event {
                    c.closed = true;
                }
                leg_events.push(event);
                continue;
            }
            match event {
                ClientEvent::HopAdded { hops } => {
                    self.events.push_back(ClientNodeEvent::Circuit {
                        circ: key,
                        event: ClientEvent::HopAdded { hops },
                    });
                    if hops < c.path.len() {
                        c.extend_to_next();
                    } else if c.is_building() {
                        c.build_deadline = None;
                        self.events.push_back(ClientNodeEvent::Built {
                            circ: key,
                            elapsed: now.saturating_duration_since(c.started),
                        });
                    }
                }
                ClientEvent::HopFailed { hop, detail } => {
                    let name = c.path.get(hop).map_or("?", |h| h.name.as_str());
                    c.failure
                        .get_or_insert_with(|| format!("relay {name} failed: {detail}"));
                    self.events.push_back(ClientNodeEvent::Circuit {
                        circ: key,
                        event: ClientEvent::HopFailed { hop, detail },
                    });
                }
                ClientEvent::Closed(reason) => {
                    let build_failure = c.is_building().then(|| {
                        if c.timed_out {
                            BuildFailure::Timeout
                        } else {
                            BuildFailure::Failed(
                                c.failure.clone().unwrap_or_else(|| reason.to_string()),
                            )
                        }
                    });
                    c.closed = true;
                    self.events.push_back(ClientNodeEvent::Closed {
                        circ: key,
                        reason,
                        build_failure,
                        detail: c.failure.clone(),
                    });
                }
                event => self
                    .events
                    .push_back(ClientNodeEvent::Circuit { circ: key, event }),
            }
        }
        let wants = c.circ.wants_transmit();
        let ch = self.channels.get_mut(&c.chan);
        let chan_alive = ch.is_some();
        if let Some(ch) = ch {
            if wants && activate {
                ch.scheduler.activate(key, now);
                self.ready.insert(c.chan);
            }
        }
        if c.closed && !(wants && chan_alive) {
            let (chan, circ_id) = (c.chan, c.circ_id);
            self.circuits.remove(&key);
            if let Some(ch) = self.channels.get_mut(&chan) {
                if ch.circuits.get(&circ_id) == Some(&key) {
                    ch.circuits.remove(&circ_id);
                }
                ch.scheduler.remove(key);
            }
        }
        if let Some(set) = set {
            if !leg_events.is_empty() {
                self.on_leg_events(now, key, set, leg_events);
            }
            self.pump_set(now, set);
        }
    }
}

//! A relay's datagram circuits (`docs/datagram.md` section 5), sans-IO:
//! fed the cells its datagram links deliver, link changes and time; it
//! returns cells to send, links to open, and (at an exit) what the client
//! sent to it.
//!
//! A relay forwards a cell at once, without a circuit queue: a cell that
//! is not its own goes to the next hop as soon as its layer is off, and a
//! full link drops it (the driver's business). Nothing is resent here: the
//! client resends its CREATE2 and EXTEND2, and a repeated one with the
//! same handshake gets the cached answer (or makes this relay send its
//! CREATE2 again). Circuits are forgotten after a while without cells, so
//! a lost DESTROY costs bounded state for a bounded time.

use std::collections::{hash_map, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_crypto::dgram::{HopKeys, Inbound, RelayLayer, SealedCell};
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_crypto::ntor::{CLIENT_HANDSHAKE_LEN, SERVER_HANDSHAKE_LEN};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tor_llcrypto::pk::ed25519::Ed25519Identity;

use crate::wire::{DgramCell, Extend2, RelayCommand, RelayMsg, CELL_LEN};
use crate::{CircuitId, Error, LinkId};

/// tor-spec's DESTROY reasons used here.
const REASON_PROTOCOL: u8 = 1;
const REASON_RESOURCELIMIT: u8 = 5;
const REASON_CONNECTFAILED: u8 = 6;
const REASON_FINISHED: u8 = 9;
const REASON_DESTROYED: u8 = 11;

/// Longest time between two looks at every circuit's timers.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// How a relay runs its datagram circuits.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// Circuits at most (a CREATE2 beyond is refused with DESTROY).
    pub max_circuits: usize,
    /// A circuit without a cell for this long is forgotten.
    pub idle_timeout: Duration,
    /// An extension not answered in this long ends the circuit.
    pub extend_timeout: Duration,
    /// Copies of each DESTROY sent (they may be lost).
    pub destroy_copies: usize,
    /// Whether the client may send end-to-end segments to us.
    pub exit: bool,
}

impl Default for RelaySettings {
    fn default() -> Self {
        RelaySettings {
            max_circuits: 8192,
            idle_timeout: Duration::from_secs(60),
            extend_timeout: Duration::from_secs(10),
            destroy_copies: 3,
            exit: false,
        }
    }
}

/// What the relay asks of its driver, or tells it.
#[derive(Debug)]
pub enum RelayOutput {
    /// Send this cell on this link.
    Transmit(LinkId, Box<[u8; CELL_LEN]>),
    /// Open a link to this relay, then call
    /// [`DgramRelay::link_up`] or [`DgramRelay::link_failed`] (always one:
    /// no other Connect to that relay is asked for until then).
    Connect {
        /// Where it listens.
        addr: SocketAddr,
        /// Who it must prove to be.
        identity: Ed25519Identity,
    },
    /// (Exits) a message the client sent us on a circuit.
    Delivered {
        /// The circuit.
        circuit: CircuitId,
        /// The message.
        msg: RelayMsg,
    },
    /// (Exits) a circuit ended.
    Closed(CircuitId),
}

/// Counters, since the relay started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Cells that did not parse, dropped.
    pub malformed: u64,
    /// Cells for no circuit we know, dropped.
    pub unknown_circuit: u64,
    /// Cells of ours refused as replays.
    pub replays: u64,
    /// Circuits ended because a cell passed their last hop unopened, or a
    /// message broke the protocol.
    pub violations: u64,
    /// CREATE2 refused for `max_circuits`.
    pub refused: u64,
    /// Circuits forgotten after `idle_timeout`.
    pub idle_forgotten: u64,
    /// (Exits) circuits of sets ended because the relay was over its
    /// memory cap.
    pub out_of_memory: u64,
}

/// Where a circuit's next hop stands.
#[derive(Debug)]
enum Next {
    /// Not extended.
    None,
    /// Waiting for a link to the next hop.
    Waiting { extend: Extend2, since: Instant },
    /// CREATE2 sent on `link` as `circ_id`.
    Creating {
        link: LinkId,
        circ_id: u32,
        extend: Extend2,
        since: Instant,
    },
    /// Extended; the reply is kept for a repeated EXTEND2.
    Open {
        link: LinkId,
        circ_id: u32,
        handshake: [u8; CLIENT_HANDSHAKE_LEN],
        reply: [u8; SERVER_HANDSHAKE_LEN],
    },
}

struct Circuit {
    prev: (LinkId, u32),
    next: Next,
    layer: RelayLayer,
    /// The CREATE2 that made it, and our answer (for a repeated CREATE2).
    create: [u8; CLIENT_HANDSHAKE_LEN],
    created: [u8; SERVER_HANDSHAKE_LEN],
    last_active: Instant,
}

/// What a repeated EXTEND2 gets.
enum Repeat {
    /// The EXTENDED2 again.
    Extended([u8; SERVER_HANDSHAKE_LEN]),
    /// Our CREATE2 again, on this link as this circuit ID.
    Create(LinkId, u32),
    /// Nothing: the link to the next hop is still opening.
    Nothing,
    /// Not a repeat: the circuit was extended to elsewhere.
    Violation,
}

/// Which end of a circuit a (link, circuit ID) pair is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Prev,
    Next,
}

/// A link the driver reported up.
#[derive(Debug, Clone, Copy)]
struct LinkInfo {
    /// The peer relay's identity (`None`: a client).
    identity: Option<Ed25519Identity>,
    /// Where it listens, for links we opened or reuse to reach it.
    addr: Option<SocketAddr>,
    /// Whether we opened it: our circuit IDs on it have the high bit set.
    initiated: bool,
}

/// A relay's datagram circuits (see the module docs).
pub struct DgramRelay {
    keys: Arc<RelaySecretKeys>,
    settings: RelaySettings,
    rng: StdRng,
    links: HashMap<LinkId, LinkInfo>,
    /// Links we opened, by the relay they reach.
    to: HashMap<(SocketAddr, Ed25519Identity), LinkId>,
    /// Links asked of the driver and not reported yet.
    connecting: HashMap<(SocketAddr, Ed25519Identity), Vec<CircuitId>>,
    ends: HashMap<(LinkId, u32), (CircuitId, End)>,
    circuits: HashMap<CircuitId, Circuit>,
    next_circuit: u64,
    out: VecDeque<RelayOutput>,
    stats: RelayStats,
    /// When the timers next look at every circuit (`None`: no circuits).
    next_sweep: Option<Instant>,
}

impl std::fmt::Debug for DgramRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DgramRelay")
            .field("circuits", &self.circuits.len())
            .field("links", &self.links.len())
            .finish_non_exhaustive()
    }
}

impl DgramRelay {
    /// A relay with these keys and settings; `seed` seeds its circuit IDs
    /// and handshakes' randomness is the OS's.
    pub fn new(keys: Arc<RelaySecretKeys>, settings: RelaySettings, seed: u64) -> Self {
        DgramRelay {
            keys,
            settings,
            rng: StdRng::seed_from_u64(seed),
            links: HashMap::new(),
            to: HashMap::new(),
            connecting: HashMap::new(),
            ends: HashMap::new(),
            circuits: HashMap::new(),
            next_circuit: 1,
            out: VecDeque::new(),
            stats: RelayStats::default(),
            next_sweep: None,
        }
    }

    /// How often the timers look at every circuit: a circuit's timeouts
    /// are kept to within this, and waking up costs nothing per cell.
    fn sweep_interval(&self) -> Duration {
        (self.settings.idle_timeout.min(self.settings.extend_timeout) / 4)
            .clamp(Duration::from_millis(1), SWEEP_INTERVAL)
    }

    /// What the relay asks or tells next.
    pub fn poll_output(&mut self) -> Option<RelayOutput> {
        self.out.pop_front()
    }

    /// Counters.
    pub fn stats(&self) -> RelayStats {
        self.stats
    }

    /// Circuits held.
    pub fn circuits(&self) -> usize {
        self.circuits.len()
    }

    /// Bytes its circuits hold, about: each circuit's state (keys, replay
    /// windows, its CREATE2 and answer) and its ends' entries, as laid out
    /// in memory (all inline). What a relay's memory cap counts.
    pub fn held_bytes(&self) -> usize {
        let per_circuit = std::mem::size_of::<(CircuitId, Circuit)>()
            + 2 * std::mem::size_of::<((LinkId, u32), (CircuitId, End))>();
        self.circuits.len() * per_circuit
    }

    /// Links that carry a circuit now (the others may be closed when
    /// idle for long).
    pub fn links_in_use(&self) -> std::collections::HashSet<LinkId> {
        self.ends.keys().map(|(link, _)| *link).collect()
    }

    /// A link is up: a peer's (`addr` `None`) or one we asked for with
    /// [`RelayOutput::Connect`].
    pub fn link_up(
        &mut self,
        now: Instant,
        link: LinkId,
        identity: Option<Ed25519Identity>,
        addr: Option<SocketAddr>,
    ) {
        let initiated = addr.is_some();
        self.links.insert(
            link,
            LinkInfo {
                identity,
                addr,
                initiated,
            },
        );
        let (Some(addr), Some(identity)) = (addr, identity) else {
            return;
        };
        self.to.insert((addr, identity), link);
        for id in self
            .connecting
            .remove(&(addr, identity))
            .unwrap_or_default()
        {
            self.send_create(now, id, link);
        }
    }

    /// `link`, which the relay `identity` opened to us, is also the way
    /// to it at `addr` (its advertised address, asked for with
    /// [`RelayOutput::Connect`]): extensions to it go over that link
    /// instead of a second one. Its circuit IDs stay the peer's rule (it
    /// opened the link). Nothing happens if the link's peer is not
    /// `identity`.
    pub fn link_known(
        &mut self,
        now: Instant,
        link: LinkId,
        addr: SocketAddr,
        identity: Ed25519Identity,
    ) {
        match self.links.get_mut(&link) {
            Some(info) if info.identity == Some(identity) => info.addr = Some(addr),
            _ => return self.link_failed(addr, identity),
        }
        self.to.insert((addr, identity), link);
        for id in self
            .connecting
            .remove(&(addr, identity))
            .unwrap_or_default()
        {
            self.send_create(now, id, link);
        }
    }

    /// A link we asked for could not be opened: the circuits waiting for
    /// it end.
    pub fn link_failed(&mut self, addr: SocketAddr, identity: Ed25519Identity) {
        for id in self
            .connecting
            .remove(&(addr, identity))
            .unwrap_or_default()
        {
            self.destroy(id, REASON_CONNECTFAILED);
        }
    }

    /// A link is gone: every circuit with an end on it ends.
    pub fn link_down(&mut self, link: LinkId) {
        if let Some(info) = self.links.remove(&link) {
            if let (Some(addr), Some(identity)) = (info.addr, info.identity) {
                self.to.remove(&(addr, identity));
            }
        }
        let ids: Vec<CircuitId> = self
            .ends
            .iter()
            .filter(|((l, _), _)| *l == link)
            .map(|(_, (id, _))| *id)
            .collect();
        for id in ids {
            self.destroy(id, REASON_DESTROYED);
        }
    }

    /// A cell from `link`.
    pub fn handle_cell(&mut self, now: Instant, link: LinkId, bytes: &[u8]) {
        if !self.links.contains_key(&link) {
            self.stats.unknown_circuit += 1;
            return;
        }
        let cell = match DgramCell::parse(bytes) {
            Ok(c) => c,
            Err(_) => {
                self.stats.malformed += 1;
                return;
            }
        };
        match cell {
            DgramCell::Create2 { circ_id, handshake } => {
                self.on_create(now, link, circ_id, &handshake)
            }
            DgramCell::Created2 { circ_id, reply } => self.on_created(now, link, circ_id, reply),
            DgramCell::Relay { circ_id, cell } => self.on_relay(now, link, circ_id, *cell),
            // Passed on with its reason, so that the client learns why
            // (tor tells it in TRUNCATED).
            DgramCell::Destroy { circ_id, reason } => match self.ends.get(&(link, circ_id)) {
                Some(&(id, _)) => self.destroy_from(id, link, reason),
                None => self.stats.unknown_circuit += 1,
            },
        }
    }

    /// (Exits) send `msg` to the client on `circuit`.
    ///
    /// # Errors
    ///
    /// [`Error::NoCircuit`] for a circuit that ended; the message's or the
    /// crypto's error.
    pub fn send_to_client(&mut self, circuit: CircuitId, msg: &RelayMsg) -> Result<(), Error> {
        let c = self
            .circuits
            .get_mut(&circuit)
            .ok_or(Error::NoCircuit(circuit))?;
        let sealed = c.layer.seal(&msg.encode()?)?;
        let (link, circ_id) = c.prev;
        self.transmit(
            link,
            DgramCell::Relay {
                circ_id,
                cell: Box::new(sealed),
            },
        );
        Ok(())
    }

    /// (Exits) end `circuit` because what the client sent on it broke the
    /// end-to-end protocol: DESTROY with PROTOCOL both ways.
    pub fn refuse(&mut self, circuit: CircuitId) {
        if self.circuits.contains_key(&circuit) {
            self.violation(circuit);
        }
    }

    /// End `circuit` (the exit's, of a set ended because the relay was
    /// over its memory cap): DESTROY with reason RESOURCELIMIT both ways.
    pub fn end_for_memory(&mut self, circuit: CircuitId) {
        if self.circuits.contains_key(&circuit) {
            self.stats.out_of_memory += 1;
            self.destroy(circuit, REASON_RESOURCELIMIT);
        }
    }

    /// Run the timers: idle circuits are forgotten, slow extensions end
    /// (looked at once a second at most, so a timeout fires up to that
    /// late).
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.next_sweep.is_none_or(|t| now < t) {
            return;
        }
        let mut idle = Vec::new();
        let mut slow = Vec::new();
        for (&id, c) in &self.circuits {
            if now.saturating_duration_since(c.last_active) >= self.settings.idle_timeout {
                idle.push(id);
            } else if let Next::Waiting { since, .. } | Next::Creating { since, .. } = c.next {
                if now.saturating_duration_since(since) >= self.settings.extend_timeout {
                    slow.push(id);
                }
            }
        }
        for id in idle {
            self.stats.idle_forgotten += 1;
            self.destroy(id, REASON_FINISHED);
        }
        for id in slow {
            self.destroy(id, REASON_CONNECTFAILED);
        }
        self.next_sweep = (!self.circuits.is_empty()).then(|| now + self.sweep_interval());
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next run
    /// (`None` while the relay holds no circuit).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_sweep
    }

    fn on_create(
        &mut self,
        now: Instant,
        link: LinkId,
        circ_id: u32,
        handshake: &[u8; CLIENT_HANDSHAKE_LEN],
    ) {
        if let Some(&(id, end)) = self.ends.get(&(link, circ_id)) {
            // A repeated CREATE2 (our CREATED2 was lost): the same answer.
            let repeat = self
                .circuits
                .get(&id)
                .filter(|c| end == End::Prev && &c.create == handshake)
                .map(|c| c.created);
            match repeat {
                Some(reply) => self.transmit(link, DgramCell::Created2 { circ_id, reply }),
                None => self.stats.violations += 1,
            }
            return;
        }
        let ours_high = self.links.get(&link).is_some_and(|l| l.initiated);
        if (circ_id & 0x8000_0000 != 0) == ours_high {
            // The peer used an ID from our half.
            self.stats.violations += 1;
            return;
        }
        if self.circuits.len() >= self.settings.max_circuits {
            self.stats.refused += 1;
            self.send_destroy(link, circ_id, REASON_RESOURCELIMIT);
            return;
        }
        let Ok((reply, keys)) = self
            .keys
            .ntor_server_handshake_as::<HopKeys, _>(&mut rand::rng(), handshake)
        else {
            self.stats.violations += 1;
            self.send_destroy(link, circ_id, REASON_PROTOCOL);
            return;
        };
        let id = CircuitId(self.next_circuit);
        self.next_circuit += 1;
        self.circuits.insert(
            id,
            Circuit {
                prev: (link, circ_id),
                next: Next::None,
                layer: RelayLayer::new(keys),
                create: *handshake,
                created: reply,
                last_active: now,
            },
        );
        self.ends.insert((link, circ_id), (id, End::Prev));
        if self.next_sweep.is_none() {
            self.next_sweep = Some(now + self.sweep_interval());
        }
        self.transmit(link, DgramCell::Created2 { circ_id, reply });
    }

    fn on_created(
        &mut self,
        now: Instant,
        link: LinkId,
        circ_id: u32,
        reply: [u8; SERVER_HANDSHAKE_LEN],
    ) {
        let Some(&(id, End::Next)) = self.ends.get(&(link, circ_id)) else {
            self.stats.unknown_circuit += 1;
            return;
        };
        let Some(c) = self.circuits.get_mut(&id) else {
            return;
        };
        let handshake = match &c.next {
            Next::Creating { extend, .. } => extend.handshake,
            // A repeated CREATED2: the EXTENDED2 went already.
            _ => return,
        };
        c.next = Next::Open {
            link,
            circ_id,
            handshake,
            reply,
        };
        c.last_active = now;
        self.send_extended(id, reply);
    }

    fn on_relay(&mut self, now: Instant, link: LinkId, circ_id: u32, cell: SealedCell) {
        let Some(&(id, end)) = self.ends.get(&(link, circ_id)) else {
            self.stats.unknown_circuit += 1;
            return;
        };
        let Some(c) = self.circuits.get_mut(&id) else {
            return;
        };
        c.last_active = now;
        if end == End::Next {
            let cell = c.layer.outbound(cell);
            let (link, circ_id) = c.prev;
            return self.transmit(
                link,
                DgramCell::Relay {
                    circ_id,
                    cell: Box::new(cell),
                },
            );
        }
        let inbound = c.layer.inbound(cell);
        let next = match c.next {
            Next::Open { link, circ_id, .. } => Some((link, circ_id)),
            _ => None,
        };
        match (inbound, next) {
            (Ok(Inbound::Ours { plaintext, .. }), _) => match RelayMsg::parse(&plaintext) {
                Ok(msg) => self.on_msg(now, id, msg),
                Err(_) => self.violation(id),
            },
            (Ok(Inbound::Forward(cell)), Some((link, circ_id))) => self.transmit(
                link,
                DgramCell::Relay {
                    circ_id,
                    cell: Box::new(cell),
                },
            ),
            // Past the last hop and nobody's: someone on the path changed
            // it or made it up.
            (Ok(Inbound::Forward(_)), None) => self.violation(id),
            (Err(_), _) => self.stats.replays += 1,
        }
    }

    fn on_msg(&mut self, now: Instant, id: CircuitId, msg: RelayMsg) {
        match msg.command {
            RelayCommand::Extend2 => match Extend2::parse(&msg.data) {
                Ok(extend) => self.on_extend(now, id, extend),
                Err(_) => self.violation(id),
            },
            RelayCommand::Segment | RelayCommand::Link if self.settings.exit => {
                self.out
                    .push_back(RelayOutput::Delivered { circuit: id, msg });
            }
            _ => self.violation(id),
        }
    }

    fn on_extend(&mut self, now: Instant, id: CircuitId, extend: Extend2) {
        if extend.identity == self.keys.public().ed_identity {
            return self.violation(id);
        }
        let Some(c) = self.circuits.get_mut(&id) else {
            return;
        };
        // A repeated EXTEND2 (our answer or our CREATE2 was lost) gets the
        // same again; a different one on an extended circuit is refused.
        let repeat = match &c.next {
            Next::None => None,
            Next::Open {
                handshake, reply, ..
            } if *handshake == extend.handshake => Some(Repeat::Extended(*reply)),
            Next::Creating {
                extend: e,
                link,
                circ_id,
                ..
            } if e.handshake == extend.handshake => Some(Repeat::Create(*link, *circ_id)),
            Next::Waiting { extend: e, .. } if e.handshake == extend.handshake => {
                Some(Repeat::Nothing)
            }
            _ => Some(Repeat::Violation),
        };
        match repeat {
            None => {}
            Some(Repeat::Extended(reply)) => return self.send_extended(id, reply),
            Some(Repeat::Create(link, circ_id)) => {
                let handshake = extend.handshake;
                return self.transmit(link, DgramCell::Create2 { circ_id, handshake });
            }
            Some(Repeat::Nothing) => return,
            Some(Repeat::Violation) => return self.violation(id),
        }
        let key = (extend.addr, extend.identity);
        c.next = Next::Waiting { extend, since: now };
        if let Some(&link) = self.to.get(&key) {
            return self.send_create(now, id, link);
        }
        // One Connect per relay until the driver answers it (the entry
        // stays, even emptied by circuits that ended meanwhile).
        match self.connecting.entry(key) {
            hash_map::Entry::Occupied(mut waiting) => waiting.get_mut().push(id),
            hash_map::Entry::Vacant(slot) => {
                slot.insert(vec![id]);
                self.out.push_back(RelayOutput::Connect {
                    addr: key.0,
                    identity: key.1,
                });
            }
        }
    }

    /// Send a waiting circuit's CREATE2 on `link` under a fresh ID.
    fn send_create(&mut self, now: Instant, id: CircuitId, link: LinkId) {
        let high = self.links.get(&link).is_some_and(|l| l.initiated);
        let circ_id = loop {
            let r: u32 = self.rng.random::<u32>() & 0x7fff_ffff;
            let c = if high { r | 0x8000_0000 } else { r };
            if c != 0 && !self.ends.contains_key(&(link, c)) {
                break c;
            }
        };
        let Some(c) = self
            .circuits
            .get_mut(&id)
            .filter(|c| matches!(c.next, Next::Waiting { .. }))
        else {
            return;
        };
        let Next::Waiting { extend, .. } = std::mem::replace(&mut c.next, Next::None) else {
            return;
        };
        let handshake = extend.handshake;
        c.next = Next::Creating {
            link,
            circ_id,
            extend,
            since: now,
        };
        self.ends.insert((link, circ_id), (id, End::Next));
        self.transmit(link, DgramCell::Create2 { circ_id, handshake });
    }

    fn send_extended(&mut self, id: CircuitId, reply: [u8; SERVER_HANDSHAKE_LEN]) {
        let msg = RelayMsg {
            command: RelayCommand::Extended2,
            data: reply.to_vec(),
        };
        // A 64-byte message always encodes, and a circuit's counters last.
        if self.send_to_client(id, &msg).is_err() {
            self.destroy(id, REASON_PROTOCOL);
        }
    }

    fn violation(&mut self, id: CircuitId) {
        self.stats.violations += 1;
        self.destroy(id, REASON_PROTOCOL);
    }

    /// End a circuit, telling both sides.
    fn destroy(&mut self, id: CircuitId, reason: u8) {
        self.end_circuit(id, None, reason);
    }

    /// End a circuit the side on `from` destroyed, telling the other.
    fn destroy_from(&mut self, id: CircuitId, from: LinkId, reason: u8) {
        self.end_circuit(id, Some(from), reason);
    }

    fn end_circuit(&mut self, id: CircuitId, from: Option<LinkId>, reason: u8) {
        let Some(c) = self.circuits.remove(&id) else {
            return;
        };
        let mut ends = vec![c.prev];
        match c.next {
            Next::Creating { link, circ_id, .. } | Next::Open { link, circ_id, .. } => {
                ends.push((link, circ_id));
            }
            Next::Waiting { extend, .. } => {
                if let Some(w) = self.connecting.get_mut(&(extend.addr, extend.identity)) {
                    w.retain(|&w| w != id);
                }
            }
            Next::None => {}
        }
        for (link, circ_id) in ends {
            self.ends.remove(&(link, circ_id));
            if Some(link) != from && self.links.contains_key(&link) {
                self.send_destroy(link, circ_id, reason);
            }
        }
        if self.settings.exit {
            self.out.push_back(RelayOutput::Closed(id));
        }
    }

    fn send_destroy(&mut self, link: LinkId, circ_id: u32, reason: u8) {
        for _ in 0..self.settings.destroy_copies.max(1) {
            self.transmit(link, DgramCell::Destroy { circ_id, reason });
        }
    }

    fn transmit(&mut self, link: LinkId, cell: DgramCell) {
        self.out
            .push_back(RelayOutput::Transmit(link, Box::new(cell.encode())));
    }
}

//! A simulated network of whole clients: relays listed in a network
//! document, each a [`RelayNode`], and clients, each a [`ClientCore`] (the
//! onion proxy's real decisions: paths, circuit reuse, failed-relay
//! avoidance, build and stream retries, timeouts), joined by ordered
//! links with random delays and stalls. Relays die and come back; exits
//! serve every stream a response of a fixed length and close it, so a
//! test tells a complete transfer from a broken one.
//!
//! Unlike [`Net`](crate::Net) the clients choose their own paths from the
//! document, as the SOCKS client does: tests drive them with stream
//! requests only.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_cell::chan::{AnyChanCell, DestroyReason};
use onionlab_cell::msg::{EndReason, LinkSpec, StreamId};
use onionlab_circuit::node::{ChannelId, ChannelPeer, CircKey, NodeConfig, NodeEvent, RelayNode};
use onionlab_circuit::relay::RelayConfig;
use onionlab_client_core::path::Target;
use onionlab_client_core::{
    ClientCore, Config, CoreEvent, IsolationKey, PolicySettings, ReadResult, RequestId,
    StreamFailure, StreamRef, StreamView,
};
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_netdoc::doc::{TransportAddress, TRANSPORT_TLS};
use onionlab_netdoc::{ExitPolicy, NetworkDocument, RelayEntry};
use rand::rngs::StdRng;
use rand::{Rng, RngExt, SeedableRng};

/// One end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Peer {
    /// Client number `k`.
    Client(usize),
    /// Relay number `i` (its index in the document).
    Relay(usize),
}

/// A channel's connection: each end's own channel ID and the cells in
/// flight each way, with their delivery times.
struct Conn {
    ends: [(Peer, ChannelId); 2],
    in_flight: [VecDeque<(Duration, AnyChanCell)>; 2],
    last_delivery: [Duration; 2],
}

/// A relay: its keys' seed (a restarted relay has the same identity),
/// its node while it runs, and the streams its exit serves.
struct SimRelay {
    key_seed: u64,
    exit: bool,
    node: Option<RelayNode>,
    /// Ticks it held at least one circuit.
    busy_ticks: u64,
    /// An exit that leaves BEGINs unanswered (from when it is set).
    silent: bool,
    /// BEGINs it left unanswered.
    unanswered: u64,
    /// Connections tried to it while it was dead.
    refused: u64,
    /// Exit streams, the length of their response and the bytes of it
    /// written.
    serving: Vec<(CircKey, StreamId, usize, usize)>,
}

/// How a transfer ended, as its application would see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// No answer yet, or bytes still coming.
    Running,
    /// Every byte of the response arrived, in order, then END DONE.
    Complete,
    /// END DONE came before every byte of the response: the application
    /// would see a clean end of a short transfer. Never expected.
    Truncated,
    /// Bytes arrived that are not the response's (or more than it).
    /// Never expected.
    Corrupt,
    /// The stream connected, then failed (its circuit closed, or the exit
    /// ended it with another reason): the application would see a reset.
    Broken(String),
    /// The stream never connected.
    Failed(StreamFailure),
}

/// One stream request of a client and what became of it.
#[derive(Debug, Clone)]
pub struct Transfer {
    /// Its stream, once connected.
    pub stream: Option<StreamRef>,
    /// Bytes of the response received so far.
    pub received: usize,
    /// Bytes of the response expected (the network's
    /// [`response_len`](Network::response_len) when it was requested).
    pub expected: usize,
    /// When it was requested and when it got its outcome (simulated).
    pub requested_at: Duration,
    /// See `requested_at`.
    pub ended_at: Option<Duration>,
    /// Where it is.
    pub outcome: Outcome,
}

/// The network: relays, clients, connections, simulated time.
pub struct Network {
    rng: StdRng,
    base: Instant,
    /// Simulated time since the start.
    pub now: Duration,
    /// The document every client started with.
    pub doc: Arc<NetworkDocument>,
    relays: Vec<SimRelay>,
    /// The clients.
    pub clients: Vec<ClientCore>,
    /// Each client's transfers, by request.
    pub transfers: Vec<BTreeMap<RequestId, Transfer>>,
    conns: BTreeMap<u64, Conn>,
    /// Where each end's channel is: (connection, side).
    by_end: HashMap<(Peer, ChannelId), (u64, usize)>,
    next_conn: u64,
    /// Relay-side channel IDs (clients number their own).
    next_chan: ChannelId,
    /// Bytes of each exit's response (as the exit gets the stream's
    /// BEGIN: change it only while no request is waiting).
    pub response_len: usize,
    /// Largest one-way delay of a cell, on top of 1 ms.
    pub max_delay: Duration,
    /// Probability per cell, and length, of a stall (a loss repaired by
    /// TCP, as it looks from above: the cell and every later one on its
    /// connection arrive late).
    pub stall: Option<(f64, Duration)>,
    /// Cells a node writes on one channel per tick, at most.
    pub burst: usize,
}

/// Length of one tick of simulated time.
const TICK: Duration = Duration::from_micros(250);

/// The exits' response bytes: byte `i` of every response.
pub fn response_byte(i: usize) -> u8 {
    (i % 251) as u8
}

impl Network {
    /// `guards` guards, `middles` middles and `exits` exits (accepting
    /// every target), named `relay0`... in that order, and `clients`
    /// clients with the policy `policy` gives over the document (its
    /// `network` is replaced). Everything random follows `seed`.
    pub fn new(
        seed: u64,
        (guards, middles, exits): (usize, usize, usize),
        clients: usize,
        policy: impl Fn(PolicySettings) -> PolicySettings,
    ) -> Network {
        let mut rng = StdRng::seed_from_u64(seed);
        let n = guards + middles + exits;
        let mut relays = Vec::with_capacity(n);
        let mut entries = Vec::with_capacity(n);
        for i in 0..n {
            let key_seed = rng.next_u64();
            let keys = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(key_seed));
            let mut entry = RelayEntry::new(format!("relay{i}"), &keys.public());
            entry.addresses.push(TransportAddress {
                transport: TRANSPORT_TLS.into(),
                addr: format!("127.0.0.1:{}", 9000 + i).parse().expect("address"),
            });
            entry.flags.guard = i < guards;
            entry.flags.exit = i >= guards + middles;
            let policy = if entry.flags.exit {
                "accept *:*"
            } else {
                "reject *:*"
            };
            entry.exit_policy = ExitPolicy::parse(policy).expect("policy");
            let exit = entry.flags.exit;
            entries.push(entry);
            let mut relay = SimRelay {
                key_seed,
                exit,
                node: None,
                busy_ticks: 0,
                silent: false,
                unanswered: 0,
                refused: 0,
                serving: Vec::new(),
            };
            relay.node = Some(start_relay(&relay, rng.next_u64()));
            relays.push(relay);
        }
        let doc = Arc::new(NetworkDocument {
            network_name: "sim".into(),
            created_unix: 0,
            valid_after_unix: 0,
            valid_until_unix: 86_400,
            params: Default::default(),
            relays: entries,
        });
        let clients: Vec<ClientCore> = (0..clients)
            .map(|_| {
                let mut settings = policy(PolicySettings::new(doc.clone()));
                settings.network = doc.clone();
                settings.path_seed.get_or_insert(rng.next_u64());
                let node_rng = StdRng::seed_from_u64(rng.next_u64());
                ClientCore::with_node_rng(
                    Config::new(settings).expect("the policy resolves"),
                    node_rng,
                )
            })
            .collect();
        Network {
            rng,
            base: Instant::now(),
            now: Duration::ZERO,
            doc,
            relays,
            transfers: vec![BTreeMap::new(); clients.len()],
            clients,
            conns: BTreeMap::new(),
            by_end: HashMap::new(),
            next_conn: 1,
            next_chan: 1,
            response_len: 64 * 1024,
            max_delay: Duration::from_millis(4),
            stall: None,
            burst: 8,
        }
    }

    /// The simulated now as an `Instant`.
    pub fn instant(&self) -> Instant {
        self.base + self.now
    }

    /// Client `k` asks for a stream to `target`; the exit serves it
    /// [`response_len`](Self::response_len) bytes and closes it.
    pub fn request(&mut self, k: usize, target: Target) -> RequestId {
        let now = self.instant();
        let id = self.clients[k].open_stream(now, target, IsolationKey::None);
        self.transfers[k].insert(
            id,
            Transfer {
                stream: None,
                received: 0,
                expected: self.response_len,
                requested_at: self.now,
                ended_at: None,
                outcome: Outcome::Running,
            },
        );
        self.handle_client_events(k);
        id
    }

    /// Whether relay `i` runs.
    pub fn is_alive(&self, i: usize) -> bool {
        self.relays[i].node.is_some()
    }

    /// Circuits relay `i` holds now (0 if it is dead).
    pub fn relay_circuits(&self, i: usize) -> usize {
        self.relays[i]
            .node
            .as_ref()
            .map_or(0, RelayNode::n_circuits)
    }

    /// Ticks relay `i` held at least one circuit (since the start).
    pub fn relay_busy_ticks(&self, i: usize) -> u64 {
        self.relays[i].busy_ticks
    }

    /// Exit `i` leaves the BEGINs it gets from now on unanswered (`true`),
    /// or answers them again.
    pub fn set_silent(&mut self, i: usize, silent: bool) {
        self.relays[i].silent = silent;
    }

    /// BEGINs exit `i` left unanswered.
    pub fn relay_unanswered(&self, i: usize) -> u64 {
        self.relays[i].unanswered
    }

    /// Connections clients and relays tried to relay `i` while it was
    /// dead.
    pub fn relay_refused(&self, i: usize) -> u64 {
        self.relays[i].refused
    }

    /// Relay `i` dies: its connections break (each peer sees its channel
    /// close), the cells in flight on them are lost.
    pub fn kill_relay(&mut self, i: usize) {
        self.relays[i].node = None;
        self.relays[i].serving.clear();
        let now = self.instant();
        let broken: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.ends.iter().any(|(p, _)| *p == Peer::Relay(i)))
            .map(|(id, _)| *id)
            .collect();
        for id in broken {
            let Some(conn) = self.conns.remove(&id) else {
                continue;
            };
            for (peer, chan) in conn.ends {
                self.by_end.remove(&(peer, chan));
                match peer {
                    Peer::Relay(j) if j == i => {}
                    Peer::Relay(j) => {
                        if let Some(node) = &mut self.relays[j].node {
                            node.remove_channel(now, chan);
                        }
                    }
                    Peer::Client(k) => {
                        self.clients[k].channel_closed(now, chan, "the connection broke");
                        self.handle_client_events(k);
                    }
                }
            }
        }
    }

    /// Relay `i` starts again: same identity, no channels, no circuits.
    pub fn restart_relay(&mut self, i: usize) {
        let seed = self.rng.next_u64();
        let node = start_relay(&self.relays[i], seed);
        self.relays[i].node = Some(node);
    }

    /// Run for `d` of simulated time.
    pub fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.tick();
        }
    }

    /// Run until every transfer has its outcome, for at most `limit`;
    /// whether they all did.
    pub fn run_until_settled(&mut self, limit: Duration) -> bool {
        let end = self.now + limit;
        while self.now < end {
            if self.running() == 0 {
                return true;
            }
            self.tick();
        }
        self.running() == 0
    }

    /// Transfers without an outcome yet.
    pub fn running(&self) -> usize {
        self.transfers
            .iter()
            .flat_map(BTreeMap::values)
            .filter(|t| t.outcome == Outcome::Running)
            .count()
    }

    /// One step: timers, every node writes a random burst on each of its
    /// channels, exits serve, clients read; then time advances and due
    /// cells are delivered.
    pub fn tick(&mut self) {
        let now = self.instant();
        for k in 0..self.clients.len() {
            if self.clients[k].poll_timeout().is_some_and(|t| t <= now) {
                self.clients[k].handle_timeout(now);
            }
            self.handle_client_events(k);
        }
        for i in 0..self.relays.len() {
            self.handle_relay_events(i);
        }
        let mut senders: Vec<Peer> = (0..self.clients.len())
            .map(Peer::Client)
            .chain((0..self.relays.len()).map(Peer::Relay))
            .collect();
        crate::shuffle(&mut self.rng, &mut senders);
        for peer in senders {
            self.transmit_from(peer);
        }
        for i in 0..self.relays.len() {
            self.serve(i);
            if self.relay_circuits(i) > 0 {
                self.relays[i].busy_ticks += 1;
            }
        }
        for k in 0..self.clients.len() {
            self.read_streams(k);
        }
        self.now += TICK;
        self.deliver_due();
    }

    /// Act on client `k`'s events: connect the channels it wants (at
    /// once, or refused if the guard is dead), note its requests' answers.
    fn handle_client_events(&mut self, k: usize) {
        while let Some(ev) = self.clients[k].poll_event() {
            match ev {
                CoreEvent::Connect { chan, guard } => {
                    let now = self.instant();
                    match self.relay_index(&guard.ed_identity) {
                        Some(g) if self.is_alive(g) => {
                            self.connect((Peer::Client(k), chan), g, ChannelPeer::Client);
                            self.clients[k].channel_opened(now, chan);
                        }
                        found => {
                            if let Some(g) = found {
                                self.relays[g].refused += 1;
                            }
                            self.clients[k].channel_closed(now, chan, "connection refused")
                        }
                    }
                }
                CoreEvent::Transmit(_) | CoreEvent::Stream(_) => {}
                CoreEvent::Opened { request, stream } => {
                    if let Some(t) = self.transfers[k].get_mut(&request) {
                        t.stream = Some(stream);
                    }
                }
                CoreEvent::Failed { request, failure } => {
                    if let Some(t) = self.transfers[k].get_mut(&request) {
                        t.outcome = Outcome::Failed(failure);
                        t.ended_at = Some(self.now);
                    }
                }
            }
        }
    }

    /// The index of the relay with Ed25519 identity `id`.
    fn relay_index(&self, id: &[u8; 32]) -> Option<usize> {
        self.doc.relays.iter().position(|r| r.ed_identity == *id)
    }

    /// A new connection from `from` (its end and channel ID) to relay `to`,
    /// which numbers its end itself.
    fn connect(&mut self, from: (Peer, ChannelId), to: usize, kind: ChannelPeer) -> ChannelId {
        let chan = self.next_chan;
        self.next_chan += 1;
        if let Some(node) = &mut self.relays[to].node {
            node.add_channel(chan, false, kind);
        }
        let id = self.next_conn;
        self.next_conn += 1;
        let ends = [from, (Peer::Relay(to), chan)];
        for (side, end) in ends.iter().enumerate() {
            self.by_end.insert(*end, (id, side));
        }
        self.conns.insert(
            id,
            Conn {
                ends,
                in_flight: [VecDeque::new(), VecDeque::new()],
                last_delivery: [Duration::ZERO; 2],
            },
        );
        chan
    }

    /// Relay `i`'s channel to relay `j`: the one they have, or a new one.
    fn relay_channel(&mut self, i: usize, j: usize) -> ChannelId {
        let existing = self.conns.values().find_map(|c| match c.ends {
            [(Peer::Relay(a), ca), (Peer::Relay(b), _)] if a == i && b == j => Some(ca),
            [(Peer::Relay(a), _), (Peer::Relay(b), cb)] if a == j && b == i => Some(cb),
            _ => None,
        });
        if let Some(chan) = existing {
            return chan;
        }
        let chan = self.next_chan;
        self.next_chan += 1;
        if let Some(node) = &mut self.relays[i].node {
            node.add_channel(chan, true, ChannelPeer::Relay);
        }
        self.connect((Peer::Relay(i), chan), j, ChannelPeer::Relay);
        chan
    }

    /// Act on relay `i`'s events: extend to the next relay, connect exit
    /// streams (and start serving them).
    fn handle_relay_events(&mut self, i: usize) {
        let now = self.instant();
        loop {
            let Some(ev) = self.relays[i].node.as_mut().and_then(|n| n.poll_event()) else {
                return;
            };
            match ev {
                NodeEvent::ConnectRelay { circ, linkspecs } => {
                    let next = linkspecs.iter().find_map(|s| match s.parse() {
                        Ok(LinkSpec::Ed25519Id(id)) => self
                            .doc
                            .relays
                            .iter()
                            .position(|r| r.public_keys().ed_identity == id),
                        _ => None,
                    });
                    let ready = match next {
                        Some(j) if j != i && self.is_alive(j) => Some(self.relay_channel(i, j)),
                        Some(j) => {
                            self.relays[j].refused += 1;
                            None
                        }
                        None => None,
                    };
                    if let Some(node) = &mut self.relays[i].node {
                        match ready {
                            Some(chan) => node.extend_channel_ready(now, circ, chan),
                            None => {
                                node.extend_channel_failed(now, circ, DestroyReason::CONNECTFAILED)
                            }
                        }
                    }
                }
                NodeEvent::ExitConnect { circ, stream, .. } => {
                    let len = self.response_len;
                    let relay = &mut self.relays[i];
                    if relay.silent {
                        relay.unanswered += 1;
                        continue;
                    }
                    if let Some(node) = &mut relay.node {
                        if node
                            .exit_connected(now, circ, stream, Some([10, 0, 0, 1].into()))
                            .is_ok()
                        {
                            relay.serving.push((circ, stream, len, 0));
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// Exit `i` writes what its streams' circuits take of their responses,
    /// and closes those it has written whole.
    fn serve(&mut self, i: usize) {
        let now = self.instant();
        let relay = &mut self.relays[i];
        let Some(node) = &mut relay.node else {
            return;
        };
        relay.serving.retain_mut(|(circ, stream, len, written)| {
            while *written < *len {
                let end = (*len).min(*written + 4096);
                let chunk: Vec<u8> = (*written..end).map(response_byte).collect();
                match node.exit_write(now, *circ, *stream, &chunk) {
                    Ok(0) => return true,
                    Ok(n) => *written += n,
                    Err(_) => return false,
                }
            }
            let _ = node.exit_close(now, *circ, *stream);
            false
        });
    }

    /// Client `k` reads its connected streams and checks what arrives.
    fn read_streams(&mut self, k: usize) {
        let now = self.instant();
        let mut buf = vec![0u8; 16 * 1024];
        let mut detach = Vec::new();
        for t in self.transfers[k].values_mut() {
            let Some(s) = t.stream.clone().filter(|_| t.outcome == Outcome::Running) else {
                continue;
            };
            let client = &mut self.clients[k];
            loop {
                match client.stream_read(now, &s, &mut buf) {
                    ReadResult::Data(0) | ReadResult::Gone => break,
                    ReadResult::Data(n) => {
                        let ok = buf[..n]
                            .iter()
                            .enumerate()
                            .all(|(j, b)| *b == response_byte(t.received + j));
                        t.received += n;
                        if !ok || t.received > t.expected {
                            t.outcome = Outcome::Corrupt;
                            t.ended_at = Some(self.now);
                            break;
                        }
                    }
                }
            }
            let outcome = match client.stream_view(&s) {
                StreamView::Lost => Some(Outcome::Broken("the circuit closed".into())),
                StreamView::Live {
                    ended: Some(EndReason::DONE),
                    ..
                } if t.received == t.expected => Some(Outcome::Complete),
                StreamView::Live {
                    ended: Some(EndReason::DONE),
                    ..
                } => Some(Outcome::Truncated),
                StreamView::Live {
                    ended: Some(reason),
                    ..
                } => Some(Outcome::Broken(format!("END {reason}"))),
                StreamView::Live { ended: None, .. } => None,
            };
            if let Some(o) = outcome.filter(|_| t.outcome == Outcome::Running) {
                t.outcome = o;
                t.ended_at = Some(self.now);
            }
            if t.outcome != Outcome::Running {
                detach.push(s);
            }
        }
        for s in detach {
            self.clients[k].detach(now, &s);
        }
        self.handle_client_events(k);
    }

    /// Every node writes up to a random burst of cells on each of its
    /// channels.
    fn transmit_from(&mut self, peer: Peer) {
        let now = self.instant();
        let chans: Vec<ChannelId> = self
            .by_end
            .keys()
            .filter(|(p, _)| *p == peer)
            .map(|(_, c)| *c)
            .collect();
        let mut chans = chans;
        chans.sort_unstable();
        for chan in chans {
            let budget = self.rng.random_range(1..=self.burst);
            for _ in 0..budget {
                let cell = match peer {
                    Peer::Client(k) => self.clients[k].poll_transmit(now, chan),
                    Peer::Relay(i) => self.relays[i]
                        .node
                        .as_mut()
                        .and_then(|n| n.poll_transmit(now, chan)),
                };
                let Some(cell) = cell else {
                    break;
                };
                self.send((peer, chan), cell);
            }
        }
        if let Peer::Client(k) = peer {
            self.clients[k].settle(now);
            self.handle_client_events(k);
        }
    }

    /// Put `cell` on the connection of `from`'s channel, due after a
    /// random delay (never before a cell sent earlier on it).
    fn send(&mut self, from: (Peer, ChannelId), cell: AnyChanCell) {
        let Some(&(id, side)) = self.by_end.get(&from) else {
            return;
        };
        let max = self.max_delay.as_micros() as u64;
        let mut delay =
            Duration::from_millis(1) + Duration::from_micros(self.rng.random_range(0..=max));
        if let Some((p, stall)) = self.stall {
            if self.rng.random_bool(p) {
                delay += stall;
            }
        }
        let now = self.now;
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let at = (now + delay).max(conn.last_delivery[side]);
        conn.last_delivery[side] = at;
        conn.in_flight[side].push_back((at, cell));
    }

    /// The next cell due on side `side` of connection `id`, and the other
    /// end it goes to.
    fn pop_due(&mut self, id: u64, side: usize) -> Option<(AnyChanCell, (Peer, ChannelId))> {
        let conn = self.conns.get_mut(&id)?;
        match conn.in_flight[side].front() {
            Some((at, _)) if *at <= self.now => {
                let (_, cell) = conn.in_flight[side].pop_front()?;
                Some((cell, conn.ends[1 - side]))
            }
            _ => None,
        }
    }

    /// Deliver the cells due by now to the other end of their connection.
    fn deliver_due(&mut self) {
        let now = self.instant();
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            for side in 0..2 {
                while let Some((cell, (to, chan))) = self.pop_due(id, side) {
                    match to {
                        Peer::Client(k) => {
                            self.clients[k].handle_cells(now, chan, std::iter::once(cell));
                        }
                        Peer::Relay(i) => {
                            if let Some(node) = &mut self.relays[i].node {
                                node.handle_cell(now, chan, cell);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A running node for `relay` (its identity from its key seed).
fn start_relay(relay: &SimRelay, rng_seed: u64) -> RelayNode {
    let keys = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(relay.key_seed));
    let config = NodeConfig {
        circuit: RelayConfig {
            exit: relay.exit,
            ..RelayConfig::default()
        },
        ..NodeConfig::default()
    };
    RelayNode::new(keys, config, StdRng::seed_from_u64(rng_seed))
}

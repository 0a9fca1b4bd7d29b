//! The simulated network: endpoints, links and the event loop.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use onionlab_cell::chan::{AnyChanCell, ChanMsg};
use onionlab_cell::msg::{EncodedLinkSpec, LinkSpec};
use onionlab_circuit::client::{ClientCircuit, ClientConfig, ClientEvent};
use onionlab_circuit::client_node::{ClientNode, ClientNodeConfig, ClientNodeEvent, PathHop};
use onionlab_circuit::conflux::sched::LegSchedulerKind;
use onionlab_circuit::flow::CircuitCc;
use onionlab_circuit::node::{ChannelId, ChannelPeer, CircKey, NodeConfig, NodeEvent, RelayNode};
use onionlab_circuit::relay::RelayConfig;
use onionlab_circuit::scheduler::SchedulerKind;
use onionlab_crypto::identity::{RelayPublicKeys, RelaySecretKeys};
use rand::rngs::StdRng;
use rand::{Rng, RngExt, SeedableRng};
use sha2::{Digest, Sha256};

use crate::SimError;

/// Who is at one end of a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum End {
    /// The client.
    Client,
    /// Relay number `n` (0 is the guard).
    Relay(usize),
}

/// One direction of a channel: cells in flight with their delivery times.
#[derive(Default)]
struct Link {
    in_flight: VecDeque<(Duration, AnyChanCell)>,
    last_delivery: Duration,
}

/// A hook that may rewrite or drop cells on a link (for violation tests).
pub type Tamper = Box<dyn FnMut(End, End, AnyChanCell) -> Option<AnyChanCell>>;

/// The in-memory network: a client, relays, links and simulated time.
pub struct Net {
    /// Randomness of delays, bursts and interleaving (seeded).
    pub rng: StdRng,
    base: Instant,
    /// Simulated time since the start.
    pub now: Duration,
    /// The relays; the last is the exit.
    pub relays: Vec<RelayNode>,
    /// The client: its channels to guards and its circuits.
    pub client: ClientNode,
    /// The client's channels: the guard's index, by the client's channel
    /// ID, and the other way round.
    client_chans: BTreeMap<ChannelId, usize>,
    client_chan_of: BTreeMap<usize, ChannelId>,
    /// Client events not yet taken, with their circuit (a circuit's
    /// closing as [`ClientEvent::Closed`]).
    pub client_events: Vec<(CircKey, ClientEvent)>,
    /// Relay events not yet taken, with their relay index.
    pub node_events: Vec<(usize, NodeEvent)>,
    /// (from, to) -> link. Iterated (in key order, then shuffled with the
    /// seeded RNG) to deliver cells, hence ordered.
    links: BTreeMap<(End, End), Link>,
    /// Channel IDs of the network: the same number at both ends (the
    /// client's node numbers its channels itself: `client_chans` maps
    /// them). Only looked up, never iterated, so its (randomly seeded)
    /// order cannot show.
    chan_ids: HashMap<(End, End), ChannelId>,
    /// Who is at the other end of relay `i`'s channel. Only looked up.
    chan_peer: HashMap<(usize, ChannelId), End>,
    next_chan: ChannelId,
    /// Most cells a node writes on one channel per tick (random 1..=max).
    pub burst: usize,
    /// Largest one-way delay of a cell on a link, in microseconds.
    pub max_delay_us: u64,
    /// Optional hook applied to every cell sent.
    pub tamper: Option<Tamper>,
    /// Whether the harness answers every exit BEGIN with a connection
    /// (true) or leaves that to the test.
    pub auto_connect: bool,
    /// Relays killed by [`Net::kill_relay`]: they neither send nor receive.
    dead: BTreeSet<usize>,
    /// Circuit-level flow control of new client circuits.
    cc: CircuitCc,
    /// Extra one-way delay of some links (both directions), on top of the
    /// random per-cell delay.
    extra_delay: BTreeMap<(End, End), Duration>,
    /// Probability per cell, and length, of a stall: the cell (and so
    /// every later cell on its ordered link) arrives that much later, as
    /// a loss repaired by TCP looks from above.
    pub stall: Option<(f64, Duration)>,
    /// The event log, when enabled with [`Net::enable_trace`].
    trace: Option<Vec<String>>,
}

pub fn linkspecs(keys: &RelayPublicKeys, port: u16) -> Vec<EncodedLinkSpec> {
    let specs = [
        LinkSpec::OrPort(std::net::Ipv4Addr::LOCALHOST.into(), port),
        LinkSpec::Ed25519Id(keys.ed_identity),
    ];
    specs.iter().filter_map(|s| s.encode().ok()).collect()
}

impl Net {
    /// `n` relays; the last one is an exit. Circuits run tor-spec's fixed
    /// windows. `scheduler` schedules circuits on every channel, the
    /// client's channel to its guard included. Client circuits not built
    /// within 60 s of simulated time are abandoned
    /// ([`ClientNodeConfig`]'s default).
    pub fn new(seed: u64, n: usize, scheduler: SchedulerKind) -> Net {
        Net::with_cc(seed, n, scheduler, CircuitCc::Fixed)
    }

    /// [`Net::new`] with circuit-level flow control `cc` at every node.
    pub fn with_cc(seed: u64, n: usize, scheduler: SchedulerKind, cc: CircuitCc) -> Net {
        Net::with_options(seed, n, scheduler, cc, None)
    }

    /// [`Net::with_cc`] whose exit links sets (proposal 329) and picks
    /// their legs with `conflux` (`None`: it refuses links).
    pub fn with_options(
        seed: u64,
        n: usize,
        scheduler: SchedulerKind,
        cc: CircuitCc,
        conflux: Option<LegSchedulerKind>,
    ) -> Net {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut relays = Vec::new();
        for i in 0..n {
            let keys = RelaySecretKeys::generate(&mut rng);
            let config = NodeConfig {
                scheduler,
                circuit: RelayConfig {
                    exit: i == n - 1,
                    conflux: conflux.is_some() && i == n - 1,
                    ..RelayConfig::default()
                }
                .with_cc(cc),
                conflux_scheduler: conflux.unwrap_or(LegSchedulerKind::LowRtt),
                ..NodeConfig::default()
            };
            relays.push(RelayNode::new(
                keys,
                config,
                StdRng::seed_from_u64(rng.next_u64()),
            ));
        }
        let client = ClientNode::new(
            ClientNodeConfig {
                scheduler,
                circuit: ClientConfig {
                    cc,
                    ..ClientConfig::default()
                },
                ..ClientNodeConfig::default()
            },
            StdRng::seed_from_u64(rng.next_u64()),
        );
        Net {
            rng,
            base: Instant::now(),
            now: Duration::ZERO,
            relays,
            client,
            client_chans: BTreeMap::new(),
            client_chan_of: BTreeMap::new(),
            client_events: Vec::new(),
            node_events: Vec::new(),
            links: BTreeMap::new(),
            chan_ids: HashMap::new(),
            chan_peer: HashMap::new(),
            next_chan: 1,
            burst: 8,
            max_delay_us: 3000,
            tamper: None,
            auto_connect: true,
            dead: Default::default(),
            cc,
            trace: None,
            extra_delay: BTreeMap::new(),
            stall: None,
        }
    }

    /// Relay `at` loses its channel to `peer` (the link broke on its side,
    /// or a hostile relay pretends it did): it tears the channel's circuits
    /// down as a relay does (TRUNCATED toward the client, DESTROY onward),
    /// while a relay `peer` is not told. The client, if it is the peer,
    /// sees its link close (its circuits through `at` close). Cells in
    /// flight between them are dropped.
    pub fn drop_channel(&mut self, at: usize, peer: End) {
        let me = End::Relay(at);
        let Some(chan) = self.chan_ids.remove(&(me, peer)) else {
            return;
        };
        self.log(|| format!("drop channel {chan} {me:?}-{peer:?}"));
        self.chan_ids.remove(&(peer, me));
        self.chan_peer.remove(&(at, chan));
        self.links.remove(&(me, peer));
        self.links.remove(&(peer, me));
        let now = self.instant();
        self.relays[at].remove_channel(now, chan);
        if peer == End::Client {
            // The client's end of the link is gone too: the next circuit
            // through this guard gets a new channel.
            self.forget_client_channel(at, "the guard dropped the channel");
        }
    }

    /// The client loses its channel to relay `guard` (if it has one): its
    /// circuits through it close, as the client's channel layer reports a
    /// closed channel.
    fn forget_client_channel(&mut self, guard: usize, why: &str) {
        if let Some(chan) = self.client_chan_of.remove(&guard) {
            self.client_chans.remove(&chan);
            let (me, g) = (End::Client, End::Relay(guard));
            self.chan_ids.remove(&(me, g));
            self.chan_ids.remove(&(g, me));
            self.links.remove(&(me, g));
            self.links.remove(&(g, me));
            let now = self.instant();
            self.client.channel_closed(now, chan, why);
        }
    }

    /// Relay `i` dies (a crash): every relay with a channel to it loses
    /// that channel, and so does the client if `i` is its guard (its
    /// circuits through it close, as the client's channel layer reports a
    /// closed channel). The dead relay sends and receives nothing from now
    /// on.
    pub fn kill_relay(&mut self, i: usize) {
        self.log(|| format!("kill relay {i}"));
        self.dead.insert(i);
        for j in 0..self.relays.len() {
            if j != i {
                self.drop_channel(j, End::Relay(i));
            }
        }
        self.forget_client_channel(i, "the guard died");
    }

    /// Start recording the event log (see [`Net::take_trace`]).
    pub fn enable_trace(&mut self) {
        self.trace.get_or_insert_with(Vec::new);
    }

    /// The event log recorded since [`Net::enable_trace`] or the last call
    /// (empty if not enabled), one line per event, in order: every cell
    /// sent on a link (simulated time, link, due time, circuit, command and
    /// a digest of the whole cell), every cell delivered, every relay and
    /// client event (their `Debug` rendering), every channel dropped and
    /// relay killed. Two runs with the same seed and the same inputs give
    /// byte-identical logs.
    pub fn take_trace(&mut self) -> Vec<String> {
        self.trace.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Append a line to the event log if it is enabled (`line` is only
    /// built then).
    fn log(&mut self, line: impl FnOnce() -> String) {
        if let Some(t) = &mut self.trace {
            t.push(format!("{:>10} {}", self.now.as_micros(), line()));
        }
    }

    /// The simulated now as an `Instant`.
    pub fn instant(&self) -> Instant {
        self.base + self.now
    }

    /// Public keys of relay `i`.
    pub fn public(&self, i: usize) -> RelayPublicKeys {
        self.relays[i].keys().public()
    }

    fn open_channel(&mut self, a: End, b: End) -> ChannelId {
        if let Some(id) = self.chan_ids.get(&(a, b)) {
            return *id;
        }
        let id = self.next_chan;
        self.next_chan += 1;
        self.chan_ids.insert((a, b), id);
        self.chan_ids.insert((b, a), id);
        for (me, peer, initiated) in [(a, b, true), (b, a, false)] {
            if let End::Relay(i) = me {
                let kind = match peer {
                    End::Client => ChannelPeer::Client,
                    End::Relay(_) => ChannelPeer::Relay,
                };
                self.relays[i].add_channel(id, initiated, kind);
                self.chan_peer.insert((i, id), peer);
            }
        }
        id
    }

    /// Relay `i` as a hop of a client path.
    pub fn hop(&self, i: usize) -> PathHop {
        let keys = self.public(i);
        PathHop {
            linkspecs: linkspecs(&keys, 9000 + i as u16),
            keys,
            name: format!("relay{i}"),
        }
    }

    /// Start a circuit from the client through relay 0 (the guard); the
    /// client's channel to it opens at once.
    pub fn new_circuit(&mut self) -> CircKey {
        let now = self.instant();
        let guard = self.hop(0);
        let key = self
            .client
            .launch(now, vec![guard], self.cc)
            .expect("a one-hop path");
        self.handle_client_events();
        key
    }

    /// Client circuit `id`, to look at (`None` once the client forgot it:
    /// closed, with its DESTROY out).
    pub fn circuit(&self, id: CircKey) -> Option<&ClientCircuit> {
        self.client.circuit(id)
    }

    /// Whether client circuit `id` is closed (or forgotten).
    pub fn is_closed(&self, id: CircKey) -> bool {
        self.circuit(id).is_none_or(ClientCircuit::is_closed)
    }

    /// Hops client circuit `id` has (0 once forgotten).
    pub fn n_hops(&self, id: CircKey) -> usize {
        self.circuit(id).map_or(0, ClientCircuit::n_hops)
    }

    /// Add `extra` one-way delay to the link between `a` and `b`, both
    /// ways (on top of the random per-cell delay).
    pub fn set_link_delay(&mut self, a: End, b: End, extra: Duration) {
        self.extra_delay.insert((a, b), extra);
        self.extra_delay.insert((b, a), extra);
    }

    /// Launch a linked set with one leg per path (relay indexes, guard
    /// first; every path must end at the exit, the last relay); the
    /// client's end picks legs with `kind`.
    pub fn launch_set(
        &mut self,
        paths: &[Vec<usize>],
        kind: LegSchedulerKind,
    ) -> Result<CircKey, SimError> {
        let now = self.instant();
        let hops: Vec<Vec<PathHop>> = paths
            .iter()
            .map(|p| p.iter().map(|&i| self.hop(i)).collect())
            .collect();
        let set = self.client.launch_set(now, hops, self.cc, kind)?;
        self.handle_client_events();
        Ok(set)
    }

    /// Build circuit `id` through all relays.
    pub fn build(&mut self, id: CircKey) -> Result<(), SimError> {
        let after_guard: Vec<usize> = (1..self.relays.len()).collect();
        self.build_via(id, &after_guard)
    }

    /// Build circuit `id` from the guard (relay 0) through the relays
    /// `after_guard`, in order (the last is where its streams exit; only
    /// the last relay of the network serves BEGIN). Circuits built through
    /// different relays give relays more than two channels. Relay 0 and
    /// repeated relays are refused ([`SimError::BadPath`]).
    pub fn build_via(&mut self, id: CircKey, after_guard: &[usize]) -> Result<(), SimError> {
        let mut seen = BTreeSet::new();
        let n = self.relays.len();
        if !after_guard
            .iter()
            .all(|&i| (1..n).contains(&i) && seen.insert(i))
        {
            return Err(SimError::BadPath(after_guard.to_vec()));
        }
        self.run_until(Duration::from_secs(10), |net| net.n_hops(id) >= 1)?;
        for (i, &relay) in after_guard.iter().enumerate() {
            let now = self.instant();
            let hop = self.hop(relay);
            self.client.extend(now, id, hop)?;
            // The guard, and the relays up to this one.
            let hops = i + 2;
            self.run_until(Duration::from_secs(10), |net| net.n_hops(id) >= hops)?;
        }
        Ok(())
    }

    fn resolve_linkspecs(&self, specs: &[EncodedLinkSpec]) -> Option<usize> {
        for s in specs {
            if let Ok(LinkSpec::Ed25519Id(id)) = s.parse() {
                return (0..self.relays.len()).find(|i| self.public(*i).ed_identity == id);
            }
        }
        None
    }

    /// Run ticks until `done` holds, for at most `limit` of simulated time.
    pub fn run_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&mut Net) -> bool,
    ) -> Result<(), SimError> {
        let deadline = self.now + limit;
        while !done(self) {
            if self.now >= deadline {
                return Err(SimError::Timeout(limit));
            }
            self.tick();
        }
        Ok(())
    }

    /// Run for a fixed simulated duration.
    pub fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.tick();
        }
    }

    /// One step: every endpoint, in random order, writes a random burst on
    /// each of its channels; then time advances and due cells are delivered.
    pub fn tick(&mut self) {
        let mut ends: Vec<End> = std::iter::once(End::Client)
            .chain((0..self.relays.len()).map(End::Relay))
            .collect();
        shuffle(&mut self.rng, &mut ends);
        for e in ends {
            self.transmit_from(e);
        }
        self.now += Duration::from_micros(100);
        self.deliver_due();
        self.handle_events();
    }

    fn transmit_from(&mut self, from: End) {
        let now = self.instant();
        match from {
            End::Client => {
                while self.client.poll_channel_ready().is_some() {}
                let chans: Vec<(ChannelId, usize)> =
                    self.client_chans.iter().map(|(c, g)| (*c, *g)).collect();
                for (chan, guard) in chans {
                    let budget = self.rng.random_range(1..=self.burst);
                    for _ in 0..budget {
                        let Some(cell) = self.client.poll_transmit(now, chan) else {
                            break;
                        };
                        self.send(from, End::Relay(guard), cell);
                    }
                }
            }
            End::Relay(i) if self.dead.contains(&i) => {}
            End::Relay(i) => {
                let chans: Vec<ChannelId> = self.relays[i].channels_with_work().collect();
                for chan in chans {
                    let Some(&to) = self.chan_peer.get(&(i, chan)) else {
                        continue;
                    };
                    let budget = self.rng.random_range(1..=self.burst);
                    for _ in 0..budget {
                        let Some(cell) = self.relays[i].poll_transmit(now, chan) else {
                            break;
                        };
                        self.send(from, to, cell);
                    }
                }
            }
        }
    }

    fn send(&mut self, from: End, to: End, cell: AnyChanCell) {
        let cell = match &mut self.tamper {
            Some(t) => match t(from, to, cell) {
                Some(c) => c,
                None => return,
            },
            None => cell,
        };
        let mut delay = Duration::from_micros(self.rng.random_range(100..=self.max_delay_us));
        delay += self
            .extra_delay
            .get(&(from, to))
            .copied()
            .unwrap_or_default();
        if let Some((p, stall)) = self.stall {
            if self.rng.random_bool(p) {
                delay += stall;
            }
        }
        let described = self.trace.is_some().then(|| describe(&cell));
        let link = self.links.entry((from, to)).or_default();
        // Channels are ordered: a cell never overtakes an earlier one.
        let at = (self.now + delay).max(link.last_delivery);
        link.last_delivery = at;
        link.in_flight.push_back((at, cell));
        if let Some(cell) = described {
            let due = at.as_micros();
            self.log(|| format!("send {from:?}>{to:?} due {due} {cell}"));
        }
    }

    fn deliver_due(&mut self) {
        // In key order (a BTreeMap), then shuffled with the seeded RNG.
        let mut keys: Vec<(End, End)> = self.links.keys().copied().collect();
        shuffle(&mut self.rng, &mut keys);
        let now = self.instant();
        for (from, to) in keys {
            while let Some(cell) = self.pop_due(from, to) {
                self.log(|| {
                    let circ = cell.circid().map_or(0, u32::from);
                    let cmd = cell.msg().cmd();
                    format!("deliver {from:?}>{to:?} circ {circ:#x} {cmd}")
                });
                match to {
                    End::Client => {
                        let chan = match from {
                            End::Relay(g) => self.client_chan_of.get(&g).copied(),
                            End::Client => None,
                        };
                        if let Some(chan) = chan {
                            self.client.handle_cell(now, chan, cell);
                        }
                    }
                    End::Relay(i) if self.dead.contains(&i) => {}
                    End::Relay(i) => {
                        if let Some(&chan) = self.chan_ids.get(&(from, to)) {
                            self.relays[i].handle_cell(now, chan, cell);
                        }
                    }
                }
            }
        }
    }

    /// The next cell on link `from -> to` if it is due.
    fn pop_due(&mut self, from: End, to: End) -> Option<AnyChanCell> {
        let link = self.links.get_mut(&(from, to))?;
        match link.in_flight.front() {
            Some((at, _)) if *at <= self.now => link.in_flight.pop_front().map(|(_, c)| c),
            _ => None,
        }
    }

    /// Act on the client's events: open the channels it wants (at once),
    /// and keep its circuits' events for the test.
    fn handle_client_events(&mut self) {
        while let Some(ev) = self.client.poll_event() {
            self.log(|| format!("client {ev:?}"));
            match ev {
                ClientNodeEvent::ChannelWanted { chan, guard } => {
                    let g = (0..self.relays.len()).find(|&i| self.public(i).ed_identity == guard);
                    match g {
                        Some(g) if !self.dead.contains(&g) => {
                            self.open_channel(End::Client, End::Relay(g));
                            self.client_chans.insert(chan, g);
                            self.client_chan_of.insert(g, chan);
                            self.client.channel_opened(chan);
                        }
                        _ => {
                            let now = self.instant();
                            self.client.channel_closed(now, chan, "no such relay");
                        }
                    }
                }
                ClientNodeEvent::Built { .. } | ClientNodeEvent::LegHopFailed { .. } => {}
                ClientNodeEvent::Circuit { circ, event } => self.client_events.push((circ, event)),
                ClientNodeEvent::Closed { circ, reason, .. } => {
                    self.client_events.push((circ, ClientEvent::Closed(reason)))
                }
            }
        }
    }

    fn handle_events(&mut self) {
        let now = self.instant();
        self.client.handle_timeout(now);
        self.handle_client_events();
        for i in 0..self.relays.len() {
            while let Some(ev) = self.relays[i].poll_event() {
                self.log(|| format!("relay {i} {ev:?}"));
                match &ev {
                    NodeEvent::ConnectRelay { circ, linkspecs } => {
                        match self.resolve_linkspecs(linkspecs) {
                            Some(j) => {
                                let chan = self.open_channel(End::Relay(i), End::Relay(j));
                                self.relays[i].extend_channel_ready(now, *circ, chan);
                            }
                            None => self.relays[i].extend_channel_failed(
                                now,
                                *circ,
                                onionlab_cell::chan::DestroyReason::CONNECTFAILED,
                            ),
                        }
                    }
                    NodeEvent::ExitConnect { circ, stream, .. } if self.auto_connect => {
                        // Only fails if the circuit closed meanwhile, which
                        // its own events report.
                        let _ = self.relays[i].exit_connected(
                            now,
                            *circ,
                            *stream,
                            Some([10, 0, 0, 1].into()),
                        );
                    }
                    _ => {}
                }
                self.node_events.push((i, ev));
            }
        }
    }

    /// Take client events of circuit `id` (removing them from the log).
    pub fn take_client_events(&mut self, id: CircKey) -> Vec<ClientEvent> {
        let (mine, rest) = std::mem::take(&mut self.client_events)
            .into_iter()
            .partition(|(c, _)| *c == id);
        self.client_events = rest;
        mine.into_iter().map(|(_, e)| e).collect()
    }
}

/// A cell for the event log: circuit ID, command, and a digest of its
/// whole content (the `Debug` rendering, which shows every byte).
fn describe(cell: &AnyChanCell) -> String {
    let circ = cell.circid().map_or(0, u32::from);
    let digest = Sha256::digest(format!("{cell:?}").as_bytes());
    let short = hex::encode(&digest[..8]);
    format!("circ {circ:#x} {} {short}", cell.msg().cmd())
}

/// Fisher-Yates shuffle with the network's RNG.
pub fn shuffle<T>(rng: &mut StdRng, v: &mut [T]) {
    for i in (1..v.len()).rev() {
        let j = rng.random_range(0..=i);
        v.swap(i, j);
    }
}

/// A deterministic byte stream, for checking data end to end.
pub struct Pattern {
    rng: rand_chacha::ChaCha8Rng,
    /// Bytes not yet consumed.
    pub remaining: usize,
    pending: Vec<u8>,
}

impl Pattern {
    /// `len` bytes from a generator seeded with `seed`.
    pub fn new(seed: u64, len: usize) -> Pattern {
        Pattern {
            rng: rand_chacha::ChaCha8Rng::seed_from_u64(seed),
            remaining: len,
            pending: Vec::new(),
        }
    }
    /// The next `n` bytes (fewer at the end), without consuming them.
    pub fn peek(&mut self, n: usize) -> &[u8] {
        let want = n.min(self.remaining);
        // Generate whole 4 KiB blocks: the RNG's output must not depend on
        // how callers slice it (ChaCha drops the unused tail of a word).
        while self.pending.len() < want {
            let mut block = [0u8; 4096];
            self.rng.fill_bytes(&mut block);
            self.pending.extend_from_slice(&block);
        }
        &self.pending[..want]
    }
    /// Drop the next `n` bytes (after [`peek`](Self::peek)).
    pub fn consume(&mut self, n: usize) {
        self.pending.drain(..n);
        self.remaining -= n;
    }
    /// Check that `data` is what comes next, and consume it.
    pub fn expect(&mut self, data: &[u8]) -> bool {
        if data.len() > self.remaining {
            return false;
        }
        let ok = self.peek(data.len()) == data;
        self.consume(data.len());
        ok
    }
}

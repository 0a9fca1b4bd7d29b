//! The client's end of datagram sets (`docs/datagram.md` sections 4 and
//! 5), sans-IO: it builds each set's circuits ([`DgramClient`]), one per
//! path, all to one exit; links each to the set with a LINK message, sent
//! again until the exit answers LINKED; spreads the set's end-to-end TCP
//! over the linked circuits ([`E2eSet`]); and opens streams on it
//! ([`crate::streams`]). Its driver opens the links to guards it asks
//! for, moves cells, and serves each stream to an application.
//!
//! A set lives while any of its circuits is linked or being built; when
//! the last one ends, every stream on it reads as reset.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use onionlab_circuit::conflux::sched::LegSchedulerKind;
use onionlab_utcp::{MuxStats, Role, Settings};
use rand::RngExt;
use tor_llcrypto::pk::ed25519::Ed25519Identity;

mod more;

use crate::client::{ClientOutput, ClientSettings, DgramClient, HopSpec};
use crate::e2e::{link_msg, E2eSet, NONCE_LEN};
use crate::more::client::{MoreClient, SetAddr};
use crate::streams::{Recv, SetStreams, StreamEvent, StreamKey, StreamStatus};
use crate::wire::{RelayCommand, RelayMsg, CELL_LEN};
use crate::{CircuitId, Error, LinkId};

/// How a client runs its datagram sets.
#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// Building circuits (and the LINK's resend timer, which follows the
    /// handshakes').
    pub circuits: ClientSettings,
    /// The end-to-end TCP's settings (its segment size is set to fit a
    /// message).
    pub tcp: Settings,
    /// How this end spreads segments over a set's circuits.
    pub dispatch: LegSchedulerKind,
    /// Sets carry the nodes' kernel TCP through TUN devices
    /// ([`crate::tunnel`]) instead of the user-space one: the driver
    /// feeds [`Proxy::send_kernel_segment`] and drains
    /// [`Proxy::poll_kernel_segment`], and no stream opens on them.
    pub kernel: bool,
}

impl Default for ProxySettings {
    fn default() -> Self {
        ProxySettings {
            circuits: ClientSettings::default(),
            tcp: Settings::default(),
            dispatch: LegSchedulerKind::RoundRobin { cells_per_leg: 1 },
            kernel: false,
        }
    }
}

/// What the client asks of its driver, or tells it.
#[derive(Debug)]
pub enum ProxyOutput {
    /// Send this cell on this link.
    Transmit(LinkId, Box<[u8; CELL_LEN]>),
    /// Send this MORE message on this link.
    SendMore(LinkId, Vec<u8>),
    /// Open a link to this guard, then call [`Proxy::link_up`] or
    /// [`Proxy::link_failed`] (one Connect per guard until then).
    Connect {
        /// Where it listens.
        addr: SocketAddr,
        /// Who it must prove to be.
        identity: Ed25519Identity,
    },
    /// A circuit of the set was linked: `legs` are now.
    Linked {
        /// The set.
        set: u64,
        /// Its linked circuits.
        legs: usize,
    },
    /// A circuit of the set ended.
    LegClosed {
        /// The set.
        set: u64,
        /// Why.
        error: Error,
    },
    /// The set has no circuit left: it is forgotten, and its streams read
    /// as reset.
    SetFailed(u64),
}

/// How often a linked circuit of a set with streams carries a LINK again
/// when nothing else need go: every relay on it sees a cell well within
/// its idle timeout (60 s), so an idle stream's circuits live.
pub const LEG_KEEPALIVE: Duration = Duration::from_secs(20);

/// A circuit of a set.
enum Leg {
    /// Being built.
    Building,
    /// Built; LINK sent, sent again at `resend_at` until LINKED.
    Linking { resend_at: Instant, wait: Duration },
    /// Carrying the set's segments; a LINK goes again at `keepalive_at`
    /// while the set has streams.
    Linked { keepalive_at: Instant },
}

struct ClientSet {
    nonce: [u8; NONCE_LEN],
    streams: SetStreams,
    legs: HashMap<CircuitId, Leg>,
    /// Paths waiting for a link to their guard.
    waiting: usize,
    /// Closed once its last stream's lane is gone (a newer set takes new
    /// streams).
    retiring: bool,
    /// A MORE set (no circuits: a Sphinx packet per segment).
    more: Option<MoreSet>,
}

/// SURBs a MORE client keeps at the exit: refilled when its stock falls
/// below half of this.
pub const SURB_TARGET: usize = 64;
/// A MORE set with streams and no reply for this long probes the exit:
/// a packet of two SURBs that asks for an answer, which says how many
/// SURBs the exit holds (the wait doubling to [`PROBE_MAX`] while no
/// reply comes).
pub const PROBE_FIRST: Duration = Duration::from_millis(500);
/// The longest wait between two probes of a silent MORE set.
pub const PROBE_MAX: Duration = Duration::from_secs(4);
/// A MORE set with streams and no reply for this long fails: its exit is
/// gone (its streams read as reset).
pub const MORE_TIMEOUT: Duration = Duration::from_secs(15);

/// A MORE set's end at the client.
struct MoreSet {
    /// Where its packets go.
    addr: SetAddr,
    /// SURBs the exit holds, as it last said plus those sent since.
    stock: usize,
    /// When a reply last came (or the set's first stream opened).
    heard_at: Instant,
    /// When the exit is probed if no reply comes, and the wait after.
    probe_at: Instant,
    probe_wait: Duration,
    /// The next refill asks for an answer.
    probe_due: bool,
}

impl MoreSet {
    /// A reply came, with segments (`data`) or only answering a probe, or
    /// a first stream opened: the exit is alive; the probes' wait starts
    /// again only after data (an idle set's exit is probed every
    /// [`PROBE_MAX`]).
    fn heard(&mut self, now: Instant, data: bool) {
        self.heard_at = now;
        if data {
            self.probe_wait = PROBE_FIRST;
        }
        self.probe_at = now + self.probe_wait;
    }
}

/// A guard: where it listens and who it is.
type Guard = (SocketAddr, Ed25519Identity);
/// Paths (and their sets) waiting for a link to their guard.
type WaitingPaths = Vec<(u64, Vec<HopSpec>)>;

/// A client's datagram sets (see the module docs).
pub struct Proxy {
    settings: ProxySettings,
    client: DgramClient,
    sets: HashMap<u64, ClientSet>,
    by_circuit: HashMap<CircuitId, u64>,
    links: HashMap<Guard, LinkId>,
    /// Guards being connected to, and the paths waiting for each.
    connecting: HashMap<Guard, WaitingPaths>,
    /// MORE's routes, links' mailboxes and SURBs.
    more: MoreClient,
    next_set: u64,
    seed: u64,
    out: VecDeque<ProxyOutput>,
    events: VecDeque<StreamEvent>,
    /// The end-to-end TCP counters of the sets that ended.
    ended: MuxStats,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("sets", &self.sets.len())
            .field("circuits", &self.by_circuit.len())
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// A client; `seed` seeds circuit IDs, the TCPs' initial sequence
    /// numbers and leg choices (take it from a CSPRNG outside tests; the
    /// sets' nonces and the handshakes always come from the OS).
    ///
    /// # Errors
    ///
    /// [`Error::Settings`] for a dispatch rule datagram sets cannot run,
    /// or the TCP's settings' error.
    pub fn new(settings: ProxySettings, seed: u64) -> Result<Self, Error> {
        E2eSet::new(
            &settings.tcp,
            Role::Initiator,
            settings.dispatch,
            seed,
            Instant::now(),
        )?;
        Ok(Proxy {
            client: DgramClient::new(settings.circuits.clone(), seed),
            settings,
            sets: HashMap::new(),
            by_circuit: HashMap::new(),
            links: HashMap::new(),
            connecting: HashMap::new(),
            more: MoreClient::new(seed),
            next_set: 1,
            seed,
            out: VecDeque::new(),
            events: VecDeque::new(),
            ended: MuxStats::default(),
        })
    }

    /// The end-to-end TCP counters of every set, ended or not.
    pub fn e2e_stats(&self) -> MuxStats {
        SetStreams::total_stats(self.ended, self.sets.values().map(|s| &s.streams))
    }

    /// Start a set of one circuit per path (guard first, all ending at
    /// the same exit; 1 to 3 of them for mUDP-OR).
    ///
    /// # Errors
    ///
    /// [`Error::EmptyPath`] for no path or an empty one.
    pub fn start_set(&mut self, now: Instant, paths: Vec<Vec<HopSpec>>) -> Result<u64, Error> {
        if paths.is_empty() || paths.iter().any(Vec::is_empty) {
            return Err(Error::EmptyPath);
        }
        let id = self.next_set;
        self.next_set += 1;
        let seed = self.seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let e2e = if self.settings.kernel {
            E2eSet::kernel(Role::Initiator, self.settings.dispatch, seed, now)?
        } else {
            E2eSet::new(
                &self.settings.tcp,
                Role::Initiator,
                self.settings.dispatch,
                seed,
                now,
            )?
        };
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill(&mut nonce[..]);
        self.sets.insert(
            id,
            ClientSet {
                nonce,
                streams: SetStreams::new(e2e),
                legs: HashMap::new(),
                waiting: 0,
                retiring: false,
                more: None,
            },
        );
        for path in paths {
            let guard = (path[0].addr, path[0].identity);
            match self.links.get(&guard) {
                Some(&link) => self.build(now, id, link, path),
                None => {
                    if let Some(set) = self.sets.get_mut(&id) {
                        set.waiting += 1;
                    }
                    // One Connect per guard until it is answered (its
                    // paths may all have gone with a closed set).
                    if !self.connecting.contains_key(&guard) {
                        self.out.push_back(ProxyOutput::Connect {
                            addr: guard.0,
                            identity: guard.1,
                        });
                    }
                    self.connecting.entry(guard).or_default().push((id, path));
                }
            }
        }
        self.pump(now);
        Ok(id)
    }

    /// Whether the set still lives (it has a circuit linked or coming).
    pub fn set_alive(&self, set: u64) -> bool {
        self.sets.contains_key(&set)
    }

    /// The set's linked circuits.
    pub fn linked_legs(&self, set: u64) -> usize {
        self.sets
            .get(&set)
            .map_or(0, |s| s.streams.e2e.legs().len())
    }

    /// Streams the driver holds on the set.
    pub fn streams(&self, set: u64) -> usize {
        self.sets.get(&set).map_or(0, |s| s.streams.held())
    }

    /// No new stream goes on `set`: it is closed once its last stream's
    /// lane is gone (every byte delivered both ways, or reset).
    pub fn retire(&mut self, set: u64) {
        if let Some(s) = self.sets.get_mut(&set) {
            s.retiring = true;
        }
        self.close_retired();
    }

    /// Close the retired sets whose last stream's lane is gone (a kernel
    /// set's connections are its driver's: it closes the set itself).
    fn close_retired(&mut self) {
        let done: Vec<u64> = self
            .sets
            .iter_mut()
            .filter(|(_, s)| s.retiring && !s.streams.e2e.is_kernel())
            .filter(|(_, s)| s.streams.held() == 0)
            .filter_map(|(&id, s)| (s.streams.e2e.mux().lanes() == 0).then_some(id))
            .collect();
        for id in done {
            self.close_set(id);
        }
    }

    /// End a set: its circuits are destroyed, its streams read as reset.
    pub fn close_set(&mut self, set: u64) {
        if let Some(s) = self.sets.remove(&set) {
            for &circuit in s.legs.keys() {
                self.by_circuit.remove(&circuit);
                self.client.close(circuit);
            }
            self.ended += s.streams.fail(set, &mut self.events);
        }
        self.more.forget_set(set);
        for waiting in self.connecting.values_mut() {
            waiting.retain(|(id, _)| *id != set);
        }
        self.drain_client(Instant::now());
    }

    /// Open a stream to `target` (`host:port`) on `set`: it goes out once
    /// a circuit is linked; [`status`](Self::status) says when the exit
    /// answered.
    ///
    /// # Errors
    ///
    /// [`Error::NoCircuit`] for a set that failed; [`Error::Protocol`] for
    /// a target over 255 bytes; the TCP's (too many streams).
    pub fn open_stream(
        &mut self,
        now: Instant,
        set: u64,
        target: &str,
    ) -> Result<StreamKey, Error> {
        let s = self
            .sets
            .get_mut(&set)
            .ok_or(Error::NoCircuit(CircuitId(0)))?;
        if s.streams.e2e.is_kernel() {
            return Err(Error::Protocol(
                "a kernel set carries the kernel's TCP, not streams",
            ));
        }
        if let Some(more) = s.more.as_mut().filter(|_| s.streams.e2e.lanes() == 0) {
            more.heard(now, true);
        }
        let lane = s.streams.open(now, target)?;
        s.streams.after_tcp(now, set, false, &mut self.events);
        self.pump(now);
        Ok(StreamKey { set, lane })
    }

    /// A kernel set: a segment from the node's kernel for its peer (the
    /// payload of a packet [`crate::tunnel::from_kernel`] let through);
    /// `false` if it was dropped (no such kernel set, or its queue is
    /// full while no circuit is linked).
    pub fn send_kernel_segment(&mut self, now: Instant, set: u64, segment: &[u8]) -> bool {
        let queued = self
            .sets
            .get_mut(&set)
            .is_some_and(|s| s.streams.e2e.send_kernel_segment(segment.to_vec()));
        self.pump(now);
        queued
    }

    /// The next segment a kernel set's peer sent, for the node's kernel
    /// (through [`crate::tunnel::to_kernel`]).
    pub fn poll_kernel_segment(&mut self) -> Option<(u64, Vec<u8>)> {
        self.sets
            .iter_mut()
            .find_map(|(&id, s)| Some((id, s.streams.e2e.poll_kernel_segment()?)))
    }

    /// Where a stream stands (the exit's answer).
    pub fn status(&self, stream: StreamKey) -> StreamStatus {
        self.sets
            .get(&stream.set)
            .map_or(StreamStatus::Failed, |s| s.streams.status(stream.lane))
    }

    /// Queue the application's bytes on `stream`; how many fit (0: wait
    /// for a [`StreamEvent::Wake`]).
    ///
    /// # Errors
    ///
    /// [`Error::Transport`] if the stream cannot send (not open, or it
    /// ended).
    pub fn send(&mut self, now: Instant, stream: StreamKey, data: &[u8]) -> Result<usize, Error> {
        self.with_set(now, stream, |s, now| s.send(now, stream.lane, data))
            .unwrap_or_else(|| Err(onionlab_utcp::Error::NoLane(stream.lane).into()))
    }

    /// Read what the exit sent on `stream`.
    pub fn recv(&mut self, now: Instant, stream: StreamKey, buf: &mut [u8]) -> Recv {
        self.with_set(now, stream, |s, now| s.recv(now, stream.lane, buf))
            .unwrap_or(Recv::Reset)
    }

    /// The application closed its side cleanly: FIN after what is queued.
    pub fn close(&mut self, now: Instant, stream: StreamKey) {
        self.with_set(now, stream, |s, now| s.close(now, stream.lane));
    }

    /// Reset `stream` and forget it.
    pub fn abort(&mut self, now: Instant, stream: StreamKey) {
        self.with_set(now, stream, |s, now| s.abort(now, stream.lane));
    }

    /// The driver is done with a stream that ended: forget it.
    pub fn forget(&mut self, stream: StreamKey) {
        if let Some(set) = self.sets.get_mut(&stream.set) {
            set.streams.forget(stream.lane);
        }
    }

    /// The link to a guard asked for with [`ProxyOutput::Connect`] is up.
    pub fn link_up(
        &mut self,
        now: Instant,
        link: LinkId,
        addr: SocketAddr,
        identity: Ed25519Identity,
    ) {
        self.links.insert((addr, identity), link);
        if self.more.knows(&identity) {
            let register = self.more.link_up(now, link, identity);
            self.out.push_back(ProxyOutput::SendMore(link, register));
        }
        for (set, path) in self
            .connecting
            .remove(&(addr, identity))
            .unwrap_or_default()
        {
            if let Some(s) = self.sets.get_mut(&set) {
                s.waiting -= 1;
                self.build(now, set, link, path);
            }
        }
        self.pump(now);
    }

    /// The link to a guard could not be opened: the paths through it fail.
    pub fn link_failed(&mut self, addr: SocketAddr, identity: Ed25519Identity) {
        for (set, _) in self
            .connecting
            .remove(&(addr, identity))
            .unwrap_or_default()
        {
            if let Some(s) = self.sets.get_mut(&set) {
                s.waiting -= 1;
                self.out.push_back(ProxyOutput::LegClosed {
                    set,
                    error: Error::LinkDown,
                });
                self.fail_if_empty(set);
            }
        }
    }

    /// A link is gone: its circuits fail.
    pub fn link_down(&mut self, now: Instant, link: LinkId) {
        self.links.retain(|_, l| *l != link);
        self.more.link_down(link);
        self.client.link_down(link);
        self.drain_client(now);
        self.pump(now);
    }

    /// A cell from `link`.
    pub fn handle_cell(&mut self, now: Instant, link: LinkId, bytes: &[u8]) {
        self.client.handle_cell(now, link, bytes);
        self.drain_client(now);
        self.pump(now);
    }

    /// Run the timers: handshakes and LINKs resent, slow builds failed,
    /// the TCPs' timers.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.client.handle_timeout(now);
        let mut relink = Vec::new();
        for (&id, set) in self.sets.iter_mut() {
            // A kernel set's connections are the kernel's: keep its legs.
            let has_streams = set.streams.e2e.mux().lanes() > 0 || set.streams.e2e.is_kernel();
            let kernel = set.streams.e2e.is_kernel();
            for (&circuit, leg) in set.legs.iter_mut() {
                match leg {
                    Leg::Linking { resend_at, wait } if now >= *resend_at => {
                        *wait = (*wait * 2).min(self.settings.circuits.max_resend);
                        *resend_at = now + *wait;
                        relink.push((circuit, set.nonce, kernel));
                    }
                    Leg::Linked { keepalive_at } if now >= *keepalive_at => {
                        *keepalive_at = now + LEG_KEEPALIVE;
                        if has_streams {
                            relink.push((circuit, set.nonce, kernel));
                        }
                    }
                    _ => {}
                }
            }
            if set.streams.e2e.poll_timeout().is_some_and(|t| t <= now) {
                set.streams.e2e.mux().handle_timeout(now);
                set.streams.after_tcp(now, id, true, &mut self.events);
            }
        }
        for (circuit, nonce, kernel) in relink {
            self.send_link(circuit, &nonce, kernel);
        }
        self.more_timers(now);
        self.drain_client(now);
        self.pump(now);
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let sets = self.sets.values().flat_map(|s| {
            let relink = s.legs.values().filter_map(|l| match l {
                Leg::Linking { resend_at, .. } => Some(*resend_at),
                Leg::Linked { keepalive_at } => Some(*keepalive_at),
                Leg::Building => None,
            });
            let stall = s
                .more
                .as_ref()
                .filter(|_| s.streams.e2e.lanes() > 0)
                .map(|m| m.probe_at.min(m.heard_at + MORE_TIMEOUT));
            relink.chain(s.streams.e2e.poll_timeout()).chain(stall)
        });
        sets.chain(self.client.poll_timeout())
            .chain(self.more.poll_timeout())
            .min()
    }

    /// What the client asks or tells next.
    pub fn poll_output(&mut self) -> Option<ProxyOutput> {
        self.out.pop_front()
    }

    /// The next stream event (wakes).
    pub fn poll_stream_event(&mut self) -> Option<StreamEvent> {
        self.events.pop_front()
    }

    fn build(&mut self, now: Instant, set: u64, link: LinkId, path: Vec<HopSpec>) {
        match self.client.build(now, link, path) {
            Ok(circuit) => {
                self.by_circuit.insert(circuit, set);
                if let Some(s) = self.sets.get_mut(&set) {
                    s.legs.insert(circuit, Leg::Building);
                }
            }
            Err(error) => {
                self.out.push_back(ProxyOutput::LegClosed { set, error });
                self.fail_if_empty(set);
            }
        }
        self.drain_client(now);
    }

    fn send_link(&mut self, circuit: CircuitId, nonce: &[u8; NONCE_LEN], kernel: bool) {
        if let Some(hops) = self.client.hops(circuit) {
            // A failure ends the circuit, reported by the client.
            let _ = self
                .client
                .send(circuit, hops - 1, &link_msg(nonce, kernel));
        }
    }

    /// Segments from the sets' TCPs onto their circuits, then the
    /// client's cells out.
    fn pump(&mut self, now: Instant) {
        let mut sends: Vec<(CircuitId, RelayMsg)> = Vec::new();
        for set in self.sets.values_mut() {
            while let Some(send) = set.streams.e2e.poll_transmit() {
                sends.push(send);
            }
        }
        for (circuit, msg) in sends {
            if let Some(hops) = self.client.hops(circuit) {
                // Lost like any datagram if the circuit just ended.
                let _ = self.client.send(circuit, hops - 1, &msg);
            }
        }
        self.pump_more(now);
        self.drain_client(now);
        if self.sets.values().any(|s| s.retiring) {
            self.close_retired();
        }
    }

    fn drain_client(&mut self, now: Instant) {
        while let Some(o) = self.client.poll_output() {
            match o {
                ClientOutput::Transmit(link, cell) => {
                    self.out.push_back(ProxyOutput::Transmit(link, cell))
                }
                ClientOutput::Built(circuit) => self.on_built(now, circuit),
                ClientOutput::Closed { circuit, error } => self.on_closed(circuit, error),
                ClientOutput::Delivered { circuit, hop, msg } => {
                    self.on_delivered(now, circuit, hop, msg)
                }
            }
        }
    }

    fn on_built(&mut self, now: Instant, circuit: CircuitId) {
        let Some(set) = self
            .by_circuit
            .get(&circuit)
            .and_then(|id| self.sets.get_mut(id))
        else {
            return self.client.close(circuit);
        };
        let wait = self.settings.circuits.first_resend;
        set.legs.insert(
            circuit,
            Leg::Linking {
                resend_at: now + wait,
                wait,
            },
        );
        let (nonce, kernel) = (set.nonce, set.streams.e2e.is_kernel());
        self.send_link(circuit, &nonce, kernel);
    }

    fn on_closed(&mut self, circuit: CircuitId, error: Error) {
        let Some(id) = self.by_circuit.remove(&circuit) else {
            return;
        };
        if let Some(set) = self.sets.get_mut(&id) {
            set.legs.remove(&circuit);
            set.streams.e2e.remove_leg(circuit);
            self.out
                .push_back(ProxyOutput::LegClosed { set: id, error });
            self.fail_if_empty(id);
        }
    }

    fn on_delivered(&mut self, now: Instant, circuit: CircuitId, hop: usize, msg: RelayMsg) {
        let Some(&id) = self.by_circuit.get(&circuit) else {
            return;
        };
        let from_exit = self.client.hops(circuit) == Some(hop + 1);
        let Some(set) = self.sets.get_mut(&id) else {
            return;
        };
        match msg.command {
            RelayCommand::Linked if from_exit && msg.data == set.nonce => {
                if let Some(leg @ Leg::Linking { .. }) = set.legs.get_mut(&circuit) {
                    *leg = Leg::Linked {
                        keepalive_at: now + LEG_KEEPALIVE,
                    };
                    set.streams.e2e.add_leg(circuit);
                    self.out.push_back(ProxyOutput::Linked {
                        set: id,
                        legs: set.streams.e2e.legs().len(),
                    });
                }
            }
            RelayCommand::Segment if from_exit => {
                if matches!(set.legs.get(&circuit), Some(Leg::Linked { .. })) {
                    set.streams.e2e.handle_segment(&msg.data, now);
                    set.streams.after_tcp(now, id, true, &mut self.events);
                }
            }
            // Anything else breaks the protocol: the circuit ends.
            _ => {
                self.client.close(circuit);
                self.on_closed(circuit, Error::Protocol("an unexpected message from a hop"));
            }
        }
    }

    /// A set with no circuit linked, building or waiting fails.
    fn fail_if_empty(&mut self, id: u64) {
        let empty = self
            .sets
            .get(&id)
            .is_some_and(|s| s.more.is_none() && s.legs.is_empty() && s.waiting == 0);
        if empty {
            if let Some(set) = self.sets.remove(&id) {
                self.ended += set.streams.fail(id, &mut self.events);
                self.out.push_back(ProxyOutput::SetFailed(id));
            }
        }
    }

    /// Run `f` on `stream`'s set between two looks at its TCP, then send
    /// what it made; `None` if the set is gone.
    fn with_set<T>(
        &mut self,
        now: Instant,
        stream: StreamKey,
        f: impl FnOnce(&mut SetStreams, Instant) -> T,
    ) -> Option<T> {
        let set = self.sets.get_mut(&stream.set)?;
        set.streams
            .after_tcp(now, stream.set, false, &mut self.events);
        let out = f(&mut set.streams, now);
        set.streams
            .after_tcp(now, stream.set, false, &mut self.events);
        self.pump(now);
        Some(out)
    }
}

//! The client's shared state: the sans-IO [`ClientNode`] (guard channels,
//! their circuit-ID maps and schedulers, circuits and their streams) and
//! what the node leaves to its driver: path selection, which circuit a
//! stream may use (isolation, exit policy, dirtiness, network document
//! changes), the stream tasks' slots, and the connections' tasks.
//!
//! Every task holds an `Rc<RefCell<State>>` and borrows it only between
//! awaits. Whatever calls into the node calls [`State::settle`] afterwards,
//! which handles the node's events (circuits built or closed, stream
//! events waking stream tasks, channels to connect) and wakes the writer
//! task of every channel with cells to send.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_cell::msg::{EncodedLinkSpec, EndReason, LinkSpec, StreamId};
use onionlab_circuit::client::{ClientConfig, ClientEvent};
use onionlab_circuit::client_node::{ClientNode, ClientNodeConfig, ClientNodeEvent, PathHop};
use onionlab_circuit::conflux::sched::LegSchedulerKind;
use onionlab_circuit::stream::StreamEvent;
use onionlab_netdoc::doc::TRANSPORT_TLS;
use onionlab_netdoc::{ExitPolicy, NetworkDocument, RelayEntry};
use onionlab_transport::addrs::EndpointAddrs;
use onionlab_transport::connector::Connector;
use onionlab_transport::{CellWriter, Ordering};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::{watch, Notify};
use tokio::task::{AbortHandle, JoinHandle};
use tor_llcrypto::pk::ed25519::Ed25519Identity;

pub(crate) use onionlab_circuit::client_node::BuildFailure;
pub(crate) use onionlab_circuit::node::CircKey;

use crate::path::{path_names, resolve_pinned, select_legs, PathError, PinnedPathError, Target};
use crate::settings::ClientSettings;
use crate::socks::{IsolationKey, StreamFailure};

/// The state as the tasks share it.
pub(crate) type Shared = Rc<RefCell<State>>;

/// Identifies a channel within the client (a new channel to the same
/// guard gets a new key).
pub(crate) type ChanKey = onionlab_circuit::node::ChannelId;

/// A relay's Ed25519 identity: how state that outlives a network document
/// (channels, failed relays) names relays. Indexes into a document's relay
/// list are only meaningful with that document.
pub(crate) type RelayId = [u8; 32];

/// Where a circuit's construction is, as its waiters see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Hops are being added.
    Building,
    /// Every hop is there; streams may attach.
    Open,
    /// The build failed.
    Failed(BuildFailure),
}

/// Settings with the pinned path (or legs) resolved against their network
/// document. A newer document makes a new `Config`
/// ([`State::replace_network`]).
#[derive(Debug)]
pub(crate) struct Config {
    pub(crate) settings: ClientSettings,
    /// Relay indexes of the pinned path (one) or pinned legs (`paths`),
    /// if the settings pin any.
    pub(crate) pinned: Option<Vec<Vec<usize>>>,
    /// Index of each relay of the document, by identity.
    by_identity: HashMap<RelayId, usize>,
}

/// Pinned legs resolved as [`resolve_pinned`] resolves a path: 1 to
/// `MAX_LEGS_PER_SET` of them, all ending at the same exit (the
/// configuration file checks the same; settings built in code are checked
/// here).
fn resolve_legs(
    relays: &[RelayEntry],
    legs: &[Vec<String>],
) -> Result<Vec<Vec<usize>>, PinnedPathError> {
    let max = onionlab_circuit::node::MAX_LEGS_PER_SET;
    if legs.is_empty() || legs.len() > max {
        return Err(PinnedPathError::BadLegs(format!(
            "1 to {max} paths, not {}",
            legs.len()
        )));
    }
    let resolved = legs
        .iter()
        .map(|names| resolve_pinned(relays, names))
        .collect::<Result<Vec<_>, _>>()?;
    if resolved.iter().any(|p| p.last() != resolved[0].last()) {
        return Err(PinnedPathError::BadLegs(
            "every leg must end at the same exit".into(),
        ));
    }
    Ok(resolved)
}

impl Config {
    /// `settings` with their pinned path (if any) resolved by nickname
    /// against their document.
    pub(crate) fn new(settings: ClientSettings) -> Result<Self, PinnedPathError> {
        let relays = &settings.network.relays;
        let pinned = match (&settings.path, &settings.paths) {
            (Some(names), _) => Some(vec![resolve_pinned(relays, names)?]),
            (None, Some(legs)) => Some(resolve_legs(relays, legs)?),
            (None, None) => None,
        };
        let by_identity = settings
            .network
            .relays
            .iter()
            .enumerate()
            .map(|(i, r)| (r.ed_identity, i))
            .collect();
        Ok(Config {
            settings,
            pinned,
            by_identity,
        })
    }

    fn relays(&self) -> &[RelayEntry] {
        &self.settings.network.relays
    }

    /// Legs of each new circuit: the pinned legs or the `legs` setting
    /// when the network's exits link sets (`cfx_enabled`), else 1.
    pub(crate) fn legs(&self) -> usize {
        if !self.settings.network.params.cfx_enabled {
            return 1;
        }
        self.pinned
            .as_ref()
            .map_or(self.settings.legs, Vec::len)
            .max(1)
    }

    /// The leg scheduler of this end of a set: the setting, else the
    /// network's.
    fn leg_scheduler(&self) -> LegSchedulerKind {
        self.settings
            .leg_scheduler
            .unwrap_or(self.settings.network.params.cfx_scheduler)
    }

    /// The index in this document of the relay with identity `id`.
    fn index_of(&self, id: &RelayId) -> Option<usize> {
        self.by_identity.get(id).copied()
    }
}

/// A stream attached to a circuit, as its SOCKS task refers to it. The
/// token tells this stream apart from a later one that reuses its ID.
#[derive(Debug, Clone)]
pub(crate) struct StreamRef {
    pub(crate) circ: CircKey,
    pub(crate) id: StreamId,
    token: u64,
}

/// What a stream task sees of its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamView {
    /// The stream exists (or its received bytes are still readable).
    Live {
        /// The exit answered CONNECTED.
        connected: bool,
        /// The exit sent END with this reason.
        ended: Option<EndReason>,
    },
    /// The circuit closed (or the stream is otherwise lost): abandon it.
    Lost,
}

/// The result of reading a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadResult {
    /// This many bytes (0: nothing now).
    Data(usize),
    /// The stream is gone from the circuit (ended and drained, or ended by
    /// us).
    Gone,
}

/// A stream task's entry in its circuit.
#[derive(Debug)]
struct StreamSlot {
    token: u64,
    notify: Rc<Notify>,
    connected: bool,
    ended: Option<EndReason>,
}

/// What the client knows of one circuit beyond the node: where it goes,
/// who may use it, and its streams' tasks. Dropped when the node reports
/// the circuit closed.
struct Circ {
    /// The document the legs were chosen from: `legs` index its relays,
    /// whatever document the client holds now.
    doc: Arc<NetworkDocument>,
    /// The path of each leg (one unless it is a multi-path set); every
    /// leg ends at the same exit.
    legs: Vec<Vec<usize>>,
    /// A newer document no longer lists a relay of the path (or changed
    /// the exit's policy): no new streams; closed with its last stream.
    stale: bool,
    isolation: IsolationKey,
    phase: watch::Sender<Phase>,
    first_use: Option<Instant>,
    streams: HashMap<u16, StreamSlot>,
}

impl Circ {
    fn is_open(&self) -> bool {
        *self.phase.borrow() == Phase::Open
    }

    fn is_building(&self) -> bool {
        *self.phase.borrow() == Phase::Building
    }

    fn is_dirty(&self, now: Instant, max: Duration) -> bool {
        too_dirty(self.first_use, now, max)
    }

    /// No new streams: dirty, or stale after a document change.
    fn is_retired(&self, now: Instant, max: Duration) -> bool {
        self.stale || self.is_dirty(now, max)
    }

    /// The exit's entry in the circuit's document.
    fn exit(&self) -> Option<&RelayEntry> {
        let path = self.legs.first()?;
        path.last().and_then(|&e| self.doc.relays.get(e))
    }

    /// Nicknames of its path, or of each leg's path separated by ` + `.
    fn path_names(&self) -> String {
        legs_names(&self.doc.relays, &self.legs)
    }

    fn slot(&self, s: &StreamRef) -> Option<&StreamSlot> {
        self.streams
            .get(&u16::from(s.id))
            .filter(|slot| slot.token == s.token)
    }
}

/// The tasks of one channel to a guard (the node holds the rest).
struct ChannelTasks {
    guard: RelayId,
    /// The guard's nickname, for logs.
    guard_nick: String,
    wake: Rc<Notify>,
    reader: Option<AbortHandle>,
    writer: Option<AbortHandle>,
}

/// What the writer task of a channel should do after [`State::fill`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fill {
    /// Flush what was queued (if anything), then wait for work.
    Continue,
    /// The channel is gone: stop.
    Gone,
    /// The channel is closing and has nothing left: shut the link down.
    Done,
}

/// How a stream gets a circuit.
pub(crate) enum Pick {
    /// This open circuit fits.
    Ready(CircKey),
    /// This circuit being built fits: wait for it.
    Pending(CircKey, watch::Receiver<Phase>),
    /// Nothing fits: build a circuit on this path.
    Launch(NewPath),
}

/// A path for a new circuit, or the paths of a new multi-path set: relay
/// indexes (guard first) into `doc`.
pub(crate) struct NewPath {
    pub(crate) doc: Arc<NetworkDocument>,
    /// One path, or one per leg of a set.
    pub(crate) legs: Vec<Vec<usize>>,
}

/// Nicknames of paths, each as [`path_names`] gives it, separated by ` + `.
fn legs_names(relays: &[RelayEntry], legs: &[Vec<usize>]) -> String {
    legs.iter()
        .map(|p| path_names(relays, p))
        .collect::<Vec<_>>()
        .join(" + ")
}

/// What [`State::replace_network`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Swapped {
    /// Relays of the old document the new one no longer lists.
    pub(crate) vanished: usize,
    /// Circuits that now take no new streams (a relay of theirs vanished,
    /// or their exit's policy changed).
    pub(crate) retired: usize,
}

/// Everything the client's tasks share.
pub(crate) struct State {
    pub(crate) cfg: Rc<Config>,
    connector: Connector,
    rng: StdRng,
    node: ClientNode,
    channels: HashMap<ChanKey, ChannelTasks>,
    circuits: HashMap<CircKey, Circ>,
    /// Channels the node asked for since the last launch took them.
    wanted: Vec<(ChanKey, Ed25519Identity)>,
    /// Wakes the timer task when the node's next deadline moved earlier.
    timer: Rc<Notify>,
    /// The deadline the timer task sleeps until.
    timer_armed: Option<Instant>,
    next_token: u64,
    shutting_down: bool,
    /// Writer tasks, awaited at shutdown so DESTROYs go out.
    writers: Vec<JoinHandle<()>>,
    /// Relays (by identity) that failed recently, and when: random paths
    /// avoid them for `relay_failure_avoidance` unless no path exists
    /// without them.
    failed_relays: HashMap<RelayId, Instant>,
    /// Stream failures are logged at INFO, at most one line per interval.
    stream_failures: onionlab_ops::LogLimiter,
}

/// Whether a stream to `target` with isolation `iso` may use a circuit
/// with isolation `circ_iso` whose exit has `exit_policy`.
pub(crate) fn may_share(
    circ_iso: &IsolationKey,
    exit_policy: &ExitPolicy,
    iso: &IsolationKey,
    target: &Target,
) -> bool {
    circ_iso.compatible(iso) && target.allowed_by(exit_policy)
}

/// Whether a circuit first used at `first_use` is too old for new streams
/// (a circuit never used is not).
pub(crate) fn too_dirty(first_use: Option<Instant>, now: Instant, max: Duration) -> bool {
    first_use.is_some_and(|t| now.saturating_duration_since(t) >= max)
}

/// Link specifiers of a relay for EXTEND2: its TLS address and Ed25519
/// identity.
pub(crate) fn linkspecs(r: &RelayEntry) -> Vec<EncodedLinkSpec> {
    let mut specs = Vec::with_capacity(2);
    if let Some(a) = r.address(TRANSPORT_TLS) {
        specs.push(LinkSpec::OrPort(a.ip(), a.port()));
    }
    specs.push(LinkSpec::Ed25519Id(Ed25519Identity::new(r.ed_identity)));
    specs.iter().filter_map(|s| s.encode().ok()).collect()
}

/// The client's connector ([`Connector::client`]). Fails only if the
/// dtls-utcp UDP socket cannot be bound.
fn connector(settings: &crate::ClientSettings) -> Result<Connector, crate::Error> {
    Connector::client(&settings.link)
        .map_err(|e| crate::Error::Setting(format!("the client's endpoints: {e}")))
}

/// The path of relays `path` (indexes into `doc`) as the node takes it.
fn path_hops(doc: &NetworkDocument, path: &[usize]) -> Vec<PathHop> {
    path.iter()
        .filter_map(|&i| doc.relays.get(i))
        .map(|r| PathHop {
            keys: r.public_keys(),
            linkspecs: linkspecs(r),
            name: r.nickname.clone(),
        })
        .collect()
}

impl State {
    pub(crate) fn new(cfg: Config) -> Result<Self, crate::Error> {
        let settings = &cfg.settings;
        let node = ClientNode::new(
            ClientNodeConfig {
                scheduler: settings.scheduler,
                build_timeout: settings.circuit_build_timeout,
                circuit: ClientConfig {
                    hop_timeout: settings.circuit_build_timeout,
                    ..ClientConfig::default()
                },
            },
            rand::make_rng(),
        );
        let rng = match settings.path_seed {
            Some(seed) => {
                tracing::warn!(
                    seed,
                    "path_seed is set: this client's paths are predictable (for experiments only)"
                );
                StdRng::seed_from_u64(seed)
            }
            None => rand::make_rng(),
        };
        Ok(State {
            connector: connector(settings)?,
            cfg: Rc::new(cfg),
            rng,
            node,
            channels: HashMap::new(),
            circuits: HashMap::new(),
            wanted: Vec::new(),
            timer: Rc::new(Notify::new()),
            timer_armed: None,
            next_token: 1,
            shutting_down: false,
            writers: Vec::new(),
            failed_relays: HashMap::new(),
            stream_failures: onionlab_ops::LogLimiter::default(),
        })
    }

    /// Log a stream failure at INFO, rate-limited (with the count of the
    /// failures held back since the last line).
    pub(crate) fn log_stream_failure(&mut self, what: &str) {
        if let Some(held_back) = self.stream_failures.check(Instant::now()) {
            if held_back > 0 {
                tracing::info!("{what} (and {held_back} more stream failures since the last line)");
            } else {
                tracing::info!("{what}");
            }
        }
    }

    /// Indexes, in the document held now, of the relays that failed
    /// within the avoidance period before `now` (a relay the document no
    /// longer lists is left out).
    fn recently_failed(&mut self, now: Instant) -> Vec<usize> {
        let period = self.cfg.settings.relay_failure_avoidance;
        self.failed_relays
            .retain(|_, at| now.saturating_duration_since(*at) < period);
        self.failed_relays
            .keys()
            .filter_map(|id| self.cfg.index_of(id))
            .collect()
    }

    /// Use `doc`, a newer network document, from now on: the pinned path
    /// is resolved again by nickname (if it no longer resolves, nothing
    /// changes and the error says why). Nothing else needs remapping:
    /// circuits keep the document they were built from, channels and
    /// failed relays are named by identity. Circuits through a relay `doc`
    /// no longer lists, or whose exit's policy changed, take no new streams
    /// and close with their last stream; channels and streams keep working.
    pub(crate) fn replace_network(
        &mut self,
        doc: Arc<NetworkDocument>,
    ) -> Result<Swapped, PinnedPathError> {
        let mut settings = self.cfg.settings.clone();
        settings.network = doc;
        let cfg = Config::new(settings)?;
        let vanished = self
            .cfg
            .relays()
            .iter()
            .filter(|r| cfg.index_of(&r.ed_identity).is_none())
            .count();
        let mut retired = 0;
        for c in self.circuits.values_mut() {
            let usable = c
                .legs
                .iter()
                .all(|path| still_usable(&c.doc.relays, path, &cfg));
            if !c.stale && !usable {
                c.stale = true;
                retired += 1;
            }
        }
        self.cfg = Rc::new(cfg);
        Ok(Swapped { vanished, retired })
    }

    /// How a stream to `target` with isolation `iso` gets a circuit: an
    /// open circuit that fits (same isolation, exit policy allows the
    /// target, not dirty; the newest first), else one being built that
    /// fits, else a new path.
    pub(crate) fn pick(
        &mut self,
        target: &Target,
        iso: &IsolationKey,
    ) -> Result<Pick, StreamFailure> {
        if self.shutting_down {
            return Err(StreamFailure::ShuttingDown);
        }
        let now = Instant::now();
        let cfg = self.cfg.clone();
        let relays = cfg.relays();
        let max_dirty = cfg.settings.max_circuit_dirtiness;
        let fits = |c: &Circ| {
            !c.stale
                && c.exit()
                    .is_some_and(|e| may_share(&c.isolation, &e.exit_policy, iso, target))
        };
        let ready = self
            .circuits
            .iter()
            .filter(|(_, c)| c.is_open() && !c.is_retired(now, max_dirty) && fits(c))
            .map(|(k, _)| *k)
            .max();
        if let Some(k) = ready {
            return Ok(Pick::Ready(k));
        }
        let pending = self
            .circuits
            .iter()
            .filter(|(_, c)| c.is_building() && fits(c))
            .map(|(k, c)| (*k, c))
            .max_by_key(|(k, _)| *k);
        if let Some((k, c)) = pending {
            return Ok(Pick::Pending(k, c.phase.subscribe()));
        }
        let launch = |legs: Vec<Vec<usize>>| {
            Pick::Launch(NewPath {
                doc: cfg.settings.network.clone(),
                legs,
            })
        };
        let legs = cfg.legs();
        match &cfg.pinned {
            Some(pinned) => {
                let exit = pinned[0].last().and_then(|&e| relays.get(e));
                if exit.is_some_and(|e| target.allowed_by(&e.exit_policy)) {
                    Ok(launch(pinned[..legs.min(pinned.len())].to_vec()))
                } else {
                    Err(StreamFailure::NotAllowed)
                }
            }
            None => {
                let avoid = self.recently_failed(now);
                let paths = select_legs(relays, target, legs, &avoid, &mut self.rng).or_else(|e| {
                    if avoid.is_empty() {
                        return Err(e);
                    }
                    tracing::debug!(
                        avoided = %path_names(relays, &avoid),
                        "no path without recently failed relays ({e}): using them"
                    );
                    select_legs(relays, target, legs, &[], &mut self.rng)
                });
                match paths {
                    Ok(paths) => Ok(launch(paths.iter().map(|p| p.to_vec()).collect())),
                    Err(PathError::NoExit { .. }) => Err(StreamFailure::NotAllowed),
                    Err(e) => Err(StreamFailure::NoPath(e.to_string())),
                }
            }
        }
    }

    /// Start building a circuit on `path` (guard first): the node sends
    /// CREATE2 on the guard's channel (opened here if there is none), then
    /// an EXTEND2 per hop as each is added, and abandons the build after
    /// the build timeout. With several legs, a linked set: one circuit per
    /// leg, linked at their exit (the set is built when every leg is
    /// linked; it fails if any leg does).
    pub(crate) fn launch(
        &mut self,
        shared: &Shared,
        path: NewPath,
        iso: IsolationKey,
    ) -> (CircKey, watch::Receiver<Phase>) {
        let NewPath { doc, legs } = path;
        let now = Instant::now();
        let mut paths: Vec<Vec<PathHop>> = legs.iter().map(|p| path_hops(&doc, p)).collect();
        let cc = doc.params.circuit_cc;
        let launched = match paths.len() {
            1 => self.node.launch(now, paths.remove(0), cc),
            _ => self
                .node
                .launch_set(now, paths, cc, self.cfg.leg_scheduler()),
        };
        let key = match launched {
            Ok(key) => key,
            Err(e) => {
                // Path selection never gives an empty path.
                let failure = BuildFailure::Failed(format!("cannot launch: {e}"));
                let (_, rx) = watch::channel(Phase::Failed(failure));
                return (CircKey(0), rx);
            }
        };
        tracing::debug!(
            circ = key.0,
            path = %legs_names(&doc.relays, &legs),
            legs = legs.len(),
            "building circuit"
        );
        let (phase, rx) = watch::channel(Phase::Building);
        self.circuits.insert(
            key,
            Circ {
                doc: doc.clone(),
                legs,
                stale: false,
                isolation: iso,
                phase,
                first_use: None,
                streams: HashMap::new(),
            },
        );
        self.settle();
        for (chan, guard) in std::mem::take(&mut self.wanted) {
            match doc
                .relays
                .iter()
                .find(|r| Ed25519Identity::new(r.ed_identity) == guard)
            {
                Some(relay) => self.connect_channel(shared, chan, relay),
                // Cannot happen (the guard is the path's first relay); the
                // node must still learn, or its channel would never open.
                None => {
                    let why = "the guard is not in the circuit's document";
                    self.node.channel_closed(now, chan, why);
                    self.settle();
                }
            }
        }
        (key, rx)
    }

    /// Start the connection of channel `chan` to `relay`.
    fn connect_channel(&mut self, shared: &Shared, chan: ChanKey, relay: &RelayEntry) {
        self.channels.insert(
            chan,
            ChannelTasks {
                guard: relay.ed_identity,
                guard_nick: relay.nickname.clone(),
                wake: Rc::new(Notify::new()),
                reader: None,
                writer: None,
            },
        );
        let identity = Ed25519Identity::new(relay.ed_identity);
        let addrs = EndpointAddrs::from_document(|name| relay.address(name));
        match addrs.any() {
            Some(addr) => {
                tracing::debug!(guard = %relay.nickname, %addr, "opening channel");
                tokio::task::spawn_local(crate::channel::connect(
                    shared.clone(),
                    chan,
                    addrs,
                    identity,
                ));
            }
            None => {
                // Path selection only picks relays with a tls address; a
                // channel to one without fails its circuits at once.
                let nick = &relay.nickname;
                self.close_channel(chan, &format!("guard {nick} has no tls address"));
            }
        }
    }

    /// Handle what the node reports: circuits built or closed, stream
    /// events (waking their tasks), relays that failed, channels it wants;
    /// then wake the writers of channels with cells to send, and the timer
    /// task if the node's next deadline moved earlier.
    pub(crate) fn settle(&mut self) {
        let now = Instant::now();
        while let Some(ev) = self.node.poll_event() {
            match ev {
                ClientNodeEvent::ChannelWanted { chan, guard } => self.wanted.push((chan, guard)),
                ClientNodeEvent::Built { circ, elapsed } => {
                    if let Some(c) = self.circuits.get_mut(&circ) {
                        c.phase.send_replace(Phase::Open);
                        tracing::info!(
                            circ = circ.0,
                            path = %c.path_names(),
                            ms = elapsed.as_millis() as u64,
                            "circuit built"
                        );
                    }
                }
                ClientNodeEvent::Circuit { circ, event } => self.on_circuit_event(circ, event, now),
                ClientNodeEvent::LegHopFailed { set, leg, hop } => {
                    // As for a plain circuit's HopFailed: avoided a while.
                    let Some(c) = self.circuits.get(&set) else {
                        continue;
                    };
                    let relay = c.legs.get(leg).and_then(|p| p.get(hop));
                    if let Some(r) = relay.and_then(|&i| c.doc.relays.get(i)) {
                        self.failed_relays.insert(r.ed_identity, now);
                    }
                }
                ClientNodeEvent::Closed {
                    circ,
                    reason,
                    build_failure,
                    detail,
                } => {
                    let Some(c) = self.circuits.remove(&circ) else {
                        continue;
                    };
                    let path = c.path_names();
                    match build_failure {
                        Some(failure) => {
                            match &failure {
                                BuildFailure::Timeout => tracing::info!(
                                    circ = circ.0,
                                    %path,
                                    "circuit build timed out after {:?}",
                                    self.cfg.settings.circuit_build_timeout
                                ),
                                BuildFailure::Failed(why) => {
                                    tracing::info!(circ = circ.0, %path, "circuit build failed: {why}")
                                }
                            }
                            c.phase.send_replace(Phase::Failed(failure));
                        }
                        None if reason.kind == onionlab_circuit::CloseKind::Local
                            && reason.reason == onionlab_cell::chan::DestroyReason::NONE =>
                        {
                            tracing::debug!(circ = circ.0, %path, "circuit closed: {reason}");
                        }
                        None => {
                            let why = detail.unwrap_or_else(|| reason.to_string());
                            tracing::info!(
                                circ = circ.0,
                                %path,
                                streams = c.streams.len(),
                                "circuit failed: {why}"
                            );
                        }
                    }
                    for slot in c.streams.values() {
                        slot.notify.notify_one();
                    }
                }
            }
        }
        while let Some(chan) = self.node.poll_channel_ready() {
            if let Some(ch) = self.channels.get(&chan) {
                ch.wake.notify_one();
            }
        }
        if self.node.take_deadline_changed() {
            let next = self.node.poll_timeout();
            if next.is_some_and(|n| self.timer_armed.is_none_or(|armed| n < armed)) {
                self.timer.notify_one();
            }
        }
    }

    /// An event of circuit `key` other than its closing.
    fn on_circuit_event(&mut self, key: CircKey, event: ClientEvent, now: Instant) {
        let Some(c) = self.circuits.get_mut(&key) else {
            return;
        };
        match event {
            ClientEvent::HopFailed { hop, .. } => {
                // The circuit closes right after; its relay is avoided for
                // a while (it may be innocent: see ClientEvent::HopFailed).
                // (Plain circuits report it here, sets as LegHopFailed.)
                let hop_relay = c.legs.first().and_then(|p| p.get(hop));
                if let Some(r) = hop_relay.and_then(|&i| c.doc.relays.get(i)) {
                    self.failed_relays.insert(r.ed_identity, now);
                }
            }
            ClientEvent::Stream(ev) => {
                let (id, connected, ended) = match ev {
                    StreamEvent::Connected { stream } => (stream, true, None),
                    StreamEvent::Readable { stream } | StreamEvent::Writable { stream } => {
                        (stream, false, None)
                    }
                    StreamEvent::Ended { stream, reason } => (stream, false, Some(reason)),
                };
                if let Some(slot) = c.streams.get_mut(&u16::from(id)) {
                    slot.connected |= connected;
                    if ended.is_some() {
                        slot.ended = ended;
                        tracing::debug!(circ = key.0, stream = %id, reason = ?slot.ended, "stream ended by the exit");
                    }
                    slot.notify.notify_one();
                }
            }
            ClientEvent::HopAdded { .. }
            | ClientEvent::Resolved { .. }
            | ClientEvent::Closed(_)
            | ClientEvent::Linked { .. } => {}
        }
    }

    /// The timer task: sleeps until the node's next deadline (build and hop
    /// timeouts), or until woken because a nearer one appeared.
    pub(crate) async fn run_timer(shared: Shared) {
        let timer = shared.borrow().timer.clone();
        loop {
            let next = {
                let mut st = shared.borrow_mut();
                let next = st.node.poll_timeout();
                st.timer_armed = next;
                next
            };
            match next {
                Some(at) => tokio::select! {
                    () = tokio::time::sleep_until(at.into()) => {
                        let mut st = shared.borrow_mut();
                        st.node.handle_timeout(Instant::now());
                        st.settle();
                    }
                    () = timer.notified() => {}
                },
                None => timer.notified().await,
            }
        }
    }

    /// Open a stream to `target` on the open circuit `key`.
    pub(crate) fn attach(
        &mut self,
        key: CircKey,
        target: &Target,
        notify: Rc<Notify>,
    ) -> Result<StreamRef, StreamFailure> {
        let now = Instant::now();
        if !self.circuits.get(&key).is_some_and(Circ::is_open) {
            return Err(StreamFailure::CircuitClosed);
        }
        let begun = self
            .node
            .begin(now, key, &target.host_string(), target.port);
        self.settle();
        let id = begun.map_err(|e| match e {
            onionlab_circuit::Error::BadTarget(_) => StreamFailure::BadTarget,
            onionlab_circuit::Error::Closed => StreamFailure::CircuitClosed,
            other => StreamFailure::Attach(other.to_string()),
        })?;
        let Some(c) = self.circuits.get_mut(&key) else {
            return Err(StreamFailure::CircuitClosed);
        };
        let token = self.next_token;
        self.next_token += 1;
        c.first_use.get_or_insert(now);
        c.streams.insert(
            u16::from(id),
            StreamSlot {
                token,
                notify,
                connected: false,
                ended: None,
            },
        );
        tracing::debug!(circ = key.0, stream = %id, %target, "BEGIN");
        Ok(StreamRef {
            circ: key,
            id,
            token,
        })
    }

    /// What `s`'s task should know about it.
    pub(crate) fn stream_view(&self, s: &StreamRef) -> StreamView {
        match self.circuits.get(&s.circ).and_then(|c| c.slot(s)) {
            Some(slot) => StreamView::Live {
                connected: slot.connected,
                ended: slot.ended,
            },
            None => StreamView::Lost,
        }
    }

    /// Whether stream `s` still has its slot on a live circuit.
    fn is_live(&self, s: &StreamRef) -> bool {
        self.circuits
            .get(&s.circ)
            .is_some_and(|c| c.slot(s).is_some())
    }

    /// Offer bytes to stream `s`: how many it took (`None`: it is gone).
    pub(crate) fn stream_write(&mut self, s: &StreamRef, data: &[u8]) -> Option<usize> {
        if !self.is_live(s) {
            return None;
        }
        let r = self.node.write(Instant::now(), s.circ, s.id, data).ok();
        self.settle();
        r
    }

    /// When the exit's XON rate lets stream `s` take bytes again, if it
    /// refuses them now for the rate.
    pub(crate) fn stream_write_resumes_at(&mut self, s: &StreamRef) -> Option<Instant> {
        if !self.is_live(s) {
            return None;
        }
        self.node.write_resumes_at(s.circ, s.id)
    }

    /// Read what stream `s` received.
    pub(crate) fn stream_read(&mut self, s: &StreamRef, buf: &mut [u8]) -> ReadResult {
        if !self.is_live(s) {
            return ReadResult::Gone;
        }
        let r = match self.node.read(Instant::now(), s.circ, s.id, buf) {
            Ok(n) => ReadResult::Data(n),
            Err(_) => ReadResult::Gone,
        };
        self.settle();
        r
    }

    /// The application is done with stream `s`: END after its queued
    /// bytes (if the stream still exists), and forget its task. A circuit
    /// past its dirtiness limit closes with its last stream.
    pub(crate) fn detach(&mut self, s: &StreamRef) {
        let now = Instant::now();
        let max_dirty = self.cfg.settings.max_circuit_dirtiness;
        let Some(c) = self.circuits.get_mut(&s.circ) else {
            return;
        };
        if c.slot(s).is_none() {
            return;
        }
        c.streams.remove(&u16::from(s.id));
        let close_circuit = c.streams.is_empty() && c.is_open() && c.is_retired(now, max_dirty);
        if close_circuit {
            tracing::debug!(
                circ = s.circ.0,
                stale = c.stale,
                "closing dirty circuit after its last stream"
            );
        }
        // Fails harmlessly if the stream is already gone.
        let _ = self.node.close_stream(now, s.circ, s.id);
        if close_circuit {
            self.node.destroy(now, s.circ);
        }
        self.settle();
    }

    /// Close circuits past their dirtiness limit (or stale after a
    /// document change) that no stream uses.
    pub(crate) fn expire_dirty(&mut self) {
        let now = Instant::now();
        let max_dirty = self.cfg.settings.max_circuit_dirtiness;
        let expired: Vec<CircKey> = self
            .circuits
            .iter()
            .filter(|(_, c)| c.streams.is_empty() && c.is_open() && c.is_retired(now, max_dirty))
            .map(|(k, _)| *k)
            .collect();
        for key in expired {
            if let Some(c) = self.circuits.get(&key) {
                tracing::debug!(
                    circ = key.0,
                    stale = c.stale,
                    "closing dirty unused circuit"
                );
            }
            self.node.destroy(now, key);
        }
        self.settle();
    }

    /// The channel's connection is up: its writer and reader tasks run.
    pub(crate) fn channel_opened(
        &mut self,
        chan: ChanKey,
        reader: AbortHandle,
        writer: JoinHandle<()>,
        how: &str,
    ) -> bool {
        let Some(ch) = self.channels.get_mut(&chan) else {
            reader.abort();
            writer.abort();
            return false;
        };
        ch.reader = Some(reader);
        ch.writer = Some(writer.abort_handle());
        let nick = ch.guard_nick.clone();
        self.writers.retain(|w| !w.is_finished());
        self.writers.push(writer);
        self.node.channel_opened(chan);
        self.settle();
        tracing::info!(guard = %nick, "channel open to {nick} at {how}");
        true
    }

    /// The notifier of a channel's writer task.
    pub(crate) fn channel_wake(&self, chan: ChanKey) -> Option<Rc<Notify>> {
        self.channels.get(&chan).map(|c| c.wake.clone())
    }

    /// Address and identity of a channel's guard, for logs.
    pub(crate) fn channel_guard_name(&self, chan: ChanKey) -> String {
        self.channels
            .get(&chan)
            .map(|c| c.guard_nick.clone())
            .unwrap_or_default()
    }

    /// A channel is gone (connection failed or closed, or shutdown): its
    /// circuits close and their streams are told.
    pub(crate) fn close_channel(&mut self, chan: ChanKey, why: &str) {
        let Some(ch) = self.channels.remove(&chan) else {
            return;
        };
        let nick = &ch.guard_nick;
        if self.shutting_down {
            tracing::debug!(guard = %nick, "channel closed: {why}");
        } else {
            // The guard is unreachable or dropped us: avoid it for a while.
            self.failed_relays.insert(ch.guard, Instant::now());
            tracing::info!(guard = %nick, "channel closed: {why}");
        }
        if let Some(r) = &ch.reader {
            r.abort();
        }
        if let Some(w) = &ch.writer {
            w.abort();
        }
        let circuits = self.node.channel_closed(Instant::now(), chan, why);
        if circuits > 0 {
            tracing::debug!(guard = %nick, circuits, "circuits on the closed channel fail");
        }
        self.settle();
    }

    /// Cells read from a channel: to their circuits.
    pub(crate) fn handle_cells(
        &mut self,
        chan: ChanKey,
        cells: impl Iterator<Item = onionlab_cell::chan::AnyChanCell>,
    ) {
        let now = Instant::now();
        for cell in cells {
            self.node.handle_cell(now, chan, cell);
        }
        self.settle();
    }

    /// Queue cells of the channel's circuits on `w`, in the order the
    /// channel's circuit scheduler gives, while the writer has room.
    pub(crate) fn fill<W: CellWriter>(
        &mut self,
        chan: ChanKey,
        w: &mut W,
    ) -> Result<Fill, onionlab_transport::Error> {
        if !self.node.has_channel(chan) {
            return Ok(Fill::Gone);
        }
        let now = Instant::now();
        let filled = if w.ordering() == Ordering::PerCircuit {
            self.fill_lanes(chan, w, now)
        } else {
            self.fill_ordered(chan, w, now)
        };
        self.settle();
        filled?;
        Ok(if self.node.channel_done(chan) {
            Fill::Done
        } else {
            Fill::Continue
        })
    }

    /// [`fill`](Self::fill) for a writer that carries the channel as one
    /// ordered byte stream.
    fn fill_ordered<W: CellWriter>(
        &mut self,
        chan: ChanKey,
        w: &mut W,
        now: Instant,
    ) -> Result<(), onionlab_transport::Error> {
        while w.has_room() {
            let Some(cell) = self.node.poll_transmit(now, chan) else {
                break;
            };
            w.queue(cell)?;
        }
        Ok(())
    }

    /// [`fill`](Self::fill) for a writer with a lane per circuit: each
    /// circuit with cells fills its own lane while that lane has room, so a
    /// full lane holds back only its circuit. Lanes sharing one connection
    /// (QUIC streams) get the scheduler's priorities.
    fn fill_lanes<W: CellWriter>(
        &mut self,
        chan: ChanKey,
        w: &mut W,
        now: Instant,
    ) -> Result<(), onionlab_transport::Error> {
        for id in self.node.circuits_with_work(chan) {
            w.set_lane_priority(id, self.node.lane_priority(now, chan, id));
            while w.has_room_for(id) {
                let Some(cell) = self.node.poll_transmit_circuit(now, chan, id) else {
                    break;
                };
                w.queue(cell)?;
            }
        }
        Ok(())
    }

    /// Stop: refuse new streams, destroy every circuit, close channels
    /// once their DESTROYs are out. Returns the writer tasks to wait for.
    pub(crate) fn begin_shutdown(&mut self) -> Vec<JoinHandle<()>> {
        self.shutting_down = true;
        for chan in self.node.shutdown(Instant::now()) {
            // Not open yet: its connect task finds it gone.
            if let Some(ch) = self.channels.remove(&chan) {
                tracing::debug!(guard = %ch.guard_nick, "channel closed: shutting down");
            }
        }
        self.settle();
        std::mem::take(&mut self.writers)
    }

    /// Whether [`begin_shutdown`](Self::begin_shutdown) was called.
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// What opens channels.
    pub(crate) fn connector(&self) -> Connector {
        self.connector.clone()
    }
}

/// Whether a circuit on `path` (indexes into `relays`, the document it
/// was built from) may take new streams under the document of `new`:
/// every relay of the path is still listed, and the exit's policy is
/// unchanged.
fn still_usable(relays: &[RelayEntry], path: &[usize], new: &Config) -> bool {
    let listed: Option<Vec<(&RelayEntry, &RelayEntry)>> = path
        .iter()
        .map(|&i| {
            let old = relays.get(i)?;
            let now = new.relays().get(new.index_of(&old.ed_identity)?)?;
            Some((old, now))
        })
        .collect();
    match listed.as_deref() {
        Some([.., (old_exit, new_exit)]) => old_exit.exit_policy == new_exit.exit_policy,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharing_needs_same_isolation_and_a_fitting_exit() {
        let user = |u: &str| IsolationKey::UserPass {
            user: u.as_bytes().to_vec(),
            pass: b"pw".to_vec(),
        };
        let web = ExitPolicy::parse("accept *:80, accept *:443").expect("policy");
        let t80 = Target::ip("192.0.2.1".parse().expect("ip"), 80);
        let t22 = Target::ip("192.0.2.1".parse().expect("ip"), 22);
        let name80 = Target::name("example.com", 80);
        let none = IsolationKey::None;
        assert!(may_share(&none, &web, &none, &t80));
        assert!(may_share(&none, &web, &none, &name80));
        assert!(!may_share(&none, &web, &none, &t22), "exit policy");
        assert!(may_share(&user("a"), &web, &user("a"), &t80));
        assert!(!may_share(&user("a"), &web, &user("b"), &t80), "isolation");
        assert!(!may_share(&user("a"), &web, &none, &t80), "isolation");
        assert!(!may_share(&none, &web, &user("a"), &t80), "isolation");
    }

    #[test]
    fn dirtiness_counts_from_first_use() {
        let t0 = Instant::now();
        let max = Duration::from_secs(600);
        assert!(!too_dirty(None, t0 + Duration::from_secs(10_000), max));
        assert!(!too_dirty(Some(t0), t0 + Duration::from_secs(599), max));
        assert!(too_dirty(Some(t0), t0 + Duration::from_secs(600), max));
        // A limit of 0: one stream per circuit.
        assert!(too_dirty(Some(t0), t0, Duration::ZERO));
    }

    /// `n` relays named `relay0`...: even ones are guards, the last two
    /// exits.
    fn relays(n: usize) -> Vec<RelayEntry> {
        use onionlab_crypto::identity::RelaySecretKeys;
        use onionlab_netdoc::doc::TransportAddress;
        (0..n)
            .map(|i| {
                let keys = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(i as u64));
                let mut r = RelayEntry::new(format!("relay{i}"), &keys.public());
                r.addresses.push(TransportAddress {
                    transport: TRANSPORT_TLS.into(),
                    addr: format!("127.0.0.1:{}", 9000 + i).parse().expect("addr"),
                });
                r.flags.guard = i % 2 == 0;
                r.flags.exit = i + 2 >= n;
                r.exit_policy = ExitPolicy::parse("accept *:*").expect("policy");
                r
            })
            .collect()
    }

    /// A document valid from `valid_after` for a day.
    fn doc(relays: Vec<RelayEntry>, valid_after: u64) -> NetworkDocument {
        NetworkDocument {
            network_name: "test".into(),
            created_unix: valid_after,
            valid_after_unix: valid_after,
            valid_until_unix: valid_after + 86_400,
            params: Default::default(),
            relays,
        }
    }

    /// A state over `doc`, with a pinned path if `path` is given.
    fn state_with(doc: NetworkDocument, path: Option<&[&str]>) -> State {
        let mut settings = ClientSettings::new("127.0.0.1:0".parse().expect("addr"), doc);
        settings.path = path.map(|p| p.iter().map(|n| n.to_string()).collect());
        State::new(Config::new(settings).expect("pinned path resolves")).expect("state")
    }

    /// A state over `n` relays with random paths.
    fn state_with_relays(n: usize) -> State {
        state_with(doc(relays(n), 0), None)
    }

    /// The identity of the relay called `nick` in the document held.
    fn id(st: &State, nick: &str) -> RelayId {
        st.cfg
            .settings
            .network
            .relay_by_nickname(nick)
            .expect("listed")
            .ed_identity
    }

    fn launched(st: &mut State) -> Vec<usize> {
        let target = Target::ip("192.0.2.1".parse().expect("ip"), 80);
        match st.pick(&target, &IsolationKey::None) {
            Ok(Pick::Launch(p)) => {
                assert!(Arc::ptr_eq(&p.doc, &st.cfg.settings.network));
                assert_eq!(p.legs.len(), 1);
                p.legs[0].clone()
            }
            other => panic!("expected a new path, got {:?}", other.map(|_| ())),
        }
    }

    /// Nicknames of relay indexes of the document held.
    fn names(st: &State, path: &[usize]) -> String {
        path_names(st.cfg.relays(), path)
    }

    /// Add a circuit on `path` (nicknames, in the document held) that the
    /// client takes for built; its channel never opens.
    fn open_circuit(st: &mut State, path: &[&str]) -> CircKey {
        let doc = st.cfg.settings.network.clone();
        let path: Vec<usize> = path
            .iter()
            .map(|n| {
                doc.relays
                    .iter()
                    .position(|r| r.nickname == *n)
                    .expect("listed")
            })
            .collect();
        let hops = path_hops(&doc, &path);
        let key = st
            .node
            .launch(Instant::now(), hops, Default::default())
            .expect("a path");
        let (phase, _) = watch::channel(Phase::Open);
        let c = Circ {
            doc,
            legs: vec![path],
            stale: false,
            isolation: IsolationKey::None,
            phase,
            first_use: None,
            streams: HashMap::new(),
        };
        st.circuits.insert(key, c);
        // The node asks for the guard's channel; nothing opens it here.
        st.settle();
        key
    }

    #[test]
    fn a_path_seed_repeats_the_paths_and_none_varies_them() {
        let seeded = |seed| {
            let mut settings =
                ClientSettings::new("127.0.0.1:0".parse().expect("addr"), doc(relays(12), 0));
            settings.path_seed = Some(seed);
            let mut st = State::new(Config::new(settings).expect("config")).expect("state");
            (0..8).map(|_| launched(&mut st)).collect::<Vec<_>>()
        };
        assert_eq!(seeded(7), seeded(7), "same seed, same paths");
        assert_ne!(seeded(7), seeded(8), "another seed, other paths");
        // Without a seed, 8 paths over 12 relays repeat with a chance far
        // below 1e-6.
        let unseeded = || {
            let mut st = state_with_relays(12);
            (0..8).map(|_| launched(&mut st)).collect::<Vec<_>>()
        };
        assert_ne!(unseeded(), unseeded());
    }

    fn pick_web(st: &mut State) -> Pick {
        let target = Target::ip("192.0.2.1".parse().expect("ip"), 80);
        match st.pick(&target, &IsolationKey::None) {
            Ok(p) => p,
            Err(e) => panic!("no circuit: {e}"),
        }
    }

    /// A state whose document has `cfx_enabled` as given, with `legs`
    /// legs or the pinned `paths`.
    fn multipath_state(cfx: bool, legs: usize, paths: Option<&[&[&str]]>) -> State {
        let mut d = doc(relays(10), 0);
        d.params.cfx_enabled = cfx;
        let mut settings = ClientSettings::new("127.0.0.1:0".parse().expect("addr"), d);
        settings.legs = legs;
        settings.paths = paths.map(|ps| {
            ps.iter()
                .map(|p| p.iter().map(|n| n.to_string()).collect())
                .collect()
        });
        State::new(Config::new(settings).expect("resolves")).expect("state")
    }

    fn launched_legs(st: &mut State) -> Vec<String> {
        let target = Target::ip("192.0.2.1".parse().expect("ip"), 80);
        match st.pick(&target, &IsolationKey::None) {
            Ok(Pick::Launch(p)) => p.legs.iter().map(|l| names(st, l)).collect(),
            other => panic!("expected a new path, got {:?}", other.map(|_| ())),
        }
    }

    #[test]
    fn pinned_legs_built_in_code_are_checked() {
        let mut d = doc(relays(10), 0);
        d.params.cfx_enabled = true;
        let settings = |legs: Vec<Vec<&str>>| {
            let mut s = ClientSettings::new("127.0.0.1:0".parse().expect("addr"), d.clone());
            s.paths = Some(
                legs.iter()
                    .map(|p| p.iter().map(|n| n.to_string()).collect())
                    .collect(),
            );
            s
        };
        for (legs, needle) in [
            (vec![], "1 to 8 paths"),
            (
                vec![
                    vec!["relay0", "relay1", "relay8"],
                    vec!["relay2", "relay3", "relay9"],
                ],
                "same exit",
            ),
        ] {
            let e = Config::new(settings(legs)).expect_err(needle);
            assert!(e.to_string().contains(needle), "{e}");
        }
    }

    #[test]
    fn sets_are_launched_only_when_the_network_links_them() {
        // cfx_enabled: three random legs, one exit, nothing else shared.
        let mut st = multipath_state(true, 3, None);
        assert_eq!(st.cfg.legs(), 3);
        for _ in 0..50 {
            let legs = launched_legs(&mut st);
            assert_eq!(legs.len(), 3);
            let hops: Vec<Vec<&str>> = legs.iter().map(|l| l.split(',').collect()).collect();
            let mut relays: Vec<&str> = hops.iter().flat_map(|h| h[..2].to_vec()).collect();
            relays.sort();
            relays.dedup();
            assert_eq!(relays.len(), 6, "{legs:?}");
            assert!(hops.iter().all(|h| h[2] == hops[0][2]), "{legs:?}");
        }
        // Without it: plain circuits, and pinned legs fall back to the first.
        let mut st = multipath_state(false, 3, None);
        assert_eq!(st.cfg.legs(), 1);
        assert_eq!(launched_legs(&mut st).len(), 1);
        let pinned: &[&[&str]] = &[
            &["relay0", "relay1", "relay9"],
            &["relay2", "relay3", "relay9"],
        ];
        let mut st = multipath_state(false, 1, Some(pinned));
        assert_eq!(launched_legs(&mut st), ["relay0,relay1,relay9"]);
        let mut st = multipath_state(true, 1, Some(pinned));
        assert_eq!(
            launched_legs(&mut st),
            ["relay0,relay1,relay9", "relay2,relay3,relay9"]
        );
    }

    #[test]
    fn failed_relays_are_avoided_for_a_while_unless_no_path_is_left() {
        let mut st = state_with_relays(6);
        let now = Instant::now();
        // relay5 (an exit) and relay1 failed a moment ago.
        st.failed_relays.insert(id(&st, "relay5"), now);
        st.failed_relays.insert(id(&st, "relay1"), now);
        for _ in 0..200 {
            let p = launched(&mut st);
            assert!(!p.contains(&5) && !p.contains(&1), "{p:?}");
        }
        // Both exits failed: no path without them, so they are used.
        st.failed_relays.insert(id(&st, "relay4"), now);
        let p = launched(&mut st);
        assert!(p[2] == 4 || p[2] == 5, "{p:?}");
        // After the avoidance period, nothing is avoided any more.
        let long_ago = now - st.cfg.settings.relay_failure_avoidance - Duration::from_secs(1);
        for at in st.failed_relays.values_mut() {
            *at = long_ago;
        }
        let seen: std::collections::HashSet<usize> =
            (0..300).flat_map(|_| launched(&mut st)).collect();
        assert!(seen.contains(&1) && seen.contains(&5), "{seen:?}");
        assert!(st.failed_relays.is_empty());
    }

    #[test]
    fn a_newer_document_with_relays_removed_and_reordered_keeps_names_right() {
        let pinned = ["relay0", "relay2", "relay5"];
        let mut st = state_with(doc(relays(6), 0), Some(&pinned));
        let kept = open_circuit(&mut st, &["relay0", "relay1", "relay5"]);
        let through_gone = open_circuit(&mut st, &["relay0", "relay3", "relay5"]);
        let now = Instant::now();
        st.failed_relays.insert(id(&st, "relay1"), now);
        st.failed_relays.insert(id(&st, "relay4"), now);
        st.failed_relays.insert(id(&st, "relay3"), now);

        // The newer document lists the relays backwards, without relay3.
        let mut newer: Vec<RelayEntry> = relays(6).into_iter().rev().collect();
        newer.retain(|r| r.nickname != "relay3");
        let swapped = st.replace_network(Arc::new(doc(newer, 10)));
        assert_eq!(
            swapped,
            Ok(Swapped {
                vanished: 1,
                retired: 1
            })
        );
        assert_eq!(st.cfg.settings.network.valid_after_unix, 10);

        // The pinned path was resolved again: same relays, new indexes.
        let p = st.cfg.pinned.clone().expect("pinned").remove(0);
        assert_ne!(p, vec![0, 2, 5]);
        assert_eq!(names(&st, &p), "relay0,relay2,relay5");
        // Failed relays are still the same relays; relay3 is gone.
        let mut failed: Vec<String> = st
            .recently_failed(now)
            .iter()
            .map(|&i| st.cfg.relays()[i].nickname.clone())
            .collect();
        failed.sort();
        assert_eq!(failed, ["relay1", "relay4"]);
        // Circuits still name their own relays.
        for (key, want) in [
            (kept, "relay0,relay1,relay5"),
            (through_gone, "relay0,relay3,relay5"),
        ] {
            let c = &st.circuits[&key];
            assert_eq!(c.path_names(), want);
        }
        // The circuit through the vanished relay takes no new streams and
        // closes when unused; the other one is still picked.
        assert!(st.circuits[&through_gone].stale && !st.circuits[&kept].stale);
        assert!(matches!(pick_web(&mut st), Pick::Ready(k) if k == kept));
        st.circuits.remove(&kept);
        match pick_web(&mut st) {
            Pick::Launch(p) => assert_eq!(names(&st, &p.legs[0]), "relay0,relay2,relay5"),
            _ => panic!("expected the pinned path to be launched"),
        }
        st.expire_dirty();
        assert!(!st.circuits.contains_key(&through_gone), "closed");
    }

    #[test]
    fn a_newer_document_without_a_pinned_relay_is_not_used() {
        let mut st = state_with(doc(relays(6), 0), Some(&["relay0", "relay2", "relay5"]));
        let held = st.cfg.clone();
        let mut newer = relays(6);
        newer.retain(|r| r.nickname != "relay2");
        let err = st.replace_network(Arc::new(doc(newer, 10)));
        assert_eq!(err, Err(PinnedPathError::UnknownRelay("relay2".into())));
        assert!(Rc::ptr_eq(&held, &st.cfg), "the held document stays");
    }

    #[test]
    fn circuits_are_usable_under_a_new_document_while_their_relays_are_listed() {
        let old = relays(6);
        let cfg_of = |relays: Vec<RelayEntry>| {
            let settings =
                ClientSettings::new("127.0.0.1:0".parse().expect("addr"), doc(relays, 1));
            Config::new(settings).expect("config")
        };
        // Reordered: still usable (by identity, not index).
        let reordered = cfg_of(old.iter().rev().cloned().collect());
        assert!(still_usable(&old, &[0, 1, 5], &reordered));
        // A hop removed: not usable.
        let mut without1 = old.clone();
        without1.remove(1);
        assert!(!still_usable(&old, &[0, 1, 5], &cfg_of(without1.clone())));
        assert!(still_usable(&old, &[0, 2, 5], &cfg_of(without1)));
        // The exit's policy changed: not usable (it may no longer allow
        // the circuit's streams); another relay's change does not matter.
        let mut narrowed = old.clone();
        narrowed[5].exit_policy = ExitPolicy::parse("accept *:443").expect("policy");
        narrowed[1].bandwidth = 7;
        let narrowed = cfg_of(narrowed);
        assert!(!still_usable(&old, &[0, 1, 5], &narrowed));
        assert!(still_usable(&old, &[0, 1, 4], &narrowed));
        // An index out of range (never made by the client): not usable, no
        // panic.
        assert!(!still_usable(&old, &[0, 1, 9], &reordered));
        assert!(!still_usable(&old, &[], &reordered));
    }

    #[test]
    fn linkspecs_name_address_and_identity() {
        use onionlab_crypto::identity::RelaySecretKeys;
        use onionlab_netdoc::doc::TransportAddress;
        let keys = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(1));
        let mut r = RelayEntry::new("r", &keys.public());
        r.addresses.push(TransportAddress {
            transport: TRANSPORT_TLS.into(),
            addr: "127.0.0.1:9001".parse().expect("addr"),
        });
        let specs: Vec<LinkSpec> = linkspecs(&r)
            .iter()
            .map(|s| s.parse().expect("parses"))
            .collect();
        assert_eq!(
            specs,
            vec![
                LinkSpec::OrPort("127.0.0.1".parse().expect("ip"), 9001),
                LinkSpec::Ed25519Id(keys.public().ed_identity),
            ]
        );
    }
}

//! [`ClientCore`]: the client node and every decision the onion proxy
//! makes over it, fed calls with the time and giving [`CoreEvent`]s.
//!
//! This file holds the circuits (which one a stream may use, building new
//! ones, dirtiness, document changes, failed relays) and the node's
//! events; `streams.rs` holds the stream requests (build and stream
//! retries, the connect timeout) and the connected streams' I/O.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_cell::chan::{AnyChanCell, CircId};
use onionlab_cell::msg::{EncodedLinkSpec, EndReason, LinkSpec};
use onionlab_circuit::client::{ClientConfig, ClientEvent};
use onionlab_circuit::client_node::{ClientNode, ClientNodeConfig, ClientNodeEvent, PathHop};
use onionlab_circuit::stream::StreamEvent;
use onionlab_netdoc::doc::TRANSPORT_TLS;
use onionlab_netdoc::{ExitPolicy, NetworkDocument, RelayEntry};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tor_llcrypto::pk::ed25519::Ed25519Identity;

use crate::path::{path_names, select_legs, PathError, PinnedPathError, Target};
use crate::request::Request;
use crate::settings::{Config, PolicySettings, RelayId};
use crate::types::{
    BuildFailure, ChanKey, CircKey, CoreEvent, IsolationKey, RequestId, StreamFailure, StreamRef,
    Swapped,
};

/// A stream's entry in its circuit.
#[derive(Debug)]
pub(crate) struct StreamSlot {
    pub(crate) request: RequestId,
    pub(crate) connected: bool,
    pub(crate) ended: Option<EndReason>,
}

/// What the client knows of one circuit beyond the node: where it goes,
/// who may use it, and its streams. Dropped when the node reports the
/// circuit closed.
pub(crate) struct Circ {
    /// The document the legs were chosen from: `legs` index its relays,
    /// whatever document the client holds now.
    pub(crate) doc: Arc<NetworkDocument>,
    /// The path of each leg (one unless it is a multi-path set); every
    /// leg ends at the same exit.
    pub(crate) legs: Vec<Vec<usize>>,
    /// A newer document no longer lists a relay of the path (or changed
    /// the exit's policy): no new streams; closed with its last stream.
    pub(crate) stale: bool,
    pub(crate) isolation: IsolationKey,
    /// Every hop is there (else it is being built).
    pub(crate) open: bool,
    pub(crate) first_use: Option<Instant>,
    pub(crate) streams: HashMap<u16, StreamSlot>,
    /// Requests waiting for it to be built.
    pub(crate) waiting: Vec<RequestId>,
}

impl Circ {
    /// No new streams: dirty, or stale after a document change.
    pub(crate) fn is_retired(&self, now: Instant, max: Duration) -> bool {
        self.stale || too_dirty(self.first_use, now, max)
    }

    /// The exit's entry in the circuit's document.
    fn exit(&self) -> Option<&RelayEntry> {
        let path = self.legs.first()?;
        path.last().and_then(|&e| self.doc.relays.get(e))
    }

    /// Nicknames of its path, or of each leg's path separated by ` + `.
    pub(crate) fn path_names(&self) -> String {
        legs_names(&self.doc.relays, &self.legs)
    }

    pub(crate) fn slot(&self, s: &StreamRef) -> Option<&StreamSlot> {
        self.streams
            .get(&u16::from(s.id))
            .filter(|slot| slot.request == s.request)
    }
}

/// How a stream gets a circuit.
pub(crate) enum Pick {
    /// This open circuit fits.
    Ready(CircKey),
    /// This circuit being built fits: wait for it.
    Pending(CircKey),
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

/// Whether a stream to `target` with isolation `iso` may use a circuit
/// with isolation `circ_iso` whose exit has `exit_policy`.
pub fn may_share(
    circ_iso: &IsolationKey,
    exit_policy: &ExitPolicy,
    iso: &IsolationKey,
    target: &Target,
) -> bool {
    circ_iso.compatible(iso) && target.allowed_by(exit_policy)
}

/// Whether a circuit first used at `first_use` is too old for new streams
/// (a circuit never used is not).
pub fn too_dirty(first_use: Option<Instant>, now: Instant, max: Duration) -> bool {
    first_use.is_some_and(|t| now.saturating_duration_since(t) >= max)
}

/// Link specifiers of a relay for EXTEND2: its TLS address and Ed25519
/// identity.
pub fn linkspecs(r: &RelayEntry) -> Vec<EncodedLinkSpec> {
    let mut specs = Vec::with_capacity(2);
    if let Some(a) = r.address(TRANSPORT_TLS) {
        specs.push(LinkSpec::OrPort(a.ip(), a.port()));
    }
    specs.push(LinkSpec::Ed25519Id(Ed25519Identity::new(r.ed_identity)));
    specs.iter().filter_map(|s| s.encode().ok()).collect()
}

/// The path of relays `path` (indexes into `doc`) as the node takes it.
pub(crate) fn path_hops(doc: &NetworkDocument, path: &[usize]) -> Vec<PathHop> {
    path.iter()
        .filter_map(|&i| doc.relays.get(i))
        .map(|r| PathHop {
            keys: r.public_keys(),
            linkspecs: linkspecs(r),
            name: r.nickname.clone(),
        })
        .collect()
}

/// The onion proxy's core, sans-IO: the client node (guard channels,
/// circuits, streams) and every decision over it: which circuit a stream
/// uses (isolation, exit policy, dirtiness, document changes), new paths
/// (avoiding relays that failed recently), build and stream retries and
/// the connect timeout.
///
/// Its driver feeds it the time with every call, cells read from
/// channels, channels opened or closed, and [`handle_timeout`] at
/// [`poll_timeout`]; it takes [`CoreEvent`]s from [`poll_event`] and cells
/// to send from [`poll_transmit`] (or [`poll_transmit_circuit`]).
///
/// [`handle_timeout`]: ClientCore::handle_timeout
/// [`poll_timeout`]: ClientCore::poll_timeout
/// [`poll_event`]: ClientCore::poll_event
/// [`poll_transmit`]: ClientCore::poll_transmit
/// [`poll_transmit_circuit`]: ClientCore::poll_transmit_circuit
pub struct ClientCore {
    pub(crate) cfg: Arc<Config>,
    rng: StdRng,
    pub(crate) node: ClientNode,
    /// Each channel's guard (identity, nickname).
    channels: HashMap<ChanKey, (RelayId, String)>,
    pub(crate) circuits: HashMap<CircKey, Circ>,
    /// Requests not connected yet.
    pub(crate) requests: HashMap<RequestId, Request>,
    pub(crate) next_request: u64,
    pub(crate) events: VecDeque<CoreEvent>,
    /// The earliest deadline may have moved earlier since the driver
    /// last looked.
    pub(crate) deadline_changed: bool,
    pub(crate) shutting_down: bool,
    /// Relays (by identity) that failed recently, and when: random paths
    /// avoid them for `relay_failure_avoidance` unless no path exists
    /// without them.
    pub(crate) failed_relays: HashMap<RelayId, Instant>,
}

impl ClientCore {
    /// A core over `cfg` (no channel, no circuit yet).
    pub fn new(cfg: Config) -> Self {
        Self::with_node_rng(cfg, rand::make_rng())
    }

    /// [`new`](Self::new) with the client node's randomness (its handshake
    /// keys, circuit IDs) from `node_rng`: a simulation seeds it to repeat
    /// a run.
    pub fn with_node_rng(cfg: Config, node_rng: StdRng) -> Self {
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
            node_rng,
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
        ClientCore {
            cfg: Arc::new(cfg),
            rng,
            node,
            channels: HashMap::new(),
            circuits: HashMap::new(),
            requests: HashMap::new(),
            next_request: 1,
            events: VecDeque::new(),
            deadline_changed: false,
            shutting_down: false,
            failed_relays: HashMap::new(),
        }
    }

    /// The settings and document held now.
    pub fn config(&self) -> &Arc<Config> {
        &self.cfg
    }

    /// The policy settings held now.
    pub fn settings(&self) -> &PolicySettings {
        &self.cfg.settings
    }

    /// The relays (identities, guard first) of every leg of every
    /// circuit built or being built, oldest circuit first.
    pub fn circuit_paths(&self) -> Vec<Vec<RelayId>> {
        let mut keys: Vec<&CircKey> = self.circuits.keys().collect();
        keys.sort_unstable();
        keys.into_iter()
            .filter_map(|k| self.circuits.get(k))
            .flat_map(|c| {
                c.legs.iter().map(|path| {
                    path.iter()
                        .filter_map(|&i| c.doc.relays.get(i))
                        .map(|r| r.ed_identity)
                        .collect()
                })
            })
            .collect()
    }

    /// The next thing for the driver to do or know.
    pub fn poll_event(&mut self) -> Option<CoreEvent> {
        self.events.pop_front()
    }

    /// Whether the deadline of [`poll_timeout`](Self::poll_timeout) may
    /// have moved earlier since the last call (a timer sleeping until the
    /// old one should look again).
    pub fn take_deadline_changed(&mut self) -> bool {
        std::mem::take(&mut self.deadline_changed)
    }

    /// When [`handle_timeout`](Self::handle_timeout) is due next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let connects = self.requests.values().filter_map(Request::deadline);
        self.node.poll_timeout().into_iter().chain(connects).min()
    }

    /// Act on the deadlines that passed by `now`: builds and hops that
    /// timed out, streams the exit did not answer in time.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.node.handle_timeout(now);
        self.expire_connects(now);
        self.settle(now);
    }

    /// Indexes, in the document held now, of the relays that failed
    /// within the avoidance period before `now` (a relay the document no
    /// longer lists is left out).
    pub(crate) fn recently_failed(&mut self, now: Instant) -> Vec<usize> {
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
    ///
    /// # Errors
    ///
    /// The pinned path does not resolve in `doc`.
    pub fn replace_network(
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
        self.cfg = Arc::new(cfg);
        Ok(Swapped { vanished, retired })
    }

    /// How a stream to `target` with isolation `iso` gets a circuit: an
    /// open circuit that fits (same isolation, exit policy allows the
    /// target, not dirty; the newest first), else one being built that
    /// fits, else a new path.
    pub(crate) fn pick(
        &mut self,
        now: Instant,
        target: &Target,
        iso: &IsolationKey,
    ) -> Result<Pick, StreamFailure> {
        if self.shutting_down {
            return Err(StreamFailure::ShuttingDown);
        }
        let cfg = self.cfg.clone();
        let relays = cfg.relays();
        let max_dirty = cfg.settings.max_circuit_dirtiness;
        let fits = |c: &Circ| {
            !c.stale
                && c.exit()
                    .is_some_and(|e| may_share(&c.isolation, &e.exit_policy, iso, target))
        };
        // The node may have closed a circuit whose Closed event is not
        // handled yet (a channel closing closes all its circuits at once):
        // never pick one.
        // (A set's legs are not circuits of the node's: a set that refused
        // a stream as closed is marked stale instead, see `attach`.)
        let node = &self.node;
        let alive = |k: &CircKey| node.circuit(*k).is_none_or(|c| !c.is_closed());
        let ready = self
            .circuits
            .iter()
            .filter(|(k, c)| c.open && alive(k) && !c.is_retired(now, max_dirty) && fits(c))
            .map(|(k, _)| *k)
            .max();
        if let Some(k) = ready {
            return Ok(Pick::Ready(k));
        }
        let pending = self
            .circuits
            .iter()
            .filter(|(k, c)| !c.open && alive(k) && fits(c))
            .map(|(k, _)| *k)
            .max();
        if let Some(k) = pending {
            return Ok(Pick::Pending(k));
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
    /// CREATE2 on the guard's channel (asking for one if there is none),
    /// then an EXTEND2 per hop as each is added, and abandons the build
    /// after the build timeout. With several legs, a linked set: one
    /// circuit per leg, linked at their exit (the set is built when every
    /// leg is linked; it fails if any leg does).
    pub(crate) fn launch(
        &mut self,
        now: Instant,
        path: NewPath,
        iso: IsolationKey,
    ) -> Result<CircKey, BuildFailure> {
        let NewPath { doc, legs } = path;
        let mut paths: Vec<Vec<PathHop>> = legs.iter().map(|p| path_hops(&doc, p)).collect();
        let cc = doc.params.circuit_cc;
        let launched = match paths.len() {
            1 => self.node.launch(now, paths.remove(0), cc),
            _ => self
                .node
                .launch_set(now, paths, cc, self.cfg.leg_scheduler()),
        };
        // Path selection never gives an empty path.
        let key = launched.map_err(|e| BuildFailure::Failed(format!("cannot launch: {e}")))?;
        tracing::debug!(
            circ = key.0,
            path = %legs_names(&doc.relays, &legs),
            legs = legs.len(),
            "building circuit"
        );
        self.circuits.insert(
            key,
            Circ {
                doc,
                legs,
                stale: false,
                isolation: iso,
                open: false,
                first_use: None,
                streams: HashMap::new(),
                waiting: Vec::new(),
            },
        );
        Ok(key)
    }

    /// The relay with identity `guard` in the document held or in a
    /// circuit's (the guard of a circuit just launched).
    fn find_relay(&self, guard: &Ed25519Identity) -> Option<&RelayEntry> {
        let docs = std::iter::once(&self.cfg.settings.network)
            .chain(self.circuits.values().map(|c| &c.doc));
        for doc in docs {
            let found = doc
                .relays
                .iter()
                .find(|r| Ed25519Identity::new(r.ed_identity) == *guard);
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// A channel the node wants: ask the driver to connect it.
    fn want_channel(&mut self, now: Instant, chan: ChanKey, guard: Ed25519Identity) {
        let Some(relay) = self.find_relay(&guard).cloned() else {
            // Cannot happen (the guard is a path's first relay); the node
            // must still learn, or its channel would never open.
            self.node
                .channel_closed(now, chan, "the guard is not in the circuit's document");
            return;
        };
        if relay.address(TRANSPORT_TLS).is_none() {
            // Path selection only picks relays with a tls address; a
            // channel to one without fails its circuits at once.
            let why = format!("guard {} has no tls address", relay.nickname);
            self.node.channel_closed(now, chan, &why);
            return;
        }
        self.channels
            .insert(chan, (relay.ed_identity, relay.nickname.clone()));
        self.events.push_back(CoreEvent::Connect {
            chan,
            guard: Box::new(relay),
        });
    }

    /// Handle what the node reports (circuits built or closed, stream
    /// events, relays that failed, channels it wants) and what that leads
    /// to, until it reports nothing more; then note the channels with
    /// cells to send and whether the next deadline moved. Every method
    /// does this before it returns but the per-cell ones
    /// ([`poll_transmit`](Self::poll_transmit),
    /// [`poll_transmit_circuit`](Self::poll_transmit_circuit)): a driver
    /// calls it once after taking a channel's cells.
    pub fn settle(&mut self, now: Instant) {
        while let Some(ev) = self.node.poll_event() {
            match ev {
                ClientNodeEvent::ChannelWanted { chan, guard } => {
                    self.want_channel(now, chan, guard);
                }
                ClientNodeEvent::Built { circ, elapsed } => self.on_built(now, circ, elapsed),
                ClientNodeEvent::Circuit { circ, event } => self.on_circuit_event(now, circ, event),
                ClientNodeEvent::LegHopFailed { set, leg, hop } => {
                    // As for a plain circuit's HopFailed: avoided a while.
                    self.relay_failed(now, set, leg, hop);
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
                    match &build_failure {
                        Some(BuildFailure::Timeout) => tracing::info!(
                            circ = circ.0,
                            %path,
                            "circuit build timed out after {:?}",
                            self.cfg.settings.circuit_build_timeout
                        ),
                        Some(BuildFailure::Failed(why)) => {
                            tracing::info!(circ = circ.0, %path, "circuit build failed: {why}")
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
                    self.on_closed(now, c, build_failure);
                }
            }
        }
        while let Some(chan) = self.node.poll_channel_ready() {
            self.events.push_back(CoreEvent::Transmit(chan));
        }
        if self.node.take_deadline_changed() {
            self.deadline_changed = true;
        }
    }

    /// Circuit `circ` is built: its waiting requests attach to it.
    fn on_built(&mut self, now: Instant, circ: CircKey, elapsed: Duration) {
        let Some(c) = self.circuits.get_mut(&circ) else {
            return;
        };
        c.open = true;
        tracing::info!(
            circ = circ.0,
            path = %c.path_names(),
            ms = elapsed.as_millis() as u64,
            "circuit built"
        );
        for request in std::mem::take(&mut c.waiting) {
            // Built for this stream (or one like it): use it even if
            // another stream made it dirty meanwhile.
            self.attach(now, request, circ);
        }
    }

    /// Hop `hop` of leg `leg` of circuit `circ` failed: its relay is
    /// avoided for a while (it may be innocent: see
    /// [`ClientEvent::HopFailed`]).
    fn relay_failed(&mut self, now: Instant, circ: CircKey, leg: usize, hop: usize) {
        let Some(c) = self.circuits.get(&circ) else {
            return;
        };
        let relay = c.legs.get(leg).and_then(|p| p.get(hop));
        if let Some(r) = relay.and_then(|&i| c.doc.relays.get(i)) {
            self.failed_relays.insert(r.ed_identity, now);
        }
    }

    /// An event of circuit `key` other than its closing.
    fn on_circuit_event(&mut self, now: Instant, key: CircKey, event: ClientEvent) {
        match event {
            // The circuit closes right after. (Plain circuits report it
            // here, sets as LegHopFailed.)
            ClientEvent::HopFailed { hop, .. } => self.relay_failed(now, key, 0, hop),
            ClientEvent::Stream(ev) => {
                let (id, connected, ended) = match ev {
                    StreamEvent::Connected { stream } => (stream, true, None),
                    StreamEvent::Readable { stream } | StreamEvent::Writable { stream } => {
                        (stream, false, None)
                    }
                    StreamEvent::Ended { stream, reason } => (stream, false, Some(reason)),
                };
                let Some(c) = self.circuits.get_mut(&key) else {
                    return;
                };
                let Some(slot) = c.streams.get_mut(&u16::from(id)) else {
                    return;
                };
                slot.connected |= connected;
                if ended.is_some() {
                    slot.ended = ended;
                    tracing::debug!(circ = key.0, stream = %id, reason = ?slot.ended, "stream ended by the exit");
                }
                let (request, connected, ended) = (slot.request, slot.connected, slot.ended);
                let sref = StreamRef {
                    circ: key,
                    id,
                    request,
                };
                self.on_stream_news(now, sref, connected, ended);
            }
            ClientEvent::HopAdded { .. }
            | ClientEvent::Resolved { .. }
            | ClientEvent::Closed(_)
            | ClientEvent::Linked { .. } => {}
        }
    }

    /// Circuit `c` closed: its waiting requests count a failed build, its
    /// connecting streams are tried again, its connected streams' owners
    /// are told.
    fn on_closed(&mut self, now: Instant, c: Circ, build_failure: Option<BuildFailure>) {
        let failure =
            build_failure.unwrap_or_else(|| BuildFailure::Failed("circuit vanished".into()));
        for request in c.waiting {
            self.build_failed(now, request, failure.clone());
        }
        for slot in c.streams.values() {
            self.stream_lost(now, slot.request);
        }
    }

    /// Close circuits past their dirtiness limit (or stale after a
    /// document change) that no stream uses.
    pub fn expire_dirty(&mut self, now: Instant) {
        let max_dirty = self.cfg.settings.max_circuit_dirtiness;
        let expired: Vec<CircKey> = self
            .circuits
            .iter()
            .filter(|(_, c)| c.streams.is_empty() && c.open && c.is_retired(now, max_dirty))
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
        self.settle(now);
    }

    /// The connection of channel `chan` is up.
    pub fn channel_opened(&mut self, now: Instant, chan: ChanKey) {
        self.node.channel_opened(chan);
        self.settle(now);
    }

    /// The guard's nickname of channel `chan`, for logs.
    pub fn channel_guard_name(&self, chan: ChanKey) -> String {
        self.channels
            .get(&chan)
            .map(|(_, nick)| nick.clone())
            .unwrap_or_default()
    }

    /// Channel `chan` is gone (its connection failed or closed): its
    /// circuits close and their streams' owners are told; its guard is
    /// avoided for a while (unless the client is shutting down).
    pub fn channel_closed(&mut self, now: Instant, chan: ChanKey, why: &str) {
        let Some((guard, nick)) = self.channels.remove(&chan) else {
            return;
        };
        if self.shutting_down {
            tracing::debug!(guard = %nick, "channel closed: {why}");
        } else {
            self.failed_relays.insert(guard, now);
            tracing::info!(guard = %nick, "channel closed: {why}");
        }
        let circuits = self.node.channel_closed(now, chan, why);
        if circuits > 0 {
            tracing::debug!(guard = %nick, circuits, "circuits on the closed channel fail");
        }
        self.settle(now);
    }

    /// Cells read from channel `chan`: to their circuits.
    pub fn handle_cells(
        &mut self,
        now: Instant,
        chan: ChanKey,
        cells: impl Iterator<Item = AnyChanCell>,
    ) {
        for cell in cells {
            self.node.handle_cell(now, chan, cell);
        }
        self.settle(now);
    }

    /// Whether channel `chan` still exists.
    pub fn has_channel(&self, chan: ChanKey) -> bool {
        self.node.has_channel(chan)
    }

    /// Whether channel `chan` is closing and has nothing left to send
    /// (its connection may be shut down).
    pub fn channel_done(&self, chan: ChanKey) -> bool {
        self.node.channel_done(chan)
    }

    /// The next cell to send on channel `chan`, in its scheduler's order
    /// ([`settle`](Self::settle) once after the last).
    pub fn poll_transmit(&mut self, now: Instant, chan: ChanKey) -> Option<AnyChanCell> {
        self.node.poll_transmit(now, chan)
    }

    /// Circuits of channel `chan` with cells to send.
    pub fn circuits_with_work(&self, chan: ChanKey) -> Vec<CircId> {
        self.node.circuits_with_work(chan)
    }

    /// The scheduler's priority of circuit `id`'s lane on channel `chan`.
    pub fn lane_priority(&self, now: Instant, chan: ChanKey, id: CircId) -> i32 {
        self.node.lane_priority(now, chan, id)
    }

    /// The next cell of circuit `id` to send on channel `chan`
    /// ([`settle`](Self::settle) once after the last).
    pub fn poll_transmit_circuit(
        &mut self,
        now: Instant,
        chan: ChanKey,
        id: CircId,
    ) -> Option<AnyChanCell> {
        self.node.poll_transmit_circuit(now, chan, id)
    }

    /// Stop: refuse new streams, destroy every circuit (their requests
    /// fail). Returns the channels that were not open yet (their
    /// connections are not needed); the others close once their DESTROYs
    /// are out ([`channel_done`](Self::channel_done)).
    pub fn shutdown(&mut self, now: Instant) -> Vec<ChanKey> {
        self.shutting_down = true;
        let unopened = self.node.shutdown(now);
        for chan in &unopened {
            if let Some((_, nick)) = self.channels.remove(chan) {
                tracing::debug!(guard = %nick, "channel closed: shutting down");
            }
        }
        self.settle(now);
        unopened
    }

    /// Whether [`shutdown`](Self::shutdown) was called.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }
}

/// Whether a circuit on `path` (indexes into `relays`, the document it
/// was built from) may take new streams under the document of `new`:
/// every relay of the path is still listed, and the exit's policy is
/// unchanged.
pub(crate) fn still_usable(relays: &[RelayEntry], path: &[usize], new: &Config) -> bool {
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

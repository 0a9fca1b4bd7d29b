//! The relay's state, channels and event handling.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::atomic::{self, AtomicUsize};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_cell::chan::{AnyChanMsg, DestroyReason};
use onionlab_cell::msg::{EncodedLinkSpec, LinkSpec};
use onionlab_circuit::conflux::sched::LegSchedulerKind;
use onionlab_circuit::node::{
    ChannelId, ChannelPeer, CircKey, NodeConfig, NodeEvent, RelayNode, TransportBuffer,
};
use onionlab_circuit::stream::StreamEvent;
use onionlab_circuit::{CloseKind, CloseReason};
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_netdoc::doc::NetworkDocument;
use onionlab_ops::{AcceptBackoff, LogLimiter};
use onionlab_transport::addrs::EndpointAddrs;
use onionlab_transport::any::{AnyLink, AnyReader, AnyWriter};
use onionlab_transport::connector::Connector;
use onionlab_transport::datagram::tunnel::EndToEnd;
use onionlab_transport::datagram::DatagramSocket;
use onionlab_transport::endpoint::{EndpointKind, Listeners, PendingLink};
use onionlab_transport::node_endpoints::RelayEndpoints;
use onionlab_transport::setup::BindError;
use onionlab_transport::{CellReader, CellWriter, LinkEvent, LinkSettings, Ordering};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::Notify;
use tokio::task::{spawn_local, JoinHandle};
use tor_llcrypto::pk::ed25519::Ed25519Identity;
use tracing::{debug, info, warn};

use crate::dos::{DosGuard, DosLimits};
use crate::exit::{self, Exit, ExitSettings, ExitStream};
use crate::memory::SharedMemory;
use crate::Error;

/// Everything a relay needs to run.
pub struct RelaySettings {
    /// The relay's nickname (for logs).
    pub nickname: String,
    /// Identity and onion keys.
    pub keys: RelaySecretKeys,
    /// Where the relay's endpoints listen, by kind: always the TCP
    /// endpoint (`tls`), and those of the transports it accepts.
    pub listen: EndpointAddrs,
    /// How the relay makes its links, either direction: the transport of
    /// those it opens, the handshake bound, and each transport's settings
    /// (the `[link]` section of its configuration file).
    pub link: LinkSettings,
    /// The network: relays we may extend to, and our own entry.
    pub doc: NetworkDocument,
    /// Circuit-layer settings (scheduler, memory cap...). `circuit.exit`
    /// is set from `exit.policy`.
    pub node: NodeConfig,
    /// Exit policy (`None` if this relay is not an exit) and the exit's
    /// target rules and limits.
    pub exit: ExitSettings,
    /// Denial-of-service limits on incoming connections and circuit
    /// creation.
    pub dos: DosLimits,
    /// A channel without circuits for this long is closed.
    pub channel_idle_timeout: Duration,
}

/// Default [`RelaySettings::channel_idle_timeout`]: 3 minutes, as C tor
/// closes client channels without circuits after 3 to 4.5 minutes
/// (`channelpadding_get_channel_idle_timeout`). Channels that never carry
/// a circuit (a connection flood) are closed by it too.
pub const DEFAULT_CHANNEL_IDLE_TIMEOUT: Duration = Duration::from_secs(180);

/// Longest interval between two checks for idle channels.
const IDLE_CHECK_INTERVAL: Duration = Duration::from_secs(10);

impl RelaySettings {
    /// Settings for the relay with `keys` in `doc`, its endpoints
    /// listening at `listen` (see [`RelaySettings::listen`]): exit policy
    /// and nickname come from its entry.
    pub fn from_document(
        keys: RelaySecretKeys,
        listen: EndpointAddrs,
        doc: NetworkDocument,
        node: NodeConfig,
    ) -> Result<Self, Error> {
        let id = keys.public().ed_identity;
        let entry = doc
            .relay_by_identity(&id_bytes(&id))
            .ok_or_else(|| Error::NotInDocument(hex_id(&id)))?;
        let exit = ExitSettings {
            policy: entry.flags.exit.then(|| entry.exit_policy.clone()),
            ..ExitSettings::none()
        };
        Ok(RelaySettings {
            nickname: entry.nickname.clone(),
            keys,
            listen,
            link: LinkSettings::tls_only(),
            node,
            exit,
            dos: DosLimits::default(),
            channel_idle_timeout: DEFAULT_CHANNEL_IDLE_TIMEOUT,
            doc,
        })
    }
}

/// Counters for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Channels open now.
    pub channels: usize,
    /// Circuits open now.
    pub circuits: usize,
    /// Incoming connections whose handshake failed.
    pub failed_handshakes: u64,
    /// Channels closed because the peer broke the protocol or the link.
    pub channels_lost: u64,
    /// Circuits destroyed by the memory cap.
    pub oom_circuits_killed: u64,
    /// Channels closed by the memory cap because their transports held
    /// the most received data.
    pub oom_channels_closed: u64,
    /// Circuits that closed abnormally (see the relay's INFO log): a
    /// protocol violation, the memory cap, a lost channel, a timeout...
    pub circuits_failed: u64,
    /// Exit streams refused (END RESOURCELIMIT) because a connection to
    /// the target could not be opened for lack of descriptors or memory.
    pub exit_resource_limit: u64,
    /// Exit streams refused because every address of their target is
    /// refused (private or local, a relay's OR port, our own address, or
    /// the exit policy).
    pub exit_targets_refused: u64,
    /// Exit streams refused (END RESOURCELIMIT) because too many were
    /// resolving or connecting already.
    pub exit_connects_refused: u64,
    /// Incoming connections refused by the denial-of-service limits.
    pub dos_conns_refused: u64,
    /// CREATE2 cells refused by the circuit-creation limit (DESTROY
    /// RESOURCELIMIT).
    pub dos_creates_refused: u64,
    /// What the endpoints refused or did before any cryptography, by
    /// name (the QUIC handshake gate's `quic_handshakes_refused`: too
    /// many pending, or one address too fast; `quic_retries`: Retry
    /// packets sent because handshakes arrived above the rate).
    pub endpoints: Vec<(&'static str, u64)>,
}

/// A relay bound to its listening address.
pub struct Relay {
    settings: RelaySettings,
    connector: Connector,
    listener: Listeners,
    circuits: CircuitGauge,
}

/// How many circuits a running relay holds, read from any thread while
/// it runs (for monitoring and tests; updated each time the relay has
/// acted on what its connections brought).
#[derive(Debug, Clone, Default)]
pub struct CircuitGauge(Arc<AtomicUsize>);

impl CircuitGauge {
    /// The circuits the relay held when it last acted.
    pub fn get(&self) -> usize {
        self.0.load(atomic::Ordering::Relaxed)
    }

    fn set(&self, n: usize) {
        self.0.store(n, atomic::Ordering::Relaxed);
    }
}

pub(crate) type Shared = Rc<RefCell<State>>;

struct Chan {
    /// Wakes the writer task.
    wake: Rc<Notify>,
    reader: Option<JoinHandle<()>>,
    peer_identity: Option<Ed25519Identity>,
    /// Who the peer is and over what, for logs: `relay1 at 127.0.0.1:9002
    /// over quic`, or `a client over tls` (client addresses are not
    /// logged at INFO, as tor's SafeLogging).
    label: String,
    /// An incoming channel: the peer's address, counted by the
    /// denial-of-service limits, and whether it is exempt (a relay).
    admitted: Option<(IpAddr, bool)>,
    /// Since when the channel has had no circuit (`None`: it has some).
    idle_since: Option<Instant>,
}

pub(crate) struct State {
    pub(crate) node: RelayNode,
    pub(crate) nickname: String,
    our_identity: Ed25519Identity,
    channels: HashMap<ChannelId, Chan>,
    /// A channel to each relay we have one with, for EXTEND2.
    by_identity: HashMap<Ed25519Identity, ChannelId>,
    /// Circuits waiting for a connection being opened.
    connecting: HashMap<Ed25519Identity, Vec<CircKey>>,
    pub(crate) streams: HashMap<(CircKey, u16), Rc<ExitStream>>,
    next_chan: ChannelId,
    doc: Rc<NetworkDocument>,
    /// The exit's rules, limits and tasks; `None` if not an exit.
    pub(crate) exit: Option<Exit>,
    connector: Connector,
    pub(crate) stats: RelayStats,
    /// Rate limit of the exit's "out of descriptors" warning.
    pub(crate) exhaustion_log: LogLimiter,
    /// Rate limit of the INFO line on failed incoming handshakes.
    handshake_log: LogLimiter,
    /// Rate limit of the INFO line on circuits that closed abnormally.
    circuit_failure_log: LogLimiter,
    /// Connection and circuit-creation limits.
    dos: DosGuard,
    /// Rate limit of the INFO line on denial-of-service refusals.
    dos_log: LogLimiter,
    /// The circuit count others read.
    circuits: CircuitGauge,
    /// The memory cap, shared with the datagram engine.
    memory: Rc<SharedMemory>,
}

fn id_bytes(id: &Ed25519Identity) -> [u8; 32] {
    let mut raw = [0; 32];
    raw.copy_from_slice(id.as_bytes());
    raw
}

fn hex_id(id: &Ed25519Identity) -> String {
    hex::encode(id.as_bytes())
}

impl Relay {
    /// Bind the relay's listener.
    pub async fn bind(settings: RelaySettings) -> Result<Relay, Error> {
        if settings.listen.get(EndpointKind::TCP).is_none() {
            return Err(Error::Setting(format!(
                "a relay listens on TCP: its listen addresses need `{}`",
                EndpointKind::TCP
            )));
        }
        let my_addrs = own_ips(&settings.listen);
        let link = &settings.link;
        link.check().map_err(Error::Transport)?;
        let tcp_congestion = link.tcp_congestion();
        tcp_congestion
            .check_available()
            .map_err(|e| Error::Transport(e.into()))?;
        // Relays of the network open a connection per circuit in
        // conn-per-circuit mode: their addresses are exempt from the
        // per-address handshake rate (as tor exempts relays).
        let admission = settings
            .dos
            .admission(relay_addresses(&settings.doc).collect());
        let RelayEndpoints {
            connector,
            listeners: listener,
        } = RelayEndpoints::bind(
            &settings.keys,
            &my_addrs,
            link,
            &settings.listen,
            &admission,
        )
        .await
        .map_err(|e| match e {
            BindError::Listen { addr, source } => Error::Listen { addr, source },
            BindError::Setup(source) => Error::Transport(source),
        })?;
        Ok(Relay {
            connector,
            listener,
            settings,
            circuits: CircuitGauge::default(),
        })
    }

    /// The relay's circuit count, live once it runs.
    pub fn circuit_gauge(&self) -> CircuitGauge {
        self.circuits.clone()
    }

    /// The address the relay's TLS transport listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr(EndpointKind::TCP)
            .expect("a relay always listens on TCP")
    }

    /// Run until `shutdown` completes. Must run on a current-thread
    /// runtime (it uses a `LocalSet`).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<RelayStats, Error> {
        let local = tokio::task::LocalSet::new();
        local.run_until(self.run_local(shutdown)).await
    }

    /// Build a current-thread runtime and run the relay on it until
    /// `shutdown` completes.
    pub fn run_blocking(
        settings: RelaySettings,
        shutdown: impl Future<Output = ()>,
    ) -> Result<RelayStats, Error> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Runtime)?;
        rt.block_on(async move {
            let relay = Relay::bind(settings).await?;
            relay.run(shutdown).await
        })
    }

    async fn run_local(self, shutdown: impl Future<Output = ()>) -> Result<RelayStats, Error> {
        let Relay {
            settings,
            connector,
            mut listener,
            circuits,
        } = self;
        let mut config = settings.node.clone();
        config.circuit.exit = settings.exit.policy.is_some();
        // Both ends of a circuit run the network's choice (see
        // `onionlab_netdoc::params`).
        config.circuit = config.circuit.with_cc(settings.doc.params.circuit_cc);
        // Exits link multi-path sets when the network says its exits do
        // (`cfx_enabled`, docs/conflux.md).
        config.circuit.conflux = config.circuit.exit && settings.doc.params.cfx_enabled;
        config.conflux_scheduler = settings.doc.params.cfx_scheduler;
        #[cfg(feature = "fault-injection")]
        {
            config.circuit.hostile_truncate =
                std::env::var_os("ONIONLAB_FAULT_HOSTILE_TRUNCATE").is_some();
            if config.circuit.hostile_truncate {
                warn!("fault injection: this relay sends TRUNCATED after every EXTENDED2");
            }
        }
        let our_identity = settings.keys.public().ed_identity;
        let memory = Rc::new(SharedMemory::new(config.max_mem_in_queues));
        let datagram = start_datagram(&settings, &connector, &config, &memory)?;
        info!(
            nickname = %settings.nickname,
            listen = ?listener.local_addrs(),
            exit = config.circuit.exit,
            circuit_cc = config.circuit.cc.name(),
            conflux = config.circuit.conflux,
            leg_scheduler = %config.conflux_scheduler,
            exit_packaging = %config.circuit.exit_packaging,
            "relay listening"
        );
        let shared: Shared = Rc::new(RefCell::new(State {
            node: {
                let mut node =
                    RelayNode::new(settings.keys, config, StdRng::from_rng(&mut rand::rng()));
                node.share_limit_with(memory.datagram_gauge());
                node
            },
            nickname: settings.nickname.clone(),
            our_identity,
            channels: HashMap::new(),
            by_identity: HashMap::new(),
            connecting: HashMap::new(),
            streams: HashMap::new(),
            next_chan: 1,
            doc: Rc::new(settings.doc.clone()),
            exit: Exit::new(
                &settings.exit,
                &settings.link.tcp_congestion(),
                &settings.doc,
                exit::own_addresses(own_ips(&settings.listen)),
            ),
            connector,
            stats: RelayStats::default(),
            exhaustion_log: LogLimiter::default(),
            handshake_log: LogLimiter::default(),
            circuit_failure_log: LogLimiter::default(),
            dos: {
                let mut dos = DosGuard::new(settings.dos.clone());
                dos.set_relay_addresses(relay_addresses(&settings.doc));
                dos
            },
            dos_log: LogLimiter::default(),
            circuits,
            memory,
        }));

        tokio::pin!(shutdown);
        let mut backoff = AcceptBackoff::new("OR port");
        let idle_timeout = settings.channel_idle_timeout;
        let mut idle_check = tokio::time::interval((idle_timeout / 4).min(IDLE_CHECK_INTERVAL));
        idle_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Torchestra's classification windows (never, when it is off).
        let mut window_end = shared.borrow_mut().node.torchestra_tick(Instant::now());
        loop {
            let window = async {
                match window_end {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut shutdown => break,
                () = window => {
                    let mut st = shared.borrow_mut();
                    window_end = st.node.torchestra_tick(Instant::now());
                    process(&shared, &mut st);
                }
                _ = idle_check.tick() => {
                    close_idle_channels(&mut shared.borrow_mut(), Instant::now(), idle_timeout);
                }
                incoming = listener.accept() => match incoming {
                    Ok(incoming) => {
                        backoff.on_success();
                        let ip = incoming.peer_addr().ip();
                        if admit(&mut shared.borrow_mut(), ip) {
                            spawn_local(accept_link(shared.clone(), incoming));
                        }
                    }
                    Err(e) => {
                        // Out of descriptors, say: wait (growing delays)
                        // instead of spinning on a listener that stays
                        // readable; the log says so once per interval.
                        let io = e
                            .io_error()
                            .map_or_else(|| io::Error::other(e.to_string()), clone_io_error);
                        let delay = backoff.on_error(Instant::now(), &io);
                        tokio::select! {
                            () = &mut shutdown => break,
                            () = tokio::time::sleep(delay) => {}
                        }
                    }
                },
            }
        }
        if let Some(task) = datagram {
            task.abort();
        }
        // Close every channel: writers flush and shut their TLS down.
        let mut st = shared.borrow_mut();
        let chans: Vec<ChannelId> = st.channels.keys().copied().collect();
        for chan in chans {
            close_channel(&mut st, chan, "relay shutting down", false);
        }
        let stats = snapshot(&st, &listener);
        info!(nickname = %st.nickname, ?stats, "relay stopped");
        Ok(stats)
    }
}

/// Start the relay's datagram circuits if it listens on a datagram
/// address (`docs/datagram.md`); their task, to abort at shutdown.
///
/// # Errors
///
/// [`Error::Setting`] for an exit that must serve kernel sets and cannot
/// open its TUN device or listener.
fn start_datagram(
    settings: &RelaySettings,
    connector: &Connector,
    config: &NodeConfig,
    memory: &Rc<SharedMemory>,
) -> Result<Option<JoinHandle<()>>, Error> {
    let Ok(socket) = connector
        .endpoints()
        .get::<Arc<DatagramSocket>>(EndpointKind::DGRAM, "datagram")
    else {
        return Ok(None);
    };
    let socket = socket.clone();
    // The keys again, for the datagram engine (the circuit node owns the
    // first copy).
    let Ok(keys) = RelaySecretKeys::from_bytes(&settings.keys.to_bytes()) else {
        return Ok(None);
    };
    let dispatch = match config.conflux_scheduler {
        d @ (LegSchedulerKind::RoundRobin { .. } | LegSchedulerKind::Random) => d,
        _ => LegSchedulerKind::RoundRobin { cells_per_leg: 1 },
    };
    let mut setup = crate::dgram::DgramSetup {
        nickname: settings.nickname.clone(),
        keys: Arc::new(keys),
        doc: Rc::new(settings.doc.clone()),
        exit: Exit::new(
            &settings.exit,
            &settings.link.tcp_congestion(),
            &settings.doc,
            exit::own_addresses(own_ips(&settings.listen)),
        ),
        sets: onionlab_dgram::ExitSetSettings {
            tcp: settings.link.utcp.clone(),
            dispatch,
            ..Default::default()
        },
        kernel: None,
        memory: memory.clone(),
    };
    if config.circuit.exit && settings.link.datagram.end_to_end == EndToEnd::Kernel {
        let limits = &setup.sets;
        let kernel = crate::dgram::kernel::ExitKernel::open(
            &settings.link.tcp_congestion(),
            limits.max_streams_per_set,
            limits.max_streams,
        )
        .map_err(|e| Error::Setting(format!("kernel sets (link.datagram.end_to_end): {e}")))?;
        setup.kernel = Some(kernel);
    }
    Ok(Some(spawn_local(crate::dgram::serve(socket, setup))))
}

/// The relay's own IP addresses: those its endpoints listen on.
fn own_ips(listen: &EndpointAddrs) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = Vec::new();
    for (_, addr) in listen.iter() {
        if !ips.contains(&addr.ip()) {
            ips.push(addr.ip());
        }
    }
    ips
}

/// The IP addresses of the network's relays: exempt from per-address
/// denial-of-service limits (see [`crate::dos`]).
fn relay_addresses(doc: &NetworkDocument) -> impl Iterator<Item = IpAddr> + '_ {
    doc.relays
        .iter()
        .flat_map(|r| r.addresses.iter().map(|a| a.addr.ip()))
}

/// Ask the denial-of-service limits to admit a connection from `ip`; a
/// refusal is counted and logged at INFO at most once per interval.
fn admit(st: &mut State, ip: IpAddr) -> bool {
    let now = Instant::now();
    match st.dos.admit(ip, now) {
        Ok(()) => true,
        Err(why) => {
            log_dos(st, now, &format!("connection refused: {why}"));
            false
        }
    }
}

/// May a client channel from `ip` create another circuit? A refusal is
/// counted and logged like [`admit`]'s.
fn allow_create(st: &mut State, ip: IpAddr, now: Instant) -> bool {
    let allowed = st.dos.allow_create(ip, now);
    if !allowed {
        log_dos(
            st,
            now,
            "CREATE2 refused: one address creates circuits too fast",
        );
    }
    allowed
}

fn log_dos(st: &mut State, now: Instant, what: &str) {
    if let Some(held_back) = st.dos_log.check(now) {
        let c = st.dos.counters();
        let (conns, handshakes) = st.dos.load();
        info!(
            held_back,
            conns_refused = c.conns_refused,
            creates_refused = c.creates_refused,
            conns,
            handshakes,
            "denial-of-service limit: {what}"
        );
    }
}

/// Complete an accepted link's handshake and register it; a failed
/// handshake is counted and logged at INFO at most once per interval
/// (a scan or a flood must not flood the log).
async fn accept_link(shared: Shared, incoming: PendingLink) {
    let addr = incoming.peer_addr();
    let result = incoming.handshake().await;
    let mut st = shared.borrow_mut();
    st.dos.handshake_done();
    match result {
        // A pctcp lane joined its link: not a channel of its own.
        Ok(None) => st.dos.lane_joined(addr.ip()),
        Ok(Some(link)) => {
            let relay = link
                .peer
                .identity
                .is_some_and(|id| st.doc.relay_by_identity(&id_bytes(&id)).is_some());
            if relay {
                st.dos.exempt(addr.ip());
            }
            let chan = add_link(&shared, &mut st, link, false);
            if let Some(c) = st.channels.get_mut(&chan) {
                c.admitted = Some((addr.ip(), relay));
            }
        }
        Err(e) => {
            st.dos.closed(addr.ip(), false);
            st.stats.failed_handshakes += 1;
            let total = st.stats.failed_handshakes;
            match st.handshake_log.check(Instant::now()) {
                // held_back: failures since the last line, not logged.
                Some(held_back) => info!(held_back, total, "link handshake failed: {e}"),
                None => debug!(peer = %addr, "link handshake failed: {e}"),
            }
        }
    }
}

/// A circuit closed: DEBUG always; INFO (at most once per interval, with
/// the number held back) when it ended abnormally: a violation, the memory
/// cap, a lost channel, a timeout, a failed extend. A DESTROY with NONE,
/// REQUESTED or FINISHED is a client's normal teardown.
fn log_circuit_closed(st: &mut State, circ: CircKey, why: &CloseReason) {
    debug!(?circ, %why, "circuit closed");
    let normal = matches!(
        why.reason,
        DestroyReason::NONE | DestroyReason::REQUESTED | DestroyReason::FINISHED
    ) && why.kind != CloseKind::Violation;
    if normal {
        return;
    }
    st.stats.circuits_failed += 1;
    if let Some(held_back) = st.circuit_failure_log.check(Instant::now()) {
        info!(
            held_back,
            total = st.stats.circuits_failed,
            "circuit closed abnormally: {why}"
        );
    }
}

/// A copy of `e` (kind and OS error code are what the back-off looks at).
fn clone_io_error(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}

fn snapshot(st: &State, listeners: &Listeners) -> RelayStats {
    RelayStats {
        channels: st.channels.len(),
        circuits: st.node.n_circuits(),
        oom_circuits_killed: st.node.oom_circuits_killed(),
        oom_channels_closed: st.node.oom_channels_closed(),
        dos_conns_refused: st.dos.counters().conns_refused,
        dos_creates_refused: st.dos.counters().creates_refused,
        endpoints: listeners.counters(),
        ..st.stats.clone()
    }
}

/// Register an open link as a channel and start its tasks.
fn add_link(shared: &Shared, st: &mut State, link: AnyLink, initiated_by_us: bool) -> ChannelId {
    let chan = st.next_chan;
    st.next_chan += 1;
    let peer = if link.peer.identity.is_some() {
        ChannelPeer::Relay
    } else {
        ChannelPeer::Client
    };
    st.node.add_channel(chan, initiated_by_us, peer);
    if let Some(id) = link.peer.identity {
        st.by_identity.entry(id).or_insert(chan);
    }
    let transport = link.writer.kind().name();
    let label = match link.peer.identity {
        Some(id) => {
            let nick = st
                .doc
                .relay_by_identity(&id_bytes(&id))
                .map_or_else(|| hex_id(&id), |r| r.nickname.clone());
            format!("{nick} at {} over {transport}", link.peer.addr)
        }
        None => format!("a client over {transport}"),
    };
    debug!(
        chan,
        peer = %link.peer.addr,
        relay = link.peer.identity.is_some(),
        transport,
        link_version = link.link_version,
        "channel open"
    );
    info!(
        chan,
        outgoing = initiated_by_us,
        "channel open with {label}"
    );
    let wake = Rc::new(Notify::new());
    spawn_local(write_loop(shared.clone(), chan, link.writer, wake.clone()));
    let reader = spawn_local(read_loop(shared.clone(), chan, link.reader));
    st.channels.insert(
        chan,
        Chan {
            wake,
            reader: Some(reader),
            peer_identity: link.peer.identity,
            label,
            admitted: None,
            idle_since: Some(Instant::now()),
        },
    );
    chan
}

/// Close the channels that have had no circuit for `timeout`: connections
/// that never build a circuit (a flood, a client that went quiet) stop
/// holding a descriptor and a slot of the denial-of-service limits.
fn close_idle_channels(st: &mut State, now: Instant, timeout: Duration) {
    let mut idle = Vec::new();
    for (&chan, c) in st.channels.iter_mut() {
        if st.node.channel_circuits(chan) > 0 {
            c.idle_since = None;
            continue;
        }
        let since = *c.idle_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= timeout {
            idle.push(chan);
        }
    }
    for chan in idle {
        let why = format!("no circuit for {} s", timeout.as_secs_f64());
        close_channel(st, chan, &why, false);
    }
}

/// Forget a channel: its circuits are torn down by the node, its reader
/// stops, and its writer flushes what it has and shuts the link.
fn close_channel(st: &mut State, chan: ChannelId, why: &str, lost: bool) {
    let Some(mut c) = st.channels.remove(&chan) else {
        return;
    };
    st.stats.channels_lost += u64::from(lost);
    info!(
        chan,
        lost,
        circuits = st.node.channel_circuits(chan),
        "channel with {} closed: {why}",
        c.label
    );
    if let Some(r) = c.reader.take() {
        r.abort();
    }
    if let Some((ip, exempt)) = c.admitted {
        st.dos.closed(ip, exempt);
    }
    c.wake.notify_one();
    if let Some(id) = c.peer_identity {
        if st.by_identity.get(&id) == Some(&chan) {
            st.by_identity.remove(&id);
            // Another open channel to the same relay takes over.
            if let Some((other, _)) = st
                .channels
                .iter()
                .find(|(_, o)| o.peer_identity == Some(id))
            {
                st.by_identity.insert(id, *other);
            }
        }
    }
    st.node.remove_channel(Instant::now(), chan);
}

async fn read_loop(shared: Shared, chan: ChannelId, mut reader: AnyReader) {
    let mut cells = Vec::with_capacity(64);
    loop {
        cells.clear();
        let r = reader.read_cells(&mut cells).await;
        let mut st = shared.borrow_mut();
        // What the transport still holds, received (cells queued behind
        // these, flow-control windows of lanes waiting for room).
        let held = reader.buffered_bytes();
        st.node
            .set_transport_buffered(Instant::now(), chan, TransportBuffer::Receive, held);
        match r {
            Ok(()) => {
                let now = Instant::now();
                let unknown_before = st.node.unknown_circuit_cells(chan);
                let client = st
                    .channels
                    .get(&chan)
                    .and_then(|c| c.admitted.filter(|(_, relay)| !relay));
                for cell in cells.drain(..) {
                    if let (Some((ip, _)), Some(circid), AnyChanMsg::Create2(_)) =
                        (client, cell.circid(), cell.msg())
                    {
                        if !allow_create(&mut st, ip, now) {
                            st.node
                                .refuse_create(now, chan, circid, DestroyReason::RESOURCELIMIT);
                            continue;
                        }
                    }
                    st.node.handle_cell(now, chan, cell);
                }
                while let Some(event) = reader.poll_event() {
                    on_link_event(&mut st, now, chan, event);
                }
                let unknown = st.node.unknown_circuit_cells(chan);
                if unknown > unknown_before && unknown_before == 0 {
                    // Once per channel: tor drops such cells too (a circuit
                    // may have just closed), so this is not a violation.
                    info!(chan, "dropping cells for unknown circuits on this channel");
                }
            }
            Err(onionlab_transport::Error::Closed) => {
                close_channel(&mut st, chan, "peer closed the link", false);
            }
            Err(e) => close_channel(&mut st, chan, &e.to_string(), true),
        }
        let open = st.channels.contains_key(&chan);
        process(&shared, &mut st);
        if !open {
            return;
        }
    }
}

/// What a link's transport reports besides cells (Torchestra's switches).
fn on_link_event(st: &mut State, now: Instant, chan: ChannelId, event: LinkEvent) {
    match event {
        LinkEvent::Switched {
            circ_id,
            heavy,
            propagate,
        } => st
            .node
            .transport_switched(now, chan, circ_id, heavy, propagate),
        LinkEvent::CircuitViolation { circ_id, detail } => {
            debug!(chan, %circ_id, "transport violation: {detail}");
            st.node.transport_violation(now, chan, circ_id, &detail);
        }
    }
}

/// Move cells from the channel's circuits to its writer while it has room,
/// in the circuit scheduler's order: one buffer for the whole connection on
/// a per-connection transport; on a per-circuit one, each circuit's lane
/// (a full lane holds back only its own circuit), with the scheduler's
/// priority handed to transports whose lanes share a connection.
fn fill_writer(
    st: &mut State,
    chan: ChannelId,
    writer: &mut AnyWriter,
) -> Result<(), onionlab_transport::Error> {
    let now = Instant::now();
    // Circuits the classifier (or the exit, through us) moved between the
    // link's connections: before their next cells.
    while let Some(m) = st.node.poll_move(chan) {
        // Rare (a circuit changing class), and what a Torchestra result
        // rests on: always in the log.
        info!(
            chan,
            circ_id = %m.circ_id,
            heavy = m.heavy,
            propagate = m.propagate,
            "torchestra: moving a circuit"
        );
        // A link with one connection has nowhere to move it.
        if let Some(mover) = writer.circuit_mover() {
            mover.move_circuit(m.circ_id, m.heavy, m.propagate);
        }
    }
    match writer.ordering() {
        // (No link is unordered: datagram links carry no channel cells.)
        Ordering::PerConnection | Ordering::Unordered => {
            while writer.has_room() {
                let Some(cell) = st.node.poll_transmit(now, chan) else {
                    break;
                };
                writer.queue(cell)?;
            }
            if !writer.has_room() {
                // Circuits wait for the connection: a congestion signal
                // to the exit's circuit congestion control.
                st.node.channel_full(chan);
            }
        }
        Ordering::PerCircuit => {
            // Circuits set aside behind full lanes come back; those whose
            // lane is still full are set aside again.
            st.node.lanes_writable(now, chan);
            loop {
                let cell = st
                    .node
                    .poll_transmit_lanes(now, chan, &mut |id| writer.has_room_for(id));
                let Some(cell) = cell else { break };
                if let Some(id) = cell.circid() {
                    writer.set_lane_priority(id, st.node.lane_priority(now, chan, id));
                }
                writer.queue(cell)?;
            }
        }
    }
    Ok(())
}

async fn write_loop(shared: Shared, chan: ChannelId, mut writer: AnyWriter, wake: Rc<Notify>) {
    loop {
        // A wake that is always pending (a bug in what counts as work)
        // must cost CPU, not the whole relay: the budget makes this task
        // yield now and then, so the links' own tasks still run.
        tokio::task::consume_budget().await;
        let open = {
            let mut st = shared.borrow_mut();
            let open = st.channels.contains_key(&chan);
            if open {
                let filled = fill_writer(&mut st, chan, &mut writer);
                let buffered = writer.buffered_bytes();
                st.node.set_transport_buffered(
                    Instant::now(),
                    chan,
                    TransportBuffer::Send,
                    buffered,
                );
                if let Err(e) = filled {
                    // Our own cell failed to encode: a bug, but only this
                    // channel pays for it.
                    warn!(chan, "encoding a cell: {e}");
                    close_channel(&mut st, chan, "cell encoding failed", true);
                }
                // Packaging exit data may have made room in stream buffers.
                process(&shared, &mut st);
            }
            open && st.channels.contains_key(&chan)
        };
        if writer.has_pending() {
            if let Err(e) = writer.flush().await {
                let mut st = shared.borrow_mut();
                close_channel(&mut st, chan, &e.to_string(), true);
                process(&shared, &mut st);
                return;
            }
            continue;
        }
        if !open {
            let _ = writer.shutdown().await;
            return;
        }
        tokio::select! {
            () = wake.notified() => {}
            () = writer.writable() => {}
        }
    }
}

/// Act on everything the node asked for, then wake the writers of
/// channels with cells to send.
pub(crate) fn process(shared: &Shared, st: &mut State) {
    while let Some(event) = st.node.poll_event() {
        match event {
            NodeEvent::ConnectRelay { circ, linkspecs } => {
                connect_relay(shared, st, circ, &linkspecs)
            }
            NodeEvent::ExitConnect {
                circ,
                stream,
                host,
                port,
            } => exit::start_connect(shared, st, circ, stream, host, port),
            NodeEvent::ExitResolve { circ, stream, host } => {
                exit::start_resolve(shared, st, circ, stream, host)
            }
            NodeEvent::ExitStream { circ, event } => on_stream_event(st, circ, event),
            NodeEvent::CircuitClosed { circ, reason } => {
                log_circuit_closed(st, circ, &reason);
                if let Some(exit) = st.exit.as_mut() {
                    exit.cancel_circuit(circ);
                }
                st.streams.retain(|(c, _), s| {
                    if *c == circ {
                        s.abort();
                        false
                    } else {
                        true
                    }
                });
            }
            NodeEvent::ChannelViolation { chan, detail } => {
                warn!(chan, "protocol violation: {detail}");
                close_channel(st, chan, &detail, true);
            }
            NodeEvent::ChannelOutOfMemory { chan, detail } => {
                warn!(chan, "{detail}");
                close_channel(st, chan, &detail, true);
            }
        }
    }
    for chan in st.node.channels_with_work() {
        if let Some(c) = st.channels.get(&chan) {
            c.wake.notify_one();
        }
    }
    st.circuits.set(st.node.n_circuits());
    st.memory.set_tor1(st.node.total_queued_bytes());
}

fn on_stream_event(st: &mut State, circ: CircKey, event: StreamEvent) {
    match event {
        StreamEvent::Readable { stream } => {
            if let Some(s) = st.streams.get(&(circ, stream.into())) {
                s.to_target.notify_one();
            }
        }
        StreamEvent::Writable { stream } => {
            if let Some(s) = st.streams.get(&(circ, stream.into())) {
                s.from_target.notify_one();
            }
        }
        StreamEvent::Ended { stream, reason } => {
            debug!(
                ?circ,
                stream = u16::from(stream),
                ?reason,
                "client ended stream"
            );
            // The stream's writer drains what the client sent, closes the
            // connection and forgets the stream. A connect still in
            // progress is abandoned.
            if let Some(s) = st.streams.get(&(circ, stream.into())) {
                s.client_ended();
            }
            if let Some(exit) = st.exit.as_mut() {
                exit.cancel(circ, stream);
            }
        }
        StreamEvent::Connected { .. } => {}
    }
}

/// Where EXTEND2 asks us to go, checked against the network document: we
/// only connect to relays it lists, at the address it lists.
#[doc(hidden)]
pub fn extend_target(
    doc: &NetworkDocument,
    linkspecs: &[EncodedLinkSpec],
) -> Result<(Ed25519Identity, EndpointAddrs), String> {
    let mut id = None;
    let mut addrs = Vec::new();
    for spec in linkspecs {
        match spec.parse() {
            Ok(LinkSpec::Ed25519Id(e)) => id = Some(e),
            Ok(LinkSpec::OrPort(ip, port)) => addrs.push(SocketAddr::new(ip, port)),
            _ => {}
        }
    }
    let id = id.ok_or("EXTEND2 without an Ed25519 identity")?;
    let entry = doc.relay_by_identity(&id_bytes(&id)).ok_or_else(|| {
        format!(
            "EXTEND2 to {} which is not in the network document",
            hex_id(&id)
        )
    })?;
    let peer = EndpointAddrs::from_document(|name| entry.address(name));
    let listed: Vec<SocketAddr> = entry.addresses.iter().map(|a| a.addr).collect();
    if listed.is_empty() {
        return Err(format!("relay {} has no address", entry.nickname));
    }
    if !addrs.is_empty() && !addrs.iter().any(|a| listed.contains(a)) {
        return Err(format!(
            "EXTEND2 to {} at {addrs:?}, but the network document says {listed:?}",
            entry.nickname
        ));
    }
    Ok((id, peer))
}

fn connect_relay(shared: &Shared, st: &mut State, circ: CircKey, linkspecs: &[EncodedLinkSpec]) {
    let now = Instant::now();
    let (id, addrs) = match extend_target(&st.doc, linkspecs) {
        Ok(t) => t,
        Err(why) => {
            info!(?circ, "refusing to extend: {why}");
            st.node
                .extend_channel_failed(now, circ, DestroyReason::CONNECTFAILED);
            return;
        }
    };
    if id == st.our_identity {
        info!(?circ, "refusing to extend to ourselves");
        st.node
            .extend_channel_failed(now, circ, DestroyReason::CONNECTFAILED);
        return;
    }
    if let Some(&chan) = st.by_identity.get(&id) {
        st.node.extend_channel_ready(now, circ, chan);
        return;
    }
    if let Some(waiting) = st.connecting.get_mut(&id) {
        waiting.push(circ);
        return;
    }
    st.connecting.insert(id, vec![circ]);
    let connector = st.connector.clone();
    let shared = shared.clone();
    spawn_local(async move {
        let result = connector.connect(&addrs, id).await;
        let mut st = shared.borrow_mut();
        let now = Instant::now();
        let waiting = st.connecting.remove(&id).unwrap_or_default();
        match result {
            Ok(link) => {
                let chan = add_link(&shared, &mut st, link, true);
                for circ in waiting {
                    st.node.extend_channel_ready(now, circ, chan);
                }
            }
            Err(e) => {
                warn!(peer = ?addrs, "connecting to the next relay failed: {e}");
                for circ in waiting {
                    st.node
                        .extend_channel_failed(now, circ, DestroyReason::CONNECTFAILED);
                }
            }
        }
        process(&shared, &mut st);
    });
}

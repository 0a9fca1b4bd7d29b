//! The relay's state, channels and event handling.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::Instant;

use onionlab_cell::chan::DestroyReason;
use onionlab_cell::msg::{EncodedLinkSpec, LinkSpec};
use onionlab_circuit::node::{ChannelId, CircKey, NodeConfig, NodeEvent, RelayNode};
use onionlab_circuit::stream::StreamEvent;
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_netdoc::doc::NetworkDocument;
use onionlab_netdoc::policy::ExitPolicy;
use onionlab_transport::tls::{TlsLink, TlsListener, TlsReader, TlsTransport, TlsWriter};
use onionlab_transport::{CellReader, CellWriter, Incoming, Listener, Transport};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::Notify;
use tokio::task::{spawn_local, JoinHandle};
use tor_llcrypto::pk::ed25519::Ed25519Identity;
use tracing::{debug, info, warn};

use crate::exit::{self, ExitStream};
use crate::Error;

/// Everything a relay needs to run.
pub struct RelaySettings {
    /// The relay's nickname (for logs).
    pub nickname: String,
    /// Identity and onion keys.
    pub keys: RelaySecretKeys,
    /// Where the TLS transport listens.
    pub listen: SocketAddr,
    /// The network: relays we may extend to, and our own entry.
    pub doc: NetworkDocument,
    /// Circuit-layer settings (scheduler, memory cap...). `circuit.exit`
    /// is set from `exit_policy`.
    pub node: NodeConfig,
    /// Exit policy; `None` if this relay is not an exit.
    pub exit_policy: Option<ExitPolicy>,
}

impl RelaySettings {
    /// Settings for the relay with `keys` in `doc`: exit policy and
    /// nickname come from its entry.
    pub fn from_document(
        keys: RelaySecretKeys,
        listen: SocketAddr,
        doc: NetworkDocument,
        node: NodeConfig,
    ) -> Result<Self, Error> {
        let id = keys.public().ed_identity;
        let entry = doc
            .relay_by_identity(&id_bytes(&id))
            .ok_or_else(|| Error::NotInDocument(hex_id(&id)))?;
        let exit_policy = entry.flags.exit.then(|| entry.exit_policy.clone());
        Ok(RelaySettings {
            nickname: entry.nickname.clone(),
            keys,
            listen,
            node,
            exit_policy,
            doc,
        })
    }
}

/// Counters for logs and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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
}

/// A relay bound to its listening address.
pub struct Relay {
    settings: RelaySettings,
    transport: TlsTransport,
    listener: TlsListener,
}

pub(crate) type Shared = Rc<RefCell<State>>;

struct Chan {
    /// Wakes the writer task.
    wake: Rc<Notify>,
    reader: Option<JoinHandle<()>>,
    peer_identity: Option<Ed25519Identity>,
    peer_addr: SocketAddr,
}

pub(crate) struct State {
    pub(crate) node: RelayNode,
    nickname: String,
    our_identity: Ed25519Identity,
    channels: HashMap<ChannelId, Chan>,
    /// A channel to each relay we have one with, for EXTEND2.
    by_identity: HashMap<Ed25519Identity, ChannelId>,
    /// Circuits waiting for a connection being opened.
    connecting: HashMap<Ed25519Identity, Vec<CircKey>>,
    pub(crate) streams: HashMap<(CircKey, u16), Rc<ExitStream>>,
    next_chan: ChannelId,
    doc: Rc<NetworkDocument>,
    pub(crate) exit_policy: Option<Rc<ExitPolicy>>,
    transport: TlsTransport,
    stats: RelayStats,
}

fn id_bytes(id: &Ed25519Identity) -> [u8; 32] {
    let mut raw = [0; 32];
    raw.copy_from_slice(id.as_bytes());
    raw
}

fn hex_id(id: &Ed25519Identity) -> String {
    id.as_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

impl Relay {
    /// Bind the relay's listener.
    pub async fn bind(settings: RelaySettings) -> Result<Relay, Error> {
        let my_addrs: Vec<IpAddr> = vec![settings.listen.ip()];
        let transport = TlsTransport::relay(&settings.keys, my_addrs).map_err(Error::Transport)?;
        let listener = transport
            .bind(settings.listen)
            .await
            .map_err(|source| Error::Listen {
                addr: settings.listen,
                source,
            })?;
        Ok(Relay {
            settings,
            transport,
            listener,
        })
    }

    /// The address the relay listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
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
            transport,
            mut listener,
        } = self;
        let mut config = settings.node.clone();
        config.circuit.exit = settings.exit_policy.is_some();
        let our_identity = settings.keys.public().ed_identity;
        info!(
            nickname = %settings.nickname,
            addr = %listener.local_addr(),
            exit = config.circuit.exit,
            "relay listening"
        );
        let shared: Shared = Rc::new(RefCell::new(State {
            node: RelayNode::new(settings.keys, config, StdRng::from_rng(&mut rand::rng())),
            nickname: settings.nickname.clone(),
            our_identity,
            channels: HashMap::new(),
            by_identity: HashMap::new(),
            connecting: HashMap::new(),
            streams: HashMap::new(),
            next_chan: 1,
            doc: Rc::new(settings.doc.clone()),
            exit_policy: settings.exit_policy.clone().map(Rc::new),
            transport,
            stats: RelayStats::default(),
        }));

        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                incoming = listener.accept() => match incoming {
                    Ok(incoming) => {
                        let shared = shared.clone();
                        spawn_local(async move {
                            let addr = incoming.peer_addr();
                            match incoming.handshake().await {
                                Ok(link) => {
                                    let mut st = shared.borrow_mut();
                                    add_link(&shared, &mut st, link, false);
                                }
                                Err(e) => {
                                    shared.borrow_mut().stats.failed_handshakes += 1;
                                    info!(peer = %addr, "link handshake failed: {e}");
                                }
                            }
                        });
                    }
                    Err(e) => warn!("accept failed: {e}"),
                },
            }
        }
        // Close every channel: writers flush and shut their TLS down.
        let mut st = shared.borrow_mut();
        let chans: Vec<ChannelId> = st.channels.keys().copied().collect();
        for chan in chans {
            close_channel(&mut st, chan, "relay shutting down", false);
        }
        let stats = snapshot(&st);
        info!(nickname = %st.nickname, ?stats, "relay stopped");
        Ok(stats)
    }
}

fn snapshot(st: &State) -> RelayStats {
    RelayStats {
        channels: st.channels.len(),
        circuits: st.node.n_circuits(),
        oom_circuits_killed: st.node.oom_circuits_killed(),
        ..st.stats
    }
}

/// Register an open link as a channel and start its tasks.
fn add_link(shared: &Shared, st: &mut State, link: TlsLink, initiated_by_us: bool) -> ChannelId {
    let chan = st.next_chan;
    st.next_chan += 1;
    st.node.add_channel(chan, initiated_by_us);
    if let Some(id) = link.peer.identity {
        st.by_identity.entry(id).or_insert(chan);
    }
    debug!(
        chan,
        peer = %link.peer.addr,
        relay = link.peer.identity.is_some(),
        link_version = link.link_version,
        "channel open"
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
            peer_addr: link.peer.addr,
        },
    );
    chan
}

/// Forget a channel: its circuits are torn down by the node, its reader
/// stops, and its writer flushes what it has and shuts the link.
fn close_channel(st: &mut State, chan: ChannelId, why: &str, lost: bool) {
    let Some(mut c) = st.channels.remove(&chan) else {
        return;
    };
    if lost {
        st.stats.channels_lost += 1;
        info!(chan, peer = %c.peer_addr, "channel closed: {why}");
    } else {
        debug!(chan, peer = %c.peer_addr, "channel closed: {why}");
    }
    if let Some(r) = c.reader.take() {
        r.abort();
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

async fn read_loop(shared: Shared, chan: ChannelId, mut reader: TlsReader) {
    let mut cells = Vec::with_capacity(64);
    loop {
        cells.clear();
        let r = reader.read_cells(&mut cells).await;
        let mut st = shared.borrow_mut();
        match r {
            Ok(()) => {
                let now = Instant::now();
                let unknown_before = st.node.unknown_circuit_cells(chan);
                for cell in cells.drain(..) {
                    st.node.handle_cell(now, chan, cell);
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

async fn write_loop(shared: Shared, chan: ChannelId, mut writer: TlsWriter, wake: Rc<Notify>) {
    loop {
        let open = {
            let mut st = shared.borrow_mut();
            let open = st.channels.contains_key(&chan);
            if open {
                let now = Instant::now();
                while writer.has_room() {
                    let Some(cell) = st.node.poll_transmit(now, chan) else {
                        break;
                    };
                    if let Err(e) = writer.queue(cell) {
                        // Our own cell failed to encode: a bug, but only
                        // this channel pays for it.
                        warn!(chan, "encoding a cell: {e}");
                        close_channel(&mut st, chan, "cell encoding failed", true);
                        break;
                    }
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
        wake.notified().await;
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
                debug!(?circ, %reason, "circuit closed");
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
        }
    }
    for chan in st.node.channels_with_work() {
        if let Some(c) = st.channels.get(&chan) {
            c.wake.notify_one();
        }
    }
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
            if let Some(s) = st.streams.remove(&(circ, stream.into())) {
                s.client_ended();
            }
        }
        StreamEvent::Connected { .. } => {}
    }
}

/// Where EXTEND2 asks us to go, checked against the network document: we
/// only connect to relays it lists, at the address it lists.
fn extend_target(
    doc: &NetworkDocument,
    linkspecs: &[EncodedLinkSpec],
) -> Result<(Ed25519Identity, SocketAddr), String> {
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
    let addr = entry
        .address(onionlab_transport::TransportKind::Tls.name())
        .ok_or_else(|| format!("relay {} has no tls address", entry.nickname))?;
    if !addrs.is_empty() && !addrs.contains(&addr) {
        return Err(format!(
            "EXTEND2 to {} at {addrs:?}, but the network document says {addr}",
            entry.nickname
        ));
    }
    Ok((id, addr))
}

fn connect_relay(shared: &Shared, st: &mut State, circ: CircKey, linkspecs: &[EncodedLinkSpec]) {
    let now = Instant::now();
    let (id, addr) = match extend_target(&st.doc, linkspecs) {
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
    let transport = st.transport.clone();
    let shared = shared.clone();
    spawn_local(async move {
        let result = transport.connect(addr, id).await;
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
                warn!(peer = %addr, "connecting to the next relay failed: {e}");
                for circ in waiting {
                    st.node
                        .extend_channel_failed(now, circ, DestroyReason::CONNECTFAILED);
                }
            }
        }
        process(&shared, &mut st);
    });
}

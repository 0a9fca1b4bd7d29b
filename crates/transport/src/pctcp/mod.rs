//! The `pctcp` transport: one TLS-over-TCP connection per circuit between
//! two nodes (PCTCP, AlSabah and Goldberg, "PCTCP: Per-Circuit TCP-over-
//! IPsec Transport for Anonymous Communication Overlay Networks", CCS
//! 2013; without the IPsec part: each circuit's connection is a TLS
//! connection authenticated like the link). It is seed 001's control: the
//! head-of-line isolation and per-circuit congestion window of
//! `quic-conn-per-circuit`, with the kernel's TCP.
//!
//! # Layout
//!
//! Every connection is TLS 1.3 over TCP with the relays' Ed25519 raw
//! public keys, exactly as the [`tls`](crate::tls) transport.
//!
//! - **Main connection.** The opener writes a link preamble after TLS:
//!   `OLT1`, mode byte 1, its 16-byte link token, and where it accepts
//!   lanes (family byte 0: nowhere, a client; 4 or 6: address and port of
//!   a relay's TCP listener). The acceptor answers `OLT1` and its own
//!   token. Both then run tor's VERSIONS/NETINFO handshake
//!   ([`crate::link`]) on it. It carries link-level cells and the circuits
//!   that have no lane.
//! - **Lanes.** The first side to send on a circuit ID opens a TLS
//!   connection to the other's lane address, requiring the link's
//!   identity (a peer proving another key is refused, as on the link),
//!   and writes a lane preamble: `OLTL`, the receiver's link token, the
//!   circuit ID, the lane's number among those its opener opened on this
//!   link (from 1) and the number of the opener's previous lane for the
//!   same circuit ID (0: none). The acceptor checks that the lane proves
//!   the same identity as its link (a client's lanes: none, like its
//!   link). Both directions of the circuit then use that connection.
//!   Sending or receiving a DESTROY ends the lane.
//! - **Reused circuit IDs are ordered.** A lane is read only after the
//!   previous lane of its circuit ID ended (its previous number says which
//!   one that is, whatever order the TCP connections were accepted in),
//!   so an old circuit's DESTROY reaches the node before a new circuit's
//!   CREATE2.
//!
//! The opener of the link gives its listener's address only if it is a
//! relay, so a guard never opens lanes to a client: a circuit whose first
//! cell the guard would send (none in tor: clients create circuits) stays
//! on the main connection. A circuit whose first cell arrived on the main
//! connection stays there in both directions.
//!
//! # Liveness
//!
//! The link's connections have no kernel keep-alive: each side sends a
//! PADDING cell on the main connection every heartbeat, and the link fails
//! when nothing arrived on any of its connections for the silence limit
//! ([`crate::liveness`]). The main connection, which carries no circuit,
//! is the quiet one; judged alone, its keep-alive probes could all be lost
//! behind a full bottleneck while its lanes are busy.
//!
//! # Bounds
//!
//! - **Descriptors.** A node opens lanes while fewer than its cap
//!   ([`PctcpSettings::max_lanes`], `pctcp_max_lanes`) of its lane
//!   connections (opened or accepted) are open; above it, new circuits use
//!   the main connection, and the fallback is counted
//!   ([`TlsTransport::pctcp_fallbacks`]) and logged at INFO (at most once
//!   per interval). Lanes it accepts are bounded per link by
//!   [`MAX_LANES_PER_LINK`] (a peer opening more broke the protocol) and
//!   by the relay's connection limits.
//! - **Memory.** Each connection buffers at most `LANE_HIGH_WATER` (16 KiB)
//!   of encoded cells before it reports no room, so cells wait in the
//!   circuit queues; received cells wait in a bounded queue for the node,
//!   and connections are not read while it is full.
//!
//! A lane that fails (cannot be opened, is refused or reset) ends only its
//! circuit: the node gets a DESTROY (CHANNEL_CLOSED) as from the peer,
//! the cells queued on the lane are dropped with it, and the link and its
//! other circuits go on; after a refusal new circuits use the main
//! connection for a while (counted as fallbacks). A lane to a relay that
//! proves another identity, a protocol error on a lane, or the main
//! connection's failure fails the whole link: the node then destroys the
//! link's circuits, and the applications see their streams fail.

pub(crate) mod lanes;
pub mod wire;

/// The pure parsing of the pctcp transport's reads, for the fuzz targets
/// (`fuzz/`); not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    pub use super::wire::*;
}

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use bytes::BytesMut;
use onionlab_ops::LogLimiter;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsStream;
use tor_llcrypto::pk::ed25519::Ed25519Identity;
use tracing::info;

use lanes::{Dialer, LinkShared, LinkSpec};
pub use lanes::{PctcpReader, PctcpWriter};
use wire::{LinkPreamble, Start, TOKEN_LEN};

use crate::any::AnyLink;
use crate::endpoint::{EndpointKind, Endpoints};
use crate::link;
use crate::registry::{SettingInfo, TransportInfo};
use crate::tls::{keepalive_off, TlsTransport};
use crate::{Error, Link, Ordering, PeerInfo, TransportKind};

/// Default [`PctcpSettings::max_lanes`]: well under the usual 1024
/// descriptors of a process's soft limit, leaving room for the exit's
/// connections and the links themselves.
pub const DEFAULT_MAX_LANES: usize = 512;
/// Most lanes one link may have open, in either direction (a protocol
/// constant: an opener falls back to the main connection above it, an
/// acceptor closes a link whose peer opens more).
pub const MAX_LANES_PER_LINK: usize = 4096;

/// The registry's description of this transport.
pub(crate) static INFO: TransportInfo = TransportInfo {
    name: "pctcp",
    about: "one TLS over TCP connection per circuit (PCTCP, AlSabah and Goldberg 2013; seed 001's control)",
    ordering: Ordering::PerCircuit,
    endpoint: EndpointKind::TCP,
    settings: &[
        SettingInfo {
            key: "pctcp_max_lanes",
            default: "512",
            about: "lane connections a node keeps open at most; above it new circuits share the main connection",
        },
        SettingInfo {
            key: "tcp_congestion",
            default: "the match of quic_congestion",
            about: "kernel congestion control of every TCP socket, lanes included",
        },
        SettingInfo {
            key: "tcp_pacing",
            default: "false",
            about: "Linux paces every TCP socket, lanes included",
        },
    ],
    open: |endpoints, addr, expected| Box::pin(open_link(endpoints, addr, expected)),
};

/// The pctcp transport's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PctcpSettings {
    /// Lane connections this node keeps open at most (`pctcp_max_lanes`).
    pub max_lanes: usize,
}

impl Default for PctcpSettings {
    fn default() -> Self {
        PctcpSettings {
            max_lanes: DEFAULT_MAX_LANES,
        }
    }
}

/// A token reserved by a link in its handshake (see
/// [`NodeLanes::reserve`]).
pub(crate) struct Reservation {
    node: Arc<NodeLanes>,
    token: [u8; TOKEN_LEN],
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.node.unreserve(&self.token);
    }
}

/// A link that accepts more connections, by its token.
enum LinkRef {
    Pctcp(Weak<LinkShared>),
    Torchestra(Weak<crate::torchestra::link::LinkShared>),
}

impl LinkRef {
    fn alive(&self) -> bool {
        match self {
            LinkRef::Pctcp(l) => l.strong_count() > 0,
            LinkRef::Torchestra(l) => l.strong_count() > 0,
        }
    }
}

/// A node's state for its links with several TCP connections (pctcp,
/// torchestra), shared by its links: their tokens, and the pctcp lane
/// count against the cap.
pub(crate) struct NodeLanes {
    links: Mutex<HashMap<[u8; TOKEN_LEN], LinkRef>>,
    /// Tokens handed out by links still in their handshake: a connection
    /// for one of them waits for the link (the peer may open it the
    /// moment its own handshake ends, before ours does).
    reserved: Mutex<HashMap<[u8; TOKEN_LEN], Arc<tokio::sync::Notify>>>,
    /// Lane connections open (opened or accepted).
    pub(crate) open: AtomicUsize,
    /// Torchestra heavy connections attached so far.
    pub(crate) heavy_attached: AtomicU64,
    pub(crate) max: usize,
    fallbacks: AtomicU64,
    log: Mutex<LogLimiter>,
}

impl NodeLanes {
    pub(crate) fn new(settings: PctcpSettings) -> Arc<Self> {
        Arc::new(NodeLanes {
            links: Mutex::default(),
            reserved: Mutex::default(),
            open: AtomicUsize::new(0),
            heavy_attached: AtomicU64::new(0),
            max: settings.max_lanes,
            fallbacks: AtomicU64::new(0),
            log: Mutex::default(),
        })
    }

    /// A new circuit to `peer` uses the main connection for lack of room.
    pub(crate) fn fell_back(&self, peer: SocketAddr) {
        let total = self.fallbacks.fetch_add(1, AtomicOrdering::Relaxed) + 1;
        let held_back = self
            .log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .check(Instant::now());
        if let Some(held_back) = held_back {
            info!(
                %peer,
                total,
                held_back,
                open = self.open.load(AtomicOrdering::Relaxed),
                max = self.max,
                "pctcp lane cap reached: new circuits share the main connection"
            );
        }
    }

    /// Circuits that used the main connection for lack of room so far.
    pub(crate) fn fallbacks(&self) -> u64 {
        self.fallbacks.load(AtomicOrdering::Relaxed)
    }

    fn register(&self, token: [u8; TOKEN_LEN], link: LinkRef) {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        links.retain(|_, l| l.alive());
        links.insert(token, link);
        drop(links);
        self.unreserve(&token);
    }

    /// `token` will name a link once its handshake completes; the
    /// reservation ends when the guard is dropped (the link registered,
    /// or its handshake failed or was abandoned).
    pub(crate) fn reserve(self: &Arc<Self>, token: [u8; TOKEN_LEN]) -> Reservation {
        let mut reserved = self.reserved.lock().unwrap_or_else(|p| p.into_inner());
        reserved.insert(token, Arc::new(tokio::sync::Notify::new()));
        Reservation {
            node: self.clone(),
            token,
        }
    }

    /// The link of `token` registered, or its handshake failed.
    pub(crate) fn unreserve(&self, token: &[u8; TOKEN_LEN]) {
        let mut reserved = self.reserved.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = reserved.remove(token) {
            n.notify_waiters();
        }
    }

    /// Wait (within the caller's handshake timeout) while `token` is
    /// reserved by a link still in its handshake.
    async fn settled(&self, token: &[u8; TOKEN_LEN]) {
        let waiting = {
            let reserved = self.reserved.lock().unwrap_or_else(|p| p.into_inner());
            reserved.get(token).cloned()
        };
        if let Some(n) = waiting {
            let notified = n.notified();
            let still = self
                .reserved
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(token);
            if still {
                notified.await;
            }
        }
    }

    fn find(&self, token: &[u8; TOKEN_LEN]) -> Option<Arc<LinkShared>> {
        let links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        match links.get(token) {
            Some(LinkRef::Pctcp(l)) => l.upgrade(),
            _ => None,
        }
    }

    /// Register a torchestra link under our token.
    pub(crate) fn register_torchestra(
        &self,
        token: [u8; TOKEN_LEN],
        link: &Arc<crate::torchestra::link::LinkShared>,
    ) {
        self.register(token, LinkRef::Torchestra(Arc::downgrade(link)));
    }

    fn find_torchestra(
        &self,
        token: &[u8; TOKEN_LEN],
    ) -> Option<Arc<crate::torchestra::link::LinkShared>> {
        let links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        match links.get(token) {
            Some(LinkRef::Torchestra(l)) => l.upgrade(),
            _ => None,
        }
    }
}

async fn open_link(
    endpoints: &Endpoints,
    addr: SocketAddr,
    expected: Ed25519Identity,
) -> Result<AnyLink, Error> {
    let tcp: &TlsTransport = endpoints.get(EndpointKind::TCP, TransportKind::PCTCP)?;
    let link = tokio::time::timeout(tcp.handshake_timeout(), connect(tcp, addr, expected))
        .await
        .map_err(|_| Error::HandshakeTimeout { peer: addr })??;
    Ok(AnyLink::erase(TransportKind::PCTCP, link))
}

/// Open a pctcp link to `addr`, whose peer must prove `expected`.
async fn connect(
    transport: &TlsTransport,
    addr: SocketAddr,
    expected: Ed25519Identity,
) -> Result<Link<PctcpReader, PctcpWriter>, Error> {
    let mut tls = transport.connect_tls(addr, expected).await?;
    let tls_err = |source| Error::Tls { peer: addr, source };
    let our_token: [u8; TOKEN_LEN] = rand::random();
    let preamble = LinkPreamble {
        mode: wire::MODE_PCTCP,
        token: our_token,
        lanes_at: transport.lane_address(),
    };
    tls.write_all(&wire::encode_link_preamble(&preamble))
        .await
        .map_err(tls_err)?;
    let mut answer = [0u8; wire::LINK_ANSWER_LEN];
    tls.read_exact(&mut answer).await.map_err(tls_err)?;
    let peer_token =
        wire::parse_link_answer(&answer).map_err(|source| Error::Framing { peer: addr, source })?;
    let negotiated = link::handshake(&mut tls, transport.initiator_role(), addr).await?;
    keepalive_off(&tls);
    Ok(start(
        transport,
        LinkSpec {
            conn: Box::new(tls),
            leftover: negotiated.leftover,
            link_version: negotiated.link_version,
            peer: PeerInfo {
                identity: Some(expected),
                addr,
            },
            our_token,
            peer_token,
            dialer: Dialer::Tcp {
                transport: transport.clone(),
                target: Some(addr),
            },
            liveness: transport.liveness_timing(),
        },
    ))
}

fn start(transport: &TlsTransport, spec: LinkSpec) -> Link<PctcpReader, PctcpWriter> {
    let node = transport.pctcp_lanes().clone();
    let token = spec.our_token;
    let (link, shared) = lanes::start(spec, node.clone());
    node.register(token, LinkRef::Pctcp(Arc::downgrade(&shared)));
    link
}

/// What an accepted TCP connection turned out to be.
pub(crate) enum Accepted {
    /// A link, complete.
    Link(AnyLink),
    /// A connection joining a link (a pctcp lane, a torchestra heavy
    /// connection), handed to it.
    Lane,
}

/// Complete an accepted connection whose first 4 bytes after TLS were
/// `first`: a pctcp link or lane. `identity` is what the peer proved.
pub(crate) async fn accept(
    transport: &TlsTransport,
    mut tls: TlsStream<TcpStream>,
    first: [u8; 4],
    identity: Option<Ed25519Identity>,
    addr: SocketAddr,
) -> Result<Accepted, Error> {
    let tls_err = |source| Error::Tls { peer: addr, source };
    let protocol = |detail| Error::Protocol { peer: addr, detail };
    let framing = |source| Error::Framing { peer: addr, source };
    match wire::classify(&first) {
        Start::Plain => Err(protocol("not a pctcp connection".into())),
        Start::Lane => {
            let mut bytes = [0u8; wire::LANE_PREAMBLE_LEN];
            bytes[..4].copy_from_slice(&first);
            tls.read_exact(&mut bytes[4..]).await.map_err(tls_err)?;
            let p = wire::parse_lane_preamble(&bytes).map_err(framing)?;
            // The opener may open a lane the moment its handshake ends,
            // before ours has.
            transport.pctcp_lanes().settled(&p.token).await;
            let link = transport
                .pctcp_lanes()
                .find(&p.token)
                .ok_or_else(|| protocol("lane for an unknown link".into()))?;
            if link.peer.identity != identity {
                return Err(protocol(
                    "lane connection from another identity than its link's".into(),
                ));
            }
            keepalive_off(&tls);
            lanes::accept_lane(&link, p, Box::new(tls));
            Ok(Accepted::Lane)
        }
        Start::Heavy => {
            let mut bytes = [0u8; wire::HEAVY_PREAMBLE_LEN];
            bytes[..4].copy_from_slice(&first);
            tls.read_exact(&mut bytes[4..]).await.map_err(tls_err)?;
            let token = wire::parse_heavy_preamble(&bytes).map_err(framing)?;
            transport.pctcp_lanes().settled(&token).await;
            let link = transport
                .pctcp_lanes()
                .find_torchestra(&token)
                .ok_or_else(|| protocol("heavy connection for an unknown link".into()))?;
            if link.peer.identity != identity || identity.is_none() {
                return Err(protocol(
                    "heavy connection from another identity than its link's".into(),
                ));
            }
            link.accept_heavy(tls)?;
            Ok(Accepted::Lane)
        }
        Start::Link => {
            let mut bytes = vec![0u8; wire::FAMILY_OFFSET + 1];
            bytes[..4].copy_from_slice(&first);
            tls.read_exact(&mut bytes[4..]).await.map_err(tls_err)?;
            let len = wire::link_preamble_len(bytes[wire::FAMILY_OFFSET])
                .ok_or_else(|| protocol("bad pctcp link preamble".into()))?;
            bytes.resize(len, 0);
            tls.read_exact(&mut bytes[wire::FAMILY_OFFSET + 1..])
                .await
                .map_err(tls_err)?;
            let p = wire::parse_link_preamble(&bytes).map_err(framing)?;
            if p.mode == wire::MODE_TORCHESTRA {
                let link = crate::torchestra::accept(transport, tls, p, identity, addr).await?;
                return Ok(Accepted::Link(link));
            }
            // Lanes go only to relays: an anonymous peer's address is
            // ignored.
            let lane_target = p.lanes_at.filter(|_| identity.is_some());
            let our_token: [u8; TOKEN_LEN] = rand::random();
            // Held until the link is registered, whatever happens meanwhile.
            let _reservation = transport.pctcp_lanes().reserve(our_token);
            tls.write_all(&wire::encode_link_answer(&our_token))
                .await
                .map_err(tls_err)?;
            let negotiated = link::handshake(&mut tls, transport.responder_role(), addr).await?;
            let link = start(
                transport,
                LinkSpec {
                    conn: {
                        keepalive_off(&tls);
                        Box::new(tls)
                    },
                    leftover: negotiated.leftover,
                    link_version: negotiated.link_version,
                    peer: PeerInfo { identity, addr },
                    our_token,
                    peer_token: p.token,
                    dialer: Dialer::Tcp {
                        transport: transport.clone(),
                        target: lane_target,
                    },
                    liveness: transport.liveness_timing(),
                },
            );
            Ok(Accepted::Link(AnyLink::erase(TransportKind::PCTCP, link)))
        }
    }
}

/// Bytes `first` as the start of a link handshake's input.
pub(crate) fn prefix(first: [u8; 4]) -> BytesMut {
    BytesMut::from(&first[..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Listener, Transport};
    use onionlab_crypto::identity::RelaySecretKeys;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn relay(seed: u64) -> (TlsTransport, Ed25519Identity) {
        let keys = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(seed));
        let t = TlsTransport::relay(&keys, vec![]).expect("tls");
        (t, keys.public().ed_identity)
    }

    /// A relay that knows a link's token but proves another identity than
    /// the link's peer cannot attach a lane to it.
    #[tokio::test]
    async fn a_lane_from_another_identity_is_refused() {
        let (a, _) = relay(1);
        let (b, b_id) = relay(2);
        let (d, _) = relay(3);
        let mut listener = b.bind("127.0.0.1:0".parse().unwrap()).await.expect("bind");
        let addr = listener.local_addr();
        let accept = async {
            let incoming = listener.accept().await.expect("accept");
            match incoming.accept_any().await.expect("link") {
                Accepted::Link(link) => link,
                Accepted::Lane => panic!("a lane"),
            }
        };
        let (ours, _theirs) = tokio::join!(connect(&a, addr, b_id), accept);
        let _ours = ours.expect("link");
        let token = *b
            .pctcp_lanes()
            .links
            .lock()
            .unwrap()
            .keys()
            .next()
            .expect("b's token");
        let lane = async {
            let mut tls = d.connect_tls(addr, b_id).await.expect("tls");
            let p = wire::LanePreamble {
                token,
                circ_id: 5,
                seq: 1,
                prev: 0,
            };
            tls.write_all(&wire::encode_lane_preamble(&p))
                .await
                .expect("write");
            tls
        };
        let accept = async {
            let incoming = listener.accept().await.expect("accept");
            incoming.accept_any().await
        };
        let (_tls, accepted) = tokio::join!(lane, accept);
        match accepted {
            Err(Error::Protocol { detail, .. }) => {
                assert!(detail.contains("another identity"), "{detail}")
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("the lane was accepted"),
        }
        assert_eq!(b.pctcp_open_lanes(), 0);
    }
}

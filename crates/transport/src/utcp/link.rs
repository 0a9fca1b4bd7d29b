//! dtls-utcp links: one DTLS session per link, its first lane the link's
//! control lane, every circuit on a lane of its own. Above the lanes it is
//! pctcp's code ([`crate::pctcp`]): the same lane preamble (circuit ID,
//! lane number, predecessor), the same ordering of reused circuit IDs, the
//! same fallback to the control lane above the lane cap, the same liveness
//! check; only how a lane is opened and accepted differs.
//!
//! # The control lane
//!
//! The session's opener opens the first lane and writes `OLU1` and its
//! 16-byte link token; the acceptor answers `OLU1` and its own token. Tor's
//! VERSIONS/NETINFO handshake follows on the same lane, which then carries
//! link-level cells and the circuits that have no lane. Each later lane
//! starts with pctcp's lane preamble naming the receiver's token.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_dtls::endpoint::{
    DEFAULT_MAX_HANDSHAKES, DEFAULT_MAX_HANDSHAKES_PER_IP, DEFAULT_MAX_SESSIONS,
};
use onionlab_utcp::{
    EndpointConfig, LaneBudget, LaneConfig, SessionConfig, Settings, DEFAULT_ANONYMOUS_MAX_LANES,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tor_llcrypto::pk::ed25519::Ed25519Identity;
use tracing::debug;

use super::socket::{IncomingLanes, UtcpSession, UtcpSocket};
use crate::endpoint::BoxFuture;
use crate::lanes::{self, Lane, LaneDialer, LaneHeader, LaneRules, LinkShared, LinkSpec, MainConn};
use crate::lanes::{LaneReader, LaneSettings, LaneWriter, NodeLanes};
use crate::link::{self, Role};
use crate::liveness::LivenessTiming;
use crate::tcp_share::wire::TOKEN_LEN;
use crate::{Error, Link, PeerInfo};

/// First bytes of the control lane, each way.
const CONTROL_MAGIC: &[u8; 4] = b"OLU1";
/// How long a peer's new lane may take to name its circuit.
const PREAMBLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Default [`UtcpSettings::liveness`]: a heartbeat every 2 s and 8 s of
/// silence, QUIC's keep-alive and idle timeout: over UDP no kernel tells
/// a peer that a relay died, so silence is the only sign (pctcp over TCP
/// gets a reset, and keeps 10 s and 60 s).
pub const DEFAULT_LIVENESS: LivenessTiming = LivenessTiming {
    heartbeat: Duration::from_secs(2),
    silence_limit: Duration::from_secs(8),
};

/// A dtls-utcp link's halves (pctcp's reader and writer).
pub type UtcpLink = Link<LaneReader, LaneWriter>;

/// The settings of a node's dtls-utcp transport.
#[derive(Clone, Debug)]
pub struct UtcpSettings {
    /// The lanes' user-space TCP.
    pub utcp: Settings,
    /// Largest UDP payload sent.
    pub datagram: usize,
    /// Bound on the DTLS handshake, the identity exchange and the link
    /// handshake.
    pub handshake_timeout: Duration,
    /// Heartbeat and silence limit of the links.
    pub liveness: LivenessTiming,
    /// Lanes the node keeps open at most, opened and accepted, over all
    /// its sessions (each lane holds its buffers, about 450 KiB); above it
    /// its new circuits share the control lane, and a peer's new lanes are
    /// refused (reset). A client's session has at most
    /// `DEFAULT_ANONYMOUS_MAX_LANES` (64).
    pub max_lanes: usize,
}

impl Default for UtcpSettings {
    fn default() -> Self {
        UtcpSettings {
            utcp: Settings::default(),
            datagram: 1280,
            handshake_timeout: crate::tls::DEFAULT_HANDSHAKE_TIMEOUT,
            liveness: DEFAULT_LIVENESS,
            max_lanes: crate::lanes::DEFAULT_MAX_LANES,
        }
    }
}

impl UtcpSettings {
    /// These settings with `tcp` for the lanes, and datagrams of its
    /// largest segment in one DTLS record (no larger: a lab link's MTU
    /// sets the segment, and a larger datagram would be fragmented), but
    /// at least 548 bytes (what IPv4's minimum MTU of 576 carries) for
    /// the handshake's flights.
    pub fn with_lane_tcp(mut self, tcp: Settings) -> Self {
        self.datagram = (tcp.max_segment + onionlab_utcp::RECORD_OVERHEAD).max(548);
        self.utcp = tcp;
        self
    }
}

/// A node's dtls-utcp transport: a relay accepts sessions on one socket
/// and opens its own from another (`docs/dtls-utcp.md`, section 6); a
/// client only opens.
pub struct UtcpTransport {
    accepting: Option<UtcpSocket>,
    opening: UtcpSocket,
    settings: UtcpSettings,
    my_addrs: Vec<IpAddr>,
    relay: bool,
    node: Arc<NodeLanes>,
}

impl UtcpTransport {
    /// A relay's transport, accepting at `listen` (UDP) and opening from
    /// an ephemeral port of the same address.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if a socket cannot be bound, [`Error::Config`] for
    /// settings out of range.
    pub async fn relay(
        keys: &RelaySecretKeys,
        my_addrs: Vec<IpAddr>,
        listen: SocketAddr,
        settings: UtcpSettings,
    ) -> Result<Self, Error> {
        let secret = keys.ed25519_keypair().as_bytes();
        let identity = Some(Arc::new(tor_llcrypto::pk::ed25519::Keypair::from_bytes(
            secret,
        )));
        // Both sockets' lanes count against the node's cap.
        let budget = LaneBudget::new(settings.max_lanes);
        let accepting = UtcpSocket::bind(
            listen,
            endpoint_config(&settings, identity.clone(), true, &budget),
        )
        .await?;
        let opening = UtcpSocket::bind(
            SocketAddr::new(listen.ip(), 0),
            endpoint_config(&settings, identity, false, &budget),
        )
        .await?;
        Ok(Self::from_parts(
            Some(accepting),
            opening,
            settings,
            my_addrs,
            true,
        ))
    }

    /// A client's transport (anonymous, opening only), bound to `ip`.
    /// Needs a tokio runtime (it starts the socket's driver) but does not
    /// wait.
    ///
    /// # Errors
    ///
    /// As [`relay`](Self::relay).
    pub fn client(ip: IpAddr, settings: UtcpSettings) -> Result<Self, Error> {
        let budget = LaneBudget::new(settings.max_lanes);
        let opening = UtcpSocket::bind_now(
            SocketAddr::new(ip, 0),
            endpoint_config(&settings, None, false, &budget),
        )?;
        Ok(Self::from_parts(None, opening, settings, Vec::new(), false))
    }

    fn from_parts(
        accepting: Option<UtcpSocket>,
        opening: UtcpSocket,
        settings: UtcpSettings,
        my_addrs: Vec<IpAddr>,
        relay: bool,
    ) -> Self {
        let node = NodeLanes::new(LaneSettings {
            max_lanes: settings.max_lanes,
        });
        UtcpTransport {
            accepting,
            opening,
            settings,
            my_addrs,
            relay,
            node,
        }
    }

    /// Where a relay accepts sessions.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.accepting.as_ref().map(UtcpSocket::local_addr)
    }

    /// Open a link to the relay at `addr` (its dtls-utcp UDP address),
    /// which must prove `expected`.
    ///
    /// # Errors
    ///
    /// [`Error::HandshakeTimeout`], or what failed.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        expected: Ed25519Identity,
    ) -> Result<UtcpLink, Error> {
        let opened = async {
            let session = self.opening.connect(addr, expected).await?;
            self.start(session, true).await
        };
        tokio::time::timeout(self.settings.handshake_timeout, opened)
            .await
            .map_err(|_| Error::HandshakeTimeout { peer: addr })?
    }

    /// The next link a peer opened (`Err(Error::Closed)`: this transport
    /// accepts none). A session whose link handshake fails is dropped and
    /// the next one awaited.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] when there is nothing to accept.
    pub async fn accept(self: &Arc<Self>) -> Result<UtcpLink, Error> {
        loop {
            let incoming = self.accept_session().await?;
            let peer = incoming.peer_addr();
            match incoming.handshake().await {
                Ok(link) => return Ok(link),
                Err(e) => debug!(%peer, "dtls-utcp link handshake failed: {e}"),
            }
        }
    }

    /// The next session a peer opened, its link handshake still to run
    /// ([`UtcpIncoming::handshake`]), so that one slow peer does not hold
    /// up the others.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] when there is nothing to accept.
    pub async fn accept_session(self: &Arc<Self>) -> Result<UtcpIncoming, Error> {
        let socket = self.accepting.as_ref().ok_or(Error::Closed)?;
        let session = socket.accept().await.ok_or(Error::Closed)?;
        Ok(UtcpIncoming {
            transport: self.clone(),
            session,
        })
    }

    /// Lanes open on this node (both sockets).
    pub fn open_lanes(&self) -> usize {
        self.node.open.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Run the control lane's exchange and the link handshake on a fresh
    /// session, then start the link and its acceptor of lanes.
    async fn start(&self, mut session: UtcpSession, opener: bool) -> Result<UtcpLink, Error> {
        let peer = session.peer();
        let identity = session.identity();
        let mut incoming = session.incoming();
        let mut control = if opener {
            session.open_lane()?
        } else {
            incoming.next().await.ok_or(Error::Closed)?
        };
        let io = |source| Error::Utcp { peer, source };
        let our_token: [u8; TOKEN_LEN] = rand::random();
        let mut hello = CONTROL_MAGIC.to_vec();
        hello.extend_from_slice(&our_token);
        control.write_all(&hello).await.map_err(io)?;
        let mut answer = [0u8; 4 + TOKEN_LEN];
        control.read_exact(&mut answer).await.map_err(io)?;
        if &answer[..4] != CONTROL_MAGIC {
            return Err(Error::Protocol {
                peer,
                detail: "not a dtls-utcp control lane".into(),
            });
        }
        let mut peer_token = [0u8; TOKEN_LEN];
        peer_token.copy_from_slice(&answer[4..]);
        let role = if opener {
            Role::Initiator {
                my_addrs: self.my_addrs.clone(),
                relay: self.relay,
            }
        } else {
            Role::Responder {
                my_addrs: self.my_addrs.clone(),
            }
        };
        let negotiated = link::handshake(&mut control, role, peer).await?;
        let session = Arc::new(session);
        let (link, shared) = lanes::start(
            LinkSpec {
                main: MainConn::stream(Box::new(control)),
                leftover: negotiated.leftover,
                link_version: negotiated.link_version,
                peer: PeerInfo {
                    identity,
                    addr: peer,
                },
                our_token,
                peer_token,
                // Lanes go to relays only, as pctcp's: a relay never opens
                // one to a client.
                dialer: Box::new(SessionDialer(session)),
                liveness: Some(self.settings.liveness),
            },
            self.node.clone(),
        );
        shared.spawn_background(accept_lanes(shared.clone(), incoming, our_token));
        Ok(link)
    }
}

/// A session a peer opened, before the link handshake.
pub struct UtcpIncoming {
    transport: Arc<UtcpTransport>,
    session: UtcpSession,
}

impl UtcpIncoming {
    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.session.peer()
    }

    /// Run the link handshake (bounded by the handshake timeout).
    ///
    /// # Errors
    ///
    /// [`Error::HandshakeTimeout`], or what failed.
    pub async fn handshake(self) -> Result<UtcpLink, Error> {
        let peer = self.session.peer();
        let t = self.transport;
        tokio::time::timeout(t.settings.handshake_timeout, t.start(self.session, false))
            .await
            .map_err(|_| Error::HandshakeTimeout { peer })?
    }
}

/// dtls-utcp's lanes: user-space TCP connections of the link's session.
struct SessionDialer(Arc<UtcpSession>);

impl LaneDialer for SessionDialer {
    /// pctcp's: lanes are connections of their own (user-space TCP in
    /// the session), numbered, and the control lane carries the circuits
    /// above the caps.
    fn rules(&self) -> LaneRules {
        LaneRules {
            name: "dtls-utcp",
            main_carries_circuits: true,
            lane_errors_end_circuit: true,
            priorities: false,
            linger: true,
        }
    }

    /// The byte-stream lane preamble (pctcp's too).
    fn header(&self, header: &LaneHeader) -> Vec<u8> {
        lanes::wire::encode_lane_preamble(header)
    }

    fn held(&self, _blocked_lanes: usize) -> (usize, usize) {
        (self.0.held().recv(), self.0.held().send())
    }

    /// The session's lane limit and the node's lane budget, which also
    /// count its control lane and closing lanes.
    fn has_room(&self) -> bool {
        self.0.can_open_lane()
    }

    fn can_open(&self) -> bool {
        true
    }

    fn take_now(&self) -> Option<Result<Lane, Error>> {
        Some(self.0.open_lane().map(|l| Lane::stream(Box::new(l))))
    }

    fn open(
        &self,
        _peer: SocketAddr,
        _identity: Option<Ed25519Identity>,
        _circ_id: u32,
    ) -> BoxFuture<'_, Result<Lane, Error>> {
        Box::pin(async move { Ok(Lane::stream(Box::new(self.0.open_lane()?))) })
    }

    fn named(&self, e: Error) -> Error {
        match e {
            Error::Tls { peer, source } => Error::Utcp { peer, source },
            e => e,
        }
    }
}

/// Hand the peer's lanes to the link once their preamble named a circuit
/// (and this link's token); a lane that does not is reset.
async fn accept_lanes(link: Arc<LinkShared>, mut incoming: IncomingLanes, token: [u8; TOKEN_LEN]) {
    while let Some(mut lane) = incoming.next().await {
        let mut bytes = [0u8; lanes::wire::LANE_PREAMBLE_LEN];
        let read = tokio::time::timeout(PREAMBLE_TIMEOUT, lane.read_exact(&mut bytes)).await;
        let peer = link.peer.addr;
        let preamble = match read {
            Ok(Ok(_)) => lanes::wire::parse_lane_preamble(&bytes)
                .map_err(|source| Error::Framing { peer, source }),
            Ok(Err(e)) => Err(Error::Protocol {
                peer,
                detail: format!("reading a lane preamble: {e}"),
            }),
            Err(_) => Err(Error::Protocol {
                peer,
                detail: "no lane preamble in time".into(),
            }),
        };
        match preamble {
            Ok(p) if p.token == token => {
                lanes::accept_numbered(&link, &p, Lane::stream(Box::new(lane)))
            }
            Ok(_) => link.fail_with(Error::Protocol {
                peer,
                detail: "a lane naming another link".into(),
            }),
            Err(e) => link.fail_with(e),
        }
    }
}

fn endpoint_config(
    settings: &UtcpSettings,
    identity: Option<Arc<tor_llcrypto::pk::ed25519::Keypair>>,
    accept: bool,
    budget: &LaneBudget,
) -> EndpointConfig {
    EndpointConfig {
        session: SessionConfig {
            carrier: LaneConfig {
                utcp: settings.utcp.clone(),
                lane_budget: Some(budget.clone()),
                anonymous_max_lanes: DEFAULT_ANONYMOUS_MAX_LANES,
            },
            datagram: settings.datagram,
            identity,
            expect_peer: None,
            handshake_timeout: settings.handshake_timeout,
            certificate: None,
        },
        accept,
        max_sessions: DEFAULT_MAX_SESSIONS,
        max_handshakes: DEFAULT_MAX_HANDSHAKES,
        max_handshakes_per_ip: DEFAULT_MAX_HANDSHAKES_PER_IP,
    }
}

//! The vanilla Tor transport: one TLS 1.3 over TCP connection per pair of
//! nodes, carrying every circuit between them in one ordered byte stream.
//!
//! Identity: TLS raw public keys bound to Ed25519 identities (see
//! [`identity`]). Framing and link handshake: [`crate::link`].
//!
//! Unlike tor, sockets get `TCP_NODELAY`: tor leaves Nagle on, and a cell
//! written behind an unacknowledged one then waits for the peer's delayed
//! ACK (tens of ms of time-to-first-byte). Cells are already batched by the
//! writer's buffer, so Nagle buys nothing here.

pub mod identity;
pub(crate) mod setup;

/// rustls's `max_fragment_size` for our records: eight 514-byte cells of
/// plaintext and the 5-byte header (on the wire, 4134 bytes with the
/// content type and AES-GCM's tag). rustls's default is the TLS
/// maximum of 16 KiB, more than a fresh TCP connection's initial window
/// (10 segments, about 14.5 KB): the record's tail then waits a round trip
/// for an ACK, and no cell of it can be decrypted before. At every hop of a
/// fresh circuit that added a hop's round trip to the first byte. A 4 KiB
/// record costs 22 bytes of header and tag (0.5%).
const MAX_RECORD: usize = 8 * 514 + 5;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use onionlab_crypto::identity::RelaySecretKeys;
use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::ServerName;
use rustls::server::AlwaysResolvesServerRawPublicKeys;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, ServerConfig};
use tokio::io::{AsyncReadExt, ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};
use tor_llcrypto::pk::ed25519::Ed25519Identity;

use crate::any::{AnyLink, AnyReader, AnyWriter};
use crate::any::{SettingInfo, TransportInfo};
use crate::endpoint::{EndpointInfo, EndpointKind};
use crate::lanes::{LaneSettings, NodeLanes};
use crate::link::{self, Role, StreamCellReader, StreamCellWriter};
use crate::liveness::LivenessTiming;
use crate::tcp::TcpCongestion;
use crate::tcp_share::states::ModeStates;
use crate::tcp_share::tokens::Tokens;
use crate::{Error, Link, Ordering, PeerInfo, Transport, TransportKind};

/// The TCP endpoint: one listener for TLS and the transports that
/// register a mode on it ([`tcp_share`]), which tell their connections
/// apart by what the peer sends first.
pub(crate) static ENDPOINT: EndpointInfo = EndpointInfo {
    doc_name: "tls",
    about: "TCP: TLS links and the connections of the transports that share its port",
    protocol: crate::any::IpProtocol::Tcp,
};

/// The TCP endpoint's kind.
pub(crate) const TCP: EndpointKind = EndpointKind::new(&ENDPOINT);

/// This transport's kind.
const KIND: TransportKind = TransportKind::of(&INFO);

/// The registry's description of this transport.
pub(crate) static INFO: TransportInfo = TransportInfo {
    name: "tls",
    about: "one TLS 1.3 over TCP connection per relay pair, every circuit in it (vanilla Tor)",
    ordering: Ordering::PerConnection,
    endpoint: TCP,
    settings: &[
        SettingInfo {
            key: "link.tcp.congestion",
            default: "the match of link.quic.congestion",
            about: "kernel congestion control of every TCP socket, or \"system\"",
        },
        SettingInfo {
            key: "link.tcp.pacing",
            default: "false",
            about: "Linux paces every channel TCP socket, as quinn paces QUIC",
        },
    ],
    open: |endpoints, addr, expected| {
        Box::pin(async move {
            let tcp: &TlsTransport = endpoints.get(TCP, INFO.name)?;
            tcp.connect(addr, expected).await
        })
    },
};

/// Incoming cells of a TLS link.
pub type TlsReader = StreamCellReader<ReadHalf<TlsStream<TcpStream>>>;
/// Outgoing cells of a TLS link.
pub type TlsWriter = StreamCellWriter<WriteHalf<TlsStream<TcpStream>>>;
/// An open TLS link.
pub type TlsLink = Link<TlsReader, TlsWriter>;

/// Default bound on TCP connect + TLS + link handshake.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TCP keep-alive on every TLS link: the first probe after this long
/// without traffic, then every [`KEEPALIVE_INTERVAL`], and the connection
/// fails after [`KEEPALIVE_PROBES`] unanswered probes. A peer whose host
/// vanished (no RST will ever come) is noticed within about 90 s of
/// silence, where Linux's defaults take over two hours. (C tor sends
/// padding cells on idle channels every `KeepalivePeriod`, 5 minutes.)
pub const KEEPALIVE_TIME: Duration = Duration::from_secs(60);
/// Interval between TCP keep-alive probes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered TCP keep-alive probes before the connection fails.
pub const KEEPALIVE_PROBES: u32 = 3;

/// Set `TCP_NOTSENT_LOWAT` on `tcp` if `limit` says so. Best effort, as
/// keep-alive: a kernel without it leaves the socket unlimited, logged.
fn set_unsent_limit(tcp: &TcpStream, limit: Option<u32>) {
    let Some(limit) = limit else {
        return;
    };
    if let Err(e) = socket2::SockRef::from(tcp).set_tcp_notsent_lowat(limit) {
        tracing::warn!("TCP_NOTSENT_LOWAT {limit} not set: {e}");
    }
}

/// Make Linux pace `tcp` if `on` ([`crate::tcp::enable_pacing`]). Best
/// effort, as the unsent limit: a refusal is logged.
fn set_pacing(tcp: &TcpStream, on: bool) {
    if !on {
        return;
    }
    if let Err(e) = crate::tcp::enable_pacing(tcp) {
        tracing::warn!("TCP pacing not turned on: {e}");
    }
}

/// Turn TCP keep-alive off on `tls`'s socket: for the connections of
/// links whose liveness is judged over all their connections together
/// ([`crate::liveness`]). Best effort, as turning it on.
pub(crate) fn keepalive_off(tls: &TlsStream<TcpStream>) {
    if let Err(e) = socket2::SockRef::from(tls.get_ref().0).set_keepalive(false) {
        tracing::debug!("TCP keep-alive left on: {e}");
    }
}

/// Turn TCP keep-alive on ([`KEEPALIVE_TIME`]). Best effort: a socket
/// that refuses it still works, without the check.
fn set_keepalive(tcp: &TcpStream) {
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_TIME)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    if let Err(e) = socket2::SockRef::from(tcp).set_tcp_keepalive(&keepalive) {
        tracing::debug!("TCP keep-alive not set: {e}");
    }
}

/// The TLS transport of one node (a relay, or an anonymous client).
#[derive(Clone)]
pub struct TlsTransport {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    provider: Arc<CryptoProvider>,
    /// Our identity, for relays.
    our_key: Option<Arc<CertifiedKey>>,
    server_config: Option<Arc<ServerConfig>>,
    my_addrs: Vec<IpAddr>,
    handshake_timeout: Duration,
    /// Congestion control of every TCP socket.
    tcp_congestion: TcpCongestion,
    /// Source address of the connections we open; `None`: the kernel's
    /// choice.
    bind: Option<IpAddr>,
    /// Where this node accepts lanes, the connections that join a link
    /// (a relay's listener).
    lane_address: Option<SocketAddr>,
    /// The links that accept more connections, by token
    /// ([`tcp_share`]).
    tokens: Arc<Tokens>,
    /// The lanes (a connection per circuit) open against their cap.
    lanes: Arc<NodeLanes>,
    /// The state of each mode sharing the endpoint ([`tcp_share`]).
    modes: Arc<ModeStates>,
    /// Heartbeat and silence limit of the links of several connections.
    liveness: LivenessTiming,
    /// Most unsent bytes each TCP socket holds (`TCP_NOTSENT_LOWAT`);
    /// `None`: the kernel's setting.
    unsent_limit: Option<u32>,
    /// Whether Linux paces each TCP socket (`SO_MAX_PACING_RATE`).
    pacing: bool,
}

impl Inner {
    /// What every channel TCP socket gets, opened or accepted: keep-alive,
    /// the unsent limit and pacing (best effort each).
    fn tune(&self, tcp: &TcpStream) {
        set_keepalive(tcp);
        set_unsent_limit(tcp, self.unsent_limit);
        set_pacing(tcp, self.pacing);
    }
}

pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsTransport {
    /// The transport of a relay: proves `keys`' Ed25519 identity on every
    /// connection it opens or accepts; `my_addrs` go into NETINFO.
    pub fn relay(keys: &RelaySecretKeys, my_addrs: Vec<IpAddr>) -> Result<Self, Error> {
        let provider = provider();
        let our_key = identity::certified_key(&provider, keys.ed25519_keypair())?;
        let mut server = server_config(&provider, &our_key)?;
        server.max_fragment_size = Some(MAX_RECORD);
        Ok(TlsTransport {
            inner: Arc::new(Inner {
                provider,
                our_key: Some(our_key),
                server_config: Some(Arc::new(server)),
                my_addrs,
                handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
                tcp_congestion: TcpCongestion::System,
                bind: None,
                lane_address: None,
                tokens: Arc::default(),
                lanes: NodeLanes::new(LaneSettings::default()),
                modes: Arc::default(),
                liveness: LivenessTiming::default(),
                unsent_limit: None,
                pacing: false,
            }),
        })
    }

    /// The transport of a client: authenticates relays, stays anonymous,
    /// and cannot accept connections.
    pub fn client() -> Self {
        TlsTransport {
            inner: Arc::new(Inner {
                provider: provider(),
                our_key: None,
                server_config: None,
                my_addrs: Vec::new(),
                handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
                tcp_congestion: TcpCongestion::System,
                bind: None,
                lane_address: None,
                tokens: Arc::default(),
                lanes: NodeLanes::new(LaneSettings::default()),
                modes: Arc::default(),
                liveness: LivenessTiming::default(),
                unsent_limit: None,
                pacing: false,
            }),
        }
    }

    /// Change the bound on a whole handshake.
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.inner).handshake_timeout = timeout;
        self
    }

    /// Use `congestion` on every TCP socket this transport opens or
    /// accepts (check it with [`TcpCongestion::check_available`] first:
    /// a socket that refuses it fails its connection).
    pub fn with_tcp_congestion(mut self, congestion: TcpCongestion) -> Self {
        Arc::make_mut(&mut self.inner).tcp_congestion = congestion;
        self
    }

    /// Open connections from source address `ip` (a host with several
    /// addresses; tests that play another host on loopback).
    pub fn with_bind_address(mut self, ip: IpAddr) -> Self {
        Arc::make_mut(&mut self.inner).bind = Some(ip);
        self
    }

    /// Use these lane settings (`[link.pctcp]`: the cap on lane
    /// connections; a fresh count: call before use).
    pub fn with_lanes(mut self, settings: LaneSettings) -> Self {
        Arc::make_mut(&mut self.inner).lanes = NodeLanes::new(settings);
        self
    }

    /// Accept lanes at `addr` (a relay's listener, as its peers can reach
    /// it); without it the node opens lanes but accepts none.
    pub fn with_lane_address(mut self, addr: SocketAddr) -> Self {
        Arc::make_mut(&mut self.inner).lane_address = Some(addr);
        self
    }

    /// Limit every TCP socket this transport opens or accepts to `limit`
    /// bytes written and not yet sent (`TCP_NOTSENT_LOWAT`; `None`: the
    /// kernel's `net.ipv4.tcp_notsent_lowat`, unlimited by default). A
    /// KIST-like write limit: the socket refuses more once that much waits
    /// unsent, so cells wait in the circuit queues, where the scheduler
    /// orders them, instead of in the kernel (C tor's KIST scheduler,
    /// default since 0.3.2, writes only what TCP can send soon).
    pub fn with_unsent_limit(mut self, limit: Option<u32>) -> Self {
        Arc::make_mut(&mut self.inner).unsent_limit = limit;
        self
    }

    /// Make Linux pace every TCP socket this transport opens or accepts
    /// (`tcp_pacing`; [`crate::tcp::enable_pacing`]), as quinn paces QUIC.
    /// Off by default: Linux paces Cubic and Reno only when asked.
    pub fn with_tcp_pacing(mut self, on: bool) -> Self {
        Arc::make_mut(&mut self.inner).pacing = on;
        self
    }

    /// Use these timers for the liveness of the links of several
    /// connections ([`crate::liveness`]; tests shorten them).
    pub fn with_liveness(mut self, timing: LivenessTiming) -> Self {
        Arc::make_mut(&mut self.inner).liveness = timing;
        self
    }

    pub(crate) fn liveness_timing(&self) -> LivenessTiming {
        self.inner.liveness
    }

    /// The node's state of a mode sharing the endpoint, of type `T`
    /// (made with its default the first time).
    pub(crate) fn mode_state<T: std::any::Any + Default + Send + Sync>(&self) -> Arc<T> {
        self.inner.modes.get::<T>()
    }

    pub(crate) fn tokens(&self) -> &Arc<Tokens> {
        &self.inner.tokens
    }

    /// Whether this is a relay's transport (it proves an identity).
    pub(crate) fn is_relay(&self) -> bool {
        self.inner.our_key.is_some()
    }

    /// Circuits that used a link's main connection because the lane cap
    /// was reached, so far.
    pub fn lane_fallbacks(&self) -> u64 {
        self.inner.lanes.fallbacks()
    }

    /// Lane connections open now.
    pub fn open_lanes(&self) -> usize {
        self.inner
            .lanes
            .open
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn lanes(&self) -> &Arc<NodeLanes> {
        &self.inner.lanes
    }

    pub(crate) fn lane_address(&self) -> Option<SocketAddr> {
        self.inner.lane_address
    }

    pub(crate) fn handshake_timeout(&self) -> Duration {
        self.inner.handshake_timeout
    }

    pub(crate) fn initiator_role(&self) -> Role {
        Role::Initiator {
            my_addrs: self.inner.my_addrs.clone(),
            relay: self.inner.our_key.is_some(),
        }
    }

    pub(crate) fn responder_role(&self) -> Role {
        Role::Responder {
            my_addrs: self.inner.my_addrs.clone(),
        }
    }

    async fn connect_inner(
        &self,
        addr: SocketAddr,
        expected: Ed25519Identity,
    ) -> Result<TlsLink, Error> {
        let mut tls = self.connect_tls(addr, expected).await?;
        let negotiated = link::handshake(&mut tls, self.initiator_role(), addr).await?;
        Ok(split(
            tls,
            negotiated,
            PeerInfo {
                identity: Some(expected),
                addr,
            },
        ))
    }

    /// A TCP connection to `addr` with TLS on it, whose peer proved
    /// `expected` (no link handshake yet).
    pub(crate) async fn connect_tls(
        &self,
        addr: SocketAddr,
        expected: Ed25519Identity,
    ) -> Result<TlsStream<TcpStream>, Error> {
        let tcp = connect_tcp(self.inner.bind, addr, &self.inner.tcp_congestion).await?;
        tcp.set_nodelay(true).map_err(|source| Error::Io {
            what: "TCP_NODELAY",
            source,
        })?;
        self.inner.tune(&tcp);
        let verifier = Arc::new(identity::ExpectIdentity::new(
            expected,
            &self.inner.provider,
        ));
        let mut config = client_config(
            &self.inner.provider,
            self.inner.our_key.as_ref(),
            verifier.clone(),
        )?;
        config.max_fragment_size = Some(MAX_RECORD);
        let connector = TlsConnector::from(Arc::new(config));
        let tls = match connector
            .connect(ServerName::IpAddress(addr.ip().into()), tcp)
            .await
        {
            Ok(tls) => tls,
            Err(source) => {
                return Err(match verifier.presented() {
                    Some(got) if got != expected => Error::WrongIdentity {
                        peer: addr,
                        got: hex::encode(got.as_bytes()),
                        expected: hex::encode(expected.as_bytes()),
                    },
                    _ => Error::Tls { peer: addr, source },
                })
            }
        };
        Ok(TlsStream::Client(tls))
    }
}

/// A TCP connection to `addr` (from source address `bind` if given) with
/// `congestion` set before the handshake.
pub(crate) async fn connect_tcp(
    bind: Option<IpAddr>,
    addr: SocketAddr,
    congestion: &TcpCongestion,
) -> Result<TcpStream, Error> {
    let io = |what| move |source| Error::Io { what, source };
    let socket = match addr.ip() {
        IpAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        IpAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }
    .map_err(io("creating a TCP socket"))?;
    congestion
        .apply(&socket)
        .map_err(io("setting TCP_CONGESTION"))?;
    if let Some(ip) = bind {
        socket
            .bind(SocketAddr::new(ip, 0))
            .map_err(io("binding the TCP source address"))?;
    }
    socket.connect(addr).await.map_err(io("TCP connect"))
}

/// The TLS 1.3 client configuration shared by the TLS and QUIC transports:
/// the server must prove `verifier`'s expected identity; we present
/// `our_key` (a relay) or nothing (a client); no resumption.
pub(crate) fn client_config(
    provider: &Arc<CryptoProvider>,
    our_key: Option<&Arc<CertifiedKey>>,
    verifier: Arc<identity::ExpectIdentity>,
) -> Result<ClientConfig, Error> {
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match our_key {
        Some(key) => builder.with_client_cert_resolver(Arc::new(
            rustls::client::AlwaysResolvesClientRawPublicKeys::new(key.clone()),
        )),
        None => builder.with_client_cert_resolver(Arc::new(identity::Anonymous)),
    };
    config.resumption = Resumption::disabled();
    Ok(config)
}

/// The TLS 1.3 server configuration shared by the TLS and QUIC transports:
/// we prove `our_key`; relays connecting to us may prove theirs, clients
/// stay anonymous; no resumption.
pub(crate) fn server_config(
    provider: &Arc<CryptoProvider>,
    our_key: &Arc<CertifiedKey>,
) -> Result<ServerConfig, Error> {
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::Config(e.to_string()))?
        .with_client_cert_verifier(Arc::new(identity::AnyRelayIdentity::new(provider)))
        .with_cert_resolver(Arc::new(AlwaysResolvesServerRawPublicKeys::new(
            our_key.clone(),
        )));
    // Every connection proves identities afresh: no resumption.
    server.send_tls13_tickets = 0;
    server.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    Ok(server)
}

fn split(tls: TlsStream<TcpStream>, negotiated: link::Negotiated, peer: PeerInfo) -> TlsLink {
    let (r, w) = tokio::io::split(tls);
    let addr = peer.addr;
    Link {
        link_version: negotiated.link_version,
        reader: StreamCellReader::new(r, negotiated.link_version, negotiated.leftover, addr),
        writer: StreamCellWriter::new(w, negotiated.link_version, addr),
        peer,
    }
}

/// A `tls` link (the type-erased form, as the listener also hands out
/// the links of the modes on the endpoint).
impl crate::Transport for TlsTransport {
    type Reader = AnyReader;
    type Writer = AnyWriter;
    type Listener = TlsListener;

    fn kind(&self) -> TransportKind {
        KIND
    }

    async fn connect(&self, addr: SocketAddr, expected: Ed25519Identity) -> Result<AnyLink, Error> {
        let link = tokio::time::timeout(
            self.inner.handshake_timeout,
            self.connect_inner(addr, expected),
        )
        .await
        .map_err(|_| Error::HandshakeTimeout { peer: addr })??;
        Ok(AnyLink::erase(KIND, link))
    }

    async fn bind(&self, addr: SocketAddr) -> Result<TlsListener, Error> {
        let config =
            self.inner.server_config.clone().ok_or_else(|| {
                Error::Config("a client transport cannot accept connections".into())
            })?;
        let listener = TcpListener::bind(addr).await.map_err(|source| Error::Io {
            what: "binding the TLS listener",
            source,
        })?;
        // Accepted sockets inherit it; each is set again on accept.
        self.inner
            .tcp_congestion
            .apply(&listener)
            .map_err(|source| Error::Io {
                what: "setting TCP_CONGESTION on the TLS listener",
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| Error::Io {
            what: "reading the listener's address",
            source,
        })?;
        Ok(TlsListener {
            listener,
            local_addr,
            acceptor: TlsAcceptor::from(config),
            transport: self.clone(),
        })
    }
}

/// A bound TLS listener.
pub struct TlsListener {
    listener: TcpListener,
    local_addr: SocketAddr,
    acceptor: TlsAcceptor,
    transport: TlsTransport,
}

impl crate::Listener for TlsListener {
    type Reader = AnyReader;
    type Writer = AnyWriter;
    type Incoming = TlsIncoming;

    fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    async fn accept(&mut self) -> Result<TlsIncoming, Error> {
        let (tcp, addr) = self.listener.accept().await.map_err(|source| Error::Io {
            what: "accepting a TCP connection",
            source,
        })?;
        // Best effort: a socket that refuses NODELAY still works.
        let _ = tcp.set_nodelay(true);
        self.transport.inner.tune(&tcp);
        // Inherited from the listener already; a refusal here would be a
        // kernel surprise, and a measurement must not run on another
        // algorithm unnoticed.
        let congestion = &self.transport.inner.tcp_congestion;
        if let Err(e) = congestion.apply(&tcp) {
            tracing::warn!(peer = %addr, "TCP_CONGESTION {congestion} not set: {e}");
        }
        Ok(TlsIncoming {
            tcp,
            addr,
            acceptor: self.acceptor.clone(),
            transport: self.transport.clone(),
        })
    }
}

/// An accepted TCP connection whose TLS and link handshakes are pending.
pub struct TlsIncoming {
    tcp: TcpStream,
    addr: SocketAddr,
    acceptor: TlsAcceptor,
    transport: TlsTransport,
}

/// An accepted TCP connection after TLS, its first 4 bytes read: what
/// the shared acceptor ([`crate::tcp_share`]) dispatches on.
pub(crate) struct Opened {
    /// The node's TCP endpoint.
    pub(crate) transport: TlsTransport,
    /// The connection.
    pub(crate) tls: TlsStream<TcpStream>,
    /// Its first 4 bytes after TLS.
    pub(crate) first: [u8; 4],
    /// What the peer proved (`None`: an anonymous client).
    pub(crate) identity: Option<Ed25519Identity>,
    /// The peer's address.
    pub(crate) addr: SocketAddr,
}

impl TlsIncoming {
    /// The peer's address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bound on the whole handshake.
    pub(crate) fn handshake_timeout(&self) -> Duration {
        self.transport.inner.handshake_timeout
    }

    /// Run the TLS handshake and read the first 4 bytes after it.
    pub(crate) async fn open(self) -> Result<Opened, Error> {
        let addr = self.addr;
        let tls = self
            .acceptor
            .accept(self.tcp)
            .await
            .map_err(|source| Error::Tls { peer: addr, source })?;
        let identity = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|certs| certs.first())
            .and_then(|cert| identity::identity_from_spki(cert));
        let mut tls = TlsStream::Server(tls);
        let mut first = [0u8; 4];
        tls.read_exact(&mut first)
            .await
            .map_err(|source| Error::Tls { peer: addr, source })?;
        Ok(Opened {
            transport: self.transport,
            tls,
            first,
            identity,
            addr,
        })
    }
}

/// Complete a plain `tls` link on an opened connection: its first bytes
/// are the peer's VERSIONS cell.
pub(crate) async fn plain_link(o: Opened) -> Result<AnyLink, Error> {
    let Opened {
        transport,
        mut tls,
        first,
        identity,
        addr,
    } = o;
    let negotiated = link::handshake_after(
        &mut tls,
        transport.responder_role(),
        addr,
        BytesMut::from(&first[..]),
    )
    .await?;
    let link = split(tls, negotiated, PeerInfo { identity, addr });
    Ok(AnyLink::erase(KIND, link))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unsent_limit_reaches_the_socket() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (client, _server) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let client = client.expect("connect");
        set_unsent_limit(&client, None);
        let kernel = socket2::SockRef::from(&client)
            .tcp_notsent_lowat()
            .expect("read");
        set_unsent_limit(&client, Some(16 * 1024));
        let r = socket2::SockRef::from(&client);
        assert_eq!(r.tcp_notsent_lowat().expect("read"), 16 * 1024);
        assert_ne!(kernel, 16 * 1024, "the kernel default differs");
    }

    #[tokio::test]
    async fn tls_sockets_get_tcp_keepalive() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (client, server) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (client, (server, _)) = (client.expect("connect"), server.expect("accept"));
        for s in [&client, &server] {
            let before = socket2::SockRef::from(s);
            assert!(!before.keepalive().expect("SO_KEEPALIVE"));
            set_keepalive(s);
            let r = socket2::SockRef::from(s);
            assert!(r.keepalive().expect("SO_KEEPALIVE"));
            assert_eq!(
                r.tcp_keepalive_time().expect("TCP_KEEPIDLE"),
                KEEPALIVE_TIME
            );
            assert_eq!(
                r.tcp_keepalive_interval().expect("TCP_KEEPINTVL"),
                KEEPALIVE_INTERVAL
            );
            assert_eq!(
                r.tcp_keepalive_retries().expect("TCP_KEEPCNT"),
                KEEPALIVE_PROBES
            );
        }
    }
}

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

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use onionlab_crypto::identity::RelaySecretKeys;
use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::ServerName;
use rustls::server::AlwaysResolvesServerRawPublicKeys;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, ServerConfig};
use tokio::io::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};
use tor_llcrypto::pk::ed25519::Ed25519Identity;

use crate::any::AnyLink;
use crate::link::{self, Role, StreamCellReader, StreamCellWriter};
use crate::registry::{Endpoint, SettingInfo, TransportInfo};
use crate::tcp::TcpCongestion;
use crate::{Error, Link, Ordering, PeerInfo, Transport, TransportKind};

/// The registry's description of this transport.
pub(crate) static INFO: TransportInfo = TransportInfo {
    name: "tls",
    about: "one TLS 1.3 over TCP connection per relay pair, every circuit in it (vanilla Tor)",
    ordering: Ordering::PerConnection,
    endpoint: Endpoint::Tcp,
    settings: &[SettingInfo {
        key: "tcp_congestion",
        default: "the match of quic_congestion",
        about: "kernel congestion control of every TCP socket, or \"system\"",
    }],
    open: |endpoints, addr, expected| {
        Box::pin(async move {
            let link = endpoints.tcp.connect(addr, expected).await?;
            Ok(AnyLink::erase(TransportKind::TLS, link))
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
        let server = server_config(&provider, &our_key)?;
        Ok(TlsTransport {
            inner: Arc::new(Inner {
                provider,
                our_key: Some(our_key),
                server_config: Some(Arc::new(server)),
                my_addrs,
                handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
                tcp_congestion: TcpCongestion::System,
                bind: None,
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

    async fn connect_inner(
        &self,
        addr: SocketAddr,
        expected: Ed25519Identity,
    ) -> Result<TlsLink, Error> {
        let tcp = connect_tcp(self.inner.bind, addr, &self.inner.tcp_congestion).await?;
        tcp.set_nodelay(true).map_err(|source| Error::Io {
            what: "TCP_NODELAY",
            source,
        })?;
        set_keepalive(&tcp);
        let verifier = Arc::new(identity::ExpectIdentity::new(
            expected,
            &self.inner.provider,
        ));
        let config = client_config(
            &self.inner.provider,
            self.inner.our_key.as_ref(),
            verifier.clone(),
        )?;
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
        let mut tls = TlsStream::Client(tls);
        let role = Role::Initiator {
            my_addrs: self.inner.my_addrs.clone(),
            relay: self.inner.our_key.is_some(),
        };
        let negotiated = link::handshake(&mut tls, role, addr).await?;
        Ok(split(
            tls,
            negotiated,
            PeerInfo {
                identity: Some(expected),
                addr,
            },
        ))
    }
}

/// A TCP connection to `addr` (from source address `bind` if given) with
/// `congestion` set before the handshake.
async fn connect_tcp(
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

impl crate::Transport for TlsTransport {
    type Reader = TlsReader;
    type Writer = TlsWriter;
    type Listener = TlsListener;

    fn kind(&self) -> TransportKind {
        TransportKind::TLS
    }

    async fn connect(&self, addr: SocketAddr, expected: Ed25519Identity) -> Result<TlsLink, Error> {
        tokio::time::timeout(
            self.inner.handshake_timeout,
            self.connect_inner(addr, expected),
        )
        .await
        .map_err(|_| Error::HandshakeTimeout { peer: addr })?
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
            my_addrs: self.inner.my_addrs.clone(),
            handshake_timeout: self.inner.handshake_timeout,
            tcp_congestion: self.inner.tcp_congestion.clone(),
        })
    }
}

/// A bound TLS listener.
pub struct TlsListener {
    listener: TcpListener,
    local_addr: SocketAddr,
    acceptor: TlsAcceptor,
    my_addrs: Vec<IpAddr>,
    handshake_timeout: Duration,
    tcp_congestion: TcpCongestion,
}

impl crate::Listener for TlsListener {
    type Reader = TlsReader;
    type Writer = TlsWriter;
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
        set_keepalive(&tcp);
        // Inherited from the listener already; a refusal here would be a
        // kernel surprise, and a measurement must not run on another
        // algorithm unnoticed.
        if let Err(e) = self.tcp_congestion.apply(&tcp) {
            tracing::warn!(peer = %addr, "TCP_CONGESTION {} not set: {e}", self.tcp_congestion);
        }
        Ok(TlsIncoming {
            tcp,
            addr,
            acceptor: self.acceptor.clone(),
            my_addrs: self.my_addrs.clone(),
            handshake_timeout: self.handshake_timeout,
        })
    }
}

/// An accepted TCP connection whose TLS and link handshakes are pending.
pub struct TlsIncoming {
    tcp: TcpStream,
    addr: SocketAddr,
    acceptor: TlsAcceptor,
    my_addrs: Vec<IpAddr>,
    handshake_timeout: Duration,
}

impl TlsIncoming {
    async fn handshake_inner(self) -> Result<TlsLink, Error> {
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
        let negotiated = link::handshake(
            &mut tls,
            Role::Responder {
                my_addrs: self.my_addrs,
            },
            addr,
        )
        .await?;
        Ok(split(tls, negotiated, PeerInfo { identity, addr }))
    }
}

impl crate::Incoming for TlsIncoming {
    type Reader = TlsReader;
    type Writer = TlsWriter;

    fn peer_addr(&self) -> SocketAddr {
        self.addr
    }

    async fn handshake(self) -> Result<TlsLink, Error> {
        let addr = self.addr;
        let timeout = self.handshake_timeout;
        tokio::time::timeout(timeout, self.handshake_inner())
            .await
            .map_err(|_| Error::HandshakeTimeout { peer: addr })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

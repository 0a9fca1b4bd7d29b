//! Links of any registered transport behind one type, a node's endpoints,
//! and the per-link choice of transport with fallback ([`Connector`]):
//! seed 000's deployability requirement, use QUIC only when both ends
//! support it and it connects.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tor_llcrypto::pk::ed25519::Ed25519Identity;
use tracing::info;

use crate::pctcp::Accepted;
use crate::quic::{QuicIncomingLink, QuicListener, QuicTransport};
use crate::registry::{Choice, Endpoint, TransportKind};
use crate::tls::{TlsIncoming, TlsListener, TlsTransport};
use crate::utcp::{UtcpIncoming, UtcpTransport};
use crate::{
    AnyChanCell, CellReader, CellWriter, CircId, Error, Incoming, Link, LinkEvent, Listener,
    Ordering,
};

/// How long an `auto` connection waits for QUIC before trying TLS.
pub const QUIC_FALLBACK_AFTER: Duration = Duration::from_secs(3);
/// How long a peer whose QUIC failed is reached over TLS only.
pub const QUIC_RETRY_AFTER: Duration = Duration::from_secs(600);

type LocalFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A peer's addresses per endpoint (from the network document).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerAddrs {
    /// TCP (TLS endpoint) address.
    pub tls: Option<SocketAddr>,
    /// QUIC (UDP) address.
    pub quic: Option<SocketAddr>,
    /// dtls-utcp (UDP) address.
    pub utcp: Option<SocketAddr>,
}

impl PeerAddrs {
    /// The addresses `lookup` gives for each endpoint's name in the
    /// network document ([`Endpoint::doc_name`]).
    pub fn from_document(lookup: impl Fn(&str) -> Option<SocketAddr>) -> Self {
        PeerAddrs {
            tls: lookup(Endpoint::Tcp.doc_name()),
            quic: lookup(Endpoint::Quic.doc_name()),
            utcp: lookup(Endpoint::Utcp.doc_name()),
        }
    }

    /// The address of `endpoint`, if the peer has one.
    pub fn get(&self, endpoint: Endpoint) -> Option<SocketAddr> {
        match endpoint {
            Endpoint::Tcp => self.tls,
            Endpoint::Quic => self.quic,
            Endpoint::Utcp => self.utcp,
        }
    }
}

/// [`CellReader`] as an object (its future boxed).
trait DynReader: Send {
    fn read_cells<'a>(
        &'a mut self,
        out: &'a mut Vec<AnyChanCell>,
    ) -> LocalFuture<'a, Result<(), Error>>;
    fn buffered_bytes(&self) -> usize;
    fn poll_event(&mut self) -> Option<LinkEvent>;
}

impl<R: CellReader> DynReader for R {
    fn read_cells<'a>(
        &'a mut self,
        out: &'a mut Vec<AnyChanCell>,
    ) -> LocalFuture<'a, Result<(), Error>> {
        Box::pin(CellReader::read_cells(self, out))
    }
    fn buffered_bytes(&self) -> usize {
        CellReader::buffered_bytes(self)
    }
    fn poll_event(&mut self) -> Option<LinkEvent> {
        CellReader::poll_event(self)
    }
}

/// [`CellWriter`] as an object (its futures boxed).
trait DynWriter: Send {
    fn queue(&mut self, cell: AnyChanCell) -> Result<(), Error>;
    fn has_room(&self) -> bool;
    fn has_pending(&self) -> bool;
    fn flush(&mut self) -> LocalFuture<'_, Result<(), Error>>;
    fn shutdown(&mut self) -> LocalFuture<'_, Result<(), Error>>;
    fn ordering(&self) -> Ordering;
    fn has_room_for(&self, circ_id: CircId) -> bool;
    fn writable(&mut self) -> LocalFuture<'_, ()>;
    fn buffered_bytes(&self) -> usize;
    fn set_lane_priority(&mut self, circ_id: CircId, priority: i32);
    fn move_circuit(&mut self, circ_id: CircId, heavy: bool, propagate: bool);
}

impl<W: CellWriter> DynWriter for W {
    fn queue(&mut self, cell: AnyChanCell) -> Result<(), Error> {
        CellWriter::queue(self, cell)
    }
    fn has_room(&self) -> bool {
        CellWriter::has_room(self)
    }
    fn has_pending(&self) -> bool {
        CellWriter::has_pending(self)
    }
    fn flush(&mut self) -> LocalFuture<'_, Result<(), Error>> {
        Box::pin(CellWriter::flush(self))
    }
    fn shutdown(&mut self) -> LocalFuture<'_, Result<(), Error>> {
        Box::pin(CellWriter::shutdown(self))
    }
    fn ordering(&self) -> Ordering {
        CellWriter::ordering(self)
    }
    fn has_room_for(&self, circ_id: CircId) -> bool {
        CellWriter::has_room_for(self, circ_id)
    }
    fn writable(&mut self) -> LocalFuture<'_, ()> {
        Box::pin(CellWriter::writable(self))
    }
    fn buffered_bytes(&self) -> usize {
        CellWriter::buffered_bytes(self)
    }
    fn set_lane_priority(&mut self, circ_id: CircId, priority: i32) {
        CellWriter::set_lane_priority(self, circ_id, priority)
    }
    fn move_circuit(&mut self, circ_id: CircId, heavy: bool, propagate: bool) {
        CellWriter::move_circuit(self, circ_id, heavy, propagate)
    }
}

/// Incoming cells of a link of any transport.
pub struct AnyReader(Box<dyn DynReader>);

/// Outgoing cells of a link of any transport.
pub struct AnyWriter {
    inner: Box<dyn DynWriter>,
    kind: TransportKind,
}

/// A link of any transport.
pub type AnyLink = Link<AnyReader, AnyWriter>;

impl AnyLink {
    /// A link of transport `kind` with concrete reader and writer types.
    pub fn erase<R, W>(kind: TransportKind, link: Link<R, W>) -> Self
    where
        R: CellReader + 'static,
        W: CellWriter + 'static,
    {
        Link {
            peer: link.peer,
            link_version: link.link_version,
            reader: AnyReader(Box::new(link.reader)),
            writer: AnyWriter {
                inner: Box::new(link.writer),
                kind,
            },
        }
    }
}

impl AnyWriter {
    /// Which transport carries this link.
    pub fn kind(&self) -> TransportKind {
        self.kind
    }
}

impl CellReader for AnyReader {
    async fn read_cells(&mut self, out: &mut Vec<AnyChanCell>) -> Result<(), Error> {
        self.0.read_cells(out).await
    }

    fn buffered_bytes(&self) -> usize {
        self.0.buffered_bytes()
    }

    fn poll_event(&mut self) -> Option<LinkEvent> {
        self.0.poll_event()
    }
}

impl CellWriter for AnyWriter {
    fn queue(&mut self, cell: AnyChanCell) -> Result<(), Error> {
        self.inner.queue(cell)
    }
    fn has_room(&self) -> bool {
        self.inner.has_room()
    }
    fn has_pending(&self) -> bool {
        self.inner.has_pending()
    }
    async fn flush(&mut self) -> Result<(), Error> {
        self.inner.flush().await
    }
    async fn shutdown(&mut self) -> Result<(), Error> {
        self.inner.shutdown().await
    }
    fn ordering(&self) -> Ordering {
        self.inner.ordering()
    }
    fn has_room_for(&self, circ_id: CircId) -> bool {
        self.inner.has_room_for(circ_id)
    }
    async fn writable(&mut self) {
        self.inner.writable().await
    }
    fn buffered_bytes(&self) -> usize {
        self.inner.buffered_bytes()
    }
    fn set_lane_priority(&mut self, circ_id: CircId, priority: i32) {
        self.inner.set_lane_priority(circ_id, priority)
    }
    fn move_circuit(&mut self, circ_id: CircId, heavy: bool, propagate: bool) {
        self.inner.move_circuit(circ_id, heavy, propagate)
    }
}

/// A node's endpoints: its TCP (TLS) transport always, its QUIC transport
/// if it has one. Every registered transport opens its links with these.
#[derive(Clone)]
pub struct Endpoints {
    /// The TCP endpoint (TLS and the transports built on TLS).
    pub tcp: TlsTransport,
    /// The QUIC endpoint (one UDP socket), if any.
    pub quic: Option<QuicTransport>,
    /// The dtls-utcp endpoint, if any.
    pub utcp: Option<Arc<UtcpTransport>>,
}

impl Endpoints {
    /// The dtls-utcp endpoint, or an error naming what needs it.
    pub fn utcp(&self, what: TransportKind) -> Result<&UtcpTransport, Error> {
        self.utcp.as_deref().ok_or_else(|| {
            Error::Config(format!(
                "transport {what} needs a dtls-utcp endpoint, and this node has none"
            ))
        })
    }

    /// The QUIC endpoint, or an error naming what needs it.
    pub fn quic(&self, what: TransportKind) -> Result<&QuicTransport, Error> {
        self.quic.as_ref().ok_or_else(|| {
            Error::Config(format!(
                "transport {what} needs a QUIC endpoint, and this node has none"
            ))
        })
    }

    /// Whether the node has `endpoint`.
    pub fn has(&self, endpoint: Endpoint) -> bool {
        match endpoint {
            Endpoint::Tcp => true,
            Endpoint::Quic => self.quic.is_some(),
            Endpoint::Utcp => self.utcp.is_some(),
        }
    }
}

/// Opens links with the transport [`Choice`] picks.
#[derive(Clone)]
pub struct Connector {
    endpoints: Endpoints,
    choice: Choice,
    /// Peers whose QUIC failed under `auto`, and when.
    quic_failed: Arc<Mutex<HashMap<SocketAddr, Instant>>>,
}

impl Connector {
    /// A connector opening links under `choice` with `endpoints`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if `choice` forces a transport whose endpoint the
    /// node lacks.
    pub fn new(endpoints: Endpoints, choice: Choice) -> Result<Self, Error> {
        if let Choice::Only(kind) = choice {
            if !endpoints.has(kind.endpoint()) {
                return Err(Error::Config(format!(
                    "transport {kind} needs a {} endpoint, and this node has none",
                    kind.endpoint().doc_name()
                )));
            }
        }
        Ok(Connector {
            endpoints,
            choice,
            quic_failed: Arc::default(),
        })
    }

    /// The rule in use.
    pub fn choice(&self) -> Choice {
        self.choice
    }

    /// Open a link to the peer with `expected` identity at `addrs`.
    pub async fn connect(
        &self,
        addrs: PeerAddrs,
        expected: Ed25519Identity,
    ) -> Result<AnyLink, Error> {
        let kind = match self.choice {
            Choice::Only(kind) => kind,
            Choice::Auto => return self.connect_auto(addrs, expected).await,
        };
        let addr = addrs.get(kind.endpoint()).ok_or_else(|| {
            Error::Config(format!(
                "transport {kind} is forced but the peer advertises no {} address",
                kind.endpoint().doc_name()
            ))
        })?;
        (kind.info().open)(&self.endpoints, addr, expected).await
    }

    async fn connect_auto(
        &self,
        addrs: PeerAddrs,
        expected: Ed25519Identity,
    ) -> Result<AnyLink, Error> {
        let tls_addr = addrs.tls;
        if let (Some(_), Some(addr)) = (&self.endpoints.quic, addrs.quic) {
            if !self.recently_failed(addr) {
                let open = (TransportKind::QUIC.info().open)(&self.endpoints, addr, expected);
                match tokio::time::timeout(QUIC_FALLBACK_AFTER, open).await {
                    Ok(Ok(link)) => return Ok(link),
                    // The peer proved the wrong key: TLS would not help.
                    Ok(Err(e @ Error::WrongIdentity { .. })) => return Err(e),
                    Ok(Err(e)) if tls_addr.is_none() => return Err(e),
                    Err(_) if tls_addr.is_none() => {
                        return Err(Error::HandshakeTimeout { peer: addr })
                    }
                    Ok(Err(e)) => {
                        info!(peer = %addr, "QUIC failed ({e}): falling back to TLS");
                        self.mark_failed(addr);
                    }
                    Err(_) => {
                        info!(
                            peer = %addr,
                            "QUIC did not connect in {QUIC_FALLBACK_AFTER:?}: falling back to TLS"
                        );
                        self.mark_failed(addr);
                    }
                }
            }
        }
        let addr =
            tls_addr.ok_or_else(|| Error::Config("the peer advertises no tls address".into()))?;
        (TransportKind::TLS.info().open)(&self.endpoints, addr, expected).await
    }

    fn recently_failed(&self, addr: SocketAddr) -> bool {
        let mut failed = self.quic_failed.lock().unwrap_or_else(|p| p.into_inner());
        failed.retain(|_, at| at.elapsed() < QUIC_RETRY_AFTER);
        failed.contains_key(&addr)
    }

    fn mark_failed(&self, addr: SocketAddr) {
        self.quic_failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr, Instant::now());
    }
}

/// A relay's listeners: TCP (TLS) always, QUIC and dtls-utcp if
/// configured.
pub struct AnyListener {
    tls: TlsListener,
    quic: Option<QuicListener>,
    utcp: Option<Arc<UtcpTransport>>,
}

/// An accepted connection of any transport, before its handshake.
pub enum AnyIncoming {
    /// A TCP connection.
    Tcp(TlsIncoming),
    /// A QUIC connection.
    Quic(QuicIncomingLink),
    /// A dtls-utcp session.
    Utcp(UtcpIncoming),
}

impl AnyListener {
    /// Listen with `tls`, and with `quic` if given.
    pub fn new(tls: TlsListener, quic: Option<QuicListener>) -> Self {
        AnyListener {
            tls,
            quic,
            utcp: None,
        }
    }

    /// Accept dtls-utcp sessions with `utcp` too.
    pub fn with_utcp(mut self, utcp: Arc<UtcpTransport>) -> Self {
        self.utcp = Some(utcp);
        self
    }

    /// The TCP listener's address.
    pub fn tls_addr(&self) -> SocketAddr {
        self.tls.local_addr()
    }

    /// The QUIC endpoint's address.
    pub fn quic_addr(&self) -> Option<SocketAddr> {
        self.quic.as_ref().map(|q| q.local_addr())
    }

    /// The next connection on either listener.
    pub async fn accept(&mut self) -> Result<AnyIncoming, Error> {
        let quic = async {
            match &mut self.quic {
                Some(q) => q.accept().await,
                None => std::future::pending().await,
            }
        };
        let utcp = async {
            match &self.utcp {
                Some(u) => u.accept_session().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            t = self.tls.accept() => Ok(AnyIncoming::Tcp(t?)),
            q = quic => Ok(AnyIncoming::Quic(q?)),
            u = utcp => Ok(AnyIncoming::Utcp(u?)),
        }
    }
}

impl AnyIncoming {
    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        match self {
            AnyIncoming::Tcp(i) => i.peer_addr(),
            AnyIncoming::Quic(i) => i.peer_addr(),
            AnyIncoming::Utcp(i) => i.peer_addr(),
        }
    }

    /// Run the handshake: the link, or `None` for a connection that
    /// joined a link it belongs to (a pctcp lane).
    pub async fn handshake(self) -> Result<Option<AnyLink>, Error> {
        match self {
            AnyIncoming::Tcp(i) => match i.accept_any().await? {
                Accepted::Link(link) => Ok(Some(link)),
                Accepted::Lane => Ok(None),
            },
            AnyIncoming::Quic(i) => {
                let kind = i.kind();
                Ok(Some(AnyLink::erase(kind, i.handshake().await?)))
            }
            AnyIncoming::Utcp(i) => Ok(Some(AnyLink::erase(
                TransportKind::DTLS_UTCP,
                i.handshake().await?,
            ))),
        }
    }
}

//! Links of any registered transport behind one type ([`AnyLink`]), and
//! the per-link choice of transport with fallback ([`Connector`]): seed
//! 000's deployability requirement, use QUIC only when both ends support
//! it and it connects.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tor_llcrypto::pk::ed25519::Ed25519Identity;
use tracing::info;

use crate::endpoint::{EndpointKind, Endpoints, PeerAddrs};
use crate::registry::{Choice, TransportKind};
use crate::{
    AnyChanCell, CellReader, CellWriter, CircId, CircuitMover, Error, Link, LinkEvent, Ordering,
};

/// How long an `auto` connection waits for QUIC before trying TLS.
pub const QUIC_FALLBACK_AFTER: Duration = Duration::from_secs(3);
/// How long a peer whose QUIC failed is reached over TLS only.
pub const QUIC_RETRY_AFTER: Duration = Duration::from_secs(600);

type LocalFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

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
    fn circuit_mover(&mut self) -> Option<&mut dyn CircuitMover>;
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
    fn circuit_mover(&mut self) -> Option<&mut dyn CircuitMover> {
        CellWriter::circuit_mover(self)
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
    fn circuit_mover(&mut self) -> Option<&mut dyn CircuitMover> {
        self.inner.circuit_mover()
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
                    kind.endpoint()
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
        addrs: &PeerAddrs,
        expected: Ed25519Identity,
    ) -> Result<AnyLink, Error> {
        let kind = match self.choice {
            Choice::Only(kind) => kind,
            Choice::Auto => return self.connect_auto(addrs, expected).await,
        };
        let addr = addrs.get(kind.endpoint()).ok_or_else(|| {
            Error::Config(format!(
                "transport {kind} is forced but the peer advertises no {} address",
                kind.endpoint()
            ))
        })?;
        (kind.info().open)(&self.endpoints, addr, expected).await
    }

    async fn connect_auto(
        &self,
        addrs: &PeerAddrs,
        expected: Ed25519Identity,
    ) -> Result<AnyLink, Error> {
        let tls_addr = addrs.get(EndpointKind::TCP);
        let quic_addr = addrs.get(EndpointKind::QUIC);
        if let (true, Some(addr)) = (self.endpoints.has(EndpointKind::QUIC), quic_addr) {
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

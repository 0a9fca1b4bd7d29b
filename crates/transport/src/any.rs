//! What any transport is, behind one type each: a link of any transport
//! ([`AnyLink`]); the description of a transport ([`TransportInfo`]) and
//! its handle ([`TransportKind`]); the kinds of endpoint transports share
//! ([`EndpointKind`]) and a node's running endpoints ([`Endpoints`]).
//! Each transport's module holds its own descriptions; the list of them
//! all, and the names of each, are the registry's ([`crate::registry`]).

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use tor_llcrypto::pk::ed25519::Ed25519Identity;

use crate::{
    AnyChanCell, CellReader, CellWriter, CircId, CircuitMover, Error, Link, LinkEvent, Ordering,
};

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

/// A future returned by [`TransportInfo::open`].
pub type OpenFuture<'a> = Pin<Box<dyn Future<Output = Result<AnyLink, Error>> + 'a>>;

/// One setting of a transport, for documentation and `--help`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettingInfo {
    /// The key in `relay.toml` and `client.toml`.
    pub key: &'static str,
    /// Its default, as written in the file.
    pub default: &'static str,
    /// What it does.
    pub about: &'static str,
}

/// The description of one transport (see the module docs).
pub struct TransportInfo {
    /// The name used everywhere (`"tls"`).
    pub name: &'static str,
    /// One line for `--help` and documentation.
    pub about: &'static str,
    /// How it orders cells.
    pub ordering: Ordering,
    /// The endpoint it uses.
    pub endpoint: EndpointKind,
    /// The settings that apply to it (beyond the link handshake timeout
    /// every transport has).
    pub settings: &'static [SettingInfo],
    /// Open a link to `addr` (the peer's address for
    /// [`endpoint`](Self::endpoint)) that must prove `expected`, with the
    /// node's endpoints.
    pub open: for<'a> fn(&'a Endpoints, SocketAddr, Ed25519Identity) -> OpenFuture<'a>,
}

/// A registered transport: a cheap handle on its [`TransportInfo`].
#[derive(Clone, Copy)]
pub struct TransportKind(&'static TransportInfo);

impl TransportKind {
    /// The kind of the transport `info` describes (its module's own
    /// handle; the registry lists them all).
    pub const fn of(info: &'static TransportInfo) -> Self {
        TransportKind(info)
    }

    /// Its description.
    pub fn info(self) -> &'static TransportInfo {
        self.0
    }

    /// Its name (`"tls"`).
    pub fn name(self) -> &'static str {
        self.0.name
    }

    /// How it orders cells.
    pub fn ordering(self) -> Ordering {
        self.0.ordering
    }

    /// The endpoint it uses.
    pub fn endpoint(self) -> EndpointKind {
        self.0.endpoint
    }
}

impl PartialEq for TransportKind {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for TransportKind {}

impl std::hash::Hash for TransportKind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name().hash(state);
    }
}

impl fmt::Debug for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The IP protocol of an endpoint's socket: endpoints of different
/// protocols may share a port number, two of one protocol may not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpProtocol {
    /// A TCP listener.
    Tcp,
    /// A UDP socket.
    Udp,
}

/// The description of one endpoint kind.
#[derive(Debug)]
pub struct EndpointInfo {
    /// The address's name in the network document (`"tls"`, `"quic"`):
    /// a relay advertises one address per endpoint it runs.
    pub doc_name: &'static str,
    /// One line for documentation.
    pub about: &'static str,
    /// Its socket's protocol.
    pub protocol: IpProtocol,
}

/// A kind of endpoint: a cheap handle on its [`EndpointInfo`], equal by
/// name.
#[derive(Clone, Copy)]
pub struct EndpointKind(&'static EndpointInfo);

impl EndpointKind {
    /// A kind of `info` (for a transport's registry entry).
    pub const fn new(info: &'static EndpointInfo) -> Self {
        EndpointKind(info)
    }

    /// The address's name in the network document.
    pub const fn doc_name(self) -> &'static str {
        self.0.doc_name
    }

    /// Its description.
    pub fn info(self) -> &'static EndpointInfo {
        self.0
    }

    /// Its socket's protocol.
    pub fn protocol(self) -> IpProtocol {
        self.0.protocol
    }
}

impl PartialEq for EndpointKind {
    fn eq(&self, other: &Self) -> bool {
        self.doc_name() == other.doc_name()
    }
}

impl Eq for EndpointKind {}

impl std::hash::Hash for EndpointKind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.doc_name().hash(state);
    }
}

impl fmt::Debug for EndpointKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.doc_name())
    }
}

impl fmt::Display for EndpointKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.doc_name())
    }
}

/// A node's running endpoints, by kind, that links are opened with. Each
/// transport's `open` fetches its own endpoint's type
/// ([`Endpoints::get`]); nothing here names one.
#[derive(Clone, Default)]
pub struct Endpoints(HashMap<EndpointKind, Arc<dyn Any + Send + Sync>>);

impl Endpoints {
    /// No endpoints.
    pub fn new() -> Self {
        Self::default()
    }

    /// These endpoints and `endpoint` as the node's `kind` (replacing any).
    #[must_use]
    pub fn with<T: Any + Send + Sync>(mut self, kind: EndpointKind, endpoint: T) -> Self {
        self.0.insert(kind, Arc::new(endpoint));
        self
    }

    /// Add `endpoint` as the node's `kind` (replacing any), as an
    /// [`EndpointSetup`](crate::setup::EndpointSetup) made it.
    pub fn insert(&mut self, kind: EndpointKind, endpoint: Arc<dyn Any + Send + Sync>) {
        self.0.insert(kind, endpoint);
    }

    /// Whether the node runs an endpoint of `kind`.
    pub fn has(&self, kind: EndpointKind) -> bool {
        self.0.contains_key(&kind)
    }

    /// The node's endpoint of `kind`, of type `T`, for transport `what`
    /// (its name).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming `what` if the node has no such endpoint
    /// (or one of another type, a registry mistake).
    pub fn get<T: Any>(&self, kind: EndpointKind, what: &str) -> Result<&T, Error> {
        self.0
            .get(&kind)
            .and_then(|e| e.downcast_ref::<T>())
            .ok_or_else(|| {
                Error::Config(format!(
                    "transport {what} needs a {kind} endpoint, and this node has none"
                ))
            })
    }
}

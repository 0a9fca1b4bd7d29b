//! A node's endpoints: the sockets its transports share (one TCP listener
//! for tls, pctcp and torchestra; one UDP socket for both QUIC modes; one
//! for dtls-utcp), as an open set.
//!
//! Each endpoint kind is described once, by an [`EndpointInfo`] in the
//! module of the transport that owns it; a transport's
//! [`TransportInfo`](crate::registry::TransportInfo) names the kind it
//! uses, and the kinds a node knows are those of the registered transports
//! ([`EndpointKind::all`]). What a node runs is held without naming any
//! transport's types: [`Endpoints`] (what links are opened with, each
//! transport fetching its own endpoint's type), [`PeerAddrs`] (a peer's
//! address per kind, from the network document) and [`Listeners`] (what a
//! relay accepts on, each endpoint's [`Acceptor`] implemented in its
//! transport's module).

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use crate::any::AnyLink;
use crate::{Error, TransportKind};

/// The description of one endpoint kind.
#[derive(Debug)]
pub struct EndpointInfo {
    /// The address's name in the network document (`"tls"`, `"quic"`):
    /// a relay advertises one address per endpoint it runs.
    pub doc_name: &'static str,
    /// One line for documentation.
    pub about: &'static str,
}

/// A kind of endpoint: a cheap handle on its [`EndpointInfo`], equal by
/// name.
#[derive(Clone, Copy)]
pub struct EndpointKind(&'static EndpointInfo);

impl EndpointKind {
    /// The TCP listener: TLS and the transports built on TLS (pctcp,
    /// torchestra); the document's `tls` address.
    pub const TCP: EndpointKind = EndpointKind(&crate::tls::ENDPOINT);
    /// The QUIC endpoint (one UDP socket, both QUIC modes); the
    /// document's `quic` address.
    pub const QUIC: EndpointKind = EndpointKind(&crate::quic::ENDPOINT);
    /// The dtls-utcp endpoint (UDP, a port of its own); the document's
    /// `utcp` address.
    pub const UTCP: EndpointKind = EndpointKind(&crate::utcp::ENDPOINT);

    /// A kind of `info` (for a transport's registry entry).
    pub const fn new(info: &'static EndpointInfo) -> Self {
        EndpointKind(info)
    }

    /// Every kind the registered transports use, in registry order.
    pub fn all() -> Vec<EndpointKind> {
        let mut kinds: Vec<EndpointKind> = Vec::new();
        for t in TransportKind::all() {
            if !kinds.contains(&t.endpoint()) {
                kinds.push(t.endpoint());
            }
        }
        kinds
    }

    /// The address's name in the network document.
    pub const fn doc_name(self) -> &'static str {
        self.0.doc_name
    }

    /// Its description.
    pub fn info(self) -> &'static EndpointInfo {
        self.0
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

/// A peer's address per endpoint kind (from the network document).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerAddrs(Vec<(EndpointKind, SocketAddr)>);

impl PeerAddrs {
    /// The addresses `lookup` gives for each kind's name in the network
    /// document ([`EndpointKind::doc_name`]).
    pub fn from_document(lookup: impl Fn(&str) -> Option<SocketAddr>) -> Self {
        PeerAddrs(
            EndpointKind::all()
                .into_iter()
                .filter_map(|kind| Some((kind, lookup(kind.doc_name())?)))
                .collect(),
        )
    }

    /// These addresses and `addr` for `kind` (replacing any).
    #[must_use]
    pub fn with(mut self, kind: EndpointKind, addr: SocketAddr) -> Self {
        self.0.retain(|(k, _)| *k != kind);
        self.0.push((kind, addr));
        self
    }

    /// The address of `kind`, if the peer has one.
    pub fn get(&self, kind: EndpointKind) -> Option<SocketAddr> {
        self.0.iter().find(|(k, _)| *k == kind).map(|(_, a)| *a)
    }

    /// Any address of the peer (the first kind in registry order), for
    /// logs and the decision whether it can be reached at all.
    pub fn any(&self) -> Option<SocketAddr> {
        EndpointKind::all().into_iter().find_map(|k| self.get(k))
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

    /// Whether the node runs an endpoint of `kind`.
    pub fn has(&self, kind: EndpointKind) -> bool {
        self.0.contains_key(&kind)
    }

    /// The node's endpoint of `kind`, of type `T`, for transport `what`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming `what` if the node has no such endpoint
    /// (or one of another type, a registry mistake).
    pub fn get<T: Any>(&self, kind: EndpointKind, what: TransportKind) -> Result<&T, Error> {
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

/// A future an [`Acceptor`] or a [`PendingLink`] returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The listening side of one endpoint, implemented by the transport that
/// owns it.
pub trait Acceptor: Send {
    /// The endpoint's kind.
    fn kind(&self) -> EndpointKind;

    /// The address actually bound.
    fn local_addr(&self) -> Option<SocketAddr>;

    /// Wait for the next connection. Its handshake runs separately
    /// ([`PendingLink::handshake`]) so a slow peer cannot stall the
    /// listener. Cancel-safe: a relay waits on every endpoint at once.
    fn accept(&mut self) -> BoxFuture<'_, Result<PendingLink, Error>>;
}

/// An accepted connection of any endpoint, before its handshake.
pub struct PendingLink {
    peer: SocketAddr,
    handshake: BoxFuture<'static, Result<Option<AnyLink>, Error>>,
}

impl PendingLink {
    /// A connection from `peer` whose `handshake` gives its link, or
    /// `None` for a connection that joined a link it belongs to (a lane).
    pub fn new(
        peer: SocketAddr,
        handshake: impl Future<Output = Result<Option<AnyLink>, Error>> + Send + 'static,
    ) -> Self {
        PendingLink {
            peer,
            handshake: Box::pin(handshake),
        }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Run the handshake (bounded in time by the transport): the link, or
    /// `None` for a connection that joined a link it belongs to.
    pub async fn handshake(self) -> Result<Option<AnyLink>, Error> {
        self.handshake.await
    }
}

/// A relay's listeners, one per endpoint it runs.
#[derive(Default)]
pub struct Listeners {
    acceptors: Vec<Box<dyn Acceptor>>,
    /// Which acceptor is asked first next time, so that a busy endpoint
    /// does not starve the others.
    next: usize,
}

impl Listeners {
    /// No listeners.
    pub fn new() -> Self {
        Self::default()
    }

    /// These listeners and `acceptor`.
    #[must_use]
    pub fn with(mut self, acceptor: impl Acceptor + 'static) -> Self {
        self.acceptors.push(Box::new(acceptor));
        self
    }

    /// The address of the listener of `kind`, if there is one.
    pub fn local_addr(&self, kind: EndpointKind) -> Option<SocketAddr> {
        self.acceptors
            .iter()
            .find(|a| a.kind() == kind)
            .and_then(|a| a.local_addr())
    }

    /// The next connection on any listener (never, with none).
    pub async fn accept(&mut self) -> Result<PendingLink, Error> {
        let n = self.acceptors.len();
        let first = self.next % n.max(1);
        self.next = self.next.wrapping_add(1);
        let mut waiting: Vec<_> = self.acceptors.iter_mut().map(|a| a.accept()).collect();
        waiting.rotate_left(first);
        std::future::poll_fn(|cx| {
            for accept in &mut waiting {
                if let Poll::Ready(r) = accept.as_mut().poll(cx) {
                    return Poll::Ready(r);
                }
            }
            Poll::Pending
        })
        .await
    }
}

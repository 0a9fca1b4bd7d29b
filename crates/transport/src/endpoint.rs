//! A node's endpoints: the sockets its transports share (one TCP listener
//! for tls, pctcp and torchestra; one UDP socket for both QUIC modes; one
//! for dtls-utcp), as an open set.
//!
//! Each endpoint kind is described once, by an [`EndpointInfo`] in the
//! module of the transport that owns it; a transport's
//! [`TransportInfo`](crate::any::TransportInfo) names the kind it uses,
//! and the kinds a node knows are those of the registered transports
//! ([`EndpointKind::all`]). What a node runs is held without naming any
//! transport's types: [`Endpoints`] (what links are opened with, each
//! transport fetching its own endpoint's type),
//! [`EndpointAddrs`] (a node's address per
//! kind: a peer's from the network document, a relay's own where it
//! listens) and [`Listeners`] (what a relay accepts on,
//! each endpoint's [`Acceptor`] implemented in its transport's module).

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::Poll;

use crate::addrs::EndpointAddrs;
use crate::any::AnyLink;
pub use crate::any::{EndpointInfo, EndpointKind, Endpoints};
use crate::Error;

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

    /// What the endpoint refused or did before any cryptography, by name
    /// (`quic_handshakes_refused`...), for a relay's statistics; none by
    /// default.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}

/// What a relay admits before any cryptography, for the endpoints that
/// gate their handshakes (QUIC's [`gate`](crate::quic::gate)): the
/// relay's denial-of-service limits on incoming connections.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    /// Most handshakes in progress at once.
    pub max_pending: usize,
    /// Handshakes per second one (non-relay) source address may start.
    pub per_address_rate: f64,
    /// Burst of handshakes from one source address.
    pub per_address_burst: f64,
    /// Handshakes per second, in total, above which peers that have not
    /// proved their address are asked to (QUIC's Retry).
    pub retry_rate: f64,
    /// Addresses exempt from the per-address rate (the network's relays,
    /// which with a connection per circuit open one per circuit).
    pub exempt: Vec<IpAddr>,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            max_pending: 256,
            per_address_rate: 20.0,
            per_address_burst: 40.0,
            retry_rate: 100.0,
            exempt: Vec::new(),
        }
    }
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

    /// Add `acceptor`.
    pub fn push(&mut self, acceptor: Box<dyn Acceptor>) {
        self.acceptors.push(acceptor);
    }

    /// The address of the listener of `kind`, if there is one.
    pub fn local_addr(&self, kind: EndpointKind) -> Option<SocketAddr> {
        self.acceptors
            .iter()
            .find(|a| a.kind() == kind)
            .and_then(|a| a.local_addr())
    }

    /// Where every listener is bound (the actual ports, where a
    /// configuration said 0).
    pub fn local_addrs(&self) -> EndpointAddrs {
        let mut addrs = EndpointAddrs::new();
        for a in &self.acceptors {
            if let Some(addr) = a.local_addr() {
                addrs.insert(a.kind(), addr);
            }
        }
        addrs
    }

    /// Every listener's [`Acceptor::counters`].
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        self.acceptors.iter().flat_map(|a| a.counters()).collect()
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

//! What an endpoint kind's setup is ([`EndpointSetup`]: how it is made
//! from a node's [`LinkSettings`]); each lives in the module of the
//! transport that owns the endpoint (`tls/setup.rs`, `quic/setup.rs`,
//! `utcp/setup.rs`), and [`crate::node_endpoints`] lists them.

use std::any::Any;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use onionlab_crypto::identity::RelaySecretKeys;

use crate::endpoint::{Acceptor, Admission, BoxFuture, EndpointKind};
use crate::{Error, LinkSettings};

/// A running endpoint, of the type its transports fetch from
/// [`Endpoints`](crate::endpoint::Endpoints).
pub type SharedEndpoint = Arc<dyn Any + Send + Sync>;

/// What a relay's endpoints are made with, beyond their address.
pub struct RelaySetup<'a> {
    /// The relay's identity and onion keys.
    pub keys: &'a RelaySecretKeys,
    /// The relay's own addresses (peers must not be them).
    pub my_addrs: &'a [IpAddr],
    /// The relay's `[link]` settings.
    pub link: &'a LinkSettings,
    /// What it admits before any cryptography.
    pub admission: &'a Admission,
}

/// How one endpoint kind is made (see the module docs).
pub struct EndpointSetup {
    /// The kind it makes.
    pub kind: EndpointKind,
    /// A client's endpoint, which only opens links.
    pub client: fn(&LinkSettings) -> Result<SharedEndpoint, Error>,
    /// A relay's endpoint and its listener, bound at the address.
    #[allow(clippy::type_complexity)]
    pub relay: for<'a> fn(
        &'a RelaySetup<'a>,
        SocketAddr,
    )
        -> BoxFuture<'a, Result<(SharedEndpoint, Box<dyn Acceptor>), BindError>>,
    /// What its links put on the wire under these settings that an
    /// experiment should record to compare transports fairly (first
    /// packet size, initial window, user-space TCP parameters), as names
    /// and values; empty when the kernel decides it all.
    pub wire: fn(&LinkSettings) -> Vec<(&'static str, String)>,
}

/// Why a relay's endpoints could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// An endpoint could not be set up or bound at its address.
    #[error("listening on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: Error,
    },
    /// The relay's identity could not make a TLS configuration, or its
    /// transport choice needs an endpoint it does not listen on (QUIC
    /// without a QUIC address), named in the error.
    #[error("setting up the transport: {0}")]
    Setup(#[source] Error),
}

impl BindError {
    /// A [`BindError::Listen`] at `addr`, for `map_err`.
    pub fn at(addr: SocketAddr) -> impl FnOnce(Error) -> BindError {
        move |source| BindError::Listen { addr, source }
    }
}

//! The per-link choice of transport with fallback ([`Connector`]): seed
//! 000's deployability requirement, use QUIC only when both ends support
//! it and it connects.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tor_llcrypto::pk::ed25519::Ed25519Identity;
use tracing::info;

use crate::addrs::EndpointAddrs;
use crate::any::AnyLink;
use crate::endpoint::{EndpointKind, Endpoints};
use crate::registry::{Choice, TransportKind};
use crate::Error;

/// How long an `auto` connection waits for QUIC before trying TLS.
pub const QUIC_FALLBACK_AFTER: Duration = Duration::from_secs(3);
/// How long a peer whose QUIC failed is reached over TLS only.
pub const QUIC_RETRY_AFTER: Duration = Duration::from_secs(600);

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

    /// The node's endpoints (a relay's datagram socket runs its datagram
    /// circuits).
    pub fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    /// The rule in use.
    pub fn choice(&self) -> Choice {
        self.choice
    }

    /// Open a link to the peer with `expected` identity at `addrs`.
    pub async fn connect(
        &self,
        addrs: &EndpointAddrs,
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
        addrs: &EndpointAddrs,
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

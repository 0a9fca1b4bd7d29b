//! A relay's endpoints, made from its [`LinkSettings`] and bound: the TCP
//! listener always (TLS and the transports that share it), the QUIC and
//! dtls-utcp endpoints where the relay's configuration gives them an
//! address. The relay node takes the [`Connector`] to open links and the
//! [`Listeners`] to accept them, and knows no transport by name.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use onionlab_crypto::identity::RelaySecretKeys;

use crate::connector::Connector;
use crate::endpoint::{EndpointKind, Endpoints, Listeners};
use crate::quic::gate::HandshakeLimits;
use crate::quic::QuicTransport;
use crate::tls::TlsTransport;
use crate::utcp::{UtcpSettings, UtcpTransport};
use crate::{Error, LinkSettings, Transport};

/// Where a relay listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayAddrs {
    /// The TCP listener (TLS, and the transports on TLS; peers open pctcp
    /// lanes to this address too).
    pub tcp: SocketAddr,
    /// The QUIC endpoint (UDP); `None`: no QUIC listener.
    pub quic: Option<SocketAddr>,
    /// The dtls-utcp endpoint (UDP); `None`: no dtls-utcp listener.
    pub utcp: Option<SocketAddr>,
}

/// What a relay accepts before any cryptography, beyond its
/// [`LinkSettings`].
#[derive(Debug, Clone, Default)]
pub struct Admission {
    /// The QUIC handshake gate's limits.
    pub quic: HandshakeLimits,
    /// Addresses exempt from the gate's per-address rate (the network's
    /// relays, which in conn-per-circuit mode open a connection per
    /// circuit).
    pub exempt: Vec<IpAddr>,
}

/// A relay's endpoints, bound.
pub struct RelayEndpoints {
    /// Opens links under the relay's transport choice.
    pub connector: Connector,
    /// Accepts links on every endpoint that listens.
    pub listeners: Listeners,
    /// The QUIC endpoint, for its handshake gate's counters.
    pub quic: Option<QuicTransport>,
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
    /// transport choice needs an endpoint it does not have (QUIC without
    /// a QUIC address), named in the error.
    #[error("setting up the transport: {0}")]
    Setup(#[source] Error),
}

impl RelayEndpoints {
    /// Set up and bind a relay's endpoints with `keys`, `link`'s settings
    /// and `admission`. `my_addrs` are the relay's own addresses (peers
    /// must not be them).
    ///
    /// # Errors
    ///
    /// [`BindError::Listen`] naming the address of the endpoint that
    /// failed; [`BindError::Setup`] for a transport forced on a relay
    /// without its endpoint (QUIC without a QUIC address), with the
    /// transport's name.
    pub async fn bind(
        keys: &RelaySecretKeys,
        my_addrs: Vec<IpAddr>,
        link: &LinkSettings,
        addrs: RelayAddrs,
        admission: Admission,
    ) -> Result<Self, BindError> {
        let at = |addr: SocketAddr| move |source| BindError::Listen { addr, source };
        let tls = TlsTransport::relay(keys, my_addrs.clone())
            .map_err(BindError::Setup)?
            .with_handshake_timeout(link.handshake_timeout)
            .with_tcp_congestion(link.tcp_congestion())
            .with_unsent_limit(link.tcp.unsent_limit)
            .with_tcp_pacing(link.tcp.pacing)
            .with_pctcp(link.pctcp)
            .with_lane_address(addrs.tcp);
        let tls_listener = tls.bind(addrs.tcp).await.map_err(at(addrs.tcp))?;
        let mut endpoints = Endpoints::new().with(EndpointKind::TCP, tls);
        let mut listeners = Listeners::new().with(tls_listener);
        let mut quic = None;
        if let Some(addr) = addrs.quic {
            let settings = crate::quic::QuicSettings {
                handshakes: admission.quic,
                ..link.quic_settings()
            };
            let t =
                QuicTransport::relay(keys, my_addrs.clone(), addr, settings).map_err(at(addr))?;
            t.set_exempt_addresses(admission.exempt);
            listeners = listeners.with(t.bind(addr).await.map_err(at(addr))?);
            endpoints = endpoints.with(EndpointKind::QUIC, t.clone());
            quic = Some(t);
        }
        if let Some(addr) = addrs.utcp {
            let settings = UtcpSettings {
                handshake_timeout: link.handshake_timeout,
                max_lanes: link.pctcp.max_lanes,
                ..UtcpSettings::default()
            }
            .with_lane_tcp(link.utcp.clone());
            let t = Arc::new(
                UtcpTransport::relay(keys, my_addrs, addr, settings)
                    .await
                    .map_err(at(addr))?,
            );
            endpoints = endpoints.with(EndpointKind::UTCP, t.clone());
            listeners = listeners.with(t);
        }
        let connector = Connector::new(endpoints, link.transport).map_err(BindError::Setup)?;
        Ok(RelayEndpoints {
            connector,
            listeners,
            quic,
        })
    }
}

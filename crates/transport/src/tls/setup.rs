//! How the TCP endpoint (TLS, and the transports that share its port) is
//! made from a node's [`LinkSettings`](crate::LinkSettings).

use std::net::SocketAddr;
use std::sync::Arc;

use crate::endpoint::Acceptor;
use crate::setup::{BindError, EndpointSetup, RelaySetup, SharedEndpoint};
use crate::tls::{TlsTransport, TCP};
use crate::{Error, LinkSettings, Transport};

/// The TCP endpoint's setup.
pub(crate) static SETUP: EndpointSetup = EndpointSetup {
    kind: TCP,
    client,
    relay: |setup, addr| Box::pin(relay(setup, addr)),
    // The kernel's TCP decides what goes on the wire.
    wire: |_| Vec::new(),
};

/// The settings a client's and a relay's TCP endpoint share.
fn configured(tls: TlsTransport, link: &LinkSettings) -> TlsTransport {
    tls.with_handshake_timeout(link.handshake_timeout)
        .with_tcp_congestion(link.tcp_congestion())
        .with_unsent_limit(link.tcp.unsent_limit)
        .with_tcp_pacing(link.tcp.pacing)
        .with_lanes(link.pctcp)
}

fn client(link: &LinkSettings) -> Result<SharedEndpoint, Error> {
    Ok(Arc::new(configured(TlsTransport::client(), link)))
}

async fn relay(
    setup: &RelaySetup<'_>,
    addr: SocketAddr,
) -> Result<(SharedEndpoint, Box<dyn Acceptor>), BindError> {
    let tls = TlsTransport::relay(setup.keys, setup.my_addrs.to_vec()).map_err(BindError::Setup)?;
    // Peers open lanes to the address they know us by.
    let tls = configured(tls, setup.link).with_lane_address(addr);
    let listener = tls.bind(addr).await.map_err(BindError::at(addr))?;
    Ok((Arc::new(tls), Box::new(listener)))
}

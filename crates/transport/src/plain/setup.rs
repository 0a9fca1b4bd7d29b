//! How the plain test endpoint is made from a node's
//! [`LinkSettings`](crate::LinkSettings).

use std::net::SocketAddr;
use std::sync::Arc;

use tor_llcrypto::pk::ed25519::Keypair;

use crate::endpoint::Acceptor;
use crate::plain::{PlainEndpoint, PlainListener, PLAIN};
use crate::setup::{BindError, EndpointSetup, RelaySetup, SharedEndpoint};
use crate::{Error, LinkSettings};

/// The plain endpoint's setup.
pub(crate) static SETUP: EndpointSetup = EndpointSetup {
    kind: PLAIN,
    client,
    relay: |setup, addr| Box::pin(relay(setup, addr)),
    wire: |_| Vec::new(),
};

fn client(link: &LinkSettings) -> Result<SharedEndpoint, Error> {
    Ok(Arc::new(Arc::new(PlainEndpoint {
        identity: None,
        my_addrs: Vec::new(),
        handshake_timeout: link.handshake_timeout,
        congestion: link.tcp_congestion(),
    })))
}

async fn relay(
    setup: &RelaySetup<'_>,
    addr: SocketAddr,
) -> Result<(SharedEndpoint, Box<dyn Acceptor>), BindError> {
    let secret = setup.keys.ed25519_keypair().as_bytes();
    let endpoint = Arc::new(PlainEndpoint {
        identity: Some(Arc::new(Keypair::from_bytes(secret))),
        my_addrs: setup.my_addrs.to_vec(),
        handshake_timeout: setup.link.handshake_timeout,
        congestion: setup.link.tcp_congestion(),
    });
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    };
    let listener = socket
        .and_then(|s| {
            s.set_reuseaddr(true)?;
            endpoint.congestion.apply(&s)?;
            s.bind(addr)?;
            s.listen(1024)
        })
        .map_err(|source| Error::Io {
            what: "binding the plain TCP listener",
            source,
        })
        .map_err(BindError::at(addr))?;
    let local_addr = listener.local_addr().unwrap_or(addr);
    let acceptor = PlainListener {
        listener,
        local_addr,
        endpoint: endpoint.clone(),
    };
    Ok((Arc::new(endpoint), Box::new(acceptor)))
}

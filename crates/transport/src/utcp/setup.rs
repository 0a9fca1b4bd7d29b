//! How the dtls-utcp endpoint (UDP, a port of its own) is made from a
//! node's [`LinkSettings`](crate::LinkSettings).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::endpoint::Acceptor;
use crate::setup::{BindError, EndpointSetup, RelaySetup, SharedEndpoint};
use crate::utcp::{UtcpSettings, UtcpTransport, UTCP};
use crate::{Error, LinkSettings};

/// The dtls-utcp endpoint's setup.
pub(crate) static SETUP: EndpointSetup = EndpointSetup {
    kind: UTCP,
    client,
    relay: |setup, addr| Box::pin(relay(setup, addr)),
    wire,
};

/// The lanes' user-space TCP: the `[link.utcp]` settings and what smoltcp
/// fixes (docs/dtls-utcp.md, section 4). (Their congestion control
/// imitates each node's TCP one, recorded with each run.)
fn wire(link: &LinkSettings) -> Vec<(&'static str, String)> {
    let lanes = &link.utcp;
    vec![
        ("max_segment", lanes.max_segment.to_string()),
        ("rx_buffer", lanes.rx_buffer.to_string()),
        ("tx_buffer", lanes.tx_buffer.to_string()),
        (
            "ack_delay_ms",
            lanes.ack_delay.map_or(0, |d| d.as_millis()).to_string(),
        ),
        ("initial_window_bytes", "2048".into()),
        // Asked of the kernel, which caps it at net.core.rmem_max / wmem_max.
        ("udp_socket_buffer", crate::UDP_SOCKET_BUFFER.to_string()),
        ("min_rto_ms", "1000".into()),
        (
            "sack",
            "receiver sends one block; sender ignores SACK (no SACK recovery)".into(),
        ),
    ]
}

fn settings(link: &LinkSettings) -> UtcpSettings {
    UtcpSettings {
        handshake_timeout: link.handshake_timeout,
        max_lanes: link.pctcp.max_lanes,
        ..UtcpSettings::default()
    }
    .with_lane_tcp(link.utcp.clone())
}

fn client(link: &LinkSettings) -> Result<SharedEndpoint, Error> {
    // Any local address: the kernel picks the source per relay.
    let any = IpAddr::from([0, 0, 0, 0]);
    Ok(Arc::new(Arc::new(UtcpTransport::client(
        any,
        settings(link),
    )?)))
}

async fn relay(
    setup: &RelaySetup<'_>,
    addr: SocketAddr,
) -> Result<(SharedEndpoint, Box<dyn Acceptor>), BindError> {
    let utcp = UtcpTransport::relay(
        setup.keys,
        setup.my_addrs.to_vec(),
        addr,
        settings(setup.link),
    )
    .await
    .map_err(BindError::at(addr))?;
    let utcp = Arc::new(utcp);
    Ok((Arc::new(utcp.clone()), Box::new(utcp)))
}

//! How the datagram endpoint (UDP, a port of its own) is made from a
//! node's [`LinkSettings`](crate::LinkSettings). A relay's datagram
//! socket accepts sessions but no channel links: its datagram circuits
//! are run by the relay itself on the socket (`onionlab_node`).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::datagram::{endpoint_config, CellLinkConfig, DatagramSocket, DGRAM};
use crate::endpoint::{Acceptor, BoxFuture, EndpointKind, PendingLink};
use crate::setup::{BindError, EndpointSetup, RelaySetup, SharedEndpoint};
use crate::{Error, LinkSettings};

/// The datagram endpoint's setup.
pub(crate) static SETUP: EndpointSetup = EndpointSetup {
    kind: DGRAM,
    client,
    relay: |setup, addr| Box::pin(relay(setup, addr)),
    wire,
};

/// The end-to-end TCP's parameters (the lanes' `[link.utcp]`, with
/// segments that fit a cell) and the link's fixed ones.
fn wire(link: &LinkSettings) -> Vec<(&'static str, String)> {
    let tcp = onionlab_dgram::e2e::segment_settings(&link.utcp, onionlab_dgram::wire::MSG_DATA_LEN);
    let cells = CellLinkConfig::default();
    vec![
        ("e2e_max_segment", tcp.max_segment.to_string()),
        ("e2e_rx_buffer", tcp.rx_buffer.to_string()),
        ("e2e_tx_buffer", tcp.tx_buffer.to_string()),
        (
            "e2e_ack_delay_ms",
            tcp.ack_delay.map_or(0, |d| d.as_millis()).to_string(),
        ),
        ("e2e_min_rto_ms", "1000".into()),
        (
            "more_e2e_max_segment",
            onionlab_dgram::more::wire::SEGMENT_LEN.to_string(),
        ),
        (
            "more_packet_bytes",
            onionlab_dgram::more::sphinx::PACKET_LEN.to_string(),
        ),
        (
            "e2e_keep_alive_s",
            tcp.keep_alive.map_or(0, |d| d.as_secs()).to_string(),
        ),
        ("link_send_queue_cells", cells.send_queue.to_string()),
        // Asked of the kernel, which caps it at net.core.rmem_max / wmem_max.
        ("udp_socket_buffer", crate::UDP_SOCKET_BUFFER.to_string()),
        ("link_peer_rate_cells_per_s", cells.peer_rate.to_string()),
        ("link_heartbeat_ms", cells.heartbeat.as_millis().to_string()),
        (
            "link_dead_after_ms",
            cells.dead_after.as_millis().to_string(),
        ),
    ]
}

fn client(link: &LinkSettings) -> Result<SharedEndpoint, Error> {
    // Any local address: the kernel picks the source per relay.
    let any = SocketAddr::new(IpAddr::from([0, 0, 0, 0]), 0);
    let config = endpoint_config(
        None,
        false,
        CellLinkConfig::default(),
        link.handshake_timeout,
    );
    Ok(Arc::new(Arc::new(DatagramSocket::bind(any, config)?)))
}

async fn relay(
    setup: &RelaySetup<'_>,
    addr: SocketAddr,
) -> Result<(SharedEndpoint, Box<dyn Acceptor>), BindError> {
    let secret = setup.keys.ed25519_keypair().as_bytes();
    let identity = Arc::new(tor_llcrypto::pk::ed25519::Keypair::from_bytes(secret));
    let config = endpoint_config(
        Some(identity),
        true,
        CellLinkConfig::default(),
        setup.link.handshake_timeout,
    );
    let socket = Arc::new(DatagramSocket::bind(addr, config).map_err(BindError::at(addr))?);
    let local = socket.local_addr();
    Ok((Arc::new(socket), Box::new(NoChannels(local))))
}

/// The datagram endpoint's listener: it accepts sessions, never channel
/// links (see the module docs), so it never yields one.
struct NoChannels(SocketAddr);

impl Acceptor for NoChannels {
    fn kind(&self) -> EndpointKind {
        DGRAM
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        Some(self.0)
    }

    fn accept(&mut self) -> BoxFuture<'_, Result<PendingLink, Error>> {
        Box::pin(std::future::pending())
    }
}

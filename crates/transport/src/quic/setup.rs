//! How the QUIC endpoint (one UDP socket, both QUIC modes) is made from a
//! node's [`LinkSettings`](crate::LinkSettings).

use std::net::SocketAddr;
use std::sync::Arc;

use crate::endpoint::{Acceptor, Admission};
use crate::quic::gate::HandshakeLimits;
use crate::quic::{QuicTransport, QUIC};
use crate::setup::{BindError, EndpointSetup, RelaySetup, SharedEndpoint};
use crate::{Error, LinkSettings, Transport};

/// The QUIC endpoint's setup.
pub(crate) static SETUP: EndpointSetup = EndpointSetup {
    kind: QUIC,
    client,
    relay: |setup, addr| Box::pin(relay(setup, addr)),
    wire,
};

/// QUIC's first packets and its initial congestion window (ten of them).
/// (Its congestion control is the variant's, recorded with each run.)
fn wire(link: &LinkSettings) -> Vec<(&'static str, String)> {
    let mtu = link.quic.initial_mtu;
    vec![
        ("initial_mtu", mtu.to_string()),
        ("initial_window_bytes", (10 * u64::from(mtu)).to_string()),
        // Asked of the kernel, which caps it at net.core.rmem_max / wmem_max.
        ("udp_socket_buffer", crate::UDP_SOCKET_BUFFER.to_string()),
    ]
}

fn client(link: &LinkSettings) -> Result<SharedEndpoint, Error> {
    Ok(Arc::new(QuicTransport::client(link.quic_settings())))
}

/// The handshake gate's limits: the relay's admission rules.
fn limits(admission: &Admission) -> HandshakeLimits {
    HandshakeLimits {
        max_pending: admission.max_pending,
        per_address_rate: admission.per_address_rate,
        per_address_burst: admission.per_address_burst,
        retry_rate: admission.retry_rate,
    }
}

async fn relay(
    setup: &RelaySetup<'_>,
    addr: SocketAddr,
) -> Result<(SharedEndpoint, Box<dyn Acceptor>), BindError> {
    let settings = crate::quic::QuicSettings {
        handshakes: limits(setup.admission),
        ..setup.link.quic_settings()
    };
    let quic = QuicTransport::relay(setup.keys, setup.my_addrs.to_vec(), addr, settings)
        .map_err(BindError::at(addr))?;
    quic.set_exempt_addresses(setup.admission.exempt.iter().copied());
    let listener = quic.bind(addr).await.map_err(BindError::at(addr))?;
    Ok((Arc::new(quic), Box::new(listener)))
}

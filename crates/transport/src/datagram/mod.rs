//! The datagram link of seed 004's mUDP-OR (`docs/datagram.md` section
//! 2): one UDP socket per node, a DTLS 1.3 session per peer
//! (`onionlab_dtls`, as dtls-utcp's: the relay identities bound inside,
//! clients anonymous, a stateless cookie in front), each record one cell
//! (`onionlab_dgram::CellLink`), nothing resent, nothing ordered.
//!
//! Its links carry datagram circuits (`onionlab_dgram`'s `DgramRelay`
//! and `Proxy`) and nothing else: tor1 circuits need every cell in
//! order, so it opens no [`crate::Link`] of channel cells (its `open`
//! says so). [`DatagramSocket`] is the thin async driver of the sans-IO
//! endpoint; a relay that listens on a `dgram` address runs datagram
//! circuits on it (`onionlab_node`), and a client whose transport is
//! `datagram` runs its streams over datagram sets (`onionlab_client`).

pub mod pump;
pub(crate) mod setup;
mod socket;
pub mod tunnel;

pub use onionlab_dgram::{CellLinkConfig, CellLinkStats};
pub use socket::{DatagramSocket, LinkEvent, EVENT_QUEUE};

use std::sync::Arc;
use std::time::Duration;

use onionlab_dgram::CellLink;
use onionlab_dtls::endpoint::{
    DEFAULT_MAX_HANDSHAKES, DEFAULT_MAX_HANDSHAKES_PER_IP, DEFAULT_MAX_SESSIONS,
};
use onionlab_dtls::{EndpointConfig, SessionConfig};
use tor_llcrypto::pk::ed25519::Keypair;

use crate::any::{IpProtocol, OpenFuture, SettingInfo, TransportInfo};
use crate::endpoint::{EndpointInfo, EndpointKind};
use crate::{Error, Ordering};

/// Largest UDP payload a datagram link sends: two cells' records fit.
pub const DATAGRAM: usize = 1200;

/// The datagram endpoint: one UDP socket per node, a port of its own.
pub(crate) static ENDPOINT: EndpointInfo = EndpointInfo {
    doc_name: "dgram",
    about: "UDP: datagram links (mUDP-OR and MORE)",
    protocol: IpProtocol::Udp,
};

/// The datagram endpoint's kind.
pub(crate) const DGRAM: EndpointKind = EndpointKind::new(&ENDPOINT);

/// The registry's description of this transport.
pub(crate) static INFO: TransportInfo = TransportInfo {
    name: "datagram",
    about: "datagram circuits over UDP: relays forward each cell at once, the client's TCP runs end to end to the exit over 1-3 circuits (mUDP-OR; seed 004)",
    ordering: Ordering::Unordered,
    endpoint: DGRAM,
    settings: &[
        SettingInfo {
            key: "listen.dgram",
            default: "none (no datagram circuits)",
            about: "relays: UDP address of the datagram endpoint",
        },
        SettingInfo {
            key: "legs, leg_scheduler",
            default: "1, round-robin",
            about: "clients: circuits per set (1-3), and round-robin or random dispatch of segments",
        },
        SettingInfo {
            key: "link.utcp.*",
            default: "as dtls-utcp's",
            about: "the end-to-end user-space TCP (segments sized to fit a cell)",
        },
        SettingInfo {
            key: "link.datagram.end_to_end",
            default: "user",
            about: "\"kernel\": the client's and the exit's kernel TCP end to end through TUN devices (the paper's TUN mode; needs CAP_NET_ADMIN, link.tcp.congestion applies)",
        },
    ],
    open: open_link,
};

/// The registry's description of MORE, on the same endpoint: relays run
/// both designs on their datagram socket; a client's transport picks one.
pub(crate) static MORE_INFO: TransportInfo = TransportInfo {
    name: "more",
    about: "no circuits: every segment of the client's end-to-end TCP goes in a Sphinx packet on its own random route of three relays to the exit, replies on single-use reply blocks (MORE; seed 004)",
    ordering: Ordering::Unordered,
    endpoint: DGRAM,
    settings: &[
        SettingInfo {
            key: "listen.dgram",
            default: "none (no datagram circuits)",
            about: "relays: UDP address of the datagram endpoint (MORE's too)",
        },
        SettingInfo {
            key: "link.utcp.*",
            default: "as dtls-utcp's",
            about: "the end-to-end user-space TCP (397-byte segments, to fit a packet with a reply block)",
        },
    ],
    open: open_link,
};

/// Datagram links carry datagram circuits, never channel cells.
fn open_link(
    _: &crate::endpoint::Endpoints,
    addr: std::net::SocketAddr,
    _: tor_llcrypto::pk::ed25519::Ed25519Identity,
) -> OpenFuture<'_> {
    Box::pin(async move {
        Err(Error::Config(format!(
            "datagram links carry datagram circuits only (docs/datagram.md): no channel to {addr}"
        )))
    })
}

/// An endpoint's settings with the defaults: a relay's (`identity`, and
/// `accept` on its advertised port) or a client's (no identity, never
/// accepting).
pub fn endpoint_config(
    identity: Option<Arc<Keypair>>,
    accept: bool,
    cells: CellLinkConfig,
    handshake_timeout: Duration,
) -> EndpointConfig<CellLink> {
    EndpointConfig {
        session: SessionConfig {
            carrier: cells,
            datagram: DATAGRAM,
            identity,
            expect_peer: None,
            handshake_timeout,
            certificate: None,
        },
        accept,
        max_sessions: DEFAULT_MAX_SESSIONS,
        max_handshakes: DEFAULT_MAX_HANDSHAKES,
        max_handshakes_per_ip: DEFAULT_MAX_HANDSHAKES_PER_IP,
    }
}

//! The datagram link of seed 004's mUDP-OR (`docs/datagram.md` section
//! 2): one UDP socket per node, a DTLS 1.3 session per peer
//! (`onionlab_dtls`, as dtls-utcp's: the relay identities bound inside,
//! clients anonymous, a stateless cookie in front), each record one cell
//! (`onionlab_dgram::CellLink`), nothing resent, nothing ordered.
//!
//! Its links carry datagram circuits (`onionlab_dgram`'s `DgramRelay`
//! and `DgramClient`) and nothing else: tor1 circuits need every cell in
//! order, so it opens no [`crate::Link`] of channel cells.
//! [`DatagramSocket`] is the thin async driver of the sans-IO endpoint;
//! the relays and clients that run datagram circuits on it, and its
//! registry entry, come with them (`docs/datagram.md` section 8).

mod socket;

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

/// Largest UDP payload a datagram link sends: two cells' records fit.
pub const DATAGRAM: usize = 1200;

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

//! The `dtls-utcp` transport (seed 002; `docs/dtls-utcp.md`): a
//! user-space TCP connection per circuit inside one DTLS session per node
//! pair, over UDP. The sans-IO parts are crate `onionlab-utcp`; this
//! module runs them on sockets.
//!
//! Built so far: the UDP socket and its sessions, with each lane as a
//! byte stream ([`socket`]), and links with circuits on lanes ([`link`],
//! pctcp's machinery over the session's lanes). Not yet: the registry
//! entry (network document address, relay and client settings, the lab).

pub mod link;
pub mod socket;

pub use link::{UtcpLink, UtcpSettings, UtcpTransport};
pub use socket::{IncomingLanes, LaneStream, UtcpSession, UtcpSocket};

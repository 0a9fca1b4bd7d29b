//! The `dtls-utcp` transport (seed 002; `docs/dtls-utcp.md`): a
//! user-space TCP connection per circuit inside one DTLS session per node
//! pair, over UDP. The sans-IO parts are crate `onionlab-utcp`; this
//! module runs them on sockets.
//!
//! Built so far: the UDP socket and its sessions, with each lane as a
//! byte stream ([`socket`]). Not yet: circuits on lanes, the link's
//! reader and writer, the registry entry.

pub mod socket;

pub use socket::{LaneStream, UtcpSession, UtcpSocket};

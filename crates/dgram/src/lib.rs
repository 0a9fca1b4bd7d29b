//! Onion routing over datagram links (seed 004's mUDP-OR,
//! `docs/datagram.md`), sans-IO: circuits whose relays forward each cell
//! at once, with no hop-by-hop reliability, and whose cell crypto
//! survives loss and reordering (`onionlab_crypto::dgram`). The client
//! and the exit run the end-to-end transport over them.
//!
//! - [`wire`]: the 529-byte datagram cell and the relay messages;
//! - [`link`]: what a datagram link's DTLS session carries ([`CellLink`]);
//! - [`relay`]: a relay's circuits ([`DgramRelay`]);
//! - [`client`]: a client's circuits ([`DgramClient`]);
//! - [`e2e`]: the end-to-end TCP over a set of circuits ([`e2e::E2eSet`]);
//! - [`streams`]: a set's streams, both ends;
//! - [`proxy`]: the client's sets ([`Proxy`]);
//! - [`exit`]: the exit's sets ([`ExitSets`]);
//! - [`more`]: MORE, a Sphinx packet per segment instead of circuits;
//! - [`tunnel`]: kernel sets, whose TCP is the nodes' kernels' behind TUN
//!   devices (the paper's TUN mode).

pub mod client;
pub mod e2e;
pub mod exit;
pub mod link;
pub mod more;
pub mod proxy;
pub mod relay;
pub mod streams;
pub mod tunnel;
pub mod wire;

pub use client::{ClientOutput, ClientSettings, DgramClient, HopSpec};
pub use exit::{ExitSetSettings, ExitSets, KernelOutput};
pub use link::{CellLink, CellLinkConfig, CellLinkEvent, CellLinkStats};
pub use proxy::{Proxy, ProxyOutput, ProxySettings};
pub use relay::{DgramRelay, RelayOutput, RelaySettings, RelayStats};
pub use streams::{Recv, StreamEvent, StreamKey, StreamStatus};

/// A datagram link (one peer's DTLS session), as the driver numbers them.
pub type LinkId = u64;

/// A circuit, as this node numbers them (not its circuit IDs on links).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CircuitId(pub u64);

/// What is wrong with a datagram cell or relay message's bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The wrong number of bytes.
    #[error("{what}: {got} bytes")]
    Length {
        /// What was parsed.
        what: &'static str,
        /// Its length.
        got: usize,
    },
    /// Circuit ID 0.
    #[error("circuit ID 0")]
    ZeroCircuit,
    /// A command this format does not have.
    #[error("unknown command {0}")]
    Command(u8),
    /// A handshake that is not ntor's, or not of its length.
    #[error("handshake type {htype} of {hlen} bytes (only ntor, 84/64)")]
    Handshake {
        /// Its type.
        htype: u16,
        /// Its length.
        hlen: usize,
    },
    /// Nonzero reserved or padding bytes.
    #[error("nonzero reserved or padding bytes")]
    Padding,
    /// An address family other than 4 and 6.
    #[error("address family {0}")]
    Family(u8),
    /// Port 0.
    #[error("port 0")]
    Port,
}

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Malformed bytes.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The cell crypto refused.
    #[error(transparent)]
    Crypto(#[from] onionlab_crypto::Error),
    /// No such circuit (it ended).
    #[error("no circuit {0:?}")]
    NoCircuit(CircuitId),
    /// The circuit is still being built.
    #[error("circuit {0:?} is not built yet")]
    NotBuilt(CircuitId),
    /// A path without hops.
    #[error("a circuit needs at least one hop")]
    EmptyPath,
    /// The circuit was not built within the build timeout.
    #[error("circuit not built in time")]
    BuildTimeout,
    /// The link under the circuit went down.
    #[error("the link to the guard went down")]
    LinkDown,
    /// A relay destroyed the circuit.
    #[error("destroyed by a relay (reason {0})")]
    Destroyed(u8),
    /// The end-to-end TCP refused.
    #[error(transparent)]
    Transport(#[from] onionlab_utcp::Error),
    /// A peer broke the protocol.
    #[error("protocol violation: {0}")]
    Protocol(&'static str),
    /// Settings out of range.
    #[error("datagram settings: {0}")]
    Settings(String),
    /// A Sphinx packet or SURB could not be built or opened.
    #[error("sphinx: {0}")]
    Sphinx(String),
}

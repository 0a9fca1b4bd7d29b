//! The transport crate's error type.

use std::net::SocketAddr;

/// Why a link could not be opened or ended.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A socket operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What we were doing.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake or record layer failed (includes a peer that could
    /// not prove an identity).
    #[error("TLS with {peer}: {source}")]
    Tls {
        /// The peer.
        peer: SocketAddr,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A dtls-utcp session or one of its lanes failed (a lane reset,
    /// the session ended).
    #[error("dtls-utcp with {peer}: {source}")]
    Utcp {
        /// The peer.
        peer: SocketAddr,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The QUIC connection failed or was closed with an error.
    #[error("QUIC with {peer}: {detail}")]
    Quic {
        /// The peer.
        peer: SocketAddr,
        /// What happened.
        detail: String,
    },
    /// The peer proved an identity other than the one expected.
    #[error("peer {peer} has identity {got}, expected {expected}: refused")]
    WrongIdentity {
        /// The peer.
        peer: SocketAddr,
        /// The identity it proved (hex).
        got: String,
        /// The identity we expected (hex).
        expected: String,
    },
    /// The peer broke the link protocol (bad framing, unexpected cell,
    /// no shared version...).
    #[error("link protocol violation by {peer}: {detail}")]
    Protocol {
        /// The peer.
        peer: SocketAddr,
        /// What it did.
        detail: String,
    },
    /// A cell could not be decoded or encoded.
    #[error("cell framing with {peer}: {source}")]
    Cell {
        /// The peer.
        peer: SocketAddr,
        /// The underlying error.
        #[source]
        source: onionlab_cell::Error,
    },
    /// The handshake took too long.
    #[error("link handshake with {peer} timed out")]
    HandshakeTimeout {
        /// The peer.
        peer: SocketAddr,
    },
    /// Nothing arrived from the peer on any of the link's connections for
    /// too long (see [`crate::liveness`]).
    #[error("nothing from {peer} on any of the link's {connections} connections for {silence:?}: peer presumed gone")]
    Silent {
        /// The peer.
        peer: SocketAddr,
        /// How long nothing arrived.
        silence: std::time::Duration,
        /// The link's connections at the time.
        connections: usize,
    },
    /// The peer closed the link.
    #[error("link closed by peer")]
    Closed,
    /// A local configuration problem (bad key material...).
    #[error("transport configuration: {0}")]
    Config(String),
}

impl Error {
    /// The operating system's error underneath, if there is one (to tell
    /// resource exhaustion, such as `EMFILE` on accept, from the rest).
    pub fn io_error(&self) -> Option<&std::io::Error> {
        match self {
            Error::Io { source, .. } | Error::Tls { source, .. } | Error::Utcp { source, .. } => {
                Some(source)
            }
            _ => None,
        }
    }
}

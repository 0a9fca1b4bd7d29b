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
    /// The peer's framing bytes (a preamble, an answer, a lane header)
    /// are malformed.
    #[error("link protocol violation by {peer}: {source}")]
    Framing {
        /// The peer.
        peer: SocketAddr,
        /// What is wrong.
        #[source]
        source: WireError,
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
    /// A transport setting is invalid or cannot be applied.
    #[error("transport setting: {0}")]
    Setting(#[from] SettingError),
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

/// What is wrong with a transport setting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettingError {
    /// A name that is not one of the setting's choices.
    #[error("unknown {setting} {value:?}: expected {expected}")]
    UnknownName {
        /// The setting.
        setting: &'static str,
        /// The value given.
        value: String,
        /// The choices, for the message.
        expected: String,
    },
    /// A limit that must be positive (and finite) is not.
    #[error("{setting} must be positive, not {value}")]
    NotPositive {
        /// The setting.
        setting: &'static str,
        /// The value given.
        value: f64,
    },
    /// No socket could be opened to ask the kernel about a TCP congestion
    /// control.
    #[error("a TCP socket to check congestion control {name:?}: {source}")]
    CannotCheck {
        /// The algorithm.
        name: String,
        /// Why no socket.
        #[source]
        source: std::io::Error,
    },
    /// The kernel refuses a TCP congestion control.
    #[error(
        "TCP congestion control {name:?} cannot be set ({source}); this kernel offers: {offered}"
    )]
    Unavailable {
        /// The algorithm.
        name: String,
        /// What the kernel offers, space-separated.
        offered: String,
        /// The kernel's refusal.
        #[source]
        source: std::io::Error,
    },
}

/// What is wrong with a transport's own framing bytes: the preambles and
/// answers that open pctcp, torchestra and QUIC links and lanes, a lane's
/// header, and torchestra's switch cells (the parsers in `lanes::wire`,
/// `quic::wire` and `torchestra::switch`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The bytes do not start with the message's magic.
    #[error("bad {what}")]
    BadMagic {
        /// The message expected.
        what: &'static str,
    },
    /// The message is shorter or longer than its kind says.
    #[error("{what} of {got} bytes, not {want}")]
    Length {
        /// The message.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length its kind has.
        want: usize,
    },
    /// Too few bytes to tell the message's kind.
    #[error("{what} too short")]
    Short {
        /// The message.
        what: &'static str,
    },
    /// A link mode no registered transport uses.
    #[error("unknown {what} link mode {mode}")]
    UnknownMode {
        /// The transport family (`"TCP"`, `"QUIC"`).
        what: &'static str,
        /// The mode byte.
        mode: u8,
    },
    /// An address family other than none, IPv4 or IPv6.
    #[error("unknown address family {0}")]
    UnknownFamily(u8),
    /// Flags this version does not know.
    #[error("unknown answer flags {0:#x}")]
    UnknownFlags(u8),
    /// A lane for circuit ID 0, which no circuit has.
    #[error("a lane for circuit ID 0")]
    ZeroCircuit,
    /// A lane numbered out of order.
    #[error("lane number {seq} after lane {prev}")]
    LaneOrder {
        /// The lane's number.
        seq: u64,
        /// The lane it says comes before it.
        prev: u64,
    },
    /// A lane address nobody can connect to (unspecified, port 0).
    #[error("lane address {0} cannot be reached")]
    Unreachable(SocketAddr),
    /// A switch command that the cell codec decoded as a known cell.
    #[error("command {0} decoded as a known cell")]
    KnownCommand(u8),
    /// A switch cell whose body cannot be read back.
    #[error("unreadable switch cell")]
    UnreadableSwitch,
    /// A switch cell that names neither connection.
    #[error("switch cell {0} names no connection")]
    NoConnection(u8),
    /// SWITCH flags this version does not know.
    #[error("unknown SWITCH flags {0:#x}")]
    UnknownSwitchFlags(u8),
}

//! The names the core and its driver share: requests, isolation, failures,
//! streams, events.

use onionlab_cell::msg::EndReason;
use onionlab_netdoc::RelayEntry;

pub use onionlab_circuit::client_node::BuildFailure;
pub use onionlab_circuit::node::CircKey;

/// Identifies a channel within the client (a new channel to the same
/// guard gets a new key).
pub type ChanKey = onionlab_circuit::node::ChannelId;

/// Identifies a stream request from [`ClientCore::open_stream`](crate::ClientCore::open_stream) until its
/// stream is detached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// What the core asks of its driver, or tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoreEvent {
    /// Open a connection to `guard` for channel `chan`; then call
    /// [`ClientCore::channel_opened`](crate::ClientCore::channel_opened) or [`ClientCore::channel_closed`](crate::ClientCore::channel_closed).
    Connect {
        /// The new channel.
        chan: ChanKey,
        /// The guard, as the circuit's document lists it.
        guard: Box<RelayEntry>,
    },
    /// Channel `chan` has cells to send (its writer should fill).
    Transmit(ChanKey),
    /// The request's stream is connected: read and write it by `stream`.
    Opened {
        /// The request.
        request: RequestId,
        /// Its stream.
        stream: StreamRef,
    },
    /// The request failed (after its retries); nothing of it is left.
    Failed {
        /// The request.
        request: RequestId,
        /// Why.
        failure: StreamFailure,
    },
    /// Something happened on the request's connected stream (readable,
    /// writable, ended, lost): its owner should look.
    Stream(RequestId),
}

/// A stream attached to a circuit. The request tells this stream apart
/// from a later one that reuses its ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRef {
    /// Its circuit.
    pub circ: CircKey,
    /// Its ID on the circuit.
    pub id: onionlab_cell::msg::StreamId,
    /// The request it answers.
    pub request: RequestId,
}

/// What a stream's owner sees of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamView {
    /// The stream exists (or its received bytes are still readable).
    Live {
        /// The exit answered CONNECTED.
        connected: bool,
        /// The exit sent END with this reason.
        ended: Option<EndReason>,
    },
    /// The circuit closed (or the stream is otherwise lost): abandon it.
    Lost,
}

/// What [`ClientCore::replace_network`](crate::ClientCore::replace_network) changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Swapped {
    /// Relays of the old document the new one no longer lists.
    pub vanished: usize,
    /// Circuits that now take no new streams (a relay of theirs vanished,
    /// or their exit's policy changed).
    pub retired: usize,
}

/// Which streams may share a circuit, as tor's `IsolateSOCKSAuth`: streams
/// with different SOCKS credentials never share one; streams without
/// credentials share among themselves.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum IsolationKey {
    /// No credentials (SOCKS5 "no authentication", SOCKS4 without user ID).
    None,
    /// A SOCKS4 user ID.
    Socks4(Vec<u8>),
    /// A SOCKS5 username and password.
    UserPass {
        /// Username.
        user: Vec<u8>,
        /// Password.
        pass: Vec<u8>,
    },
}

impl IsolationKey {
    /// Whether streams with these keys may share a circuit.
    pub fn compatible(&self, other: &IsolationKey) -> bool {
        self == other
    }
}

/// Why a stream could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamFailure {
    /// The exit refused or failed the stream with this END reason.
    Ended(EndReason),
    /// No relay's exit policy allows the target (or the pinned exit's
    /// does not).
    NotAllowed,
    /// The network document has too few suitable relays for a path.
    NoPath(String),
    /// Every circuit build attempt failed; the last one did not time out.
    BuildFailed(String),
    /// Every circuit build attempt failed; the last one timed out.
    BuildTimeout,
    /// The circuit closed before the exit answered.
    CircuitClosed,
    /// The exit did not answer within the stream timeout.
    ConnectTimeout,
    /// The target cannot be carried in a BEGIN cell.
    BadTarget,
    /// The circuit refused a new stream (for example, no stream ID free).
    Attach(String),
    /// The client is shutting down.
    ShuttingDown,
}

impl std::fmt::Display for StreamFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamFailure::Ended(r) => write!(f, "exit ended the stream: {r}"),
            StreamFailure::NotAllowed => write!(f, "no exit policy allows the target"),
            StreamFailure::NoPath(e) => write!(f, "no path: {e}"),
            StreamFailure::BuildFailed(e) => write!(f, "circuit build failed: {e}"),
            StreamFailure::BuildTimeout => write!(f, "circuit build timed out"),
            StreamFailure::CircuitClosed => write!(f, "circuit closed before CONNECTED"),
            StreamFailure::ConnectTimeout => write!(f, "no CONNECTED in time"),
            StreamFailure::BadTarget => write!(f, "target cannot be encoded in BEGIN"),
            StreamFailure::Attach(e) => write!(f, "cannot open a stream: {e}"),
            StreamFailure::ShuttingDown => write!(f, "client shutting down"),
        }
    }
}

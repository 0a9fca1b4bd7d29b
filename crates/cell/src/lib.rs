//! Wire formats of the onion-routing core, per tor-spec.
//!
//! The message types themselves come from Arti's `tor-cell` (pinned): this
//! crate re-exports them and adds what the rest of onionlab needs around them:
//!
//! * [`codec`]: framing of channel cells on a byte stream (link protocol 4/5,
//!   4-byte circuit IDs, 514-byte fixed cells and variable-length cells), with
//!   a hard limit on frame size and the obsolete 2-byte-circuit-ID VERSIONS
//!   cell that opens every link handshake;
//! * [`relay`]: relay cell bodies (the 509 bytes that relay crypto covers),
//!   encoded from and decoded into relay messages, plus the header offsets
//!   the tor1 relay crypto reads.
//!
//! Every decoder returns [`Error`] on malformed input and never panics.

pub mod codec;
mod err;
pub mod relay;

pub use err::Error;

/// Channel-level types (cells between two directly connected nodes).
pub mod chan {
    pub use tor_cell::chancell::msg::{
        AnyChanMsg, AuthChallenge, Certs, Create2, Created2, Destroy, DestroyReason, HandshakeType,
        Netinfo, Padding, Relay, RelayEarly, Versions, Vpadding,
    };
    pub use tor_cell::chancell::{AnyChanCell, ChanCell, ChanCmd, ChanMsg, CircId};
}

/// Relay-message types (messages carried end to end inside RELAY cells).
pub mod msg {
    pub use tor_cell::relaycell::conflux::{
        ConfluxLink, ConfluxLinked, ConfluxLinkedAck, ConfluxSwitch, V1DesiredUx, V1LinkPayload,
        V1Nonce,
    };
    pub use tor_cell::relaycell::flow_ctrl::{FlowCtrlVersion, Xoff, Xon, XonKBpsEwma};
    pub use tor_cell::relaycell::msg::{
        AnyRelayMsg, Begin, BeginFlags, Connected, Data, Drop, End, EndReason, Extend2, Extended2,
        Resolve, Resolved, ResolvedVal, Sendme, SendmeTag, Truncate, Truncated,
    };
    pub use tor_cell::relaycell::{RelayCmd, RelayMsg, StreamId};
    pub use tor_linkspec::{EncodedLinkSpec, LinkSpec, LinkSpecType};
}

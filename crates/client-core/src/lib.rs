//! The onion proxy's decisions, sans-IO: [`ClientCore`] holds the client
//! node (guard channels, circuits, streams; `onionlab-circuit`'s
//! `ClientNode`) and decides over it which circuit a stream uses
//! (isolation, exit policy, dirtiness, network document changes), which
//! path a new circuit takes (avoiding relays that failed recently), and
//! when builds and streams are tried again. It is fed calls with the time
//! and gives [`CoreEvent`]s, as the relay's `RelayNode` is: the client
//! crate drives it with sockets and timers, the simulation with simulated
//! ones.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod core;
pub mod path;
mod request;
mod settings;
mod streams;
#[cfg(test)]
mod tests;
mod types;

pub use crate::core::{linkspecs, may_share, too_dirty, ClientCore};
pub use request::begin_target_ok;
pub use settings::{
    Config, PolicySettings, RelayId, DEFAULT_BUILD_RETRIES, DEFAULT_CIRCUIT_BUILD_TIMEOUT,
    DEFAULT_MAX_CIRCUIT_DIRTINESS, DEFAULT_RELAY_FAILURE_AVOIDANCE, DEFAULT_STREAM_CONNECT_TIMEOUT,
    DEFAULT_STREAM_RETRIES,
};
pub use streams::ReadResult;
pub use types::{
    BuildFailure, ChanKey, CircKey, CoreEvent, IsolationKey, RequestId, StreamFailure, StreamRef,
    StreamView, Swapped,
};

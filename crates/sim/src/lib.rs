//! A deterministic in-memory onion network over the sans-IO core.
//!
//! One client ([`onionlab_circuit::client_node::ClientNode`], the node the
//! SOCKS client drives too) and a chain of relays
//! ([`onionlab_circuit::node::RelayNode`]) joined by channels modelled as
//! ordered links with random per-cell delays; every tick the endpoints act in random order and write random bursts, so
//! interleavings vary with the seed while each run is exactly repeatable.
//! Time is simulated: nothing sleeps, and a run takes as long as the CPU
//! needs to push the cells through the real cell, crypto and circuit code.
//! [`Net::enable_trace`] records an event log (every cell sent and
//! delivered, every event) that is byte-identical across runs of the same
//! seed: nothing the network or the nodes iterate in an order that shows
//! depends on a hash seed.
//!
//! The tests of the circuit layer run on it, and so does `onionlab schedulers`
//! ([`demo`]).
//!
//! [`Network`] is the same idea with whole clients: relays listed in a
//! network document and clients that are the onion proxy's sans-IO core
//! (`onionlab-client-core`), choosing their own paths, retrying and
//! avoiding failed relays as the SOCKS client does.

mod clients;
pub mod demo;
mod net;

pub use clients::{response_byte, Network, Outcome, Peer, Transfer};
pub use net::{linkspecs, shuffle, End, Net, Pattern, Tamper};

use std::time::Duration;

/// Why a simulation could not complete.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The condition waited for did not happen in time (simulated).
    #[error("nothing happened within {0:?} of simulated time")]
    Timeout(Duration),
    /// A path after the guard must name relays `1..n`, each once.
    #[error("bad path after the guard: {0:?}")]
    BadPath(Vec<usize>),
    /// A circuit refused an operation.
    #[error("circuit: {0}")]
    Circuit(#[from] onionlab_circuit::Error),
    /// A circuit closed while the experiment needed it.
    #[error("circuit closed: {0}")]
    Closed(onionlab_circuit::CloseReason),
    /// Data arrived corrupted or out of order.
    #[error("stream data corrupted: {0}")]
    Corrupt(&'static str),
}

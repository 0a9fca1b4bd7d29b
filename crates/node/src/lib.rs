//! onionlab's relay process: the sans-IO [`RelayNode`] on real sockets.
//!
//! The relay runs on one thread, as tor does: a tokio current-thread
//! runtime with a `LocalSet`, the node in an `Rc<RefCell<_>>`, and small
//! tasks around it:
//!
//! - one accept loop, and one handshake task per incoming connection;
//! - per channel, a reader task that feeds cells to the node (at most one
//!   batch of 64 cells per wake, so one busy peer cannot starve others) and
//!   a writer task that pulls cells from the node's circuit scheduler while
//!   the transport has room, then flushes (this is where back-pressure
//!   enters: cells wait in circuit queues, where the scheduler and the
//!   memory cap see them);
//! - one task per outgoing connection attempt (EXTEND2 to a relay we have
//!   no channel with);
//! - at an exit, per stream: a connect task (resolve, check the exit policy,
//!   connect), then two pump tasks (target to circuit and circuit to target).
//!
//! No RefCell borrow is held across an `.await`.
//!
//! [`RelayNode`]: onionlab_circuit::node::RelayNode

#![warn(missing_docs)]

mod dgram;
pub mod dos;
mod err;
mod exit;
mod memory;
mod relay;
mod thread;

pub use dos::DosLimits;
pub use err::Error;
pub use exit::{
    end_reason_for_io, ExitSettings, DEFAULT_EXIT_CONNECT_TIMEOUT, DEFAULT_MAX_CONCURRENT_LOOKUPS,
    DEFAULT_MAX_PENDING_CONNECTS,
};
pub use relay::{CircuitGauge, Relay, RelaySettings, RelayStats, DEFAULT_CHANNEL_IDLE_TIMEOUT};
pub use thread::RelayThread;

/// Private pieces of the relay made reachable for the fuzz targets
/// (`fuzz/`); not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::relay::extend_target;
}

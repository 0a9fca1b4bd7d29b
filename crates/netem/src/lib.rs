//! Emulated network for onionlab.
//!
//! Each emulated host is a Linux network namespace with a TUN interface, its
//! own IPv4 address and a default route into the TUN. A forwarder thread
//! reads IP packets from every host's TUN, runs them through the
//! [`LinkModel`] (rates, drop-tail queues, latency, jitter, loss, reordering)
//! and writes them into the destination host's TUN when they are due.
//! Packets to addresses outside the topology are dropped and counted.
//!
//! * [`Topology`]: the TOML topology format (see `docs/netem.md`).
//! * [`LinkModel`]: the sans-IO, seeded, deterministic link model.
//! * [`Network`]: namespaces + TUNs + forwarder; run commands in hosts, change
//!   links at run time, read counters.

pub mod control;
pub mod counters;
mod error;
pub mod forwarder;
pub mod model;
pub mod netns;
mod network;
pub mod rng;
mod sys;
pub mod topology;
pub mod units;

pub use counters::Counters;
pub use error::{Error, Result};
pub use forwarder::ForwarderOptions;
pub use model::{DropCause, LinkModel, Nanos, Output};
pub use network::{check_privileges, Network, NetworkOptions};
pub use topology::{
    Block, HostId, HostSpec, HostUpdate, LinkSpec, LossModel, PathSpec, PathUpdate, Topology,
};
pub use units::{QueueLimit, Rate};

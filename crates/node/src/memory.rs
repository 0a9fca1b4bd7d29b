//! The relay's memory cap (`max_mem_in_queues`), shared by its two
//! engines on the relay's thread: the circuit node (tor1 circuits over
//! channels, which counts its queues itself) and the datagram engine
//! (datagram circuits, MORE and at an exit the end-to-end sets). Each
//! publishes what it holds here and may hold the cap less what the
//! other holds, never less than half of it
//! (`onionlab_circuit::node::allowance`): together they stay under the
//! cap, and neither can starve the other.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// What each engine holds, against the relay's cap.
#[derive(Debug)]
pub(crate) struct SharedMemory {
    /// The cap in bytes; 0: none.
    limit: usize,
    tor1: Cell<usize>,
    /// Read by the circuit node at each of its checks.
    datagram: Arc<AtomicUsize>,
}

impl SharedMemory {
    /// Nothing held yet, under a cap of `limit` bytes (0: none).
    pub(crate) fn new(limit: usize) -> Self {
        SharedMemory {
            limit,
            tor1: Cell::new(0),
            datagram: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The cap in bytes; 0: none.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// What the circuit node's queues held when it last acted.
    pub(crate) fn tor1(&self) -> usize {
        self.tor1.get()
    }

    pub(crate) fn set_tor1(&self, bytes: usize) {
        self.tor1.set(bytes);
    }

    /// Where the datagram engine keeps what it holds, for the circuit
    /// node (`RelayNode::share_limit_with`).
    pub(crate) fn datagram_gauge(&self) -> Arc<AtomicUsize> {
        self.datagram.clone()
    }

    pub(crate) fn set_datagram(&self, bytes: usize) {
        self.datagram.store(bytes, Ordering::Relaxed);
    }
}

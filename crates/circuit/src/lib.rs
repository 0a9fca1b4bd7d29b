//! Sans-IO onion-routing circuits: the client, relay and exit roles, streams,
//! flow control and circuit scheduling.
//!
//! Nothing here does I/O or reads a clock. State machines take cells and the
//! current time in (`handle_*`) and give cells, events and deadlines out
//! (`poll_*`), in the style of `quinn-proto`. Drivers (the node binaries, the
//! in-memory network of the tests) move cells between them.
//!
//! * [`client::ClientCircuit`]: the client end of one circuit;
//! * [`client_node::ClientNode`]: a whole client: channels to guards, their
//!   circuit-ID maps and schedulers, circuits built along given paths;
//! * [`conflux`]: multi-path circuits (sequence numbers, leg schedulers);
//! * [`relay::RelayCircuit`]: one circuit at a relay or exit;
//! * [`node::RelayNode`]: a whole relay: channels, circuit-ID maps, a circuit
//!   scheduler per channel, EXTEND2 handling across channels;
//! * [`flow`]: windows and authenticated SENDMEs, and the choice of circuit
//!   congestion control ([`flow::CircuitCc`]);
//! * [`cc`]: the congestion-control trait and tor-spec's fixed window;
//! * [`vegas`]: TOR_VEGAS circuit congestion control of proposal 324;
//! * [`scheduler`]: round-robin and EWMA circuit schedulers;
//! * [`xonxoff`]: XON/XOFF stream flow control of proposal 324;
//! * [`torchestra`]: Torchestra's light/heavy circuit classifier (seed 003).

pub mod cc;
pub mod client;
pub mod client_node;
pub mod conflux;
mod err;
pub mod flow;
pub mod node;
pub mod relay;
pub mod scheduler;
pub mod stream;
pub mod torchestra;
pub mod vegas;
pub mod xonxoff;

pub use err::{CloseKind, CloseReason, Error, ParamError};

/// Memory charged for one queued cell in memory accounting
/// ([`relay::RelayCircuit::queued_bytes`], [`node::RelayNode::total_queued_bytes`]):
/// the 514-byte wire cell plus the queue slot that holds the message (the
/// body itself lives in its own allocation). This is roughly what tor
/// charges per queued cell (`sizeof(packed_cell_t)`, a little over 514
/// bytes).
pub const QUEUED_CELL_BYTES: usize =
    onionlab_cell::codec::FIXED_CELL_LEN + std::mem::size_of::<onionlab_cell::chan::AnyChanMsg>();

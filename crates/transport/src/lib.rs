//! The seam between onionlab's circuit layer and the transports that carry
//! cells between two nodes, and the transports: vanilla Tor's TLS over TCP
//! ([`tls`]), QUIC with a stream or a connection per circuit ([`quic`]),
//! and the per-link choice between them with fallback ([`any`]).
//!
//! # The contract
//!
//! A *transport* carries channel cells ([`AnyChanCell`], each tagged with its
//! circuit ID) between two nodes. Everything above it (circuits, relay
//! crypto, flow control, the circuit scheduler) is shared code in
//! `onionlab-circuit`, so a difference measured between two transports
//! belongs to the transports. A transport promises:
//!
//! 1. **Authentication.** [`Transport::connect`] is given the Ed25519
//!    identity the caller expects and fails with [`Error::WrongIdentity`]
//!    unless the peer proves it holds that key. A relay that initiates a
//!    connection proves its own identity too; a client stays anonymous
//!    ([`Link::peer`] has `identity: None` on the relay's side).
//! 2. **Link negotiation.** After authentication both ends agree on a link
//!    protocol version (VERSIONS) and exchange NETINFO, as tor-spec's link
//!    handshake does. A [`Link`] is returned only after that; its reader and
//!    writer speak cells of the negotiated version.
//! 3. **Ordering.** Cells of one circuit arrive in the order they were sent
//!    and are never lost or duplicated while the link lives (tor's relay
//!    crypto and digests require it). [`Ordering`] says whether the transport
//!    also orders cells *across* circuits: TLS over one TCP connection does
//!    ([`Ordering::PerConnection`]); a QUIC stream or a TCP connection per
//!    circuit orders only within a circuit ([`Ordering::PerCircuit`]), which
//!    is the point of those designs (no head-of-line blocking across
//!    circuits).
//! 4. **Back-pressure.** The driver asks [`CellWriter::has_room`] before it
//!    pulls the next cell from the circuit layer, so cells wait in the
//!    circuit queues (where the scheduler and the memory cap see them), not
//!    in transport buffers. A per-connection transport buffers at most one
//!    high-water mark of encoded cells; a per-circuit transport would expose
//!    one writer per circuit (lane), so a blocked circuit blocks only itself.
//! 5. **Bounded input.** A reader buffers at most one read chunk plus one
//!    maximal cell. Garbage, an oversized variable-length cell or a
//!    truncated frame ends the link with an [`Error`] saying what happened;
//!    it never panics and never affects other links.
//! 6. **Link-level cells** (VERSIONS, NETINFO, PADDING) are handled by the
//!    transport; circuit cells go to the circuit layer unchanged.
//!
//! The driver (crate `onionlab-node`) owns one reader task and one writer
//! task per link; this crate does no scheduling of its own.

#![warn(missing_docs)]

use std::future::Future;
use std::net::SocketAddr;

pub use onionlab_cell::chan::{AnyChanCell, CircId};
use tor_llcrypto::pk::ed25519::Ed25519Identity;

pub mod addrs;
pub mod any;
pub mod connector;
pub mod datagram;
pub mod endpoint;
mod err;
mod inbox;
mod lanes;
pub mod link;
pub mod liveness;
pub mod node_endpoints;
pub mod pctcp;
#[cfg(feature = "test-transport")]
pub mod plain;
pub mod quic;
mod read_order;
pub mod registry;
mod sendbuf;
pub mod settings;
pub mod setup;
pub mod tcp;
pub mod tcp_share;
pub mod tls;
pub mod torchestra;
mod udp;
pub mod utcp;

pub use any::TransportKind;
pub use err::{Error, SettingError, WireError};
pub use registry::Choice;
pub use settings::LinkSettings;
pub use udp::UDP_SOCKET_BUFFER;

/// How a transport orders cells (see the crate docs, point 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    /// All cells of a connection arrive in the order sent (TLS over TCP).
    PerConnection,
    /// Only the cells of one circuit are ordered among themselves.
    PerCircuit,
    /// Nothing is ordered and nothing is resent: the datagram link
    /// ([`datagram`]), which carries datagram circuits only and so never
    /// opens a [`Link`] of channel cells.
    Unordered,
}

/// Who is at the other end of a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer's authenticated Ed25519 identity; `None` for an anonymous
    /// client (only possible on the accepting side).
    pub identity: Option<Ed25519Identity>,
    /// The peer's network address.
    pub addr: SocketAddr,
}

/// An open, authenticated link whose handshake is complete.
pub struct Link<R, W> {
    /// Who is at the other end.
    pub peer: PeerInfo,
    /// The negotiated link protocol version.
    pub link_version: u16,
    /// Incoming cells.
    pub reader: R,
    /// Outgoing cells.
    pub writer: W,
}

/// Something a link's transport tells the node besides cells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// The peer moved circuit `circ_id` to the link's heavy connection
    /// (`heavy`) or back to the light one, and the switch completed on
    /// our side (Torchestra, `docs/torchestra.md`). With `propagate` the
    /// node switches the circuit on its own inward link too.
    Switched {
        /// The circuit.
        circ_id: CircId,
        /// Whether it is now on the heavy connection.
        heavy: bool,
        /// Whether to switch it on the inward link as well.
        propagate: bool,
    },
    /// The peer broke the transport's per-circuit protocol for
    /// `circ_id`: the node closes that circuit.
    CircuitViolation {
        /// The circuit.
        circ_id: CircId,
        /// What happened.
        detail: String,
    },
}

/// The receiving half of a link.
pub trait CellReader: Send {
    /// Wait until at least one circuit cell is available and append the
    /// cells now available (at most a small batch) to `out`.
    ///
    /// Returns [`Error::Closed`] when the peer closed the link cleanly (after
    /// the cells it sent before closing, on every connection of the link
    /// that was open), and another error when the link is broken; either
    /// way the link is done.
    fn read_cells(
        &mut self,
        out: &mut Vec<AnyChanCell>,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Bytes received but not yet returned by
    /// [`read_cells`](Self::read_cells) that this process holds (the
    /// kernel's socket buffers not included), for a relay's memory cap.
    fn buffered_bytes(&self) -> usize;

    /// The next event besides cells, if any; the driver asks after every
    /// [`read_cells`](Self::read_cells). Transports without any say
    /// `None`.
    fn poll_event(&mut self) -> Option<LinkEvent> {
        None
    }
}

/// The sending half of a link.
pub trait CellWriter: Send {
    /// Encode `cell` into the send buffer. Never blocks; call
    /// [`CellWriter::has_room`] first to respect back-pressure.
    fn queue(&mut self, cell: AnyChanCell) -> Result<(), Error>;

    /// Whether the send buffer is below its high-water mark.
    fn has_room(&self) -> bool;

    /// Whether anything is queued and not yet flushed.
    fn has_pending(&self) -> bool;

    /// Bytes this writer holds that are not yet written to the network
    /// (its send buffer, or a per-circuit writer's lane buffers), for a
    /// relay's memory cap.
    fn buffered_bytes(&self) -> usize;

    /// Write everything queued to the network.
    fn flush(&mut self) -> impl Future<Output = Result<(), Error>> + Send;

    /// Flush, then close the sending direction. Returns once what was
    /// queued is written (on a link of several connections, its lanes
    /// before its main connection), or after a bounded wait for a peer
    /// that does not read; it does not wait for the peer's own close.
    fn shutdown(&mut self) -> impl Future<Output = Result<(), Error>> + Send;

    /// How this writer orders cells. With [`Ordering::PerCircuit`] the
    /// driver fills each circuit's lane on its own: it asks
    /// [`CellWriter::has_room_for`] per circuit and waits on
    /// [`CellWriter::writable`] for full lanes to drain.
    fn ordering(&self) -> Ordering {
        Ordering::PerConnection
    }

    /// Whether a cell of circuit `circ_id` may be queued now. A writer
    /// with one lane per circuit answers for that lane only, so a circuit
    /// whose lane is full blocks nobody else; others answer
    /// [`CellWriter::has_room`].
    fn has_room_for(&self, circ_id: CircId) -> bool {
        let _ = circ_id;
        self.has_room()
    }

    /// Resolves when a lane that was full has drained (per-circuit
    /// writers), so the driver can pull more cells. A per-connection
    /// writer makes room only by [`CellWriter::flush`], and this never
    /// resolves.
    fn writable(&mut self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }

    /// How urgent circuit `circ_id`'s lane is, from the circuit scheduler
    /// (higher goes first; equal priorities share). A per-circuit writer
    /// whose lanes share one congestion-controlled connection (QUIC
    /// streams) hands it to that connection's stream scheduler, so the
    /// circuit scheduler's order holds on the wire; others ignore it.
    fn set_lane_priority(&mut self, circ_id: CircId, priority: i32) {
        let _ = (circ_id, priority);
    }

    /// The writer's circuit mover, if its link has a light and a heavy
    /// connection (Torchestra); `None` for every other transport.
    fn circuit_mover(&mut self) -> Option<&mut dyn CircuitMover> {
        None
    }
}

/// An extension of a link with a light and a heavy connection
/// (Torchestra, `docs/torchestra.md`), which the node asks its writer for
/// ([`CellWriter::circuit_mover`]): moving circuits between them.
pub trait CircuitMover {
    /// Move circuit `circ_id` to the heavy connection (`heavy`) or back
    /// to the light one, telling the peer to do the same on its inward
    /// link if `propagate` (the node's classifier decides).
    fn move_circuit(&mut self, circ_id: CircId, heavy: bool, propagate: bool);
}

/// A transport endpoint: opens links to peers and accepts them.
pub trait Transport {
    /// Incoming cells of a link.
    type Reader: CellReader + 'static;
    /// Outgoing cells of a link.
    type Writer: CellWriter + 'static;
    /// A bound listening endpoint.
    type Listener: Listener<Reader = Self::Reader, Writer = Self::Writer>;

    /// Which transport this is.
    fn kind(&self) -> TransportKind;

    /// Open a link to `addr`, requiring the peer to prove `expected`.
    fn connect(
        &self,
        addr: SocketAddr,
        expected: Ed25519Identity,
    ) -> impl Future<Output = Result<Link<Self::Reader, Self::Writer>, Error>>;

    /// Listen on `addr`.
    fn bind(&self, addr: SocketAddr) -> impl Future<Output = Result<Self::Listener, Error>>;
}

/// A listening endpoint.
pub trait Listener {
    /// Incoming cells of a link.
    type Reader: CellReader + 'static;
    /// Outgoing cells of a link.
    type Writer: CellWriter + 'static;
    /// A connection that still has to complete its handshake.
    type Incoming: Incoming<Reader = Self::Reader, Writer = Self::Writer> + 'static;

    /// The address actually bound.
    fn local_addr(&self) -> SocketAddr;

    /// Wait for the next connection. Its handshake runs separately
    /// ([`Incoming::handshake`]) so a slow peer cannot stall the listener.
    fn accept(&mut self) -> impl Future<Output = Result<Self::Incoming, Error>>;
}

/// An accepted connection before its handshake.
pub trait Incoming {
    /// Incoming cells of a link.
    type Reader: CellReader;
    /// Outgoing cells of a link.
    type Writer: CellWriter;

    /// The peer's network address.
    fn peer_addr(&self) -> SocketAddr;

    /// Run the handshake (bounded in time by the transport).
    fn handshake(self) -> impl Future<Output = Result<Link<Self::Reader, Self::Writer>, Error>>;
}

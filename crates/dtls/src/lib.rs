//! DTLS 1.3 sessions between onion routers, sans-IO, shared by the
//! transports whose links are datagrams: `dtls-utcp` (seed 002: each
//! session carries a user-space TCP per circuit) and `datagram` (seed
//! 004's mUDP-OR: each session carries cells, nothing resent).
//!
//! A [`Session`] is one peer's DTLS 1.3 session with the relay identities
//! bound inside it, fed datagrams and time; an [`Endpoint`] sorts one UDP
//! socket's datagrams to its sessions, behind a stateless cookie. What a
//! session carries once both sides are authenticated is its [`Carrier`]'s
//! business: the session hands it the peer's messages and sends the
//! messages it produces, one per DTLS record. The transport crate owns
//! the socket.
//!
//! Tested through its carriers, in simulated time: dtls-utcp's lanes
//! (`crates/utcp/tests/session.rs`, `endpoint.rs`) and datagram cells
//! (`crates/dgram/tests/link.rs`); the endpoint is fuzzed
//! (`fuzz/fuzz_targets/utcp_endpoint.rs`).

pub mod endpoint;
pub mod session;

use std::time::Instant;

use tor_llcrypto::pk::ed25519::Ed25519Identity;

pub use endpoint::{Endpoint, EndpointConfig, EndpointEvent, EndpointStats};
pub use session::{Certificate, Session, SessionConfig, SessionEvent, RECORD_OVERHEAD};

/// Which side of the DTLS session we are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// We began the session (its DTLS client).
    Initiator,
    /// The peer began it.
    Responder,
}

/// What a session carries once both sides are authenticated: it takes
/// the peer's messages and produces its own, each one DTLS record.
pub trait Carrier: Sized {
    /// Its settings, one value for all of an endpoint's sessions.
    type Config: Clone;
    /// What it reports to the session's owner.
    type Event;
    /// Its errors (their text goes into [`Error::Carrier`]).
    type Error: std::fmt::Display;
    /// What a relay's `AUTH` signature covers first: each carrier its
    /// own, so that an `AUTH` made for one never verifies for another.
    const AUTH_LABEL: &'static [u8];
    /// What an endpoint's cookie MAC covers first.
    const COOKIE_LABEL: &'static [u8];

    /// Check `config`, given that a message must fit in `max_message`
    /// bytes (one record of one datagram).
    ///
    /// # Errors
    ///
    /// Settings out of range.
    fn check(config: &Self::Config, max_message: usize) -> Result<(), Self::Error>;

    /// Start carrying, once the peer is authenticated: `peer` is a
    /// relay's proven identity, `None` for a client.
    ///
    /// # Errors
    ///
    /// Whatever keeps it from starting (the session ends).
    fn start(
        config: &Self::Config,
        role: Role,
        peer: Option<Ed25519Identity>,
        seed: u64,
        now: Instant,
    ) -> Result<Self, Self::Error>;

    /// A message from the authenticated peer.
    ///
    /// # Errors
    ///
    /// A malformed message: the session counts it and goes on.
    fn handle_message(&mut self, message: &[u8], now: Instant) -> Result<(), Self::Error>;

    /// The next message to send to the peer.
    fn poll_message(&mut self) -> Option<Vec<u8>>;

    /// The next event for the session's owner.
    fn poll_event(&mut self) -> Option<Self::Event>;

    /// Run the timers due by `now`.
    fn handle_timeout(&mut self, now: Instant);

    /// When [`handle_timeout`](Self::handle_timeout) must next run.
    fn poll_timeout(&self) -> Option<Instant>;
}

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Settings out of range.
    #[error("DTLS session settings: {0}")]
    Settings(String),
    /// DTLS failed; the session is over.
    #[error("DTLS: {0}")]
    Dtls(String),
    /// A session with this address exists already.
    #[error("a session with {0} exists already")]
    SessionExists(std::net::SocketAddr),
    /// The endpoint has as many sessions as it may.
    #[error("{0} sessions are open, the most an endpoint may have")]
    TooManySessions(usize),
    /// The relay proved an identity other than the one expected; the
    /// session is over.
    #[error("the peer proved identity {got}, not the expected {expected}")]
    WrongIdentity {
        /// What it proved.
        got: Ed25519Identity,
        /// What we expected.
        expected: Ed25519Identity,
    },
    /// The peer did not prove the identity it had to; the session is over.
    #[error("session authentication: {0}")]
    Auth(String),
    /// The carrier refused its settings or could not start.
    #[error("{0}")]
    Carrier(String),
}

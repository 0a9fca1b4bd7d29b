//! MORE (Landsiedel et al., 2007; seed 004's fourth design,
//! `docs/datagram.md` section 6), sans-IO: no circuits; every segment of
//! the end-to-end TCP travels in a Sphinx packet of its own, on a route
//! of three relays drawn afresh for it and ending at the exit, and the
//! exit answers on single-use reply blocks (SURBs) the client sends ahead.
//!
//! - [`sphinx`]: the packet format (the `sphinx-packet` crate) sized to a
//!   datagram link record, and the relays' Sphinx keys;
//! - [`wire`]: MORE's link messages and end-to-end messages;
//! - [`relay`]: a relay's part ([`MoreRelay`]);
//! - [`surbs`]: the SURBs a client handed out;
//! - [`client`]: a client's routes and SURBs (its sets and streams are the
//!   [`Proxy`](crate::Proxy)'s; the exit's are the
//!   [`ExitSets`](crate::ExitSets)').

pub mod client;
pub mod relay;
pub mod sphinx;
pub mod surbs;
pub mod wire;

pub use client::MoreRelayInfo;
pub use relay::{MoreOutput, MoreRelay, MoreRelaySettings, MoreStats};
pub use sphinx::{RouteHop, SphinxKey};

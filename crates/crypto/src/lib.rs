//! Cryptography of the onion-routing core: relay identities, the ntor
//! handshake (client and server), KDF-RFC5869, the tor1 relay-cell crypto,
//! and the per-cell crypto of circuits over datagram links ([`dgram`]).
//!
//! Built on `tor-llcrypto` primitives. Arti keeps the ntor server side and the
//! relay-side layer crypto private, so those are written here.

#![deny(missing_docs)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod dgram;
pub mod identity;
pub mod kdf;
pub mod ntor;
pub mod relay_crypto;

mod err;
pub use err::Error;

/// Length of a relay cell body (the part of a RELAY cell the layers encrypt).
pub const CELL_BODY_LEN: usize = 509;

/// A relay cell body as the relay crypto sees it.
pub type CellBody = [u8; CELL_BODY_LEN];

/// The 20-byte running digest after a cell, used as the SENDME v1 tag.
pub type SendmeTag = [u8; 20];

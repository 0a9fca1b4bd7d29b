//! MORE's per-packet onion format (`docs/datagram.md` section 6): Sphinx,
//! as the `sphinx-packet` crate implements it (not written here), sized
//! so that one packet fits one datagram link record. This module is the
//! thin glue: our relays' Sphinx keys, routes of relay identities, forward
//! packets to an exit, single-use reply blocks (SURBs) back to a client's
//! mailbox, and one relay's peeling of one layer.
//!
//! Every packet is [`PACKET_LEN`] bytes at every hop, forward or reply,
//! full or not: a relay cannot tell a packet's kind, position or content
//! by its size.

use rand::RngExt;
use sphinx_packet::constants::{
    NODE_ADDRESS_LENGTH, PAYLOAD_KEY_SEED_SIZE, REPLAY_TAG_SIZE, SECURITY_PARAMETER,
};
use sphinx_packet::header::delays::Delay;
use sphinx_packet::header::HEADER_SIZE;
use sphinx_packet::payload::{Payload, PAYLOAD_OVERHEAD_SIZE};
use sphinx_packet::route::{Destination, DestinationAddressBytes, Node, NodeAddressBytes};
use sphinx_packet::version::SINGLE_SEED_SURB_VERSION;
use sphinx_packet::{
    ProcessedPacketData, SURBMaterial, SphinxPacket, SphinxPacketBuilder, SurbReplyRecovery, SURB,
};
use tor_llcrypto::pk::ed25519::Ed25519Identity;
use x25519_dalek::{PublicKey, StaticSecret};

use crate::Error;

/// Bytes of a Sphinx payload: what is left of a [`PACKET_LEN`] packet
/// after the header.
pub const PAYLOAD_LEN: usize = PACKET_LEN - HEADER_SIZE;
/// Bytes of a Sphinx packet: the largest that fits one datagram link
/// record with the link message's kind byte (a 1200-byte datagram).
pub const PACKET_LEN: usize = 1176;
/// The longest message a packet carries (the payload less Sphinx's
/// zero prefix and padding marker).
pub const MESSAGE_LEN: usize = PAYLOAD_LEN - PAYLOAD_OVERHEAD_SIZE;
/// Bytes of a SURB: its header, its first hop, its one payload key seed.
pub const SURB_LEN: usize = HEADER_SIZE + NODE_ADDRESS_LENGTH + PAYLOAD_KEY_SEED_SIZE;
/// Bytes of a SURB's identifier (how its creator finds its keys).
pub const SURB_ID_LEN: usize = SECURITY_PARAMETER;
/// Bytes of a client's mailbox at a relay (a SURB's destination).
pub const MAILBOX_LEN: usize = 32;
/// Bytes of Sphinx's replay tag.
pub const TAG_LEN: usize = REPLAY_TAG_SIZE;

/// A relay's Sphinx key pair.
pub struct SphinxKey {
    secret: StaticSecret,
    public: [u8; 32],
}

impl std::fmt::Debug for SphinxKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SphinxKey")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

impl SphinxKey {
    /// The relay's Sphinx key
    /// (`onionlab_crypto::identity::RelaySecretKeys::sphinx_secret`).
    pub fn new(secret: [u8; 32]) -> SphinxKey {
        let secret = StaticSecret::from(secret);
        let public = PublicKey::from(&secret).to_bytes();
        SphinxKey { secret, public }
    }

    /// The public half, published for clients.
    pub fn public(&self) -> [u8; 32] {
        self.public
    }
}

/// A relay on a MORE route: who it is and its Sphinx public key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteHop {
    /// Its identity (a route names relays by it).
    pub identity: Ed25519Identity,
    /// Its Sphinx public key.
    pub key: [u8; 32],
}

fn nodes(route: &[RouteHop]) -> Vec<Node> {
    route
        .iter()
        .map(|h| {
            Node::new(
                NodeAddressBytes::from_bytes(<[u8; 32]>::from(h.identity)),
                PublicKey::from(h.key),
            )
        })
        .collect()
}

/// MORE adds no mixing delay: it is a low-latency design.
fn no_delays(n: usize) -> Vec<Delay> {
    vec![Delay::new_from_nanos(0); n]
}

fn sphinx_err(what: &'static str) -> impl Fn(sphinx_packet::Error) -> Error {
    move |e| Error::Sphinx(format!("{what}: {e}"))
}

/// A packet carrying `message` along `route` to its last hop (the exit),
/// which delivers it to itself.
///
/// # Errors
///
/// [`Error::Sphinx`] for an empty or too long route or message.
pub fn seal_forward(route: &[RouteHop], message: &[u8]) -> Result<Vec<u8>, Error> {
    let last = route.last().ok_or(Error::EmptyPath)?;
    let destination = Destination::new(
        DestinationAddressBytes::from_bytes(<[u8; 32]>::from(last.identity)),
        [0u8; SURB_ID_LEN],
    );
    let packet = SphinxPacketBuilder::new()
        .with_payload_size(PAYLOAD_LEN)
        .build_packet(
            message,
            &nodes(route),
            &destination,
            &no_delays(route.len()),
        )
        .map_err(sphinx_err("building a packet"))?;
    Ok(packet.to_bytes())
}

/// A SURB: the bytes the exit uses once, and what its creator keeps to
/// read the reply.
pub struct Surb {
    /// The SURB as sent ([`SURB_LEN`] bytes).
    pub bytes: Vec<u8>,
    /// Its identifier, which comes back with the reply.
    pub id: [u8; SURB_ID_LEN],
    /// The keys that open the reply.
    pub recovery: SurbReplyRecovery,
}

/// A SURB along `route`, whose last hop delivers the reply to `mailbox`.
///
/// # Errors
///
/// [`Error::Sphinx`] for an empty or too long route.
pub fn make_surb(route: &[RouteHop], mailbox: &[u8; MAILBOX_LEN]) -> Result<Surb, Error> {
    let mut id = [0u8; SURB_ID_LEN];
    rand::rng().fill(&mut id[..]);
    let material = SURBMaterial::new(
        nodes(route),
        no_delays(route.len()),
        Destination::new(DestinationAddressBytes::from_bytes(*mailbox), id),
        SINGLE_SEED_SURB_VERSION,
    );
    let (surb, recovery) = material
        .construct_recoverable_SURB()
        .map_err(sphinx_err("building a SURB"))?;
    Ok(Surb {
        bytes: surb.to_bytes(),
        id,
        recovery,
    })
}

/// A reply packet carrying `message` on the SURB `surb`, and the relay
/// it goes to first.
///
/// # Errors
///
/// [`Error::Sphinx`] for a SURB that does not parse or a message too long.
pub fn use_surb(surb: &[u8], message: &[u8]) -> Result<(Vec<u8>, Ed25519Identity), Error> {
    let surb = SURB::from_bytes(surb).map_err(sphinx_err("a SURB"))?;
    let (packet, first) = surb
        .use_surb(message, PAYLOAD_LEN)
        .map_err(sphinx_err("using a SURB"))?;
    Ok((packet.to_bytes(), Ed25519Identity::new(first.to_bytes())))
}

/// The message in a reply's payload, as the relay of the creator's
/// mailbox delivered it.
///
/// # Errors
///
/// [`Error::Sphinx`] if the payload was not made with this SURB or was
/// changed on the way.
pub fn open_reply(recovery: &SurbReplyRecovery, payload: &[u8]) -> Result<Vec<u8>, Error> {
    let payload = Payload::from_bytes(payload).map_err(sphinx_err("a reply payload"))?;
    recovery
        .recover_plaintext(payload)
        .map_err(sphinx_err("opening a reply"))
}

/// What one relay's layer of a packet said.
#[derive(Debug, PartialEq, Eq)]
pub enum Peeled {
    /// Send `packet` on to the relay `next`.
    Forward {
        /// The next hop.
        next: Ed25519Identity,
        /// The packet for it.
        packet: Vec<u8>,
    },
    /// We are the last hop: deliver to `destination`.
    Final {
        /// Our own identity (a forward packet to us, the exit) or a
        /// client's mailbox (a reply).
        destination: [u8; 32],
        /// The SURB's identifier (a reply; zero for a forward packet).
        id: [u8; SURB_ID_LEN],
        /// The payload, still under the SURB creator's layers for a reply.
        payload: Vec<u8>,
    },
}

/// Why a relay refused a packet.
#[derive(Debug, PartialEq, Eq)]
pub enum PeelError {
    /// Not a packet of ours: wrong length, a header that does not parse,
    /// or a MAC that does not verify (made for another key, or changed).
    Invalid(String),
    /// Its replay tag was seen before.
    Replay,
}

/// Peel our layer of `bytes`; `seen` is asked once the header's MAC has
/// verified and says whether the packet's replay tag was seen (and
/// records it).
///
/// A panic inside `sphinx-packet` is a refused packet: any client can
/// make a header whose MAC verifies for us, and the crate asserts on some
/// of what is under it in debug builds (a version byte); no packet may
/// stop a relay.
///
/// # Errors
///
/// [`PeelError`].
pub fn peel(
    key: &SphinxKey,
    bytes: &[u8],
    seen: impl FnOnce(&[u8; TAG_LEN]) -> bool,
) -> Result<Peeled, PeelError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        peel_inner(key, bytes, seen)
    }))
    .unwrap_or_else(|_| Err(PeelError::Invalid("sphinx-packet panicked".into())))
}

fn peel_inner(
    key: &SphinxKey,
    bytes: &[u8],
    seen: impl FnOnce(&[u8; TAG_LEN]) -> bool,
) -> Result<Peeled, PeelError> {
    let invalid = |e: sphinx_packet::Error| PeelError::Invalid(e.to_string());
    if bytes.len() != PACKET_LEN {
        return Err(PeelError::Invalid(format!(
            "{} bytes, not {PACKET_LEN}",
            bytes.len()
        )));
    }
    let packet = SphinxPacket::from_bytes(bytes).map_err(invalid)?;
    let secret = packet.header.compute_expanded_shared_secret(&key.secret);
    packet
        .header
        .ensure_header_integrity(&secret)
        .map_err(invalid)?;
    if seen(secret.replay_tag()) {
        return Err(PeelError::Replay);
    }
    let processed = packet
        .process_with_expanded_secret(&secret)
        .map_err(invalid)?;
    Ok(match processed.data {
        ProcessedPacketData::ForwardHop {
            next_hop_packet,
            next_hop_address,
            ..
        } => Peeled::Forward {
            next: Ed25519Identity::new(next_hop_address.to_bytes()),
            packet: next_hop_packet.to_bytes(),
        },
        ProcessedPacketData::FinalHop {
            destination,
            identifier,
            payload,
        } => Peeled::Final {
            destination: destination.as_bytes(),
            id: identifier,
            payload: payload.into_bytes(),
        },
    })
}

/// A forward packet's message, at the exit it was for.
///
/// # Errors
///
/// [`Error::Sphinx`] if the payload was changed on the way.
pub fn open_forward(payload: Vec<u8>) -> Result<Vec<u8>, Error> {
    Payload::from_bytes(&payload)
        .and_then(Payload::recover_plaintext)
        .map_err(sphinx_err("opening a packet"))
}

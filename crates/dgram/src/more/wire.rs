//! MORE's two formats (`docs/datagram.md` section 6): the messages a
//! datagram link carries for it beside cells, and the end-to-end messages
//! inside a Sphinx payload. Pure parsing, fuzzed by
//! `fuzz/fuzz_targets/dgram_more.rs`.
//!
//! Link messages never have a cell's length (529) or a heartbeat's (1),
//! which is how a link tells them apart:
//!
//! ```text
//! PACKET      1 | Sphinx packet (1176)                     1177 bytes
//! DELIVER     2 | SURB id (16) | reply payload (828)        845 bytes
//! REGISTER    3 | mailbox (32)                              33 bytes
//! REGISTERED  4 | mailbox (32)                              33 bytes
//! ```
//!
//! End-to-end messages (at most [`MESSAGE_LEN`] bytes):
//!
//! ```text
//! FORWARD  1 | set (16) | probe (1 bit) n (7 bits, 0-2) | n SURBs (396 each) | one TORTP segment (the rest, maybe none)
//! REPLY    2 | SURBs the exit holds (2) | { length (2) | TORTP segment } 0 to 2 times
//! ```
//!
//! A FORWARD with the probe bit asks for a REPLY even without segments:
//! the client's check that the exit is alive when nothing comes.

use super::sphinx::{MAILBOX_LEN, MESSAGE_LEN, PACKET_LEN, PAYLOAD_LEN, SURB_ID_LEN, SURB_LEN};
use crate::WireError;

/// Bytes of a MORE set's identifier (secret between client and exit).
pub const SET_ID_LEN: usize = 16;
/// SURBs in one FORWARD message at most.
pub const MAX_SURBS: usize = 2;
/// The largest TORTP segment a FORWARD message carries beside one SURB:
/// the end-to-end TCP's `max_segment` for MORE sets.
pub const SEGMENT_LEN: usize = MESSAGE_LEN - FORWARD_HEADER - SURB_LEN;
/// Segments in one REPLY message at most.
pub const MAX_REPLY_SEGMENTS: usize = 2;

const FORWARD_HEADER: usize = 1 + SET_ID_LEN + 1;
const REPLY_HEADER: usize = 1 + 2;

const KIND_PACKET: u8 = 1;
const KIND_DELIVER: u8 = 2;
const KIND_REGISTER: u8 = 3;
const KIND_REGISTERED: u8 = 4;
const KIND_FORWARD: u8 = 1;
/// The probe bit of a FORWARD's count byte.
const PROBE: u8 = 0x80;
const KIND_REPLY: u8 = 2;

/// The longest MORE link message.
pub const LINK_MSG_MAX: usize = 1 + PACKET_LEN;

/// A MORE message on a datagram link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkMsg {
    /// A Sphinx packet for the receiving relay to peel.
    Packet(Vec<u8>),
    /// (Relay to client) a reply that reached the client's mailbox.
    Deliver {
        /// The SURB it came on.
        id: [u8; SURB_ID_LEN],
        /// Its payload, under the SURB's layers.
        payload: Vec<u8>,
    },
    /// (Client to relay) deliver replies for this mailbox on this link.
    Register([u8; MAILBOX_LEN]),
    /// (Relay to client) the mailbox is registered.
    Registered([u8; MAILBOX_LEN]),
}

impl LinkMsg {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            LinkMsg::Packet(p) => [&[KIND_PACKET][..], p].concat(),
            LinkMsg::Deliver { id, payload } => [&[KIND_DELIVER][..], id, payload].concat(),
            LinkMsg::Register(m) => [&[KIND_REGISTER][..], m].concat(),
            LinkMsg::Registered(m) => [&[KIND_REGISTERED][..], m].concat(),
        }
    }

    /// Parse a link message.
    ///
    /// # Errors
    ///
    /// An unknown kind, or a length other than the kind's.
    pub fn parse(bytes: &[u8]) -> Result<LinkMsg, WireError> {
        let (&kind, rest) = bytes.split_first().ok_or(WireError::Length {
            what: "MORE link message",
            got: 0,
        })?;
        let length = |what| WireError::Length {
            what,
            got: bytes.len(),
        };
        match kind {
            KIND_PACKET if rest.len() == PACKET_LEN => Ok(LinkMsg::Packet(rest.to_vec())),
            KIND_PACKET => Err(length("MORE packet")),
            KIND_DELIVER if rest.len() == SURB_ID_LEN + PAYLOAD_LEN => {
                let (id, payload) = rest.split_at(SURB_ID_LEN);
                Ok(LinkMsg::Deliver {
                    id: id.try_into().map_err(|_| length("MORE delivery"))?,
                    payload: payload.to_vec(),
                })
            }
            KIND_DELIVER => Err(length("MORE delivery")),
            KIND_REGISTER | KIND_REGISTERED => {
                let mailbox: [u8; MAILBOX_LEN] =
                    rest.try_into().map_err(|_| length("MORE mailbox"))?;
                Ok(if kind == KIND_REGISTER {
                    LinkMsg::Register(mailbox)
                } else {
                    LinkMsg::Registered(mailbox)
                })
            }
            other => Err(WireError::Command(other)),
        }
    }
}

/// An end-to-end MORE message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum E2eMsg {
    /// Client to exit.
    Forward {
        /// The set.
        set: [u8; SET_ID_LEN],
        /// Answer even with nothing to send.
        probe: bool,
        /// SURBs for the exit's replies.
        surbs: Vec<Vec<u8>>,
        /// A TORTP segment, or none (SURBs only).
        segment: Vec<u8>,
    },
    /// Exit to client, on a SURB.
    Reply {
        /// SURBs the exit still holds for the set after this one.
        stock: u16,
        /// TORTP segments.
        segments: Vec<Vec<u8>>,
    },
}

impl E2eMsg {
    /// The message's bytes.
    ///
    /// # Errors
    ///
    /// [`WireError::Length`] if it does not fit [`MESSAGE_LEN`], holds
    /// more than [`MAX_SURBS`] SURBs or [`MAX_REPLY_SEGMENTS`] segments,
    /// or a SURB of the wrong length.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let out = match self {
            E2eMsg::Forward {
                set,
                probe,
                surbs,
                segment,
            } => {
                if surbs.len() > MAX_SURBS || surbs.iter().any(|s| s.len() != SURB_LEN) {
                    return Err(WireError::Length {
                        what: "MORE SURBs",
                        got: surbs.iter().map(Vec::len).sum(),
                    });
                }
                let mut out = vec![KIND_FORWARD];
                out.extend_from_slice(set);
                out.push(surbs.len() as u8 | if *probe { PROBE } else { 0 });
                for s in surbs {
                    out.extend_from_slice(s);
                }
                out.extend_from_slice(segment);
                out
            }
            E2eMsg::Reply { stock, segments } => {
                if segments.len() > MAX_REPLY_SEGMENTS {
                    return Err(WireError::Length {
                        what: "MORE reply segments",
                        got: segments.len(),
                    });
                }
                let mut out = vec![KIND_REPLY];
                out.extend_from_slice(&stock.to_be_bytes());
                for s in segments {
                    let len = u16::try_from(s.len()).map_err(|_| WireError::Length {
                        what: "MORE reply segment",
                        got: s.len(),
                    })?;
                    out.extend_from_slice(&len.to_be_bytes());
                    out.extend_from_slice(s);
                }
                out
            }
        };
        if out.len() > MESSAGE_LEN {
            return Err(WireError::Length {
                what: "MORE message",
                got: out.len(),
            });
        }
        Ok(out)
    }

    /// Parse an end-to-end message.
    ///
    /// # Errors
    ///
    /// An unknown kind, a message over [`MESSAGE_LEN`], too many SURBs,
    /// or lengths that do not add up.
    pub fn parse(bytes: &[u8]) -> Result<E2eMsg, WireError> {
        let length = |what| WireError::Length {
            what,
            got: bytes.len(),
        };
        if bytes.len() > MESSAGE_LEN {
            return Err(length("MORE message"));
        }
        let (&kind, rest) = bytes.split_first().ok_or(length("MORE message"))?;
        match kind {
            KIND_FORWARD => {
                if bytes.len() < FORWARD_HEADER {
                    return Err(length("MORE forward message"));
                }
                let set: [u8; SET_ID_LEN] = rest[..SET_ID_LEN]
                    .try_into()
                    .map_err(|_| length("MORE forward message"))?;
                let probe = rest[SET_ID_LEN] & PROBE != 0;
                let n = usize::from(rest[SET_ID_LEN] & !PROBE);
                let body = &rest[SET_ID_LEN + 1..];
                if n > MAX_SURBS || body.len() < n * SURB_LEN {
                    return Err(length("MORE SURBs"));
                }
                let (surbs, segment) = body.split_at(n * SURB_LEN);
                Ok(E2eMsg::Forward {
                    set,
                    probe,
                    surbs: surbs.chunks(SURB_LEN).map(<[u8]>::to_vec).collect(),
                    segment: segment.to_vec(),
                })
            }
            KIND_REPLY => {
                if bytes.len() < REPLY_HEADER {
                    return Err(length("MORE reply"));
                }
                let stock = u16::from_be_bytes([rest[0], rest[1]]);
                let mut body = &rest[2..];
                let mut segments = Vec::new();
                while !body.is_empty() {
                    if segments.len() == MAX_REPLY_SEGMENTS || body.len() < 2 {
                        return Err(length("MORE reply"));
                    }
                    let len = usize::from(u16::from_be_bytes([body[0], body[1]]));
                    let seg = body.get(2..2 + len).ok_or(length("MORE reply segment"))?;
                    segments.push(seg.to_vec());
                    body = &body[2 + len..];
                }
                Ok(E2eMsg::Reply { stock, segments })
            }
            other => Err(WireError::Command(other)),
        }
    }
}

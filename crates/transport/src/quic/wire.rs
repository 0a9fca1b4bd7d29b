//! The pure parsing behind the QUIC transport's reads: connection
//! preambles and lane headers (a lane's cells are the lane framework's,
//! `crate::lanes::wire`). The stream tasks in [`super`] and
//! [`super::lanes`] read bytes and call these; the fuzz targets reach them
//! through [`super::fuzzing`].

use super::{Mode, LANE_MAGIC, LINK_MAGIC, TOKEN_LEN};
use crate::WireError;

/// Length of the accepting side's answer to a link preamble: `OLQ1` and
/// its link token.
pub const LINK_ANSWER_LEN: usize = 4 + TOKEN_LEN;

/// What the first stream of a connection a relay accepted starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preamble {
    /// `OLQ1`, mode byte, token: a link.
    Link {
        /// How the opener maps circuits onto QUIC.
        mode: Mode,
        /// The opener's link token.
        peer_token: [u8; TOKEN_LEN],
    },
    /// `OLQL`, token, circuit ID: a lane connection (conn-per-circuit).
    Lane {
        /// The receiver's link token, naming the link the lane belongs to.
        token: [u8; TOKEN_LEN],
        /// The lane's circuit (never 0).
        circ_id: u32,
    },
}

/// The length of the preamble that starts with `magic`, magic included;
/// `None` for an unknown magic (the connection is refused after 4 bytes).
pub fn preamble_len(magic: &[u8; 4]) -> Option<usize> {
    if magic == LINK_MAGIC {
        Some(4 + 1 + TOKEN_LEN)
    } else if magic == LANE_MAGIC {
        Some(4 + TOKEN_LEN + 4)
    } else {
        None
    }
}

/// Parse a whole preamble (`preamble_len` bytes).
///
/// # Errors
///
/// What is wrong: an unknown magic or mode, a wrong length, or a lane for
/// circuit ID 0.
pub fn parse_preamble(bytes: &[u8]) -> Result<Preamble, WireError> {
    let magic: &[u8; 4] =
        bytes
            .get(..4)
            .and_then(|m| m.try_into().ok())
            .ok_or(WireError::Short {
                what: "QUIC preamble",
            })?;
    let len = preamble_len(magic).ok_or(WireError::BadMagic {
        what: "QUIC preamble",
    })?;
    if bytes.len() != len {
        return Err(WireError::Length {
            what: "QUIC preamble",
            got: bytes.len(),
            want: len,
        });
    }
    let mut token = [0u8; TOKEN_LEN];
    if magic == LINK_MAGIC {
        let mode = Mode::from_byte(bytes[4]).ok_or(WireError::UnknownMode {
            what: "QUIC",
            mode: bytes[4],
        })?;
        token.copy_from_slice(&bytes[5..]);
        return Ok(Preamble::Link {
            mode,
            peer_token: token,
        });
    }
    token.copy_from_slice(&bytes[4..4 + TOKEN_LEN]);
    let mut id = [0u8; 4];
    id.copy_from_slice(&bytes[4 + TOKEN_LEN..]);
    let circ_id = lane_circ_id(id)?;
    Ok(Preamble::Lane { token, circ_id })
}

/// The accepting side's answer to a link preamble
/// ([`LINK_ANSWER_LEN`] bytes): its link token.
///
/// # Errors
///
/// A wrong length or magic.
pub fn parse_link_answer(answer: &[u8]) -> Result<[u8; TOKEN_LEN], WireError> {
    if answer.len() != LINK_ANSWER_LEN || &answer[..4] != LINK_MAGIC {
        return Err(WireError::BadMagic {
            what: "QUIC link answer",
        });
    }
    let mut token = [0u8; TOKEN_LEN];
    token.copy_from_slice(&answer[4..]);
    Ok(token)
}

/// The circuit ID of a lane's 4-byte header.
///
/// # Errors
///
/// Circuit ID 0, which has no lane.
pub fn lane_circ_id(header: [u8; 4]) -> Result<u32, WireError> {
    match u32::from_be_bytes(header) {
        0 => Err(WireError::ZeroCircuit),
        id => Ok(id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane_preamble(circ_id: u32) -> Vec<u8> {
        let mut p = LANE_MAGIC.to_vec();
        p.extend_from_slice(&[7; TOKEN_LEN]);
        p.extend_from_slice(&circ_id.to_be_bytes());
        p
    }

    #[test]
    fn preambles() {
        let mut link = LINK_MAGIC.to_vec();
        link.push(1);
        link.extend_from_slice(&[9; TOKEN_LEN]);
        assert_eq!(preamble_len(LINK_MAGIC), Some(link.len()));
        assert_eq!(
            parse_preamble(&link),
            Ok(Preamble::Link {
                mode: Mode::ConnPerCircuit,
                peer_token: [9; TOKEN_LEN]
            })
        );
        link[4] = 2;
        assert!(parse_preamble(&link).is_err());
        assert_eq!(
            parse_preamble(&lane_preamble(5)),
            Ok(Preamble::Lane {
                token: [7; TOKEN_LEN],
                circ_id: 5
            })
        );
        assert_eq!(preamble_len(b"OLQ2"), None);
        assert!(parse_preamble(b"OLQ2").is_err());
        assert!(parse_preamble(&lane_preamble(5)[..23]).is_err());
        assert!(parse_preamble(b"").is_err());
    }

    /// A lane connection for circuit ID 0 was accepted (only lane headers
    /// on a link's connection refused it): its clean end then closed the
    /// link's control lane (ID 0). Found by restating the rule in the
    /// `quic_preamble` fuzz target.
    #[test]
    fn lane_connection_for_circuit_zero_is_refused() {
        assert_eq!(
            parse_preamble(&lane_preamble(0)),
            Err(WireError::ZeroCircuit)
        );
        assert!(lane_circ_id([0; 4]).is_err());
        assert_eq!(lane_circ_id([0, 0, 0, 1]), Ok(1));
    }
}

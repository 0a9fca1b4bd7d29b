//! The pure parsing behind lanes, for every lane transport: a lane's
//! cells (the lane readers, [`super::recv`], hand over what their streams
//! delivered and call these), and the preamble a byte-stream lane starts
//! with (pctcp's TLS connections and dtls-utcp's user-space TCP lanes:
//! `OLTL`, the link token, the circuit ID, the lane's number and the
//! number of the previous lane for that circuit, big-endian). The fuzz
//! targets reach the preamble through [`crate::tcp_share::fuzzing`].

use std::net::SocketAddr;

use bytes::BytesMut;
use onionlab_cell::chan::{AnyChanCell, AnyChanMsg, ChanMsg};
use onionlab_cell::codec::CellCodec;

use crate::tcp_share::wire::TOKEN_LEN;
use crate::{Error, WireError};

/// The next cell of the lane of `circ_id` from `buf`, what its stream
/// delivered and was not decoded yet: `Ok(None)` (nothing consumed) if
/// `buf` holds no whole cell.
///
/// # Errors
///
/// [`Error::Cell`] for bytes the codec refuses; [`Error::Protocol`] for a
/// cell of another circuit or a link-level cell (VERSIONS, NETINFO, CERTS,
/// AUTH_CHALLENGE, AUTHENTICATE, PADDING, VPADDING), which a lane may not
/// carry.
pub fn next_lane_cell(
    codec: &mut CellCodec,
    circ_id: u32,
    buf: &mut BytesMut,
    peer: SocketAddr,
) -> Result<Option<AnyChanCell>, Error> {
    let cell = match codec.decode(buf) {
        Ok(Some(cell)) => cell,
        Ok(None) => return Ok(None),
        Err(source) => return Err(Error::Cell { peer, source }),
    };
    if cell.circid().map(u32::from) != Some(circ_id) {
        return Err(Error::Protocol {
            peer,
            detail: format!(
                "{} cell for circuit {:?} on the lane of circuit {circ_id}",
                cell.msg().cmd(),
                cell.circid().map(u32::from)
            ),
        });
    }
    match cell.msg() {
        AnyChanMsg::Versions(_)
        | AnyChanMsg::Netinfo(_)
        | AnyChanMsg::Certs(_)
        | AnyChanMsg::AuthChallenge(_)
        | AnyChanMsg::Authenticate(_)
        | AnyChanMsg::Padding(_)
        | AnyChanMsg::Vpadding(_) => Err(Error::Protocol {
            peer,
            detail: format!("{} cell on a circuit lane", cell.msg().cmd()),
        }),
        _ => Ok(Some(cell)),
    }
}

/// The end of the stream of the lane of `circ_id`, with `buffered` bytes
/// not decoded.
///
/// # Errors
///
/// [`Error::Protocol`] unless the stream ended on a cell boundary.
pub fn lane_end(circ_id: u32, buffered: usize, peer: SocketAddr) -> Result<(), Error> {
    if buffered == 0 {
        Ok(())
    } else {
        Err(Error::Protocol {
            peer,
            detail: format!("lane {circ_id} ended inside a cell ({buffered} bytes)"),
        })
    }
}

/// Magic of a lane preamble.
pub const LANE_MAGIC: &[u8; 4] = b"OLTL";
/// Length of a lane preamble: magic, token, circuit ID, sequence number,
/// previous sequence number.
pub const LANE_PREAMBLE_LEN: usize = 4 + TOKEN_LEN + 4 + 8 + 8;
/// A lane's header: which link, which circuit, and its place among the
/// lanes the opener opened for that circuit ID (numbered lanes; a
/// transport whose peer takes lanes in the order they were opened writes
/// the circuit ID only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneHeader {
    /// The receiver's link token.
    pub token: [u8; TOKEN_LEN],
    /// The lane's circuit (never 0).
    pub circ_id: u32,
    /// The lane's number among those its opener opened on this link
    /// (from 1).
    pub seq: u64,
    /// The number of the opener's previous lane for the same circuit ID
    /// (0: none); the receiver reads this lane only after that one ended.
    pub prev: u64,
}

/// Encode the preamble a byte-stream lane starts with.
pub fn encode_lane_preamble(p: &LaneHeader) -> Vec<u8> {
    let mut out = LANE_MAGIC.to_vec();
    out.extend_from_slice(&p.token);
    out.extend_from_slice(&p.circ_id.to_be_bytes());
    out.extend_from_slice(&p.seq.to_be_bytes());
    out.extend_from_slice(&p.prev.to_be_bytes());
    out
}

/// Parse a whole lane preamble ([`LANE_PREAMBLE_LEN`] bytes).
///
/// # Errors
///
/// A wrong magic or length, circuit ID 0, sequence number 0, or a
/// previous lane that is not earlier.
pub fn parse_lane_preamble(bytes: &[u8]) -> Result<LaneHeader, WireError> {
    if bytes.len() != LANE_PREAMBLE_LEN || &bytes[..4] != LANE_MAGIC {
        return Err(WireError::BadMagic {
            what: "TCP lane preamble",
        });
    }
    let mut token = [0; TOKEN_LEN];
    token.copy_from_slice(&bytes[4..4 + TOKEN_LEN]);
    let rest = &bytes[4 + TOKEN_LEN..];
    // The length was checked above: these slices have their sizes.
    let short = |_| WireError::Short {
        what: "TCP lane preamble",
    };
    let circ_id = u32::from_be_bytes(rest[..4].try_into().map_err(short)?);
    let seq = u64::from_be_bytes(rest[4..12].try_into().map_err(short)?);
    let prev = u64::from_be_bytes(rest[12..20].try_into().map_err(short)?);
    if circ_id == 0 {
        return Err(WireError::ZeroCircuit);
    }
    if seq == 0 || prev >= seq {
        return Err(WireError::LaneOrder { seq, prev });
    }
    Ok(LaneHeader {
        token,
        circ_id,
        seq,
        prev,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_preambles_round_trip_and_refuse_bad_numbers() {
        let p = LaneHeader {
            token: [5; TOKEN_LEN],
            circ_id: 0x8000_0001,
            seq: 7,
            prev: 3,
        };
        let bytes = encode_lane_preamble(&p);
        assert_eq!(bytes.len(), LANE_PREAMBLE_LEN);
        assert_eq!(parse_lane_preamble(&bytes), Ok(p));
        for bad in [
            LaneHeader { circ_id: 0, ..p },
            LaneHeader {
                seq: 0,
                prev: 0,
                ..p
            },
            LaneHeader { prev: 7, ..p },
        ] {
            assert!(parse_lane_preamble(&encode_lane_preamble(&bad)).is_err());
        }
    }
}

//! The pure parsing behind pctcp's lanes: the preamble a lane connection
//! starts with after TLS. The connection tasks in [`super`] read bytes and
//! call these; the fuzz target reaches them through
//! [`crate::tcp_share::fuzzing`].
//! The layout is in the docs of [`super`]; the link preamble is the shared
//! TCP endpoint's ([`crate::tcp_share::wire`]).

use crate::tcp_share::wire::TOKEN_LEN;
use crate::WireError;

/// Magic of a lane preamble.
pub const LANE_MAGIC: &[u8; 4] = b"OLTL";
/// Length of a lane preamble: magic, token, circuit ID, sequence number,
/// previous sequence number.
pub const LANE_PREAMBLE_LEN: usize = 4 + TOKEN_LEN + 4 + 8 + 8;
/// Mode byte of a pctcp link.
pub const MODE_PCTCP: u8 = 1;

/// A lane preamble: which link, which circuit, and its place among the
/// lanes the opener opened for that circuit ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LanePreamble {
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

/// Encode a lane preamble.
pub fn encode_lane_preamble(p: &LanePreamble) -> Vec<u8> {
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
pub fn parse_lane_preamble(bytes: &[u8]) -> Result<LanePreamble, WireError> {
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
    Ok(LanePreamble {
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
        let p = LanePreamble {
            token: [5; TOKEN_LEN],
            circ_id: 0x8000_0001,
            seq: 7,
            prev: 3,
        };
        let bytes = encode_lane_preamble(&p);
        assert_eq!(bytes.len(), LANE_PREAMBLE_LEN);
        assert_eq!(parse_lane_preamble(&bytes), Ok(p));
        for bad in [
            LanePreamble { circ_id: 0, ..p },
            LanePreamble {
                seq: 0,
                prev: 0,
                ..p
            },
            LanePreamble { prev: 7, ..p },
        ] {
            assert!(parse_lane_preamble(&encode_lane_preamble(&bad)).is_err());
        }
    }
}

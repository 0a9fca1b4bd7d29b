//! The pure parsing behind the TCP-lane transports' reads (pctcp): what
//! follows the TLS handshake on a connection. The connection tasks in
//! [`super`] read bytes and call these; the fuzz target reaches them
//! through [`super::fuzzing`]. The layout is in the docs of [`super`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::WireError;

/// Magic of a link preamble and of its answer.
pub const LINK_MAGIC: &[u8; 4] = b"OLT1";
/// Magic of a lane preamble.
pub const LANE_MAGIC: &[u8; 4] = b"OLTL";
/// Length of a link token.
pub const TOKEN_LEN: usize = 16;
/// Length of the accepting side's answer to a link preamble: `OLT1` and
/// its link token.
pub const LINK_ANSWER_LEN: usize = 4 + TOKEN_LEN;
/// Length of a lane preamble: magic, token, circuit ID, sequence number,
/// previous sequence number.
pub const LANE_PREAMBLE_LEN: usize = 4 + TOKEN_LEN + 4 + 8 + 8;
/// Mode byte of a pctcp link.
pub const MODE_PCTCP: u8 = 1;
/// Mode byte of a torchestra link.
pub const MODE_TORCHESTRA: u8 = 2;
/// Magic of a torchestra link's heavy connection.
pub const HEAVY_MAGIC: &[u8; 4] = b"OLTH";
/// Length of a heavy connection's preamble: magic and the receiver's token.
pub const HEAVY_PREAMBLE_LEN: usize = 4 + TOKEN_LEN;
/// Length of the answer to a torchestra link preamble: `OLT1`, the token
/// and a flags byte.
pub const FLAGGED_ANSWER_LEN: usize = LINK_ANSWER_LEN + 1;
/// Answer flag: the acceptor switches circuits (torchestra).
pub const FLAG_SWITCHES: u8 = 1;

/// What a connection a relay accepted starts with, after TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Anything else: a plain `tls` link's VERSIONS cell (its first
    /// bytes stay for the link handshake).
    Plain,
    /// `OLT1`: a link with lanes; [`link_preamble_len`] bytes in all.
    Link,
    /// `OLTL`: a lane of an existing link; [`LANE_PREAMBLE_LEN`] bytes.
    Lane,
    /// `OLTH`: the heavy connection of a torchestra link;
    /// [`HEAVY_PREAMBLE_LEN`] bytes.
    Heavy,
}

/// Classify a connection by its first 4 bytes. A VERSIONS cell starts
/// with a zero circuit ID, so it cannot be mistaken for a magic.
pub fn classify(first: &[u8; 4]) -> Start {
    if first == LINK_MAGIC {
        Start::Link
    } else if first == LANE_MAGIC {
        Start::Lane
    } else if first == HEAVY_MAGIC {
        Start::Heavy
    } else {
        Start::Plain
    }
}

/// A link preamble: the opener's mode, token and lane address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkPreamble {
    /// Which transport ([`MODE_PCTCP`], [`MODE_TORCHESTRA`]).
    pub mode: u8,
    /// The opener's link token (lanes to the opener carry it).
    pub token: [u8; TOKEN_LEN],
    /// Where the opener accepts lanes (a relay's TCP listener); `None`
    /// for a client, which accepts none.
    pub lanes_at: Option<SocketAddr>,
}

/// The length of a link preamble, magic included, given its first 22
/// bytes (magic, mode, token, address family); `None` for an unknown
/// family.
pub fn link_preamble_len(family: u8) -> Option<usize> {
    let base = 4 + 1 + TOKEN_LEN + 1;
    match family {
        0 => Some(base),
        4 => Some(base + 4 + 2),
        6 => Some(base + 16 + 2),
        _ => None,
    }
}

/// Offset of the address family byte in a link preamble.
pub const FAMILY_OFFSET: usize = 4 + 1 + TOKEN_LEN;

/// Encode a link preamble.
pub fn encode_link_preamble(p: &LinkPreamble) -> Vec<u8> {
    let mut out = LINK_MAGIC.to_vec();
    out.push(p.mode);
    out.extend_from_slice(&p.token);
    match p.lanes_at {
        None => out.push(0),
        Some(SocketAddr::V4(a)) => {
            out.push(4);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_be_bytes());
        }
        Some(SocketAddr::V6(a)) => {
            out.push(6);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_be_bytes());
        }
    }
    out
}

/// Parse a whole link preamble.
///
/// # Errors
///
/// What is wrong: magic, mode, family, length, or a lane address that
/// cannot be connected to (unspecified address, port 0).
pub fn parse_link_preamble(bytes: &[u8]) -> Result<LinkPreamble, WireError> {
    if bytes.get(..4) != Some(&LINK_MAGIC[..]) {
        return Err(WireError::BadMagic {
            what: "TCP link preamble",
        });
    }
    let family = *bytes.get(FAMILY_OFFSET).ok_or(WireError::Short {
        what: "TCP link preamble",
    })?;
    let len = link_preamble_len(family).ok_or(WireError::UnknownFamily(family))?;
    if bytes.len() != len {
        return Err(WireError::Length {
            what: "TCP link preamble",
            got: bytes.len(),
            want: len,
        });
    }
    let mode = bytes[4];
    if mode != MODE_PCTCP && mode != MODE_TORCHESTRA {
        return Err(WireError::UnknownMode { what: "TCP", mode });
    }
    let mut token = [0; TOKEN_LEN];
    token.copy_from_slice(&bytes[5..5 + TOKEN_LEN]);
    let addr = &bytes[FAMILY_OFFSET + 1..];
    let lanes_at = match family {
        0 => None,
        _ => {
            let (ip, port) = addr.split_at(addr.len() - 2);
            let ip = match <[u8; 4]>::try_from(ip) {
                Ok(v4) => IpAddr::V4(Ipv4Addr::from(v4)),
                Err(_) => {
                    // The family fixed the length: 16 bytes.
                    let v6: [u8; 16] = ip
                        .try_into()
                        .map_err(|_| WireError::UnknownFamily(family))?;
                    IpAddr::V6(Ipv6Addr::from(v6))
                }
            };
            let port = u16::from_be_bytes([port[0], port[1]]);
            if ip.is_unspecified() || port == 0 {
                return Err(WireError::Unreachable(SocketAddr::new(ip, port)));
            }
            Some(SocketAddr::new(ip, port))
        }
    };
    Ok(LinkPreamble {
        mode,
        token,
        lanes_at,
    })
}

/// Encode the answer to a link preamble.
pub fn encode_link_answer(token: &[u8; TOKEN_LEN]) -> Vec<u8> {
    let mut out = LINK_MAGIC.to_vec();
    out.extend_from_slice(token);
    out
}

/// Parse the answer to our link preamble ([`LINK_ANSWER_LEN`] bytes).
///
/// # Errors
///
/// A wrong length or magic.
pub fn parse_link_answer(answer: &[u8]) -> Result<[u8; TOKEN_LEN], WireError> {
    if answer.len() != LINK_ANSWER_LEN || &answer[..4] != LINK_MAGIC {
        return Err(WireError::BadMagic {
            what: "TCP link answer",
        });
    }
    let mut token = [0; TOKEN_LEN];
    token.copy_from_slice(&answer[4..]);
    Ok(token)
}

/// Encode the answer to a torchestra link preamble, with `flags`.
pub fn encode_flagged_answer(token: &[u8; TOKEN_LEN], flags: u8) -> Vec<u8> {
    let mut out = encode_link_answer(token);
    out.push(flags);
    out
}

/// Parse the answer to our torchestra link preamble
/// ([`FLAGGED_ANSWER_LEN`] bytes): the token and the flags.
///
/// # Errors
///
/// A wrong length or magic, or unknown flags.
pub fn parse_flagged_answer(answer: &[u8]) -> Result<([u8; TOKEN_LEN], u8), WireError> {
    let what = "torchestra link answer";
    let (&flags, rest) = answer.split_last().ok_or(WireError::Short { what })?;
    if answer.len() != FLAGGED_ANSWER_LEN {
        return Err(WireError::Length {
            what,
            got: answer.len(),
            want: FLAGGED_ANSWER_LEN,
        });
    }
    if flags & !FLAG_SWITCHES != 0 {
        return Err(WireError::UnknownFlags(flags));
    }
    Ok((parse_link_answer(rest)?, flags))
}

/// Encode a heavy connection's preamble.
pub fn encode_heavy_preamble(token: &[u8; TOKEN_LEN]) -> Vec<u8> {
    let mut out = HEAVY_MAGIC.to_vec();
    out.extend_from_slice(token);
    out
}

/// Parse a heavy connection's preamble: the receiver's link token.
///
/// # Errors
///
/// A wrong length or magic.
pub fn parse_heavy_preamble(bytes: &[u8]) -> Result<[u8; TOKEN_LEN], WireError> {
    if bytes.len() != HEAVY_PREAMBLE_LEN || &bytes[..4] != HEAVY_MAGIC {
        return Err(WireError::BadMagic {
            what: "heavy connection preamble",
        });
    }
    let mut token = [0; TOKEN_LEN];
    token.copy_from_slice(&bytes[4..]);
    Ok(token)
}

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
    fn link_preambles_round_trip() {
        for lanes_at in [
            None,
            Some("10.0.0.1:9001".parse().unwrap()),
            Some("[2001:db8::1]:443".parse().unwrap()),
        ] {
            let p = LinkPreamble {
                mode: MODE_PCTCP,
                token: [3; TOKEN_LEN],
                lanes_at,
            };
            let bytes = encode_link_preamble(&p);
            assert_eq!(link_preamble_len(bytes[FAMILY_OFFSET]), Some(bytes.len()));
            assert_eq!(parse_link_preamble(&bytes), Ok(p));
            assert!(parse_link_preamble(&bytes[..bytes.len() - 1]).is_err());
            let mut bad = bytes.clone();
            bad[4] = 9;
            assert!(parse_link_preamble(&bad).is_err());
        }
        let unreachable = encode_link_preamble(&LinkPreamble {
            mode: MODE_PCTCP,
            token: [0; TOKEN_LEN],
            lanes_at: Some("0.0.0.0:9001".parse().unwrap()),
        });
        assert!(parse_link_preamble(&unreachable).is_err());
        assert_eq!(classify(b"OLT1"), Start::Link);
        assert_eq!(classify(b"OLTL"), Start::Lane);
        // VERSIONS: circuit ID 0, command 7.
        assert_eq!(classify(&[0, 0, 7, 0]), Start::Plain);
    }

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
        assert_eq!(
            parse_link_answer(&encode_link_answer(&[1; TOKEN_LEN])),
            Ok([1; TOKEN_LEN])
        );
        assert!(parse_link_answer(b"OLT1").is_err());
    }
}

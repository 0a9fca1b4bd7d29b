//! The pure parsing of what opens a link on the shared TCP endpoint
//! after TLS, for the transports that register a mode on it (pctcp,
//! torchestra): the link preamble, `OLT1`, the opener's mode byte, its
//! link token and where it accepts more connections; and the answer,
//! `OLT1` and the acceptor's token. Connections joining a link (lanes,
//! heavy connections) have preambles of their own, in their transports'
//! `wire` modules. A plain `tls` link starts with a VERSIONS cell, whose
//! zero circuit ID no magic can be mistaken for.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::WireError;

/// Magic of a link preamble and of its answer.
pub const LINK_MAGIC: &[u8; 4] = b"OLT1";
/// Length of a link token.
pub const TOKEN_LEN: usize = 16;
/// Length of the accepting side's answer to a link preamble: `OLT1` and
/// its link token.
pub const LINK_ANSWER_LEN: usize = 4 + TOKEN_LEN;

/// A link preamble: the opener's mode, token and lane address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkPreamble {
    /// Which transport (the mode byte a transport registers on the
    /// shared acceptor).
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
/// What is wrong: magic, family, length, or a lane address that cannot
/// be connected to (unspecified address, port 0). The mode byte is not
/// checked here: the shared acceptor looks it up among the registered
/// transports.
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
    // Which transport takes it is the shared acceptor's question.
    let mode = bytes[4];
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
                mode: 1,
                token: [3; TOKEN_LEN],
                lanes_at,
            };
            let bytes = encode_link_preamble(&p);
            assert_eq!(link_preamble_len(bytes[FAMILY_OFFSET]), Some(bytes.len()));
            assert_eq!(parse_link_preamble(&bytes), Ok(p));
            assert!(parse_link_preamble(&bytes[..bytes.len() - 1]).is_err());
            let mut bad = bytes.clone();
            bad[FAMILY_OFFSET] = 9;
            assert!(parse_link_preamble(&bad).is_err());
        }
        let unreachable = encode_link_preamble(&LinkPreamble {
            mode: 1,
            token: [0; TOKEN_LEN],
            lanes_at: Some("0.0.0.0:9001".parse().unwrap()),
        });
        assert!(parse_link_preamble(&unreachable).is_err());
        assert_eq!(
            parse_link_answer(&encode_link_answer(&[1; TOKEN_LEN])),
            Ok([1; TOKEN_LEN])
        );
        assert!(parse_link_answer(b"OLT1").is_err());
    }
}

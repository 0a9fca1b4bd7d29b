//! The pure parsing of torchestra's own framing on the shared TCP
//! endpoint: the flagged answer to its link preamble and the preamble of
//! a link's heavy connection (`docs/torchestra.md`). The switch cells are
//! in [`super::switch`].

use crate::tcp_share::wire::{encode_link_answer, parse_link_answer, LINK_ANSWER_LEN, TOKEN_LEN};
use crate::WireError;

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

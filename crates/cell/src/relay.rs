//! Relay cell bodies: the 509 bytes inside RELAY and RELAY_EARLY cells.
//!
//! Layout (tor-spec "Relay cells", relay cell format V0, the one tor1 crypto uses):
//! `Command(1) | Recognized(2) | StreamID(2) | Digest(4) | Length(2) | Data(498)`.
//! A body is encoded with `Recognized` and `Digest` zero; the relay crypto then
//! fills `Digest` and encrypts. Decoding must only happen after the crypto has
//! recognized the cell.

use std::ops::Range;

use rand::{CryptoRng, Rng};
use tor_cell::relaycell::msg::AnyRelayMsg;
use tor_cell::relaycell::{AnyRelayMsgOuter, RelayCellFormat, RelayCmd, RelayMsg, StreamId};

pub use tor_cell::chancell::{BoxedCellBody, RawCellBody, CELL_DATA_LEN};

use crate::Error;

/// Byte range of the `Recognized` field.
pub const RECOGNIZED: Range<usize> = 1..3;
/// Byte range of the `Digest` field.
pub const DIGEST: Range<usize> = 5..9;
/// Most payload bytes one DATA message carries.
pub const MAX_DATA_LEN: usize = CELL_DATA_LEN - 11;

/// Encode a relay message into a fresh relay cell body (random padding after
/// the message, as tor-spec recommends).
///
/// Fails if the message does not fit in a cell, if `stream` is absent for
/// a stream command (BEGIN, DATA, END, CONNECTED, RESOLVE, RESOLVED, ...) or
/// present for a circuit command (EXTEND2, TRUNCATE, DROP, ...), or if a
/// BEGIN target address contains `[`, `]` or NUL (see [`decode`]).
pub fn encode<R: Rng + CryptoRng>(
    stream: Option<StreamId>,
    msg: AnyRelayMsg,
    rng: &mut R,
) -> Result<BoxedCellBody, Error> {
    check_stream_id(msg.cmd(), stream)?;
    if !begin_addr_ok(&msg) {
        return Err(Error::Encode {
            what: "BEGIN message",
            source: tor_cell::Error::BadStreamAddress,
        });
    }
    AnyRelayMsgOuter::new(stream, msg)
        .encode(RelayCellFormat::V0, rng)
        .map_err(|source| Error::Encode {
            what: "relay message",
            source,
        })
}

/// Decode a recognized relay cell body into its stream ID and message.
///
/// Like [`encode`], rejects a stream command with stream ID 0 and a circuit
/// command with a nonzero stream ID (tor-spec: such cells are dropped as a
/// protocol violation), and a BEGIN whose target address contains `[`, `]`
/// or NUL. (tor-cell strips one pair of brackets on decode and adds them on
/// encode only around addresses containing `:`, so `[[x]:80` would decode
/// to the address `[x`, which re-encodes as the unparseable `[x:80`.)
pub fn decode(body: BoxedCellBody) -> Result<(Option<StreamId>, AnyRelayMsg), Error> {
    let (stream, msg) = AnyRelayMsgOuter::decode_singleton(RelayCellFormat::V0, body)
        .map(AnyRelayMsgOuter::into_streamid_and_msg)
        .map_err(Error::BadRelayMsg)?;
    check_stream_id(msg.cmd(), stream)?;
    if !begin_addr_ok(&msg) {
        return Err(Error::BadRelayMsg(tor_bytes::Error::InvalidMessage(
            "bracket or NUL inside BEGIN target address".into(),
        )));
    }
    Ok((stream, msg))
}

/// Whether `addr` may be the target address of a BEGIN message: it must not
/// contain `[`, `]` or NUL. No hostname or IP literal does; give IPv6
/// literals without brackets (`::1`, not `[::1]`), the encoder adds them.
/// Check user-supplied targets with this before queueing a BEGIN:
/// [`encode`] refuses the others.
pub fn is_valid_begin_addr(addr: &[u8]) -> bool {
    !addr.iter().any(|c| matches!(c, b'[' | b']' | 0))
}

/// False for a BEGIN whose target address fails [`is_valid_begin_addr`].
fn begin_addr_ok(msg: &AnyRelayMsg) -> bool {
    match msg {
        AnyRelayMsg::Begin(begin) => is_valid_begin_addr(begin.addr()),
        _ => true,
    }
}

/// Whether `stream` is allowed with `cmd`: stream commands need one, circuit
/// commands must not have one; SENDME and unknown commands accept either.
fn check_stream_id(cmd: RelayCmd, stream: Option<StreamId>) -> Result<(), Error> {
    if cmd.accepts_streamid_val(stream) {
        Ok(())
    } else {
        Err(Error::BadStreamId {
            cmd,
            stream: StreamId::get_or_zero(stream),
        })
    }
}

/// The relay command of a recognized body, without decoding the rest.
pub fn peek_cmd(body: &RawCellBody) -> RelayCmd {
    RelayCmd::from(body[0])
}

//! What a QUIC lane's reader parses, fed arbitrary bytes: the preamble of a
//! QUIC connection (`OLQ1` + mode + token for a link, `OLQL` + token +
//! circuit ID for a lane connection), a lane's 4-byte circuit-ID header,
//! and then the lane's cells, decoded with `CellCodec` as the stream's
//! reads deliver them.
//!
//! The transport's own lane parsing (`lanes::recv::read_lane_cells`, the
//! preamble check in `quic::accept_one`) is private and runs on quinn
//! streams, so this target re-states its rules on the public pieces:
//! * circuit ID 0 has no lane; every cell on a lane must carry the lane's
//!   circuit ID; link-level cells (VERSIONS, NETINFO, CERTS, AUTH_*,
//!   PADDING, VPADDING) are violations on a lane;
//! * a stream ending inside a cell is a violation.
//!
//! Checked besides "no panic": decoding does not depend on where reads
//! split the stream (chunked decoding yields the same cells and the same
//! verdict as decoding it whole), `Ok(None)` consumes nothing, and what is
//! buffered after draining stays below one read chunk plus one cell.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use onionlab_cell::chan::AnyChanMsg;
use onionlab_cell::codec::CellCodec;

const LINK_MAGIC: &[u8; 4] = b"OLQ1";
const LANE_MAGIC: &[u8; 4] = b"OLQL";
const TOKEN_LEN: usize = 16;
/// Largest cell on the wire: 4-byte circuit ID, command, length, body.
const MAX_CELL: usize = 4 + 1 + 2 + u16::MAX as usize;

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Clean end of stream on a cell boundary.
    End,
    /// Still inside a cell when the input ran out.
    Truncated,
    /// The codec refused the bytes.
    BadCell,
    /// A cell the lane rules refuse.
    Violation,
}

/// The preamble of a connection's first stream, as `accept_one` reads it:
/// the bytes it takes and, for a lane connection, the circuit ID.
enum Preamble {
    Link { mode: u8 },
    Lane { circ_id: u32 },
    Bad,
}

fn preamble(data: &[u8]) -> Option<(Preamble, usize)> {
    let magic: &[u8; 4] = data.get(..4)?.try_into().ok()?;
    if magic == LINK_MAGIC {
        let rest = data.get(4..4 + 1 + TOKEN_LEN)?;
        let p = match rest[0] {
            0 | 1 => Preamble::Link { mode: rest[0] },
            _ => Preamble::Bad,
        };
        return Some((p, 4 + 1 + TOKEN_LEN));
    }
    if magic != LANE_MAGIC {
        return Some((Preamble::Bad, 4));
    }
    let rest = data.get(4..4 + TOKEN_LEN + 4)?;
    let id = u32::from_be_bytes(rest[TOKEN_LEN..].try_into().expect("4 bytes"));
    Some((Preamble::Lane { circ_id: id }, 4 + TOKEN_LEN + 4))
}

/// Decode a lane's cells from `stream`, delivered in reads of `chunk`
/// bytes (0: all at once), applying the lane rules. Returns the cells'
/// re-encodings and the verdict.
fn read_lane(link: u16, circ_id: u32, stream: &[u8], chunk: usize) -> (Vec<Vec<u8>>, Verdict) {
    let mut codec = CellCodec::new(link);
    let mut out_codec = CellCodec::new(link);
    let mut buf = BytesMut::new();
    let mut cells = Vec::new();
    let reads: Vec<&[u8]> = if chunk == 0 {
        vec![stream]
    } else {
        stream.chunks(chunk).collect()
    };
    for read in reads {
        buf.extend_from_slice(read);
        loop {
            let before = buf.len();
            let cell = match codec.decode(&mut buf) {
                Ok(Some(cell)) => {
                    assert!(buf.len() < before, "a cell consumed nothing");
                    cell
                }
                Ok(None) => {
                    assert_eq!(buf.len(), before, "Ok(None) consumed bytes");
                    break;
                }
                Err(_) => return (cells, Verdict::BadCell),
            };
            if cell.circid().map(u32::from) != Some(circ_id) {
                return (cells, Verdict::Violation);
            }
            match cell.msg() {
                AnyChanMsg::Versions(_)
                | AnyChanMsg::Netinfo(_)
                | AnyChanMsg::Certs(_)
                | AnyChanMsg::AuthChallenge(_)
                | AnyChanMsg::Authenticate(_)
                | AnyChanMsg::Padding(_)
                | AnyChanMsg::Vpadding(_) => return (cells, Verdict::Violation),
                _ => {}
            }
            let mut wire = BytesMut::new();
            out_codec
                .encode(cell, &mut wire)
                .expect("a decoded lane cell re-encodes");
            cells.push(wire.to_vec());
        }
        // Decoding drains whole cells: at most one partial cell is left.
        assert!(buf.len() < read.len().max(1) + MAX_CELL);
        assert!(
            buf.len() < MAX_CELL,
            "{} bytes left after draining",
            buf.len()
        );
    }
    let verdict = if buf.is_empty() {
        Verdict::End
    } else {
        Verdict::Truncated
    };
    (cells, verdict)
}

fuzz_target!(|data: &[u8]| {
    // First byte: set-up; the rest is what the peer sent on the stream.
    let Some((&setup, stream)) = data.split_first() else {
        return;
    };
    let link = if setup & 1 == 0 { 4 } else { 5 };
    let chunk = usize::from(setup >> 2) * 13;
    let (circ_id, cells) = if setup & 2 != 0 {
        // A connection's first stream: the preamble decides.
        match preamble(stream) {
            None | Some((Preamble::Bad, _)) => return,
            // A link's control stream goes to the link handshake
            // (fuzzed by link_handshake).
            Some((Preamble::Link { mode }, _)) => {
                assert!(mode <= 1);
                return;
            }
            Some((Preamble::Lane { circ_id }, n)) => (circ_id, &stream[n..]),
        }
    } else {
        // A stream the peer opened on a link: the 4-byte lane header.
        let Some(header) = stream.get(..4) else {
            return;
        };
        let id = u32::from_be_bytes(header.try_into().expect("4 bytes"));
        (id, &stream[4..])
    };
    if circ_id == 0 {
        // No lane for circuit ID 0: a violation before any cell.
        return;
    }
    let whole = read_lane(link, circ_id, cells, 0);
    let chunked = read_lane(link, circ_id, cells, chunk.max(1));
    assert_eq!(whole.1, chunked.1, "the verdict depends on read boundaries");
    assert_eq!(whole.0, chunked.0, "the cells depend on read boundaries");
    // Every cell takes at least a 5-byte (v4: 3-byte) header and the body.
    assert!(whole.0.len() <= cells.len() / 3);
});

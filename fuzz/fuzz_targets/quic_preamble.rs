//! What a QUIC peer sends before and on a circuit lane, parsed by the QUIC
//! transport's own functions (`onionlab_transport::quic::fuzzing`, the ones
//! `accept_one`, `connect_inner`, `read_lane_header` and `read_lane_cells`
//! call on quinn streams), with the reads emulated as those tasks do them.
//! Byte 0 chooses the link version (bit 0), what the rest is (bits 1-2)
//! and the read size for lane cells (bits 3-7):
//! * the first stream of an accepted connection: 4 bytes of magic, then
//!   `preamble_len` bytes in all, then `parse_preamble`; a lane
//!   connection's cells follow;
//! * a stream the peer opened on a link: a 4-byte lane header
//!   (`lane_circ_id`), then the lane's cells;
//! * the accepting side's answer to our link preamble
//!   (`parse_link_answer`).
//!
//! Lane cells are decoded with `next_lane_cell` as the reads deliver them
//! and the stream's end is judged by `lane_end`.
//!
//! Checked besides "no panic":
//! * a preamble is accepted exactly when the wire layout says: `OLQ1` with
//!   mode 0 or 1, or `OLQL` with a circuit ID other than 0; the token,
//!   mode and circuit ID are the bytes at their offsets; a preamble of the
//!   wrong length is refused; the answer is accepted exactly when it
//!   starts with `OLQ1`;
//! * a lane header of circuit ID 0 is refused, in both places a lane can
//!   start (the lane header and the lane-connection preamble);
//! * every cell handed out carries the lane's circuit ID and is no
//!   link-level cell, and re-encodes; `Ok(None)` consumes nothing, a cell
//!   consumes something; after draining, less than one maximal cell stays
//!   buffered;
//! * decoding in one read and in small reads gives the same cells and the
//!   same verdict (error message included).
#![no_main]

use std::net::SocketAddr;

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use onionlab_cell::chan::AnyChanMsg;
use onionlab_cell::codec::CellCodec;
use onionlab_transport::quic::fuzzing::{
    lane_circ_id, lane_end, next_lane_cell, parse_link_answer, parse_preamble, preamble_len,
    Preamble, LINK_ANSWER_LEN,
};
use onionlab_transport::quic::Mode;

/// Largest cell on the wire: 4-byte circuit ID, command, length, body.
const MAX_CELL: usize = 4 + 1 + 2 + u16::MAX as usize;
const TOKEN_LEN: usize = 16;

fn peer() -> SocketAddr {
    SocketAddr::from(([192, 0, 2, 1], 443))
}

/// Decode the cells of the lane of `circ_id` from `stream` delivered in
/// reads of `chunk` bytes; the cells' encodings and the verdict (`None`:
/// clean end; else the error message).
fn read_lane(
    link: u16,
    circ_id: u32,
    stream: &[u8],
    chunk: usize,
) -> (Vec<Vec<u8>>, Option<String>) {
    let mut codec = CellCodec::new(link);
    let mut out_codec = CellCodec::new(link);
    let mut buf = BytesMut::new();
    let mut cells = Vec::new();
    for read in stream.chunks(chunk.max(1)) {
        buf.extend_from_slice(read);
        loop {
            let before = buf.len();
            match next_lane_cell(&mut codec, circ_id, &mut buf, peer()) {
                Ok(Some(cell)) => {
                    assert!(buf.len() < before, "a cell consumed nothing");
                    assert_eq!(cell.circid().map(u32::from), Some(circ_id));
                    assert!(
                        !matches!(
                            cell.msg(),
                            AnyChanMsg::Versions(_)
                                | AnyChanMsg::Netinfo(_)
                                | AnyChanMsg::Certs(_)
                                | AnyChanMsg::AuthChallenge(_)
                                | AnyChanMsg::Authenticate(_)
                                | AnyChanMsg::Padding(_)
                                | AnyChanMsg::Vpadding(_)
                        ),
                        "link-level cell handed out on a lane"
                    );
                    let mut wire = BytesMut::new();
                    out_codec
                        .encode(cell, &mut wire)
                        .expect("a lane cell re-encodes");
                    cells.push(wire.to_vec());
                }
                Ok(None) => {
                    assert_eq!(buf.len(), before, "Ok(None) consumed bytes");
                    break;
                }
                Err(e) => return (cells, Some(e.to_string())),
            }
        }
        assert!(
            buf.len() < MAX_CELL,
            "{} bytes left after draining",
            buf.len()
        );
    }
    let end = lane_end(circ_id, buf.len(), peer())
        .err()
        .map(|e| e.to_string());
    assert_eq!(end.is_none(), buf.is_empty());
    (cells, end)
}

fn check_lane(link: u16, circ_id: u32, stream: &[u8], chunk: usize) {
    assert_ne!(circ_id, 0, "a lane for circuit ID 0 was accepted");
    let whole = read_lane(link, circ_id, stream, stream.len());
    let chunked = read_lane(link, circ_id, stream, chunk);
    assert_eq!(whole, chunked, "reads of {chunk} bytes change the outcome");
    // Every cell takes at least a 7-byte (v4: 5-byte) header.
    assert!(whole.0.len() <= stream.len() / 5);
}

fuzz_target!(|data: &[u8]| {
    let Some((&setup, stream)) = data.split_first() else {
        return;
    };
    let link = if setup & 1 == 0 { 4 } else { 5 };
    let chunk = usize::from(setup >> 3) * 7 + 1;
    match (setup >> 1) & 3 {
        // The first stream of an accepted connection.
        0 | 3 => {
            // A preamble of any other length is refused.
            for cut in [0, 3, 4, 20, 25] {
                if let Some(p) = stream.get(..cut) {
                    let ok = p.get(..4).and_then(|m| preamble_len(m.try_into().ok()?)) == Some(cut);
                    if !ok {
                        assert!(parse_preamble(p).is_err(), "{cut}-byte preamble accepted");
                    }
                }
            }
            let Some(magic) = stream.get(..4) else { return };
            let magic: [u8; 4] = magic.try_into().expect("4 bytes");
            let Some(len) = preamble_len(&magic) else {
                assert!(&magic != b"OLQ1" && &magic != b"OLQL");
                assert!(parse_preamble(&magic).is_err());
                return;
            };
            let Some(bytes) = stream.get(..len) else {
                return;
            };
            match parse_preamble(bytes) {
                Ok(Preamble::Link { mode, peer_token }) => {
                    assert_eq!(&magic, b"OLQ1");
                    let want = match bytes[4] {
                        0 => Mode::StreamPerCircuit,
                        1 => Mode::ConnPerCircuit,
                        b => panic!("mode byte {b} accepted"),
                    };
                    assert_eq!(mode, want);
                    assert_eq!(&peer_token[..], &bytes[5..5 + TOKEN_LEN]);
                    // The rest goes to the link handshake (link_handshake).
                }
                Ok(Preamble::Lane { token, circ_id }) => {
                    assert_eq!(&magic, b"OLQL");
                    assert_eq!(&token[..], &bytes[4..4 + TOKEN_LEN]);
                    let id: [u8; 4] = bytes[4 + TOKEN_LEN..].try_into().expect("4 bytes");
                    assert_eq!(circ_id, u32::from_be_bytes(id));
                    check_lane(link, circ_id, &stream[len..], chunk);
                }
                Err(why) => {
                    let id = bytes
                        .get(4 + TOKEN_LEN..)
                        .map(|b| b.iter().all(|&x| x == 0));
                    assert!(
                        (&magic == b"OLQ1" && bytes[4] > 1)
                            || (&magic == b"OLQL" && id == Some(true)),
                        "preamble refused: {why}"
                    );
                }
            }
        }
        // A stream the peer opened on a link.
        1 => {
            let Some(header) = stream.get(..4) else {
                return;
            };
            let header: [u8; 4] = header.try_into().expect("4 bytes");
            match lane_circ_id(header) {
                Ok(circ_id) => {
                    assert_eq!(circ_id, u32::from_be_bytes(header));
                    check_lane(link, circ_id, &stream[4..], chunk);
                }
                Err(_) => assert_eq!(header, [0; 4], "lane header refused"),
            }
        }
        // The answer to our link preamble.
        _ => {
            for cut in [0, 4, LINK_ANSWER_LEN - 1, LINK_ANSWER_LEN + 1] {
                if let Some(p) = stream.get(..cut) {
                    assert!(parse_link_answer(p).is_err(), "{cut}-byte answer accepted");
                }
            }
            let Some(answer) = stream.get(..LINK_ANSWER_LEN) else {
                return;
            };
            match parse_link_answer(answer) {
                Ok(token) => {
                    assert_eq!(&answer[..4], b"OLQ1");
                    assert_eq!(&token[..], &answer[4..]);
                }
                Err(_) => assert_ne!(&answer[..4], b"OLQ1"),
            }
        }
    }
});

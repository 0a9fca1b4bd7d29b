//! What a peer sends after TLS on the shared TCP endpoint, before a link
//! handshake or a joining connection's cells, parsed by the transports'
//! own functions (`onionlab_transport::tcp_share::fuzzing`, the ones the
//! shared acceptor, pctcp and torchestra call). Byte 0 chooses what the
//! rest is:
//! * even: an accepted connection's first bytes: `claims` on 4 bytes,
//!   then a link preamble (`OLT1`; its length from the family byte,
//!   `link_preamble_len`), a pctcp lane preamble (`OLTL`,
//!   `LANE_PREAMBLE_LEN`) or a torchestra heavy preamble (`OLTH`);
//! * odd: the answer to our link preamble (`parse_link_answer`).
//!
//! Checked besides "no panic":
//! * `claims` says yes exactly for `OLT1`, `OLTL` and `OLTH` (the magics
//!   pctcp and torchestra register), no for anything else (a `tls` link);
//! * a parsed link preamble re-encodes to the same bytes and its lane
//!   address is connectable (not unspecified, port not 0); one of any
//!   other length is refused;
//! * a parsed lane preamble re-encodes to the same bytes, its circuit ID
//!   is not 0, its number not 0 and its predecessor earlier;
//! * a parsed heavy preamble re-encodes to the same bytes;
//! * an answer is accepted exactly when it is `OLT1` and a 16-byte token.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onionlab_transport::tcp_share::fuzzing::{
    claims, encode_heavy_preamble, encode_lane_preamble, encode_link_preamble, link_preamble_len,
    parse_heavy_preamble, parse_lane_preamble, parse_link_answer, parse_link_preamble,
    FAMILY_OFFSET, HEAVY_PREAMBLE_LEN, LANE_PREAMBLE_LEN, LINK_ANSWER_LEN,
};

fuzz_target!(|data: &[u8]| {
    let Some((&setup, rest)) = data.split_first() else {
        return;
    };
    if setup & 1 == 1 {
        let ok = parse_link_answer(rest);
        let want = rest.len() == LINK_ANSWER_LEN && rest.starts_with(b"OLT1");
        assert_eq!(ok.is_ok(), want, "answer verdict");
        if let Ok(token) = ok {
            assert_eq!(&token[..], &rest[4..]);
        }
        return;
    }
    let Some(first) = rest.get(..4) else { return };
    let first: [u8; 4] = first.try_into().expect("4 bytes");
    let magic = matches!(&first, b"OLT1" | b"OLTL" | b"OLTH");
    assert_eq!(claims(&first), magic, "claimed {first:?}");
    match &first {
        b"OLTH" => {
            let Some(bytes) = rest.get(..HEAVY_PREAMBLE_LEN) else {
                assert!(parse_heavy_preamble(rest).is_err());
                return;
            };
            if let Ok(token) = parse_heavy_preamble(bytes) {
                assert_eq!(
                    encode_heavy_preamble(&token),
                    bytes,
                    "heavy preamble round trip"
                );
            }
        }
        b"OLT1" => {
            // The acceptor reads up to the family byte, then the rest.
            let Some(&family) = rest.get(FAMILY_OFFSET) else {
                return;
            };
            let Some(len) = link_preamble_len(family) else {
                assert!(parse_link_preamble(&rest[..FAMILY_OFFSET + 1]).is_err());
                return;
            };
            let Some(bytes) = rest.get(..len) else { return };
            if let Ok(p) = parse_link_preamble(bytes) {
                assert_eq!(encode_link_preamble(&p), bytes, "link preamble round trip");
                if let Some(a) = p.lanes_at {
                    assert!(!a.ip().is_unspecified() && a.port() != 0, "{a}");
                }
            }
            if rest.len() > len {
                assert!(parse_link_preamble(&rest[..len + 1]).is_err());
            }
        }
        b"OLTL" => {
            let Some(bytes) = rest.get(..LANE_PREAMBLE_LEN) else {
                assert!(parse_lane_preamble(rest).is_err());
                return;
            };
            if let Ok(p) = parse_lane_preamble(bytes) {
                assert_ne!(p.circ_id, 0);
                assert!(p.seq != 0 && p.prev < p.seq);
                assert_eq!(encode_lane_preamble(&p), bytes, "lane preamble round trip");
            }
        }
        _ => {}
    }
});

//! Fuzz the channel-cell framing: arbitrary bytes fed to
//! `CellCodec::decode` in a loop until it needs more bytes or fails, after an
//! optional opening VERSIONS cell (`decode_versions`).
//!
//! Checked besides "no panic":
//! * `Ok(None)` consumes nothing; `Ok(Some(_))` consumes something;
//! * whatever decodes encodes again, and that encoding decodes to a cell that
//!   encodes to the same bytes (decode is a normalization, then stable);
//! * an accepted VERSIONS cell re-encodes to exactly the bytes consumed.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use onionlab_cell::codec::{self, CellCodec};

fuzz_target!(|data: &[u8]| {
    // The first byte chooses the set-up; the rest is the byte stream.
    let Some((&mode, stream)) = data.split_first() else {
        return;
    };
    let link = if mode & 1 == 0 { 4 } else { 5 };
    let mut codec = if mode & 4 == 0 {
        CellCodec::new(link)
    } else {
        // A small limit, to exercise the oversize check more often.
        CellCodec::new(link).with_max_var_body(usize::from(mode >> 3) * 8)
    };
    let mut src = BytesMut::from(stream);

    if mode & 2 != 0 {
        // A link opens with VERSIONS (2-byte circuit ID), then cells.
        let before = src.len();
        match codec::decode_versions(&mut src) {
            Ok(Some(versions)) => {
                let wire = codec::encode_versions(&versions).expect("re-encode VERSIONS");
                assert_eq!(&wire[..], &stream[..before - src.len()]);
            }
            Ok(None) => {
                assert_eq!(src.len(), before, "Ok(None) consumed bytes");
                return;
            }
            Err(_) => return,
        }
    } else {
        let mut copy = src.clone();
        if let Ok(None) = codec::decode_versions(&mut copy) {
            assert_eq!(copy.len(), src.len(), "Ok(None) consumed bytes");
        }
    }

    loop {
        let before = src.len();
        match codec.decode(&mut src) {
            Ok(Some(cell)) => {
                assert!(src.len() < before, "a decoded cell consumed nothing");
                let mut once = BytesMut::new();
                CellCodec::new(link)
                    .encode(cell, &mut once)
                    .expect("a decoded cell must encode");
                let mut reread = once.clone();
                let cell = CellCodec::new(link)
                    .with_max_var_body(usize::MAX)
                    .decode(&mut reread)
                    .expect("a re-encoded cell must decode")
                    .expect("a re-encoded cell is complete");
                assert!(reread.is_empty(), "re-encoded cell has trailing bytes");
                let mut twice = BytesMut::new();
                CellCodec::new(link)
                    .encode(cell, &mut twice)
                    .expect("a decoded cell must encode");
                assert_eq!(once, twice, "encoding is not stable");
            }
            Ok(None) => {
                assert_eq!(src.len(), before, "Ok(None) consumed bytes");
                break;
            }
            Err(_) => break,
        }
    }
});

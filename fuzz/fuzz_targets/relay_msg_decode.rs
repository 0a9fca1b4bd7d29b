//! Fuzz relay-message decoding: an arbitrary 509-byte relay cell body (input
//! shorter than 509 bytes is zero-padded) goes to `relay::decode`.
//!
//! Checked besides "no panic": whatever decodes must encode again with
//! `relay::encode`, decode to the same command and stream ID, and encode to
//! the same body a second time (decode normalizes once, then is stable).
#![no_main]

use libfuzzer_sys::fuzz_target;
use onionlab_cell::msg::RelayMsg;
use onionlab_cell::relay::{self, CELL_DATA_LEN};
use rand::rngs::StdRng;
use rand::SeedableRng;

fuzz_target!(|data: &[u8]| {
    let mut body = Box::new([0_u8; CELL_DATA_LEN]);
    let n = data.len().min(CELL_DATA_LEN);
    body[..n].copy_from_slice(&data[..n]);

    let Ok((stream, msg)) = relay::decode(body) else {
        return;
    };
    let cmd = msg.cmd();
    let once = relay::encode(stream, msg, &mut StdRng::seed_from_u64(1))
        .expect("a decoded relay message must encode");
    let (stream2, msg2) = relay::decode(once.clone()).expect("a re-encoded message must decode");
    assert_eq!(stream2, stream, "stream ID changed");
    assert_eq!(msg2.cmd(), cmd, "command changed");
    let twice = relay::encode(stream2, msg2, &mut StdRng::seed_from_u64(1))
        .expect("a decoded relay message must encode");
    assert_eq!(&once[..], &twice[..], "encoding is not stable");
});

//! The test-only `plain` transport's identity proof
//! (`onionlab_transport::plain::wire`): a hello, a responder's proof and
//! an initiator's proof, read from arbitrary bytes as a peer could send
//! them.
//!
//! Checked besides "no panic":
//! * a hello is accepted exactly when it starts with the magic and its
//!   flag is 0 or 1, and then re-encodes to the same bytes;
//! * a proof read from arbitrary bytes re-encodes to the same bytes and
//!   proves no identity unless its key actually signed the exchange: a
//!   proof signed here with a known key verifies, the same proof for
//!   another nonce does not.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onionlab_transport::plain::wire::{
    hello, parse_hello, InitiatorProof, ResponderProof, HELLO_LEN, MAGIC, NONCE_LEN,
};
use tor_llcrypto::pk::ed25519::Keypair;

fn array<const N: usize>(data: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = data.len().min(N);
    out[..n].copy_from_slice(&data[..n]);
    out
}

fuzz_target!(|data: &[u8]| {
    let h: [u8; HELLO_LEN] = array(data);
    match parse_hello(&h) {
        Ok((nonce, relay)) => {
            assert_eq!(&h[..4], MAGIC);
            assert_eq!(hello(&nonce, relay), h);
        }
        Err(_) => assert!(&h[..4] != MAGIC || h[HELLO_LEN - 1] > 1),
    }
    let nonce: [u8; NONCE_LEN] = array(data.get(HELLO_LEN..).unwrap_or(&[]));
    let other: [u8; NONCE_LEN] = array(data.get(1..).unwrap_or(&[]));
    let r = ResponderProof::parse(&array(data));
    assert_eq!(ResponderProof::parse(&r.to_bytes()), r);
    let _ = r.verify(&nonce);
    let i = InitiatorProof::parse(&array(data));
    assert_eq!(InitiatorProof::parse(&i.to_bytes()), i);
    let _ = i.verify(&nonce, &other);
    // A real proof verifies for its exchange only.
    let key = Keypair::from_bytes(&array(data.get(7..).unwrap_or(&[])));
    let signed = ResponderProof::sign(&key, &nonce, other);
    assert!(signed.verify(&nonce).is_some());
    if other != nonce {
        assert!(signed.verify(&other).is_none());
    }
});

//! Fuzz the parsing and checking of ntor handshake messages:
//! `server_handshake` on arbitrary CREATE2 data, and `NtorClient::finish`
//! on arbitrary CREATED2 data. Neither may panic; any accepted handshake
//! must give the same keys on both sides.
//!
//! Needs `onionlab-crypto` and `tor-llcrypto` (and `libfuzzer-sys`) in
//! fuzz/Cargo.toml.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_crypto::ntor::{
    server_handshake_with_secret, NtorClient, CLIENT_HANDSHAKE_LEN, SERVER_HANDSHAKE_LEN,
};
use tor_llcrypto::pk::curve25519::StaticSecret;

fuzz_target!(|data: &[u8]| {
    let Ok(relay) = RelaySecretKeys::from_bytes(&[7u8; 64]) else {
        return;
    };
    let public = relay.public();
    let id = public.ntor_node_id();
    let y = || StaticSecret::from([9u8; 32]);
    let x = || StaticSecret::from([5u8; 32]);

    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 3 {
        // Raw bytes as the whole CREATE2 handshake data.
        0 => {
            let _ = server_handshake_with_secret(y(), &id, relay.onion_secret(), rest);
        }
        // Correct ID and B, fuzzed X: reaches the DH, the degenerate-point
        // check and the key derivation.
        1 => {
            let mut msg = [0u8; CLIENT_HANDSHAKE_LEN];
            msg[..20].copy_from_slice(id.as_bytes());
            msg[20..52].copy_from_slice(public.onion_key.as_bytes());
            let n = rest.len().min(32);
            msg[52..52 + n].copy_from_slice(&rest[..n]);
            if let Ok((reply, _keys)) =
                server_handshake_with_secret(y(), &id, relay.onion_secret(), &msg)
            {
                // Y is ours, so the reply starts with it.
                let y_pub = tor_llcrypto::pk::curve25519::PublicKey::from(&y());
                assert_eq!(&reply[..32], y_pub.as_bytes());
                assert_eq!(reply.len(), SERVER_HANDSHAKE_LEN);
            }
        }
        // Raw bytes as the CREATED2 reply to a real client.
        _ => {
            let (client, create) = NtorClient::start_with_secret(x(), &id, &public.onion_key);
            let genuine = server_handshake_with_secret(y(), &id, relay.onion_secret(), &create);
            let result = client.finish(rest);
            if let (Ok(ckeys), Ok((reply, skeys))) = (result, genuine) {
                // Only the genuine reply may be accepted.
                assert_eq!(rest, &reply[..]);
                assert_eq!(ckeys.to_bytes(), skeys.to_bytes());
            }
        }
    }
});

//! Fuzz the datagram circuits' wire formats (`onionlab_dgram::wire`):
//! arbitrary bytes as a datagram cell, as a relay message's plaintext and
//! as EXTEND2 data; then the same bytes, cut into cells, at an exit relay
//! with a client link. Nothing may panic; whatever parses re-encodes to
//! the same bytes (a cell: up to its unused payload bytes); the relay's
//! output per cell stays bounded.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use libfuzzer_sys::fuzz_target;
use onionlab_crypto::dgram::PLAINTEXT_LEN;
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_dgram::wire::{DgramCell, Extend2, RelayMsg, CELL_LEN};
use onionlab_dgram::{DgramRelay, RelaySettings};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// The relay's keys, made once (key generation would dominate a run).
fn keys() -> Arc<RelaySecretKeys> {
    static KEYS: OnceLock<Arc<RelaySecretKeys>> = OnceLock::new();
    KEYS.get_or_init(|| Arc::new(RelaySecretKeys::generate(&mut StdRng::seed_from_u64(1))))
        .clone()
}

fuzz_target!(|data: &[u8]| {
    if let Ok(cell) = DgramCell::parse(data) {
        let again = DgramCell::parse(&cell.encode()).expect("an encoded cell parses");
        assert_eq!(again, cell);
    }
    let mut plaintext = [0u8; PLAINTEXT_LEN];
    let n = data.len().min(PLAINTEXT_LEN);
    plaintext[..n].copy_from_slice(&data[..n]);
    if let Ok(msg) = RelayMsg::parse(&plaintext) {
        assert_eq!(msg.encode().expect("a parsed message encodes"), plaintext);
    }
    if let Ok(e) = Extend2::parse(data) {
        assert_eq!(e.encode(), data);
    }

    let settings = RelaySettings {
        exit: true,
        ..RelaySettings::default()
    };
    let mut relay = DgramRelay::new(keys(), settings, 1);
    let now = Instant::now();
    relay.link_up(now, 1, None, None);
    for cell in data.chunks(CELL_LEN) {
        relay.handle_cell(now, 1, cell);
        let mut out = 0;
        while relay.poll_output().is_some() {
            out += 1;
        }
        // A CREATED2, or the copies of one DESTROY and a Closed.
        assert!(out <= 4, "{out} outputs for one cell");
    }
});

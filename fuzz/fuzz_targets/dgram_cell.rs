//! Fuzz the datagram cell crypto (`onionlab_crypto::dgram`,
//! `docs/datagram.md` section 3): arbitrary bytes as cells at a relay and
//! at the client, and the client's own cells delivered in an arbitrary
//! order, duplicated and with bits flipped. Nothing may panic; no made-up
//! or altered cell may open; every cell opens at most once, with the
//! plaintext it was sealed with.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use onionlab_crypto::dgram::{
    ClientLayers, HopKeys, Inbound, RelayLayer, SealedCell, BODY_LEN, HEADER_LEN,
    HOP_KEY_MATERIAL_LEN, PLAINTEXT_LEN,
};

const CELL_LEN: usize = HEADER_LEN + BODY_LEN;

fn keys(i: u8) -> HopKeys {
    let m = [i.wrapping_mul(41) ^ 0x33; HOP_KEY_MATERIAL_LEN];
    HopKeys::from_kdf_output(&m).expect("96 bytes")
}

fn cell_of(bytes: &[u8]) -> SealedCell {
    let mut c = SealedCell {
        header: [0; HEADER_LEN],
        body: [0; BODY_LEN],
    };
    let n = bytes.len().min(HEADER_LEN);
    c.header[..n].copy_from_slice(&bytes[..n]);
    if bytes.len() > HEADER_LEN {
        let rest = &bytes[HEADER_LEN..];
        let m = rest.len().min(BODY_LEN);
        c.body[..m].copy_from_slice(&rest[..m]);
    }
    c
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut client = ClientLayers::new();
    let mut relays = Vec::new();
    for i in 0..3 {
        client.add_hop(keys(i));
        relays.push(RelayLayer::new(keys(i)));
    }
    if mode % 2 == 0 {
        // Made-up cells: none opens anywhere.
        for chunk in rest.chunks(CELL_LEN) {
            let cell = cell_of(chunk);
            let r = relays[0].inbound(cell.clone());
            assert!(!matches!(r, Ok(Inbound::Ours { .. })), "a made-up cell opened");
            assert!(client.open(cell).is_err(), "a made-up cell opened at the client");
        }
        return;
    }
    // A script: each 3-byte step seals a cell (target hop, plaintext
    // byte) or delivers an earlier one (index, flip a bit or not).
    let mut sealed: Vec<(usize, u8, SealedCell)> = Vec::new();
    let mut opened: HashMap<u64, u8> = HashMap::new();
    for step in rest.chunks_exact(3) {
        if step[0] % 2 == 0 || sealed.is_empty() {
            let target = usize::from(step[1] % 3);
            let plaintext = [step[2]; PLAINTEXT_LEN];
            let cell = client.seal(target, &plaintext).expect("seal");
            sealed.push((target, step[2], cell));
            continue;
        }
        let (target, byte, mut cell) = sealed[usize::from(step[1]) % sealed.len()].clone();
        let flip = step[2] != 0;
        if flip {
            let bit = usize::from(step[2]) * 37 % (8 * CELL_LEN);
            if bit < 8 * HEADER_LEN {
                cell.header[bit / 8] ^= 1 << (bit % 8);
            } else {
                let b = bit - 8 * HEADER_LEN;
                cell.body[b / 8] ^= 1 << (b % 8);
            }
        }
        for (hop, relay) in relays.iter_mut().enumerate() {
            match relay.inbound(cell) {
                Ok(Inbound::Ours { counter, plaintext }) => {
                    assert!(!flip, "an altered cell opened");
                    assert_eq!(hop, target);
                    assert_eq!(plaintext, [byte; PLAINTEXT_LEN]);
                    assert!(opened.insert(counter, byte).is_none(), "opened twice");
                    break;
                }
                Ok(Inbound::Forward(next)) => cell = next,
                Err(_) => {
                    assert!(!flip && hop == target, "refused at the wrong hop");
                    break;
                }
            }
        }
    }
});

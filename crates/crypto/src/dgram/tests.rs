//! The datagram cell crypto against its specification, and under loss,
//! duplication, reordering and tampering.

use std::collections::HashMap;

use cipher::KeyIvInit;
use proptest::prelude::*;
use tor_llcrypto::cipher::aes::Aes128Ctr;

use super::*;

/// Distinct, fixed key material for hop `i`.
fn material(i: u8) -> [u8; HOP_KEY_MATERIAL_LEN] {
    let mut m = [0u8; HOP_KEY_MATERIAL_LEN];
    for (j, b) in m.iter_mut().enumerate() {
        *b = i.wrapping_mul(97).wrapping_add(j as u8).wrapping_mul(31) ^ 0x5a;
    }
    m
}

/// A client and the relays of an `n`-hop circuit.
fn circuit(n: u8) -> (ClientLayers, Vec<RelayLayer>) {
    let mut client = ClientLayers::new();
    let mut relays = Vec::new();
    for i in 0..n {
        client.add_hop(HopKeys::from_kdf_output(&material(i)).unwrap());
        relays.push(RelayLayer::new(
            HopKeys::from_kdf_output(&material(i)).unwrap(),
        ));
    }
    (client, relays)
}

fn plaintext(seed: u64) -> Plaintext {
    let mut p = [0u8; PLAINTEXT_LEN];
    for (i, b) in p.iter_mut().enumerate() {
        *b = (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (i % 57)) as u8 ^ i as u8;
    }
    p
}

/// Carry a cell from the client through the relays until one takes it:
/// that relay's index, counter and plaintext; `None` if it passed the
/// last relay.
fn carry_forward(
    relays: &mut [RelayLayer],
    mut cell: SealedCell,
) -> Option<(usize, u64, Plaintext)> {
    for (i, relay) in relays.iter_mut().enumerate() {
        match relay.inbound(cell).unwrap() {
            Inbound::Ours { counter, plaintext } => return Some((i, counter, plaintext)),
            Inbound::Forward(next) => cell = next,
        }
    }
    None
}

/// Carry a cell that relay `from` sealed back to the client.
fn carry_backward(relays: &[RelayLayer], from: usize, mut cell: SealedCell) -> SealedCell {
    for relay in relays[..from].iter().rev() {
        cell = relay.outbound(cell);
    }
    cell
}

#[test]
fn every_hop_gets_its_cells_and_every_hop_reaches_the_client() {
    let (mut client, mut relays) = circuit(3);
    for round in 0..4u64 {
        for hop in 0..3 {
            let p = plaintext(round * 3 + hop as u64);
            let cell = client.seal(hop, &p).unwrap();
            let (at, _, got) = carry_forward(&mut relays, cell).unwrap();
            assert_eq!((at, got), (hop, p));

            let back = plaintext(1000 + round * 3 + hop as u64);
            let cell = relays[hop].seal(&back).unwrap();
            let (from, _, got) = client.open(carry_backward(&relays, hop, cell)).unwrap();
            assert_eq!((from, got), (hop, back));
        }
    }
}

/// The construction of `docs/datagram.md` section 3.3, computed step by
/// step with the primitives, matches what `seal` puts on the wire.
#[test]
fn the_wire_format_is_the_documented_construction() {
    use aes::cipher::{Array, BlockCipherEncrypt, KeyInit};
    let (mut client, _) = circuit(3);
    let p = plaintext(7);
    // The client's first cell, to the middle (hop index 1): counter 1.
    let cell = client.seal(1, &p).unwrap();

    let m0 = material(0);
    let m1 = material(1);
    let k = |m: &[u8; HOP_KEY_MATERIAL_LEN], i: usize| -> [u8; 16] {
        m[i * 16..(i + 1) * 16].try_into().unwrap()
    };
    let mut body = [0u8; BODY_LEN];
    body[..PLAINTEXT_LEN].copy_from_slice(&p);
    let mut nonce = [0u8; 12];
    nonce[11] = 1;
    let tag = Aes128Gcm::new(&Array::from(k(&m1, 4)))
        .encrypt_inout_detached(
            &Array::from(nonce),
            &[],
            (&mut body[..PLAINTEXT_LEN]).into(),
        )
        .unwrap();
    body[PLAINTEXT_LEN..].copy_from_slice(&tag);
    let mut x = [0u8; 16];
    x[15] = 1;
    let mut block = Array::from(x);
    Aes128::new(&Array::from(k(&m1, 0))).encrypt_block(&mut block);
    Aes128::new(&Array::from(k(&m0, 0))).encrypt_block(&mut block);
    let mut x1 = [0u8; 16];
    x1.copy_from_slice(&block);
    let mut ctr = Aes128Ctr::new(&Array::from(k(&m0, 2)), &Array::from(x1));
    ctr.apply_keystream(&mut body);

    assert_eq!(cell.header, x1);
    assert_eq!(cell.body, body);
}

#[test]
fn each_link_sees_other_bytes_for_the_same_cell() {
    let (mut client, mut relays) = circuit(3);
    let cell = client.seal(2, &plaintext(1)).unwrap();
    let Inbound::Forward(at_middle) = relays[0].inbound(cell.clone()).unwrap() else {
        panic!("the guard took a cell for the exit");
    };
    assert_ne!(cell.header, at_middle.header);
    assert_ne!(cell.body, at_middle.body);
    // And the same plaintext twice gives unrelated cells.
    let again = client.seal(2, &plaintext(1)).unwrap();
    assert_ne!(cell.header, again.header);
    assert_ne!(cell.body, again.body);
}

#[test]
fn a_replayed_cell_is_refused_by_the_hop_it_is_for() {
    let (mut client, mut relays) = circuit(2);
    let cell = client.seal(0, &plaintext(3)).unwrap();
    assert!(matches!(
        relays[0].inbound(cell.clone()),
        Ok(Inbound::Ours { .. })
    ));
    assert_eq!(
        relays[0].inbound(cell),
        Err(Error::DgramReplay { counter: 1 })
    );

    let back = relays[1].seal(&plaintext(4)).unwrap();
    let back = carry_backward(&relays, 1, back);
    assert!(client.open(back.clone()).is_ok());
    assert_eq!(client.open(back), Err(Error::DgramReplay { counter: 1 }));
}

#[test]
fn a_cell_from_outside_the_circuit_is_unrecognised() {
    let (mut client, _) = circuit(3);
    // A relay with keys of another circuit.
    let mut other = RelayLayer::new(HopKeys::from_kdf_output(&material(9)).unwrap());
    let stray = other.seal(&plaintext(5)).unwrap();
    assert_eq!(client.open(stray), Err(Error::DgramUnrecognised));
    assert_eq!(
        client.seal(3, &plaintext(0)),
        Err(Error::NoSuchHop {
            hop: 3,
            n_layers: 3
        })
    );
}

#[test]
fn key_material_of_the_wrong_length_is_refused() {
    assert!(matches!(
        HopKeys::from_kdf_output(&[0u8; 95]),
        Err(Error::BadLength {
            expected: 96,
            got: 95,
            ..
        })
    ));
}

#[test]
fn the_replay_window_takes_each_counter_once_and_none_too_old() {
    let mut w = ReplayWindow::default();
    assert!(!w.accept(0));
    assert!(w.accept(5));
    assert!(w.accept(3));
    assert!(!w.accept(3));
    assert!(w.accept(5 + REPLAY_WINDOW));
    assert!(!w.accept(5), "now exactly a window below the top");
    assert!(w.accept(6));
    assert!(w.accept(u64::MAX - 1));
    assert!(!w.accept(6));
    assert!(w.accept(u64::MAX - 2));
}

proptest! {
    /// The window agrees with a model that remembers everything: a
    /// counter is taken if new and less than a window below the highest.
    #[test]
    fn the_replay_window_matches_its_model(counters in prop::collection::vec(
        prop_oneof![1u64..3000, 1u64..40, 0u64..=u64::MAX], 0..400)
    ) {
        let mut w = ReplayWindow::default();
        let mut seen = std::collections::HashSet::new();
        let mut top = 0u64;
        for c in counters {
            let want = c != 0 && !seen.contains(&c) && (c > top || top - c < REPLAY_WINDOW);
            prop_assert_eq!(w.accept(c), want, "counter {} with top {}", c, top);
            if want {
                seen.insert(c);
                top = top.max(c);
            }
        }
    }

    /// Cells sent to every hop, each link losing, duplicating and
    /// reordering them: every cell that reaches its hop is taken there
    /// exactly once with its plaintext; copies are refused as replays;
    /// none passes the last hop. The same backward.
    #[test]
    fn loss_duplication_and_reordering_cost_only_the_lost_cells(
        targets in prop::collection::vec(0usize..3, 1..60),
        order in prop::collection::vec(any::<u32>(), 3 * 120),
        fate_seq in prop::collection::vec(0u8..6, 3 * 120),
    ) {
        let (mut client, mut relays) = circuit(3);
        // Forward: (target, plaintext seed, cell) in flight.
        let mut flight: Vec<(usize, u64, SealedCell)> = targets
            .iter()
            .enumerate()
            .map(|(i, &t)| (t, i as u64, client.seal(t, &plaintext(i as u64)).unwrap()))
            .collect();
        let mut taken: HashMap<u64, usize> = HashMap::new();
        for (hop, relay) in relays.iter_mut().enumerate() {
            flight = disturb(flight, &fate_seq[hop * 120..], &order[hop * 120..]);
            let mut next = Vec::new();
            for (t, seed, cell) in flight {
                match relay.inbound(cell) {
                    Ok(Inbound::Ours { plaintext: p, .. }) => {
                        prop_assert_eq!(t, hop);
                        prop_assert_eq!(p, plaintext(seed));
                        *taken.entry(seed).or_default() += 1;
                    }
                    Ok(Inbound::Forward(c)) => {
                        prop_assert!(t > hop, "hop {} passed on a cell for hop {}", hop, t);
                        next.push((t, seed, c));
                    }
                    Err(Error::DgramReplay { .. }) => {
                        prop_assert_eq!(t, hop);
                        prop_assert!(taken.contains_key(&seed));
                    }
                    Err(e) => prop_assert!(false, "{e}"),
                }
            }
            flight = next;
        }
        prop_assert!(flight.is_empty());
        prop_assert!(taken.values().all(|&n| n == 1));

        // Backward: each relay sends one cell per target naming it.
        let mut back: Vec<(usize, u64, SealedCell)> = Vec::new();
        for (i, &from) in targets.iter().enumerate() {
            let seed = 10_000 + i as u64;
            back.push((from, seed, relays[from].seal(&plaintext(seed)).unwrap()));
        }
        for hop in (0..3).rev() {
            // Cells of relays beyond `hop` pass it, then its link disturbs all.
            back = back
                .into_iter()
                .map(|(from, seed, c)| if from > hop { (from, seed, relays[hop].outbound(c)) } else { (from, seed, c) })
                .collect();
            back = disturb(back, &fate_seq[hop * 120 + 60..], &order[hop * 120 + 60..]);
        }
        let mut opened: HashMap<u64, usize> = HashMap::new();
        for (from, seed, cell) in back {
            match client.open(cell) {
                Ok((hop, _, p)) => {
                    prop_assert_eq!(hop, from);
                    prop_assert_eq!(p, plaintext(seed));
                    *opened.entry(seed).or_default() += 1;
                }
                Err(Error::DgramReplay { .. }) => prop_assert!(opened.contains_key(&seed)),
                Err(e) => prop_assert!(false, "{e}"),
            }
        }
        prop_assert!(opened.values().all(|&n| n == 1));
    }

    /// A single flipped bit anywhere in a cell never yields a plaintext
    /// at the hop it was for: the cell is dropped or unrecognised there.
    #[test]
    fn a_flipped_bit_never_opens(target in 0usize..3, bit in 0usize..(8 * (HEADER_LEN + BODY_LEN))) {
        let (mut client, mut relays) = circuit(3);
        let mut cell = client.seal(target, &plaintext(9)).unwrap();
        if bit < 8 * HEADER_LEN {
            cell.header[bit / 8] ^= 1 << (bit % 8);
        } else {
            let b = bit - 8 * HEADER_LEN;
            cell.body[b / 8] ^= 1 << (b % 8);
        }
        prop_assert_eq!(carry_forward(&mut relays, cell), None);
    }
}

/// One link's effect on a batch of cells: each lost, passed once or
/// twice by `fates` (0: lost; 1-3: once; 4-5: twice), then reordered by
/// `order`.
fn disturb<T: Clone>(cells: Vec<T>, fates: &[u8], order: &[u32]) -> Vec<T> {
    let mut out: Vec<(u32, T)> = Vec::new();
    for (i, c) in cells.into_iter().enumerate() {
        let copies = match fates[i % fates.len()] {
            0 => 0,
            1..=3 => 1,
            _ => 2,
        };
        for k in 0..copies {
            out.push((order[(i * 2 + k) % order.len()], c.clone()));
        }
    }
    out.sort_by_key(|(k, _)| *k);
    out.into_iter().map(|(_, c)| c).collect()
}

/// An ntor handshake expanded for datagram circuits gives the client and
/// the relay the same keys.
#[test]
fn ntor_gives_both_sides_the_same_datagram_keys() {
    use crate::identity::RelaySecretKeys;
    use crate::ntor::NtorClient;
    use tor_llcrypto::pk::curve25519::StaticSecret;

    let relay = RelaySecretKeys::from_bytes(&[7u8; 64]).unwrap();
    let public = relay.public();
    let (state, msg) = NtorClient::start_with_secret(
        StaticSecret::from([5u8; 32]),
        &public.ntor_node_id(),
        &public.onion_key,
    );
    let (reply, relay_keys) = relay
        .ntor_server_handshake_as::<HopKeys, _>(&mut rand::rng(), &msg)
        .unwrap();
    let client_keys: HopKeys = state.finish_as(&reply).unwrap();

    let mut client = ClientLayers::new();
    client.add_hop(client_keys);
    let mut relays = vec![RelayLayer::new(relay_keys)];
    let p = plaintext(11);
    let cell = client.seal(0, &p).unwrap();
    assert_eq!(
        carry_forward(&mut relays, cell).map(|(_, _, got)| got),
        Some(p)
    );
}

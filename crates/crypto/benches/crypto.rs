//! Throughput of the per-cell relay crypto (tor1's and the datagram
//! cells') and of the ntor handshake.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use onionlab_crypto::dgram::{self, ClientLayers, HopKeys, Inbound};
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_crypto::ntor::{server_handshake, NtorClient};
use onionlab_crypto::relay_crypto::{ClientCircuitCrypto, LayerKeys, RelayLayer};
use onionlab_crypto::{CellBody, CELL_BODY_LEN};

fn keys(seed: u8) -> LayerKeys {
    let material: Vec<u8> = (0..92u8)
        .map(|i| i.wrapping_mul(7).wrapping_add(seed))
        .collect();
    LayerKeys::from_kdf_output(&material).unwrap()
}

fn body() -> CellBody {
    let mut b = [0x5a; CELL_BODY_LEN];
    b[1..3].fill(0);
    b[5..9].fill(0);
    b
}

fn relay_layer(c: &mut Criterion) {
    let mut g = c.benchmark_group("relay_layer");
    g.throughput(Throughput::Elements(1));
    // Cells for a later hop: decrypt + recognized check (the common case
    // at guard and middle).
    let mut r = RelayLayer::new(&keys(1));
    let mut b = body();
    g.bench_function("decrypt_outbound_forward", |bench| {
        bench.iter(|| {
            b[1..3].copy_from_slice(&[1, 2]);
            black_box(r.decrypt_outbound(black_box(&mut b)))
        })
    });
    // Cells addressed to this hop: decrypt + digest check + advance. Each
    // iteration encrypts a fresh cell at a matching client first, so this
    // measures client encrypt + relay decrypt (one layer each).
    let k = keys(2);
    let mut client = ClientCircuitCrypto::new();
    client.add_layer(&k);
    let mut r = RelayLayer::new(&k);
    g.bench_function("client_encrypt+decrypt_outbound_recognized", |bench| {
        bench.iter(|| {
            let mut b = body();
            client.encrypt_outbound(&mut b, 0).unwrap();
            black_box(r.decrypt_outbound(&mut b))
        })
    });
    let mut r = RelayLayer::new(&keys(3));
    let mut b = body();
    g.bench_function("encrypt_inbound", |bench| {
        bench.iter(|| r.encrypt_inbound(black_box(&mut b)))
    });
    let mut r = RelayLayer::new(&keys(4));
    g.bench_function("originate_inbound", |bench| {
        bench.iter(|| {
            let mut b = body();
            black_box(r.originate_inbound(&mut b))
        })
    });
    g.finish();
}

fn client_circuit(c: &mut Criterion) {
    let mut g = c.benchmark_group("client_3_hops");
    g.throughput(Throughput::Elements(1));
    let ks = [keys(10), keys(20), keys(30)];
    let mut client = ClientCircuitCrypto::new();
    for k in &ks {
        client.add_layer(k);
    }
    g.bench_function("encrypt_outbound_to_exit", |bench| {
        bench.iter(|| {
            let mut b = body();
            black_box(client.encrypt_outbound(&mut b, 2).unwrap())
        })
    });
    // Inbound from the exit: each iteration has the three relays prepare a
    // matching cell, so this is 3 relay layers + the client's 3 layers.
    let mut client = ClientCircuitCrypto::new();
    let mut relays: Vec<RelayLayer> = ks.iter().map(RelayLayer::new).collect();
    for k in &ks {
        client.add_layer(k);
    }
    g.bench_function(
        "relays_originate+client_decrypt_inbound_from_exit",
        |bench| {
            bench.iter(|| {
                let mut b = body();
                relays[2].originate_inbound(&mut b);
                relays[1].encrypt_inbound(&mut b);
                relays[0].encrypt_inbound(&mut b);
                black_box(client.decrypt_inbound(&mut b).unwrap())
            })
        },
    );
    g.finish();
}

fn ntor(c: &mut Criterion) {
    let mut g = c.benchmark_group("ntor");
    g.throughput(Throughput::Elements(1));
    let mut rng = rand::rng();
    let relay = RelaySecretKeys::generate(&mut rng);
    let public = relay.public();
    let id = public.ntor_node_id();
    let (_, create) = NtorClient::start(&mut rng, &id, &public.onion_key);
    let (created, _) = server_handshake(&mut rng, &id, relay.onion_secret(), &create).unwrap();

    g.bench_function("client_start+finish", |bench| {
        // The reply is the server's answer to a different X, so finish
        // fails AUTH, but it does all the work of a success first
        // (everything is computed before any check).
        bench.iter(|| {
            let (client, msg) = NtorClient::start(&mut rng, &id, &public.onion_key);
            black_box(msg);
            black_box(client.finish(&created).is_err())
        })
    });
    g.bench_function("server_handshake", |bench| {
        bench.iter(|| {
            black_box(server_handshake(&mut rng, &id, relay.onion_secret(), &create).unwrap())
        })
    });
    g.bench_function("server_handshake_cached_public_key", |bench| {
        bench.iter(|| black_box(relay.ntor_server_handshake(&mut rng, &create).unwrap()))
    });
    g.bench_function("full_round_trip", |bench| {
        bench.iter(|| {
            let (client, msg) = NtorClient::start(&mut rng, &id, &public.onion_key);
            let (reply, _) = relay.ntor_server_handshake(&mut rng, &msg).unwrap();
            black_box(client.finish(&reply).unwrap())
        })
    });
    g.finish();
}

fn hop_keys(seed: u8) -> HopKeys {
    let material: Vec<u8> = (0..dgram::HOP_KEY_MATERIAL_LEN as u8)
        .map(|i| i.wrapping_mul(7).wrapping_add(seed))
        .collect();
    HopKeys::from_kdf_output(&material).unwrap()
}

/// The datagram cells' crypto, as the tor1 groups above measure tor1's: a
/// relay passing on a cell for a later hop, and the three-hop round trips.
fn datagram(c: &mut Criterion) {
    let mut g = c.benchmark_group("dgram");
    g.throughput(Throughput::Elements(1));
    let plaintext = [0x5a; dgram::PLAINTEXT_LEN];
    let ks = [hop_keys(10), hop_keys(20), hop_keys(30)];
    let mut client = ClientLayers::new();
    for k in &ks {
        client.add_hop(k.clone());
    }
    let mut relays: Vec<dgram::RelayLayer> =
        ks.iter().cloned().map(dgram::RelayLayer::new).collect();
    // A cell for the exit, as the guard sees it: try to open (fails), peel.
    let to_exit = client.seal(2, &plaintext).unwrap();
    g.bench_function("relay_inbound_forward", |bench| {
        bench.iter(|| black_box(relays[0].inbound(black_box(to_exit.clone())).unwrap()))
    });
    g.bench_function("relay_outbound", |bench| {
        bench.iter(|| black_box(relays[0].outbound(black_box(to_exit.clone()))))
    });
    // Client seals for the exit, all three relays take it in turn.
    g.bench_function("client_seal+relays_inbound_to_exit", |bench| {
        bench.iter(|| {
            let mut cell = client.seal(2, &plaintext).unwrap();
            for r in &mut relays[..2] {
                match r.inbound(cell).unwrap() {
                    Inbound::Forward(next) => cell = next,
                    Inbound::Ours { .. } => unreachable!("a cell for the exit"),
                }
            }
            black_box(relays[2].inbound(cell).unwrap())
        })
    });
    // The exit seals for the client, the others wrap, the client opens.
    g.bench_function("relays_seal+client_open_from_exit", |bench| {
        bench.iter(|| {
            let mut cell = relays[2].seal(&plaintext).unwrap();
            cell = relays[1].outbound(cell);
            cell = relays[0].outbound(cell);
            black_box(client.open(cell).unwrap())
        })
    });
    g.finish();
}

criterion_group!(benches, relay_layer, client_circuit, ntor, datagram);
criterion_main!(benches);

//! What MORE's Sphinx packets cost (`docs/datagram.md` section 6): a relay
//! peeling one layer (the two x25519 multiplications, the MAC, the header
//! stream cipher and the payload's Lioness), the exit's last layer and a
//! reply on a SURB, and the client's side: a forward packet, a SURB, and
//! opening a reply. One packet is 1176 bytes and carries at most 397 bytes
//! of a TORTP segment forward (two segments back).

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_dgram::more::sphinx::{self, Peeled, RouteHop, SphinxKey};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn more(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(1);
    let keys: Vec<RelaySecretKeys> = (0..4)
        .map(|_| RelaySecretKeys::generate(&mut rng))
        .collect();
    let hop = |k: &RelaySecretKeys| RouteHop {
        identity: k.public().ed_identity,
        key: k.sphinx_public(),
    };
    let route: Vec<RouteHop> = keys[..3].iter().map(hop).collect();
    let sphinx_keys: Vec<SphinxKey> = keys
        .iter()
        .map(|k| SphinxKey::new(k.sphinx_secret()))
        .collect();
    let message = vec![0x5a; sphinx::MESSAGE_LEN];

    let mut g = c.benchmark_group("more");
    g.throughput(Throughput::Elements(1));
    let packet = sphinx::seal_forward(&route, &message).unwrap();
    g.bench_function("relay_peel_forward", |b| {
        b.iter(|| black_box(sphinx::peel(&sphinx_keys[0], black_box(&packet), |_| false)))
    });
    // The packet as the exit gets it: its last layer, then the message.
    let mut at_exit = packet.clone();
    for k in &sphinx_keys[..2] {
        match sphinx::peel(k, &at_exit, |_| false).unwrap() {
            Peeled::Forward { packet, .. } => at_exit = packet,
            Peeled::Final { .. } => unreachable!("a packet for the third hop"),
        }
    }
    g.bench_function("exit_peel_and_open", |b| {
        b.iter(
            || match sphinx::peel(&sphinx_keys[2], black_box(&at_exit), |_| false) {
                Ok(Peeled::Final { payload, .. }) => black_box(sphinx::open_forward(payload)),
                _ => unreachable!("the exit's packet"),
            },
        )
    });
    g.bench_function("client_seal_forward", |b| {
        b.iter(|| black_box(sphinx::seal_forward(&route, black_box(&message))))
    });
    g.bench_function("client_make_surb", |b| {
        b.iter(|| black_box(sphinx::make_surb(&route, &[7u8; 32])))
    });
    let surb = sphinx::make_surb(&route, &[7u8; 32]).unwrap();
    g.bench_function("exit_use_surb", |b| {
        b.iter(|| black_box(sphinx::use_surb(&surb.bytes, black_box(&message))))
    });
    // The reply as its last hop delivers it.
    let (mut reply, _) = sphinx::use_surb(&surb.bytes, &message).unwrap();
    let mut payload = Vec::new();
    for k in &sphinx_keys[..3] {
        match sphinx::peel(k, &reply, |_| false).unwrap() {
            Peeled::Forward { packet, .. } => reply = packet,
            Peeled::Final { payload: p, .. } => payload = p,
        }
    }
    g.bench_function("client_open_reply", |b| {
        b.iter(|| black_box(sphinx::open_reply(&surb.recovery, black_box(&payload))))
    });
    g.finish();
}

criterion_group!(benches, more);
criterion_main!(benches);

//! The QUIC handshake gate with real quinn endpoints on loopback: one
//! address that opens connections too fast is refused before any
//! cryptography while another address still connects, relays' addresses
//! are exempt, and above the total rate peers get a Retry and still
//! connect.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_transport::quic::gate::HandshakeLimits;
use onionlab_transport::quic::{QuicListener, QuicSettings, QuicTransport};
use onionlab_transport::{Incoming, Listener, Transport};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

async fn relay(limits: HandshakeLimits) -> (QuicTransport, RelaySecretKeys, SocketAddr) {
    let keys = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(7));
    let settings = QuicSettings {
        handshakes: limits,
        ..QuicSettings::default()
    };
    let t = QuicTransport::relay(&keys, vec![], SocketAddr::new(loopback(1), 0), settings)
        .expect("relay");
    let addr = t.local_addr().expect("bound");
    let listener = t.bind(addr).await.expect("listen");
    tokio::spawn(serve(listener));
    (t, keys, addr)
}

/// Complete every link handshake and keep the links open.
async fn serve(mut listener: QuicListener) {
    let mut links = Vec::new();
    while let Ok(incoming) = listener.accept().await {
        if let Ok(link) = incoming.handshake().await {
            links.push(link);
        }
    }
}

/// Open `n` links one after another from `from`; how many succeeded.
async fn connect_many(from: IpAddr, to: SocketAddr, keys: &RelaySecretKeys, n: usize) -> usize {
    let client = QuicTransport::client_bound(QuicSettings::default(), from);
    let mut links = Vec::new();
    for _ in 0..n {
        let attempt = tokio::time::timeout(
            Duration::from_secs(5),
            client.connect(to, keys.public().ed_identity),
        )
        .await
        .expect("a refused handshake fails fast, not by timeout");
        if let Ok(link) = attempt {
            links.push(link);
        }
    }
    links.len()
}

#[tokio::test]
async fn one_fast_address_is_refused_others_and_relays_connect() {
    let limits = HandshakeLimits {
        per_address_rate: 0.01,
        per_address_burst: 5.0,
        ..HandshakeLimits::default()
    };
    let (relay, keys, addr) = relay(limits).await;
    relay.set_exempt_addresses([loopback(9)]);
    assert_eq!(connect_many(loopback(5), addr, &keys, 12).await, 5);
    assert_eq!(relay.gate_counters().refused, 7);
    // Another address is not affected, and a relay's address is exempt.
    assert_eq!(connect_many(loopback(6), addr, &keys, 3).await, 3);
    assert_eq!(connect_many(loopback(9), addr, &keys, 12).await, 12);
    assert_eq!(relay.gate_counters().refused, 7);
}

#[tokio::test]
async fn above_the_total_rate_peers_are_retried_and_still_connect() {
    let limits = HandshakeLimits {
        retry_rate: 0.5,
        ..HandshakeLimits::default()
    };
    let (relay, keys, addr) = relay(limits).await;
    assert_eq!(connect_many(loopback(5), addr, &keys, 6).await, 6);
    let c = relay.gate_counters();
    assert!(c.retried >= 4, "{c:?}");
    assert_eq!(c.refused, 0);
}

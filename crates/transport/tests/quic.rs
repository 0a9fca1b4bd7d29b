//! The QUIC transport on loopback: identities, lanes per circuit, both
//! modes, fallback to TLS, and a blocked lane that holds up nobody else.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use onionlab_cell::chan::{
    AnyChanCell, AnyChanMsg, ChanCell, CircId, Destroy, DestroyReason, Relay,
};
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_transport::any::{Choice, Connector, PeerAddrs};
use onionlab_transport::quic::{Mode, QuicLink, QuicSettings, QuicTransport};
use onionlab_transport::tls::TlsTransport;
use onionlab_transport::{
    CellReader, CellWriter, Error, Incoming, Listener, Ordering, Transport, TransportKind,
};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn keys(seed: u64) -> RelaySecretKeys {
    RelaySecretKeys::generate(&mut StdRng::seed_from_u64(seed))
}

fn relay_cell(circ: u32, byte: u8) -> AnyChanCell {
    ChanCell::new(
        CircId::new(circ),
        AnyChanMsg::Relay(Relay::new([byte; 509])),
    )
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("literal")
}

fn settings(mode: Mode) -> QuicSettings {
    QuicSettings {
        mode,
        ..QuicSettings::default()
    }
}

fn relay(seed: u64, mode: Mode) -> (RelaySecretKeys, QuicTransport) {
    let k = keys(seed);
    let t = QuicTransport::relay(&k, vec![], loopback(), settings(mode)).expect("relay");
    (k, t)
}

/// Send `per_circ` cells on each circuit in `circs` from `from` and read
/// them at `to`, checking per-circuit order.
async fn exchange(from: &mut QuicLink, to: &mut QuicLink, circs: &[u32], per_circ: u32) {
    let send = async {
        for i in 0..per_circ {
            for &c in circs {
                let id = CircId::new(c).expect("nonzero");
                while !from.writer.has_room_for(id) {
                    from.writer.writable().await;
                }
                from.writer.queue(relay_cell(c, i as u8)).expect("queue");
            }
        }
    };
    let recv = async {
        let mut seen: HashMap<u32, u32> = HashMap::new();
        let total = circs.len() * per_circ as usize;
        let mut n = 0;
        let mut cells = Vec::new();
        while n < total {
            cells.clear();
            to.reader.read_cells(&mut cells).await.expect("read");
            for cell in cells.drain(..) {
                let c = cell.circid().map(u32::from).expect("circuit cell");
                let i = seen.entry(c).or_default();
                let (_, msg) = cell.into_circid_and_msg();
                let AnyChanMsg::Relay(r) = msg else {
                    panic!("unexpected {msg:?}");
                };
                assert_eq!(r.into_relay_body()[0], *i as u8, "circuit {c} out of order");
                *i += 1;
                n += 1;
            }
        }
        seen
    };
    let ((), seen) = tokio::join!(send, recv);
    for &c in circs {
        assert_eq!(seen.get(&c), Some(&per_circ));
    }
}

async fn pair(mode: Mode) -> (QuicLink, QuicLink, RelaySecretKeys, RelaySecretKeys) {
    let (a, ta) = relay(1, mode);
    let (b, tb) = relay(2, mode);
    let mut listener = tb.bind(loopback()).await.expect("bind");
    let addr = listener.local_addr();
    let (client, server) = tokio::join!(ta.connect(addr, b.public().ed_identity), async {
        listener.accept().await?.handshake().await
    });
    // The transports' endpoints live on in the links.
    (client.expect("connect"), server.expect("accept"), a, b)
}

async fn relays_exchange_cells_on_lanes(mode: Mode) {
    let (mut ab, mut ba, a, b) = pair(mode).await;
    assert_eq!(ab.peer.identity, Some(b.public().ed_identity));
    assert_eq!(ba.peer.identity, Some(a.public().ed_identity));
    assert_eq!(ab.link_version, 5);
    assert_eq!(ab.writer.ordering(), Ordering::PerCircuit);
    let circs = [0x8000_0001, 0x8000_0002, 0x8000_0003, 7];
    exchange(&mut ab, &mut ba, &circs, 500).await;
    // Replies travel on the lanes the other side opened, and the
    // responder can open a lane too (circuit 9).
    exchange(&mut ba, &mut ab, &[0x8000_0001, 7, 9], 300).await;
    assert_eq!(ab.writer.open_lanes(), 5, "4 opened by us, 1 by the peer");

    // A DESTROY closes the lane; a new circuit with the same ID gets a
    // new stream, read after the old one's end.
    let destroy = ChanCell::new(CircId::new(7), Destroy::new(DestroyReason::FINISHED).into());
    ab.writer.queue(destroy).expect("destroy");
    assert_eq!(ab.writer.open_lanes(), 4);
    ab.writer.queue(relay_cell(7, 42)).expect("reuse");
    let mut got = Vec::new();
    while got.len() < 2 {
        ba.reader.read_cells(&mut got).await.expect("read");
    }
    assert!(matches!(got[0].msg(), AnyChanMsg::Destroy(_)));
    assert!(matches!(got[1].msg(), AnyChanMsg::Relay(_)));

    // Shutting down ends the link cleanly for the peer.
    ab.writer.shutdown().await.expect("shutdown");
    let mut cells = Vec::new();
    let end = loop {
        match ba.reader.read_cells(&mut cells).await {
            Ok(()) => cells.clear(),
            Err(e) => break e,
        }
    };
    assert!(matches!(end, Error::Closed), "{end}");
}

#[tokio::test]
async fn stream_per_circuit_moves_cells_both_ways() {
    relays_exchange_cells_on_lanes(Mode::StreamPerCircuit).await;
}

#[tokio::test]
async fn conn_per_circuit_moves_cells_both_ways() {
    relays_exchange_cells_on_lanes(Mode::ConnPerCircuit).await;
}

#[tokio::test]
async fn clients_stay_anonymous_and_wrong_identities_are_refused() {
    let (r, tr) = relay(3, Mode::StreamPerCircuit);
    let mut listener = tr.bind(loopback()).await.expect("bind");
    let addr = listener.local_addr();
    let client = QuicTransport::client(QuicSettings::default());
    let (c, s) = tokio::join!(client.connect(addr, r.public().ed_identity), async {
        listener.accept().await?.handshake().await
    });
    let (mut c, mut s) = (c.expect("client"), s.expect("relay"));
    assert_eq!(s.peer.identity, None, "a client presents no identity");
    exchange(&mut c, &mut s, &[0x8000_0005], 100).await;
    exchange(&mut s, &mut c, &[0x8000_0005], 100).await;
    assert!(client.bind(loopback()).await.is_err());

    let other = keys(99).public().ed_identity;
    match client.connect(addr, other).await {
        Err(Error::WrongIdentity { got, expected, .. }) => {
            assert_eq!(got, hex::encode(r.public().ed_identity.as_bytes()));
            assert_eq!(expected, hex::encode(other.as_bytes()));
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a wrong identity was accepted"),
    }
}

#[tokio::test]
async fn auto_falls_back_to_tls_when_quic_does_not_answer() {
    let r = keys(4);
    let tls = TlsTransport::relay(&r, vec![]).expect("tls");
    let mut listener = tls.bind(loopback()).await.expect("bind");
    let tls_addr = listener.local_addr();
    // A UDP socket that never answers: QUIC times out.
    let silent = std::net::UdpSocket::bind(loopback()).expect("udp");
    let addrs = PeerAddrs {
        tls: Some(tls_addr),
        quic: Some(silent.local_addr().expect("addr")),
    };
    tokio::spawn(async move {
        loop {
            if let Ok(i) = listener.accept().await {
                tokio::spawn(i.handshake());
            }
        }
    });
    let connector = Connector::new(
        TlsTransport::client(),
        Some(QuicTransport::client(QuicSettings::default())),
        Choice::Auto,
    );
    let link = connector
        .connect(addrs, r.public().ed_identity)
        .await
        .expect("fallback");
    assert_eq!(link.writer.kind(), TransportKind::Tls);

    let forced = Connector::new(
        TlsTransport::client(),
        Some(QuicTransport::client(QuicSettings {
            handshake_timeout: Duration::from_millis(500),
            ..QuicSettings::default()
        })),
        Choice::Quic,
    );
    assert!(forced.connect(addrs, r.public().ed_identity).await.is_err());
}

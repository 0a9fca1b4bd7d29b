//! The TLS transport on loopback: identities, the link handshake, cells
//! both ways, and bad input.

use std::net::SocketAddr;

use onionlab_cell::chan::{
    AnyChanCell, AnyChanMsg, ChanCell, CircId, Destroy, DestroyReason, Relay,
};
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_transport::link::{self, Role, StreamCellReader};
use onionlab_transport::tls::TlsTransport;
use onionlab_transport::{CellReader, CellWriter, Error, Incoming, Listener, Transport};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tor_llcrypto::pk::ed25519::Ed25519Identity;

fn keys(seed: u64) -> RelaySecretKeys {
    RelaySecretKeys::generate(&mut StdRng::seed_from_u64(seed))
}

fn relay_cell(circ: u32, byte: u8) -> AnyChanCell {
    let body = [byte; 509];
    ChanCell::new(CircId::new(circ), AnyChanMsg::Relay(Relay::new(body)))
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("literal")
}

/// Accept one connection and run its handshake.
async fn accept_one(
    listener: &mut onionlab_transport::tls::TlsListener,
) -> Result<onionlab_transport::any::AnyLink, Error> {
    listener.accept().await?.handshake().await
}

#[tokio::test]
async fn relays_authenticate_each_other_and_move_cells_both_ways() {
    let (a, b) = (keys(1), keys(2));
    let ta = TlsTransport::relay(&a, vec![]).unwrap();
    let tb = TlsTransport::relay(&b, vec![]).unwrap();
    let mut listener = tb.bind(loopback()).await.unwrap();
    let addr = listener.local_addr();
    let b_id = b.public().ed_identity;
    let (client, server) = tokio::join!(ta.connect(addr, b_id), accept_one(&mut listener));
    let (mut client, mut server) = (client.unwrap(), server.unwrap());
    assert_eq!(client.link_version, 5);
    assert_eq!(server.link_version, 5);
    assert_eq!(client.peer.identity, Some(b_id));
    assert_eq!(server.peer.identity, Some(a.public().ed_identity));

    // 2000 cells each way, checked in order.
    let n = 2000u32;
    let send = async {
        for i in 0..n {
            while !client.writer.has_room() {
                client.writer.flush().await.unwrap();
            }
            client
                .writer
                .queue(relay_cell(0x8000_0000 | i, i as u8))
                .unwrap();
        }
        client.writer.flush().await.unwrap();
    };
    let recv = async {
        let mut got = Vec::new();
        let mut cells = Vec::new();
        while got.len() < n as usize {
            cells.clear();
            server.reader.read_cells(&mut cells).await.unwrap();
            got.extend(cells.drain(..).map(|c| c.circid().map(u32::from)));
        }
        got
    };
    let ((), got) = tokio::join!(send, recv);
    let want: Vec<_> = (0..n).map(|i| Some(0x8000_0000 | i)).collect();
    assert_eq!(got, want);

    server
        .writer
        .queue(ChanCell::new(
            CircId::new(7),
            Destroy::new(DestroyReason::PROTOCOL).into(),
        ))
        .unwrap();
    server.writer.shutdown().await.unwrap();
    let mut cells = Vec::new();
    client.reader.read_cells(&mut cells).await.unwrap();
    assert!(matches!(cells[0].msg(), AnyChanMsg::Destroy(_)));
    cells.clear();
    assert!(matches!(
        client.reader.read_cells(&mut cells).await,
        Err(Error::Closed)
    ));
}

#[tokio::test]
async fn clients_stay_anonymous() {
    let relay = keys(3);
    let tr = TlsTransport::relay(&relay, vec![]).unwrap();
    let mut listener = tr.bind(loopback()).await.unwrap();
    let addr = listener.local_addr();
    let client = TlsTransport::client();
    let (c, s) = tokio::join!(
        client.connect(addr, relay.public().ed_identity),
        accept_one(&mut listener)
    );
    let (c, s) = (c.unwrap(), s.unwrap());
    assert_eq!(c.peer.identity, Some(relay.public().ed_identity));
    assert_eq!(s.peer.identity, None, "a client presents no identity");
    assert!(
        client.bind(loopback()).await.is_err(),
        "a client cannot listen"
    );
}

#[tokio::test]
async fn a_relay_with_the_wrong_identity_is_refused() {
    let (real, expected) = (keys(4), keys(5));
    let tr = TlsTransport::relay(&real, vec![]).unwrap();
    let mut listener = tr.bind(loopback()).await.unwrap();
    let addr = listener.local_addr();
    let server = tokio::spawn(async move { accept_one(&mut listener).await.map(|_| ()) });
    let err = TlsTransport::client()
        .connect(addr, expected.public().ed_identity)
        .await
        .err()
        .expect("must be refused");
    match &err {
        Error::WrongIdentity {
            got,
            expected: want,
            ..
        } => {
            assert_eq!(got, &hex::encode(real.public().ed_identity.as_bytes()));
            assert_eq!(want, &hex::encode(expected.public().ed_identity.as_bytes()));
        }
        other => panic!("expected WrongIdentity, got {other}"),
    }
    assert!(err.to_string().contains("refused"));
    assert!(server.await.unwrap().is_err(), "the relay's side fails too");
}

#[tokio::test]
async fn garbage_fails_one_handshake_and_the_listener_goes_on() {
    let relay = keys(6);
    let tr = TlsTransport::relay(&relay, vec![]).unwrap();
    let mut listener = tr.bind(loopback()).await.unwrap();
    let addr = listener.local_addr();

    let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
    raw.write_all(&[0x16, 3, 1, 0xff, 0xff, 1, 2, 3])
        .await
        .unwrap();
    raw.write_all(&[0xAB; 4000]).await.unwrap();
    let bad = listener.accept().await.unwrap().handshake().await;
    assert!(matches!(bad, Err(Error::Tls { .. })), "{:?}", bad.err());

    let client = TlsTransport::client();
    let (c, s) = tokio::join!(
        client.connect(addr, relay.public().ed_identity),
        accept_one(&mut listener)
    );
    assert!(c.is_ok() && s.is_ok());
}

#[tokio::test]
async fn a_silent_peer_times_out() {
    let relay = keys(7);
    let tr = TlsTransport::relay(&relay, vec![])
        .unwrap()
        .with_handshake_timeout(std::time::Duration::from_millis(200));
    let mut listener = tr.bind(loopback()).await.unwrap();
    let _raw = tokio::net::TcpStream::connect(listener.local_addr())
        .await
        .unwrap();
    let r = listener.accept().await.unwrap().handshake().await;
    assert!(matches!(r, Err(Error::HandshakeTimeout { .. })));
}

// ---- The link layer on an in-memory byte stream (no TLS needed). ----

fn peer() -> SocketAddr {
    "127.0.0.9:1".parse().expect("literal")
}

/// Handshake both roles over a duplex pipe; return the initiator's reader
/// and the responder's raw stream for injecting bytes.
async fn handshaken() -> (
    StreamCellReader<tokio::io::DuplexStream>,
    tokio::io::DuplexStream,
) {
    let (mut a, mut b) = tokio::io::duplex(1 << 16);
    let init = link::handshake(
        &mut a,
        Role::Initiator {
            my_addrs: vec![],
            relay: false,
        },
        peer(),
    );
    let resp = link::handshake(&mut b, Role::Responder { my_addrs: vec![] }, peer());
    let (i, r) = tokio::join!(init, resp);
    let (i, r) = (i.unwrap(), r.unwrap());
    assert_eq!((i.link_version, r.link_version), (5, 5));
    (
        StreamCellReader::new(a, i.link_version, i.leftover, peer()),
        b,
    )
}

#[tokio::test]
async fn an_oversized_var_cell_ends_the_link() {
    let (mut reader, mut raw) = handshaken().await;
    // VPADDING-like var cell header (command 128) claiming 60000 bytes.
    raw.write_all(&[0, 0, 0, 1, 128, 0xEA, 0x60]).await.unwrap();
    let mut out = Vec::new();
    let e = reader.read_cells(&mut out).await.unwrap_err();
    assert!(matches!(e, Error::Cell { .. }), "{e}");
}

#[tokio::test]
async fn a_truncated_cell_at_eof_is_reported() {
    let (mut reader, mut raw) = handshaken().await;
    raw.write_all(&[0, 0, 0, 1, 3, 1, 2, 3]).await.unwrap();
    drop(raw);
    let mut out = Vec::new();
    let e = reader.read_cells(&mut out).await.unwrap_err();
    assert!(e.to_string().contains("inside a cell"), "{e}");
}

#[tokio::test]
async fn handshake_cells_after_the_handshake_end_the_link() {
    let (mut reader, mut raw) = handshaken().await;
    let mut codec = onionlab_cell::codec::CellCodec::new(5);
    let mut buf = bytes::BytesMut::new();
    codec
        .encode(
            ChanCell::new(None, onionlab_cell::chan::Netinfo::from_client(None).into()),
            &mut buf,
        )
        .unwrap();
    raw.write_all(&buf).await.unwrap();
    let mut out = Vec::new();
    let e = reader.read_cells(&mut out).await.unwrap_err();
    assert!(matches!(e, Error::Protocol { .. }), "{e}");
}

#[tokio::test]
async fn no_shared_version_is_a_clear_error() {
    let (mut a, mut b) = tokio::io::duplex(4096);
    let peer_task = tokio::spawn(async move {
        // VERSIONS offering only 3.
        b.write_all(&[0, 0, 7, 0, 2, 0, 3]).await.unwrap();
        let mut sink = vec![0u8; 64];
        let _ = b.read(&mut sink).await;
    });
    let e = link::handshake(&mut a, Role::Responder { my_addrs: vec![] }, peer())
        .await
        .err()
        .expect("no shared version");
    assert!(e.to_string().contains("no shared link protocol"), "{e}");
    drop(a);
    peer_task.await.unwrap();
}

#[tokio::test]
async fn ids_are_compared_exactly() {
    // A transport built for one identity presents exactly that key.
    let k = keys(8);
    let der = onionlab_transport::tls::identity::spki_for(&k.public().ed_identity);
    assert_eq!(
        onionlab_transport::tls::identity::identity_from_spki(&der),
        Some(k.public().ed_identity)
    );
    assert_ne!(k.public().ed_identity, Ed25519Identity::new([0; 32]));
}

/// Forward one TCP connection from a fresh listener to `to`, keeping a copy
/// of each direction's bytes; returns the listener's address and the copies
/// (client to server, server to client) once both directions end.
async fn recording_proxy(
    to: SocketAddr,
) -> (SocketAddr, tokio::task::JoinHandle<(Vec<u8>, Vec<u8>)>) {
    let listener = tokio::net::TcpListener::bind(loopback()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (inbound, _) = listener.accept().await.unwrap();
        let outbound = tokio::net::TcpStream::connect(to).await.unwrap();
        let (mut in_r, mut in_w) = inbound.into_split();
        let (mut out_r, mut out_w) = outbound.into_split();
        async fn pump(
            r: &mut tokio::net::tcp::OwnedReadHalf,
            w: &mut tokio::net::tcp::OwnedWriteHalf,
        ) -> Vec<u8> {
            let (mut seen, mut buf) = (Vec::new(), vec![0u8; 65536]);
            while let Ok(n @ 1..) = r.read(&mut buf).await {
                seen.extend_from_slice(&buf[..n]);
                if w.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            let _ = w.shutdown().await;
            seen
        }
        tokio::join!(pump(&mut in_r, &mut out_w), pump(&mut out_r, &mut in_w))
    });
    (addr, task)
}

/// The lengths of the TLS records in `stream` (5-byte headers: type,
/// version, length).
fn record_lengths(stream: &[u8]) -> Vec<usize> {
    let (mut lengths, mut at) = (Vec::new(), 0);
    while at + 5 <= stream.len() {
        let len = usize::from(u16::from_be_bytes([stream[at + 3], stream[at + 4]]));
        lengths.push(len);
        at += 5 + len;
    }
    assert_eq!(at, stream.len(), "the capture ends inside a record");
    lengths
}

/// Records carry at most eight cells: a 16 KiB record is larger than a
/// fresh TCP connection's initial window, and its tail would wait a round
/// trip for an ACK before any of its cells could be decrypted.
#[tokio::test]
async fn records_are_small_enough_for_a_fresh_congestion_window() {
    let (a, b) = (keys(1), keys(2));
    let ta = TlsTransport::relay(&a, vec![]).unwrap();
    let tb = TlsTransport::relay(&b, vec![]).unwrap();
    let mut listener = tb.bind(loopback()).await.unwrap();
    let (proxy, capture) = recording_proxy(listener.local_addr()).await;
    let b_id = b.public().ed_identity;
    let (client, server) = tokio::join!(ta.connect(proxy, b_id), accept_one(&mut listener));
    let (mut client, mut server) = (client.unwrap(), server.unwrap());

    // 200 cells each way, queued before one flush: 100 KB in one write.
    let n = 200u32;
    for i in 0..n {
        client.writer.queue(relay_cell(0x8000_0000 | i, 1)).unwrap();
        server.writer.queue(relay_cell(0x8000_0000 | i, 2)).unwrap();
    }
    let (c, s) = tokio::join!(client.writer.flush(), server.writer.flush());
    c.unwrap();
    s.unwrap();
    let mut cells = Vec::new();
    for reader in [&mut client.reader, &mut server.reader] {
        let mut got = 0;
        while got < n as usize {
            cells.clear();
            reader.read_cells(&mut cells).await.unwrap();
            got += cells.len();
        }
    }
    client.writer.shutdown().await.unwrap();
    server.writer.shutdown().await.unwrap();
    drop((client, server));
    let (to_server, to_client) = capture.await.unwrap();

    // Eight 514-byte cells, the inner content type and AES-GCM's tag.
    let largest = 8 * 514 + 1 + 16;
    for (direction, stream) in [("to the server", to_server), ("to the client", to_client)] {
        let lengths = record_lengths(&stream);
        let big = lengths.iter().filter(|&&len| len > 4000).count();
        assert!(
            big >= 20,
            "{direction}: only {big} full records: {lengths:?}"
        );
        let max = lengths.iter().max().unwrap();
        assert!(*max <= largest, "{direction}: a {max}-byte record");
    }
}

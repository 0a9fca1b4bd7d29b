//! The QUIC transport on loopback: identities, lanes per circuit, both
//! modes, fallback to TLS, and a blocked lane that holds up nobody else.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use onionlab_cell::chan::{
    AnyChanCell, AnyChanMsg, ChanCell, CircId, Destroy, DestroyReason, Relay,
};
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_transport::addrs::EndpointAddrs;
use onionlab_transport::connector::Connector;
use onionlab_transport::endpoint::{EndpointKind, Endpoints};
use onionlab_transport::quic::{Mode, QuicLink, QuicSettings, QuicTransport};
use onionlab_transport::tls::TlsTransport;
use onionlab_transport::Choice;
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

async fn pair(
    mode: Mode,
) -> (
    QuicLink,
    QuicLink,
    RelaySecretKeys,
    RelaySecretKeys,
    QuicTransport,
) {
    let (a, ta) = relay(1, mode);
    let (b, tb) = relay(2, mode);
    let mut listener = tb.bind(loopback()).await.expect("bind");
    let addr = listener.local_addr();
    let (client, server) = tokio::join!(ta.connect(addr, b.public().ed_identity), async {
        listener.accept().await?.handshake().await
    });
    // The transports' endpoints live on in the links.
    (client.expect("connect"), server.expect("accept"), a, b, ta)
}

async fn relays_exchange_cells_on_lanes(mode: Mode) {
    let (mut ab, mut ba, a, b, ta) = pair(mode).await;
    assert_eq!(ab.peer.identity, Some(b.public().ed_identity));
    assert_eq!(ba.peer.identity, Some(a.public().ed_identity));
    assert_eq!(ab.link_version, 5);
    assert_eq!(ab.writer.ordering(), Ordering::PerCircuit);
    let circs = [0x8000_0001, 0x8000_0002, 0x8000_0003, 7];
    exchange(&mut ab, &mut ba, &circs, 500).await;
    // One connection for the link, plus one per circuit in conn-per-circuit
    // mode (the endpoint counts the connections it opened and accepted).
    let expected = match mode {
        Mode::StreamPerCircuit => 1,
        Mode::ConnPerCircuit => 1 + circs.len(),
    };
    assert_eq!(ta.open_connections(), expected);
    // Replies travel on the lanes the other side opened, and the
    // responder can open a lane too (circuit 9).
    exchange(&mut ba, &mut ab, &[0x8000_0001, 7, 9], 300).await;
    assert_eq!(ab.writer.send_lanes(), 5, "4 opened by us, 1 by the peer");

    // A DESTROY closes the lane; a new circuit with the same ID gets a
    // new stream, read after the old one's end.
    let destroy = ChanCell::new(CircId::new(7), Destroy::new(DestroyReason::FINISHED).into());
    ab.writer.queue(destroy).expect("destroy");
    assert_eq!(ab.writer.send_lanes(), 4);
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

/// A circuit the peer destroyed on its lane stays closed here: a late
/// cell for it (not a CREATE) is dropped instead of opening a new stream
/// the peer would only have to refuse; a CREATE2 for the same ID opens
/// one.
#[tokio::test]
async fn a_late_cell_for_a_destroyed_circuit_opens_no_lane() {
    use onionlab_cell::chan::{Create2, HandshakeType};
    let (mut ab, mut ba, ..) = pair(Mode::StreamPerCircuit).await;
    exchange(&mut ab, &mut ba, &[9], 3).await;
    let destroy = ChanCell::new(CircId::new(9), Destroy::new(DestroyReason::FINISHED).into());
    ba.writer.queue(destroy).expect("destroy");
    let mut got = Vec::new();
    while got.is_empty() {
        ab.reader.read_cells(&mut got).await.expect("read");
    }
    assert!(matches!(got[0].msg(), AnyChanMsg::Destroy(_)));
    assert_eq!(
        ab.writer.send_lanes(),
        0,
        "the lane closed with its circuit"
    );
    ab.writer.queue(relay_cell(9, 1)).expect("late cell");
    assert_eq!(ab.writer.send_lanes(), 0, "no lane for a destroyed circuit");
    let create = Create2::new(HandshakeType::NTOR, vec![7; 84]);
    ab.writer
        .queue(ChanCell::new(CircId::new(9), create.into()))
        .expect("create");
    assert_eq!(ab.writer.send_lanes(), 1, "a new circuit gets a lane");
}

#[tokio::test]
async fn stream_per_circuit_moves_cells_both_ways() {
    relays_exchange_cells_on_lanes(Mode::StreamPerCircuit).await;
}

#[tokio::test]
async fn conn_per_circuit_moves_cells_both_ways() {
    relays_exchange_cells_on_lanes(Mode::ConnPerCircuit).await;
}

/// A peer that shuts the link down while we still send to it: our
/// lane's write fails as a consequence of its close, and our reader still
/// gets every cell the peer sent before it, then a clean end (not the
/// write's error, which would drop the queued cells).
async fn a_close_while_we_send_still_delivers_the_peers_cells(mode: Mode) {
    let (mut ab, mut ba, ..) = pair(mode).await;
    // b floods a on circuit 5; a never reads, so b's lane stays busy.
    for i in 0..4000 {
        ba.writer.queue(numbered_cell(5, i)).expect("queue");
    }
    for i in 0..10 {
        ab.writer.queue(numbered_cell(7, i)).expect("queue");
    }
    ab.writer.shutdown().await.expect("shutdown");
    // b's reader looks only now, after the close reached b.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut got = Vec::new();
    let end = loop {
        match ba.reader.read_cells(&mut got).await {
            Ok(()) => {}
            Err(e) => break e,
        }
    };
    assert!(matches!(end, Error::Closed), "{end}");
    assert_eq!(got.len(), 10, "a's cells before its close");
    for (i, cell) in got.iter().enumerate() {
        let want = numbered_cell(7, i as u32);
        assert_eq!(format!("{cell:?}"), format!("{want:?}"), "cell {i}");
    }
}

#[tokio::test]
async fn stream_per_circuit_close_while_sending_delivers_the_peers_cells() {
    a_close_while_we_send_still_delivers_the_peers_cells(Mode::StreamPerCircuit).await;
}

#[tokio::test]
async fn conn_per_circuit_close_while_sending_delivers_the_peers_cells() {
    a_close_while_we_send_still_delivers_the_peers_cells(Mode::ConnPerCircuit).await;
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
    let addrs = EndpointAddrs::default()
        .with(EndpointKind::TCP, tls_addr)
        .with(EndpointKind::QUIC, silent.local_addr().expect("addr"));
    tokio::spawn(async move {
        loop {
            if let Ok(i) = listener.accept().await {
                tokio::spawn(i.handshake());
            }
        }
    });
    let connector = Connector::new(
        Endpoints::new()
            .with(EndpointKind::TCP, TlsTransport::client())
            .with(
                EndpointKind::QUIC,
                QuicTransport::client(QuicSettings::default()),
            ),
        Choice::Auto,
    )
    .expect("connector");
    let link = connector
        .connect(&addrs, r.public().ed_identity)
        .await
        .expect("fallback");
    assert_eq!(link.writer.kind(), TransportKind::TLS);

    let forced = Connector::new(
        Endpoints::new()
            .with(EndpointKind::TCP, TlsTransport::client())
            .with(
                EndpointKind::QUIC,
                QuicTransport::client(QuicSettings {
                    handshake_timeout: Duration::from_millis(500),
                    ..QuicSettings::default()
                }),
            ),
        Choice::Only(TransportKind::QUIC),
    )
    .expect("connector");
    assert!(forced
        .connect(&addrs, r.public().ed_identity)
        .await
        .is_err());
}

/// A cell of circuit `circ` whose body encodes its index `i` (and is
/// different at every byte position), so the peer can check order and
/// content.
fn numbered_cell(circ: u32, i: u32) -> AnyChanCell {
    ChanCell::new(
        CircId::new(circ),
        AnyChanMsg::Relay(Relay::new(numbered_body(i))),
    )
}

fn numbered_body(i: u32) -> [u8; 509] {
    let mut body = [0u8; 509];
    body[..4].copy_from_slice(&i.to_be_bytes());
    for (j, b) in body.iter_mut().enumerate().skip(4) {
        *b = (i as usize).wrapping_mul(31).wrapping_add(j) as u8;
    }
    body
}

/// A QUIC peer built from quinn directly that speaks just enough of the
/// link layer (preamble, link handshake, lane headers) to accept a
/// relay's link, and then reads only the lanes it chooses.
fn raw_peer_endpoint(keys: &RelaySecretKeys) -> quinn::Endpoint {
    use onionlab_transport::quic;
    use onionlab_transport::tls::identity;
    use quinn::VarInt;
    use std::sync::Arc;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = identity::certified_key(&provider, keys.ed25519_keypair()).expect("our key");
    let mut tls = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_client_cert_verifier(Arc::new(identity::AnyRelayIdentity::new(&provider)))
        .with_cert_resolver(Arc::new(
            rustls::server::AlwaysResolvesServerRawPublicKeys::new(key),
        ));
    tls.alpn_protocols = vec![quic::ALPN.to_vec()];
    tls.max_early_data_size = 0;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).expect("QUIC TLS config");
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    // The same receive windows as a real relay: lane X can have at most
    // STREAM_WINDOW bytes in flight to us until we read it (we never do).
    let mut transport = quinn::TransportConfig::default();
    transport
        .stream_receive_window(VarInt::from_u32(quic::STREAM_WINDOW))
        .receive_window(VarInt::from_u32(quic::CONNECTION_WINDOW))
        .max_concurrent_bidi_streams(VarInt::from_u32(16))
        .max_concurrent_uni_streams(VarInt::from_u32(0));
    server.transport_config(Arc::new(transport));
    quinn::Endpoint::server(server, loopback()).expect("raw peer endpoint")
}

/// What the raw peer keeps alive until the test is done.
struct RawPeerState {
    _conn: quinn::Connection,
    _control: (quinn::RecvStream, quinn::SendStream),
    /// Lane X's streams: accepted, header read, never read further.
    held: Vec<(quinn::SendStream, quinn::RecvStream)>,
}

/// Accept one link on `endpoint`, then accept lanes: keep `blocked`'s
/// stream unread and read `n` cells of `open`'s lane, checking each.
async fn raw_peer(endpoint: quinn::Endpoint, blocked: u32, open: u32, n: u32) -> RawPeerState {
    use bytes::BytesMut;
    use onionlab_cell::codec::CellCodec;
    use onionlab_transport::link::{self, Role};
    use tokio::io::AsyncWriteExt;

    let incoming = endpoint.accept().await.expect("an incoming connection");
    let addr = incoming.remote_address();
    let conn = incoming.await.expect("QUIC handshake");
    let (mut send, mut recv) = conn.accept_bi().await.expect("control stream");
    let mut preamble = [0u8; 4 + 1 + 16];
    recv.read_exact(&mut preamble).await.expect("preamble");
    assert_eq!(&preamble[..4], b"OLQ1", "link preamble magic");
    assert_eq!(preamble[4], 0, "stream-per-circuit mode byte");
    let mut answer = b"OLQ1".to_vec();
    answer.extend_from_slice(&[0x5a; 16]);
    send.write_all(&answer).await.expect("preamble answer");
    let mut control = tokio::io::join(recv, send);
    let negotiated = link::handshake(&mut control, Role::Responder { my_addrs: vec![] }, addr)
        .await
        .expect("link handshake");
    control.flush().await.expect("flush the handshake");

    let mut held = Vec::new();
    loop {
        let (s, mut r) = conn.accept_bi().await.expect("a lane");
        let mut header = [0u8; 4];
        r.read_exact(&mut header).await.expect("lane header");
        let circ = u32::from_be_bytes(header);
        if circ == blocked {
            held.push((s, r));
            continue;
        }
        assert_eq!(circ, open, "a lane for an unexpected circuit");
        let mut codec = CellCodec::new(negotiated.link_version);
        let mut buf = BytesMut::new();
        let mut next = 0u32;
        while next < n {
            buf.reserve(32 * 1024);
            let got = tokio::io::AsyncReadExt::read_buf(&mut r, &mut buf)
                .await
                .expect("lane read");
            assert!(got > 0, "lane {open} ended after {next} of {n} cells");
            while let Some(cell) = codec.decode(&mut buf).expect("a valid cell") {
                assert_eq!(cell.circid().map(u32::from), Some(open), "cell {next}");
                let (_, msg) = cell.into_circid_and_msg();
                let AnyChanMsg::Relay(relay) = msg else {
                    panic!("cell {next} is {msg:?}");
                };
                assert!(
                    *relay.into_relay_body() == numbered_body(next),
                    "cell {next} of circuit {open} is corrupt or out of order"
                );
                next += 1;
            }
        }
        assert!(buf.is_empty(), "more than {n} cells on lane {open}");
        return RawPeerState {
            _conn: conn,
            _control: control.into_inner(),
            held,
        };
    }
}

/// Head-of-line blocking, checked without timing: the peer never reads
/// circuit X's stream, so QUIC flow control lets at most STREAM_WINDOW
/// bytes of X leave the sender, and everything else queued on X stays in
/// X's lane buffer for good; circuit Y on the same connection must still
/// deliver all its cells (more than one stream window, so the peer has to
/// grant Y credit as it reads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_lane_does_not_hold_up_another_circuit() {
    use onionlab_transport::quic::{LANE_HIGH_WATER, STREAM_WINDOW};

    const X: u32 = 0x8000_0011;
    const Y: u32 = 0x8000_0022;
    const CELL: usize = 514;
    const X_BYTES: usize = 2 << 20;
    const Y_CELLS: u32 = 3000;
    let limit = Duration::from_secs(30);
    assert!(X_BYTES > STREAM_WINDOW as usize + LANE_HIGH_WATER + CELL);
    assert!(Y_CELLS as usize * CELL > STREAM_WINDOW as usize);

    let peer_keys = keys(20);
    let endpoint = raw_peer_endpoint(&peer_keys);
    let addr = endpoint.local_addr().expect("raw peer address");
    let peer = tokio::spawn(raw_peer(endpoint.clone(), X, Y, Y_CELLS));

    let (_k, t) = relay(21, Mode::StreamPerCircuit);
    let mut link = tokio::time::timeout(limit, t.connect(addr, peer_keys.public().ed_identity))
        .await
        .expect("connect timed out")
        .expect("connect to the raw peer");
    let x = CircId::new(X).expect("nonzero");
    let y = CircId::new(Y).expect("nonzero");

    // Far more on X than its stream window and lane buffer can take.
    // Whatever the lane task has managed to write, at least
    // X_BYTES - STREAM_WINDOW stay in X's lane, above its high-water mark.
    let x_cells = X_BYTES / CELL;
    for i in 0..x_cells {
        link.writer
            .queue(numbered_cell(X, i as u32))
            .expect("queue on X");
    }
    assert!(!link.writer.has_room_for(x), "X has room after 2 MiB");

    // Y, respecting back-pressure on its own lane only.
    for i in 0..Y_CELLS {
        while !link.writer.has_room_for(y) {
            tokio::time::timeout(limit, link.writer.writable())
                .await
                .expect("Y's lane never drained: blocked behind X");
        }
        link.writer.queue(numbered_cell(Y, i)).expect("queue on Y");
        assert!(
            !link.writer.has_room_for(x),
            "X got room while the peer reads nothing of it"
        );
    }
    let state = tokio::time::timeout(limit, peer)
        .await
        .expect("the peer did not get Y's cells: blocked behind X")
        .expect("raw peer");

    // X is still blocked, with its backlog still in its lane.
    assert_eq!(state.held.len(), 1, "X's lane reached the peer");
    assert!(!link.writer.has_room_for(x));
    let backlog = x_cells * CELL - STREAM_WINDOW as usize;
    assert!(
        link.writer.buffered_bytes() >= backlog,
        "X's lane holds {} bytes, expected at least {backlog}",
        link.writer.buffered_bytes()
    );
    drop(link);
    drop(state);
    endpoint.close(0u32.into(), b"done");
}

#[tokio::test]
async fn every_congestion_controller_carries_a_circuit() {
    use onionlab_transport::quic::Congestion;
    for (i, congestion) in [Congestion::Cubic, Congestion::NewReno, Congestion::Bbr]
        .into_iter()
        .enumerate()
    {
        let quic = QuicSettings {
            congestion,
            ..QuicSettings::default()
        };
        let (b, tb) = (keys(20 + i as u64), QuicTransport::client(quic));
        let tr = QuicTransport::relay(&b, vec![], loopback(), quic).expect("relay");
        let mut listener = tr.bind(loopback()).await.expect("bind");
        let addr = listener.local_addr();
        let (c, s) = tokio::join!(tb.connect(addr, b.public().ed_identity), async {
            listener.accept().await?.handshake().await
        });
        let (mut c, mut s) = (c.expect("connect"), s.expect("accept"));
        exchange(&mut c, &mut s, &[0x8000_0010, 0x8000_0011], 400).await;
        exchange(&mut s, &mut c, &[0x8000_0010], 400).await;
    }
}

/// What a link holds received, as the relay counts it toward its memory
/// cap: while the reader does not read, decoded cells wait in its queue
/// and the lanes behind them wait too (each counted at its stream window,
/// which quinn may hold); once everything is read, nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_link_reports_what_it_holds() {
    use onionlab_transport::quic::{CONNECTION_WINDOW, STREAM_WINDOW};
    let (mut ab, mut ba, _, _, _ta) = pair(Mode::StreamPerCircuit).await;
    assert_eq!(ba.reader.buffered_bytes(), 0);
    let circs: Vec<u32> = (1..=8).collect();
    let per_circ = 600u32;
    for i in 0..per_circ {
        for &c in &circs {
            let id = CircId::new(c).expect("nonzero");
            while !ab.writer.has_room_for(id) {
                ab.writer.writable().await;
            }
            ab.writer.queue(relay_cell(c, i as u8)).expect("queue");
        }
    }
    let sent = circs.len() * per_circ as usize * 514;
    // The reader's queue fills (about a megabyte) and lanes wait on it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let held = loop {
        let held = ba.reader.buffered_bytes();
        if held >= STREAM_WINDOW as usize {
            break held;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the unread link reports only {held} bytes"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        held <= sent + CONNECTION_WINDOW as usize,
        "{held} bytes reported, {sent} sent"
    );
    // Read everything: the figure returns to nothing (no partial cell, no
    // read buffer kept by the idle lanes).
    let mut cells = Vec::new();
    let mut n = 0;
    while n < sent / 514 {
        cells.clear();
        ba.reader.read_cells(&mut cells).await.expect("read");
        n += cells.len();
    }
    assert_eq!(n, sent / 514);
    assert_eq!(ba.reader.buffered_bytes(), 0);
    // The sender's lanes drained into quinn.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while ab.writer.buffered_bytes() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "lanes never drained"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

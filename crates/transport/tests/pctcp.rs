//! The pctcp transport on loopback: one TLS connection per circuit, every
//! cell of every circuit delivered in order both ways, lanes closed by
//! DESTROY, reused circuit IDs ordered across lanes, the lane cap and its
//! fallback, and lanes refused to and from the wrong identity.

use std::net::SocketAddr;
use std::time::Duration;

use onionlab_cell::chan::{AnyChanCell, AnyChanMsg};
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_transport::addrs::EndpointAddrs;
use onionlab_transport::any::AnyLink;
use onionlab_transport::connector::Connector;
use onionlab_transport::endpoint::{EndpointKind, Endpoints, Listeners};
use onionlab_transport::pctcp::PctcpSettings;
use onionlab_transport::tls::TlsTransport;
use onionlab_transport::{
    CellReader, CellWriter, Choice, Error, Listener, Transport, TransportKind,
};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::mpsc;

mod lanes_common;
use lanes_common::*;

fn keys(seed: u64) -> RelaySecretKeys {
    RelaySecretKeys::generate(&mut StdRng::seed_from_u64(seed))
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("literal")
}

/// A relay node for the tests: its TCP transport, listening, handing the
/// links it accepts to a channel (lanes join their links on their own).
struct Node {
    id: tor_llcrypto::pk::ed25519::Ed25519Identity,
    tcp: TlsTransport,
    addr: SocketAddr,
    accepted: mpsc::UnboundedReceiver<Result<AnyLink, Error>>,
}

async fn node(seed: u64, max_lanes: usize, lanes_at: Option<SocketAddr>) -> Node {
    let k = keys(seed);
    let mut tcp = TlsTransport::relay(&k, vec![])
        .expect("tls")
        .with_lanes(PctcpSettings { max_lanes });
    let listener = tcp.bind(loopback()).await.expect("bind");
    let addr = Listener::local_addr(&listener);
    // Links this node opens tell the peer where its lanes go (shares the
    // listener's pctcp state).
    tcp = tcp.with_lane_address(lanes_at.unwrap_or(addr));
    let (tx, accepted) = mpsc::unbounded_channel();
    let mut any = Listeners::new().with(listener);
    tokio::spawn(async move {
        while let Ok(incoming) = any.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                match incoming.handshake().await {
                    Ok(Some(link)) => {
                        let _ = tx.send(Ok(link));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            });
        }
    });
    Node {
        id: k.public().ed_identity,
        tcp,
        addr,
        accepted,
    }
}

async fn link(from: &Node, to: &mut Node) -> (AnyLink, AnyLink) {
    let endpoints = Endpoints::new().with(EndpointKind::TCP, from.tcp.clone());
    let connector =
        Connector::new(endpoints, Choice::Only(TransportKind::PCTCP)).expect("connector");
    let addrs = EndpointAddrs::default().with(EndpointKind::TCP, to.addr);
    let (ours, theirs) = tokio::join!(connector.connect(&addrs, to.id), to.accepted.recv());
    let ours = ours.expect("link opens");
    let theirs = theirs.expect("accepted").expect("link accepted");
    assert_eq!(ours.writer.kind(), TransportKind::PCTCP);
    assert_eq!(theirs.writer.kind(), TransportKind::PCTCP);
    assert_eq!(theirs.peer.identity, Some(from.id));
    (ours, theirs)
}

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("never: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_circuit_gets_its_own_connection_and_its_cells_in_order() {
    let a = node(1, 64, None).await;
    let mut b = node(2, 64, None).await;
    let (mut ab, mut ba) = link(&a, &mut b).await;
    let circs: Vec<u32> = (1..=8).map(|i| 0x8000_0000 | i).collect();
    let n = 300;
    let cells: Vec<AnyChanCell> = (0..n)
        .flat_map(|i| circs.iter().map(move |&c| cell(c, i)))
        .collect();
    let (_, got) = tokio::join!(
        send(&mut ab.writer, cells),
        receive(&mut ba.reader, circs.len() * n as usize)
    );
    for (circ, idx) in per_circuit(&got) {
        assert_eq!(idx, (0..n).collect::<Vec<_>>(), "circuit {circ:#x}");
    }
    assert_eq!(a.tcp.open_lanes(), circs.len());
    eventually("b counts the lanes", || b.tcp.open_lanes() == circs.len()).await;
    // Replies go back on the same lanes: no new connection.
    let replies: Vec<AnyChanCell> = circs.iter().map(|&c| cell(c, 7)).collect();
    let (_, got) = tokio::join!(
        send(&mut ba.writer, replies),
        receive(&mut ab.reader, circs.len())
    );
    assert_eq!(got.len(), circs.len());
    assert_eq!(a.tcp.open_lanes(), circs.len());
    // A DESTROY each way ends a lane.
    send(&mut ab.writer, vec![destroy(circs[0])]).await;
    let got = receive(&mut ba.reader, 1).await;
    assert!(matches!(got[0].msg(), AnyChanMsg::Destroy(_)));
    eventually("the destroyed circuit's lane closes", || {
        a.tcp.open_lanes() == circs.len() - 1 && b.tcp.open_lanes() == circs.len() - 1
    })
    .await;
    assert_eq!(a.tcp.lane_fallbacks(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_circuit_id_is_delivered_after_the_old_circuits_destroy() {
    let a = node(3, 64, None).await;
    let mut b = node(4, 64, None).await;
    let (mut ab, mut ba) = link(&a, &mut b).await;
    reused_circuit_id_is_ordered(&mut ab.writer, &mut ba.reader, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn above_the_cap_circuits_share_the_main_connection() {
    let a = node(5, 3, None).await;
    let mut b = node(6, 64, None).await;
    let (mut ab, mut ba) = link(&a, &mut b).await;
    let circs: Vec<u32> = (1..=6).map(|i| 0x8000_0100 | i).collect();
    let cells: Vec<AnyChanCell> = (0..50)
        .flat_map(|i| circs.iter().map(move |&c| cell(c, i)))
        .collect();
    let (_, got) = tokio::join!(send(&mut ab.writer, cells), receive(&mut ba.reader, 300));
    for (circ, idx) in per_circuit(&got) {
        assert_eq!(idx, (0..50).collect::<Vec<_>>(), "circuit {circ:#x}");
    }
    assert_eq!(a.tcp.open_lanes(), 3);
    assert_eq!(a.tcp.lane_fallbacks(), 3);
    // Replies to the circuits on the main connection stay there.
    let replies: Vec<AnyChanCell> = circs.iter().map(|&c| cell(c, 99)).collect();
    let (_, got) = tokio::join!(send(&mut ba.writer, replies), receive(&mut ab.reader, 6));
    assert_eq!(got.len(), 6);
    assert_eq!(a.tcp.open_lanes(), 3);
    eventually("b opened no lane of its own", || b.tcp.open_lanes() == 3).await;
    // b destroys a circuit on the main connection; a cell a still had
    // queued for it is dropped, not given a lane of its own.
    let on_main = circs[5];
    send(&mut ba.writer, vec![destroy(on_main)]).await;
    let got = receive(&mut ab.reader, 1).await;
    assert!(matches!(got[0].msg(), AnyChanMsg::Destroy(_)));
    ab.writer.queue(cell(on_main, 100)).expect("queue");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(a.tcp.open_lanes(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_to_a_relay_that_is_not_the_link_peer_is_refused() {
    // Relay c listens; relay a claims c's address as where it accepts
    // lanes. When b opens a lane toward a, c answers with its own key:
    // b refuses it, and the link fails rather than deliver to c.
    let c = node(7, 64, None).await;
    let a = node(8, 64, Some(c.addr)).await;
    let mut b = node(9, 64, None).await;
    let (_ab, mut ba) = link(&a, &mut b).await;
    // b sends first on a circuit of its own: it opens the lane.
    ba.writer.queue(cell(0x0000_0077, 1)).expect("queue");
    let mut cells = Vec::new();
    let err = tokio::time::timeout(Duration::from_secs(10), ba.reader.read_cells(&mut cells))
        .await
        .expect("the failure is reported in time")
        .expect_err("the link fails");
    assert!(matches!(err, Error::WrongIdentity { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_lane_ends_its_circuit_not_the_link() {
    use onionlab_cell::chan::DestroyReason;
    // Relay a claims a lane address where nothing listens: b's lane
    // toward a is refused. Only that circuit ends (b's node gets a
    // DESTROY); the link carries the next circuit on its main connection.
    let closed = std::net::TcpListener::bind(loopback())
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let a = node(13, 64, Some(closed)).await;
    let mut b = node(14, 64, None).await;
    let (mut ab, mut ba) = link(&a, &mut b).await;
    let (refused, next) = (0x0000_0078, 0x0000_0079);
    ba.writer.queue(cell(refused, 1)).expect("queue");
    let got = receive(&mut ba.reader, 1).await;
    assert_eq!(got[0].circid().map(u32::from), Some(refused));
    match got[0].msg() {
        AnyChanMsg::Destroy(d) => assert_eq!(d.reason(), DestroyReason::CHANNEL_CLOSED),
        other => panic!("not a DESTROY: {other:?}"),
    }
    let (_, got) = tokio::join!(
        send(&mut ba.writer, vec![cell(next, 1), cell(next, 2)]),
        receive(&mut ab.reader, 2)
    );
    assert_eq!(per_circuit(&got)[&next], [1, 2]);
    assert_eq!(b.tcp.lane_fallbacks(), 1);
    // The refused lane's count goes when its task ends.
    eventually("the refused lane closed", || b.tcp.open_lanes() == 0).await;
    // What was queued on the refused lane is no longer counted.
    eventually("b's queues drained", || ba.writer.buffered_bytes() == 0).await;
    let (_, got) = tokio::join!(
        send(&mut ab.writer, vec![cell(next, 3)]),
        receive(&mut ba.reader, 1)
    );
    assert_eq!(index_of(&got[0]), Some((next, 3)));
}

/// Closing a link's sending side is prompt: the writer flushes what it
/// holds on the main connection and every lane, and returns once they are
/// written and the peer, reading them, closed its side (never waiting for
/// the liveness watch, which only an abort ends). The peer gets
/// every cell of the lanes it has accepted, then the end of the link. (A
/// lane the closing side opened just before closing may still be in its
/// handshake when the main connection's end arrives: its cells are lost
/// with the link, as those of its circuit would be.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flushes_every_lane_and_returns_promptly() {
    let a = node(11, 64, None).await;
    let mut b = node(12, 64, None).await;
    let (mut ab, mut ba) = link(&a, &mut b).await;
    let circs: Vec<u32> = (1..=4).map(|i| 0x8000_0000 | i).collect();
    let n = 200;
    let cells_from = |first: u32| -> Vec<AnyChanCell> {
        (first..n)
            .flat_map(|i| circs.iter().map(move |&c| cell(c, i)))
            .collect()
    };
    send(&mut ab.writer, cells_from(n - 1)).await;
    eventually("b accepts every lane", || b.tcp.open_lanes() == circs.len()).await;
    send(&mut ab.writer, cells_from(0)).await;
    let closing = shut_down_within(&mut ab.writer, Duration::from_secs(5));
    let reading = async {
        let mut got = Vec::new();
        while got.len() < circs.len() * (n as usize + 1) {
            if let Err(e) = ba.reader.read_cells(&mut got).await {
                let per: Vec<(u32, usize)> = per_circuit(&got)
                    .into_iter()
                    .map(|(c, v)| (c, v.len()))
                    .collect();
                panic!("{e} after {} cells: {per:?}", got.len());
            }
        }
        got
    };
    let (took, got) = tokio::join!(closing, reading);
    let mut want: Vec<u32> = vec![n - 1];
    want.extend(0..n);
    for (circ, idx) in per_circuit(&got) {
        assert_eq!(idx, want, "circuit {circ:#x}");
    }
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    let end = end_of(&mut ba.reader, Duration::from_secs(5)).await;
    assert!(matches!(end, Error::Closed), "{end:?}");
}

//! What the tests of the per-circuit-lane transports (pctcp, dtls-utcp)
//! share: numbered cells, sending with each lane's room, receiving, and
//! the reused-circuit-ID check.
#![allow(dead_code)]

use std::time::Duration;

use onionlab_cell::chan::{
    AnyChanCell, AnyChanMsg, ChanCell, CircId, Destroy, DestroyReason, Relay,
};
use std::net::SocketAddr;

use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_transport::any::AnyLink;
use onionlab_transport::endpoint::Listeners;
use onionlab_transport::tls::TlsTransport;
use onionlab_transport::{CellReader, CellWriter, Listener, Transport};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tor_llcrypto::pk::ed25519::Ed25519Identity;

/// A relay's TCP transport (made by `configure` from the plain one) on
/// loopback, listening, its lanes accepted at its listener, and the links
/// it accepts.
pub struct TcpRelay {
    pub tcp: TlsTransport,
    pub addr: SocketAddr,
    pub id: Ed25519Identity,
    pub accepted: tokio::sync::mpsc::UnboundedReceiver<AnyLink>,
}

pub async fn tcp_relay(
    seed: u64,
    configure: impl FnOnce(TlsTransport) -> TlsTransport,
) -> TcpRelay {
    let k = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(seed));
    let tcp = configure(TlsTransport::relay(&k, vec![]).expect("tls"));
    let listener = tcp
        .bind("127.0.0.1:0".parse().expect("literal"))
        .await
        .expect("bind");
    let addr = Listener::local_addr(&listener);
    let tcp = tcp.with_lane_address(addr);
    let (tx, accepted) = tokio::sync::mpsc::unbounded_channel();
    let mut any = Listeners::new().with(listener);
    tokio::spawn(async move {
        while let Ok(incoming) = any.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Ok(Some(link)) = incoming.handshake().await {
                    let _ = tx.send(link);
                }
            });
        }
    });
    TcpRelay {
        tcp,
        addr,
        id: k.public().ed_identity,
        accepted,
    }
}

/// A link of `kind` (a transport on the TCP endpoint) from `from` to
/// `to`, both ends.
pub async fn tcp_link(
    from: &TcpRelay,
    to: &mut TcpRelay,
    kind: onionlab_transport::TransportKind,
) -> (AnyLink, AnyLink) {
    use onionlab_transport::addrs::EndpointAddrs;
    use onionlab_transport::connector::Connector;
    use onionlab_transport::endpoint::{EndpointKind, Endpoints};
    let endpoints = Endpoints::new().with(EndpointKind::TCP, from.tcp.clone());
    let connector =
        Connector::new(endpoints, onionlab_transport::Choice::Only(kind)).expect("connector");
    let addrs = EndpointAddrs::default().with(EndpointKind::TCP, to.addr);
    let (ours, theirs) = tokio::join!(connector.connect(&addrs, to.id), to.accepted.recv());
    (ours.expect("link opens"), theirs.expect("link accepted"))
}

/// Cell `i` of circuit `circ`: its index, then the circuit, in the first
/// body bytes.
pub fn cell(circ: u32, i: u32) -> AnyChanCell {
    let mut body = [0u8; 509];
    body[..4].copy_from_slice(&i.to_be_bytes());
    body[4..8].copy_from_slice(&circ.to_be_bytes());
    ChanCell::new(CircId::new(circ), AnyChanMsg::Relay(Relay::new(body)))
}

pub fn destroy(circ: u32) -> AnyChanCell {
    ChanCell::new(
        CircId::new(circ),
        AnyChanMsg::Destroy(Destroy::new(DestroyReason::FINISHED)),
    )
}

/// (circuit, index) of a cell from [`cell`]; `None` for others.
pub fn index_of(c: &AnyChanCell) -> Option<(u32, u32)> {
    let AnyChanMsg::Relay(r) = c.msg().clone() else {
        return None;
    };
    let body = r.into_relay_body();
    let i = u32::from_be_bytes(body[..4].try_into().ok()?);
    Some((c.circid().map(u32::from)?, i))
}

/// Queue `cells` on `w` respecting each lane's room.
pub async fn send(w: &mut impl CellWriter, cells: Vec<AnyChanCell>) {
    for c in cells {
        let id = c.circid().expect("circuit cell");
        while !w.has_room_for(id) {
            tokio::time::timeout(Duration::from_secs(10), w.writable())
                .await
                .expect("a lane drains");
        }
        w.queue(c).expect("queue");
    }
}

/// Read until `n` cells arrived.
pub async fn receive(r: &mut impl CellReader, n: usize) -> Vec<AnyChanCell> {
    let mut got = Vec::new();
    while got.len() < n {
        tokio::time::timeout(Duration::from_secs(20), r.read_cells(&mut got))
            .await
            .expect("cells arrive in time")
            .expect("link alive");
    }
    got
}

/// Cells of each circuit, in the order received.
pub fn per_circuit(cells: &[AnyChanCell]) -> std::collections::BTreeMap<u32, Vec<u32>> {
    let mut m = std::collections::BTreeMap::<u32, Vec<u32>>::new();
    for c in cells {
        if let Some((circ, i)) = index_of(c) {
            m.entry(circ).or_default().push(i);
        }
    }
    m
}

/// Rounds of a circuit's cells and DESTROY, the same circuit ID each
/// time (so each round on a new lane): the receiver must see every
/// DESTROY before the next round's cells.
pub async fn reused_circuit_id_is_ordered(
    w: &mut impl CellWriter,
    r: &mut impl CellReader,
    rounds: u32,
) {
    let circ = 0x8000_0042;
    let mut cells = Vec::new();
    for round in 0..rounds {
        for i in 0..20 {
            cells.push(cell(circ, round * 100 + i));
        }
        cells.push(destroy(circ));
    }
    let n = cells.len();
    let (_, got) = tokio::join!(send(w, cells), receive(r, n));
    let mut want = Vec::new();
    for round in 0..rounds {
        want.extend((0..20).map(|i| Some(round * 100 + i)));
        want.push(None);
    }
    let seen: Vec<Option<u32>> = got.iter().map(|c| index_of(c).map(|x| x.1)).collect();
    assert_eq!(seen, want);
}

/// Shut `w` down within `limit`; how long it took.
pub async fn shut_down_within(w: &mut impl CellWriter, limit: Duration) -> Duration {
    let started = std::time::Instant::now();
    tokio::time::timeout(limit, w.shutdown())
        .await
        .expect("shutdown returns in time")
        .expect("shutdown");
    started.elapsed()
}

/// Read (and drop) cells until the link ends, within `limit`: how it
/// ended.
pub async fn end_of(r: &mut impl CellReader, limit: Duration) -> onionlab_transport::Error {
    let mut cells = Vec::new();
    tokio::time::timeout(limit, async {
        loop {
            if let Err(e) = r.read_cells(&mut cells).await {
                return e;
            }
        }
    })
    .await
    .expect("the link's end follows its cells")
}

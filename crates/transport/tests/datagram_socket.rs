//! Datagram links on loopback, with real UDP sockets: relays prove their
//! identities and carry cells; a man in the middle that replays,
//! truncates and changes every datagram of one link delivers each cell
//! once and ends nothing; datagrams from nowhere open nothing; a relay
//! that proves another identity is refused; another link on the same
//! socket goes on throughout.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onionlab_dgram::wire::CELL_LEN;
use onionlab_transport::datagram::{endpoint_config, CellLinkConfig, DatagramSocket, LinkEvent};
use tokio::net::UdpSocket;
use tor_llcrypto::pk::ed25519::{Ed25519Identity, Keypair};

const WAIT: Duration = Duration::from_secs(10);

fn keypair(seed: u8) -> Arc<Keypair> {
    Arc::new(Keypair::from_bytes(&[seed; 32]))
}

fn identity(k: &Keypair) -> Ed25519Identity {
    Ed25519Identity::from(k.verifying_key())
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn relay(seed: u8) -> DatagramSocket {
    let config = endpoint_config(
        Some(keypair(seed)),
        true,
        CellLinkConfig::default(),
        Duration::from_secs(5),
    );
    DatagramSocket::bind(loopback(), config).expect("bind")
}

fn client() -> DatagramSocket {
    let config = endpoint_config(
        None,
        false,
        CellLinkConfig::default(),
        Duration::from_secs(5),
    );
    DatagramSocket::bind(loopback(), config).expect("bind")
}

fn cell(i: u32) -> Box<[u8; CELL_LEN]> {
    let mut c = [0u8; CELL_LEN];
    c[..4].copy_from_slice(&i.to_be_bytes());
    c[4] = 3;
    c[CELL_LEN - 4..].copy_from_slice(&i.to_le_bytes());
    Box::new(c)
}

/// The next event, or a panic after [`WAIT`].
async fn next(s: &DatagramSocket) -> LinkEvent {
    tokio::time::timeout(WAIT, s.next_event())
        .await
        .expect("an event in time")
}

/// Wait for `peer`'s link to come up at `s`.
async fn up(s: &DatagramSocket) -> (SocketAddr, Option<Ed25519Identity>) {
    match next(s).await {
        LinkEvent::Up { peer, identity, .. } => (peer, identity),
        other => panic!("expected a link up, got {other:?}"),
    }
}

/// Send cells `range` to `peer`, paced so that loopback's socket buffers
/// hold them even when a man in the middle sends each datagram five
/// times (eight cells, at most 40 datagrams, per millisecond).
async fn send_cells(s: &DatagramSocket, peer: SocketAddr, range: std::ops::Range<u32>) {
    for i in range {
        assert!(s.send(peer, cell(i)).expect("link up"), "send queue full");
        if i % 8 == 7 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// Collect `n` cells at `s`, by sender; panics on any other event.
async fn cells(s: &DatagramSocket, n: usize) -> Vec<(SocketAddr, u32)> {
    let mut got = Vec::new();
    while got.len() < n {
        match next(s).await {
            LinkEvent::Cell { peer, cell } => {
                assert_eq!(&cell[..], &cell_bytes(&cell)[..], "a changed cell");
                got.push((
                    peer,
                    u32::from_be_bytes([cell[0], cell[1], cell[2], cell[3]]),
                ));
            }
            other => panic!("expected cells, got {other:?}"),
        }
    }
    got
}

/// The cell its first bytes name, as [`cell`] makes it.
fn cell_bytes(c: &[u8; CELL_LEN]) -> Box<[u8; CELL_LEN]> {
    cell(u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_prove_identities_and_carry_cells_both_ways() {
    let (a, b) = (relay(1), relay(2));
    a.connect(b.local_addr(), identity(&keypair(2)))
        .expect("connect");
    let (b_seen_from_a, id_b) = up(&a).await;
    let (a_seen_from_b, id_a) = up(&b).await;
    assert_eq!(
        (b_seen_from_a, id_b),
        (b.local_addr(), Some(identity(&keypair(2))))
    );
    assert_eq!(id_a, Some(identity(&keypair(1))));
    send_cells(&a, b_seen_from_a, 0..300).await;
    let got = cells(&b, 300).await;
    let mut numbers: Vec<u32> = got.iter().map(|g| g.1).collect();
    numbers.sort_unstable();
    assert_eq!(numbers, (0..300).collect::<Vec<_>>());
    send_cells(&b, a_seen_from_b, 0..50).await;
    assert_eq!(cells(&a, 50).await.len(), 50);
    assert_eq!(a.link_stats(b_seen_from_a).expect("up").cells_out, 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_with_another_identity_is_refused() {
    let (a, b) = (relay(1), relay(2));
    a.connect(b.local_addr(), identity(&keypair(3)))
        .expect("connect");
    match next(&a).await {
        LinkEvent::Down { peer, reason } => {
            assert_eq!(peer, b.local_addr());
            assert!(reason.contains("identity"), "{reason}");
        }
        other => panic!("expected the link refused, got {other:?}"),
    }
    assert!(a.send(b.local_addr(), cell(0)).is_err());
}

/// A UDP relay between `a` and `b`'s address: every datagram passes; once
/// `mangle` is set, each one from `a` is followed by a copy, a copy cut
/// short by a byte, a copy cut to 13 bytes and a copy with a byte
/// changed.
async fn man_in_the_middle(b: SocketAddr, mangle: Arc<AtomicBool>) -> SocketAddr {
    let socket = UdpSocket::bind(loopback()).await.expect("bind");
    let addr = socket.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        let mut a = None;
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                return;
            };
            let d = buf[..n].to_vec();
            if from == b {
                if let Some(a) = a {
                    let _ = socket.send_to(&d, a).await;
                }
                continue;
            }
            a = Some(from);
            let _ = socket.send_to(&d, b).await;
            if mangle.load(Ordering::Relaxed) {
                let mut changed = d.clone();
                let mid = changed.len() / 2;
                changed[mid] ^= 0x10;
                for bad in [
                    d.clone(),
                    d[..n - 1].to_vec(),
                    d[..n.min(13)].to_vec(),
                    changed,
                ] {
                    let _ = socket.send_to(&bad, b).await;
                }
            }
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_truncated_and_changed_datagrams_deliver_each_cell_once() {
    let (a, b, c) = (relay(1), relay(2), client());
    let mangle = Arc::new(AtomicBool::new(false));
    let middle = man_in_the_middle(b.local_addr(), mangle.clone()).await;
    a.connect(middle, identity(&keypair(2))).expect("connect");
    let (to_b, _) = up(&a).await;
    up(&b).await;
    // A client's link to b on the same socket, untouched.
    c.connect(b.local_addr(), identity(&keypair(2)))
        .expect("connect");
    let (c_to_b, _) = up(&c).await;
    let (_, client_identity) = up(&b).await;
    assert_eq!(client_identity, None, "a client stays anonymous");

    mangle.store(true, Ordering::Relaxed);
    send_cells(&a, to_b, 0..200).await;
    send_cells(&c, c_to_b, 1000..1100).await;
    let got = cells(&b, 300).await;
    let (mut from_a, mut from_c): (Vec<u32>, Vec<u32>) = (Vec::new(), Vec::new());
    for (peer, i) in got {
        if peer == middle {
            from_a.push(i);
        } else {
            from_c.push(i);
        }
    }
    from_a.sort_unstable();
    from_c.sort_unstable();
    assert_eq!(from_a, (0..200).collect::<Vec<_>>(), "each cell once");
    assert_eq!(from_c, (1000..1100).collect::<Vec<_>>());
    // Nothing more comes (no copy of any cell), and the link is still up.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), b.next_event())
            .await
            .is_err(),
        "an event after the cells"
    );
    send_cells(&a, to_b, 200..210).await;
    assert_eq!(cells(&b, 10).await.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagrams_from_nowhere_open_nothing() {
    let b = relay(2);
    let stranger = UdpSocket::bind(loopback()).await.expect("bind");
    for d in [
        &[0u8; 0][..],
        &[0x17, 0xfe, 0xfd, 0, 1],
        &[0xf1; 40],
        &[0x16; 200],
    ] {
        stranger.send_to(d, b.local_addr()).await.expect("send");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(100), b.next_event())
            .await
            .is_err(),
        "an event from nowhere"
    );
    let stats = b.stats();
    assert_eq!(stats.sessions_accepted, 0);
    assert!(stats.stray_datagrams + stats.bad_cookies + stats.retries_sent >= 3);
}

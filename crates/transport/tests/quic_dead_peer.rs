//! A QUIC peer that vanishes or restarts is noticed: within the idle
//! timeout when it is gone, at its next packet when the same relay (same
//! identity keys, so the same stateless reset key) answers on the old
//! address. The peer sits behind a UDP relay in the test that can drop
//! everything (a peer that vanished without a word, as after SIGKILL or a
//! cut cable) or switch to another endpoint (a restart on the same
//! address).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onionlab_cell::chan::{AnyChanCell, AnyChanMsg, ChanCell, CircId, Relay};
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_transport::quic::{Mode, QuicLink, QuicListener, QuicSettings, QuicTransport};
use onionlab_transport::{CellReader, CellWriter, Incoming, Listener, Transport};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::net::UdpSocket;

fn keys(seed: u64) -> RelaySecretKeys {
    RelaySecretKeys::generate(&mut StdRng::seed_from_u64(seed))
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("literal")
}

fn relay(keys: &RelaySecretKeys, settings: QuicSettings) -> QuicTransport {
    QuicTransport::relay(keys, vec![], loopback(), settings).expect("relay")
}

/// A UDP relay between one QUIC client and a switchable server address
/// (`None`: every packet is dropped, both ways).
#[derive(Clone)]
struct UdpForwarder {
    front: SocketAddr,
    target: Arc<Mutex<Option<SocketAddr>>>,
    /// The first QUIC connection's IDs, and whether its packets are
    /// dropped (both ways).
    first: Arc<Mutex<FirstConnection>>,
}

/// The connection IDs of the first QUIC connection through a forwarder,
/// learnt from the server's first long-header packet (its destination ID
/// is the client's, its source ID the server's).
#[derive(Default)]
struct FirstConnection {
    ids: Option<(Vec<u8>, Vec<u8>)>,
    muted: bool,
    dropped: u64,
}

/// Destination and source connection IDs of a long-header packet.
fn long_header_ids(p: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    if p.first()? & 0x80 == 0 {
        return None;
    }
    let dlen = usize::from(*p.get(5)?);
    let dcid = p.get(6..6 + dlen)?.to_vec();
    let slen = usize::from(*p.get(6 + dlen)?);
    let scid = p.get(7 + dlen..7 + dlen + slen)?.to_vec();
    Some((dcid, scid))
}

impl FirstConnection {
    /// Whether packet `p` (to the server if `to_server`) is to be
    /// dropped: it is the muted first connection's.
    fn drops(&mut self, p: &[u8], to_server: bool) -> bool {
        if !to_server && self.ids.is_none() {
            // (client ID, server ID)
            self.ids = long_header_ids(p);
        }
        let Some((client, server)) = &self.ids else {
            return false;
        };
        if !self.muted {
            return false;
        }
        let dcid = if to_server { server } else { client };
        let ours = match long_header_ids(p) {
            Some((d, _)) => &d == dcid,
            None => p.get(1..1 + dcid.len()) == Some(&dcid[..]),
        };
        if ours {
            self.dropped += 1;
        }
        ours
    }
}

impl UdpForwarder {
    async fn start(target: SocketAddr) -> UdpForwarder {
        let front = Arc::new(UdpSocket::bind(loopback()).await.expect("front"));
        let back = Arc::new(UdpSocket::bind(loopback()).await.expect("back"));
        let target = Arc::new(Mutex::new(Some(target)));
        let client: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
        let first: Arc<Mutex<FirstConnection>> = Arc::default();
        let relay = UdpForwarder {
            front: front.local_addr().expect("addr"),
            target: target.clone(),
            first: first.clone(),
        };
        let (f, b, t, c) = (front.clone(), back.clone(), target.clone(), client.clone());
        let first2 = first.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            while let Ok((n, from)) = f.recv_from(&mut buf).await {
                *c.lock().expect("lock") = Some(from);
                if first2.lock().expect("lock").drops(&buf[..n], true) {
                    continue;
                }
                let to = *t.lock().expect("lock");
                if let Some(to) = to {
                    let _ = b.send_to(&buf[..n], to).await;
                }
            }
        });
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            while let Ok((n, from)) = back.recv_from(&mut buf).await {
                if first.lock().expect("lock").drops(&buf[..n], false) {
                    continue;
                }
                let to = *client.lock().expect("lock");
                let current = *target.lock().expect("lock");
                if let (Some(to), Some(cur)) = (to, current) {
                    if from == cur {
                        let _ = front.send_to(&buf[..n], to).await;
                    }
                }
            }
        });
        relay
    }

    fn switch(&self, to: Option<SocketAddr>) {
        *self.target.lock().expect("lock") = to;
    }

    /// Drop every packet of the first connection from now on; false if
    /// its IDs are not known.
    fn mute_first(&self) -> bool {
        let mut first = self.first.lock().expect("lock");
        first.muted = true;
        first.ids.is_some()
    }

    fn dropped_of_first(&self) -> u64 {
        self.first.lock().expect("lock").dropped
    }
}

/// `a` links to `b` through a fresh UDP relay; both ends of the link.
async fn link_through_relay(
    a: &QuicTransport,
    b: &QuicTransport,
    b_keys: &RelaySecretKeys,
) -> (QuicLink, QuicLink, UdpForwarder) {
    link_through_relay_in(a, b, b_keys, Mode::StreamPerCircuit).await
}

async fn link_through_relay_in(
    a: &QuicTransport,
    b: &QuicTransport,
    b_keys: &RelaySecretKeys,
    mode: Mode,
) -> (QuicLink, QuicLink, UdpForwarder) {
    let mut listener = b.bind(loopback()).await.expect("bind");
    let relay = UdpForwarder::start(listener.local_addr()).await;
    let id = b_keys.public().ed_identity;
    let (ab, ba) = tokio::join!(a.connect_mode(relay.front, id, mode), async {
        listener.accept().await?.handshake().await
    });
    (ab.expect("connect"), ba.expect("accept"), relay)
}

fn cell(circ: u32) -> AnyChanCell {
    ChanCell::new(CircId::new(circ), AnyChanMsg::Relay(Relay::new([1; 509])))
}

/// Send one cell each way, so the link is known to work.
async fn ping(x: &mut QuicLink, y: &mut QuicLink) {
    let mut got = Vec::new();
    x.writer.queue(cell(0x8000_0001)).expect("queue");
    y.reader.read_cells(&mut got).await.expect("read");
    got.clear();
    y.writer.queue(cell(0x8000_0001)).expect("queue");
    x.reader.read_cells(&mut got).await.expect("read");
}

/// How long until `link`'s reader fails (`None`: not within `limit`).
async fn time_to_failure(link: &mut QuicLink, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut cells = Vec::new();
    tokio::time::timeout(limit, async {
        loop {
            cells.clear();
            if link.reader.read_cells(&mut cells).await.is_err() {
                return start.elapsed();
            }
        }
    })
    .await
    .ok()
}

/// Keep-alive 200 ms, idle timeout 1 s: the tests take seconds.
fn short_timers() -> QuicSettings {
    QuicSettings {
        keep_alive: Duration::from_millis(200),
        idle_timeout: Duration::from_millis(1000),
        ..QuicSettings::default()
    }
}

#[tokio::test]
async fn a_vanished_peer_is_noticed_within_the_idle_timeout() {
    let settings = short_timers();
    let (ka, kb) = (keys(1), keys(2));
    let (a, b) = (relay(&ka, settings), relay(&kb, settings));
    let (mut ab, mut ba, forwarder) = link_through_relay(&a, &b, &kb).await;
    ping(&mut ab, &mut ba).await;
    // Quiet for longer than the idle timeout: keep-alives hold it open.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    ping(&mut ab, &mut ba).await;
    forwarder.switch(None);
    let t = time_to_failure(&mut ab, Duration::from_secs(5))
        .await
        .expect("the link to a vanished peer must fail within 5 s");
    assert!(t >= Duration::from_millis(700), "failed after only {t:?}");
}

/// With a connection per circuit, the link's main connection carries no
/// circuit: when it alone hears nothing (its packets all dropped, as its
/// keep-alives were behind a full bottleneck in the seed 003 runs) while a
/// circuit's connection is busy, the link lives on; quinn's own idle
/// timeout on the main connection must not end it.
#[tokio::test]
async fn a_link_whose_main_connection_hears_nothing_lives_while_a_lane_is_busy() {
    let settings = short_timers();
    let (ka, kb) = (keys(1), keys(2));
    let (a, b) = (relay(&ka, settings), relay(&kb, settings));
    let (mut ab, mut ba, forwarder) =
        link_through_relay_in(&a, &b, &kb, Mode::ConnPerCircuit).await;
    ping(&mut ab, &mut ba).await;
    assert!(
        forwarder.mute_first(),
        "the main connection's IDs were seen"
    );
    let start = Instant::now();
    while start.elapsed() < settings.idle_timeout * 3 {
        tokio::time::timeout(Duration::from_secs(2), ping(&mut ab, &mut ba))
            .await
            .expect("the lane still carries cells");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        forwarder.dropped_of_first() > 0,
        "the main connection's keep-alives were dropped"
    );
}

/// A working link from relay 1 to relay 2 through a forwarder, after
/// which a fresh relay with `new_keys` takes over the address (relay 2 is
/// cut off, as if its process had died) and relay 1 sends a cell on the
/// old link.
struct Takeover {
    a: QuicTransport,
    /// Relay 1's end of the old link.
    ab: QuicLink,
    /// Relay 2's end, kept open (relay 2 says nothing: it is cut off).
    _ba: QuicLink,
    forwarder: UdpForwarder,
    /// The new relay's listener, and the new relay.
    listener: QuicListener,
    _new: QuicTransport,
}

async fn take_over(new_keys: &RelaySecretKeys) -> Takeover {
    let settings = QuicSettings::default();
    let (ka, kb) = (keys(1), keys(2));
    let a = relay(&ka, settings);
    let b = relay(&kb, settings);
    let (mut ab, mut ba, forwarder) = link_through_relay(&a, &b, &kb).await;
    ping(&mut ab, &mut ba).await;
    let new = relay(new_keys, settings);
    let listener = new.bind(loopback()).await.expect("bind");
    forwarder.switch(Some(listener.local_addr()));
    ab.writer.queue(cell(0x8000_0002)).expect("queue");
    Takeover {
        a,
        ab,
        _ba: ba,
        forwarder,
        listener,
        _new: new,
    }
}

#[tokio::test]
async fn a_peer_restarted_with_the_same_keys_resets_the_old_connection() {
    // The default (8 s) idle timeout: only the reset can be this fast.
    let kb = keys(2);
    let mut t = take_over(&kb).await;
    let elapsed = time_to_failure(&mut t.ab, Duration::from_secs(3))
        .await
        .expect("the restarted peer's stateless reset must close the old link");
    assert!(
        elapsed < QuicSettings::default().idle_timeout / 2,
        "{elapsed:?}"
    );
    // A new link to the same address reaches the restarted relay.
    let (ab2, ba2) = tokio::join!(
        t.a.connect(t.forwarder.front, kb.public().ed_identity),
        async { t.listener.accept().await?.handshake().await }
    );
    let (mut ab2, mut ba2) = (ab2.expect("reconnect"), ba2.expect("accept"));
    ping(&mut ab2, &mut ba2).await;
}

#[tokio::test]
async fn a_different_relay_on_the_address_cannot_reset_the_connection() {
    // Control for the test above: another identity's reset key gives
    // reset tokens that the old connection does not accept.
    let mut t = take_over(&keys(3)).await;
    assert_eq!(
        time_to_failure(&mut t.ab, Duration::from_millis(1500)).await,
        None
    );
}

#[test]
fn timers_are_checked() {
    let ok = QuicSettings::default();
    ok.validate().expect("defaults are valid");
    for bad in [
        QuicSettings {
            keep_alive: ok.idle_timeout,
            ..ok
        },
        QuicSettings {
            idle_timeout: Duration::ZERO,
            ..ok
        },
        QuicSettings {
            handshake_timeout: Duration::ZERO,
            ..ok
        },
        QuicSettings {
            idle_timeout: Duration::from_secs(100 * 24 * 3600),
            ..ok
        },
    ] {
        let e = bad.validate().expect_err("invalid");
        assert!(e.to_string().contains("QUIC"), "{e}");
    }
    let k = keys(1);
    assert!(QuicTransport::relay(
        &k,
        vec![],
        loopback(),
        QuicSettings {
            keep_alive: Duration::from_secs(9),
            ..ok
        }
    )
    .is_err());
}

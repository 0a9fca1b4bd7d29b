//! dtls-utcp sockets on loopback: a client's session to a relay, lanes
//! both ways carrying data intact and ending cleanly, many lanes at once,
//! and a relay that proves another identity refused.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use onionlab_dtls::endpoint::{DEFAULT_MAX_HANDSHAKES, DEFAULT_MAX_SESSIONS};
use onionlab_transport::utcp::{UtcpSession, UtcpSocket};
use onionlab_utcp::{EndpointConfig, LaneConfig, SessionConfig, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tor_llcrypto::pk::ed25519::{Ed25519Identity, Keypair};

fn keypair(seed: u8) -> Arc<Keypair> {
    Arc::new(Keypair::from_bytes(&[seed; 32]))
}

fn identity(k: &Keypair) -> Ed25519Identity {
    Ed25519Identity::from(k.verifying_key())
}

fn config(identity: Option<Arc<Keypair>>, accept: bool) -> EndpointConfig {
    EndpointConfig {
        session: SessionConfig {
            carrier: LaneConfig {
                utcp: Settings::default(),
                lane_budget: None,
                anonymous_max_lanes: onionlab_utcp::DEFAULT_ANONYMOUS_MAX_LANES,
            },
            datagram: 1280,
            identity,
            expect_peer: None,
            handshake_timeout: Duration::from_secs(5),
            certificate: None,
        },
        accept,
        max_sessions: DEFAULT_MAX_SESSIONS,
        max_handshakes: DEFAULT_MAX_HANDSHAKES,
        max_handshakes_per_ip: onionlab_dtls::endpoint::DEFAULT_MAX_HANDSHAKES_PER_IP,
    }
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("literal")
}

/// A relay socket with `key`, a client socket, and their session.
async fn session(key: &Arc<Keypair>) -> (UtcpSocket, UtcpSocket, UtcpSession, UtcpSession) {
    let relay = UtcpSocket::bind(loopback(), config(Some(key.clone()), true))
        .await
        .expect("relay");
    let client = UtcpSocket::bind(loopback(), config(None, false))
        .await
        .expect("client");
    let (ours, theirs) = tokio::join!(
        client.connect(relay.local_addr(), identity(key)),
        relay.accept()
    );
    let ours = ours.expect("the client's session");
    let theirs = theirs.expect("the relay's session");
    (relay, client, ours, theirs)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_carries_a_mebibyte_each_way_and_ends_cleanly() {
    let key = keypair(1);
    let (_relay, _client, ours, mut theirs) = session(&key).await;
    assert_eq!(ours.identity(), Some(identity(&key)));
    assert_eq!(theirs.identity(), None, "a client stays anonymous");
    let up = pattern(1 << 20, 1);
    let down = pattern(1 << 20, 2);
    let mut lane = ours.open_lane().expect("lane");
    let (up2, down2) = (up.clone(), down.clone());
    let relay_side = tokio::spawn(async move {
        let mut lane = theirs.accept_lane().await.expect("the client's lane");
        let mut got = Vec::new();
        let mut buf = vec![0u8; up2.len()];
        lane.read_exact(&mut buf).await.expect("read");
        got.extend_from_slice(&buf);
        lane.write_all(&down2).await.expect("write");
        lane.shutdown().await.expect("shutdown");
        let mut rest = Vec::new();
        lane.read_to_end(&mut rest).await.expect("the client's end");
        assert!(rest.is_empty());
        (got, theirs)
    });
    lane.write_all(&up).await.expect("write");
    let mut got = vec![0u8; down.len()];
    tokio::time::timeout(Duration::from_secs(30), lane.read_exact(&mut got))
        .await
        .expect("in time")
        .expect("read");
    assert_eq!(got, down);
    lane.shutdown().await.expect("shutdown");
    let mut rest = Vec::new();
    lane.read_to_end(&mut rest).await.expect("the relay's end");
    assert!(rest.is_empty());
    let (relay_got, _theirs) = relay_side.await.expect("relay side");
    assert_eq!(relay_got, up);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_lanes_at_once_each_deliver_their_own_bytes() {
    let key = keypair(1);
    let (_relay, _client, ours, mut theirs) = session(&key).await;
    let mut writers = Vec::new();
    for i in 0..50u8 {
        let mut lane = ours.open_lane().expect("lane");
        writers.push(tokio::spawn(async move {
            let data = pattern(20_000, i);
            lane.write_all(&[i]).await.expect("tag");
            lane.write_all(&data).await.expect("write");
            lane.shutdown().await.expect("shutdown");
            let mut rest = Vec::new();
            let _ = lane.read_to_end(&mut rest).await;
        }));
    }
    let mut seen = Vec::new();
    for _ in 0..50 {
        let mut lane = tokio::time::timeout(Duration::from_secs(20), theirs.accept_lane())
            .await
            .expect("in time")
            .expect("a lane");
        let mut all = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), lane.read_to_end(&mut all))
            .await
            .expect("in time")
            .expect("read");
        let (tag, data) = all.split_first().expect("a tag");
        assert_eq!(data, &pattern(20_000, *tag)[..], "lane {tag}");
        seen.push(*tag);
        lane.shutdown().await.expect("shutdown");
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..50).collect::<Vec<u8>>());
    for w in writers {
        w.await.expect("writer");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_proves_another_identity_is_refused() {
    let relay = UtcpSocket::bind(loopback(), config(Some(keypair(1)), true))
        .await
        .expect("relay");
    let client = UtcpSocket::bind(loopback(), config(None, false))
        .await
        .expect("client");
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        client.connect(relay.local_addr(), identity(&keypair(2))),
    )
    .await
    .expect("an answer in time");
    match r {
        Err(e) => assert!(e.to_string().contains("identity"), "{e}"),
        Ok(_) => panic!("a session with the wrong relay"),
    }
}

/// A stream dropped right after writing (no shutdown) still delivers all
/// it wrote, then the end: nothing is truncated silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_delivers_what_it_wrote_then_ends() {
    let key = keypair(1);
    let (_relay, _client, ours, mut theirs) = session(&key).await;
    let data = pattern(300_000, 9);
    let mut lane = ours.open_lane().expect("lane");
    lane.write_all(&data).await.expect("write");
    drop(lane);
    let mut lane = theirs.accept_lane().await.expect("lane");
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), lane.read_to_end(&mut all))
        .await
        .expect("in time")
        .expect("a clean end");
    assert_eq!(all.len(), data.len());
    assert_eq!(all, data);
}

/// A client that drops its session and connects again from the same
/// socket gets a new session at once; the relay's old one ends (its lane
/// fails, not a clean end), and dropping the old handles afterwards does
/// not harm the new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_opened_again_from_the_same_socket_replaces_the_old_one() {
    let key = keypair(1);
    let (relay, client, ours, mut theirs) = session(&key).await;
    let mut lane = ours.open_lane().expect("lane");
    lane.write_all(b"first").await.expect("write");
    let mut old_lane = theirs.accept_lane().await.expect("lane");
    let mut buf = [0u8; 5];
    old_lane.read_exact(&mut buf).await.expect("read");
    // The session first: its lanes end with it, no FIN.
    drop(ours);
    drop(lane);
    let (again, theirs2) = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::join!(
            client.connect(relay.local_addr(), identity(&key)),
            relay.accept()
        )
    })
    .await
    .expect("a new session at once");
    let again = again.expect("the new session");
    let mut theirs2 = theirs2.expect("the relay's new session");
    let mut rest = Vec::new();
    let r = old_lane.read_to_end(&mut rest).await;
    assert!(r.is_err(), "the old lane fails: {r:?}");
    drop(old_lane);
    drop(theirs);
    let mut lane = again.open_lane().expect("a lane on the new session");
    lane.write_all(b"second").await.expect("write");
    lane.shutdown().await.expect("shutdown");
    let mut l2 = tokio::time::timeout(Duration::from_secs(5), theirs2.accept_lane())
        .await
        .expect("in time")
        .expect("lane");
    let mut got = Vec::new();
    l2.read_to_end(&mut got).await.expect("read");
    assert_eq!(got, b"second");
}

/// What a lane holds counts: bytes written to a lane nobody reads stay
/// in the sender's buffers and then fill the receiver's, and the sessions
/// report them (the relay counts them toward its memory cap); once read,
/// the count falls back to nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_bytes_follow_what_lanes_hold() {
    let key = keypair(6);
    let (_relay, _client, ours, mut theirs) = session(&key).await;
    let mut lane = ours.open_lane().expect("lane");
    let data = pattern(200_000, 6);
    lane.write_all(&data).await.expect("write");
    let mut peer = theirs.accept_lane().await.expect("lane");
    // Nobody reads yet: the bytes are held on one side or the other.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let held = ours.held().send() + theirs.held().recv();
        if held >= data.len() - 1 && theirs.held().recv() > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "held: sender {} to send, receiver {} received",
            ours.held().send(),
            theirs.held().recv()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut got = vec![0u8; data.len()];
    peer.read_exact(&mut got).await.expect("read");
    assert!(got == data);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while ours.held().send() + theirs.held().recv() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still held after reading: {} / {}",
            ours.held().send(),
            theirs.held().recv()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

//! dtls-utcp links on loopback: pctcp's circuits-on-lanes over a DTLS
//! session's user-space TCP lanes. Every circuit gets a lane and its cells
//! in order both ways, a reused circuit ID is ordered after the old
//! circuit's DESTROY, a client's link is anonymous, and a relay proving
//! another identity is refused.

use std::net::SocketAddr;
use std::sync::Arc;

use onionlab_cell::chan::AnyChanCell;
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_transport::utcp::{UtcpLink, UtcpSettings, UtcpTransport};
use onionlab_transport::CellReader;
use rand::rngs::StdRng;
use rand::SeedableRng;

mod lanes_common;
use lanes_common::*;

fn keys(seed: u64) -> RelaySecretKeys {
    RelaySecretKeys::generate(&mut StdRng::seed_from_u64(seed))
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("literal")
}

async fn relay(seed: u64) -> (Arc<UtcpTransport>, RelaySecretKeys) {
    let k = keys(seed);
    let t = UtcpTransport::relay(&k, vec![], loopback(), UtcpSettings::default())
        .await
        .expect("relay");
    (Arc::new(t), k)
}

async fn linked(
    a: &UtcpTransport,
    b: &Arc<UtcpTransport>,
    b_keys: &RelaySecretKeys,
) -> (UtcpLink, UtcpLink) {
    let addr = b.local_addr().expect("b accepts");
    let (ours, theirs) = tokio::join!(a.connect(addr, b_keys.public().ed_identity), b.accept());
    (ours.expect("link opens"), theirs.expect("link accepted"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_circuit_gets_a_lane_and_its_cells_in_order() {
    let (a, ka) = relay(1).await;
    let (b, kb) = relay(2).await;
    let (mut ab, mut ba) = linked(&a, &b, &kb).await;
    assert_eq!(ab.peer.identity, Some(kb.public().ed_identity));
    assert_eq!(ba.peer.identity, Some(ka.public().ed_identity));
    let circs: Vec<u32> = (1..=8).map(|i| 0x8000_0000 | i).collect();
    let n = 200;
    let cells: Vec<AnyChanCell> = (0..n)
        .flat_map(|i| circs.iter().map(move |&c| cell(c, i)))
        .collect();
    let (_, got) = tokio::join!(
        send(&mut ab.writer, cells),
        receive(&mut ba.reader, circs.len() * n as usize)
    );
    let per = per_circuit(&got);
    assert_eq!(per.len(), circs.len());
    for (circ, idx) in per {
        assert_eq!(idx, (0..n).collect::<Vec<_>>(), "circuit {circ:#x}");
    }
    assert_eq!(a.open_lanes(), circs.len());
    // Replies go back on the same lanes.
    let replies: Vec<AnyChanCell> = circs.iter().map(|&c| cell(c, 7)).collect();
    let (_, got) = tokio::join!(
        send(&mut ba.writer, replies),
        receive(&mut ab.reader, circs.len())
    );
    assert_eq!(got.len(), circs.len());
    assert_eq!(a.open_lanes(), circs.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_circuit_id_is_delivered_after_the_old_circuits_destroy() {
    let (a, _) = relay(3).await;
    let (b, kb) = relay(4).await;
    let (mut ab, mut ba) = linked(&a, &b, &kb).await;
    reused_circuit_id_is_ordered(&mut ab.writer, &mut ba.reader, 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_link_is_anonymous_and_carries_circuits() {
    let (b, kb) = relay(5).await;
    let client = UtcpTransport::client("127.0.0.1".parse().unwrap(), UtcpSettings::default())
        .expect("client");
    let (mut cb, mut bc) = linked(&client, &b, &kb).await;
    assert_eq!(bc.peer.identity, None, "the relay learns no identity");
    let cells: Vec<AnyChanCell> = (0..50).map(|i| cell(0x8000_0001, i)).collect();
    let (_, got) = tokio::join!(send(&mut cb.writer, cells), receive(&mut bc.reader, 50));
    assert_eq!(got.len(), 50);
    send(&mut bc.writer, vec![cell(0x8000_0001, 99)]).await;
    let got = receive(&mut cb.reader, 1).await;
    assert_eq!(index_of(&got[0]), Some((0x8000_0001, 99)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_proving_another_identity_is_refused() {
    let (a, _) = relay(6).await;
    let (b, _) = relay(7).await;
    let addr = b.local_addr().expect("b accepts");
    let _accepting = tokio::spawn(async move {
        let _ = b.accept().await;
    });
    let r = a.connect(addr, keys(8).public().ed_identity).await;
    assert!(r.is_err(), "a link to the wrong relay");
}

/// A relay over its lane budget refuses a lane: only that circuit ends
/// (its node gets a DESTROY, CHANNEL_CLOSED), the link and the circuits
/// on other lanes go on, and new circuits use the main connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_lane_ends_its_circuit_not_the_link() {
    use onionlab_cell::chan::{AnyChanMsg, DestroyReason};
    let (a, _) = relay(11).await;
    let kb = keys(12);
    // The control lane and two circuits' lanes.
    let settings = UtcpSettings {
        max_lanes: 3,
        ..UtcpSettings::default()
    };
    let b = Arc::new(
        UtcpTransport::relay(&kb, vec![], loopback(), settings)
            .await
            .expect("relay"),
    );
    let (mut ab, mut ba) = linked(&a, &b, &kb).await;
    let (c1, c2, c3, c4) = (0x8000_0001, 0x8000_0002, 0x8000_0003, 0x8000_0004);
    // Two lanes fill b's budget.
    let (_, got) = tokio::join!(
        send(&mut ab.writer, vec![cell(c1, 0), cell(c2, 0)]),
        receive(&mut ba.reader, 2)
    );
    assert_eq!(got.len(), 2);
    // The third is refused: a's node hears that circuit end.
    send(&mut ab.writer, vec![cell(c3, 0), cell(c3, 1)]).await;
    let got = receive(&mut ab.reader, 1).await;
    assert_eq!(got[0].circid().map(u32::from), Some(c3));
    match got[0].msg() {
        AnyChanMsg::Destroy(d) => assert_eq!(d.reason(), DestroyReason::CHANNEL_CLOSED),
        other => panic!("not a DESTROY: {other:?}"),
    }
    // The other circuits still work both ways, and a new one is carried
    // on the main connection.
    let cells = vec![cell(c1, 1), cell(c2, 1), cell(c4, 0), cell(c4, 1)];
    let (_, got) = tokio::join!(send(&mut ab.writer, cells), receive(&mut ba.reader, 4));
    let per = per_circuit(&got);
    assert_eq!(per[&c1], [1]);
    assert_eq!(per[&c2], [1]);
    assert_eq!(per[&c4], [0, 1]);
    assert!(!per.contains_key(&c3), "cells of the refused lane arrived");
    let replies = vec![cell(c1, 9), cell(c2, 9), cell(c4, 9)];
    let (_, got) = tokio::join!(send(&mut ba.writer, replies), receive(&mut ab.reader, 3));
    assert_eq!(per_circuit(&got).len(), 3);
    // The refused lane's tasks end on their own: its count goes with them.
    for _ in 0..100 {
        if a.open_lanes() == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(a.open_lanes(), 2);
    assert_eq!(b.open_lanes(), 2);
}

/// A node at its own lane budget (the control lane counts) carries new
/// circuits on the control lane: none fails, the link stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_our_own_lane_budget_new_circuits_share_the_control_lane() {
    let ka = keys(13);
    let settings = UtcpSettings {
        max_lanes: 2,
        ..UtcpSettings::default()
    };
    let a = UtcpTransport::relay(&ka, vec![], loopback(), settings)
        .await
        .expect("relay");
    let (b, kb) = relay(14).await;
    let (mut ab, mut ba) = linked(&a, &b, &kb).await;
    let circs = [0x8000_0001, 0x8000_0002, 0x8000_0003];
    let cells: Vec<AnyChanCell> = (0..20)
        .flat_map(|i| circs.iter().map(move |&c| cell(c, i)))
        .collect();
    let (_, got) = tokio::join!(send(&mut ab.writer, cells), receive(&mut ba.reader, 60));
    for (circ, idx) in per_circuit(&got) {
        assert_eq!(idx, (0..20).collect::<Vec<_>>(), "circuit {circ:#x}");
    }
    assert_eq!(
        a.open_lanes(),
        1,
        "one circuit lane beside the control lane"
    );
    let replies: Vec<AnyChanCell> = circs.iter().map(|&c| cell(c, 99)).collect();
    let (_, got) = tokio::join!(send(&mut ba.writer, replies), receive(&mut ab.reader, 3));
    assert_eq!(per_circuit(&got).len(), 3);
}

/// One circuit's throughput on loopback, dtls-utcp against pctcp (the
/// kernel's TCP with TLS): what the user-space stack and DTLS cost in CPU
/// where nothing is lost. A measurement, not a check (`--ignored`, release
/// build): `cargo test --release -p onionlab-transport --test utcp_link
/// -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_one_circuit_throughput_against_pctcp() {
    let cells = 20_000u32; // about 10 MB
    for round in 0..3 {
        let (a, _) = relay(100 + round).await;
        let (b, kb) = relay(200 + round).await;
        let (mut ab, mut ba) = linked(&a, &b, &kb).await;
        let t = std::time::Instant::now();
        let batch: Vec<AnyChanCell> = (0..cells).map(|i| cell(0x8000_0001, i)).collect();
        tokio::join!(
            send(&mut ab.writer, batch),
            receive(&mut ba.reader, cells as usize)
        );
        let utcp = t.elapsed();
        let pa = tcp_relay(300 + round, |t| t).await;
        let mut pb = tcp_relay(400 + round, |t| t).await;
        let (mut pab, mut pba) =
            tcp_link(&pa, &mut pb, onionlab_transport::TransportKind::PCTCP).await;
        let t = std::time::Instant::now();
        let batch: Vec<AnyChanCell> = (0..cells).map(|i| cell(0x8000_0001, i)).collect();
        tokio::join!(
            send(&mut pab.writer, batch),
            receive(&mut pba.reader, cells as usize)
        );
        let pctcp = t.elapsed();
        let mb = f64::from(cells) * 514.0 / 1e6;
        println!(
            "round {round}: dtls-utcp {:.1} MB/s, pctcp {:.1} MB/s, ratio {:.2}",
            mb / utcp.as_secs_f64(),
            mb / pctcp.as_secs_f64(),
            pctcp.as_secs_f64() / utcp.as_secs_f64()
        );
    }
}

/// A closing dtls-utcp link hands everything over, as a relay closes it:
/// the writer's shutdown, then both halves dropped at once. The lanes'
/// bytes sit in user-space TCP buffers until the peer acknowledges them,
/// so the session must outlive the shutdown until the peer has read and
/// closed: the peer gets every cell, then the link's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_shut_down_and_dropped_delivers_every_cell_then_ends() {
    let (a, _) = relay(21).await;
    let (b, kb) = relay(22).await;
    let (mut ab, mut ba) = linked(&a, &b, &kb).await;
    let circs: Vec<u32> = (1..=4).map(|i| 0x8000_0000 | i).collect();
    let n = 300;
    let cells: Vec<AnyChanCell> = (0..n)
        .flat_map(|i| circs.iter().map(move |&c| cell(c, i)))
        .collect();
    let closing = async move {
        send(&mut ab.writer, cells).await;
        shut_down_within(&mut ab.writer, std::time::Duration::from_secs(15)).await;
        drop(ab);
    };
    let reading = async {
        let mut got = Vec::new();
        while got.len() < circs.len() * n as usize {
            if let Err(e) = ba.reader.read_cells(&mut got).await {
                panic!(
                    "{e} after {} of {} cells",
                    got.len(),
                    circs.len() * n as usize
                );
            }
        }
        got
    };
    let ((), got) = tokio::join!(closing, reading);
    for (circ, idx) in per_circuit(&got) {
        assert_eq!(idx, (0..n).collect::<Vec<_>>(), "circuit {circ:#x}");
    }
    let end = end_of(&mut ba.reader, std::time::Duration::from_secs(15)).await;
    assert!(matches!(end, onionlab_transport::Error::Closed), "{end:?}");
}

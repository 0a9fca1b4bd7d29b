//! The torchestra transport on loopback: the heavy connection opens
//! between relays, circuits move to it and back while cells flow both
//! ways, and every cell arrives once and in order; the peer learns of
//! each switch (with the propagate flag); a peer that does not switch
//! makes the link a plain one.

use std::collections::BTreeMap;
use std::time::Duration;

use onionlab_cell::chan::{AnyChanCell, AnyChanMsg, ChanCell, CircId, Relay};
use onionlab_transport::any::AnyLink;
use onionlab_transport::torchestra::{
    self,
    switch::{Conn, Control},
};
use onionlab_transport::{CellReader, CellWriter, LinkEvent, TransportKind};

mod lanes_common;
use lanes_common::{end_of, shut_down_within, tcp_link, tcp_relay, TcpRelay};

fn cell(circ: u32, i: u32) -> AnyChanCell {
    let mut body = [0u8; 509];
    body[..4].copy_from_slice(&i.to_be_bytes());
    ChanCell::new(CircId::new(circ), AnyChanMsg::Relay(Relay::new(body)))
}

fn index_of(c: &AnyChanCell) -> Option<(u32, u32)> {
    let AnyChanMsg::Relay(r) = c.msg().clone() else {
        return None;
    };
    let body = r.into_relay_body();
    Some((
        u32::from(c.circid()?),
        u32::from_be_bytes(body[..4].try_into().ok()?),
    ))
}

async fn node(seed: u64, switches: bool) -> TcpRelay {
    let node = tcp_relay(seed, |t| t).await;
    torchestra::set_switching(&node.tcp, switches);
    node
}

async fn link(from: &TcpRelay, to: &mut TcpRelay) -> (AnyLink, AnyLink) {
    tcp_link(from, to, TransportKind::TORCHESTRA).await
}

/// Send `n` cells on each circuit from `w`, moving circuit `moves[k].0`
/// to heavy (`true`) or light at cell `moves[k].1`.
async fn send(w: &mut impl CellWriter, circs: &[u32], n: u32, moves: &[(u32, u32, bool)]) {
    for i in 0..n {
        for &(circ, at, heavy) in moves {
            if at == i {
                w.circuit_mover()
                    .expect("a torchestra writer moves circuits")
                    .move_circuit(CircId::new(circ).unwrap(), heavy, true);
            }
        }
        for &c in circs {
            let id = CircId::new(c).unwrap();
            while !w.has_room_for(id) {
                tokio::time::timeout(Duration::from_secs(10), w.writable())
                    .await
                    .expect("room");
            }
            w.queue(cell(c, i)).expect("queue");
        }
        if i % 50 == 0 {
            tokio::task::yield_now().await;
        }
    }
}

/// Read until `n` data cells arrived; the events seen.
async fn receive(r: &mut impl CellReader, n: usize) -> (BTreeMap<u32, Vec<u32>>, Vec<LinkEvent>) {
    let mut got = BTreeMap::<u32, Vec<u32>>::new();
    let mut events = Vec::new();
    let mut count = 0;
    let mut cells = Vec::new();
    while count < n {
        cells.clear();
        tokio::time::timeout(Duration::from_secs(10), r.read_cells(&mut cells))
            .await
            .expect("cells in time")
            .expect("link alive");
        while let Some(e) = r.poll_event() {
            events.push(e);
        }
        for c in &cells {
            if let Some((circ, i)) = index_of(c) {
                got.entry(circ).or_default().push(i);
                count += 1;
            }
        }
    }
    while let Some(e) = r.poll_event() {
        events.push(e);
    }
    (got, events)
}

/// The writer refuses moves until the heavy connection is up (it opens
/// right after the link handshake): wait for both ends to attach it.
async fn wait_heavy(a: &TcpRelay, b: &TcpRelay) {
    for _ in 0..500 {
        if torchestra::heavy_connections(&a.tcp) >= 1 && torchestra::heavy_connections(&b.tcp) >= 1
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the heavy connection never came up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn circuits_move_to_heavy_and_back_without_losing_or_reordering_a_cell() {
    let a = node(1, true).await;
    let mut b = node(2, true).await;
    let (mut ab, mut ba) = link(&a, &mut b).await;
    assert_eq!(ab.writer.kind(), TransportKind::TORCHESTRA);
    wait_heavy(&a, &b).await;
    let circs = [0x8000_0001u32, 0x8000_0002, 0x8000_0003];
    let n = 400;
    // Circuit 1 moves to heavy at 50 and back at 250; circuit 2 to heavy
    // at 100 (and again, already there, at 101: nothing); circuit 3 stays.
    let moves = [
        (circs[0], 50, true),
        (circs[0], 250, false),
        (circs[1], 100, true),
        (circs[1], 101, true),
    ];
    // b answers on the same circuits at the same time.
    let total = circs.len() * n as usize;
    let ((), (got_b, mut events_b), (), (got_a, _)) = tokio::join!(
        send(&mut ab.writer, &circs, n, &moves),
        receive(&mut ba.reader, total),
        send(&mut ba.writer, &circs, n, &[]),
        receive(&mut ab.reader, total),
    );
    for got in [&got_b, &got_a] {
        for c in circs {
            assert_eq!(got[&c], (0..n).collect::<Vec<_>>(), "circuit {c:#x}");
        }
    }
    // A switch asked for mid-switch starts when SWITCHED comes back,
    // which may be after the last data cell: wait for its event too.
    let mut cells = Vec::new();
    for _ in 0..100 {
        if events_b.len() >= 3 {
            break;
        }
        let _ =
            tokio::time::timeout(Duration::from_millis(20), ba.reader.read_cells(&mut cells)).await;
        while let Some(e) = ba.reader.poll_event() {
            events_b.push(e);
        }
        assert!(cells.iter().all(|c| index_of(c).is_none()), "more data");
    }
    let switched: Vec<(u32, bool, bool)> = events_b
        .iter()
        .map(|e| match e {
            LinkEvent::Switched {
                circ_id,
                heavy,
                propagate,
            } => (u32::from(*circ_id), *heavy, *propagate),
            LinkEvent::CircuitViolation { .. } => panic!("{e:?}"),
        })
        .collect();
    assert!(switched.contains(&(circs[0], true, true)), "{switched:?}");
    assert!(switched.contains(&(circs[0], false, true)), "{switched:?}");
    assert!(switched.contains(&(circs[1], true, true)), "{switched:?}");
    assert_eq!(switched.len(), 3, "{switched:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_does_not_switch_makes_a_plain_link() {
    let a = node(3, true).await;
    let mut b = node(4, false).await;
    let (mut ab, mut ba) = link(&a, &mut b).await;
    // No heavy connection between them.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(torchestra::heavy_connections(&a.tcp), 0);
    assert_eq!(torchestra::heavy_connections(&b.tcp), 0);
    let circs = [0x8000_0010u32];
    let moves = [(circs[0], 10, true)];
    let ((), (got, events)) = tokio::join!(
        send(&mut ab.writer, &circs, 100, &moves),
        receive(&mut ba.reader, 100),
    );
    assert_eq!(got[&circs[0]], (0..100).collect::<Vec<_>>());
    assert!(events.is_empty(), "{events:?}");
    // A switch cell on such a link is the peer's mistake: its circuit is
    // reported, nothing reaches the node, other circuits go on.
    let c = CircId::new(circs[0]).unwrap();
    let switch = Control::Switch {
        to: Conn::Heavy,
        propagate: true,
    }
    .cell(c);
    ab.writer.queue(switch).expect("queue");
    ab.writer.queue(cell(0x8000_0011, 0)).expect("queue");
    let (got, events) = receive(&mut ba.reader, 1).await;
    assert_eq!(got[&0x8000_0011], vec![0]);
    let mut events = events;
    for _ in 0..100 {
        if !events.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        while let Some(e) = ba.reader.poll_event() {
            events.push(e);
        }
    }
    assert!(
        matches!(events.as_slice(), [LinkEvent::CircuitViolation { circ_id, .. }] if *circ_id == c),
        "{events:?}"
    );
}

/// Closing a torchestra link is prompt and loses nothing: the writer
/// flushes both connections (heavy first, then light) without waiting for
/// the readers or the liveness watch, and the peer gets every cell of a
/// circuit on heavy and of one on light before the link's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_delivers_both_connections_cells_then_the_end() {
    let a = node(5, true).await;
    let mut b = node(6, true).await;
    let (mut ab, mut ba) = link(&a, &mut b).await;
    wait_heavy(&a, &b).await;
    let circs = [0x8000_0001u32, 0x8000_0002];
    let n = 300;
    let total = circs.len() * n as usize;
    let sender = async {
        send(&mut ab.writer, &circs, n, &[(circs[0], 0, true)]).await;
        shut_down_within(&mut ab.writer, Duration::from_secs(5)).await
    };
    let (took, (got, _)) = tokio::join!(sender, receive(&mut ba.reader, total));
    for c in circs {
        assert_eq!(got[&c], (0..n).collect::<Vec<_>>(), "circuit {c:#x}");
    }
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    let end = end_of(&mut ba.reader, Duration::from_secs(5)).await;
    assert!(matches!(end, onionlab_transport::Error::Closed), "{end:?}");
}

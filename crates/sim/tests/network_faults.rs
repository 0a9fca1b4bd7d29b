//! Faults on the in-memory network: a corrupted cell kills its circuit and
//! no other; a failed extend, a TRUNCATED from any hop (a relay's next hop
//! died, or a hostile relay claims it did) and a dead relay each kill the
//! whole circuit, name the failed relay, and leave no hop holding it.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use onionlab_cell::chan::{AnyChanMsg, DestroyReason};
use onionlab_circuit::client::ClientEvent;
use onionlab_circuit::client_node::PathHop;
use onionlab_circuit::node::{CircKey, NodeEvent};
use onionlab_circuit::scheduler::SchedulerKind;
use onionlab_circuit::stream::StreamEvent;
use onionlab_circuit::CloseKind;
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_sim::{linkspecs, End, Net};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// Send `bytes` on a fresh stream of circuit `id` and read them back at the
/// exit; returns true if all arrived before `limit`.
fn push_bytes(net: &mut Net, id: CircKey, port: u16, bytes: usize, limit: Duration) -> bool {
    let now = net.instant();
    let Ok(s) = net.client.begin(now, id, "x.example", port) else {
        return false;
    };
    let payload = vec![0xabu8; bytes];
    let mut written = 0;
    let mut got = 0;
    let mut exit_stream = None;
    let deadline = net.now + limit;
    let mut buf = vec![0u8; 65536];
    while net.now < deadline {
        net.tick();
        let now = net.instant();
        for (_, ev) in &net.node_events {
            if let NodeEvent::ExitConnect {
                circ,
                stream,
                port: p,
                ..
            } = ev
            {
                if *p == port {
                    exit_stream = Some((*circ, *stream));
                }
            }
        }
        if net.is_closed(id) {
            return false;
        }
        if written < bytes {
            written += net
                .client
                .write(now, id, s, &payload[written..])
                .unwrap_or(0);
        }
        if let Some((c, st)) = exit_stream {
            let exit = net.relays.len() - 1;
            got += net.relays[exit]
                .exit_read(now, c, st, &mut buf)
                .unwrap_or(0);
        }
        if got == bytes {
            return true;
        }
    }
    false
}

#[test]
fn corrupted_cell_between_relays_kills_only_its_circuit() {
    let mut net = Net::new(11, 3, SchedulerKind::default());
    let a = net.new_circuit();
    let b = net.new_circuit();
    net.build(a).expect("build");
    net.build(b).expect("build");
    // Flip one bit in the next RELAY cell crossing guard -> middle.
    let armed = Rc::new(Cell::new(true));
    let hit = Rc::new(Cell::new(None));
    let (armed2, hit2) = (armed.clone(), hit.clone());
    net.tamper = Some(Box::new(move |from, to, cell| {
        if armed2.get() && from == End::Relay(0) && to == End::Relay(1) {
            let (circ, msg) = cell.into_circid_and_msg();
            if let AnyChanMsg::Relay(r) = msg {
                armed2.set(false);
                hit2.set(circ);
                let mut body = r.into_relay_body();
                body[200] ^= 1;
                return Some(onionlab_cell::chan::ChanCell::new(
                    circ,
                    onionlab_cell::chan::Relay::from(body).into(),
                ));
            }
            return Some(onionlab_cell::chan::ChanCell::new(circ, msg));
        }
        Some(cell)
    }));
    // Circuit a sends first, so its cell is the one corrupted.
    assert!(!push_bytes(&mut net, a, 1, 100_000, Duration::from_secs(5)));
    assert!(hit.get().is_some());
    net.run_for(Duration::from_millis(100));
    // The exit saw a cell it could not recognize and destroyed the circuit;
    // the client learned it via TRUNCATED from the middle relay.
    let exit_closed = net.node_events.iter().any(|(i, e)| {
        *i == 2 && matches!(e, NodeEvent::CircuitClosed { reason, .. } if reason.reason == DestroyReason::PROTOCOL)
    });
    assert!(exit_closed, "{:?}", net.node_events);
    // The client closed circuit a on that TRUNCATED (blaming the exit),
    // and its DESTROY cleared the guard and the middle.
    assert!(net.is_closed(a));
    assert_eq!(net.relays[0].n_circuits(), 1);
    assert_eq!(net.relays[1].n_circuits(), 1);
    assert_eq!(net.relays[2].n_circuits(), 1);
    let ev = net.take_client_events(a);
    assert!(
        ev.iter()
            .any(|e| matches!(e, ClientEvent::HopFailed { hop: 2, .. })),
        "{ev:?}"
    );
    // Circuit b, on the very same channels, is unaffected.
    assert!(push_bytes(
        &mut net,
        b,
        2,
        1_000_000,
        Duration::from_secs(60)
    ));
    assert!(net
        .take_client_events(b)
        .iter()
        .all(|e| !matches!(e, ClientEvent::Closed(_))));
}

/// A relay nobody runs, as a hop.
fn ghost_hop(keys: &onionlab_crypto::identity::RelayPublicKeys) -> PathHop {
    PathHop {
        keys: keys.clone(),
        linkspecs: linkspecs(keys, 1),
        name: "ghost".into(),
    }
}

#[test]
fn failed_extend_kills_the_circuit() {
    let mut net = Net::new(12, 3, SchedulerKind::RoundRobin);
    let id = net.new_circuit();
    net.run_until(Duration::from_secs(5), |n| n.n_hops(id) == 1)
        .expect("run");
    // Extend to a relay nobody runs: the guard cannot connect.
    let ghost = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(99)).public();
    let now = net.instant();
    net.client
        .extend(now, id, ghost_hop(&ghost))
        .expect("extend");
    net.run_until(Duration::from_secs(5), |n| n.is_closed(id))
        .expect("the circuit closes");
    let ev = net.take_client_events(id);
    assert!(
        matches!(
            ev.as_slice(),
            [
                ClientEvent::HopAdded { hops: 1 },
                ClientEvent::HopFailed { hop: 1, .. },
                ClientEvent::Closed(_)
            ]
        ),
        "{ev:?}"
    );
    // Never re-extended: the circuit is gone at the guard too.
    let (now, target) = (net.instant(), net.hop(1));
    assert!(net.client.extend(now, id, target).is_err());
    net.run_for(Duration::from_millis(100));
    assert_eq!(net.relays[0].n_circuits(), 0);
}

/// Build a 3-hop circuit and start a stream on it whose exit side is
/// connected; returns the circuit ID.
fn built_with_stream(net: &mut Net) -> CircKey {
    let id = net.new_circuit();
    net.build(id).expect("build");
    let now = net.instant();
    let s = net.client.begin(now, id, "x.example", 80).expect("begin");
    net.run_until(Duration::from_secs(5), |n| {
        n.client_events.iter().any(|(c, e)| {
            *c == id && *e == ClientEvent::Stream(StreamEvent::Connected { stream: s })
        })
    })
    .expect("connected");
    id
}

#[test]
fn a_middle_that_sends_truncated_loses_the_circuit_and_never_sees_a_begin() {
    // The middle drops its channel to the exit, which stays up: to the
    // client this is exactly a hostile middle sending TRUNCATED to become
    // the circuit's last hop.
    let mut net = Net::new(21, 3, SchedulerKind::default());
    let id = built_with_stream(&mut net);
    net.take_client_events(id);
    net.drop_channel(1, End::Relay(2));
    net.run_until(Duration::from_secs(1), |n| n.is_closed(id))
        .expect("the client closes the circuit at once");
    let ev = net.take_client_events(id);
    assert!(
        matches!(
            ev.as_slice(),
            [ClientEvent::HopFailed { hop: 2, .. }, ClientEvent::Closed(r)]
                if r.kind == CloseKind::Truncated
        ),
        "{ev:?}"
    );
    // No stream can attach to what is left, and the client's DESTROY
    // clears the guard and the middle.
    let now = net.instant();
    assert!(net.client.begin(now, id, "y.example", 80).is_err());
    assert!(net.client.resolve(now, id, "y.example").is_err());
    net.run_for(Duration::from_millis(100));
    assert_eq!(net.relays[0].n_circuits(), 0);
    assert_eq!(net.relays[1].n_circuits(), 0);
    let begins_at_middle = net
        .node_events
        .iter()
        .filter(|(i, e)| *i == 1 && matches!(e, NodeEvent::ExitConnect { .. }))
        .count();
    assert_eq!(begins_at_middle, 0);
}

#[test]
fn a_killed_exit_or_middle_closes_the_circuit_naming_the_dead_relay() {
    for dead in [2usize, 1] {
        let mut net = Net::new(30 + dead as u64, 3, SchedulerKind::default());
        let id = built_with_stream(&mut net);
        net.take_client_events(id);
        net.kill_relay(dead);
        net.run_until(Duration::from_secs(1), |n| n.is_closed(id))
            .expect("the client learns at once");
        let ev = net.take_client_events(id);
        let failed: Vec<usize> = ev
            .iter()
            .filter_map(|e| match e {
                ClientEvent::HopFailed { hop, .. } => Some(*hop),
                _ => None,
            })
            .collect();
        assert_eq!(failed, [dead], "{ev:?}");
        assert!(matches!(ev.last(), Some(ClientEvent::Closed(_))), "{ev:?}");
        net.run_for(Duration::from_millis(100));
        for alive in (0..3).filter(|i| *i != dead) {
            assert_eq!(net.relays[alive].n_circuits(), 0, "relay {alive}");
        }
    }
}

#[test]
fn a_killed_guard_closes_the_circuit() {
    let mut net = Net::new(40, 3, SchedulerKind::default());
    let id = built_with_stream(&mut net);
    net.kill_relay(0);
    net.run_for(Duration::from_millis(10));
    assert!(net.is_closed(id));
    net.run_for(Duration::from_millis(100));
    assert_eq!(net.relays[1].n_circuits(), 0);
    assert_eq!(net.relays[2].n_circuits(), 0);
}

#[test]
fn client_destroy_tears_down_every_hop() {
    let mut net = Net::new(13, 3, SchedulerKind::default());
    let id = net.new_circuit();
    net.build(id).expect("build");
    assert!(net.relays.iter().all(|r| r.n_circuits() == 1));
    let now = net.instant();
    net.client.destroy(now, id);
    net.run_for(Duration::from_millis(100));
    assert!(net.relays.iter().all(|r| r.n_circuits() == 0));
}

#[test]
fn a_guard_that_drops_the_clients_channel_closes_its_circuits_and_a_new_one_builds() {
    let mut net = Net::new(41, 3, SchedulerKind::default());
    let id = built_with_stream(&mut net);
    net.drop_channel(0, End::Client);
    net.run_for(Duration::from_millis(10));
    assert!(net.is_closed(id));
    let ev = net.take_client_events(id);
    assert!(matches!(ev.last(), Some(ClientEvent::Closed(_))), "{ev:?}");
    // A new circuit gets a new channel and works.
    let again = net.new_circuit();
    net.build(again).expect("a new channel to the same guard");
    assert!(push_bytes(
        &mut net,
        again,
        3,
        50_000,
        Duration::from_secs(10)
    ));
}

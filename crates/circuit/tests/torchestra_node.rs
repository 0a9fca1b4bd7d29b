//! Torchestra at a relay (`RelayNode`'s side of `docs/torchestra.md`): the
//! exit classifies its circuits on a link to a middle each window and asks
//! for the bulk one to move with the propagate flag; a middle told of a
//! switch by its next hop passes it to the previous hop (never to a
//! client); a switch from the previous hop is a violation.

mod common;

use std::time::Duration;

use common::TestRelay;
use onionlab_cell::chan::{AnyChanMsg, CircId};
use onionlab_circuit::node::{ChannelId, CircuitMove, NodeConfig};
use onionlab_circuit::relay::RelayConfig;
use onionlab_circuit::torchestra::ClassifierParams;

const MIDDLE: ChannelId = 1;
const PREV: ChannelId = 2;
const NEXT: ChannelId = 3;
const CLIENT: ChannelId = 4;

fn params() -> ClassifierParams {
    ClassifierParams {
        window: Duration::from_secs(1),
        // Every circuit counts in n (the test's light circuits are tiny).
        thresh_verylight: 1.0,
        ..ClassifierParams::default()
    }
}

fn exit(torchestra: bool) -> TestRelay {
    let config = NodeConfig {
        circuit: RelayConfig {
            exit: true,
            allow_one_hop_streams: true,
            ..RelayConfig::default()
        },
        torchestra: torchestra.then(params),
        ..NodeConfig::default()
    };
    TestRelay::new(config, 7)
}

#[test]
fn the_exit_moves_its_bulk_circuit_and_only_it() {
    let mut r = exit(true);
    r.add_relay_channel(MIDDLE);
    let circs = r.open_exit_circuits(MIDDLE, 0x8000_0001, &[60_000, 500, 500, 500]);
    assert_eq!(r.node.torchestra_tick(r.now), Some(r.now + params().window));
    r.drain(MIDDLE);
    assert!(
        r.node.poll_move(MIDDLE).is_none(),
        "nothing before the window ends"
    );
    r.now += params().window;
    let next = r.node.torchestra_tick(r.now);
    assert_eq!(next, Some(r.now + params().window));
    assert_eq!(
        r.node.poll_move(MIDDLE),
        Some(CircuitMove {
            circ_id: circs[0].id,
            heavy: true,
            propagate: true
        })
    );
    assert_eq!(r.node.poll_move(MIDDLE), None);
    assert!(!r.node.channels_with_work().any(|c| c == MIDDLE));
    // Idle from now on: after enough windows it turns light again.
    let mut back = None;
    for w in 0..40 {
        r.now += params().window;
        r.node.torchestra_tick(r.now);
        if let Some(m) = r.node.poll_move(MIDDLE) {
            assert_eq!((m.circ_id, m.heavy), (circs[0].id, false));
            back = Some(w);
            break;
        }
    }
    assert!(back.is_some(), "the idle bulk circuit stayed heavy");
}

#[test]
fn without_the_classifier_nothing_moves() {
    let mut r = exit(false);
    r.add_relay_channel(MIDDLE);
    r.open_exit_circuits(MIDDLE, 0x8000_0001, &[60_000, 500]);
    assert_eq!(r.node.torchestra_tick(r.now), None);
    r.drain(MIDDLE);
    r.now += Duration::from_secs(10);
    assert_eq!(r.node.torchestra_tick(r.now), None);
    assert_eq!(r.node.poll_move(MIDDLE), None);
}

/// The middle's outbound circuit ID on `NEXT` (from its CREATE2).
fn outbound_id(r: &mut TestRelay) -> CircId {
    r.drain(NEXT);
    let sent = r.take_all(NEXT);
    sent.iter()
        .find(|(_, m)| matches!(m, AnyChanMsg::Create2(_)))
        .map(|(id, _)| *id)
        .expect("a CREATE2 toward the next hop")
}

fn middle() -> TestRelay {
    let mut r = exit(false);
    r.add_relay_channel(PREV);
    r.add_client_channel(CLIENT);
    r.add_next_hop_channel(NEXT);
    r
}

#[test]
fn the_middle_passes_a_switch_to_the_previous_relay_not_to_a_client() {
    let mut r = middle();
    let mut c = r.open(PREV, 0x8000_0011);
    r.extend(&mut c, NEXT);
    let out = outbound_id(&mut r);
    r.node.transport_switched(r.now, NEXT, out, true, true);
    assert_eq!(
        r.node.poll_move(PREV),
        Some(CircuitMove {
            circ_id: c.id,
            heavy: true,
            propagate: false
        })
    );
    // Without the flag (the entrance's case) nothing goes further.
    r.node.transport_switched(r.now, NEXT, out, false, false);
    assert_eq!(r.node.poll_move(PREV), None);
    // A client's circuit: its link is never split.
    let mut k = r.open(CLIENT, 0x8000_0021);
    r.extend(&mut k, NEXT);
    let out = outbound_id(&mut r);
    r.node.transport_switched(r.now, NEXT, out, true, true);
    assert_eq!(r.node.poll_move(CLIENT), None);
    assert!(r.closed().is_empty());
}

#[test]
fn a_switch_from_the_previous_hop_closes_the_circuit() {
    let mut r = middle();
    let mut c = r.open(PREV, 0x8000_0031);
    r.extend(&mut c, NEXT);
    let _ = outbound_id(&mut r);
    r.node.transport_switched(r.now, PREV, c.id, true, true);
    r.collect_events();
    let closed = r.closed();
    assert_eq!(closed.len(), 1, "{closed:?}");
    assert!(
        closed[0].1.to_string().contains("previous hop"),
        "{}",
        closed[0].1
    );
    // A violation the transport reports closes its circuit too.
    let mut d = r.open(PREV, 0x8000_0041);
    r.extend(&mut d, NEXT);
    r.node
        .transport_violation(r.now, PREV, d.id, "unexpected SWITCHED_CONN");
    r.collect_events();
    assert_eq!(r.closed().len(), 2);
    // Unknown circuits are ignored.
    r.node
        .transport_switched(r.now, NEXT, CircId::new(5).unwrap(), true, true);
    r.node
        .transport_violation(r.now, NEXT, CircId::new(5).unwrap(), "x");
}

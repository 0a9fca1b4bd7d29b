//! Sending per circuit (`circuits_with_work` + `poll_transmit_circuit`),
//! for transports that give each circuit its own lane: every lane gets its
//! circuit's cells in order at its own pace, a stalled lane holds up no
//! other, DESTROYs go on their circuit's lane, and the channel scheduler
//! stays consistent so the connection-wide `poll_transmit` still works.

mod common;

use std::collections::{HashMap, HashSet};

use common::{assert_pattern, data_of, RawCirc, TestRelay};
use onionlab_cell::chan::{AnyChanMsg, CircId, Create2, DestroyReason, HandshakeType};
use onionlab_cell::msg::AnyRelayMsg;
use onionlab_cell::msg::{FlowCtrlVersion, Xoff, Xon, XonKBpsEwma};
use onionlab_circuit::flow::CircuitCc;
use onionlab_circuit::node::{ChannelId, NodeConfig};
use onionlab_circuit::relay::RelayConfig;
use onionlab_circuit::scheduler::SchedulerKind;
use onionlab_circuit::CloseReason;

const CLIENTS: ChannelId = 1;
const NEXT: ChannelId = 10;

fn relay(scheduler: SchedulerKind) -> TestRelay {
    relay_with(scheduler, CircuitCc::Fixed)
}

fn relay_with(scheduler: SchedulerKind, cc: CircuitCc) -> TestRelay {
    let config = NodeConfig {
        scheduler,
        circuit: RelayConfig {
            exit: true,
            // The test drives one-hop circuits.
            allow_one_hop_streams: true,
            ..RelayConfig::default()
        }
        .with_cc(cc),
        ..NodeConfig::default()
    };
    let mut r = TestRelay::new(config, 21);
    r.add_client_channel(CLIENTS);
    r.add_next_hop_channel(NEXT);
    r
}

/// One-hop exit circuits on `CLIENTS` with `lens[i]` bytes queued on
/// circuit `i`.
fn exit_circuits(r: &mut TestRelay, lens: &[usize]) -> Vec<RawCirc> {
    r.open_exit_circuits(CLIENTS, 0x8000_0001, lens)
}

fn lanes_deliver_every_circuit_in_order(scheduler: SchedulerKind) {
    let mut r = relay(scheduler);
    let lens = [20_000, 30_000, 40_000];
    let mut circs = exit_circuits(&mut r, &lens);
    let index: HashMap<CircId, usize> = circs.iter().enumerate().map(|(i, c)| (c.id, i)).collect();
    // Lanes of different speeds: 1, 3 and any number of cells per round.
    let budgets = [1, 3, usize::MAX];
    let mut got = vec![Vec::new(); 3];
    let mut rounds = 0;
    loop {
        let ids: Vec<CircId> = r.node.circuits_with_work(CLIENTS).collect();
        if ids.is_empty() {
            break;
        }
        rounds += 1;
        assert!(rounds < 1000);
        for id in ids {
            let i = index[&id];
            let mut cells = Vec::new();
            while cells.len() < budgets[i] {
                match r.node.poll_transmit_circuit(r.now, CLIENTS, id) {
                    Some(cell) => {
                        let (cid, msg) = cell.into_circid_and_msg();
                        assert_eq!(cid, Some(id));
                        cells.push(msg);
                    }
                    None => break,
                }
            }
            assert!(!cells.is_empty(), "a circuit with work gave no cell");
            data_of(&mut circs[i], cells, &mut got[i]);
        }
    }
    for (i, bytes) in got.iter().enumerate() {
        assert_pattern(bytes, i, lens[i]);
    }
    // The slowest lane set the pace: one cell per round.
    assert_eq!(rounds, lens[0].div_ceil(498));
    // Nothing left, and the scheduler agrees.
    assert_eq!(r.node.total_queued_bytes(), 0);
    assert!(r.node.channels_with_work().next().is_none());
    assert!(r.node.poll_transmit(r.now, CLIENTS).is_none());
}

#[test]
fn lanes_deliver_every_circuit_in_order_ewma() {
    lanes_deliver_every_circuit_in_order(SchedulerKind::default());
}

#[test]
fn lanes_deliver_every_circuit_in_order_round_robin() {
    lanes_deliver_every_circuit_in_order(SchedulerKind::RoundRobin);
}

#[test]
fn a_stalled_lane_holds_up_no_other_and_styles_mix() {
    let mut r = relay(SchedulerKind::default());
    let [mut a, mut b] =
        <[RawCirc; 2]>::try_from(exit_circuits(&mut r, &[10_000, 10_000])).expect("two circuits");
    let a_held = r.circ_bytes(a.key);

    // Only b's lane moves.
    let mut got_b = Vec::new();
    let mut cells = Vec::new();
    while let Some(cell) = r.node.poll_transmit_circuit(r.now, CLIENTS, b.id) {
        cells.push(cell.into_circid_and_msg().1);
    }
    data_of(&mut b, cells, &mut got_b);
    assert_pattern(&got_b, 1, 10_000);
    assert_eq!(r.circ_bytes(a.key), a_held);
    let busy: Vec<CircId> = r.node.circuits_with_work(CLIENTS).collect();
    assert_eq!(busy, vec![a.id]);
    assert_eq!(
        r.node.channels_with_work().collect::<Vec<_>>(),
        vec![CLIENTS]
    );

    // The connection-wide writer takes over: a's cells, in order.
    r.drain(CLIENTS);
    let mut got_a = Vec::new();
    let cells = r.take(CLIENTS, a.id);
    data_of(&mut a, cells, &mut got_a);
    assert_pattern(&got_a, 0, 10_000);
    assert!(r.take(CLIENTS, b.id).is_empty());
    assert!(r.node.poll_transmit_circuit(r.now, CLIENTS, b.id).is_none());
    assert!(r.node.circuits_with_work(CLIENTS).next().is_none());
    assert!(r.node.channels_with_work().next().is_none());

    // The other way: a circuit's lane toward its next hop starts with the
    // CREATE2, then the cells the client sent onward.
    let mut c = r.open(CLIENTS, 0x8000_0010);
    r.extend(&mut c, NEXT);
    r.send_onward(&c, 5);
    let lanes: Vec<CircId> = r.node.circuits_with_work(NEXT).collect();
    assert_eq!(lanes.len(), 1);
    let mut out = Vec::new();
    while let Some(cell) = r.node.poll_transmit_circuit(r.now, NEXT, lanes[0]) {
        let (cid, msg) = cell.into_circid_and_msg();
        assert_eq!(cid, Some(lanes[0]));
        out.push(msg);
    }
    assert_eq!(out.len(), 6);
    assert!(matches!(out[0], AnyChanMsg::Create2(_)));
    assert!(out[1..].iter().all(|m| matches!(m, AnyChanMsg::Relay(_))));
    assert!(r.node.channels_with_work().next().is_none());
    assert_eq!(r.node.total_queued_bytes(), 0);
}

#[test]
fn destroys_go_on_their_circuits_lane() {
    let mut r = relay(SchedulerKind::RoundRobin);
    let [a, b] = <[RawCirc; 2]>::try_from(exit_circuits(&mut r, &[0, 3000])).expect("two circuits");
    r.node.close_circuit(
        r.now,
        a.key,
        CloseReason::local(DestroyReason::FINISHED, "test"),
    );
    r.collect_events();
    // A CREATE2 refused (garbage onionskin) also leaves a DESTROY.
    let refused = CircId::new(0x8000_0100).expect("id");
    r.send(
        CLIENTS,
        refused,
        Create2::new(HandshakeType::NTOR, vec![0; 84]).into(),
    );
    assert_eq!(r.node.queued_destroys(CLIENTS), 2);

    let busy: HashSet<CircId> = r.node.circuits_with_work(CLIENTS).collect();
    assert_eq!(busy, HashSet::from([a.id, b.id, refused]));
    for id in [a.id, refused] {
        let cell = r
            .node
            .poll_transmit_circuit(r.now, CLIENTS, id)
            .expect("DESTROY");
        let (cid, msg) = cell.into_circid_and_msg();
        assert_eq!(cid, Some(id));
        assert!(matches!(msg, AnyChanMsg::Destroy(_)), "{msg:?}");
        assert!(r.node.poll_transmit_circuit(r.now, CLIENTS, id).is_none());
    }
    assert_eq!(r.node.queued_destroys(CLIENTS), 0);
    assert_eq!(r.node.total_queued_bytes(), r.circ_bytes(b.key));
    let busy: Vec<CircId> = r.node.circuits_with_work(CLIENTS).collect();
    assert_eq!(busy, vec![b.id]);
    // An ID the channel does not know, a channel the node does not know.
    let unknown = CircId::new(0x8000_0200).expect("id");
    assert!(r
        .node
        .poll_transmit_circuit(r.now, CLIENTS, unknown)
        .is_none());
    assert!(r.node.poll_transmit_circuit(r.now, 99, b.id).is_none());
    assert!(r.node.circuits_with_work(99).next().is_none());
}

/// An XOFF stops a circuit's only stream without the circuit sending
/// anything: the circuit must leave its channel's work at once. Left in
/// the scheduler, it kept the channel listed in `channels_with_work` while
/// `circuits_with_work` was empty, and a per-circuit writer woke for ever
/// (a relay spinning at 100% CPU, starving its QUIC connections).
#[test]
fn an_xoff_takes_the_circuit_out_of_its_channels_work() {
    for scheduler in [SchedulerKind::default(), SchedulerKind::RoundRobin] {
        let mut r = relay_with(scheduler, CircuitCc::vegas());
        let mut c = r.open(CLIENTS, 0x8000_0001);
        let sid = r.begin(&mut c, 1);
        let got = r.receive(&mut c);
        assert!(
            matches!(got.as_slice(), [Ok((Some(_), AnyRelayMsg::Connected(_)))]),
            "{got:?}"
        );
        let n = r
            .node
            .exit_write(r.now, c.key, sid, &[7u8; 20_000])
            .expect("write");
        assert_eq!(n, 20_000);
        let has_work = |r: &TestRelay| r.node.channels_with_work().any(|ch| ch == CLIENTS);
        assert!(has_work(&r));
        r.relay(
            &mut c,
            Some(1),
            Xoff::new(FlowCtrlVersion::V0).into(),
            false,
        );
        assert_eq!(r.node.circuits_with_work(CLIENTS).count(), 0);
        assert!(!has_work(&r), "an XOFF'd circuit keeps its channel busy");
        let xon = Xon::new(FlowCtrlVersion::V0, XonKBpsEwma::Unlimited);
        r.relay(&mut c, Some(1), xon.into(), false);
        assert!(has_work(&r), "XON puts it back");
        assert_eq!(r.node.circuits_with_work(CLIENTS).count(), 1);
    }
}

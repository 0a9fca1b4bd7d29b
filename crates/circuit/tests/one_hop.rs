//! Exits refuse streams on the first hop of a circuit (as C tor does: END
//! TORPROTOCOL), so a relay cannot be used as a one-hop proxy; a circuit
//! that reached the exit through another relay is served.

mod common;

use common::TestRelay;
use onionlab_cell::msg::{AnyRelayMsg, Begin, BeginFlags, EndReason};
use onionlab_circuit::node::{ChannelId, NodeConfig, NodeEvent};
use onionlab_circuit::relay::RelayConfig;

const CHAN: ChannelId = 1;

fn exit(allow_one_hop_streams: bool) -> TestRelay {
    let config = NodeConfig {
        circuit: RelayConfig {
            exit: true,
            allow_one_hop_streams,
            ..RelayConfig::default()
        },
        ..NodeConfig::default()
    };
    TestRelay::new(config, 3)
}

/// Send BEGIN on stream 1 of a new circuit over `CHAN`; whether the relay
/// asked its driver to connect, and what came back to the client.
fn begin(r: &mut TestRelay) -> (bool, Vec<AnyRelayMsg>) {
    let mut c = r.open(CHAN, 0x8000_0001);
    let seen = r.events.len();
    let begin = Begin::new("example.com", 80, BeginFlags::empty()).expect("begin");
    r.relay(&mut c, Some(1), begin.into(), false);
    let connect = r.events[seen..]
        .iter()
        .any(|e| matches!(e, NodeEvent::ExitConnect { .. }));
    let got = r
        .receive(&mut c)
        .into_iter()
        .map(|m| m.expect("a relay message, not a DESTROY").1)
        .collect();
    (connect, got)
}

#[test]
fn begin_on_the_first_hop_is_refused_with_torprotocol() {
    let mut r = exit(false);
    r.add_client_channel(CHAN);
    let (connect, got) = begin(&mut r);
    assert!(!connect, "no connection attempted");
    let [AnyRelayMsg::End(end)] = got.as_slice() else {
        panic!("expected one END, got {got:?}")
    };
    assert_eq!(end.reason(), EndReason::TORPROTOCOL);
    assert!(r.closed().is_empty(), "the circuit stays open");
}

#[test]
fn begin_from_a_relay_channel_is_served() {
    let mut r = exit(false);
    r.add_relay_channel(CHAN);
    let (connect, got) = begin(&mut r);
    assert!(connect, "the exit connects");
    assert!(got.is_empty(), "nothing before the driver answers: {got:?}");
}

#[test]
fn the_test_harness_opt_in_serves_one_hop_streams() {
    let mut r = exit(true);
    r.add_client_channel(CHAN);
    let (connect, _) = begin(&mut r);
    assert!(connect);
}

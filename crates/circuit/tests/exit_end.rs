//! How an exit ends a stream whose target connection ended: the END carries
//! the reason the driver gives (`RelayNode::exit_end`), after the bytes the
//! target sent before it ended; `exit_close` is END DONE; `exit_refused`
//! drops what was queued.

mod common;

use common::{Received, TestRelay};
use onionlab_cell::chan::AnyChanMsg;
use onionlab_cell::msg::{AnyRelayMsg, EndReason};
use onionlab_circuit::node::{ChannelId, NodeConfig};
use onionlab_circuit::relay::RelayConfig;
use onionlab_circuit::CloseReason;

const CHAN: ChannelId = 1;

fn exit_relay() -> TestRelay {
    let config = NodeConfig {
        circuit: RelayConfig {
            exit: true,
            // The test drives one-hop circuits.
            allow_one_hop_streams: true,
            ..RelayConfig::default()
        },
        ..NodeConfig::default()
    };
    let mut r = TestRelay::new(config, 7);
    r.add_client_channel(CHAN);
    r
}

/// What the client got, as short strings: `data N`, `end REASON`, ...
fn summary(got: Received) -> Vec<String> {
    got.into_iter()
        .map(|m| match m {
            Ok((_, AnyRelayMsg::Connected(_))) => "connected".to_string(),
            Ok((_, AnyRelayMsg::Data(d))) => format!("data {}", Vec::from(d).len()),
            Ok((_, AnyRelayMsg::End(e))) => format!("end {:?}", e.reason()),
            Ok((_, other)) => format!("{other:?}"),
            Err(AnyChanMsg::Destroy(d)) => format!("destroy {:?}", d.reason()),
            Err(other) => format!("{other:?}"),
        })
        .collect()
}

#[test]
fn a_target_reset_ends_with_its_reason_after_the_data_it_sent() {
    let mut r = exit_relay();
    let mut c = r.open(CHAN, 0x8000_0001);
    let sid = r.begin(&mut c, 1);
    assert_eq!(summary(r.receive(&mut c)), ["connected"]);
    let n = r
        .node
        .exit_write(r.now, c.key, sid, &[5; 600])
        .expect("write");
    assert_eq!(n, 600);
    r.node
        .exit_end(r.now, c.key, sid, EndReason::CONNRESET)
        .expect("end");
    r.collect_events();
    assert_eq!(
        summary(r.receive(&mut c)),
        [
            "data 498".to_string(),
            "data 102".to_string(),
            format!("end {:?}", EndReason::CONNRESET)
        ]
    );
    // The stream is gone: a second END has nothing to end, and DATA the
    // client had in flight is dropped without closing the circuit.
    assert!(r.node.exit_end(r.now, c.key, sid, EndReason::MISC).is_err());
    r.data(&mut c, 1, b"late");
    assert!(summary(r.receive(&mut c)).is_empty());
    assert!(r.closed().is_empty(), "{:?}", r.closed());
}

#[test]
fn a_clean_close_ends_done_and_each_stream_keeps_its_own_reason() {
    let mut r = exit_relay();
    let mut c = r.open(CHAN, 0x8000_0001);
    let a = r.begin(&mut c, 1);
    let b = r.begin(&mut c, 2);
    r.receive(&mut c);
    r.node.exit_close(r.now, c.key, a).expect("close a");
    r.node
        .exit_end(r.now, c.key, b, EndReason::TIMEOUT)
        .expect("end b");
    let got = r.receive(&mut c);
    let ends: Vec<(u16, EndReason)> = got
        .into_iter()
        .filter_map(|m| match m {
            Ok((Some(id), AnyRelayMsg::End(e))) => Some((u16::from(id), e.reason())),
            _ => None,
        })
        .collect();
    assert_eq!(ends, [(1, EndReason::DONE), (2, EndReason::TIMEOUT)]);
}

#[test]
fn a_refused_stream_drops_what_was_queued() {
    let mut r = exit_relay();
    let mut c = r.open(CHAN, 0x8000_0001);
    let sid = r.begin(&mut c, 1);
    r.receive(&mut c);
    r.node
        .exit_write(r.now, c.key, sid, &[5; 600])
        .expect("write");
    r.node
        .exit_refused(r.now, c.key, sid, EndReason::RESOURCELIMIT)
        .expect("refuse");
    assert_eq!(
        summary(r.receive(&mut c)),
        [format!("end {:?}", EndReason::RESOURCELIMIT)]
    );
    let closed: Vec<CloseReason> = r.closed().into_iter().map(|(_, why)| why).collect();
    assert!(closed.is_empty(), "{closed:?}");
}

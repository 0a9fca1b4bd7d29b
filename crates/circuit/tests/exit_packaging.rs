//! When an exit packages its streams' bytes into DATA cells
//! (`RelayConfig::exit_packaging`): lazily, when the channel asks for a
//! cell (onionlab's default), or eagerly as they arrive, up to C tor's
//! `cellq_high` queued cells and again from `cellq_low` (C tor's). The
//! difference shows in when the circuit's congestion control counts a cell
//! in flight, and in which blocked-channel signal it takes.

mod common;

use std::time::Duration;

use common::{RawCirc, TestRelay};
use onionlab_cell::msg::{AnyRelayMsg, Sendme, StreamId};
use onionlab_circuit::flow::CircuitCc;
use onionlab_circuit::node::{ChannelId, NodeConfig};
use onionlab_circuit::relay::{ExitPackaging, RelayConfig, CELLQ_HIGH, CELLQ_LOW};

const CHAN: ChannelId = 1;
/// Bytes in a full DATA cell.
const CELL: usize = 498;
/// An exit stream's buffer (`StreamConfig::default().send_buffer`).
const BUFFER: usize = 64 * 1024;

fn exit_relay(packaging: ExitPackaging, cc: CircuitCc) -> TestRelay {
    let config = NodeConfig {
        circuit: RelayConfig {
            exit: true,
            // The test drives one-hop circuits.
            allow_one_hop_streams: true,
            exit_packaging: packaging,
            ..RelayConfig::default()
        }
        .with_cc(cc),
        ..NodeConfig::default()
    };
    let mut r = TestRelay::new(config, 11);
    r.add_client_channel(CHAN);
    r
}

/// Vegas with an initial window of `cells` (C tor's is 124).
fn vegas_starting_at(cells: u32) -> CircuitCc {
    let mut cc = CircuitCc::vegas();
    cc.set_param("cc_cwnd_init", cells).expect("in range");
    cc
}

/// One circuit with one connected stream, its CONNECTED already read.
fn open_stream(r: &mut TestRelay) -> (RawCirc, StreamId) {
    let mut c = r.open(CHAN, 0x8000_0001);
    let sid = r.begin(&mut c, 1);
    r.receive(&mut c);
    (c, sid)
}

/// Bytes from the target, `cells` full cells at a time, until the stream
/// takes no more; returns how many it took.
fn fill(r: &mut TestRelay, c: &RawCirc, sid: StreamId, cells: usize) -> usize {
    let chunk = vec![7; cells * CELL];
    let mut total = 0;
    loop {
        let n = r.node.exit_write(r.now, c.key, sid, &chunk).expect("write");
        r.collect_events();
        if n == 0 {
            return total;
        }
        total += n;
    }
}

fn inflight(r: &TestRelay, c: &RawCirc) -> usize {
    r.node.exit_cc_snapshot(c.key).expect("vegas").inflight as usize
}

#[test]
fn an_eager_exit_counts_cells_in_flight_when_it_packages_them() {
    for packaging in [ExitPackaging::Lazy, ExitPackaging::Eager] {
        let mut r = exit_relay(packaging, CircuitCc::vegas());
        let (c, sid) = open_stream(&mut r);
        fill(&mut r, &c, sid, 32);
        let before = r.node.exit_cc_snapshot(c.key).expect("vegas");
        let sent = r.drain(CHAN);
        let after = r.node.exit_cc_snapshot(c.key).expect("vegas");
        // The initial window (124 cells) is what goes out either way...
        assert_eq!(after.inflight, 124, "{packaging}");
        assert_eq!(sent, 124, "{packaging}");
        // ...but only the eager exit counted it before the channel took it.
        let expected_before = match packaging {
            ExitPackaging::Lazy => 0,
            ExitPackaging::Eager => 124,
        };
        assert_eq!(before.inflight, expected_before, "{packaging}");
    }
}

#[test]
fn an_eager_exit_stops_at_cellq_high_and_packages_again_at_cellq_low() {
    let mut r = exit_relay(ExitPackaging::Eager, vegas_starting_at(1000));
    let (c, sid) = open_stream(&mut r);
    // Reads of 40 cells: the seventh takes the queue to CELLQ_HIGH after
    // 16 of its cells; the rest of it waits in the stream buffer.
    let took = fill(&mut r, &c, sid, 40);
    assert_eq!(inflight(&r, &c), CELLQ_HIGH);
    assert!(
        r.node
            .exit_cc_snapshot(c.key)
            .expect("vegas")
            .channel_blocked,
        "blocked on its own queue"
    );
    assert_eq!(
        took,
        CELLQ_HIGH * CELL + BUFFER,
        "a full stream buffer behind"
    );
    // Down to one above the low watermark: still blocked, nothing packaged.
    let above_low = CELLQ_HIGH - CELLQ_LOW - 1;
    assert_eq!(r.pump(CHAN, above_low), above_low);
    assert_eq!(r.node.exit_write_room(r.now, c.key, sid).expect("room"), 0);
    assert_eq!(inflight(&r, &c), CELLQ_HIGH);
    // One more: the queue is at the low watermark, and the exit packages
    // the stream buffer's whole cells (131; the last 298 bytes wait),
    // which leaves the queue below the high watermark.
    assert_eq!(r.pump(CHAN, 1), 1);
    assert_eq!(inflight(&r, &c), CELLQ_HIGH + BUFFER / CELL);
    let snapshot = r.node.exit_cc_snapshot(c.key).expect("vegas");
    assert!(!snapshot.channel_blocked, "unblocked at the low watermark");
    assert_eq!(
        r.node.exit_write_room(r.now, c.key, sid).expect("room"),
        BUFFER - BUFFER % CELL
    );
    // The partial cell goes when the channel finds the queue empty.
    assert_eq!(r.drain(CHAN), CELLQ_LOW + BUFFER / CELL + 1);
    assert_eq!(inflight(&r, &c), CELLQ_HIGH + BUFFER.div_ceil(CELL));
}

#[test]
fn a_circuit_sendme_packages_only_up_to_cellq_high() {
    let mut r = exit_relay(ExitPackaging::Eager, vegas_starting_at(250));
    let (mut c, sid) = open_stream(&mut r);
    // The initial window goes into the queue at once (below CELLQ_HIGH),
    // the rest waits in the stream buffer.
    fill(&mut r, &c, sid, 32);
    assert_eq!(inflight(&r, &c), 250);
    // The client reads 31 cells (one SENDME's worth); 219 stay queued.
    r.pump(CHAN, 31);
    let mut tag = None;
    for msg in r.take(CHAN, c.id) {
        let (_, m, t) = common::decrypt_with_tag(&mut c, msg).expect("relay cell");
        assert!(matches!(m, AnyRelayMsg::Data(_)), "{m:?}");
        tag = Some(t);
    }
    r.now += Duration::from_millis(50);
    r.relay(
        &mut c,
        None,
        Sendme::new_tag(tag.expect("31 cells")).into(),
        false,
    );
    // The window opened by 31 cells and slow start widened it, but the
    // exit packages only up to the high watermark: 37 cells.
    let s = r.node.exit_cc_snapshot(c.key).expect("vegas");
    assert_eq!(s.inflight as usize, CELLQ_HIGH, "{s:?}");
    assert!(s.cwnd > s.inflight, "the window is still open: {s:?}");
    assert!(s.channel_blocked, "at the high watermark");
}

#[test]
fn an_eager_exit_packages_whole_cells_as_bytes_arrive() {
    let mut r = exit_relay(ExitPackaging::Eager, CircuitCc::vegas());
    let (c, sid) = open_stream(&mut r);
    r.node
        .exit_write(r.now, c.key, sid, &[7; 2 * CELL + 4])
        .expect("write");
    r.collect_events();
    assert_eq!(inflight(&r, &c), 2, "the last 4 bytes wait");
    r.node
        .exit_write(r.now, c.key, sid, &[7; CELL - 4])
        .expect("write");
    assert_eq!(inflight(&r, &c), 3, "a whole cell now");
    r.node
        .exit_write(r.now, c.key, sid, &[7; 4])
        .expect("write");
    assert_eq!(inflight(&r, &c), 3);
    // The channel drains the queue and then takes the partial cell.
    assert_eq!(r.drain(CHAN), 4);
    assert_eq!(inflight(&r, &c), 4);
    // At the target's end the last partial cell goes at once, with END.
    r.node
        .exit_write(r.now, c.key, sid, &[7; 4])
        .expect("write");
    assert_eq!(inflight(&r, &c), 4);
    r.node.exit_close(r.now, c.key, sid).expect("close");
    assert_eq!(inflight(&r, &c), 5);
}

#[test]
fn an_eager_exit_takes_its_queue_not_the_channel_as_the_blocked_signal() {
    for packaging in [ExitPackaging::Lazy, ExitPackaging::Eager] {
        let mut r = exit_relay(packaging, CircuitCc::vegas());
        let (c, sid) = open_stream(&mut r);
        r.node
            .exit_write(r.now, c.key, sid, &[7; 4000])
            .expect("write");
        r.collect_events();
        // The transport's writer is full.
        r.node.channel_full(CHAN);
        let blocked = r
            .node
            .exit_cc_snapshot(c.key)
            .expect("vegas")
            .channel_blocked;
        assert_eq!(blocked, packaging == ExitPackaging::Lazy, "{packaging}");
    }
}

#[test]
fn eager_and_lazy_exits_deliver_the_same_bytes() {
    let mut delivered = Vec::new();
    for packaging in [ExitPackaging::Lazy, ExitPackaging::Eager] {
        let mut r = exit_relay(packaging, CircuitCc::Fixed);
        let mut c = r.open(CHAN, 0x8000_0001);
        let sid = r.begin(&mut c, 1);
        let bytes = common::pattern(0, 40_000);
        let n = r.node.exit_write(r.now, c.key, sid, &bytes).expect("write");
        assert_eq!(n, bytes.len());
        r.node.exit_close(r.now, c.key, sid).expect("close");
        r.collect_events();
        let mut got = Vec::new();
        for m in r.receive(&mut c) {
            if let Ok((_, AnyRelayMsg::Data(d))) = m {
                got.extend_from_slice(&Vec::from(d));
            }
        }
        common::assert_pattern(&got, 0, bytes.len());
        delivered.push(got.len());
    }
    assert_eq!(delivered, [40_000, 40_000]);
}

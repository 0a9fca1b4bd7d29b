//! XON/XOFF on the in-memory network (proposal 324 section 4): a stream's
//! receiving edge that stops reading makes the sending edge stop within the
//! XOFF limit plus what was in flight, and the transfer completes intact
//! once it reads again. Both directions: the exit's target stops reading an
//! upload, and the client's application stops reading a download.

use std::time::Duration;

use onionlab_cell::msg::StreamId;
use onionlab_cell::relay::MAX_DATA_LEN;
use onionlab_circuit::client::ClientEvent;
use onionlab_circuit::flow::CircuitCc;
use onionlab_circuit::node::{CircKey, NodeEvent};
use onionlab_circuit::scheduler::SchedulerKind;
use onionlab_sim::{Net, Pattern};

/// Bytes moved: well over the XOFF limit (500 cells, about 249 KB).
const TOTAL: usize = 4 << 20;

/// A Vegas network with a built 3-hop circuit and one open stream.
fn open_stream(seed: u64) -> (Net, CircKey, StreamId, CircKey, StreamId) {
    let mut net = Net::with_cc(seed, 3, SchedulerKind::default(), CircuitCc::vegas());
    let id = net.new_circuit();
    net.build(id).expect("build");
    let now = net.instant();
    let s = net
        .client
        .begin(now, id, "target.example", 80)
        .expect("begin");
    let mut at_exit = None;
    for _ in 0..10_000 {
        net.tick();
        for (_, ev) in net.node_events.drain(..) {
            if let NodeEvent::ExitConnect { circ, stream, .. } = ev {
                at_exit = Some((circ, stream));
            }
        }
        let connected = net
            .take_client_events(id)
            .iter()
            .any(|e| matches!(e, ClientEvent::Stream(_)));
        if at_exit.is_some() && connected {
            break;
        }
    }
    let (circ, stream) = at_exit.expect("the exit saw the BEGIN");
    (net, id, s, circ, stream)
}

/// The most a stopped receiver may hold: the XOFF limit plus a congestion
/// window in flight (at most `cc_ss_max` cells on these links).
fn stopped_limit() -> usize {
    let CircuitCc::Vegas { vegas, xon } = CircuitCc::vegas() else {
        unreachable!()
    };
    (xon.xoff_exit.max(xon.xoff_client) + vegas.ss_max) as usize * MAX_DATA_LEN
}

fn no_closure(net: &mut Net, id: CircKey) {
    for (_, ev) in net.node_events.drain(..) {
        assert!(
            !matches!(
                ev,
                NodeEvent::CircuitClosed { .. } | NodeEvent::ChannelViolation { .. }
            ),
            "{ev:?}"
        );
    }
    for ev in net.take_client_events(id) {
        assert!(!matches!(ev, ClientEvent::Closed(_)), "{ev:?}");
    }
}

#[test]
fn an_exit_target_that_stops_reading_stops_the_client() {
    let (mut net, id, s, circ, stream) = open_stream(11);
    let exit = 2;
    let mut up = Pattern::new(5, TOTAL);
    let mut check = Pattern::new(5, TOTAL);
    // Phase 1: the target reads nothing for 5 simulated seconds.
    let until = net.now + Duration::from_secs(5);
    while net.now < until {
        let chunk = up.peek(64 * 1024).to_vec();
        let now = net.instant();
        let n = net.client.write(now, id, s, &chunk).expect("write");
        up.consume(n);
        net.tick();
        no_closure(&mut net, id);
    }
    let held = net.relays[exit].exit_readable_bytes(circ, stream);
    assert!(held > 0, "data reached the exit");
    assert!(
        held <= stopped_limit(),
        "the exit holds {held} bytes, over XOFF limit + window {}",
        stopped_limit()
    );
    assert!(up.remaining > 0, "the client was stopped before the end");
    // Stopped means stopped: nothing more arrives while the target waits.
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.relays[exit].exit_readable_bytes(circ, stream), held);
    // Phase 2: the target reads; the XON resumes the client.
    let mut buf = vec![0u8; 64 * 1024];
    let deadline = net.now + Duration::from_secs(600);
    while check.remaining > 0 {
        assert!(net.now < deadline, "upload did not finish after XON");
        let chunk = up.peek(64 * 1024).to_vec();
        let now = net.instant();
        let n = net.client.write(now, id, s, &chunk).expect("write");
        up.consume(n);
        let now = net.instant();
        let n = net.relays[exit]
            .exit_read(now, circ, stream, &mut buf)
            .expect("exit_read");
        assert!(check.expect(&buf[..n]), "upload corrupt");
        net.tick();
        no_closure(&mut net, id);
    }
}

#[test]
fn a_client_that_stops_reading_stops_the_exit() {
    let (mut net, id, s, circ, stream) = open_stream(12);
    let exit = 2;
    let mut down = Pattern::new(6, TOTAL);
    let mut check = Pattern::new(6, TOTAL);
    let until = net.now + Duration::from_secs(5);
    while net.now < until {
        let now = net.instant();
        let chunk = down.peek(64 * 1024).to_vec();
        let n = net.relays[exit]
            .exit_write(now, circ, stream, &chunk)
            .expect("exit_write");
        down.consume(n);
        net.tick();
        no_closure(&mut net, id);
    }
    let held = net.client.readable_bytes(id, s);
    assert!(held > 0 && held <= stopped_limit(), "client holds {held}");
    assert!(down.remaining > 0, "the exit was stopped before the end");
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.client.readable_bytes(id, s), held);
    let mut buf = vec![0u8; 64 * 1024];
    let deadline = net.now + Duration::from_secs(600);
    while check.remaining > 0 {
        assert!(net.now < deadline, "download did not finish after XON");
        let now = net.instant();
        let chunk = down.peek(64 * 1024).to_vec();
        let n = net.relays[exit]
            .exit_write(now, circ, stream, &chunk)
            .expect("exit_write");
        down.consume(n);
        let n = net.client.read(now, id, s, &mut buf).expect("read");
        assert!(check.expect(&buf[..n]), "download corrupt");
        net.tick();
        no_closure(&mut net, id);
    }
}

/// A client reading steadily at 100 KB/s: after its XOFF, the XONs carry
/// its drain rate, and the exit takes the target's bytes at about that
/// rate (the token bucket of proposal 324 section 4.1.2, as C tor paces its
/// edge reads), instead of bursting until the next XOFF.
#[test]
fn a_slow_reader_paces_the_exit_at_its_drain_rate() {
    let (mut net, id, s, circ, stream) = open_stream(13);
    let exit = 2;
    let rate = 100_000.0; // bytes per second read by the client
    let mut down = Pattern::new(7, TOTAL);
    let mut check = Pattern::new(7, TOTAL);
    let mut buf = vec![0u8; 64 * 1024];
    let start = net.now;
    let (mut paced, mut taken_after, mut held_max) = (false, 0usize, 0usize);
    let measure_from = Duration::from_secs(10);
    while net.now - start < Duration::from_secs(20) {
        let now = net.instant();
        let chunk = down.peek(64 * 1024).to_vec();
        let n = net.relays[exit]
            .exit_write(now, circ, stream, &chunk)
            .expect("exit_write");
        down.consume(n);
        if net.now - start >= measure_from {
            taken_after += n;
            held_max = held_max.max(net.client.readable_bytes(id, s));
        }
        paced |= net.relays[exit]
            .exit_write_resumes_at(circ, stream)
            .is_some();
        // The client reads what its rate allows by now.
        let allowed = ((net.now - start).as_secs_f64() * rate) as usize;
        let read_so_far = TOTAL - check.remaining;
        let want = allowed.saturating_sub(read_so_far).min(buf.len());
        let n = net.client.read(now, id, s, &mut buf[..want]).expect("read");
        assert!(check.expect(&buf[..n]), "download corrupt");
        net.tick();
        no_closure(&mut net, id);
    }
    assert!(paced, "the exit never waited for the XON rate");
    // Over the last 10 s the exit took what the client read (without
    // pacing: 1.2 MB against 1.0), and the client never held as much as
    // its XOFF limit (without pacing: 607 KB, bursts between XOFFs).
    let xoff_limit = 500 * MAX_DATA_LEN;
    assert!(
        held_max < xoff_limit,
        "the client held {held_max} bytes, over its XOFF limit {xoff_limit}"
    );
    let exit_rate = taken_after as f64 / 10.0;
    assert!(
        exit_rate > 0.9 * rate && exit_rate < 1.1 * rate,
        "the exit took {exit_rate:.0} B/s from its target while the client read {rate} B/s"
    );
}

//! A client and three relays (guard, middle, exit) on the deterministic
//! in-memory network: a 3-hop circuit, 10 streams, 10 MiB each way on each,
//! checked byte for byte and by SHA-256, with windows and buffers watched,
//! under fixed windows and under Vegas with XON/XOFF.

use std::collections::HashMap;
use std::time::Duration;

use onionlab_cell::msg::StreamId;
use onionlab_circuit::client::ClientEvent;
use onionlab_circuit::flow::{CircuitCc, STREAMWINDOW_START};
use onionlab_circuit::node::{CircKey, NodeEvent};
use onionlab_circuit::scheduler::SchedulerKind;
use onionlab_circuit::stream::StreamEvent;
use onionlab_circuit::xonxoff::{EdgePosition, XonXoffParams};
use onionlab_sim::{Net, Pattern};
use rand::RngExt;
use sha2::{Digest, Sha256};

/// Most bytes a stream may buffer on receive: one full stream window under
/// fixed windows; under Vegas, the XOFF limit plus what the sender may have
/// in flight when the XOFF reaches it (at most `cc_ss_max` cells here: the
/// simulated links add no queueing, so the window stays in slow start's
/// range).
fn max_recv_buffer(cc: CircuitCc) -> usize {
    let cell = onionlab_cell::relay::MAX_DATA_LEN;
    match cc {
        CircuitCc::Fixed => STREAMWINDOW_START as usize * cell,
        CircuitCc::Vegas { vegas, xon } => {
            let xoff = XonXoffParams::xoff_limit_bytes(&xon, EdgePosition::Exit) as usize;
            xoff + vegas.ss_max as usize * cell
        }
    }
}

struct Flow {
    pattern: Pattern,
    sent: Sha256,
}

struct Check {
    pattern: Pattern,
    got: Sha256,
}

fn transfer(seed: u64, n_streams: u16, bytes: usize, scheduler: SchedulerKind, cc: CircuitCc) {
    let max_recv = max_recv_buffer(cc);
    let mut net = Net::with_cc(seed, 3, scheduler, cc);
    let id = net.new_circuit();
    net.build(id).expect("build");
    assert_eq!(net.n_hops(id), 3);

    let mut client_streams = Vec::new();
    for i in 0..n_streams {
        let now = net.instant();
        let s = net
            .client
            .begin(now, id, "target.example", 1000 + i)
            .expect("begin");
        client_streams.push(s);
    }
    // Client side: what it sends (up) and what it must receive (down).
    let mut up: Vec<Flow> = (0..n_streams)
        .map(|i| Flow {
            pattern: Pattern::new(1000 + u64::from(i), bytes),
            sent: Sha256::new(),
        })
        .collect();
    let mut down_check: Vec<Check> = (0..n_streams)
        .map(|i| Check {
            pattern: Pattern::new(2000 + u64::from(i), bytes),
            got: Sha256::new(),
        })
        .collect();
    // Exit side, keyed by port once the BEGIN arrives.
    let mut exit_streams: HashMap<u16, (CircKey, StreamId)> = HashMap::new();
    let mut down: Vec<Flow> = (0..n_streams)
        .map(|i| Flow {
            pattern: Pattern::new(2000 + u64::from(i), bytes),
            sent: Sha256::new(),
        })
        .collect();
    let mut up_check: Vec<Check> = (0..n_streams)
        .map(|i| Check {
            pattern: Pattern::new(1000 + u64::from(i), bytes),
            got: Sha256::new(),
        })
        .collect();
    let mut closed = vec![false; usize::from(n_streams)];
    let mut ended_at_exit = 0;
    let exit = 2;
    let mut buf = vec![0u8; 64 * 1024];

    let deadline = net.now + Duration::from_secs(3600);
    loop {
        net.tick();
        let now = net.instant();
        for (_, ev) in net.node_events.drain(..) {
            match ev {
                NodeEvent::ExitConnect {
                    circ, stream, port, ..
                } => {
                    exit_streams.insert(port - 1000, (circ, stream));
                }
                NodeEvent::ExitStream {
                    event: StreamEvent::Ended { .. },
                    ..
                } => ended_at_exit += 1,
                NodeEvent::CircuitClosed { reason, .. } => {
                    panic!("circuit closed at a relay: {reason}")
                }
                NodeEvent::ChannelViolation { detail, .. } => panic!("channel violation: {detail}"),
                _ => {}
            }
        }
        for ev in net.take_client_events(id) {
            if let ClientEvent::Closed(r) = ev {
                panic!("client circuit closed: {r}");
            }
        }
        // Client application.
        for i in 0..usize::from(n_streams) {
            let s = client_streams[i];
            let now = net.instant();
            let chunk = up[i].pattern.peek(16 * 1024).to_vec();
            if !chunk.is_empty() {
                let n = net.client.write(now, id, s, &chunk).expect("write");
                up[i].sent.update(&chunk[..n]);
                up[i].pattern.consume(n);
            }
            assert!(
                net.client.readable_bytes(id, s) <= max_recv,
                "client stream buffer over one window"
            );
            if !closed[i] && net.rng.random_bool(0.7) {
                let want = net.rng.random_range(1..=buf.len());
                let n = net.client.read(now, id, s, &mut buf[..want]).expect("read");
                assert!(
                    down_check[i].pattern.expect(&buf[..n]),
                    "stream {i}: bytes out of order or corrupt (down)"
                );
                down_check[i].got.update(&buf[..n]);
            }
            if !closed[i] && up[i].pattern.remaining == 0 && down_check[i].pattern.remaining == 0 {
                net.client.close_stream(now, id, s).expect("close");
                closed[i] = true;
            }
        }
        // Exit application (the TCP targets).
        for (port, (circ, stream)) in exit_streams.clone() {
            let i = usize::from(port);
            let relay = &mut net.relays[exit];
            let chunk = down[i].pattern.peek(16 * 1024).to_vec();
            if !chunk.is_empty() {
                let n = relay
                    .exit_write(now, circ, stream, &chunk)
                    .expect("exit_write");
                down[i].sent.update(&chunk[..n]);
                down[i].pattern.consume(n);
            }
            assert!(
                relay.exit_readable_bytes(circ, stream) <= max_recv,
                "exit stream buffer over one window"
            );
            if net.rng.random_bool(0.7) {
                let want = net.rng.random_range(1..=buf.len());
                let Ok(n) = relay.exit_read(now, circ, stream, &mut buf[..want]) else {
                    continue;
                };
                assert!(
                    up_check[i].pattern.expect(&buf[..n]),
                    "stream {i}: bytes out of order or corrupt (up)"
                );
                up_check[i].got.update(&buf[..n]);
            }
        }
        let all_done =
            closed.iter().all(|c| *c) && up_check.iter().all(|c| c.pattern.remaining == 0);
        if all_done {
            break;
        }
        assert!(net.now < deadline, "transfer did not finish");
    }
    for i in 0..usize::from(n_streams) {
        assert_eq!(
            up[i].sent.clone().finalize(),
            up_check[i].got.clone().finalize(),
            "stream {i} up"
        );
        assert_eq!(
            down[i].sent.clone().finalize(),
            down_check[i].got.clone().finalize(),
            "stream {i} down"
        );
    }
    // The END of every stream reaches the exit and nothing breaks after.
    net.run_for(Duration::from_millis(200));
    ended_at_exit += net
        .node_events
        .iter()
        .filter(|(_, e)| {
            matches!(
                e,
                NodeEvent::ExitStream {
                    event: StreamEvent::Ended { .. },
                    ..
                }
            )
        })
        .count();
    assert_eq!(ended_at_exit, usize::from(n_streams));
    assert!(!net.is_closed(id));
    // Under Vegas both senders took RTT samples and moved their windows.
    if let CircuitCc::Vegas { vegas, .. } = cc {
        let exit_circ = exit_streams.values().next().expect("streams").0;
        let senders = [
            ("client", net.circuit(id).and_then(|c| c.cc_snapshot())),
            ("exit", net.relays[exit].exit_cc_snapshot(exit_circ)),
        ];
        for (who, snap) in senders {
            let snap = snap.expect("a Vegas sender");
            assert!(snap.rtt.samples > 100, "{who}: {snap:?}");
            assert!(snap.rtt.min_us > 0, "{who}: {snap:?}");
            assert_ne!(snap.cwnd, vegas.cwnd_init, "{who}: {snap:?}");
            assert!(!snap.channel_blocked, "{who}: {snap:?}");
        }
        // A full channel toward the client reaches the exit's Vegas (a
        // congestion signal at its next SENDME).
        let node = &mut net.relays[exit];
        let chan = node.inbound_channel(exit_circ).expect("circuit");
        node.channel_full(chan);
        let snap = node.exit_cc_snapshot(exit_circ).expect("Vegas");
        assert!(snap.channel_blocked, "{snap:?}");
    }
}

#[test]
fn ten_streams_ten_mib_each_way_ewma() {
    transfer(
        7,
        10,
        10 * 1024 * 1024,
        SchedulerKind::default(),
        CircuitCc::Fixed,
    );
}

#[test]
fn ten_streams_ten_mib_each_way_vegas() {
    transfer(
        7,
        10,
        10 * 1024 * 1024,
        SchedulerKind::default(),
        CircuitCc::vegas(),
    );
}

#[test]
fn ten_streams_one_mib_each_way_round_robin_other_seeds() {
    for seed in [1, 2, 3] {
        transfer(
            seed,
            10,
            1024 * 1024,
            SchedulerKind::RoundRobin,
            CircuitCc::Fixed,
        );
        transfer(
            seed,
            10,
            1024 * 1024,
            SchedulerKind::RoundRobin,
            CircuitCc::vegas(),
        );
    }
}

//! The simulation is exactly repeatable: the same scenario run twice in one
//! process gives a byte-identical event log (every cell sent and delivered
//! with its simulated time, link, circuit and a digest of its content, every
//! relay and client event). std's `HashMap`s are seeded at random per map
//! instance, so the two runs see different seeds: any iteration over a
//! hashed collection whose order reaches the output (which channel a relay
//! serves first, which circuit a closed channel tears down first, ...)
//! shows up as a difference.
//!
//! The scenario is busy on purpose: a guard, three middles and an exit;
//! nine circuits through the three middles, so the guard and the exit each
//! have several channels with work in the same tick and every channel
//! carries several circuits, each with a download and an upload. Then,
//! under load, a middle's channel to the exit breaks (its circuits send
//! TRUNCATED to their clients, which tear them down), and another
//! middle's channel to the guard breaks (its circuits close at once,
//! DESTROY onward, in the order the middle visits them), while the
//! circuits through the third middle go on. Runs are compared with the
//! first several times: a hash order that reaches the output differs
//! between two maps with probability 1/2 at worst (two keys), so a few
//! runs catch it almost surely.

use std::collections::BTreeMap;

use onionlab_cell::msg::StreamId;
use onionlab_circuit::flow::CircuitCc;
use onionlab_circuit::node::{CircKey, NodeEvent};
use onionlab_circuit::scheduler::SchedulerKind;
use onionlab_sim::{End, Net, Pattern};

/// Guard 0, middles 1..=3, exit 4.
const RELAYS: usize = 5;
const EXIT: usize = RELAYS - 1;
const CIRCUITS: usize = 9;
/// Runs compared with the first.
const REPEATS: usize = 4;

/// One client circuit's two streams, client side.
struct ClientFlows {
    id: CircKey,
    /// The client writes this (upload).
    up: StreamId,
    up_data: Pattern,
    /// The client reads this (download).
    down: StreamId,
}

/// Run the scenario; returns its event log, plus one line per tick of
/// what the applications at both ends moved.
fn scenario(seed: u64, scheduler: SchedulerKind, cc: CircuitCc) -> Vec<String> {
    let mut net = Net::with_cc(seed, RELAYS, scheduler, cc);
    net.enable_trace();
    let mut flows = Vec::new();
    for i in 0..CIRCUITS {
        let id = net.new_circuit();
        let middle = 1 + i % 3;
        net.build_via(id, &[middle, EXIT]).expect("build");
        let now = net.instant();
        let port = 1000 + 10 * i as u16;
        let up = net
            .client
            .begin(now, id, "up.example", port)
            .expect("begin");
        let down = net
            .client
            .begin(now, id, "down.example", port + 1)
            .expect("begin");
        flows.push(ClientFlows {
            id,
            up,
            up_data: Pattern::new(seed + i as u64, 100_000 + 40_000 * i),
            down,
        });
    }
    // Exit side: port -> stream, and what each download stream sends.
    let mut exit_streams: BTreeMap<u16, (CircKey, StreamId)> = BTreeMap::new();
    let mut downloads: BTreeMap<u16, Pattern> = (0..CIRCUITS)
        .map(|i| {
            let port = 1001 + 10 * i as u16;
            (port, Pattern::new(seed ^ 0xd0, 150_000 + 50_000 * i))
        })
        .collect();
    let mut app_log = Vec::new();
    let mut buf = vec![0u8; 8192];
    let mut tick = 0u32;
    let broken_at = 1000;
    while tick < broken_at + 1500 {
        tick += 1;
        if tick == broken_at {
            net.drop_channel(1, End::Relay(EXIT));
        }
        if tick == broken_at + 100 {
            net.drop_channel(2, End::Relay(0));
        }
        net.tick();
        let now = net.instant();
        for (_, ev) in net.node_events.drain(..) {
            if let NodeEvent::ExitConnect {
                circ, stream, port, ..
            } = ev
            {
                exit_streams.insert(port, (circ, stream));
            }
        }
        net.client_events.clear();
        let mut moved = Vec::new();
        for (&port, &(circ, stream)) in &exit_streams {
            let relay = &mut net.relays[EXIT];
            if let Some(data) = downloads.get_mut(&port) {
                let chunk = data.peek(4096).to_vec();
                let n = relay.exit_write(now, circ, stream, &chunk).unwrap_or(0);
                data.consume(n);
                moved.push(n);
            } else {
                moved.push(relay.exit_read(now, circ, stream, &mut buf).unwrap_or(0));
            }
        }
        for f in &mut flows {
            let chunk = f.up_data.peek(4096).to_vec();
            let n = net.client.write(now, f.id, f.up, &chunk).unwrap_or(0);
            f.up_data.consume(n);
            moved.push(n);
            moved.push(net.client.read(now, f.id, f.down, &mut buf).unwrap_or(0));
        }
        app_log.push(format!("tick {tick} app {moved:?}"));
    }
    let mut log = net.take_trace();
    log.extend(app_log);
    log
}

/// Panic, naming the first line where the two logs part.
fn assert_same_log(a: &[String], b: &[String], what: &str) {
    if let Some(i) = (0..a.len().min(b.len())).find(|&i| a[i] != b[i]) {
        panic!(
            "{what}: the runs part at line {i} of {}:\n  first:  {}\n  second: {}",
            a.len(),
            a[i],
            b[i]
        );
    }
    assert_eq!(a.len(), b.len(), "{what}: one log is a prefix of the other");
}

fn check(scheduler: SchedulerKind, cc: CircuitCc) {
    let what = format!("{scheduler:?}, {}", cc.name());
    let first = scenario(7, scheduler, cc);
    // The scenario did what it is meant to exercise.
    let count = |pat: &str| first.iter().filter(|l| l.contains(pat)).count();
    assert!(
        count(" send ") > 5000,
        "{what}: {} cells sent",
        count(" send ")
    );
    assert!(
        count(" DATA") + count(" RELAY") > 0,
        "{what}: no relay cells"
    );
    assert!(count("drop channel") == 2, "{what}: channels not dropped");
    // The three circuits through middle 1 close there (TRUNCATED to their
    // clients), then at the guard (their clients' DESTROY); the three
    // through middle 2 close there and at the exit.
    assert!(
        count("CircuitClosed") >= 12,
        "{what}: {} circuits closed at relays",
        count("CircuitClosed")
    );
    assert!(
        count("client Closed {") >= 3,
        "{what}: no client circuit closed"
    );
    assert!(count("DESTROY") >= 6, "{what}: too few DESTROYs");
    let drop_at = first
        .iter()
        .position(|l| l.contains("drop channel"))
        .unwrap_or(0);
    let data_after = first[drop_at..]
        .iter()
        .filter(|l| l.contains(" send ") && l.contains("RELAY"))
        .count();
    assert!(
        data_after > 1000,
        "{what}: {data_after} cells after the drop"
    );
    for _ in 0..REPEATS {
        assert_same_log(&first, &scenario(7, scheduler, cc), &what);
    }
}

#[test]
fn the_same_seed_gives_the_same_event_log_ewma() {
    check(SchedulerKind::default(), CircuitCc::Fixed);
}

#[test]
fn the_same_seed_gives_the_same_event_log_round_robin_vegas() {
    check(SchedulerKind::RoundRobin, CircuitCc::vegas());
}

/// Different seeds give different logs: the log does show the run.
#[test]
fn another_seed_gives_another_log() {
    let kind = SchedulerKind::default();
    let a = scenario(7, kind, CircuitCc::Fixed);
    let b = scenario(8, kind, CircuitCc::Fixed);
    assert_ne!(a, b);
}

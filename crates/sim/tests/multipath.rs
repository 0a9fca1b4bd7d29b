//! Multi-path circuits (seed 004; proposal 329 linked sets) on the
//! in-memory network, in simulated time: 2 or 3 legs to one exit, the
//! legs' delays skewed up to 10x, TCP-like stalls (what a loss repaired
//! under the circuit looks like), and a leg's middle relay killed at a
//! random moment. Every byte arrives once and in order, or the set ends
//! with an error the client sees (and what arrived before is a correct
//! prefix); the out-of-order queues stay within their bound, and a failed
//! set leaves nothing behind at the exit.

use std::time::Duration;

use onionlab_cell::msg::StreamId;
use onionlab_circuit::client::ClientEvent;
use onionlab_circuit::conflux::sched::LegSchedulerKind;
use onionlab_circuit::conflux::DEFAULT_MAX_OUT_OF_ORDER;
use onionlab_circuit::flow::CircuitCc;
use onionlab_circuit::node::{CircKey, NodeEvent};
use onionlab_circuit::scheduler::SchedulerKind;
use onionlab_sim::{End, Net, Pattern};
use proptest::prelude::*;

/// One multi-path download.
#[derive(Debug, Clone)]
struct Case {
    seed: u64,
    legs: usize,
    /// One-way delay of the slowest leg's middle-exit link, as a multiple
    /// of the fastest's (2 ms).
    skew: u64,
    stall: Option<(f64, Duration)>,
    /// Kill the middle of leg `.0` after `.1` of simulated time.
    kill: Option<(usize, Duration)>,
    kind: LegSchedulerKind,
    size: usize,
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Complete,
    /// The set closed; this many bytes had arrived (all checked).
    Failed(usize),
}

fn run(case: &Case) -> Outcome {
    let n = 2 * case.legs + 1;
    let exit = n - 1;
    let mut net = Net::with_options(
        case.seed,
        n,
        SchedulerKind::default(),
        CircuitCc::Fixed,
        Some(case.kind),
    );
    net.stall = case.stall;
    let paths: Vec<Vec<usize>> = (0..case.legs)
        .map(|i| vec![2 * i, 2 * i + 1, exit])
        .collect();
    for i in 0..case.legs {
        let extra = 2_000 + 2_000 * (case.skew - 1) * i as u64 / (case.legs.max(2) - 1) as u64;
        net.set_link_delay(
            End::Relay(2 * i + 1),
            End::Relay(exit),
            Duration::from_micros(extra),
        );
    }
    let set = net.launch_set(&paths, case.kind).expect("launch");
    net.run_until(Duration::from_secs(10), |n| n.client.is_built(set))
        .expect("the set links");
    let now = net.instant();
    let s = net.client.begin(now, set, "x.example", 80).expect("begin");
    let mut at_exit: Option<(CircKey, StreamId)> = None;
    let mut to_send = Pattern::new(case.seed, case.size);
    let mut to_check = Pattern::new(case.seed, case.size);
    let mut buf = vec![0u8; 65536];
    let mut killed = false;
    let start = net.now;
    let limit = start + Duration::from_secs(120);
    while to_check.remaining > 0 {
        assert!(
            net.now < limit,
            "{case:?}: stalled with {} left",
            to_check.remaining
        );
        if let Some((leg, at)) = case.kill {
            if !killed && net.now - start >= at {
                net.kill_relay(2 * leg + 1);
                killed = true;
            }
        }
        net.tick();
        let now = net.instant();
        for (_, ev) in net.node_events.drain(..) {
            if let NodeEvent::ExitConnect { circ, stream, .. } = ev {
                at_exit = Some((circ, stream));
            }
        }
        let closed = net
            .take_client_events(set)
            .iter()
            .any(|e| matches!(e, ClientEvent::Closed(_)));
        if closed {
            return Outcome::Failed(case.size - to_check.remaining);
        }
        if let Some((c, st)) = at_exit {
            let chunk = to_send.peek(16 * 1024).to_vec();
            if !chunk.is_empty() {
                let n = net.relays[exit].exit_write(now, c, st, &chunk).unwrap_or(0);
                to_send.consume(n);
            }
            let queued = net.relays[exit].set_out_of_order_len(c).unwrap_or(0);
            assert!(queued <= DEFAULT_MAX_OUT_OF_ORDER);
        }
        let n = net.client.read(now, set, s, &mut buf).unwrap_or(0);
        assert!(
            to_check.expect(&buf[..n]),
            "{case:?}: bytes corrupted or out of order"
        );
        let queued = net.client.set_out_of_order_len(set).unwrap_or(0);
        assert!(queued <= DEFAULT_MAX_OUT_OF_ORDER);
    }
    if std::env::var_os("MULTIPATH_TIMES").is_some() {
        eprintln!("{case:?}: {:?} simulated", net.now - start);
    }
    Outcome::Complete
}

fn case(seed: u64, legs: usize, skew: u64, kind: LegSchedulerKind) -> Case {
    Case {
        seed,
        legs,
        skew,
        stall: None,
        kill: None,
        kind,
        size: 1_000_000,
    }
}

#[test]
fn two_and_three_legs_deliver_every_byte_in_order() {
    let rr = LegSchedulerKind::RoundRobin { cells_per_leg: 1 };
    for legs in [2, 3] {
        for kind in LegSchedulerKind::ALL {
            assert_eq!(
                run(&case(legs as u64, legs, 10, kind)),
                Outcome::Complete,
                "{kind}"
            );
        }
        assert_eq!(run(&case(9, legs, 1, rr)), Outcome::Complete);
    }
}

#[test]
fn a_killed_leg_fails_the_set_where_the_client_sees_it_and_leaves_nothing_at_the_exit() {
    let rr = LegSchedulerKind::RoundRobin { cells_per_leg: 1 };
    let mut c = case(5, 2, 4, rr);
    c.kill = Some((1, Duration::from_millis(30)));
    let Outcome::Failed(got) = run(&c) else {
        panic!("the transfer cannot finish without one of its legs");
    };
    assert!(got < c.size);
    // And the exit forgot the set: rerun to the failure, then look.
    let n = 5;
    let mut net = Net::with_options(5, n, SchedulerKind::default(), CircuitCc::Fixed, Some(rr));
    let set = net
        .launch_set(&[vec![0, 1, 4], vec![2, 3, 4]], rr)
        .expect("launch");
    net.run_until(Duration::from_secs(10), |n| n.client.is_built(set))
        .expect("linked");
    assert_eq!(net.relays[4].n_sets(), 1);
    net.kill_relay(3);
    net.run_for(Duration::from_millis(200));
    assert_eq!(net.relays[4].n_sets(), 0);
    assert_eq!(net.relays[4].n_circuits(), 0);
    assert!(!net.client.is_built(set));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, .. ProptestConfig::default() })]

    /// Any skew up to 10x, stalls, any scheduler, a leg killed or not:
    /// complete and in order, or failed with a correct prefix; never
    /// failed without a kill.
    #[test]
    fn multipath_transfers_are_complete_or_fail_visibly(
        seed in 0u64..1000,
        legs in 2usize..=3,
        skew in 1u64..=10,
        stall in proptest::option::of((0.0005f64..0.01, 5u64..200)),
        // 300 KB takes about 30-70 ms of simulated time: most kills land
        // mid-transfer.
        kill in proptest::option::of((0usize..3, 1u64..60)),
        kind in 0usize..7,
    ) {
        let c = Case {
            seed,
            legs,
            skew,
            stall: stall.map(|(p, ms)| (p, Duration::from_millis(ms))),
            kill: kill.map(|(leg, ms)| (leg % legs, Duration::from_millis(ms))),
            kind: LegSchedulerKind::ALL[kind],
            size: 300_000,
        };
        let outcome = run(&c);
        if c.kill.is_none() {
            prop_assert_eq!(outcome, Outcome::Complete, "{:?}", c);
        }
    }
}

//! Two whole clients (the onion proxy's real policy, `ClientCore`) on a
//! simulated network with random delays and stalls, through a relay's
//! death and its restart: transfers through the dead relay break (never a
//! short transfer that looks complete), requests made after it complete
//! on paths that avoid it, and once its avoidance period is over the
//! restarted relay carries circuits again.

use std::time::Duration;

use onionlab_client_core::path::Target;
use onionlab_client_core::{RequestId, StreamFailure};
use onionlab_sim::{Network, Outcome};

const AVOIDANCE: Duration = Duration::from_secs(5);

fn web() -> Target {
    Target::ip("192.0.2.1".parse().expect("ip"), 80)
}

/// 3 guards, 3 middles, 2 exits; two clients whose circuits take one
/// stream each (dirtiness 0), so every request builds a fresh path.
fn network(seed: u64) -> Network {
    let mut net = Network::new(seed, (3, 3, 2), 2, |mut p| {
        p.max_circuit_dirtiness = Duration::ZERO;
        p.relay_failure_avoidance = AVOIDANCE;
        p.circuit_build_timeout = Duration::from_secs(3);
        p.stream_connect_timeout = Duration::from_secs(3);
        p
    });
    net.stall = Some((0.002, Duration::from_millis(60)));
    net.response_len = 48 * 1024;
    net
}

/// Each client asks for `n` transfers.
fn request_all(net: &mut Network, n: usize) -> Vec<(usize, RequestId)> {
    let mut ids = Vec::new();
    for _ in 0..n {
        for k in 0..2 {
            ids.push((k, net.request(k, web())));
        }
    }
    ids
}

fn outcome(net: &Network, (k, id): (usize, RequestId)) -> Outcome {
    net.transfers[k][&id].outcome.clone()
}

/// Each client asks for `n` transfers at once; all complete within
/// `limit`.
fn all_complete(net: &mut Network, n: usize, limit: Duration, seed: u64) {
    let ids = request_all(net, n);
    assert!(net.run_until_settled(limit), "seed {seed}");
    for &t in &ids {
        assert_eq!(outcome(net, t), Outcome::Complete, "seed {seed}: {t:?}");
    }
}

#[test]
fn two_clients_survive_a_relay_death_and_use_it_again_after_its_restart() {
    // The victim is the guard (hop 0) or the middle (hop 1) of one of
    // client 0's circuits.
    for (seed, hop) in [(1, 0), (2, 1), (3, 0), (4, 1)] {
        let mut net = network(seed);

        // Before: everything completes.
        all_complete(&mut net, 4, Duration::from_secs(30), seed);

        // Start transfers big enough to be in flight, then kill a relay
        // they go through.
        net.response_len = 16 << 20;
        let during = request_all(&mut net, 3);
        let flowing = |net: &Network| {
            during
                .iter()
                .all(|&(k, id)| net.transfers[k][&id].received > 0)
        };
        for _ in 0..40_000 {
            if flowing(&net) {
                break;
            }
            net.tick();
        }
        assert!(flowing(&net), "seed {seed}: transfers not flowing");
        let paths = net.clients[0].circuit_paths();
        let victim = net
            .doc
            .relays
            .iter()
            .position(|r| r.ed_identity == paths[0][hop])
            .expect("listed");
        net.kill_relay(victim);
        assert!(
            net.run_until_settled(Duration::from_secs(120)),
            "seed {seed}"
        );
        let broken = during
            .iter()
            .filter(|&&t| matches!(outcome(&net, t), Outcome::Broken(_)))
            .count();
        assert!(
            broken > 0,
            "seed {seed}: no transfer went through relay {victim}"
        );
        // Every transfer either completed or broke (its application
        // reset): none ended cleanly short (Truncated) or corrupt.
        for &t in &during {
            match outcome(&net, t) {
                Outcome::Complete | Outcome::Broken(_) => {}
                other => panic!("seed {seed}: {t:?} {other:?}"),
            }
        }

        // Right after: new requests complete on paths that avoid the dead
        // relay. A client that had no circuit through it learns by trying
        // it once (its channel refused, or the extend to it failed).
        net.response_len = 48 * 1024;
        let refused_before = net.relay_refused(victim);
        // One request per client at a time: each gets a fresh path.
        for _ in 0..8 {
            all_complete(&mut net, 1, Duration::from_secs(60), seed);
        }
        let tried = net.relay_refused(victim) - refused_before;
        assert!(
            tried <= 2,
            "seed {seed}: relay {victim} tried {tried} times while dead"
        );

        // The relay restarts; past the avoidance period, paths use it again.
        net.restart_relay(victim);
        net.run_for(AVOIDANCE + Duration::from_secs(1));
        let busy_before = net.relay_busy_ticks(victim);
        for _ in 0..10 {
            all_complete(&mut net, 1, Duration::from_secs(30), seed);
        }
        assert!(
            net.relay_busy_ticks(victim) > busy_before,
            "seed {seed}: relay {victim} never used after its restart"
        );
    }
}

#[test]
fn a_client_whose_only_exit_is_dead_fails_its_streams_after_its_retries() {
    // One exit: once it is dead, every build fails at the extend to it;
    // each client's requests (made at once, so they wait for the same
    // circuits) fail after 1 + build_retries builds.
    let build_retries = 2;
    let mut net = Network::new(7, (2, 2, 1), 2, |mut p| {
        p.build_retries = build_retries;
        p.circuit_build_timeout = Duration::from_secs(2);
        p
    });
    let exit = 4;
    net.kill_relay(exit);
    let ids = request_all(&mut net, 2);
    assert!(net.run_until_settled(Duration::from_secs(30)));
    for t in ids {
        match outcome(&net, t) {
            Outcome::Failed(StreamFailure::BuildFailed(_) | StreamFailure::BuildTimeout) => {}
            other => panic!("{t:?}: {other:?}"),
        }
    }
    let builds = 2 * (1 + u64::from(build_retries));
    assert_eq!(
        net.relay_refused(exit),
        builds,
        "builds through the dead exit"
    );
    // The exit comes back: with no other exit it is used at once, though
    // its avoidance period (30 s by default) is not over.
    net.restart_relay(exit);
    all_complete(&mut net, 2, Duration::from_secs(30), 7);
}

/// Two exits that leave BEGIN unanswered; client 0 asks for a stream and
/// the exit its BEGIN went to is returned (the other one starts
/// answering).
fn begin_left_unanswered(net: &mut Network, exits: [usize; 2]) -> (RequestId, usize) {
    for e in exits {
        net.set_silent(e, true);
    }
    let id = net.request(0, web());
    let mut waiting = None;
    for _ in 0..40_000 {
        waiting = exits.into_iter().find(|&e| net.relay_unanswered(e) > 0);
        if waiting.is_some() {
            break;
        }
        net.tick();
    }
    let waiting = waiting.expect("a BEGIN reached an exit");
    for e in exits {
        net.set_silent(e, e == waiting);
    }
    (id, waiting)
}

#[test]
fn a_stream_whose_circuit_dies_before_connected_is_retried_on_a_fresh_one() {
    for (seed, retries) in [(11, 1), (12, 0)] {
        let mut net = Network::new(seed, (2, 2, 2), 1, |mut p| {
            p.stream_retries = retries;
            p
        });
        let (id, exit) = begin_left_unanswered(&mut net, [4, 5]);
        // The exit dies before it answers: the circuit closes under the
        // stream.
        net.kill_relay(exit);
        assert!(net.run_until_settled(Duration::from_secs(30)));
        let got = outcome(&net, (0, id));
        if retries > 0 {
            // A fresh circuit, through the other exit.
            assert_eq!(got, Outcome::Complete, "seed {seed}");
        } else {
            assert_eq!(
                got,
                Outcome::Failed(StreamFailure::CircuitClosed),
                "seed {seed}"
            );
        }
    }
}

#[test]
fn a_silent_exit_fails_the_stream_at_the_connect_timeout() {
    let timeout = Duration::from_secs(2);
    let mut net = Network::new(21, (2, 2, 2), 1, |mut p| {
        p.stream_connect_timeout = timeout;
        p
    });
    let (id, exit) = begin_left_unanswered(&mut net, [4, 5]);
    assert!(net.run_until_settled(Duration::from_secs(30)));
    let t = &net.transfers[0][&id];
    assert_eq!(t.outcome, Outcome::Failed(StreamFailure::ConnectTimeout));
    // BEGIN went out once the circuit was built (well under a second
    // here); the request failed the connect timeout after it, not retried.
    let took = t.ended_at.expect("ended") - t.requested_at;
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(1),
        "{took:?}"
    );
    assert_eq!(net.relay_unanswered(exit), 1);
}

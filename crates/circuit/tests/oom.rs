//! The relay's memory limit (`NodeConfig::max_mem_in_queues`, like tor's
//! MaxMemInQueues): the running total of queued bytes, and the
//! out-of-memory handler that kills the circuits holding the most.
//!
//! "Stuck" next hops are channels the driver never writes, so cells that
//! clients send through them pile up at the relay.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{has_destroy, RawCirc, TestRelay};
use onionlab_cell::chan::{AnyChanMsg, CircId, Create2, Created2, Destroy, DestroyReason};
use onionlab_cell::chan::{HandshakeType, Relay};
use onionlab_cell::msg::{AnyRelayMsg, EndReason, StreamId};
use onionlab_cell::relay::{BoxedCellBody, CELL_DATA_LEN};
use onionlab_circuit::node::{
    allowance, ChannelId, CircKey, NodeConfig, NodeEvent, TransportBuffer,
};
use onionlab_circuit::relay::RelayConfig;
use onionlab_circuit::scheduler::SchedulerKind;
use onionlab_circuit::stream::StreamEvent;
use onionlab_circuit::{CloseKind, QUEUED_CELL_BYTES};
use rand::rngs::StdRng;
use rand::{Rng, RngExt, SeedableRng};

const CLIENTS: ChannelId = 1;
const LIGHT: ChannelId = 2;
const STUCK_A: ChannelId = 10;
const STUCK_B: ChannelId = 11;
const ALL: [ChannelId; 4] = [CLIENTS, LIGHT, STUCK_A, STUCK_B];
const MIB: usize = 1 << 20;

fn config(limit: usize) -> NodeConfig {
    NodeConfig {
        scheduler: SchedulerKind::RoundRobin,
        circuit: RelayConfig {
            exit: true,
            // The test drives one-hop circuits.
            allow_one_hop_streams: true,
            ..RelayConfig::default()
        },
        max_mem_in_queues: limit,
        ..NodeConfig::default()
    }
}

fn low_water(limit: usize) -> usize {
    limit - limit / 4
}

/// A relay with a light one-hop exit circuit on channel LIGHT (a stream
/// open, 1000 bytes from the target waiting for the client), and five
/// circuits from CLIENTS extended to stuck next hops, each holding a
/// share of the limit in cells for the next hop: 24%, 23%, 22%, 21% and 0%
/// (the last one is then filled by the test). All within the circuit
/// window of 1000 cells.
struct Scene {
    r: TestRelay,
    light: RawCirc,
    light_stream: StreamId,
    heavy: Vec<RawCirc>,
}

fn scene(limit: usize) -> Scene {
    let mut r = TestRelay::new(config(limit), 7);
    r.add_client_channel(CLIENTS);
    r.add_client_channel(LIGHT);
    r.add_next_hop_channel(STUCK_A);
    r.add_next_hop_channel(STUCK_B);

    let mut light = r.open(LIGHT, 0x8000_0001);
    let light_stream = r.begin(&mut light, 1);
    let got = r.receive(&mut light);
    assert!(
        matches!(got.as_slice(), [Ok((Some(_), AnyRelayMsg::Connected(_)))]),
        "{got:?}"
    );
    let n = r
        .node
        .exit_write(r.now, light.key, light_stream, &[0xab; 1000])
        .expect("write");
    assert_eq!(n, 1000);

    let cells_in_limit = limit / QUEUED_CELL_BYTES;
    let mut heavy = Vec::new();
    for (i, share) in [24, 23, 22, 21, 0].into_iter().enumerate() {
        let mut c = r.open(CLIENTS, 0x8000_0001 + i as u32);
        r.extend(&mut c, if i % 2 == 0 { STUCK_A } else { STUCK_B });
        let cells = cells_in_limit * share / 100;
        assert!(cells < 1000, "stay within the circuit window");
        r.send_onward(&c, cells);
        heavy.push(c);
    }
    assert_eq!(r.node.oom_circuits_killed(), 0);
    assert!(r.closed().is_empty(), "{:?}", r.closed());
    assert_eq!(r.node.total_queued_bytes(), r.recount(&ALL));
    Scene {
        r,
        light,
        light_stream,
        heavy,
    }
}

/// Fill the last heavy circuit as far as the limit allows without crossing
/// it; returns the cells sent.
fn fill_to_the_limit(s: &mut Scene, limit: usize) -> usize {
    let mut sent = 0;
    while s.r.node.total_queued_bytes() + QUEUED_CELL_BYTES <= limit {
        s.r.send_onward(&s.heavy[4], 1);
        sent += 1;
        assert!(sent < 1000, "stay within the circuit window");
    }
    sent
}

#[test]
fn oom_kills_the_circuits_holding_the_most_and_spares_the_rest() {
    let mut s = scene(MIB);
    fill_to_the_limit(&mut s, MIB);
    assert_eq!(s.r.node.oom_circuits_killed(), 0);
    let held: Vec<usize> = s.heavy.iter().map(|c| s.r.circ_bytes(c.key)).collect();
    let light_held = s.r.circ_bytes(s.light.key);
    assert_eq!(light_held, 1000, "stream bytes count by their length");
    assert!(held.windows(2).take(3).all(|w| w[0] > w[1]), "{held:?}");

    // One more cell crosses the limit. Killing the largest (24%) leaves
    // about 76%, above the low-water mark of 75%, so the next largest goes
    // too.
    s.r.send_onward(&s.heavy[4], 1);
    assert_eq!(s.r.node.oom_circuits_killed(), 2);
    let closed = s.r.closed();
    let killed: HashSet<CircKey> = closed.iter().map(|(k, _)| *k).collect();
    assert_eq!(killed, HashSet::from([s.heavy[0].key, s.heavy[1].key]));
    for (_, reason) in &closed {
        assert_eq!(reason.kind, CloseKind::OutOfMemory);
        assert!(reason.is_out_of_memory());
        assert_eq!(reason.reason, DestroyReason::RESOURCELIMIT);
        assert!(!reason.by_peer);
    }

    // Below the low-water mark, and the running total is right.
    let total = s.r.node.total_queued_bytes();
    assert!(total < low_water(MIB), "{total}");
    assert_eq!(total, s.r.recount(&ALL));
    assert_eq!(s.r.node.n_circuits(), 4);

    // DESTROY went both ways: to the clients...
    s.r.drain(CLIENTS);
    for c in &s.heavy[..2] {
        let got = s.r.take(CLIENTS, c.id);
        assert!(has_destroy(&got, DestroyReason::RESOURCELIMIT), "{got:?}");
    }
    for c in &s.heavy[2..] {
        assert!(s.r.take(CLIENTS, c.id).is_empty());
    }
    // ...and to the next hops, where it is the first cell out.
    for chan in [STUCK_A, STUCK_B] {
        assert_eq!(s.r.node.queued_destroys(chan), 1);
        s.r.pump(chan, 1);
        let got = s.r.take_all(chan);
        assert!(
            matches!(got.as_slice(), [(_, AnyChanMsg::Destroy(d))] if d.reason() == DestroyReason::RESOURCELIMIT),
            "{got:?}"
        );
    }

    // The other heavy circuits still hold their cells.
    for (c, before) in s.heavy[2..4].iter().zip(&held[2..4]) {
        assert_eq!(s.r.circ_bytes(c.key), *before);
    }
    assert!(s.r.circ_bytes(s.heavy[4].key) > held[4]);

    // The light circuit on the other channel was not touched and works
    // both ways.
    assert_eq!(s.r.circ_bytes(s.light.key), light_held);
    let got = s.r.receive(&mut s.light);
    let mut bytes = 0;
    for m in &got {
        match m {
            Ok((Some(id), AnyRelayMsg::Data(d))) if *id == s.light_stream => {
                bytes += d.as_ref().len();
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(bytes, 1000);
    s.r.data(&mut s.light, 1, b"still here");
    let light = &s.light;
    assert!(s.r.events.iter().any(|e| matches!(
        e,
        NodeEvent::ExitStream { circ, event: StreamEvent::Readable { .. } } if *circ == light.key
    )));
    let mut buf = [0u8; 64];
    let n =
        s.r.node
            .exit_read(s.r.now, light.key, s.light_stream, &mut buf)
            .expect("read");
    assert_eq!(&buf[..n], b"still here");
    assert_eq!(s.r.node.oom_circuits_killed(), 2);
    assert_eq!(s.r.node.total_queued_bytes(), s.r.recount(&ALL));
}

#[test]
fn another_engines_holdings_lower_the_nodes_allowance_never_below_half() {
    let mut s = scene(MIB);
    let held: Vec<usize> = s.heavy.iter().map(|c| s.r.circ_bytes(c.key)).collect();
    let others = Arc::new(AtomicUsize::new(0));
    s.r.node.share_limit_with(others.clone());
    // The datagram engine holds 60% of the limit: the node's allowance is
    // the half it always keeps, not 40%.
    others.store(MIB * 60 / 100, Ordering::Relaxed);
    assert_eq!(s.r.node.external_held(), MIB * 60 / 100);
    assert_eq!(allowance(MIB, MIB * 60 / 100), MIB / 2);
    // The node holds 90% of the limit; its next input finds it over its
    // allowance and frees down to 3/4 of it (37.5%): the 24%, 23% and
    // 22% circuits go, the rest stay.
    s.r.send_onward(&s.heavy[4], 1);
    assert_eq!(s.r.node.oom_circuits_killed(), 3);
    let killed: HashSet<CircKey> = s.r.closed().iter().map(|(k, _)| *k).collect();
    let want: HashSet<CircKey> = s.heavy[..3].iter().map(|c| c.key).collect();
    assert_eq!(killed, want);
    assert!(s.r.node.total_queued_bytes() < low_water(MIB / 2));
    assert_eq!(s.r.circ_bytes(s.heavy[3].key), held[3]);
    assert_eq!(s.r.circ_bytes(s.light.key), 1000);
    // Below its allowance it is left alone, however much the other holds.
    others.store(4 * MIB, Ordering::Relaxed);
    s.r.send_onward(&s.heavy[4], 1);
    assert_eq!(s.r.node.oom_circuits_killed(), 3);
    assert_eq!(s.r.node.total_queued_bytes(), s.r.recount(&ALL));
}

#[test]
fn an_allowance_is_the_limit_less_the_others_and_at_least_half() {
    assert_eq!(allowance(1000, 0), 1000);
    assert_eq!(allowance(1000, 300), 700);
    assert_eq!(allowance(1000, 500), 500);
    assert_eq!(allowance(1000, 5000), 500);
    assert_eq!(allowance(1001, 5000), 500);
    assert_eq!(allowance(usize::MAX, usize::MAX), usize::MAX / 2);
    // Two engines each within its allowance hold at most the limit.
    for limit in [100, 101] {
        for a in 0..=limit {
            for b in 0..=limit {
                if a <= allowance(limit, b) && b <= allowance(limit, a) {
                    assert!(a + b <= limit, "{limit}: {a} + {b}");
                }
            }
        }
    }
}

#[test]
fn no_oom_action_at_or_below_the_limit() {
    let mut s = scene(MIB);
    let sent = fill_to_the_limit(&mut s, MIB);
    assert!(sent > 0);
    let total = s.r.node.total_queued_bytes();
    assert!(total <= MIB && total + QUEUED_CELL_BYTES > MIB, "{total}");
    assert_eq!(total, s.r.recount(&ALL));
    assert_eq!(s.r.node.oom_circuits_killed(), 0);
    assert!(s.r.closed().is_empty());
    assert_eq!(s.r.node.n_circuits(), 6);
    // Writing frees memory; the node stays quiet all along.
    s.r.drain(LIGHT);
    s.r.drain(CLIENTS);
    assert_eq!(s.r.node.oom_circuits_killed(), 0);
    assert!(s.r.node.total_queued_bytes() < total);
}

#[test]
fn zero_or_max_limit_means_unlimited() {
    for limit in [0, usize::MAX] {
        let mut r = TestRelay::new(config(limit), 3);
        r.add_client_channel(CLIENTS);
        r.add_next_hop_channel(STUCK_A);
        for i in 0..4 {
            let mut c = r.open(CLIENTS, 0x8000_0001 + i);
            r.extend(&mut c, STUCK_A);
            r.send_onward(&c, 900);
        }
        assert!(r.node.total_queued_bytes() > 3 * MIB / 2);
        assert_eq!(r.node.total_queued_bytes(), r.recount(&[CLIENTS, STUCK_A]));
        assert_eq!(r.node.oom_circuits_killed(), 0);
        assert_eq!(r.node.n_circuits(), 4);
    }
}

#[test]
fn default_limit_is_256_mib() {
    assert_eq!(NodeConfig::default().max_mem_in_queues, 256 * MIB);
}

#[test]
fn exit_stream_buffers_count_and_a_write_can_trigger_the_killer() {
    const LIMIT: usize = 256 * 1024;
    let mut r = TestRelay::new(config(LIMIT), 11);
    r.add_client_channel(CLIENTS);
    let mut x = r.open(CLIENTS, 0x8000_0001);
    let mut y = r.open(CLIENTS, 0x8000_0002);
    let xs: Vec<StreamId> = (1..=3).map(|i| r.begin(&mut x, i)).collect();
    let ys: Vec<StreamId> = (1..=2).map(|i| r.begin(&mut y, i)).collect();
    r.receive(&mut x);
    r.receive(&mut y);
    assert_eq!(r.node.total_queued_bytes(), 0);

    // The client does not read: bytes from the targets stay in the stream
    // buffers (64 KiB each), counted by their length.
    for s in &xs {
        let n = r
            .node
            .exit_write(r.now, x.key, *s, &[1; 70_000])
            .expect("write");
        assert_eq!(n, 65_536);
    }
    let n = r
        .node
        .exit_write(r.now, y.key, ys[0], &[2; 65_536])
        .expect("write");
    assert_eq!(n, 65_536);
    assert_eq!(r.node.total_queued_bytes(), LIMIT);
    assert_eq!(r.node.oom_circuits_killed(), 0);

    // One byte more: the write is taken, then x (192 KiB) is killed.
    let n = r.node.exit_write(r.now, y.key, ys[1], b"!").expect("write");
    assert_eq!(n, 1);
    r.collect_events();
    assert_eq!(r.node.oom_circuits_killed(), 1);
    let closed = r.closed();
    assert!(
        matches!(closed.as_slice(), [(k, reason)] if *k == x.key && reason.is_out_of_memory()),
        "{closed:?}"
    );
    // x's DESTROY is queued for the client (not yet written).
    assert_eq!(
        r.node.total_queued_bytes(),
        65_537 + QUEUED_CELL_BYTES,
        "y's bytes and the DESTROY"
    );
    assert_eq!(r.node.total_queued_bytes(), r.recount(&[CLIENTS]));
    assert!(r.node.exit_write(r.now, x.key, xs[0], b"?").is_err());
    let got = r.receive(&mut y);
    assert_eq!(got.len(), 133, "65537 bytes in 498-byte DATA cells");
    r.drain(CLIENTS);
    assert!(has_destroy(
        &r.take(CLIENTS, x.id),
        DestroyReason::RESOURCELIMIT
    ));
    assert_eq!(r.node.total_queued_bytes(), 0);
}

#[test]
fn destroys_queued_for_the_link_count() {
    let mut r = TestRelay::new(config(0), 5);
    r.add_client_channel(CLIENTS);
    // Garbage onionskins: each CREATE2 is refused with a DESTROY.
    for i in 0..5 {
        let id = CircId::new(0x8000_0100 + i).expect("id");
        r.send(
            CLIENTS,
            id,
            Create2::new(HandshakeType::NTOR, vec![0; 84]).into(),
        );
    }
    assert_eq!(r.node.queued_destroys(CLIENTS), 5);
    assert_eq!(r.node.total_queued_bytes(), 5 * QUEUED_CELL_BYTES);
    r.pump(CLIENTS, 2);
    assert_eq!(r.node.total_queued_bytes(), 3 * QUEUED_CELL_BYTES);
    r.node.remove_channel(r.now, CLIENTS);
    assert_eq!(r.node.total_queued_bytes(), 0);
}

/// A circuit of the randomized test, as its client sees it.
struct Tracked {
    c: RawCirc,
    extended: bool,
    streams: Vec<StreamId>,
    next_stream: u16,
}

/// Random operations on a relay; after each, the running total must equal
/// a recount, and the node must be within its limit unless no circuit
/// holds anything to kill.
/// Returns how many circuits the out-of-memory handler killed.
fn random_operations(seed: u64, limit: usize, steps: usize) -> u64 {
    const LIVE: ChannelId = 20;
    let chans = [CLIENTS, LIGHT, LIVE, STUCK_A];
    let mut r = TestRelay::new(config(limit), seed);
    let mut rng = StdRng::seed_from_u64(seed);
    r.add_client_channel(CLIENTS);
    r.add_client_channel(LIGHT);
    r.add_next_hop_channel(LIVE);
    r.add_next_hop_channel(STUCK_A);
    let mut circs: Vec<Tracked> = Vec::new();
    let mut next_id = 0x8000_0001u32;
    // Circuit IDs the relay used on LIVE (seen in its CREATE2s).
    let mut live_ids: Vec<CircId> = Vec::new();
    let mut kills_seen = 0;

    for step in 0..steps {
        let op = rng.random_range(0..16u32);
        let pick = rng.random_range(0..circs.len().max(1));
        match op {
            0 | 1 if circs.len() < 24 => {
                let chan = if rng.random_bool(0.5) { CLIENTS } else { LIGHT };
                if let Some(c) = r.try_open(chan, next_id) {
                    circs.push(Tracked {
                        c,
                        extended: false,
                        streams: Vec::new(),
                        next_stream: 1,
                    });
                }
                next_id += 1;
            }
            2 => {
                if let Some(t) = circs.get_mut(pick) {
                    if !t.extended && t.streams.is_empty() {
                        let next = if rng.random_bool(0.5) { LIVE } else { STUCK_A };
                        r.extend(&mut t.c, next);
                        t.extended = true;
                    }
                }
            }
            3 | 4 => {
                if let Some(t) = circs.get(pick).filter(|t| t.extended) {
                    // One cell at a time, checking after each input.
                    for _ in 0..rng.random_range(1..60) {
                        r.send_onward(&t.c, 1);
                        let at = format!("seed {seed} step {step} op {op}");
                        check(&r, &chans, limit, &mut kills_seen, true)
                            .unwrap_or_else(|e| panic!("{at}: {e}"));
                    }
                }
            }
            5 => {
                if let Some(t) = circs.get_mut(pick) {
                    let alive = r.node.queued_bytes().any(|(k, _)| k == t.c.key);
                    if !t.extended && alive && t.next_stream < 20 {
                        let id = t.next_stream;
                        t.next_stream += 1;
                        t.streams.extend(r.try_begin(&mut t.c, id));
                    }
                }
            }
            6 | 7 => {
                if let Some(t) = circs.get(pick) {
                    if let Some(sid) = pick_one(&mut rng, &t.streams) {
                        let len = rng.random_range(0..20_000);
                        let data = vec![3u8; len];
                        let _ = r.node.exit_write(r.now, t.c.key, sid, &data);
                        r.collect_events();
                    }
                }
            }
            8 => {
                if let Some(t) = circs.get_mut(pick) {
                    if let Some(sid) = pick_one(&mut rng, &t.streams) {
                        let len = rng.random_range(1..=498);
                        r.data(&mut t.c, u16::from(sid), &vec![4u8; len]);
                    }
                }
            }
            9 => {
                if let Some(t) = circs.get(pick) {
                    if let Some(sid) = pick_one(&mut rng, &t.streams) {
                        let mut buf = vec![0u8; rng.random_range(1..4000)];
                        let _ = r.node.exit_read(r.now, t.c.key, sid, &mut buf);
                        r.collect_events();
                    }
                }
            }
            10 => {
                // Write some cells on a channel (never on STUCK_A).
                let chan = pick_one(&mut rng, &[CLIENTS, LIGHT, LIVE]).expect("chan");
                r.pump(chan, rng.random_range(0..80));
                for (id, msg) in r.take_all(chan) {
                    if chan == LIVE && matches!(msg, AnyChanMsg::Create2(_)) {
                        live_ids.push(id);
                    }
                }
            }
            11 => {
                // The live next hop answers, sends cells back, or destroys.
                if let Some(id) = pick_one(&mut rng, &live_ids) {
                    let msg: AnyChanMsg = match rng.random_range(0..4) {
                        0 => Created2::new(vec![5; 64]).into(),
                        1 => Destroy::new(DestroyReason::FINISHED).into(),
                        _ => {
                            let mut body: BoxedCellBody = Box::new([0; CELL_DATA_LEN]);
                            rng.fill_bytes(&mut body[..]);
                            Relay::from(body).into()
                        }
                    };
                    r.send(LIVE, id, msg);
                }
            }
            12 => {
                if let Some(t) = circs.get(pick) {
                    match rng.random_range(0..3) {
                        0 => r.send(
                            t.c.chan,
                            t.c.id,
                            Destroy::new(DestroyReason::FINISHED).into(),
                        ),
                        1 => {
                            r.node.close_circuit(
                                r.now,
                                t.c.key,
                                onionlab_circuit::CloseReason::local(
                                    DestroyReason::FINISHED,
                                    "test",
                                ),
                            );
                            r.collect_events();
                        }
                        _ => {
                            if let Some(sid) = pick_one(&mut rng, &t.streams) {
                                let _ = if rng.random_bool(0.5) {
                                    r.node.exit_close(r.now, t.c.key, sid)
                                } else {
                                    r.node.exit_refused(r.now, t.c.key, sid, EndReason::DONE)
                                };
                                r.collect_events();
                            }
                        }
                    }
                }
            }
            13 => {
                // A refused CREATE2 queues a link-level DESTROY.
                let id = CircId::new(next_id).expect("id");
                next_id += 1;
                r.send(
                    CLIENTS,
                    id,
                    Create2::new(HandshakeType::NTOR, vec![0; 84]).into(),
                );
            }
            14 if step % 7 == 0 => {
                // A channel goes away and a new one takes its place.
                let chan = pick_one(&mut rng, &chans).expect("chan");
                r.node.remove_channel(r.now, chan);
                r.collect_events();
                r.take_all(chan);
                if chan == LIVE {
                    live_ids.clear();
                }
                if chan == CLIENTS || chan == LIGHT {
                    r.add_client_channel(chan);
                    circs.retain(|t| t.c.chan != chan);
                } else {
                    r.add_next_hop_channel(chan);
                }
            }
            _ => {}
        }
        // Forget circuits the relay closed.
        let alive: HashSet<CircKey> = r.node.queued_bytes().map(|(k, _)| k).collect();
        circs.retain(|t| alive.contains(&t.c.key));

        // Removing a channel closes many circuits in one input: the killer
        // may run halfway, and later closings queue more DESTROYs.
        let low_water_check = op != 14;
        let at = format!("seed {seed} step {step} op {op}");
        check(&r, &chans, limit, &mut kills_seen, low_water_check)
            .unwrap_or_else(|e| panic!("{at}: {e}"));
    }
    r.node.oom_circuits_killed()
}

/// The invariants after one input: the running total equals a recount; it
/// is within the limit unless no circuit holds anything to kill; if the
/// killer ran, it got below the low-water mark (same exception); every
/// kill was reported as an out-of-memory close.
fn check(
    r: &TestRelay,
    chans: &[ChannelId],
    limit: usize,
    kills_seen: &mut u64,
    low_water_check: bool,
) -> Result<(), String> {
    let total = r.node.total_queued_bytes();
    let recount = r.recount(chans);
    if total != recount {
        return Err(format!("running total {total}, recount {recount}"));
    }
    let max_held = r.node.queued_bytes().map(|(_, b)| b).max().unwrap_or(0);
    let killed = r.node.oom_circuits_killed();
    if limit == 0 {
        if killed != 0 {
            return Err(format!("{killed} killed without a limit"));
        }
    } else {
        if total > limit && max_held > 0 {
            return Err(format!("{total} over the limit {limit}"));
        }
        if killed > *kills_seen {
            *kills_seen = killed;
            if low_water_check && total >= low_water(limit) && max_held > 0 {
                return Err(format!("{total} after the killer (limit {limit})"));
            }
        }
    }
    let oom_closes = r
        .closed()
        .iter()
        .filter(|(_, why)| why.is_out_of_memory())
        .count();
    if oom_closes as u64 != killed {
        return Err(format!("{oom_closes} closed for OOM, {killed} counted"));
    }
    Ok(())
}

fn pick_one<T: Copy>(rng: &mut StdRng, items: &[T]) -> Option<T> {
    if items.is_empty() {
        None
    } else {
        items.get(rng.random_range(0..items.len())).copied()
    }
}

#[test]
fn running_total_matches_a_recount_after_random_operations() {
    let limits = [0, 40 * QUEUED_CELL_BYTES, 64 * 1024, 128 * 1024];
    let mut kills = vec![0; limits.len()];
    for seed in 0..8u64 {
        let i = seed as usize % limits.len();
        kills[i] += random_operations(seed, limits[i], 1500);
    }
    // The limited runs did meet the killer.
    assert_eq!(kills[0], 0);
    assert!(kills[1..].iter().all(|k| *k > 0), "{kills:?}");
}

#[test]
fn transport_buffers_count_toward_the_limit() {
    let mut s = scene(MIB);
    fill_to_the_limit(&mut s, MIB);
    let queues = s.r.node.total_queued_bytes();
    let now = s.r.now;
    // A QUIC link's lane buffers on the stuck channel: reported, counted,
    // and re-reporting replaces (not adds to) the channel's figure.
    s.r.node
        .set_transport_buffered(now, STUCK_B, TransportBuffer::Send, 100);
    s.r.node
        .set_transport_buffered(now, STUCK_B, TransportBuffer::Send, 200);
    assert_eq!(s.r.node.total_queued_bytes(), queues + 200);
    assert_eq!(s.r.node.oom_circuits_killed(), 0);
    // Enough transport bytes push the total over the limit: the circuits
    // holding the most are killed, as for queued cells.
    s.r.node
        .set_transport_buffered(now, STUCK_A, TransportBuffer::Send, 64 * 1024);
    assert!(s.r.node.oom_circuits_killed() > 0);
    // Cells on their way out are the circuits' doing: no channel closed.
    assert_eq!(s.r.node.oom_channels_closed(), 0);
    assert!(s.r.node.total_queued_bytes() <= low_water(MIB));
    // A closed channel's figure leaves the total.
    let before = s.r.node.total_queued_bytes();
    s.r.node.remove_channel(now, STUCK_A);
    assert!(s.r.node.total_queued_bytes() <= before - 64 * 1024);
}

/// The out-of-memory events among the node's events.
fn channels_closed_for_oom(events: &[NodeEvent]) -> Vec<ChannelId> {
    events
        .iter()
        .filter_map(|e| match e {
            NodeEvent::ChannelOutOfMemory { chan, .. } => Some(*chan),
            _ => None,
        })
        .collect()
}

#[test]
fn a_channel_holding_the_most_received_data_is_closed() {
    let mut s = scene(MIB);
    let now = s.r.now;
    // The light client's transport holds a little received data (a QUIC
    // reader queue): counted, and below every heavy circuit.
    s.r.node
        .set_transport_buffered(now, LIGHT, TransportBuffer::Receive, 1000);
    fill_to_the_limit(&mut s, MIB);
    assert_eq!(s.r.node.oom_circuits_killed(), 0);
    // A client's link holds received data nobody consumes (its lanes wait
    // on a full reader queue, each with a stream window in quinn), more
    // than any circuit holds: that channel goes first, and with it the
    // circuits it carries; the light circuit and its channel stay.
    let before = s.r.node.total_queued_bytes();
    s.r.node
        .set_transport_buffered(now, CLIENTS, TransportBuffer::Receive, MIB / 3);
    s.r.collect_events();
    assert_eq!(channels_closed_for_oom(&s.r.events), vec![CLIENTS]);
    assert_eq!(s.r.node.oom_channels_closed(), 1);
    // The heavy circuits came from CLIENTS: closed with their channel, not
    // killed one by one.
    assert_eq!(s.r.node.oom_circuits_killed(), 0);
    let closed: HashSet<CircKey> = s.r.closed().iter().map(|(k, _)| *k).collect();
    assert!(s.heavy.iter().all(|c| closed.contains(&c.key)));
    assert!(!closed.contains(&s.light.key));
    let after = s.r.node.total_queued_bytes();
    assert!(after <= low_water(MIB), "{before} -> {after}");
    assert_eq!(after, s.r.recount(&ALL) + 1000);
    // A report for the closed channel changes nothing.
    s.r.node
        .set_transport_buffered(now, CLIENTS, TransportBuffer::Receive, MIB);
    assert_eq!(s.r.node.total_queued_bytes(), after);
}

#[test]
fn received_data_smaller_than_the_circuits_spares_its_channel() {
    let mut s = scene(MIB);
    fill_to_the_limit(&mut s, MIB);
    let now = s.r.now;
    // Received data on the light channel pushes the total over the limit,
    // but every heavy circuit holds more: they go, the channel stays.
    s.r.node
        .set_transport_buffered(now, LIGHT, TransportBuffer::Receive, MIB / 10);
    s.r.collect_events();
    assert!(channels_closed_for_oom(&s.r.events).is_empty());
    assert_eq!(s.r.node.oom_channels_closed(), 0);
    assert!(s.r.node.oom_circuits_killed() > 0);
    assert!(s.r.node.total_queued_bytes() <= low_water(MIB));
}

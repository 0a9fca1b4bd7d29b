//! The client node against real relay nodes, cells passed at once (no
//! delay, no loss: the in-memory network of `onionlab-sim` does that).

use std::collections::BTreeMap;

use onionlab_cell::chan::{AnyChanMsg, ChanMsg};
use onionlab_cell::msg::LinkSpec;
use onionlab_crypto::identity::RelaySecretKeys;
use rand::Rng;

use super::*;
use crate::conflux::sched::LegSchedulerKind;
use crate::node::{ChannelPeer, NodeConfig, NodeEvent, RelayNode};
use crate::relay::RelayConfig;

/// Who holds one end of a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    Client,
    Relay(usize),
}

/// A client node, `n` relay nodes (the last an exit) and instant wires.
struct Harness {
    now: Instant,
    client: ClientNode,
    relays: Vec<RelayNode>,
    /// (end, channel) -> the other end. Channel IDs are the same at both
    /// ends: the client's own, and from 1000 up between relays.
    peer: BTreeMap<(End, ChannelId), End>,
    next_relay_chan: ChannelId,
    /// Open the client's channels when asked.
    answer_channels: bool,
    /// Cells the guards receive from the client are dropped.
    blackhole_guard: bool,
    events: Vec<ClientNodeEvent>,
    /// Streams the exit connected (exit-side circuit and stream).
    exit_streams: Vec<(crate::node::CircKey, StreamId)>,
    /// Cells delivered to each relay.
    cells_in: BTreeMap<usize, usize>,
}

impl Harness {
    fn new(n: usize, seed: u64) -> Harness {
        Harness::build(n, seed, false)
    }

    /// [`Harness::new`] with an exit that links sets.
    fn with_conflux(n: usize, seed: u64) -> Harness {
        Harness::build(n, seed, true)
    }

    fn build(n: usize, seed: u64, conflux: bool) -> Harness {
        let mut rng = StdRng::seed_from_u64(seed);
        let relays = (0..n)
            .map(|i| {
                let config = NodeConfig {
                    circuit: RelayConfig {
                        exit: i == n - 1,
                        conflux,
                        ..RelayConfig::default()
                    },
                    conflux_scheduler: LegSchedulerKind::RoundRobin { cells_per_leg: 1 },
                    ..NodeConfig::default()
                };
                let keys = RelaySecretKeys::generate(&mut rng);
                RelayNode::new(keys, config, StdRng::seed_from_u64(rng.next_u64()))
            })
            .collect();
        let config = ClientNodeConfig {
            build_timeout: Duration::from_secs(10),
            ..ClientNodeConfig::default()
        };
        Harness {
            now: Instant::now(),
            client: ClientNode::new(config, StdRng::seed_from_u64(seed)),
            relays,
            peer: BTreeMap::new(),
            next_relay_chan: 1000,
            answer_channels: true,
            blackhole_guard: false,
            events: Vec::new(),
            exit_streams: Vec::new(),
            cells_in: BTreeMap::new(),
        }
    }

    fn hop(&self, i: usize) -> PathHop {
        let keys = self.relays[i].keys().public();
        let specs = [LinkSpec::Ed25519Id(keys.ed_identity)];
        PathHop {
            linkspecs: specs.iter().map(|s| s.encode().expect("encodes")).collect(),
            keys,
            name: format!("relay{i}"),
        }
    }

    fn path(&self, relays: &[usize]) -> Vec<PathHop> {
        relays.iter().map(|&i| self.hop(i)).collect()
    }

    fn launch(&mut self, relays: &[usize]) -> CircKey {
        let path = self.path(relays);
        self.client
            .launch(self.now, path, CircuitCc::Fixed)
            .expect("launch")
    }

    fn relay_by_identity(&self, id: &Ed25519Identity) -> Option<usize> {
        (0..self.relays.len()).find(|&i| self.relays[i].keys().public().ed_identity == *id)
    }

    fn deliver(&mut self, from: End, chan: ChannelId, cell: AnyChanCell) {
        let Some(&to) = self.peer.get(&(from, chan)) else {
            return;
        };
        match to {
            End::Client => self.client.handle_cell(self.now, chan, cell),
            End::Relay(i) => {
                *self.cells_in.entry(i).or_default() += 1;
                if !(from == End::Client && self.blackhole_guard) {
                    self.relays[i].handle_cell(self.now, chan, cell);
                }
            }
        }
    }

    /// Move cells and answer events until nothing happens.
    fn pump(&mut self) {
        for _ in 0..10_000 {
            let mut moved = false;
            while let Some(ev) = self.client.poll_event() {
                moved = true;
                if let ClientNodeEvent::ChannelWanted { chan, guard } = &ev {
                    if let (true, Some(g)) = (self.answer_channels, self.relay_by_identity(guard)) {
                        self.relays[g].add_channel(*chan, false, ChannelPeer::Client);
                        self.peer.insert((End::Client, *chan), End::Relay(g));
                        self.peer.insert((End::Relay(g), *chan), End::Client);
                        self.client.channel_opened(*chan);
                    }
                }
                self.events.push(ev);
            }
            // Every channel's writer takes one cell in turn, as
            // independent writers on equally fast links would.
            while self.client.poll_channel_ready().is_some() {}
            let client_chans: Vec<ChannelId> = self
                .peer
                .keys()
                .filter(|(end, _)| *end == End::Client)
                .map(|(_, chan)| *chan)
                .collect();
            loop {
                let mut any = false;
                for &chan in &client_chans {
                    if let Some(cell) = self.client.poll_transmit(self.now, chan) {
                        any = true;
                        self.deliver(End::Client, chan, cell);
                    }
                }
                if !any {
                    break;
                }
                moved = true;
            }
            for i in 0..self.relays.len() {
                loop {
                    let chans: Vec<ChannelId> = self.relays[i].channels_with_work().collect();
                    let mut any = false;
                    for chan in chans {
                        if let Some(cell) = self.relays[i].poll_transmit(self.now, chan) {
                            any = true;
                            self.deliver(End::Relay(i), chan, cell);
                        }
                    }
                    if !any {
                        break;
                    }
                    moved = true;
                }
                while let Some(ev) = self.relays[i].poll_event() {
                    moved = true;
                    self.relay_event(i, ev);
                }
            }
            if !moved {
                return;
            }
        }
        panic!("the harness never settles");
    }

    fn relay_event(&mut self, i: usize, ev: NodeEvent) {
        match ev {
            NodeEvent::ConnectRelay { circ, linkspecs } => {
                let target = linkspecs.iter().find_map(|s| match s.parse() {
                    Ok(LinkSpec::Ed25519Id(id)) => self.relay_by_identity(&id),
                    _ => None,
                });
                match target {
                    Some(j) => {
                        let chan = self.next_relay_chan;
                        self.next_relay_chan += 1;
                        self.relays[i].add_channel(chan, true, ChannelPeer::Relay);
                        self.relays[j].add_channel(chan, false, ChannelPeer::Relay);
                        self.peer.insert((End::Relay(i), chan), End::Relay(j));
                        self.peer.insert((End::Relay(j), chan), End::Relay(i));
                        self.relays[i].extend_channel_ready(self.now, circ, chan);
                    }
                    None => self.relays[i].extend_channel_failed(
                        self.now,
                        circ,
                        DestroyReason::CONNECTFAILED,
                    ),
                }
            }
            NodeEvent::ExitConnect { circ, stream, .. } => {
                self.relays[i]
                    .exit_connected(self.now, circ, stream, Some([10, 0, 0, 1].into()))
                    .expect("connected");
                self.exit_streams.push((circ, stream));
            }
            _ => {}
        }
    }

    fn built(&self) -> Vec<CircKey> {
        self.events
            .iter()
            .filter_map(|e| match e {
                ClientNodeEvent::Built { circ, .. } => Some(*circ),
                _ => None,
            })
            .collect()
    }

    fn closed(&self, key: CircKey) -> Option<(Option<BuildFailure>, Option<String>)> {
        self.events.iter().find_map(|e| match e {
            ClientNodeEvent::Closed {
                circ,
                build_failure,
                detail,
                ..
            } if *circ == key => Some((build_failure.clone(), detail.clone())),
            _ => None,
        })
    }

    /// The exit side of the last stream the exit connected.
    fn exit_stream(&self) -> Option<(crate::node::CircKey, StreamId)> {
        self.exit_streams.last().copied()
    }
}

#[test]
fn a_launch_asks_for_the_guard_channel_and_builds_the_whole_path() {
    let mut h = Harness::new(3, 1);
    let a = h.launch(&[0, 1, 2]);
    // Nothing leaves before the channel is open.
    h.answer_channels = false;
    h.pump();
    let Some(ClientNodeEvent::ChannelWanted { chan, guard }) = h.events.first().cloned() else {
        panic!("{:?}", h.events);
    };
    assert_eq!(guard, h.relays[0].keys().public().ed_identity);
    assert!(h.client.poll_transmit(h.now, chan).is_none());
    assert_eq!(h.relays[0].n_circuits(), 0);
    assert!(!h.client.is_built(a));
    // Open it: the circuit is built hop by hop.
    h.relays[0].add_channel(chan, false, ChannelPeer::Client);
    h.peer.insert((End::Client, chan), End::Relay(0));
    h.peer.insert((End::Relay(0), chan), End::Client);
    h.client.channel_opened(chan);
    h.pump();
    assert_eq!(h.built(), [a]);
    assert!(h.client.is_built(a));
    let hops: Vec<usize> = h
        .events
        .iter()
        .filter_map(|e| match e {
            ClientNodeEvent::Circuit {
                event: ClientEvent::HopAdded { hops },
                ..
            } => Some(*hops),
            _ => None,
        })
        .collect();
    assert_eq!(hops, [1, 2, 3]);
    assert!(h.relays.iter().all(|r| r.n_circuits() == 1));
    assert_eq!(h.client.poll_timeout(), None, "no build deadline left");
}

#[test]
fn circuits_through_one_guard_share_its_channel_with_distinct_initiator_ids() {
    let mut h = Harness::new(4, 2);
    let a = h.launch(&[0, 1, 3]);
    let b = h.launch(&[0, 2, 3]);
    h.pump();
    assert_eq!(h.built(), [a, b]);
    let wanted = h
        .events
        .iter()
        .filter(|e| matches!(e, ClientNodeEvent::ChannelWanted { .. }))
        .count();
    assert_eq!(wanted, 1);
    assert_eq!(h.client.channel_of(a), h.client.channel_of(b));
    let chan = h.client.channel_of(a).expect("channel");
    assert_eq!(h.relays[0].channel_circuits(chan), 2);
}

#[test]
fn streams_carry_bytes_both_ways() {
    let mut h = Harness::new(3, 3);
    let a = h.launch(&[0, 1, 2]);
    h.pump();
    let s = h.client.begin(h.now, a, "x.example", 80).expect("begin");
    h.pump();
    assert!(h.events.iter().any(|e| matches!(e,
        ClientNodeEvent::Circuit { circ, event: ClientEvent::Stream(crate::stream::StreamEvent::Connected { stream }) }
            if *circ == a && *stream == s)));
    let sent: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    let mut off = 0;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let exit = 2;
    for _ in 0..1000 {
        if off < sent.len() {
            off += h.client.write(h.now, a, s, &sent[off..]).expect("write");
        }
        h.pump();
        if let Some((circ, stream)) = h.exit_stream() {
            let n = h.relays[exit]
                .exit_read(h.now, circ, stream, &mut buf)
                .unwrap_or(0);
            got.extend_from_slice(&buf[..n]);
            // Echo back.
            let back = h.relays[exit]
                .exit_write(h.now, circ, stream, &buf[..n])
                .expect("exit write");
            assert_eq!(back, n);
        }
        h.pump();
        if got.len() == sent.len() {
            break;
        }
    }
    assert_eq!(got, sent);
    let mut echoed = Vec::new();
    for _ in 0..100 {
        let n = h.client.read(h.now, a, s, &mut buf).expect("read");
        echoed.extend_from_slice(&buf[..n]);
        h.pump();
        if echoed.len() == sent.len() {
            break;
        }
    }
    assert_eq!(echoed, sent);
}

#[test]
fn a_build_not_done_in_time_closes_with_a_timeout() {
    let mut h = Harness::new(3, 4);
    h.blackhole_guard = true;
    let a = h.launch(&[0, 1, 2]);
    h.pump();
    let deadline = h.client.poll_timeout().expect("a build deadline");
    assert!(deadline <= h.now + Duration::from_secs(10));
    h.client.handle_timeout(deadline - Duration::from_millis(1));
    h.pump();
    assert!(h.closed(a).is_none(), "not before the deadline");
    h.now = deadline;
    h.client.handle_timeout(h.now);
    h.pump();
    let (failure, _) = h.closed(a).expect("closed");
    assert_eq!(failure, Some(BuildFailure::Timeout));
    assert_eq!(h.client.poll_timeout(), None);
    assert_eq!(
        h.client.n_circuits(),
        0,
        "forgotten once the DESTROY is out"
    );
}

/// A hop no relay answers to (its keys from `seed`), called "ghost".
fn ghost_hop(seed: u64) -> PathHop {
    let ghost = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(seed)).public();
    PathHop {
        linkspecs: [LinkSpec::Ed25519Id(ghost.ed_identity)]
            .iter()
            .map(|s| s.encode().expect("encodes"))
            .collect(),
        keys: ghost,
        name: "ghost".into(),
    }
}

#[test]
fn a_relay_that_cannot_be_reached_fails_the_build_naming_it() {
    let mut h = Harness::new(3, 5);
    let mut path = h.path(&[0, 1]);
    path.push(ghost_hop(99));
    let a = h
        .client
        .launch(h.now, path, CircuitCc::Fixed)
        .expect("launch");
    h.pump();
    let (failure, detail) = h.closed(a).expect("closed");
    let Some(BuildFailure::Failed(why)) = failure else {
        panic!("{failure:?}");
    };
    assert!(why.starts_with("relay ghost failed"), "{why}");
    assert_eq!(detail.as_deref(), Some(why.as_str()));
    assert!(h.events.iter().any(|e| matches!(
        e,
        ClientNodeEvent::Circuit {
            event: ClientEvent::HopFailed { hop: 2, .. },
            ..
        }
    )));
    assert!(h.relays.iter().all(|r| r.n_circuits() == 0));
}

#[test]
fn a_closed_channel_fails_its_circuits_and_the_next_launch_asks_again() {
    let mut h = Harness::new(3, 6);
    let a = h.launch(&[0, 1, 2]);
    h.pump();
    let chan = h.client.channel_of(a).expect("channel");
    let b = h.launch(&[0, 1, 2]);
    h.client.channel_closed(h.now, chan, "reset by peer");
    h.pump();
    let (failure, detail) = h.closed(a).expect("a closed");
    assert_eq!(failure, None, "a was built");
    assert_eq!(
        detail.as_deref(),
        Some("channel to guard relay0 closed: reset by peer")
    );
    let (failure, _) = h.closed(b).expect("b closed");
    assert!(matches!(failure, Some(BuildFailure::Failed(why)) if why.contains("reset by peer")));
    assert!(!h.client.has_channel(chan));
    h.events.clear();
    let c = h.launch(&[0, 1, 2]);
    h.pump();
    assert!(
        matches!(h.events.first(), Some(ClientNodeEvent::ChannelWanted { chan: new, .. }) if *new != chan)
    );
    assert_eq!(h.built(), [c]);
}

#[test]
fn shutdown_sends_every_destroy_then_lets_channels_close() {
    let mut h = Harness::new(3, 7);
    let a = h.launch(&[0, 1, 2]);
    h.pump();
    let open = h.client.channel_of(a).expect("channel");
    // A second guard whose channel never opens.
    h.answer_channels = false;
    let b = h.launch(&[1, 0, 2]);
    h.pump();
    let pending = h.client.channel_of(b).expect("channel");
    let dropped = h.client.shutdown(h.now);
    assert_eq!(dropped, [pending]);
    assert!(!h.client.channel_done(open), "the DESTROY is not out yet");
    let mut destroys = 0;
    while let Some(cell) = h.client.poll_transmit(h.now, open) {
        assert_eq!(
            cell.msg().cmd(),
            AnyChanMsg::from(Destroy::new(DestroyReason::NONE)).cmd()
        );
        destroys += 1;
        h.deliver(End::Client, open, cell);
    }
    assert_eq!(destroys, 1);
    assert!(h.client.channel_done(open));
    assert_eq!(h.client.n_circuits(), 0);
    h.pump();
    assert!(h.relays.iter().all(|r| r.n_circuits() == 0));
}

#[test]
fn lanes_get_each_circuits_cells() {
    let mut h = Harness::new(3, 8);
    let a = h.launch(&[0, 1, 2]);
    let b = h.launch(&[0, 1, 2]);
    // Take the CREATE2s lane by lane instead of in scheduler order.
    h.answer_channels = false;
    h.pump();
    let chan = h.client.channel_of(a).expect("channel");
    h.relays[0].add_channel(chan, false, ChannelPeer::Client);
    h.peer.insert((End::Client, chan), End::Relay(0));
    h.peer.insert((End::Relay(0), chan), End::Client);
    h.client.channel_opened(chan);
    let lanes = h.client.circuits_with_work(chan);
    assert_eq!(lanes.len(), 2);
    for id in lanes {
        let _ = h.client.lane_priority(h.now, chan, id);
        let cell = h
            .client
            .poll_transmit_circuit(h.now, chan, id)
            .expect("a CREATE2");
        assert_eq!(cell.circid(), Some(id));
        assert!(h.client.poll_transmit_circuit(h.now, chan, id).is_none());
        h.deliver(End::Client, chan, cell);
    }
    assert!(h.client.circuits_with_work(chan).is_empty());
    h.answer_channels = true;
    h.pump();
    assert_eq!(h.built(), [a, b]);
}

#[test]
fn extending_a_built_circuit_builds_it_again() {
    let mut h = Harness::new(3, 9);
    let a = h.launch(&[0]);
    h.pump();
    assert_eq!(h.built(), [a]);
    for i in [1, 2] {
        let hop = h.hop(i);
        h.client.extend(h.now, a, hop).expect("extend");
        assert!(!h.client.is_built(a));
        assert!(h.client.poll_timeout().is_some());
        h.pump();
        assert!(h.client.is_built(a));
    }
    assert_eq!(h.built(), [a, a, a]);
    assert_eq!(h.client.circuit(a).map(|c| c.n_hops()), Some(3));
}

#[test]
fn the_same_seed_gives_the_same_circuit_ids() {
    let ids = |seed| {
        let mut h = Harness::new(3, seed);
        let keys: Vec<CircKey> = (0..3).map(|_| h.launch(&[0, 1, 2])).collect();
        h.pump();
        let chan = h.client.channel_of(keys[0]).expect("channel");
        h.client.circuits_with_work(chan);
        keys.iter()
            .map(|k| h.client.circuits[k].circ_id)
            .collect::<Vec<u32>>()
    };
    assert_eq!(ids(10), ids(10));
    assert_ne!(ids(10), ids(11));
    assert!(ids(10).iter().all(|id| id & 0x8000_0000 != 0));
}

/// Echo `size` bytes through stream `s` of `key` (a circuit or a set):
/// the exit reads what arrives and writes it back.
fn echo(h: &mut Harness, key: CircKey, s: StreamId, size: usize) {
    let exit = h.relays.len() - 1;
    let sent: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let (mut off, mut back) = (0, Vec::new());
    let mut buf = [0u8; 8192];
    for _ in 0..100_000 {
        if off < sent.len() {
            off += h.client.write(h.now, key, s, &sent[off..]).expect("write");
        }
        h.pump();
        if let Some((circ, stream)) = h.exit_stream() {
            let n = h.relays[exit]
                .exit_read(h.now, circ, stream, &mut buf)
                .unwrap_or(0);
            let w = h.relays[exit]
                .exit_write(h.now, circ, stream, &buf[..n])
                .expect("exit write");
            assert_eq!(w, n, "the echo fits the stream window");
        }
        h.pump();
        let n = h.client.read(h.now, key, s, &mut buf).expect("read");
        back.extend_from_slice(&buf[..n]);
        if back.len() == size {
            assert!(back == sent, "echo corrupted or reordered");
            return;
        }
    }
    panic!("echo incomplete: {} of {size}", back.len());
}

#[test]
fn a_linked_set_carries_a_stream_over_two_legs() {
    let mut h = Harness::with_conflux(5, 21);
    let paths = vec![h.path(&[0, 1, 4]), h.path(&[2, 3, 4])];
    let rr = LegSchedulerKind::RoundRobin { cells_per_leg: 1 };
    let set = h
        .client
        .launch_set(h.now, paths, CircuitCc::Fixed, rr)
        .expect("launch");
    h.pump();
    assert_eq!(h.built(), [set], "only the set is reported built");
    assert!(h.client.is_built(set));
    assert_eq!(h.relays[4].n_sets(), 1);
    let wanted = h
        .events
        .iter()
        .filter(|e| matches!(e, ClientNodeEvent::ChannelWanted { .. }))
        .count();
    assert_eq!(wanted, 2, "one channel per guard");
    let s = h.client.begin(h.now, set, "x.example", 80).expect("begin");
    h.pump();
    let before = h.cells_in.clone();
    assert!(h.events.iter().any(|e| matches!(e,
        ClientNodeEvent::Circuit { circ, event: ClientEvent::Stream(crate::stream::StreamEvent::Connected { .. }) }
            if *circ == set)));
    echo(&mut h, set, s, 400_000);
    // Both middles carried the stream's cells: 400 KB each way is about
    // 1600 cells, split by round robin.
    for middle in [1, 3] {
        let cells = h.cells_in[&middle] - before.get(&middle).copied().unwrap_or(0);
        assert!(cells > 500, "relay {middle} carried {cells} cells");
    }
}

#[test]
fn a_set_fails_when_one_of_its_legs_dies() {
    let mut h = Harness::with_conflux(5, 22);
    let paths = vec![h.path(&[0, 1, 4]), h.path(&[2, 3, 4])];
    let set = h
        .client
        .launch_set(h.now, paths, CircuitCc::Fixed, LegSchedulerKind::LowRtt)
        .expect("launch");
    h.pump();
    let s = h.client.begin(h.now, set, "x.example", 80).expect("begin");
    h.pump();
    echo(&mut h, set, s, 20_000);
    // The channel to the second guard closes: its leg, then the set.
    let chan = h
        .events
        .iter()
        .filter_map(|e| match e {
            ClientNodeEvent::ChannelWanted { chan, .. } => Some(*chan),
            _ => None,
        })
        .nth(1)
        .expect("second channel");
    h.client.channel_closed(h.now, chan, "reset");
    h.pump();
    let closed = h.closed(set).expect("the set closed");
    assert_eq!(closed.0, None, "it was built: not a build failure");
    assert!(h.client.write(h.now, set, s, b"more").is_err());
    assert!(!h.client.is_built(set));
    // The exit tore the set and both legs down.
    assert_eq!(h.relays[4].n_sets(), 0);
    assert_eq!(h.relays[4].n_circuits(), 0);
    assert_eq!(h.client.n_circuits(), 0);
}

#[test]
fn a_set_through_an_exit_that_does_not_link_fails_to_build() {
    let mut h = Harness::new(5, 23);
    let paths = vec![h.path(&[0, 1, 4]), h.path(&[2, 3, 4])];
    let set = h
        .client
        .launch_set(h.now, paths, CircuitCc::Fixed, LegSchedulerKind::LowRtt)
        .expect("launch");
    h.pump();
    let (failure, _) = h.closed(set).expect("closed");
    assert!(
        matches!(failure, Some(BuildFailure::Failed(_))),
        "{failure:?}"
    );
    assert!(h.built().is_empty());
    // Paths to different exits are refused at once.
    let mixed = vec![h.path(&[0, 1, 4]), h.path(&[2, 3])];
    assert!(h
        .client
        .launch_set(h.now, mixed, CircuitCc::Fixed, LegSchedulerKind::LowRtt)
        .is_err());
}

#[test]
fn a_leg_whose_relay_cannot_be_reached_names_the_leg_and_hop() {
    let mut h = Harness::with_conflux(5, 29);
    let second = vec![h.hop(2), ghost_hop(98), h.hop(4)];
    let paths = vec![h.path(&[0, 1, 4]), second];
    let set = h
        .client
        .launch_set(h.now, paths, CircuitCc::Fixed, LegSchedulerKind::LowRtt)
        .expect("launch");
    h.pump();
    assert!(h.events.iter().any(|e| matches!(
        e,
        ClientNodeEvent::LegHopFailed { set: s, leg: 1, hop: 1 } if *s == set
    )));
    let (failure, _) = h.closed(set).expect("closed");
    let Some(BuildFailure::Failed(why)) = failure else {
        panic!("{failure:?}");
    };
    assert!(why.contains("ghost"), "{why}");
}

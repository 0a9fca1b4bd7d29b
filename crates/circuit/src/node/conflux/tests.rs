//! A relay node as the exit of a linked set: client legs (client circuits
//! in leg mode with the client's end of the set) on two channels with
//! different delays, real cells both ways.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use onionlab_cell::chan::{AnyChanCell, AnyChanMsg, ChanCell, CircId};
use onionlab_cell::msg::StreamId;
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;
use crate::client::streams::ClientStreams;
use crate::client::{ClientCircuit, ClientConfig, ClientEvent};
use crate::conflux::sched::LegSchedulerKind;
use crate::flow::CircuitCc;
use crate::node::{ChannelId, ChannelPeer, NodeConfig};
use crate::relay::{ExitPackaging, RelayConfig, CELLQ_HIGH, CELLQ_LOW};
use crate::stream::{StreamConfig, StreamFlowKind};
use onionlab_crypto::identity::RelaySecretKeys;

/// Client legs by leg number (= channel number), a node, and wires.
struct World {
    now: Instant,
    node: RelayNode,
    legs: BTreeMap<u8, ClientCircuit>,
    delay: BTreeMap<u8, Duration>,
    up: BTreeMap<u8, VecDeque<(Instant, AnyChanCell)>>,
    down: BTreeMap<u8, VecDeque<(Instant, AnyChanMsg)>>,
    events: Vec<NodeEvent>,
    /// Cells each leg carried toward the client.
    down_cells: BTreeMap<u8, usize>,
}

const CIRC_ID: u32 = 0x8000_0001;

impl World {
    /// Legs with these one-way delays, each on its own client channel,
    /// linked into one set with nonce `nonce`.
    fn new(delays: &[Duration], nonce: V1Nonce) -> World {
        let exit = RelayConfig {
            exit: true,
            allow_one_hop_streams: true,
            conflux: true,
            ..RelayConfig::default()
        };
        let scheduler = LegSchedulerKind::RoundRobin { cells_per_leg: 1 };
        World::with(delays, nonce, exit, scheduler)
    }

    /// [`World::new`] with the exit's circuit settings (its congestion
    /// control the client legs' too) and leg scheduler.
    fn with(
        delays: &[Duration],
        nonce: V1Nonce,
        exit: RelayConfig,
        scheduler: LegSchedulerKind,
    ) -> World {
        let keys = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(5));
        let public = keys.public();
        let client = ClientConfig {
            cc: exit.cc,
            ..ClientConfig::default()
        };
        let config = NodeConfig {
            circuit: exit,
            conflux_scheduler: scheduler,
            ..NodeConfig::default()
        };
        let mut w = World {
            now: Instant::now(),
            node: RelayNode::new(keys, config, StdRng::seed_from_u64(6)),
            legs: BTreeMap::new(),
            delay: BTreeMap::new(),
            up: BTreeMap::new(),
            down: BTreeMap::new(),
            events: Vec::new(),
            down_cells: BTreeMap::new(),
        };
        for (i, d) in delays.iter().enumerate() {
            let i = i as u8;
            w.node
                .add_channel(ChannelId::from(i), false, ChannelPeer::Client);
            let c = ClientCircuit::new(
                client.clone(),
                &public,
                StdRng::seed_from_u64(10 + u64::from(i)),
            );
            w.legs.insert(i, c);
            w.delay.insert(i, *d);
            w.up.insert(i, VecDeque::new());
            w.down.insert(i, VecDeque::new());
        }
        // Build, then link every leg.
        w.run_until(|w| w.legs.values().all(|c| c.n_hops() == 1));
        for c in w.legs.values_mut() {
            let payload = V1LinkPayload::new(nonce, V1DesiredUx::HIGH_THROUGHPUT);
            c.start_leg(payload).expect("start leg");
        }
        w
    }

    /// One millisecond: cells onto wires, due cells delivered, events
    /// taken (a client leg's LINKED is answered with LINKED_ACK).
    fn step(&mut self) {
        self.now += Duration::from_millis(1);
        let now = self.now;
        for (i, c) in &mut self.legs {
            while let Some(msg) = c.poll_transmit(now) {
                let cell = ChanCell::new(CircId::new(CIRC_ID), msg);
                self.up
                    .get_mut(i)
                    .expect("wire")
                    .push_back((now + self.delay[i], cell));
            }
        }
        // The channels' writers take a cell each in turn, as independent
        // writers on equally fast links would.
        let chans: Vec<u8> = self.legs.keys().copied().collect();
        let mut any = true;
        while any {
            any = false;
            for &i in &chans {
                if let Some(cell) = self.node.poll_transmit(now, ChannelId::from(i)) {
                    let (_, msg) = cell.into_circid_and_msg();
                    *self.down_cells.entry(i).or_default() += 1;
                    self.down
                        .get_mut(&i)
                        .expect("wire")
                        .push_back((now + self.delay[&i], msg));
                    any = true;
                }
            }
        }
        for (i, wire) in &mut self.up {
            while wire.front().is_some_and(|(at, _)| *at <= now) {
                let (_, cell) = wire.pop_front().expect("front");
                self.node.handle_cell(now, ChannelId::from(*i), cell);
            }
        }
        for (i, wire) in &mut self.down {
            while wire.front().is_some_and(|(at, _)| *at <= now) {
                let (_, msg) = wire.pop_front().expect("front");
                self.legs.get_mut(i).expect("leg").handle_cell(now, msg);
            }
        }
        for c in self.legs.values_mut() {
            while let Some(ev) = c.poll_event() {
                if matches!(ev, ClientEvent::Linked { .. }) {
                    c.send_linked_ack().expect("ack");
                }
            }
        }
        while let Some(ev) = self.node.poll_event() {
            self.events.push(ev);
        }
    }

    fn run_until(&mut self, mut done: impl FnMut(&World) -> bool) {
        for _ in 0..10_000 {
            if done(self) {
                return;
            }
            self.step();
        }
        panic!("not done in 10 s of simulated time");
    }

    /// The client's end of the set over every leg (lowrtt).
    fn client_set(&self) -> SetCore<u8> {
        let mut set = SetCore::new(
            LegSchedulerKind::LowRtt,
            StdRng::seed_from_u64(4),
            DEFAULT_MAX_OUT_OF_ORDER,
        );
        for leg in self.legs.keys() {
            set.add_leg(*leg);
        }
        set
    }

    /// The set's key, from the node's Connect event.
    fn exit_connect(&self) -> Option<(CircKey, StreamId)> {
        self.events.iter().find_map(|e| match e {
            NodeEvent::ExitConnect { circ, stream, .. } => Some((*circ, *stream)),
            _ => None,
        })
    }
}

/// Download `size` bytes through the set; returns the world afterwards
/// (the stream still open) and the exit's set key.
fn download(delays: &[Duration], size: usize) -> (World, CircKey) {
    let nonce = V1Nonce::new(&mut StdRng::seed_from_u64(3));
    let mut w = World::new(delays, nonce);
    w.run_until(|w| {
        w.legs
            .values()
            .all(|c| c.leg_state().is_some_and(|s| s.link_rtt.is_some()))
    });
    assert_eq!(w.node.n_sets(), 1);
    let mut set = w.client_set();
    let mut streams = ClientStreams::new(StreamConfig::default(), StreamFlowKind::Windows, 4096);
    let stream = streams
        .begin("example.com", 80)
        .map_err(|_| ())
        .expect("begin");
    let body: Vec<u8> = (0..size).map(|i| (i % 239) as u8).collect();
    let (mut sent, mut got) = (0, Vec::new());
    let mut buf = vec![0u8; 16_384];
    let mut exit = None;
    for _ in 0..200_000 {
        set.pump_out(w.now, &mut streams, &mut w.legs)
            .expect("client out");
        w.step();
        set.pump_in(w.now, &mut streams, &mut w.legs)
            .expect("client in");
        while streams.poll_event().is_some() {}
        if exit.is_none() {
            if let Some((circ, s)) = w.exit_connect() {
                w.node
                    .exit_connected(w.now, circ, s, None)
                    .expect("connected");
                exit = Some((circ, s));
            }
        }
        if let Some((circ, s)) = exit {
            if sent < size {
                sent += w
                    .node
                    .exit_write(w.now, circ, s, &body[sent..])
                    .expect("write");
            }
        }
        let (n, _) = streams.read(stream, &mut buf, w.now).expect("read");
        got.extend_from_slice(&buf[..n]);
        if got.len() == size {
            let (circ, _) = exit.expect("connected");
            assert!(got == body, "corrupted or reordered");
            return (w, circ);
        }
    }
    panic!("download did not finish: {} of {size}", got.len());
}

#[test]
fn a_download_crosses_both_legs_intact() {
    let ms = Duration::from_millis;
    let (w, set) = download(&[ms(5), ms(40)], 3_000_000);
    assert!(w.node.sets.contains(set));
    // The exit's round robin used both legs: about half of the 6000
    // cells each.
    for i in [0u8, 1] {
        let cells = w.down_cells.get(&i).copied().unwrap_or(0);
        assert!(cells > 2500, "leg {i} carried {cells} cells");
    }
    assert!(w.node.total_queued_bytes() < 4 << 20);
}

#[test]
fn a_leg_that_dies_closes_the_set_and_its_other_legs() {
    let ms = Duration::from_millis;
    let (mut w, set) = download(&[ms(5), ms(10)], 200_000);
    w.events.clear();
    w.legs.get_mut(&0).expect("leg").destroy();
    w.run_until(|w| w.legs[&1].is_closed());
    assert!(w.events.iter().any(|e| matches!(e,
        NodeEvent::CircuitClosed { circ, .. } if *circ == set)));
    assert_eq!(w.node.n_sets(), 0);
    assert_eq!(w.node.n_circuits(), 0);
    assert_eq!(w.node.total_queued_bytes(), 0);
}

#[test]
fn a_late_leg_is_refused_once_data_moved() {
    let ms = Duration::from_millis;
    let (mut w, set) = download(&[ms(5)], 50_000);
    // A new circuit on a new channel asks to join the same set.
    let nonce = V1Nonce::new(&mut StdRng::seed_from_u64(3));
    w.node.add_channel(7, false, ChannelPeer::Client);
    let public = w.node.keys().public();
    let late = ClientCircuit::new(ClientConfig::default(), &public, StdRng::seed_from_u64(9));
    w.legs.insert(7, late);
    w.delay.insert(7, ms(1));
    w.up.insert(7, VecDeque::new());
    w.down.insert(7, VecDeque::new());
    w.run_until(|w| w.legs[&7].n_hops() == 1);
    w.legs
        .get_mut(&7)
        .expect("late")
        .start_leg(V1LinkPayload::new(nonce, V1DesiredUx::NO_OPINION))
        .expect("start");
    w.run_until(|w| w.legs[&7].is_closed());
    assert!(w.node.sets.contains(set), "the set itself stays");
    assert!(!w.legs[&0].is_closed());
}

/// A set at an exit with `packaging` and Vegas starting at `cwnd` cells,
/// over legs 5 and 20 ms away (lowrtt), with one connected stream whose
/// CONNECTED has left: the world, the set's key, its stream, its legs.
fn vegas_set(packaging: ExitPackaging, cwnd: u32) -> (World, CircKey, StreamId, Vec<CircKey>) {
    let ms = Duration::from_millis;
    let mut cc = CircuitCc::vegas();
    cc.set_param("cc_cwnd_init", cwnd).expect("in range");
    let exit = RelayConfig {
        exit: true,
        allow_one_hop_streams: true,
        conflux: true,
        exit_packaging: packaging,
        ..RelayConfig::default()
    }
    .with_cc(cc);
    let exit_cc = exit.cc;
    let nonce = V1Nonce::new(&mut StdRng::seed_from_u64(3));
    let mut w = World::with(&[ms(5), ms(20)], nonce, exit, LegSchedulerKind::LowRtt);
    // Both ends know both legs' round trips (the exit's from LINKED_ACK):
    // lowrtt passes over a leg without one.
    w.run_until(|w| {
        let client = w
            .legs
            .values()
            .all(|c| c.leg_state().is_some_and(|s| s.link_rtt.is_some()));
        let exit = w.node.sets.sets.values().all(|s| {
            s.core.legs().len() == 2
                && s.core.legs().iter().all(|l| {
                    w.node.circuits[l]
                        .circ
                        .leg_state()
                        .is_some_and(|st| st.link_rtt.is_some())
                })
        });
        client && exit && w.node.n_sets() == 1
    });
    let mut set = w.client_set();
    let flow = StreamFlowKind::at(exit_cc, crate::xonxoff::EdgePosition::Client);
    let mut streams = ClientStreams::new(StreamConfig::default(), flow, 4096);
    streams
        .begin("example.com", 80)
        .map_err(|_| ())
        .expect("begin");
    set.pump_out(w.now, &mut streams, &mut w.legs)
        .expect("client out");
    w.run_until(|w| w.exit_connect().is_some());
    let (circ, stream) = w.exit_connect().expect("connect");
    w.node
        .exit_connected(w.now, circ, stream, None)
        .expect("connected");
    // The CONNECTED leaves; no DATA is queued yet.
    for _ in 0..3 {
        w.step();
    }
    let legs = w.node.sets.sets[&circ].core.legs().to_vec();
    (w, circ, stream, legs)
}

/// Cells queued on exit leg `leg` (its queue toward the client and what
/// its set gave it to send).
fn queued_cells(w: &World, leg: CircKey) -> usize {
    w.node.circuits[&leg].circ.queued_bytes() / crate::QUEUED_CELL_BYTES
}

fn inflight(w: &World, leg: CircKey) -> u32 {
    w.node.exit_cc_snapshot(leg).expect("vegas").inflight
}

/// Bytes from the target until the set's stream takes no more (no cell
/// leaves meanwhile).
fn fill(w: &mut World, circ: CircKey, stream: StreamId) {
    let chunk = vec![7u8; 16 * 498];
    while w
        .node
        .exit_write(w.now, circ, stream, &chunk)
        .expect("write")
        > 0
    {}
}

#[test]
fn an_eager_exit_set_counts_each_cell_in_flight_on_the_leg_it_queues_on() {
    for packaging in [ExitPackaging::Lazy, ExitPackaging::Eager] {
        let (mut w, circ, stream, legs) = vegas_set(packaging, 124);
        fill(&mut w, circ, stream);
        for &leg in &legs {
            let (queued, inflight) = (queued_cells(&w, leg), inflight(&w, leg));
            match packaging {
                // Cells wait on the legs (a few each) or in the stream,
                // uncounted until the channel takes them.
                ExitPackaging::Lazy => {
                    assert_eq!(inflight, 0, "{leg:?}");
                    assert!(queued <= crate::conflux::LEG_OUTPUT_DEPTH, "{queued}");
                }
                // Each leg filled its window at once, every DATA cell
                // counted (besides them, the SWITCH a leg gets when the
                // set moves to it).
                ExitPackaging::Eager => {
                    assert_eq!(inflight, 124, "{leg:?}");
                    assert!((124..=125).contains(&queued), "{leg:?}: {queued}");
                }
            }
        }
    }
}

#[test]
fn an_eager_exit_set_skips_a_blocked_leg_until_its_queue_drains() {
    // Windows far larger than cellq_high: only the queues stop the set.
    let (mut w, circ, stream, legs) = vegas_set(ExitPackaging::Eager, 1000);
    fill(&mut w, circ, stream);
    // Each leg stops at cellq_high, blocked (C tor's
    // `circuit_ready_to_send`), and the stream keeps the rest.
    let can_send = |w: &World, leg: CircKey| {
        let state = w.node.circuits[&leg].circ.leg_state().expect("linked");
        state.can_send
    };
    for &leg in &legs {
        assert_eq!(queued_cells(&w, leg), CELLQ_HIGH, "{leg:?}");
        assert!(!can_send(&w, leg), "{leg:?} is blocked");
    }
    // The channel of one leg takes cells: it stays blocked down to
    // cellq_low, then the set fills it up again and leaves the other.
    let chan = ChannelId::from(0u8);
    let first = legs
        .iter()
        .copied()
        .find(|l| w.node.circuits[l].inbound.0 == chan)
        .expect("a leg on channel 0");
    let other = legs
        .iter()
        .copied()
        .find(|l| *l != first)
        .expect("two legs");
    let before = inflight(&w, first);
    for _ in 0..CELLQ_HIGH - CELLQ_LOW - 1 {
        assert!(w.node.poll_transmit(w.now, chan).is_some());
    }
    assert_eq!(queued_cells(&w, first), CELLQ_LOW + 1);
    assert!(!can_send(&w, first), "still blocked");
    assert!(w.node.poll_transmit(w.now, chan).is_some());
    assert!(
        queued_cells(&w, first) > CELLQ_LOW,
        "the stream's bytes went"
    );
    fill(&mut w, circ, stream);
    assert_eq!(queued_cells(&w, first), CELLQ_HIGH, "refilled");
    assert!(!can_send(&w, first), "blocked again");
    // As many cells as left went in (a SWITCH among them), all counted.
    let added = inflight(&w, first) - before;
    let drained = (CELLQ_HIGH - CELLQ_LOW) as u32;
    assert!((drained - 1..=drained).contains(&added), "{added}");
    assert_eq!(queued_cells(&w, other), CELLQ_HIGH, "untouched");
}

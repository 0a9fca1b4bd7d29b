//! Two ends of a linked set over real legs (client circuits and exit
//! circuits in leg mode, one hop each, real cells and crypto), with a
//! different one-way delay per leg: a stream's bytes cross both ways, all
//! of them, once and in order, under every leg scheduler.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use onionlab_cell::chan::AnyChanMsg;
use onionlab_cell::msg::{V1DesiredUx, V1LinkPayload, V1Nonce};
use rand::SeedableRng;

use super::*;
use crate::client::streams::ClientStreams;
use crate::client::{ClientCircuit, ClientConfig, ClientEvent};
use crate::relay::exit_streams::ExitStreams;
use crate::relay::{RelayCircEvent, RelayCircuit, RelayConfig, Side};
use crate::stream::{StreamConfig, StreamFlowKind};
use onionlab_crypto::identity::RelaySecretKeys;

/// Cells in flight on one leg in one direction: (due time, cell).
type Wire = VecDeque<(Instant, AnyChanMsg)>;

struct Legs {
    client: BTreeMap<u8, ClientCircuit>,
    exit: BTreeMap<u8, RelayCircuit>,
    delay: BTreeMap<u8, Duration>,
    up: BTreeMap<u8, Wire>,
    down: BTreeMap<u8, Wire>,
}

impl Legs {
    /// Built and linked legs with these one-way delays.
    fn new(delays: &[Duration]) -> Legs {
        let mut legs = Legs {
            client: BTreeMap::new(),
            exit: BTreeMap::new(),
            delay: BTreeMap::new(),
            up: BTreeMap::new(),
            down: BTreeMap::new(),
        };
        let now = Instant::now();
        let nonce = V1Nonce::new(&mut StdRng::seed_from_u64(7));
        for (i, d) in delays.iter().enumerate() {
            let i = i as u8;
            let keys = RelaySecretKeys::generate(&mut StdRng::seed_from_u64(u64::from(i)));
            let mut c = ClientCircuit::new(
                ClientConfig::default(),
                &keys.public(),
                StdRng::seed_from_u64(100 + u64::from(i)),
            );
            let Some(AnyChanMsg::Create2(create)) = c.poll_transmit(now) else {
                panic!("CREATE2");
            };
            let config = RelayConfig {
                exit: true,
                allow_one_hop_streams: true,
                conflux: true,
                ..RelayConfig::default()
            };
            let mut e = RelayCircuit::accept(
                config,
                &keys,
                &create,
                StdRng::seed_from_u64(200 + u64::from(i)),
            )
            .expect("handshake");
            e.set_first_hop(true);
            let created = e.poll_transmit(now, Side::Inbound).expect("CREATED2");
            c.handle_cell(now, created);
            let payload = V1LinkPayload::new(nonce, V1DesiredUx::HIGH_THROUGHPUT);
            c.start_leg(payload.clone()).expect("start");
            e.handle_inbound(now, c.poll_transmit(now).expect("LINK"));
            while let Some(ev) = e.poll_event() {
                assert!(matches!(ev, RelayCircEvent::Link { .. }), "{ev:?}");
            }
            e.accept_leg(now, payload).expect("accept");
            c.handle_cell(now, e.poll_transmit(now, Side::Inbound).expect("LINKED"));
            c.send_linked_ack().expect("ack");
            e.handle_inbound(now, c.poll_transmit(now).expect("ACK"));
            while c.poll_event().is_some() {}
            legs.client.insert(i, c);
            legs.exit.insert(i, e);
            legs.delay.insert(i, *d);
            legs.up.insert(i, VecDeque::new());
            legs.down.insert(i, VecDeque::new());
        }
        legs
    }

    /// Move cells: everything the legs have goes on their wires, every
    /// cell due by `now` is delivered.
    fn step(&mut self, now: Instant) {
        for (i, c) in &mut self.client {
            while let Some(cell) = c.poll_transmit(now) {
                self.up
                    .get_mut(i)
                    .expect("wire")
                    .push_back((now + self.delay[i], cell));
            }
        }
        for (i, e) in &mut self.exit {
            while let Some(cell) = e.poll_transmit(now, Side::Inbound) {
                self.down
                    .get_mut(i)
                    .expect("wire")
                    .push_back((now + self.delay[i], cell));
            }
        }
        for (i, wire) in &mut self.up {
            while wire.front().is_some_and(|(at, _)| *at <= now) {
                let (_, cell) = wire.pop_front().expect("front");
                self.exit.get_mut(i).expect("leg").handle_inbound(now, cell);
            }
        }
        for (i, wire) in &mut self.down {
            while wire.front().is_some_and(|(at, _)| *at <= now) {
                let (_, cell) = wire.pop_front().expect("front");
                self.client.get_mut(i).expect("leg").handle_cell(now, cell);
            }
        }
    }
}

/// Upload `up` bytes and download `down` bytes on one stream over legs
/// with `delays`; returns the most messages the two out-of-order queues
/// held.
fn transfer(kind: LegSchedulerKind, delays: &[Duration], up: usize, down: usize) -> usize {
    let mut legs = Legs::new(delays);
    let flow = StreamFlowKind::Windows;
    let mut client = ClientStreams::new(StreamConfig::default(), flow, 4096);
    let mut exit = ExitStreams::new(StreamConfig::default(), flow);
    let mut cset = SetCore::new(kind, StdRng::seed_from_u64(1), 10_000);
    let mut eset = SetCore::new(kind, StdRng::seed_from_u64(2), 10_000);
    for leg in legs.client.keys().copied().collect::<Vec<_>>() {
        cset.add_leg(leg);
        eset.add_leg(leg);
    }
    let upload: Vec<u8> = (0..up).map(|i| (i % 253) as u8).collect();
    let download: Vec<u8> = (0..down).map(|i| (i % 241) as u8).collect();
    let (mut sent_up, mut sent_down) = (0, 0);
    let (mut got_up, mut got_down) = (Vec::new(), Vec::new());
    let mut exit_stream = None;
    let mut connected = false;
    let stream = match client.begin("example.com", 80) {
        Ok(s) => s,
        Err(_) => panic!("begin"),
    };
    let mut worst_queue = 0;
    let mut buf = vec![0u8; 8192];
    let start = Instant::now();
    let mut now = start;
    while got_up.len() < up || got_down.len() < down {
        assert!(now - start < Duration::from_secs(600), "stalled: {kind}");
        now += Duration::from_micros(500);
        // Client application.
        if connected && sent_up < up {
            sent_up += client.write(stream, &upload[sent_up..], now).unwrap_or(0);
        }
        cset.pump_out(now, &mut client, &mut legs.client)
            .expect("client out");
        legs.step(now);
        eset.pump_in(now, &mut exit, &mut legs.exit)
            .expect("exit in");
        while let Some(ev) = exit.poll_event() {
            if let RelayCircEvent::Connect { stream, .. } = ev {
                exit.connected(stream, None).expect("connect");
                exit_stream = Some(stream);
            }
        }
        // Exit application (the target).
        if let Some(s) = exit_stream {
            let n = exit.read(s, &mut buf, now).unwrap_or(0);
            got_up.extend_from_slice(&buf[..n]);
            if sent_down < down {
                sent_down += exit.write(s, &download[sent_down..], now).unwrap_or(0);
            }
        }
        eset.pump_out(now, &mut exit, &mut legs.exit)
            .expect("exit out");
        legs.step(now);
        cset.pump_in(now, &mut client, &mut legs.client)
            .expect("client in");
        while let Some(ev) = client.poll_event() {
            if let ClientEvent::Stream(crate::stream::StreamEvent::Connected { .. }) = ev {
                connected = true;
            }
        }
        let (n, _) = client.read(stream, &mut buf, now).unwrap_or((0, Ok(())));
        got_down.extend_from_slice(&buf[..n]);
        worst_queue = worst_queue
            .max(cset.out_of_order_len())
            .max(eset.out_of_order_len());
    }
    assert!(got_up == upload, "{kind}: upload corrupted or reordered");
    assert!(
        got_down == download,
        "{kind}: download corrupted or reordered"
    );
    worst_queue
}

#[test]
fn every_scheduler_moves_a_stream_over_skewed_legs_intact() {
    let ms = Duration::from_millis;
    for kind in LegSchedulerKind::ALL {
        transfer(kind, &[ms(5), ms(50)], 300_000, 1_000_000);
    }
}

#[test]
fn round_robin_over_skewed_legs_reorders_within_what_is_in_flight() {
    let ms = Duration::from_millis;
    let rr = LegSchedulerKind::RoundRobin { cells_per_leg: 1 };
    let worst = transfer(rr, &[ms(2), ms(20), ms(10)], 0, 2_000_000);
    // Messages wait behind the slow leg: some reordering, never more than
    // all legs' circuit windows (1000 cells each) hold.
    assert!(worst > 0, "legs this skewed must reorder");
    assert!(worst < 3000, "{worst}");
}

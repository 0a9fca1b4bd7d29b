//! Datagram circuits in simulated time: a client and three relays whose
//! links lose, duplicate and reorder cells.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_circuit::conflux::sched::LegSchedulerKind;
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_dgram::e2e::{self, E2eSet};
use onionlab_dgram::wire::{RelayCommand, RelayMsg, CELL_LEN};
use onionlab_dgram::{
    CircuitId, ClientOutput, ClientSettings, DgramClient, DgramRelay, Error, HopSpec, LinkId,
    RelayOutput, RelaySettings,
};
use onionlab_utcp::{LaneEvent, Role, Settings};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// Node 0 is the client; node i + 1 is relay i.
type Node = usize;

struct Net {
    now: Instant,
    client: DgramClient,
    relays: Vec<DgramRelay>,
    keys: Vec<Arc<RelaySecretKeys>>,
    /// Link -> its two ends.
    links: HashMap<LinkId, (Node, Node)>,
    next_link: LinkId,
    /// (delivery time, sequence) -> (to, link, cell).
    flight: BTreeMap<(Instant, u64), (Node, LinkId, Vec<u8>)>,
    seq: u64,
    rng: StdRng,
    loss: f64,
    dup: f64,
    /// Relay cells arriving at this node get a bit flipped.
    tamper_to: Option<Node>,
    /// Each link's own delay (5 to 15 ms), when links keep order (`fifo`);
    /// otherwise every cell draws its own and links reorder.
    link_delay: HashMap<LinkId, Duration>,
    fifo: bool,
    client_got: Vec<(CircuitId, usize, RelayMsg)>,
    exit_got: Vec<(CircuitId, RelayMsg)>,
    built: Vec<CircuitId>,
    closed: Vec<(CircuitId, Error)>,
    /// The client's and the exit's ends of a set, when a test runs the
    /// end-to-end transport: they take the SEGMENT and LINK messages.
    e2e: Option<(E2eSet, E2eSet)>,
    /// SEGMENT messages the exit took, by circuit.
    segments_at_exit: HashMap<CircuitId, u64>,
}

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i as u8 + 1], 5000))
}

impl Net {
    fn new(loss: f64, dup: f64, seed: u64) -> Net {
        Net::with_settings(loss, dup, seed, RelaySettings::default())
    }

    /// Relays with `base` settings (the third is the exit).
    fn with_settings(loss: f64, dup: f64, seed: u64, base: RelaySettings) -> Net {
        let mut rng = StdRng::seed_from_u64(seed);
        let keys: Vec<Arc<RelaySecretKeys>> = (0..3)
            .map(|_| Arc::new(RelaySecretKeys::generate(&mut rng)))
            .collect();
        let relays = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let settings = RelaySettings {
                    exit: i == 2,
                    ..base.clone()
                };
                DgramRelay::new(k.clone(), settings, seed + i as u64)
            })
            .collect();
        Net {
            now: Instant::now(),
            // Builds are given all the time they need: tests that lose
            // cells assert that circuits get built, not how fast.
            client: DgramClient::new(
                ClientSettings {
                    build_timeout: Duration::from_secs(60),
                    ..ClientSettings::default()
                },
                seed,
            ),
            relays,
            keys,
            links: HashMap::new(),
            next_link: 1,
            flight: BTreeMap::new(),
            seq: 0,
            rng,
            loss,
            dup,
            tamper_to: None,
            link_delay: HashMap::new(),
            fifo: false,
            client_got: Vec::new(),
            exit_got: Vec::new(),
            built: Vec::new(),
            closed: Vec::new(),
            e2e: None,
            segments_at_exit: HashMap::new(),
        }
    }

    fn path(&self) -> Vec<HopSpec> {
        self.keys
            .iter()
            .enumerate()
            .map(|(i, k)| HopSpec {
                addr: addr(i),
                identity: k.public().ed_identity,
                onion_key: k.public().onion_key,
            })
            .collect()
    }

    /// A link from `a` to relay node `b`, up at both ends.
    fn open_link(&mut self, a: Node, b: Node) -> LinkId {
        let link = self.next_link;
        self.next_link += 1;
        self.links.insert(link, (a, b));
        let delay = Duration::from_micros(self.rng.random_range(5_000..15_000));
        self.link_delay.insert(link, delay);
        let now = self.now;
        let id_b = self.keys[b - 1].public().ed_identity;
        if a > 0 {
            let id_a = self.keys[a - 1].public().ed_identity;
            self.relays[a - 1].link_up(now, link, Some(id_b), Some(addr(b - 1)));
            self.relays[b - 1].link_up(now, link, Some(id_a), None);
        } else {
            self.relays[b - 1].link_up(now, link, None, None);
        }
        link
    }

    fn send(&mut self, from: Node, link: LinkId, mut cell: Vec<u8>) {
        let Some(&(a, b)) = self.links.get(&link) else {
            return;
        };
        let to = if from == a { b } else { a };
        if self.tamper_to == Some(to) && cell[4] == 3 {
            cell[CELL_LEN - 1] ^= 1;
        }
        let copies = if self.rng.random_bool(self.loss) {
            0
        } else if self.rng.random_bool(self.dup) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = match self.link_delay.get(&link) {
                Some(&d) if self.fifo => d,
                _ => Duration::from_micros(self.rng.random_range(5_000..15_000)),
            };
            self.seq += 1;
            self.flight
                .insert((self.now + delay, self.seq), (to, link, cell.clone()));
        }
    }

    fn drain(&mut self) {
        loop {
            let mut any = false;
            while let Some(o) = self.client.poll_output() {
                any = true;
                match o {
                    ClientOutput::Transmit(link, cell) => self.send(0, link, cell.to_vec()),
                    ClientOutput::Built(c) => self.built.push(c),
                    ClientOutput::Closed { circuit, error } => self.closed.push((circuit, error)),
                    ClientOutput::Delivered { circuit, hop, msg } => match self.e2e.as_mut() {
                        Some((set, _)) => set.handle_segment(&msg.data, self.now),
                        None => self.client_got.push((circuit, hop, msg)),
                    },
                }
            }
            for i in 0..self.relays.len() {
                while let Some(o) = self.relays[i].poll_output() {
                    any = true;
                    match o {
                        RelayOutput::Transmit(link, cell) => self.send(i + 1, link, cell.to_vec()),
                        RelayOutput::Connect { addr: a, .. } => {
                            let to = (0..3).find(|&j| addr(j) == a).expect("a relay") + 1;
                            self.open_link(i + 1, to);
                        }
                        RelayOutput::Delivered { circuit, msg } => match self.e2e.as_mut() {
                            Some((_, set)) if msg.command == RelayCommand::Link => {
                                set.add_leg(circuit)
                            }
                            Some((_, set)) => {
                                *self.segments_at_exit.entry(circuit).or_default() += 1;
                                set.handle_segment(&msg.data, self.now)
                            }
                            None => self.exit_got.push((circuit, msg)),
                        },
                        RelayOutput::Closed(_) => {}
                    }
                }
            }
            if let Some((client_set, exit_set)) = self.e2e.as_mut() {
                while let Some((leg, msg)) = client_set.poll_transmit() {
                    any = true;
                    self.client.send(leg, 2, &msg).expect("a built circuit");
                }
                while let Some((leg, msg)) = exit_set.poll_transmit() {
                    any = true;
                    self.relays[2]
                        .send_to_client(leg, &msg)
                        .expect("an open circuit");
                }
            }
            if !any {
                return;
            }
        }
    }

    /// Run until `until` passes.
    fn run(&mut self, until: Duration) {
        let end = self.now + until;
        loop {
            self.drain();
            let timers = [self.client.poll_timeout()]
                .into_iter()
                .chain(self.relays.iter().map(|r| r.poll_timeout()))
                .chain(
                    self.e2e
                        .iter_mut()
                        .flat_map(|(c, e)| [c.mux().poll_timeout(), e.mux().poll_timeout()]),
                )
                .flatten()
                .min();
            let next_cell = self.flight.keys().next().map(|k| k.0);
            let Some(next) = [timers, next_cell].into_iter().flatten().min() else {
                return;
            };
            if next > end {
                self.now = end;
                return;
            }
            self.now = self.now.max(next);
            let now = self.now;
            while let Some(entry) = self.flight.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                let (to, link, cell) = entry.remove();
                if to == 0 {
                    self.client.handle_cell(now, link, &cell);
                } else {
                    self.relays[to - 1].handle_cell(now, link, &cell);
                }
            }
            self.client.handle_timeout(now);
            for r in &mut self.relays {
                r.handle_timeout(now);
            }
            if let Some((c, e)) = self.e2e.as_mut() {
                c.mux().handle_timeout(now);
                e.mux().handle_timeout(now);
            }
        }
    }
}

impl Net {
    fn closed_ids(&self) -> Vec<CircuitId> {
        self.closed.iter().map(|(c, _)| *c).collect()
    }

    /// Build `n` circuits over one client link; panics unless all are
    /// built within `within`.
    fn build_circuits(&mut self, n: usize, within: Duration) -> Vec<CircuitId> {
        let link = self.open_link(0, 1);
        let circuits: Vec<CircuitId> = (0..n)
            .map(|_| {
                let path = self.path();
                self.client.build(self.now, link, path).unwrap()
            })
            .collect();
        self.run(within);
        assert_eq!(self.built.len(), n, "closed: {:?}", self.closed_ids());
        circuits
    }
}

fn segment(i: u32) -> RelayMsg {
    RelayMsg {
        command: RelayCommand::Segment,
        data: i.to_be_bytes().repeat(100),
    }
}

#[test]
fn a_circuit_is_built_and_carries_messages_both_ways() {
    let mut net = Net::new(0.0, 0.0, 1);
    let link = net.open_link(0, 1);
    let path = net.path();
    let c = net.client.build(net.now, link, path).unwrap();
    net.run(Duration::from_secs(2));
    assert_eq!(net.built, vec![c]);
    for i in 0..50 {
        net.client.send(c, 2, &segment(i)).unwrap();
    }
    net.run(Duration::from_secs(1));
    assert_eq!(net.exit_got.len(), 50);
    let (exit_circ, _) = net.exit_got[0];
    for i in 0..50 {
        net.relays[2]
            .send_to_client(exit_circ, &segment(i))
            .unwrap();
    }
    net.run(Duration::from_secs(1));
    assert_eq!(net.client_got.len(), 50);
    assert!(net
        .client_got
        .iter()
        .all(|(circ, hop, _)| *circ == c && *hop == 2));
}

#[test]
fn circuits_are_built_through_loss_and_duplication_and_lose_only_lost_cells() {
    let mut net = Net::new(0.05, 0.1, 2);
    let link = net.open_link(0, 1);
    let mut circs = Vec::new();
    for _ in 0..10 {
        let path = net.path();
        circs.push(net.client.build(net.now, link, path).unwrap());
    }
    net.run(Duration::from_secs(30));
    // Each handshake step is resent until answered: with 5% loss per
    // link (an EXTEND2 to the exit and its answer cross six links: 74%
    // of the tries get through), every circuit is built, and most within
    // a few tries (the resends' backoff reaches 2 s).
    assert_eq!(net.built.len(), 10, "closed: {:?}", net.closed_ids());
    let c = circs[0];
    for i in 0..200 {
        net.client.send(c, 2, &segment(i)).unwrap();
    }
    net.run(Duration::from_secs(1));
    let mut got: Vec<u32> = net
        .exit_got
        .iter()
        .map(|(_, m)| u32::from_be_bytes(m.data[..4].try_into().unwrap()))
        .collect();
    got.sort();
    let before = got.len();
    got.dedup();
    assert_eq!(got.len(), before, "a cell was taken twice");
    // Three links at 5% loss: about 86% arrive, never more than sent.
    assert!((140..=200).contains(&got.len()), "{}", got.len());
    assert_eq!(net.relays[2].stats().violations, 0);
}

#[test]
fn a_relay_link_going_down_ends_the_circuits_on_it() {
    let mut net = Net::new(0.0, 0.0, 3);
    let link = net.open_link(0, 1);
    let path = net.path();
    let c = net.client.build(net.now, link, path).unwrap();
    net.run(Duration::from_secs(2));
    assert_eq!(net.built, vec![c]);
    // The guard loses its link to the middle: it destroys the circuit
    // toward the client, which reports it closed.
    let guard_middle = *net
        .links
        .iter()
        .find(|(_, &(a, b))| (a, b) == (1, 2))
        .unwrap()
        .0;
    net.relays[0].link_down(guard_middle);
    net.run(Duration::from_secs(1));
    assert_eq!(net.closed_ids(), vec![c]);
    assert_eq!(net.relays[0].circuits(), 0);
}

#[test]
fn a_relay_refuses_circuits_past_its_limit_and_the_client_hears_why() {
    let settings = RelaySettings {
        max_circuits: 2,
        ..RelaySettings::default()
    };
    let mut net = Net::with_settings(0.0, 0.0, 5, settings);
    let link = net.open_link(0, 1);
    for _ in 0..4 {
        let path = net.path();
        net.client.build(net.now, link, path).unwrap();
    }
    net.run(Duration::from_secs(2));
    assert_eq!(net.built.len(), 2);
    assert_eq!(net.closed.len(), 2);
    // RESOURCELIMIT, from the guard.
    assert!(net
        .closed
        .iter()
        .all(|(_, e)| matches!(e, Error::Destroyed(5))));
    assert_eq!(net.relays[0].stats().refused, 2);
    assert_eq!(net.relays[0].circuits(), 2);
}

#[test]
fn a_cell_changed_on_the_path_ends_the_circuit_at_its_last_hop() {
    let mut net = Net::new(0.0, 0.0, 6);
    let c = net.build_circuits(1, Duration::from_secs(2))[0];
    // The middle (or its link) flips a bit of every cell it forwards: the
    // exit cannot open the cell and has no hop to pass it to.
    net.tamper_to = Some(3);
    net.client.send(c, 2, &segment(1)).unwrap();
    net.run(Duration::from_secs(1));
    assert!(net.exit_got.is_empty());
    assert_eq!(net.relays[2].stats().violations, 1);
    // PROTOCOL, passed back hop by hop; no relay keeps the circuit.
    assert_eq!(net.closed_ids(), vec![c]);
    assert!(matches!(net.closed[0].1, Error::Destroyed(1)));
    assert!(net.relays.iter().all(|r| r.circuits() == 0));
}

#[test]
fn idle_circuits_are_forgotten_by_every_relay() {
    let settings = RelaySettings {
        idle_timeout: Duration::from_secs(5),
        ..RelaySettings::default()
    };
    let mut net = Net::with_settings(0.0, 0.0, 7, settings);
    let c = net.build_circuits(1, Duration::from_secs(2))[0];
    net.run(Duration::from_secs(6));
    assert!(net.relays.iter().all(|r| r.circuits() == 0));
    assert_eq!(net.closed_ids(), vec![c]);
    // Nothing left to wake up for.
    assert!(net.relays.iter().all(|r| r.poll_timeout().is_none()));
    // At least one relay timed it out; the others may have heard its
    // DESTROY first.
    let idle: u64 = net.relays.iter().map(|r| r.stats().idle_forgotten).sum();
    assert!(idle >= 1);
}

#[test]
fn a_stream_over_two_circuits_arrives_whole_through_loss_and_duplication() {
    // Links that keep order, as real ones do (the circuits still reorder
    // against each other), 1% loss and 1% duplication on each.
    let mut net = Net::new(0.01, 0.01, 8);
    net.fifo = true;
    let legs = net.build_circuits(2, Duration::from_secs(5));
    let now = net.now;
    let tcp = Settings::default();
    let rr = LegSchedulerKind::RoundRobin { cells_per_leg: 1 };
    let mut client_set = E2eSet::new(&tcp, Role::Initiator, rr, 9, now).unwrap();
    let exit_set = E2eSet::new(&tcp, Role::Responder, rr, 10, now).unwrap();
    // Each leg joins the set at the exit with the set's nonce (sent until
    // the exit has both: a LINK may be lost like any cell).
    let nonce = [7u8; e2e::NONCE_LEN];
    for &leg in &legs {
        client_set.add_leg(leg);
    }
    net.e2e = Some((client_set, exit_set));
    for _ in 0..20 {
        if net.e2e.as_ref().unwrap().1.legs().len() == 2 {
            break;
        }
        for &leg in &legs {
            net.client
                .send(leg, 2, &e2e::link_msg(&nonce, false))
                .unwrap();
        }
        net.run(Duration::from_millis(100));
    }
    assert_eq!(net.e2e.as_ref().unwrap().1.legs().len(), 2);

    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 31 % 251) as u8).collect();
    let lane = net.e2e.as_mut().unwrap().0.mux().open(net.now).unwrap();
    let (mut sent, mut got, mut accepted) = (0, Vec::new(), None);
    let mut buf = vec![0u8; 64 * 1024];
    // Up to 60 s of simulated time: smoltcp's loss recovery is slow (a
    // retransmission timeout of at least 1 s, no SACK recovery), and this
    // checks the bytes, not the speed.
    for _ in 0..6000 {
        let now = net.now;
        let (client_set, exit_set) = net.e2e.as_mut().unwrap();
        if sent < data.len() {
            sent += client_set.mux().send(lane, &data[sent..], now).unwrap();
            if sent == data.len() {
                client_set.mux().close(lane, now).unwrap();
            }
        }
        while let Some(ev) = exit_set.mux().poll_event() {
            if let LaneEvent::Accepted(l) = ev {
                accepted = Some(l);
            }
        }
        if let Some(l) = accepted {
            loop {
                let n = exit_set.mux().recv(l, &mut buf, now).unwrap_or(0);
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
        }
        if got.len() == data.len() {
            break;
        }
        net.run(Duration::from_millis(10));
    }
    assert_eq!(got.len(), data.len(), "the stream stalled");
    assert!(got == data, "the stream's bytes differ");
    // Round robin: both circuits carried about half of it.
    let per_circuit: Vec<u64> = net.segments_at_exit.values().copied().collect();
    assert_eq!(per_circuit.len(), 2, "{per_circuit:?}");
    let (lo, hi) = (
        per_circuit[0].min(per_circuit[1]),
        per_circuit[0].max(per_circuit[1]),
    );
    assert!(lo * 10 >= hi * 8, "{per_circuit:?}");
    assert_eq!(net.relays[2].stats().violations, 0);
}

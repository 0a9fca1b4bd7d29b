//! Datagram sets end to end in simulated time: a client's `Proxy`, six
//! relays and an exit running `ExitSets`, whose links lose and reorder
//! cells; streams carry bytes both ways over one or three circuits.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_circuit::conflux::sched::LegSchedulerKind;
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_dgram::{
    ClientSettings, DgramRelay, ExitSetSettings, ExitSets, HopSpec, KernelOutput, LinkId, Proxy,
    ProxyOutput, ProxySettings, Recv, RelayOutput, RelaySettings, StreamEvent, StreamKey,
    StreamStatus,
};
use onionlab_utcp::{Congestion, Settings};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// Node 0 is the client; node i + 1 is relay i; the last relay is the
/// exit.
type Node = usize;
const RELAYS: usize = 7;
const EXIT: Node = RELAYS;
/// The target the exit's driver refuses, and the END reason it gives.
const REFUSED_TARGET: &str = "refused.example:80";
const EXITPOLICY: u8 = 4;

fn addr(relay: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, relay as u8 + 1], 5000))
}

/// One end of a stream: what it has to send, what it got, how it ended.
#[derive(Default)]
struct End {
    to_send: Vec<u8>,
    sent: usize,
    closed: bool,
    /// Not to close yet even when all is sent.
    hold: bool,
    got: Vec<u8>,
    end: Option<Recv>,
}

struct Sim {
    now: Instant,
    rng: StdRng,
    loss: f64,
    proxy: Proxy,
    relays: Vec<DgramRelay>,
    keys: Vec<Arc<RelaySecretKeys>>,
    exit: ExitSets,
    links: HashMap<LinkId, (Node, Node)>,
    next_link: LinkId,
    flight: BTreeMap<(Instant, u64), (Node, LinkId, Vec<u8>)>,
    seq: u64,
    /// Relays that are dead: they take and send nothing.
    dead: Vec<Node>,
    /// Links that go down at their neighbours at a time (a dead relay's
    /// sessions time out).
    downs: Vec<(Instant, LinkId)>,
    /// What the exit's "targets" send back on each stream.
    reply: Vec<u8>,
    /// Whether the exit's ends hold their close.
    exit_hold: bool,
    client_ends: HashMap<StreamKey, End>,
    exit_ends: HashMap<StreamKey, End>,
    set_failed: bool,
    /// The most circuits the set had linked at once.
    most_linked: usize,
    /// Kernel sets: what reached each end's "kernel" (the exit's by its
    /// set number), and the sets the exit said ended.
    client_kernel: Vec<Vec<u8>>,
    exit_kernel: Vec<(u64, Vec<u8>)>,
    exit_kernel_closed: Vec<u64>,
}

impl Sim {
    fn new(loss: f64, seed: u64) -> Sim {
        Sim::with_kernel(loss, seed, false, false)
    }

    /// A simulation whose client runs kernel sets (`client_kernel`) and
    /// whose exit serves them (`exit_kernel`).
    fn with_kernel(loss: f64, seed: u64, client_kernel: bool, exit_kernel: bool) -> Sim {
        let mut rng = StdRng::seed_from_u64(seed);
        let keys: Vec<Arc<RelaySecretKeys>> = (0..RELAYS)
            .map(|_| Arc::new(RelaySecretKeys::generate(&mut rng)))
            .collect();
        let relays = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let settings = RelaySettings {
                    exit: i + 1 == EXIT,
                    ..RelaySettings::default()
                };
                DgramRelay::new(k.clone(), settings, seed + i as u64)
            })
            .collect();
        // The end-to-end TCP as deployed (Cubic).
        let tcp = Settings {
            congestion: Congestion::Cubic,
            ..Settings::default()
        };
        let proxy = Proxy::new(
            ProxySettings {
                circuits: ClientSettings {
                    build_timeout: Duration::from_secs(60),
                    ..ClientSettings::default()
                },
                tcp: tcp.clone(),
                dispatch: LegSchedulerKind::RoundRobin { cells_per_leg: 1 },
                kernel: client_kernel,
            },
            seed,
        )
        .unwrap();
        let exit = ExitSets::new(
            ExitSetSettings {
                tcp,
                kernel: exit_kernel,
                ..ExitSetSettings::default()
            },
            seed + 100,
        )
        .unwrap();
        Sim {
            now: Instant::now(),
            rng,
            loss,
            proxy,
            relays,
            keys,
            exit,
            links: HashMap::new(),
            next_link: 1,
            flight: BTreeMap::new(),
            seq: 0,
            dead: Vec::new(),
            downs: Vec::new(),
            reply: Vec::new(),
            exit_hold: false,
            client_ends: HashMap::new(),
            exit_ends: HashMap::new(),
            set_failed: false,
            most_linked: 0,
            client_kernel: Vec::new(),
            exit_kernel: Vec::new(),
            exit_kernel_closed: Vec::new(),
        }
    }

    fn hop(&self, relay: usize) -> HopSpec {
        HopSpec {
            addr: addr(relay),
            identity: self.keys[relay].public().ed_identity,
            onion_key: self.keys[relay].public().onion_key,
        }
    }

    /// `legs` paths with distinct guards (relays 0-2) and middles (3-5),
    /// all to the exit.
    fn paths(&self, legs: usize) -> Vec<Vec<HopSpec>> {
        (0..legs)
            .map(|i| vec![self.hop(i), self.hop(3 + i), self.hop(EXIT - 1)])
            .collect()
    }

    fn relay_of(a: SocketAddr) -> Node {
        (0..RELAYS).find(|&j| addr(j) == a).expect("a relay") + 1
    }

    fn open_link(&mut self, a: Node, b: Node) -> LinkId {
        let link = self.next_link;
        self.next_link += 1;
        self.links.insert(link, (a, b));
        let now = self.now;
        let id_b = self.keys[b - 1].public().ed_identity;
        if a > 0 {
            let id_a = self.keys[a - 1].public().ed_identity;
            self.relays[a - 1].link_up(now, link, Some(id_b), Some(addr(b - 1)));
            self.relays[b - 1].link_up(now, link, Some(id_a), None);
        } else {
            self.relays[b - 1].link_up(now, link, None, None);
            self.proxy.link_up(now, link, addr(b - 1), id_b);
        }
        link
    }

    fn send(&mut self, from: Node, link: LinkId, cell: Vec<u8>) {
        let Some(&(a, b)) = self.links.get(&link) else {
            return;
        };
        let to = if from == a { b } else { a };
        if self.dead.contains(&from) || self.rng.random_bool(self.loss) {
            return;
        }
        // Each cell its own delay: links reorder a little.
        let delay = Duration::from_micros(self.rng.random_range(5_000..6_000));
        self.seq += 1;
        self.flight
            .insert((self.now + delay, self.seq), (to, link, cell));
    }

    /// Everyone acts on what the others asked, until nobody asks more.
    fn drain(&mut self) {
        loop {
            let mut any = false;
            while let Some(o) = self.proxy.poll_output() {
                any = true;
                match o {
                    ProxyOutput::Transmit(link, cell) => self.send(0, link, cell.to_vec()),
                    ProxyOutput::Connect { addr: a, .. } => {
                        let to = Self::relay_of(a);
                        self.open_link(0, to);
                    }
                    ProxyOutput::SetFailed(_) => self.set_failed = true,
                    ProxyOutput::Linked { legs, .. } => {
                        self.most_linked = self.most_linked.max(legs)
                    }
                    ProxyOutput::LegClosed { .. } => {}
                    ProxyOutput::SendMore(..) => panic!("a MORE message from circuits"),
                }
            }
            for i in 0..RELAYS {
                while let Some(o) = self.relays[i].poll_output() {
                    any = true;
                    match o {
                        RelayOutput::Transmit(link, cell) => self.send(i + 1, link, cell.to_vec()),
                        RelayOutput::Connect { addr: a, .. } => {
                            let to = Self::relay_of(a);
                            self.open_link(i + 1, to);
                        }
                        RelayOutput::Delivered { circuit, msg } => {
                            self.exit.handle_msg(self.now, circuit, msg)
                        }
                        RelayOutput::Closed(circuit) => self.exit.circuit_closed(circuit),
                    }
                }
            }
            while let Some(c) = self.exit.poll_refused() {
                any = true;
                self.relays[EXIT - 1].refuse(c);
            }
            while let Some(c) = self.exit.poll_shed() {
                any = true;
                self.relays[EXIT - 1].end_for_memory(c);
            }
            while let Some((c, msg)) = self.exit.poll_transmit() {
                any = true;
                let _ = self.relays[EXIT - 1].send_to_client(c, &msg);
            }
            while let Some(ev) = self.exit.poll_event() {
                any = true;
                if let StreamEvent::Connect { stream, target } = ev {
                    if target == REFUSED_TARGET {
                        self.exit.refused(self.now, stream, EXITPOLICY);
                    } else {
                        self.exit.connected(self.now, stream);
                        self.exit_ends.insert(
                            stream,
                            End {
                                to_send: self.reply.clone(),
                                hold: self.exit_hold,
                                ..End::default()
                            },
                        );
                    }
                }
            }
            while self.proxy.poll_stream_event().is_some() {}
            while let Some((_, segment)) = self.proxy.poll_kernel_segment() {
                any = true;
                self.client_kernel.push(segment);
            }
            while let Some(out) = self.exit.poll_kernel() {
                any = true;
                match out {
                    KernelOutput::Segment { set, data } => self.exit_kernel.push((set, data)),
                    KernelOutput::Closed(set) => self.exit_kernel_closed.push(set),
                }
            }
            any |= self.move_bytes();
            if !any {
                return;
            }
        }
    }

    /// Each end sends what it has (then closes) and reads what came.
    fn move_bytes(&mut self) -> bool {
        let mut moved = false;
        let now = self.now;
        let keys: Vec<StreamKey> = self.client_ends.keys().copied().collect();
        for k in keys {
            if self.proxy.status(k) == StreamStatus::Opening {
                continue;
            }
            let e = self.client_ends.get_mut(&k).unwrap();
            moved |= pump_end(e, &mut ClientEnd(&mut self.proxy, now, k));
        }
        let keys: Vec<StreamKey> = self.exit_ends.keys().copied().collect();
        for k in keys {
            let e = self.exit_ends.get_mut(&k).unwrap();
            moved |= pump_end(e, &mut ExitEnd(&mut self.exit, now, k));
        }
        moved
    }

    fn run(&mut self, until: Duration) {
        let end = self.now + until;
        loop {
            self.drain();
            let timers = [self.proxy.poll_timeout(), self.exit.poll_timeout()]
                .into_iter()
                .chain(self.relays.iter().map(|r| r.poll_timeout()))
                .chain(self.downs.iter().map(|d| Some(d.0)))
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
                if self.dead.contains(&to) {
                    continue;
                }
                if to == 0 {
                    self.proxy.handle_cell(now, link, &cell);
                } else {
                    self.relays[to - 1].handle_cell(now, link, &cell);
                }
            }
            let due: Vec<LinkId> = self
                .downs
                .iter()
                .filter(|d| d.0 <= now)
                .map(|d| d.1)
                .collect();
            self.downs.retain(|d| d.0 > now);
            for link in due {
                self.link_down(link);
            }
            self.proxy.handle_timeout(now);
            for r in &mut self.relays {
                r.handle_timeout(now);
            }
            self.exit.handle_timeout(now);
        }
    }

    /// Run until stream `k`'s client end has ended, at most `limit`.
    fn run_until_end(&mut self, k: StreamKey, limit: Duration) {
        let end = self.now + limit;
        while self.client_ends[&k].end.is_none() && self.now < end {
            self.run(Duration::from_millis(100));
        }
    }

    /// The link is gone at both ends (the dead end does nothing).
    fn link_down(&mut self, link: LinkId) {
        let Some((a, b)) = self.links.remove(&link) else {
            return;
        };
        for n in [a, b] {
            if self.dead.contains(&n) {
                continue;
            }
            if n == 0 {
                self.proxy.link_down(self.now, link);
            } else {
                self.relays[n - 1].link_down(link);
            }
        }
    }

    /// Relay `relay` dies: nothing more from or to it; its neighbours'
    /// sessions time out after 3 s.
    fn kill(&mut self, relay: usize) {
        let node = relay + 1;
        self.dead.push(node);
        let at = self.now + Duration::from_secs(3);
        for (&link, &(a, b)) in &self.links {
            if a == node || b == node {
                self.downs.push((at, link));
            }
        }
    }

    /// Open a stream that uploads `up` on a new set of `legs` circuits.
    fn start(&mut self, legs: usize, up: Vec<u8>, down: Vec<u8>) -> StreamKey {
        self.reply = down;
        let paths = self.paths(legs);
        let set = self.proxy.start_set(self.now, paths).unwrap();
        let k = self
            .proxy
            .open_stream(self.now, set, "target.example:443")
            .unwrap();
        self.client_ends.insert(
            k,
            End {
                to_send: up,
                ..End::default()
            },
        );
        k
    }
}

/// One end of a stream, as the test moves its bytes.
trait Side {
    fn send(&mut self, data: &[u8]) -> Result<usize, ()>;
    fn recv(&mut self, buf: &mut [u8]) -> Recv;
    fn close(&mut self);
}

struct ClientEnd<'a>(&'a mut Proxy, Instant, StreamKey);

impl Side for ClientEnd<'_> {
    fn send(&mut self, data: &[u8]) -> Result<usize, ()> {
        self.0.send(self.1, self.2, data).map_err(|_| ())
    }
    fn recv(&mut self, buf: &mut [u8]) -> Recv {
        self.0.recv(self.1, self.2, buf)
    }
    fn close(&mut self) {
        self.0.close(self.1, self.2)
    }
}

struct ExitEnd<'a>(&'a mut ExitSets, Instant, StreamKey);

impl Side for ExitEnd<'_> {
    fn send(&mut self, data: &[u8]) -> Result<usize, ()> {
        self.0.send(self.1, self.2, data).map_err(|_| ())
    }
    fn recv(&mut self, buf: &mut [u8]) -> Recv {
        self.0.recv(self.1, self.2, buf)
    }
    fn close(&mut self) {
        self.0.close(self.1, self.2)
    }
}

/// Move one end's bytes: read everything that came, send what fits,
/// close when all is sent; whether anything moved.
fn pump_end(e: &mut End, side: &mut impl Side) -> bool {
    let mut moved = false;
    if e.end.is_none() {
        loop {
            let mut buf = [0u8; 4096];
            match side.recv(&mut buf) {
                Recv::Data(n) => {
                    e.got.extend_from_slice(&buf[..n]);
                    moved = true;
                }
                Recv::Pending => break,
                end => {
                    e.end = Some(end);
                    moved = true;
                    break;
                }
            }
        }
    }
    if e.end != Some(Recv::Reset) {
        while e.sent < e.to_send.len() {
            match side.send(&e.to_send[e.sent..]) {
                Ok(0) | Err(()) => break,
                Ok(n) => {
                    e.sent += n;
                    moved = true;
                }
            }
        }
        if e.sent == e.to_send.len() && !e.closed && !e.hold {
            side.close();
            e.closed = true;
            moved = true;
        }
    }
    moved
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A stream over `legs` circuits with `loss` on every link: both ways
/// arrive whole and end cleanly.
fn whole_both_ways(legs: usize, loss: f64, seed: u64) {
    let mut sim = Sim::new(loss, seed);
    let up = pattern(60_000, 1);
    let down = pattern(200_000, 2);
    let k = sim.start(legs, up.clone(), down.clone());
    sim.run(Duration::from_secs(120));
    let client = &sim.client_ends[&k];
    assert_eq!(
        client.end,
        Some(Recv::End),
        "client end; {} bytes of {}",
        client.got.len(),
        down.len()
    );
    assert!(client.got == down, "the download differs");
    let exit = sim.exit_ends.values().next().expect("the exit connected");
    assert_eq!(exit.end, Some(Recv::End));
    assert!(exit.got == up, "the upload differs");
    assert_eq!(sim.most_linked, legs);
}

#[test]
fn a_stream_over_one_circuit_arrives_whole_both_ways() {
    whole_both_ways(1, 0.0, 1);
}

#[test]
fn a_stream_over_three_circuits_arrives_whole_both_ways() {
    whole_both_ways(3, 0.0, 2);
}

#[test]
fn a_stream_over_one_circuit_arrives_whole_through_one_percent_loss() {
    whole_both_ways(1, 0.01, 3);
}

#[test]
fn a_stream_over_three_circuits_arrives_whole_through_one_percent_loss() {
    whole_both_ways(3, 0.01, 4);
}

#[test]
fn a_target_the_exit_refuses_gets_its_reason() {
    let mut sim = Sim::new(0.0, 5);
    let paths = sim.paths(1);
    let set = sim.proxy.start_set(sim.now, paths).unwrap();
    let k = sim.proxy.open_stream(sim.now, set, REFUSED_TARGET).unwrap();
    sim.run(Duration::from_secs(5));
    assert_eq!(sim.proxy.status(k), StreamStatus::Refused(EXITPOLICY));
    assert!(sim.exit_ends.is_empty());
}

#[test]
fn a_relay_killed_mid_transfer_resets_the_stream_never_ends_it() {
    let mut sim = Sim::new(0.0, 6);
    let k = sim.start(1, Vec::new(), pattern(2_000_000, 3));
    sim.run(Duration::from_millis(400));
    let got = sim.client_ends[&k].got.len();
    assert!(got > 0 && got < 2_000_000, "mid-transfer: {got} bytes");
    // The middle of the only circuit.
    sim.kill(3);
    sim.run(Duration::from_secs(120));
    let client = &sim.client_ends[&k];
    assert_eq!(client.end, Some(Recv::Reset), "{} bytes", client.got.len());
    assert!(sim.set_failed);
    assert_eq!(sim.proxy.status(k), StreamStatus::Failed);
}

#[test]
fn a_relay_killed_on_one_of_three_circuits_costs_no_byte() {
    let mut sim = Sim::new(0.0, 7);
    let down = pattern(2_000_000, 4);
    let k = sim.start(3, Vec::new(), down.clone());
    sim.run(Duration::from_millis(400));
    assert!(sim.client_ends[&k].got.len() < down.len());
    sim.kill(4);
    sim.run_until_end(k, Duration::from_secs(300));
    let client = &sim.client_ends[&k];
    assert_eq!(client.end, Some(Recv::End), "{} bytes", client.got.len());
    assert!(client.got == down, "the download differs");
    assert_eq!(sim.proxy.linked_legs(k.set), 2);
    assert!(!sim.set_failed);
}

#[test]
fn an_idle_stream_keeps_its_circuits_and_carries_bytes_after_minutes() {
    let mut sim = Sim::new(0.0, 8);
    // Nothing to send yet, either way: the stream opens and idles.
    sim.exit_hold = true;
    let k = sim.start(3, Vec::new(), Vec::new());
    sim.client_ends.get_mut(&k).unwrap().hold = true;
    sim.run(Duration::from_secs(1));
    assert_eq!(sim.proxy.status(k), StreamStatus::Open);
    // Past every relay's idle timeout (60 s), twice.
    sim.run(Duration::from_secs(150));
    assert!(!sim.set_failed, "the set died idle");
    assert_eq!(sim.proxy.linked_legs(k.set), 3);
    assert_eq!(sim.proxy.status(k), StreamStatus::Open);
    // Then the exit's side sends: it arrives.
    let (&ek, _) = sim.exit_ends.iter().next().expect("the exit connected");
    let e = sim.exit_ends.get_mut(&ek).unwrap();
    e.to_send = pattern(10_000, 5);
    e.hold = false;
    sim.run(Duration::from_secs(10));
    assert!(sim.client_ends[&k].got == pattern(10_000, 5));
    assert_eq!(sim.client_ends[&k].end, Some(Recv::End));
}

#[test]
fn an_exit_takes_at_most_its_streams_per_set() {
    let mut sim = Sim::new(0.0, 9);
    sim.exit_hold = true;
    let paths = sim.paths(1);
    let set = sim.proxy.start_set(sim.now, paths).unwrap();
    let limit = ExitSetSettings::default().max_streams_per_set;
    let keys: Vec<StreamKey> = (0..limit + 6)
        .map(|_| {
            sim.proxy
                .open_stream(sim.now, set, "target.example:443")
                .unwrap()
        })
        .collect();
    sim.run(Duration::from_secs(5));
    let count = |want: StreamStatus| {
        keys.iter()
            .filter(|k| sim.proxy.status(**k) == want)
            .count()
    };
    assert_eq!(count(StreamStatus::Open), limit);
    assert_eq!(count(StreamStatus::Failed), 6);
    assert_eq!(sim.exit.streams(), limit);
}

/// Distinct segment-like payloads (the tunnel's packets are opaque here).
fn segments(n: usize, seed: u8) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| pattern(100 + i, seed.wrapping_add(i as u8)))
        .collect()
}

#[test]
fn a_kernel_set_carries_segments_both_ways_over_three_circuits() {
    let mut sim = Sim::with_kernel(0.0, 10, true, true);
    let paths = sim.paths(3);
    let set = sim.proxy.start_set(sim.now, paths).unwrap();
    assert!(
        sim.proxy
            .open_stream(sim.now, set, "target.example:443")
            .is_err(),
        "a kernel set opens no user-space stream"
    );
    // Sent before any circuit is linked: queued, not lost.
    let up = segments(40, 1);
    for s in &up[..10] {
        assert!(sim.proxy.send_kernel_segment(sim.now, set, s));
    }
    sim.run(Duration::from_secs(2));
    assert_eq!(sim.most_linked, 3);
    for s in &up[10..] {
        assert!(sim.proxy.send_kernel_segment(sim.now, set, s));
    }
    sim.run(Duration::from_secs(2));
    let mut got: Vec<Vec<u8>> = sim.exit_kernel.iter().map(|(_, d)| d.clone()).collect();
    let mut want = up.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want, "every segment reached the exit's kernel");
    let exit_set = sim.exit_kernel[0].0;
    let down = segments(40, 2);
    for s in &down {
        assert!(sim.exit.send_kernel_segment(exit_set, s));
    }
    sim.run(Duration::from_secs(2));
    let mut got = sim.client_kernel.clone();
    let mut want = down.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want, "every segment reached the client's kernel");
    // Idle past every relay's idle timeout: the legs live on.
    sim.run(Duration::from_secs(150));
    assert_eq!(sim.proxy.linked_legs(set), 3);
    assert!(sim.exit_kernel_closed.is_empty());
}

#[test]
fn an_exit_without_a_tun_device_refuses_kernel_sets() {
    let mut sim = Sim::with_kernel(0.0, 11, true, false);
    let paths = sim.paths(1);
    let set = sim.proxy.start_set(sim.now, paths).unwrap();
    sim.proxy.send_kernel_segment(sim.now, set, &[1; 40]);
    sim.run(Duration::from_secs(10));
    assert!(sim.set_failed, "the set failed");
    assert!(sim.exit_kernel.is_empty());
}

#[test]
fn a_kernel_set_whose_circuits_die_is_closed_at_the_exit() {
    let mut sim = Sim::with_kernel(0.0, 12, true, true);
    let paths = sim.paths(1);
    let set = sim.proxy.start_set(sim.now, paths).unwrap();
    sim.proxy.send_kernel_segment(sim.now, set, &[7; 60]);
    sim.run(Duration::from_secs(2));
    let (exit_set, _) = sim.exit_kernel[0];
    // The middle of the only circuit.
    sim.kill(3);
    sim.run(Duration::from_secs(120));
    assert!(sim.set_failed, "the client's set failed");
    assert_eq!(sim.exit_kernel_closed, vec![exit_set]);
    assert!(!sim.exit.send_kernel_segment(exit_set, &[1; 40]));
}

#[test]
fn an_exit_lets_no_more_streams_open_than_its_memory_allows() {
    let mut sim = Sim::new(0.0, 13);
    sim.exit_hold = true;
    // Room for three streams' buffers.
    sim.exit.limit_streams(3);
    let paths = sim.paths(1);
    let set = sim.proxy.start_set(sim.now, paths).unwrap();
    let open = |sim: &mut Sim, n: usize| -> Vec<StreamKey> {
        (0..n)
            .map(|_| {
                let k = sim
                    .proxy
                    .open_stream(sim.now, set, "target.example:443")
                    .unwrap();
                sim.client_ends.entry(k).or_default().hold = true;
                k
            })
            .collect()
    };
    let keys = open(&mut sim, 5);
    sim.run(Duration::from_secs(5));
    let count = |sim: &Sim, keys: &[StreamKey], want: StreamStatus| {
        keys.iter()
            .filter(|k| sim.proxy.status(**k) == want)
            .count()
    };
    assert_eq!(count(&sim, &keys, StreamStatus::Open), 3);
    assert_eq!(count(&sim, &keys, StreamStatus::Failed), 2);
    assert_eq!(sim.exit.open_streams(), 3);
    assert_eq!(sim.exit.held_bytes(), 3 * sim.exit.stream_bytes());
    // With room again, a new stream opens.
    sim.exit.limit_streams(usize::MAX);
    let more = open(&mut sim, 1);
    sim.run(Duration::from_secs(5));
    assert_eq!(sim.proxy.status(more[0]), StreamStatus::Open);
    assert_eq!(sim.exit.open_streams(), 4);
}

#[test]
fn an_exit_over_its_memory_ends_the_set_holding_the_most_and_spares_the_rest() {
    let mut sim = Sim::new(0.0, 14);
    sim.exit_hold = true;
    // Two sets, all streams idle: one with three streams, one with one.
    let mut streams = Vec::new();
    for n in [3, 1] {
        let paths = sim.paths(1);
        let set = sim.proxy.start_set(sim.now, paths).unwrap();
        for _ in 0..n {
            let k = sim
                .proxy
                .open_stream(sim.now, set, "target.example:443")
                .unwrap();
            sim.client_ends.entry(k).or_default().hold = true;
            streams.push(k);
        }
    }
    sim.run(Duration::from_secs(5));
    for k in &streams {
        assert_eq!(sim.proxy.status(*k), StreamStatus::Open, "{k:?}");
    }
    let one = sim.exit.stream_bytes();
    assert_eq!(sim.exit.held_bytes(), 4 * one);
    // Down to at most two streams' worth: the larger set goes, alone.
    assert_eq!(sim.exit.shed(2 * one), 1);
    assert_eq!(sim.exit.held_bytes(), one);
    assert_eq!(sim.exit.sets(), 1);
    sim.run(Duration::from_secs(30));
    for k in &streams[..3] {
        assert_eq!(sim.proxy.status(*k), StreamStatus::Failed, "{k:?}");
    }
    assert!(sim.set_failed, "the client heard its set end");
    // The other set still carries bytes.
    let k = streams[3];
    assert_eq!(sim.proxy.status(k), StreamStatus::Open);
    let mut alive: Vec<&mut End> = sim
        .exit_ends
        .values_mut()
        .filter(|e| e.end.is_none())
        .collect();
    assert_eq!(alive.len(), 1, "the spared set's stream alone is open");
    alive[0].to_send = pattern(10_000, 6);
    alive[0].hold = false;
    sim.client_ends.get_mut(&k).unwrap().hold = false;
    sim.run(Duration::from_secs(10));
    assert!(sim.client_ends[&k].got == pattern(10_000, 6));
    assert_eq!(sim.client_ends[&k].end, Some(Recv::End));
}

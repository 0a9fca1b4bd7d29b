//! MORE end to end in simulated time: a client's `Proxy`, five relays
//! (the last an exit running `ExitSets`) whose links lose and reorder
//! messages; a stream carries bytes both ways, every segment in a Sphinx
//! packet on a route of its own.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::ops::Range;
use std::time::{Duration, Instant};

use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_dgram::more::wire::{LinkMsg, SEGMENT_LEN};
use onionlab_dgram::more::{
    sphinx, MoreOutput, MoreRelay, MoreRelayInfo, MoreRelaySettings, RouteHop, SphinxKey,
};
use onionlab_dgram::{
    ExitSetSettings, ExitSets, LinkId, Proxy, ProxyOutput, ProxySettings, Recv, StreamEvent,
    StreamKey, StreamStatus,
};
use onionlab_utcp::{Congestion, Settings};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// Node 0 is the client; node i + 1 is relay i; the last relay is the
/// exit.
type Node = usize;
const RELAYS: usize = 5;
const EXIT: Node = RELAYS;

fn addr(relay: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, relay as u8 + 1], 5000))
}

struct Sim {
    now: Instant,
    rng: StdRng,
    loss: f64,
    proxy: Proxy,
    relays: Vec<MoreRelay>,
    keys: Vec<RelaySecretKeys>,
    exit: ExitSets,
    links: HashMap<LinkId, (Node, Node)>,
    next_link: LinkId,
    flight: BTreeMap<(Instant, u64), (Node, LinkId, Vec<u8>)>,
    seq: u64,
    /// Each message's one-way delay is drawn from this range (µs): a
    /// range wider than one value reorders.
    delay_us: Range<u64>,
    /// Relays that are dead: they take and send nothing.
    dead: Vec<Node>,
    set: u64,
    stream: Option<StreamKey>,
    /// The client's request and what of it went; what came back.
    request: Vec<u8>,
    request_sent: usize,
    client_got: Vec<u8>,
    client_end: Option<Recv>,
    /// The exit's stream, what its target sends and what of it went;
    /// what came.
    exit_stream: Option<StreamKey>,
    reply: Vec<u8>,
    reply_sent: usize,
    exit_got: Vec<u8>,
    exit_end: Option<Recv>,
    set_failed: bool,
}

impl Sim {
    fn new(loss: f64, seed: u64, request: usize, reply: usize) -> Sim {
        let mut rng = StdRng::seed_from_u64(seed);
        let keys: Vec<RelaySecretKeys> = (0..RELAYS)
            .map(|_| RelaySecretKeys::generate(&mut rng))
            .collect();
        let now = Instant::now();
        let directory: Vec<_> = (0..RELAYS)
            .map(|i| (keys[i].public().ed_identity, addr(i)))
            .collect();
        let relays = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let settings = MoreRelaySettings {
                    exit: i + 1 == EXIT,
                    ..MoreRelaySettings::default()
                };
                MoreRelay::new(
                    k.public().ed_identity,
                    SphinxKey::new(k.sphinx_secret()),
                    directory.clone(),
                    settings,
                    now,
                )
            })
            .collect();
        let tcp = Settings {
            congestion: Congestion::Cubic,
            ..Settings::default()
        };
        let mut proxy = Proxy::new(
            ProxySettings {
                tcp: tcp.clone(),
                ..ProxySettings::default()
            },
            seed,
        )
        .unwrap();
        let exit = ExitSets::new(
            ExitSetSettings {
                tcp,
                ..ExitSetSettings::default()
            },
            seed + 100,
        )
        .unwrap();
        let info: Vec<MoreRelayInfo> = (0..RELAYS)
            .map(|i| MoreRelayInfo {
                hop: RouteHop {
                    identity: keys[i].public().ed_identity,
                    key: keys[i].sphinx_public(),
                },
                addr: addr(i),
            })
            .collect();
        proxy.set_more_relays(info.clone());
        let set = proxy.start_more_set(now, info[EXIT - 1]).unwrap();
        let mut bytes = |n: usize| (0..n).map(|_| rng.random::<u8>()).collect::<Vec<u8>>();
        let (request, reply) = (bytes(request), bytes(reply));
        Sim {
            now,
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
            delay_us: 5_000..6_000,
            dead: Vec::new(),
            set,
            stream: None,
            request,
            request_sent: 0,
            client_got: Vec::new(),
            client_end: None,
            exit_stream: None,
            reply,
            reply_sent: 0,
            exit_got: Vec::new(),
            exit_end: None,
            set_failed: false,
        }
    }

    fn relay_of(a: SocketAddr) -> Node {
        (0..RELAYS).find(|&j| addr(j) == a).expect("a relay") + 1
    }

    fn open_link(&mut self, a: Node, b: Node) {
        if self.dead.contains(&b) {
            return;
        }
        let link = self.next_link;
        self.next_link += 1;
        self.links.insert(link, (a, b));
        let id_b = self.keys[b - 1].public().ed_identity;
        if a == 0 {
            self.relays[b - 1].link_up(link, None);
            self.proxy.link_up(self.now, link, addr(b - 1), id_b);
        } else {
            let id_a = self.keys[a - 1].public().ed_identity;
            self.relays[a - 1].link_up(link, Some(id_b));
            self.relays[b - 1].link_up(link, Some(id_a));
        }
    }

    fn send(&mut self, from: Node, link: LinkId, msg: Vec<u8>) {
        let Some(&(a, b)) = self.links.get(&link) else {
            return;
        };
        let to = if from == a { b } else { a };
        if self.dead.contains(&from) || self.rng.random_bool(self.loss) {
            return;
        }
        // Each message its own delay: links reorder a little.
        let delay = Duration::from_micros(self.rng.random_range(self.delay_us.clone()));
        self.seq += 1;
        self.flight
            .insert((self.now + delay, self.seq), (to, link, msg));
    }

    /// Everyone acts on what the others asked, until nobody asks more.
    fn drain(&mut self) {
        loop {
            let mut any = false;
            while let Some(o) = self.proxy.poll_output() {
                any = true;
                match o {
                    ProxyOutput::SendMore(link, m) => self.send(0, link, m),
                    ProxyOutput::Connect { addr: a, .. } => self.open_link(0, Self::relay_of(a)),
                    ProxyOutput::SetFailed(_) => self.set_failed = true,
                    other => panic!("a MORE set asked for {other:?}"),
                }
            }
            for r in 0..RELAYS {
                while let Some(o) = self.relays[r].poll_output() {
                    any = true;
                    match o {
                        MoreOutput::Send(link, m) => self.send(r + 1, link, m),
                        MoreOutput::Connect { addr: a, .. } => {
                            self.open_link(r + 1, Self::relay_of(a))
                        }
                        MoreOutput::Exit(m) => self.exit.handle_more(self.now, &m),
                    }
                }
            }
            while let Some((surb, msg)) = self.exit.poll_more_reply(self.now) {
                any = true;
                self.relays[EXIT - 1]
                    .send_reply(self.now, &surb, &msg)
                    .unwrap();
            }
            while let Some(ev) = self.exit.poll_event() {
                any = true;
                if let StreamEvent::Connect { stream, target } = ev {
                    assert_eq!(target, "dest.example:80");
                    self.exit.connected(self.now, stream);
                    self.exit_stream = Some(stream);
                }
            }
            while self.proxy.poll_stream_event().is_some() {
                any = true;
            }
            any |= self.serve_streams();
            if !any {
                break;
            }
        }
    }

    /// Move the streams' bytes: the client's request, the exit's reply.
    fn serve_streams(&mut self) -> bool {
        let now = self.now;
        let mut moved = false;
        let mut buf = vec![0u8; 65536];
        if let Some(s) = self.stream {
            if self.proxy.status(s) == StreamStatus::Open {
                if self.request_sent < self.request.len() {
                    let n = self
                        .proxy
                        .send(now, s, &self.request[self.request_sent..])
                        .unwrap();
                    if n > 0 {
                        self.request_sent += n;
                        moved = true;
                        if self.request_sent == self.request.len() {
                            self.proxy.close(now, s);
                        }
                    }
                }
                while self.client_end.is_none() {
                    match self.proxy.recv(now, s, &mut buf) {
                        Recv::Data(n) => {
                            self.client_got.extend_from_slice(&buf[..n]);
                            moved = true;
                        }
                        Recv::Pending => break,
                        end => self.client_end = Some(end),
                    }
                }
            } else if self.proxy.status(s) == StreamStatus::Failed {
                self.client_end.get_or_insert(Recv::Reset);
            }
        }
        if let Some(s) = self.exit_stream {
            if self.reply_sent < self.reply.len() {
                if let Ok(n) = self.exit.send(now, s, &self.reply[self.reply_sent..]) {
                    if n > 0 {
                        self.reply_sent += n;
                        moved = true;
                        if self.reply_sent == self.reply.len() {
                            self.exit.close(now, s);
                        }
                    }
                }
            }
            while self.exit_end.is_none() {
                match self.exit.recv(now, s, &mut buf) {
                    Recv::Data(n) => {
                        self.exit_got.extend_from_slice(&buf[..n]);
                        moved = true;
                    }
                    Recv::Pending => break,
                    end => self.exit_end = Some(end),
                }
            }
        }
        moved
    }

    /// Run until `done` or `limit` of simulated time passed.
    fn run(&mut self, limit: Duration, done: impl Fn(&Sim) -> bool) {
        let end = self.now + limit;
        loop {
            self.drain();
            if done(self) || self.now >= end {
                return;
            }
            let next = [
                self.flight.keys().next().map(|k| k.0),
                self.proxy.poll_timeout(),
                self.exit.poll_timeout(),
                Some(self.now + Duration::from_millis(100)),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap();
            self.now = next.max(self.now).min(end);
            while let Some(entry) = self.flight.first_entry() {
                if entry.key().0 > self.now {
                    break;
                }
                let (to, link, msg) = entry.remove();
                if self.dead.contains(&to) {
                    continue;
                }
                if to == 0 {
                    self.proxy.handle_more(self.now, link, &msg);
                } else {
                    self.relays[to - 1].handle_message(self.now, link, &msg);
                }
            }
            self.proxy.handle_timeout(self.now);
            self.exit.handle_timeout(self.now);
        }
    }

    fn open_stream(&mut self) {
        // Wait for the links and the mailboxes first.
        self.run(Duration::from_secs(2), |_| false);
        let s = self
            .proxy
            .open_stream(self.now, self.set, "dest.example:80")
            .unwrap();
        self.stream = Some(s);
    }

    fn finished(&self) -> bool {
        self.client_end.is_some() && self.exit_end.is_some()
    }
}

fn transfer(loss: f64, seed: u64, request: usize, reply: usize) -> Sim {
    let mut sim = Sim::new(loss, seed, request, reply);
    sim.open_stream();
    sim.run(Duration::from_secs(300), Sim::finished);
    assert_eq!(sim.client_end, Some(Recv::End), "the client's end");
    assert_eq!(sim.exit_end, Some(Recv::End), "the exit's end");
    assert!(sim.client_got == sim.reply, "the reply arrived changed");
    assert!(sim.exit_got == sim.request, "the request arrived changed");
    assert!(!sim.set_failed);
    sim
}

#[test]
fn a_stream_crosses_more_both_ways() {
    let sim = transfer(0.0, 1, 20_000, 300_000);
    // Every packet took a route of its own: every relay peeled some.
    for (i, r) in sim.relays.iter().enumerate() {
        let st = r.stats();
        assert!(st.peeled > 0, "relay {i} peeled nothing: {st:?}");
        assert_eq!(st.invalid, 0, "relay {i}: {st:?}");
        assert_eq!(st.replays, 0, "relay {i}: {st:?}");
    }
    // The exit's stock was kept without storms of refills: the client
    // sent not many more packets than the exit answered (a reply takes
    // one SURB; a refill brings two).
    let forward = sim.relays[EXIT - 1].stats().exited;
    let replies: u64 = sim.relays.iter().map(|r| r.stats().delivered).sum();
    assert!(replies > 0);
    assert!(
        forward <= 2 * replies + 100,
        "{forward} packets forward for {replies} replies"
    );
}

/// What MORE's end-to-end TCP costs alone: simulated time stands still
/// while packets are sealed and peeled, so a download's simulated time
/// is the protocol's (windows, acknowledgements, SURB stock) without the
/// cryptography's CPU. A megabyte down without loss, over links whose
/// delays reorder packets (5-6 ms per link) and over links of one delay,
/// printed for docs/datagram.md; bounded so that a stall (a 1 s
/// retransmission timeout) fails the test.
#[test]
fn a_megabyte_down_without_loss_has_no_stall() {
    let time = |delay_us: Range<u64>| {
        let mut sim = Sim::new(0.0, 5, 1000, 1 << 20);
        sim.delay_us = delay_us;
        sim.open_stream();
        let start = sim.now;
        sim.run(Duration::from_secs(60), Sim::finished);
        assert_eq!(sim.client_end, Some(Recv::End));
        assert!(sim.client_got == sim.reply);
        (sim.now - start, sim.exit.e2e_stats())
    };
    let (reordering, _) = time(5_000..6_000);
    let (in_order, exit) = time(5_000..5_001);
    eprintln!(
        "1 MiB over MORE in simulated time: {reordering:?} reordering, {in_order:?} in order; \
         the exit's TCP in order: {exit:?}"
    );
    // Every segment costs a whole packet: the exit's segments are full
    // (Nagle's algorithm, `e2e::segment_settings`), where smoltcp alone
    // sent about 46% more of them than the data needed.
    let data_per_segment = SEGMENT_LEN - onionlab_utcp::tortp::HEADER_LEN - 12;
    let needed = (1 << 20) / data_per_segment as u64 + 1;
    let new_segments = exit.data_segments_out - exit.data_segments_resent;
    assert!(
        new_segments <= needed + needed / 20,
        "{new_segments} segments of new data for {needed} full ones"
    );
    assert!(
        reordering < in_order * 2 + Duration::from_millis(500),
        "reordering cost {reordering:?} against {in_order:?}"
    );
}

#[test]
fn with_loss_and_reordering_every_byte_arrives() {
    transfer(0.02, 2, 10_000, 150_000);
}

#[test]
fn a_dead_exit_resets_the_stream_never_ends_it() {
    let mut sim = Sim::new(0.0, 3, 1000, 2_000_000);
    sim.open_stream();
    sim.run(Duration::from_secs(60), |s| s.client_got.len() > 100_000);
    assert!(sim.client_got.len() > 100_000, "the transfer did not start");
    sim.dead.push(EXIT);
    let killed = sim.now;
    sim.run(Duration::from_secs(60), |s| s.client_end.is_some());
    assert_eq!(sim.client_end, Some(Recv::Reset), "a truncated stream");
    assert!(sim.client_got.len() < sim.reply.len());
    let noticed = sim.now - killed;
    assert!(
        noticed <= onionlab_dgram::proxy::MORE_TIMEOUT + Duration::from_secs(2),
        "noticed after {noticed:?}"
    );
    assert!(sim.set_failed);
}

/// A relay with a link from a client (1) and one to the relay `next` (2),
/// and a packet for it that goes on to `next`.
fn relay_and_packet() -> (MoreRelay, Vec<u8>) {
    let mut rng = StdRng::seed_from_u64(9);
    let (a, b) = (
        RelaySecretKeys::generate(&mut rng),
        RelaySecretKeys::generate(&mut rng),
    );
    let hop = |k: &RelaySecretKeys| RouteHop {
        identity: k.public().ed_identity,
        key: k.sphinx_public(),
    };
    let now = Instant::now();
    let mut relay = MoreRelay::new(
        a.public().ed_identity,
        SphinxKey::new(a.sphinx_secret()),
        [(b.public().ed_identity, addr(1))],
        MoreRelaySettings::default(),
        now,
    );
    relay.link_up(1, None);
    relay.link_up(2, Some(b.public().ed_identity));
    let packet = sphinx::seal_forward(&[hop(&a), hop(&b)], b"hello").unwrap();
    assert_eq!(packet.len(), sphinx::PACKET_LEN);
    (relay, LinkMsg::Packet(packet).encode())
}

#[test]
fn a_replayed_packet_is_refused() {
    let (mut relay, msg) = relay_and_packet();
    let now = Instant::now();
    relay.handle_message(now, 1, &msg);
    match relay.poll_output() {
        Some(MoreOutput::Send(2, out)) => {
            assert!(
                matches!(LinkMsg::parse(&out), Ok(LinkMsg::Packet(p)) if p.len() == sphinx::PACKET_LEN)
            );
        }
        other => panic!("expected the packet sent on, got {other:?}"),
    }
    relay.handle_message(now, 1, &msg);
    assert_eq!(relay.poll_output(), None);
    assert_eq!(relay.stats().replays, 1);
    assert_eq!(relay.stats().forwarded, 1);
}

#[test]
fn a_forged_or_truncated_packet_is_dropped() {
    let (mut relay, msg) = relay_and_packet();
    let now = Instant::now();
    // A byte of the header's routing information changed: its MAC fails.
    let mut forged = msg.clone();
    forged[100] ^= 1;
    relay.handle_message(now, 1, &forged);
    // Cut short: not a MORE message of any kind.
    relay.handle_message(now, 1, &msg[..msg.len() - 1]);
    // From a link that is not up.
    relay.handle_message(now, 7, &msg);
    assert_eq!(relay.poll_output(), None);
    assert_eq!(relay.stats().invalid, 3);
    // The genuine packet still goes through.
    relay.handle_message(now, 1, &msg);
    assert!(matches!(relay.poll_output(), Some(MoreOutput::Send(2, _))));
}

#[test]
fn a_mailbox_is_one_links() {
    let (mut relay, _) = relay_and_packet();
    relay.link_up(3, None);
    let mailbox = [7u8; 32];
    relay.handle_message(Instant::now(), 1, &LinkMsg::Register(mailbox).encode());
    assert_eq!(
        relay.poll_output(),
        Some(MoreOutput::Send(1, LinkMsg::Registered(mailbox).encode()))
    );
    // Another link's claim on it is refused: it would take the replies.
    relay.handle_message(Instant::now(), 3, &LinkMsg::Register(mailbox).encode());
    assert_eq!(relay.poll_output(), None);
    assert_eq!(relay.stats().invalid, 1);
}

#[test]
fn the_largest_messages_fit_a_packet() {
    use onionlab_dgram::more::wire::{E2eMsg, MAX_SURBS, SEGMENT_LEN};
    let surb = vec![3u8; sphinx::SURB_LEN];
    let full = [
        E2eMsg::Forward {
            set: [1; 16],
            probe: false,
            surbs: vec![surb.clone()],
            segment: vec![4; SEGMENT_LEN],
        },
        E2eMsg::Forward {
            set: [1; 16],
            probe: true,
            surbs: vec![surb.clone(); MAX_SURBS],
            segment: Vec::new(),
        },
        E2eMsg::Reply {
            stock: 77,
            segments: vec![vec![5; SEGMENT_LEN]; 2],
        },
    ];
    for msg in full {
        let bytes = msg.encode().unwrap();
        assert!(bytes.len() <= sphinx::MESSAGE_LEN);
        assert_eq!(E2eMsg::parse(&bytes).unwrap(), msg);
    }
    // One byte more does not.
    let over = E2eMsg::Forward {
        set: [1; 16],
        probe: false,
        surbs: vec![surb; 1],
        segment: vec![4; SEGMENT_LEN + 1],
    };
    assert!(over.encode().is_err());
}

#[test]
fn a_surb_and_its_reply_are_packet_sized() {
    let mut rng = StdRng::seed_from_u64(5);
    let keys: Vec<RelaySecretKeys> = (0..3)
        .map(|_| RelaySecretKeys::generate(&mut rng))
        .collect();
    let route: Vec<RouteHop> = keys
        .iter()
        .map(|k| RouteHop {
            identity: k.public().ed_identity,
            key: k.sphinx_public(),
        })
        .collect();
    let surb = sphinx::make_surb(&route, &[9u8; 32]).unwrap();
    assert_eq!(surb.bytes.len(), sphinx::SURB_LEN);
    let (mut packet, first) = sphinx::use_surb(&surb.bytes, b"a reply").unwrap();
    assert_eq!(first, route[0].identity);
    // Peel it at each hop as the relays do: the last delivers to the
    // mailbox, and only the SURB's creator reads it.
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(packet.len(), sphinx::PACKET_LEN);
        let key = SphinxKey::new(k.sphinx_secret());
        match sphinx::peel(&key, &packet, |_| false).unwrap() {
            sphinx::Peeled::Forward { next, packet: p } => {
                assert_eq!(next, route[i + 1].identity);
                packet = p;
            }
            sphinx::Peeled::Final {
                destination,
                id,
                payload,
            } => {
                assert_eq!(i, 2);
                assert_eq!(destination, [9u8; 32]);
                assert_eq!(id, surb.id);
                let message = sphinx::open_reply(&surb.recovery, &payload).unwrap();
                assert_eq!(message, b"a reply");
                return;
            }
        }
    }
    panic!("the reply never reached its last hop");
}

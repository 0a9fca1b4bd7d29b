//! Endpoints joined in simulated time (10 ms each way): sessions from
//! several peers on one accepting endpoint, lanes carrying data, datagrams
//! from nowhere dropped, the handshake limits under a flood of forged
//! ClientHellos, and one session's failure harming no other.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_dtls::endpoint::{is_client_hello, COOKIE_LEN, HELLO, RETRY};
use onionlab_dtls::Error;
use onionlab_utcp::{
    Endpoint, EndpointConfig, EndpointEvent, LaneBudget, LaneConfig, LaneEvent, LaneId,
    SessionConfig, Settings,
};
use tor_llcrypto::pk::ed25519::{Ed25519Identity, Keypair};

const DELAY: Duration = Duration::from_millis(10);

fn keypair(seed: u8) -> Arc<Keypair> {
    Arc::new(Keypair::from_bytes(&[seed; 32]))
}

fn identity(k: &Keypair) -> Ed25519Identity {
    Ed25519Identity::from(k.verifying_key())
}

fn addr(i: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], 1000 + i))
}

fn endpoint(identity: Option<Arc<Keypair>>, accept: bool, max_handshakes: usize) -> Endpoint {
    endpoint_with(identity, accept, max_handshakes, None, 64)
}

fn endpoint_with(
    identity: Option<Arc<Keypair>>,
    accept: bool,
    max_handshakes: usize,
    lane_budget: Option<LaneBudget>,
    anonymous_max_lanes: usize,
) -> Endpoint {
    Endpoint::new(
        config_with(
            identity,
            accept,
            max_handshakes,
            lane_budget,
            anonymous_max_lanes,
        ),
        7,
        Instant::now(),
    )
    .expect("endpoint")
}

fn config_with(
    identity: Option<Arc<Keypair>>,
    accept: bool,
    max_handshakes: usize,
    lane_budget: Option<LaneBudget>,
    anonymous_max_lanes: usize,
) -> EndpointConfig {
    EndpointConfig {
        session: SessionConfig {
            carrier: LaneConfig {
                utcp: Settings::default(),
                lane_budget,
                anonymous_max_lanes,
            },
            datagram: 1280,
            identity,
            expect_peer: None,
            handshake_timeout: Duration::from_secs(10),
            certificate: None,
        },
        accept,
        max_sessions: 64,
        max_handshakes,
        max_handshakes_per_ip: onionlab_dtls::endpoint::DEFAULT_MAX_HANDSHAKES_PER_IP,
    }
}

/// Endpoints by address, and datagrams in flight.
struct Net {
    now: Instant,
    nodes: BTreeMap<SocketAddr, Endpoint>,
    /// (arrival, from, to, datagram)
    flight: VecDeque<(Instant, SocketAddr, SocketAddr, Vec<u8>)>,
    /// Events seen, by the endpoint that reported them.
    events: Vec<(SocketAddr, EndpointEvent)>,
}

impl Net {
    fn new() -> Net {
        Net {
            now: Instant::now(),
            nodes: BTreeMap::new(),
            flight: VecDeque::new(),
            events: Vec::new(),
        }
    }

    /// A network with one relay, `key`'s, accepting at `addr(0)` with at
    /// most `max_handshakes` half-open sessions.
    fn with_relay(key: &Arc<Keypair>, max_handshakes: usize) -> (Net, SocketAddr) {
        let mut net = Net::new();
        let r = addr(0);
        net.nodes
            .insert(r, endpoint(Some(key.clone()), true, max_handshakes));
        (net, r)
    }

    /// A relay (`key`'s, at `addr(0)`) and a client at `addr(1)` with a
    /// session between them, authenticated both ways.
    fn client_session(key: &Arc<Keypair>) -> (Net, SocketAddr, SocketAddr) {
        let (mut net, r) = Net::with_relay(key, 8);
        let c = addr(1);
        net.client_connects(c, r, identity(key));
        net.run_for(Duration::from_millis(500));
        assert!(net.authenticated(r, c).is_some());
        assert!(net.authenticated(c, r).is_some());
        (net, r, c)
    }

    /// Two relays, `ka`'s at `addr(0)` and `kb`'s at `addr(1)`, each
    /// accepting on the address it dials from (one socket, as the
    /// datagram transport's); the first dials the second.
    fn two_relays(ka: &Arc<Keypair>, kb: &Arc<Keypair>) -> (Net, SocketAddr, SocketAddr) {
        let (a, b) = (addr(0), addr(1));
        let mut net = Net::new();
        net.nodes.insert(a, endpoint(Some(ka.clone()), true, 8));
        net.nodes.insert(b, endpoint(Some(kb.clone()), true, 8));
        let now = net.now;
        net.node(a).connect(b, identity(kb), now).expect("a dials");
        (net, a, b)
    }

    /// A new client at `at` opens a session to `to`, expecting `expect`.
    fn client_connects(&mut self, at: SocketAddr, to: SocketAddr, expect: Ed25519Identity) {
        self.nodes.insert(at, endpoint(None, false, 8));
        let now = self.now;
        self.node(at).connect(to, expect, now).expect("connect");
    }

    fn node(&mut self, a: SocketAddr) -> &mut Endpoint {
        self.nodes.get_mut(&a).expect("node")
    }

    /// Move every endpoint's output into the air, and its events out.
    fn collect(&mut self) {
        for (&from, e) in self.nodes.iter_mut() {
            while let Some((to, d)) = e.poll_transmit() {
                self.flight.push_back((self.now + DELAY, from, to, d));
            }
            while let Some(ev) = e.poll_event() {
                self.events.push((from, ev));
            }
        }
    }

    fn run_for(&mut self, d: Duration) {
        let until = self.now + d;
        loop {
            self.collect();
            let next = self
                .flight
                .iter()
                .map(|f| f.0)
                .chain(self.nodes.values().filter_map(Endpoint::poll_timeout))
                .min();
            let Some(next) = next.filter(|t| *t <= until) else {
                self.now = until;
                return;
            };
            self.now = self.now.max(next);
            let now = self.now;
            let mut i = 0;
            while i < self.flight.len() {
                if self.flight[i].0 <= now {
                    let (_, from, to, d) = self.flight.remove(i).expect("index");
                    if let Some(e) = self.nodes.get_mut(&to) {
                        e.handle_datagram(from, &d, now);
                    }
                } else {
                    i += 1;
                }
            }
            for e in self.nodes.values_mut() {
                if e.poll_timeout().is_some_and(|t| t <= now) {
                    e.handle_timeout(now);
                }
            }
        }
    }

    fn authenticated(&self, at: SocketAddr, peer: SocketAddr) -> Option<Option<Ed25519Identity>> {
        self.events.iter().find_map(|(a, e)| match e {
            EndpointEvent::Authenticated {
                peer: p, identity, ..
            } if *a == at && *p == peer => Some(*identity),
            _ => None,
        })
    }

    /// Whether `at` dialled its authenticated session with `peer`.
    fn dialled(&self, at: SocketAddr, peer: SocketAddr) -> Option<bool> {
        self.events.iter().find_map(|(a, e)| match e {
            EndpointEvent::Authenticated {
                peer: p, dialled, ..
            } if *a == at && *p == peer => Some(*dialled),
            _ => None,
        })
    }

    fn closed(&self, at: SocketAddr, peer: SocketAddr) -> Option<&Error> {
        self.events.iter().find_map(|(a, e)| match e {
            EndpointEvent::Closed { peer: p, error } if *a == at && *p == peer => Some(error),
            _ => None,
        })
    }

    /// The lane `from` opened to `to`, as `to` numbers it.
    fn opened_lane(&self, at: SocketAddr, peer: SocketAddr) -> Option<LaneId> {
        self.events.iter().find_map(|(a, e)| match e {
            EndpointEvent::Carrier {
                peer: p,
                event: LaneEvent::Accepted(id),
            } if *a == at && *p == peer => Some(*id),
            _ => None,
        })
    }
}

/// A relay listening at `addr(0)` and a client at `addr(1)` connect; the
/// client sends `data` on a lane and the relay reads it.
#[test]
fn a_client_and_a_relay_run_a_lane_through_their_endpoints() {
    let relay_key = keypair(1);
    let (mut net, r) = Net::with_relay(&relay_key, 8);
    let c = addr(1);
    net.client_connects(c, r, identity(&relay_key));
    net.run_for(Duration::from_millis(500));
    assert_eq!(net.authenticated(c, r), Some(Some(identity(&relay_key))));
    assert_eq!(
        net.authenticated(r, c),
        Some(None),
        "a client stays anonymous"
    );
    let now = net.now;
    let lane = net
        .node(c)
        .with_carrier(r, now, |m| m.open(now))
        .expect("session")
        .expect("lane");
    net.run_for(Duration::from_millis(200));
    let data = vec![0x5a; 20_000];
    let now = net.now;
    let sent = net
        .node(c)
        .with_carrier(r, now, |m| m.send(lane, &data, now))
        .expect("session")
        .expect("send");
    assert_eq!(sent, data.len());
    net.run_for(Duration::from_secs(2));
    let theirs = net.opened_lane(r, c).expect("the relay saw the lane");
    let mut got = vec![0u8; 32_768];
    let now = net.now;
    let n = net
        .node(r)
        .with_carrier(c, now, |m| m.recv(theirs, &mut got, now))
        .expect("session")
        .expect("recv");
    assert_eq!(&got[..n], &data[..]);
}

/// Three clients on one relay endpoint: three sessions; the one that
/// expected another identity fails alone.
#[test]
fn sessions_are_per_peer_and_one_failure_harms_no_other() {
    let relay_key = keypair(1);
    let (mut net, r) = Net::with_relay(&relay_key, 8);
    for i in 1..=3 {
        net.nodes.insert(addr(i), endpoint(None, false, 8));
    }
    let now = net.now;
    net.node(addr(1))
        .connect(r, identity(&relay_key), now)
        .expect("connect");
    net.node(addr(2))
        .connect(r, identity(&keypair(9)), now)
        .expect("connect");
    net.node(addr(3))
        .connect(r, identity(&relay_key), now)
        .expect("connect");
    net.run_for(Duration::from_secs(1));
    assert!(net.authenticated(addr(1), r).is_some());
    assert!(net.authenticated(addr(3), r).is_some());
    assert!(matches!(
        net.closed(addr(2), r),
        Some(Error::WrongIdentity { .. })
    ));
    assert_eq!(net.node(addr(2)).sessions(), 0);
    assert!(net.closed(addr(1), r).is_none());
    assert!(net.closed(addr(3), r).is_none());
    // The relay never heard a valid identity message from client 2's
    // session: it ends at its handshake timeout, harming nobody.
    net.run_for(Duration::from_secs(11));
    assert_eq!(net.node(r).sessions(), 2);
    assert!(matches!(net.closed(r, addr(2)), Some(Error::Auth(_))));
}

#[test]
fn datagrams_from_nowhere_open_nothing_and_get_no_answer() {
    let r = addr(0);
    let mut net = Net::new();
    net.nodes.insert(r, endpoint(Some(keypair(1)), true, 8));
    let now = net.now;
    for (i, junk) in [vec![], vec![22u8; 3], vec![23u8; 100], vec![0u8; 1200]]
        .into_iter()
        .enumerate()
    {
        net.node(r).handle_datagram(addr(10 + i as u16), &junk, now);
    }
    net.collect();
    assert!(net.flight.is_empty());
    assert_eq!(net.node(r).sessions(), 0);
    assert_eq!(net.node(r).stats().stray_datagrams, 4);
    // A client's endpoint accepts no session at all, even a ClientHello.
    let mut client = endpoint(None, false, 8);
    let hello = client_hello(r, now);
    client.handle_datagram(addr(20), &hello, now);
    assert_eq!(client.sessions(), 0);
    assert!(client.poll_transmit().is_none());
}

/// A client's first ClientHello to `to`.
fn client_hello(to: SocketAddr, now: Instant) -> Vec<u8> {
    let mut e = endpoint(None, false, 8);
    e.connect(to, identity(&keypair(1)), now).expect("connect");
    let mut t = now;
    loop {
        if let Some((_, d)) = e.poll_transmit() {
            assert!(is_client_hello(&d), "the first datagram is a ClientHello");
            return d;
        }
        t = e.poll_timeout().expect("a timer").max(t);
        e.handle_timeout(t);
    }
}

fn hello_with(cookie: &[u8], hello: &[u8]) -> Vec<u8> {
    let mut m = vec![HELLO];
    m.extend_from_slice(cookie);
    m.extend_from_slice(hello);
    m
}

/// ClientHellos from forged sources get a short RETRY and open nothing; a
/// cookie is good only for the address it was given to and for a while;
/// honest clients meanwhile get their sessions.
#[test]
fn forged_client_hellos_open_nothing() {
    let relay_key = keypair(1);
    let (mut net, r) = Net::with_relay(&relay_key, 4);
    let now = net.now;
    let hello = client_hello(r, now);
    for i in 0..20 {
        net.node(r).handle_datagram(addr(100 + i), &hello, now);
    }
    assert_eq!(net.node(r).sessions(), 0);
    assert_eq!(net.node(r).stats().retries_sent, 20);
    let mut cookie_of_100 = None;
    while let Some((to, d)) = net.node(r).poll_transmit() {
        assert_eq!(d.len(), 1 + COOKIE_LEN);
        assert!(d.len() < hello.len(), "no amplification");
        assert_eq!(d[0], RETRY);
        if to == addr(100) {
            cookie_of_100 = Some(d[1..].to_vec());
        }
    }
    let cookie = cookie_of_100.expect("a RETRY to 100");
    // Another address's cookie, a made-up one, a HELLO around junk.
    net.node(r)
        .handle_datagram(addr(101), &hello_with(&cookie, &hello), now);
    net.node(r)
        .handle_datagram(addr(100), &hello_with(&[7; COOKIE_LEN], &hello), now);
    net.node(r)
        .handle_datagram(addr(100), &hello_with(&cookie, &[22; 40]), now);
    assert_eq!(net.node(r).stats().bad_cookies, 3);
    assert_eq!(net.node(r).sessions(), 0);
    // A bad cookie with a ClientHello inside is answered with a fresh one.
    assert_eq!(net.node(r).stats().retries_sent, 22);
    // Too late: two windows on.
    let later = now + Duration::from_secs(25);
    net.node(r)
        .handle_datagram(addr(100), &hello_with(&cookie, &hello), later);
    assert_eq!(net.node(r).stats().bad_cookies, 4);
    // In time and from its address: a session.
    net.node(r)
        .handle_datagram(addr(100), &hello_with(&cookie, &hello), now);
    assert_eq!(net.node(r).sessions(), 1);
    assert_eq!(net.node(r).stats().sessions_accepted, 1);
    net.node(r).close(addr(100));
    for i in 1..=3 {
        net.client_connects(addr(i), r, identity(&relay_key));
    }
    net.run_for(Duration::from_secs(1));
    for i in 1..=3 {
        assert!(
            net.authenticated(addr(i), r).is_some(),
            "client {i} authenticated"
        );
    }
}

/// With two half-open sessions allowed, the third client's ClientHello
/// is refused while two are half-open, and gets in on its retransmission.
#[test]
fn the_half_open_limit_holds_and_a_refused_client_gets_in_later() {
    let relay_key = keypair(1);
    let (mut net, r) = Net::with_relay(&relay_key, 2);
    for i in 1..=3 {
        net.client_connects(addr(i), r, identity(&relay_key));
    }
    for _ in 0..400 {
        net.run_for(Duration::from_millis(5));
        assert!(net.node(r).half_open() <= 2);
    }
    assert!(net.node(r).stats().handshakes_refused >= 1);
    net.run_for(Duration::from_secs(3));
    for i in 1..=3 {
        assert!(
            net.authenticated(addr(i), r).is_some(),
            "client {i} authenticated"
        );
    }
    assert_eq!(net.node(r).sessions(), 3);
    assert_eq!(net.node(r).half_open(), 0);
}

#[test]
fn limits_and_duplicates_are_refused_at_connect() {
    let now = Instant::now();
    let mut e = endpoint(None, false, 8);
    let id = identity(&keypair(1));
    e.connect(addr(0), id, now).expect("first");
    assert!(matches!(
        e.connect(addr(0), id, now),
        Err(Error::SessionExists(_))
    ));
    for i in 1..64 {
        e.connect(addr(i), id, now).expect("within the limit");
    }
    assert!(matches!(
        e.connect(addr(64), id, now),
        Err(Error::TooManySessions(64))
    ));
    let bad = EndpointConfig {
        session: SessionConfig {
            carrier: LaneConfig {
                utcp: Settings::default(),
                lane_budget: None,
                anonymous_max_lanes: onionlab_utcp::DEFAULT_ANONYMOUS_MAX_LANES,
            },
            datagram: 1280,
            identity: None,
            expect_peer: None,
            handshake_timeout: Duration::from_secs(10),
            certificate: None,
        },
        accept: true,
        max_sessions: 8,
        max_handshakes: 8,
        max_handshakes_per_ip: onionlab_dtls::endpoint::DEFAULT_MAX_HANDSHAKES_PER_IP,
    };
    assert!(matches!(
        Endpoint::new(bad, 1, now),
        Err(Error::Settings(_))
    ));
}

/// A forged RETRY reaching a client before the relay's own misleads it
/// for one round only: the relay answers the bad cookie with a fresh one,
/// and the client's next ClientHello gets in.
#[test]
fn a_forged_retry_only_delays_the_handshake() {
    let relay_key = keypair(1);
    let (mut net, r) = Net::with_relay(&relay_key, 8);
    let c = addr(1);
    net.client_connects(c, r, identity(&relay_key));
    // The client's first ClientHello leaves; a forged RETRY "from the
    // relay" arrives before the relay's.
    while net.node(c).poll_transmit().is_none() {
        let t = net.node(c).poll_timeout().expect("timer");
        net.now = net.now.max(t);
        let now = net.now;
        net.node(c).handle_timeout(now);
    }
    let mut forged = vec![RETRY];
    forged.extend_from_slice(&[9; COOKIE_LEN]);
    let now = net.now;
    net.node(c).handle_datagram(r, &forged, now);
    net.run_for(Duration::from_secs(5));
    assert!(net.authenticated(c, r).is_some());
    assert!(net.node(r).stats().bad_cookies >= 1);
}

/// Once a session is up, a forged ClientHello from its peer's address
/// (no cookie: the forger cannot receive there) does not end it: the
/// relay answers with a RETRY the real peer ignores, and the session's
/// lanes still carry data.
#[test]
fn a_forged_client_hello_does_not_end_a_session() {
    let relay_key = keypair(1);
    let (mut net, r, c) = Net::client_session(&relay_key);
    let now = net.now;
    let hello = client_hello(r, now);
    net.node(r).handle_datagram(c, &hello, now);
    // Also a plaintext record that is not a ClientHello.
    let mut junk = hello.clone();
    junk[13] = 2;
    net.node(r).handle_datagram(c, &junk, now);
    net.run_for(Duration::from_millis(100));
    assert!(net.closed(r, c).is_none(), "the session lives");
    assert!(net.closed(c, r).is_none());
    let now = net.now;
    let lane = net
        .node(c)
        .with_carrier(r, now, |m| m.open(now))
        .expect("session")
        .expect("lane");
    net.run_for(Duration::from_millis(200));
    let now = net.now;
    let sent = net
        .node(c)
        .with_carrier(r, now, |m| m.send(lane, b"still here", now))
        .expect("session")
        .expect("send");
    assert_eq!(sent, 10);
}

/// A client that dropped its session and begins a new one from the same
/// address (its socket's) replaces the relay's old session: the relay
/// reports the old one closed and the new one authenticated.
#[test]
fn a_new_session_from_the_same_address_replaces_the_old_one() {
    let relay_key = keypair(1);
    let (mut net, r, c) = Net::client_session(&relay_key);
    assert!(net.node(c).close(r));
    net.events.clear();
    let now = net.now;
    net.node(c)
        .connect(r, identity(&relay_key), now)
        .expect("connect again");
    net.run_for(Duration::from_millis(500));
    assert!(net.closed(r, c).is_some(), "the old session ended");
    assert!(net.authenticated(r, c).is_some(), "the new one is up");
    assert!(net.authenticated(c, r).is_some());
    assert_eq!(net.node(r).sessions(), 1);
}

/// A relay's lanes over all its sessions stay within its budget, and a
/// client's session within the anonymous limit; a lane beyond is reset,
/// and a lane that ends gives its place back.
#[test]
fn lanes_stay_within_the_node_budget_and_the_anonymous_limit() {
    let relay_key = keypair(1);
    let budget = LaneBudget::new(5);
    let r = addr(0);
    let mut net = Net::new();
    net.nodes.insert(
        r,
        endpoint_with(Some(relay_key.clone()), true, 8, Some(budget.clone()), 3),
    );
    for i in 1..=2 {
        net.client_connects(addr(i), r, identity(&relay_key));
    }
    net.run_for(Duration::from_millis(500));
    // Each client opens 4 lanes: 3 fit per client session, 5 in all.
    let mut opened = Vec::new();
    for i in 1..=2u16 {
        let now = net.now;
        for _ in 0..4 {
            let id = net
                .node(addr(i))
                .with_carrier(r, now, |m| m.open(now))
                .expect("session")
                .expect("a lane of ours");
            opened.push((addr(i), id));
        }
    }
    net.run_for(Duration::from_millis(500));
    assert_eq!(budget.used(), 5);
    let resets = net
        .events
        .iter()
        .filter(|(a, e)| {
            *a != r
                && matches!(
                    e,
                    EndpointEvent::Carrier {
                        event: LaneEvent::Closed { reset: true, .. },
                        ..
                    }
                )
        })
        .count();
    assert_eq!(resets, 3, "8 lanes asked for, 5 accepted");
    // One client's session ends: its places come back.
    assert!(net.node(r).close(addr(1)));
    assert!(budget.used() <= 2, "{} still held", budget.used());
}

/// One IP address may hold only its share of the half-open sessions:
/// with two per address, a third ClientHello from another port of the
/// same host waits, while a host at another address gets in at once.
#[test]
fn one_address_cannot_take_every_half_open_slot() {
    let relay_key = keypair(1);
    let mut config = config_with(Some(relay_key.clone()), true, 8, None, 64);
    config.max_handshakes_per_ip = 2;
    let mut net = Net::new();
    let r = addr(0);
    net.nodes
        .insert(r, Endpoint::new(config, 7, Instant::now()).expect("relay"));
    let other = SocketAddr::from(([10, 0, 0, 2], 1001));
    for c in [addr(1), addr(2), addr(3), other] {
        net.client_connects(c, r, identity(&relay_key));
    }
    let same_ip = |net: &mut Net| net.node(r).half_open_from(addr(1).ip());
    for _ in 0..200 {
        net.run_for(Duration::from_millis(5));
        assert!(same_ip(&mut net) <= 2);
    }
    assert!(net.node(r).stats().handshakes_refused >= 1);
    assert!(
        net.authenticated(other, r).is_some(),
        "the other host waited"
    );
    net.run_for(Duration::from_secs(3));
    for c in [addr(1), addr(2), addr(3)] {
        assert!(net.authenticated(c, r).is_some(), "{c} authenticated later");
    }
}

/// Two relays, each accepting on the address it dials from (one socket,
/// as the datagram transport's), open sessions to each other at the same
/// moment: one session comes up between them, authenticated both ways,
/// within a few round trips.
#[test]
fn two_relays_dialling_each_other_at_once_get_one_session() {
    let (ka, kb) = (keypair(1), keypair(2));
    let (mut net, a, b) = Net::two_relays(&ka, &kb);
    let now = net.now;
    net.node(b).connect(a, identity(&ka), now).expect("b dials");
    net.run_for(Duration::from_millis(500));
    assert_eq!(net.authenticated(a, b), Some(Some(identity(&kb))));
    assert_eq!(net.authenticated(b, a), Some(Some(identity(&ka))));
    assert!(net.closed(a, b).is_none() && net.closed(b, a).is_none());
    assert_eq!(net.node(a).sessions(), 1);
    assert_eq!(net.node(b).sessions(), 1);
    // The relay with the larger identity gave its dial up.
    let yielded = |n: &mut Net, at| n.node(at).stats().dials_yielded;
    let larger = if identity(&ka).as_bytes() > identity(&kb).as_bytes() {
        a
    } else {
        b
    };
    let smaller = if larger == a { b } else { a };
    assert_eq!(yielded(&mut net, larger), 1);
    assert_eq!(yielded(&mut net, smaller), 0);
    // The smaller's dial made the session; the larger reports it as the
    // peer's.
    assert_eq!(net.dialled(smaller, larger), Some(true));
    assert_eq!(net.dialled(larger, smaller), Some(false));
}

/// The relay that gives its dial up may have sent a `HELLO` for it (with
/// a cookie of the other's) that arrives after the other's dial made the
/// session: it restarts nothing.
#[test]
fn a_late_hello_of_a_crossed_dial_restarts_nothing() {
    let (k1, k2) = (keypair(1), keypair(2));
    let (smaller, larger) = if identity(&k1).as_bytes() < identity(&k2).as_bytes() {
        (k1, k2)
    } else {
        (k2, k1)
    };
    // The larger (the one to give up) dials first, gets a cookie and
    // sends its HELLO, which is held back.
    let (mut net, l, w) = Net::two_relays(&larger, &smaller);
    net.run_for(Duration::from_millis(25));
    let i = net
        .flight
        .iter()
        .position(|f| f.1 == l && f.3.first() == Some(&HELLO))
        .expect("the larger's HELLO on its way");
    let (_, _, _, late) = net.flight.remove(i).expect("index");
    let now = net.now;
    net.node(w)
        .connect(l, identity(&larger), now)
        .expect("w dials");
    net.run_for(Duration::from_millis(500));
    assert_eq!(net.dialled(w, l), Some(true));
    assert_eq!(net.dialled(l, w), Some(false));
    assert_eq!(net.node(l).stats().dials_yielded, 1);
    let now = net.now;
    net.node(w).handle_datagram(l, &late, now);
    net.run_for(Duration::from_millis(200));
    assert!(net.closed(w, l).is_none(), "{:?}", net.closed(w, l));
    assert!(net.closed(l, w).is_none());
    assert_eq!(net.node(w).sessions(), 1);
}

/// A ClientHello forged with the source of a relay we are dialling makes
/// us drop nothing: it gets a RETRY (which goes to the real relay), and
/// our dial comes up whichever identity is the smaller.
#[test]
fn a_forged_client_hello_does_not_cancel_a_dial() {
    for (a_seed, b_seed) in [(1, 2), (2, 1)] {
        let (ka, kb) = (keypair(a_seed), keypair(b_seed));
        let (mut net, a, b) = Net::two_relays(&ka, &kb);
        let now = net.now;
        let hello = client_hello(a, now);
        net.node(a).handle_datagram(b, &hello, now);
        net.node(a)
            .handle_datagram(b, &hello_with(&[7; COOKIE_LEN], &hello), now);
        net.run_for(Duration::from_millis(500));
        assert_eq!(net.authenticated(a, b), Some(Some(identity(&kb))));
        assert_eq!(net.authenticated(b, a), Some(Some(identity(&ka))));
        assert_eq!(net.node(a).stats().dials_yielded, 0);
        if identity(&ka).as_bytes() > identity(&kb).as_bytes() {
            // a would give way to b's real dial: the forged cookie was
            // checked, and refused.
            assert_eq!(net.node(a).stats().bad_cookies, 1);
        }
    }
}

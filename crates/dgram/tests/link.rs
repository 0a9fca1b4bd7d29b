//! Datagram links in simulated time: two DTLS sessions carrying cells
//! (`CellLink`), 5 ms each way. Relays prove their identities; cells
//! cross once; replayed, truncated and forged datagrams deliver nothing
//! and end nothing; a peer over its rate loses the excess; a dtls-utcp
//! session's identity proof does not open a datagram session.

use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_dgram::wire::CELL_LEN;
use onionlab_dgram::{CellLink, CellLinkConfig, CellLinkEvent};
use onionlab_dtls::{Carrier, Error, Session, SessionConfig, SessionEvent};
use onionlab_utcp::{LaneConfig, Mux, Settings};
use tor_llcrypto::pk::ed25519::{Ed25519Identity, Keypair};

const DELAY: Duration = Duration::from_millis(5);

fn keypair(seed: u8) -> Arc<Keypair> {
    Arc::new(Keypair::from_bytes(&[seed; 32]))
}

fn identity(k: &Keypair) -> Ed25519Identity {
    Ed25519Identity::from(k.verifying_key())
}

fn config<C: Carrier>(
    carrier: C::Config,
    identity: Option<Arc<Keypair>>,
    expect: Option<Ed25519Identity>,
) -> SessionConfig<C> {
    SessionConfig {
        carrier,
        datagram: 1400,
        identity,
        expect_peer: expect,
        handshake_timeout: Duration::from_secs(5),
        certificate: None,
    }
}

/// Two sessions and the datagrams between them.
struct Pair<A: Carrier, B: Carrier> {
    now: Instant,
    a: Session<A>,
    b: Session<B>,
    /// (arrival, to b?, datagram), in order of arrival.
    flight: Vec<(Instant, bool, Vec<u8>)>,
    /// Every datagram a sent, in order.
    sent_by_a: Vec<Vec<u8>>,
    /// Drop everything b sends (b died).
    b_dead: bool,
}

impl<A: Carrier, B: Carrier> Pair<A, B> {
    fn new(a: SessionConfig<A>, b: SessionConfig<B>) -> Self {
        let now = Instant::now();
        Pair {
            now,
            a: Session::initiate(a, 1, now).expect("initiate"),
            b: Session::respond(b, 2, now).expect("respond"),
            flight: Vec::new(),
            sent_by_a: Vec::new(),
            b_dead: false,
        }
    }

    /// Run for `span`; the first error of either side ends it.
    fn run(&mut self, span: Duration) -> Result<(), (char, Error)> {
        let until = self.now + span;
        loop {
            while let Some(d) = self.a.poll_transmit() {
                self.sent_by_a.push(d.clone());
                self.flight.push((self.now + DELAY, true, d));
            }
            while let Some(d) = self.b.poll_transmit() {
                if !self.b_dead {
                    self.flight.push((self.now + DELAY, false, d));
                }
            }
            let next = [
                self.flight.first().map(|f| f.0),
                self.a.poll_timeout(),
                self.b.poll_timeout(),
            ]
            .into_iter()
            .flatten()
            .min();
            let Some(next) = next.filter(|t| *t <= until) else {
                self.now = until;
                return Ok(());
            };
            self.now = self.now.max(next);
            while self.flight.first().is_some_and(|f| f.0 <= self.now) {
                let (_, to_b, d) = self.flight.remove(0);
                if to_b {
                    self.b.handle_datagram(&d, self.now).map_err(|e| ('b', e))?;
                } else {
                    self.a.handle_datagram(&d, self.now).map_err(|e| ('a', e))?;
                }
            }
            self.a.handle_timeout(self.now).map_err(|e| ('a', e))?;
            self.b.handle_timeout(self.now).map_err(|e| ('b', e))?;
        }
    }
}

type Link = Pair<CellLink, CellLink>;

/// Relay 1 (a, initiating) and relay 2 (b), their handshake done; `b`'s
/// carrier settings as given.
fn relays_up(b_link: CellLinkConfig) -> Link {
    let (ka, kb) = (keypair(1), keypair(2));
    let mut link = Pair::new(
        config(CellLinkConfig::default(), Some(ka), Some(identity(&kb))),
        config(b_link, Some(kb), None),
    );
    link.run(Duration::from_millis(500)).expect("handshake");
    let authenticated = |e: Option<SessionEvent<CellLinkEvent>>| {
        matches!(e, Some(SessionEvent::Authenticated(Some(_))))
    };
    assert!(authenticated(link.a.poll_event()));
    assert!(authenticated(link.b.poll_event()));
    link
}

fn cell(i: u32) -> Box<[u8; CELL_LEN]> {
    let mut c = [0u8; CELL_LEN];
    c[..4].copy_from_slice(&i.to_be_bytes());
    c[4] = 3;
    c[5..9].copy_from_slice(&i.to_le_bytes());
    Box::new(c)
}

/// Queue cells `range` at a and flush them.
fn send_from_a(link: &mut Link, range: std::ops::Range<u32>) {
    let now = link.now;
    let carrier = link.a.carrier().expect("authenticated");
    for i in range {
        assert!(carrier.send(cell(i)), "the send queue is full");
    }
    link.a.flush(now).expect("flush");
}

/// Whether a reported its peer silent (events since the last call).
fn silent_at_a(link: &mut Link) -> bool {
    std::iter::from_fn(|| link.a.poll_event())
        .any(|e| matches!(e, SessionEvent::Carrier(CellLinkEvent::Silent)))
}

/// The cells b has received since the last call, by number.
fn received_at_b(link: &mut Link) -> Vec<u32> {
    std::iter::from_fn(|| link.b.poll_event())
        .filter_map(|e| match e {
            SessionEvent::Carrier(CellLinkEvent::Cell(c)) => {
                Some(u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn relays_carry_cells_and_each_arrives_once() {
    let mut link = relays_up(CellLinkConfig::default());
    for chunk in 0..5 {
        send_from_a(&mut link, chunk * 40..(chunk + 1) * 40);
        link.run(Duration::from_millis(20)).expect("no error");
    }
    let got = received_at_b(&mut link);
    assert_eq!(got, (0..200).collect::<Vec<_>>());
    let stats = link.b.carrier().expect("up").stats();
    assert_eq!((stats.cells_in, stats.over_rate), (200, 0));
}

#[test]
fn replayed_truncated_and_forged_datagrams_deliver_nothing_and_end_nothing() {
    let mut link = relays_up(CellLinkConfig::default());
    let before = link.sent_by_a.len();
    send_from_a(&mut link, 0..50);
    link.run(Duration::from_millis(20)).expect("no error");
    assert_eq!(received_at_b(&mut link).len(), 50);
    let carrying: Vec<Vec<u8>> = link.sent_by_a[before..].to_vec();
    assert!(!carrying.is_empty());
    let now = link.now;
    for d in &carrying {
        // The same datagram again: DTLS's record window refuses it.
        link.b.handle_datagram(d, now).expect("a replay is dropped");
        // Cut short, or cut to its header.
        link.b
            .handle_datagram(&d[..d.len() - 1], now)
            .expect("a truncated datagram is dropped");
        link.b
            .handle_datagram(&d[..d.len().min(13)], now)
            .expect("a truncated datagram is dropped");
        // A changed byte in the record's body.
        let mut forged = d.clone();
        let mid = forged.len() / 2;
        forged[mid] ^= 0x01;
        link.b
            .handle_datagram(&forged, now)
            .expect("a forged datagram is dropped");
    }
    link.b
        .handle_datagram(&[0x2f, 0xfe, 0xfd, 0, 1, 2, 3], now)
        .expect("garbage is dropped");
    assert_eq!(received_at_b(&mut link), Vec::<u32>::new());
    // The link goes on.
    send_from_a(&mut link, 50..60);
    link.run(Duration::from_millis(20)).expect("no error");
    assert_eq!(received_at_b(&mut link), (50..60).collect::<Vec<_>>());
}

#[test]
fn a_peer_over_its_rate_loses_the_excess() {
    let mut link = relays_up(CellLinkConfig {
        peer_rate: 1000,
        peer_burst: 20,
        ..CellLinkConfig::default()
    });
    send_from_a(&mut link, 0..100);
    link.run(Duration::from_millis(6)).expect("no error");
    let got = received_at_b(&mut link);
    // The burst, and at most a few more for the milliseconds that passed.
    assert!((20..=30).contains(&got.len()), "{}", got.len());
    let stats = link.b.carrier().expect("up").stats();
    assert_eq!(stats.cells_in + stats.over_rate, 100);
}

#[test]
fn a_full_send_queue_drops_and_counts() {
    let mut link = relays_up(CellLinkConfig::default());
    let a = link.a.carrier().expect("up");
    let queue = CellLinkConfig::default().send_queue as u32;
    let taken = (0..queue + 10).filter(|&i| a.send(cell(i))).count();
    assert_eq!(taken, queue as usize);
    assert_eq!(a.stats().send_dropped, 10);
}

#[test]
fn a_dtls_utcp_identity_proof_does_not_open_a_datagram_session() {
    // The same relay keys, the same DTLS: only the carrier differs, and
    // with it the label the identity proof signs.
    let (ka, kb) = (keypair(1), keypair(2));
    let mut pair: Pair<Mux, CellLink> = Pair::new(
        config(
            LaneConfig::new(Settings::default()),
            Some(ka),
            Some(identity(&kb)),
        ),
        config(CellLinkConfig::default(), Some(kb), None),
    );
    let result = pair.run(Duration::from_secs(1));
    assert!(
        matches!(result, Err((_, Error::Auth(_)))),
        "{:?}",
        result.err()
    );
}

#[test]
fn settings_that_cannot_carry_a_cell_are_refused() {
    let kb = keypair(2);
    let mut small = config::<CellLink>(CellLinkConfig::default(), Some(kb), None);
    small.datagram = 500;
    assert!(matches!(
        Session::respond(small, 1, Instant::now()),
        Err(Error::Carrier(_))
    ));
}

#[test]
fn an_idle_link_stays_up_on_heartbeats() {
    let mut link = relays_up(CellLinkConfig::default());
    link.run(Duration::from_secs(30)).expect("no error");
    assert!(!silent_at_a(&mut link));
    let b_silent = std::iter::from_fn(|| link.b.poll_event())
        .any(|e| matches!(e, SessionEvent::Carrier(CellLinkEvent::Silent)));
    assert!(!b_silent);
    for side in [link.a.carrier(), link.b.carrier()] {
        let beats = side.expect("up").stats().heartbeats_out;
        // One a second, less the first.
        assert!((25..=31).contains(&beats), "{beats} heartbeats");
    }
}

#[test]
fn a_busy_link_sends_no_heartbeat() {
    let mut link = relays_up(CellLinkConfig::default());
    for i in 0..100 {
        send_from_a(&mut link, i * 2..i * 2 + 2);
        link.run(Duration::from_millis(100)).expect("no error");
    }
    let a = link.a.carrier().expect("up").stats();
    assert_eq!(a.cells_out, 200);
    assert!(a.heartbeats_out <= 1, "{a:?}");
}

#[test]
fn a_dead_peer_is_reported_once_within_its_silence_limit() {
    let mut link = relays_up(CellLinkConfig::default());
    link.run(Duration::from_secs(3)).expect("no error");
    assert!(!silent_at_a(&mut link));
    // b last spoke within a heartbeat (1 s) of dying: a reports it 4 to
    // 5 s after.
    link.b_dead = true;
    link.run(Duration::from_millis(3_900)).expect("no error");
    assert!(!silent_at_a(&mut link), "reported before 4 s of silence");
    link.run(Duration::from_millis(1_200)).expect("no error");
    assert!(
        silent_at_a(&mut link),
        "not reported after 5.1 s of silence"
    );
    link.run(Duration::from_secs(10)).expect("no error");
    assert!(!silent_at_a(&mut link), "reported twice");
}

//! Two DTLS sessions joined in simulated time (10 ms each way): relays
//! prove their identities, clients stay anonymous, a wrong identity ends
//! the session, and a tampered record is dropped without harm.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_dtls::Error;
use onionlab_utcp::{LaneConfig, Session, SessionConfig, SessionEvent, Settings};
use tor_llcrypto::pk::ed25519::{Ed25519Identity, Keypair};

fn keypair(seed: u8) -> Arc<Keypair> {
    Arc::new(Keypair::from_bytes(&[seed; 32]))
}

fn identity(k: &Keypair) -> Ed25519Identity {
    Ed25519Identity::from(k.verifying_key())
}

fn config(identity: Option<Arc<Keypair>>, expect: Option<Ed25519Identity>) -> SessionConfig {
    SessionConfig {
        carrier: LaneConfig::new(Settings::default()),
        datagram: 1280,
        identity,
        expect_peer: expect,
        handshake_timeout: Duration::from_secs(10),
        certificate: None,
    }
}

/// Changes a datagram from a to b, given its index among a's datagrams.
type Tamper = Box<dyn FnMut(usize, &mut Vec<u8>)>;

struct Net {
    now: Instant,
    a: Session,
    b: Session,
    /// (arrival, to b?, datagram)
    flight: VecDeque<(Instant, bool, Vec<u8>)>,
    tamper: Option<Tamper>,
    sent_by_a: usize,
}

impl Net {
    fn new(a: SessionConfig, b: SessionConfig) -> Net {
        let now = Instant::now();
        Net {
            now,
            a: Session::initiate(a, 1, now).expect("initiate"),
            b: Session::respond(b, 2, now).expect("respond"),
            flight: VecDeque::new(),
            tamper: None,
            sent_by_a: 0,
        }
    }

    /// Run until `until`; the first error of either side ends it.
    fn run(&mut self, until: Instant) -> Result<(), (char, Error)> {
        loop {
            let delay = Duration::from_millis(10);
            while let Some(mut d) = self.a.poll_transmit() {
                if let Some(t) = self.tamper.as_mut() {
                    t(self.sent_by_a, &mut d);
                }
                self.sent_by_a += 1;
                self.flight.push_back((self.now + delay, true, d));
            }
            while let Some(d) = self.b.poll_transmit() {
                self.flight.push_back((self.now + delay, false, d));
            }
            let next = [
                self.flight.front().map(|f| f.0),
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
            while self.flight.front().is_some_and(|f| f.0 <= self.now) {
                let (_, to_b, d) = self.flight.pop_front().expect("front");
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

    fn events(s: &mut Session) -> Vec<SessionEvent> {
        std::iter::from_fn(|| s.poll_event()).collect()
    }
}

/// Relay `ka` (a, initiating) and relay `kb` (b), their handshake done.
fn relays_up(ka: &Arc<Keypair>, kb: &Arc<Keypair>) -> Net {
    let mut net = Net::new(
        config(Some(ka.clone()), Some(identity(kb))),
        config(Some(kb.clone()), None),
    );
    let t = net.now + Duration::from_millis(500);
    net.run(t).expect("handshake");
    net
}

/// Send `len` bytes on a new lane from a to b, and return what b read.
fn transfer(net: &mut Net, len: usize) -> Vec<u8> {
    let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
    let lane = net
        .a
        .carrier()
        .expect("authenticated")
        .open(net.now)
        .expect("lane");
    net.a.flush(net.now).expect("flush");
    let (mut sent, mut got) = (0, Vec::new());
    let deadline = net.now + Duration::from_secs(30);
    let mut buf = vec![0; 65536];
    while got.len() < len {
        assert!(net.now < deadline, "transfer stuck at {} bytes", got.len());
        let now = net.now;
        if sent < len {
            sent += net
                .a
                .carrier()
                .expect("mux")
                .send(lane, &data[sent..], now)
                .expect("send");
            net.a.flush(now).expect("flush");
        }
        if let Some(mux) = net.b.carrier() {
            if mux.lane_state(lane).is_some() {
                let n = mux.recv(lane, &mut buf, now).expect("recv");
                got.extend_from_slice(&buf[..n]);
            }
        }
        net.b.flush(now).expect("flush");
        let step = net.now + Duration::from_millis(5);
        net.run(step).expect("no error");
    }
    assert_eq!(got, data);
    got
}

#[test]
fn relays_prove_their_identities_and_carry_lanes() {
    let (ka, kb) = (keypair(1), keypair(2));
    let mut net = relays_up(&ka, &kb);
    assert_eq!(
        Net::events(&mut net.a),
        [SessionEvent::Authenticated(Some(identity(&kb)))]
    );
    assert_eq!(
        Net::events(&mut net.b),
        [SessionEvent::Authenticated(Some(identity(&ka)))]
    );
    transfer(&mut net, 256 * 1024);
}

#[test]
fn a_client_stays_anonymous() {
    let kb = keypair(2);
    let mut net = Net::new(
        config(None, Some(identity(&kb))),
        config(Some(kb.clone()), None),
    );
    let t = net.now + Duration::from_millis(500);
    net.run(t).expect("handshake");
    assert_eq!(Net::events(&mut net.b), [SessionEvent::Authenticated(None)]);
    assert_eq!(net.b.peer(), Some(None));
    transfer(&mut net, 32 * 1024);
}

#[test]
fn a_relay_with_the_wrong_identity_is_refused() {
    let (kb, other) = (keypair(2), keypair(3));
    let mut net = Net::new(config(None, Some(identity(&other))), config(Some(kb), None));
    let t = net.now + Duration::from_millis(500);
    match net.run(t) {
        Err(('a', Error::WrongIdentity { got, expected })) => {
            assert_eq!((got, expected), (identity(&keypair(2)), identity(&other)))
        }
        other => panic!("the wrong identity was accepted: {other:?}"),
    }
    assert!(net.a.carrier().is_none(), "lanes without authentication");
}

#[test]
fn lost_first_datagrams_are_sent_again() {
    let (ka, kb) = (keypair(1), keypair(2));
    let mut net = Net::new(
        config(Some(ka.clone()), Some(identity(&kb))),
        config(Some(kb.clone()), None),
    );
    // Lose a's third and fourth datagrams (after its two ClientHellos):
    // its handshake's end and its AUTH, which DTLS does not resend.
    net.tamper = Some(Box::new(|i, d| {
        if (2..=3).contains(&i) {
            d.clear();
            d.extend_from_slice(&[0x17]);
        }
    }));
    let t = net.now + Duration::from_secs(8);
    net.run(t).expect("recovers");
    assert_eq!(net.b.peer(), Some(Some(identity(&ka))));
    assert_eq!(net.a.peer(), Some(Some(identity(&kb))));
    transfer(&mut net, 16 * 1024);
}

#[test]
fn a_peer_that_never_authenticates_ends_the_session() {
    let kb = keypair(2);
    let mut net = Net::new(config(None, Some(identity(&kb))), config(Some(kb), None));
    // Everything from a after its first two datagrams is lost.
    net.tamper = Some(Box::new(|i, d| {
        if i >= 2 {
            d.clear();
            d.extend_from_slice(&[0x17]);
        }
    }));
    let t = net.now + Duration::from_secs(30);
    match net.run(t) {
        Err((_, Error::Auth(why) | Error::Dtls(why))) => {
            assert!(why.contains("timeout") || why.contains("Timeout"), "{why}")
        }
        other => panic!("the session did not end: {other:?}"),
    }
}

#[test]
fn a_tampered_record_is_dropped_and_the_lane_recovers() {
    let kb = keypair(2);
    let mut net = Net::new(
        config(None, Some(identity(&kb))),
        config(Some(kb.clone()), None),
    );
    // Flip a byte in every 25th datagram after the handshake's first ten.
    net.tamper = Some(Box::new(|i, d| {
        if i > 10 && i % 25 == 0 {
            let last = d.len() - 1;
            d[last] ^= 0x40;
        }
    }));
    let t = net.now + Duration::from_millis(500);
    net.run(t).expect("handshake");
    transfer(&mut net, 128 * 1024);
    assert!(
        net.sent_by_a > 60,
        "too few datagrams to tamper with: {}",
        net.sent_by_a
    );
    // Garbage from anywhere is not a session error either.
    net.b
        .handle_datagram(&[0x17, 0xfe, 0xfd, 1, 2, 3], net.now)
        .expect("garbage is dropped");
}

/// After authentication, plaintext records (only epoch 0's handshake
/// messages are sent so) are dropped and counted: a forged ClientHello
/// from the peer's address would otherwise be taken for a renegotiation
/// and end the session.
#[test]
fn plaintext_records_after_authentication_are_dropped() {
    let (ka, kb) = (keypair(1), keypair(2));
    let mut net = relays_up(&ka, &kb);
    // A ClientHello of another session, as a forger would send it.
    let now = net.now;
    let mut other = Session::initiate(config(None, Some(identity(&kb))), 9, now).expect("other");
    let mut at = now;
    let hello = loop {
        if let Some(d) = other.poll_transmit() {
            break d;
        }
        at = other.poll_timeout().expect("timer").max(at);
        other.handle_timeout(at).expect("timer");
    };
    net.b
        .handle_datagram(&hello, now)
        .expect("dropped, not fatal");
    net.a
        .handle_datagram(&hello, now)
        .expect("dropped, not fatal");
    assert_eq!(net.b.stale_plaintext_dropped(), 1);
    assert_eq!(net.a.stale_plaintext_dropped(), 1);
    transfer(&mut net, 64 * 1024);
}

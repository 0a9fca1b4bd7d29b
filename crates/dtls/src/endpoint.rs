//! Many peers' [`Session`]s on one UDP socket, sans-IO: datagrams are
//! sorted to sessions by their source address, and a datagram from an
//! unknown address opens a session only if the endpoint accepts them, it
//! is a DTLS ClientHello, and the handshake limits allow.
//!
//! A dtls-utcp relay runs two endpoints: one on its advertised UDP port
//! that accepts sessions, one on an ephemeral port for the sessions it
//! opens. So every session has its own address pair, and two relays may
//! have a session each way at once (as tor may have two channels). A
//! datagram relay (mUDP-OR, MORE) runs one endpoint for all its peers, as
//! the paper's one socket: there two relays that dial each other at the
//! same moment share one address pair, and a rule picks one dial (see
//! [Crossed dials](#crossed-dials)). A client runs one endpoint that
//! accepts nothing.
//!
//! # Crossed dials
//!
//! A ClientHello from a relay we are dialling and whose session is not
//! authenticated yet means it dialled us at the same moment. The relay
//! with the smaller identity keeps its dial and ignores the other's
//! ClientHellos; the other drops its own dial and answers the peer's as
//! any responder, once the peer proved its address with a cookie (so a
//! forged ClientHello cannot make a relay drop a dial). The winner's
//! ClientHello reaches the loser in the same round trip, so one session
//! comes up. Without the rule each ClientHello went into the other's
//! client-side handshake, and both stalled until their handshake timeout.
//! The loser reports the session as the peer's
//! ([`EndpointEvent::Authenticated`]'s `dialled` is false; its identity
//! was not checked against the dialled one: the caller does that). A
//! `HELLO` of the loser's dropped dial still on its way cannot restart
//! the new session: a `HELLO` restarts an authenticated session only
//! after a bare ClientHello got a `RETRY` since it came up.
//!
//! # Address validation and handshake limits
//!
//! A session object (dimpl's state, the identity exchange) is made only
//! for a peer that proved it receives at its source address, with a
//! stateless cookie exchange in front of DTLS, as QUIC's Retry:
//!
//! - A ClientHello from an unknown address gets `RETRY`: the byte
//!   [`RETRY`], then a 16-byte cookie, the HMAC-SHA256 (truncated) of the
//!   peer's address and the current 10-second window under a secret of
//!   this endpoint. Nothing is kept; the answer is 17 bytes, far shorter
//!   than a ClientHello, so it amplifies nothing.
//! - The initiator then sends every ClientHello of that session as
//!   `HELLO`: the byte [`HELLO`], the cookie, the ClientHello. A `HELLO`
//!   whose cookie matches the sender's address in this window or the one
//!   before opens the session (if the limits allow); one that does not is
//!   counted and answered with a fresh `RETRY` (the initiator replaces
//!   its cookie; a forged `RETRY` sent to it is so corrected).
//! - The first bytes tell the kinds apart: DTLS records start with 20 to
//!   63 (RFC 9147, section 4.1), the two messages above with 0xf0 and 0xf1.
//!
//! dimpl then asks for its own cookie (a HelloRetryRequest) as well: a
//! session costs two round trips before the DTLS handshake proper.
//!
//! With forged sources ruled out, the limits bound what real peers can
//! hold: one session per address pair; at most
//! [`EndpointConfig::max_handshakes`] sessions whose peer has not proven
//! itself yet (a ClientHello beyond is refused and its sender tries again
//! on its DTLS retransmission timer); at most
//! [`EndpointConfig::max_sessions`] in all. Every session of a relay's
//! endpoint shares the endpoint's DTLS certificate (no key generation per
//! handshake; a client's sessions each get a fresh one, so that relays
//! cannot link them). A datagram from an unknown address that is neither
//! is dropped unanswered. One IP address may hold at most
//! [`EndpointConfig::max_handshakes_per_ip`] of the half-open sessions, so
//! one host with many ports cannot take them all for a handshake timeout.
//! Each refusal is counted in [`EndpointStats`].

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Instant;

use tor_llcrypto::pk::ed25519::Ed25519Identity;

use crate::{Carrier, Certificate, Error, Session, SessionConfig, SessionEvent};

/// Default [`EndpointConfig::max_sessions`].
pub const DEFAULT_MAX_SESSIONS: usize = 4096;
/// Default [`EndpointConfig::max_handshakes`].
pub const DEFAULT_MAX_HANDSHAKES: usize = 256;
/// Default [`EndpointConfig::max_handshakes_per_ip`]: an eighth of the
/// half-open slots (a network of relays sharing one address, as on
/// loopback, still starts: a refused ClientHello is sent again on its
/// retransmission timer).
pub const DEFAULT_MAX_HANDSHAKES_PER_IP: usize = 32;
/// First byte of a `RETRY` (see the module docs).
pub const RETRY: u8 = 0xf0;
/// First byte of a `HELLO` (see the module docs).
pub const HELLO: u8 = 0xf1;
/// Cookie bytes in `RETRY` and `HELLO`.
pub const COOKIE_LEN: usize = 16;
/// How long a cookie's window lasts; a cookie is good in its window and
/// the next.
pub const COOKIE_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);
/// How an endpoint runs its sessions.
pub struct EndpointConfig<C: Carrier> {
    /// Every session's settings (`expect_peer` is set per connection;
    /// without a certificate the endpoint makes one).
    pub session: SessionConfig<C>,
    /// Whether peers may open sessions to this endpoint (a relay's
    /// advertised port); needs `session.identity`.
    pub accept: bool,
    /// Sessions at most, open or opening.
    pub max_sessions: usize,
    /// Half-open sessions at most (see the module docs).
    pub max_handshakes: usize,
    /// Half-open sessions from one IP address at most.
    pub max_handshakes_per_ip: usize,
}

// Not derived: a derive would ask `C: Clone` of the carrier itself.
impl<C: Carrier> Clone for EndpointConfig<C> {
    fn clone(&self) -> Self {
        EndpointConfig {
            session: self.session.clone(),
            accept: self.accept,
            max_sessions: self.max_sessions,
            max_handshakes: self.max_handshakes,
            max_handshakes_per_ip: self.max_handshakes_per_ip,
        }
    }
}

/// What an endpoint reports; `E` is its carrier's event.
#[derive(Debug)]
pub enum EndpointEvent<E> {
    /// The session with `peer` is authenticated both ways: a relay's
    /// proven identity, or `None` for a client. Its carrier runs.
    Authenticated {
        /// The peer's address.
        peer: SocketAddr,
        /// Its identity.
        identity: Option<Ed25519Identity>,
        /// Whether we dialled this session. `false` after a crossed dial
        /// we gave up (see the module docs): the session is the peer's,
        /// its identity is not checked against the one we dialled, and
        /// the caller decides whether it stands for our dial.
        dialled: bool,
    },
    /// The carrier of the session with `peer` reports.
    Carrier {
        /// The peer's address.
        peer: SocketAddr,
        /// What.
        event: E,
    },
    /// The session with `peer` ended and is forgotten.
    Closed {
        /// The peer's address.
        peer: SocketAddr,
        /// Why.
        error: Error,
    },
}

/// What an endpoint refused or dropped, since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Sessions peers opened that were accepted (first datagram taken).
    pub sessions_accepted: u64,
    /// `RETRY`s sent (ClientHellos without a cookie).
    pub retries_sent: u64,
    /// `HELLO`s whose cookie did not match their source and time.
    pub bad_cookies: u64,
    /// ClientHellos with a good cookie refused by the limits.
    pub handshakes_refused: u64,
    /// Datagrams from unknown addresses that were neither a ClientHello
    /// nor a `HELLO`.
    pub stray_datagrams: u64,
    /// Sessions that ended with an error.
    pub sessions_failed: u64,
    /// Dials of ours dropped for the peer's, which crossed them (see the
    /// module docs).
    pub dials_yielded: u64,
}

struct Entry<C: Carrier> {
    session: Session<C>,
    authenticated: bool,
    /// A session we initiated: the peer's cookie once it sent `RETRY`
    /// (our ClientHellos then go as `HELLO`), and our last ClientHello,
    /// sent again at once when the cookie comes.
    cookie: Option<[u8; COOKIE_LEN]>,
    last_hello: Option<Vec<u8>>,
    initiated: bool,
    /// The identity a session we initiated expects.
    dialled: Option<Ed25519Identity>,
    /// Whether we sent a `RETRY` to a ClientHello from the peer since
    /// this session was authenticated: only then does a `HELLO` restart
    /// it (a peer that starts over sends a bare ClientHello first), so a
    /// `HELLO` of the peer's crossed dial still on its way, made with a
    /// cookie from before, cannot end the session that replaced that
    /// dial.
    restart_invited: bool,
}

/// The sessions of one UDP socket (see the module docs).
pub struct Endpoint<C: Carrier> {
    config: EndpointConfig<C>,
    sessions: HashMap<SocketAddr, Entry<C>>,
    out: VecDeque<(SocketAddr, Vec<u8>)>,
    events: VecDeque<EndpointEvent<C::Event>>,
    next_seed: u64,
    stats: EndpointStats,
    cookie_key: ring::hmac::Key,
    /// The origin of the cookie windows.
    epoch: Instant,
    /// Our identity (relays), for crossed dials.
    identity: Option<Ed25519Identity>,
}

/// Whether `datagram` starts with a DTLS handshake record of epoch 0
/// holding a ClientHello: the only datagram that may open a session.
/// (Record: type 22, version 0xfeXX, epoch 0, sequence, length; then the
/// handshake message type, 1.)
pub fn is_client_hello(datagram: &[u8]) -> bool {
    let record_len = datagram
        .get(11..13)
        .map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])));
    datagram.len() >= MIN_CLIENT_HELLO
        && datagram[0] == 22
        && datagram[1] == 0xfe
        && datagram[3..5] == [0, 0]
        && datagram[13] == 1
        && record_len <= datagram.len() - 13
}

/// Shortest datagram taken for a ClientHello: a DTLS 1.3 ClientHello
/// (random, cipher suites, a key share) is longer, and anything shorter
/// would make the 17-byte `RETRY` an amplifier.
pub const MIN_CLIENT_HELLO: usize = 100;

impl<C: Carrier> Endpoint<C> {
    /// An endpoint with no sessions; `seed` seeds its sessions' carriers
    /// (dtls-utcp: the lanes' TCP initial sequence numbers).
    ///
    /// # Errors
    ///
    /// [`Error::Settings`] or [`Error::Carrier`] for settings out of range
    /// or an accepting endpoint without an identity; [`Error::Dtls`] if no
    /// certificate can be made.
    pub fn new(mut config: EndpointConfig<C>, seed: u64, now: Instant) -> Result<Self, Error> {
        config.session.check()?;
        if config.accept && config.session.identity.is_none() {
            return Err(Error::Settings("only relays accept sessions".into()));
        }
        if config.max_sessions == 0
            || config.max_handshakes == 0
            || config.max_handshakes_per_ip == 0
        {
            return Err(Error::Settings(
                "max_sessions, max_handshakes and max_handshakes_per_ip must be positive".into(),
            ));
        }
        // A relay's sessions share one certificate (its identity is public
        // anyway); a client's each get a fresh one, so relays cannot link
        // its sessions by certificate.
        if config.session.certificate.is_none() && config.session.identity.is_some() {
            config.session.certificate = Some(Certificate::generate()?);
        }
        config.session.expect_peer = None;
        let identity = config
            .session
            .identity
            .as_ref()
            .map(|k| Ed25519Identity::from(k.verifying_key()));
        let rng = ring::rand::SystemRandom::new();
        let cookie_key = ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &rng)
            .map_err(|_| Error::Dtls("no randomness for the cookie secret".into()))?;
        Ok(Endpoint {
            config,
            sessions: HashMap::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            next_seed: seed,
            stats: EndpointStats::default(),
            cookie_key,
            epoch: now,
            identity,
        })
    }

    fn seed(&mut self) -> u64 {
        self.next_seed = self.next_seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        self.next_seed
    }

    /// Open a session to the relay at `peer`, which must prove `expect`.
    ///
    /// # Errors
    ///
    /// [`Error::SessionExists`] if there is one with `peer` already,
    /// [`Error::TooManySessions`] at the limit, or the session's own
    /// errors.
    pub fn connect(
        &mut self,
        peer: SocketAddr,
        expect: Ed25519Identity,
        now: Instant,
    ) -> Result<(), Error> {
        if self.sessions.contains_key(&peer) {
            return Err(Error::SessionExists(peer));
        }
        if self.sessions.len() >= self.config.max_sessions {
            return Err(Error::TooManySessions(self.config.max_sessions));
        }
        let mut config = self.config.session.clone();
        config.expect_peer = Some(expect);
        let seed = self.seed();
        let session = Session::initiate(config, seed, now)?;
        let mut entry = Entry::new(session, true);
        entry.dialled = Some(expect);
        self.sessions.insert(peer, entry);
        self.collect(peer);
        Ok(())
    }

    /// Take a datagram from `from`. Never fails: a session's error ends
    /// that session ([`EndpointEvent::Closed`]); what no session takes is
    /// counted and dropped.
    pub fn handle_datagram(&mut self, from: SocketAddr, datagram: &[u8], now: Instant) {
        let restarting = self.config.accept
            && self.sessions.get(&from).is_some_and(|e| e.authenticated)
            && (is_client_hello(datagram) || datagram.first() == Some(&HELLO));
        if restarting {
            self.restart(from, datagram, now);
            return;
        }
        if let Some(entry) = self.sessions.get_mut(&from) {
            if datagram.first() == Some(&RETRY) {
                entry.on_retry(datagram, from, &mut self.out);
                return;
            }
            if self.config.accept && entry.crossed_by(datagram) {
                self.crossed_dial(from, datagram, now);
                return;
            }
            // A HELLO of a session still in its handshake (its cookie was
            // checked when the session began).
            let datagram = match datagram.first() {
                Some(&HELLO) => datagram.get(1 + COOKIE_LEN..).unwrap_or_default(),
                _ => datagram,
            };
            let result = entry.session.handle_datagram(datagram, now);
            self.finish(from, result);
            return;
        }
        if !self.config.accept {
            self.stats.stray_datagrams += 1;
            return;
        }
        if is_client_hello(datagram) {
            self.send_retry(from, now);
            return;
        }
        let Some(hello) = self.validated_hello(from, datagram, now) else {
            return;
        };
        if !self.has_room(from) {
            self.stats.handshakes_refused += 1;
            return;
        }
        let seed = self.seed();
        match Session::respond(self.config.session.clone(), seed, now) {
            Ok(s) => {
                self.sessions.insert(from, Entry::new(s, false));
                self.stats.sessions_accepted += 1;
            }
            Err(error) => {
                self.stats.sessions_failed += 1;
                self.events
                    .push_back(EndpointEvent::Closed { peer: from, error });
                return;
            }
        }
        if let Some(entry) = self.sessions.get_mut(&from) {
            let result = entry.session.handle_datagram(hello, now);
            self.finish(from, result);
        }
    }

    /// A ClientHello from a relay we are dialling: see [Crossed
    /// dials](self#crossed-dials).
    fn crossed_dial(&mut self, from: SocketAddr, datagram: &[u8], now: Instant) {
        let Some(entry) = self.sessions.get_mut(&from) else {
            return;
        };
        // An accepting endpoint has an identity (`new` checks) and a
        // dial its peer's, so both are known here.
        let ours_wins = match (self.identity, entry.dialled) {
            (Some(ours), Some(peer)) => ours.as_bytes() < peer.as_bytes(),
            _ => {
                debug_assert!(false, "a crossed dial without both identities");
                true
            }
        };
        if ours_wins {
            // The peer yields when our ClientHello reaches it.
            return;
        }
        if datagram.first() != Some(&HELLO) {
            self.send_retry(from, now);
            return;
        }
        if self.validated_hello(from, datagram, now).is_none() {
            return;
        }
        self.sessions.remove(&from);
        self.stats.dials_yielded += 1;
        self.handle_datagram(from, datagram, now);
    }

    /// A ClientHello from the address of an authenticated session: the
    /// peer began a new session (it dropped the old one, or restarted).
    /// Without a cookie it gets a `RETRY` (stateless, as any ClientHello);
    /// then a `HELLO` with a good cookie, which only the address's owner
    /// can have, ends the old session (reported) and the new one begins.
    /// A forged one harms nothing: the `RETRY` goes to the real peer,
    /// which ignores it. A `HELLO` before any such `RETRY` is dropped (a
    /// crossed dial's, see the module docs).
    fn restart(&mut self, from: SocketAddr, datagram: &[u8], now: Instant) {
        let Some(entry) = self.sessions.get_mut(&from) else {
            return;
        };
        if datagram.first() != Some(&HELLO) {
            entry.restart_invited = true;
            self.send_retry(from, now);
            return;
        }
        if !entry.restart_invited {
            // No RETRY of ours since the session came up asked for it.
            self.stats.stray_datagrams += 1;
            return;
        }
        if self.validated_hello(from, datagram, now).is_none() {
            return;
        }
        self.sessions.remove(&from);
        self.events.push_back(EndpointEvent::Closed {
            peer: from,
            error: Error::Auth("the peer began a new session from the same address".into()),
        });
        self.handle_datagram(from, datagram, now);
    }

    /// The ClientHello inside `datagram` if it is a `HELLO` whose cookie
    /// is good for `from` now (counted otherwise).
    fn validated_hello<'a>(
        &mut self,
        from: SocketAddr,
        datagram: &'a [u8],
        now: Instant,
    ) -> Option<&'a [u8]> {
        let (Some(&HELLO), Some(cookie), Some(hello)) = (
            datagram.first(),
            datagram.get(1..1 + COOKIE_LEN),
            datagram.get(1 + COOKIE_LEN..),
        ) else {
            self.stats.stray_datagrams += 1;
            return None;
        };
        let window = self.window(now);
        let good = [Some(window), window.checked_sub(1)]
            .into_iter()
            .flatten()
            .any(|w| same_bytes(&self.cookie(from, w), cookie));
        if !is_client_hello(hello) {
            self.stats.bad_cookies += 1;
            return None;
        }
        if !good {
            // Stale, or a forged RETRY misled the peer: a fresh cookie
            // (17 bytes, no amplification; nothing kept).
            self.stats.bad_cookies += 1;
            self.send_retry(from, now);
            return None;
        }
        Some(hello)
    }

    fn send_retry(&mut self, to: SocketAddr, now: Instant) {
        let mut retry = Vec::with_capacity(1 + COOKIE_LEN);
        retry.push(RETRY);
        retry.extend_from_slice(&self.cookie(to, self.window(now)));
        self.out.push_back((to, retry));
        self.stats.retries_sent += 1;
    }

    fn window(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.epoch);
        since.as_secs() / COOKIE_WINDOW.as_secs()
    }

    /// The cookie of `peer` in `window`.
    fn cookie(&self, peer: SocketAddr, window: u64) -> [u8; COOKIE_LEN] {
        let mut m = Vec::with_capacity(C::COOKIE_LABEL.len() + 8 + 16 + 2);
        m.extend_from_slice(C::COOKIE_LABEL);
        m.extend_from_slice(&window.to_be_bytes());
        match peer.ip() {
            std::net::IpAddr::V4(ip) => m.extend_from_slice(&ip.octets()),
            std::net::IpAddr::V6(ip) => m.extend_from_slice(&ip.octets()),
        }
        m.extend_from_slice(&peer.port().to_be_bytes());
        let tag = ring::hmac::sign(&self.cookie_key, &m);
        let mut out = [0u8; COOKIE_LEN];
        out.copy_from_slice(&tag.as_ref()[..COOKIE_LEN]);
        out
    }

    /// Room for one more session whose peer (at `from`) has not proven
    /// itself.
    fn has_room(&self, from: SocketAddr) -> bool {
        let (mut half_open, mut from_ip) = (0, 0);
        for (addr, e) in &self.sessions {
            if !e.authenticated {
                half_open += 1;
                from_ip += usize::from(addr.ip() == from.ip());
            }
        }
        self.sessions.len() < self.config.max_sessions
            && half_open < self.config.max_handshakes
            && from_ip < self.config.max_handshakes_per_ip
    }

    /// Run the timers due by `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        // A scan of every session: a relay has a few thousand peers at
        // most, and the caller runs this only when `poll_timeout` is due.
        let due: Vec<SocketAddr> = self
            .sessions
            .iter()
            .filter(|(_, e)| e.session.poll_timeout().is_some_and(|t| t <= now))
            .map(|(a, _)| *a)
            .collect();
        for peer in due {
            if let Some(e) = self.sessions.get_mut(&peer) {
                let result = e.session.handle_timeout(now);
                self.finish(peer, result);
            }
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.sessions
            .values()
            .filter_map(|e| e.session.poll_timeout())
            .min()
    }

    /// The next datagram to send, and where.
    pub fn poll_transmit(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
        self.out.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<EndpointEvent<C::Event>> {
        self.events.pop_front()
    }

    /// Run `f` on the carrier of the session with `peer` (once
    /// authenticated), then send what it produced. `None`: no such
    /// session, or not authenticated yet.
    pub fn with_carrier<R>(
        &mut self,
        peer: SocketAddr,
        now: Instant,
        f: impl FnOnce(&mut C) -> R,
    ) -> Option<R> {
        let entry = self.sessions.get_mut(&peer)?;
        let r = f(entry.session.carrier()?);
        let flushed = entry.session.flush(now);
        self.finish(peer, flushed);
        Some(r)
    }

    /// Forget the session with `peer` (without a word: the peer notices by
    /// its own timers); false if there was none.
    pub fn close(&mut self, peer: SocketAddr) -> bool {
        self.sessions.remove(&peer).is_some()
    }

    /// Sessions open or opening.
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Whether there is a session with `peer`, open or opening.
    pub fn has_session(&self, peer: SocketAddr) -> bool {
        self.sessions.contains_key(&peer)
    }

    /// Sessions from `ip` whose peer has not proven itself yet.
    pub fn half_open_from(&self, ip: std::net::IpAddr) -> usize {
        self.sessions
            .iter()
            .filter(|(a, e)| !e.authenticated && a.ip() == ip)
            .count()
    }

    /// Sessions whose peer has not proven itself yet.
    pub fn half_open(&self) -> usize {
        self.sessions.values().filter(|e| !e.authenticated).count()
    }

    /// The peer of the session with `peer`, once authenticated
    /// (`Some(None)`: a client).
    pub fn peer_identity(&self, peer: SocketAddr) -> Option<Option<Ed25519Identity>> {
        self.sessions.get(&peer)?.session.peer()
    }

    /// What was refused or dropped so far.
    pub fn stats(&self) -> EndpointStats {
        self.stats
    }

    /// After a call into `peer`'s session: collect its output, or end it.
    fn finish(&mut self, peer: SocketAddr, result: Result<(), Error>) {
        match result {
            Ok(()) => self.collect(peer),
            Err(error) => {
                // Whatever it produced last (an alert) still goes out.
                self.collect(peer);
                self.sessions.remove(&peer);
                self.stats.sessions_failed += 1;
                self.events.push_back(EndpointEvent::Closed { peer, error });
            }
        }
    }

    fn collect(&mut self, peer: SocketAddr) {
        let Some(entry) = self.sessions.get_mut(&peer) else {
            return;
        };
        while let Some(d) = entry.session.poll_transmit() {
            let d = entry.outgoing(d);
            self.out.push_back((peer, d));
        }
        while let Some(e) = entry.session.poll_event() {
            self.events.push_back(match e {
                SessionEvent::Authenticated(identity) => {
                    entry.authenticated = true;
                    EndpointEvent::Authenticated {
                        peer,
                        identity,
                        dialled: entry.initiated,
                    }
                }
                SessionEvent::Carrier(event) => EndpointEvent::Carrier { peer, event },
            });
        }
    }
}

impl<C: Carrier> Entry<C> {
    fn new(session: Session<C>, initiated: bool) -> Self {
        Entry {
            session,
            authenticated: false,
            cookie: None,
            last_hello: None,
            initiated,
            dialled: None,
            restart_invited: false,
        }
    }

    /// Whether `datagram` is the peer's ClientHello (bare or as `HELLO`)
    /// while our own dial to it is still handshaking.
    fn crossed_by(&self, datagram: &[u8]) -> bool {
        self.initiated
            && !self.authenticated
            && (datagram.first() == Some(&HELLO) || is_client_hello(datagram))
    }

    /// A datagram of ours on its way out: a ClientHello is remembered
    /// and, once the peer gave a cookie, wrapped as `HELLO`.
    fn outgoing(&mut self, d: Vec<u8>) -> Vec<u8> {
        if !self.initiated || !is_client_hello(&d) {
            return d;
        }
        self.last_hello = Some(d.clone());
        match self.cookie {
            Some(cookie) => hello_message(&cookie, &d),
            None => d,
        }
    }

    /// The peer's `RETRY` for a session we initiated and still
    /// handshaking: keep its cookie (a later one replaces it, so a forged
    /// RETRY is corrected by the peer's next one) and, the first time,
    /// send our last ClientHello again at once; later ones wait for
    /// dimpl's retransmission timer, so forged RETRYs cannot make us send
    /// a HELLO each. Anything else is dropped.
    fn on_retry(
        &mut self,
        datagram: &[u8],
        peer: SocketAddr,
        out: &mut VecDeque<(SocketAddr, Vec<u8>)>,
    ) {
        let Ok(cookie) = <[u8; COOKIE_LEN]>::try_from(&datagram[1..]) else {
            return;
        };
        if !self.initiated || self.authenticated {
            return;
        }
        let first = self.cookie.replace(cookie).is_none();
        if let (true, Some(hello)) = (first, &self.last_hello) {
            out.push_back((peer, hello_message(&cookie, hello)));
        }
    }
}

/// Whether `a` and `b` are equal, in time independent of where they
/// differ (ring's own comparison is deprecated for outside use).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `HELLO`: the marker, the cookie, the ClientHello.
fn hello_message(cookie: &[u8; COOKIE_LEN], hello: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(1 + COOKIE_LEN + hello.len());
    m.push(HELLO);
    m.extend_from_slice(cookie);
    m.extend_from_slice(hello);
    m
}

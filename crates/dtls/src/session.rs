//! One DTLS 1.3 session between two nodes, carrying a [`Carrier`]'s
//! messages, with the relay identities bound inside it. Sans-IO: fed
//! datagrams and time, it returns datagrams.
//!
//! DTLS is `dimpl` (pure Rust, sans-IO), which authenticates only with
//! ECDSA certificates. Each side presents a self-signed P-256
//! certificate (a relay's endpoint one for all its sessions, a client a
//! fresh one each); once the handshake is done, each sends one message
//! first:
//!
//! - a relay: `AUTH`, its Ed25519 identity and its signature over
//!   the carrier's [`Carrier::AUTH_LABEL`], its role (0: the session's
//!   initiator, 1: responder),
//!   the session's exported keying material and the SHA-256 of its own
//!   certificate then of the peer's: bound to this session, this
//!   direction and these two certificates;
//! - a client: `ANON` (no identity: clients stay anonymous).
//!
//! The initiator refuses the session unless the responder's `AUTH`
//! verifies with the identity it expected; the responder accepts `ANON`
//! (a client) or a verifying `AUTH` (a relay, whose identity it reports).
//! Carried messages before the peer's message are dropped (dtls-utcp's
//! TCP sends them again; a datagram link loses them).
//!
//! DTLS does not resend application data, so the first message is sent
//! again (after 250 ms, doubling up to 2 s) until the peer answers
//! `AUTH_OK`, which it sends for each copy it accepts; a session not
//! authenticated both ways within the handshake timeout ends.
//!
//! Every DTLS record carries one message: a type byte, then its body.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dimpl::{Config, Dtls, DtlsCertificate, Output};
use tor_llcrypto::pk::ed25519::{Ed25519Identity, Keypair, PublicKey, Signature};

use crate::{Carrier, Error, Role};

const MSG_AUTH: u8 = 1;
const MSG_ANON: u8 = 2;
/// A carrier's message (dtls-utcp: a TORTP segment; datagram: a cell).
const MSG_CARRIED: u8 = 3;
const MSG_AUTH_OK: u8 = 4;
/// First wait before the first message is sent again.
const FIRST_RESEND: Duration = Duration::from_millis(250);
/// Longest wait between copies of the first message.
const MAX_RESEND: Duration = Duration::from_secs(2);
/// `AUTH`: type, identity, signature.
const AUTH_LEN: usize = 1 + 32 + 64;
/// Bytes of a datagram's DTLS 1.3 record header and tag, and our type byte.
pub const RECORD_OVERHEAD: usize = 5 + 1 + 16 + 1;

/// How a session starts.
pub struct SessionConfig<C: Carrier> {
    /// The carrier's settings. Its messages must fit one record of one
    /// datagram: at most `datagram - RECORD_OVERHEAD` bytes.
    pub carrier: C::Config,
    /// Largest UDP payload sent.
    pub datagram: usize,
    /// Our identity (relays); `None`: a client, which only initiates.
    pub identity: Option<Arc<Keypair>>,
    /// The identity the responder must prove (set when initiating).
    pub expect_peer: Option<Ed25519Identity>,
    /// Give up a handshake after this long.
    pub handshake_timeout: Duration,
    /// The DTLS certificate to present (`None`: a fresh one for this
    /// session). A relay's endpoint makes one and shares it among its
    /// sessions: the identity binding covers each session's keying
    /// material, so a shared certificate binds as well, and a session then
    /// costs no key generation (a flood of handshakes would otherwise buy
    /// one each). A client's sessions each present a fresh one (unlinkable).
    pub certificate: Option<Certificate>,
}

// Not derived: a derive would ask `C: Clone` of the carrier itself.
impl<C: Carrier> Clone for SessionConfig<C> {
    fn clone(&self) -> Self {
        SessionConfig {
            carrier: self.carrier.clone(),
            datagram: self.datagram,
            identity: self.identity.clone(),
            expect_peer: self.expect_peer,
            handshake_timeout: self.handshake_timeout,
            certificate: self.certificate.clone(),
        }
    }
}

impl<C: Carrier> SessionConfig<C> {
    /// Check the settings: the datagram holds a record, and the carrier's
    /// messages fit one.
    ///
    /// # Errors
    ///
    /// [`Error::Settings`] or [`Error::Carrier`].
    pub fn check(&self) -> Result<(), Error> {
        let Some(max_message) = self
            .datagram
            .checked_sub(RECORD_OVERHEAD)
            .filter(|&m| m > 0)
        else {
            return Err(Error::Settings(format!(
                "a {}-byte datagram holds no record",
                self.datagram
            )));
        };
        C::check(&self.carrier, max_message).map_err(|e| Error::Carrier(e.to_string()))
    }
}

/// A self-signed P-256 certificate and its key, for DTLS.
#[derive(Clone, Debug)]
pub struct Certificate(DtlsCertificate);

impl Certificate {
    /// A fresh one.
    ///
    /// # Errors
    ///
    /// [`Error::Dtls`] if the key or certificate cannot be made.
    pub fn generate() -> Result<Certificate, Error> {
        session_certificate().map(Certificate)
    }
}

/// What a session reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionEvent<E> {
    /// The peer proved its identity (`Some`) or is a client (`None`); the
    /// carrier runs from now on.
    Authenticated(Option<Ed25519Identity>),
    /// The carrier's event.
    Carrier(E),
}

/// One peer's DTLS session and its carrier (see the module docs).
pub struct Session<C: Carrier> {
    dtls: Dtls,
    role: Role,
    config: SessionConfig<C>,
    own_cert_hash: [u8; 32],
    peer_cert_hash: Option<[u8; 32]>,
    keying: Option<Vec<u8>>,
    connected: bool,
    /// Our first message, once sent; and when to send it again (`None`
    /// once the peer acknowledged it).
    first: Option<Vec<u8>>,
    resend_at: Option<Instant>,
    resend_wait: Duration,
    /// The session must be authenticated both ways by then.
    auth_deadline: Instant,
    /// The peer's first message as accepted (a copy is acknowledged
    /// again; anything else is an error).
    peer_first: Option<Vec<u8>>,
    peer: Option<Option<Ed25519Identity>>,
    malformed_messages: u64,
    carrier: Option<C>,
    seed: u64,
    dtls_timeout: Option<Instant>,
    out: VecDeque<Vec<u8>>,
    events: VecDeque<SessionEvent<C::Event>>,
    early_messages_dropped: u64,
    stale_plaintext_dropped: u64,
    buf: Vec<u8>,
}

fn sha256(data: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// A fresh self-signed P-256 certificate for one session.
fn session_certificate() -> Result<DtlsCertificate, Error> {
    let dtls = |e: rcgen::Error| Error::Dtls(format!("making a session certificate: {e}"));
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(dtls)?;
    let cert = rcgen::CertificateParams::new(Vec::<String>::new())
        .map_err(dtls)?
        .self_signed(&key)
        .map_err(dtls)?;
    Ok(DtlsCertificate {
        certificate: cert.der().to_vec(),
        private_key: key.serialize_der(),
    })
}

impl<C: Carrier> Session<C> {
    /// Begin a session to a peer (we send the first flight); `seed` goes
    /// to the carrier (take it from a CSPRNG outside tests).
    ///
    /// # Errors
    ///
    /// [`Error::Settings`] without the identity to expect, or settings out
    /// of range; [`Error::Dtls`] if DTLS cannot start.
    pub fn initiate(config: SessionConfig<C>, seed: u64, now: Instant) -> Result<Self, Error> {
        if config.expect_peer.is_none() {
            return Err(Error::Settings(
                "a session is initiated to a relay whose identity is known".into(),
            ));
        }
        Session::new(config, Role::Initiator, seed, now)
    }

    /// Answer a session a peer began (its first datagram comes next).
    ///
    /// # Errors
    ///
    /// [`Error::Settings`] without an identity of our own, or settings out
    /// of range; [`Error::Dtls`] if DTLS cannot start.
    pub fn respond(config: SessionConfig<C>, seed: u64, now: Instant) -> Result<Self, Error> {
        if config.identity.is_none() {
            return Err(Error::Settings("only relays accept sessions".into()));
        }
        Session::new(config, Role::Responder, seed, now)
    }

    fn new(config: SessionConfig<C>, role: Role, seed: u64, now: Instant) -> Result<Self, Error> {
        config.check()?;
        let dtls_config = Config::builder()
            .mtu(config.datagram)
            // Full queues are fatal in dimpl; we drain after every call.
            .max_queue_rx(1024)
            .max_queue_tx(1024)
            .handshake_timeout(config.handshake_timeout)
            .build()
            .map_err(|e| Error::Dtls(format!("{e:?}")))?;
        let cert = match &config.certificate {
            Some(c) => c.0.clone(),
            None => session_certificate()?,
        };
        let own_cert_hash = sha256(&cert.certificate);
        let mut dtls = Dtls::new_13(Arc::new(dtls_config), cert, now);
        if role == Role::Initiator {
            dtls.set_active(true);
        }
        let auth_deadline = now + config.handshake_timeout;
        let mut s = Session {
            dtls,
            role,
            config,
            own_cert_hash,
            peer_cert_hash: None,
            keying: None,
            connected: false,
            first: None,
            resend_at: None,
            resend_wait: FIRST_RESEND,
            auth_deadline,
            peer_first: None,
            peer: None,
            malformed_messages: 0,
            carrier: None,
            seed,
            dtls_timeout: None,
            out: VecDeque::new(),
            events: VecDeque::new(),
            early_messages_dropped: 0,
            stale_plaintext_dropped: 0,
            buf: vec![0; 2048],
        };
        s.pump(now)?;
        Ok(s)
    }

    /// Take a datagram from the peer. An error ends the session.
    ///
    /// Once the peer is authenticated, a datagram that starts with a
    /// plaintext record (content types 20 to 26: only epoch 0's handshake
    /// messages are sent so) is dropped and counted: an honest peer sends
    /// none any more, and dimpl would take a forged ClientHello for a
    /// renegotiation and end the session, so anyone who knows the address
    /// pair could end it with one datagram.
    pub fn handle_datagram(&mut self, datagram: &[u8], now: Instant) -> Result<(), Error> {
        if self.peer.is_some() && datagram.first().is_some_and(|b| (20..=26).contains(b)) {
            self.stale_plaintext_dropped += 1;
            return Ok(());
        }
        self.dtls
            .handle_timeout(now)
            .map_err(|e| Error::Dtls(format!("{e:?}")))?;
        self.dtls
            .handle_packet(datagram)
            .map_err(|e| Error::Dtls(format!("{e:?}")))?;
        self.pump(now)
    }

    /// Run the timers due by `now` (DTLS retransmissions, the carrier's
    /// timers). An error ends the session.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), Error> {
        self.dtls
            .handle_timeout(now)
            .map_err(|e| Error::Dtls(format!("{e:?}")))?;
        if let Some(carrier) = self.carrier.as_mut() {
            carrier.handle_timeout(now);
        }
        let authenticated = self.peer.is_some() && self.resend_at.is_none() && self.first.is_some();
        if !authenticated && now >= self.auth_deadline {
            return Err(Error::Auth(
                "not authenticated both ways within the handshake timeout".into(),
            ));
        }
        if let (Some(at), Some(first)) = (self.resend_at, self.first.clone()) {
            if now >= at {
                self.send_record(&first)?;
                self.resend_wait = (self.resend_wait * 2).min(MAX_RESEND);
                self.resend_at = Some(now + self.resend_wait);
            }
        }
        self.pump(now)
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let carrier = self.carrier.as_ref().and_then(C::poll_timeout);
        let authenticated = self.peer.is_some() && self.resend_at.is_none() && self.first.is_some();
        let deadline = (!authenticated).then_some(self.auth_deadline);
        [self.dtls_timeout, carrier, self.resend_at, deadline]
            .into_iter()
            .flatten()
            .min()
    }

    /// The next datagram to send to the peer.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.out.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<SessionEvent<C::Event>> {
        self.events.pop_front()
    }

    /// The carrier, once the peer is authenticated. After calling into
    /// it, call [`flush`](Self::flush) to send what it produced.
    pub fn carrier(&mut self) -> Option<&mut C> {
        self.carrier.as_mut()
    }

    /// Send what the carrier produced since the last call.
    pub fn flush(&mut self, now: Instant) -> Result<(), Error> {
        self.pump(now)
    }

    /// The peer, once authenticated: `Some(identity)` for a relay,
    /// `Some(None)` for a client.
    pub fn peer(&self) -> Option<Option<Ed25519Identity>> {
        self.peer
    }

    /// Carried messages that arrived before the peer's identity and were
    /// dropped.
    pub fn early_messages_dropped(&self) -> u64 {
        self.early_messages_dropped
    }

    /// Plaintext records after authentication, dropped (see
    /// [`handle_datagram`](Self::handle_datagram)).
    pub fn stale_plaintext_dropped(&self) -> u64 {
        self.stale_plaintext_dropped
    }

    /// Messages from the authenticated peer that the carrier refused as
    /// malformed, dropped.
    pub fn malformed_messages(&self) -> u64 {
        self.malformed_messages
    }

    /// Move everything along: DTLS output, our first message, the
    /// carrier's messages into records.
    fn pump(&mut self, now: Instant) -> Result<(), Error> {
        loop {
            self.drain_dtls(now)?;
            if self.connected && self.first.is_none() {
                if self.keying.is_none() {
                    return Err(Error::Dtls("no keying material exported".into()));
                }
                let msg = self.first_message()?;
                self.send_record(&msg)?;
                self.first = Some(msg);
                self.resend_at = Some(now + self.resend_wait);
                continue;
            }
            let mut sent = false;
            while let Some(carried) = self.carrier.as_mut().and_then(C::poll_message) {
                let mut msg = Vec::with_capacity(1 + carried.len());
                msg.push(MSG_CARRIED);
                msg.extend_from_slice(&carried);
                // Each record drained at once: dimpl's queues are finite
                // and a full one ends the session.
                self.send_record(&msg)?;
                self.drain_dtls(now)?;
                sent = true;
            }
            if let Some(carrier) = self.carrier.as_mut() {
                while let Some(e) = carrier.poll_event() {
                    self.events.push_back(SessionEvent::Carrier(e));
                }
            }
            if !sent {
                return self.drain_dtls(now);
            }
        }
    }

    fn send_record(&mut self, msg: &[u8]) -> Result<(), Error> {
        self.dtls
            .send_application_data(msg)
            .map(|_| ())
            .map_err(|e| Error::Dtls(format!("{e:?}")))
    }

    /// Everything dimpl has for us, up to its timer.
    fn drain_dtls(&mut self, now: Instant) -> Result<(), Error> {
        loop {
            let mut messages = Vec::new();
            match self.dtls.poll_output(&mut self.buf) {
                Output::Packet(p) => self.out.push_back(p.to_vec()),
                Output::BufferTooSmall { needed } => self.buf.resize(needed, 0),
                Output::Timeout(t) => {
                    self.dtls_timeout = Some(t);
                    return Ok(());
                }
                Output::Connected => self.connected = true,
                // Trusted only once Connected: dimpl reports it before
                // the handshake's signature is checked; never replaced.
                Output::PeerCert(der) if !self.connected => {
                    self.peer_cert_hash = Some(sha256(der));
                }
                Output::KeyingMaterial(k, _) => self.keying = Some(k.to_vec()),
                Output::ApplicationData(m) => messages.push(m.to_vec()),
                Output::CloseNotify => {
                    return Err(Error::Dtls("the peer closed the session".into()))
                }
                _ => {}
            }
            for m in messages {
                self.on_message(&m, now)?;
            }
        }
    }

    /// What a message signed by the `signer` role covers.
    fn signed_content(&self, signer: Role, signer_cert: &[u8; 32], other: &[u8; 32]) -> Vec<u8> {
        let mut m = Vec::with_capacity(C::AUTH_LABEL.len() + 1 + 88 + 64);
        m.extend_from_slice(C::AUTH_LABEL);
        m.push(u8::from(signer == Role::Responder));
        m.extend_from_slice(self.keying.as_deref().unwrap_or_default());
        m.extend_from_slice(signer_cert);
        m.extend_from_slice(other);
        m
    }

    fn first_message(&self) -> Result<Vec<u8>, Error> {
        let Some(keypair) = self.config.identity.as_ref() else {
            return Ok(vec![MSG_ANON]);
        };
        let peer_cert = self
            .peer_cert_hash
            .ok_or_else(|| Error::Dtls("connected without the peer's certificate".into()))?;
        let content = self.signed_content(self.role, &self.own_cert_hash, &peer_cert);
        let sig = keypair.sign(&content);
        let mut msg = Vec::with_capacity(AUTH_LEN);
        msg.push(MSG_AUTH);
        msg.extend_from_slice(keypair.verifying_key().as_bytes());
        msg.extend_from_slice(&sig.to_bytes());
        Ok(msg)
    }

    fn on_message(&mut self, msg: &[u8], now: Instant) -> Result<(), Error> {
        let Some((&kind, body)) = msg.split_first() else {
            return Err(Error::Auth("an empty record".into()));
        };
        match (kind, self.peer.is_some()) {
            (MSG_CARRIED, true) => {
                // A carried message shows the peer accepted our first one.
                self.resend_at = None;
                if let Some(carrier) = self.carrier.as_mut() {
                    // Only the authenticated peer can send a malformed
                    // message; the carrier drops it and goes on.
                    if carrier.handle_message(body, now).is_err() {
                        self.malformed_messages += 1;
                    }
                }
                Ok(())
            }
            (MSG_CARRIED, false) => {
                self.early_messages_dropped += 1;
                Ok(())
            }
            (MSG_AUTH_OK, _) if body.is_empty() && self.first.is_some() => {
                self.resend_at = None;
                Ok(())
            }
            (MSG_AUTH | MSG_ANON, true) => {
                // A copy of the first message (our AUTH_OK was lost):
                // acknowledge it again; anything else is an error.
                if self.peer_first.as_deref() == Some(msg) {
                    self.send_record(&[MSG_AUTH_OK])
                } else {
                    Err(Error::Auth("a second, different identity message".into()))
                }
            }
            (MSG_ANON, false) => {
                if self.role == Role::Initiator || !body.is_empty() || !self.connected {
                    return Err(Error::Auth("the relay did not prove its identity".into()));
                }
                self.peer_first = Some(msg.to_vec());
                self.send_record(&[MSG_AUTH_OK])?;
                self.authenticated(None, now)
            }
            (MSG_AUTH, false) => {
                let identity = self.verify_auth(body)?;
                if self.role == Role::Initiator {
                    if let Some(expected) = self.config.expect_peer.filter(|e| *e != identity) {
                        return Err(Error::WrongIdentity {
                            got: identity,
                            expected,
                        });
                    }
                }
                self.peer_first = Some(msg.to_vec());
                self.send_record(&[MSG_AUTH_OK])?;
                self.authenticated(Some(identity), now)
            }
            (other, _) => Err(Error::Auth(format!("unknown message type {other}"))),
        }
    }

    fn verify_auth(&self, body: &[u8]) -> Result<Ed25519Identity, Error> {
        if body.len() != AUTH_LEN - 1 {
            return Err(Error::Auth(format!("AUTH of {} bytes", body.len() + 1)));
        }
        let (Some(peer_cert), true, true) =
            (self.peer_cert_hash, self.connected, self.keying.is_some())
        else {
            return Err(Error::Auth("AUTH before the handshake ended".into()));
        };
        let key_bytes: [u8; 32] = body[..32].try_into().unwrap_or_default();
        let sig_bytes: [u8; 64] = body[32..].try_into().unwrap_or([0; 64]);
        let key = PublicKey::from_bytes(&key_bytes)
            .map_err(|_| Error::Auth("AUTH with an invalid key".into()))?;
        let signer = match self.role {
            Role::Initiator => Role::Responder,
            Role::Responder => Role::Initiator,
        };
        let content = self.signed_content(signer, &peer_cert, &self.own_cert_hash);
        key.verify(&content, &Signature::from_bytes(&sig_bytes))
            .map_err(|_| Error::Auth("AUTH signature does not verify".into()))?;
        Ok(Ed25519Identity::from(key))
    }

    fn authenticated(&mut self, peer: Option<Ed25519Identity>, now: Instant) -> Result<(), Error> {
        self.peer = Some(peer);
        let carrier = C::start(&self.config.carrier, self.role, peer, self.seed, now)
            .map_err(|e| Error::Carrier(e.to_string()))?;
        self.carrier = Some(carrier);
        self.events.push_back(SessionEvent::Authenticated(peer));
        Ok(())
    }
}

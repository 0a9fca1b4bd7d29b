//! A relay's part in MORE (`docs/datagram.md` section 6), sans-IO: it
//! peels one Sphinx layer off each packet that reaches it on any datagram
//! link and sends the rest on to the next relay at once (no circuit, no
//! queue beyond the wait for a link being opened); delivers replies to
//! the clients' mailboxes registered on their links; and, at an exit,
//! hands the forward messages for it to its end-to-end sets and sends
//! their replies on the SURBs that came with them.
//!
//! Bounded: replay tags are kept in two generations of at most
//! `replay_tags` each, a generation living `replay_period` at most (a
//! replay older than that passes: section 6 says what that gives away);
//! one mailbox per link; `connect_queue` packets per relay being
//! connected to.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tor_llcrypto::pk::ed25519::Ed25519Identity;

use super::sphinx::{self, PeelError, Peeled, SphinxKey, MAILBOX_LEN, TAG_LEN};
use super::wire::LinkMsg;
use crate::{Error, LinkId};

/// How a relay runs MORE.
#[derive(Debug, Clone)]
pub struct MoreRelaySettings {
    /// Whether forward messages for us are taken (we are an exit).
    pub exit: bool,
    /// Replay tags in one generation at most.
    pub replay_tags: usize,
    /// A generation of replay tags lives this long at most.
    pub replay_period: Duration,
    /// Packets waiting for a link to one relay at most.
    pub connect_queue: usize,
}

impl Default for MoreRelaySettings {
    fn default() -> Self {
        MoreRelaySettings {
            exit: false,
            // 2 x 2^17 tags of 32 bytes: about 16 MiB with the sets'
            // overhead; at 10k packets/s a generation lasts 13 s.
            replay_tags: 1 << 17,
            replay_period: Duration::from_secs(300),
            connect_queue: 64,
        }
    }
}

/// What the relay asks of its driver, or tells it.
#[derive(Debug, PartialEq, Eq)]
pub enum MoreOutput {
    /// Send this MORE link message on this link.
    Send(LinkId, Vec<u8>),
    /// Open a link to this relay, then call [`MoreRelay::link_up`] or
    /// [`MoreRelay::link_failed`] (one Connect per relay until then).
    Connect {
        /// Where it listens.
        addr: SocketAddr,
        /// Who it must prove to be.
        identity: Ed25519Identity,
    },
    /// (Exits) an end-to-end message for our sets.
    Exit(Vec<u8>),
}

/// Counters, since the relay started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MoreStats {
    /// Packets peeled (forwarded, delivered or exited).
    pub peeled: u64,
    /// Packets sent on to the next relay.
    pub forwarded: u64,
    /// Replies delivered to a client's mailbox.
    pub delivered: u64,
    /// Forward messages for our exit.
    pub exited: u64,
    /// Packets refused as replays.
    pub replays: u64,
    /// Link messages or packets that did not parse or verify.
    pub invalid: u64,
    /// Packets for a relay we do not know, a mailbox nobody registered,
    /// or us when we are not an exit.
    pub undeliverable: u64,
    /// Packets dropped: the queue for a relay being connected to was full,
    /// or the connection failed.
    pub dropped: u64,
}

/// Replay tags seen, in two generations.
struct ReplayWindow {
    current: HashSet<[u8; TAG_LEN]>,
    previous: HashSet<[u8; TAG_LEN]>,
    started: Instant,
    cap: usize,
    period: Duration,
}

impl ReplayWindow {
    /// Whether `tag` was seen; it is recorded.
    fn seen(&mut self, now: Instant, tag: &[u8; TAG_LEN]) -> bool {
        if self.current.len() >= self.cap
            || now.saturating_duration_since(self.started) >= self.period
        {
            self.previous = std::mem::take(&mut self.current);
            self.started = now;
        }
        self.previous.contains(tag) || !self.current.insert(*tag)
    }
}

/// One relay's MORE (see the module docs).
pub struct MoreRelay {
    identity: Ed25519Identity,
    key: SphinxKey,
    settings: MoreRelaySettings,
    /// Where each relay of the network listens.
    directory: HashMap<Ed25519Identity, SocketAddr>,
    /// Links to relays, by identity.
    peers: HashMap<Ed25519Identity, LinkId>,
    /// Every link up, and its relay's identity (none for a client).
    links: HashMap<LinkId, Option<Ed25519Identity>>,
    mailboxes: HashMap<[u8; MAILBOX_LEN], LinkId>,
    mailbox_of: HashMap<LinkId, [u8; MAILBOX_LEN]>,
    /// Packets waiting for a link to a relay.
    connecting: HashMap<Ed25519Identity, Vec<Vec<u8>>>,
    replay: ReplayWindow,
    /// When each link last carried a MORE message either way.
    last_used: HashMap<LinkId, Instant>,
    /// The time of the call being served.
    now: Instant,
    out: VecDeque<MoreOutput>,
    stats: MoreStats,
}

impl std::fmt::Debug for MoreRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MoreRelay")
            .field("identity", &self.identity)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl MoreRelay {
    /// The relay `identity` with Sphinx key `key`, in a network whose
    /// relays listen at `directory`.
    pub fn new(
        identity: Ed25519Identity,
        key: SphinxKey,
        directory: impl IntoIterator<Item = (Ed25519Identity, SocketAddr)>,
        settings: MoreRelaySettings,
        now: Instant,
    ) -> Self {
        MoreRelay {
            identity,
            key,
            directory: directory.into_iter().collect(),
            peers: HashMap::new(),
            links: HashMap::new(),
            mailboxes: HashMap::new(),
            mailbox_of: HashMap::new(),
            connecting: HashMap::new(),
            replay: ReplayWindow {
                current: HashSet::new(),
                previous: HashSet::new(),
                started: now,
                cap: settings.replay_tags.max(1),
                period: settings.replay_period,
            },
            settings,
            last_used: HashMap::new(),
            now,
            out: VecDeque::new(),
            stats: MoreStats::default(),
        }
    }

    /// The links that carried a MORE message since `since`.
    pub fn links_used_since(&self, since: Instant) -> Vec<LinkId> {
        self.last_used
            .iter()
            .filter(|(_, &at)| at >= since)
            .map(|(&link, _)| link)
            .collect()
    }

    /// Bytes it holds, about: its replay tags and the packets waiting for
    /// links to relays. What a relay's memory cap counts.
    pub fn held_bytes(&self) -> usize {
        let tags = self.replay.current.len() + self.replay.previous.len();
        let waiting: usize = self
            .connecting
            .values()
            .flat_map(|packets| packets.iter().map(Vec::len))
            .sum();
        tags * TAG_LEN + waiting
    }

    /// Counters so far.
    pub fn stats(&self) -> MoreStats {
        self.stats
    }

    /// What the relay asks or tells next.
    pub fn poll_output(&mut self) -> Option<MoreOutput> {
        self.out.pop_front()
    }

    /// A link is up, to the relay `identity` or from a client (`None`);
    /// packets waiting for that relay go.
    pub fn link_up(&mut self, link: LinkId, identity: Option<Ed25519Identity>) {
        self.links.insert(link, identity);
        let Some(identity) = identity else {
            return;
        };
        self.peers.insert(identity, link);
        for packet in self.connecting.remove(&identity).unwrap_or_default() {
            self.stats.forwarded += 1;
            self.send(link, &LinkMsg::Packet(packet));
        }
    }

    /// The link to `identity` asked for could not be opened: its packets
    /// are dropped.
    pub fn link_failed(&mut self, identity: Ed25519Identity) {
        if let Some(waiting) = self.connecting.remove(&identity) {
            self.stats.dropped += waiting.len() as u64;
        }
    }

    /// A link is gone, with its mailbox.
    pub fn link_down(&mut self, link: LinkId) {
        if let Some(Some(identity)) = self.links.remove(&link) {
            if self.peers.get(&identity) == Some(&link) {
                self.peers.remove(&identity);
            }
        }
        if let Some(mailbox) = self.mailbox_of.remove(&link) {
            self.mailboxes.remove(&mailbox);
        }
        self.last_used.remove(&link);
    }

    /// A MORE link message from `link`.
    pub fn handle_message(&mut self, now: Instant, link: LinkId, bytes: &[u8]) {
        if !self.links.contains_key(&link) {
            self.stats.invalid += 1;
            return;
        }
        self.now = self.now.max(now);
        self.last_used.insert(link, self.now);
        match LinkMsg::parse(bytes) {
            Ok(LinkMsg::Packet(packet)) => self.on_packet(now, packet),
            Ok(LinkMsg::Register(mailbox)) => self.register(link, mailbox),
            // Only relays deliver, and only to clients.
            Ok(LinkMsg::Deliver { .. } | LinkMsg::Registered(_)) | Err(_) => {
                self.stats.invalid += 1
            }
        }
    }

    /// (Exits) send `message` back on the SURB `surb`.
    ///
    /// # Errors
    ///
    /// [`Error::Sphinx`] for a SURB that does not parse or a message too
    /// long for it.
    pub fn send_reply(&mut self, now: Instant, surb: &[u8], message: &[u8]) -> Result<(), Error> {
        self.now = self.now.max(now);
        let (packet, first) = sphinx::use_surb(surb, message)?;
        self.route(now, first, packet);
        Ok(())
    }

    fn register(&mut self, link: LinkId, mailbox: [u8; MAILBOX_LEN]) {
        // A mailbox is one link's: another link's claim on it is refused
        // (it would steal the replies), a link's new mailbox replaces its
        // old one.
        match self.mailboxes.get(&mailbox) {
            Some(&owner) if owner != link => {
                self.stats.invalid += 1;
                return;
            }
            _ => {}
        }
        if let Some(old) = self.mailbox_of.insert(link, mailbox) {
            self.mailboxes.remove(&old);
        }
        self.mailboxes.insert(mailbox, link);
        // Answered every time: the answer may be lost.
        self.send(link, &LinkMsg::Registered(mailbox));
    }

    fn on_packet(&mut self, now: Instant, packet: Vec<u8>) {
        let replay = &mut self.replay;
        let peeled = sphinx::peel(&self.key, &packet, |tag| replay.seen(now, tag));
        match peeled {
            Ok(Peeled::Forward { next, packet }) => {
                self.stats.peeled += 1;
                self.route(now, next, packet);
            }
            Ok(Peeled::Final {
                destination,
                id,
                payload,
            }) => {
                self.stats.peeled += 1;
                self.deliver(destination, id, payload);
            }
            Err(PeelError::Replay) => self.stats.replays += 1,
            Err(PeelError::Invalid(_)) => self.stats.invalid += 1,
        }
    }

    /// Send `packet` to the relay `next` (peeling it here if that is us).
    fn route(&mut self, now: Instant, next: Ed25519Identity, packet: Vec<u8>) {
        if next == self.identity {
            // A route through us twice in a row: peel again (at most a
            // route's length of times, as every peel takes a hop).
            return self.on_packet(now, packet);
        }
        if let Some(&link) = self.peers.get(&next) {
            self.stats.forwarded += 1;
            return self.send(link, &LinkMsg::Packet(packet));
        }
        let Some(&addr) = self.directory.get(&next) else {
            self.stats.undeliverable += 1;
            return;
        };
        if self.settings.connect_queue == 0 {
            self.stats.dropped += 1;
            return;
        }
        let waiting = self.connecting.entry(next).or_default();
        if waiting.is_empty() {
            self.out.push_back(MoreOutput::Connect {
                addr,
                identity: next,
            });
        }
        if waiting.len() >= self.settings.connect_queue {
            self.stats.dropped += 1;
        } else {
            waiting.push(packet);
        }
    }

    fn deliver(&mut self, destination: [u8; 32], id: [u8; 16], payload: Vec<u8>) {
        if destination == <[u8; 32]>::from(self.identity) {
            if !self.settings.exit {
                self.stats.undeliverable += 1;
                return;
            }
            match sphinx::open_forward(payload) {
                Ok(message) => {
                    self.stats.exited += 1;
                    self.out.push_back(MoreOutput::Exit(message));
                }
                Err(_) => self.stats.invalid += 1,
            }
            return;
        }
        match self.mailboxes.get(&destination) {
            Some(&link) => {
                self.stats.delivered += 1;
                self.send(link, &LinkMsg::Deliver { id, payload });
            }
            None => self.stats.undeliverable += 1,
        }
    }

    fn send(&mut self, link: LinkId, msg: &LinkMsg) {
        self.last_used.insert(link, self.now);
        self.out.push_back(MoreOutput::Send(link, msg.encode()));
    }
}

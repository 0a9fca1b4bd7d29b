//! A client's routing for MORE (`docs/datagram.md` section 6), sans-IO:
//! the relays it may route through, its links to them and a mailbox at
//! each, a fresh random route for every packet, and the SURBs it has
//! handed out (kept to open their replies). The client's sets and
//! streams are the [`Proxy`](crate::Proxy)'s, which calls this.
//!
//! Routes: a forward packet goes entry, middle, exit; a SURB goes a, b,
//! c, where c holds one of our mailboxes. Only relays we have a link to
//! are drawn (one whose link went down is taken as gone). The exit is never a client's
//! neighbour (never an entry or a SURB's last hop) and two hops in a row
//! are distinct where the network allows.
//!
//! Bounded: the SURBs as [`super::surbs`] says; one mailbox per linked
//! relay.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tor_llcrypto::pk::ed25519::Ed25519Identity;

use super::sphinx::{self, RouteHop, MAILBOX_LEN};
use super::surbs::SurbBook;
use super::wire::{E2eMsg, LinkMsg, SEGMENT_LEN, SET_ID_LEN};
use crate::{Error, LinkId, WireError};

/// A relay a MORE client may route through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoreRelayInfo {
    /// Its identity and Sphinx key.
    pub hop: RouteHop,
    /// Where its datagram link listens.
    pub addr: SocketAddr,
}

/// How often links to the relays not linked are asked for again.
pub const RECONNECT: Duration = Duration::from_secs(5);
/// How long a REGISTER waits for its answer before it goes again.
pub const REGISTER_RESEND: Duration = Duration::from_secs(1);

struct Mailbox {
    id: [u8; MAILBOX_LEN],
    registered: bool,
    resend_at: Instant,
}

/// Where a MORE set's packets go.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SetAddr {
    /// The set, as the client numbers them.
    pub(crate) key: u64,
    /// Its identifier, secret between the client and the exit.
    pub(crate) id: [u8; SET_ID_LEN],
    /// Its exit.
    pub(crate) exit: RouteHop,
}

/// What a MORE link message from a relay was.
#[derive(Debug)]
pub(crate) enum Heard {
    /// A reply of ours, opened.
    Reply {
        /// Its set.
        set: u64,
        /// The message.
        msg: E2eMsg,
        /// SURBs of the set in flight when the exit answered
        /// ([`super::surbs`]).
        in_flight: usize,
    },
    /// A mailbox of ours is registered: SURBs may go through it now.
    Registered,
}

/// A client's MORE routing (see the module docs).
pub(crate) struct MoreClient {
    relays: Vec<MoreRelayInfo>,
    links: HashMap<Ed25519Identity, LinkId>,
    by_link: HashMap<LinkId, Ed25519Identity>,
    mailboxes: HashMap<Ed25519Identity, Mailbox>,
    surbs: SurbBook,
    /// When links to relays not linked are next asked for.
    connect_at: Option<Instant>,
    rng: StdRng,
}

impl MoreClient {
    pub(crate) fn new(seed: u64) -> Self {
        MoreClient {
            relays: Vec::new(),
            links: HashMap::new(),
            by_link: HashMap::new(),
            mailboxes: HashMap::new(),
            surbs: SurbBook::default(),
            connect_at: None,
            rng: StdRng::seed_from_u64(seed ^ 0x4d4f_5245),
        }
    }

    /// The relays to route through.
    pub(crate) fn set_relays(&mut self, relays: Vec<MoreRelayInfo>) {
        self.relays = relays;
    }

    /// The relays this client links to: every one it knows (an exit of
    /// one set is an entry of another's).
    pub(crate) fn relays(&self) -> &[MoreRelayInfo] {
        &self.relays
    }

    /// Whether `identity` is a relay we route through.
    pub(crate) fn knows(&self, identity: &Ed25519Identity) -> bool {
        self.relays.iter().any(|r| r.hop.identity == *identity)
    }

    /// A link to a relay is up: our mailbox there is registered (the
    /// message to send on it).
    pub(crate) fn link_up(
        &mut self,
        now: Instant,
        link: LinkId,
        identity: Ed25519Identity,
    ) -> Vec<u8> {
        self.links.insert(identity, link);
        self.by_link.insert(link, identity);
        let mut id = [0u8; MAILBOX_LEN];
        rand::rng().fill(&mut id[..]);
        self.mailboxes.insert(
            identity,
            Mailbox {
                id,
                registered: false,
                resend_at: now + REGISTER_RESEND,
            },
        );
        LinkMsg::Register(id).encode()
    }

    /// A link is gone, with our mailbox at its relay.
    pub(crate) fn link_down(&mut self, link: LinkId) {
        if let Some(identity) = self.by_link.remove(&link) {
            self.links.remove(&identity);
            self.mailboxes.remove(&identity);
        }
    }

    /// A MORE link message from `link`: what it was, if anything of ours.
    pub(crate) fn handle_message(
        &mut self,
        now: Instant,
        link: LinkId,
        bytes: &[u8],
    ) -> Option<Heard> {
        let identity = *self.by_link.get(&link)?;
        match LinkMsg::parse(bytes).ok()? {
            LinkMsg::Registered(id) => {
                let m = self.mailboxes.get_mut(&identity)?;
                let news = !m.registered && m.id == id;
                m.registered |= news;
                news.then_some(Heard::Registered)
            }
            LinkMsg::Deliver { id, payload } => {
                let taken = self.surbs.take(now, &id)?;
                let message = sphinx::open_reply(&taken.recovery, &payload).ok()?;
                let msg = E2eMsg::parse(&message).ok()?;
                matches!(msg, E2eMsg::Reply { .. }).then_some(Heard::Reply {
                    set: taken.set,
                    msg,
                    in_flight: taken.in_flight,
                })
            }
            // Relays get packets and registrations, not clients.
            LinkMsg::Packet(_) | LinkMsg::Register(_) => None,
        }
    }

    /// REGISTERs to send again (link, message); SURBs too old forgotten.
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> Vec<(LinkId, Vec<u8>)> {
        self.surbs.sweep(now);
        let mut out = Vec::new();
        for (identity, m) in self.mailboxes.iter_mut() {
            if !m.registered && now >= m.resend_at {
                m.resend_at = now + REGISTER_RESEND;
                if let Some(&link) = self.links.get(identity) {
                    out.push((link, LinkMsg::Register(m.id).encode()));
                }
            }
        }
        out
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next run.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let resend = self
            .mailboxes
            .values()
            .filter(|m| !m.registered)
            .map(|m| m.resend_at);
        resend.chain(self.surbs.poll_timeout()).min()
    }

    /// Whether it is time to ask again for links to the relays not
    /// linked (every [`RECONNECT`]: a relay closes an idle link, and one
    /// may have been down).
    pub(crate) fn connect_due(&mut self, now: Instant) -> bool {
        if self.connect_at.is_some_and(|at| now < at) {
            return false;
        }
        self.connect_at = Some(now + RECONNECT);
        true
    }

    /// Forget the SURBs of a set that ended.
    pub(crate) fn forget_set(&mut self, set: u64) {
        self.surbs.forget_set(set);
    }

    /// SURBs handed out and not answered.
    pub(crate) fn surbs_out(&self) -> usize {
        self.surbs.len()
    }

    /// Whether a packet to `exit` can go now: a linked entry other than
    /// the exit.
    pub(crate) fn can_send(&self, exit: &Ed25519Identity) -> bool {
        self.links.keys().any(|id| id != exit)
    }

    /// A forward packet to `exit` for `set` with up to `surbs` new SURBs
    /// (fewer if no mailbox is registered yet or too many are out) and
    /// `segment`, asking for an answer if `probe`: the link it goes on
    /// and the link message; how many SURBs it carries.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyPath`] if no entry is linked; [`Error::Sphinx`] if
    /// building fails.
    pub(crate) fn forward(
        &mut self,
        now: Instant,
        to: SetAddr,
        surbs: usize,
        probe: bool,
        segment: Vec<u8>,
    ) -> Result<(LinkId, Vec<u8>, usize), Error> {
        let SetAddr {
            key: set,
            id: set_id,
            exit,
        } = to;
        // The route first: no SURB is made for a packet that cannot go.
        let entries: Vec<(Ed25519Identity, LinkId)> = self
            .links
            .iter()
            .filter(|(id, _)| **id != exit.identity)
            .map(|(id, link)| (*id, *link))
            .collect();
        let &(entry_id, link) = pick(&mut self.rng, &entries).ok_or(Error::EmptyPath)?;
        let entry = self.hop(&entry_id).ok_or(Error::EmptyPath)?;
        let middle = self
            .random_hop(&[entry_id, exit.identity])
            .ok_or(Error::EmptyPath)?;
        if segment.len() > SEGMENT_LEN {
            return Err(WireError::Length {
                what: "MORE segment",
                got: segment.len(),
            }
            .into());
        }
        let mut carried = Vec::new();
        for _ in 0..surbs {
            match self.new_surb(now, set, &exit.identity)? {
                Some(bytes) => carried.push(bytes),
                None => break,
            }
        }
        let n = carried.len();
        let message = E2eMsg::Forward {
            set: set_id,
            probe,
            surbs: carried,
            segment,
        }
        .encode()?;
        let packet = sphinx::seal_forward(&[entry, middle, exit], &message)?;
        Ok((link, LinkMsg::Packet(packet).encode(), n))
    }

    /// A new SURB for `set`'s replies from `exit`; `None` if no mailbox is
    /// registered, fewer than two relays besides the exit are linked, or
    /// the book is full.
    fn new_surb(
        &mut self,
        now: Instant,
        set: u64,
        exit: &Ed25519Identity,
    ) -> Result<Option<Vec<u8>>, Error> {
        if !self.surbs.has_room() {
            return Ok(None);
        }
        let boxes: Vec<(Ed25519Identity, [u8; MAILBOX_LEN])> = self
            .mailboxes
            .iter()
            .filter(|(id, m)| m.registered && *id != exit)
            .map(|(id, m)| (*id, m.id))
            .collect();
        let Some(&(last_id, mailbox)) = pick(&mut self.rng, &boxes) else {
            return Ok(None);
        };
        let Some(last) = self.hop(&last_id) else {
            return Ok(None);
        };
        let Some(b) = self.random_hop(&[last_id, *exit]) else {
            return Ok(None);
        };
        let Some(a) = self.random_hop(&[b.identity, *exit]) else {
            return Ok(None);
        };
        let surb = sphinx::make_surb(&[a, b, last], &mailbox)?;
        self.surbs.insert(now, set, surb.id, surb.recovery);
        Ok(Some(surb.bytes))
    }

    fn hop(&self, identity: &Ed25519Identity) -> Option<RouteHop> {
        self.relays
            .iter()
            .find(|r| r.hop.identity == *identity)
            .map(|r| r.hop)
    }

    /// A relay at random among those we have a link to (a relay whose
    /// link went down is taken as gone), none of `not`.
    fn random_hop(&mut self, not: &[Ed25519Identity]) -> Option<RouteHop> {
        let candidates: Vec<RouteHop> = self
            .relays
            .iter()
            .map(|r| r.hop)
            .filter(|h| !not.contains(&h.identity) && self.links.contains_key(&h.identity))
            .collect();
        pick(&mut self.rng, &candidates).copied()
    }
}

fn pick<'a, T>(rng: &mut StdRng, items: &'a [T]) -> Option<&'a T> {
    if items.is_empty() {
        None
    } else {
        items.get(rng.random_range(0..items.len()))
    }
}

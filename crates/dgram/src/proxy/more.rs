//! The client's MORE sets (`docs/datagram.md` section 6): a set has no
//! circuits; each of its segments goes in a Sphinx packet of its own on a
//! fresh random route to the exit ([`MoreClient`]), carrying a SURB for
//! the exit's replies, and the client keeps the exit's stock of SURBs
//! near [`SURB_TARGET`] with packets of SURBs alone.

use std::time::Instant;

use onionlab_utcp::Role;
use rand::RngExt;

use super::{
    ClientSet, MoreSet, Proxy, ProxyOutput, MORE_TIMEOUT, PROBE_FIRST, PROBE_MAX, SURB_TARGET,
};
use crate::e2e::{E2eSet, NONCE_LEN};
use crate::more::client::{Heard, MoreRelayInfo, SetAddr};
use crate::more::wire::{E2eMsg, MAX_SURBS, SEGMENT_LEN, SET_ID_LEN};
use crate::streams::SetStreams;
use crate::{Error, LinkId};

impl Proxy {
    /// The relays MORE sets route through (from the network document):
    /// the client links to each and registers a mailbox there.
    pub fn set_more_relays(&mut self, relays: Vec<MoreRelayInfo>) {
        self.more.set_relays(relays);
        self.connect_more();
    }

    /// Start a MORE set to `exit`: no circuits; its streams' segments go
    /// in Sphinx packets, each on its own route (see
    /// [`set_more_relays`](Self::set_more_relays)).
    ///
    /// # Errors
    ///
    /// The TCP's settings' error.
    pub fn start_more_set(&mut self, now: Instant, exit: MoreRelayInfo) -> Result<u64, Error> {
        let id = self.next_set;
        self.next_set += 1;
        let seed = self.seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let e2e = E2eSet::with_segment(
            &self.settings.tcp,
            Role::Initiator,
            self.settings.dispatch,
            seed,
            now,
            SEGMENT_LEN,
        )?;
        let mut set_id = [0u8; SET_ID_LEN];
        rand::rng().fill(&mut set_id[..]);
        self.sets.insert(
            id,
            ClientSet {
                nonce: [0u8; NONCE_LEN],
                streams: SetStreams::new(e2e),
                legs: Default::default(),
                waiting: 0,
                retiring: false,
                more: Some(MoreSet {
                    addr: SetAddr {
                        key: id,
                        id: set_id,
                        exit: exit.hop,
                    },
                    stock: 0,
                    heard_at: now,
                    probe_at: now + PROBE_FIRST,
                    probe_wait: PROBE_FIRST,
                    probe_due: false,
                }),
            },
        );
        self.connect_more();
        self.pump(now);
        Ok(id)
    }

    /// A MORE message from `link` (a relay's answer to our mailbox, or a
    /// reply delivered to it).
    pub fn handle_more(&mut self, now: Instant, link: LinkId, bytes: &[u8]) {
        let (id, msg, in_flight) = match self.more.handle_message(now, link, bytes) {
            Some(Heard::Reply {
                set,
                msg,
                in_flight,
            }) => (set, msg, in_flight),
            // SURBs can go through that mailbox now.
            Some(Heard::Registered) => return self.pump(now),
            None => return,
        };
        let Some(set) = self.sets.get_mut(&id) else {
            return;
        };
        let (Some(more), E2eMsg::Reply { stock, segments }) = (set.more.as_mut(), msg) else {
            return;
        };
        // What the exit held, and what was on its way to it.
        more.stock = usize::from(stock) + in_flight;
        more.heard(now, !segments.is_empty());
        for segment in segments {
            set.streams.e2e.handle_segment(&segment, now);
        }
        set.streams.after_tcp(now, id, true, &mut self.events);
        self.pump(now);
    }

    /// SURBs handed out and not answered (bounded by
    /// [`MAX_SURBS_OUT`](crate::more::surbs::MAX_SURBS_OUT)).
    pub fn surbs_out(&self) -> usize {
        self.more.surbs_out()
    }

    /// Ask for a link to every MORE relay not linked or being connected.
    fn connect_more(&mut self) {
        let relays = self.more.relays().to_vec();
        for relay in relays {
            let guard = (relay.addr, relay.hop.identity);
            if self.links.contains_key(&guard) || self.connecting.contains_key(&guard) {
                continue;
            }
            self.connecting.insert(guard, Vec::new());
            self.out.push_back(ProxyOutput::Connect {
                addr: relay.addr,
                identity: relay.hop.identity,
            });
        }
    }

    /// MORE's timers: REGISTERs resent, old SURBs forgotten; a set with
    /// streams and no reply probes its exit, and fails after
    /// [`MORE_TIMEOUT`].
    pub(super) fn more_timers(&mut self, now: Instant) {
        for (link, msg) in self.more.handle_timeout(now) {
            self.out.push_back(ProxyOutput::SendMore(link, msg));
        }
        let mut failed = Vec::new();
        for (&id, set) in self.sets.iter_mut() {
            let lanes = set.streams.e2e.lanes();
            let Some(more) = set.more.as_mut().filter(|_| lanes > 0) else {
                continue;
            };
            if now >= more.heard_at + MORE_TIMEOUT {
                failed.push(id);
            } else if now >= more.probe_at {
                more.probe_due = true;
                more.probe_wait = (more.probe_wait * 2).min(PROBE_MAX);
                more.probe_at = now + more.probe_wait;
            }
        }
        for id in failed {
            self.close_set(id);
            self.out.push_back(ProxyOutput::SetFailed(id));
        }
        if self.sets.values().any(|s| s.more.is_some()) && self.more.connect_due(now) {
            self.connect_more();
        }
    }

    /// MORE sets' segments out, each with a SURB while the exit's stock
    /// is below target; then refills of SURBs alone for sets with streams
    /// whose stock fell below half the target.
    pub(super) fn pump_more(&mut self, now: Instant) {
        let mut sends = Vec::new();
        for set in self.sets.values_mut() {
            let Some(more) = set.more.as_mut() else {
                continue;
            };
            if !self.more.can_send(&more.addr.exit.identity) {
                continue;
            }
            while let Some(segment) = set.streams.e2e.mux().poll_transmit() {
                let surbs = usize::from(more.stock < SURB_TARGET);
                // A packet that cannot be built is lost like any
                // datagram: the TCP sends its segment again.
                if let Ok((link, msg, n)) = self.more.forward(now, more.addr, surbs, false, segment)
                {
                    more.stock += n;
                    sends.push((link, msg));
                }
            }
            if set.streams.e2e.lanes() == 0 {
                continue;
            }
            // A probe: two SURBs, one for its answer, which says how many
            // the exit really holds (refills may have been lost).
            if more.probe_due {
                match self
                    .more
                    .forward(now, more.addr, MAX_SURBS, true, Vec::new())
                {
                    // A probe without a SURB cannot be answered: it waits.
                    Ok((link, msg, n)) if n > 0 => {
                        more.stock += n;
                        more.probe_due = false;
                        sends.push((link, msg));
                    }
                    _ => {}
                }
            }
            if more.stock >= SURB_TARGET / 2 {
                continue;
            }
            while more.stock < SURB_TARGET {
                match self
                    .more
                    .forward(now, more.addr, MAX_SURBS, false, Vec::new())
                {
                    Ok((link, msg, n)) if n > 0 => {
                        more.stock += n;
                        sends.push((link, msg));
                    }
                    // No mailbox registered yet, or too many SURBs out.
                    _ => break,
                }
            }
        }
        for (link, msg) in sends {
            self.out.push_back(ProxyOutput::SendMore(link, msg));
        }
    }
}

//! The exit's MORE sets (`docs/datagram.md` section 6): a set is known by
//! the identifier in its FORWARD messages (secret between the client and
//! us); each message's SURBs join the set's stock, its segment goes to
//! the set's TCP, and the TCP's segments go back two to a REPLY, each
//! REPLY on one SURB (the newest: the client forgets old ones), as does
//! an empty REPLY answering a probe. With no SURB in stock the segments
//! wait in the TCP.
//!
//! Bounded: [`MAX_STOCK`] SURBs per set (the oldest go first) and
//! [`MAX_SURBS_HELD`] in all (beyond, new ones are dropped), SURBs older
//! than [`SURB_MAX_AGE`] are not used, at most [`MAX_WAITING`] segments
//! wait in a set's TCP while it has no SURB (older ones are dropped, as
//! on a lossy path), and a set that sends nothing for [`MORE_IDLE`] is
//! forgotten, its streams reset.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use onionlab_utcp::Role;

use super::{ExitSets, Set};
use crate::e2e::{E2eSet, NONCE_LEN};
use crate::more::surbs::SURB_LIFETIME;
use crate::more::wire::{E2eMsg, MAX_REPLY_SEGMENTS, SEGMENT_LEN, SET_ID_LEN};
use crate::streams::SetStreams;

/// SURBs held for one set at most.
pub const MAX_STOCK: usize = 128;
/// SURBs held for all sets at most (about 6.5 MB).
pub const MAX_SURBS_HELD: usize = 16_384;
/// Segments waiting in a set's TCP for a SURB at most.
pub const MAX_WAITING: usize = 64;
/// A SURB older than this is not used (its creator forgets it after
/// [`SURB_LIFETIME`]; the margin covers the reply's trip).
pub const SURB_MAX_AGE: Duration = SURB_LIFETIME.saturating_sub(Duration::from_secs(10));
/// A MORE set without a message for this long is forgotten.
pub const MORE_IDLE: Duration = Duration::from_secs(120);

/// A MORE set's state at the exit.
pub(super) struct MoreExitSet {
    pub(super) id: [u8; SET_ID_LEN],
    /// SURBs and when each came, oldest first.
    pub(super) surbs: VecDeque<(Instant, Vec<u8>)>,
    heard_at: Instant,
    /// The client probed: a REPLY goes even without segments.
    answer_due: bool,
}

impl MoreExitSet {
    /// Bytes its SURBs hold.
    pub(super) fn held_bytes(&self) -> usize {
        self.surbs.iter().map(|(_, surb)| surb.len()).sum()
    }

    /// When the set is forgotten if nothing comes.
    pub(super) fn silent_at(&self) -> Instant {
        self.heard_at + MORE_IDLE
    }
}

impl ExitSets {
    /// A MORE end-to-end message for us (the relay's `MoreOutput::Exit`);
    /// a malformed one, or one for a new set beyond `max_sets`, is
    /// dropped.
    pub fn handle_more(&mut self, now: Instant, message: &[u8]) {
        let Ok(E2eMsg::Forward {
            set,
            probe,
            surbs,
            segment,
        }) = E2eMsg::parse(message)
        else {
            return;
        };
        let Some(id) = self.more_set(now, set) else {
            return;
        };
        let Some(s) = self.sets.get_mut(&id) else {
            return;
        };
        let Some(more) = s.more.as_mut() else {
            return;
        };
        more.heard_at = now;
        more.answer_due |= probe;
        for surb in surbs {
            if more.surbs.len() >= MAX_STOCK {
                more.surbs.pop_front();
            } else if self.more_surbs >= MAX_SURBS_HELD {
                continue;
            } else {
                self.more_surbs += 1;
            }
            more.surbs.push_back((now, surb));
        }
        if !segment.is_empty() {
            s.streams.e2e.handle_segment(&segment, now);
            s.streams.after_tcp(now, id, true, &mut self.events);
        }
    }

    /// SURBs held for all MORE sets.
    pub fn more_surbs(&self) -> usize {
        self.more_surbs
    }

    /// The next REPLY to send: the SURB it goes on and the message (for
    /// the relay's `MoreRelay::send_reply`).
    pub fn poll_more_reply(&mut self, now: Instant) -> Option<(Vec<u8>, Vec<u8>)> {
        for s in self.sets.values_mut() {
            let Some(more) = s.more.as_mut() else {
                continue;
            };
            while more
                .surbs
                .front()
                .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= SURB_MAX_AGE)
            {
                more.surbs.pop_front();
                self.more_surbs -= 1;
            }
            if more.surbs.is_empty() {
                let mux = s.streams.e2e.mux();
                while mux.queued() > MAX_WAITING {
                    mux.poll_transmit();
                }
                continue;
            }
            let mut segments = Vec::new();
            while segments.len() < MAX_REPLY_SEGMENTS {
                match s.streams.e2e.mux().poll_transmit() {
                    Some(segment) => segments.push(segment),
                    None => break,
                }
            }
            if segments.is_empty() && !more.answer_due {
                continue;
            }
            let Some((_, surb)) = more.surbs.pop_back() else {
                continue;
            };
            self.more_surbs -= 1;
            more.answer_due = false;
            let stock = u16::try_from(more.surbs.len()).unwrap_or(u16::MAX);
            // Two segments of at most SEGMENT_LEN always fit a REPLY.
            if let Ok(msg) = (E2eMsg::Reply { stock, segments }).encode() {
                return Some((surb, msg));
            }
        }
        None
    }

    /// The set `id` names, made if new (`None` beyond `max_sets`).
    fn more_set(&mut self, now: Instant, id: [u8; SET_ID_LEN]) -> Option<u64> {
        if let Some(&known) = self.by_more.get(&id) {
            return Some(known);
        }
        if self.sets.len() >= self.settings.max_sets {
            return None;
        }
        let key = self.next_set;
        let seed = self.seed ^ key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut e2e = E2eSet::with_segment(
            &self.settings.tcp,
            Role::Responder,
            self.settings.dispatch,
            seed,
            now,
            SEGMENT_LEN,
        )
        .ok()?;
        self.next_set += 1;
        e2e.mux().set_budget(self.budget.clone());
        self.sets.insert(
            key,
            Set {
                nonce: [0u8; NONCE_LEN],
                streams: SetStreams::new(e2e),
                more: Some(MoreExitSet {
                    id,
                    surbs: VecDeque::new(),
                    heard_at: now,
                    answer_due: false,
                }),
            },
        );
        self.by_more.insert(id, key);
        Some(key)
    }

    /// Forget MORE sets silent for [`MORE_IDLE`]: their streams read as
    /// reset.
    pub(super) fn forget_silent_more(&mut self, now: Instant) {
        let silent: Vec<u64> = self
            .sets
            .iter()
            .filter(|(_, s)| s.more.as_ref().is_some_and(|m| now >= m.silent_at()))
            .map(|(&id, _)| id)
            .collect();
        for id in silent {
            self.remove_set(id);
        }
    }
}

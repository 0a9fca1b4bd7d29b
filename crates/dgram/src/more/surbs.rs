//! The SURBs a MORE client handed out and not yet answered: the keys that
//! open each one's reply, by set, in the order they were made.
//!
//! The exit uses the newest SURB it holds first, so a reply on a SURB
//! says that the SURBs made after it and not yet answered had not reached
//! the exit when it answered, if they were made within about a round trip
//! (older ones were lost, or their replies were): those are the ones in
//! flight, and the client's estimate of the exit's stock is what the
//! reply says plus those. The round trip is a smoothed mean of the time
//! from making a SURB to its reply.
//!
//! Bounded: [`MAX_SURBS_PER_SET`] per set (the set's oldest forgotten
//! first: the exit uses its newest, and drops the oldest beyond its own
//! stock), [`MAX_SURBS_OUT`] in all (no new SURB beyond), and any older
//! than [`SURB_LIFETIME`], looked for every [`SURB_SWEEP`].

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use sphinx_packet::SurbReplyRecovery;

use super::sphinx::SURB_ID_LEN;

/// SURBs handed out and not yet answered, in all sets, at most.
pub const MAX_SURBS_OUT: usize = 4096;
/// SURBs of one set kept at most (twice what an exit holds for a set).
pub const MAX_SURBS_PER_SET: usize = 256;
/// A SURB not answered in this long is forgotten (its reply was lost, or
/// the exit dropped it).
pub const SURB_LIFETIME: Duration = Duration::from_secs(60);
/// How often SURBs past [`SURB_LIFETIME`] are looked for.
pub const SURB_SWEEP: Duration = Duration::from_secs(5);

type SurbId = [u8; SURB_ID_LEN];

struct Issued {
    set: u64,
    /// Its number in its set, from 1.
    seq: u64,
    recovery: SurbReplyRecovery,
    issued: Instant,
}

#[derive(Default)]
struct SetBook {
    /// SURBs made for the set so far.
    made: u64,
    /// Their identifiers, numbers and when made, oldest first (some
    /// already answered or forgotten).
    order: VecDeque<(SurbId, u64, Instant)>,
    /// Smoothed time from making a SURB to its reply.
    srtt: Option<Duration>,
    /// How many are still kept.
    live: usize,
}

/// A reply's SURB, taken from the book.
pub(crate) struct Taken {
    /// The set it was made for.
    pub(crate) set: u64,
    /// What opens the reply.
    pub(crate) recovery: SurbReplyRecovery,
    /// SURBs of the set made after it, within a round trip, and not
    /// answered: in flight when the exit answered.
    pub(crate) in_flight: usize,
}

/// A client's unanswered SURBs (see the module docs).
#[derive(Default)]
pub(crate) struct SurbBook {
    surbs: HashMap<SurbId, Issued>,
    sets: HashMap<u64, SetBook>,
    sweep_at: Option<Instant>,
}

impl SurbBook {
    /// SURBs kept, in all sets.
    pub(crate) fn len(&self) -> usize {
        self.surbs.len()
    }

    /// Whether another SURB may be made ([`MAX_SURBS_OUT`]).
    pub(crate) fn has_room(&self) -> bool {
        self.surbs.len() < MAX_SURBS_OUT
    }

    /// Keep SURB `id` of `set`; the set's oldest is forgotten beyond
    /// [`MAX_SURBS_PER_SET`].
    pub(crate) fn insert(
        &mut self,
        now: Instant,
        set: u64,
        id: SurbId,
        recovery: SurbReplyRecovery,
    ) {
        let book = self.sets.entry(set).or_default();
        while book.live >= MAX_SURBS_PER_SET {
            let Some((old, ..)) = book.order.pop_front() else {
                break;
            };
            if self.surbs.remove(&old).is_some() {
                book.live -= 1;
            }
        }
        // Answered ones at the front need not be kept in the order.
        while book
            .order
            .front()
            .is_some_and(|(old, ..)| !self.surbs.contains_key(old))
        {
            book.order.pop_front();
        }
        book.made += 1;
        book.live += 1;
        book.order.push_back((id, book.made, now));
        self.surbs.insert(
            id,
            Issued {
                set,
                seq: book.made,
                recovery,
                issued: now,
            },
        );
        self.sweep_at.get_or_insert(now + SURB_SWEEP);
    }

    /// Take SURB `id` (a reply came on it at `now`).
    pub(crate) fn take(&mut self, now: Instant, id: &SurbId) -> Option<Taken> {
        let issued = self.surbs.remove(id)?;
        let book = self.sets.get_mut(&issued.set)?;
        book.live = book.live.saturating_sub(1);
        let sample = now.saturating_duration_since(issued.issued);
        let srtt = match book.srtt {
            Some(srtt) => (srtt * 7 + sample) / 8,
            None => sample,
        };
        book.srtt = Some(srtt);
        let since = now.checked_sub(srtt).unwrap_or(now);
        let in_flight = book
            .order
            .iter()
            .rev()
            .take_while(|(_, _, made)| *made >= since)
            .filter(|(id, seq, _)| *seq > issued.seq && self.surbs.contains_key(id))
            .count();
        Some(Taken {
            set: issued.set,
            recovery: issued.recovery,
            in_flight,
        })
    }

    /// Forget a set's SURBs (it ended).
    pub(crate) fn forget_set(&mut self, set: u64) {
        if let Some(book) = self.sets.remove(&set) {
            for (id, ..) in book.order {
                self.surbs.remove(&id);
            }
        }
    }

    /// Forget the SURBs past [`SURB_LIFETIME`], if it is time to look.
    pub(crate) fn sweep(&mut self, now: Instant) {
        if self.sweep_at.is_some_and(|at| now < at) {
            return;
        }
        let sets = &mut self.sets;
        self.surbs.retain(|_, s| {
            let keep = now.saturating_duration_since(s.issued) < SURB_LIFETIME;
            if !keep {
                if let Some(book) = sets.get_mut(&s.set) {
                    book.live = book.live.saturating_sub(1);
                }
            }
            keep
        });
        for book in self.sets.values_mut() {
            book.order.retain(|(id, ..)| self.surbs.contains_key(id));
        }
        self.sweep_at = (!self.surbs.is_empty()).then_some(now + SURB_SWEEP);
    }

    /// When [`sweep`](Self::sweep) must next run.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.sweep_at
    }
}

//! Sequence numbers of a linked set (proposal 329, section 2.6): the
//! sender counts the multiplexed messages it sends on each leg and sends a
//! CONFLUX_SWITCH with the gap when it moves to a leg that missed messages;
//! the receiver counts what arrives on each leg, so every message gets the
//! absolute sequence number it was sent with, and releases messages in
//! that order through a bounded out-of-order queue.
//!
//! Each leg is an ordered channel (a circuit), so no number travels with
//! the messages themselves. (The 2013 Conflux paper put a 4-byte sequence
//! number in every cell; proposal 329, which C tor implements, replaced
//! that with SWITCH. Both merge the same way.)

use std::collections::{BTreeMap, VecDeque};

/// Largest relative sequence number one SWITCH carries. Proposal 329's
/// field is 32 bits; C tor keeps it below 2^31, and so do we (a larger
/// gap goes out as several SWITCHes, which the receiver adds up).
pub const MAX_SWITCH_GAP: u32 = (1 << 31) - 1;

/// Why a sequencing input was refused. Any of these from the peer is a
/// protocol violation: the set closes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SeqError {
    /// The leg is not (or no longer) in the set.
    #[error("unknown leg")]
    UnknownLeg,
    /// A SWITCH with relative sequence number 0 (it changes nothing; C tor
    /// also refuses it, as a possible side channel).
    #[error("SWITCH with a relative sequence number of 0")]
    ZeroSwitch,
    /// A message whose sequence number was already delivered or queued:
    /// the peer's sequence numbers are inconsistent.
    #[error("message with sequence number {0} arrived twice")]
    Duplicate(u64),
    /// The out-of-order queue is full.
    #[error("out-of-order queue over its limit of {0} messages")]
    QueueFull(usize),
    /// A sequence number overflowed 64 bits.
    #[error("sequence number overflow")]
    Overflow,
}

/// What to send for one multiplexed message on a leg: SWITCHes first (if
/// the leg missed messages sent on other legs), then the message, which
/// has absolute sequence number `seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendSeq {
    /// Relative sequence numbers of the SWITCHes to send first, in order
    /// (usually none or one).
    pub switches: Vec<u32>,
    /// The message's absolute sequence number (1 for the first).
    pub seq: u64,
}

/// The sending side: absolute sequence numbers per leg.
#[derive(Debug, Clone, Default)]
pub struct SeqSender<L> {
    /// Last absolute sequence number sent on each leg.
    legs: BTreeMap<L, u64>,
    /// Last absolute sequence number sent on any leg.
    last_sent: u64,
}

impl<L: Ord + Copy> SeqSender<L> {
    /// A sender with no legs.
    pub fn new() -> Self {
        SeqSender {
            legs: BTreeMap::new(),
            last_sent: 0,
        }
    }

    /// Add `leg`, whose peer counts it from `last_seq_sent` (0 for a leg
    /// linked before any data; the value its LINK carried otherwise).
    pub fn add_leg(&mut self, leg: L, last_seq_sent: u64) {
        self.legs.insert(leg, last_seq_sent.min(self.last_sent));
    }

    /// Send the next multiplexed message on `leg`.
    pub fn send_on(&mut self, leg: L) -> Result<SendSeq, SeqError> {
        let last = self.legs.get_mut(&leg).ok_or(SeqError::UnknownLeg)?;
        let mut gap = self.last_sent - *last;
        let mut switches = Vec::new();
        while gap > 0 {
            let step = gap.min(u64::from(MAX_SWITCH_GAP));
            // `step` fits: it is at most MAX_SWITCH_GAP.
            switches.push(u32::try_from(step).unwrap_or(MAX_SWITCH_GAP));
            gap -= step;
        }
        let seq = self.last_sent.checked_add(1).ok_or(SeqError::Overflow)?;
        self.last_sent = seq;
        *last = seq;
        Ok(SendSeq { switches, seq })
    }

    /// Last absolute sequence number sent on any leg.
    pub fn last_sent(&self) -> u64 {
        self.last_sent
    }
}

/// The receiving side: absolute sequence numbers per leg, and messages
/// released in order.
#[derive(Debug, Clone)]
pub struct SeqReceiver<L, M> {
    /// Last absolute sequence number received on each leg.
    legs: BTreeMap<L, u64>,
    /// Last absolute sequence number released.
    delivered: u64,
    /// Messages that arrived ahead of a gap, by sequence number.
    out_of_order: BTreeMap<u64, M>,
    /// Messages released in order, not yet taken.
    ready: VecDeque<M>,
    /// Most messages `out_of_order` may hold.
    max_out_of_order: usize,
}

impl<L: Ord + Copy, M> SeqReceiver<L, M> {
    /// A receiver with no legs whose out-of-order queue holds at most
    /// `max_out_of_order` messages.
    pub fn new(max_out_of_order: usize) -> Self {
        SeqReceiver {
            legs: BTreeMap::new(),
            delivered: 0,
            out_of_order: BTreeMap::new(),
            ready: VecDeque::new(),
            max_out_of_order,
        }
    }

    /// Add `leg`, counted from `last_seq_recv` (0 for a leg linked before
    /// any data).
    pub fn add_leg(&mut self, leg: L, last_seq_recv: u64) {
        self.legs.insert(leg, last_seq_recv);
    }

    /// A CONFLUX_SWITCH with relative sequence number `gap` arrived on
    /// `leg`: messages sent on other legs come before its next one.
    pub fn on_switch(&mut self, leg: L, gap: u32) -> Result<(), SeqError> {
        if gap == 0 {
            return Err(SeqError::ZeroSwitch);
        }
        let last = self.legs.get_mut(&leg).ok_or(SeqError::UnknownLeg)?;
        *last = last.checked_add(u64::from(gap)).ok_or(SeqError::Overflow)?;
        Ok(())
    }

    /// A multiplexed message arrived on `leg`: released at once if it is
    /// the next in sequence (with whatever queued messages follow it),
    /// else queued.
    pub fn on_message(&mut self, leg: L, msg: M) -> Result<(), SeqError> {
        let last = self.legs.get_mut(&leg).ok_or(SeqError::UnknownLeg)?;
        let seq = last.checked_add(1).ok_or(SeqError::Overflow)?;
        *last = seq;
        if seq <= self.delivered || self.out_of_order.contains_key(&seq) {
            return Err(SeqError::Duplicate(seq));
        }
        if seq != self.delivered + 1 {
            if self.out_of_order.len() >= self.max_out_of_order {
                return Err(SeqError::QueueFull(self.max_out_of_order));
            }
            self.out_of_order.insert(seq, msg);
            return Ok(());
        }
        self.ready.push_back(msg);
        self.delivered = seq;
        while let Some(next) = self.out_of_order.remove(&(self.delivered + 1)) {
            self.ready.push_back(next);
            self.delivered += 1;
        }
        Ok(())
    }

    /// The next message in sequence, if it arrived.
    pub fn poll_ready(&mut self) -> Option<M> {
        self.ready.pop_front()
    }

    /// Messages waiting behind a gap.
    pub fn out_of_order_len(&self) -> usize {
        self.out_of_order.len()
    }

    /// Last absolute sequence number released in order.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// Lowest sequence number still missing, if messages wait behind it.
    pub fn first_gap(&self) -> Option<u64> {
        (!self.out_of_order.is_empty()).then_some(self.delivered + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_proposals_example() {
        // Proposal 329, 2.6: 10 cells on the first leg, a switch to the
        // second (SWITCH 10), 21 cells there, back to the first (SWITCH 21).
        let mut tx = SeqSender::new();
        tx.add_leg(1u8, 0);
        tx.add_leg(2u8, 0);
        for i in 1..=10 {
            assert_eq!(tx.send_on(1).unwrap().switches, Vec::<u32>::new(), "{i}");
        }
        let first_on_2 = tx.send_on(2).unwrap();
        assert_eq!(
            first_on_2,
            SendSeq {
                switches: vec![10],
                seq: 11
            }
        );
        for _ in 0..20 {
            assert!(tx.send_on(2).unwrap().switches.is_empty());
        }
        assert_eq!(tx.last_sent(), 31);
        assert_eq!(
            tx.send_on(1).unwrap(),
            SendSeq {
                switches: vec![21],
                seq: 32
            }
        );
    }

    #[test]
    fn messages_come_out_in_send_order_whatever_leg_is_faster() {
        let mut rx = SeqReceiver::new(100);
        rx.add_leg('a', 0);
        rx.add_leg('b', 0);
        // Sent: 1, 2 on a; SWITCH 2 then 3, 4 on b; SWITCH 2 then 5 on a.
        // b is faster: 3 and 4 arrive first.
        rx.on_switch('b', 2).unwrap();
        rx.on_message('b', 3).unwrap();
        rx.on_message('b', 4).unwrap();
        assert_eq!(rx.poll_ready(), None);
        assert_eq!(rx.out_of_order_len(), 2);
        assert_eq!(rx.first_gap(), Some(1));
        rx.on_message('a', 1).unwrap();
        assert_eq!(rx.poll_ready(), Some(1));
        assert_eq!(rx.poll_ready(), None);
        rx.on_message('a', 2).unwrap();
        rx.on_switch('a', 2).unwrap();
        rx.on_message('a', 5).unwrap();
        let out: Vec<i32> = std::iter::from_fn(|| rx.poll_ready()).collect();
        assert_eq!(out, [2, 3, 4, 5]);
        assert_eq!(rx.delivered(), 5);
        assert_eq!(rx.out_of_order_len(), 0);
    }

    #[test]
    fn hostile_sequence_numbers_are_refused() {
        let mut rx: SeqReceiver<u8, ()> = SeqReceiver::new(2);
        rx.add_leg(1, 0);
        rx.add_leg(2, 0);
        assert_eq!(rx.on_switch(1, 0), Err(SeqError::ZeroSwitch));
        assert_eq!(rx.on_switch(9, 1), Err(SeqError::UnknownLeg));
        assert_eq!(rx.on_message(9, ()), Err(SeqError::UnknownLeg));
        // Both legs claim sequence number 1.
        rx.on_message(1, ()).unwrap();
        assert_eq!(rx.on_message(2, ()), Err(SeqError::Duplicate(1)));
        // A gap that never fills: the queue stops at its limit.
        rx.on_switch(1, 5).unwrap();
        rx.on_message(1, ()).unwrap();
        rx.on_message(1, ()).unwrap();
        assert_eq!(rx.on_message(1, ()), Err(SeqError::QueueFull(2)));
        // Counters cannot wrap.
        rx.on_switch(2, MAX_SWITCH_GAP).unwrap();
        let mut huge: SeqReceiver<u8, ()> = SeqReceiver::new(2);
        huge.add_leg(1, u64::MAX - 1);
        assert_eq!(huge.on_switch(1, 2), Err(SeqError::Overflow));
    }

    #[test]
    fn a_gap_over_31_bits_goes_out_as_several_switches() {
        let mut tx = SeqSender::new();
        tx.add_leg(1u8, 0);
        tx.add_leg(2u8, 0);
        // Pretend leg 1 carried 2^32 + 5 messages.
        tx.last_sent = (1 << 32) + 5;
        tx.legs.insert(1, tx.last_sent);
        let s = tx.send_on(2).unwrap();
        assert_eq!(
            s.switches.iter().map(|g| u64::from(*g)).sum::<u64>(),
            (1 << 32) + 5
        );
        assert!(s.switches.iter().all(|g| *g > 0 && *g <= MAX_SWITCH_GAP));
        let mut rx: SeqReceiver<u8, u64> = SeqReceiver::new(4);
        rx.add_leg(2, 0);
        rx.add_leg(1, 0);
        rx.delivered = (1 << 32) + 5;
        for g in &s.switches {
            rx.on_switch(2, *g).unwrap();
        }
        rx.on_message(2, s.seq).unwrap();
        assert_eq!(rx.poll_ready(), Some(s.seq));
    }

    proptest! {
        /// Messages sent on legs chosen at random, each leg delivering in
        /// its own order but the legs interleaved at random (any delay
        /// skew), come out exactly once and in send order; the queue
        /// never holds more than what is in flight.
        #[test]
        fn any_interleaving_of_ordered_legs_is_merged_in_order(
            legs in 1usize..4,
            choices in proptest::collection::vec(0usize..3, 1..300),
            arrival in proptest::collection::vec(0usize..3, 0..2000),
        ) {
            let mut tx = SeqSender::new();
            let mut rx = SeqReceiver::new(10_000);
            for l in 0..legs {
                tx.add_leg(l, 0);
                rx.add_leg(l, 0);
            }
            // Per leg, what travels on it in order: SWITCH(gap) or DATA(n).
            let mut wires: Vec<VecDeque<Result<u32, u64>>> = vec![VecDeque::new(); legs];
            for c in &choices {
                let leg = c % legs;
                let s = tx.send_on(leg).unwrap();
                for g in s.switches {
                    wires[leg].push_back(Ok(g));
                }
                wires[leg].push_back(Err(s.seq));
            }
            let total = choices.len() as u64;
            let mut got = Vec::new();
            let mut pick = arrival.into_iter();
            loop {
                let nonempty: Vec<usize> = (0..legs).filter(|l| !wires[*l].is_empty()).collect();
                if nonempty.is_empty() {
                    break;
                }
                let leg = nonempty[pick.next().unwrap_or(0) % nonempty.len()];
                match wires[leg].pop_front().unwrap() {
                    Ok(gap) => rx.on_switch(leg, gap).unwrap(),
                    Err(seq) => rx.on_message(leg, seq).unwrap(),
                }
                prop_assert!(rx.out_of_order_len() as u64 <= total);
                got.extend(std::iter::from_fn(|| rx.poll_ready()));
            }
            prop_assert_eq!(got, (1..=total).collect::<Vec<u64>>());
        }
    }
}

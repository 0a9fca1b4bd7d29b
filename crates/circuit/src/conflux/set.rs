//! One end of a linked set: its legs, sequence numbers and leg scheduler,
//! between a stream edge (the client's or the exit's streams) and the
//! legs (circuits in leg mode). The client node and the relay node each
//! keep one per set; the legs stay in the node's circuit table, reached
//! through [`LegMap`].
//!
//! * Out: [`SetCore::pump_out`] takes the edge's messages one at a time,
//!   picks a leg for each (DATA only on a leg whose window is open and
//!   whose last message went out; other messages, when no leg may send
//!   DATA, on the current leg), numbers it, and queues it on that leg
//!   after the SWITCHes the leg needs.
//! * In: [`SetCore::pump_in`] takes what the legs received, puts the
//!   multiplexed messages back in order through the bounded out-of-order
//!   queue, and hands them (and stream SENDMEs, which are not sequenced)
//!   to the edge.

use std::time::Instant;

use onionlab_cell::msg::{AnyRelayMsg, RelayMsg, StreamId};
use rand::rngs::StdRng;

use super::sched::{LegScheduler, LegSchedulerKind, LegView};
use super::seq::{SeqError, SeqReceiver, SeqSender};
use super::{LegInput, LegState};
use crate::err::Error;
use crate::stream::StreamViolation;

/// A stream edge a set carries: the client's or the exit's streams.
pub trait SetEdge {
    /// Whether a message is ready, with some leg's window open or not.
    fn has_work(&self, window_open: bool) -> bool;
    /// The next message to send (DATA only if `window_open`).
    fn next_outgoing(
        &mut self,
        window_open: bool,
    ) -> Option<Result<(StreamId, AnyRelayMsg), Error>>;
    /// A stream message from the other end, in order; an error is a
    /// protocol violation.
    fn handle(
        &mut self,
        now: Instant,
        stream: StreamId,
        msg: AnyRelayMsg,
    ) -> Result<(), StreamViolation>;
}

/// A circuit in leg mode, as the set uses it.
pub trait SetLeg {
    /// Its state (None if it is not, or no longer, a linked leg).
    fn state(&self) -> Option<LegState>;
    /// Queue `msg` on `stream` after the SWITCHes (at `now`: a leg that
    /// sends at once counts and times the cell from then).
    fn send(
        &mut self,
        now: Instant,
        switches: &[u32],
        stream: StreamId,
        msg: AnyRelayMsg,
    ) -> Result<(), Error>;
    /// The oldest thing it received for the set.
    fn take_input(&mut self) -> Option<LegInput>;
}

/// How a set reaches its legs in the node's circuit table.
pub trait LegMap<L> {
    /// Leg `key`, if the table still has it.
    fn leg(&mut self, key: L) -> Option<&mut dyn SetLeg>;
}

impl<L: Ord, C: SetLeg> LegMap<L> for std::collections::BTreeMap<L, C> {
    fn leg(&mut self, key: L) -> Option<&mut dyn SetLeg> {
        self.get_mut(&key).map(|c| c as &mut dyn SetLeg)
    }
}

/// Why a set must close.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SetError {
    /// The other end's sequence numbers broke the protocol, or its
    /// out-of-order queue overflowed.
    #[error("sequencing: {0}")]
    Seq(#[from] SeqError),
    /// A stream message broke the protocol.
    #[error("{0}")]
    Stream(#[from] StreamViolation),
    /// A leg refused a message (it closed, or its queue overflowed), or
    /// the edge could not encode one.
    #[error("{0}")]
    Leg(Error),
}

/// One end of a linked set.
#[derive(Debug)]
pub struct SetCore<L> {
    /// Linked legs, in the order they joined.
    legs: Vec<L>,
    tx: SeqSender<L>,
    rx: SeqReceiver<L, (StreamId, AnyRelayMsg)>,
    sched: LegScheduler<L>,
}

impl<L: Ord + Copy> SetCore<L> {
    /// A set with no legs yet.
    pub fn new(kind: LegSchedulerKind, rng: StdRng, max_out_of_order: usize) -> Self {
        SetCore {
            legs: Vec::new(),
            tx: SeqSender::new(),
            rx: SeqReceiver::new(max_out_of_order),
            sched: LegScheduler::new(kind, rng),
        }
    }

    /// Add a linked leg (counted from 0 both ways: a first link).
    pub fn add_leg(&mut self, leg: L) {
        if !self.legs.contains(&leg) {
            self.legs.push(leg);
            self.tx.add_leg(leg, 0);
            self.rx.add_leg(leg, 0);
        }
    }

    /// The linked legs, in the order they joined.
    pub fn legs(&self) -> &[L] {
        &self.legs
    }

    /// Whether any multiplexed message moved either way (a leg joining
    /// now could not be told where the sequence stands without
    /// resumption, which is not supported).
    pub fn has_moved_data(&self) -> bool {
        self.tx.last_sent() > 0 || self.rx.delivered() > 0 || self.rx.out_of_order_len() > 0
    }

    /// Messages waiting behind a gap.
    pub fn out_of_order_len(&self) -> usize {
        self.rx.out_of_order_len()
    }

    fn views(&self, map: &mut impl LegMap<L>) -> Vec<LegView<L>> {
        self.legs
            .iter()
            .filter_map(|&leg| map.leg(leg)?.state().map(|s| view(leg, s)))
            .collect()
    }

    /// Move the edge's messages onto legs while a leg may take them (at
    /// `now`); returns the legs that got messages (their channels have
    /// cells).
    pub fn pump_out(
        &mut self,
        now: Instant,
        edge: &mut impl SetEdge,
        map: &mut impl LegMap<L>,
    ) -> Result<Vec<L>, SetError> {
        let mut used = Vec::new();
        loop {
            let views = self.views(map);
            let window_open = views.iter().any(|v| v.can_send);
            if !edge.has_work(window_open) {
                break;
            }
            let data_leg = if window_open {
                self.sched.choose(&views)
            } else {
                None
            };
            let Some(out) = edge.next_outgoing(data_leg.is_some()) else {
                break;
            };
            let (stream, msg) = out.map_err(SetError::Leg)?;
            let leg = match data_leg {
                Some(leg) => leg,
                // Not DATA (the edge gives DATA only with a leg): the
                // current leg, so it stays in order with what went before.
                None => match self.sched.current().or(self.legs.first().copied()) {
                    Some(leg) => leg,
                    None => break,
                },
            };
            // Stream SENDMEs are not multiplexed: no sequence number (the
            // other end handles them on arrival), so no SWITCH either.
            let switches = if super::is_multiplexed(msg.cmd()) {
                self.tx.send_on(leg)?.switches
            } else {
                Vec::new()
            };
            let target = map.leg(leg).ok_or(SetError::Leg(Error::Closed))?;
            target
                .send(now, &switches, stream, msg)
                .map_err(SetError::Leg)?;
            if !used.contains(&leg) {
                used.push(leg);
            }
        }
        Ok(used)
    }

    /// Take what the legs received and hand the edge what is in order.
    pub fn pump_in(
        &mut self,
        now: Instant,
        edge: &mut impl SetEdge,
        map: &mut impl LegMap<L>,
    ) -> Result<(), SetError> {
        for leg in self.legs.clone() {
            let Some(l) = map.leg(leg) else { continue };
            while let Some(input) = l.take_input() {
                match input {
                    LegInput::Switch(gap) => self.rx.on_switch(leg, gap)?,
                    LegInput::Sequenced(stream, msg) => self.rx.on_message(leg, (stream, msg))?,
                    LegInput::Unsequenced(stream, msg) => {
                        edge.handle(now, stream, msg).map_err(SetError::Stream)?
                    }
                }
            }
        }
        while let Some((stream, msg)) = self.rx.poll_ready() {
            edge.handle(now, stream, msg).map_err(SetError::Stream)?;
        }
        Ok(())
    }
}

/// The scheduler's view of a leg.
fn view<L>(leg: L, s: LegState) -> LegView<L> {
    let rtt_us =
        s.cc.map(|c| c.rtt.ewma_us)
            .filter(|us| *us > 0)
            .or(s.sendme_delay.map(|d| d.as_micros() as u64))
            .or(s.link_rtt.map(|d| d.as_micros() as u64));
    LegView {
        leg,
        can_send: s.can_send,
        window_room: u64::from(s.window_room),
        rtt_us,
        cwnd: s.cc.map_or(u64::from(s.window_room), |c| u64::from(c.cwnd)),
        inflight: s.cc.map_or(0, |c| u64::from(c.inflight)),
        in_slow_start: s.cc.is_some_and(|c| c.in_slow_start),
        sendme_delay_us: s.sendme_delay.map(|d| d.as_micros() as u64),
    }
}

#[cfg(test)]
mod tests;

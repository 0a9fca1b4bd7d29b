//! Multi-path circuits (seed 004): Conflux as tor proposal 329 specifies
//! it, generalised to m legs, and mTor, which differs only in how legs are
//! chosen.
//!
//! A client builds m circuits (legs) to one exit, with distinct guards and
//! middles, and links them into a set with CONFLUX_LINK / LINKED /
//! LINKED_ACK carrying one random nonce. Streams then belong to the set:
//! each end picks a leg for every multiplexed message it sends (BEGIN,
//! DATA, END, CONNECTED, RESOLVE, RESOLVED, XON, XOFF), and the other end
//! puts what arrives on all legs back in order. Circuit-level flow control
//! (SENDMEs, Vegas) stays per leg.
//!
//! * [`seq`]: sequence numbers and the bounded out-of-order queue;
//! * [`sched`]: which leg carries the next cell (round robin, random,
//!   Conflux 2013, mTor, and C tor's minRTT, lowRTT and cwndRTT).
//!
//! Messages that are not multiplexed (SENDME, the linking messages,
//! SWITCH, DROP) stay on their own leg and have no sequence number.

pub mod sched;
pub mod seq;
pub mod set;

use std::collections::VecDeque;
use std::time::Duration;

use onionlab_cell::msg::{AnyRelayMsg, ConfluxSwitch, RelayCmd, RelayMsg, StreamId};

use crate::cc::CcSnapshot;

/// Default bound of a set's out-of-order queue, in messages (at most one
/// cell each, so about 4.3 MB). Flow control keeps an honest peer well
/// below it (at most the cells in flight on the other legs); a peer that
/// leaves a gap open on purpose reaches it and loses the set.
pub const DEFAULT_MAX_OUT_OF_ORDER: usize = 8192;

/// Whether messages with command `cmd` travel in the set's sequence
/// (proposal 329, 2.8: the commands that carry a stream ID).
pub fn is_multiplexed(cmd: RelayCmd) -> bool {
    [
        RelayCmd::BEGIN,
        RelayCmd::DATA,
        RelayCmd::END,
        RelayCmd::CONNECTED,
        RelayCmd::RESOLVE,
        RelayCmd::RESOLVED,
        RelayCmd::XOFF,
        RelayCmd::XON,
    ]
    .contains(&cmd)
}

/// What a leg received for its set, in arrival order.
#[derive(Debug, Clone)]
pub enum LegInput {
    /// CONFLUX_SWITCH: messages sent on other legs come before the next
    /// one here.
    Switch(u32),
    /// A multiplexed message: it takes the leg's next sequence number.
    Sequenced(StreamId, AnyRelayMsg),
    /// A stream message that is not multiplexed (a stream SENDME): the
    /// set handles it on arrival.
    Unsequenced(StreamId, AnyRelayMsg),
}

/// What the set's leg scheduler needs to know about a leg.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LegState {
    /// The leg takes another DATA cell: its circuit window has room for
    /// one besides those the set gave it, and fewer than
    /// [`LEG_OUTPUT_DEPTH`] messages wait on it; at an exit that packages
    /// eagerly, its window has room and its queue is not blocked
    /// (`exit_packaging` in the relay settings).
    pub can_send: bool,
    /// DATA cells the circuit window lets the leg send.
    pub window_room: u32,
    /// The leg's congestion control (None under fixed windows).
    pub cc: Option<CcSnapshot>,
    /// The last SENDME's delay (see
    /// [`CircSender::last_sendme_delay`](crate::flow::CircSender::last_sendme_delay)).
    pub sendme_delay: Option<Duration>,
    /// Time from sending LINK to receiving LINKED.
    pub link_rtt: Option<Duration>,
}

/// Most messages a leg holds from its set before its channel takes them
/// (DATA also within the circuit window). With room for one, a set moved
/// one cell per channel write, waking the writers of its legs in turn: on
/// the emulated network two legs were slower than one (`multipath-quick`,
/// docs/conflux.md). With a few dozen a writer takes a batch per
/// wake-up, and the leg scheduler still decides on recent state. C tor's
/// exit queues each cell on its leg as it packages it, up to the leg's
/// congestion window and `cellq_high` cells (onionlab's eager exits do
/// too; this bound is for lazy legs and the client's).
pub const LEG_OUTPUT_DEPTH: usize = 32;

/// A leg's two queues: what arrived for its set, and what its set gave it
/// to send (SWITCHes and multiplexed messages), each in order. Shared by
/// the client's and the exit's legs.
#[derive(Debug, Default)]
pub(crate) struct LegQueues {
    input: VecDeque<LegInput>,
    output: VecDeque<(Option<StreamId>, AnyRelayMsg)>,
    /// DATA messages in `output` (not yet counted by the circuit window).
    data_waiting: u64,
}

impl LegQueues {
    /// Keep a message that arrived on a linked leg for the set: SWITCH,
    /// a stream SENDME (unsequenced) or a multiplexed message. Anything
    /// else is a protocol violation, described.
    pub(crate) fn arrived(
        &mut self,
        stream: Option<StreamId>,
        msg: AnyRelayMsg,
    ) -> Result<(), String> {
        let input = match (stream, msg) {
            (None, AnyRelayMsg::ConfluxSwitch(s)) => LegInput::Switch(s.seqno()),
            (Some(id), msg @ AnyRelayMsg::Sendme(_)) => LegInput::Unsequenced(id, msg),
            (Some(id), msg) if is_multiplexed(msg.cmd()) => LegInput::Sequenced(id, msg),
            (_, msg) => return Err(format!("unexpected {} on a leg", msg.cmd())),
        };
        self.input.push_back(input);
        Ok(())
    }

    /// The oldest input not taken yet.
    pub(crate) fn take_input(&mut self) -> Option<LegInput> {
        self.input.pop_front()
    }

    /// Queue `msg` on `stream` after a SWITCH for each of `switches`;
    /// false (nothing queued) if that would reach `limit` messages.
    pub(crate) fn send(
        &mut self,
        switches: &[u32],
        stream: StreamId,
        msg: AnyRelayMsg,
        limit: usize,
    ) -> bool {
        if self.output.len() + switches.len() >= limit {
            return false;
        }
        for &gap in switches {
            self.output
                .push_back((None, ConfluxSwitch::new(gap).into()));
        }
        if matches!(msg, AnyRelayMsg::Data(_)) {
            self.data_waiting += 1;
        }
        self.output.push_back((Some(stream), msg));
        true
    }

    /// Whether the set may give the leg another DATA message: fewer than
    /// [`LEG_OUTPUT_DEPTH`] messages wait, and the circuit window (`window_room`
    /// cells, not counting those waiting here) has room for one more.
    pub(crate) fn may_take_data(&self, window_room: u64) -> bool {
        self.output.len() < LEG_OUTPUT_DEPTH && self.data_waiting < window_room
    }

    /// Whether the next message to send may go now: anything but DATA at
    /// once, DATA while `window_open`.
    pub(crate) fn output_ready(&self, window_open: bool) -> bool {
        self.output
            .front()
            .is_some_and(|(_, m)| window_open || !matches!(m, AnyRelayMsg::Data(_)))
    }

    /// The next message to send.
    pub(crate) fn next_output(&mut self) -> Option<(Option<StreamId>, AnyRelayMsg)> {
        let next = self.output.pop_front();
        if matches!(next, Some((_, AnyRelayMsg::Data(_)))) {
            self.data_waiting -= 1;
        }
        next
    }

    /// Messages held either way.
    pub(crate) fn len(&self) -> usize {
        self.input.len() + self.output.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_messages_are_multiplexed_and_circuit_messages_are_not() {
        assert!(is_multiplexed(RelayCmd::DATA));
        assert!(is_multiplexed(RelayCmd::XON));
        for cmd in [
            RelayCmd::SENDME,
            RelayCmd::EXTEND2,
            RelayCmd::CONFLUX_LINK,
            RelayCmd::CONFLUX_SWITCH,
            RelayCmd::DROP,
        ] {
            assert!(!is_multiplexed(cmd), "{cmd}");
        }
    }

    #[test]
    fn a_leg_takes_data_up_to_its_depth_and_its_window() {
        let data = || AnyRelayMsg::Data(onionlab_cell::msg::Data::new(b"x").expect("data"));
        let stream = StreamId::new(1).expect("stream id");
        let mut q = LegQueues::default();
        // The window is the tighter bound: 3 cells of room.
        for _ in 0..3 {
            assert!(q.may_take_data(3));
            assert!(q.send(&[], stream, data(), 10_000));
        }
        assert!(
            !q.may_take_data(3),
            "DATA waiting counts against the window"
        );
        assert!(q.next_output().is_some());
        assert!(q.may_take_data(3));
        // The depth: SWITCHes and DATA together, whatever the window.
        let mut q = LegQueues::default();
        assert!(q.send(&[7, 9], stream, data(), 10_000));
        for _ in 3..LEG_OUTPUT_DEPTH {
            assert!(q.may_take_data(1000));
            assert!(q.send(&[], stream, data(), 10_000));
        }
        assert!(!q.may_take_data(1000));
        // Everything comes out in order, SWITCHes first.
        assert!(matches!(
            q.next_output(),
            Some((None, AnyRelayMsg::ConfluxSwitch(_)))
        ));
    }
}

//! An exit circuit as one leg of a linked set (proposal 329; see
//! [`crate::conflux`]): the counterpart of the client's `client/leg.rs`.
//!
//! A CONFLUX_LINK at the exit (last hop, exit role, no streams) becomes
//! [`RelayCircEvent::Link`]; the node joins the circuit to the set its
//! nonce names and answers with [`RelayCircuit::accept_leg`], which sends
//! CONFLUX_LINKED (the leg counts as linked from then on, as the proposal
//! says for the receiver of LINK). Stream messages from the client are
//! then kept for the set ([`RelayCircuit::take_leg_input`]) instead of
//! going to the circuit's own streams, and the set hands the leg messages
//! to send ([`RelayCircuit::leg_send`]).

use std::time::{Duration, Instant};

use onionlab_cell::msg::{AnyRelayMsg, ConfluxLinked, StreamId, V1LinkPayload};

use super::{ExitPackaging, Next, RelayCircEvent, RelayCircuit};
use crate::conflux::{LegInput, LegQueues, LegState};
use crate::err::Error;

/// Leg state of an exit circuit.
#[derive(Debug, Default)]
pub(super) struct Leg {
    /// LINK received, answer not given yet.
    pending: bool,
    /// LINKED sent: the leg carries the set's messages.
    linked: bool,
    queues: LegQueues,
    linked_sent_at: Option<Instant>,
    /// Time from sending LINKED to receiving LINKED_ACK.
    link_rtt: Option<Duration>,
}

impl Leg {
    /// Messages held (received and not taken, or given and not sent).
    pub(super) fn queued(&self) -> usize {
        self.queues.len()
    }
}

impl RelayCircuit {
    /// A CONFLUX_LINK arrived at this hop.
    pub(super) fn on_link(&mut self, payload: V1LinkPayload) {
        if !self.config.exit || !self.config.conflux || self.next != Next::None {
            return self.violation("CONFLUX_LINK at a hop that is not a conflux exit");
        }
        if self.leg.is_some() || self.exit.is_some() {
            return self.violation("CONFLUX_LINK on a circuit that carries streams or is linked");
        }
        if self.first_hop && !self.config.allow_one_hop_streams {
            return self.violation("CONFLUX_LINK on the first hop of a circuit");
        }
        self.leg = Some(Leg {
            pending: true,
            ..Leg::default()
        });
        self.events.push_back(RelayCircEvent::Link {
            nonce: *payload.nonce(),
            last_seqno_sent: *payload.last_seqno_sent(),
            last_seqno_recv: *payload.last_seqno_recv(),
        });
    }

    /// Join the set [`RelayCircEvent::Link`] named: CONFLUX_LINKED with
    /// `reply` goes to the client, and the leg carries the set's messages
    /// from now on. (To refuse, destroy the circuit.)
    pub fn accept_leg(&mut self, now: Instant, reply: V1LinkPayload) -> Result<(), Error> {
        if self.closed {
            return Err(Error::Closed);
        }
        match &mut self.leg {
            Some(leg) if leg.pending => {
                leg.pending = false;
                leg.linked = true;
                leg.linked_sent_at = Some(now);
            }
            _ => return Err(Error::BadState("no CONFLUX_LINK to answer")),
        }
        // The circuit's flow control (the exit state) exists from here.
        self.exit_state();
        self.originate(None, ConfluxLinked::new(reply).into(), now);
        Ok(())
    }

    /// Whether this circuit is a linked leg of a set.
    pub fn is_leg(&self) -> bool {
        self.leg.as_ref().is_some_and(|l| l.linked)
    }

    /// Send `msg` (multiplexed) on stream `stream` for the set, after a
    /// CONFLUX_SWITCH for each of `switches`. The set sends DATA only when
    /// [`LegState::can_send`]. A lazy exit queues them for its channel
    /// scheduler; an eager one ([`ExitPackaging::Eager`]) puts them in the
    /// circuit's queue at once, counted in flight from `now`, as C tor's
    /// exit does with the leg its conflux scheduler chose for a cell.
    pub fn leg_send(
        &mut self,
        now: Instant,
        switches: &[u32],
        stream: StreamId,
        msg: AnyRelayMsg,
    ) -> Result<(), Error> {
        if self.closed {
            return Err(Error::Closed);
        }
        let limit = self.config.max_queue_cells;
        let leg = self
            .leg
            .as_mut()
            .filter(|l| l.linked)
            .ok_or(Error::BadState("not a linked leg"))?;
        if !leg.queues.send(switches, stream, msg, limit) {
            self.close(
                crate::CloseReason::local(
                    onionlab_cell::chan::DestroyReason::RESOURCELIMIT,
                    "leg queue overflow",
                ),
                true,
            );
            return Err(Error::Closed);
        }
        if self.config.exit_packaging == ExitPackaging::Eager {
            while self.leg_output_ready() {
                self.send_leg_output(now);
            }
            // The queue overflowed, or a cell could not be made: the set
            // must close now, not at its next move.
            if self.closed {
                return Err(Error::Closed);
            }
        }
        Ok(())
    }

    /// What the leg received for its set, oldest first.
    pub fn take_leg_input(&mut self) -> Option<LegInput> {
        self.leg.as_mut()?.queues.take_input()
    }

    /// The leg's state for the set's scheduler (None if not a linked leg).
    /// A lazy leg takes DATA while its window has room beyond what waits
    /// for its channel, up to a few messages ahead; an eager one while its
    /// window is open and its queue is not blocked (C tor's
    /// `circuit_ready_to_send`: the congestion window not full, the
    /// circuit not blocked on its channel, which is the `cellq_high`
    /// watermark state).
    pub fn leg_state(&self) -> Option<LegState> {
        let leg = self.leg.as_ref().filter(|l| l.linked)?;
        let exit = self.exit.as_ref()?;
        let sender = &exit.sender;
        let room = match self.config.exit_packaging {
            ExitPackaging::Lazy => leg.queues.may_take_data(u64::from(sender.available())),
            ExitPackaging::Eager => !exit.queue_block.blocked(),
        };
        Some(LegState {
            can_send: !self.closed && sender.can_send() && room,
            window_room: sender.available(),
            cc: sender.snapshot(),
            sendme_delay: sender.last_sendme_delay(),
            link_rtt: leg.link_rtt,
        })
    }

    /// Whether the next message the set gave this leg may go now (a DATA
    /// only while the circuit window is open).
    pub(super) fn leg_output_ready(&self) -> bool {
        let window_open = self.exit.as_ref().is_some_and(|e| e.sender.can_send());
        self.leg
            .as_ref()
            .is_some_and(|l| l.queues.output_ready(window_open))
    }

    /// Send the next message the set gave this leg.
    pub(super) fn send_leg_output(&mut self, now: Instant) {
        if let Some((stream, msg)) = self.leg.as_mut().and_then(|l| l.queues.next_output()) {
            self.originate(stream, msg, now);
        }
    }

    /// A message from the client that the set handles (a stream message,
    /// LINKED_ACK, SWITCH) on a linked leg. Returns false if this circuit
    /// is not one (the caller handles the message itself). DATA was
    /// already counted against the circuit window.
    pub(super) fn on_leg_message(
        &mut self,
        now: Instant,
        stream: Option<StreamId>,
        msg: AnyRelayMsg,
    ) -> bool {
        let Some(leg) = self.leg.as_mut().filter(|l| l.linked) else {
            return false;
        };
        match (stream, msg) {
            (None, AnyRelayMsg::ConfluxLinkedAck(_)) => {
                if leg.link_rtt.is_some() {
                    self.violation("second CONFLUX_LINKED_ACK");
                    return true;
                }
                leg.link_rtt = leg.linked_sent_at.map(|t| now.saturating_duration_since(t));
            }
            (stream, msg) => {
                if let Err(e) = leg.queues.arrived(stream, msg) {
                    self.violation(e);
                }
            }
        }
        true
    }
}

impl crate::conflux::set::SetLeg for RelayCircuit {
    fn state(&self) -> Option<LegState> {
        self.leg_state()
    }
    fn send(
        &mut self,
        now: Instant,
        switches: &[u32],
        stream: StreamId,
        msg: AnyRelayMsg,
    ) -> Result<(), Error> {
        self.leg_send(now, switches, stream, msg)
    }
    fn take_input(&mut self) -> Option<LegInput> {
        self.take_leg_input()
    }
}

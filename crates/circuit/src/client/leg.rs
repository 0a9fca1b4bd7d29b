//! A client circuit as one leg of a linked set (proposal 329; see
//! [`crate::conflux`]).
//!
//! A built circuit with no streams becomes a leg with
//! [`ClientCircuit::start_leg`], which sends CONFLUX_LINK to its last hop.
//! From then on its own stream edge is unused: stream messages from the
//! exit are not handled here but kept for the set
//! ([`ClientCircuit::take_leg_input`]), in arrival order with the SWITCHes
//! between them, and the set hands it messages to send
//! ([`ClientCircuit::leg_send`]). The circuit still does everything per
//! circuit: crypto, circuit windows and SENDMEs, congestion control.

use std::time::{Duration, Instant};

use onionlab_cell::msg::{
    AnyRelayMsg, ConfluxLink, ConfluxLinkedAck, RelayMsg, StreamId, V1LinkPayload, V1Nonce,
};

use super::{ClientCircuit, ClientEvent, PendingMsg};
use crate::conflux::{LegInput, LegQueues, LegState};
use crate::err::Error;

/// Leg state of a client circuit.
#[derive(Debug, Default)]
pub(super) struct Leg {
    queues: LegQueues,
    /// The nonce the LINK carried.
    nonce: Option<V1Nonce>,
    link_sent_at: Option<Instant>,
    link_rtt: Option<Duration>,
    linked: bool,
}

impl Leg {
    /// Messages held (received and not taken, or given and not sent).
    pub(super) fn queued(&self) -> usize {
        self.queues.len()
    }
}

impl ClientCircuit {
    /// Make this built circuit (no streams, not extending) a leg of the
    /// set `payload` names: CONFLUX_LINK goes to its last hop. The answer
    /// comes as [`ClientEvent::Linked`].
    pub fn start_leg(&mut self, payload: V1LinkPayload) -> Result<(), Error> {
        self.check_open()?;
        if self.hops.is_empty() || self.is_extending() {
            return Err(Error::NotBuilt);
        }
        if self.stream_hop.is_some() || self.leg.is_some() {
            return Err(Error::BadState("the circuit already carries streams"));
        }
        let last = self.hops.len() - 1;
        self.stream_hop = Some(last);
        self.leg = Some(Leg {
            nonce: Some(*payload.nonce()),
            ..Leg::default()
        });
        self.queue(PendingMsg {
            hop: last,
            stream: None,
            msg: ConfluxLink::new(payload).into(),
            early: false,
        })
    }

    /// Whether this circuit is a leg of a set.
    pub fn is_leg(&self) -> bool {
        self.leg.is_some()
    }

    /// Send CONFLUX_LINKED_ACK (after [`ClientEvent::Linked`]).
    pub fn send_linked_ack(&mut self) -> Result<(), Error> {
        self.check_open()?;
        let hop = self.leg_hop()?;
        self.queue(PendingMsg {
            hop,
            stream: None,
            msg: ConfluxLinkedAck::default().into(),
            early: false,
        })
    }

    /// Send `msg` (multiplexed) on stream `stream` for the set, after a
    /// CONFLUX_SWITCH for each of `switches`. The set sends DATA only when
    /// [`LegState::can_send`].
    pub fn leg_send(
        &mut self,
        switches: &[u32],
        stream: StreamId,
        msg: AnyRelayMsg,
    ) -> Result<(), Error> {
        self.check_open()?;
        let limit = self.config.max_control_queue;
        let leg = self.leg.as_mut().ok_or(Error::BadState("not a leg"))?;
        if !leg.queues.send(switches, stream, msg, limit) {
            self.control_overflow();
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// What the leg received for its set, oldest first.
    pub fn take_leg_input(&mut self) -> Option<LegInput> {
        self.leg.as_mut()?.queues.take_input()
    }

    /// The leg's state for the set's scheduler (None if not a leg).
    pub fn leg_state(&self) -> Option<LegState> {
        let leg = self.leg.as_ref()?;
        let sender = &self.hops.get(self.stream_hop?)?.sender;
        Some(LegState {
            can_send: !self.closed
                && sender.can_send()
                && leg.queues.may_take_data(u64::from(sender.available())),
            window_room: sender.available(),
            cc: sender.snapshot(),
            sendme_delay: sender.last_sendme_delay(),
            link_rtt: leg.link_rtt,
        })
    }

    fn leg_hop(&self) -> Result<usize, Error> {
        match (&self.leg, self.stream_hop) {
            (Some(_), Some(hop)) => Ok(hop),
            _ => Err(Error::BadState("not a leg")),
        }
    }

    /// Whether the next message the set gave this leg may go now (a DATA
    /// only while the circuit window is open).
    pub(super) fn leg_output_ready(&self) -> bool {
        let window_open = self
            .stream_hop
            .and_then(|h| self.hops.get(h))
            .is_some_and(|h| h.sender.can_send());
        self.leg
            .as_ref()
            .is_some_and(|l| l.queues.output_ready(window_open))
    }

    /// The next message the set gave this leg, as a message to seal.
    pub(super) fn next_leg_output(&mut self) -> Option<PendingMsg> {
        let hop = self.stream_hop?;
        let (stream, msg) = self.leg.as_mut()?.queues.next_output()?;
        Some(PendingMsg {
            hop,
            stream,
            msg,
            early: false,
        })
    }

    /// A LINK is being sealed at `now`: the link RTT runs from here.
    pub(super) fn on_link_sent(&mut self, now: Instant) {
        if let Some(leg) = &mut self.leg {
            leg.link_sent_at.get_or_insert(now);
        }
    }

    /// A message from the leg's last hop that the set handles (a stream
    /// message, LINKED, SWITCH). Returns false if this circuit is not a
    /// leg (the caller handles the message itself).
    pub(super) fn on_leg_message(
        &mut self,
        now: Instant,
        stream: Option<StreamId>,
        msg: AnyRelayMsg,
    ) -> bool {
        let Some(leg) = &mut self.leg else {
            return false;
        };
        match (stream, msg) {
            (None, AnyRelayMsg::ConfluxLinked(l)) => {
                let p = l.payload();
                if leg.linked || leg.nonce != Some(*p.nonce()) {
                    self.violation("unexpected CONFLUX_LINKED");
                    return true;
                }
                leg.linked = true;
                leg.link_rtt = leg.link_sent_at.map(|t| now.saturating_duration_since(t));
                self.events.push_back(ClientEvent::Linked {
                    last_seqno_sent: *p.last_seqno_sent(),
                    last_seqno_recv: *p.last_seqno_recv(),
                });
            }
            (stream, msg) if leg.linked => {
                if let Err(e) = leg.queues.arrived(stream, msg) {
                    self.violation(e);
                }
            }
            (_, msg) => self.violation(format!("{} before CONFLUX_LINKED", msg.cmd())),
        }
        true
    }
}

impl crate::conflux::set::SetLeg for ClientCircuit {
    fn state(&self) -> Option<LegState> {
        self.leg_state()
    }
    fn send(
        &mut self,
        _now: Instant,
        switches: &[u32],
        stream: StreamId,
        msg: AnyRelayMsg,
    ) -> Result<(), Error> {
        // The client's legs send when the channel asks (the stream edge
        // packages lazily at the client either way).
        self.leg_send(switches, stream, msg)
    }
    fn take_input(&mut self) -> Option<LegInput> {
        self.take_leg_input()
    }
}

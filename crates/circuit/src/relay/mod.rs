//! One circuit as a relay sees it: a sans-IO state machine with a side
//! toward the client ("inbound") and, once extended, a side toward the next
//! hop ("outbound"). The same type serves the exit role: when it is the last
//! hop and exits are allowed, BEGIN opens streams that the driver connects
//! to TCP targets.
//!
//! Cells in each direction go through one FIFO, encrypted as they are
//! queued, so the order in which the relay crypto sees cells is the order in
//! which they leave. Exit DATA is packaged lazily from stream buffers when
//! the channel asks for a cell, which keeps per-stream fairness and lets
//! windows apply back-pressure to the driver; or, with
//! [`ExitPackaging::Eager`], as C tor does, as soon as bytes arrive
//! (`packaging.rs`).

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Instant;

use onionlab_cell::chan::{
    AnyChanMsg, ChanMsg, Create2, Created2, DestroyReason, HandshakeType, Relay,
};
use onionlab_cell::msg::{
    AnyRelayMsg, Data, EncodedLinkSpec, End, EndReason, Extended2, RelayMsg, ResolvedVal, Sendme,
    StreamId, Truncated,
};
use onionlab_cell::relay;
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_crypto::relay_crypto::RelayLayer;
use rand::rngs::StdRng;

use crate::err::{CloseReason, Error};
use crate::flow::{CircReceiver, CircSender, CircuitCc};
use crate::stream::{StreamConfig, StreamEvent, StreamFlowKind};
use crate::xonxoff::EdgePosition;

pub(crate) mod exit_streams;
mod leg;
mod packaging;
use exit_streams::ExitStreams;
pub use packaging::{ExitPackaging, CELLQ_HIGH, CELLQ_LOW};
use packaging::{QueueBlock, Trigger};

/// Settings of relay circuits.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Whether BEGIN/RESOLVE are served (this relay is an exit).
    pub exit: bool,
    /// Stream limits at the exit.
    pub streams: StreamConfig,
    /// Most cells queued per direction. Flow control keeps an honest peer
    /// below its window plus a few control cells per circuit, so more means
    /// the peer ignores the windows and the circuit is closed. Set with
    /// [`with_cc`](Self::with_cc) ([`CircuitCc::max_queue_cells`]).
    pub max_queue_cells: usize,
    /// Circuit-level flow control (the network document's `circuit_cc`).
    pub cc: CircuitCc,
    /// Serve BEGIN on circuits whose previous hop is a client (one-hop
    /// circuits). C tor refuses them (END TORPROTOCOL, "Attempt to open a
    /// stream on first hop of circuit"): a relay used as a one-hop proxy
    /// attracts abuse and gives its users no anonymity. Default false;
    /// only test harnesses that exercise a client over a single relay
    /// turn it on.
    pub allow_one_hop_streams: bool,
    /// Whether an exit circuit may become a leg of a linked set
    /// (CONFLUX_LINK, proposal 329). Off by default: the relay node links
    /// sets only once it supports them (issue 19); a LINK to a relay
    /// without it closes the circuit, as an unknown message does.
    pub conflux: bool,
    /// When the exit packages its streams' bytes into DATA cells (and so
    /// when its circuit congestion control counts them in flight):
    /// onionlab's lazy packaging by default, or C tor's eager one.
    pub exit_packaging: ExitPackaging,
    /// Fault injection, compiled into test builds only: after sending
    /// EXTENDED2 toward the client, also send TRUNCATED while keeping the
    /// next hop, as a hostile relay would to become the last hop of the
    /// client's circuit and see where its streams go.
    #[cfg(feature = "fault-injection")]
    pub hostile_truncate: bool,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            exit: false,
            streams: StreamConfig::default(),
            max_queue_cells: CircuitCc::Fixed.max_queue_cells(),
            cc: CircuitCc::Fixed,
            allow_one_hop_streams: false,
            conflux: false,
            exit_packaging: ExitPackaging::Lazy,
            #[cfg(feature = "fault-injection")]
            hostile_truncate: false,
        }
    }
}

impl RelayConfig {
    /// These settings with circuit-level flow control `cc` and its queue
    /// limit.
    pub fn with_cc(self, cc: CircuitCc) -> Self {
        RelayConfig {
            max_queue_cells: cc.max_queue_cells(),
            cc,
            ..self
        }
    }
}

/// The two sides of a relay circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    /// Toward the client (the previous hop).
    Inbound,
    /// Away from the client (the next hop).
    Outbound,
}

/// What a relay circuit asks of its driver.
#[derive(Debug, Clone, PartialEq)]
pub enum RelayCircEvent {
    /// Open (or reuse) a channel to the relay described by `linkspecs` and
    /// attach the outbound side to it; then call
    /// [`RelayCircuit::extend_failed`] if that is impossible. The CREATE2 is
    /// already queued as the first outbound cell.
    Extend {
        /// The link specifiers from EXTEND2.
        linkspecs: Vec<EncodedLinkSpec>,
    },
    /// The outbound side is gone (TRUNCATE, DESTROY from the next hop):
    /// detach it from its channel.
    OutboundClosed {
        /// Whether a DESTROY must still be sent to the next hop.
        send_destroy: bool,
        /// The reason for that DESTROY.
        reason: DestroyReason,
    },
    /// Exit: connect stream `stream` to `host:port`, then call
    /// [`RelayCircuit::exit_connected`] or [`RelayCircuit::exit_refused`].
    Connect {
        /// The stream.
        stream: StreamId,
        /// Host name or address literal, as the client sent it.
        host: String,
        /// TCP port.
        port: u16,
    },
    /// Exit: resolve `host`, then call [`RelayCircuit::exit_resolved`].
    Resolve {
        /// The RESOLVE's stream ID.
        stream: StreamId,
        /// The name to resolve.
        host: String,
    },
    /// Exit: an event on one of its streams (Readable: bytes for the
    /// target; Writable: room for bytes from the target; Ended: the client
    /// closed it, close the TCP connection after writing what was read).
    Stream(StreamEvent),
    /// Exit: a CONFLUX_LINK asks to make this circuit a leg of the set
    /// `nonce` names: call [`RelayCircuit::accept_leg`], or destroy the
    /// circuit to refuse.
    Link {
        /// The set's nonce (a secret: never log it).
        nonce: onionlab_cell::msg::V1Nonce,
        /// Last sequence number the client sent on the set.
        last_seqno_sent: u64,
        /// Last sequence number the client received on the set.
        last_seqno_recv: u64,
    },
    /// The circuit is closed. `notify_inbound` / `notify_outbound`: a
    /// DESTROY with `reason.reason` must be sent on that side.
    Closed {
        /// Why.
        reason: CloseReason,
        /// Send DESTROY toward the client.
        notify_inbound: bool,
        /// Send DESTROY toward the next hop.
        notify_outbound: bool,
    },
}

/// State of the side toward the next hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    None,
    /// CREATE2 queued or sent; waiting for CREATED2.
    Extending,
    Open,
}

/// Exit-side state, created on the first BEGIN.
struct Exit {
    streams: ExitStreams,
    sender: CircSender,
    receiver: CircReceiver,
    /// Eager packaging only: stopped at C tor's queue watermarks.
    queue_block: QueueBlock,
}

/// One circuit at a relay.
pub struct RelayCircuit {
    config: RelayConfig,
    layer: RelayLayer,
    to_client: VecDeque<AnyChanMsg>,
    to_next: VecDeque<AnyChanMsg>,
    next: Next,
    exit: Option<Exit>,
    relay_early_seen: u8,
    /// Did this circuit ever have a next hop that is now gone?
    lost_next_hop: bool,
    events: VecDeque<RelayCircEvent>,
    closed: bool,
    rng: StdRng,
    /// The previous hop is a client, not a relay: we are the first hop.
    first_hop: bool,
    /// Set once a CONFLUX_LINK arrived (see `leg.rs`).
    leg: Option<leg::Leg>,
}

impl std::fmt::Debug for RelayCircuit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayCircuit")
            .field("next", &self.next)
            .field("to_client", &self.to_client.len())
            .field("to_next", &self.to_next.len())
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl RelayCircuit {
    /// Answer a CREATE2: on success the circuit exists and its first
    /// inbound cell is the CREATED2. On error the caller sends DESTROY with
    /// the returned reason.
    pub fn accept(
        config: RelayConfig,
        keys: &RelaySecretKeys,
        create: &Create2,
        mut rng: StdRng,
    ) -> Result<Self, CloseReason> {
        if create.handshake_type() != HandshakeType::NTOR {
            return Err(CloseReason::violation(format!(
                "unsupported handshake type {}",
                create.handshake_type()
            )));
        }
        let (reply, layer_keys) = keys
            .ntor_server_handshake(&mut rng, create.body())
            .map_err(|e| CloseReason::violation(format!("ntor handshake: {e}")))?;
        let mut to_client = VecDeque::new();
        to_client.push_back(Created2::new(reply.to_vec()).into());
        Ok(RelayCircuit {
            config,
            layer: RelayLayer::new(&layer_keys),
            to_client,
            to_next: VecDeque::new(),
            next: Next::None,
            exit: None,
            relay_early_seen: 0,
            lost_next_hop: false,
            events: VecDeque::new(),
            closed: false,
            rng,
            first_hop: false,
            leg: None,
        })
    }

    /// The previous hop is a client (it did not authenticate as a relay),
    /// so this circuit has us as its first hop: BEGIN is refused unless
    /// [`RelayConfig::allow_one_hop_streams`].
    pub fn set_first_hop(&mut self, first_hop: bool) {
        self.first_hop = first_hop;
    }

    /// Is the circuit closed?
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The congestion control of the exit's sending side (None at a
    /// middle relay, before the first stream, or under fixed windows).
    pub fn exit_cc_snapshot(&self) -> Option<crate::cc::CcSnapshot> {
        self.exit.as_ref()?.sender.snapshot()
    }

    /// Does the circuit have an outbound side (extending or extended)?
    pub fn has_outbound(&self) -> bool {
        self.next != Next::None
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<RelayCircEvent> {
        self.events.pop_front()
    }

    fn close(&mut self, reason: CloseReason, notify_inbound: bool) {
        if self.closed {
            return;
        }
        self.closed = true;
        let notify_outbound = self.next != Next::None;
        tracing::debug!(%reason, cc = ?self.exit_cc_snapshot(), "relay circuit closed");
        self.to_client.clear();
        self.to_next.clear();
        self.exit = None;
        self.leg = None;
        self.events.push_back(RelayCircEvent::Closed {
            reason,
            notify_inbound,
            notify_outbound,
        });
    }

    fn violation(&mut self, detail: impl Into<String>) {
        self.close(CloseReason::violation(detail), true);
    }

    /// Close the circuit for a local reason (out of memory, shutdown...).
    pub fn destroy(&mut self, reason: CloseReason) {
        self.close(reason, true);
    }

    fn push(&mut self, side: Side, cell: AnyChanMsg) {
        let limit = self.config.max_queue_cells;
        let q = match side {
            Side::Inbound => &mut self.to_client,
            Side::Outbound => &mut self.to_next,
        };
        if q.len() >= limit {
            return self.close(
                CloseReason::local(
                    DestroyReason::RESOURCELIMIT,
                    format!("{side:?} queue over {limit} cells: peer ignores flow control"),
                ),
                true,
            );
        }
        q.push_back(cell);
    }

    /// Originate a relay message toward the client.
    fn originate(&mut self, stream: Option<StreamId>, msg: AnyRelayMsg, now: Instant) {
        let is_data = msg.cmd() == onionlab_cell::msg::RelayCmd::DATA;
        let mut body = match relay::encode(stream, msg, &mut self.rng) {
            Ok(b) => b,
            Err(e) => {
                return self.close(
                    CloseReason::local(DestroyReason::INTERNAL, format!("{e}")),
                    true,
                )
            }
        };
        let tag = self.layer.originate_inbound(&mut body);
        if is_data {
            if let Some(exit) = &mut self.exit {
                exit.sender.on_data_sent(tag, now);
            }
        }
        self.push(Side::Inbound, Relay::from(body).into());
        // C tor checks its high watermark at every cell it queues.
        self.update_queue_block();
    }

    /// Handle a cell from the client side.
    pub fn handle_inbound(&mut self, now: Instant, msg: AnyChanMsg) {
        if self.closed {
            return;
        }
        let (mut body, early) = match msg {
            AnyChanMsg::Relay(r) => (r.into_relay_body(), false),
            AnyChanMsg::RelayEarly(r) => {
                self.relay_early_seen += 1;
                if self.relay_early_seen > crate::client::MAX_RELAY_EARLY {
                    return self.violation("more than 8 RELAY_EARLY cells");
                }
                (r.into_relay_body(), true)
            }
            AnyChanMsg::Destroy(d) => return self.close(CloseReason::remote(d.reason()), false),
            AnyChanMsg::Padding(_) | AnyChanMsg::Vpadding(_) => return,
            other => {
                return self.violation(format!(
                    "unexpected {} cell from the client side",
                    other.cmd()
                ))
            }
        };
        match self.layer.decrypt_outbound(&mut body) {
            Some(tag) => self.handle_recognized(now, tag, body, early),
            None => match self.next {
                // Cells the client sent toward hops we lost (DESTROY from
                // the next hop, failed extend) may still arrive: drop them.
                Next::None if self.lost_next_hop => {}
                Next::None => self.violation("unrecognized relay cell at the last hop"),
                Next::Extending | Next::Open => {
                    let relay = Relay::from(body);
                    let cell = if early {
                        relay.into_early()
                    } else {
                        relay.into()
                    };
                    self.push(Side::Outbound, cell);
                }
            },
        }
    }

    fn handle_recognized(
        &mut self,
        now: Instant,
        tag: onionlab_crypto::SendmeTag,
        body: relay::BoxedCellBody,
        early: bool,
    ) {
        let (stream, msg) = match relay::decode(body) {
            Ok(x) => x,
            Err(e) => return self.violation(format!("undecodable relay message: {e}")),
        };
        let for_the_set = || {
            stream.is_some()
                || matches!(
                    msg,
                    AnyRelayMsg::ConfluxLinkedAck(_) | AnyRelayMsg::ConfluxSwitch(_)
                )
        };
        if self.leg.is_some() && for_the_set() {
            if !self.is_leg() {
                return self.violation(format!("{} before the leg was linked", msg.cmd()));
            }
            if matches!(msg, AnyRelayMsg::Data(_)) {
                self.count_circuit_data(now, tag);
                if self.closed {
                    return;
                }
            }
            self.on_leg_message(now, stream, msg);
            return;
        }
        match (stream, msg) {
            (None, AnyRelayMsg::ConfluxLink(l)) => self.on_link(l.payload().clone()),
            (None, AnyRelayMsg::Extend2(e)) => {
                if !early {
                    return self.violation("EXTEND2 outside RELAY_EARLY");
                }
                if self.next != Next::None {
                    return self.violation("EXTEND2 on an already extended circuit");
                }
                if self.exit.is_some() {
                    return self.violation("EXTEND2 on a circuit with streams");
                }
                let create = Create2::new(e.handshake_type(), e.handshake().to_vec());
                self.next = Next::Extending;
                self.push(Side::Outbound, create.into());
                self.events.push_back(RelayCircEvent::Extend {
                    linkspecs: e.linkspecs().to_vec(),
                });
            }
            (None, AnyRelayMsg::Truncate(_)) => {
                if self.next != Next::None {
                    self.next = Next::None;
                    self.lost_next_hop = true;
                    self.to_next.clear();
                    self.events.push_back(RelayCircEvent::OutboundClosed {
                        send_destroy: true,
                        reason: DestroyReason::REQUESTED,
                    });
                }
                self.originate(None, Truncated::new(DestroyReason::REQUESTED).into(), now);
            }
            (_, AnyRelayMsg::Drop(_)) => {}
            (Some(id), AnyRelayMsg::Begin(b)) => self.on_begin(now, id, b),
            (Some(id), AnyRelayMsg::Resolve(r)) => {
                if !self.config.exit || self.next != Next::None {
                    return self.originate(
                        Some(id),
                        End::new_with_reason(EndReason::EXITPOLICY).into(),
                        now,
                    );
                }
                let opened = self.exit_state().streams.resolve(id, r.query());
                self.flush_exit(now);
                if let Err(e) = opened {
                    self.violation(e.to_string());
                }
            }
            (Some(id), AnyRelayMsg::Data(d)) => self.on_data(now, tag, id, d),
            (None, AnyRelayMsg::Sendme(s)) => {
                let Some(exit) = &mut self.exit else {
                    return self.violation("circuit SENDME at a hop without streams");
                };
                let t = s.into_sendme_tag();
                match exit.sender.on_sendme(t.as_ref().map(|t| t.as_ref()), now) {
                    // The window opened: an eager exit packages into it.
                    Ok(()) => self.package_eagerly(now, Trigger::Flush),
                    Err(e) => self.violation(e),
                }
            }
            (
                Some(id),
                msg @ (AnyRelayMsg::Sendme(_)
                | AnyRelayMsg::Xon(_)
                | AnyRelayMsg::Xoff(_)
                | AnyRelayMsg::End(_)),
            ) => self.on_stream_msg(now, id, msg),
            (_, other) => self.violation(format!("unexpected {} message", other.cmd())),
        }
    }

    fn on_begin(&mut self, now: Instant, id: StreamId, b: onionlab_cell::msg::Begin) {
        if !self.config.exit || self.next != Next::None {
            tracing::debug!("BEGIN refused: this relay is not the exit of this circuit");
            return self.originate(
                Some(id),
                End::new_with_reason(EndReason::EXITPOLICY).into(),
                now,
            );
        }
        if self.first_hop && !self.config.allow_one_hop_streams {
            tracing::debug!("BEGIN refused: a stream on the first hop of a circuit");
            return self.originate(
                Some(id),
                End::new_with_reason(EndReason::TORPROTOCOL).into(),
                now,
            );
        }
        let opened = self.exit_state().streams.begin(id, b.addr(), b.port());
        self.flush_exit(now);
        if let Err(e) = opened {
            self.violation(e.to_string());
        }
    }

    /// A stream message for the exit's streams.
    fn on_stream_msg(&mut self, now: Instant, id: StreamId, msg: AnyRelayMsg) {
        let Some(exit) = &mut self.exit else {
            return self.violation(format!("{} at a hop without streams", msg.cmd()));
        };
        // What C tor's exit packages on (`packaging.rs`): a stream SENDME
        // its inbuf, partial cells too; an XON only lets it read again.
        let trigger = match msg {
            AnyRelayMsg::Sendme(_) => Some(Trigger::Flush),
            AnyRelayMsg::Xon(_) => Some(Trigger::Read),
            _ => None,
        };
        let handled = exit.streams.handle(now, id, msg);
        self.flush_exit(now);
        if let Err(e) = handled {
            return self.violation(e.to_string());
        }
        if let Some(trigger) = trigger {
            self.package_eagerly(now, trigger);
        }
    }

    /// Send what the exit's streams queued for the client (CONNECTED, END,
    /// RESOLVED, feedback) and pass their events on, in order.
    fn flush_exit(&mut self, now: Instant) {
        while let Some((id, msg)) = self.exit.as_mut().and_then(|e| e.streams.take_queued()) {
            self.originate(Some(id), msg, now);
        }
        while let Some(ev) = self.exit.as_mut().and_then(|e| e.streams.poll_event()) {
            self.events.push_back(ev);
        }
    }

    /// Does this circuit package its own streams eagerly
    /// ([`ExitPackaging::Eager`], and not a leg of a set: a set packages
    /// its streams and gives an eager leg each cell to queue at once)?
    fn packages_eagerly(&self) -> bool {
        self.config.exit_packaging == ExitPackaging::Eager && self.leg.is_none()
    }

    /// Is this circuit's own queue, not its channel, the congestion
    /// control's blocked-channel signal (an eager exit, a leg or not)?
    fn queue_is_blocked_signal(&self) -> bool {
        self.config.exit_packaging == ExitPackaging::Eager
    }

    /// An eager exit packages what its streams hold, as C tor would on
    /// `trigger` (`packaging.rs`): as far as the window allows, until its
    /// queue is blocked (at once, after every cell queued); then it passes
    /// the streams' events on.
    fn package_eagerly(&mut self, now: Instant, trigger: Trigger) {
        if !self.packages_eagerly() {
            return;
        }
        loop {
            let Some(exit) = self.exit.as_mut() else {
                return;
            };
            if exit.queue_block.blocked() || !exit.sender.can_send() {
                break;
            }
            let next = if trigger.takes_partial_cells() {
                exit.streams.next_outgoing(true)
            } else {
                exit.streams.next_whole_outgoing(true)
            };
            match next {
                None => break,
                Some(Ok((id, msg))) => self.originate(Some(id), msg, now),
                Some(Err(e)) => {
                    return self.close(
                        CloseReason::local(DestroyReason::INTERNAL, format!("{e}")),
                        true,
                    )
                }
            }
            if self.closed {
                return;
            }
        }
        while let Some(ev) = self.exit.as_mut().and_then(|e| e.streams.poll_event()) {
            self.events.push_back(ev);
        }
    }

    /// Eager packaging: check the queue against C tor's watermarks and
    /// pass a change to the congestion control as its blocked-channel
    /// signal. Returns whether packaging may resume (a leg's set learns it
    /// from the leg's state when the node next moves the set's messages).
    fn update_queue_block(&mut self) -> bool {
        if !self.queue_is_blocked_signal() {
            return false;
        }
        let queued = self.to_client.len();
        let Some(exit) = self.exit.as_mut() else {
            return false;
        };
        match exit.queue_block.update(queued) {
            Some(blocked) => {
                exit.sender.set_channel_blocked(blocked);
                !blocked
            }
            None => false,
        }
    }

    fn on_data(&mut self, now: Instant, tag: onionlab_crypto::SendmeTag, id: StreamId, d: Data) {
        if self.exit.is_none() {
            return self.violation("DATA at a hop without streams");
        }
        self.count_circuit_data(now, tag);
        if self.closed {
            return;
        }
        self.on_stream_msg(now, id, d.into());
    }

    /// A DATA cell counts against the circuit window: a circuit SENDME
    /// goes out when one is due.
    fn count_circuit_data(&mut self, now: Instant, tag: onionlab_crypto::SendmeTag) {
        let Some(exit) = &mut self.exit else {
            return self.violation("DATA at a hop without streams");
        };
        match exit.receiver.on_data(tag) {
            Ok(Some(t)) => self.originate(None, Sendme::new_tag(t).into(), now),
            Ok(None) => {}
            Err(e) => self.violation(e),
        }
    }

    /// Handle a cell from the next hop.
    pub fn handle_outbound(&mut self, now: Instant, msg: AnyChanMsg) {
        if self.closed {
            return;
        }
        match msg {
            AnyChanMsg::Created2(c) if self.next == Next::Extending => {
                self.next = Next::Open;
                self.originate(None, Extended2::new(c.into_body()).into(), now);
                #[cfg(feature = "fault-injection")]
                if self.config.hostile_truncate {
                    self.originate(
                        None,
                        Truncated::new(DestroyReason::CHANNEL_CLOSED).into(),
                        now,
                    );
                }
            }
            AnyChanMsg::Relay(r) if self.next == Next::Open => {
                let mut body = r.into_relay_body();
                self.layer.encrypt_inbound(&mut body);
                self.push(Side::Inbound, Relay::from(body).into());
            }
            AnyChanMsg::Destroy(d) if self.next != Next::None => {
                self.next = Next::None;
                self.lost_next_hop = true;
                self.to_next.clear();
                self.events.push_back(RelayCircEvent::OutboundClosed {
                    send_destroy: false,
                    reason: d.reason(),
                });
                self.originate(None, Truncated::new(d.reason()).into(), now);
            }
            AnyChanMsg::Padding(_) | AnyChanMsg::Vpadding(_) => {}
            other => self.violation(format!("unexpected {} cell from the next hop", other.cmd())),
        }
    }

    /// The driver could not reach the next hop: the client gets TRUNCATED.
    pub fn extend_failed(&mut self, now: Instant, reason: DestroyReason) {
        if self.closed || self.next == Next::None {
            return;
        }
        self.next = Next::None;
        self.lost_next_hop = true;
        self.to_next.clear();
        self.originate(None, Truncated::new(reason).into(), now);
    }

    /// Exit: the TCP connection for `stream` is up.
    pub fn exit_connected(
        &mut self,
        now: Instant,
        stream: StreamId,
        addr: Option<IpAddr>,
    ) -> Result<(), Error> {
        self.exit_streams(stream)?.connected(stream, addr)?;
        self.flush_exit(now);
        Ok(())
    }

    /// Exit: the stream could not be opened (or the target closed it
    /// abruptly): END with `reason`, dropping unsent data.
    pub fn exit_refused(
        &mut self,
        now: Instant,
        stream: StreamId,
        reason: EndReason,
    ) -> Result<(), Error> {
        self.exit_streams(stream)?.refused(stream, reason)?;
        self.flush_exit(now);
        Ok(())
    }

    /// Exit: answer a RESOLVE.
    pub fn exit_resolved(
        &mut self,
        now: Instant,
        stream: StreamId,
        answers: Vec<(ResolvedVal, u32)>,
    ) {
        if let Ok(streams) = self.exit_streams(stream) {
            streams.resolved(stream, answers);
            self.flush_exit(now);
        }
    }

    /// The exit's streams, if this circuit has any (`stream` names the
    /// stream for the error).
    fn exit_streams(&mut self, stream: StreamId) -> Result<&mut ExitStreams, Error> {
        self.exit
            .as_mut()
            .map(|e| &mut e.streams)
            .ok_or(Error::NoStream(stream.into()))
    }

    /// The exit state, created on first use.
    fn exit_state(&mut self) -> &mut Exit {
        let streams = self.config.streams.clone();
        let cc = self.config.cc;
        self.exit.get_or_insert_with(|| {
            let flow = StreamFlowKind::at(cc, EdgePosition::Exit);
            Exit {
                streams: ExitStreams::new(streams, flow),
                sender: cc.sender(),
                receiver: cc.receiver(),
                queue_block: QueueBlock::default(),
            }
        })
    }

    /// Exit: bytes from the target for the client; returns how many were
    /// accepted (the rest after [`StreamEvent::Writable`]).
    pub fn exit_write(
        &mut self,
        now: Instant,
        stream: StreamId,
        data: &[u8],
    ) -> Result<usize, Error> {
        let n = self.exit_streams(stream)?.write(stream, data, now)?;
        self.package_eagerly(now, Trigger::Read);
        Ok(n)
    }

    /// Exit: when the client's last XON rate lets the target's bytes in
    /// again, if it does not now (see
    /// [`RelayNode::exit_write_resumes_at`](crate::node::RelayNode::exit_write_resumes_at)).
    pub fn exit_write_resumes_at(&self, stream: StreamId) -> Option<Instant> {
        self.exit.as_ref()?.streams.write_resumes_at(stream)
    }

    /// Exit: bytes from the client for the target.
    pub fn exit_read(
        &mut self,
        now: Instant,
        stream: StreamId,
        buf: &mut [u8],
    ) -> Result<usize, Error> {
        let n = self.exit_streams(stream)?.read(stream, buf, now)?;
        self.flush_exit(now);
        Ok(n)
    }

    /// Exit: hand the client's bytes for the target to `consume` without
    /// copying them (see [`RelayNode::exit_read_with`](crate::node::RelayNode::exit_read_with)).
    pub fn exit_read_with(
        &mut self,
        now: Instant,
        stream: StreamId,
        consume: impl FnOnce(&[&[u8]]) -> usize,
    ) -> Result<usize, Error> {
        let n = self.exit_streams(stream)?.read_with(stream, now, consume)?;
        self.flush_exit(now);
        Ok(n)
    }

    /// Exit: bytes from the target the stream would take now (see
    /// [`RelayNode::exit_write_room`](crate::node::RelayNode::exit_write_room)).
    pub fn exit_write_room(&mut self, now: Instant, stream: StreamId) -> Result<usize, Error> {
        self.exit_streams(stream)?.write_room(stream, now)
    }

    /// Exit: bytes from the client not yet read for the target.
    pub fn exit_readable_bytes(&self, stream: StreamId) -> usize {
        self.exit
            .as_ref()
            .map_or(0, |e| e.streams.readable_bytes(stream))
    }

    /// Exit: the target closed its side; END (DONE) after the queued bytes.
    pub fn exit_close(&mut self, now: Instant, stream: StreamId) -> Result<(), Error> {
        self.exit_end(now, stream, EndReason::DONE)
    }

    /// Exit: the connection to the target ended (cleanly: DONE; or with an
    /// error, e.g. CONNRESET): END with `reason` after the bytes already
    /// queued for the client. Unlike [`exit_refused`](Self::exit_refused),
    /// what the target sent before it failed still reaches the client.
    pub fn exit_end(
        &mut self,
        now: Instant,
        stream: StreamId,
        reason: EndReason,
    ) -> Result<(), Error> {
        self.exit_streams(stream)?.end(stream, reason)?;
        // C tor packages the last partial cell and the END at the EOF.
        self.package_eagerly(now, Trigger::Flush);
        Ok(())
    }

    /// Whether the channel on `side` is blocked now (the transport takes
    /// no more of this circuit's cells): the exit's congestion control
    /// takes it as a congestion signal at its next SENDME (only the
    /// inbound side carries data this relay originates).
    ///
    /// An exit that packages eagerly ignores it: as in C tor, its signal
    /// is its own queue's state (`packaging.rs`).
    pub fn set_channel_blocked(&mut self, side: Side, blocked: bool) {
        if self.queue_is_blocked_signal() {
            return;
        }
        if let (Side::Inbound, Some(exit)) = (side, self.exit.as_mut()) {
            exit.sender.set_channel_blocked(blocked);
        }
    }

    /// Does the circuit have a cell for `side` now?
    pub fn wants_transmit(&self, side: Side) -> bool {
        if self.closed {
            return false;
        }
        match side {
            Side::Outbound => !self.to_next.is_empty(),
            Side::Inbound => {
                !self.to_client.is_empty()
                    || self.leg_output_ready()
                    || self
                        .exit
                        .as_ref()
                        .is_some_and(|e| e.streams.has_work(e.sender.can_send()))
            }
        }
    }

    /// The next cell for `side`.
    pub fn poll_transmit(&mut self, now: Instant, side: Side) -> Option<AnyChanMsg> {
        if self.closed {
            return None;
        }
        match side {
            Side::Outbound => self.to_next.pop_front(),
            Side::Inbound => {
                if let Some(c) = self.to_client.pop_front() {
                    if self.update_queue_block() {
                        self.package_eagerly(now, Trigger::Read);
                    }
                    return Some(c);
                }
                if self.leg_output_ready() {
                    self.send_leg_output(now);
                    return self.to_client.pop_front();
                }
                let exit = self.exit.as_mut()?;
                let out = exit.streams.next_outgoing(exit.sender.can_send())?;
                match out {
                    Ok((id, msg)) => self.originate(Some(id), msg, now),
                    Err(e) => self.close(
                        CloseReason::local(DestroyReason::INTERNAL, format!("{e}")),
                        true,
                    ),
                }
                // Writable events the packaging produced.
                while let Some(ev) = self.exit.as_mut().and_then(|e| e.streams.poll_event()) {
                    self.events.push_back(ev);
                }
                self.to_client.pop_front()
            }
        }
    }

    /// Memory held by this circuit's queues, in O(1): every cell queued in
    /// either direction at [`QUEUED_CELL_BYTES`](crate::QUEUED_CELL_BYTES)
    /// each, plus the exit's stream buffers by their length (bytes from the
    /// target not yet packaged, bytes from the client not yet read by the
    /// driver). Crypto state, stream tables and the like are not counted.
    pub fn queued_bytes(&self) -> usize {
        (self.to_client.len() + self.to_next.len() + self.leg.as_ref().map_or(0, leg::Leg::queued))
            * crate::QUEUED_CELL_BYTES
            + self.exit.as_ref().map_or(0, |e| e.streams.buffered_bytes())
    }
}

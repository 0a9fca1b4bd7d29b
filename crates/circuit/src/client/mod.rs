//! The client (onion proxy) end of one circuit, as a sans-IO state machine.
//!
//! Inputs: cells from the guard ([`ClientCircuit::handle_cell`]), the
//! current time, and requests (extend, open a stream, write, read, close).
//! Outputs: cells for the guard ([`ClientCircuit::poll_transmit`]), events
//! ([`ClientCircuit::poll_event`]) and a deadline
//! ([`ClientCircuit::poll_timeout`]).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use onionlab_cell::chan::{
    AnyChanMsg, ChanMsg, Create2, Destroy, DestroyReason, HandshakeType, Relay,
};
use onionlab_cell::msg::{
    AnyRelayMsg, EncodedLinkSpec, Extend2, RelayMsg, ResolvedVal, Sendme, StreamId,
};
use onionlab_cell::relay;
use onionlab_crypto::identity::RelayPublicKeys;
use onionlab_crypto::ntor::NtorClient;
use onionlab_crypto::relay_crypto::ClientCircuitCrypto;
use rand::rngs::StdRng;

use crate::err::{CloseReason, Error};
use crate::flow::{CircReceiver, CircSender, CircuitCc};
use crate::stream::{StreamConfig, StreamEvent, StreamFlowKind};

use crate::xonxoff::EdgePosition;

mod leg;
pub(crate) mod streams;
use streams::{BeginError, ClientStreams, ControlOverflow};

/// Most RELAY_EARLY cells a circuit may carry (tor-spec).
pub const MAX_RELAY_EARLY: u8 = 8;

/// Settings of a client circuit.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Stream limits.
    pub streams: StreamConfig,
    /// How long one hop's CREATE2/EXTEND2 may take before the circuit is abandoned.
    pub hop_timeout: Duration,
    /// Most control messages (SENDME, BEGIN, END...) queued before the circuit
    /// is considered broken.
    pub max_control_queue: usize,
    /// Circuit-level flow control (the network document's `circuit_cc`).
    pub cc: CircuitCc,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            streams: StreamConfig::default(),
            hop_timeout: Duration::from_secs(30),
            max_control_queue: 4096,
            cc: CircuitCc::default(),
        }
    }
}

/// What a client circuit reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientEvent {
    /// A hop was added; the circuit now has `hops` hops.
    HopAdded {
        /// Number of hops now.
        hops: usize,
    },
    /// The relay at index `hop` of the path (0: the guard) failed: the hop
    /// before it said so with TRUNCATED, its handshake failed, or it did
    /// not answer in time. [`ClientEvent::Closed`] follows at once: a
    /// client never re-extends or keeps using a truncated circuit (a hop
    /// that sends TRUNCATED would otherwise become the circuit's last hop
    /// and see where its streams go). The relay named may be innocent (a
    /// hostile hop can lie about its successor); callers use this only to
    /// avoid the relay for a while.
    HopFailed {
        /// Index of the failed relay in the circuit's path.
        hop: usize,
        /// What happened, for logs.
        detail: String,
    },
    /// A stream event.
    Stream(StreamEvent),
    /// A RESOLVE finished.
    Resolved {
        /// The stream ID the RESOLVE used.
        stream: StreamId,
        /// Answers with their TTLs (empty if the exit gave none).
        answers: Vec<(ResolvedVal, u32)>,
    },
    /// The circuit is closed; nothing more will happen on it.
    Closed(CloseReason),
    /// A leg's CONFLUX_LINKED arrived (after
    /// [`ClientCircuit::start_leg`]), with the exit's sequence numbers for
    /// the set (0 on a first link).
    Linked {
        /// Last sequence number the exit sent on the set.
        last_seqno_sent: u64,
        /// Last sequence number the exit received on the set.
        last_seqno_recv: u64,
    },
}

/// Where the circuit construction is.
enum Build {
    /// Waiting for CREATED2 (first hop) or EXTENDED2 (later hops).
    Awaiting {
        handshake: NtorClient,
        deadline: Option<Instant>,
    },
    /// Not extending.
    Idle,
}

/// A relay message waiting to be encrypted and sent.
struct PendingMsg {
    hop: usize,
    stream: Option<StreamId>,
    msg: AnyRelayMsg,
    early: bool,
}

/// Per-hop circuit-level flow control.
#[derive(Debug)]
struct Hop {
    sender: CircSender,
    receiver: CircReceiver,
}

/// The client end of one circuit.
pub struct ClientCircuit {
    config: ClientConfig,
    build: Build,
    crypto: ClientCircuitCrypto,
    hops: Vec<Hop>,
    /// The hop streams attach to (the last hop when the first stream opened).
    stream_hop: Option<usize>,
    streams: ClientStreams,
    /// Channel-level cells not encrypted per hop (CREATE2, DESTROY).
    chan_out: VecDeque<AnyChanMsg>,
    control: VecDeque<PendingMsg>,
    events: VecDeque<ClientEvent>,
    relay_early_left: u8,
    closed: bool,
    rng: StdRng,
    /// Set when the circuit is a leg of a linked set (see `leg.rs`).
    leg: Option<leg::Leg>,
}

impl std::fmt::Debug for ClientCircuit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCircuit")
            .field("hops", &self.hops.len())
            .field("streams", &self.streams.len())
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl ClientCircuit {
    /// Start a circuit whose first hop is `guard`: queues the CREATE2.
    pub fn new(config: ClientConfig, guard: &RelayPublicKeys, mut rng: StdRng) -> Self {
        let (handshake, onionskin) =
            NtorClient::start(&mut rng, &guard.ntor_node_id(), &guard.onion_key);
        let mut chan_out = VecDeque::new();
        chan_out.push_back(Create2::new(HandshakeType::NTOR, onionskin.to_vec()).into());
        let flow = StreamFlowKind::at(config.cc, EdgePosition::Client);
        ClientCircuit {
            streams: ClientStreams::new(config.streams.clone(), flow, config.max_control_queue),
            config,
            build: Build::Awaiting {
                handshake,
                deadline: None,
            },
            crypto: ClientCircuitCrypto::new(),
            hops: Vec::new(),
            stream_hop: None,
            chan_out,
            control: VecDeque::new(),
            events: VecDeque::new(),
            relay_early_left: MAX_RELAY_EARLY,
            closed: false,
            rng,
            leg: None,
        }
    }

    /// Number of hops built so far.
    pub fn n_hops(&self) -> usize {
        self.hops.len()
    }

    /// Is a hop being added right now?
    pub fn is_extending(&self) -> bool {
        matches!(self.build, Build::Awaiting { .. })
    }

    /// Is the circuit closed?
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The congestion control of the hop streams attach to (None before a
    /// stream was opened, or under fixed windows).
    pub fn cc_snapshot(&self) -> Option<crate::cc::CcSnapshot> {
        self.hops.get(self.stream_hop?)?.sender.snapshot()
    }

    /// Number of open streams.
    pub fn n_streams(&self) -> usize {
        self.streams.len()
    }

    /// Extend the circuit by one hop to `target`, reachable as `linkspecs`.
    pub fn extend(
        &mut self,
        target: &RelayPublicKeys,
        linkspecs: Vec<EncodedLinkSpec>,
    ) -> Result<(), Error> {
        self.check_open()?;
        match self.build {
            Build::Awaiting { .. } => return Err(Error::BadState("already extending")),
            Build::Idle => {}
        }
        if self.stream_hop.is_some() {
            return Err(Error::BadState(
                "streams are attached; cannot extend further",
            ));
        }
        if self.relay_early_left == 0 {
            return Err(Error::BadState("no RELAY_EARLY cells left for EXTEND2"));
        }
        let (handshake, onionskin) =
            NtorClient::start(&mut self.rng, &target.ntor_node_id(), &target.onion_key);
        let last = self.hops.len() - 1;
        self.queue(PendingMsg {
            hop: last,
            stream: None,
            msg: Extend2::new(linkspecs, HandshakeType::NTOR, onionskin.to_vec()).into(),
            early: true,
        })?;
        self.build = Build::Awaiting {
            handshake,
            deadline: None,
        };
        Ok(())
    }

    /// Open a stream to `host:port` at the last hop. The stream is usable
    /// for writing at once; data flows once CONNECTED arrives.
    pub fn begin(&mut self, host: &str, port: u16) -> Result<StreamId, Error> {
        self.attach_hop()?;
        let r = self.streams.begin(host, port);
        self.opened(r)
    }

    /// Ask the last hop to resolve `host`; the answer arrives as
    /// [`ClientEvent::Resolved`].
    pub fn resolve(&mut self, host: &str) -> Result<StreamId, Error> {
        self.attach_hop()?;
        let r = self.streams.resolve(host);
        self.opened(r)
    }

    /// The result of a BEGIN or RESOLVE: a full queue closes the circuit.
    fn opened(&mut self, r: Result<StreamId, BeginError>) -> Result<StreamId, Error> {
        match r {
            Ok(id) => Ok(id),
            Err(BeginError::Refused(e)) => Err(e),
            Err(BeginError::Overflow) => {
                self.control_overflow();
                Err(Error::Closed)
            }
        }
    }

    fn control_overflow(&mut self) {
        self.close(CloseReason::local(
            DestroyReason::RESOURCELIMIT,
            "control queue overflow",
        ));
    }

    fn attach_hop(&mut self) -> Result<usize, Error> {
        self.check_open()?;
        if self.leg.is_some() {
            return Err(Error::BadState(
                "a leg of a linked set: streams go to the set",
            ));
        }
        if self.hops.is_empty() || self.is_extending() {
            return Err(Error::NotBuilt);
        }
        Ok(*self.stream_hop.get_or_insert(self.hops.len() - 1))
    }

    /// Queue bytes on a stream at `now`; returns how many were accepted
    /// (the rest must be offered again after [`StreamEvent::Writable`], or
    /// at [`write_resumes_at`](Self::write_resumes_at) if the exit's XON
    /// rate held them back).
    pub fn write(&mut self, now: Instant, stream: StreamId, data: &[u8]) -> Result<usize, Error> {
        self.check_open()?;
        self.streams
            .write(stream, data, now)
            .ok_or(Error::NoStream(stream.into()))
    }

    /// When the exit's last XON rate (proposal 324) lets
    /// [`write`](Self::write) take bytes on `stream` again, if it does not
    /// now. No event marks that moment: wait until then, or for
    /// [`StreamEvent::Writable`]. `None`: no rate limits the stream now.
    pub fn write_resumes_at(&self, stream: StreamId) -> Option<Instant> {
        self.streams.write_resumes_at(stream)
    }

    /// Read received bytes of a stream into `buf` at `now`.
    pub fn read(&mut self, now: Instant, stream: StreamId, buf: &mut [u8]) -> Result<usize, Error> {
        let (n, queued) = self.streams.read(stream, buf, now)?;
        // Feedback is only queued while the circuit is open; if it
        // overflows the queue the circuit closes and says so in its
        // events; the bytes read are still the caller's.
        if queued == Err(ControlOverflow) && !self.closed {
            self.control_overflow();
        }
        Ok(n)
    }

    /// Bytes received on a stream and not yet read.
    pub fn readable_bytes(&self, stream: StreamId) -> usize {
        self.streams.readable_bytes(stream)
    }

    /// Close a stream for writing: END is sent after the queued bytes.
    pub fn close_stream(&mut self, stream: StreamId) -> Result<(), Error> {
        if self.streams.close(stream) {
            Ok(())
        } else {
            Err(Error::NoStream(stream.into()))
        }
    }

    /// Tear the circuit down (DESTROY to the guard).
    pub fn destroy(&mut self) {
        if !self.closed {
            self.close(CloseReason::local(
                DestroyReason::NONE,
                "closed by the client",
            ));
        }
    }

    fn check_open(&self) -> Result<(), Error> {
        if self.closed {
            Err(Error::Closed)
        } else {
            Ok(())
        }
    }

    fn queue(&mut self, m: PendingMsg) -> Result<(), Error> {
        if self.control.len() >= self.config.max_control_queue {
            self.close(CloseReason::local(
                DestroyReason::RESOURCELIMIT,
                "control queue overflow",
            ));
            return Err(Error::Closed);
        }
        self.control.push_back(m);
        Ok(())
    }

    /// Close the circuit: DESTROY out, everything else dropped.
    fn close(&mut self, why: CloseReason) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.control.clear();
        self.streams.clear_queued();
        self.leg = None;
        self.chan_out.clear();
        if !why.by_peer {
            self.chan_out.push_back(Destroy::new(why.reason).into());
        }
        tracing::debug!(reason = %why, cc = ?self.cc_snapshot(), "client circuit closed");
        self.events.push_back(ClientEvent::Closed(why));
    }

    fn violation(&mut self, detail: impl Into<String>) {
        self.close(CloseReason::violation(detail));
    }

    /// Handle a cell that arrived from the guard on this circuit.
    pub fn handle_cell(&mut self, now: Instant, msg: AnyChanMsg) {
        if self.closed {
            return;
        }
        match msg {
            AnyChanMsg::Created2(c) => {
                if !self.hops.is_empty() {
                    return self.violation("CREATED2 on a built circuit");
                }
                self.finish_hop(&c.into_body());
            }
            AnyChanMsg::Relay(r) => {
                let mut body = r.into_relay_body();
                match self.crypto.decrypt_inbound(&mut body) {
                    Some((hop, tag)) => self.handle_relay(now, hop, tag, body),
                    None => self.violation("relay cell recognized by no hop"),
                }
            }
            AnyChanMsg::Destroy(d) => self.close(CloseReason::remote(d.reason())),
            AnyChanMsg::RelayEarly(_) => self.violation("RELAY_EARLY toward the client"),
            AnyChanMsg::Padding(_) | AnyChanMsg::Vpadding(_) => {}
            other => self.violation(format!("unexpected {} cell", other.cmd())),
        }
    }

    fn finish_hop(&mut self, reply: &[u8]) {
        let Build::Awaiting { handshake, .. } = std::mem::replace(&mut self.build, Build::Idle)
        else {
            return self.violation("handshake reply without a pending handshake");
        };
        match handshake.finish(reply) {
            Ok(keys) => {
                self.crypto.add_layer(&keys);
                self.hops.push(Hop {
                    sender: self.config.cc.sender(),
                    receiver: self.config.cc.receiver(),
                });
                self.events.push_back(ClientEvent::HopAdded {
                    hops: self.hops.len(),
                });
            }
            Err(e) => {
                // A wrong key or a forged reply: the whole circuit goes (we
                // never truncate and re-extend).
                let detail = format!("handshake with hop {} failed: {e}", self.hops.len() + 1);
                self.hop_failed(self.hops.len(), detail.clone());
                self.violation(detail);
            }
        }
    }

    fn handle_relay(
        &mut self,
        now: Instant,
        hop: usize,
        tag: onionlab_crypto::SendmeTag,
        body: relay::BoxedCellBody,
    ) {
        let (stream, msg) = match relay::decode(body) {
            Ok(x) => x,
            Err(e) => return self.violation(format!("undecodable relay message: {e}")),
        };
        let for_the_set = || {
            stream.is_some()
                || matches!(
                    msg,
                    AnyRelayMsg::ConfluxLinked(_) | AnyRelayMsg::ConfluxSwitch(_)
                )
        };
        if self.leg.is_some() && self.is_stream_hop(hop) && for_the_set() {
            if matches!(msg, AnyRelayMsg::Data(_)) {
                self.on_circuit_data(hop, tag);
                if self.closed {
                    return;
                }
            }
            self.on_leg_message(now, stream, msg);
            return;
        }
        match (stream, msg) {
            (
                Some(id),
                msg @ (AnyRelayMsg::Data(_)
                | AnyRelayMsg::Sendme(_)
                | AnyRelayMsg::Xon(_)
                | AnyRelayMsg::Xoff(_)
                | AnyRelayMsg::Connected(_)
                | AnyRelayMsg::End(_)
                | AnyRelayMsg::Resolved(_)),
            ) => self.on_stream_msg(now, hop, tag, id, msg),
            (None, AnyRelayMsg::Sendme(s)) => {
                let Some(h) = self.hops.get_mut(hop) else {
                    return;
                };
                if let Err(e) = h
                    .sender
                    .on_sendme(s.into_sendme_tag().as_ref().map(|t| t.as_ref()), now)
                {
                    self.violation(e);
                }
            }
            (None, AnyRelayMsg::Extended2(e)) => {
                if hop + 1 != self.hops.len() || !self.is_extending() {
                    return self.violation("unexpected EXTENDED2");
                }
                self.finish_hop(&e.into_body());
            }
            (None, AnyRelayMsg::Truncated(t)) => {
                let reason = t.reason();
                // Hop `hop` says everything beyond it is gone. Circuit
                // failure is circuit death: we tear the rest down too, so
                // no stream can ever end at a hop that is not the exit we
                // chose (tor's clients do the same).
                let detail = format!(
                    "hop {} sent TRUNCATED ({}): hop {} is gone",
                    hop + 1,
                    reason.human_str(),
                    hop + 2
                );
                self.hop_failed(hop + 1, detail.clone());
                self.close(CloseReason {
                    reason,
                    detail,
                    by_peer: false,
                    kind: crate::err::CloseKind::Truncated,
                });
            }
            (_, AnyRelayMsg::Drop(_)) => {}
            (_, other) => self.violation(format!("unexpected {} message", other.cmd())),
        }
    }

    fn hop_failed(&mut self, hop: usize, detail: String) {
        self.events
            .push_back(ClientEvent::HopFailed { hop, detail });
    }

    fn is_stream_hop(&self, hop: usize) -> bool {
        self.stream_hop == Some(hop)
    }

    fn on_circuit_data(&mut self, hop: usize, tag: onionlab_crypto::SendmeTag) {
        let Some(h) = self.hops.get_mut(hop) else {
            return;
        };
        match h.receiver.on_data(tag) {
            Ok(Some(tag)) => {
                let _ = self.queue(PendingMsg {
                    hop,
                    stream: None,
                    msg: Sendme::new_tag(tag).into(),
                    early: false,
                });
            }
            Ok(None) => {}
            Err(e) => self.violation(e),
        }
    }

    /// A stream message from hop `hop`: DATA counts against the circuit
    /// window first; then the streams handle it.
    fn on_stream_msg(
        &mut self,
        now: Instant,
        hop: usize,
        tag: onionlab_crypto::SendmeTag,
        id: StreamId,
        msg: AnyRelayMsg,
    ) {
        if !self.is_stream_hop(hop) {
            return self.violation(format!("{} from a hop without streams", msg.cmd()));
        }
        if matches!(msg, AnyRelayMsg::Data(_)) {
            self.on_circuit_data(hop, tag);
            if self.closed {
                return;
            }
        }
        let handled = self.streams.handle(now, id, msg);
        self.take_stream_events();
        if let Err(e) = handled {
            self.violation(e.to_string());
        }
    }

    /// Move the streams' events into the circuit's, in order.
    fn take_stream_events(&mut self) {
        while let Some(ev) = self.streams.poll_event() {
            self.events.push_back(ev);
        }
    }

    /// Does the circuit have a cell to send now?
    pub fn wants_transmit(&self) -> bool {
        !self.chan_out.is_empty()
            || (!self.closed
                && (!self.control.is_empty()
                    || self.leg_output_ready()
                    || self.stream_hop.is_some_and(|h| {
                        self.streams
                            .has_work(self.hops.get(h).is_some_and(|x| x.sender.can_send()))
                    })))
    }

    /// The next cell to send to the guard on this circuit, if any.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<AnyChanMsg> {
        if let Some(cell) = self.chan_out.pop_front() {
            self.arm_deadline(now);
            return Some(cell);
        }
        if self.closed {
            return None;
        }
        if let Some(m) = self.control.pop_front() {
            let is_extend = m.early;
            let cell = self.seal(m, now);
            if is_extend {
                self.arm_deadline(now);
            }
            return cell;
        }
        if self.leg_output_ready() {
            let m = self.next_leg_output()?;
            return self.seal(m, now);
        }
        let hop = self.stream_hop?;
        let window_open = self.hops.get(hop)?.sender.can_send();
        let out = self.streams.next_outgoing(window_open)?;
        self.take_stream_events();
        match out {
            Ok((id, msg)) => self.seal(
                PendingMsg {
                    hop,
                    stream: Some(id),
                    msg,
                    early: false,
                },
                now,
            ),
            Err(e) => {
                self.close(CloseReason::local(DestroyReason::INTERNAL, format!("{e}")));
                self.chan_out.pop_front()
            }
        }
    }

    fn arm_deadline(&mut self, now: Instant) {
        if let Build::Awaiting { deadline, .. } = &mut self.build {
            deadline.get_or_insert(now + self.config.hop_timeout);
        }
    }

    /// Encode, encrypt and wrap one relay message.
    fn seal(&mut self, m: PendingMsg, now: Instant) -> Option<AnyChanMsg> {
        let is_data = matches!(m.msg, AnyRelayMsg::Data(_));
        if matches!(m.msg, AnyRelayMsg::ConfluxLink(_)) {
            self.on_link_sent(now);
        }
        let mut body = match relay::encode(m.stream, m.msg, &mut self.rng) {
            Ok(b) => b,
            Err(e) => {
                self.close(CloseReason::local(DestroyReason::INTERNAL, format!("{e}")));
                return self.chan_out.pop_front();
            }
        };
        let tag = match self.crypto.encrypt_outbound(&mut body, m.hop) {
            Ok(t) => t,
            Err(e) => {
                self.close(CloseReason::local(DestroyReason::INTERNAL, format!("{e}")));
                return self.chan_out.pop_front();
            }
        };
        if is_data {
            if let Some(h) = self.hops.get_mut(m.hop) {
                h.sender.on_data_sent(tag, now);
            }
        }
        let relay = Relay::from(body);
        if m.early && self.relay_early_left > 0 {
            self.relay_early_left -= 1;
            Some(relay.into_early())
        } else {
            Some(relay.into())
        }
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        self.events.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.build {
            Build::Awaiting { deadline, .. } if !self.closed => *deadline,
            _ => None,
        }
    }

    /// Let time pass: a hop that took too long to answer closes the circuit.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.poll_timeout().is_some_and(|d| now >= d) {
            let detail = format!("hop {} did not answer in time", self.hops.len() + 1);
            self.hop_failed(self.hops.len(), detail.clone());
            self.close(CloseReason::local(DestroyReason::TIMEOUT, detail));
        }
    }

    /// Bytes held by this circuit: queued cells and stream buffers.
    pub fn queued_bytes(&self) -> usize {
        (self.chan_out.len()
            + self.control.len()
            + self.streams.queued_control()
            + self.leg.as_ref().map_or(0, leg::Leg::queued))
            * crate::QUEUED_CELL_BYTES
            + self.streams.buffered_bytes()
    }
}

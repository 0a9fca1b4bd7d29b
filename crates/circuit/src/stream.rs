//! Stream endpoints: the streams a client opens and an exit serves.
//!
//! Both ends keep the same state per stream: its flow control, a bounded
//! buffer of bytes waiting to be packaged into DATA cells, and the received
//! cells not yet read by the application. Sent data is bounded by
//! [`StreamConfig::send_buffer`]. Received data is bounded by the stream
//! window under fixed windows (see [`StreamWindows::take_sendme`]); under
//! congestion control the receiving edge sends XOFF past its limit and XON
//! once drained ([`crate::xonxoff`]), and a peer that goes on sending
//! past [`StreamConfig::max_unread_bytes`] breaks the protocol.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use bytes::{Buf, Bytes, BytesMut};
use onionlab_cell::msg::RelayCmd;
use onionlab_cell::msg::{AnyRelayMsg, EndReason, Sendme, StreamId, Xoff, Xon};
use onionlab_cell::relay::MAX_DATA_LEN;

use crate::flow::StreamWindows;
use crate::xonxoff::{
    EdgePosition, FlowAction, XonXoffError, XonXoffParams, XonXoffReceiver, XonXoffSender,
};

/// How the other end broke the stream protocol (tor-spec section 6, and
/// proposal 324's XON/XOFF): the circuit closes as a violation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamViolation {
    /// A BEGIN or RESOLVE (named) on a stream ID in use, or past the
    /// stream limit.
    #[error("{0} on a stream ID in use (or too many streams)")]
    IdInUse(&'static str),
    /// A message (named) for a stream that is neither open nor recently
    /// ended.
    #[error("{0} for an unknown stream")]
    UnknownStream(&'static str),
    /// A RESOLVED on a stream that asked for no resolution.
    #[error("RESOLVED without a RESOLVE")]
    UnaskedResolved,
    /// A relay message that has no place on a stream.
    #[error("unexpected {0} message on a stream")]
    Unexpected(RelayCmd),
    /// A stream's window, data or state rule broken (what was wrong).
    #[error("{0}")]
    Flow(&'static str),
    /// An XON or XOFF the sending edge refuses.
    #[error("{0}")]
    XonXoff(#[from] XonXoffError),
    /// Our own control messages for the stream overflowed their queue
    /// (the peer provoked more than the queue holds).
    #[error("stream control queue overflow")]
    ControlOverflow,
}

/// Limits of one stream.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// Bytes the application may queue for sending before `write` accepts less.
    pub send_buffer: usize,
    /// Most streams open (including half-closed ones) on one circuit.
    pub max_streams: usize,
    /// Most half-closed stream IDs remembered per circuit.
    pub max_half_closed: usize,
    /// Under XON/XOFF, most received bytes a stream holds unread before the
    /// peer is taken to ignore XOFF (the circuit is closed). An honest
    /// sender stops within one congestion window of the XOFF; 16 MiB is
    /// more than any window of the networks we emulate (100 Mbit/s x
    /// 600 ms is 7.5 MB). Under fixed windows the stream window binds.
    pub max_unread_bytes: usize,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            send_buffer: 64 * 1024,
            max_streams: 1024,
            max_half_closed: 512,
            max_unread_bytes: 16 << 20,
        }
    }
}

/// How the streams of a circuit are flow-controlled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamFlowKind {
    /// tor-spec's stream windows and stream-level SENDMEs.
    #[default]
    Windows,
    /// Proposal 324's XON/XOFF, with this end's position and its peer's.
    XonXoff {
        /// The parameters.
        params: XonXoffParams,
        /// This end.
        local: EdgePosition,
        /// The other end of the streams.
        peer: EdgePosition,
    },
}

/// The flow-control state of one stream.
#[derive(Debug)]
enum StreamFlow {
    Windows(StreamWindows),
    XonXoff {
        rx: XonXoffReceiver,
        tx: XonXoffSender,
    },
}

impl StreamFlow {
    fn new(kind: StreamFlowKind) -> Self {
        match kind {
            StreamFlowKind::Windows => StreamFlow::Windows(StreamWindows::default()),
            StreamFlowKind::XonXoff {
                params,
                local,
                peer,
            } => StreamFlow::XonXoff {
                rx: XonXoffReceiver::new(params, local),
                tx: XonXoffSender::new(params, local, peer),
            },
        }
    }

    /// May a DATA cell be packaged on this stream?
    fn can_package(&self) -> bool {
        match self {
            StreamFlow::Windows(w) => w.package > 0,
            StreamFlow::XonXoff { tx, .. } => tx.can_package(),
        }
    }

    /// Bytes the edge may hand over now (an XON's rate; else unlimited).
    fn allowance(&mut self, now: Instant) -> usize {
        match self {
            StreamFlow::Windows(_) => usize::MAX,
            StreamFlow::XonXoff { tx, .. } => {
                usize::try_from(tx.allowance(now)).unwrap_or(usize::MAX)
            }
        }
    }

    fn on_packaged(&mut self, bytes: usize) {
        match self {
            StreamFlow::Windows(w) => w.package -= 1,
            StreamFlow::XonXoff { tx, .. } => tx.on_data_sent(bytes),
        }
    }
}

/// A stream-level flow-control message a stream endpoint owes its peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamFeedback {
    /// A stream-level SENDME (fixed windows).
    Sendme,
    /// An XON or XOFF (congestion control).
    Flow(FlowAction),
}

impl StreamFeedback {
    /// The relay message to send on the stream.
    pub(crate) fn into_msg(self) -> AnyRelayMsg {
        use onionlab_cell::msg::{FlowCtrlVersion, XonKBpsEwma};
        match self {
            StreamFeedback::Sendme => Sendme::new_empty().into(),
            StreamFeedback::Flow(FlowAction::SendXoff) => Xoff::new(FlowCtrlVersion::V0).into(),
            StreamFeedback::Flow(FlowAction::SendXon { kbps }) => {
                let rate = std::num::NonZeroU32::new(kbps)
                    .map_or(XonKBpsEwma::Unlimited, XonKBpsEwma::Limited);
                Xon::new(FlowCtrlVersion::V0, rate).into()
            }
        }
    }
}

/// Where a stream is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamState {
    /// BEGIN sent (client) or received (exit); waiting for CONNECTED.
    Connecting,
    /// Data may flow both ways.
    Open,
}

/// One stream endpoint.
#[derive(Debug)]
pub(crate) struct Stream {
    pub(crate) state: StreamState,
    flow: StreamFlow,
    send_buf: BytesMut,
    recv: VecDeque<Bytes>,
    recv_bytes: usize,
    /// The application asked to close once the send buffer is flushed.
    pub(crate) close_requested: bool,
    /// The reason of that deferred END (DONE unless the application said
    /// otherwise, e.g. an exit whose target reset the connection).
    close_reason: EndReason,
    /// Is the stream in the packaging round robin?
    in_rr: bool,
}

impl Stream {
    fn new(state: StreamState, flow: StreamFlowKind) -> Self {
        Stream {
            state,
            flow: StreamFlow::new(flow),
            send_buf: BytesMut::new(),
            recv: VecDeque::new(),
            recv_bytes: 0,
            close_requested: false,
            close_reason: EndReason::DONE,
            in_rr: false,
        }
    }
}

/// What happened to a stream that the circuit reports upward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// The exit connected the stream (client side).
    Connected {
        /// The stream.
        stream: StreamId,
    },
    /// Data arrived on a stream whose receive buffer was empty.
    Readable {
        /// The stream.
        stream: StreamId,
    },
    /// Room appeared in a stream's send buffer after it had refused bytes.
    Writable {
        /// The stream.
        stream: StreamId,
    },
    /// The peer ended the stream (or refused to open it). Data already
    /// received can still be read.
    Ended {
        /// The stream.
        stream: StreamId,
        /// The reason in the peer's END.
        reason: EndReason,
    },
}

/// The streams of one circuit endpoint (all at one hop).
#[derive(Debug)]
pub(crate) struct StreamMap {
    config: StreamConfig,
    flow: StreamFlowKind,
    /// Only looked up (and summed): the packaging order is `rr`'s, so the
    /// map's random hash order never shows.
    streams: HashMap<u16, Stream>,
    /// Streams we ended whose peer may still have cells in flight.
    half_closed: VecDeque<u16>,
    /// Streams ended by the peer with data not yet read by the application.
    /// Only looked up (and summed).
    draining: HashMap<u16, VecDeque<Bytes>>,
    /// Round-robin order for packaging DATA.
    rr: VecDeque<u16>,
    next_id: u16,
    /// Streams whose writer was refused bytes and wants a Writable event.
    blocked_writers: Vec<u16>,
    /// Bytes in all send buffers, receive buffers and `draining`, kept up
    /// to date so memory accounting is O(1).
    buffered: usize,
}

impl StreamMap {
    pub(crate) fn new(config: StreamConfig, flow: StreamFlowKind) -> Self {
        StreamMap {
            config,
            flow,
            streams: HashMap::new(),
            half_closed: VecDeque::new(),
            draining: HashMap::new(),
            rr: VecDeque::new(),
            next_id: 1,
            blocked_writers: Vec::new(),
            buffered: 0,
        }
    }

    /// Allocate an unused stream ID and open a stream in `Connecting`.
    pub(crate) fn open_local(&mut self) -> Option<StreamId> {
        if self.occupied() >= self.config.max_streams {
            return None;
        }
        for _ in 0..=u16::MAX {
            let id = self.next_id;
            self.next_id = self.next_id.checked_add(1).unwrap_or(1);
            if !self.in_use(id) {
                self.streams
                    .insert(id, Stream::new(StreamState::Connecting, self.flow));
                return StreamId::new(id);
            }
        }
        None
    }

    /// Register a stream the peer asked for (exit side). False if the ID is
    /// open (or still draining) or the circuit has too many streams. An ID
    /// we ended ourselves may be reused: the peer has seen our END.
    pub(crate) fn open_remote(&mut self, id: StreamId) -> bool {
        let id = u16::from(id);
        self.half_closed.retain(|h| *h != id);
        if self.in_use(id) || self.occupied() >= self.config.max_streams {
            return false;
        }
        self.streams
            .insert(id, Stream::new(StreamState::Connecting, self.flow));
        true
    }

    /// Stream IDs taken: open, half-closed, or ended with data unread.
    fn occupied(&self) -> usize {
        self.streams.len() + self.half_closed.len() + self.draining.len()
    }

    /// Forget stream `id` entirely (a RESOLVE that was answered).
    pub(crate) fn forget(&mut self, id: StreamId) {
        self.remove_stream(u16::from(id));
    }

    /// Remove stream `id` from `streams`, dropping its buffers from the count.
    fn remove_stream(&mut self, id: u16) -> Option<Stream> {
        let s = self.streams.remove(&id)?;
        self.buffered -= s.send_buf.len() + s.recv_bytes;
        Some(s)
    }

    fn in_use(&self, id: u16) -> bool {
        self.streams.contains_key(&id)
            || self.half_closed.contains(&id)
            || self.draining.contains_key(&id)
    }

    pub(crate) fn get_mut(&mut self, id: StreamId) -> Option<&mut Stream> {
        self.streams.get_mut(&u16::from(id))
    }

    pub(crate) fn get(&self, id: StreamId) -> Option<&Stream> {
        self.streams.get(&u16::from(id))
    }

    /// Is `id` one we ended recently (cells for it are tolerated and dropped)?
    pub(crate) fn is_half_closed(&self, id: StreamId) -> bool {
        self.half_closed.contains(&u16::from(id))
    }

    pub(crate) fn len(&self) -> usize {
        self.streams.len()
    }

    /// Queue application bytes at `now`; returns how many were accepted:
    /// as many as the send buffer has room for and an XON's rate allows
    /// ([`resumes_at`](Self::resumes_at) says when the rate allows more).
    pub(crate) fn write(&mut self, id: StreamId, data: &[u8], now: Instant) -> Option<usize> {
        let limit = self.config.send_buffer;
        let raw = u16::from(id);
        let s = self.streams.get_mut(&raw)?;
        if s.close_requested {
            return Some(0);
        }
        let room = limit.saturating_sub(s.send_buf.len());
        let n = data.len().min(room).min(s.flow.allowance(now));
        if let StreamFlow::XonXoff { tx, .. } = &mut s.flow {
            tx.take(n);
        }
        s.send_buf.extend_from_slice(&data[..n]);
        self.buffered += n;
        if n > 0 && !s.in_rr {
            s.in_rr = true;
            self.rr.push_back(raw);
        }
        // Woken once the buffer has room; a writer held back by the rate
        // alone waits for `resumes_at` instead.
        if n == room && n < data.len() && !self.blocked_writers.contains(&raw) {
            self.blocked_writers.push(raw);
        }
        Some(n)
    }

    /// When `id`'s XON rate will let its edge hand over bytes again, if it
    /// does not now (`None`: no rate, enough allowance, or no such stream).
    /// An edge refused for the rate should retry then: no event marks it.
    pub(crate) fn resumes_at(&self, id: StreamId) -> Option<Instant> {
        match &self.streams.get(&u16::from(id))?.flow {
            StreamFlow::Windows(_) => None,
            StreamFlow::XonXoff { tx, .. } => tx.resumes_at(),
        }
    }

    /// The application will write no more: END (reason DONE) after the
    /// buffer drains.
    pub(crate) fn request_close(&mut self, id: StreamId) -> bool {
        self.request_close_with(id, EndReason::DONE)
    }

    /// The application will write no more: END with `reason` after the
    /// buffer drains. A later call before the END is sent replaces the
    /// reason.
    pub(crate) fn request_close_with(&mut self, id: StreamId, reason: EndReason) -> bool {
        let raw = u16::from(id);
        match self.streams.get_mut(&raw) {
            Some(s) => {
                s.close_requested = true;
                s.close_reason = reason;
                if !s.in_rr {
                    s.in_rr = true;
                    self.rr.push_back(raw);
                }
                true
            }
            None => false,
        }
    }

    /// Streams that have something to package (DATA or a deferred END),
    /// given whether the circuit window allows DATA.
    pub(crate) fn has_work(&self, circ_window_open: bool) -> bool {
        self.rr.iter().any(|id| {
            self.streams.get(id).is_some_and(|s| {
                s.state == StreamState::Open
                    && ((circ_window_open && s.flow.can_package() && !s.send_buf.is_empty())
                        || (s.close_requested && s.send_buf.is_empty()))
            })
        })
    }

    /// Next thing to package, round robin over streams: a DATA chunk (when
    /// `circ_window_open`) or an END, with the reason given to
    /// [`request_close_with`](Self::request_close_with), for a stream whose
    /// close was requested and whose buffer is empty.
    pub(crate) fn next_packaged(&mut self, circ_window_open: bool) -> Option<Packaged> {
        self.next_packaged_from(circ_window_open, false)
    }

    /// [`next_packaged`](Self::next_packaged), but a stream with less than
    /// a full cell buffered and no close requested keeps its bytes (and
    /// its place) for later: what an eager exit packages as bytes arrive
    /// (C tor packages whole cells after each read).
    pub(crate) fn next_whole_packaged(&mut self, circ_window_open: bool) -> Option<Packaged> {
        self.next_packaged_from(circ_window_open, true)
    }

    fn next_packaged_from(
        &mut self,
        circ_window_open: bool,
        whole_cells_only: bool,
    ) -> Option<Packaged> {
        for _ in 0..self.rr.len() {
            let id = self.rr.pop_front()?;
            let Some(s) = self.streams.get_mut(&id) else {
                continue;
            };
            if s.state != StreamState::Open {
                // Not connected yet: keep its place.
                self.rr.push_back(id);
                continue;
            }
            if !s.send_buf.is_empty() {
                let partial = s.send_buf.len() < MAX_DATA_LEN && !s.close_requested;
                if circ_window_open && s.flow.can_package() && !(whole_cells_only && partial) {
                    let n = s.send_buf.len().min(MAX_DATA_LEN);
                    let chunk = s.send_buf.split_to(n).freeze();
                    self.buffered -= n;
                    s.flow.on_packaged(n);
                    if !s.send_buf.is_empty() || s.close_requested {
                        self.rr.push_back(id);
                    } else {
                        s.in_rr = false;
                    }
                    return StreamId::new(id).map(|sid| Packaged::Data(sid, chunk));
                }
                self.rr.push_back(id);
                continue;
            }
            if s.close_requested {
                let reason = s.close_reason;
                self.remove_stream(id);
                self.remember_half_closed(id);
                return StreamId::new(id).map(|sid| Packaged::End(sid, reason));
            }
            // Nothing to send: leave the rotation until the next write.
            s.in_rr = false;
        }
        None
    }

    /// Drain writers that were refused bytes and now have room.
    pub(crate) fn take_writable(&mut self) -> Vec<StreamId> {
        let limit = self.config.send_buffer;
        let streams = &self.streams;
        let mut ready = Vec::new();
        self.blocked_writers.retain(|id| match streams.get(id) {
            Some(s) if s.send_buf.len() < limit => {
                ready.extend(StreamId::new(*id));
                false
            }
            Some(_) => true,
            None => false,
        });
        ready
    }

    /// DATA arrived for a stream at `now`. Returns Err on a flow-control
    /// violation (or DATA before CONNECTED where that is not allowed);
    /// otherwise whether the receive buffer was empty before, and the XOFF
    /// to send if the buffer just passed its limit.
    ///
    /// `optimistic`: accept DATA on a stream still connecting. An exit does
    /// (tor clients send "optimistic data" right behind BEGIN); a client
    /// does not (the exit must answer CONNECTED first).
    pub(crate) fn on_data(
        &mut self,
        id: StreamId,
        data: Bytes,
        optimistic: bool,
        now: Instant,
    ) -> Result<(bool, Option<StreamFeedback>), &'static str> {
        let max_unread = self.config.max_unread_bytes;
        let s = self
            .streams
            .get_mut(&u16::from(id))
            .ok_or("DATA for a stream that is not open")?;
        if s.state != StreamState::Open && !optimistic {
            return Err("DATA before the stream was connected");
        }
        let feedback = match &mut s.flow {
            StreamFlow::Windows(w) => {
                w.on_data()?;
                None
            }
            StreamFlow::XonXoff { rx, .. } => {
                if s.recv_bytes + data.len() > max_unread {
                    return Err("peer ignores XOFF: too much stream data unread");
                }
                rx.on_data(data.len(), now).map(StreamFeedback::Flow)
            }
        };
        let was_empty = s.recv.is_empty();
        if !data.is_empty() {
            s.recv_bytes += data.len();
            self.buffered += data.len();
            s.recv.push_back(data);
        }
        Ok((was_empty && s.recv_bytes > 0, feedback))
    }

    /// A stream-level SENDME arrived for `id`.
    pub(crate) fn on_sendme(&mut self, id: StreamId) -> Result<(), &'static str> {
        let half_closed = self.is_half_closed(id);
        match self.streams.get_mut(&u16::from(id)).map(|s| &mut s.flow) {
            Some(StreamFlow::Windows(w)) => w.on_sendme(),
            Some(StreamFlow::XonXoff { .. }) => {
                Err("stream SENDME on a circuit with congestion control")
            }
            None if half_closed => Ok(()),
            None => Err("stream SENDME for an unknown stream"),
        }
    }

    /// An XOFF (`xon: None`) or an XON with its rate in KB/s arrived for
    /// `id`. Errors are protocol violations that close the circuit.
    pub(crate) fn on_xon_xoff(
        &mut self,
        id: StreamId,
        version: u8,
        xon: Option<u32>,
    ) -> Result<(), StreamViolation> {
        let half_closed = self.is_half_closed(id);
        match self.streams.get_mut(&u16::from(id)).map(|s| &mut s.flow) {
            Some(StreamFlow::XonXoff { tx, .. }) => {
                let result = match xon {
                    Some(kbps) => tx.on_xon(version, kbps),
                    None => tx.on_xoff(version),
                };
                let at_exit = matches!(
                    self.flow,
                    StreamFlowKind::XonXoff {
                        local: EdgePosition::Exit,
                        ..
                    }
                );
                match result {
                    Ok(()) => Ok(()),
                    // At an exit the stream is already stopped: a repeated
                    // XOFF changes nothing and harms no one. A client
                    // refuses it: XOFFs that change nothing could carry a
                    // signal from a hostile exit (the dropmark concern of
                    // proposal 324 section 4.1.4).
                    Err(e) if !e.closes_circuit() && at_exit => {
                        tracing::debug!(stream = u16::from(id), "ignored: {e}");
                        Ok(())
                    }
                    Err(e) => Err(e.into()),
                }
            }
            Some(StreamFlow::Windows(_)) => Err(StreamViolation::Flow(
                "XON/XOFF on a circuit without congestion control",
            )),
            // XON/XOFF may cross our END.
            None if half_closed => Ok(()),
            None => Err(StreamViolation::UnknownStream("XON/XOFF")),
        }
    }

    /// CONNECTED arrived for `id`: Ok(true) if the stream is now open,
    /// Ok(false) if we had already ended it.
    pub(crate) fn on_connected(&mut self, id: StreamId) -> Result<bool, &'static str> {
        let half_closed = self.is_half_closed(id);
        match self.streams.get_mut(&u16::from(id)) {
            Some(s) if s.state == StreamState::Connecting => {
                s.state = StreamState::Open;
                Ok(true)
            }
            Some(_) => Err("CONNECTED on an open stream"),
            None if half_closed => Ok(false),
            None => Err("CONNECTED for an unknown stream"),
        }
    }

    /// Read received bytes into `buf` at `now`. Returns bytes read and the
    /// flow-control message now due, if any.
    pub(crate) fn read(
        &mut self,
        id: StreamId,
        buf: &mut [u8],
        now: Instant,
    ) -> Option<(usize, Option<StreamFeedback>)> {
        self.read_with(id, now, |chunks| {
            let mut n = 0;
            for c in chunks {
                let k = c.len().min(buf.len() - n);
                buf[n..n + k].copy_from_slice(&c[..k]);
                n += k;
                if n == buf.len() {
                    break;
                }
            }
            n
        })
    }

    /// Hand the received bytes of `id` (up to [`READ_WITH_CHUNKS`] cells'
    /// worth, in order) to `consume`, which returns how many it took; those
    /// are removed. For a driver that writes straight from the stream's
    /// buffer to its target (no copy held per stream). Returns bytes
    /// consumed and the flow-control message now due, if any.
    pub(crate) fn read_with(
        &mut self,
        id: StreamId,
        now: Instant,
        consume: impl FnOnce(&[&[u8]]) -> usize,
    ) -> Option<(usize, Option<StreamFeedback>)> {
        let raw = u16::from(id);
        if let Some(s) = self.streams.get_mut(&raw) {
            let n = consume_front(&mut s.recv, consume);
            s.recv_bytes -= n;
            self.buffered -= n;
            let feedback = match &mut s.flow {
                StreamFlow::Windows(w) => (s.state == StreamState::Open
                    && w.take_sendme(s.recv.len()))
                .then_some(StreamFeedback::Sendme),
                StreamFlow::XonXoff { rx, .. } if n > 0 => {
                    rx.on_drain(n, now).map(StreamFeedback::Flow)
                }
                StreamFlow::XonXoff { .. } => None,
            };
            return Some((n, feedback));
        }
        let q = self.draining.get_mut(&raw)?;
        let n = consume_front(q, consume);
        self.buffered -= n;
        if q.is_empty() {
            self.draining.remove(&raw);
        }
        Some((n, None))
    }

    /// Bytes [`write`](Self::write) would accept on `id` at `now`; `None`
    /// for an unknown stream, 0 for a closing one. When a stream with no
    /// buffer room is asked, its writer is woken
    /// ([`take_writable`](Self::take_writable)) once there is room, as after
    /// a refused write; one held back by an XON's rate waits for
    /// [`resumes_at`](Self::resumes_at).
    pub(crate) fn write_room(&mut self, id: StreamId, now: Instant) -> Option<usize> {
        let raw = u16::from(id);
        let s = self.streams.get_mut(&raw)?;
        if s.close_requested {
            return Some(0);
        }
        let room = self.config.send_buffer.saturating_sub(s.send_buf.len());
        if room == 0 && !self.blocked_writers.contains(&raw) {
            self.blocked_writers.push(raw);
        }
        Some(room.min(s.flow.allowance(now)))
    }

    /// Bytes received and not yet read on `id`.
    pub(crate) fn readable_bytes(&self, id: StreamId) -> usize {
        let raw = u16::from(id);
        match self.streams.get(&raw) {
            Some(s) => s.recv_bytes,
            None => self
                .draining
                .get(&raw)
                .map_or(0, |q| q.iter().map(Bytes::len).sum()),
        }
    }

    /// The peer ended the stream: forget it, keeping unread data readable.
    pub(crate) fn on_end(&mut self, id: StreamId) {
        let raw = u16::from(id);
        if let Some(s) = self.remove_stream(raw) {
            if !s.recv.is_empty() {
                self.buffered += s.recv_bytes;
                self.draining.insert(raw, s.recv);
            }
        }
        self.half_closed.retain(|h| *h != raw);
    }

    /// We end the stream at once (dropping unsent data); its ID stays
    /// half-closed so in-flight cells from the peer are tolerated.
    pub(crate) fn abort(&mut self, id: StreamId) -> bool {
        let raw = u16::from(id);
        if let Some(q) = self.draining.remove(&raw) {
            self.buffered -= q.iter().map(Bytes::len).sum::<usize>();
        }
        if self.remove_stream(raw).is_some() {
            self.remember_half_closed(raw);
            true
        } else {
            false
        }
    }

    fn remember_half_closed(&mut self, id: u16) {
        if self.half_closed.len() >= self.config.max_half_closed {
            self.half_closed.pop_front();
        }
        self.half_closed.push_back(id);
    }

    /// Bytes held in send and receive buffers (for memory accounting):
    /// O(1), from a running count.
    pub(crate) fn buffered_bytes(&self) -> usize {
        debug_assert_eq!(self.buffered, self.recount_buffered());
        self.buffered
    }

    /// [`buffered_bytes`](Self::buffered_bytes) recomputed from the buffers.
    fn recount_buffered(&self) -> usize {
        self.streams
            .values()
            .map(|s| s.send_buf.len() + s.recv_bytes)
            .sum::<usize>()
            + self
                .draining
                .values()
                .flat_map(|q| q.iter().map(Bytes::len))
                .sum::<usize>()
    }
}

impl StreamFlowKind {
    /// The stream flow control of the edge at `local` (a client or an
    /// exit, the peer being the other) under circuit congestion control
    /// `cc`: XON/XOFF with Vegas, stream windows otherwise.
    pub(crate) fn at(cc: crate::flow::CircuitCc, local: EdgePosition) -> Self {
        match cc.xon_xoff() {
            None => StreamFlowKind::Windows,
            Some(params) => StreamFlowKind::XonXoff {
                params,
                local,
                peer: match local {
                    EdgePosition::Exit => EdgePosition::Client,
                    EdgePosition::Client | EdgePosition::OnionService => EdgePosition::Exit,
                },
            },
        }
    }
}

/// Something a stream wants sent, with the reason of an END.
#[derive(Debug)]
pub(crate) enum Packaged {
    /// A DATA message.
    Data(StreamId, Bytes),
    /// An END message with its reason.
    End(StreamId, EndReason),
}

/// The relay message of what a stream packaged (DATA of at most one
/// cell's worth, or END with its reason), with its stream.
pub(crate) fn packaged_message(p: Packaged) -> Result<(StreamId, AnyRelayMsg), crate::Error> {
    match p {
        Packaged::Data(id, bytes) => onionlab_cell::msg::Data::new(&bytes)
            .map(|d| (id, d.into()))
            .map_err(|e| {
                crate::Error::Cell(onionlab_cell::Error::Encode {
                    what: "DATA message",
                    source: e,
                })
            }),
        Packaged::End(id, reason) => {
            Ok((id, onionlab_cell::msg::End::new_with_reason(reason).into()))
        }
    }
}

/// The rate of a received XON in KB/s, 0 for unlimited (as on the wire).
pub(crate) fn xon_rate_kbps(rate: onionlab_cell::msg::XonKBpsEwma) -> u32 {
    match rate {
        onionlab_cell::msg::XonKBpsEwma::Limited(r) => r.get(),
        onionlab_cell::msg::XonKBpsEwma::Unlimited => 0,
    }
}

/// Most chunks (received cells) `StreamMap::read_with` shows at once.
pub const READ_WITH_CHUNKS: usize = 64;

/// Show the front chunks of `q` to `consume` and remove the bytes it took.
fn consume_front(q: &mut VecDeque<Bytes>, consume: impl FnOnce(&[&[u8]]) -> usize) -> usize {
    let chunks: Vec<&[u8]> = q.iter().take(READ_WITH_CHUNKS).map(|b| &b[..]).collect();
    let offered: usize = chunks.iter().map(|c| c.len()).sum();
    let n = consume(&chunks).min(offered);
    let mut left = n;
    while left > 0 {
        let Some(front) = q.front_mut() else { break };
        let k = front.len().min(left);
        front.advance(k);
        left -= k;
        if front.is_empty() {
            q.pop_front();
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Instant {
        Instant::now()
    }

    fn open(map: &mut StreamMap) -> StreamId {
        let id = map.open_local().expect("free id");
        map.get_mut(id).expect("stream").state = StreamState::Open;
        id
    }

    #[test]
    fn write_room_reports_the_space_and_wakes_the_writer_when_full() {
        let mut map = StreamMap::new(
            StreamConfig {
                send_buffer: 1000,
                ..StreamConfig::default()
            },
            StreamFlowKind::Windows,
        );
        let id = open(&mut map);
        assert_eq!(map.write_room(id, now()), Some(1000));
        assert_eq!(map.write(id, &[1; 1000], now()), Some(1000));
        assert_eq!(map.write_room(id, now()), Some(0));
        assert!(map.take_writable().is_empty());
        let Some(Packaged::Data(..)) = map.next_packaged(true) else {
            panic!("expected DATA")
        };
        assert_eq!(map.take_writable(), vec![id]);
        assert_eq!(map.write_room(id, now()), Some(MAX_DATA_LEN));
        assert_eq!(map.write_room(StreamId::new(999).expect("id"), now()), None);
    }

    #[test]
    fn read_with_removes_exactly_what_was_taken_across_cells() {
        let mut map = StreamMap::new(StreamConfig::default(), StreamFlowKind::Windows);
        let id = open(&mut map);
        for part in [&b"hello "[..], b"onion ", b"world"] {
            map.on_data(id, Bytes::copy_from_slice(part), false, now())
                .expect("data");
        }
        let mut seen = Vec::new();
        let (n, _) = map
            .read_with(id, now(), |chunks| {
                seen = chunks.iter().map(|c| c.to_vec()).collect();
                8 // "hello on"
            })
            .expect("stream");
        assert_eq!(n, 8);
        assert_eq!(seen.len(), 3);
        assert_eq!(map.readable_bytes(id), 9);
        let (n, _) = map.read_with(id, now(), |_| 1000).expect("stream");
        assert_eq!(n, 9, "never more than was offered");
        let mut buf = [0u8; 4];
        assert_eq!(map.read(id, &mut buf, now()), Some((0, None)));
        map.on_data(id, Bytes::from_static(b"abcdef"), false, now())
            .expect("data");
        assert_eq!(map.read(id, &mut buf, now()).map(|r| r.0), Some(4));
        assert_eq!(&buf, b"abcd");
        assert_eq!(map.readable_bytes(id), 2);
    }

    #[test]
    fn send_buffer_is_bounded_and_reports_writable() {
        let mut map = StreamMap::new(
            StreamConfig {
                send_buffer: 1000,
                ..StreamConfig::default()
            },
            StreamFlowKind::Windows,
        );
        let id = open(&mut map);
        assert_eq!(map.write(id, &[1; 1500], now()), Some(1000));
        assert_eq!(map.write(id, &[1; 10], now()), Some(0));
        assert!(map.take_writable().is_empty());
        let Some(Packaged::Data(_, chunk)) = map.next_packaged(true) else {
            panic!("expected DATA")
        };
        assert_eq!(chunk.len(), MAX_DATA_LEN);
        assert_eq!(map.take_writable(), vec![id]);
        assert!(map.take_writable().is_empty());
    }

    #[test]
    fn whole_cell_packaging_keeps_a_partial_cell_until_the_close() {
        let mut map = StreamMap::new(StreamConfig::default(), StreamFlowKind::Windows);
        let id = open(&mut map);
        map.write(id, &[0; MAX_DATA_LEN + 100], now());
        let sizes = |map: &mut StreamMap, whole: bool| -> Vec<usize> {
            std::iter::from_fn(|| {
                if whole {
                    map.next_whole_packaged(true)
                } else {
                    map.next_packaged(true)
                }
            })
            .map(|p| match p {
                Packaged::Data(_, chunk) => chunk.len(),
                Packaged::End(..) => 0,
            })
            .collect()
        };
        assert_eq!(sizes(&mut map, true), [MAX_DATA_LEN], "100 bytes wait");
        map.write(id, &[0; MAX_DATA_LEN - 100], now());
        assert_eq!(sizes(&mut map, true), [MAX_DATA_LEN], "now a whole cell");
        map.write(id, &[0; 10], now());
        assert!(sizes(&mut map, true).is_empty());
        assert_eq!(sizes(&mut map, false), [10], "the lazy way takes it");
        map.write(id, &[0; 10], now());
        map.request_close(id);
        assert_eq!(
            sizes(&mut map, true),
            [10, 0],
            "a close takes the rest, then END"
        );
    }

    #[test]
    fn packaging_is_round_robin_and_respects_windows() {
        let mut map = StreamMap::new(StreamConfig::default(), StreamFlowKind::Windows);
        let a = open(&mut map);
        let b = open(&mut map);
        map.write(a, &[0; 2000], now());
        map.write(b, &[0; 2000], now());
        let order: Vec<StreamId> = (0..4)
            .filter_map(|_| match map.next_packaged(true) {
                Some(Packaged::Data(id, _)) => Some(id),
                _ => None,
            })
            .collect();
        assert_eq!(order, vec![a, b, a, b]);
        // A closed circuit window stops DATA.
        assert!(map.next_packaged(false).is_none());
        // An exhausted stream window stops that stream only.
        match &mut map.get_mut(a).expect("a").flow {
            StreamFlow::Windows(w) => w.package = 0,
            StreamFlow::XonXoff { .. } => unreachable!(),
        }
        assert!(matches!(map.next_packaged(true), Some(Packaged::Data(id, _)) if id == b));
    }

    #[test]
    fn end_follows_the_last_data_and_id_becomes_half_closed() {
        let mut map = StreamMap::new(StreamConfig::default(), StreamFlowKind::Windows);
        let id = open(&mut map);
        map.write(id, &[7; 600], now());
        assert!(map.request_close(id));
        assert!(matches!(map.next_packaged(true), Some(Packaged::Data(..))));
        assert!(matches!(map.next_packaged(true), Some(Packaged::Data(..))));
        assert!(matches!(map.next_packaged(true), Some(Packaged::End(e, _)) if e == id));
        assert!(map.next_packaged(true).is_none());
        assert!(map.is_half_closed(id));
        assert!(map.get(id).is_none());
        // The peer's END frees the ID for good.
        map.on_end(id);
        assert!(!map.is_half_closed(id));
    }

    #[test]
    fn a_close_with_a_reason_ends_with_it_after_the_last_data() {
        let mut map = StreamMap::new(StreamConfig::default(), StreamFlowKind::Windows);
        let a = open(&mut map);
        let b = open(&mut map);
        map.write(a, &[1; 100], now());
        assert!(map.request_close_with(a, EndReason::CONNRESET));
        assert!(map.request_close(b));
        // No more bytes once the close is requested.
        assert_eq!(map.write(a, &[1; 10], now()), Some(0));
        let got: Vec<String> = std::iter::from_fn(|| map.next_packaged(true))
            .map(|p| match p {
                Packaged::Data(id, d) => format!("data {} {}", u16::from(id), d.len()),
                Packaged::End(id, r) => format!("end {} {r}", u16::from(id)),
            })
            .collect();
        let want = [
            "data 1 100".to_string(),
            format!("end 2 {}", EndReason::DONE),
            format!("end 1 {}", EndReason::CONNRESET),
        ];
        assert_eq!(got, want);
        assert!(map.is_half_closed(a) && map.is_half_closed(b));
        assert!(!map.request_close_with(a, EndReason::MISC), "already ended");
    }

    #[test]
    fn the_last_requested_reason_wins() {
        let mut map = StreamMap::new(StreamConfig::default(), StreamFlowKind::Windows);
        let a = open(&mut map);
        map.request_close(a);
        map.request_close_with(a, EndReason::TIMEOUT);
        assert!(matches!(
            map.next_packaged(true),
            Some(Packaged::End(id, r)) if id == a && r == EndReason::TIMEOUT
        ));
    }

    #[test]
    fn stream_ids_skip_those_in_use_and_the_limit_holds() {
        let mut map = StreamMap::new(
            StreamConfig {
                max_streams: 3,
                max_half_closed: 1,
                ..StreamConfig::default()
            },
            StreamFlowKind::Windows,
        );
        let a = open(&mut map);
        let b = open(&mut map);
        assert_ne!(a, b);
        map.abort(a);
        let c = open(&mut map);
        assert_ne!(c, a, "a half-closed ID is not reused");
        assert!(
            map.open_local().is_none(),
            "two open + one half-closed = limit"
        );
        map.abort(b);
        // Only one half-closed ID is remembered: `a` was evicted.
        assert!(!map.is_half_closed(a));
        assert!(map.is_half_closed(b));
    }

    #[test]
    fn peer_may_reuse_an_id_we_ended() {
        let mut map = StreamMap::new(StreamConfig::default(), StreamFlowKind::Windows);
        let id = StreamId::new(9).expect("id");
        assert!(map.open_remote(id));
        assert!(!map.open_remote(id), "open ID");
        assert!(map.abort(id));
        assert!(map.is_half_closed(id));
        assert!(map.open_remote(id));
        assert!(!map.is_half_closed(id));
    }

    #[test]
    fn unread_data_survives_the_peers_end() {
        let mut map = StreamMap::new(StreamConfig::default(), StreamFlowKind::Windows);
        let id = open(&mut map);
        assert_eq!(
            map.on_data(id, Bytes::from_static(b"hello"), false, now()),
            Ok((true, None))
        );
        map.on_end(id);
        let mut buf = [0u8; 16];
        assert_eq!(map.read(id, &mut buf, now()), Some((5, None)));
        assert_eq!(&buf[..5], b"hello");
        assert_eq!(map.read(id, &mut buf, now()), None);
    }

    fn xon_xoff_map(local: EdgePosition, peer: EdgePosition) -> StreamMap {
        let params = XonXoffParams {
            xoff_client: 4,
            xoff_exit: 4,
            ..XonXoffParams::default()
        };
        let flow = StreamFlowKind::XonXoff {
            params,
            local,
            peer,
        };
        StreamMap::new(StreamConfig::default(), flow)
    }

    #[test]
    fn an_xon_rate_limits_what_the_edge_hands_over_until_it_refills() {
        // An exit's sender: no dropmark checks, so an XON may come at once.
        let mut map = xon_xoff_map(EdgePosition::Exit, EdgePosition::Client);
        let id = open(&mut map);
        let t = now();
        assert_eq!(map.resumes_at(id), None);
        // 10 KB/s: a burst of 10 000 bytes, then 10 bytes per ms.
        map.on_xon_xoff(id, 0, Some(10)).expect("xon");
        assert_eq!(map.write_room(id, t), Some(10_000));
        assert_eq!(map.write(id, &[1; 12_000], t), Some(10_000));
        assert_eq!(map.write_room(id, t), Some(0));
        assert_eq!(map.write(id, &[1; 100], t), Some(0));
        // Held back by the rate, not the buffer: no Writable wake-up (it
        // would come at once and find nothing), a time to retry instead.
        assert!(map.take_writable().is_empty());
        let resume = map.resumes_at(id).expect("a time to retry");
        assert!(resume > t && resume <= t + std::time::Duration::from_millis(50));
        assert_eq!(map.write(id, &[1; 1000], resume), Some(MAX_DATA_LEN));
        // Rate 0: unlimited again (up to the send buffer).
        map.on_xon_xoff(id, 0, Some(0)).expect("xon");
        assert_eq!(map.resumes_at(id), None);
        assert_eq!(
            map.write_room(id, resume),
            Some(StreamConfig::default().send_buffer - 10_000 - MAX_DATA_LEN)
        );
    }

    #[test]
    fn a_full_receive_buffer_sends_xoff_and_an_empty_one_xon() {
        let mut map = xon_xoff_map(EdgePosition::Client, EdgePosition::Exit);
        let id = open(&mut map);
        let cell = Bytes::from(vec![1u8; MAX_DATA_LEN]);
        for i in 0..4 {
            let first = i == 0;
            assert_eq!(
                map.on_data(id, cell.clone(), false, now()),
                Ok((first, None))
            );
        }
        // The fifth cell passes the limit of 4 cells: XOFF, once.
        let (_, fb) = map.on_data(id, cell.clone(), false, now()).expect("data");
        assert_eq!(fb, Some(StreamFeedback::Flow(FlowAction::SendXoff)));
        let (_, fb) = map.on_data(id, cell.clone(), false, now()).expect("data");
        assert_eq!(fb, None, "never two XOFFs without an XON");
        // Reading part of it owes nothing; emptying it owes the XON.
        let mut buf = vec![0u8; MAX_DATA_LEN];
        assert_eq!(map.read(id, &mut buf, now()).map(|r| r.1), Some(None));
        let mut last = None;
        while map.readable_bytes(id) > 0 {
            last = map.read(id, &mut buf, now()).and_then(|r| r.1);
        }
        assert!(
            matches!(last, Some(StreamFeedback::Flow(FlowAction::SendXon { .. }))),
            "{last:?}"
        );
        assert!(matches!(
            last.map(StreamFeedback::into_msg),
            Some(AnyRelayMsg::Xon(_))
        ));
    }

    #[test]
    fn xoff_stops_packaging_and_xon_resumes_it() {
        let mut map = xon_xoff_map(EdgePosition::Exit, EdgePosition::Client);
        let id = open(&mut map);
        map.write(id, &[3u8; 4000], now());
        assert!(map.has_work(true));
        map.on_xon_xoff(id, 0, None).expect("xoff");
        assert!(!map.has_work(true));
        assert!(map.next_packaged(true).is_none());
        // A repeated XOFF changes nothing and is not fatal.
        map.on_xon_xoff(id, 0, None).expect("duplicate xoff");
        map.on_xon_xoff(id, 0, Some(0)).expect("xon");
        assert!(matches!(map.next_packaged(true), Some(Packaged::Data(..))));
    }

    #[test]
    fn a_client_refuses_a_repeated_xoff() {
        let mut map = xon_xoff_map(EdgePosition::Client, EdgePosition::Exit);
        let id = open(&mut map);
        map.write(id, &[3u8; 8000], now());
        while map.next_packaged(true).is_some() {}
        map.on_xon_xoff(id, 0, None)
            .expect("an XOFF after enough data");
        assert!(map.on_xon_xoff(id, 0, None).is_err(), "a second XOFF");
    }

    #[test]
    fn each_flow_control_refuses_the_others_messages() {
        let mut cc = xon_xoff_map(EdgePosition::Exit, EdgePosition::Client);
        let a = open(&mut cc);
        assert!(cc.on_sendme(a).is_err(), "stream SENDME under XON/XOFF");
        let mut fixed = StreamMap::new(StreamConfig::default(), StreamFlowKind::Windows);
        let b = open(&mut fixed);
        assert!(fixed.on_xon_xoff(b, 0, None).is_err(), "XOFF under windows");
        assert!(cc
            .on_xon_xoff(StreamId::new(77).expect("id"), 0, None)
            .is_err());
    }

    #[test]
    fn a_peer_that_ignores_xoff_is_caught() {
        let mut map = StreamMap::new(
            StreamConfig {
                max_unread_bytes: 10 * MAX_DATA_LEN,
                ..StreamConfig::default()
            },
            StreamFlowKind::XonXoff {
                params: XonXoffParams::default(),
                local: EdgePosition::Client,
                peer: EdgePosition::Exit,
            },
        );
        let id = open(&mut map);
        let cell = Bytes::from(vec![1u8; MAX_DATA_LEN]);
        for _ in 0..10 {
            map.on_data(id, cell.clone(), false, now())
                .expect("within the cap");
        }
        assert!(map.on_data(id, cell, false, now()).is_err());
    }
}

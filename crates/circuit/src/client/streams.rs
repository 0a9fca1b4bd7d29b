//! The client's end of its streams: what a circuit (or, later, a linked
//! set of circuits) does with stream messages, apart from carrying them.
//!
//! It opens streams (BEGIN, RESOLVE), takes the application's bytes and
//! gives back what arrived, handles the exit's stream messages (CONNECTED,
//! DATA, END, RESOLVED, stream SENDME, XON, XOFF), and hands out the
//! stream messages to send: queued ones (BEGIN, RESOLVE, stream feedback)
//! first, then DATA and END as stream windows allow. The owner encrypts,
//! counts DATA against its circuit window, and sends.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;
use onionlab_cell::msg::{AnyRelayMsg, Begin, BeginFlags, RelayMsg, Resolve, StreamId};
use onionlab_cell::relay;

use super::ClientEvent;
use crate::err::Error;
use crate::stream::{StreamConfig, StreamEvent, StreamFlowKind, StreamMap, StreamViolation};

/// Streams of one circuit (or set), and their pending messages.
#[derive(Debug)]
pub(crate) struct ClientStreams {
    map: StreamMap,
    /// Pending RESOLVE stream IDs.
    resolves: Vec<StreamId>,
    /// Stream messages to send before any DATA: BEGIN, RESOLVE, stream
    /// SENDME, XON, XOFF.
    control: VecDeque<(StreamId, AnyRelayMsg)>,
    /// Most messages `control` may hold before the owner must close.
    max_control: usize,
    events: VecDeque<ClientEvent>,
}

/// The control queue is full: the owner closes (a peer that makes us
/// queue this much feedback is not behaving).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ControlOverflow;

impl ClientStreams {
    /// No streams yet.
    pub(crate) fn new(config: StreamConfig, flow: StreamFlowKind, max_control: usize) -> Self {
        ClientStreams {
            map: StreamMap::new(config, flow),
            resolves: Vec::new(),
            control: VecDeque::new(),
            max_control,
            events: VecDeque::new(),
        }
    }

    fn queue(&mut self, stream: StreamId, msg: AnyRelayMsg) -> Result<(), ControlOverflow> {
        if self.control.len() >= self.max_control {
            return Err(ControlOverflow);
        }
        self.control.push_back((stream, msg));
        Ok(())
    }

    /// Open a stream to `host:port` (BEGIN queued).
    pub(crate) fn begin(&mut self, host: &str, port: u16) -> Result<StreamId, BeginError> {
        // An IPv6 literal may come bracketed (as in a URL); tor-cell adds
        // the brackets itself. Anything else with brackets or NUL is invalid.
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() || !relay::is_valid_begin_addr(host.as_bytes()) {
            return Err(BeginError::Refused(Error::BadTarget(format!(
                "{host}:{port}"
            ))));
        }
        let begin = Begin::new(host, port, BeginFlags::IPV6_OKAY)
            .map_err(|e| BeginError::Refused(Error::BadTarget(format!("{host}:{port}: {e}"))))?;
        let id = self
            .map
            .open_local()
            .ok_or(BeginError::Refused(Error::StreamsExhausted))?;
        self.queue(id, begin.into())
            .map_err(|ControlOverflow| BeginError::Overflow)?;
        Ok(id)
    }

    /// Ask for `host` to be resolved (RESOLVE queued).
    pub(crate) fn resolve(&mut self, host: &str) -> Result<StreamId, BeginError> {
        let id = self
            .map
            .open_local()
            .ok_or(BeginError::Refused(Error::StreamsExhausted))?;
        // A RESOLVE never carries data: it only borrows the ID.
        self.map.abort(id);
        self.resolves.push(id);
        self.queue(id, Resolve::new(host).into())
            .map_err(|ControlOverflow| BeginError::Overflow)?;
        Ok(id)
    }

    /// Queue the application's bytes on `stream`: how many it took.
    pub(crate) fn write(&mut self, stream: StreamId, data: &[u8], now: Instant) -> Option<usize> {
        self.map.write(stream, data, now)
    }

    /// When the exit's XON rate lets `stream` take bytes again.
    pub(crate) fn write_resumes_at(&self, stream: StreamId) -> Option<Instant> {
        self.map.resumes_at(stream)
    }

    /// Read what `stream` received: how many bytes, and whether the
    /// feedback it owes (queued) overflowed the queue (then the owner
    /// closes; the bytes read are still the caller's).
    pub(crate) fn read(
        &mut self,
        stream: StreamId,
        buf: &mut [u8],
        now: Instant,
    ) -> Result<(usize, Result<(), ControlOverflow>), Error> {
        let (n, feedback) = self
            .map
            .read(stream, buf, now)
            .ok_or(Error::NoStream(stream.into()))?;
        let queued = match feedback {
            Some(f) => self.queue(stream, f.into_msg()),
            None => Ok(()),
        };
        Ok((n, queued))
    }

    /// Bytes received on `stream`, not read yet.
    pub(crate) fn readable_bytes(&self, stream: StreamId) -> usize {
        self.map.readable_bytes(stream)
    }

    /// Close `stream` for writing (END after its queued bytes).
    pub(crate) fn close(&mut self, stream: StreamId) -> bool {
        self.map.request_close(stream)
    }

    /// Open streams.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Bytes held in stream buffers.
    pub(crate) fn buffered_bytes(&self) -> usize {
        self.map.buffered_bytes()
    }

    /// Messages queued ahead of DATA.
    pub(crate) fn queued_control(&self) -> usize {
        self.control.len()
    }

    /// A stream message from the exit (`cmd` with a stream ID, DATA
    /// included; the owner counted DATA against its circuit window). An
    /// error is a protocol violation: the owner closes.
    pub(crate) fn handle(
        &mut self,
        now: Instant,
        id: StreamId,
        msg: AnyRelayMsg,
    ) -> Result<(), StreamViolation> {
        match msg {
            AnyRelayMsg::Data(d) => self.on_data(now, id, Bytes::from(Vec::from(d))),
            AnyRelayMsg::Sendme(_) => self.map.on_sendme(id).map_err(StreamViolation::Flow),
            AnyRelayMsg::Xon(x) => {
                let rate = crate::stream::xon_rate_kbps(x.kbytes_per_sec_ewma());
                self.on_flow(id, *x.version(), Some(rate))
            }
            AnyRelayMsg::Xoff(x) => self.on_flow(id, *x.version(), None),
            AnyRelayMsg::Connected(_) => match self.map.on_connected(id) {
                Ok(true) => {
                    self.events
                        .push_back(ClientEvent::Stream(StreamEvent::Connected { stream: id }));
                    Ok(())
                }
                Ok(false) => Ok(()),
                Err(e) => Err(StreamViolation::Flow(e)),
            },
            AnyRelayMsg::End(e) => {
                if self.map.get(id).is_some() {
                    self.map.on_end(id);
                    self.events
                        .push_back(ClientEvent::Stream(StreamEvent::Ended {
                            stream: id,
                            reason: e.reason(),
                        }));
                } else if let Some(pos) = self.resolves.iter().position(|r| *r == id) {
                    self.resolves.swap_remove(pos);
                    self.events.push_back(ClientEvent::Resolved {
                        stream: id,
                        answers: Vec::new(),
                    });
                } else if self.map.is_half_closed(id) {
                    self.map.on_end(id);
                } else {
                    return Err(StreamViolation::UnknownStream("END"));
                }
                Ok(())
            }
            AnyRelayMsg::Resolved(r) => match self.resolves.iter().position(|x| *x == id) {
                Some(pos) => {
                    self.resolves.swap_remove(pos);
                    self.map.on_end(id);
                    self.events.push_back(ClientEvent::Resolved {
                        stream: id,
                        answers: r.into_answers(),
                    });
                    Ok(())
                }
                None => Err(StreamViolation::UnaskedResolved),
            },
            other => Err(StreamViolation::Unexpected(other.cmd())),
        }
    }

    fn on_flow(
        &mut self,
        id: StreamId,
        version: u8,
        xon: Option<u32>,
    ) -> Result<(), StreamViolation> {
        self.map.on_xon_xoff(id, version, xon)
    }

    fn on_data(&mut self, now: Instant, id: StreamId, data: Bytes) -> Result<(), StreamViolation> {
        if self.map.get(id).is_none() {
            if !self.map.is_half_closed(id) {
                return Err(StreamViolation::UnknownStream("DATA"));
            }
            return Ok(());
        }
        let (readable, feedback) = self
            .map
            .on_data(id, data, false, now)
            .map_err(StreamViolation::Flow)?;
        if readable {
            self.events
                .push_back(ClientEvent::Stream(StreamEvent::Readable { stream: id }));
        }
        if let Some(f) = feedback {
            self.queue(id, f.into_msg())
                .map_err(|ControlOverflow| StreamViolation::ControlOverflow)?;
        }
        Ok(())
    }

    /// Whether a stream message is ready to send, with the circuit
    /// window open or not.
    pub(crate) fn has_work(&self, window_open: bool) -> bool {
        !self.control.is_empty() || self.map.has_work(window_open)
    }

    /// The next stream message to send: queued ones first, then DATA or
    /// END as the stream windows (and `window_open`, the circuit's) allow.
    pub(crate) fn next_outgoing(
        &mut self,
        window_open: bool,
    ) -> Option<Result<(StreamId, AnyRelayMsg), Error>> {
        if let Some(m) = self.control.pop_front() {
            return Some(Ok(m));
        }
        let out = self.map.next_packaged(window_open)?;
        for stream in self.map.take_writable() {
            self.events
                .push_back(ClientEvent::Stream(StreamEvent::Writable { stream }));
        }
        Some(crate::stream::packaged_message(out))
    }

    /// The next stream event (connected, readable, writable, ended,
    /// resolved).
    pub(crate) fn poll_event(&mut self) -> Option<ClientEvent> {
        self.events.pop_front()
    }

    /// Forget everything queued to send (the owner closed).
    pub(crate) fn clear_queued(&mut self) {
        self.control.clear();
    }
}

/// Why a stream could not be opened.
#[derive(Debug, Clone)]
pub(crate) enum BeginError {
    /// Refused; nothing changed.
    Refused(Error),
    /// The control queue is full: the owner closes.
    Overflow,
}

impl crate::conflux::set::SetEdge for ClientStreams {
    fn has_work(&self, window_open: bool) -> bool {
        ClientStreams::has_work(self, window_open)
    }
    fn next_outgoing(
        &mut self,
        window_open: bool,
    ) -> Option<Result<(StreamId, AnyRelayMsg), Error>> {
        ClientStreams::next_outgoing(self, window_open)
    }
    fn handle(
        &mut self,
        now: Instant,
        stream: StreamId,
        msg: AnyRelayMsg,
    ) -> Result<(), StreamViolation> {
        ClientStreams::handle(self, now, stream, msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use onionlab_cell::msg::{Connected, Data, End, EndReason};

    fn streams(max_control: usize) -> ClientStreams {
        ClientStreams::new(
            StreamConfig::default(),
            StreamFlowKind::Windows,
            max_control,
        )
    }

    #[test]
    fn begin_queues_a_begin_and_refuses_bad_targets() {
        let mut s = streams(8);
        assert!(matches!(
            s.begin("bad\0host", 80),
            Err(BeginError::Refused(Error::BadTarget(_)))
        ));
        assert!(matches!(
            s.begin("", 80),
            Err(BeginError::Refused(Error::BadTarget(_)))
        ));
        let id = s.begin("[::1]", 443).expect("bracketed IPv6");
        assert!(
            s.has_work(false),
            "BEGIN goes out even with the window shut"
        );
        let Some(Ok((sid, AnyRelayMsg::Begin(_)))) = s.next_outgoing(false) else {
            panic!("expected the BEGIN");
        };
        assert_eq!(sid, id);
        assert!(!s.has_work(true), "no data before CONNECTED");
    }

    #[test]
    fn a_full_control_queue_is_reported_not_grown() {
        let mut s = streams(2);
        s.begin("a.example", 1).expect("first");
        s.begin("b.example", 1).expect("second");
        assert!(matches!(s.begin("c.example", 1), Err(BeginError::Overflow)));
        assert_eq!(s.queued_control(), 2);
        s.clear_queued();
        assert_eq!(s.queued_control(), 0);
    }

    #[test]
    fn exit_messages_drive_the_stream_and_bad_ones_are_violations() {
        let mut s = streams(8);
        let id = s.begin("a.example", 80).expect("begin");
        let _ = s.next_outgoing(true);
        s.handle(Instant::now(), id, Connected::new_empty().into())
            .expect("connected");
        assert_eq!(
            s.poll_event(),
            Some(ClientEvent::Stream(StreamEvent::Connected { stream: id }))
        );
        let data = Data::new(b"hello").expect("data");
        s.handle(Instant::now(), id, data.into()).expect("data");
        assert_eq!(s.readable_bytes(id), 5);
        let unknown = StreamId::new(999).expect("nonzero");
        let end = End::new_with_reason(EndReason::DONE);
        assert_eq!(
            s.handle(Instant::now(), unknown, end.clone().into()),
            Err(StreamViolation::UnknownStream("END"))
        );
        let data = Data::new(b"x").expect("data");
        assert_eq!(
            s.handle(Instant::now(), unknown, data.into()),
            Err(StreamViolation::UnknownStream("DATA"))
        );
        let resolved = onionlab_cell::msg::Resolved::new_empty();
        assert_eq!(
            s.handle(Instant::now(), id, resolved.into()),
            Err(StreamViolation::UnaskedResolved)
        );
        s.handle(Instant::now(), id, end.into()).expect("end");
        assert!(matches!(
            s.poll_event(),
            Some(ClientEvent::Stream(StreamEvent::Readable { .. }))
        ));
        assert!(matches!(
            s.poll_event(),
            Some(ClientEvent::Stream(StreamEvent::Ended { .. }))
        ));
    }

    #[test]
    fn a_resolve_ends_with_resolved_or_end() {
        let mut s = streams(8);
        let id = s.resolve("a.example").expect("resolve");
        assert!(matches!(
            s.next_outgoing(false),
            Some(Ok((_, AnyRelayMsg::Resolve(_))))
        ));
        let end = End::new_with_reason(EndReason::RESOLVEFAILED);
        s.handle(Instant::now(), id, end.into())
            .expect("end of a resolve");
        assert_eq!(
            s.poll_event(),
            Some(ClientEvent::Resolved {
                stream: id,
                answers: Vec::new()
            })
        );
        let resolved = onionlab_cell::msg::Resolved::new_empty();
        assert!(s.handle(Instant::now(), id, resolved.into()).is_err());
    }
}

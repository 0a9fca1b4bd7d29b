//! The exit's end of its streams: what an exit circuit (or, later, a
//! linked set of circuits) does with stream messages, apart from carrying
//! them.
//!
//! It opens streams for BEGIN and RESOLVE (the owner checked its exit
//! role and policy first) and asks the driver to connect them, handles the
//! client's stream messages (DATA, END, stream SENDME, XON, XOFF), takes
//! the target's bytes and gives back the client's, and hands out stream
//! messages to send toward the client: queued ones (CONNECTED, END,
//! RESOLVED, stream feedback) first, then DATA and END as stream windows
//! allow. The owner encrypts, counts DATA against its circuit window, and
//! sends.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Instant;

use bytes::Bytes;
use onionlab_cell::msg::{
    AnyRelayMsg, Connected, Data, End, EndReason, RelayMsg, Resolved, ResolvedVal, StreamId,
};

use super::RelayCircEvent;
use crate::err::Error;
use crate::stream::{
    StreamConfig, StreamEvent, StreamFeedback, StreamFlowKind, StreamMap, StreamState,
    StreamViolation,
};

/// Streams of one exit circuit (or set), and their pending messages.
#[derive(Debug)]
pub(crate) struct ExitStreams {
    map: StreamMap,
    /// Stream messages for the client ahead of any DATA.
    out: VecDeque<(StreamId, AnyRelayMsg)>,
    events: VecDeque<RelayCircEvent>,
}

impl ExitStreams {
    /// No streams yet.
    pub(crate) fn new(config: StreamConfig, flow: StreamFlowKind) -> Self {
        ExitStreams {
            map: StreamMap::new(config, flow),
            out: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// BEGIN to `addr:port` on stream `id`: the driver is asked to
    /// connect. An error is a protocol violation.
    pub(crate) fn begin(
        &mut self,
        id: StreamId,
        addr: &[u8],
        port: u16,
    ) -> Result<(), StreamViolation> {
        let Ok(host) = std::str::from_utf8(addr) else {
            self.refuse(id, EndReason::RESOLVEFAILED);
            return Ok(());
        };
        if !self.map.open_remote(id) {
            return Err(StreamViolation::IdInUse("BEGIN"));
        }
        self.events.push_back(RelayCircEvent::Connect {
            stream: id,
            host: host.to_owned(),
            port,
        });
        Ok(())
    }

    /// RESOLVE of `query` on stream `id`: the driver is asked to resolve.
    /// The ID stays reserved (and counted against the stream limit) until
    /// the driver answers.
    pub(crate) fn resolve(&mut self, id: StreamId, query: &[u8]) -> Result<(), StreamViolation> {
        if !self.map.open_remote(id) {
            return Err(StreamViolation::IdInUse("RESOLVE"));
        }
        let host = String::from_utf8_lossy(query).into_owned();
        self.events
            .push_back(RelayCircEvent::Resolve { stream: id, host });
        Ok(())
    }

    /// END with `reason` for stream `id` without opening it.
    pub(crate) fn refuse(&mut self, id: StreamId, reason: EndReason) {
        self.out
            .push_back((id, End::new_with_reason(reason).into()));
    }

    /// A stream message from the client (DATA included; the owner counted
    /// it against its circuit window). An error is a protocol violation.
    pub(crate) fn handle(
        &mut self,
        now: Instant,
        id: StreamId,
        msg: AnyRelayMsg,
    ) -> Result<(), StreamViolation> {
        match msg {
            AnyRelayMsg::Data(d) => self.on_data(now, id, d),
            AnyRelayMsg::Sendme(_) => self.map.on_sendme(id).map_err(StreamViolation::Flow),
            AnyRelayMsg::Xon(x) => {
                let kbps = crate::stream::xon_rate_kbps(x.kbytes_per_sec_ewma());
                self.map.on_xon_xoff(id, *x.version(), Some(kbps))
            }
            AnyRelayMsg::Xoff(x) => self.map.on_xon_xoff(id, *x.version(), None),
            AnyRelayMsg::End(e) => {
                if self.map.get(id).is_some() {
                    self.map.on_end(id);
                    self.events
                        .push_back(RelayCircEvent::Stream(StreamEvent::Ended {
                            stream: id,
                            reason: e.reason(),
                        }));
                } else if self.map.is_half_closed(id) {
                    self.map.on_end(id);
                } else {
                    return Err(StreamViolation::UnknownStream("END"));
                }
                Ok(())
            }
            other => Err(StreamViolation::Unexpected(other.cmd())),
        }
    }

    fn on_data(&mut self, now: Instant, id: StreamId, d: Data) -> Result<(), StreamViolation> {
        if self.map.get(id).is_none() {
            if !self.map.is_half_closed(id) {
                return Err(StreamViolation::UnknownStream("DATA"));
            }
            return Ok(());
        }
        let (readable, feedback) = self
            .map
            .on_data(id, Bytes::from(Vec::from(d)), true, now)
            .map_err(StreamViolation::Flow)?;
        if readable {
            self.events
                .push_back(RelayCircEvent::Stream(StreamEvent::Readable { stream: id }));
        }
        self.feedback(id, feedback);
        Ok(())
    }

    fn feedback(&mut self, stream: StreamId, f: Option<StreamFeedback>) {
        if let Some(f) = f {
            self.out.push_back((stream, f.into_msg()));
        }
    }

    /// The driver connected `stream` (CONNECTED queued).
    pub(crate) fn connected(
        &mut self,
        stream: StreamId,
        addr: Option<IpAddr>,
    ) -> Result<(), Error> {
        let s = self
            .map
            .get_mut(stream)
            .ok_or(Error::NoStream(stream.into()))?;
        if s.state != StreamState::Connecting {
            return Err(Error::BadState("stream already connected"));
        }
        s.state = StreamState::Open;
        let msg = match addr {
            Some(a) => Connected::new_with_addr(a, 300),
            None => Connected::new_empty(),
        };
        self.out.push_back((stream, msg.into()));
        Ok(())
    }

    /// The driver could not open `stream`, or its target failed abruptly:
    /// END with `reason` queued, unsent data dropped.
    pub(crate) fn refused(&mut self, stream: StreamId, reason: EndReason) -> Result<(), Error> {
        if !self.map.abort(stream) {
            return Err(Error::NoStream(stream.into()));
        }
        self.refuse(stream, reason);
        Ok(())
    }

    /// The driver's answer to a RESOLVE (RESOLVED queued).
    pub(crate) fn resolved(&mut self, stream: StreamId, answers: Vec<(ResolvedVal, u32)>) {
        self.map.forget(stream);
        let mut r = Resolved::new_empty();
        for (a, ttl) in answers {
            r.add_answer(a, ttl);
        }
        self.out.push_back((stream, r.into()));
    }

    /// The target's bytes for the client: how many `stream` took.
    pub(crate) fn write(
        &mut self,
        stream: StreamId,
        data: &[u8],
        now: Instant,
    ) -> Result<usize, Error> {
        self.map
            .write(stream, data, now)
            .ok_or(Error::NoStream(stream.into()))
    }

    /// When the client's XON rate lets `stream` take bytes again.
    pub(crate) fn write_resumes_at(&self, stream: StreamId) -> Option<Instant> {
        self.map.resumes_at(stream)
    }

    /// Bytes from the target `stream` would take now.
    pub(crate) fn write_room(&mut self, stream: StreamId, now: Instant) -> Result<usize, Error> {
        self.map
            .write_room(stream, now)
            .ok_or(Error::NoStream(stream.into()))
    }

    /// The client's bytes for the target (feedback it owes is queued).
    pub(crate) fn read(
        &mut self,
        stream: StreamId,
        buf: &mut [u8],
        now: Instant,
    ) -> Result<usize, Error> {
        let (n, feedback) = self
            .map
            .read(stream, buf, now)
            .ok_or(Error::NoStream(stream.into()))?;
        self.feedback(stream, feedback);
        Ok(n)
    }

    /// The client's bytes for the target, handed to `consume` in place.
    pub(crate) fn read_with(
        &mut self,
        stream: StreamId,
        now: Instant,
        consume: impl FnOnce(&[&[u8]]) -> usize,
    ) -> Result<usize, Error> {
        let (n, feedback) = self
            .map
            .read_with(stream, now, consume)
            .ok_or(Error::NoStream(stream.into()))?;
        self.feedback(stream, feedback);
        Ok(n)
    }

    /// Bytes from the client not read yet.
    pub(crate) fn readable_bytes(&self, stream: StreamId) -> usize {
        self.map.readable_bytes(stream)
    }

    /// The target's side ended: END with `reason` after the queued bytes.
    pub(crate) fn end(&mut self, stream: StreamId, reason: EndReason) -> Result<(), Error> {
        if self.map.request_close_with(stream, reason) {
            Ok(())
        } else {
            Err(Error::NoStream(stream.into()))
        }
    }

    /// Bytes held in stream buffers.
    pub(crate) fn buffered_bytes(&self) -> usize {
        self.map.buffered_bytes()
    }

    /// Whether a message is ready for the client, with the circuit window
    /// open or not.
    pub(crate) fn has_work(&self, window_open: bool) -> bool {
        !self.out.is_empty() || self.map.has_work(window_open)
    }

    /// The next queued message (CONNECTED, END, RESOLVED, feedback), for
    /// an owner that sends them at once.
    pub(crate) fn take_queued(&mut self) -> Option<(StreamId, AnyRelayMsg)> {
        self.out.pop_front()
    }

    /// The next message for the client: queued ones first, then DATA or
    /// END as the stream windows (and `window_open`, the circuit's) allow.
    pub(crate) fn next_outgoing(
        &mut self,
        window_open: bool,
    ) -> Option<Result<(StreamId, AnyRelayMsg), Error>> {
        self.next_outgoing_from(window_open, false)
    }

    /// [`next_outgoing`](Self::next_outgoing) in whole cells only: a
    /// stream's last partial cell waits for more bytes or its close (see
    /// `StreamMap::next_whole_packaged`).
    pub(crate) fn next_whole_outgoing(
        &mut self,
        window_open: bool,
    ) -> Option<Result<(StreamId, AnyRelayMsg), Error>> {
        self.next_outgoing_from(window_open, true)
    }

    fn next_outgoing_from(
        &mut self,
        window_open: bool,
        whole_cells_only: bool,
    ) -> Option<Result<(StreamId, AnyRelayMsg), Error>> {
        if let Some(m) = self.out.pop_front() {
            return Some(Ok(m));
        }
        let out = if whole_cells_only {
            self.map.next_whole_packaged(window_open)?
        } else {
            self.map.next_packaged(window_open)?
        };
        for stream in self.map.take_writable() {
            self.events
                .push_back(RelayCircEvent::Stream(StreamEvent::Writable { stream }));
        }
        Some(crate::stream::packaged_message(out))
    }

    /// The next event for the driver (connect, resolve, stream events).
    pub(crate) fn poll_event(&mut self) -> Option<RelayCircEvent> {
        self.events.pop_front()
    }
}

impl crate::conflux::set::SetEdge for ExitStreams {
    fn has_work(&self, window_open: bool) -> bool {
        ExitStreams::has_work(self, window_open)
    }
    fn next_outgoing(
        &mut self,
        window_open: bool,
    ) -> Option<Result<(StreamId, AnyRelayMsg), Error>> {
        ExitStreams::next_outgoing(self, window_open)
    }
    /// The set's owner checked at LINK time that this is an exit that
    /// serves streams, so BEGIN and RESOLVE open streams here.
    fn handle(
        &mut self,
        now: Instant,
        stream: StreamId,
        msg: AnyRelayMsg,
    ) -> Result<(), StreamViolation> {
        match msg {
            AnyRelayMsg::Begin(b) => self.begin(stream, b.addr(), b.port()),
            AnyRelayMsg::Resolve(r) => self.resolve(stream, r.query()),
            other => ExitStreams::handle(self, now, stream, other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use onionlab_cell::msg::{Begin, BeginFlags, RelayCmd};

    fn streams() -> ExitStreams {
        ExitStreams::new(StreamConfig::default(), StreamFlowKind::Windows)
    }

    fn id(n: u16) -> StreamId {
        StreamId::new(n).expect("nonzero")
    }

    #[test]
    fn begin_asks_the_driver_and_connected_answers_once() {
        let mut s = streams();
        s.begin(id(1), b"example.com", 443).expect("begin");
        assert!(matches!(
            s.poll_event(),
            Some(RelayCircEvent::Connect { port: 443, .. })
        ));
        assert_eq!(
            s.begin(id(1), b"example.com", 443),
            Err(StreamViolation::IdInUse("BEGIN")),
            "ID in use"
        );
        s.connected(id(1), None).expect("connected");
        assert!(matches!(s.connected(id(1), None), Err(Error::BadState(_))));
        assert!(matches!(
            s.take_queued(),
            Some((_, AnyRelayMsg::Connected(_)))
        ));
        assert!(s.connected(id(2), None).is_err(), "no such stream");
    }

    #[test]
    fn a_target_that_is_not_utf8_is_refused_without_a_stream() {
        let mut s = streams();
        s.begin(id(3), b"\xff\xfe", 80)
            .expect("refused, not a violation");
        assert!(s.poll_event().is_none());
        let Some((sid, AnyRelayMsg::End(e))) = s.take_queued() else {
            panic!("expected END");
        };
        assert_eq!((sid, e.reason()), (id(3), EndReason::RESOLVEFAILED));
        // The ID was never opened: it may be used.
        s.begin(id(3), b"ok.example", 80).expect("begin");
    }

    #[test]
    fn resolve_holds_the_id_until_answered() {
        let mut s = streams();
        s.resolve(id(5), b"a.example").expect("resolve");
        assert!(matches!(
            s.poll_event(),
            Some(RelayCircEvent::Resolve { .. })
        ));
        assert!(s.begin(id(5), b"a.example", 80).is_err(), "still reserved");
        s.resolved(id(5), Vec::new());
        assert!(matches!(
            s.take_queued(),
            Some((_, AnyRelayMsg::Resolved(_)))
        ));
        s.begin(id(5), b"a.example", 80).expect("free again");
    }

    #[test]
    fn client_messages_for_unknown_streams_are_violations() {
        let mut s = streams();
        let data = Data::new(b"x").expect("data");
        assert_eq!(
            s.handle(Instant::now(), id(9), data.into()),
            Err(StreamViolation::UnknownStream("DATA"))
        );
        let end = End::new_with_reason(EndReason::DONE);
        assert_eq!(
            s.handle(Instant::now(), id(9), end.into()),
            Err(StreamViolation::UnknownStream("END"))
        );
        let begin = Begin::new("a.example", 80, BeginFlags::empty()).expect("begin");
        assert_eq!(
            s.handle(Instant::now(), id(9), begin.into()),
            Err(StreamViolation::Unexpected(RelayCmd::BEGIN)),
            "a BEGIN is the circuit's to handle, not a stream's"
        );
        assert!(s.refused(id(9), EndReason::DONE).is_err());
        assert!(s.end(id(9), EndReason::DONE).is_err());
    }
}

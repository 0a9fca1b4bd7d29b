//! The streams of one set (`docs/datagram.md` section 4), both ends:
//! each stream is a lane of the set's end-to-end TCP ([`E2eSet`]). The
//! client opens the lane and sends the target first; the exit reads it,
//! has its driver connect, and answers with one byte (0: connected, else
//! tor-spec's END reason); then bytes flow both ways.
//!
//! A stream's end is never silent: a lane closed by FIN after all its
//! data reads as [`Recv::End`]; one reset, refused, or whose set lost
//! every circuit reads as [`Recv::Reset`] or [`StreamStatus::Refused`].

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use onionlab_utcp::{LaneEvent, LaneId, LaneState, Mux, MuxStats};

use crate::e2e::{parse_stream_preamble, stream_preamble, E2eSet};
use crate::Error;

/// A stream: a lane of one set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamKey {
    /// The set, as this node numbers them.
    pub set: u64,
    /// The lane.
    pub lane: LaneId,
}

/// What a node's streams ask of its driver, or tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// (Exits) a new stream wants `target` (`host:port`): resolve it,
    /// check the exit policy, connect, then call `connected` or
    /// `refused`.
    Connect {
        /// The stream.
        stream: StreamKey,
        /// Its target.
        target: String,
    },
    /// The stream's state changed, or it may have bytes to read or room
    /// to send: look.
    Wake(StreamKey),
}

/// What a read found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recv {
    /// This many bytes.
    Data(usize),
    /// Nothing yet.
    Pending,
    /// The peer closed its side cleanly (FIN) and everything was read.
    End,
    /// The stream was reset or its set ended: what came was not all.
    Reset,
}

/// Where a stream stands, for the client's SOCKS reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamStatus {
    /// Waiting for the exit's answer.
    Opening,
    /// Connected: bytes flow.
    Open,
    /// The exit refused with this END reason.
    Refused(u8),
    /// Reset, or its set failed.
    Failed,
}

#[derive(Debug)]
enum Stream {
    /// (Client) the target, sent once the lane is open.
    Preamble(Vec<u8>),
    /// (Client) target sent; waiting for the exit's answer byte.
    Answer,
    /// (Exit) reading the target.
    Target(Vec<u8>),
    /// (Exit) the driver is connecting.
    Connecting,
    /// Bytes flow.
    Open,
    /// (Client) refused by the exit with this reason.
    Refused(u8),
    /// The lane is gone: cleanly (`false`) or by a reset.
    Ended { reset: bool },
    /// The driver is done with it; its lane still sends what is queued,
    /// and the stream is forgotten when the lane ends.
    Detached,
}

impl Stream {
    /// Whether the driver holds it (it learns how it ended, then forgets
    /// it).
    fn held(&self) -> bool {
        matches!(
            self,
            Stream::Preamble(_) | Stream::Answer | Stream::Connecting | Stream::Open
        )
    }
}

/// One set's end: its TCP and its streams.
pub(crate) struct SetStreams {
    pub(crate) e2e: E2eSet,
    streams: HashMap<LaneId, Stream>,
}

impl SetStreams {
    pub(crate) fn new(e2e: E2eSet) -> Self {
        SetStreams {
            e2e,
            streams: HashMap::new(),
        }
    }

    /// Streams the driver holds.
    pub(crate) fn held(&self) -> usize {
        self.streams.values().filter(|s| s.held()).count()
    }

    /// (Client) open a stream to `target`.
    pub(crate) fn open(&mut self, now: Instant, target: &str) -> Result<LaneId, Error> {
        let preamble = stream_preamble(target)?;
        let lane = self.e2e.mux().open(now)?;
        self.streams.insert(lane, Stream::Preamble(preamble));
        Ok(lane)
    }

    pub(crate) fn status(&self, lane: LaneId) -> StreamStatus {
        match self.streams.get(&lane) {
            Some(Stream::Preamble(_) | Stream::Answer | Stream::Target(_) | Stream::Connecting) => {
                StreamStatus::Opening
            }
            Some(Stream::Open) => StreamStatus::Open,
            Some(Stream::Refused(r)) => StreamStatus::Refused(*r),
            // An end before the answer is a failure; after, the reads
            // say how it ended.
            Some(Stream::Ended { .. } | Stream::Detached) | None => StreamStatus::Failed,
        }
    }

    /// (Exit) the driver connected the stream: the answer 0 goes out.
    pub(crate) fn connected(&mut self, now: Instant, lane: LaneId) -> bool {
        match self.streams.get_mut(&lane) {
            Some(s @ Stream::Connecting) => {
                *s = Stream::Open;
                // The lane's send buffer is empty: the byte fits.
                let _ = self.e2e.mux().send(lane, &[0], now);
                true
            }
            _ => false,
        }
    }

    /// (Exit) the driver could not connect: `reason` goes out, the lane
    /// closes, and the stream is no longer the driver's.
    pub(crate) fn refused(&mut self, now: Instant, lane: LaneId, reason: u8) {
        if let Some(s @ Stream::Connecting) = self.streams.get_mut(&lane) {
            *s = Stream::Ended { reset: false };
            let _ = self.e2e.mux().send(lane, &[reason.max(1)], now);
            let _ = self.e2e.mux().close(lane, now);
        }
    }

    pub(crate) fn send(&mut self, now: Instant, lane: LaneId, data: &[u8]) -> Result<usize, Error> {
        if !matches!(self.streams.get(&lane), Some(Stream::Open)) {
            return Err(onionlab_utcp::Error::LaneClosed(lane).into());
        }
        Ok(self.e2e.mux().send(lane, data, now)?)
    }

    /// Read the stream (call [`after_tcp`](Self::after_tcp) first, so
    /// that a lane that just ended is marked).
    pub(crate) fn recv(&mut self, now: Instant, lane: LaneId, buf: &mut [u8]) -> Recv {
        match self.streams.get(&lane) {
            None => Recv::Reset,
            Some(Stream::Ended { reset: false }) => Recv::End,
            Some(Stream::Ended { reset: true } | Stream::Refused(_) | Stream::Detached) => {
                Recv::Reset
            }
            Some(Stream::Open) => lane_recv(self.e2e.mux(), lane, buf, now),
            Some(_) => Recv::Pending,
        }
    }

    /// FIN after what is queued.
    pub(crate) fn close(&mut self, now: Instant, lane: LaneId) {
        let _ = self.e2e.mux().close(lane, now);
    }

    /// Reset the stream and forget it.
    pub(crate) fn abort(&mut self, now: Instant, lane: LaneId) {
        let _ = self.e2e.mux().abort(lane, now);
        self.streams.remove(&lane);
    }

    /// The driver is done with a stream: forgotten now if it ended, else
    /// when its lane does (after sending what is queued).
    pub(crate) fn forget(&mut self, lane: LaneId) {
        match self.streams.get_mut(&lane) {
            Some(s) if s.held() => *s = Stream::Detached,
            Some(_) => {
                self.streams.remove(&lane);
            }
            None => {}
        }
    }

    /// The set failed and is dropped: every stream the driver holds is
    /// woken to read its reset (from the set's absence). Returns the
    /// set's end-to-end TCP counters, for the driver's totals.
    pub(crate) fn fail(self, set: u64, events: &mut VecDeque<StreamEvent>) -> MuxStats {
        for (&lane, s) in self.streams.iter() {
            if s.held() {
                events.push_back(StreamEvent::Wake(StreamKey { set, lane }));
            }
        }
        self.e2e.stats()
    }

    /// The end-to-end TCP counters of `ended` sets plus those of the
    /// sets still held.
    pub(crate) fn total_stats<'a>(
        ended: MuxStats,
        held: impl IntoIterator<Item = &'a SetStreams>,
    ) -> MuxStats {
        held.into_iter().fold(ended, |mut all, set| {
            all += set.e2e.stats();
            all
        })
    }

    /// After the TCP moved: new and ended lanes, targets and answers
    /// read, preambles sent; every open stream woken if `wake_open`
    /// (segments or timers moved it, not the driver).
    pub(crate) fn after_tcp(
        &mut self,
        now: Instant,
        set: u64,
        wake_open: bool,
        events: &mut VecDeque<StreamEvent>,
    ) {
        let key = |lane| StreamKey { set, lane };
        while let Some(ev) = self.e2e.mux().poll_event() {
            match ev {
                // Only the exit accepts lanes (the client's TCP is the
                // initiator's, which smoltcp never listens on).
                LaneEvent::Accepted(lane) => {
                    self.streams.insert(lane, Stream::Target(Vec::new()));
                }
                LaneEvent::Closed { lane, reset, .. } => match self.streams.get_mut(&lane) {
                    Some(s) if s.held() => {
                        *s = Stream::Ended { reset };
                        events.push_back(StreamEvent::Wake(key(lane)));
                    }
                    // Refused streams stay until the driver forgets them.
                    Some(Stream::Refused(_)) => {}
                    // Ended already, detached, or never the driver's.
                    _ => {
                        self.streams.remove(&lane);
                    }
                },
            }
        }
        let mut gone = Vec::new();
        for (&lane, s) in self.streams.iter_mut() {
            let mux = self.e2e.mux();
            match s {
                Stream::Target(buf) => match read_target(mux, lane, buf, now) {
                    Ok(Some(target)) => {
                        *s = Stream::Connecting;
                        events.push_back(StreamEvent::Connect {
                            stream: key(lane),
                            target,
                        });
                    }
                    Ok(None) => {}
                    // Not `host:port`: reset. Nobody holds it, so it goes
                    // now.
                    Err(()) => {
                        let _ = mux.abort(lane, now);
                        gone.push(lane);
                    }
                },
                Stream::Preamble(bytes) => {
                    if mux.lane_state(lane) == Some(LaneState::Open) {
                        // Empty send buffer: the target (under 257 bytes)
                        // fits whole, or the lane is broken.
                        match mux.send(lane, bytes, now) {
                            Ok(n) if n == bytes.len() => *s = Stream::Answer,
                            Ok(0) => {}
                            _ => {
                                let _ = mux.abort(lane, now);
                                *s = Stream::Ended { reset: true };
                                events.push_back(StreamEvent::Wake(key(lane)));
                            }
                        }
                    }
                }
                Stream::Answer => {
                    let mut answer = [0u8; 1];
                    match mux.recv(lane, &mut answer, now) {
                        Ok(1) => {
                            *s = if answer[0] == 0 {
                                Stream::Open
                            } else {
                                Stream::Refused(answer[0])
                            };
                            events.push_back(StreamEvent::Wake(key(lane)));
                        }
                        // Nothing yet, unless the exit closed without
                        // answering.
                        Ok(_)
                            if matches!(
                                mux.lane_state(lane),
                                Some(LaneState::Connecting | LaneState::Open)
                            ) => {}
                        _ => {
                            let _ = mux.abort(lane, now);
                            *s = Stream::Ended { reset: true };
                            events.push_back(StreamEvent::Wake(key(lane)));
                        }
                    }
                }
                Stream::Open if wake_open => events.push_back(StreamEvent::Wake(key(lane))),
                Stream::Open
                | Stream::Connecting
                | Stream::Refused(_)
                | Stream::Ended { .. }
                | Stream::Detached => {}
            }
        }
        for lane in gone {
            self.streams.remove(&lane);
        }
    }
}

/// Read a stream's target from its lane into `buf`, no further than its
/// last byte (what follows is the stream's): `Ok(Some(target))` once
/// whole; `Err(())` if it is not `host:port` or the lane closed first.
fn read_target(
    mux: &mut Mux,
    lane: LaneId,
    buf: &mut Vec<u8>,
    now: Instant,
) -> Result<Option<String>, ()> {
    loop {
        let need = match buf.first() {
            None => 1,
            Some(&len) => 1 + usize::from(len) - buf.len(),
        };
        if need == 0 {
            return match parse_stream_preamble(buf) {
                Ok(Some((target, _))) => Ok(Some(target)),
                Ok(None) | Err(_) => Err(()),
            };
        }
        let mut chunk = [0u8; 256];
        match mux.recv(lane, &mut chunk[..need], now) {
            Ok(0) => {
                return match mux.lane_state(lane) {
                    Some(LaneState::Connecting | LaneState::Open) => Ok(None),
                    _ => Err(()),
                };
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => return Err(()),
        }
    }
}

/// Read an open lane: data, nothing yet, or its end.
fn lane_recv(mux: &mut Mux, lane: LaneId, buf: &mut [u8], now: Instant) -> Recv {
    match mux.recv(lane, buf, now) {
        // The peer's FIN came after all its data (whichever side closed
        // first).
        Ok(0) if mux.peer_finished(lane) => Recv::End,
        Ok(0) => match mux.lane_state(lane) {
            // Reset: forgotten at once, and its Closed event says so.
            Some(_) => Recv::Pending,
            None => Recv::Reset,
        },
        Ok(n) => Recv::Data(n),
        Err(_) => Recv::Reset,
    }
}

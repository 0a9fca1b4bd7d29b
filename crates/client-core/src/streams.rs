//! Stream requests and connected streams of [`ClientCore`].
//!
//! A request ([`ClientCore::open_stream`]) gets a circuit (an open one
//! that fits, one being built that fits, or a new one; up to
//! `1 + build_retries` builds may fail), sends BEGIN, and waits for
//! CONNECTED until `stream_connect_timeout`. A circuit that closes before
//! CONNECTED is replaced up to `stream_retries` times, as tor does (the
//! dead circuit is never picked again). The outcome is one
//! [`CoreEvent::Opened`] or [`CoreEvent::Failed`]; a connected stream's
//! owner then reads and writes it by its [`StreamRef`] and is told of news
//! by [`CoreEvent::Stream`].

use std::time::Instant;

use onionlab_cell::msg::EndReason;

use crate::core::{ClientCore, Pick, StreamSlot};
use crate::path::Target;
use crate::request::{begin_target_ok, Request, RequestState};
use crate::types::{
    BuildFailure, CircKey, CoreEvent, IsolationKey, RequestId, StreamFailure, StreamRef, StreamView,
};

/// The result of reading a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadResult {
    /// This many bytes (0: nothing now).
    Data(usize),
    /// The stream is gone from the circuit (ended and drained, or ended by
    /// us).
    Gone,
}

impl ClientCore {
    /// Ask for a stream to `target` with isolation `iso`. Its outcome
    /// comes as [`CoreEvent::Opened`] or [`CoreEvent::Failed`] with the
    /// returned ID (possibly before this returns: look at the events).
    pub fn open_stream(&mut self, now: Instant, target: Target, iso: IsolationKey) -> RequestId {
        let id = RequestId(self.next_request);
        self.next_request += 1;
        let ok = begin_target_ok(&target);
        self.requests.insert(
            id,
            Request {
                target,
                iso,
                builds_failed: 0,
                retried: 0,
                state: RequestState::Choosing,
            },
        );
        if ok {
            self.advance(now, id);
        } else {
            self.fail(now, id, StreamFailure::BadTarget);
        }
        self.settle(now);
        id
    }

    /// Choose a circuit for request `id` and attach to it, wait for it, or
    /// launch it.
    fn advance(&mut self, now: Instant, id: RequestId) {
        let Some(r) = self.requests.get(&id) else {
            return;
        };
        let (target, iso) = (r.target.clone(), r.iso.clone());
        match self.pick(now, &target, &iso) {
            Err(failure) => self.fail(now, id, failure),
            Ok(Pick::Ready(circ)) => self.attach(now, id, circ),
            Ok(Pick::Pending(circ)) => self.wait_for(id, circ),
            Ok(Pick::Launch(path)) => match self.launch(now, path, iso) {
                Ok(circ) => self.wait_for(id, circ),
                Err(failure) => self.build_failed(now, id, failure),
            },
        }
    }

    /// Request `id` waits for circuit `circ` to be built.
    fn wait_for(&mut self, id: RequestId, circ: CircKey) {
        if let (Some(r), Some(c)) = (self.requests.get_mut(&id), self.circuits.get_mut(&circ)) {
            r.state = RequestState::Building(circ);
            c.waiting.push(id);
        }
    }

    /// The circuit request `id` waited for failed to build: try another,
    /// unless that was the last attempt.
    pub(crate) fn build_failed(&mut self, now: Instant, id: RequestId, failure: BuildFailure) {
        let attempts = 1 + self.cfg.settings.build_retries;
        let Some(r) = self.requests.get_mut(&id) else {
            return;
        };
        r.builds_failed += 1;
        r.state = RequestState::Choosing;
        if r.builds_failed >= attempts {
            let failure = match failure {
                BuildFailure::Timeout => StreamFailure::BuildTimeout,
                BuildFailure::Failed(why) => StreamFailure::BuildFailed(why),
            };
            self.fail(now, id, failure);
        } else if self.shutting_down {
            self.fail(now, id, StreamFailure::ShuttingDown);
        } else {
            tracing::debug!(target = %r.target, attempt = r.builds_failed + 1, "retrying with a new circuit");
            self.advance(now, id);
        }
    }

    /// BEGIN for request `id` on the open circuit `circ`.
    pub(crate) fn attach(&mut self, now: Instant, id: RequestId, circ: CircKey) {
        let Some(r) = self.requests.get(&id) else {
            return;
        };
        if !self.circuits.get(&circ).is_some_and(|c| c.open) {
            return self.connect_lost(now, id);
        }
        let begun = self
            .node
            .begin(now, circ, &r.target.host_string(), r.target.port);
        let stream_id = match begun {
            Ok(s) => s,
            Err(onionlab_circuit::Error::BadTarget(_)) => {
                return self.fail(now, id, StreamFailure::BadTarget)
            }
            Err(onionlab_circuit::Error::Closed) => {
                // Dead already (its Closed event may not be handled yet):
                // no stream may pick it again.
                if let Some(c) = self.circuits.get_mut(&circ) {
                    c.stale = true;
                }
                return self.connect_lost(now, id);
            }
            Err(other) => return self.fail(now, id, StreamFailure::Attach(other.to_string())),
        };
        tracing::debug!(circ = circ.0, stream = %stream_id, target = %r.target, "BEGIN");
        let stream = StreamRef {
            circ,
            id: stream_id,
            request: id,
        };
        if let Some(c) = self.circuits.get_mut(&circ) {
            c.first_use.get_or_insert(now);
            c.streams.insert(
                u16::from(stream_id),
                StreamSlot {
                    request: id,
                    connected: false,
                    ended: None,
                },
            );
        }
        let deadline = now + self.cfg.settings.stream_connect_timeout;
        if let Some(r) = self.requests.get_mut(&id) {
            r.state = RequestState::Connecting { stream, deadline };
        }
        self.deadline_changed = true;
    }

    /// The circuit of request `id` closed before CONNECTED (or refused the
    /// stream as closed): a fresh circuit, unless it was the last retry.
    fn connect_lost(&mut self, now: Instant, id: RequestId) {
        let retries = self.cfg.settings.stream_retries;
        let Some(r) = self.requests.get_mut(&id) else {
            return;
        };
        if r.retried >= retries {
            return self.fail(now, id, StreamFailure::CircuitClosed);
        }
        r.retried += 1;
        r.builds_failed = 0;
        r.state = RequestState::Choosing;
        tracing::debug!(target = %r.target, "circuit closed before CONNECTED: retrying on a fresh circuit");
        self.advance(now, id);
    }

    /// The stream of request `id` lost its circuit: a connecting one is
    /// tried again, a connected one's owner is told.
    pub(crate) fn stream_lost(&mut self, now: Instant, id: RequestId) {
        if self.requests.contains_key(&id) {
            self.connect_lost(now, id);
        } else {
            self.events.push_back(CoreEvent::Stream(id));
        }
    }

    /// News of stream `sref`: CONNECTED or END for a connecting request,
    /// anything for a connected stream's owner.
    pub(crate) fn on_stream_news(
        &mut self,
        now: Instant,
        sref: StreamRef,
        connected: bool,
        ended: Option<EndReason>,
    ) {
        let id = sref.request;
        if !self.requests.contains_key(&id) {
            self.events.push_back(CoreEvent::Stream(id));
            return;
        }
        if connected {
            self.requests.remove(&id);
            self.events.push_back(CoreEvent::Opened {
                request: id,
                stream: sref,
            });
        } else if let Some(reason) = ended {
            self.fail(now, id, StreamFailure::Ended(reason));
        }
    }

    /// Requests whose exit did not answer by their deadline fail.
    pub(crate) fn expire_connects(&mut self, now: Instant) {
        let late: Vec<RequestId> = self
            .requests
            .iter()
            .filter(|(_, r)| r.deadline().is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            self.fail(now, id, StreamFailure::ConnectTimeout);
        }
    }

    /// Request `id` fails: its stream (if it has one) is closed.
    pub(crate) fn fail(&mut self, now: Instant, id: RequestId, failure: StreamFailure) {
        let Some(r) = self.requests.remove(&id) else {
            return;
        };
        match r.state {
            RequestState::Connecting { stream, .. } => self.detach_stream(now, &stream),
            RequestState::Building(circ) => {
                if let Some(c) = self.circuits.get_mut(&circ) {
                    c.waiting.retain(|w| *w != id);
                }
            }
            RequestState::Choosing => {}
        }
        self.events.push_back(CoreEvent::Failed {
            request: id,
            failure,
        });
    }

    /// What `s`'s owner should know about it.
    pub fn stream_view(&self, s: &StreamRef) -> StreamView {
        match self.circuits.get(&s.circ).and_then(|c| c.slot(s)) {
            Some(slot) => StreamView::Live {
                connected: slot.connected,
                ended: slot.ended,
            },
            None => StreamView::Lost,
        }
    }

    /// Whether stream `s` still has its slot on a live circuit.
    fn is_live(&self, s: &StreamRef) -> bool {
        self.circuits
            .get(&s.circ)
            .is_some_and(|c| c.slot(s).is_some())
    }

    /// Offer bytes to stream `s`: how many it took (`None`: it is gone).
    pub fn stream_write(&mut self, now: Instant, s: &StreamRef, data: &[u8]) -> Option<usize> {
        if !self.is_live(s) {
            return None;
        }
        let r = self.node.write(now, s.circ, s.id, data).ok();
        self.settle(now);
        r
    }

    /// When the exit's XON rate lets stream `s` take bytes again, if it
    /// refuses them now for the rate.
    pub fn stream_write_resumes_at(&self, s: &StreamRef) -> Option<Instant> {
        if !self.is_live(s) {
            return None;
        }
        self.node.write_resumes_at(s.circ, s.id)
    }

    /// Read what stream `s` received.
    pub fn stream_read(&mut self, now: Instant, s: &StreamRef, buf: &mut [u8]) -> ReadResult {
        if !self.is_live(s) {
            return ReadResult::Gone;
        }
        let r = match self.node.read(now, s.circ, s.id, buf) {
            Ok(n) => ReadResult::Data(n),
            Err(_) => ReadResult::Gone,
        };
        self.settle(now);
        r
    }

    /// The application is done with stream `s`: END after its queued
    /// bytes (if the stream still exists). A circuit past its dirtiness
    /// limit closes with its last stream.
    pub fn detach(&mut self, now: Instant, s: &StreamRef) {
        self.detach_stream(now, s);
        self.settle(now);
    }

    /// [`detach`](Self::detach) without handling what follows.
    fn detach_stream(&mut self, now: Instant, s: &StreamRef) {
        let max_dirty = self.cfg.settings.max_circuit_dirtiness;
        let Some(c) = self.circuits.get_mut(&s.circ) else {
            return;
        };
        if c.slot(s).is_none() {
            return;
        }
        c.streams.remove(&u16::from(s.id));
        let close_circuit = c.streams.is_empty() && c.open && c.is_retired(now, max_dirty);
        if close_circuit {
            tracing::debug!(
                circ = s.circ.0,
                stale = c.stale,
                "closing dirty circuit after its last stream"
            );
        }
        // Fails harmlessly if the stream is already gone.
        let _ = self.node.close_stream(now, s.circ, s.id);
        if close_circuit {
            self.node.destroy(now, s.circ);
        }
    }
}

//! The client's shared state: the sans-IO [`ClientCore`] (the client node
//! and every decision over it) and what drives it here: the channels'
//! connections and tasks, the stream tasks' wake-ups, the timer.
//!
//! Every task holds an `Rc<RefCell<State>>` and borrows it only between
//! awaits. Whatever calls into the core calls [`State::settle`] afterwards,
//! which acts on the core's events: connections to open, channels' writers
//! to wake, stream tasks to wake (their request answered, or news of their
//! stream), the timer to move.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Instant;

use onionlab_client_core::{ClientCore, Config, CoreEvent, RequestId};
use onionlab_netdoc::{NetworkDocument, RelayEntry};
use onionlab_transport::addrs::EndpointAddrs;
use onionlab_transport::connector::Connector;
use onionlab_transport::{CellWriter, Ordering};
use tokio::sync::Notify;
use tokio::task::{AbortHandle, JoinHandle};
use tor_llcrypto::pk::ed25519::Ed25519Identity;

pub(crate) use onionlab_client_core::{
    ChanKey, IsolationKey, ReadResult, StreamFailure, StreamRef, StreamView,
};

use crate::path::{PinnedPathError, Target};
use crate::settings::ClientSettings;

/// The state as the tasks share it.
pub(crate) type Shared = Rc<RefCell<State>>;

/// The tasks of one channel to a guard (the core holds the rest).
struct ChannelTasks {
    wake: Rc<Notify>,
    reader: Option<AbortHandle>,
    writer: Option<AbortHandle>,
}

/// What the writer task of a channel should do after [`State::fill`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fill {
    /// Flush what was queued (if anything), then wait for work.
    Continue,
    /// The channel is gone: stop.
    Gone,
    /// The channel is closing and has nothing left: shut the link down.
    Done,
}

/// A stream task's wake-up, and its request's outcome once known.
struct Waiter {
    notify: Rc<Notify>,
    outcome: Option<Result<StreamRef, StreamFailure>>,
}

/// Everything the client's tasks share.
pub(crate) struct State {
    /// The client's settings as given (the core holds the document in
    /// use).
    pub(crate) settings: Rc<ClientSettings>,
    core: ClientCore,
    /// The state's own handle, for the tasks it starts.
    me: Weak<RefCell<State>>,
    connector: Connector,
    channels: HashMap<ChanKey, ChannelTasks>,
    /// Stream tasks, by their request.
    waiters: HashMap<RequestId, Waiter>,
    /// Wakes the timer task when the core's next deadline moved earlier.
    timer: Rc<Notify>,
    /// The deadline the timer task sleeps until.
    timer_armed: Option<Instant>,
    /// Writer tasks, awaited at shutdown so DESTROYs go out.
    writers: Vec<JoinHandle<()>>,
    /// Stream failures are logged at INFO, at most one line per interval.
    stream_failures: onionlab_ops::LogLimiter,
}

/// The client's connector ([`Connector::client`]). Fails only if the
/// dtls-utcp UDP socket cannot be bound.
fn connector(settings: &ClientSettings) -> Result<Connector, crate::Error> {
    Connector::client(&settings.link).map_err(|source| crate::Error::Setting {
        what: "the client's endpoints",
        source,
    })
}

impl State {
    /// The shared state over `cfg` (the settings' policy, resolved).
    pub(crate) fn new_shared(
        settings: ClientSettings,
        cfg: Config,
    ) -> Result<Shared, crate::Error> {
        let connector = connector(&settings)?;
        Ok(Rc::new_cyclic(|me| {
            RefCell::new(State {
                settings: Rc::new(settings),
                core: ClientCore::new(cfg),
                me: me.clone(),
                connector,
                channels: HashMap::new(),
                waiters: HashMap::new(),
                timer: Rc::new(Notify::new()),
                timer_armed: None,
                writers: Vec::new(),
                stream_failures: onionlab_ops::LogLimiter::default(),
            })
        }))
    }

    /// The network document in use.
    pub(crate) fn network(&self) -> Arc<NetworkDocument> {
        self.core.settings().network.clone()
    }

    /// Log a stream failure at INFO, rate-limited (with the count of the
    /// failures held back since the last line).
    pub(crate) fn log_stream_failure(&mut self, what: &str) {
        if let Some(held_back) = self.stream_failures.check(Instant::now()) {
            if held_back > 0 {
                tracing::info!("{what} (and {held_back} more stream failures since the last line)");
            } else {
                tracing::info!("{what}");
            }
        }
    }

    /// Use `doc`, a newer network document, from now on (see
    /// [`ClientCore::replace_network`]).
    pub(crate) fn replace_network(
        &mut self,
        doc: Arc<NetworkDocument>,
    ) -> Result<onionlab_client_core::Swapped, PinnedPathError> {
        self.core.replace_network(doc)
    }

    /// Ask for a stream to `target` with isolation `iso`: the request and
    /// the notifier its task waits on until
    /// [`take_outcome`](Self::take_outcome) has the answer.
    pub(crate) fn open_stream(
        &mut self,
        target: Target,
        iso: IsolationKey,
    ) -> (RequestId, Rc<Notify>) {
        let notify = Rc::new(Notify::new());
        // Its answer may be among the core's events already: they are
        // handled once its waiter is in place.
        let id = self.core.open_stream(Instant::now(), target, iso);
        self.waiters.insert(
            id,
            Waiter {
                notify: notify.clone(),
                outcome: None,
            },
        );
        self.settle();
        (id, notify)
    }

    /// The answer to request `id`, once there is one (taken once).
    pub(crate) fn take_outcome(
        &mut self,
        id: RequestId,
    ) -> Option<Result<StreamRef, StreamFailure>> {
        let outcome = self.waiters.get_mut(&id)?.outcome.take();
        if matches!(outcome, Some(Err(_))) {
            self.waiters.remove(&id);
        }
        outcome
    }

    /// Act on what the core reports: connections to open, writers, stream
    /// tasks and the timer to wake.
    pub(crate) fn settle(&mut self) {
        while let Some(ev) = self.core.poll_event() {
            match ev {
                CoreEvent::Connect { chan, guard } => self.connect_channel(chan, &guard),
                CoreEvent::Transmit(chan) => {
                    if let Some(ch) = self.channels.get(&chan) {
                        ch.wake.notify_one();
                    }
                }
                CoreEvent::Opened { request, stream } => self.answer(request, Ok(stream)),
                CoreEvent::Failed { request, failure } => self.answer(request, Err(failure)),
                CoreEvent::Stream(request) => {
                    if let Some(w) = self.waiters.get(&request) {
                        w.notify.notify_one();
                    }
                }
            }
        }
        if self.core.take_deadline_changed() {
            let next = self.core.poll_timeout();
            if next.is_some_and(|n| self.timer_armed.is_none_or(|armed| n < armed)) {
                self.timer.notify_one();
            }
        }
    }

    /// Request `id` has its answer: wake its task.
    fn answer(&mut self, id: RequestId, outcome: Result<StreamRef, StreamFailure>) {
        if let Some(w) = self.waiters.get_mut(&id) {
            w.outcome = Some(outcome);
            w.notify.notify_one();
        }
    }

    /// Start the connection of channel `chan` to `relay`.
    fn connect_channel(&mut self, chan: ChanKey, relay: &RelayEntry) {
        self.channels.insert(
            chan,
            ChannelTasks {
                wake: Rc::new(Notify::new()),
                reader: None,
                writer: None,
            },
        );
        let identity = Ed25519Identity::new(relay.ed_identity);
        let addrs = EndpointAddrs::from_document(|name| relay.address(name));
        let Some(shared) = self.me.upgrade() else {
            return;
        };
        if let Some(addr) = addrs.any() {
            tracing::debug!(guard = %relay.nickname, %addr, "opening channel");
        }
        tokio::task::spawn_local(crate::channel::connect(shared, chan, addrs, identity));
    }

    /// The timer task: sleeps until the core's next deadline (build, hop
    /// and connect timeouts), or until woken because a nearer one
    /// appeared.
    pub(crate) async fn run_timer(shared: Shared) {
        let timer = shared.borrow().timer.clone();
        loop {
            let next = {
                let mut st = shared.borrow_mut();
                let next = st.core.poll_timeout();
                st.timer_armed = next;
                next
            };
            match next {
                Some(at) => tokio::select! {
                    () = tokio::time::sleep_until(at.into()) => {
                        let mut st = shared.borrow_mut();
                        st.core.handle_timeout(Instant::now());
                        st.settle();
                    }
                    () = timer.notified() => {}
                },
                None => timer.notified().await,
            }
        }
    }

    /// What `s`'s task should know about it.
    pub(crate) fn stream_view(&self, s: &StreamRef) -> StreamView {
        self.core.stream_view(s)
    }

    /// Offer bytes to stream `s`: how many it took (`None`: it is gone).
    pub(crate) fn stream_write(&mut self, s: &StreamRef, data: &[u8]) -> Option<usize> {
        let r = self.core.stream_write(Instant::now(), s, data);
        self.settle();
        r
    }

    /// When the exit's XON rate lets stream `s` take bytes again, if it
    /// refuses them now for the rate.
    pub(crate) fn stream_write_resumes_at(&self, s: &StreamRef) -> Option<Instant> {
        self.core.stream_write_resumes_at(s)
    }

    /// Read what stream `s` received.
    pub(crate) fn stream_read(&mut self, s: &StreamRef, buf: &mut [u8]) -> ReadResult {
        let r = self.core.stream_read(Instant::now(), s, buf);
        self.settle();
        r
    }

    /// The application is done with stream `s`: END after its queued
    /// bytes, and forget its task.
    pub(crate) fn detach(&mut self, s: &StreamRef) {
        self.waiters.remove(&s.request);
        self.core.detach(Instant::now(), s);
        self.settle();
    }

    /// Close circuits past their dirtiness limit (or stale after a
    /// document change) that no stream uses.
    pub(crate) fn expire_dirty(&mut self) {
        self.core.expire_dirty(Instant::now());
        self.settle();
    }

    /// The channel's connection is up: its writer and reader tasks run.
    pub(crate) fn channel_opened(
        &mut self,
        chan: ChanKey,
        reader: AbortHandle,
        writer: JoinHandle<()>,
        how: &str,
    ) -> bool {
        let Some(ch) = self.channels.get_mut(&chan) else {
            reader.abort();
            writer.abort();
            return false;
        };
        ch.reader = Some(reader);
        ch.writer = Some(writer.abort_handle());
        self.writers.retain(|w| !w.is_finished());
        self.writers.push(writer);
        let nick = self.core.channel_guard_name(chan);
        self.core.channel_opened(Instant::now(), chan);
        self.settle();
        tracing::info!(guard = %nick, "channel open to {nick} at {how}");
        true
    }

    /// The notifier of a channel's writer task.
    pub(crate) fn channel_wake(&self, chan: ChanKey) -> Option<Rc<Notify>> {
        self.channels.get(&chan).map(|c| c.wake.clone())
    }

    /// The guard's nickname of a channel, for logs.
    pub(crate) fn channel_guard_name(&self, chan: ChanKey) -> String {
        self.core.channel_guard_name(chan)
    }

    /// A channel is gone (connection failed or closed, or shutdown): its
    /// tasks stop, its circuits close and their streams are told.
    pub(crate) fn close_channel(&mut self, chan: ChanKey, why: &str) {
        let Some(ch) = self.channels.remove(&chan) else {
            return;
        };
        if let Some(r) = &ch.reader {
            r.abort();
        }
        if let Some(w) = &ch.writer {
            w.abort();
        }
        self.core.channel_closed(Instant::now(), chan, why);
        self.settle();
    }

    /// Cells read from a channel: to their circuits.
    pub(crate) fn handle_cells(
        &mut self,
        chan: ChanKey,
        cells: impl Iterator<Item = onionlab_cell::chan::AnyChanCell>,
    ) {
        self.core.handle_cells(Instant::now(), chan, cells);
        self.settle();
    }

    /// Queue cells of the channel's circuits on `w`, in the order the
    /// channel's circuit scheduler gives, while the writer has room.
    pub(crate) fn fill<W: CellWriter>(
        &mut self,
        chan: ChanKey,
        w: &mut W,
    ) -> Result<Fill, onionlab_transport::Error> {
        if !self.core.has_channel(chan) {
            return Ok(Fill::Gone);
        }
        let now = Instant::now();
        let filled = if w.ordering() == Ordering::PerCircuit {
            self.fill_lanes(chan, w, now)
        } else {
            self.fill_ordered(chan, w, now)
        };
        self.core.settle(now);
        self.settle();
        filled?;
        Ok(if self.core.channel_done(chan) {
            Fill::Done
        } else {
            Fill::Continue
        })
    }

    /// [`fill`](Self::fill) for a writer that carries the channel as one
    /// ordered byte stream.
    fn fill_ordered<W: CellWriter>(
        &mut self,
        chan: ChanKey,
        w: &mut W,
        now: Instant,
    ) -> Result<(), onionlab_transport::Error> {
        while w.has_room() {
            let Some(cell) = self.core.poll_transmit(now, chan) else {
                break;
            };
            w.queue(cell)?;
        }
        Ok(())
    }

    /// [`fill`](Self::fill) for a writer with a lane per circuit: each
    /// circuit with cells fills its own lane while that lane has room, so a
    /// full lane holds back only its circuit. Lanes sharing one connection
    /// (QUIC streams) get the scheduler's priorities.
    fn fill_lanes<W: CellWriter>(
        &mut self,
        chan: ChanKey,
        w: &mut W,
        now: Instant,
    ) -> Result<(), onionlab_transport::Error> {
        for id in self.core.circuits_with_work(chan) {
            w.set_lane_priority(id, self.core.lane_priority(now, chan, id));
            while w.has_room_for(id) {
                let Some(cell) = self.core.poll_transmit_circuit(now, chan, id) else {
                    break;
                };
                w.queue(cell)?;
            }
        }
        Ok(())
    }

    /// Stop: refuse new streams, destroy every circuit, close channels
    /// once their DESTROYs are out. Returns the writer tasks to wait for.
    pub(crate) fn begin_shutdown(&mut self) -> Vec<JoinHandle<()>> {
        for chan in self.core.shutdown(Instant::now()) {
            // Not open yet: its connect task finds it gone.
            self.channels.remove(&chan);
        }
        self.settle();
        std::mem::take(&mut self.writers)
    }

    /// What opens channels.
    pub(crate) fn connector(&self) -> Connector {
        self.connector.clone()
    }
}

//! One UDP socket running a sans-IO [`Endpoint`] (crate `onionlab-utcp`):
//! DTLS sessions to peers, and each session's lanes (one user-space TCP
//! connection each) as byte streams ([`LaneStream`], `AsyncRead` +
//! `AsyncWrite`).
//!
//! One driver task per socket owns nothing but the socket; the endpoint
//! and every lane's buffers sit behind one lock shared with the lane
//! streams. A stream's write copies into its lane's send buffer (at most
//! [`LANE_BUFFER`] bytes, then it waits) and wakes the driver; the driver
//! moves the buffer into the lane's TCP as its window allows, and moves
//! what the lane received into the stream's receive buffer (at most
//! [`LANE_BUFFER`]; while it is full the lane is not read, so its TCP
//! window closes and the peer waits: back-pressure end to end).

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::{Buf, BytesMut};
use onionlab_utcp::{
    Endpoint, EndpointConfig, EndpointEvent, EndpointStats, LaneEvent, LaneId, LaneState,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot, Notify};
use tor_llcrypto::pk::ed25519::Ed25519Identity;
use tracing::debug;

use crate::Error;

/// Bytes a lane stream buffers each way.
pub const LANE_BUFFER: usize = 64 * 1024;
/// Sessions waiting for [`UtcpSocket::accept`], at most (more are closed).
const ACCEPT_QUEUE: usize = 64;
/// Lanes the peer opened waiting for [`UtcpSession::accept_lane`], at
/// most (more are dropped at once: reset when their first bytes arrive).
const LANE_QUEUE: usize = 1024;

/// A UDP socket with its sessions (see the module docs). Dropping it
/// stops its driver: every session and lane on it ends.
pub struct UtcpSocket {
    shared: Arc<Shared>,
    accepted: Option<tokio::sync::Mutex<mpsc::Receiver<UtcpSession>>>,
    driver: tokio::task::JoinHandle<()>,
}

struct Shared {
    socket: UdpSocket,
    local: SocketAddr,
    state: Mutex<State>,
    wake: Notify,
}

struct State {
    endpoint: Endpoint,
    connects: HashMap<SocketAddr, oneshot::Sender<Result<UtcpSession, Error>>>,
    accepted: Option<mpsc::Sender<UtcpSession>>,
    sessions: HashMap<SocketAddr, SessionIo>,
    /// Sessions whose lanes have something to move.
    dirty: HashSet<SocketAddr>,
    /// Sessions and lanes nobody took, dropped by the driver once it has
    /// let go of the lock (their drop takes it).
    unwanted: Vec<Unwanted>,
    /// The next session's generation: handles carry theirs, so a handle
    /// of an ended session never touches a later one with the same peer
    /// address.
    next_generation: u64,
}

#[allow(dead_code)] // held only to be dropped
enum Unwanted {
    Session(UtcpSession),
    Lane(LaneStream),
}

struct SessionIo {
    generation: u64,
    lanes: HashMap<LaneId, LaneIo>,
    incoming: mpsc::Sender<LaneStream>,
    held: Arc<HeldBytes>,
}

/// Bytes a session's lanes hold, received and to send: in the lanes'
/// stream buffers and in their TCP's (smoltcp's) queues. Kept by the
/// driver each time it moves the session's lanes; the link reports them
/// to the relay's memory cap (`max_mem_in_queues`), as other transports
/// report their user-space buffers.
#[derive(Debug, Default)]
pub struct HeldBytes {
    recv: AtomicUsize,
    send: AtomicUsize,
}

impl HeldBytes {
    /// Received bytes not yet read by the lanes' streams.
    pub fn recv(&self) -> usize {
        self.recv.load(AtomicOrdering::Relaxed)
    }

    /// Bytes written by the lanes' streams and not yet acknowledged.
    pub fn send(&self) -> usize {
        self.send.load(AtomicOrdering::Relaxed)
    }
}

impl State {
    /// The session with `peer` if it is generation `generation`.
    fn session(&mut self, peer: SocketAddr, generation: u64) -> Option<&mut SessionIo> {
        self.sessions
            .get_mut(&peer)
            .filter(|s| s.generation == generation)
    }
}

#[derive(Default)]
struct LaneIo {
    /// Written by the stream, not yet taken by the lane's TCP.
    tx: BytesMut,
    /// Received by the lane, not yet read by the stream.
    rx: BytesMut,
    tx_waker: Option<Waker>,
    rx_waker: Option<Waker>,
    /// The peer finished its side (FIN) and everything was read.
    eof: bool,
    /// The lane or its session broke.
    error: Option<io::ErrorKind>,
    /// The stream shut its sending side down; FIN once `tx` is sent.
    shutdown: bool,
    fin_sent: bool,
    /// The stream is gone: its unsent bytes still go out, then FIN (see
    /// `finish_dropped`).
    dropped: bool,
}

impl LaneIo {
    fn wake(&mut self) {
        if let Some(w) = self.tx_waker.take() {
            w.wake();
        }
        if let Some(w) = self.rx_waker.take() {
            w.wake();
        }
    }

    fn fail(&mut self, kind: io::ErrorKind) {
        self.error.get_or_insert(kind);
        self.wake();
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(|p| p.into_inner())
}

impl UtcpSocket {
    /// Bind a UDP socket at `addr` and start its driver. Accepting
    /// sockets (`config.accept`) hand their sessions to
    /// [`accept`](Self::accept).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the socket cannot be bound, [`Error::Config`] for
    /// settings the endpoint refuses.
    pub async fn bind(addr: SocketAddr, config: EndpointConfig) -> Result<UtcpSocket, Error> {
        Self::bind_now(addr, config)
    }

    /// [`bind`](Self::bind) without waiting (binding a UDP socket does
    /// not block); needs a tokio runtime.
    ///
    /// # Errors
    ///
    /// As [`bind`](Self::bind).
    pub fn bind_now(addr: SocketAddr, config: EndpointConfig) -> Result<UtcpSocket, Error> {
        let accepts = config.accept;
        let endpoint = Endpoint::new(config, rand::random(), Instant::now())
            .map_err(|e| Error::Config(format!("dtls-utcp endpoint: {e}")))?;
        let (socket, local) = crate::udp::bind(addr, "binding the dtls-utcp UDP socket")?;
        let (tx, rx) = mpsc::channel(ACCEPT_QUEUE);
        let shared = Arc::new(Shared {
            socket,
            local,
            state: Mutex::new(State {
                endpoint,
                connects: HashMap::new(),
                accepted: accepts.then_some(tx),
                sessions: HashMap::new(),
                dirty: HashSet::new(),
                unwanted: Vec::new(),
                next_generation: 0,
            }),
            wake: Notify::new(),
        });
        let driver = tokio::spawn(drive(shared.clone()));
        Ok(UtcpSocket {
            shared,
            accepted: accepts.then(|| tokio::sync::Mutex::new(rx)),
            driver,
        })
    }

    /// The socket's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local
    }

    /// Open a session to the relay at `peer`, which must prove `expect`.
    /// Resolves once both sides are authenticated, or with the reason the
    /// session ended (the endpoint's handshake timeout bounds it).
    ///
    /// # Errors
    ///
    /// [`Error::Protocol`] naming what failed.
    pub async fn connect(
        &self,
        peer: SocketAddr,
        expect: Ed25519Identity,
    ) -> Result<UtcpSession, Error> {
        let (tx, rx) = oneshot::channel();
        {
            let mut st = lock(&self.shared);
            st.endpoint
                .connect(peer, expect, Instant::now())
                .map_err(|e| protocol(peer, e))?;
            st.connects.insert(peer, tx);
        }
        self.shared.wake.notify_one();
        rx.await.unwrap_or_else(|_| Err(Error::Closed))
    }

    /// The next session a peer opened (`None`: this socket does not
    /// accept, or it is shutting down).
    pub async fn accept(&self) -> Option<UtcpSession> {
        self.accepted.as_ref()?.lock().await.recv().await
    }

    /// What the endpoint refused or dropped so far.
    pub fn stats(&self) -> EndpointStats {
        lock(&self.shared).endpoint.stats()
    }
}

impl Drop for UtcpSocket {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

fn protocol(peer: SocketAddr, e: onionlab_dtls::Error) -> Error {
    match e {
        onionlab_dtls::Error::WrongIdentity { got, expected } => Error::WrongIdentity {
            peer,
            got: hex::encode(got.as_bytes()),
            expected: hex::encode(expected.as_bytes()),
        },
        e => Error::Protocol {
            peer,
            detail: format!("dtls-utcp: {e}"),
        },
    }
}

/// One authenticated session: open lanes, accept the peer's.
pub struct UtcpSession {
    shared: Arc<Shared>,
    peer: SocketAddr,
    generation: u64,
    identity: Option<Ed25519Identity>,
    incoming: mpsc::Receiver<LaneStream>,
    held: Arc<HeldBytes>,
}

impl UtcpSession {
    /// What the session's lanes hold now (see [`HeldBytes`]).
    pub fn held(&self) -> &HeldBytes {
        &self.held
    }

    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The identity the peer proved (`None`: a client).
    pub fn identity(&self) -> Option<Ed25519Identity> {
        self.identity
    }

    /// Whether [`open_lane`](Self::open_lane) would find room: the
    /// session's lane limit and the node's lane budget (its control lane
    /// and closing lanes count too). False if the session ended.
    pub fn can_open_lane(&self) -> bool {
        let mut st = lock(&self.shared);
        if st.session(self.peer, self.generation).is_none() {
            return false;
        }
        let now = Instant::now();
        st.endpoint
            .with_carrier(self.peer, now, |m| m.has_room())
            .unwrap_or(false)
    }

    /// Open a lane to the peer. What is written before its handshake
    /// completes waits in its buffer.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] if the session ended; [`Error::Utcp`] with
    /// `ConnectionRefused` if the lane limit is reached (a circuit of its
    /// own, not the link's failure); [`Error::Protocol`] if the lane
    /// numbers ran out.
    pub fn open_lane(&self) -> Result<LaneStream, Error> {
        let stream = {
            let mut st = lock(&self.shared);
            st.session(self.peer, self.generation)
                .ok_or(Error::Closed)?;
            let now = Instant::now();
            let id = st
                .endpoint
                .with_carrier(self.peer, now, |m| m.open(now))
                .ok_or(Error::Closed)?
                .map_err(|e| match e {
                    onionlab_utcp::Error::TooManyLanes(_) => Error::Utcp {
                        peer: self.peer,
                        source: io::Error::new(io::ErrorKind::ConnectionRefused, e.to_string()),
                    },
                    e => Error::Protocol {
                        peer: self.peer,
                        detail: format!("dtls-utcp: {e}"),
                    },
                })?;
            st.session(self.peer, self.generation)
                .ok_or(Error::Closed)?
                .lanes
                .insert(id, LaneIo::default());
            LaneStream {
                shared: self.shared.clone(),
                peer: self.peer,
                generation: self.generation,
                lane: id,
            }
        };
        // The SYN waits in the endpoint's queue: the driver sends it.
        self.shared.wake.notify_one();
        Ok(stream)
    }

    /// The next lane the peer opened (`None`: the session ended, or its
    /// lanes were taken by [`incoming`](Self::incoming)).
    pub async fn accept_lane(&mut self) -> Option<LaneStream> {
        self.incoming.recv().await
    }

    /// Take the lanes the peer opens, to accept them elsewhere (the
    /// session keeps opening its own).
    pub fn incoming(&mut self) -> IncomingLanes {
        let (_, closed) = mpsc::channel(1);
        IncomingLanes(std::mem::replace(&mut self.incoming, closed))
    }

    /// Lanes open on this session.
    pub fn lanes(&self) -> usize {
        lock(&self.shared)
            .session(self.peer, self.generation)
            .map_or(0, |s| s.lanes.len())
    }
}

impl Drop for UtcpSession {
    fn drop(&mut self) {
        let mut st = lock(&self.shared);
        // Only this session: a later one with the same peer is not ours.
        if st.session(self.peer, self.generation).is_none() {
            return;
        }
        st.endpoint.close(self.peer);
        if let Some(io) = st.sessions.remove(&self.peer) {
            for mut lane in io.lanes.into_values() {
                lane.fail(io::ErrorKind::ConnectionAborted);
            }
        }
    }
}

/// The lanes a session's peer opens (see [`UtcpSession::incoming`]).
pub struct IncomingLanes(mpsc::Receiver<LaneStream>);

impl IncomingLanes {
    /// The next one (`None`: the session ended).
    pub async fn next(&mut self) -> Option<LaneStream> {
        self.0.recv().await
    }
}

/// One lane: a reliable, ordered byte stream to the peer, carried by the
/// lane's user-space TCP inside the session.
pub struct LaneStream {
    shared: Arc<Shared>,
    peer: SocketAddr,
    generation: u64,
    lane: LaneId,
}

impl LaneStream {
    /// The lane's number in its session.
    pub fn id(&self) -> LaneId {
        self.lane
    }

    /// Run `f` on this lane's buffers; an error if the session is gone.
    fn with<R>(&self, f: impl FnOnce(&mut LaneIo, &mut HashSet<SocketAddr>) -> R) -> io::Result<R> {
        let mut st = lock(&self.shared);
        let st = &mut *st;
        let lane = st
            .sessions
            .get_mut(&self.peer)
            .filter(|s| s.generation == self.generation)
            .and_then(|s| s.lanes.get_mut(&self.lane))
            .ok_or_else(|| io::Error::from(io::ErrorKind::ConnectionAborted))?;
        Ok(f(lane, &mut st.dirty))
    }
}

impl AsyncRead for LaneStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let peer = self.peer;
        let polled = self.with(|lane, dirty| {
            if !lane.rx.is_empty() {
                let n = lane.rx.len().min(buf.remaining());
                buf.put_slice(&lane.rx[..n]);
                lane.rx.advance(n);
                // Room again: the driver may read more from the lane.
                dirty.insert(peer);
                return Poll::Ready(Ok(true));
            }
            if let Some(kind) = lane.error {
                return Poll::Ready(Err(io::Error::from(kind)));
            }
            if lane.eof {
                return Poll::Ready(Ok(false));
            }
            lane.rx_waker = Some(cx.waker().clone());
            Poll::Pending
        });
        match polled {
            Ok(Poll::Ready(Ok(read))) => {
                if read {
                    self.shared.wake.notify_one();
                }
                Poll::Ready(Ok(()))
            }
            Ok(Poll::Ready(Err(e))) | Err(e) => Poll::Ready(Err(e)),
            Ok(Poll::Pending) => Poll::Pending,
        }
    }
}

impl AsyncWrite for LaneStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let peer = self.peer;
        let polled = self.with(|lane, dirty| {
            if let Some(kind) = lane.error {
                return Poll::Ready(Err(io::Error::from(kind)));
            }
            if lane.shutdown {
                return Poll::Ready(Err(io::Error::from(io::ErrorKind::BrokenPipe)));
            }
            let room = LANE_BUFFER.saturating_sub(lane.tx.len());
            if room == 0 {
                lane.tx_waker = Some(cx.waker().clone());
                return Poll::Pending;
            }
            let n = room.min(data.len());
            lane.tx.extend_from_slice(&data[..n]);
            dirty.insert(peer);
            Poll::Ready(Ok(n))
        });
        match polled {
            Ok(Poll::Ready(Ok(n))) => {
                self.shared.wake.notify_one();
                Poll::Ready(Ok(n))
            }
            Ok(other) => other,
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let peer = self.peer;
        let r = self.with(|lane, dirty| {
            lane.shutdown = true;
            dirty.insert(peer);
        });
        self.shared.wake.notify_one();
        Poll::Ready(r)
    }
}

impl Drop for LaneStream {
    fn drop(&mut self) {
        let peer = self.peer;
        if self
            .with(|lane, dirty| {
                lane.dropped = true;
                dirty.insert(peer);
            })
            .is_ok()
        {
            self.shared.wake.notify_one();
        }
    }
}

/// The driver: datagrams in, timers, lanes' buffers moved, datagrams out.
async fn drive(shared: Arc<Shared>) {
    let mut buf = vec![0u8; crate::udp::MAX_DATAGRAM];
    loop {
        let (deadline, out, unwanted) = {
            let mut st = lock(&shared);
            let now = Instant::now();
            st.move_lanes(&shared, now);
            let out: Vec<_> = std::iter::from_fn(|| st.endpoint.poll_transmit()).collect();
            (
                st.endpoint.poll_timeout(),
                out,
                std::mem::take(&mut st.unwanted),
            )
        };
        // Their drops close them (taking the lock): the next round sends
        // what that produced.
        let closed_some = !unwanted.is_empty();
        drop(unwanted);
        if closed_some {
            continue;
        }
        for (to, d) in &out {
            if let Err(e) = shared.socket.send_to(d, to).await {
                debug!(%to, "dtls-utcp send: {e}");
            }
        }
        if !out.is_empty() {
            // Sending took time: look again before sleeping.
            tokio::task::yield_now().await;
        }
        let notified = shared.wake.notified();
        let sleep = async {
            match deadline {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = shared.socket.recv_from(&mut buf) => match r {
                Ok((n, from)) => {
                    let mut st = lock(&shared);
                    let now = Instant::now();
                    crate::udp::take_batch(&shared.socket, &mut buf, (from, n), |from, d| {
                        st.take_datagram(from, d, now, &shared)
                    });
                }
                // An ICMP error for an earlier datagram, on Linux: the
                // session concerned learns by its own timers.
                Err(e) => debug!("dtls-utcp receive: {e}"),
            },
            _ = sleep => {
                let mut st = lock(&shared);
                st.endpoint.handle_timeout(Instant::now());
                // Timers may have freed send room or completed lanes.
                let peers: Vec<_> = st.sessions.keys().copied().collect();
                st.dirty.extend(peers);
                st.take_events(&shared);
            }
            _ = notified => {}
        }
    }
}

impl State {
    fn take_datagram(&mut self, from: SocketAddr, d: &[u8], now: Instant, shared: &Arc<Shared>) {
        self.endpoint.handle_datagram(from, d, now);
        self.dirty.insert(from);
        self.take_events(shared);
    }

    fn take_events(&mut self, shared: &Arc<Shared>) {
        while let Some(ev) = self.endpoint.poll_event() {
            match ev {
                EndpointEvent::Authenticated { peer, identity, .. } => {
                    self.authenticated(peer, identity, shared)
                }
                EndpointEvent::Carrier {
                    peer,
                    event: LaneEvent::Accepted(id),
                } => self.lane_accepted(peer, id, shared),
                EndpointEvent::Carrier {
                    peer,
                    event:
                        LaneEvent::Closed {
                            lane,
                            reset,
                            refused,
                        },
                } => {
                    if let Some(l) = self
                        .sessions
                        .get_mut(&peer)
                        .and_then(|s| s.lanes.get_mut(&lane))
                    {
                        if refused {
                            // Nothing sent on it arrived (pctcp may end
                            // just its circuit, and stop opening lanes).
                            l.fail(io::ErrorKind::ConnectionRefused);
                        } else if reset {
                            l.fail(io::ErrorKind::ConnectionReset);
                        } else {
                            l.eof = true;
                            l.wake();
                        }
                        if l.dropped {
                            // Its stream is gone and so is the lane (a
                            // dropped stream's unsent bytes die with it).
                            if let Some(s) = self.sessions.get_mut(&peer) {
                                s.lanes.remove(&lane);
                            }
                        }
                    }
                }
                EndpointEvent::Closed { peer, error } => {
                    debug!(%peer, "dtls-utcp session ended: {error}");
                    if let Some(tx) = self.connects.remove(&peer) {
                        let _ = tx.send(Err(protocol(peer, error)));
                    }
                    if let Some(io) = self.sessions.remove(&peer) {
                        for mut lane in io.lanes.into_values() {
                            lane.fail(io::ErrorKind::ConnectionAborted);
                        }
                    }
                }
            }
        }
    }

    fn authenticated(
        &mut self,
        peer: SocketAddr,
        identity: Option<Ed25519Identity>,
        shared: &Arc<Shared>,
    ) {
        let (tx, rx) = mpsc::channel(LANE_QUEUE);
        let generation = self.next_generation;
        self.next_generation += 1;
        let held = Arc::new(HeldBytes::default());
        let session = UtcpSession {
            shared: shared.clone(),
            peer,
            generation,
            identity,
            incoming: rx,
            held: held.clone(),
        };
        self.sessions.insert(
            peer,
            SessionIo {
                generation,
                lanes: HashMap::new(),
                incoming: tx,
                held,
            },
        );
        let unwanted = match self.connects.remove(&peer) {
            Some(waiting) => waiting.send(Ok(session)).err().and_then(Result::ok),
            None => match &self.accepted {
                Some(q) => q.try_send(session).err().map(|e| match e {
                    mpsc::error::TrySendError::Full(s) | mpsc::error::TrySendError::Closed(s) => s,
                }),
                None => Some(session),
            },
        };
        if let Some(session) = unwanted {
            // Nobody wants it (the connect was dropped, the accept queue
            // is full): its drop closes it.
            debug!(%peer, "dtls-utcp session not taken: closed");
            self.unwanted.push(Unwanted::Session(session));
        }
    }

    fn lane_accepted(&mut self, peer: SocketAddr, id: LaneId, shared: &Arc<Shared>) {
        let Some(io) = self.sessions.get_mut(&peer) else {
            return;
        };
        io.lanes.insert(id, LaneIo::default());
        let stream = LaneStream {
            shared: shared.clone(),
            peer,
            generation: io.generation,
            lane: id,
        };
        if let Err(e) = io.incoming.try_send(stream) {
            // Nobody accepts lanes now: dropped, the lane is reset once the
            // peer's first bytes (its preamble) arrive unread.
            let stream = match e {
                mpsc::error::TrySendError::Full(s) | mpsc::error::TrySendError::Closed(s) => s,
            };
            self.unwanted.push(Unwanted::Lane(stream));
        }
    }

    /// Move every dirty session's lane buffers to and from their TCP.
    fn move_lanes(&mut self, shared: &Arc<Shared>, now: Instant) {
        let dirty: Vec<_> = self.dirty.drain().collect();
        for peer in dirty {
            let Some(io) = self.sessions.get_mut(&peer) else {
                continue;
            };
            let (lanes, held) = (&mut io.lanes, &io.held);
            self.endpoint
                .with_carrier(peer, now, |mux| move_session(mux, lanes, held, now));
        }
        // Closing lanes and sessions may have produced events.
        self.take_events(shared);
    }
}

/// A lane whose stream is gone: its unsent bytes go out, then FIN; bytes
/// that arrive and nobody will read reset it (as TCP's close with unread
/// data: the peer must not take its writes for delivered). True once the
/// lane can be forgotten.
fn finish_dropped(
    mux: &mut onionlab_utcp::Mux,
    id: LaneId,
    lane: &mut LaneIo,
    now: Instant,
) -> bool {
    let unread = !lane.rx.is_empty() || mux.recv_queued(id) > 0;
    if lane.error.is_some() || unread || mux.lane_state(id).is_none() {
        if mux.lane_state(id).is_some() && (lane.error.is_some() || unread) {
            let _ = mux.abort(id, now);
        }
        return true;
    }
    if !lane.tx.is_empty() {
        match mux.send(id, &lane.tx, now) {
            Ok(n) => lane.tx.advance(n),
            Err(_) => {
                let _ = mux.abort(id, now);
                return true;
            }
        }
    }
    if lane.tx.is_empty() && !lane.fin_sent {
        let _ = mux.close(id, now);
        lane.fin_sent = true;
    }
    false
}

/// One session's lanes: streams' bytes into TCP, TCP's bytes to streams,
/// ends and drops; then what they hold, into `held`.
fn move_session(
    mux: &mut onionlab_utcp::Mux,
    lanes: &mut HashMap<LaneId, LaneIo>,
    held: &HeldBytes,
    now: Instant,
) {
    let mut gone = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    for (&id, lane) in lanes.iter_mut() {
        if lane.dropped {
            if finish_dropped(mux, id, lane, now) {
                gone.push(id);
            }
            continue;
        }
        if lane.error.is_some() {
            continue;
        }
        if !lane.tx.is_empty() {
            match mux.send(id, &lane.tx, now) {
                Ok(0) => {}
                Ok(n) => {
                    lane.tx.advance(n);
                    if let Some(w) = lane.tx_waker.take() {
                        w.wake();
                    }
                }
                Err(_) => lane.fail(io::ErrorKind::BrokenPipe),
            }
        }
        if lane.shutdown && lane.tx.is_empty() && !lane.fin_sent {
            let _ = mux.close(id, now);
            lane.fin_sent = true;
        }
        let mut got = false;
        while lane.rx.len() < LANE_BUFFER {
            let want = (LANE_BUFFER - lane.rx.len()).min(chunk.len());
            match mux.recv(id, &mut chunk[..want], now) {
                Ok(0) => break,
                Ok(n) => {
                    lane.rx.extend_from_slice(&chunk[..n]);
                    got = true;
                }
                Err(_) => break,
            }
        }
        let finished = matches!(
            mux.lane_state(id),
            Some(LaneState::PeerClosed | LaneState::Closed)
        ) && mux.recv_queued(id) == 0;
        if finished && !lane.eof {
            lane.eof = true;
            got = true;
        }
        if got {
            if let Some(w) = lane.rx_waker.take() {
                w.wake();
            }
        }
    }
    for id in gone {
        lanes.remove(&id);
    }
    let (mut recv, mut send) = (0, 0);
    for (&id, lane) in lanes.iter() {
        recv += lane.rx.len() + mux.recv_queued(id);
        send += lane.tx.len() + mux.send_queued(id);
    }
    held.recv.store(recv, AtomicOrdering::Relaxed);
    held.send.store(send, AtomicOrdering::Relaxed);
}

//! A connection's (or lane's) send buffer and the task that writes it:
//! what every transport with several connections or streams per link
//! shares (pctcp, dtls-utcp, torchestra, quic). The link's writer encodes
//! cells into a [`SendBuffer`] without blocking; one [`write_task`] per
//! connection or stream moves the buffer to it, so a blocked one holds up
//! only its own buffer.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::BytesMut;
use onionlab_cell::chan::{AnyChanCell, AnyChanMsg, Padding};
use onionlab_cell::codec::CellCodec;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_rustls::TlsStream;

use crate::Error;

/// A TLS-over-TCP connection.
pub(crate) type Tls = TlsStream<TcpStream>;

/// A reliable, ordered byte stream carrying a link's cells: a TLS
/// connection, or a dtls-utcp lane.
pub(crate) trait Conn: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Conn for T {}

/// Any [`Conn`].
pub(crate) type BoxConn = Box<dyn Conn>;

/// How long a closing connection's shutdown may take.
pub(crate) const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// The sending side of a connection or stream, as [`write_task`] drives
/// it: a byte stream, plus what a stream of a multiplexed connection adds
/// (QUIC's priorities, and its end that waits for the peer's
/// acknowledgement).
pub(crate) trait LaneWrite: AsyncWrite + Unpin + Send {
    /// Send this stream's data before that of streams with a lower
    /// `priority` on the same connection; nothing by default (a connection
    /// of its own has nobody to share with).
    fn set_priority(&mut self, priority: i32) {
        let _ = priority;
    }

    /// End the sending side after what was written, waiting at most
    /// [`SHUTDOWN_TIMEOUT`].
    fn finish(&mut self) -> impl std::future::Future<Output = ()> + Send {
        async {
            let _ = tokio::time::timeout(SHUTDOWN_TIMEOUT, self.shutdown()).await;
        }
    }
}

impl<T: AsyncWrite + Send> LaneWrite for tokio::io::WriteHalf<T> {}

/// [`LaneWrite`] for a boxed stream: the lane framework holds lanes of
/// any kind ([`BoxLaneWrite`]).
pub(crate) trait DynLaneWrite: AsyncWrite + Unpin + Send {
    /// [`LaneWrite::set_priority`].
    fn set_priority_boxed(&mut self, priority: i32);
    /// [`LaneWrite::finish`].
    fn finish_boxed(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

impl<T: LaneWrite> DynLaneWrite for T {
    fn set_priority_boxed(&mut self, priority: i32) {
        self.set_priority(priority)
    }

    fn finish_boxed(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(self.finish())
    }
}

/// Any lane's sending half.
pub(crate) type BoxLaneWrite = Box<dyn DynLaneWrite>;

// For any lifetime of the box's object: the Send check of a task that
// holds one asks for that.
impl<'a> LaneWrite for Box<dyn DynLaneWrite + 'a> {
    fn set_priority(&mut self, priority: i32) {
        (**self).set_priority_boxed(priority)
    }

    fn finish(&mut self) -> impl Future<Output = ()> + Send {
        (**self).finish_boxed()
    }
}

/// What a connection's writer task reports to its link.
pub(crate) trait Owner: Send + Sync + 'static {
    /// The peer (for errors).
    fn peer_addr(&self) -> SocketAddr;
    /// Writing failed: the link is broken.
    fn fail(&self, e: Error);
    /// Writing the connection of `buffer` failed (the buffer is already
    /// killed). By default the link is broken; a link with a connection
    /// per circuit may end just that circuit.
    fn conn_failed(self: &Arc<Self>, buffer: &Arc<SendBuffer>, e: Error) {
        let _ = buffer;
        self.fail(e);
    }
    /// `bytes` left a buffer for the socket: there is room again.
    fn drained(&self, bytes: usize);
}

/// One connection's buffer of encoded cells, shared by the link's writer
/// and the connection's task.
pub(crate) struct SendBuffer {
    /// The circuit the connection carries (0: several).
    pub(crate) circ_id: u32,
    state: Mutex<State>,
    data: Notify,
}

#[derive(Default)]
pub(crate) struct State {
    /// Encoded cells not yet handed to the socket.
    pub(crate) buf: BytesMut,
    in_flight: usize,
    closing: bool,
    /// The connection failed: what is queued is dropped.
    pub(crate) dead: bool,
    /// The circuit scheduler's priority for this buffer's stream, when it
    /// changed and the writer task has not applied it yet.
    new_priority: Option<i32>,
    /// The last priority asked for (0 until one is).
    priority: i32,
}

impl SendBuffer {
    pub(crate) fn new(circ_id: u32) -> Arc<Self> {
        Arc::new(SendBuffer {
            circ_id,
            state: Mutex::default(),
            data: Notify::new(),
        })
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes queued or being written.
    pub(crate) fn buffered(&self) -> usize {
        let st = self.state();
        st.buf.len() + st.in_flight
    }

    /// Wake the task: something was queued.
    pub(crate) fn wake(&self) {
        self.data.notify_one();
    }

    /// Queue a PADDING cell (framed by `codec`) unless something is queued
    /// or being written: a heartbeat ([`crate::liveness`]). The bytes
    /// queued are added to `buffered` (the link's count) before the writer
    /// task can see them.
    pub(crate) fn queue_padding_if_idle(&self, codec: &mut CellCodec, buffered: &AtomicUsize) {
        let mut st = self.state();
        if st.dead || st.closing || !st.buf.is_empty() || st.in_flight > 0 {
            return;
        }
        let padding = AnyChanCell::new(None, AnyChanMsg::Padding(Padding::new()));
        // A PADDING cell always encodes; nothing is queued if it did not.
        if codec.encode(padding, &mut st.buf).is_err() {
            st.buf.clear();
            return;
        }
        buffered.fetch_add(st.buf.len(), std::sync::atomic::Ordering::Relaxed);
        drop(st);
        self.wake();
    }

    /// The connection failed: drop what is queued and stop its task.
    /// Returns the bytes dropped (queued or being written), 0 if it was
    /// already dead.
    pub(crate) fn kill(&self) -> usize {
        let mut st = self.state();
        if st.dead {
            return 0;
        }
        st.dead = true;
        let dropped = st.buf.len() + st.in_flight;
        st.buf.clear();
        st.in_flight = 0;
        drop(st);
        self.data.notify_one();
        dropped
    }

    /// Give the stream `priority` ([`LaneWrite::set_priority`]) from its
    /// next write on.
    pub(crate) fn set_priority(&self, priority: i32) {
        let mut st = self.state();
        if st.priority != priority {
            st.priority = priority;
            st.new_priority = Some(priority);
        }
    }

    /// Shut the connection down once what is queued is written.
    pub(crate) fn close(&self) {
        self.state().closing = true;
        self.data.notify_one();
    }
}

/// Write `buffer` to `w` until it closes, then end the sending side
/// ([`LaneWrite::finish`]). `guard` lives as long as the task (a count of
/// open connections, say).
pub(crate) async fn write_task<O: Owner, G: Send + Sync, W: LaneWrite>(
    owner: Arc<O>,
    buffer: Arc<SendBuffer>,
    mut w: W,
    guard: Option<Arc<G>>,
) {
    loop {
        let (chunk, closing, priority) = {
            let mut st = buffer.state();
            if st.dead {
                return;
            }
            let chunk = st.buf.split();
            st.in_flight = chunk.len();
            (chunk, st.closing, st.new_priority.take())
        };
        if let Some(priority) = priority {
            w.set_priority(priority);
        }
        if !chunk.is_empty() {
            let written = async {
                w.write_all(&chunk).await?;
                w.flush().await
            };
            if let Err(source) = written.await {
                owner.drained(buffer.kill());
                let peer = owner.peer_addr();
                owner.conn_failed(&buffer, Error::Tls { peer, source });
                return;
            }
            {
                let mut st = buffer.state();
                if st.dead {
                    // Killed while writing: its bytes were counted then.
                    return;
                }
                st.in_flight = 0;
            }
            owner.drained(chunk.len());
            continue;
        }
        if closing {
            w.finish().await;
            drop(guard);
            return;
        }
        buffer.data.notified().await;
    }
}

/// The connections or lanes of a link still being read, and a wake-up
/// when one's reading ends: a clean end of the link's main connection
/// waits for the others', so that a closing peer's last cells on them
/// come before the link's end.
#[derive(Default)]
pub(crate) struct Readings {
    count: AtomicUsize,
    ended: Notify,
}

/// Counts one connection or lane being read until dropped (held by its
/// read task).
pub(crate) struct Reading(Arc<Readings>);

impl Drop for Reading {
    fn drop(&mut self) {
        self.0
            .count
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.0.ended.notify_waiters();
    }
}

impl Readings {
    /// Count one more being read.
    pub(crate) fn start(self: &Arc<Self>) -> Reading {
        self.count
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Reading(self.clone())
    }

    /// Wait, at most `within`, until none is being read.
    pub(crate) async fn all_ended(&self, within: Duration) {
        let all_ended = async {
            loop {
                let ended = self.ended.notified();
                if self.count.load(std::sync::atomic::Ordering::Relaxed) == 0 {
                    return;
                }
                ended.await;
            }
        };
        let _ = tokio::time::timeout(within, all_ended).await;
    }
}

/// How long a closing link waits for its tasks to drain.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The tasks of a link with several connections: spawned, aborted when
/// the link fails or ends, drained (then aborted) when it shuts down.
///
/// A shutdown ends them in order: the writers (tasks that write what a
/// buffer holds, or open a connection and then write) finish what they
/// hold; then the main connection's writer, kept apart, closes the link's
/// main connection; then the readers run until the peer, seeing the end,
/// closes its side (a connection dropped with unread input would answer
/// with a reset and lose what was sent; a dtls-utcp session dropped at
/// once would lose what is unacknowledged). Background tasks (the
/// liveness watch) end only when aborted: a shutdown never waits for
/// them.
#[derive(Default)]
pub(crate) struct LinkTasks(Mutex<TaskLists>);

type Task = tokio::task::JoinHandle<()>;

#[derive(Default)]
struct TaskLists {
    writers: Vec<Task>,
    main_writer: Option<Task>,
    readers: Vec<Task>,
    background: Vec<Task>,
}

/// The least time the main connection's writer and then the readers get
/// after the other writers, however long those took.
const LAST_WAIT: Duration = Duration::from_secs(2);

fn remember(list: &mut Vec<Task>, task: Task) {
    list.retain(|t| !t.is_finished());
    list.push(task);
}

/// Wait for `tasks` until `deadline`, then abort what still runs.
async fn finish(tasks: Vec<Task>, deadline: tokio::time::Instant) {
    let aborts: Vec<_> = tasks.iter().map(|t| t.abort_handle()).collect();
    let wait = async {
        for t in tasks {
            let _ = t.await;
        }
    };
    let _ = tokio::time::timeout_at(deadline, wait).await;
    for a in aborts {
        a.abort();
    }
}

impl LinkTasks {
    fn lists(&self) -> MutexGuard<'_, TaskLists> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run `task`, a reader, remembered until it finishes: a shutdown
    /// waits for it last.
    pub(crate) fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(task);
        remember(&mut self.lists().readers, handle);
    }

    /// Run `task`, a writer: a shutdown waits for it first.
    pub(crate) fn spawn_writer(
        &self,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let handle = tokio::spawn(task);
        remember(&mut self.lists().writers, handle);
    }

    /// Run `task`, the main connection's writer: a shutdown waits for it
    /// after the other writers.
    pub(crate) fn spawn_main_writer(
        &self,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        self.lists().main_writer = Some(tokio::spawn(task));
    }

    /// Run `task` until the link ends; a shutdown does not wait for it.
    pub(crate) fn spawn_background(
        &self,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let handle = tokio::spawn(task);
        remember(&mut self.lists().background, handle);
    }

    /// Stop every task now.
    pub(crate) fn abort_all(&self) {
        let TaskLists {
            writers,
            main_writer,
            readers,
            background,
        } = std::mem::take(&mut *self.lists());
        let all = writers.into_iter().chain(main_writer).chain(readers);
        for t in all.chain(background) {
            t.abort();
        }
    }

    /// Wait for the writers to finish what they hold (at most
    /// [`DRAIN_TIMEOUT`]), then call `close_main` and wait for the main
    /// connection's writer, then for the readers (until the peer closes;
    /// together at most the rest of that time or [`LAST_WAIT`], whichever
    /// is longer); then abort every task still running: a closed link
    /// leaves no task behind.
    pub(crate) async fn drain(&self, close_main: impl FnOnce()) {
        self.drain_and(close_main, true).await
    }

    /// [`LinkTasks::drain`], but waiting for the readers only if
    /// `linger`: a socket closed with unread input answers with a reset,
    /// which may destroy what the peer has not read yet, so byte-stream
    /// links keep reading until the peer closes; connections whose
    /// streams' ends were acknowledged (QUIC) lose nothing.
    pub(crate) async fn drain_and(&self, close_main: impl FnOnce(), linger: bool) {
        let writers = std::mem::take(&mut self.lists().writers);
        let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
        finish(writers, deadline).await;
        close_main();
        let last = deadline.max(tokio::time::Instant::now() + LAST_WAIT);
        let main_writer = self.lists().main_writer.take();
        finish(main_writer.into_iter().collect(), last).await;
        if linger {
            let readers = std::mem::take(&mut self.lists().readers);
            finish(readers, last).await;
        }
        self.abort_all();
    }
}

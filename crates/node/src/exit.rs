//! Exit streams: resolving, the exit policy, connecting, and moving bytes
//! between a TCP target and its circuit stream.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::{self, ErrorKind};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_cell::msg::{EndReason, ResolvedVal, StreamId};
use onionlab_circuit::node::CircKey;
use onionlab_netdoc::exit_targets::{ExitTargets, PrivateTargets, TargetRefusal};
use onionlab_netdoc::policy::ExitPolicy;
use onionlab_ops::LogLimiter;
use onionlab_transport::tcp::TcpCongestion;
use tokio::net::TcpStream;
use tokio::sync::{Notify, Semaphore};
use tokio::task::{spawn_local, JoinHandle};
use tracing::{debug, info, warn};

use crate::relay::{process, Shared, State};

/// Default bound on resolving a name and on each connection attempt
/// ([`ExitSettings::connect_timeout`]).
pub const DEFAULT_EXIT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`ExitSettings::max_concurrent_lookups`].
pub const DEFAULT_MAX_CONCURRENT_LOOKUPS: usize = 64;
/// Default [`ExitSettings::max_pending_connects`].
pub const DEFAULT_MAX_PENDING_CONNECTS: usize = 1024;

/// How a relay serves as an exit.
#[derive(Clone, Debug)]
pub struct ExitSettings {
    /// The exit policy; `None`: not an exit.
    pub policy: Option<ExitPolicy>,
    /// Refuse private and local addresses and our own addresses whatever
    /// the policy says (C tor's `ExitPolicyRejectPrivate`; default true).
    /// The relays' OR ports are refused either way.
    pub reject_private: bool,
    /// Private targets allowed despite `reject_private`.
    pub allow_private: PrivateTargets,
    /// Bound on resolving a target's name and on each connection attempt.
    pub connect_timeout: Duration,
    /// Most name lookups running at once (each holds a thread of tokio's
    /// blocking pool until the system resolver answers); more wait for a
    /// slot within `connect_timeout`.
    pub max_concurrent_lookups: usize,
    /// Most streams resolving or connecting at once; more are refused with
    /// END RESOURCELIMIT.
    pub max_pending_connects: usize,
}

impl ExitSettings {
    /// Not an exit.
    pub fn none() -> Self {
        ExitSettings {
            policy: None,
            reject_private: true,
            allow_private: PrivateTargets::none(),
            connect_timeout: DEFAULT_EXIT_CONNECT_TIMEOUT,
            max_concurrent_lookups: DEFAULT_MAX_CONCURRENT_LOOKUPS,
            max_pending_connects: DEFAULT_MAX_PENDING_CONNECTS,
        }
    }
}

/// The exit's state in a running relay.
pub(crate) struct Exit {
    targets: Rc<ExitTargets>,
    connect_timeout: Duration,
    /// Congestion control of connections to targets.
    tcp_congestion: TcpCongestion,
    /// Slots for name lookups (see [`ExitSettings::max_concurrent_lookups`]).
    lookups: Arc<Semaphore>,
    max_pending_connects: usize,
    /// Connect and resolve tasks in progress, by circuit and stream ID:
    /// aborted when their stream or circuit ends, so a late answer never
    /// lands on a stream that reused the ID.
    pending: HashMap<(CircKey, u16), JoinHandle<()>>,
    /// Rate limit of the INFO line on refused targets.
    refusal_log: LogLimiter,
}

impl Exit {
    /// The exit of a relay with `settings`, listening on `own_ips`, in
    /// `doc`; `None` if it is not an exit.
    pub(crate) fn new(
        settings: &ExitSettings,
        tcp_congestion: &TcpCongestion,
        doc: &onionlab_netdoc::NetworkDocument,
        own_ips: Vec<IpAddr>,
    ) -> Option<Exit> {
        let policy = settings.policy.clone()?;
        let targets = ExitTargets::new(
            policy,
            settings.reject_private,
            settings.allow_private.clone(),
            doc,
            own_ips,
        );
        Some(Exit {
            targets: Rc::new(targets),
            connect_timeout: settings.connect_timeout,
            tcp_congestion: tcp_congestion.clone(),
            lookups: Arc::new(Semaphore::new(settings.max_concurrent_lookups.max(1))),
            max_pending_connects: settings.max_pending_connects.max(1),
            pending: HashMap::new(),
            refusal_log: LogLimiter::default(),
        })
    }

    /// What a connect task needs (for the datagram circuits' exit too).
    pub(crate) fn job(&self) -> ConnectJob {
        ConnectJob {
            targets: self.targets.clone(),
            timeout: self.connect_timeout,
            tcp_congestion: self.tcp_congestion.clone(),
            lookups: self.lookups.clone(),
        }
    }

    /// Most streams resolving or connecting at once.
    pub(crate) fn max_pending_connects(&self) -> usize {
        self.max_pending_connects
    }

    /// Stop the connect or resolve task of `(circ, stream)`, if any.
    pub(crate) fn cancel(&mut self, circ: CircKey, stream: StreamId) {
        if let Some(task) = self.pending.remove(&(circ, stream.into())) {
            task.abort();
        }
    }

    /// Stop every connect and resolve task of `circ`.
    pub(crate) fn cancel_circuit(&mut self, circ: CircKey) {
        self.pending.retain(|(c, _), task| {
            if *c == circ {
                task.abort();
                false
            } else {
                true
            }
        });
    }
}

/// Our own addresses, as an exit refuses them: the listening addresses and
/// those of the host's interfaces.
pub(crate) fn own_addresses(listening: impl IntoIterator<Item = IpAddr>) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = listening.into_iter().collect();
    match if_addrs::get_if_addrs() {
        Ok(ifs) => ips.extend(ifs.into_iter().map(|i| i.ip())),
        Err(e) => warn!("cannot list the host's interface addresses (an exit refuses them): {e}"),
    }
    ips
}
/// Once a stream has ended, how long the bytes the client had sent may
/// take to reach a target that does not read them before the connection
/// is closed anyway (so a stalled target cannot pin a descriptor).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Addresses of one name tried before giving up.
const MAX_ATTEMPTS: usize = 4;
/// Bytes moved per read from the target or the circuit.
const CHUNK: usize = 16 * 1024;
/// TTL reported in RESOLVED answers.
const RESOLVED_TTL: u32 = 60;

/// One open exit stream: the connection to its target, shared by its two
/// pump tasks (target to circuit, circuit to target).
///
/// END closes both directions of a stream (tor-spec): once the client's
/// END arrived or ours is queued, the writer sends the target what the
/// client had sent, then drops the connection (a FIN) and the stream's
/// entry in `State::streams`. If the circuit dies instead, [`abort`]
/// resets the connection: the target sees RST, never a clean end.
///
/// The two tasks share the socket through `Rc<ExitStream>` (readable /
/// try_read and writable / try_write on `&TcpStream`) rather than owning
/// split halves, so that nothing sends a FIN behind our back: dropping
/// tokio's `OwnedWriteHalf` shuts the write side down, which would turn an
/// abortive close into a clean-looking one.
///
/// [`abort`]: ExitStream::abort
pub(crate) struct ExitStream {
    tcp: TcpStream,
    /// Woken when client bytes arrive for the target (or the stream ends).
    pub(crate) to_target: Notify,
    /// Woken when the circuit stream has room for target bytes.
    pub(crate) from_target: Notify,
    /// No more client bytes will come beyond those buffered: the client
    /// sent END, or we asked the circuit to send ours.
    ended: Cell<bool>,
    /// The reader, then the writer.
    tasks: RefCell<Vec<JoinHandle<()>>>,
}

impl ExitStream {
    fn new(tcp: TcpStream) -> Self {
        ExitStream {
            tcp,
            to_target: Notify::new(),
            from_target: Notify::new(),
            ended: Cell::new(false),
            tasks: RefCell::new(Vec::new()),
        }
    }

    /// The client sent END: stop reading the target; the writer drains
    /// what the client sent, then closes the connection.
    pub(crate) fn client_ended(&self) {
        self.ended.set(true);
        self.stop_reading();
        self.to_target.notify_one();
    }

    fn stop_reading(&self) {
        if let Some(reader) = self.tasks.borrow().first() {
            reader.abort();
        }
    }

    /// The circuit is gone: reset the target connection. With SO_LINGER 0
    /// the close (when the tasks' futures, the last owners, are dropped)
    /// sends RST and discards unsent bytes; no FIN goes out before it.
    pub(crate) fn abort(&self) {
        if let Err(e) = self.tcp.set_zero_linger() {
            debug!("SO_LINGER 0 on an exit connection: {e}");
        }
        for t in self.tasks.borrow_mut().drain(..) {
            t.abort();
        }
    }
}

/// The END reason that tells a client why connecting failed.
pub fn end_reason_for_io(e: &std::io::Error) -> EndReason {
    match e.kind() {
        ErrorKind::ConnectionRefused => EndReason::CONNECTREFUSED,
        ErrorKind::TimedOut => EndReason::TIMEOUT,
        ErrorKind::NetworkUnreachable | ErrorKind::HostUnreachable => EndReason::NOROUTE,
        ErrorKind::ConnectionReset => EndReason::CONNRESET,
        _ => EndReason::MISC,
    }
}

/// Resolve `host` (an address literal is its own answer) within
/// `timeout`, waiting for one of the `lookups` slots first. The slot is
/// held by the lookup thread until the system resolver answers, even if
/// the stream ends (and this future is dropped) before: threads stuck in
/// lookups stay bounded.
async fn resolve(
    host: &str,
    port: u16,
    timeout: Duration,
    lookups: &Arc<Semaphore>,
) -> Result<Vec<SocketAddr>, EndReason> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let lookup = async {
        let permit = lookups
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| EndReason::RESOURCELIMIT)?;
        let name = (host.to_owned(), port);
        let answer = tokio::task::spawn_blocking(move || {
            let _slot = permit;
            name.to_socket_addrs().map(Iterator::collect::<Vec<_>>)
        })
        .await;
        match answer {
            Ok(Ok(addrs)) => Ok(addrs),
            Ok(Err(_)) | Err(_) => Err(EndReason::RESOLVEFAILED),
        }
    };
    tokio::time::timeout(timeout, lookup)
        .await
        .unwrap_or(Err(EndReason::TIMEOUT))
}

/// Why the exit could not connect to a target.
pub(crate) struct ConnectFailed {
    /// The END reason for the client.
    pub(crate) reason: EndReason,
    /// The last connection error, if it came to connecting.
    pub(crate) error: Option<io::Error>,
    /// Why the target's addresses were refused, if they all were.
    pub(crate) refused: Option<TargetRefusal>,
}

impl From<EndReason> for ConnectFailed {
    fn from(reason: EndReason) -> Self {
        ConnectFailed {
            reason,
            error: None,
            refused: None,
        }
    }
}

/// What a connect task needs, cloned out of [`Exit`].
#[derive(Clone)]
pub(crate) struct ConnectJob {
    targets: Rc<ExitTargets>,
    timeout: Duration,
    tcp_congestion: TcpCongestion,
    lookups: Arc<Semaphore>,
}

/// A TCP connection to `addr` with `congestion` set before the handshake.
async fn connect_tcp(addr: SocketAddr, congestion: &TcpCongestion) -> std::io::Result<TcpStream> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    congestion.apply(&socket)?;
    socket.connect(addr).await
}

/// Resolve `host`, refuse what the exit's rules refuse, and connect to
/// the first address that answers.
pub(crate) async fn connect_target(
    host: &str,
    port: u16,
    job: &ConnectJob,
) -> Result<TcpStream, ConnectFailed> {
    let addrs = resolve(host, port, job.timeout, &job.lookups).await?;
    if addrs.is_empty() {
        return Err(EndReason::RESOLVEFAILED.into());
    }
    let mut refused = None;
    let allowed: Vec<SocketAddr> = addrs
        .into_iter()
        .filter(|a| match job.targets.check(*a) {
            Ok(()) => true,
            Err(why) => {
                refused = Some(why);
                false
            }
        })
        .take(MAX_ATTEMPTS)
        .collect();
    let mut last = ConnectFailed {
        reason: EndReason::EXITPOLICY,
        error: None,
        refused,
    };
    for addr in allowed {
        match tokio::time::timeout(job.timeout, connect_tcp(addr, &job.tcp_congestion)).await {
            Ok(Ok(tcp)) => {
                let _ = tcp.set_nodelay(true);
                return Ok(tcp);
            }
            // Out of descriptors (or buffer memory): the next address
            // would fail the same way.
            Ok(Err(e)) if onionlab_ops::is_resource_exhaustion(&e) => {
                return Err(ConnectFailed {
                    reason: EndReason::RESOURCELIMIT,
                    error: Some(e),
                    refused: None,
                });
            }
            Ok(Err(e)) => {
                last = ConnectFailed {
                    reason: end_reason_for_io(&e),
                    error: Some(e),
                    refused: None,
                }
            }
            Err(_) => last = EndReason::TIMEOUT.into(),
        }
    }
    Err(last)
}

/// BEGIN: connect in the background, then answer CONNECTED or END.
pub(crate) fn start_connect(
    shared: &Shared,
    st: &mut State,
    circ: CircKey,
    stream: StreamId,
    host: String,
    port: u16,
) {
    let now = Instant::now();
    let Some(exit) = st.exit.as_mut() else {
        let _ = st
            .node
            .exit_refused(now, circ, stream, EndReason::EXITPOLICY);
        return;
    };
    // The circuit layer refuses a BEGIN on an ID in use, so a task still
    // here belongs to an earlier stream with this ID, which has ended.
    exit.cancel(circ, stream);
    if exit.pending.len() >= exit.max_pending_connects {
        st.stats.exit_connects_refused += 1;
        note_refusal(st, now, "too many streams resolving or connecting at once");
        let _ = st
            .node
            .exit_refused(now, circ, stream, EndReason::RESOURCELIMIT);
        return;
    }
    let job = exit.job();
    let task_shared = shared.clone();
    let task = spawn_local(async move {
        let result = connect_target(&host, port, &job).await;
        let shared = task_shared;
        let mut st = shared.borrow_mut();
        if let Some(exit) = st.exit.as_mut() {
            exit.pending.remove(&(circ, stream.into()));
        }
        connect_done(&shared, &mut st, circ, stream, (&host, port), result);
        process(&shared, &mut st);
    });
    if let Some(exit) = st.exit.as_mut() {
        exit.pending.insert((circ, stream.into()), task);
    }
}

/// A connect task's result: open the stream, or END it with the reason.
fn connect_done(
    shared: &Shared,
    st: &mut State,
    circ: CircKey,
    stream: StreamId,
    (host, port): (&str, u16),
    result: Result<TcpStream, ConnectFailed>,
) {
    let now = Instant::now();
    match result {
        Ok(tcp) => {
            let ip = tcp.peer_addr().ok().map(|a| a.ip());
            if st.node.exit_connected(now, circ, stream, ip).is_ok() {
                debug!(?circ, stream = u16::from(stream), %host, port, "exit stream connected");
                open_stream(shared, st, circ, stream, tcp);
            }
        }
        Err(failed) => {
            debug!(
                ?circ,
                stream = u16::from(stream),
                %host,
                port,
                reason = ?failed.reason,
                error = ?failed.error,
                refused = ?failed.refused,
                "exit connect failed"
            );
            if failed.reason == EndReason::RESOURCELIMIT {
                note_exhaustion(st, now, failed.error.as_ref());
            }
            if let Some(why) = failed.refused {
                st.stats.exit_targets_refused += 1;
                note_refusal(st, now, &format!("target refused: {why}"));
            }
            let _ = st.node.exit_refused(now, circ, stream, failed.reason);
        }
    }
}

/// A stream refused by a limit or the target rules: one INFO line per
/// interval, with how many happened since the last (targets are not
/// logged, as tor's SafeLogging).
fn note_refusal(st: &mut State, now: Instant, what: &str) {
    let Some(exit) = st.exit.as_mut() else { return };
    if let Some(held_back) = exit.refusal_log.check(now) {
        info!(
            nickname = %st.nickname,
            held_back,
            refused_targets = st.stats.exit_targets_refused,
            refused_connects = st.stats.exit_connects_refused,
            "exit stream refused: {what}"
        );
    }
}

/// A connect failed for lack of descriptors or memory: count it, and warn
/// at most once per interval (with how many happened since the last line).
/// Streams still get END RESOURCELIMIT each; the exit recovers by itself as
/// soon as descriptors are free again.
fn note_exhaustion(st: &mut State, now: Instant, error: Option<&io::Error>) {
    st.stats.exit_resource_limit += 1;
    if let Some(held_back) = st.exhaustion_log.check(now) {
        let error = error.map_or_else(|| "?".to_string(), io::Error::to_string);
        warn!(
            nickname = %st.nickname,
            held_back,
            total = st.stats.exit_resource_limit,
            "exit cannot open connections to targets: {error} \
             (out of descriptors or memory): streams end with RESOURCELIMIT"
        );
    }
}

/// Start the two pump tasks of a connected stream and register it.
fn open_stream(shared: &Shared, st: &mut State, circ: CircKey, stream: StreamId, tcp: TcpStream) {
    let es = Rc::new(ExitStream::new(tcp));
    let reader = spawn_local(target_to_circuit(shared.clone(), circ, stream, es.clone()));
    let writer = spawn_local(circuit_to_target(shared.clone(), circ, stream, es.clone()));
    es.tasks.borrow_mut().extend([reader, writer]);
    // An entry left by an earlier stream with this ID that is still
    // draining is replaced; its writer sees that and stops.
    st.streams.insert((circ, stream.into()), es);
}

/// RESOLVE: look the name up and answer RESOLVED.
pub(crate) fn start_resolve(
    shared: &Shared,
    st: &mut State,
    circ: CircKey,
    stream: StreamId,
    host: String,
) {
    let Some(exit) = st.exit.as_mut() else {
        let _ = st.node.exit_resolved(
            Instant::now(),
            circ,
            stream,
            vec![(ResolvedVal::NontransientError, 0)],
        );
        return;
    };
    exit.cancel(circ, stream);
    let timeout = exit.connect_timeout;
    let lookups = exit.lookups.clone();
    let task_shared = shared.clone();
    let task = spawn_local(async move {
        let answers = match resolve(&host, 0, timeout, &lookups).await {
            Ok(addrs) if !addrs.is_empty() => addrs
                .iter()
                .map(|a| (ResolvedVal::Ip(a.ip()), RESOLVED_TTL))
                .collect(),
            Ok(_) | Err(EndReason::RESOLVEFAILED) => vec![(ResolvedVal::NontransientError, 0)],
            Err(_) => vec![(ResolvedVal::TransientError, 0)],
        };
        let shared = task_shared;
        let mut st = shared.borrow_mut();
        if let Some(exit) = st.exit.as_mut() {
            exit.pending.remove(&(circ, stream.into()));
        }
        let _ = st.node.exit_resolved(Instant::now(), circ, stream, answers);
        process(&shared, &mut st);
    });
    if let Some(exit) = st.exit.as_mut() {
        exit.pending.insert((circ, stream.into()), task);
    }
}

/// We end the stream because the target side ended (`DONE`) or failed:
/// END with `reason` after the queued bytes, unless the stream has
/// already ended; the writer then drains and closes.
fn end_stream(
    shared: &Shared,
    circ: CircKey,
    stream: StreamId,
    es: &ExitStream,
    reason: EndReason,
) {
    if es.ended.replace(true) {
        return;
    }
    es.to_target.notify_one();
    let mut st = shared.borrow_mut();
    debug!(
        ?circ,
        stream = u16::from(stream),
        ?reason,
        "exit stream ends: END sent to the client"
    );
    let _ = st.node.exit_end(Instant::now(), circ, stream, reason);
    process(shared, &mut st);
}

thread_local! {
    /// The one buffer target bytes pass through on their way into a
    /// circuit stream: the relay runs on one thread, and a pump reads only
    /// what the circuit takes at once, so no stream holds a buffer of its
    /// own (a client that opens many streams and never reads makes only
    /// the counted circuit queues grow).
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; CHUNK].into_boxed_slice());
}

/// Target bytes into the circuit stream: wait for room in the stream's
/// send buffer, then read at most that much from the target.
async fn target_to_circuit(shared: Shared, circ: CircKey, stream: StreamId, es: Rc<ExitStream>) {
    let reason = loop {
        let (room, resume) = {
            let mut st = shared.borrow_mut();
            let room = st.node.exit_write_room(Instant::now(), circ, stream);
            (room, st.node.exit_write_resumes_at(circ, stream))
        };
        match room {
            Ok(0) => {
                // Room comes back with a Writable event, or, if the
                // client's XON rate held the bytes back, at a known time.
                match resume {
                    Some(at) => {
                        tokio::select! {
                            () = es.from_target.notified() => {}
                            () = tokio::time::sleep_until(at.into()) => {}
                        }
                    }
                    None => es.from_target.notified().await,
                }
                continue;
            }
            Ok(_) => {}
            // The stream is gone (the client ended it): the writer closes
            // the connection.
            Err(_) => {
                es.ended.set(true);
                es.to_target.notify_one();
                return;
            }
        }
        if let Err(e) = es.tcp.readable().await {
            break end_reason_for_io(&e);
        }
        // The room is asked again now: while this task waited, an XON may
        // have lowered the rate, and what is read must all be taken.
        let read = SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let mut st = shared.borrow_mut();
            let now = Instant::now();
            let room = match st.node.exit_write_room(now, circ, stream) {
                Ok(room) => room.min(CHUNK),
                // Gone or no room: the next round sees which.
                Err(_) => 0,
            };
            if room == 0 {
                return Ok(None);
            }
            let n = es.tcp.try_read(&mut scratch[..room])?;
            if n > 0 {
                // Within the room just reported, in the same borrow: all
                // of it is taken.
                let _ = st.node.exit_write(now, circ, stream, &scratch[..n]);
                process(&shared, &mut st);
            }
            Ok::<Option<usize>, io::Error>(Some(n))
        });
        match read {
            Ok(Some(0)) => break EndReason::DONE,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => {
                debug!(
                    ?circ,
                    stream = u16::from(stream),
                    "reading from the target: {e}"
                );
                break end_reason_for_io(&e);
            }
        }
    };
    end_stream(&shared, circ, stream, &es, reason);
}

/// Client bytes to the target, written straight from the circuit
/// stream's buffer when the target's socket takes them; once the stream
/// has ended (either side's END), drain what the client had sent, then
/// close the connection.
async fn circuit_to_target(shared: Shared, circ: CircKey, stream: StreamId, es: Rc<ExitStream>) {
    let mut drain_deadline = None;
    loop {
        let readable = {
            let st = shared.borrow();
            if !is_registered(&st, circ, stream, &es) {
                break;
            }
            st.node.exit_readable_bytes(circ, stream)
        };
        if readable == 0 {
            // Ended and drained, or the stream is gone.
            let gone = shared
                .borrow_mut()
                .node
                .exit_read_with(Instant::now(), circ, stream, |_| 0)
                .is_err();
            if es.ended.get() || gone {
                break;
            }
            es.to_target.notified().await;
            continue;
        }
        if es.ended.get() && drain_deadline.is_none() {
            drain_deadline = Some(Instant::now() + DRAIN_TIMEOUT);
        }
        let writable = match drain_deadline {
            None => es.tcp.writable().await,
            Some(d) => tokio::time::timeout_at(d.into(), es.tcp.writable())
                .await
                .unwrap_or_else(|_| Err(ErrorKind::TimedOut.into())),
        };
        let written = writable.and_then(|()| write_from_stream(&shared, circ, stream, &es));
        match written {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => {
                debug!(
                    ?circ,
                    stream = u16::from(stream),
                    "writing to the target: {e}"
                );
                end_stream(&shared, circ, stream, &es, end_reason_for_io(&e));
                break;
            }
        }
    }
    finish(&shared, circ, stream, &es);
}

/// Write what the target's socket takes now straight from the stream's
/// buffer (one vectored write); the bytes written leave the stream.
fn write_from_stream(
    shared: &Shared,
    circ: CircKey,
    stream: StreamId,
    es: &ExitStream,
) -> io::Result<usize> {
    let mut failure = None;
    let mut st = shared.borrow_mut();
    let r = st
        .node
        .exit_read_with(Instant::now(), circ, stream, |chunks| {
            let slices: Vec<io::IoSlice<'_>> = chunks.iter().map(|c| io::IoSlice::new(c)).collect();
            match es.tcp.try_write_vectored(&slices) {
                Ok(0) => {
                    failure = Some(ErrorKind::WriteZero.into());
                    0
                }
                Ok(n) => n,
                Err(e) => {
                    failure = Some(e);
                    0
                }
            }
        });
    process(shared, &mut st);
    match (failure, r) {
        (Some(e), _) => Err(e),
        (None, Ok(n)) => Ok(n),
        // The stream is gone; the loop sees it is no longer registered.
        (None, Err(_)) => Ok(0),
    }
}

/// Is `es` still the stream registered for `(circ, stream)`?
fn is_registered(st: &State, circ: CircKey, stream: StreamId, es: &Rc<ExitStream>) -> bool {
    st.streams
        .get(&(circ, stream.into()))
        .is_some_and(|s| Rc::ptr_eq(s, es))
}

/// The writer is done: stop the reader and forget the stream. The
/// connection closes (FIN) when the last task holding it is dropped, at
/// once: no descriptor outlives its stream.
fn finish(shared: &Shared, circ: CircKey, stream: StreamId, es: &Rc<ExitStream>) {
    es.ended.set(true);
    es.stop_reading();
    let mut st = shared.borrow_mut();
    if is_registered(&st, circ, stream, es) {
        st.streams.remove(&(circ, stream.into()));
    }
    debug!(?circ, stream = u16::from(stream), "exit stream closed");
}

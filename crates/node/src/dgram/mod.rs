//! A relay's datagram circuits (`docs/datagram.md`) on its datagram
//! socket: the sans-IO [`DgramRelay`] driven by the socket's links, cells
//! and timers; at an exit also its [`ExitSets`] (the end-to-end TCP of
//! each set), each stream's target connected under the exit's rules
//! ([`crate::exit`]) and its bytes moved by a task of its own.
//!
//! It also runs MORE on the same socket ([`MoreRelay`]): packets peeled
//! and sent on, replies delivered to clients' mailboxes, and at an exit
//! the forward messages for its sets and their replies on SURBs.
//!
//! Links it opens go only to relays of the network document, at their
//! advertised `dgram` address (an EXTEND2 or a MORE route elsewhere
//! fails).
//!
//! An exit with `[link.datagram] end_to_end = "kernel"` also serves
//! kernel sets, whose TCP is its kernel's behind a TUN device
//! ([`kernel`]).

pub(crate) mod kernel;
mod memory;

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_cell::msg::EndReason;
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_dgram::more::{MoreOutput, MoreRelay, MoreRelaySettings, SphinxKey};
use onionlab_dgram::{
    DgramRelay, ExitSetSettings, ExitSets, KernelOutput, LinkId, Recv, RelayOutput, RelaySettings,
    StreamEvent, StreamKey,
};
use onionlab_netdoc::doc::NetworkDocument;
use onionlab_transport::datagram::pump::{pump, StreamSide};
use onionlab_transport::datagram::{DatagramSocket, LinkEvent};
use onionlab_transport::endpoint::EndpointKind;
use tokio::sync::Notify;
use tokio::task::{spawn_local, JoinHandle};
use tor_llcrypto::pk::ed25519::Ed25519Identity;
use tracing::{debug, info};

use crate::exit::{connect_target, ConnectJob, Exit};
use crate::memory::SharedMemory;

/// A link without circuits for this long is closed: heartbeats would
/// keep it (and a session slot) forever otherwise.
const LINK_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// How often links are looked at for that.
const LINK_SWEEP: Duration = Duration::from_secs(30);

/// What a relay's datagram circuits run with.
pub(crate) struct DgramSetup {
    pub(crate) nickname: String,
    pub(crate) keys: Arc<RelaySecretKeys>,
    pub(crate) doc: Rc<NetworkDocument>,
    /// The exit's rules; `None` if not an exit.
    pub(crate) exit: Option<Exit>,
    /// The end-to-end TCP's settings and dispatch, at an exit.
    pub(crate) sets: ExitSetSettings,
    /// At an exit that serves kernel sets: its TUN device and listener.
    pub(crate) kernel: Option<kernel::ExitKernel>,
    /// The relay's memory cap, shared with its circuit node.
    pub(crate) memory: Rc<SharedMemory>,
}

type Shared = Rc<RefCell<State>>;

struct State {
    nickname: String,
    relay: DgramRelay,
    more: MoreRelay,
    socket: Arc<DatagramSocket>,
    doc: Rc<NetworkDocument>,
    /// At an exit: its sets, and what a connect needs.
    exit: Option<(ExitSets, ConnectJob, usize)>,
    /// Each link's peer address and proven identity (`None`: a client).
    links: HashMap<LinkId, (SocketAddr, Option<Ed25519Identity>)>,
    peers: HashMap<SocketAddr, LinkId>,
    next_link: LinkId,
    /// Links asked for and not up yet: the identity each must prove.
    dialing: HashMap<SocketAddr, Ed25519Identity>,
    /// Each stream's wake-up, while its task runs.
    streams: HashMap<StreamKey, Rc<Notify>>,
    /// Connects under way.
    connecting: usize,
    /// Every stream task, aborted when the relay stops.
    tasks: Vec<JoinHandle<()>>,
    /// Wakes the main loop when a stream's task moved the timers.
    wake: Rc<Notify>,
    /// Links without circuits, since when.
    idle_since: HashMap<LinkId, Instant>,
    /// Kernel sets' TUN device, listener and connections (an exit's).
    kernel: Option<kernel::ExitKernel>,
    /// The relay's memory cap, shared with its circuit node.
    memory: Rc<SharedMemory>,
    /// Sets ended because the relay was over its memory cap.
    sets_ended_oom: u64,
}

/// Run the relay's datagram circuits on `socket` until the task is
/// aborted.
pub(crate) async fn serve(socket: Arc<DatagramSocket>, mut setup: DgramSetup) {
    // Only an exit serves kernel sets.
    let kernel = setup.kernel.take().filter(|_| setup.exit.is_some());
    setup.sets.kernel = kernel.is_some();
    let exit = match setup.exit {
        Some(exit) => match ExitSets::new(setup.sets, rand::random()) {
            Ok(sets) => Some((sets, exit.job(), exit.max_pending_connects())),
            Err(e) => {
                tracing::error!(nickname = %setup.nickname, "datagram exit disabled: {e}");
                None
            }
        },
        None => None,
    };
    let settings = RelaySettings {
        exit: exit.is_some(),
        ..RelaySettings::default()
    };
    info!(
        nickname = %setup.nickname,
        dgram = %socket.local_addr(),
        exit = settings.exit,
        kernel_sets = kernel.is_some(),
        "datagram circuits listening"
    );
    let more = MoreRelay::new(
        setup.keys.public().ed_identity,
        SphinxKey::new(setup.keys.sphinx_secret()),
        datagram_relays(&setup.doc),
        MoreRelaySettings {
            exit: exit.is_some(),
            ..MoreRelaySettings::default()
        },
        Instant::now(),
    );
    let wake = Rc::new(Notify::new());
    let shared: Shared = Rc::new(RefCell::new(State {
        nickname: setup.nickname,
        more,
        relay: DgramRelay::new(setup.keys, settings, rand::random()),
        socket: socket.clone(),
        doc: setup.doc,
        exit,
        links: HashMap::new(),
        peers: HashMap::new(),
        next_link: 1,
        dialing: HashMap::new(),
        streams: HashMap::new(),
        connecting: 0,
        tasks: Vec::new(),
        wake: wake.clone(),
        idle_since: HashMap::new(),
        kernel,
        memory: setup.memory,
        sets_ended_oom: 0,
    }));
    kernel::start(&shared);
    let mut tun = shared.borrow().kernel.as_ref().map(kernel::ExitKernel::tun);
    let mut packet = vec![0u8; 2048];
    let mut sweep = tokio::time::interval(LINK_SWEEP);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut memory_check = tokio::time::interval(memory::MEMORY_CHECK);
    memory_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let _stop = StopTasks(shared.clone());
    loop {
        let next = shared.borrow().next_timeout();
        let timer = async {
            match next {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ev = socket.next_event() => on_link_event(&shared, ev),
            () = timer => {
                let mut st = shared.borrow_mut();
                let now = Instant::now();
                st.relay.handle_timeout(now);
                if let Some((sets, ..)) = st.exit.as_mut() {
                    sets.handle_timeout(now);
                }
            }
            () = wake.notified() => {}
            _ = sweep.tick() => close_idle_links(&mut shared.borrow_mut(), Instant::now()),
            _ = memory_check.tick() => memory::check(&mut shared.borrow_mut()),
            r = from_tun(tun.as_deref(), &mut packet) => match r {
                Ok(n) => {
                    let mut st = shared.borrow_mut();
                    let State { kernel, exit, .. } = &mut *st;
                    if let (Some(kernel), Some((sets, ..))) = (kernel.as_mut(), exit.as_mut()) {
                        kernel.packet_from_kernel(sets, &packet[..n]);
                    }
                }
                Err(e) => {
                    tracing::error!("reading the TUN device failed, kernel sets stop: {e}");
                    tun = None;
                }
            },
        }
        flush(&shared);
    }
}

/// The next packet from the TUN device; never, without one.
async fn from_tun(
    tun: Option<&onionlab_transport::datagram::tunnel::TunDevice>,
    packet: &mut [u8],
) -> std::io::Result<usize> {
    match tun {
        Some(tun) => tun.recv(packet).await,
        None => std::future::pending().await,
    }
}

/// Every relay's identity and datagram address in `doc`.
fn datagram_relays(doc: &NetworkDocument) -> Vec<(Ed25519Identity, SocketAddr)> {
    doc.relays
        .iter()
        .filter_map(|r| {
            let addr = r.address(EndpointKind::DGRAM.doc_name())?;
            Some((Ed25519Identity::new(r.ed_identity), addr))
        })
        .collect()
}

/// Close the links that carried no circuit and no MORE message for
/// [`LINK_IDLE_TIMEOUT`].
fn close_idle_links(st: &mut State, now: Instant) {
    let mut in_use = st.relay.links_in_use();
    in_use.extend(
        st.more
            .links_used_since(now.checked_sub(LINK_SWEEP).unwrap_or(now)),
    );
    let links: Vec<LinkId> = st.links.keys().copied().collect();
    st.idle_since.retain(|l, _| !in_use.contains(l));
    for link in links {
        if in_use.contains(&link) {
            continue;
        }
        let since = *st.idle_since.entry(link).or_insert(now);
        if now.saturating_duration_since(since) < LINK_IDLE_TIMEOUT {
            continue;
        }
        if let Some((peer, _)) = st.links.remove(&link) {
            st.peers.remove(&peer);
            st.socket.close(peer);
            debug!(nickname = %st.nickname, %peer, "idle datagram link closed");
        }
        st.idle_since.remove(&link);
        st.relay.link_down(link);
        st.more.link_down(link);
    }
}

/// Aborts the stream tasks when the relay's datagram task ends, and
/// logs what the datagram side did (drops and refusals included).
struct StopTasks(Shared);

impl Drop for StopTasks {
    fn drop(&mut self) {
        if let Ok(mut st) = self.0.try_borrow_mut() {
            for t in st.tasks.drain(..) {
                t.abort();
            }
            info!(
                nickname = %st.nickname,
                circuits = ?st.relay.stats(),
                more = ?st.more.stats(),
                endpoint = ?st.socket.stats(),
                e2e = ?st.exit.as_ref().map(|(sets, ..)| sets.e2e_stats()),
                kernel = %st
                    .kernel
                    .as_ref()
                    .map(|k| k.stats().to_string())
                    .unwrap_or_else(|| "none".into()),
                events_dropped = st.socket.events_dropped(),
                sets_ended_out_of_memory = st.sets_ended_oom,
                "datagram relay stopped"
            );
        }
    }
}

impl State {
    fn next_timeout(&self) -> Option<Instant> {
        let sets = self.exit.as_ref().and_then(|(s, ..)| s.poll_timeout());
        [self.relay.poll_timeout(), sets]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether `addr` is the datagram address of the relay `identity` in
    /// the document (the only links this relay opens).
    fn is_relay(&self, addr: SocketAddr, identity: &Ed25519Identity) -> bool {
        self.doc.relays.iter().any(|r| {
            r.ed_identity == identity.as_bytes()[..]
                && r.address(EndpointKind::DGRAM.doc_name()) == Some(addr)
        })
    }
}

fn on_link_event(shared: &Shared, ev: LinkEvent) {
    let mut st = shared.borrow_mut();
    let now = Instant::now();
    match ev {
        LinkEvent::Up {
            peer,
            identity,
            dialled,
        } => {
            let link = st.next_link;
            st.next_link += 1;
            st.links.insert(link, (peer, identity));
            st.peers.insert(peer, link);
            let asked = st.dialing.remove(&peer);
            // Ours if our dial made it: then the relay knows where it
            // goes, and the circuit IDs are ours to choose.
            st.relay
                .link_up(now, link, identity, dialled.then_some(peer));
            st.more.link_up(link, identity);
            if let Some(expected) = asked.filter(|_| !dialled) {
                // The peer's session came instead of our dial (crossed,
                // or it was opening one as we asked): it stands for our
                // dial if it is the relay we asked for.
                st.relay.link_known(now, link, peer, expected);
                if identity != Some(expected) {
                    st.more.link_failed(expected);
                }
            }
        }
        LinkEvent::Cell { peer, cell } => {
            if let Some(&link) = st.peers.get(&peer) {
                st.relay.handle_cell(now, link, &cell[..]);
            }
        }
        LinkEvent::More { peer, message } => {
            if let Some(&link) = st.peers.get(&peer) {
                st.more.handle_message(now, link, &message);
            }
        }
        LinkEvent::Down { peer, reason } => {
            debug!(nickname = %st.nickname, %peer, %reason, "datagram link down");
            if let Some(identity) = st.dialing.remove(&peer) {
                st.relay.link_failed(peer, identity);
                st.more.link_failed(identity);
            }
            if let Some(link) = st.peers.remove(&peer) {
                st.links.remove(&link);
                st.idle_since.remove(&link);
                st.relay.link_down(link);
                st.more.link_down(link);
            }
        }
    }
}

/// Act on everything the relay and the exit's sets asked for, until
/// neither asks more.
fn flush(shared: &Shared) {
    let mut st = shared.borrow_mut();
    let now = Instant::now();
    loop {
        let mut moved = false;
        while let Some(out) = st.relay.poll_output() {
            moved = true;
            on_relay_output(&mut st, now, out);
        }
        while let Some(out) = st.more.poll_output() {
            moved = true;
            on_more_output(&mut st, now, out);
        }
        let State {
            exit,
            relay,
            more,
            kernel,
            ..
        } = &mut *st;
        if let Some((sets, ..)) = exit.as_mut() {
            while let Some(circuit) = sets.poll_refused() {
                moved = true;
                relay.refuse(circuit);
            }
            while let Some(circuit) = sets.poll_shed() {
                moved = true;
                relay.end_for_memory(circuit);
            }
            while let Some((circuit, msg)) = sets.poll_transmit() {
                moved = true;
                // A circuit that just ended: the segment is lost, as on
                // any datagram path.
                let _ = relay.send_to_client(circuit, &msg);
            }
            while let Some((surb, msg)) = sets.poll_more_reply(now) {
                moved = true;
                // A SURB that does not parse is the client's loss.
                let _ = more.send_reply(now, &surb, &msg);
            }
            while let Some(out) = sets.poll_kernel() {
                moved = true;
                let Some(kernel) = kernel.as_mut() else {
                    continue;
                };
                match out {
                    KernelOutput::Segment { set, data } => kernel.segment_to_kernel(set, &data),
                    KernelOutput::Closed(set) => kernel.set_ended(set),
                }
            }
        }
        while let Some(ev) = st.exit.as_mut().and_then(|(s, ..)| s.poll_event()) {
            moved = true;
            match ev {
                StreamEvent::Connect { stream, target } => {
                    start_connect(shared, &mut st, stream, target)
                }
                StreamEvent::Wake(stream) => {
                    if let Some(n) = st.streams.get(&stream) {
                        n.notify_one();
                    }
                }
            }
        }
        if !moved {
            break;
        }
    }
}

fn on_relay_output(st: &mut State, now: Instant, out: RelayOutput) {
    match out {
        RelayOutput::Transmit(link, cell) => {
            if let Some(&(peer, _)) = st.links.get(&link) {
                // A full link drops it, as any datagram path may.
                let _ = st.socket.send(peer, cell);
            }
        }
        RelayOutput::Connect { addr, identity } => {
            let opened_by_peer = st
                .peers
                .get(&addr)
                .filter(|l| st.links.get(l).is_some_and(|(_, id)| *id == Some(identity)));
            if !st.is_relay(addr, &identity) {
                debug!(
                    nickname = %st.nickname,
                    %addr,
                    "EXTEND2 to no relay's datagram address: refused"
                );
                st.relay.link_failed(addr, identity);
            } else if let Some(&link) = opened_by_peer {
                // That relay opened a link to us from its address: the
                // same link goes both ways.
                st.relay.link_known(now, link, addr, identity);
            } else if let Err(e) = dial(st, addr, identity) {
                debug!(nickname = %st.nickname, %addr, "datagram link not opened: {e}");
                st.relay.link_failed(addr, identity);
            }
        }
        RelayOutput::Delivered { circuit, msg } => match st.exit.as_mut() {
            Some((sets, ..)) => sets.handle_msg(now, circuit, msg),
            None => st.relay.refuse(circuit),
        },
        RelayOutput::Closed(circuit) => {
            if let Some((sets, ..)) = st.exit.as_mut() {
                sets.circuit_closed(circuit);
            }
        }
    }
}

fn on_more_output(st: &mut State, now: Instant, out: MoreOutput) {
    match out {
        MoreOutput::Send(link, message) => {
            if let Some(&(peer, _)) = st.links.get(&link) {
                // A full link drops it, as any datagram path may.
                let _ = st.socket.send_more(peer, message);
            }
        }
        MoreOutput::Connect { addr, identity } => {
            if let Err(e) = dial(st, addr, identity) {
                debug!(nickname = %st.nickname, %addr, "datagram link not opened: {e}");
                st.more.link_failed(identity);
            }
        }
        MoreOutput::Exit(message) => {
            if let Some((sets, ..)) = st.exit.as_mut() {
                sets.handle_more(now, &message);
            }
        }
    }
}

/// Ask for a link to the relay `identity` at `addr`, unless one is on its
/// way: our dial (circuits and MORE share it), or the peer's own session
/// from that address still handshaking (its `Up` then stands for our
/// dial, see `on_link_event`). `Err`: no link will come.
fn dial(st: &mut State, addr: SocketAddr, identity: Ed25519Identity) -> Result<(), String> {
    match st.dialing.get(&addr) {
        Some(dialled) if *dialled == identity => return Ok(()),
        Some(_) => return Err("a dial to another relay at that address is under way".into()),
        None => {}
    }
    match st.socket.connect(addr, identity) {
        Ok(()) => {}
        Err(_) if !st.peers.contains_key(&addr) && st.socket.has_session(addr) => {}
        Err(e) => return Err(e.to_string()),
    }
    st.dialing.insert(addr, identity);
    Ok(())
}

/// A new stream's target: connect in the background (bounded), then pump.
fn start_connect(shared: &Shared, st: &mut State, stream: StreamKey, target: String) {
    let now = Instant::now();
    let Some((sets, job, max)) = st.exit.as_mut() else {
        return;
    };
    let Some((host, port)) = split_target(&target) else {
        return sets.refused(now, stream, u8::from(EndReason::TORPROTOCOL));
    };
    if st.connecting >= *max {
        return sets.refused(now, stream, u8::from(EndReason::RESOURCELIMIT));
    }
    st.connecting += 1;
    let job = job.clone();
    let wake = Rc::new(Notify::new());
    st.streams.insert(stream, wake.clone());
    let shared = shared.clone();
    let task = spawn_local(async move {
        let result = connect_target(&host, port, &job).await;
        {
            let mut st = shared.borrow_mut();
            st.connecting -= 1;
            let now = Instant::now();
            if let Some((sets, ..)) = st.exit.as_mut() {
                match &result {
                    Ok(_) => sets.connected(now, stream),
                    Err(f) => sets.refused(now, stream, u8::from(f.reason)),
                }
            }
        }
        flush(&shared);
        let tcp = match result {
            Ok(tcp) => tcp,
            Err(f) => {
                debug!(stream = ?stream, reason = ?f.reason, error = ?f.error, "datagram exit connect failed");
                shared.borrow_mut().streams.remove(&stream);
                return;
            }
        };
        let side = ExitSide {
            shared: shared.clone(),
            stream,
        };
        let end = pump(tcp, &side, wake, Vec::new()).await;
        debug!(stream = ?stream, ?end, "datagram exit stream done");
        shared.borrow_mut().streams.remove(&stream);
        flush(&shared);
    });
    st.tasks.retain(|t| !t.is_finished());
    st.tasks.push(task);
}

/// A stream's `host:port` target as host (brackets off an IPv6 address)
/// and port.
fn split_target(target: &str) -> Option<(String, u16)> {
    let (host, port) = target.rsplit_once(':')?;
    Some((
        host.trim_matches(['[', ']']).to_string(),
        port.parse::<u16>().ok()?,
    ))
}

/// An exit stream as its pump sees it.
struct ExitSide {
    shared: Shared,
    stream: StreamKey,
}

impl ExitSide {
    /// Run `f` on the exit's sets, then send what it made.
    fn with<T>(&self, f: impl FnOnce(&mut ExitSets, Instant) -> T) -> Option<T> {
        let out = {
            let mut st = self.shared.borrow_mut();
            let (sets, ..) = st.exit.as_mut()?;
            let out = f(sets, Instant::now());
            st.wake.notify_one();
            out
        };
        flush(&self.shared);
        Some(out)
    }
}

impl StreamSide for ExitSide {
    fn send(&self, data: &[u8]) -> Option<usize> {
        self.with(|s, now| s.send(now, self.stream, data).ok())
            .flatten()
    }

    fn recv(&self, buf: &mut [u8]) -> Recv {
        self.with(|s, now| s.recv(now, self.stream, buf))
            .unwrap_or(Recv::Reset)
    }

    fn close(&self) {
        self.with(|s, now| s.close(now, self.stream));
    }

    fn abort(&self) {
        self.with(|s, now| s.abort(now, self.stream));
    }

    fn forget(&self) {
        self.with(|s, _| s.forget(self.stream));
    }
}

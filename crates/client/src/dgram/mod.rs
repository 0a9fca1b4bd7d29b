//! The client over datagram sets (`docs/datagram.md`), when its
//! transport is `datagram` (mUDP-OR) or `more` (MORE): SOCKS streams
//! become streams of the end-to-end TCP over a set of `legs` circuits (1
//! to 3, distinct guards and middles, one exit), or over Sphinx packets
//! each on its own route to the set's exit, run by the sans-IO [`Proxy`]
//! on the client's datagram socket. One set serves every stream whose target its exit's
//! policy allows, until it fails; a stream that needs another exit gets a
//! new set.
//!
//! The SOCKS reply says how the stream opened (the exit's END reason as
//! for tor1 circuits); once open, its end reaches the application as a
//! FIN only if every byte arrived, else as a reset
//! ([`pump`](onionlab_transport::datagram::pump)).
//!
//! With `[link.datagram] end_to_end = "kernel"` the sets carry the
//! client's kernel TCP instead ([`kernel`]).

mod kernel;

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use onionlab_cell::msg::EndReason;
use onionlab_circuit::conflux::sched::LegSchedulerKind;
use onionlab_client_core::path::{resolve_pinned, select_legs, Target};
use onionlab_client_core::PolicySettings;
use onionlab_dgram::more::{MoreRelayInfo, RouteHop};
use onionlab_dgram::{
    ClientSettings as CircuitSettings, HopSpec, LinkId, Proxy, ProxyOutput, ProxySettings, Recv,
    StreamEvent, StreamKey, StreamStatus,
};
use onionlab_netdoc::doc::NetworkDocument;
use onionlab_transport::datagram::pump::{pump, StreamSide};
use onionlab_transport::datagram::tunnel::EndToEnd;
use onionlab_transport::datagram::{DatagramSocket, LinkEvent};
use onionlab_transport::endpoint::EndpointKind;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tor_llcrypto::pk::ed25519::Ed25519Identity;
use tor_socksproto::SocksAddr;

use crate::socks::{self, reply};
use crate::{Error, Result};

/// Most circuits in one set (mUDP-OR's 1 to 3).
pub const MAX_LEGS: usize = 3;

pub(crate) type Shared = Rc<RefCell<State>>;

pub(crate) struct State {
    proxy: Proxy,
    socket: Arc<DatagramSocket>,
    policy: PolicySettings,
    rng: StdRng,
    links: HashMap<LinkId, SocketAddr>,
    peers: HashMap<SocketAddr, LinkId>,
    next_link: LinkId,
    dialing: HashMap<SocketAddr, Ed25519Identity>,
    /// The set new streams go on, and its exit (an index into the
    /// document's relays).
    current: Option<(u64, usize)>,
    /// MORE sets instead of circuits.
    more: bool,
    streams: HashMap<StreamKey, Rc<Notify>>,
    /// Wakes the main loop when a stream's task moved the timers.
    wake: Rc<Notify>,
    /// Kernel sets: the TUN device and each set's connections.
    kernel: Option<kernel::KernelSets>,
}

impl Drop for State {
    /// What the end-to-end TCP did, for the log (resent segments and
    /// ACKs cost whole cells here).
    fn drop(&mut self) {
        tracing::info!(
            e2e = ?self.proxy.e2e_stats(),
            kernel = %self
                .kernel
                .as_ref()
                .map(|k| k.stats().to_string())
                .unwrap_or_else(|| "none".into()),
            "datagram client stopped"
        );
    }
}

/// The leg scheduler datagram sets run: the client's (round robin or
/// random, else an error), else the network's if it is one of those,
/// else round robin, a cell per circuit in turn (mUDP-OR's default).
fn dispatch(policy: &PolicySettings) -> Result<LegSchedulerKind> {
    let datagram = |d: &LegSchedulerKind| {
        matches!(
            d,
            LegSchedulerKind::RoundRobin { .. } | LegSchedulerKind::Random
        )
    };
    match policy.leg_scheduler {
        Some(d) if datagram(&d) => Ok(d),
        Some(other) => Err(Error::Datagram(format!(
            "leg scheduler {other}: datagram sets take round-robin or random"
        ))),
        None => Ok(Some(policy.network.params.cfx_scheduler)
            .filter(datagram)
            .unwrap_or(LegSchedulerKind::RoundRobin { cells_per_leg: 1 })),
    }
}

impl State {
    /// The client's datagram state on `socket`, with `policy`'s paths
    /// and timeouts and `link`'s end-to-end TCP; MORE sets if `more`,
    /// else mUDP-OR's.
    pub(crate) fn new_shared(
        socket: Arc<DatagramSocket>,
        policy: PolicySettings,
        link: &onionlab_transport::LinkSettings,
        more: bool,
    ) -> Result<Shared> {
        let kernel = match link.datagram.end_to_end {
            EndToEnd::User => None,
            EndToEnd::Kernel if more => {
                return Err(Error::Datagram(
                    "MORE runs the user-space TCP only (link.datagram.end_to_end = \"kernel\" is mUDP-OR's)"
                        .into(),
                ))
            }
            EndToEnd::Kernel => Some(kernel::KernelSets::open(link.tcp_congestion())?),
        };
        if !(1..=MAX_LEGS).contains(&policy.legs) {
            return Err(Error::Datagram(format!(
                "legs = {}: datagram sets have 1 to {MAX_LEGS} circuits",
                policy.legs
            )));
        }
        let settings = ProxySettings {
            circuits: CircuitSettings {
                build_timeout: policy.circuit_build_timeout,
                ..CircuitSettings::default()
            },
            tcp: link.utcp.clone(),
            dispatch: dispatch(&policy)?,
            kernel: kernel.is_some(),
        };
        let mut proxy =
            Proxy::new(settings, rand::random()).map_err(|e| Error::Datagram(e.to_string()))?;
        if more {
            let relays = more_relays(&policy.network);
            if relays.len() < 3 {
                return Err(Error::Datagram(format!(
                    "MORE routes need 3 relays with a datagram address and a Sphinx key; \
                     the network document has {}",
                    relays.len()
                )));
            }
            proxy.set_more_relays(relays);
        }
        let rng = match policy.path_seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_rng(&mut rand::rng()),
        };
        Ok(Rc::new(RefCell::new(State {
            proxy,
            socket,
            policy,
            rng,
            links: HashMap::new(),
            peers: HashMap::new(),
            next_link: 1,
            dialing: HashMap::new(),
            current: None,
            more,
            streams: HashMap::new(),
            wake: Rc::new(Notify::new()),
            kernel,
        })))
    }

    fn doc(&self) -> Arc<NetworkDocument> {
        self.policy.network.clone()
    }

    /// The set a stream to `target` goes on: the current one if its exit
    /// allows the target, else a new one.
    fn set_for(&mut self, now: Instant, target: &Target) -> std::result::Result<u64, String> {
        let doc = self.doc();
        if let Some((set, exit)) = self.current {
            let allowed = doc
                .relays
                .get(exit)
                .is_some_and(|r| target.allowed_by(&r.exit_policy));
            if self.proxy.set_alive(set) && allowed {
                return Ok(set);
            }
        }
        let paths = self.choose_paths(&doc, target)?;
        let exit = paths[0][paths[0].len() - 1];
        if self.more {
            return self.start_more_set(now, &doc, exit);
        }
        let hops: Vec<Vec<HopSpec>> = paths
            .iter()
            .map(|p| {
                p.iter()
                    .map(|&i| hop_spec(&doc, i))
                    .collect::<Option<Vec<_>>>()
            })
            .collect::<Option<_>>()
            .ok_or("a relay on the path has no datagram address")?;
        let names: Vec<String> = paths
            .iter()
            .map(|p| onionlab_client_core::path::path_names(&doc.relays, p))
            .collect();
        let set = self.proxy.start_set(now, hops).map_err(|e| e.to_string())?;
        tracing::info!(set, legs = paths.len(), paths = ?names, "datagram set started");
        if let Some((old, _)) = self.current.replace((set, exit)) {
            // No new streams go on the old set; it ends with its last.
            match self.kernel.as_mut() {
                Some(kernel) => kernel.retire(&mut self.proxy, old),
                None => self.proxy.retire(old),
            }
        }
        Ok(set)
    }

    /// A MORE set to the relay `exit` (the exit of a path chosen as for a
    /// circuit: its policy allows the target).
    fn start_more_set(
        &mut self,
        now: Instant,
        doc: &NetworkDocument,
        exit: usize,
    ) -> std::result::Result<u64, String> {
        let info = doc
            .relays
            .get(exit)
            .and_then(more_relay)
            .ok_or("the exit has no datagram address or Sphinx key")?;
        let set = self
            .proxy
            .start_more_set(now, info)
            .map_err(|e| e.to_string())?;
        tracing::info!(set, exit = %doc.relays[exit].nickname, "MORE set started");
        if let Some((old, _)) = self.current.replace((set, exit)) {
            self.proxy.retire(old);
        }
        Ok(set)
    }

    /// Paths of a new set: the pinned ones, or `legs` random ones with
    /// distinct guards and middles through relays with a datagram address.
    fn choose_paths(
        &mut self,
        doc: &NetworkDocument,
        target: &Target,
    ) -> std::result::Result<Vec<Vec<usize>>, String> {
        // As the tor1 client reads them: `path` first, else `paths`, all
        // of them (their number is the set's legs, whatever `legs` says:
        // the lab writes `paths` alone).
        let pinned: Option<Vec<Vec<String>>> = match (&self.policy.path, &self.policy.paths) {
            (Some(path), _) => Some(vec![path.clone()]),
            (None, Some(paths)) => Some(paths.clone()),
            (None, None) => None,
        };
        if let Some(pinned) = pinned {
            return pinned
                .iter()
                .map(|p| resolve_pinned(&doc.relays, p).map_err(|e| e.to_string()))
                .collect();
        }
        // Relays a set cannot use: no datagram address, or (MORE) no
        // Sphinx key.
        let no_dgram: Vec<usize> = (0..doc.relays.len())
            .filter(|&i| {
                let r = &doc.relays[i];
                r.address(EndpointKind::DGRAM.doc_name()).is_none()
                    || (self.more && r.sphinx_key.is_none())
            })
            .collect();
        let legs = select_legs(
            &doc.relays,
            target,
            self.policy.legs,
            &no_dgram,
            &mut self.rng,
        )
        .map_err(|e| e.to_string())?;
        Ok(legs.into_iter().map(|l| l.to_vec()).collect())
    }
}

/// A relay as MORE routes through it: its datagram address and Sphinx
/// key, if it has both.
fn more_relay(r: &onionlab_netdoc::doc::RelayEntry) -> Option<MoreRelayInfo> {
    Some(MoreRelayInfo {
        hop: RouteHop {
            identity: r.public_keys().ed_identity,
            key: r.sphinx_key?,
        },
        addr: r.address(EndpointKind::DGRAM.doc_name())?,
    })
}

/// Every relay MORE can route through.
fn more_relays(doc: &NetworkDocument) -> Vec<MoreRelayInfo> {
    doc.relays.iter().filter_map(more_relay).collect()
}

/// Relay `i` as a hop: its datagram address and keys.
fn hop_spec(doc: &NetworkDocument, i: usize) -> Option<HopSpec> {
    let r = doc.relays.get(i)?;
    let keys = r.public_keys();
    Some(HopSpec {
        addr: r.address(EndpointKind::DGRAM.doc_name())?,
        identity: keys.ed_identity,
        onion_key: keys.onion_key,
    })
}

/// Drive the client's datagram socket and timers until aborted.
pub(crate) async fn drive(shared: Shared) {
    let (socket, wake) = {
        let st = shared.borrow();
        (st.socket.clone(), st.wake.clone())
    };
    let mut tun = shared.borrow().kernel_tun();
    let mut packet = vec![0u8; 2048];
    // What the proxy asked for at its start (MORE's links) goes now, not
    // at the first event.
    flush(&shared);
    loop {
        let next = shared.borrow().proxy.poll_timeout();
        let timer = async {
            match next {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        let from_tun = async {
            match &tun {
                Some(tun) => tun.recv(&mut packet).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ev = socket.next_event() => on_link_event(&shared, ev),
            () = timer => shared.borrow_mut().proxy.handle_timeout(Instant::now()),
            () = wake.notified() => {}
            r = from_tun => match r {
                Ok(n) => {
                    let mut st = shared.borrow_mut();
                    let State { kernel, proxy, .. } = &mut *st;
                    if let Some(kernel) = kernel.as_mut() {
                        kernel.packet_from_kernel(proxy, &packet[..n]);
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

fn on_link_event(shared: &Shared, ev: LinkEvent) {
    let mut st = shared.borrow_mut();
    let now = Instant::now();
    match ev {
        LinkEvent::Up { peer, identity, .. } => {
            let (Some(expected), Some(_)) = (st.dialing.remove(&peer), identity) else {
                // Clients never accept: no such session can be ours.
                st.socket.close(peer);
                return;
            };
            let link = st.next_link;
            st.next_link += 1;
            st.links.insert(link, peer);
            st.peers.insert(peer, link);
            st.proxy.link_up(now, link, peer, expected);
        }
        LinkEvent::Cell { peer, cell } => {
            if let Some(&link) = st.peers.get(&peer) {
                st.proxy.handle_cell(now, link, &cell[..]);
            }
        }
        LinkEvent::More { peer, message } => {
            if let Some(&link) = st.peers.get(&peer) {
                st.proxy.handle_more(now, link, &message);
            }
        }
        LinkEvent::Down { peer, reason } => {
            tracing::info!(%peer, %reason, "datagram link to a guard down");
            if let Some(identity) = st.dialing.remove(&peer) {
                st.proxy.link_failed(peer, identity);
            }
            if let Some(link) = st.peers.remove(&peer) {
                st.links.remove(&link);
                st.proxy.link_down(now, link);
            }
        }
    }
}

/// Act on everything the proxy asked for.
fn flush(shared: &Shared) {
    let mut st = shared.borrow_mut();
    while let Some(out) = st.proxy.poll_output() {
        match out {
            ProxyOutput::Transmit(link, cell) => {
                if let Some(&peer) = st.links.get(&link) {
                    // A full link drops it, as any datagram path may.
                    let _ = st.socket.send(peer, cell);
                }
            }
            ProxyOutput::SendMore(link, message) => {
                if let Some(&peer) = st.links.get(&link) {
                    let _ = st.socket.send_more(peer, message);
                }
            }
            ProxyOutput::Connect { addr, identity } => {
                if let Err(e) = st.socket.connect(addr, identity) {
                    tracing::info!(%addr, "datagram link to a guard not opened: {e}");
                    st.proxy.link_failed(addr, identity);
                } else {
                    st.dialing.insert(addr, identity);
                }
            }
            ProxyOutput::Linked { set, legs } => {
                tracing::info!(set, legs, "datagram circuit linked");
            }
            ProxyOutput::LegClosed { set, error } => {
                tracing::info!(set, "datagram circuit ended: {error}");
            }
            ProxyOutput::SetFailed(set) => {
                tracing::info!(set, "datagram set failed: its streams are reset");
                if st.current.is_some_and(|(s, _)| s == set) {
                    st.current = None;
                }
                if let Some(kernel) = st.kernel.as_mut() {
                    kernel.set_ended(set);
                }
            }
        }
    }
    let State { kernel, proxy, .. } = &mut *st;
    if let Some(kernel) = kernel.as_mut() {
        while let Some((set, segment)) = proxy.poll_kernel_segment() {
            kernel.segment_to_kernel(set, &segment);
        }
    }
    while let Some(ev) = st.proxy.poll_stream_event() {
        let StreamEvent::Wake(stream) = ev else {
            continue;
        };
        if let Some(n) = st.streams.get(&stream) {
            n.notify_one();
        }
    }
}

/// Serve one SOCKS connection over a datagram set.
pub(crate) async fn serve(
    shared: Shared,
    mut sock: TcpStream,
    peer: SocketAddr,
    hs_timeout: std::time::Duration,
) {
    let accepted = match socks::handshake(&mut sock, hs_timeout).await {
        Ok(a) => a,
        Err(e) => {
            tracing::debug!(%peer, "SOCKS handshake failed: {e}");
            return;
        }
    };
    let request = accepted.request;
    let port = request.port();
    let (target, host) = match request.addr() {
        SocksAddr::Ip(ip) => (
            Target::ip(*ip, port),
            std::net::SocketAddr::new(*ip, port).to_string(),
        ),
        SocksAddr::Hostname(h) => (
            Target::from_host(h.as_ref(), port),
            format!("{}:{port}", h.as_ref()),
        ),
    };
    if shared.borrow().kernel.is_some() {
        let early = accepted.early_data;
        return kernel::serve_stream(shared, sock, peer, &request, (target, host), early).await;
    }
    let opened = open(&shared, &target, &host).await;
    let (stream, wake) = match opened {
        Ok(s) => s,
        Err(code) => {
            tracing::debug!(%peer, %target, code, "datagram stream failed");
            let _ = sock.write_all(&socks::reply_bytes(&request, code)).await;
            return;
        }
    };
    if sock
        .write_all(&socks::reply_bytes(&request, reply::SUCCEEDED))
        .await
        .is_err()
    {
        ClientSide {
            shared: shared.clone(),
            stream,
        }
        .abort();
        shared.borrow_mut().streams.remove(&stream);
        return;
    }
    let side = ClientSide {
        shared: shared.clone(),
        stream,
    };
    let end = pump(sock, &side, wake, accepted.early_data).await;
    tracing::debug!(%peer, %target, ?end, "datagram stream done");
    shared.borrow_mut().streams.remove(&stream);
    flush(&shared);
}

/// Open a stream and wait for the exit's answer, within the build and
/// connect timeouts: the stream and its wake-up, or a SOCKS reply code.
async fn open(
    shared: &Shared,
    target: &Target,
    host: &str,
) -> std::result::Result<(StreamKey, Rc<Notify>), u8> {
    let now = Instant::now();
    let (stream, wake, deadline) = {
        let mut st = shared.borrow_mut();
        let set = st.set_for(now, target).map_err(|why| {
            tracing::info!(%target, "no datagram set: {why}");
            reply::GENERAL_FAILURE
        })?;
        let stream = st.proxy.open_stream(now, set, host).map_err(|e| {
            tracing::info!(%target, "datagram stream not opened: {e}");
            reply::GENERAL_FAILURE
        })?;
        let wake = Rc::new(Notify::new());
        st.streams.insert(stream, wake.clone());
        let deadline = now + st.policy.circuit_build_timeout + st.policy.stream_connect_timeout;
        (stream, wake, deadline)
    };
    flush(shared);
    let failed = |code: u8| {
        let mut st = shared.borrow_mut();
        st.proxy.abort(Instant::now(), stream);
        st.streams.remove(&stream);
        drop(st);
        flush(shared);
        Err(code)
    };
    loop {
        let status = shared.borrow().proxy.status(stream);
        match status {
            StreamStatus::Open => return Ok((stream, wake)),
            StreamStatus::Refused(reason) => {
                return failed(socks::end_reason_reply(EndReason::from(reason)))
            }
            StreamStatus::Failed => return failed(reply::GENERAL_FAILURE),
            StreamStatus::Opening => {}
        }
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep_until(deadline.into()) => return failed(reply::TTL_EXPIRED),
        }
    }
}

/// A client stream as its pump sees it.
struct ClientSide {
    shared: Shared,
    stream: StreamKey,
}

impl ClientSide {
    /// Run `f` on the proxy, then send what it made.
    fn with<T>(&self, f: impl FnOnce(&mut Proxy, Instant) -> T) -> T {
        let out = {
            let mut st = self.shared.borrow_mut();
            let out = f(&mut st.proxy, Instant::now());
            st.wake.notify_one();
            out
        };
        flush(&self.shared);
        out
    }
}

impl StreamSide for ClientSide {
    fn send(&self, data: &[u8]) -> Option<usize> {
        self.with(|p, now| p.send(now, self.stream, data).ok())
    }

    fn recv(&self, buf: &mut [u8]) -> Recv {
        self.with(|p, now| p.recv(now, self.stream, buf))
    }

    fn close(&self) {
        self.with(|p, now| p.close(now, self.stream));
    }

    fn abort(&self) {
        self.with(|p, now| p.abort(now, self.stream));
    }

    fn forget(&self) {
        self.with(|p, _| p.forget(self.stream));
    }
}

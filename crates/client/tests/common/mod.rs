//! A small loopback network for the client's tests: relays made of the
//! sans-IO `RelayNode` behind `TlsTransport::relay` listeners, with a
//! minimal exit (TCP connect, bytes both ways), all on one thread of their
//! own; plus a TCP echo server and a hand-written SOCKS5 client.
//!
//! This is deliberately not `onionlab-node`: the client's tests only need
//! relays that speak the protocol.

#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_cell::chan::DestroyReason;
use onionlab_cell::msg::{EncodedLinkSpec, EndReason, LinkSpec, StreamId};
use onionlab_circuit::node::{ChannelId, ChannelPeer, CircKey, NodeConfig, NodeEvent, RelayNode};
use onionlab_circuit::relay::RelayConfig;
use onionlab_circuit::stream::StreamEvent;
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_netdoc::doc::{TransportAddress, TRANSPORT_TLS};
use onionlab_netdoc::{ExitPolicy, NetworkDocument, RelayEntry};
use onionlab_transport::any::AnyLink as TlsLink;
use onionlab_transport::tls::TlsTransport;
use onionlab_transport::{CellReader, CellWriter, Incoming, Listener, Transport};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tor_llcrypto::pk::ed25519::Ed25519Identity;

/// Log to the test output, filtered by `RUST_LOG`.
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// One relay to start.
#[derive(Debug, Clone)]
pub struct RelaySpec {
    pub guard: bool,
    pub exit: bool,
    pub bandwidth: u64,
    pub policy: &'static str,
}

impl RelaySpec {
    pub fn guard() -> Self {
        RelaySpec {
            guard: true,
            exit: false,
            bandwidth: 100,
            policy: "reject *:*",
        }
    }
    pub fn middle() -> Self {
        RelaySpec {
            guard: false,
            ..RelaySpec::guard()
        }
    }
    pub fn exit() -> Self {
        RelaySpec {
            guard: false,
            exit: true,
            bandwidth: 100,
            policy: "accept *:*",
        }
    }
    pub fn guard_exit() -> Self {
        RelaySpec {
            guard: true,
            ..RelaySpec::exit()
        }
    }
}

/// Relays running on a thread of their own; stopped (every connection
/// closed) when dropped.
pub struct Network {
    /// The document describing the relays (`relay0`, `relay1`...).
    pub doc: NetworkDocument,
    circuits: Vec<Arc<AtomicUsize>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Network {
    /// Start relays as `specs` say; relay `i` is `relay{i}`.
    pub fn start(specs: &[RelaySpec]) -> Network {
        let n = specs.len();
        let keys: Vec<RelaySecretKeys> = (0..n)
            .map(|i| RelaySecretKeys::generate(&mut StdRng::seed_from_u64(1000 + i as u64)))
            .collect();
        let publics: Vec<_> = keys.iter().map(|k| k.public()).collect();
        let circuits: Vec<Arc<AtomicUsize>> =
            (0..n).map(|_| Arc::new(AtomicUsize::new(0))).collect();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let exits: Vec<bool> = specs.iter().map(|s| s.exit).collect();
        let gauges = circuits.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, async move {
                let mut addrs = Vec::new();
                for (i, k) in keys.into_iter().enumerate() {
                    let transport = TlsTransport::relay(&k, vec![IpAddr::V4(Ipv4Addr::LOCALHOST)])
                        .expect("transport");
                    let listener = transport
                        .bind("127.0.0.1:0".parse().expect("addr"))
                        .await
                        .expect("bind");
                    addrs.push(listener.local_addr());
                    let config = NodeConfig {
                        circuit: RelayConfig {
                            exit: exits[i],
                            // These relays test the client, which some
                            // tests pin to a one-hop path.
                            allow_one_hop_streams: true,
                            ..RelayConfig::default()
                        },
                        ..NodeConfig::default()
                    };
                    let relay = Rc::new(RefCell::new(Relay {
                        node: RelayNode::new(k, config, StdRng::seed_from_u64(i as u64)),
                        chans: HashMap::new(),
                        next_chan: 1,
                        streams: HashMap::new(),
                        gauge: gauges[i].clone(),
                        transport,
                    }));
                    tokio::task::spawn_local(accept_loop(relay, listener));
                }
                addr_tx.send(addrs).expect("send addrs");
                let _ = stop_rx.await;
            });
        });
        let addrs = addr_rx.recv().expect("relay addresses");
        let relays = specs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let mut r = RelayEntry::new(format!("relay{i}"), &publics[i]);
                r.addresses.push(TransportAddress {
                    transport: TRANSPORT_TLS.into(),
                    addr: addrs[i],
                });
                r.flags.guard = s.guard;
                r.flags.exit = s.exit;
                r.bandwidth = s.bandwidth;
                r.exit_policy = ExitPolicy::parse(s.policy).expect("policy");
                r
            })
            .collect();
        let doc = NetworkDocument {
            network_name: "test".into(),
            created_unix: 1_700_000_000,
            valid_after_unix: 1_700_000_000,
            valid_until_unix: 1_700_000_000 + 86_400,
            params: Default::default(),
            relays,
        };
        doc.validate().expect("valid document");
        Network {
            doc,
            circuits,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// Circuits relay `i` has now.
    pub fn circuits_at(&self, i: usize) -> usize {
        self.circuits[i].load(Ordering::SeqCst)
    }

    /// Wait until relay `i` has `n` circuits (true) or 5 s pass (false).
    pub async fn wait_circuits(&self, i: usize, n: usize) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.circuits_at(i) == n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    /// Stop every relay now (closing all their connections).
    pub fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.stop();
    }
}

struct ExitSlot {
    notify: Rc<Notify>,
    ended: bool,
    closed: bool,
}

struct Relay {
    node: RelayNode,
    /// Writer wake-ups of the open channels.
    chans: HashMap<ChannelId, Rc<Notify>>,
    next_chan: ChannelId,
    streams: HashMap<(CircKey, u16), ExitSlot>,
    gauge: Arc<AtomicUsize>,
    transport: TlsTransport,
}

type Shared = Rc<RefCell<Relay>>;

async fn accept_loop(relay: Shared, mut listener: onionlab_transport::tls::TlsListener) {
    while let Ok(incoming) = listener.accept().await {
        let relay = relay.clone();
        tokio::task::spawn_local(async move {
            if let Ok(link) = incoming.handshake().await {
                add_link(&relay, link, false);
            }
        });
    }
}

fn add_link(relay: &Shared, link: TlsLink, initiated: bool) -> ChannelId {
    let wake = Rc::new(Notify::new());
    let chan = {
        let mut me = relay.borrow_mut();
        let chan = me.next_chan;
        me.next_chan += 1;
        let peer = if link.peer.identity.is_some() {
            ChannelPeer::Relay
        } else {
            ChannelPeer::Client
        };
        me.node.add_channel(chan, initiated, peer);
        me.chans.insert(chan, wake.clone());
        chan
    };
    tokio::task::spawn_local(read_link(relay.clone(), chan, link.reader));
    tokio::task::spawn_local(write_link(relay.clone(), chan, link.writer, wake));
    chan
}

fn drop_channel(relay: &Shared, chan: ChannelId) {
    {
        let mut me = relay.borrow_mut();
        if let Some(w) = me.chans.remove(&chan) {
            w.notify_one();
            me.node.remove_channel(Instant::now(), chan);
        }
    }
    pump(relay);
}

async fn read_link<R: CellReader>(relay: Shared, chan: ChannelId, mut reader: R) {
    let mut cells = Vec::new();
    loop {
        cells.clear();
        if reader.read_cells(&mut cells).await.is_err() {
            drop_channel(&relay, chan);
            return;
        }
        {
            let mut me = relay.borrow_mut();
            if !me.chans.contains_key(&chan) {
                return;
            }
            let now = Instant::now();
            for c in cells.drain(..) {
                me.node.handle_cell(now, chan, c);
            }
        }
        pump(&relay);
    }
}

async fn write_link<W: CellWriter>(
    relay: Shared,
    chan: ChannelId,
    mut writer: W,
    wake: Rc<Notify>,
) {
    loop {
        {
            let mut me = relay.borrow_mut();
            if !me.chans.contains_key(&chan) {
                return;
            }
            let now = Instant::now();
            while writer.has_room() {
                let Some(cell) = me.node.poll_transmit(now, chan) else {
                    break;
                };
                if writer.queue(cell).is_err() {
                    drop(me);
                    drop_channel(&relay, chan);
                    return;
                }
            }
        }
        pump(&relay);
        if writer.has_pending() {
            if writer.flush().await.is_err() {
                drop_channel(&relay, chan);
                return;
            }
            continue;
        }
        wake.notified().await;
    }
}

/// Act on the node's events and wake the writers of channels with work.
fn pump(relay: &Shared) {
    let mut me = relay.borrow_mut();
    let now = Instant::now();
    while let Some(ev) = me.node.poll_event() {
        match ev {
            NodeEvent::ConnectRelay { circ, linkspecs } => match parse_linkspecs(&linkspecs) {
                Some((addr, id)) => {
                    tokio::task::spawn_local(connect_next(relay.clone(), circ, addr, id));
                }
                None => me
                    .node
                    .extend_channel_failed(now, circ, DestroyReason::CONNECTFAILED),
            },
            NodeEvent::ExitConnect {
                circ,
                stream,
                host,
                port,
            } => {
                let notify = Rc::new(Notify::new());
                me.streams.insert(
                    (circ, u16::from(stream)),
                    ExitSlot {
                        notify: notify.clone(),
                        ended: false,
                        closed: false,
                    },
                );
                tokio::task::spawn_local(exit_stream(
                    relay.clone(),
                    circ,
                    stream,
                    host,
                    port,
                    notify,
                ));
            }
            NodeEvent::ExitResolve { circ, stream, .. } => {
                let _ = me.node.exit_resolved(now, circ, stream, Vec::new());
            }
            NodeEvent::ExitStream { circ, event } => {
                let (id, ended) = match event {
                    StreamEvent::Readable { stream } | StreamEvent::Writable { stream } => {
                        (stream, false)
                    }
                    StreamEvent::Ended { stream, .. } => (stream, true),
                    StreamEvent::Connected { stream } => (stream, false),
                };
                if let Some(slot) = me.streams.get_mut(&(circ, u16::from(id))) {
                    slot.ended |= ended;
                    slot.notify.notify_one();
                }
            }
            NodeEvent::CircuitClosed { circ, .. } => {
                for ((c, _), slot) in me.streams.iter_mut() {
                    if *c == circ {
                        slot.closed = true;
                        slot.notify.notify_one();
                    }
                }
            }
            NodeEvent::ChannelViolation { chan, .. }
            | NodeEvent::ChannelOutOfMemory { chan, .. } => {
                if let Some(w) = me.chans.remove(&chan) {
                    w.notify_one();
                    me.node.remove_channel(now, chan);
                }
            }
        }
    }
    let busy: Vec<ChannelId> = me.node.channels_with_work().collect();
    for chan in busy {
        if let Some(w) = me.chans.get(&chan) {
            w.notify_one();
        }
    }
    me.gauge.store(me.node.n_circuits(), Ordering::SeqCst);
}

fn parse_linkspecs(specs: &[EncodedLinkSpec]) -> Option<(SocketAddr, Ed25519Identity)> {
    let mut addr = None;
    let mut id = None;
    for s in specs {
        match s.parse() {
            Ok(LinkSpec::OrPort(ip, port)) => addr = Some(SocketAddr::new(ip, port)),
            Ok(LinkSpec::Ed25519Id(e)) => id = Some(e),
            _ => {}
        }
    }
    Some((addr?, id?))
}

async fn connect_next(relay: Shared, circ: CircKey, addr: SocketAddr, id: Ed25519Identity) {
    let transport = relay.borrow().transport.clone();
    match transport.connect(addr, id).await {
        Ok(link) => {
            let chan = add_link(&relay, link, true);
            relay
                .borrow_mut()
                .node
                .extend_channel_ready(Instant::now(), circ, chan);
        }
        Err(_) => relay.borrow_mut().node.extend_channel_failed(
            Instant::now(),
            circ,
            DestroyReason::CONNECTFAILED,
        ),
    }
    pump(&relay);
}

/// Connect the target: the END reason on failure.
async fn connect_target(host: &str, port: u16) -> Result<TcpStream, EndReason> {
    let addrs: Vec<SocketAddr> = match tokio::net::lookup_host((host, port)).await {
        Ok(a) => a.collect(),
        Err(_) => return Err(EndReason::RESOLVEFAILED),
    };
    let mut last = EndReason::RESOLVEFAILED;
    for a in addrs {
        match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(a)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                last = EndReason::CONNECTREFUSED
            }
            Ok(Err(_)) => last = EndReason::MISC,
            Err(_) => last = EndReason::TIMEOUT,
        }
    }
    Err(last)
}

/// One exit stream: connect, then bytes both ways.
async fn exit_stream(
    relay: Shared,
    circ: CircKey,
    stream: StreamId,
    host: String,
    port: u16,
    notify: Rc<Notify>,
) {
    let key = (circ, u16::from(stream));
    let tcp = match connect_target(&host, port).await {
        Ok(s) => {
            let ip = s.peer_addr().ok().map(|a| a.ip());
            let _ = relay
                .borrow_mut()
                .node
                .exit_connected(Instant::now(), circ, stream, ip);
            pump(&relay);
            s
        }
        Err(reason) => {
            {
                let mut me = relay.borrow_mut();
                let _ = me.node.exit_refused(Instant::now(), circ, stream, reason);
                me.streams.remove(&key);
            }
            pump(&relay);
            return;
        }
    };
    let (mut rd, mut wr) = tcp.into_split();
    let mut from_target: Vec<u8> = Vec::new();
    let mut off = 0;
    let mut buf = vec![0u8; 16 * 1024];
    let mut to_target = vec![0u8; 16 * 1024];
    let (mut t0, mut t1) = (0, 0);
    let mut target_eof = false;
    loop {
        let (ended, closed, resume) = {
            let mut me = relay.borrow_mut();
            let now = Instant::now();
            if off < from_target.len() {
                match me.node.exit_write(now, circ, stream, &from_target[off..]) {
                    Ok(n) => off += n,
                    Err(_) => off = from_target.len(),
                }
                if off == from_target.len() {
                    from_target.clear();
                    off = 0;
                }
            }
            if t0 == t1 {
                if let Ok(n) = me.node.exit_read(now, circ, stream, &mut to_target) {
                    (t0, t1) = (0, n);
                }
            }
            // Held back by an XON's rate (Vegas): no event says when more
            // is taken.
            let resume = (off < from_target.len())
                .then(|| me.node.exit_write_resumes_at(circ, stream))
                .flatten();
            let slot = me.streams.get(&key);
            (
                slot.is_none_or(|s| s.ended),
                slot.is_none_or(|s| s.closed),
                resume,
            )
        };
        pump(&relay);
        if closed {
            break;
        }
        if target_eof && from_target.is_empty() {
            let _ = relay
                .borrow_mut()
                .node
                .exit_close(Instant::now(), circ, stream);
            pump(&relay);
            break;
        }
        if ended && t0 == t1 {
            let _ = wr.shutdown().await;
            break;
        }
        let want_read = !target_eof && from_target.is_empty() && !ended;
        tokio::select! {
            r = rd.read(&mut buf), if want_read => match r {
                Ok(0) | Err(_) => target_eof = true,
                Ok(n) => from_target.extend_from_slice(&buf[..n]),
            },
            r = wr.write(&to_target[t0..t1]), if t0 < t1 => match r {
                Ok(n) if n > 0 => t0 += n,
                _ => break,
            },
            _ = notify.notified() => {}
            () = tokio::time::sleep_until(resume.unwrap_or_else(Instant::now).into()),
                if resume.is_some() => {}
        }
    }
    relay.borrow_mut().streams.remove(&key);
}

/// A TCP echo server on 127.0.0.1 (or `ip`), for as long as the runtime
/// lives.
pub async fn echo_server_on(ip: IpAddr) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    Ok(addr)
}

/// A TCP echo server on 127.0.0.1.
pub async fn echo_server() -> SocketAddr {
    echo_server_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .await
        .expect("echo server")
}

/// A SOCKS5 target.
pub enum Dest<'a> {
    Ip(SocketAddr),
    Name(&'a str, u16),
}

/// SOCKS5 CONNECT through `proxy`: the stream on success, the reply code
/// otherwise.
pub async fn socks_connect(
    proxy: SocketAddr,
    dest: Dest<'_>,
    auth: Option<(&str, &str)>,
) -> Result<TcpStream, u8> {
    let mut s = TcpStream::connect(proxy).await.expect("connect to proxy");
    let method = if auth.is_some() { 2 } else { 0 };
    s.write_all(&[5, 1, method]).await.expect("greeting");
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).await.expect("method choice");
    assert_eq!(choice, [5, method], "method selection");
    if let Some((u, p)) = auth {
        let mut msg = vec![1, u.len() as u8];
        msg.extend_from_slice(u.as_bytes());
        msg.push(p.len() as u8);
        msg.extend_from_slice(p.as_bytes());
        s.write_all(&msg).await.expect("auth");
        let mut status = [0u8; 2];
        s.read_exact(&mut status).await.expect("auth status");
        assert_eq!(status, [1, 0], "auth accepted");
    }
    let mut req = vec![5, 1, 0];
    match dest {
        Dest::Ip(SocketAddr::V4(a)) => {
            req.push(1);
            req.extend_from_slice(&a.ip().octets());
            req.extend_from_slice(&a.port().to_be_bytes());
        }
        Dest::Ip(SocketAddr::V6(a)) => {
            req.push(4);
            req.extend_from_slice(&a.ip().octets());
            req.extend_from_slice(&a.port().to_be_bytes());
        }
        Dest::Name(h, port) => {
            req.push(3);
            req.push(h.len() as u8);
            req.extend_from_slice(h.as_bytes());
            req.extend_from_slice(&port.to_be_bytes());
        }
    }
    s.write_all(&req).await.expect("request");
    let code = read_reply(&mut s).await;
    if code == 0 {
        Ok(s)
    } else {
        Err(code)
    }
}

/// Read a SOCKS5 reply; its code.
pub async fn read_reply(s: &mut TcpStream) -> u8 {
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await.expect("reply header");
    assert_eq!(head[0], 5, "reply version");
    let addr_len = match head[3] {
        1 => 4,
        4 => 16,
        3 => {
            let mut l = [0u8; 1];
            s.read_exact(&mut l).await.expect("length");
            l[0] as usize
        }
        other => panic!("bad reply address type {other}"),
    };
    let mut rest = vec![0u8; addr_len + 2];
    s.read_exact(&mut rest).await.expect("reply address");
    head[1]
}

/// A deterministic pattern of `len` bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0] ^ seed)
        .collect()
}

/// Write `data` and read as much back at the same time; the bytes read.
pub async fn echo_roundtrip(s: &mut TcpStream, data: &[u8]) -> Vec<u8> {
    let (mut r, mut w) = s.split();
    let write = async {
        w.write_all(data).await.expect("write");
    };
    let read = async {
        let mut got = vec![0u8; data.len()];
        r.read_exact(&mut got).await.expect("read back");
        got
    };
    let ((), got) = tokio::join!(write, read);
    got
}

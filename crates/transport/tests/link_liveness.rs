//! The liveness of links made of several TCP connections (pctcp,
//! torchestra), judged over all of a link's connections together: a link
//! whose connection that carries no circuit hears nothing while a
//! circuit's connection is busy stays up (the seed 003 runs lost whole
//! links to that connection's kernel keep-alive under a full bottleneck);
//! an idle link stays up on its heartbeats; a link that hears nothing at
//! all fails within the silence limit, with an error saying so.
//!
//! Between the two relays runs a TCP forwarder that can cut any one
//! connection by its index (the order connections were opened) without
//! closing it: what a path that drops all of one connection's packets
//! looks like to the two ends.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onionlab_cell::chan::{AnyChanCell, AnyChanMsg, ChanCell, CircId, Relay};
use onionlab_transport::addrs::EndpointAddrs;
use onionlab_transport::any::AnyLink;
use onionlab_transport::connector::Connector;
use onionlab_transport::endpoint::{EndpointKind, Endpoints};
use onionlab_transport::liveness::LivenessTiming;
use onionlab_transport::{CellReader, CellWriter, Choice, Error, TransportKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod lanes_common;
use lanes_common::tcp_relay;

/// Short timers, so the tests take seconds.
const TIMING: LivenessTiming = LivenessTiming {
    heartbeat: Duration::from_millis(100),
    silence_limit: Duration::from_millis(1000),
};

fn cell(circ: u32, i: u32) -> AnyChanCell {
    let mut body = [0u8; 509];
    body[..4].copy_from_slice(&i.to_be_bytes());
    ChanCell::new(CircId::new(circ), AnyChanMsg::Relay(Relay::new(body)))
}

/// A forwarder from `front` to a target; each connection it carries can be
/// cut (nothing more passes either way, both sockets stay open).
struct Forwarder {
    front: SocketAddr,
    cuts: Arc<Mutex<Vec<Arc<AtomicBool>>>>,
}

impl Forwarder {
    async fn start(target: SocketAddr) -> Forwarder {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let front = listener.local_addr().expect("addr");
        let cuts: Arc<Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let cuts2 = cuts.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = TcpStream::connect(target).await else {
                    continue;
                };
                let cut = Arc::new(AtomicBool::new(false));
                cuts2.lock().expect("lock").push(cut.clone());
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                tokio::spawn(pump(ri, wo, cut.clone()));
                tokio::spawn(pump(ro, wi, cut));
            }
        });
        Forwarder { front, cuts }
    }

    fn connections(&self) -> usize {
        self.cuts.lock().expect("lock").len()
    }

    /// Cut connection `i` (in the order they were opened).
    fn cut(&self, i: usize) {
        self.cuts.lock().expect("lock")[i].store(true, Ordering::SeqCst);
    }

    fn cut_all(&self) {
        for c in self.cuts.lock().expect("lock").iter() {
            c.store(true, Ordering::SeqCst);
        }
    }
}

/// Copy `r` to `w` until either ends; once `cut`, hold what was read
/// (or the end) and read no more.
async fn pump(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let read = r.read(&mut buf).await;
        // Cut: not even the end of the connection passes.
        while cut.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A link of `kind` from relay 1 to relay 2 through a forwarder.
async fn linked(kind: TransportKind) -> (AnyLink, AnyLink, Forwarder) {
    let a = tcp_relay(1, |t| t.with_liveness(TIMING)).await;
    let mut b = tcp_relay(2, |t| t.with_liveness(TIMING)).await;
    let forwarder = Forwarder::start(b.addr).await;
    let connector = Connector::new(
        Endpoints::new().with(EndpointKind::TCP, a.tcp.clone()),
        Choice::Only(kind),
    )
    .expect("connector");
    let addrs = EndpointAddrs::default().with(EndpointKind::TCP, forwarder.front);
    let (ours, theirs) = tokio::join!(connector.connect(&addrs, b.id), b.accepted.recv());
    let ours = ours.expect("link opens");
    let theirs = theirs.expect("link accepted");
    // The transports must outlive the test's links.
    std::mem::forget((a, b));
    (ours, theirs, forwarder)
}

/// Send cell `i` of `circ` from `x` to `y`, and one back.
async fn round_trip(x: &mut AnyLink, y: &mut AnyLink, circ: u32, i: u32) {
    x.writer.queue(cell(circ, i)).expect("queue");
    expect_cell(y).await;
    y.writer.queue(cell(circ, i)).expect("queue");
    expect_cell(x).await;
}

async fn expect_cell(l: &mut AnyLink) {
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), l.reader.read_cells(&mut got))
        .await
        .expect("a cell in time")
        .expect("link alive");
    assert!(!got.is_empty());
}

/// How long until `link`'s reader fails, and with what.
async fn failure(link: &mut AnyLink) -> (Duration, Error) {
    let start = Instant::now();
    let mut cells = Vec::new();
    let e = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            cells.clear();
            if let Err(e) = link.reader.read_cells(&mut cells).await {
                return e;
            }
        }
    })
    .await
    .expect("the link fails within 10 s");
    (start.elapsed(), e)
}

/// Cells both ways on circuit 7 every 50 ms for three silence limits;
/// panics if one does not arrive.
async fn keep_busy(ab: &mut AnyLink, ba: &mut AnyLink) {
    let start = Instant::now();
    let mut i = 1;
    while start.elapsed() < TIMING.silence_limit * 3 {
        round_trip(ab, ba, 7, i).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        i += 1;
    }
}

async fn idle_link_stays_up(kind: TransportKind) {
    let (mut ab, mut ba, _f) = linked(kind).await;
    round_trip(&mut ab, &mut ba, 7, 0).await;
    tokio::time::sleep(TIMING.silence_limit * 3).await;
    round_trip(&mut ab, &mut ba, 7, 1).await;
}

async fn silent_link_fails(kind: TransportKind) {
    let (mut ab, mut ba, f) = linked(kind).await;
    round_trip(&mut ab, &mut ba, 7, 0).await;
    f.cut_all();
    let (t, e) = failure(&mut ab).await;
    assert!(matches!(e, Error::Silent { .. }), "{e}");
    assert!(
        t >= TIMING.silence_limit * 3 / 4 && t < TIMING.silence_limit * 3,
        "failed after {t:?}: {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pctcp_link_with_a_silent_main_connection_lives_on_its_busy_lane() {
    let (mut ab, mut ba, f) = linked(TransportKind::PCTCP).await;
    round_trip(&mut ab, &mut ba, 7, 0).await;
    assert_eq!(
        f.connections(),
        2,
        "the main connection and circuit 7's lane"
    );
    f.cut(0);
    keep_busy(&mut ab, &mut ba).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pctcp_idle_link_stays_up_on_heartbeats() {
    idle_link_stays_up(TransportKind::PCTCP).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pctcp_link_that_hears_nothing_fails_within_the_silence_limit() {
    silent_link_fails(TransportKind::PCTCP).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torchestra_link_with_a_silent_heavy_connection_lives_on_its_light_one() {
    let (mut ab, mut ba, f) = linked(TransportKind::TORCHESTRA).await;
    round_trip(&mut ab, &mut ba, 7, 0).await;
    for _ in 0..100 {
        if f.connections() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(f.connections(), 2, "light and heavy connections");
    f.cut(1);
    keep_busy(&mut ab, &mut ba).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torchestra_idle_link_stays_up_on_heartbeats() {
    idle_link_stays_up(TransportKind::TORCHESTRA).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torchestra_link_that_hears_nothing_fails_within_the_silence_limit() {
    silent_link_fails(TransportKind::TORCHESTRA).await;
}

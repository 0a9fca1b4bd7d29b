//! Benchmark (not run in CI, `#[ignore]`): goodput and time to first byte
//! of a well-behaved client while "other hosts" on loopback flood its
//! guard, against the same client without the flood, and with the same
//! flood aimed at a relay outside its path (the control: what the
//! flooders' own CPU and the shared host cost the client, with no DoS
//! handling on the path), measured in one run in turn (quiet, flood at
//! the guard, flood elsewhere, quiet, ...) so that drift of the shared
//! machine hits all three alike.
//!
//! The network has 4 relays; the client's path is relay0, relay1, relay3
//! (the exit); relay2 is the control's target. The flood, all at once: TCP connections from
//! 127.0.0.5 (re-opened as the guard closes them), CREATE2 cells with
//! genuine onionskins on 4 TLS links from 127.0.0.6, and QUIC handshakes
//! from 127.0.0.7. The flooders run in this process, on the same 2 cores
//! as the relays: the numbers include the attacker's CPU competing with
//! the relays, which a real attacker would not add.
//!
//! ```sh
//! cargo test --release -p onionlab --test bench_flood -- --ignored --nocapture
//! ```

use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_cell::chan::{AnyChanCell, ChanCell, CircId, Create2, HandshakeType};
use onionlab_crypto::ntor::NtorClient;
use onionlab_netdoc::{NetworkDocument, RelayEntry};
use onionlab_testnet::{self as testnet, LocalNetwork};
use onionlab_transport::quic::{QuicSettings, QuicTransport};
use onionlab_transport::tls::TlsTransport;
use onionlab_transport::{CellReader, CellWriter, Transport};
use tokio::net::TcpSocket;

const PATH: [&str; 3] = ["relay0", "relay1", "relay3"];
/// The relay the control flood hits: in the network, not in the path.
const BYSTANDER: usize = 2;
const LEN: u64 = 4 << 20;
const ROUNDS: usize = 6;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_onionlab"))
}

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// Counts of what the flooders sent.
#[derive(Default)]
struct FloodCounts {
    tcp: AtomicU64,
    create2: AtomicU64,
    quic: AtomicU64,
}

/// TCP connections from 127.0.0.5, at most 300 held, re-opened as closed.
async fn tcp_flood(to: SocketAddr, stop: Arc<AtomicBool>, n: Arc<FloodCounts>) {
    let mut held = std::collections::VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        let Ok(s) = TcpSocket::new_v4() else { break };
        if s.bind(SocketAddr::new(ip(5), 0)).is_err() {
            break;
        }
        if let Ok(Ok(c)) = tokio::time::timeout(Duration::from_secs(1), s.connect(to)).await {
            n.tcp.fetch_add(1, Ordering::Relaxed);
            held.push_back(c);
            if held.len() > 300 {
                held.pop_front();
            }
        }
        tokio::task::yield_now().await;
    }
}

/// CREATE2 cells with genuine onionskins on 4 TLS links from 127.0.0.6,
/// in batches of 50 per link, reading whatever comes back.
async fn create2_flood(
    to: SocketAddr,
    guard: RelayEntry,
    stop: Arc<AtomicBool>,
    n: Arc<FloodCounts>,
) {
    let keys = guard.public_keys();
    let transport = TlsTransport::client().with_bind_address(ip(6));
    let mut links = Vec::new();
    for _ in 0..4 {
        if let Ok(l) = transport.connect(to, keys.ed_identity).await {
            links.push(l);
        }
    }
    let mut next = 1u32;
    let mut cells = Vec::new();
    while !stop.load(Ordering::Relaxed) && !links.is_empty() {
        for link in &mut links {
            for _ in 0..50 {
                let (_, onionskin) = {
                    let mut rng = rand::rng();
                    NtorClient::start(&mut rng, &keys.ntor_node_id(), &keys.onion_key)
                };
                next = next.wrapping_add(1) & 0x7fff_ffff;
                let id = CircId::new(0x8000_0000 | next.max(1)).expect("nonzero");
                let create = Create2::new(HandshakeType::NTOR, onionskin.to_vec());
                let cell: AnyChanCell = ChanCell::new(Some(id), create.into());
                let _ = link.writer.queue(cell);
            }
            let _ = link.writer.flush().await;
            n.create2.fetch_add(50, Ordering::Relaxed);
            cells.clear();
            let _ = tokio::time::timeout(
                Duration::from_millis(20),
                link.reader.read_cells(&mut cells),
            )
            .await;
        }
    }
}

/// QUIC handshakes from 127.0.0.7, 20 at a time.
async fn quic_flood(to: SocketAddr, guard: RelayEntry, stop: Arc<AtomicBool>, n: Arc<FloodCounts>) {
    let identity = guard.public_keys().ed_identity;
    let t = QuicTransport::client_bound(QuicSettings::default(), ip(7));
    while !stop.load(Ordering::Relaxed) {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..20 {
            let t = t.clone();
            set.spawn(async move {
                tokio::time::timeout(Duration::from_secs(2), t.connect(to, identity)).await
            });
        }
        while set.join_next().await.is_some() {
            n.quic.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn median(v: Vec<f64>) -> f64 {
    onionlab_stats::median(&v).unwrap_or(f64::NAN)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by hand with --release --ignored --nocapture"]
async fn honest_client_goodput_under_a_flood() {
    let dir = std::env::temp_dir().join(format!("onionlab-bench-flood-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let mut net = LocalNetwork::init(&bin(), &dir, 4, 1).expect("network init");
    net.remove_when_done();
    net.start_relays().expect("relays start");
    net.start_client(Some(&PATH), "").expect("client starts");
    let key =
        onionlab_netdoc::keys::load_network_public_key(&dir.join("network-key.pub")).expect("key");
    let doc = NetworkDocument::from_signed_text(
        &fs::read_to_string(dir.join("network.doc")).expect("doc"),
        &key,
    )
    .expect("doc");
    let quic_addr = |r: &RelayEntry| {
        r.addresses
            .iter()
            .find(|a| a.transport == "quic")
            .expect("QUIC address")
            .addr
    };
    let socks = net.socks_addr();
    let server = testnet::workload_server().await.expect("server");
    testnet::download(socks, server, LEN, None)
        .await
        .expect("warm-up");

    // Samples (goodput Mbit/s, TTFB ms) per condition: quiet, flood at
    // the guard, flood at the bystander.
    let mut samples: [Vec<(f64, f64)>; 3] = Default::default();
    let counts = Arc::new(FloodCounts::default());
    for round in 0..ROUNDS * 3 {
        let condition = round % 3;
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        if condition > 0 {
            let target = if condition == 1 { 0 } else { BYSTANDER };
            let entry = doc.relays[target].clone();
            let to = net.relay_addr(target);
            tasks.push(tokio::spawn(tcp_flood(to, stop.clone(), counts.clone())));
            tasks.push(tokio::spawn(create2_flood(
                to,
                entry.clone(),
                stop.clone(),
                counts.clone(),
            )));
            tasks.push(tokio::spawn(quic_flood(
                quic_addr(&entry),
                entry,
                stop.clone(),
                counts.clone(),
            )));
            // Let the flood reach its steady state first.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let started = Instant::now();
        let t = testnet::download(socks, server, LEN, None)
            .await
            .expect("the honest client downloads");
        let secs = started.elapsed().as_secs_f64();
        samples[condition].push((
            LEN as f64 * 8.0 / secs / 1e6,
            t.first_byte.as_secs_f64() * 1e3,
        ));
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        // Let the relays forget the flood (buckets refill) before the next round.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let goodput = |v: &[(f64, f64)]| median(v.iter().map(|s| s.0).collect());
    let ttfb = |v: &[(f64, f64)]| median(v.iter().map(|s| s.1).collect());
    println!(
        "flood sent: {} TCP connections, {} CREATE2, {} QUIC handshakes",
        counts.tcp.load(Ordering::Relaxed),
        counts.create2.load(Ordering::Relaxed),
        counts.quic.load(Ordering::Relaxed)
    );
    let names = ["quiet", "flood at the guard", "flood at a bystander"];
    for (name, v) in names.iter().zip(&samples) {
        println!(
            "{name}: goodput {:?} Mbit/s, TTFB {:?} ms",
            v.iter().map(|s| s.0.round()).collect::<Vec<_>>(),
            v.iter()
                .map(|s| (s.1 * 10.0).round() / 10.0)
                .collect::<Vec<_>>()
        );
    }
    let [quiet, guard_flood, bystander_flood] = &samples;
    for (name, v) in names.iter().zip(&samples) {
        println!(
            "{name}: median goodput {:.1} Mbit/s ({:.2} of quiet), median TTFB {:.1} ms",
            goodput(v),
            goodput(v) / goodput(quiet),
            ttfb(v)
        );
    }
    println!(
        "flood at the guard against the same flood at a bystander: goodput ratio {:.2}",
        goodput(guard_flood) / goodput(bystander_flood)
    );
    let log = fs::read_to_string(&net.relays[0].log).unwrap_or_default();
    let last_stats = log
        .lines()
        .rev()
        .find(|l| l.contains("refused"))
        .unwrap_or("");
    println!("guard log, last refusal line: {last_stats}");
}

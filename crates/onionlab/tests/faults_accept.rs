//! Descriptor exhaustion at a listener, with real processes on 127.0.0.1:
//! a node limited to 64 descriptors (`RLIMIT_NOFILE`) is flooded with TCP
//! connections that never speak. Its accept loop must back off (bounded
//! CPU, a few rate-limited log lines, not millions), what already runs
//! through it must go on, and once the flood is gone it must accept again.
//!
//! Before the back-off, a relay in this state spun at 100% CPU and wrote
//! 3.1 million log lines (417 MB) in 6 seconds.

use std::fs;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use onionlab_testnet::{self as testnet, LocalNetwork, NodeProcess};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

const PATH: [&str; 3] = ["relay0", "relay1", "relay2"];
/// Connections in the flood: far above the node's 64 descriptors.
const FLOOD: usize = 300;
/// How long the node's CPU is watched while exhausted.
const WATCH: Duration = Duration::from_secs(3);

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_onionlab"))
}

/// A 3-relay TLS network whose node `limited` may open 64 descriptors,
/// and a client on the pinned path relay0, relay1, relay2.
fn network(name: &str, limited: &str) -> LocalNetwork {
    let dir = std::env::temp_dir().join(format!(
        "onionlab-faults-accept-{}-{name}",
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&dir);
    let mut net = LocalNetwork::init(&bin(), &dir, 3, 1).expect("network init");
    net.remove_when_done();
    net.set_transport("tls").expect("transport");
    net.set_nofile_limit(limited, 64);
    // These tests run a node out of descriptors with a flood from this
    // host: the denial-of-service limits would stop it first (that is
    // tests/abuse_flood.rs), so lift them here.
    for i in 0..3 {
        net.set_relay_config(
            i,
            "dos_max_conns_per_address = 100000
dos_conn_rate = 100000
dos_conn_burst = 100000
",
        )
        .expect("relay config");
    }
    net.start_relays().expect("relays start");
    start_client(&mut net);
    net
}

fn start_client(net: &mut LocalNetwork) {
    net.start_client(Some(&PATH), "max_circuit_dirtiness_s = 100000\n")
        .expect("client starts");
}

fn log_of(p: &NodeProcess) -> String {
    fs::read_to_string(&p.log).unwrap_or_default()
}

/// Open `n` TCP connections to `addr` and hold them (they never send a
/// byte). Connections beyond what the node accepted wait in its backlog.
async fn flood(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        match tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr)).await {
            Ok(Ok(s)) => held.push(s),
            // The backlog is full: enough.
            _ => break,
        }
    }
    assert!(held.len() > 100, "only {} connections opened", held.len());
    held
}

/// CPU seconds `p` uses during [`WATCH`], and the log lines it writes then.
async fn watch(p: &NodeProcess) -> (f64, usize) {
    let cpu0 = p.cpu_seconds().expect("cpu");
    let lines0 = log_of(p).lines().count();
    tokio::time::sleep(WATCH).await;
    let cpu = p.cpu_seconds().expect("cpu") - cpu0;
    (cpu, log_of(p).lines().count() - lines0)
}

/// Check the exhausted node's behaviour: CPU well below one core, a
/// handful of log lines, and a line that says why.
fn check_backed_off(p: &NodeProcess, cpu: f64, lines: usize) {
    eprintln!(
        "{} out of descriptors: {cpu:.3} CPU s and {lines} log lines in {WATCH:?}",
        p.name
    );
    let log = log_of(p);
    let tail: String = log.lines().rev().take(20).collect::<Vec<_>>().join("\n");
    assert!(
        cpu < WATCH.as_secs_f64() / 3.0,
        "{} used {cpu:.2} CPU s in {WATCH:?} while out of descriptors\n{tail}",
        p.name
    );
    assert!(
        lines <= 10,
        "{} wrote {lines} log lines in {WATCH:?}\n{tail}",
        p.name
    );
    assert!(
        log.contains("accept failed") && log.contains("backing off"),
        "{} never said it is out of descriptors\n{tail}",
        p.name
    );
    assert!(log.len() < 1 << 20, "{} log is {} bytes", p.name, log.len());
}

/// Try small downloads until one succeeds (up to 15 s).
async fn eventually_downloads(net: &LocalNetwork, server: SocketAddr) {
    let t0 = Instant::now();
    let mut last = String::new();
    while t0.elapsed() < Duration::from_secs(15) {
        let attempt = tokio::time::timeout(
            Duration::from_secs(5),
            testnet::download(net.socks_addr(), server, 64 * 1024, None),
        )
        .await;
        match attempt {
            Ok(Ok(_)) => return,
            Ok(Err(e)) => last = e,
            Err(_) => last = "attempt timed out".into(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("no download succeeded after the flood: {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_out_of_descriptors_backs_off_keeps_its_circuits_and_recovers() {
    let mut net = network("relay", "relay0");
    let server = testnet::workload_server().await.expect("server");
    testnet::download(net.socks_addr(), server, 100_000, None)
        .await
        .expect("download before the flood");

    let held = flood(net.relay_addr(0), FLOOD).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (cpu, lines) = watch(&net.relays[0]).await;
    check_backed_off(&net.relays[0], cpu, lines);
    // The client's circuit through relay0 needs no new descriptor there.
    testnet::download(net.socks_addr(), server, 1 << 20, None)
        .await
        .expect("a download on the existing circuit during the flood");

    // The flood ends; a new client needs a new channel to relay0.
    drop(held);
    net.client.as_mut().expect("client").stop();
    start_client(&mut net);
    eventually_downloads(&net, server).await;
    let log = log_of(&net.relays[0]);
    let handshake_lines = log.matches("link handshake failed").count();
    assert!(
        handshake_lines <= 3,
        "{handshake_lines} lines for the flood's failed handshakes (rate-limited: a few)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_out_of_descriptors_backs_off_keeps_its_streams_and_recovers() {
    let net = network("client", "client");
    let server = testnet::workload_server().await.expect("server");
    // A download of unbounded length, open before the flood.
    let mut s = testnet::endless_download(net.socks_addr(), server)
        .await
        .expect("download request");
    let mut buf = vec![0u8; 64 * 1024];
    s.read_exact(&mut buf).await.expect("first bytes");

    let held = flood(net.socks_addr(), FLOOD).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let client = net.client.as_ref().expect("client");
    // Keep the download moving while the client is watched, slowly (the
    // CPU it costs the client must not hide a spin).
    let reading = async {
        let mut got = 0usize;
        let t0 = Instant::now();
        while t0.elapsed() < WATCH {
            got += s
                .read(&mut buf[..4096])
                .await
                .expect("the open stream goes on");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        got
    };
    let ((cpu, lines), got) = tokio::join!(watch(client), reading);
    check_backed_off(client, cpu, lines);
    assert!(got > 0, "the open stream stalled during the flood");
    drop(s);

    drop(held);
    eventually_downloads(&net, server).await;
}

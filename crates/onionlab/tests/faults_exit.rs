//! The exit's streams under faults, with real processes on 127.0.0.1: a
//! 3-relay network (relay2 is the exit), a client on the pinned path
//! relay0, relay1, relay2, and TCP servers in the test.
//!
//! - streams that end must not leave descriptors behind at the exit (no
//!   CLOSE_WAIT), however long the circuit lives;
//! - an exit out of descriptors refuses streams with RESOURCELIMIT, says
//!   so in its log (rate-limited), and recovers;
//! - a target that resets its connection ends the stream with CONNRESET;
//! - a circuit that dies resets the target connection (RST, not FIN).
//!
//! Every process is stopped on every way out of a test, panics included
//! (`LocalNetwork`'s Drop).

use std::fs;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use onionlab_testnet::{self as testnet, LocalNetwork, NodeProcess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PATH: [&str; 3] = ["relay0", "relay1", "relay2"];
const EXIT: usize = 2;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_onionlab"))
}

/// A fresh directory named after the test.
fn workdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "onionlab-faults-exit-{}-{name}",
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&dir);
    dir
}

/// Relays (the exit limited to `exit_nofile` descriptors if given, and
/// logging its streams at debug) and a client on the pinned path, whose
/// circuits never get too dirty for new streams; every link uses
/// `transport` (`auto` by default).
fn network(name: &str, exit_nofile: Option<u64>, transport: Option<&str>) -> LocalNetwork {
    let mut net = LocalNetwork::init(&bin(), &workdir(name), 3, 1).expect("network init");
    net.remove_when_done();
    if let Some(t) = transport {
        net.set_transport(t).expect("transport");
    }
    if let Some(limit) = exit_nofile {
        net.set_nofile_limit(&format!("relay{EXIT}"), limit);
    }
    net.set_log_filter("info,onionlab_node::exit=debug");
    net.start_relays().expect("relays start");
    let exit_log = log_of(&net.relays[EXIT]);
    assert!(exit_log.contains("exit=true"), "relay{EXIT} is no exit");
    net.start_client(Some(&PATH), "max_circuit_dirtiness_s = 100000\n")
        .expect("client starts");
    net
}

fn log_of(p: &NodeProcess) -> String {
    fs::read_to_string(&p.log).unwrap_or_default()
}

/// The exit's log, for failure messages (the last 4000 characters).
fn exit_log_tail(net: &LocalNetwork) -> String {
    let log = log_of(&net.relays[EXIT]);
    let cut = log.len().saturating_sub(4000);
    let cut = (cut..log.len())
        .find(|i| log.is_char_boundary(*i))
        .unwrap_or(0);
    log[cut..].to_string()
}

/// Descriptors process `pid` has open.
fn open_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// TCP connections on this machine in CLOSE_WAIT whose peer is port
/// `port` on 127.0.0.1: the exit's side of a connection to our server
/// that the server closed and the exit did not.
fn close_wait_to(port: u16) -> usize {
    let table = fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let want = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // sl local_address rem_address st ...; 08 is CLOSE_WAIT.
            f.len() > 3 && f[2] == want && f[3] == "08"
        })
        .count()
}

/// Wait up to `limit` for `cond`.
async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_sequential_streams_on_one_circuit_under_64_descriptors() {
    let net = network("sequential", Some(64), None);
    let server = testnet::workload_server().await.expect("server");
    let socks = net.socks_addr();
    let exit_pid = net.relays[EXIT].pid().expect("exit runs");
    // The first stream builds the circuit and opens the exit's channels.
    testnet::download(socks, server, 2000, None)
        .await
        .unwrap_or_else(|e| panic!("first request: {e}\n{}", exit_log_tail(&net)));
    let baseline = open_fds(exit_pid);
    let mut peak = baseline;
    for i in 1..1000 {
        testnet::download(socks, server, 2000, None)
            .await
            .unwrap_or_else(|e| panic!("request {i}: {e}\n{}", exit_log_tail(&net)));
        if i % 25 == 0 {
            peak = peak.max(open_fds(exit_pid));
            // At most the stream just finished can be closing.
            let waiting = close_wait_to(server.port());
            assert!(waiting <= 2, "{waiting} CLOSE_WAIT after request {i}");
        }
    }
    assert!(
        peak <= baseline + 4,
        "the exit's descriptors grew from {baseline} to {peak}"
    );
    let settled = eventually(Duration::from_secs(3), || {
        close_wait_to(server.port()) == 0 && open_fds(exit_pid) <= baseline
    })
    .await;
    assert!(
        settled,
        "{} CLOSE_WAIT, {} descriptors open at the exit (baseline {baseline})",
        close_wait_to(server.port()),
        open_fds(exit_pid)
    );
    let client_log = log_of(net.client.as_ref().expect("client"));
    let built = client_log.matches("circuit built").count();
    assert_eq!(
        built, 1,
        "the requests used {built} circuits:\n{client_log}"
    );
}

/// A server that accepts connections and holds them (reading and dropping
/// what comes) until the test ends.
async fn holding_server() -> SocketAddr {
    let listener = TcpListener::bind((testnet::TARGET_IP, 0))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_streams_than_exit_descriptors_fail_cleanly_and_the_exit_recovers() {
    let net = network("exhaustion", Some(64), None);
    let server = holding_server().await;
    let socks = net.socks_addr();
    let mut attempts = tokio::task::JoinSet::new();
    for _ in 0..100 {
        attempts.spawn(async move {
            testnet::socks_connect(socks, &server.ip().to_string(), server.port(), None)
                .await
                .map_err(|e| e.to_string())
        });
    }
    let mut open: Vec<TcpStream> = Vec::new();
    let mut failures = Vec::new();
    while let Some(r) = attempts.join_next().await {
        match r.expect("task") {
            Ok(s) => open.push(s),
            Err(e) => failures.push(e),
        }
    }
    assert!(
        !failures.is_empty() && open.len() >= 20,
        "{} open, failures: {failures:?}",
        open.len()
    );
    // A refused stream is a SOCKS failure (RESOURCELIMIT maps to 0x01).
    for f in &failures {
        assert!(f.to_lowercase().contains("general"), "{f}");
    }
    // The streams that succeeded are open, not ended behind our back.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for s in &open {
        let mut b = [0u8; 1];
        match s.try_read(&mut b) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            other => panic!("an open stream read {other:?}"),
        }
    }
    let log = log_of(&net.relays[EXIT]);
    let warnings = log
        .matches("exit cannot open connections to targets")
        .count();
    assert!(
        (1..=2).contains(&warnings),
        "{warnings} exhaustion warnings for {} failures:\n{}",
        failures.len(),
        exit_log_tail(&net)
    );
    assert!(log.contains("RESOURCELIMIT"), "{}", exit_log_tail(&net));
    // Release them all: the exit closes its connections and recovers.
    drop(open);
    let exit_pid = net.relays[EXIT].pid().expect("exit runs");
    let freed = eventually(Duration::from_secs(5), || open_fds(exit_pid) < 40).await;
    assert!(freed, "{} descriptors still open", open_fds(exit_pid));
    let workload = testnet::workload_server().await.expect("server");
    testnet::download(socks, workload, 100_000, None)
        .await
        .unwrap_or_else(|e| panic!("after recovery: {e}\n{}", exit_log_tail(&net)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_resets_ends_the_stream_with_connreset() {
    let net = network("reset", None, None);
    let listener = TcpListener::bind((testnet::TARGET_IP, 0))
        .await
        .expect("bind");
    let server = listener.local_addr().expect("addr");
    let (reset_tx, reset_rx) = tokio::sync::oneshot::channel::<()>();
    let target = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut req = [0u8; 4];
        s.read_exact(&mut req).await.expect("request");
        s.write_all(&[7; 1000]).await.expect("part of a response");
        // Once the client has it, reset the connection (SO_LINGER 0).
        let _ = reset_rx.await;
        s.set_zero_linger().expect("SO_LINGER 0");
        drop(s);
    });
    let mut s = testnet::socks_connect(
        net.socks_addr(),
        &server.ip().to_string(),
        server.port(),
        None,
    )
    .await
    .expect("SOCKS connect");
    s.write_all(b"GET\n").await.expect("request");
    let mut part = [0u8; 1000];
    s.read_exact(&mut part).await.expect("the part sent");
    assert!(part.iter().all(|b| *b == 7));
    let _ = reset_tx.send(());
    target.await.expect("server task");
    // What the client does with a non-DONE END is the client's business;
    // the exit must have sent CONNRESET.
    let ended = eventually(Duration::from_secs(5), || {
        log_of(&net.relays[EXIT])
            .lines()
            .any(|l| l.contains("exit stream ends") && l.contains("CONNRESET"))
    })
    .await;
    assert!(ended, "no END CONNRESET:\n{}", exit_log_tail(&net));
    assert!(
        !log_of(&net.relays[EXIT]).contains("(DONE)"),
        "{}",
        exit_log_tail(&net)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_circuit_that_dies_resets_the_target_connection() {
    // Over TLS the guard sees the dead client's connection close at once
    // (a QUIC peer would only notice at its idle timeout).
    let mut net = network("dead-circuit", None, Some("tls"));
    let listener = TcpListener::bind((testnet::TARGET_IP, 0))
        .await
        .expect("bind");
    let server = listener.local_addr().expect("addr");
    let _client_side = testnet::socks_connect(
        net.socks_addr(),
        &server.ip().to_string(),
        server.port(),
        None,
    )
    .await
    .expect("SOCKS connect");
    let (mut s, _) = tokio::time::timeout(Duration::from_secs(5), listener.accept())
        .await
        .expect("the exit connects")
        .expect("accept");
    // The client dies: its guard loses the channel, the circuit is
    // destroyed hop by hop, and the exit must reset the connection.
    net.client.as_mut().expect("client").kill();
    let mut buf = [0u8; 16];
    let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
    match r {
        Ok(Err(e)) if e.kind() == ErrorKind::ConnectionReset => {}
        other => panic!(
            "the target saw {other:?}, not a reset\n{}",
            exit_log_tail(&net)
        ),
    }
}

//! The exit's target rules with real processes on 127.0.0.1: a 3-relay
//! network from `network init` (relay2 is the exit, policy `accept *:*`),
//! whose exits allow only the test's own targets on 127.0.0.2
//! (`--allow-private-target 127.0.0.2:*`, see `testnet::TARGET_IP`).
//!
//! Every local form of a listening server's address, `localhost`, the
//! relays' OR ports and the client's own SOCKS port are refused with
//! "connection not allowed by ruleset" (END EXITPOLICY), the exit logs the
//! refusals (rate-limited), and the allowed target still works.

use std::fs;
use std::net::SocketAddr;
use std::path::PathBuf;

use onionlab_testnet::{self as testnet, LocalNetwork};
use tokio::net::TcpListener;

const PATH: [&str; 3] = ["relay0", "relay1", "relay2"];
const EXIT: usize = 2;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_onionlab"))
}

fn network(name: &str) -> LocalNetwork {
    let dir =
        std::env::temp_dir().join(format!("onionlab-abuse-exit-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let mut net = LocalNetwork::init(&bin(), &dir, 3, 1).expect("network init");
    net.remove_when_done();
    net.start_relays().expect("relays start");
    net.start_client(Some(&PATH), "").expect("client starts");
    net
}

/// Accept and hold every connection, so that a refusal can only come from
/// the exit's rules, never from the target.
async fn listener(addr: &str) -> Option<SocketAddr> {
    let l = TcpListener::bind(addr).await.ok()?;
    let addr = l.local_addr().ok()?;
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    Some(addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exit_refuses_local_targets_relays_and_its_client_in_every_form() {
    let net = network("refuse");
    let socks = net.socks_addr();
    // A server on 127.0.0.1 (all local IPv4 forms reach it) and, where the
    // host has IPv6, one on [::1] with the same port if free.
    let v4 = listener("127.0.0.1:0").await.expect("bind 127.0.0.1");
    let port = v4.port();
    let have_v6 = listener(&format!("[::1]:{port}")).await.is_some();
    let mut targets: Vec<(String, u16)> = [
        "127.0.0.1",
        "::ffff:127.0.0.1",
        "::ffff:7f00:1",
        "::7f00:1",
        "0.0.0.0",
        "::",
        "localhost",
        "127.1.2.3",
    ]
    .iter()
    .map(|h| (h.to_string(), port))
    .collect();
    if have_v6 {
        targets.push(("::1".into(), port));
    }
    // The relays' OR ports and the client's SOCKS port (a loop).
    for i in 0..3 {
        targets.push(("127.0.0.1".into(), net.relay_addr(i).port()));
    }
    targets.push(("127.0.0.1".into(), socks.port()));

    for (host, port) in &targets {
        let got = testnet::socks_connect(socks, host, *port, None).await;
        assert!(
            matches!(got, Err(tokio_socks::Error::ConnectionNotAllowedByRuleset)),
            "{host} port {port}: {got:?}"
        );
    }
    // The opted-in target address works through the same circuit.
    let server = testnet::workload_server().await.expect("server");
    testnet::download(socks, server, 100_000, None)
        .await
        .expect("the allowed target is reachable");
    let log = fs::read_to_string(&net.relays[EXIT].log).unwrap_or_default();
    let lines = log.matches("exit stream refused").count();
    assert!(
        (1..=2).contains(&lines),
        "{} refusals give one or two rate-limited log lines, got {lines}:\n{log}",
        targets.len()
    );
}

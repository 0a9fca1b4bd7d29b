//! Multi-path sets (proposal 329's Conflux generalised to m legs,
//! docs/conflux.md) end to end with real processes on 127.0.0.1: a
//! network made with `onionlab network init --conflux` (seven relays, the
//! last the exit), a client with `legs = N`, and a local workload server.
//! Every byte of every transfer is checked; a relay killed under a set
//! must end the application's stream with an error, never a clean EOF.

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use onionlab_testnet::{self as testnet, LocalNetwork};
use tokio::io::AsyncReadExt;

const MIB: u64 = 1 << 20;
const RELAYS: usize = 7;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_onionlab"))
}

/// Seven relays (six guards, one exit) whose exits link sets scheduled
/// by `scheduler`, over `transport`; relays running, no client yet.
fn network(name: &str, transport: &str, scheduler: &str) -> LocalNetwork {
    let dir = std::env::temp_dir().join(format!(
        "onionlab-multipath-{}-{name}-{transport}",
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&dir);
    let mut net = LocalNetwork::init_with(
        &bin(),
        &dir,
        RELAYS,
        1,
        &["--conflux", "--leg-scheduler", scheduler],
    )
    .expect("network init");
    net.remove_when_done();
    net.set_transport(transport).expect("transport");
    net.start_relays().expect("relays start");
    net
}

fn client_log(net: &LocalNetwork) -> String {
    let client = net.client.as_ref().expect("client");
    fs::read_to_string(&client.log).unwrap_or_default()
}

/// The legs of every set the client built, from its "circuit built"
/// lines (the path of each leg, separated by ` + `).
fn built_sets(log: &str) -> Vec<Vec<String>> {
    log.lines()
        .filter(|l| l.contains("circuit built"))
        .filter_map(|l| {
            let path = l.split("path=").nth(1)?;
            let path = path.split(" ms=").next()?;
            Some(path.split(" + ").map(str::to_string).collect())
        })
        .collect()
}

/// A download and an upload through a set of `legs` legs arrive intact,
/// and the client really built such a set: legs sharing only the exit.
async fn transfers_through_a_set_arrive_intact(transport: &str, legs: usize, scheduler: &str) {
    let mut net = network(&format!("{legs}legs-{scheduler}"), transport, scheduler);
    net.start_client(None, &format!("legs = {legs}"))
        .expect("client starts");
    let server = testnet::workload_server().await.expect("server");
    let socks = net.socks_addr();
    testnet::download(socks, server, 8 * MIB, None)
        .await
        .unwrap_or_else(|e| panic!("download: {e}\n{}", client_log(&net)));
    testnet::upload(socks, server, 4 * MIB, None)
        .await
        .unwrap_or_else(|e| panic!("upload: {e}\n{}", client_log(&net)));
    let log = client_log(&net);
    let sets = built_sets(&log);
    let set = sets
        .first()
        .unwrap_or_else(|| panic!("no circuit built:\n{log}"));
    assert_eq!(set.len(), legs, "a set of {legs} legs expected:\n{log}");
    let hops: Vec<Vec<&str>> = set.iter().map(|p| p.split(',').collect()).collect();
    let exit = format!("relay{}", RELAYS - 1);
    let mut seen = std::collections::BTreeSet::new();
    for leg in &hops {
        assert_eq!(leg.len(), 3, "{set:?}");
        assert_eq!(leg[2], exit, "{set:?}");
        assert!(seen.insert(leg[0]) && seen.insert(leg[1]), "{set:?}");
    }
    net.stop();
}

/// A middle relay of a two-leg set killed during an endless download:
/// the application sees a reset, soon; never a clean EOF or silence.
async fn a_killed_leg_fails_the_stream_visibly(transport: &str) {
    let mut net = network("killed-leg", transport, "round-robin");
    // Pinned legs, so the victim carries one of them: relay3 is the
    // second leg's middle.
    net.start_client(
        None,
        "paths = [[\"relay0\", \"relay1\", \"relay6\"], [\"relay2\", \"relay3\", \"relay6\"]]",
    )
    .expect("client starts");
    let server = testnet::workload_server().await.expect("server");
    let mut s = testnet::endless_download(net.socks_addr(), server)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", client_log(&net)));
    let mut buf = vec![0u8; 64 * 1024];
    let mut received = 0usize;
    while received < (2 * MIB) as usize {
        match tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => received += n,
            other => panic!("before the kill: {other:?}\n{}", client_log(&net)),
        }
    }
    let killed = Instant::now();
    net.relays[3].kill();
    let ending = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(e.kind()),
            }
        }
    })
    .await;
    let log = client_log(&net);
    match ending {
        Ok(Err(kind)) => assert_eq!(kind, std::io::ErrorKind::ConnectionReset, "{log}"),
        Ok(Ok(())) => panic!("a killed leg gave the application a clean EOF:\n{log}"),
        Err(_) => panic!("a killed leg: nothing for 20 s:\n{log}"),
    }
    assert_eq!(built_sets(&log).first().map(Vec::len), Some(2), "{log}");
    eprintln!(
        "{transport}: leg killed after {received} bytes; reset after {:?}",
        killed.elapsed()
    );
    net.stop();
}

macro_rules! multipath_tests {
    ($($transport:ident: $name:expr),* $(,)?) => {$(
        mod $transport {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn two_legs_round_robin() {
                super::transfers_through_a_set_arrive_intact($name, 2, "round-robin").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn three_legs_lowrtt() {
                super::transfers_through_a_set_arrive_intact($name, 3, "lowrtt").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn three_legs_mtor() {
                super::transfers_through_a_set_arrive_intact($name, 3, "mtor").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_killed_leg_fails_the_stream_visibly() {
                super::a_killed_leg_fails_the_stream_visibly($name).await
            }
        }
    )*};
}

multipath_tests!(tls: "tls", quic: "quic");

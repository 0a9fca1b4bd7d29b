//! Memory a peer can make an exit hold, with real processes on loopback:
//! a client opens many streams to a server that sends as fast as it can,
//! then never reads them. The exit (relay2, `max_mem_in_queues` 2 MiB)
//! holds no buffer of its own per stream (it reads from a target only what
//! the circuit stream takes), so everything queued is counted: over the
//! cap it kills the circuits holding the most, logs it, ends below the
//! cap, and goes on serving an honest download.

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use onionlab_lab::traffic::{socks_connect, OP_DOWNLOAD};
use onionlab_testnet::{self as testnet, LocalNetwork};
use tokio::io::AsyncWriteExt;

const PATH: [&str; 3] = ["relay0", "relay1", "relay2"];
const EXIT: usize = 2;
const CAP: u64 = 2 << 20;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_onionlab"))
}

/// The `after=` value of each out-of-memory log line of `log`.
fn oom_after_values(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|l| l.contains("queued data over the memory limit"))
        .filter_map(|l| {
            let v = l.split("after=").nth(1)?;
            v.split_whitespace().next()?.parse().ok()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_are_never_read_stay_within_the_exit_memory_cap() {
    let dir = std::env::temp_dir().join(format!("onionlab-abuse-memory-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let mut net = LocalNetwork::init(&bin(), &dir, 3, 1).expect("network init");
    net.remove_when_done();
    net.set_relay_config(EXIT, &format!("max_mem_in_queues = {CAP}"))
        .expect("exit config");
    net.start_relays().expect("relays start");
    net.start_client(Some(&PATH), "").expect("client starts");
    let socks = net.socks_addr();
    let server = testnet::workload_server().await.expect("server");
    let host = server.ip().to_string();

    // 8 circuits (isolated by SOCKS username) x 16 streams, each asking
    // for 64 MiB and never reading: 128 stream buffers of 64 KiB at the
    // exit would be 8 MiB, four times the cap.
    let mut held = Vec::new();
    for circ in 0..8 {
        let user = format!("hog{circ}");
        for _ in 0..16 {
            let Ok(mut s) = socks_connect(socks, &host, server.port(), Some((&user, "x"))).await
            else {
                continue;
            };
            let mut req = [0u8; 9];
            req[0] = OP_DOWNLOAD;
            req[1..].copy_from_slice(&(64u64 << 20).to_be_bytes());
            if s.write_all(&req).await.is_ok() {
                held.push(s);
            }
        }
    }
    assert!(held.len() >= 64, "{} streams opened", held.len());
    tokio::time::sleep(Duration::from_secs(5)).await;

    let log = fs::read_to_string(&net.relays[EXIT].log).unwrap_or_default();
    let after = oom_after_values(&log);
    assert!(
        !after.is_empty(),
        "the exit went over its cap and killed circuits: {log}"
    );
    assert!(after.iter().all(|&a| a < CAP), "{after:?}");
    assert!(net.relays[EXIT].pid().is_some(), "the exit is alive");
    drop(held);
    testnet::download(socks, server, 1 << 20, None)
        .await
        .expect("an honest download through the same exit");
}

//! Datagram onion routing (`docs/datagram.md`) with real processes on
//! 127.0.0.1: seven relays (relay6 the exit), a client whose transport is
//! `datagram` (mUDP-OR) with 1 or 3 circuits per set, or `more` (MORE: a
//! Sphinx packet per segment), and a workload server.
//!
//! - 1 MiB each way arrives intact over 1 and 3 circuits and over MORE,
//!   with no loss and with 1% loss each way on every link (a lossy UDP
//!   forwarder in front of every relay's datagram address, which the
//!   network document advertises instead).
//! - A relay killed mid-download: over one circuit the application sees
//!   a reset within seconds, never a clean end; over three circuits the
//!   download goes on intact on the other two. Over MORE a killed middle
//!   costs no byte (routes avoid relays whose link to the client is
//!   down), and a killed exit resets the download within MORE's timeout.
//! - The exit's memory cap (`max_mem_in_queues`) counts its datagram
//!   streams' buffers: streams that do not fit are refused at once, the
//!   others run on, and room freed lets new ones open.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onionlab_testnet::{self as testnet, LocalNetwork};
use onionlab_transport::endpoint::EndpointKind;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpStream, UdpSocket};

const MIB: u64 = 1 << 20;
/// Kill to reset over one circuit: the link's silence limit (5 s) and
/// the DESTROYs' way back, with room for a loaded machine.
const KILL_TO_RESET_LIMIT: Duration = Duration::from_secs(20);

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_onionlab"))
}

/// A UDP forwarder to `target` that drops each datagram with probability
/// `loss`, both ways; one upstream socket per source, so replies find
/// their way back. Its address.
async fn lossy_forwarder(target: SocketAddr, loss: f64, seed: u64) -> SocketAddr {
    let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("bind"));
    let addr = front.local_addr().expect("address");
    tokio::spawn(async move {
        let mut backs: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut buf = vec![0u8; 65_536];
        loop {
            let Ok((n, from)) = front.recv_from(&mut buf).await else {
                continue;
            };
            let back = match backs.get(&from) {
                Some(b) => b.clone(),
                None => {
                    let b = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("bind"));
                    b.connect(target).await.expect("connect");
                    let (b2, f2) = (b.clone(), front.clone());
                    let mut rng2 = StdRng::seed_from_u64(rng.random());
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 65_536];
                        while let Ok(n) = b2.recv(&mut buf).await {
                            if !rng2.random_bool(loss) {
                                let _ = f2.send_to(&buf[..n], from).await;
                            }
                        }
                    });
                    backs.insert(from, b.clone());
                    b
                }
            };
            if !rng.random_bool(loss) {
                let _ = back.send(&buf[..n]).await;
            }
        }
    });
    addr
}

/// Seven relays whose nodes open datagram links, for a client of
/// `transport`; with `loss`, every relay's datagram address in the
/// document is a lossy forwarder's.
async fn network_of(transport: &str, name: &str, loss: f64) -> LocalNetwork {
    let dir = std::env::temp_dir().join(format!("onionlab-datagram-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut net = LocalNetwork::init(&bin(), &dir, 7, 1).expect("network init");
    net.remove_when_done();
    net.set_transport(transport).expect("transport");
    net.set_log_filter("info,onionlab_node::dgram=debug,onionlab_client::dgram=debug");
    if loss > 0.0 {
        let key = onionlab_netdoc::keys::load_network_key(&dir.join("network-key.secret"))
            .expect("network key");
        let mut doc = net.document().expect("document");
        for (i, relay) in doc.relays.iter_mut().enumerate() {
            for a in relay.addresses.iter_mut() {
                if a.transport == EndpointKind::DGRAM.doc_name() {
                    a.addr = lossy_forwarder(a.addr, loss, i as u64).await;
                }
            }
        }
        std::fs::write(dir.join("network.doc"), doc.to_signed_text(&key)).expect("document");
    }
    net.start_relays().expect("relays start");
    net
}

/// [`network_of`] for mUDP-OR.
async fn network(name: &str, loss: f64) -> LocalNetwork {
    network_of("datagram", name, loss).await
}

fn log_of(p: &testnet::NodeProcess) -> String {
    std::fs::read_to_string(&p.log).unwrap_or_default()
}

async fn one_mib_each_way(legs: usize, loss: f64) {
    let mut net = network(&format!("bulk-{legs}-{loss}"), loss).await;
    net.start_client(None, &format!("legs = {legs}"))
        .expect("client starts");
    let server = testnet::workload_server().await.expect("server");
    let socks = net.socks_addr();
    let client_log = || log_of(net.client.as_ref().expect("client"));
    testnet::download(socks, server, MIB, None)
        .await
        .unwrap_or_else(|e| panic!("download: {e}\n{}", client_log()));
    testnet::upload(socks, server, MIB, None)
        .await
        .unwrap_or_else(|e| panic!("upload: {e}\n{}", client_log()));
    let log = client_log();
    let linked = format!("legs={legs}");
    assert!(
        log.lines()
            .any(|l| l.contains("datagram circuit linked") && l.contains(&linked)),
        "the set never had {legs} linked circuits:\n{log}"
    );
    net.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_mib_each_way_over_one_circuit() {
    one_mib_each_way(1, 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_mib_each_way_over_three_circuits() {
    one_mib_each_way(3, 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_mib_each_way_over_one_circuit_through_one_percent_loss() {
    one_mib_each_way(1, 0.01).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_mib_each_way_over_three_circuits_through_one_percent_loss() {
    one_mib_each_way(3, 0.01).await;
}

/// Read `len` bytes of an endless download from `offset`, checking each
/// against the pattern.
async fn read_checked(s: &mut TcpStream, offset: &mut u64, len: u64) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut want = vec![0u8; 64 * 1024];
    let end = *offset + len;
    while *offset < end {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        testnet::fill_pattern(*offset, &mut want[..n]);
        assert!(buf[..n] == want[..n], "wrong bytes at offset {offset}");
        *offset += n as u64;
    }
    Ok(())
}

/// Start an endless download through `net`'s client (started with the
/// path `relay0`, `relay3`, `relay6`), read 1 MiB of it, kill relay
/// `victim`, and expect the application to see a reset within `limit`,
/// never a clean end.
async fn kill_expecting_reset(mut net: LocalNetwork, victim: usize, limit: Duration) {
    net.start_client(Some(&["relay0", "relay3", "relay6"]), "")
        .expect("client starts");
    let server = testnet::workload_server().await.expect("server");
    let mut s = testnet::endless_download(net.socks_addr(), server)
        .await
        .expect("download request");
    let mut offset = 0;
    read_checked(&mut s, &mut offset, MIB)
        .await
        .expect("before the kill");
    net.relays[victim].kill();
    let t0 = Instant::now();
    let mut buf = vec![0u8; 64 * 1024];
    let ending = tokio::time::timeout(limit, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return Err("a clean end: the truncated download looks whole"),
                Ok(_) => {}
                Err(_) => return Ok(()),
            }
        }
    })
    .await;
    match ending {
        Ok(Ok(())) => eprintln!("kill to reset: {:?}", t0.elapsed()),
        Ok(Err(why)) => panic!("{why}"),
        Err(_) => panic!(
            "no reset within {limit:?}\n{}",
            log_of(net.client.as_ref().expect("client"))
        ),
    }
    net.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_middle_killed_under_the_only_circuit_resets_the_download() {
    let net = network("kill-one", 0.0).await;
    kill_expecting_reset(net, 3, KILL_TO_RESET_LIMIT).await;
}

/// Start an endless download through `net`'s client (configured with
/// `client_config`), read 1 MiB of it, kill relay `victim`, and expect
/// `more` MiB more to arrive intact within `limit`.
async fn kill_expecting_no_loss(
    mut net: LocalNetwork,
    client_config: &str,
    // A datagram set's circuits (MORE has none).
    legs: Option<usize>,
    victim: usize,
    more: u64,
    limit: Duration,
) {
    net.start_client(None, client_config)
        .expect("client starts");
    let server = testnet::workload_server().await.expect("server");
    let mut s = testnet::endless_download(net.socks_addr(), server)
        .await
        .expect("download request");
    let mut offset = 0;
    read_checked(&mut s, &mut offset, MIB)
        .await
        .expect("before the kill");
    net.relays[victim].kill();
    tokio::time::timeout(limit, read_checked(&mut s, &mut offset, more * MIB))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "stalled at {offset} bytes\n{}",
                log_of(net.client.as_ref().expect("client"))
            )
        })
        .expect("after the kill");
    // The set had every circuit asked for (the victim's among them).
    if let Some(legs) = legs {
        let log = log_of(net.client.as_ref().expect("client"));
        let started = format!("legs={legs}");
        assert!(
            log.lines()
                .any(|l| l.contains("datagram set started") && l.contains(&started)),
            "no set of {legs} circuits:\n{log}"
        );
    }
    net.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_middle_killed_under_one_of_three_circuits_costs_no_byte() {
    let net = network("kill-three", 0.0).await;
    // `paths` alone, as the lab writes them: their number is the legs.
    let paths = r#"paths = [["relay0", "relay3", "relay6"], ["relay1", "relay4", "relay6"], ["relay2", "relay5", "relay6"]]"#;
    kill_expecting_no_loss(net, paths, Some(3), 4, 4, Duration::from_secs(60)).await;
}

async fn more_transfer(loss: f64) {
    let mut net = network_of("more", &format!("more-{loss}"), loss).await;
    net.start_client(None, "").expect("client starts");
    let server = testnet::workload_server().await.expect("server");
    let socks = net.socks_addr();
    let client_log = || log_of(net.client.as_ref().expect("client"));
    testnet::download(socks, server, MIB, None)
        .await
        .unwrap_or_else(|e| panic!("download: {e}\n{}", client_log()));
    testnet::upload(socks, server, MIB, None)
        .await
        .unwrap_or_else(|e| panic!("upload: {e}\n{}", client_log()));
    let log = client_log();
    assert!(log.contains("MORE set started"), "no MORE set:\n{log}");
    assert!(
        !log.contains("datagram set started"),
        "circuits under MORE:\n{log}"
    );
    net.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_mib_each_way_over_more() {
    more_transfer(0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_mib_each_way_over_more_through_one_percent_loss() {
    more_transfer(0.01).await;
}

/// Kill to reset over MORE: its set's timeout (15 s without a reply),
/// with room for a loaded machine.
const MORE_KILL_TO_RESET_LIMIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exit_killed_under_more_resets_the_download() {
    // MORE takes only the exit of a pinned path.
    let net = network_of("more", "more-kill-exit", 0.0).await;
    kill_expecting_reset(net, 6, MORE_KILL_TO_RESET_LIMIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_middle_killed_under_more_costs_no_byte() {
    let net = network_of("more", "more-kill-middle", 0.0).await;
    // MORE takes only the exit of a pinned path.
    let path = r#"path = ["relay0", "relay3", "relay6"]"#;
    kill_expecting_no_loss(net, path, None, 3, 2, Duration::from_secs(90)).await;
}

/// The exit (relay6) under a memory cap of 1.5 MiB: new streams are
/// admitted while the datagram engine stays under 3/4 of it, which is
/// room for three streams' buffers (320 KiB each) beside the rest of what
/// it holds. Three endless downloads run; a fourth is refused (the SOCKS
/// request fails, within seconds, while the three go on); when one of
/// the three ends, a new stream opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exits_memory_cap_refuses_the_datagram_streams_that_do_not_fit() {
    let dir = std::env::temp_dir().join(format!("onionlab-datagram-{}-memory", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut net = LocalNetwork::init(&bin(), &dir, 7, 1).expect("network init");
    net.remove_when_done();
    net.set_transport("datagram").expect("transport");
    net.set_log_filter("info,onionlab_node::dgram=debug,onionlab_client::dgram=debug");
    net.set_relay_config(6, "max_mem_in_queues = 1572864")
        .expect("the exit's cap");
    net.start_relays().expect("relays start");
    net.start_client(Some(&["relay0", "relay3", "relay6"]), "")
        .expect("client starts");
    let server = testnet::workload_server().await.expect("server");
    let socks = net.socks_addr();
    let client_log = |net: &LocalNetwork| log_of(net.client.as_ref().expect("client"));
    let mut running = Vec::new();
    for i in 0..3 {
        let mut s = testnet::endless_download(socks, server)
            .await
            .unwrap_or_else(|e| panic!("download {i}: {e}\n{}", client_log(&net)));
        let mut offset = 0;
        read_checked(&mut s, &mut offset, 64 * 1024)
            .await
            .unwrap_or_else(|e| panic!("download {i}: {e}"));
        running.push((s, offset));
    }
    let refused = tokio::time::timeout(
        Duration::from_secs(20),
        testnet::endless_download(socks, server),
    )
    .await
    .expect("the fourth stream neither opened nor failed within 20 s");
    assert!(refused.is_err(), "a fourth stream opened under the cap");
    // The three go on.
    for (s, offset) in &mut running {
        read_checked(s, offset, 64 * 1024)
            .await
            .expect("after the refusal");
    }
    // One ends: its room comes back, within the lanes' close and the
    // exit's next look at its memory.
    drop(running.pop());
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut reopened = loop {
        match testnet::endless_download(socks, server).await {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                eprintln!("not yet: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("no room came back: {e}\n{}", client_log(&net)),
        }
    };
    let mut offset = 0;
    read_checked(&mut reopened, &mut offset, 64 * 1024)
        .await
        .expect("the new stream");
    net.stop();
}

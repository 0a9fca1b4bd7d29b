//! End to end with real processes on 127.0.0.1: `onionlab network init`,
//! three relays (one exit), a client, and a local TCP server.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use onionlab_testnet::{self as testnet, LocalNetwork};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MIB: u64 = 1 << 20;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_onionlab"))
}

/// A fresh directory under the target dir, named after the test.
fn workdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("onionlab-e2e-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    dir
}

/// A 3-relay network whose nodes open links with `transport`; relays log
/// each channel's transport.
fn network(name: &str, transport: &str) -> LocalNetwork {
    let dir = workdir(&format!("{name}-{transport}"));
    let mut net = LocalNetwork::init(&bin(), &dir, 3, 1).expect("network init");
    net.remove_when_done();
    net.set_transport(transport).expect("transport");
    net.set_log_filter("info,onionlab_node::relay=debug");
    net.start_relays().expect("relays start");
    net
}

/// The suite runs unchanged over every transport: `transports!(test_fn)`
/// makes one test per transport, in a module named after the test.
macro_rules! transports {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tls() {
                super::$name("tls").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn quic() {
                super::$name("quic").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn quic_conn_per_circuit() {
                super::$name("quic-conn-per-circuit").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn pctcp() {
                super::$name("pctcp").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn torchestra() {
                super::$name("torchestra").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn dtls_utcp() {
                super::$name("dtls-utcp").await
            }
            // The test-only transport (a module and a registry line, see
            // onionlab_transport::plain): the seam takes a new transport.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn plain() {
                super::$name("plain").await
            }
        }
    )*};
}

transports!(
    twenty_mib_each_way_arrives_intact,
    twenty_parallel_streams_on_shared_and_isolated_circuits,
    a_relay_with_the_wrong_identity_key_is_refused,
    garbage_and_malformed_cells_at_a_relay_do_not_disturb_a_transfer,
    curl_fetches_a_file_through_the_socks_proxy,
    sixty_circuits_opened_at_once_are_all_served,
);

/// Assert that the middle relay's channels used `transport`.
fn assert_channels_used(net: &LocalNetwork, transport: &str) {
    let log = log_of(&net.relays[1]);
    let want = format!("transport=\"{transport}\"");
    assert!(
        log.contains(&want),
        "the middle relay opened no {transport} channel:\n{log}"
    );
    for other in onionlab_transport::TransportKind::names() {
        if other != transport {
            let bad = format!("transport=\"{other}\"");
            assert!(
                !log.contains(&bad),
                "a {other} channel under {transport}:\n{log}"
            );
        }
    }
}

fn log_of(p: &testnet::NodeProcess) -> String {
    fs::read_to_string(&p.log).unwrap_or_default()
}

async fn twenty_mib_each_way_arrives_intact(transport: &str) {
    let mut net = network("bulk", transport);
    net.start_client(None, "").expect("client starts");
    let server = testnet::workload_server().await.expect("server");
    let socks = net.socks_addr();
    let t = testnet::download(socks, server, 20 * MIB, None)
        .await
        .unwrap_or_else(|e| panic!("download: {e}\n{}", log_of(net.client.as_ref().unwrap())));
    assert!(t.last_byte > Duration::ZERO);
    testnet::upload(socks, server, 20 * MIB, None)
        .await
        .unwrap_or_else(|e| panic!("upload: {e}"));
    assert_channels_used(&net, transport);
}

async fn twenty_parallel_streams_on_shared_and_isolated_circuits(transport: &str) {
    let mut net = network("parallel", transport);
    // The client fetches the network document from a directory server.
    let dir_port = testnet::free_port_range(1).expect("port");
    let dir_addr = SocketAddr::from(([127, 0, 0, 1], dir_port));
    let doc = net.dir.join("network.doc").to_string_lossy().into_owned();
    let key = net
        .dir
        .join("network-key.pub")
        .to_string_lossy()
        .into_owned();
    let mut directory = net
        .spawn(
            "directory",
            &[
                "directory",
                "--doc",
                &doc,
                "--network-key",
                &key,
                "--listen",
                &dir_addr.to_string(),
            ],
            dir_addr,
        )
        .expect("directory");
    let client_toml = net.dir.join("client.toml");
    let text = fs::read_to_string(&client_toml).expect("client.toml");
    let text = text.replace(
        "network = \"network.doc\"",
        &format!("network = \"http://{dir_addr}/network.doc\""),
    );
    fs::write(&client_toml, text).expect("write client.toml");
    // The directory must be up before the client fetches.
    for _ in 0..200 {
        if std::net::TcpStream::connect(dir_addr).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    net.start_client(None, "").expect("client starts");

    let server = testnet::workload_server().await.expect("server");
    let socks = net.socks_addr();
    let mut tasks = Vec::new();
    for i in 0..20 {
        tasks.push(tokio::spawn(async move {
            let user = format!("user{i}");
            // Streams 0-9 share (no auth); 10-19 each get their own circuit.
            let auth = (i >= 10).then_some((user.as_str(), "pw"));
            testnet::download(socks, server, MIB + i as u64 * 4099, auth).await
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        t.await
            .expect("task")
            .unwrap_or_else(|e| panic!("stream {i}: {e}"));
    }
    let log = log_of(net.client.as_ref().expect("client"));
    let built = log.matches("circuit built").count();
    assert!(
        (11..=20).contains(&built),
        "10 isolated credentials plus the shared streams need 11 or more circuits (allowing a few \
         extra shared ones), got {built}:\n{log}"
    );
    directory.stop();
}

async fn a_relay_with_the_wrong_identity_key_is_refused(transport: &str) {
    let dir = workdir(&format!("wrong-identity-{transport}"));
    let mut net = LocalNetwork::init(&bin(), &dir, 3, 1).expect("network init");
    net.remove_when_done();
    net.set_transport(transport).expect("transport");
    // relay1 runs with relay0's keys: it claims to be someone else.
    fs::copy(
        dir.join("relays/relay0/keys.secret"),
        dir.join("relays/relay1/keys.secret"),
    )
    .expect("copy keys");
    net.start_relays().expect("relays start");
    net.start_client(Some(&["relay1", "relay0", "relay2"]), "build_retries = 0\n")
        .expect("client starts");
    let server = testnet::workload_server().await.expect("server");
    let r = testnet::download(net.socks_addr(), server, 1000, None).await;
    assert!(r.is_err(), "a circuit through an impostor guard must fail");
    let log = log_of(net.client.as_ref().expect("client"));
    assert!(
        log.contains("refused") && log.contains("expected"),
        "the client log must say why:\n{log}"
    );
}

#[test]
fn a_tampered_network_document_is_refused() {
    let dir = workdir("tampered");
    let mut net = LocalNetwork::init(&bin(), &dir, 3, 1).expect("network init");
    net.remove_when_done();
    let path = dir.join("network.doc");
    let text = fs::read_to_string(&path).expect("doc");
    let tampered = text.replacen("bandwidth = 1000", "bandwidth = 9000", 1);
    assert_ne!(text, tampered, "the test must change the document");
    fs::write(&path, tampered).expect("write");
    for args in [
        vec![
            "relay".to_string(),
            "--config".into(),
            path_str(&net.relay_config(0)),
        ],
        vec![
            "client".to_string(),
            "--config".into(),
            path_str(&dir.join("client.toml")),
        ],
    ] {
        let out = Command::new(bin())
            .args(&args)
            .output()
            .expect("run onionlab");
        assert!(
            !out.status.success(),
            "{args:?} accepted a tampered document"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("signature"), "{args:?}: unclear error: {err}");
    }
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

async fn garbage_and_malformed_cells_at_a_relay_do_not_disturb_a_transfer(transport: &str) {
    let mut net = network("garbage", transport);
    net.start_client(Some(&["relay0", "relay1", "relay2"]), "")
        .expect("client starts");
    let server = testnet::workload_server().await.expect("server");
    let socks = net.socks_addr();
    let transfer = tokio::spawn(testnet::download(socks, server, 20 * MIB, None));

    let middle = net.relay_addr(1);
    // The QUIC endpoint shares the port number (UDP).
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    let mut seed = 0x1234_5678_u32;
    for round in 0..40 {
        // Random datagrams, and a QUIC-looking long header, at the QUIC
        // endpoint.
        let junk: Vec<u8> = (0..1200)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                seed as u8
            })
            .collect();
        let _ = udp.send_to(&junk, middle);
        let mut initial = junk.clone();
        initial[..5].copy_from_slice(&[0xc3, 0, 0, 0, 1]);
        let _ = udp.send_to(&initial, middle);
        // Raw random bytes where TLS is expected.
        if let Ok(mut s) = tokio::net::TcpStream::connect(middle).await {
            let junk: Vec<u8> = (0..2048)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    seed as u8
                })
                .collect();
            let _ = s.write_all(&junk).await;
            let mut sink = [0u8; 256];
            let _ = tokio::time::timeout(Duration::from_millis(20), s.read(&mut sink)).await;
        }
        // A truncated TLS ClientHello.
        if round % 4 == 0 {
            if let Ok(mut s) = tokio::net::TcpStream::connect(middle).await {
                let _ = s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    transfer
        .await
        .expect("task")
        .unwrap_or_else(|e| panic!("transfer disturbed: {e}"));
    // And the middle relay is still serving new circuits.
    testnet::download(socks, server, MIB, Some(("fresh", "circuit")))
        .await
        .expect("a new circuit through the attacked relay");
}

/// Sixty isolated streams at once: sixty circuits, which per-circuit
/// transports (pctcp, QUIC connection per circuit) open as sixty
/// connections from the client to the guard and from relay to relay
/// within a second. Relays' addresses are exempt from the per-address
/// connection rate (burst 40), so none is refused.
async fn sixty_circuits_opened_at_once_are_all_served(transport: &str) {
    let mut net = network("sixty", transport);
    net.start_client(Some(&["relay0", "relay1", "relay2"]), "")
        .expect("client starts");
    let server = testnet::workload_server().await.expect("server");
    let socks = net.socks_addr();
    let downloads: Vec<_> = (0..60)
        .map(|i| {
            tokio::spawn(async move {
                let user = format!("user{i}");
                testnet::download(socks, server, 64 * 1024, Some((&user, "x"))).await
            })
        })
        .collect();
    for (i, d) in downloads.into_iter().enumerate() {
        d.await.expect("task").unwrap_or_else(|e| {
            panic!(
                "download {i}: {e}\nguard:\n{}\nmiddle:\n{}",
                log_of(&net.relays[0]),
                log_of(&net.relays[1])
            )
        });
    }
    for relay in &net.relays {
        assert!(
            !log_of(relay).contains("denial-of-service limit"),
            "a relay refused the network's own connections:\n{}",
            log_of(relay)
        );
    }
}

/// A one-file HTTP/1.0 server for curl.
async fn http_file_server(body: Vec<u8>) -> SocketAddr {
    let l = tokio::net::TcpListener::bind((testnet::TARGET_IP, 0))
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let head = format!(
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(&body).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

async fn curl_fetches_a_file_through_the_socks_proxy(transport: &str) {
    let curl_ok = Command::new("curl")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(curl_ok, "curl is required (scripts/test.sh installs it)");
    let mut net = network("curl", transport);
    net.start_client(None, "").expect("client starts");
    let mut body = vec![0u8; 3 * MIB as usize + 17];
    testnet::fill_pattern(0, &mut body);
    let http = http_file_server(body.clone()).await;
    let out_file = net.dir.join("fetched.bin");
    let url = format!("http://{http}/file.bin");
    let socks = net.socks_addr();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("curl")
            .args(["--silent", "--show-error", "--max-time", "60"])
            .arg("--socks5-hostname")
            .arg(socks.to_string())
            .arg("-o")
            .arg(&out_file)
            .arg(&url)
            .output()
    })
    .await
    .expect("join")
    .expect("run curl");
    assert!(
        out.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fetched = fs::read(net.dir.join("fetched.bin")).expect("fetched file");
    assert!(
        fetched == body,
        "curl's file differs ({} bytes)",
        fetched.len()
    );
}

/// `(transport, peer address, is a relay)` of every "channel open with"
/// line of a relay log: `channel open with relay1 at ADDR over quic ...` or
/// `channel open with a client over tls ...` (no address: client addresses
/// stay out of INFO logs).
fn channels_opened(p: &testnet::NodeProcess) -> Vec<(String, String, bool)> {
    log_of(p)
        .lines()
        .filter_map(|l| l.split_once("channel open with ").map(|(_, rest)| rest))
        .map(|rest| {
            let words: Vec<&str> = rest.split_whitespace().collect();
            match words.as_slice() {
                ["a", "client", "over", transport, ..] => {
                    (transport.to_string(), String::new(), false)
                }
                [_nick, "at", addr, "over", transport, ..] => {
                    (transport.to_string(), addr.to_string(), true)
                }
                _ => panic!("unexpected channel line: {rest}"),
            }
        })
        .collect()
}

/// Torchestra with real processes: one bulk circuit among light ones
/// (each its own circuit, by SOCKS credentials), a 200 ms classification
/// window, and no circuit left out as very light (on loopback the light
/// circuits carry a thousandth of the bulk one's cells, which the thesis's
/// 0.9 would leave out, leaving the bulk circuit alone at its fair share).
/// The exit moves the bulk circuit to the heavy connection with
/// the propagate flag, the middle moves it on its link to the entrance,
/// and every byte of every transfer arrives intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torchestra_moves_a_bulk_circuit_to_the_heavy_connections() {
    let dir = workdir("torchestra-moves");
    let mut net = LocalNetwork::init(&bin(), &dir, 3, 1).expect("network init");
    net.remove_when_done();
    net.set_transport("torchestra").expect("transport");
    for i in 0..3 {
        net.set_relay_config(i, "[torchestra]\nwindow_ms = 200\nthresh_verylight = 1.0\n")
            .expect("window");
    }
    net.set_log_filter("info,onionlab_node::relay=debug,onionlab_transport::torchestra=debug");
    net.start_relays().expect("relays start");
    net.start_client(Some(&["relay0", "relay1", "relay2"]), "")
        .expect("client starts");
    let server = testnet::workload_server().await.expect("server");
    let socks = net.socks_addr();
    // A bulk circuit that keeps the link busy for a few windows.
    let bulk = async {
        use tokio::io::AsyncReadExt;
        let mut conn = testnet::endless_download(socks, server)
            .await
            .expect("bulk download starts");
        let mut buf = vec![0u8; 64 * 1024];
        let until = tokio::time::Instant::now() + Duration::from_secs(3);
        while tokio::time::Instant::now() < until {
            let n = conn.read(&mut buf).await.expect("bulk data");
            assert!(n > 0, "the bulk download ended");
        }
    };
    let light = async {
        for round in 0..12u32 {
            for user in ["l1", "l2", "l3"] {
                testnet::download(socks, server, 20 * 1024, Some((user, "x")))
                    .await
                    .unwrap_or_else(|e| panic!("light {user} round {round}: {e}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::join!(bulk, light);
    // Whatever moved, every byte still arrives, both ways.
    testnet::download(socks, server, 5 * MIB, None)
        .await
        .unwrap_or_else(|e| panic!("download after the switches: {e}"));
    testnet::upload(socks, server, 5 * MIB, None)
        .await
        .unwrap_or_else(|e| panic!("upload after the switches: {e}"));
    let exit = log_of(&net.relays[2]);
    let middle = log_of(&net.relays[1]);
    assert!(
        exit.contains("torchestra: moving a circuit") && exit.contains("propagate=true"),
        "the exit moved nothing:\n{exit}"
    );
    assert!(
        middle.contains("torchestra: moving a circuit") && middle.contains("propagate=false"),
        "the middle passed no switch on:\n{middle}"
    );
    assert!(!exit.contains("transport violation") && !middle.contains("transport violation"));
    // Only the bulk circuit went heavy.
    let heavy: std::collections::BTreeSet<&str> = exit
        .lines()
        .filter(|l| l.contains("torchestra: moving a circuit") && l.contains("heavy=true"))
        .filter_map(|l| l.split("circ_id=").nth(1)?.split(' ').next())
        .collect();
    assert_eq!(
        heavy.len(),
        1,
        "circuits moved to heavy at the exit: {heavy:?}"
    );
    net.stop();
    let _ = fs::remove_dir_all(&dir);
}

/// A 3-relay network in `workdir(name)` whose nodes open links with the
/// given transports (`None`: the client), logging with `log_filter`, after
/// 5 MiB downloaded and 5 MiB uploaded intact over relay0, relay1, relay2.
async fn mixed_circuit_round_trip(
    name: &str,
    transports: &[(Option<usize>, &str)],
    log_filter: &str,
) -> (LocalNetwork, PathBuf) {
    let dir = workdir(name);
    let mut net = LocalNetwork::init(&bin(), &dir, 3, 1).expect("network init");
    net.remove_when_done();
    for &(node, transport) in transports {
        net.set_node_transport(node, transport).expect("transport");
    }
    net.set_log_filter(log_filter);
    net.start_relays().expect("relays start");
    net.start_client(Some(&["relay0", "relay1", "relay2"]), "")
        .expect("client starts");
    let server = testnet::workload_server().await.expect("server");
    let socks = net.socks_addr();
    testnet::download(socks, server, 5 * MIB, None)
        .await
        .unwrap_or_else(|e| panic!("download: {e}\n{}", log_of(net.client.as_ref().unwrap())));
    testnet::upload(socks, server, 5 * MIB, None)
        .await
        .unwrap_or_else(|e| panic!("upload: {e}"));
    (net, dir)
}

/// A circuit over torchestra, pctcp and QUIC hops: client->relay0
/// torchestra (a client's link: no heavy connection), relay0->relay1
/// torchestra (relays: its heavy connection opens), relay1->relay2 pctcp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_torchestra_torchestra_pctcp_circuit_moves_data_intact() {
    let (mut net, dir) = mixed_circuit_round_trip(
        "mixed-torchestra-pctcp",
        &[
            (None, "torchestra"),
            (Some(0), "torchestra"),
            (Some(1), "pctcp"),
            (Some(2), "quic"),
        ],
        "info,onionlab_node::relay=debug,onionlab_transport=debug",
    )
    .await;
    let relay_addr = |i: usize| net.relay_addr(i).to_string();
    let r0 = channels_opened(&net.relays[0]);
    assert!(
        r0.iter().any(|(t, _, relay)| t == "torchestra" && !relay),
        "no torchestra channel from the client at relay0"
    );
    assert!(
        r0.iter()
            .any(|(t, p, _)| t == "torchestra" && *p == relay_addr(1)),
        "no torchestra channel from relay0 to relay1"
    );
    let r1 = channels_opened(&net.relays[1]);
    assert!(
        r1.iter()
            .any(|(t, p, _)| t == "pctcp" && *p == relay_addr(2)),
        "no pctcp channel from relay1 to relay2"
    );
    // Only the relays' link got a heavy connection: relay0 opened it,
    // relay1 accepted it; the client's link has none.
    let heavy = |i: usize| {
        log_of(&net.relays[i])
            .matches("torchestra heavy connection up")
            .count()
    };
    assert_eq!((heavy(0), heavy(1), heavy(2)), (1, 1, 0));
    net.stop();
    let _ = fs::remove_dir_all(&dir);
}

/// A circuit over pctcp, QUIC and pctcp hops: client->relay0 pctcp (the
/// client opens a lane per circuit to its guard), relay0->relay1 QUIC,
/// relay1->relay2 pctcp; relay0 and relay2 accept the lanes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_pctcp_quic_pctcp_circuit_moves_data_intact() {
    let (mut net, dir) = mixed_circuit_round_trip(
        "mixed-pctcp-quic-pctcp",
        &[(None, "pctcp"), (Some(0), "quic"), (Some(1), "pctcp")],
        "info,onionlab_node::relay=debug,onionlab_transport::lanes=debug",
    )
    .await;
    let relay_addr = |i: usize| net.relay_addr(i).to_string();
    let r0 = channels_opened(&net.relays[0]);
    assert!(
        r0.iter().any(|(t, _, relay)| t == "pctcp" && !relay),
        "no pctcp channel from the client at relay0:\n{}",
        log_of(&net.relays[0])
    );
    assert!(
        r0.iter()
            .any(|(t, p, _)| t == "quic" && *p == relay_addr(1)),
        "no QUIC channel from relay0 to relay1"
    );
    let r1 = channels_opened(&net.relays[1]);
    assert!(
        r1.iter()
            .any(|(t, p, _)| t == "pctcp" && *p == relay_addr(2)),
        "no pctcp channel from relay1 to relay2:\n{}",
        log_of(&net.relays[1])
    );
    // The lanes: accepted by relay0 (from the client) and relay2.
    for i in [0, 2] {
        assert!(
            log_of(&net.relays[i]).contains("pctcp lane accepted"),
            "relay{i} accepted no lane:\n{}",
            log_of(&net.relays[i])
        );
    }
    assert!(log_of(&net.relays[1]).contains("pctcp lane opened"));
    net.stop();
    let _ = fs::remove_dir_all(&dir);
}

/// A circuit over dtls-utcp, TLS and dtls-utcp hops: client->relay0
/// dtls-utcp (an anonymous session), relay0->relay1 TLS, relay1->relay2
/// dtls-utcp (authenticated both ways); every relay advertises both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_utcp_tls_utcp_circuit_moves_data_intact() {
    let (mut net, dir) = mixed_circuit_round_trip(
        "mixed-utcp-tls-utcp",
        &[
            (None, "dtls-utcp"),
            (Some(0), "tls"),
            (Some(1), "dtls-utcp"),
        ],
        "info,onionlab_node::relay=debug",
    )
    .await;
    let relay_addr = |i: usize| net.relay_addr(i).to_string();
    let r0 = channels_opened(&net.relays[0]);
    assert!(
        r0.iter().any(|(t, _, relay)| t == "dtls-utcp" && !relay),
        "no dtls-utcp channel from the client at relay0:\n{}",
        log_of(&net.relays[0])
    );
    assert!(
        r0.iter().any(|(t, p, _)| t == "tls" && *p == relay_addr(1)),
        "no TLS channel from relay0 to relay1"
    );
    assert!(
        channels_opened(&net.relays[1])
            .iter()
            .any(|(t, _, relay)| t == "dtls-utcp" && *relay),
        "no dtls-utcp channel from relay1 to relay2:\n{}",
        log_of(&net.relays[1])
    );
    net.stop();
    let _ = fs::remove_dir_all(&dir);
}

/// A circuit whose hops use different transports: client->relay0 QUIC,
/// relay0->relay1 TLS, relay1->relay2 QUIC. Each node's `transport` forces
/// the links it opens; every relay advertises and accepts both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_quic_tls_quic_circuit_moves_data_intact() {
    let (mut net, dir) = mixed_circuit_round_trip(
        "mixed-quic-tls-quic",
        &[
            (None, "quic"),
            (Some(0), "tls"),
            (Some(1), "quic"),
            (Some(2), "tls"),
        ],
        "info,onionlab_node::relay=debug",
    )
    .await;

    let relay_addr = |i: usize| net.relay_addr(i).to_string();
    let logs = |i: usize| log_of(&net.relays[i]);
    // relay0: the client's channel (anonymous) is QUIC, its own channel
    // to relay1 is TLS.
    let r0 = channels_opened(&net.relays[0]);
    assert!(
        r0.iter().any(|(t, _, relay)| t == "quic" && !relay),
        "no QUIC channel from the client at relay0:\n{}",
        logs(0)
    );
    assert!(
        r0.iter().any(|(t, p, _)| t == "tls" && *p == relay_addr(1)),
        "no TLS channel from relay0 to relay1:\n{}",
        logs(0)
    );
    for (t, p, relay) in &r0 {
        let want = if *relay { "tls" } else { "quic" };
        assert_eq!(t, want, "relay0's channel with {p} (relay: {relay})");
    }
    // relay1: relay0's channel is TLS, its own channel to relay2 QUIC.
    let r1 = channels_opened(&net.relays[1]);
    assert!(
        r1.iter()
            .any(|(t, p, relay)| t == "quic" && *relay && *p == relay_addr(2)),
        "no QUIC channel from relay1 to relay2:\n{}",
        logs(1)
    );
    assert!(
        r1.iter()
            .any(|(t, p, relay)| t == "tls" && *relay && *p != relay_addr(2)),
        "no TLS channel from relay0 at relay1:\n{}",
        logs(1)
    );
    for (t, p, _) in &r1 {
        let want = if *p == relay_addr(2) { "quic" } else { "tls" };
        assert_eq!(t, want, "relay1's channel with {p}");
    }
    // relay2: only relay1's QUIC channel (from relay1's one UDP socket).
    let r2 = channels_opened(&net.relays[2]);
    assert!(
        r2.iter()
            .any(|(t, p, relay)| t == "quic" && *relay && *p == relay_addr(1)),
        "no QUIC channel from relay1 at relay2:\n{}",
        logs(2)
    );
    for (t, p, _) in &r2 {
        assert_eq!(t, "quic", "relay2's channel with {p}");
    }
    net.stop();
    let _ = fs::remove_dir_all(&dir);
}

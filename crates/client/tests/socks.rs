//! The client end to end on loopback: SOCKS5 in, circuits through test
//! relays (sans-IO `RelayNode`s behind TLS listeners), a TCP echo server as
//! the target.

mod common;

use std::future::Future;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use common::{echo_roundtrip, pattern, socks_connect, Dest, Network, RelaySpec};
use onionlab_client::{Client, ClientSettings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn settings(net: &Network, path: Option<&[&str]>) -> ClientSettings {
    let mut s = ClientSettings::new("127.0.0.1:0".parse().expect("addr"), net.doc.clone());
    s.policy.path = path.map(|p| p.iter().map(|n| n.to_string()).collect());
    s.policy.circuit_build_timeout = Duration::from_secs(5);
    s.policy.build_retries = 1;
    s
}

/// Run the client with `settings` while `body` runs with its SOCKS
/// address; then shut it down.
async fn with_client<F, Fut>(settings: ClientSettings, body: F)
where
    F: FnOnce(SocketAddr) -> Fut,
    Fut: Future<Output = ()>,
{
    let client = Client::bind(settings).await.expect("bind");
    let addr = client.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = client.run(async {
        let _ = stopped.await;
    });
    let test = async {
        body(addr).await;
        let _ = stop.send(());
    };
    let (r, ()) = tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(run, test) })
        .await
        .expect("test took too long");
    r.expect("client run");
}

#[tokio::test]
async fn ipv4_connect_over_three_random_hops_moves_one_mib_intact() {
    common::init_logs();
    // One guard, one middle, one exit: path selection has one answer, and
    // the circuit is extended twice.
    let net = Network::start(&[RelaySpec::guard(), RelaySpec::middle(), RelaySpec::exit()]);
    let echo = common::echo_server().await;
    with_client(settings(&net, None), |socks| async move {
        let mut s = socks_connect(socks, Dest::Ip(echo), None)
            .await
            .expect("connected");
        let data = pattern(1 << 20, 1);
        let got = echo_roundtrip(&mut s, &data).await;
        assert!(got == data, "1 MiB came back intact");
        assert_eq!(net.circuits_at(0), 1);
        assert_eq!(net.circuits_at(1), 1);
        assert_eq!(net.circuits_at(2), 1);
        // Closing our side ends the stream; the circuit stays for reuse.
        drop(s);
        let mut s = socks_connect(socks, Dest::Ip(echo), None)
            .await
            .expect("second stream");
        assert_eq!(echo_roundtrip(&mut s, b"again").await, b"again");
        assert_eq!(net.circuits_at(0), 1, "the circuit was reused");
    })
    .await;
}

#[tokio::test]
async fn domain_name_target_is_resolved_by_the_exit() {
    common::init_logs();
    let net = Network::start(&[RelaySpec::guard_exit()]);
    let echo = common::echo_server().await;
    with_client(settings(&net, Some(&["relay0"])), |socks| async move {
        let mut s = socks_connect(socks, Dest::Name("localhost", echo.port()), None)
            .await
            .expect("connected");
        let data = pattern(100_000, 2);
        assert!(echo_roundtrip(&mut s, &data).await == data);
    })
    .await;
}

#[tokio::test]
async fn ipv6_target() {
    common::init_logs();
    let Ok(echo) = common::echo_server_on(IpAddr::V6(Ipv6Addr::LOCALHOST)).await else {
        eprintln!("no IPv6 loopback here: skipped");
        return;
    };
    let net = Network::start(&[RelaySpec::guard_exit()]);
    with_client(settings(&net, Some(&["relay0"])), |socks| async move {
        let mut s = socks_connect(socks, Dest::Ip(echo), None)
            .await
            .expect("connected");
        assert_eq!(echo_roundtrip(&mut s, b"over v6").await, b"over v6");
    })
    .await;
}

#[tokio::test]
async fn socks_credentials_isolate_circuits() {
    common::init_logs();
    let net = Network::start(&[RelaySpec::guard_exit()]);
    let echo = common::echo_server().await;
    with_client(settings(&net, Some(&["relay0"])), |socks| async move {
        let mut streams = Vec::new();
        // (credentials, circuits the relay should have after the stream)
        let steps: [(Option<(&str, &str)>, usize); 6] = [
            (Some(("alice", "pw")), 1),
            (Some(("bob", "pw")), 2),
            (Some(("alice", "pw")), 2),
            (Some(("alice", "other")), 3),
            (None, 4),
            (None, 4),
        ];
        for (i, (auth, circuits)) in steps.into_iter().enumerate() {
            let mut s = socks_connect(socks, Dest::Ip(echo), auth)
                .await
                .expect("connected");
            let msg = format!("stream {i}");
            assert_eq!(echo_roundtrip(&mut s, msg.as_bytes()).await, msg.as_bytes());
            assert!(
                net.wait_circuits(0, circuits).await,
                "after stream {i} ({auth:?}): {} circuits, expected {circuits}",
                net.circuits_at(0)
            );
            streams.push(s);
        }
    })
    .await;
}

#[tokio::test]
async fn refused_target_port_gives_reply_05() {
    common::init_logs();
    let net = Network::start(&[RelaySpec::guard_exit()]);
    // A port nobody listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    with_client(settings(&net, Some(&["relay0"])), |socks| async move {
        let r = socks_connect(socks, Dest::Ip(closed), None).await;
        assert_eq!(r.err(), Some(0x05));
        // An unresolvable name: host unreachable.
        let r = socks_connect(socks, Dest::Name("no-such-host.invalid", 80), None).await;
        assert_eq!(r.err(), Some(0x04));
    })
    .await;
}

#[tokio::test]
async fn exit_policy_refusal_gives_reply_02() {
    common::init_logs();
    let mut spec = RelaySpec::guard_exit();
    spec.policy = "accept *:1-1023";
    let net = Network::start(&[spec]);
    let echo = common::echo_server().await;
    with_client(settings(&net, Some(&["relay0"])), |socks| async move {
        let r = socks_connect(socks, Dest::Ip(echo), None).await;
        assert_eq!(r.err(), Some(0x02));
    })
    .await;
}

#[tokio::test]
async fn malformed_requests_get_error_replies_and_leave_other_streams_alone() {
    common::init_logs();
    let net = Network::start(&[RelaySpec::guard_exit()]);
    let echo = common::echo_server().await;
    with_client(settings(&net, Some(&["relay0"])), |socks| async move {
        let mut good = socks_connect(socks, Dest::Ip(echo), None)
            .await
            .expect("connected");
        let data = pattern(1 << 20, 3);
        let half = data.len() / 2;
        assert!(echo_roundtrip(&mut good, &data[..half]).await == data[..half]);

        // Unknown address type 9: 0x08.
        let mut s = TcpStream::connect(socks).await.expect("connect");
        s.write_all(&[5, 1, 0]).await.expect("greeting");
        let mut choice = [0u8; 2];
        s.read_exact(&mut choice).await.expect("choice");
        s.write_all(&[5, 1, 0, 9, 1, 2, 3, 4, 0, 80])
            .await
            .expect("request");
        assert_eq!(common::read_reply(&mut s).await, 0x08);
        assert_eq!(s.read(&mut [0u8; 1]).await.expect("eof"), 0, "closed");

        // BIND: 0x07.
        let mut s = TcpStream::connect(socks).await.expect("connect");
        s.write_all(&[5, 1, 0, 5, 2, 0, 1, 127, 0, 0, 1, 0, 80])
            .await
            .expect("greeting + request");
        let mut choice = [0u8; 2];
        s.read_exact(&mut choice).await.expect("choice");
        assert_eq!(common::read_reply(&mut s).await, 0x07);

        // No acceptable authentication method: 0xFF.
        let mut s = TcpStream::connect(socks).await.expect("connect");
        s.write_all(&[5, 1, 0x80]).await.expect("greeting");
        let mut choice = [0u8; 2];
        s.read_exact(&mut choice).await.expect("choice");
        assert_eq!(choice, [5, 0xFF]);

        // Not SOCKS at all: closed without a reply.
        let mut s = TcpStream::connect(socks).await.expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.expect("http");
        assert_eq!(s.read(&mut [0u8; 16]).await.unwrap_or(0), 0);

        // The first stream goes on.
        assert!(echo_roundtrip(&mut good, &data[half..]).await == data[half..]);
    })
    .await;
}

#[tokio::test]
async fn unreachable_guard_fails_the_stream_with_general_failure() {
    common::init_logs();
    let mut net = Network::start(&[RelaySpec::guard_exit()]);
    let doc = net.doc.clone();
    net.stop();
    let mut s = ClientSettings::new("127.0.0.1:0".parse().expect("addr"), doc);
    s.policy.path = Some(vec!["relay0".into()]);
    s.policy.build_retries = 2;
    with_client(s, |socks| async move {
        let target: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let r = socks_connect(socks, Dest::Ip(target), None).await;
        assert_eq!(r.err(), Some(0x01));
    })
    .await;
}

#[tokio::test]
async fn silent_guard_times_out_with_ttl_expired() {
    common::init_logs();
    let net = Network::start(&[RelaySpec::guard_exit()]);
    // A listener that accepts TCP and never answers the TLS handshake.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let mut doc = net.doc.clone();
    doc.relays[0].addresses[0].addr = silent.local_addr().expect("addr");
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = silent.accept().await {
            conns.push(c);
        }
    });
    let mut s = ClientSettings::new("127.0.0.1:0".parse().expect("addr"), doc);
    s.policy.path = Some(vec!["relay0".into()]);
    s.policy.circuit_build_timeout = Duration::from_millis(300);
    s.policy.build_retries = 1;
    with_client(s, |socks| async move {
        let target: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let started = std::time::Instant::now();
        let r = socks_connect(socks, Dest::Ip(target), None).await;
        assert_eq!(r.err(), Some(0x06));
        assert!(started.elapsed() < Duration::from_secs(3));
    })
    .await;
    held.abort();
}

#[tokio::test]
async fn a_dying_guard_closes_its_streams() {
    common::init_logs();
    let mut net = Network::start(&[RelaySpec::guard_exit()]);
    let echo = common::echo_server().await;
    let doc = net.doc.clone();
    let mut settings = ClientSettings::new("127.0.0.1:0".parse().expect("addr"), doc);
    settings.policy.path = Some(vec!["relay0".into()]);
    let client = Client::bind(settings).await.expect("bind");
    let socks = client.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = client.run(async {
        let _ = stopped.await;
    });
    let test = async {
        let mut s = socks_connect(socks, Dest::Ip(echo), None)
            .await
            .expect("connected");
        assert_eq!(echo_roundtrip(&mut s, b"hello").await, b"hello");
        net.stop();
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut [0u8; 16]))
            .await
            .expect("closed in time")
            .unwrap_or(0);
        assert_eq!(n, 0, "the application sees the stream close");
        let _ = stop.send(());
    };
    let (r, ()) = tokio::join!(run, test);
    r.expect("run");
}

#[tokio::test]
async fn unknown_pinned_relay_is_an_error_at_bind() {
    let net = Network::start(&[RelaySpec::guard_exit()]);
    let err = Client::bind(settings(&net, Some(&["relay0", "nobody"])))
        .await
        .expect_err("unknown relay");
    let msg = err.to_string();
    assert!(msg.contains("nobody"), "{msg}");
}

#[tokio::test]
async fn simultaneous_streams_share_one_circuit_and_move_data_in_parallel() {
    common::init_logs();
    let net = Network::start(&[RelaySpec::guard(), RelaySpec::middle(), RelaySpec::exit()]);
    let echo = common::echo_server().await;
    with_client(settings(&net, None), |socks| async move {
        // Five streams asked for at once, before any circuit exists: they
        // wait for the same circuit being built.
        let tasks: Vec<_> = (0..5u8)
            .map(|i| {
                tokio::spawn(async move {
                    let mut s = socks_connect(socks, Dest::Ip(echo), None)
                        .await
                        .expect("connected");
                    let data = pattern(256 * 1024, i);
                    let got = echo_roundtrip(&mut s, &data).await;
                    assert!(got == data, "stream {i} intact");
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("stream task");
        }
        assert_eq!(net.circuits_at(0), 1, "one circuit for all");
    })
    .await;
}

#[tokio::test]
async fn dirty_circuits_take_no_new_streams_and_close_with_their_last_stream() {
    common::init_logs();
    let net = Network::start(&[RelaySpec::guard_exit()]);
    let echo = common::echo_server().await;
    let mut s = settings(&net, Some(&["relay0"]));
    s.policy.max_circuit_dirtiness = Duration::from_millis(300);
    with_client(s, |socks| async move {
        let mut first = socks_connect(socks, Dest::Ip(echo), None)
            .await
            .expect("connected");
        assert_eq!(echo_roundtrip(&mut first, b"1").await, b"1");
        assert!(net.wait_circuits(0, 1).await);
        tokio::time::sleep(Duration::from_millis(400)).await;
        let mut second = socks_connect(socks, Dest::Ip(echo), None)
            .await
            .expect("connected");
        assert_eq!(echo_roundtrip(&mut second, b"2").await, b"2");
        assert!(net.wait_circuits(0, 2).await, "a new circuit");
        // The old circuit is used by `first` only: it goes with it.
        drop(first);
        assert!(net.wait_circuits(0, 1).await, "the dirty circuit closed");
        assert_eq!(echo_roundtrip(&mut second, b"3").await, b"3");
    })
    .await;
}

#[tokio::test]
async fn target_close_reaches_the_application_after_the_data() {
    common::init_logs();
    let net = Network::start(&[RelaySpec::guard_exit()]);
    let data = pattern(300_000, 4);
    let server = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let target = server.local_addr().expect("addr");
    let sent = data.clone();
    tokio::spawn(async move {
        let (mut c, _) = server.accept().await.expect("accept");
        c.write_all(&sent).await.expect("write");
        c.shutdown().await.expect("shutdown");
    });
    with_client(settings(&net, Some(&["relay0"])), |socks| async move {
        let mut s = socks_connect(socks, Dest::Ip(target), None)
            .await
            .expect("connected");
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
            .await
            .expect("EOF in time")
            .expect("read");
        assert!(got == data, "all {} bytes, then EOF", data.len());
    })
    .await;
}

#[tokio::test]
async fn shutdown_destroys_every_circuit() {
    common::init_logs();
    let net = Network::start(&[RelaySpec::guard(), RelaySpec::middle(), RelaySpec::exit()]);
    let echo = common::echo_server().await;
    let relays = &net;
    with_client(settings(&net, None), |socks| async move {
        let mut s = socks_connect(socks, Dest::Ip(echo), Some(("a", "b")))
            .await
            .expect("connected");
        assert_eq!(echo_roundtrip(&mut s, b"x").await, b"x");
        let mut t = socks_connect(socks, Dest::Ip(echo), None)
            .await
            .expect("connected");
        assert_eq!(echo_roundtrip(&mut t, b"y").await, b"y");
        assert!(relays.wait_circuits(2, 2).await);
    })
    .await;
    for i in 0..3 {
        assert!(net.wait_circuits(i, 0).await, "relay{i} still has circuits");
    }
}

#[tokio::test]
async fn socks4a_connect_comes_for_free() {
    common::init_logs();
    let net = Network::start(&[RelaySpec::guard_exit()]);
    let echo = common::echo_server().await;
    with_client(settings(&net, Some(&["relay0"])), |socks| async move {
        let mut s = TcpStream::connect(socks).await.expect("connect");
        let mut req = vec![4, 1];
        req.extend_from_slice(&echo.port().to_be_bytes());
        req.extend_from_slice(&[0, 0, 0, 1, 0]);
        req.extend_from_slice(b"localhost\0");
        s.write_all(&req).await.expect("request");
        let mut reply = [0u8; 8];
        s.read_exact(&mut reply).await.expect("reply");
        assert_eq!(reply[..2], [0, 0x5A]);
        assert_eq!(echo_roundtrip(&mut s, b"socks4a").await, b"socks4a");
    })
    .await;
}

#[tokio::test]
async fn a_target_that_does_not_read_stalls_the_application() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    common::init_logs();
    let net = Network::start(&[RelaySpec::guard_exit()]);
    // A target that accepts and never reads.
    let sink = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let target = sink.local_addr().expect("addr");
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = sink.accept().await {
            conns.push(c);
        }
    });
    const LIMIT: usize = 64 << 20;
    with_client(settings(&net, Some(&["relay0"])), |socks| async move {
        let mut s = socks_connect(socks, Dest::Ip(target), None)
            .await
            .expect("connected");
        let written = Arc::new(AtomicUsize::new(0));
        let counter = written.clone();
        let writer = tokio::spawn(async move {
            let chunk = vec![7u8; 64 * 1024];
            while counter.load(Ordering::SeqCst) < LIMIT {
                if s.write_all(&chunk).await.is_err() {
                    break;
                }
                counter.fetch_add(chunk.len(), Ordering::SeqCst);
            }
        });
        // Wait until the writer makes no progress for 500 ms.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut last = usize::MAX;
        let mut still = 0;
        while still < 5 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = written.load(Ordering::SeqCst);
            still = if now == last { still + 1 } else { 0 };
            last = now;
        }
        let total = written.load(Ordering::SeqCst);
        eprintln!("the application's writes stalled after {total} bytes");
        assert!(still >= 5, "the writer never stalled ({total} bytes)");
        assert!(
            total < LIMIT,
            "{total} bytes accepted: back-pressure does not reach the application"
        );
        writer.abort();
    })
    .await;
    held.abort();
}

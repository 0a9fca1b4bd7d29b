//! `block = ["udp"]` on a link: UDP is dropped (and counted as `blocked`)
//! while TCP passes on the same path, other paths carry UDP, and the block
//! can be lifted at run time. Needs root (or a user namespace) and
//! /dev/net/tun, like `fidelity.rs`: without them it prints SKIPPED and
//! returns, unless ONIONLAB_REQUIRE_NETNS=1.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use onionlab_netem::{Block, Network, NetworkOptions, PathUpdate, Topology};

/// The exclusive lock the fidelity tests take, so that namespace tests never
/// overlap.
struct Serial(#[allow(dead_code)] Flock<std::fs::File>);

fn available() -> Option<Serial> {
    match onionlab_netem::check_privileges() {
        Ok(()) => {
            std::fs::create_dir_all("/run/onionlab").unwrap();
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open("/run/onionlab/.fidelity-tests.lock")
                .unwrap();
            // Released when the file closes.
            let lock = Flock::lock(f, FlockArg::LockExclusive)
                .map_err(|(_, e)| e)
                .unwrap();
            Some(Serial(lock))
        }
        Err(e) => {
            let msg = format!("SKIPPED: this test needs root and /dev/net/tun ({e})");
            if std::env::var("ONIONLAB_REQUIRE_NETNS").is_ok_and(|v| v == "1") {
                panic!("{msg}, and ONIONLAB_REQUIRE_NETNS=1");
            }
            let _ = writeln!(std::io::stderr(), "{msg}");
            None
        }
    }
}

const TOPOLOGY: &str = r#"
name = "t-block"
[defaults]
latency = "1ms"

[[host]]
name = "a"
[[host]]
name = "b"
[[host]]
name = "c"

[[link]]
a = "a"
b = "b"
block = ["udp"]
"#;

fn udp_in(net: &Network, host: &str, port: u16) -> UdpSocket {
    let addr = SocketAddr::from((net.address(host).unwrap(), port));
    let s = net
        .run_in(host, move || UdpSocket::bind(addr))
        .unwrap()
        .unwrap();
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    s
}

/// Sends `n` datagrams from `tx` to `to` and counts those `rx` receives.
fn udp_received(tx: &UdpSocket, rx: &UdpSocket, to: SocketAddr, n: usize) -> usize {
    for i in 0..n {
        tx.send_to(&[i as u8; 100], to).unwrap();
    }
    let mut got = 0;
    let mut buf = [0u8; 200];
    while rx.recv(&mut buf).is_ok() {
        got += 1;
    }
    got
}

#[test]
fn udp_blocked_tcp_passes() {
    let Some(_serial) = available() else {
        return;
    };
    let topo = Topology::from_toml_str(TOPOLOGY, "block.toml").unwrap();
    let net = Network::up(topo, NetworkOptions::default()).unwrap();
    let (a, b, c) = (
        net.address("a").unwrap(),
        net.address("b").unwrap(),
        net.address("c").unwrap(),
    );

    // UDP a -> b and b -> a: nothing arrives. a -> c: everything.
    let ua = udp_in(&net, "a", 9300);
    let ub = udp_in(&net, "b", 9300);
    let uc = udp_in(&net, "c", 9300);
    assert_eq!(udp_received(&ua, &ub, (b, 9300).into(), 20), 0, "a->b");
    assert_eq!(udp_received(&ub, &ua, (a, 9300).into(), 20), 0, "b->a");
    assert_eq!(udp_received(&ua, &uc, (c, 9300).into(), 20), 20, "a->c");

    // TCP a -> b: connects and moves 1 MiB intact.
    let listener = net
        .run_in("b", move || TcpListener::bind((b, 9301)))
        .unwrap()
        .unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut data = Vec::new();
        s.read_to_end(&mut data).unwrap();
        data
    });
    let sent: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    let mut s = net
        .run_in("a", move || {
            TcpStream::connect_timeout(&SocketAddr::from((b, 9301)), Duration::from_secs(5))
        })
        .unwrap()
        .unwrap();
    s.write_all(&sent).unwrap();
    drop(s);
    assert!(server.join().unwrap() == sent, "TCP data differs");

    // Counters: the UDP datagrams are `blocked` drops, nothing else dropped.
    let counters = net.counters().unwrap();
    let ab = counters.path("a", "b").unwrap();
    assert_eq!(ab.drops.blocked, 20, "{ab:?}");
    assert_eq!(ab.drops.total(), 20, "{ab:?}");
    assert!(ab.delivered_packets > 100, "TCP segments delivered: {ab:?}");
    assert_eq!(counters.path("b", "a").unwrap().drops.blocked, 20);
    assert_eq!(counters.path("a", "c").unwrap().drops.total(), 0);

    // Lift the block at run time: UDP passes.
    net.update_path(
        "a",
        "b",
        PathUpdate {
            block: Some(Block::NONE),
            ..PathUpdate::default()
        },
        true,
    )
    .unwrap();
    assert_eq!(
        udp_received(&ua, &ub, (b, 9300).into(), 20),
        20,
        "unblocked"
    );
    let c2 = net.shutdown().unwrap();
    assert_eq!(c2.path("a", "b").unwrap().drops.blocked, 20);
}

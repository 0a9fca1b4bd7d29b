//! Denial-of-service limits with real processes on loopback: a 3-relay
//! network from `network init` and a client on 127.0.0.1 with the pinned
//! path relay0, relay1, relay2, while "another host" (127.0.0.5, 127.0.0.6)
//! floods the guard, relay0:
//!
//! - a flood of TCP connections from one address: the guard keeps at most
//!   `dos_max_conns_per_address` (50) of them and closes the rest at once;
//! - a CREATE2 flood over several TLS links from one address: after the
//!   burst (90) the guard answers DESTROY RESOURCELIMIT without doing the
//!   ntor handshake;
//!
//! - a flood of QUIC handshakes from one address: after the burst (40)
//!   the guard's QUIC handshake gate refuses them before any cryptography;
//! - connections that never carry a circuit are closed after
//!   `channel_idle_timeout_ms`;
//!
//! and the honest client downloads intact all along.

use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use onionlab_cell::chan::{
    AnyChanCell, AnyChanMsg, ChanCell, CircId, Create2, DestroyReason, HandshakeType,
};
use onionlab_crypto::ntor::NtorClient;
use onionlab_netdoc::NetworkDocument;
use onionlab_testnet::{self as testnet, LocalNetwork};
use onionlab_transport::quic::{QuicSettings, QuicTransport};
use onionlab_transport::tls::TlsTransport;
use onionlab_transport::{CellReader, CellWriter, Transport};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};

const PATH: [&str; 3] = ["relay0", "relay1", "relay2"];
const MIB: u64 = 1 << 20;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_onionlab"))
}

fn network(name: &str) -> LocalNetwork {
    network_with(name, "")
}

/// A network whose guard's configuration gets `guard_config` appended.
fn network_with(name: &str, guard_config: &str) -> LocalNetwork {
    let dir = std::env::temp_dir().join(format!(
        "onionlab-abuse-flood-{}-{name}",
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&dir);
    let mut net = LocalNetwork::init(&bin(), &dir, 3, 1).expect("network init");
    net.remove_when_done();
    net.set_relay_config(0, guard_config).expect("guard config");
    net.start_relays().expect("relays start");
    net.start_client(Some(&PATH), "").expect("client starts");
    net
}

fn document(net: &LocalNetwork) -> NetworkDocument {
    let key = onionlab_netdoc::keys::load_network_public_key(&net.dir.join("network-key.pub"))
        .expect("network key");
    let text = fs::read_to_string(net.dir.join("network.doc")).expect("document");
    NetworkDocument::from_signed_text(&text, &key).expect("valid document")
}

async fn connect_from(ip: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.bind(SocketAddr::new(IpAddr::V4(ip), 0))?;
    s.connect(to).await
}

/// Whether the relay closed `s` (EOF or reset) within `wait`.
async fn closed_by_peer(s: &mut TcpStream, wait: Duration) -> bool {
    let mut b = [0u8; 1];
    matches!(
        tokio::time::timeout(wait, s.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_from_one_address_is_capped_and_the_client_still_downloads() {
    let net = network("conns");
    let socks = net.socks_addr();
    let server = testnet::workload_server().await.expect("server");
    testnet::download(socks, server, MIB, None)
        .await
        .expect("before the flood");
    let guard = net.relay_addr(0);
    let flooder = Ipv4Addr::new(127, 0, 0, 5);
    let mut conns = Vec::new();
    for _ in 0..300 {
        if let Ok(s) = connect_from(flooder, guard).await {
            conns.push(s);
        }
    }
    assert!(conns.len() >= 250, "{} connects", conns.len());
    let transfer = tokio::spawn(testnet::download(socks, server, MIB, None));
    let mut open = 0;
    for s in &mut conns {
        if !closed_by_peer(s, Duration::from_millis(20)).await {
            open += 1;
        }
    }
    assert!(
        (1..=50).contains(&open),
        "{open} of {} flood connections kept",
        conns.len()
    );
    finish_and_check_log(
        transfer,
        &net,
        "denial-of-service limit: connection refused",
    )
    .await;
}

/// The honest client's transfer ended intact, and the guard's log says
/// `logged`.
async fn finish_and_check_log(
    transfer: tokio::task::JoinHandle<Result<testnet::Transfer, String>>,
    net: &LocalNetwork,
    logged: &str,
) {
    transfer
        .await
        .expect("task")
        .expect("the honest client downloads during the flood");
    let log = fs::read_to_string(&net.relays[0].log).unwrap_or_default();
    assert!(log.contains(logged), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create2_flood_is_rate_limited_and_the_client_still_downloads() {
    let net = network("create");
    let socks = net.socks_addr();
    let server = testnet::workload_server().await.expect("server");
    let doc = document(&net);
    let guard = doc.relays[0].public_keys();
    let transport =
        TlsTransport::client().with_bind_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6)));
    let mut links = Vec::new();
    for _ in 0..4 {
        links.push(
            transport
                .connect(net.relay_addr(0), guard.ed_identity)
                .await
                .expect("TLS link"),
        );
    }
    let transfer = tokio::spawn(testnet::download(socks, server, MIB, None));
    // 400 CREATE2 with genuine onionskins, 100 per link, as fast as the
    // links take them.
    let mut rng = rand::rng();
    for (l, link) in links.iter_mut().enumerate() {
        for i in 0..100u32 {
            let (_, onionskin) =
                NtorClient::start(&mut rng, &guard.ntor_node_id(), &guard.onion_key);
            let id = CircId::new(0x8000_0000 | (l as u32 * 1000 + i + 1)).expect("id");
            let create = Create2::new(HandshakeType::NTOR, onionskin.to_vec());
            let cell: AnyChanCell = ChanCell::new(Some(id), create.into());
            link.writer.queue(cell).expect("queue");
        }
        link.writer.flush().await.expect("flush");
    }
    let (mut created, mut refused) = (0, 0);
    let mut cells = Vec::new();
    for link in &mut links {
        let mut answers = 0;
        while answers < 100 {
            cells.clear();
            tokio::time::timeout(Duration::from_secs(10), link.reader.read_cells(&mut cells))
                .await
                .expect("answers within 10 s")
                .expect("read");
            for cell in cells.drain(..) {
                match cell.into_circid_and_msg().1 {
                    AnyChanMsg::Created2(_) => created += 1,
                    AnyChanMsg::Destroy(d) => {
                        assert_eq!(d.reason(), DestroyReason::RESOURCELIMIT);
                        refused += 1;
                    }
                    other => panic!("unexpected {other:?}"),
                }
                answers += 1;
            }
        }
    }
    // The burst (90) and what 3/s refills while the cells arrive.
    assert!(
        (90..=110).contains(&created),
        "{created} created, {refused} refused"
    );
    assert_eq!(created + refused, 400);
    transfer
        .await
        .expect("task")
        .expect("the honest client downloads during the flood");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quic_handshake_flood_from_one_address_is_refused_and_the_client_still_downloads() {
    let net = network("quic");
    let socks = net.socks_addr();
    let server = testnet::workload_server().await.expect("server");
    let doc = document(&net);
    let guard = &doc.relays[0];
    let quic = guard
        .addresses
        .iter()
        .find(|a| a.transport == "quic")
        .expect("the guard listens on QUIC")
        .addr;
    let identity = guard.public_keys().ed_identity;
    let transfer = tokio::spawn(testnet::download(socks, server, MIB, None));
    let flooder = QuicTransport::client_bound(
        QuicSettings::default(),
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 7)),
    );
    let started = std::time::Instant::now();
    let mut attempts = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let flooder = flooder.clone();
        attempts.spawn(async move {
            tokio::time::timeout(Duration::from_secs(15), flooder.connect(quic, identity)).await
        });
    }
    let mut links = Vec::new();
    let mut refused = 0;
    while let Some(r) = attempts.join_next().await {
        match r.expect("task").expect("refused fast, not by timeout") {
            Ok(link) => links.push(link),
            Err(_) => refused += 1,
        }
    }
    // The burst, and what 20/s refills while the flood lasts.
    let allowed = 40.0 + 20.0 * started.elapsed().as_secs_f64() + 2.0;
    assert!(
        !links.is_empty() && (links.len() as f64) <= allowed,
        "{} links, {refused} refused, {allowed} allowed",
        links.len()
    );
    finish_and_check_log(
        transfer,
        &net,
        "QUIC handshake refused: one address starts QUIC handshakes too fast",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_without_circuits_are_closed_when_idle() {
    let net = network_with("idle", "channel_idle_timeout_ms = 1000\n");
    let doc = document(&net);
    let guard = doc.relays[0].public_keys();
    let transport =
        TlsTransport::client().with_bind_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 8)));
    let mut link = transport
        .connect(net.relay_addr(0), guard.ed_identity)
        .await
        .expect("TLS link");
    let started = std::time::Instant::now();
    let mut cells = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(10), link.reader.read_cells(&mut cells))
        .await
        .expect("the idle channel is closed within 10 s");
    assert!(end.is_err(), "{end:?} {cells:?}");
    assert!(started.elapsed() >= Duration::from_millis(900));
    // The client's own idle channel was closed too; it reconnects.
    let server = testnet::workload_server().await.expect("server");
    testnet::download(net.socks_addr(), server, MIB, None)
        .await
        .expect("the client downloads after its channel was closed");
    let log = fs::read_to_string(&net.relays[0].log).unwrap_or_default();
    assert!(log.contains("closed: no circuit for 1 s"), "{log}");
}

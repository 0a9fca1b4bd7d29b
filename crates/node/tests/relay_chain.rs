//! Three relays on loopback, each on its own thread and runtime, driven by
//! a minimal hand-written client (one circuit over one TLS channel): data
//! crosses the chain intact, bad peers lose only their own connection, and
//! extends go only where the network document says.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use onionlab_cell::chan::{AnyChanCell, ChanCell, CircId};
use onionlab_cell::msg::{EncodedLinkSpec, LinkSpec};
use onionlab_circuit::client::{ClientCircuit, ClientConfig, ClientEvent};
use onionlab_circuit::node::NodeConfig;
use onionlab_circuit::stream::StreamEvent;
use onionlab_crypto::identity::{RelayPublicKeys, RelaySecretKeys};
use onionlab_netdoc::exit_targets::PrivateTargets;
use onionlab_netdoc::{ExitPolicy, Flags, NetworkDocument, RelayEntry, TransportAddress};
use onionlab_node::{RelaySettings, RelayStats, RelayThread};
use onionlab_transport::addrs::EndpointAddrs;
use onionlab_transport::any::AnyLink as TlsLink;
use onionlab_transport::endpoint::EndpointKind;
use onionlab_transport::tls::TlsTransport;
use onionlab_transport::{CellReader, CellWriter, Transport};
use rand::rngs::StdRng;
use rand::SeedableRng;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

struct TestRelay {
    public: RelayPublicKeys,
    addr: SocketAddr,
    /// `None` for a relay that does not run.
    relay: Option<RelayThread>,
}

impl TestRelay {
    fn stop(&mut self) -> RelayStats {
        self.relay
            .as_mut()
            .and_then(RelayThread::stop)
            .expect("running")
            .expect("relay run")
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// `n` relays, the last an exit; returns them and the document.
fn start_network(n: usize, seed: u64) -> (Vec<TestRelay>, NetworkDocument) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut keys = Vec::new();
    let mut relays = Vec::new();
    for i in 0..n {
        let k = RelaySecretKeys::generate(&mut rng);
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let mut e = RelayEntry::new(format!("relay{i}"), &k.public());
        e.addresses.push(TransportAddress {
            transport: "tls".into(),
            addr,
        });
        e.bandwidth = 1000;
        let exit = i == n - 1;
        e.flags = Flags { guard: !exit, exit };
        if exit {
            e.exit_policy = ExitPolicy::accept_all();
        }
        relays.push(e);
        keys.push(k);
    }
    let now = onionlab_config::unix_now();
    let doc = NetworkDocument {
        network_name: "test".into(),
        created_unix: now,
        valid_after_unix: now,
        valid_until_unix: now + onionlab_netdoc::DEFAULT_LIFETIME.as_secs(),
        params: Default::default(),
        relays,
    };
    let mut out = Vec::new();
    for (k, entry) in keys.into_iter().zip(&doc.relays) {
        let addr = entry.addresses[0].addr;
        let public = k.public();
        let mut settings = RelaySettings::from_document(
            k,
            EndpointAddrs::new().with(EndpointKind::TCP, addr),
            doc.clone(),
            NodeConfig::default(),
        )
        .expect("in document");
        // The targets are test servers on loopback (the relays' own ports
        // stay refused).
        settings.exit.allow_private = PrivateTargets::parse(&["127.0.0.1:*"]).expect("targets");
        let relay = RelayThread::spawn(settings).expect("bind");
        out.push(TestRelay {
            public,
            addr,
            relay: Some(relay),
        });
    }
    (out, doc)
}

fn linkspecs(r: &TestRelay) -> Vec<EncodedLinkSpec> {
    [
        LinkSpec::OrPort(r.addr.ip(), r.addr.port()),
        LinkSpec::Ed25519Id(r.public.ed_identity),
    ]
    .iter()
    .map(|s| s.encode().expect("encode"))
    .collect()
}

/// One client circuit over one channel, driven by hand.
struct MiniClient {
    link: TlsLink,
    circ: ClientCircuit,
    id: CircId,
    inbox: Vec<AnyChanCell>,
}

impl MiniClient {
    async fn connect(guard: &TestRelay) -> MiniClient {
        let link = TlsTransport::client()
            .connect(guard.addr, guard.public.ed_identity)
            .await
            .expect("connect guard");
        let circ = ClientCircuit::new(
            ClientConfig::default(),
            &guard.public,
            StdRng::seed_from_u64(99),
        );
        MiniClient {
            link,
            circ,
            id: CircId::new(0x8000_0001).expect("nonzero"),
            inbox: Vec::new(),
        }
    }

    /// Send what the circuit has, then wait for input (or `timeout`).
    async fn step(&mut self, timeout: Duration) {
        let now = Instant::now();
        while self.link.writer.has_room() {
            let Some(msg) = self.circ.poll_transmit(now) else {
                break;
            };
            self.link
                .writer
                .queue(ChanCell::new(Some(self.id), msg))
                .expect("queue");
        }
        self.link.writer.flush().await.expect("flush");
        self.inbox.clear();
        if let Ok(r) =
            tokio::time::timeout(timeout, self.link.reader.read_cells(&mut self.inbox)).await
        {
            r.expect("read cells");
        }
        let now = Instant::now();
        for cell in self.inbox.drain(..) {
            let (_, msg) = cell.into_circid_and_msg();
            self.circ.handle_cell(now, msg);
        }
    }

    async fn build(&mut self, path: &[&TestRelay]) {
        for hop in &path[1..] {
            loop {
                self.step(Duration::from_millis(50)).await;
                if let Some(ev) = self.circ.poll_event() {
                    assert!(matches!(ev, ClientEvent::HopAdded { .. }), "{ev:?}");
                    break;
                }
            }
            self.circ
                .extend(&hop.public, linkspecs(hop))
                .expect("extend");
        }
        loop {
            self.step(Duration::from_millis(50)).await;
            if let Some(ev) = self.circ.poll_event() {
                assert!(matches!(ev, ClientEvent::HopAdded { .. }), "{ev:?}");
                break;
            }
        }
        assert_eq!(self.circ.n_hops(), path.len());
    }
}

/// An echo server: everything received is sent back.
async fn echo_server() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// Push `total` bytes through an echo stream and check what comes back.
async fn echo_through(client: &mut MiniClient, target: SocketAddr, total: usize) {
    let stream = client
        .circ
        .begin(&target.ip().to_string(), target.port())
        .expect("begin");
    let data: Vec<u8> = (0..total).map(|i| (i * 7 + i / 4096) as u8).collect();
    let (mut sent, mut got) = (0usize, Vec::with_capacity(total));
    let mut buf = vec![0u8; 64 * 1024];
    let deadline = Instant::now() + Duration::from_secs(120);
    while got.len() < total {
        assert!(
            Instant::now() < deadline,
            "stalled at {} of {total}",
            got.len()
        );
        if sent < total {
            sent += client
                .circ
                .write(
                    Instant::now(),
                    stream,
                    &data[sent..(sent + 64 * 1024).min(total)],
                )
                .unwrap_or(0);
        }
        client.step(Duration::from_millis(20)).await;
        while let Some(ev) = client.circ.poll_event() {
            if let ClientEvent::Stream(StreamEvent::Ended { reason, .. }) = ev {
                panic!("stream ended early: {reason:?}");
            }
            assert!(!matches!(ev, ClientEvent::Closed(_)), "{ev:?}");
        }
        loop {
            let n = client
                .circ
                .read(Instant::now(), stream, &mut buf)
                .expect("read");
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
    }
    assert_eq!(
        Sha256::digest(&got),
        Sha256::digest(&data),
        "echoed bytes differ"
    );
}

#[tokio::test]
async fn a_three_hop_circuit_echoes_4_mib_intact() {
    let (mut relays, _doc) = start_network(3, 1);
    let echo = echo_server().await;
    let mut client = MiniClient::connect(&relays[0]).await;
    let path: Vec<&TestRelay> = relays.iter().collect();
    client.build(&path).await;
    echo_through(&mut client, echo, 4 << 20).await;
    drop(client);
    for r in &mut relays {
        let stats = r.stop();
        assert_eq!(stats.oom_circuits_killed, 0);
    }
}

#[tokio::test]
async fn garbage_at_a_relay_does_not_disturb_a_transfer_through_it() {
    let (mut relays, _doc) = start_network(3, 2);
    let echo = echo_server().await;
    let mut client = MiniClient::connect(&relays[0]).await;
    let path: Vec<&TestRelay> = relays.iter().collect();
    client.build(&path).await;

    // While the transfer runs, attack the middle relay: raw garbage, a TLS
    // peer sending malformed cells, and one sending cells for circuits
    // that do not exist.
    let middle = (relays[1].addr, relays[1].public.ed_identity);
    let attacker = tokio::spawn(async move {
        for round in 0..20u8 {
            if let Ok(mut s) = tokio::net::TcpStream::connect(middle.0).await {
                let _ = s.write_all(&[round; 3000]).await;
            }
            if let Ok(mut link) = TlsTransport::client().connect(middle.0, middle.1).await {
                // Unknown circuit: a RELAY cell on a circuit never created.
                let _ = link.writer.queue(ChanCell::new(
                    CircId::new(0x8000_0000 | (u32::from(round) + 1)),
                    onionlab_cell::chan::Relay::new([round; 509]).into(),
                ));
                let _ = link.writer.flush().await;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    echo_through(&mut client, echo, 2 << 20).await;
    attacker.await.expect("attacker");
    drop(client);
    let middle_stats = relays[1].stop();
    assert!(middle_stats.failed_handshakes >= 20, "{middle_stats:?}");
}

#[tokio::test]
async fn a_link_protocol_violation_costs_the_sender_its_link_only() {
    let (mut relays, _doc) = start_network(3, 3);
    let echo = echo_server().await;
    let mut good = MiniClient::connect(&relays[0]).await;
    let path: Vec<&TestRelay> = relays.iter().collect();
    good.build(&path).await;

    // A second client on the guard creates a circuit with an ID from the
    // wrong half (initiators must set the high bit): a channel violation.
    let mut bad = TlsTransport::client()
        .connect(relays[0].addr, relays[0].public.ed_identity)
        .await
        .expect("connect");
    let create =
        onionlab_cell::chan::Create2::new(onionlab_cell::chan::HandshakeType::NTOR, vec![0u8; 84]);
    bad.writer
        .queue(ChanCell::new(CircId::new(1), create.into()))
        .expect("queue");
    bad.writer.flush().await.expect("flush");
    let mut cells = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if bad.reader.read_cells(&mut cells).await.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the violating link was not closed");

    echo_through(&mut good, echo, 1 << 20).await;
    // Stop the relay while `good` is still connected: only the violator
    // counts as lost.
    let stats = relays[0].stop();
    drop(good);
    assert_eq!(stats.channels_lost, 1, "{stats:?}");
}

#[tokio::test]
async fn extends_only_to_relays_in_the_document() {
    let (relays, _doc) = start_network(2, 4);
    let mut client = MiniClient::connect(&relays[0]).await;
    // A relay that is not in the network document.
    let stranger = TestRelay {
        public: RelaySecretKeys::generate(&mut StdRng::seed_from_u64(77)).public(),
        addr: "127.0.0.1:9".parse().expect("addr"),
        relay: None,
    };
    loop {
        client.step(Duration::from_millis(50)).await;
        if client.circ.poll_event().is_some() {
            break;
        }
    }
    client
        .circ
        .extend(&stranger.public, linkspecs(&stranger))
        .expect("extend");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "no answer to a bad extend");
        client.step(Duration::from_millis(50)).await;
        match client.circ.poll_event() {
            Some(ClientEvent::HopFailed { .. }) => break,
            Some(ClientEvent::Closed(_)) => break,
            Some(other) => panic!("unexpected {other:?}"),
            None => {}
        }
    }
}

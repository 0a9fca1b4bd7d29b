//! A small loopback network for the client's tests: real relays
//! (`onionlab-node`'s `Relay`, each on a thread of its own) whose exits may
//! reach loopback targets; plus a TCP echo server and a hand-written
//! SOCKS5 client.

#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use onionlab_circuit::node::NodeConfig;
use onionlab_circuit::relay::RelayConfig;
use onionlab_crypto::identity::RelaySecretKeys;
use onionlab_netdoc::doc::{TransportAddress, TRANSPORT_TLS};
use onionlab_netdoc::exit_targets::PrivateTargets;
use onionlab_netdoc::{ExitPolicy, NetworkDocument, RelayEntry};
use onionlab_node::{RelaySettings, RelayThread};
use onionlab_transport::addrs::EndpointAddrs;
use onionlab_transport::endpoint::EndpointKind;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
/// Log to the test output, filtered by `RUST_LOG`.
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// One relay to start.
#[derive(Debug, Clone)]
pub struct RelaySpec {
    pub guard: bool,
    pub exit: bool,
    pub bandwidth: u64,
    pub policy: &'static str,
}

impl RelaySpec {
    pub fn guard() -> Self {
        RelaySpec {
            guard: true,
            exit: false,
            bandwidth: 100,
            policy: "reject *:*",
        }
    }
    pub fn middle() -> Self {
        RelaySpec {
            guard: false,
            ..RelaySpec::guard()
        }
    }
    pub fn exit() -> Self {
        RelaySpec {
            guard: false,
            exit: true,
            bandwidth: 100,
            policy: "accept *:*",
        }
    }
    pub fn guard_exit() -> Self {
        RelaySpec {
            guard: true,
            ..RelaySpec::exit()
        }
    }
}

/// Relays running on threads of their own; stopped when dropped.
pub struct Network {
    /// The document describing the relays (`relay0`, `relay1`...).
    pub doc: NetworkDocument,
    relays: Vec<RelayThread>,
}

/// A free TCP port on loopback (free when asked; the relay binds it
/// right after).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

impl Network {
    /// Start relays as `specs` say; relay `i` is `relay{i}`.
    pub fn start(specs: &[RelaySpec]) -> Network {
        let keys: Vec<RelaySecretKeys> = (0..specs.len())
            .map(|i| RelaySecretKeys::generate(&mut StdRng::seed_from_u64(1000 + i as u64)))
            .collect();
        let relays = specs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let mut r = RelayEntry::new(format!("relay{i}"), &keys[i].public());
                r.addresses.push(TransportAddress {
                    transport: TRANSPORT_TLS.into(),
                    addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), free_port()),
                });
                r.flags.guard = s.guard;
                r.flags.exit = s.exit;
                r.bandwidth = s.bandwidth;
                r.exit_policy = ExitPolicy::parse(s.policy).expect("policy");
                r
            })
            .collect();
        let doc = NetworkDocument {
            network_name: "test".into(),
            created_unix: 1_700_000_000,
            valid_after_unix: 1_700_000_000,
            valid_until_unix: 1_700_000_000 + 86_400,
            params: Default::default(),
            relays,
        };
        doc.validate().expect("valid document");
        let relays = keys.into_iter().map(|k| start_relay(k, &doc)).collect();
        Network { doc, relays }
    }

    /// Circuits relay `i` has now.
    pub fn circuits_at(&self, i: usize) -> usize {
        self.relays[i].circuits().get()
    }

    /// Wait until relay `i` has `n` circuits (true) or 5 s pass (false).
    pub async fn wait_circuits(&self, i: usize, n: usize) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.circuits_at(i) == n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    /// Stop every relay now (closing all their connections).
    pub fn stop(&mut self) {
        for r in &mut self.relays {
            r.stop();
        }
    }
}

/// Run the relay with `keys` of `doc` on a thread of its own, once bound.
fn start_relay(keys: RelaySecretKeys, doc: &NetworkDocument) -> RelayThread {
    let id = keys.public().ed_identity;
    let entry = doc
        .relays
        .iter()
        .find(|r| r.ed_identity == *id.as_bytes())
        .expect("listed");
    let listen = EndpointAddrs::new().with(EndpointKind::TCP, entry.addresses[0].addr);
    let node = NodeConfig {
        circuit: RelayConfig {
            // The client's tests pin some paths to one hop.
            allow_one_hop_streams: true,
            ..RelayConfig::default()
        },
        ..NodeConfig::default()
    };
    let mut settings =
        RelaySettings::from_document(keys, listen, doc.clone(), node).expect("in the document");
    // The targets are the tests' servers on loopback.
    settings.exit.allow_private =
        PrivateTargets::parse(&["127.0.0.1:*", "[::1]:*"]).expect("targets");
    RelayThread::spawn(settings).expect("the relay binds")
}

/// A TCP echo server on 127.0.0.1 (or `ip`), for as long as the runtime
/// lives.
pub async fn echo_server_on(ip: IpAddr) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    Ok(addr)
}

/// A TCP echo server on 127.0.0.1.
pub async fn echo_server() -> SocketAddr {
    echo_server_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .await
        .expect("echo server")
}

/// A SOCKS5 target.
pub enum Dest<'a> {
    Ip(SocketAddr),
    Name(&'a str, u16),
}

/// SOCKS5 CONNECT through `proxy`: the stream on success, the reply code
/// otherwise.
pub async fn socks_connect(
    proxy: SocketAddr,
    dest: Dest<'_>,
    auth: Option<(&str, &str)>,
) -> Result<TcpStream, u8> {
    let mut s = TcpStream::connect(proxy).await.expect("connect to proxy");
    let method = if auth.is_some() { 2 } else { 0 };
    s.write_all(&[5, 1, method]).await.expect("greeting");
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).await.expect("method choice");
    assert_eq!(choice, [5, method], "method selection");
    if let Some((u, p)) = auth {
        let mut msg = vec![1, u.len() as u8];
        msg.extend_from_slice(u.as_bytes());
        msg.push(p.len() as u8);
        msg.extend_from_slice(p.as_bytes());
        s.write_all(&msg).await.expect("auth");
        let mut status = [0u8; 2];
        s.read_exact(&mut status).await.expect("auth status");
        assert_eq!(status, [1, 0], "auth accepted");
    }
    let mut req = vec![5, 1, 0];
    match dest {
        Dest::Ip(SocketAddr::V4(a)) => {
            req.push(1);
            req.extend_from_slice(&a.ip().octets());
            req.extend_from_slice(&a.port().to_be_bytes());
        }
        Dest::Ip(SocketAddr::V6(a)) => {
            req.push(4);
            req.extend_from_slice(&a.ip().octets());
            req.extend_from_slice(&a.port().to_be_bytes());
        }
        Dest::Name(h, port) => {
            req.push(3);
            req.push(h.len() as u8);
            req.extend_from_slice(h.as_bytes());
            req.extend_from_slice(&port.to_be_bytes());
        }
    }
    s.write_all(&req).await.expect("request");
    let code = read_reply(&mut s).await;
    if code == 0 {
        Ok(s)
    } else {
        Err(code)
    }
}

/// Read a SOCKS5 reply; its code.
pub async fn read_reply(s: &mut TcpStream) -> u8 {
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await.expect("reply header");
    assert_eq!(head[0], 5, "reply version");
    let addr_len = match head[3] {
        1 => 4,
        4 => 16,
        3 => {
            let mut l = [0u8; 1];
            s.read_exact(&mut l).await.expect("length");
            l[0] as usize
        }
        other => panic!("bad reply address type {other}"),
    };
    let mut rest = vec![0u8; addr_len + 2];
    s.read_exact(&mut rest).await.expect("reply address");
    head[1]
}

/// A deterministic pattern of `len` bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0] ^ seed)
        .collect()
}

/// Write `data` and read as much back at the same time; the bytes read.
pub async fn echo_roundtrip(s: &mut TcpStream, data: &[u8]) -> Vec<u8> {
    let (mut r, mut w) = s.split();
    let write = async {
        w.write_all(data).await.expect("write");
    };
    let read = async {
        let mut got = vec![0u8; data.len()];
        r.read_exact(&mut got).await.expect("read back");
        got
    };
    let ((), got) = tokio::join!(write, read);
    got
}

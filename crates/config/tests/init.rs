//! `init_network`: the files it writes load, and bad options are refused.

use std::net::IpAddr;
use std::path::Path;

use onionlab_config::Error;
use onionlab_config::{init_network, load_network, InitOptions};
use onionlab_config::{
    ClientConfig, ConfigFile, Congestion, NetworkSource, RelayConfig, Scheduler, TransportChoice,
};
use onionlab_netdoc::doc::TRANSPORT_TLS;
use onionlab_netdoc::keys;
use onionlab_netdoc::{ExitPolicy, NetworkDocument};
use onionlab_transport::endpoint::EndpointKind;
use rand::rngs::StdRng;
use rand::SeedableRng;

const LIFETIME: std::time::Duration = std::time::Duration::from_secs(200 * 365 * 86_400);

fn opts(out: &Path, relays: usize, exits: usize) -> InitOptions {
    InitOptions {
        relays,
        exits,
        out: out.to_path_buf(),
        created_unix: Some(1_234),
        // Loadable now although made at a fixed time long ago.
        lifetime: LIFETIME,
        ..InitOptions::default()
    }
}

/// A network public key nobody used.
fn secret_other() -> tor_llcrypto::pk::ed25519::PublicKey {
    tor_llcrypto::pk::ed25519::Keypair::from_bytes(&[9; 32]).verifying_key()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn init_writes_loadable_files() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("net");
    let mut rng = StdRng::seed_from_u64(1);
    let summary = init_network(&opts(&out, 5, 2), &mut rng).unwrap();
    assert_eq!(summary.relays.len(), 5);
    let text = summary.to_string();
    assert!(text.contains("relay4"), "{text}");

    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "README.txt",
            "client.toml",
            "network-key.pub",
            "network-key.secret",
            "network.doc",
            "relays"
        ]
    );

    let public = keys::load_network_public_key(&out.join("network-key.pub")).unwrap();
    let secret = keys::load_network_key(&out.join("network-key.secret")).unwrap();
    assert_eq!(secret.verifying_key(), public);
    assert_eq!(keys::public_key_hex(&public), summary.network_key_hex);

    // The client config loads and points at a verifiable document.
    let client = ClientConfig::load(&summary.client_config).unwrap();
    assert_eq!(client.socks_listen, "127.0.0.1:9050".parse().unwrap());
    assert_eq!(client.path, None);
    assert_eq!(client.link.transport, TransportChoice::Auto);
    assert_eq!(client.link.quic.congestion, Congestion::Cubic);
    assert_eq!(client.network, NetworkSource::File(out.join("network.doc")));
    assert_eq!(client.network_public_key().unwrap(), public);
    let doc = rt()
        .block_on(load_network(&client.network, &public))
        .unwrap();
    assert_eq!(
        NetworkDocument::load_file(&summary.network_doc, &public).unwrap(),
        doc
    );
    let other = secret_other();
    let err = NetworkDocument::load_file(&summary.network_doc, &other).unwrap_err();
    assert!(err.to_string().contains("network.doc"), "{err}");
    assert_eq!(doc.network_name, "onionlab");
    assert_eq!(doc.created_unix, 1_234);
    assert_eq!(doc.valid_after_unix, 1_234);
    assert_eq!(doc.valid_until_unix, 1_234 + LIFETIME.as_secs());
    assert_eq!(doc.relays.len(), 5);

    for (i, (relay, entry)) in summary.relays.iter().zip(&doc.relays).enumerate() {
        assert_eq!(entry.nickname, format!("relay{i}"));
        let exit = i >= 3;
        assert_eq!((entry.flags.exit, entry.flags.guard), (exit, !exit));
        assert_eq!((relay.exit, relay.guard), (exit, !exit));
        assert_eq!(
            entry.exit_policy,
            if exit {
                ExitPolicy::accept_all()
            } else {
                ExitPolicy::reject_all()
            }
        );
        assert_eq!(entry.bandwidth, 1000);
        let port = 9001 + i as u16;
        assert_eq!(entry.address("tls"), Some(relay.listen));
        assert_eq!(relay.listen.port(), port);
        // Every endpoint: QUIC on the same port number (UDP), dtls-utcp
        // on a UDP port after all the relays' ports.
        let names: Vec<&str> = entry
            .addresses
            .iter()
            .map(|a| a.transport.as_str())
            .collect();
        let (quic, utcp_name) = (EndpointKind::QUIC.doc_name(), EndpointKind::UTCP.doc_name());
        let every: Vec<&str> = EndpointKind::all().iter().map(|k| k.doc_name()).collect();
        assert_eq!(names, every);
        assert_eq!(&names[..3], [TRANSPORT_TLS, quic, utcp_name]);
        assert_eq!(entry.address(quic), Some(relay.listen));
        let utcp = std::net::SocketAddr::new(relay.listen.ip(), port + summary.relays.len() as u16);
        assert_eq!(entry.address(utcp_name), Some(utcp));
        let dgram =
            std::net::SocketAddr::new(relay.listen.ip(), port + 2 * summary.relays.len() as u16);
        assert_eq!(entry.address(EndpointKind::DGRAM.doc_name()), Some(dgram));

        // Each relay config loads, its keys match the document, and its
        // network source (relative to its directory) is the same document.
        let cfg = RelayConfig::load(&relay.config).unwrap();
        assert_eq!(cfg.nickname, entry.nickname);
        assert_eq!(cfg.listen, relay.endpoints);
        assert_eq!(cfg.tls_address(), Some(relay.listen));
        // It listens where the document says it does.
        for address in &entry.addresses {
            let kind = EndpointKind::all()
                .into_iter()
                .find(|k| k.doc_name() == address.transport)
                .unwrap();
            assert_eq!(cfg.listen.get(kind), Some(address.addr));
        }
        assert_eq!(cfg.scheduler, Scheduler::Ewma);
        assert_eq!(cfg.link.transport, TransportChoice::Auto);
        assert_eq!(cfg.link.quic.congestion, Congestion::Cubic);
        assert_eq!(cfg.network_public_key().unwrap(), public);
        let keys = keys::load_relay_keys(&cfg.keys).unwrap();
        assert_eq!(keys.public(), entry.public_keys());
        let doc2 = rt().block_on(cfg.network.load(&public)).unwrap();
        assert_eq!(doc2, doc);

        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&cfg.keys).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&summary.network_key_secret)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let readme = std::fs::read_to_string(out.join("README.txt")).unwrap();
    assert!(readme.contains("Exits:  relay3, relay4"), "{readme}");
}

#[test]
fn all_exits_are_all_guards() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(2);
    let s = init_network(&opts(tmp.path(), 3, 3), &mut rng).unwrap();
    assert!(s.relays.iter().all(|r| r.guard && r.exit));
    // An existing empty directory is fine (tempdir is one); no exits is fine.
    let tmp = tempfile::tempdir().unwrap();
    let s = init_network(&opts(tmp.path(), 1, 0), &mut rng).unwrap();
    assert!(s.relays[0].guard && !s.relays[0].exit);
}

#[test]
fn other_host_and_ports() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    let o = InitOptions {
        host: "::1".parse::<IpAddr>().unwrap(),
        base_port: 20000,
        socks_port: 19999,
        network_name: "v6-net".into(),
        bandwidth: 5,
        ..opts(tmp.path(), 2, 1)
    };
    let s = init_network(&o, &mut rng).unwrap();
    assert_eq!(s.relays[1].listen, "[::1]:20001".parse().unwrap());
    let client = ClientConfig::load(&s.client_config).unwrap();
    assert_eq!(client.socks_listen, "[::1]:19999".parse().unwrap());
    let public = keys::load_network_public_key(&s.network_key_public).unwrap();
    let doc = rt()
        .block_on(load_network(&client.network, &public))
        .unwrap();
    assert_eq!(doc.network_name, "v6-net");
    assert_eq!(doc.relays[0].bandwidth, 5);
}

#[test]
fn bad_options_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(4);
    let base = opts(&tmp.path().join("x"), 3, 1);
    let cases: Vec<(InitOptions, &str)> = vec![
        (
            InitOptions {
                relays: 0,
                exits: 0,
                ..base.clone()
            },
            "at least one relay",
        ),
        (
            InitOptions {
                exits: 4,
                ..base.clone()
            },
            "4 exits requested but only 3 relays",
        ),
        (
            InitOptions {
                base_port: 65534,
                ..base.clone()
            },
            "do not fit",
        ),
        (
            InitOptions {
                base_port: 0,
                ..base.clone()
            },
            "not 0",
        ),
        (
            InitOptions {
                socks_port: 9002,
                ..base.clone()
            },
            "SOCKS port 9002",
        ),
        (
            InitOptions {
                network_name: "a/b".into(),
                ..base.clone()
            },
            "network name",
        ),
        (
            InitOptions {
                host: "0.0.0.0".parse().unwrap(),
                ..base.clone()
            },
            "cannot be connected to",
        ),
    ];
    for (o, want) in cases {
        let err = init_network(&o, &mut rng).unwrap_err();
        assert!(matches!(err, Error::InitOptions(_)), "{want}: {err}");
        assert!(err.to_string().contains(want), "{want}: {err}");
        // Nothing was written.
        assert!(!o.out.exists());
    }
}

#[test]
fn non_empty_output_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("something"), "x").unwrap();
    let mut rng = StdRng::seed_from_u64(5);
    let err = init_network(&opts(tmp.path(), 3, 1), &mut rng).unwrap_err();
    assert!(matches!(err, Error::OutputNotEmpty { .. }), "{err}");
    assert!(err.to_string().contains("not empty"), "{err}");

    // A second init into the same directory is refused too.
    let tmp = tempfile::tempdir().unwrap();
    init_network(&opts(tmp.path(), 2, 1), &mut rng).unwrap();
    let err = init_network(&opts(tmp.path(), 2, 1), &mut rng).unwrap_err();
    assert!(matches!(err, Error::OutputNotEmpty { .. }), "{err}");

    // A file where the directory should be.
    let file = tmp.path().join("README.txt");
    let err = init_network(&opts(&file, 2, 1), &mut rng).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
}

/// What `network init` writes reads back as the types, and those write
/// and read back equal (with the paths resolved against the file's
/// directory). Its files hold only what differs from the defaults.
#[test]
fn init_configurations_round_trip_through_the_types() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("a \"quoted\" dir\\ü");
    let mut o = opts(&out, 3, 1);
    o.exit_allow_private =
        onionlab_netdoc::exit_targets::PrivateTargets::parse(&["127.0.0.1:8000"]).unwrap();
    init_network(&o, &mut StdRng::seed_from_u64(4)).unwrap();
    let client = ClientConfig::load(&out.join("client.toml")).unwrap();
    let text = client.to_toml().unwrap();
    let back = ClientConfig::from_toml_str(&text, "written", Path::new("/nowhere")).unwrap();
    assert_eq!(back, client, "{text}");
    for relay in ["relay0", "relay2"] {
        let path = out.join("relays").join(relay).join("relay.toml");
        let cfg = RelayConfig::load(&path).unwrap();
        assert!(cfg.keys.starts_with(&out), "{}", cfg.keys.display());
        let text = cfg.to_toml().unwrap();
        let back = RelayConfig::from_toml_str(&text, "written", Path::new("/nowhere")).unwrap();
        assert_eq!(back, cfg, "{text}");
        let written = std::fs::read_to_string(&path).unwrap();
        let keys: Vec<&str> = written
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains(" = "))
            .filter_map(|l| l.split(" = ").next())
            .collect();
        let mut want = vec!["nickname", "keys", "network", "network_key"];
        if relay == "relay2" {
            want.push("exit_allow_private");
        }
        // The [listen] table, after the keys: every endpoint kind.
        want.extend(EndpointKind::all().iter().map(|k| k.doc_name()));
        assert_eq!(keys, want, "{written}");
    }
}

/// The document's OR-port address name is the TCP endpoint's.
#[test]
fn the_or_port_is_the_tcp_endpoint() {
    assert_eq!(TRANSPORT_TLS, EndpointKind::TCP.doc_name());
}

//! Relay and client configuration: the `[link]` section both share
//! (transport, TCP, QUIC, pctcp, dtls-utcp), the relay's `[torchestra]`,
//! their defaults, errors for bad values and for keys that moved, and
//! configurations written by serialising that read back equal.

use std::path::{Path, PathBuf};

use onionlab_config::Error;
use onionlab_config::{
    ClientConfig, ConfigFile, Congestion, NetworkSource, RelayConfig, TransportChoice,
};
use onionlab_netdoc::exit_targets::PrivateTargets;
use onionlab_transport::endpoint::EndpointKind;
use onionlab_transport::tcp::TcpCongestion;

/// A valid network public key in hex.
fn key_hex() -> String {
    let kp = tor_llcrypto::pk::ed25519::Keypair::from_bytes(&[5; 32]);
    hex::encode(kp.verifying_key().as_bytes())
}

/// A relay configuration of five lines, then `extra`.
fn relay(extra: &str) -> Result<RelayConfig, Error> {
    let text = format!(
        "nickname = \"relay0\"\nkeys = \"keys.secret\"\nlisten = {{ tls = \"127.0.0.1:9001\" }}\n\
         network = \"network.doc\"\nnetwork_key = \"{}\"\n{extra}",
        key_hex()
    );
    RelayConfig::from_toml_str(&text, "relay.toml", Path::new("/r"))
}

/// A client configuration of three lines, then `extra`.
fn client(extra: &str) -> Result<ClientConfig, Error> {
    let text = format!(
        "socks_listen = \"127.0.0.1:9050\"\nnetwork = \"network.doc\"\nnetwork_key = \"{}\"\n{extra}",
        key_hex()
    );
    ClientConfig::from_toml_str(&text, "client.toml", Path::new("/c"))
}

/// The line and message of a parse error.
fn parse_error(err: &Error) -> (usize, &str) {
    match err {
        Error::Parse { line, message, .. } => (*line, message.as_str()),
        other => panic!("not a parse error: {other}"),
    }
}

fn tls() -> TransportChoice {
    "tls".parse().expect("tls is registered")
}

#[test]
fn defaults() {
    let r = relay("").unwrap();
    assert_eq!(
        r.listen.iter().collect::<Vec<_>>(),
        [(EndpointKind::TCP, "127.0.0.1:9001".parse().unwrap())]
    );
    assert_eq!(r.link, onionlab_transport::LinkSettings::default());
    assert_eq!(r.link.transport, TransportChoice::Auto);
    assert_eq!(r.link.quic.congestion, Congestion::Cubic);
    assert_eq!(r.torchestra, Default::default());
    let c = client("").unwrap();
    assert_eq!(c.link, r.link);
}

#[test]
fn every_transport_and_congestion_parses() {
    // Every registered transport, and auto.
    let choices: Vec<TransportChoice> = TransportChoice::all().collect();
    assert!(choices.len() >= 4, "{choices:?}");
    for t in choices {
        let name = t.name();
        assert_eq!(t.to_string(), name);
        assert_eq!(name.parse::<TransportChoice>().unwrap(), t);
        let r = relay(&format!("[link]\ntransport = \"{name}\"\n")).unwrap();
        assert_eq!(r.link.transport, t);
        let c = client(&format!("[link]\ntransport = \"{name}\"\n")).unwrap();
        assert_eq!(c.link.transport, t);
    }
    assert!(!tls().uses(EndpointKind::QUIC));
    assert!(TransportChoice::Auto.uses(EndpointKind::QUIC));
    for (name, cc) in [
        ("cubic", Congestion::Cubic),
        ("newreno", Congestion::NewReno),
        ("bbr", Congestion::Bbr),
    ] {
        assert_eq!(cc.to_string(), name);
        assert_eq!(name.parse::<Congestion>().unwrap(), cc);
        let r = relay(&format!("[link.quic]\ncongestion = \"{name}\"\n")).unwrap();
        assert_eq!(r.link.quic.congestion, cc);
        let c = client(&format!("link.quic.congestion = \"{name}\"\n")).unwrap();
        assert_eq!(c.link.quic.congestion, cc);
    }
}

/// A relay configuration whose `listen` table is `listen`.
fn relay_listening(listen: &str, extra: &str) -> Result<RelayConfig, Error> {
    let text = format!(
        "nickname = \"relay0\"\nkeys = \"keys.secret\"\nnetwork = \"network.doc\"\n\
         network_key = \"{}\"\n{extra}[listen]\n{listen}",
        key_hex()
    );
    RelayConfig::from_toml_str(&text, "relay.toml", Path::new("/r"))
}

#[test]
fn listen_addresses_by_endpoint() {
    let r = relay_listening(
        "tls = \"127.0.0.1:9001\"\nquic = \"[::1]:443\"\n",
        "link.transport = \"quic\"\n",
    )
    .unwrap();
    assert_eq!(
        r.listen.get(EndpointKind::QUIC),
        Some("[::1]:443".parse().unwrap())
    );
    assert_eq!(r.tls_address(), Some("127.0.0.1:9001".parse().unwrap()));
    assert_eq!(r.link.transport.name(), "quic");
    // Every relay listens on TCP.
    let err = relay_listening("quic = \"127.0.0.1:9001\"\n", "").unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err}");
    assert!(err.to_string().contains("needs a `tls` address"), "{err}");
    for (listen, what) in [
        (
            "tls = \"localhost:9001\"\n",
            "`tls` address `localhost:9001`",
        ),
        ("tls = \"127.0.0.1\"\n", "invalid socket address"),
        (
            "tls = \"127.0.0.1:1\"\nudp = \"127.0.0.1:1\"\n",
            "unknown endpoint `udp`",
        ),
    ] {
        let err = relay_listening(listen, "").unwrap_err();
        let (line, message) = parse_error(&err);
        assert_eq!(line, 5, "{listen}: {err}");
        assert!(message.contains(what), "{listen}: {err}");
    }
    // The format before the table: the error says what to write.
    let old = format!(
        "nickname = \"r\"\nkeys = \"k\"\nlisten = \"127.0.0.1:9001\"\nnetwork = \"n\"\nnetwork_key = \"{}\"\nquic_listen = \"127.0.0.1:9001\"\n",
        key_hex()
    );
    let err = RelayConfig::from_toml_str(&old, "relay.toml", Path::new("/r")).unwrap_err();
    assert!(
        err.to_string().contains("{ tls = \"127.0.0.1:9001\" }"),
        "{err}"
    );
    let err = relay("quic_listen = \"127.0.0.1:9001\"\n").unwrap_err();
    assert!(
        err.to_string()
            .contains("`quic_listen` is now [listen] quic"),
        "{err}"
    );
}

#[test]
fn bad_values_are_clear_errors() {
    let cases = [
        ("link.transport = \"udp\"\n", "unknown transport `udp`"),
        ("link.transport = \"QUIC\"\n", "`quic-conn-per-circuit`"),
        ("link.transport = 1\n", "string"),
        (
            "link.quic.congestion = \"new-reno\"\n",
            "unknown variant `new-reno`",
        ),
        ("link.quic.congestion = \"Cubic\"\n", "newreno"),
        ("link.tcp.congestion = \"Cubic\"\n", "kernel algorithm name"),
        ("link.tcp.unsent_limit = -1\n", ""),
        ("link.tcp.unsent_limit = 4294967296\n", ""),
        ("link.tcp.unsent_limit = \"16KiB\"\n", ""),
        ("link.pctcp = 3\n", "struct"),
        ("torchestra.alpha = \"high\"\n", "f64"),
        ("torchestra.gamma = 1\n", "unknown field `gamma`"),
        ("quic = true\n", "unknown field `quic`"),
    ];
    for (extra, what) in cases {
        let err = relay(extra).unwrap_err();
        assert!(
            err.to_string().starts_with("relay.toml:6:"),
            "{extra}: {err}"
        );
        let (line, message) = parse_error(&err);
        assert_eq!(line, 6, "{extra}: {err}");
        assert!(message.contains(what), "{extra}: {err}");
    }
    // Ranges and combinations, checked after parsing, name the setting.
    for (extra, what) in [
        ("link.handshake_timeout_ms = 0\n", "handshake_timeout_ms"),
        ("link.tcp.unsent_limit = 0\n", "unsent_limit"),
        ("[link.quic]\nkeep_alive_ms = 9000\n", "keep-alive"),
        ("link.quic.idle_timeout_ms = 100000000\n", "above the limit"),
        ("link.quic.initial_mtu = 1000\n", "initial MTU"),
        ("link.pctcp.max_lanes = 0\n", "max_lanes"),
        ("link.utcp.ack_delay_ms = 2000\n", "ack_delay_ms"),
        ("torchestra.alpha = 1.5\n", "alpha"),
        ("torchestra.window_ms = 0\n", "window_ms"),
    ] {
        let err = relay(extra).unwrap_err();
        assert!(
            matches!(err, Error::Invalid { .. }) && err.to_string().contains(what),
            "{extra}: {err}"
        );
        assert!(err.to_string().contains("relay.toml"), "{err}");
    }
    // A client has no QUIC listener and no classifier.
    let err = client("quic_listen = \"127.0.0.1:9001\"\n").unwrap_err();
    let (line, message) = parse_error(&err);
    assert_eq!(line, 4, "{err}");
    assert!(message.contains("unknown field `quic_listen`"), "{err}");
    assert!(client("[torchestra]\nalpha = 0.5\n").is_err());
    let err = client("link.transport = \"tcp\"\n").unwrap_err();
    assert!(err.to_string().starts_with("client.toml:4:"), "{err}");
    assert!(err.to_string().contains("expected one of"), "{err}");

    // FromStr names the valid strings.
    let err = "tcp".parse::<TransportChoice>().unwrap_err().to_string();
    assert!(
        err.contains("`auto`, `tls`, `quic`, `quic-conn-per-circuit`"),
        "{err}"
    );
    let err = "reno".parse::<Congestion>().unwrap_err().to_string();
    assert!(err.contains("\"cubic\", \"newreno\", \"bbr\""), "{err}");
}

/// A file from before the `[link]` section gets an error that says where
/// its key went.
#[test]
fn moved_keys_say_where_they_went() {
    for (extra, hint) in [
        ("transport = \"tls\"\n", "[link] transport"),
        ("quic_congestion = \"bbr\"\n", "[link.quic] congestion"),
        ("tcp_congestion = \"reno\"\n", "[link.tcp] congestion"),
        ("channel_unsent_limit = 16384\n", "[link.tcp] unsent_limit"),
        ("pctcp_max_lanes = 4\n", "[link.pctcp] max_lanes"),
        ("utcp = { tx_buffer = 262144 }\n", "[link.utcp]"),
        ("torchestra_alpha = 0.5\n", "[torchestra] alpha"),
    ] {
        let err = relay(extra).unwrap_err();
        let (line, message) = parse_error(&err);
        assert_eq!(line, 6, "{extra}: {err}");
        assert!(message.contains(hint), "{extra}: {err}");
    }
}

/// Found by the `config_parse` fuzz target: a NUL in a comment gave a
/// parse error with an empty message (`relay.toml:6:4: `).
#[test]
fn syntax_errors_say_something() {
    for extra in ["# a comment with a \0 inside\n", "x = \"\u{1}\"\n"] {
        let err = relay(extra).unwrap_err();
        let Error::Parse { line, message, .. } = &err else {
            panic!("{extra:?}: {err}");
        };
        assert_eq!(*line, 6, "{extra:?}: {err}");
        assert!(!message.is_empty(), "{extra:?}: {err:?}");
    }
}

#[test]
fn tcp_congestion_follows_quic_unless_set() {
    let named = |n: &str| TcpCongestion::Named(n.into());
    for (quic, tcp) in [("cubic", "cubic"), ("newreno", "reno"), ("bbr", "bbr")] {
        let r = relay(&format!("link.quic.congestion = \"{quic}\"\n")).unwrap();
        assert_eq!(r.link.tcp_congestion(), named(tcp));
        let c = client(&format!("link.quic.congestion = \"{quic}\"\n")).unwrap();
        assert_eq!(c.link.tcp_congestion(), named(tcp));
    }
    let r =
        relay("[link.quic]\ncongestion = \"bbr\"\n[link.tcp]\ncongestion = \"system\"\n").unwrap();
    assert_eq!(r.link.tcp_congestion(), TcpCongestion::System);
    let c = client("link.tcp.congestion = \"reno\"\n").unwrap();
    assert_eq!(c.link.tcp_congestion(), named("reno"));
    assert_eq!(relay("").unwrap().link.quic.initial_mtu, 1200);
    assert_eq!(
        client("link.quic.initial_mtu = 1472\n")
            .unwrap()
            .link
            .quic
            .initial_mtu,
        1472
    );
    assert_eq!(relay("").unwrap().link.tcp.unsent_limit, None);
    assert_eq!(
        relay("link.tcp.unsent_limit = 16384\n")
            .unwrap()
            .link
            .tcp
            .unsent_limit,
        Some(16384)
    );
}

/// A relay configuration with a value in every section, and paths and a
/// log filter that need TOML's escaping (quotes, backslashes, non-ASCII,
/// a newline).
fn busy_relay() -> RelayConfig {
    let mut cfg = RelayConfig::new(
        "relay7",
        PathBuf::from("/tmp/lab \"one\"\\two/ü\nkeys.secret"),
        "10.0.0.7:9001".parse().unwrap(),
        NetworkSource::parse("http://10.0.0.1:7000/network.doc").unwrap(),
        &key_hex(),
    )
    .unwrap();
    cfg.listen
        .insert(EndpointKind::QUIC, "10.0.0.7:9001".parse().unwrap());
    cfg.listen
        .insert(EndpointKind::UTCP, "[::1]:9004".parse().unwrap());
    cfg.log = Some("info,onionlab_node=\"debug\"".into());
    cfg.exit_allow_private = PrivateTargets::parse(&["127.0.0.1:8000", "[::1]:80-90"]).unwrap();
    cfg.dos_create_rate = 7;
    cfg.link.transport = "pctcp".parse().unwrap();
    cfg.link.tcp.congestion = Some(TcpCongestion::System);
    cfg.link.tcp.unsent_limit = Some(16384);
    cfg.link.quic.congestion = Congestion::Bbr;
    cfg.link.quic.initial_mtu = 1472;
    cfg.link.pctcp.max_lanes = 9;
    cfg.link.utcp.tx_buffer = 262_144;
    cfg.link.utcp.ack_delay = None;
    cfg.torchestra.alpha = 0.25;
    cfg
}

#[test]
fn written_configurations_read_back_equal() {
    let cfg = busy_relay();
    let text = cfg.to_toml().unwrap();
    let back = RelayConfig::from_toml_str(&text, "written", Path::new("/elsewhere")).unwrap();
    assert_eq!(back, cfg, "{text}");
    // Defaults are left out; set values are written.
    assert!(!text.contains("dos_conn_rate"), "{text}");
    assert!(text.contains("dos_create_rate = 7"), "{text}");
    assert!(!text.contains("keep_alive_ms"), "{text}");
    assert!(text.contains("[link.utcp]"), "{text}");
    // A default configuration writes only its required keys.
    let plain = RelayConfig::new(
        "r",
        PathBuf::from("k"),
        "127.0.0.1:1".parse().unwrap(),
        NetworkSource::parse("n").unwrap(),
        &key_hex(),
    )
    .unwrap();
    let text = plain.to_toml().unwrap();
    // Four keys, a blank line, and the [listen] table's header and line.
    assert_eq!(text.lines().count(), 7, "{text}");

    let mut c = ClientConfig::new(
        "127.0.0.1:9050".parse().unwrap(),
        NetworkSource::File(PathBuf::from("/a \"b\"/c\\d.doc")),
        &key_hex(),
    )
    .unwrap();
    c.path = Some(vec!["relay1".into(), "relay2".into()]);
    c.path_seed = Some(u64::from(u32::MAX) * 7);
    c.leg_scheduler = onionlab_circuit::conflux::sched::LegSchedulerKind::parse("round-robin:4");
    assert!(c.leg_scheduler.is_some());
    c.link = cfg.link.clone();
    let text = c.to_toml().unwrap();
    let back = ClientConfig::from_toml_str(&text, "written", Path::new("/x")).unwrap();
    assert_eq!(back, c, "{text}");
}

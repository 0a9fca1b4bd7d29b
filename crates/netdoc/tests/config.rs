//! Relay and client configuration: the transport fields (`quic_listen`,
//! `transport`, `quic_congestion`), their defaults, and errors for bad values.

use std::path::Path;

use onionlab_netdoc::config::{ClientConfig, Congestion, RelayConfig, TransportChoice};
use onionlab_netdoc::Error;
use onionlab_transport::endpoint::EndpointKind;

/// A valid network public key in hex.
fn key_hex() -> String {
    let kp = tor_llcrypto::pk::ed25519::Keypair::from_bytes(&[5; 32]);
    hex::encode(kp.verifying_key().as_bytes())
}

/// A relay configuration of five lines, then `extra`.
fn relay(extra: &str) -> Result<RelayConfig, Error> {
    let text = format!(
        "nickname = \"relay0\"\nkeys = \"keys.secret\"\nlisten = \"127.0.0.1:9001\"\n\
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
    assert_eq!(r.quic_listen, None);
    assert_eq!(r.transport, TransportChoice::Auto);
    assert_eq!(r.quic_congestion, Congestion::Cubic);
    let c = client("").unwrap();
    assert_eq!(c.transport, TransportChoice::Auto);
    assert_eq!(c.quic_congestion, Congestion::Cubic);
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
        let r = relay(&format!("transport = \"{name}\"\n")).unwrap();
        assert_eq!(r.transport, t);
        let c = client(&format!("transport = \"{name}\"\n")).unwrap();
        assert_eq!(c.transport, t);
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
        let r = relay(&format!("quic_congestion = \"{name}\"\n")).unwrap();
        assert_eq!(r.quic_congestion, cc);
        let c = client(&format!("quic_congestion = \"{name}\"\n")).unwrap();
        assert_eq!(c.quic_congestion, cc);
    }
}

#[test]
fn quic_listen() {
    let r = relay("quic_listen = \"127.0.0.1:9001\"\ntransport = \"quic\"\n").unwrap();
    assert_eq!(r.quic_listen, Some("127.0.0.1:9001".parse().unwrap()));
    assert_eq!(r.transport.name(), "quic");
    let r = relay("quic_listen = \"[::1]:443\"\n").unwrap();
    assert_eq!(r.quic_listen, Some("[::1]:443".parse().unwrap()));
}

#[test]
fn bad_values_are_clear_errors() {
    let cases = [
        ("transport = \"udp\"\n", "unknown transport `udp`"),
        ("transport = \"QUIC\"\n", "`quic-conn-per-circuit`"),
        ("transport = 1\n", "string"),
        (
            "quic_congestion = \"new-reno\"\n",
            "unknown variant `new-reno`",
        ),
        ("quic_congestion = \"Cubic\"\n", "newreno"),
        ("quic_listen = \"localhost\"\n", "invalid socket address"),
        ("quic_listen = \"127.0.0.1\"\n", "invalid socket address"),
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
    // A client has no QUIC listener.
    let err = client("quic_listen = \"127.0.0.1:9001\"\n").unwrap_err();
    let (line, message) = parse_error(&err);
    assert_eq!(line, 4, "{err}");
    assert!(message.contains("unknown field `quic_listen`"), "{err}");
    let err = client("transport = \"tcp\"\n").unwrap_err();
    assert!(err.to_string().starts_with("client.toml:4:"), "{err}");
    assert!(err.to_string().contains("expected one of"), "{err}");

    // FromStr names the valid strings.
    let err = "tcp".parse::<TransportChoice>().unwrap_err().to_string();
    assert!(
        err.contains("`auto`, `tls`, `quic`, `quic-conn-per-circuit`"),
        "{err}"
    );
    let err = "reno".parse::<Congestion>().unwrap_err();
    assert!(err.contains("\"cubic\", \"newreno\", \"bbr\""), "{err}");
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
    for (quic, tcp) in [("cubic", "cubic"), ("newreno", "reno"), ("bbr", "bbr")] {
        let r = relay(&format!("quic_congestion = \"{quic}\"\n")).unwrap();
        assert_eq!(r.tcp_congestion_name(), tcp);
        let c = client(&format!("quic_congestion = \"{quic}\"\n")).unwrap();
        assert_eq!(c.tcp_congestion_name(), tcp);
    }
    let r = relay("quic_congestion = \"bbr\"\ntcp_congestion = \"system\"\n").unwrap();
    assert_eq!(r.tcp_congestion_name(), "system");
    let c = client("tcp_congestion = \"reno\"\n").unwrap();
    assert_eq!(c.tcp_congestion_name(), "reno");
    for bad in ["Cubic", "", "cu bic", "a_name_far_too_long"] {
        let e = relay(&format!("tcp_congestion = \"{bad}\"\n")).unwrap_err();
        assert!(
            e.to_string().contains("kernel congestion control name"),
            "{e}"
        );
    }
    assert_eq!(relay("").unwrap().quic_initial_mtu, 1200);
    assert!(relay("quic_initial_mtu = 1000\n").is_err());
    assert_eq!(
        client("quic_initial_mtu = 1472\n")
            .unwrap()
            .quic_initial_mtu,
        1472
    );
}

#[test]
fn channel_unsent_limit_is_optional_and_positive() {
    assert_eq!(relay("").unwrap().channel_unsent_limit, None);
    assert_eq!(client("").unwrap().channel_unsent_limit, None);
    assert_eq!(
        relay("channel_unsent_limit = 16384\n")
            .unwrap()
            .channel_unsent_limit,
        Some(16384)
    );
    assert_eq!(
        client("channel_unsent_limit = 4096\n")
            .unwrap()
            .channel_unsent_limit,
        Some(4096)
    );
    for bad in ["0", "-1", "4294967296", "\"16KiB\""] {
        let e = relay(&format!("channel_unsent_limit = {bad}\n")).unwrap_err();
        let (line, message) = parse_error(&e);
        assert_eq!(line, 6, "{bad}: {e}");
        assert!(!message.is_empty());
    }
}

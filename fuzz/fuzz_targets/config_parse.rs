//! Arbitrary text as a relay configuration (`RelayConfig::from_toml_str`)
//! and as a client configuration (`ClientConfig::from_toml_str`), both
//! with relative paths resolved against `/lab/node`.
//!
//! Checked besides "no panic":
//! * an error is `Parse` (with a line and column inside the text) or
//!   `Invalid`, and names the origin;
//! * a configuration that parses keeps the rules its fields document: the
//!   network key parses, every "must be positive" setting is above 0, the
//!   `[link]` section passes its own check (QUIC keep-alive below the idle
//!   timeout, at most a day, and the rest) and its QUIC settings validate
//!   as the transport checks them (`QuicSettings::validate`); nicknames (the relay's, a pinned
//!   path's) are valid; a URL source prints to a URL that parses back
//!   equal; relative paths became absolute; parsing is deterministic;
//! * a relay's `exit_allow_private` prints (`Display`, a TOML array) to
//!   entries that parse back to an equal list;
//! * a configuration that parses writes (`to_toml`) a file that reads
//!   back equal;
//! * a client configuration turns into `ClientSettings` (as
//!   `onionlab client` does) whose QUIC settings validate and whose
//!   timeouts can be added to `Instant::now()`.
#![no_main]

use std::path::Path;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use onionlab_client::ClientSettings;
use onionlab_config::directory::HttpUrl;
use onionlab_config::Error;
use onionlab_config::NetworkSource;
use onionlab_config::{ClientConfig, ConfigFile, RelayConfig};
use onionlab_netdoc::{ExitPolicy, NetworkDocument, RelayEntry, TransportAddress};
use onionlab_transport::LinkSettings;

const BASE: &str = "/lab/node";

fn valid_nickname(n: &str) -> bool {
    (1..=19).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_alphanumeric())
}

fn check_error(e: &Error, text: &str, origin: &str) {
    match e {
        Error::Parse {
            origin: o,
            line,
            column,
            message,
        } => {
            assert_eq!(o, origin);
            assert!(*line >= 1 && *column >= 1);
            assert!(
                *line <= text.split('\n').count(),
                "line {line} past the end"
            );
            assert!(!message.is_empty(), "empty message: {e:?}");
        }
        Error::Invalid { origin: o, message } => {
            assert_eq!(o, origin);
            assert!(!message.is_empty());
        }
        other => panic!("unexpected error kind: {other}"),
    }
}

fn check_source(s: &NetworkSource) {
    match s {
        NetworkSource::File(p) => assert!(p.is_absolute(), "{p:?} not resolved"),
        NetworkSource::Url(u) => {
            let back = HttpUrl::parse(&u.to_string()).expect("a printed URL parses");
            assert_eq!(&back, u);
        }
    }
}

fn check_link(link: &LinkSettings) {
    link.check().expect("a parsed [link] section checks");
    let quic = link.quic_settings();
    assert!(quic.keep_alive > Duration::ZERO && quic.keep_alive < quic.idle_timeout);
    assert!(quic.idle_timeout <= Duration::from_secs(24 * 3600));
    quic.validate()
        .expect("QUIC settings of a valid configuration validate");
}

fn relay(text: &str) {
    let base = Path::new(BASE);
    let cfg = match RelayConfig::from_toml_str(text, "relay.toml", base) {
        Ok(cfg) => cfg,
        Err(e) => return check_error(&e, text, "relay.toml"),
    };
    let again = RelayConfig::from_toml_str(text, "relay.toml", base).expect("parses twice");
    assert_eq!(again, cfg);
    cfg.network_public_key()
        .expect("a parsed network key is valid");
    assert!(valid_nickname(&cfg.nickname), "{:?}", cfg.nickname);
    assert!(cfg.keys.is_absolute());
    check_source(&cfg.network);
    for v in [
        cfg.ewma_half_life_ms,
        cfg.max_mem_in_queues,
        cfg.exit_connect_timeout_ms,
        cfg.exit_max_concurrent_lookups,
        cfg.exit_max_pending_connects,
        cfg.dos_max_conns_per_address,
        cfg.dos_conn_rate,
        cfg.dos_conn_burst,
        cfg.dos_max_conns_total,
        cfg.dos_max_handshakes,
        cfg.dos_create_rate,
        cfg.dos_create_burst,
        cfg.dos_create_min_conns,
    ] {
        assert!(v > 0, "a setting that must be positive is 0");
    }
    check_link(&cfg.link);
    cfg.torchestra
        .validate()
        .expect("a parsed classifier validates");
    let written = cfg.to_toml().expect("a parsed configuration writes");
    let back = RelayConfig::from_toml_str(&written, "written.toml", base)
        .unwrap_or_else(|e| panic!("written configuration does not parse: {e}\n{written}"));
    assert_eq!(back, cfg, "{written}");
    // exit_allow_private prints as a TOML array that parses back equal.
    let key = tor_llcrypto::pk::ed25519::Keypair::from_bytes(&[3; 32]).verifying_key();
    let key: String = key.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let printed = format!(
        "nickname = \"r\"\nkeys = \"k\"\nlisten = \"127.0.0.1:1\"\nnetwork = \"n\"\n\
         network_key = \"{key}\"\nexit_allow_private = {}\n",
        cfg.exit_allow_private
    );
    let back = RelayConfig::from_toml_str(&printed, "printed.toml", base)
        .unwrap_or_else(|e| panic!("printed exit_allow_private does not parse: {e}\n{printed}"));
    assert_eq!(back.exit_allow_private, cfg.exit_allow_private);
}

fn document() -> NetworkDocument {
    let mut entry = RelayEntry {
        nickname: "relay1".into(),
        ed_identity: [1; 32],
        ntor_onion_key: [2; 32],
        sphinx_key: None,
        addresses: vec![TransportAddress {
            transport: "tls".into(),
            addr: "10.0.0.1:9001".parse().expect("literal"),
        }],
        flags: Default::default(),
        bandwidth: 1,
        exit_policy: ExitPolicy::reject_all(),
    };
    entry.flags.guard = true;
    NetworkDocument {
        network_name: "fuzz".into(),
        created_unix: 1,
        valid_after_unix: 1,
        valid_until_unix: 2,
        params: Default::default(),
        relays: vec![entry],
    }
}

fn client(text: &str) {
    let base = Path::new(BASE);
    let cfg = match ClientConfig::from_toml_str(text, "client.toml", base) {
        Ok(cfg) => cfg,
        Err(e) => return check_error(&e, text, "client.toml"),
    };
    let again = ClientConfig::from_toml_str(text, "client.toml", base).expect("parses twice");
    assert_eq!(again, cfg);
    cfg.network_public_key()
        .expect("a parsed network key is valid");
    check_source(&cfg.network);
    if let Some(path) = &cfg.path {
        assert!(!path.is_empty());
        assert!(path.iter().all(|n| valid_nickname(n)), "{path:?}");
    }
    for v in [
        cfg.circuit_build_timeout_ms,
        cfg.stream_connect_timeout_ms,
        cfg.socks_handshake_timeout_ms,
        cfg.max_socks_connections,
    ] {
        assert!(v > 0, "a setting that must be positive is 0");
    }
    check_link(&cfg.link);
    let written = cfg.to_toml().expect("a parsed configuration writes");
    let back = ClientConfig::from_toml_str(&written, "written.toml", base)
        .unwrap_or_else(|e| panic!("written configuration does not parse: {e}\n{written}"));
    assert_eq!(back, cfg, "{written}");
    let settings = ClientSettings::from_config(&cfg, document())
        .expect("a configuration that parsed gives client settings");
    settings
        .link
        .quic_settings()
        .validate()
        .expect("the client's QUIC settings validate");
    let now = Instant::now();
    for d in [
        settings.policy.circuit_build_timeout,
        settings.policy.stream_connect_timeout,
        settings.socks_handshake_timeout,
        settings.link.handshake_timeout,
        settings.network_refresh.unwrap_or_default(),
    ] {
        assert!(
            now.checked_add(d).is_some(),
            "timeout {d:?} overflows a deadline"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    relay(text);
    client(text);
});

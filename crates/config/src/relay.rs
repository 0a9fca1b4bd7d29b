//! A relay's configuration file (`relay.toml`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use onionlab_circuit::relay::ExitPackaging;
use onionlab_circuit::torchestra::ClassifierParams;
use serde::{Deserialize, Deserializer, Serialize};
use tor_llcrypto::pk::ed25519::PublicKey;

use crate::error::Result;
use crate::files::{
    de_network_key, de_nickname, de_positive, invalid, resolve, ser_display, ConfigFile,
    LinkSettings, NetworkSource, Scheduler,
};
use onionlab_netdoc::exit_targets::PrivateTargets;
use onionlab_netdoc::keys::parse_public_key;
use onionlab_transport::addrs::EndpointAddrs;
use onionlab_transport::endpoint::EndpointKind;

/// Default [`RelayConfig::exit_max_concurrent_lookups`].
pub const DEFAULT_EXIT_MAX_CONCURRENT_LOOKUPS: u64 = 64;
/// Default [`RelayConfig::exit_max_pending_connects`].
pub const DEFAULT_EXIT_MAX_PENDING_CONNECTS: u64 = 1024;
/// Default [`RelayConfig::dos_max_conns_per_address`].
pub const DEFAULT_DOS_MAX_CONNS_PER_ADDRESS: u64 = 50;
/// Default [`RelayConfig::dos_conn_rate`].
pub const DEFAULT_DOS_CONN_RATE: u64 = 20;
/// Default [`RelayConfig::dos_conn_burst`].
pub const DEFAULT_DOS_CONN_BURST: u64 = 40;
/// Default [`RelayConfig::dos_max_conns_total`].
pub const DEFAULT_DOS_MAX_CONNS_TOTAL: u64 = 8192;
/// Default [`RelayConfig::dos_max_handshakes`].
pub const DEFAULT_DOS_MAX_HANDSHAKES: u64 = 256;
/// Default [`RelayConfig::dos_create_rate`].
pub const DEFAULT_DOS_CREATE_RATE: u64 = 3;
/// Default [`RelayConfig::dos_create_burst`].
pub const DEFAULT_DOS_CREATE_BURST: u64 = 90;
/// Default [`RelayConfig::dos_create_min_conns`].
pub const DEFAULT_DOS_CREATE_MIN_CONNS: u64 = 3;
/// Default [`RelayConfig::dos_quic_retry_rate`].
pub const DEFAULT_DOS_QUIC_RETRY_RATE: u64 = 100;
/// Default [`RelayConfig::channel_idle_timeout_ms`]: 3 minutes.
pub const DEFAULT_CHANNEL_IDLE_TIMEOUT_MS: u64 = 180_000;
/// Default [`RelayConfig::ewma_half_life_ms`].
pub const DEFAULT_EWMA_HALF_LIFE_MS: u64 = 30_000;
/// Default [`RelayConfig::max_mem_in_queues`]: 256 MiB.
pub const DEFAULT_MAX_MEM_IN_QUEUES: u64 = 256 * 1024 * 1024;
/// Default [`RelayConfig::exit_connect_timeout_ms`].
pub const DEFAULT_EXIT_CONNECT_TIMEOUT_MS: u64 = 10_000;

/// A relay's configuration file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    /// The relay's nickname, as in the network document.
    #[serde(deserialize_with = "de_nickname")]
    pub nickname: String,
    /// The relay secret keys file (see [`onionlab_netdoc::keys::load_relay_keys`]).
    pub keys: PathBuf,
    /// Where the relay's endpoints listen (`[listen]`), by the network
    /// document's names: `tls` (TCP, required) for TLS and the
    /// transports that share its port, `quic` (UDP) for both QUIC
    /// transports, `utcp` (UDP) for dtls-utcp. Without an endpoint's
    /// address the relay does not accept its transports (it may still
    /// open links with them, as its `transport` says).
    pub listen: EndpointAddrs,
    /// Where the network document comes from.
    pub network: NetworkSource,
    /// The network public key, 64 hex digits (checked when loading; see
    /// [`RelayConfig::network_public_key`]).
    #[serde(deserialize_with = "de_network_key")]
    pub network_key: String,
    /// Circuit scheduler; default EWMA.
    #[serde(default)]
    pub scheduler: Scheduler,
    /// Exits: when the target's bytes become DATA cells, and so when the
    /// circuit congestion control counts them in flight: `"lazy"`
    /// (onionlab's, the default) or `"eager"` (C tor's); see
    /// [`ExitPackaging`].
    #[serde(
        default,
        deserialize_with = "de_exit_packaging",
        serialize_with = "ser_display"
    )]
    pub exit_packaging: ExitPackaging,
    /// EWMA half-life in milliseconds (default 30000); must be positive.
    #[serde(
        default = "default_ewma_half_life_ms",
        deserialize_with = "de_positive"
    )]
    pub ewma_half_life_ms: u64,
    /// Most bytes of cells queued in the relay (default 256 MiB); must be
    /// positive.
    #[serde(
        default = "default_max_mem_in_queues",
        deserialize_with = "de_positive"
    )]
    pub max_mem_in_queues: u64,
    /// Exit: bound on resolving a target's name and on each connection
    /// attempt to it, in milliseconds (default 10000); must be positive.
    #[serde(
        default = "default_exit_connect_timeout_ms",
        deserialize_with = "de_positive"
    )]
    pub exit_connect_timeout_ms: u64,
    /// Exit: refuse private, loopback, link-local and other local
    /// addresses and the exit's own addresses, whatever the exit policy
    /// says (default true; C tor's `ExitPolicyRejectPrivate`). The
    /// relays' OR ports are refused either way. See
    /// [`onionlab_netdoc::exit_targets`].
    #[serde(default = "default_true")]
    pub exit_reject_private: bool,
    /// Exit: private or local targets allowed despite
    /// `exit_reject_private`, as `ADDR[/BITS]:PORT[-PORT]` (for example
    /// `["127.0.0.1:8000"]`: a server run for a local network); default
    /// none.
    #[serde(default)]
    pub exit_allow_private: PrivateTargets,
    /// Exit: most name lookups running at once (default 64); must be
    /// positive.
    #[serde(
        default = "default_exit_max_concurrent_lookups",
        deserialize_with = "de_positive"
    )]
    pub exit_max_concurrent_lookups: u64,
    /// Exit: most streams resolving or connecting at once (default 1024);
    /// must be positive.
    #[serde(
        default = "default_exit_max_pending_connects",
        deserialize_with = "de_positive"
    )]
    pub exit_max_pending_connects: u64,
    /// Most connections from one address at once, relays of the network not counted (default 50; C tor's `DoSConnectionMaxConcurrentCount`). Must be positive.
    #[serde(
        default = "default_dos_max_conns_per_address",
        deserialize_with = "de_positive"
    )]
    pub dos_max_conns_per_address: u64,
    /// New connections per second from one address (default 20; `DoSConnectionConnectRate`). Must be positive.
    #[serde(default = "default_dos_conn_rate", deserialize_with = "de_positive")]
    pub dos_conn_rate: u64,
    /// Burst of new connections from one address (default 40; `DoSConnectionConnectBurst`). Must be positive.
    #[serde(default = "default_dos_conn_burst", deserialize_with = "de_positive")]
    pub dos_conn_burst: u64,
    /// Most incoming connections at once (default 8192). Must be positive.
    #[serde(
        default = "default_dos_max_conns_total",
        deserialize_with = "de_positive"
    )]
    pub dos_max_conns_total: u64,
    /// Most incoming link handshakes in progress at once (default 256). Must be positive.
    #[serde(
        default = "default_dos_max_handshakes",
        deserialize_with = "de_positive"
    )]
    pub dos_max_handshakes: u64,
    /// CREATE2 cells per second from one client address (default 3; `DoSCircuitCreationRate`). Must be positive.
    #[serde(default = "default_dos_create_rate", deserialize_with = "de_positive")]
    pub dos_create_rate: u64,
    /// Burst of CREATE2 cells from one client address (default 90; `DoSCircuitCreationBurst`). Must be positive.
    #[serde(default = "default_dos_create_burst", deserialize_with = "de_positive")]
    pub dos_create_burst: u64,
    /// The CREATE2 limit applies to addresses with at least this many connections (default 3; `DoSCircuitCreationMinConnections`). Must be positive.
    #[serde(
        default = "default_dos_create_min_conns",
        deserialize_with = "de_positive"
    )]
    pub dos_create_min_conns: u64,
    /// QUIC handshakes per second, from everyone, above which peers that have not proved their address get a QUIC Retry first (default 100). Must be positive.
    #[serde(
        default = "default_dos_quic_retry_rate",
        deserialize_with = "de_positive"
    )]
    pub dos_quic_retry_rate: u64,
    /// A channel (TLS or QUIC, either direction) that has had no circuit for this long is closed (default 180000). Must be positive.
    #[serde(
        default = "default_channel_idle_timeout_ms",
        deserialize_with = "de_positive"
    )]
    pub channel_idle_timeout_ms: u64,
    /// Log filter in `tracing_subscriber::EnvFilter` syntax (for example
    /// `"info"` or `"info,onionlab_node=debug"`); none means the program's
    /// default.
    #[serde(default)]
    pub log: Option<String>,
    /// How this relay makes its links (`[link]`: transport, TCP, QUIC,
    /// pctcp and dtls-utcp settings), as a client's; defaults as
    /// [`LinkSettings::default`].
    #[serde(default)]
    pub link: LinkSettings,
    /// Torchestra's classifier at the exit (`[torchestra]`, used when
    /// `link.transport` is `"torchestra"`; docs/torchestra.md).
    #[serde(default)]
    pub torchestra: ClassifierParams,
}

fn default_exit_max_concurrent_lookups() -> u64 {
    DEFAULT_EXIT_MAX_CONCURRENT_LOOKUPS
}
fn default_exit_max_pending_connects() -> u64 {
    DEFAULT_EXIT_MAX_PENDING_CONNECTS
}
fn default_dos_max_conns_per_address() -> u64 {
    DEFAULT_DOS_MAX_CONNS_PER_ADDRESS
}
fn default_dos_conn_rate() -> u64 {
    DEFAULT_DOS_CONN_RATE
}
fn default_dos_conn_burst() -> u64 {
    DEFAULT_DOS_CONN_BURST
}
fn default_dos_max_conns_total() -> u64 {
    DEFAULT_DOS_MAX_CONNS_TOTAL
}
fn default_dos_max_handshakes() -> u64 {
    DEFAULT_DOS_MAX_HANDSHAKES
}
fn default_dos_create_rate() -> u64 {
    DEFAULT_DOS_CREATE_RATE
}
fn default_dos_create_burst() -> u64 {
    DEFAULT_DOS_CREATE_BURST
}
fn default_dos_create_min_conns() -> u64 {
    DEFAULT_DOS_CREATE_MIN_CONNS
}
fn default_dos_quic_retry_rate() -> u64 {
    DEFAULT_DOS_QUIC_RETRY_RATE
}
fn default_channel_idle_timeout_ms() -> u64 {
    DEFAULT_CHANNEL_IDLE_TIMEOUT_MS
}
fn default_ewma_half_life_ms() -> u64 {
    DEFAULT_EWMA_HALF_LIFE_MS
}
fn default_max_mem_in_queues() -> u64 {
    DEFAULT_MAX_MEM_IN_QUEUES
}
fn default_exit_connect_timeout_ms() -> u64 {
    DEFAULT_EXIT_CONNECT_TIMEOUT_MS
}
fn default_true() -> bool {
    true
}

/// `exit_packaging`: a name [`ExitPackaging::parse`] takes.
fn de_exit_packaging<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<ExitPackaging, D::Error> {
    let name = String::deserialize(d)?;
    ExitPackaging::parse(&name).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "exit_packaging {name:?} is not one of {}",
            ExitPackaging::NAMES.join(", ")
        ))
    })
}

impl RelayConfig {
    /// A configuration with these 5 required settings (`listen`: the
    /// `tls` address only) and every other at its default.
    ///
    /// # Errors
    ///
    /// [`crate::Error::Parse`] for a nickname or network key that is not
    /// valid.
    pub fn new(
        nickname: &str,
        keys: PathBuf,
        listen: SocketAddr,
        network: NetworkSource,
        network_key: &str,
    ) -> Result<Self> {
        #[derive(Serialize)]
        struct Required<'a> {
            nickname: &'a str,
            keys: PathBuf,
            listen: EndpointAddrs,
            network: NetworkSource,
            network_key: &'a str,
        }
        crate::files::config_from_required(
            &Required {
                nickname,
                keys,
                listen: EndpointAddrs::new().with(EndpointKind::TCP, listen),
                network,
                network_key,
            },
            "relay configuration",
        )
    }

    /// The TCP endpoint's address (`tls` in `[listen]`, which a loaded
    /// configuration has).
    pub fn tls_address(&self) -> Option<SocketAddr> {
        self.listen.get(EndpointKind::TCP)
    }

    /// The network public key.
    ///
    /// # Errors
    ///
    /// [`crate::Error::Document`] if `network_key` was changed to something
    /// invalid after loading.
    pub fn network_public_key(&self) -> Result<PublicKey> {
        Ok(parse_public_key(
            &self.network_key,
            "relay configuration network_key",
        )?)
    }
}

impl ConfigFile for RelayConfig {
    const REQUIRED: &'static [&'static str] =
        &["nickname", "keys", "listen", "network", "network_key"];

    fn check(&self, origin: &str) -> Result<()> {
        if self.tls_address().is_none() {
            return Err(invalid(
                origin,
                format!(
                    "[listen] needs a `{}` address: every relay listens on TCP",
                    EndpointKind::TCP
                ),
            ));
        }
        self.link
            .check()
            .map_err(|e| invalid(origin, e.to_string()))?;
        self.torchestra
            .validate()
            .map_err(|e| invalid(origin, e.to_string()))
    }

    fn resolve_paths(&mut self, base: &Path) {
        self.keys = resolve(base, &self.keys);
        self.network.resolve_against(base);
    }
}

#[cfg(test)]
mod test {
    use std::time::Duration;

    use super::*;
    use crate::Error;

    use crate::files::test_key_hex as key_hex;

    fn relay_text(extra: &str) -> String {
        format!(
            "nickname = \"relay0\"\nkeys = \"keys.secret\"\nlisten = {{ tls = \"127.0.0.1:9001\" }}\n\
             network = \"../../network.doc\"\nnetwork_key = \"{}\"\n{extra}",
            key_hex()
        )
    }

    #[test]
    fn relay_defaults_and_paths() {
        let cfg =
            RelayConfig::from_toml_str(&relay_text(""), "r.toml", Path::new("/lab/r0")).unwrap();
        assert_eq!(cfg.keys, PathBuf::from("/lab/r0/keys.secret"));
        assert_eq!(
            cfg.network,
            NetworkSource::File(PathBuf::from("/lab/r0/../../network.doc"))
        );
        assert_eq!(cfg.scheduler, Scheduler::Ewma);
        assert_eq!(cfg.exit_packaging, ExitPackaging::Lazy);
        assert_eq!(cfg.ewma_half_life_ms, 30_000);
        assert_eq!(cfg.max_mem_in_queues, 256 << 20);
        assert_eq!(cfg.log, None);
        assert!(cfg.network_public_key().is_ok());

        let cfg = RelayConfig::from_toml_str(
            &relay_text(
                "scheduler = \"round-robin\"\nlog = \"debug\"\nkeys = \"/abs/k\"\n\
                 exit_packaging = \"eager\"\n",
            )
            .replace("keys = \"keys.secret\"\n", ""),
            "r.toml",
            Path::new("/lab/r0"),
        )
        .unwrap();
        assert_eq!(cfg.scheduler, Scheduler::RoundRobin);
        assert_eq!(cfg.exit_packaging, ExitPackaging::Eager);
        assert_eq!(cfg.keys, PathBuf::from("/abs/k"));
        assert_eq!(cfg.log.as_deref(), Some("debug"));
    }

    #[test]
    fn quic_timers_must_fit_together() {
        let base = Path::new("/lab/r0");
        let ok = RelayConfig::from_toml_str(
            &relay_text("[link.quic]\nkeep_alive_ms = 500\nidle_timeout_ms = 3000\n"),
            "r.toml",
            base,
        )
        .unwrap();
        assert_eq!(
            (ok.link.quic.keep_alive, ok.link.quic.idle_timeout),
            (Duration::from_millis(500), Duration::from_secs(3))
        );
        for (extra, want) in [
            (
                "link.quic.keep_alive_ms = 9000\n",
                "must be shorter than the idle timeout",
            ),
            ("link.quic.idle_timeout_ms = 100000000\n", "above the limit"),
            ("link.quic.idle_timeout_ms = 0\n", "must be positive"),
            ("exit_connect_timeout_ms = 0\n", "greater than 0"),
        ] {
            let e = RelayConfig::from_toml_str(&relay_text(extra), "r.toml", base).unwrap_err();
            let e = e.to_string();
            assert!(e.contains("r.toml") && e.contains(want), "{extra}: {e}");
        }
    }

    #[test]
    fn relay_errors_name_file_and_line() {
        let cases = [
            ("colour = 1\n", 6, "unknown field"),
            ("scheduler = \"fifo\"\n", 6, "unknown variant"),
            ("exit_packaging = \"soon\"\n", 6, "lazy, eager"),
            ("ewma_half_life_ms = 0\n", 6, "greater than 0"),
            ("max_mem_in_queues = -1\n", 6, ""),
        ];
        for (extra, line, what) in cases {
            let err = RelayConfig::from_toml_str(&relay_text(extra), "r.toml", Path::new("."))
                .unwrap_err();
            let Error::Parse {
                origin,
                line: l,
                message,
                ..
            } = &err
            else {
                panic!("{extra}: {err}");
            };
            assert_eq!(origin, "r.toml");
            assert_eq!(*l, line, "{extra}: {err}");
            assert!(message.contains(what), "{extra}: {err}");
        }
        let err = RelayConfig::from_toml_str(
            &relay_text("").replace(&key_hex(), "abcd"),
            "r.toml",
            Path::new("."),
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("r.toml:5:"), "{err}");
        assert!(err.to_string().contains("network public key"), "{err}");
        let err = RelayConfig::from_toml_str(
            &relay_text("").replace("relay0", "relay_0"),
            "r.toml",
            Path::new("."),
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("r.toml:1:"), "{err}");
        let err = RelayConfig::from_toml_str(
            &relay_text("").replace("../../network.doc", "https://127.0.0.1/x"),
            "r.toml",
            Path::new("."),
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("r.toml:4:"), "{err}");
        assert!(err.to_string().contains("only http://"), "{err}");
        let err = RelayConfig::from_toml_str(
            &relay_text("").replace("listen = { tls = \"127.0.0.1:9001\" }\n", ""),
            "r.toml",
            Path::new("."),
        )
        .unwrap_err();
        assert!(err.to_string().contains("missing field `listen`"), "{err}");
    }
}

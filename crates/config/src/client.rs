//! A client's configuration file (`client.toml`).

use std::net::SocketAddr;
use std::path::Path;

use onionlab_circuit::conflux::sched::LegSchedulerKind;
use serde::{Deserialize, Deserializer, Serialize};
use tor_llcrypto::pk::ed25519::PublicKey;

use crate::error::Result;
use crate::files::{de_network_key, de_positive, invalid, ConfigFile, LinkSettings, NetworkSource};
use onionlab_netdoc::doc::valid_nickname;
use onionlab_netdoc::keys::parse_public_key;

// The client's decisions declare their defaults; the file's keys take them.
use onionlab_client_core as policy;

/// Default [`ClientConfig::circuit_build_timeout_ms`].
pub const DEFAULT_CIRCUIT_BUILD_TIMEOUT_MS: u64 =
    policy::DEFAULT_CIRCUIT_BUILD_TIMEOUT.as_millis() as u64;
/// Default [`ClientConfig::max_circuit_dirtiness_s`].
pub const DEFAULT_MAX_CIRCUIT_DIRTINESS_S: u64 = policy::DEFAULT_MAX_CIRCUIT_DIRTINESS.as_secs();
/// Default [`ClientConfig::build_retries`].
pub const DEFAULT_BUILD_RETRIES: u32 = policy::DEFAULT_BUILD_RETRIES;

/// Default [`ClientConfig::stream_connect_timeout_ms`].
pub const DEFAULT_STREAM_CONNECT_TIMEOUT_MS: u64 =
    policy::DEFAULT_STREAM_CONNECT_TIMEOUT.as_millis() as u64;
/// Default [`ClientConfig::socks_handshake_timeout_ms`].
pub const DEFAULT_SOCKS_HANDSHAKE_TIMEOUT_MS: u64 = 30_000;
/// Default [`ClientConfig::max_socks_connections`].
pub const DEFAULT_MAX_SOCKS_CONNECTIONS: u64 = 4096;
/// Default [`ClientConfig::stream_retries`].
pub const DEFAULT_STREAM_RETRIES: u32 = policy::DEFAULT_STREAM_RETRIES;
/// Default [`ClientConfig::relay_failure_avoidance_s`].
pub const DEFAULT_RELAY_FAILURE_AVOIDANCE_S: u64 =
    policy::DEFAULT_RELAY_FAILURE_AVOIDANCE.as_secs();
/// Default [`ClientConfig::network_refresh_s`].
pub const DEFAULT_NETWORK_REFRESH_S: u64 = 3600;
/// Largest [`ClientConfig::network_refresh_s`] accepted (a year).
pub const MAX_NETWORK_REFRESH_S: u64 = 365 * 24 * 3600;

/// A client's configuration file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientConfig {
    /// Address of the SOCKS5 listener.
    pub socks_listen: SocketAddr,
    /// Where the network document comes from.
    pub network: NetworkSource,
    /// The network public key, 64 hex digits (checked when loading; see
    /// [`ClientConfig::network_public_key`]).
    #[serde(deserialize_with = "de_network_key")]
    pub network_key: String,
    /// A pinned path of relay nicknames, guard first and exit last (at
    /// least one). None: choose paths from the document.
    #[serde(default, deserialize_with = "de_path")]
    pub path: Option<Vec<String>>,
    /// Multi-path: pinned legs of every set, each a path as `path` is, all
    /// ending at the same exit (instead of `path`; their number is the
    /// set's legs).
    #[serde(default, deserialize_with = "de_paths")]
    pub paths: Option<Vec<Vec<String>>>,
    /// Multi-path: circuits (legs) per linked set, 1 to
    /// [`MAX_LEGS`] (default 1: no sets). Used only when the network
    /// document has `cfx_enabled = 1`; with random paths the legs share
    /// only their exit.
    #[serde(default = "default_legs", deserialize_with = "de_legs")]
    pub legs: usize,
    /// Multi-path: the leg scheduler of this end of each set (default: the
    /// network's `cfx_scheduler`).
    #[serde(
        default,
        deserialize_with = "de_leg_scheduler",
        serialize_with = "ser_leg_scheduler",
        skip_serializing_if = "Option::is_none"
    )]
    pub leg_scheduler: Option<LegSchedulerKind>,
    /// Experiments only: seed of the random path choice, so that runs of
    /// the same document that ask for circuits in the same order get the
    /// same paths (the lab's variants of one repetition). None (the
    /// default): paths drawn from the operating system's entropy, as an
    /// anonymous client's must be.
    #[serde(default)]
    pub path_seed: Option<u64>,
    /// Give up building a circuit after this many milliseconds (default
    /// 10000); must be positive.
    #[serde(
        default = "default_circuit_build_timeout_ms",
        deserialize_with = "de_positive"
    )]
    pub circuit_build_timeout_ms: u64,
    /// Stop putting new streams on a circuit this many seconds after its
    /// first stream (default 600).
    #[serde(default = "default_max_circuit_dirtiness_s")]
    pub max_circuit_dirtiness_s: u64,
    /// Build attempts after a failed one before a stream fails (default 3).
    #[serde(default = "default_build_retries")]
    pub build_retries: u32,
    /// Fail a stream whose exit has not answered BEGIN after this many
    /// milliseconds (SOCKS reply 0x06; default 60000); must be positive.
    #[serde(
        default = "default_stream_connect_timeout_ms",
        deserialize_with = "de_positive"
    )]
    pub stream_connect_timeout_ms: u64,
    /// Drop a SOCKS connection that has not finished its handshake after
    /// this many milliseconds (default 30000); must be positive.
    #[serde(
        default = "default_socks_handshake_timeout_ms",
        deserialize_with = "de_positive"
    )]
    pub socks_handshake_timeout_ms: u64,
    /// Most SOCKS connections open at once (default 4096); must be
    /// positive.
    #[serde(
        default = "default_max_socks_connections",
        deserialize_with = "de_positive"
    )]
    pub max_socks_connections: u64,
    /// Retries, on a fresh circuit, of a stream whose circuit failed
    /// before the exit answered (default 1).
    #[serde(default = "default_stream_retries")]
    pub stream_retries: u32,
    /// Seconds a failed relay is left out of new random paths (default
    /// 30; 0: never avoided).
    #[serde(default = "default_relay_failure_avoidance_s")]
    pub relay_failure_avoidance_s: u64,
    /// Load the network document again from `network` every this many
    /// seconds and keep the newest valid one (see [`crate::refresh`];
    /// default 3600, as tor clients fetch a consensus about hourly; 0:
    /// load it once, at start; at most [`MAX_NETWORK_REFRESH_S`]).
    #[serde(default = "default_network_refresh_s")]
    pub network_refresh_s: u64,
    /// Log filter, as for a relay; none means the program's default.
    #[serde(default)]
    pub log: Option<String>,
    /// How this client makes its links to guards (`[link]`), as a
    /// relay's; defaults as [`LinkSettings::default`].
    #[serde(default)]
    pub link: LinkSettings,
}

/// Most legs of a set ([`ClientConfig::legs`]): what an exit accepts.
pub const MAX_LEGS: usize = onionlab_circuit::node::MAX_LEGS_PER_SET;

fn default_legs() -> usize {
    1
}

/// `legs`: 1 to [`MAX_LEGS`].
fn de_legs<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<usize, D::Error> {
    let n = u64::deserialize(d)?;
    match usize::try_from(n) {
        Ok(n) if (1..=MAX_LEGS).contains(&n) => Ok(n),
        _ => Err(serde::de::Error::custom(format!(
            "legs must be 1 to {MAX_LEGS}, not {n}"
        ))),
    }
}

/// `leg_scheduler`: a name [`LegSchedulerKind::parse`] takes.
fn de_leg_scheduler<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<LegSchedulerKind>, D::Error> {
    let name = String::deserialize(d)?;
    LegSchedulerKind::parse(&name).map(Some).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "{name:?} is not a leg scheduler ({})",
            LegSchedulerKind::names()
        ))
    })
}

/// `paths`: 1 to [`MAX_LEGS`] pinned paths (each as [`de_path`] checks
/// it) that end at the same exit.
fn de_paths<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Vec<Vec<String>>>, D::Error> {
    let paths = Vec::<Vec<String>>::deserialize(d)?;
    if paths.is_empty() || paths.len() > MAX_LEGS {
        return Err(serde::de::Error::custom(format!(
            "pinned legs must be 1 to {MAX_LEGS} paths, not {}",
            paths.len()
        )));
    }
    for path in &paths {
        if path.is_empty() {
            return Err(serde::de::Error::custom(
                "a pinned leg needs at least one relay",
            ));
        }
        if let Some(bad) = path.iter().find(|n| !valid_nickname(n)) {
            return Err(serde::de::Error::custom(format!(
                "nickname {bad:?} must be 1-19 ASCII letters and digits"
            )));
        }
    }
    let exits: std::collections::BTreeSet<String> = paths
        .iter()
        .filter_map(|p| p.last().map(|e| e.to_ascii_lowercase()))
        .collect();
    if exits.len() != 1 {
        return Err(serde::de::Error::custom(format!(
            "the pinned legs of a set must end at the same exit, not at {}",
            exits.into_iter().collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(Some(paths))
}

/// A pinned path: at least one valid nickname.
fn de_path<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<Vec<String>>, D::Error> {
    let path = Vec::<String>::deserialize(d)?;
    if path.is_empty() {
        return Err(serde::de::Error::custom(
            "a pinned path needs at least one relay (leave `path` out to choose paths)",
        ));
    }
    if let Some(bad) = path.iter().find(|n| !valid_nickname(n)) {
        return Err(serde::de::Error::custom(format!(
            "nickname {bad:?} must be 1-19 ASCII letters and digits"
        )));
    }
    Ok(Some(path))
}

fn default_stream_connect_timeout_ms() -> u64 {
    DEFAULT_STREAM_CONNECT_TIMEOUT_MS
}
fn default_socks_handshake_timeout_ms() -> u64 {
    DEFAULT_SOCKS_HANDSHAKE_TIMEOUT_MS
}
fn default_max_socks_connections() -> u64 {
    DEFAULT_MAX_SOCKS_CONNECTIONS
}
fn default_stream_retries() -> u32 {
    DEFAULT_STREAM_RETRIES
}
fn default_relay_failure_avoidance_s() -> u64 {
    DEFAULT_RELAY_FAILURE_AVOIDANCE_S
}
fn default_network_refresh_s() -> u64 {
    DEFAULT_NETWORK_REFRESH_S
}
fn default_circuit_build_timeout_ms() -> u64 {
    DEFAULT_CIRCUIT_BUILD_TIMEOUT_MS
}
fn default_max_circuit_dirtiness_s() -> u64 {
    DEFAULT_MAX_CIRCUIT_DIRTINESS_S
}
fn default_build_retries() -> u32 {
    DEFAULT_BUILD_RETRIES
}

/// `leg_scheduler` as its name.
fn ser_leg_scheduler<S: serde::Serializer>(
    v: &Option<LegSchedulerKind>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match v {
        Some(k) => s.collect_str(k),
        None => s.serialize_none(),
    }
}

impl ClientConfig {
    /// A configuration with these 3 required settings and every other
    /// at its default.
    ///
    /// # Errors
    ///
    /// [`crate::Error::Parse`] for a network key that is not valid.
    pub fn new(
        socks_listen: SocketAddr,
        network: NetworkSource,
        network_key: &str,
    ) -> Result<Self> {
        #[derive(Serialize)]
        struct Required<'a> {
            socks_listen: SocketAddr,
            network: NetworkSource,
            network_key: &'a str,
        }
        crate::files::config_from_required(
            &Required {
                socks_listen,
                network,
                network_key,
            },
            "client configuration",
        )
    }

    /// The network public key.
    ///
    /// # Errors
    ///
    /// [`crate::Error::Document`] if `network_key` was changed to something invalid
    /// after loading.
    pub fn network_public_key(&self) -> Result<PublicKey> {
        Ok(parse_public_key(
            &self.network_key,
            "client configuration network_key",
        )?)
    }
}

impl ConfigFile for ClientConfig {
    const REQUIRED: &'static [&'static str] = &["socks_listen", "network", "network_key"];

    fn check(&self, origin: &str) -> Result<()> {
        self.link
            .check()
            .map_err(|e| invalid(origin, e.to_string()))?;
        if self.path.is_some() && self.legs != 1 {
            return Err(invalid(
                origin,
                format!(
                    "legs = {} with one pinned path: pin the legs with paths, or leave path out \
                     for random legs",
                    self.legs
                ),
            ));
        }
        if let Some(paths) = &self.paths {
            let message = if self.path.is_some() {
                Some("give either path or paths (pinned legs), not both".to_string())
            } else if self.legs != 1 && self.legs != paths.len() {
                Some(format!(
                    "legs = {} but paths pins {} legs (leave legs out with paths)",
                    self.legs,
                    paths.len()
                ))
            } else {
                None
            };
            if let Some(message) = message {
                return Err(invalid(origin, message));
            }
        }
        if self.network_refresh_s > MAX_NETWORK_REFRESH_S {
            return Err(invalid(
                origin,
                format!(
                    "network_refresh_s ({}) is above the limit of {MAX_NETWORK_REFRESH_S} \
                     (a year; 0 turns the refresh off)",
                    self.network_refresh_s
                ),
            ));
        }
        Ok(())
    }

    fn resolve_paths(&mut self, base: &Path) {
        self.network.resolve_against(base);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::directory::HttpUrl;

    use crate::files::test_key_hex as key_hex;

    #[test]
    fn client_config() {
        let text = format!(
            "socks_listen = \"127.0.0.1:9050\"\nnetwork = \"http://127.0.0.1:7000/network.doc\"\n\
             network_key = \"{}\"\npath = [\"a\", \"b\", \"c\"]\nbuild_retries = 5\n",
            key_hex()
        );
        let cfg = ClientConfig::from_toml_str(&text, "c.toml", Path::new("/x")).unwrap();
        assert_eq!(
            cfg.network,
            NetworkSource::Url(HttpUrl::parse("http://127.0.0.1:7000/network.doc").unwrap())
        );
        assert_eq!(cfg.path, Some(vec!["a".into(), "b".into(), "c".into()]));
        assert_eq!(cfg.build_retries, 5);
        assert_eq!(cfg.circuit_build_timeout_ms, 10_000);
        assert_eq!(cfg.max_circuit_dirtiness_s, 600);
        assert_eq!(cfg.network_refresh_s, DEFAULT_NETWORK_REFRESH_S);
        let off = ClientConfig::from_toml_str(
            &format!("{text}network_refresh_s = 0\n"),
            "c.toml",
            Path::new("/x"),
        )
        .unwrap();
        assert_eq!(off.network_refresh_s, 0);
        let err = ClientConfig::from_toml_str(
            &format!("{text}network_refresh_s = {}\n", MAX_NETWORK_REFRESH_S + 1),
            "c.toml",
            Path::new("/x"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("network_refresh_s"), "{err}");

        let err = ClientConfig::from_toml_str(
            &text.replace("[\"a\", \"b\", \"c\"]", "[]"),
            "c.toml",
            Path::new("/x"),
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("c.toml:4:"), "{err}");
    }

    #[test]
    fn client_multipath_settings() {
        let base = format!(
            "socks_listen = \"127.0.0.1:9050\"\nnetwork = \"n.doc\"\nnetwork_key = \"{}\"\n",
            key_hex()
        );
        let parse = |extra: &str| {
            ClientConfig::from_toml_str(&format!("{base}{extra}"), "c.toml", Path::new("/x"))
        };
        let cfg = parse("").unwrap();
        assert_eq!((cfg.legs, cfg.leg_scheduler, cfg.paths), (1, None, None));
        let cfg = parse("legs = 3\nleg_scheduler = \"round-robin:2\"\n").unwrap();
        assert_eq!(cfg.legs, 3);
        assert_eq!(
            cfg.leg_scheduler,
            Some(LegSchedulerKind::RoundRobin { cells_per_leg: 2 })
        );
        let cfg = parse("paths = [[\"g1\", \"m1\", \"e\"], [\"g2\", \"m2\", \"E\"]]\n").unwrap();
        assert_eq!(cfg.paths.as_ref().map(Vec::len), Some(2));
        for (extra, needle) in [
            ("legs = 0\n", "legs must be 1 to 8"),
            ("legs = 9\n", "legs must be 1 to 8"),
            ("leg_scheduler = \"fast\"\n", "not a leg scheduler"),
            ("paths = []\n", "1 to 8 paths"),
            ("paths = [[]]\n", "at least one relay"),
            ("paths = [[\"a\", \"e1\"], [\"b\", \"e2\"]]\n", "same exit"),
            (
                "paths = [[\"a\", \"e\"]]\npath = [\"a\", \"e\"]\n",
                "either path or paths",
            ),
            (
                "paths = [[\"a\", \"e\"], [\"b\", \"e\"]]\nlegs = 3\n",
                "pins 2 legs",
            ),
            ("path = [\"a\", \"e\"]\nlegs = 2\n", "one pinned path"),
        ] {
            let err = parse(extra).expect_err(extra).to_string();
            assert!(err.contains(needle), "{extra}: {err}");
        }
    }
}

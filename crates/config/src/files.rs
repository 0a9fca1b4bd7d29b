//! Node configuration files (TOML).
//!
//! Unknown fields are refused, errors name the file, line and column, and
//! relative paths (`keys`, and `network` when it is a file) are relative to
//! the directory of the configuration file. The types are `Serialize` as
//! well: whoever writes a configuration (`network init`, the lab, the
//! test network) builds the value and serialises it
//! ([`ConfigFile::to_toml`]), so every value
//! is quoted and escaped as TOML needs and the file reads back equal.
//!
//! A relay (`relay.toml`; every key but the first five is optional, shown
//! with its default):
//!
//! ```toml
//! nickname = "relay0"
//! keys = "keys.secret"            # relay secret keys, see crate::keys
//! network = "../../network.doc"   # file path, or http://HOST:PORT/network.doc
//! network_key = "<64 hex digits>" # network public key
//! scheduler = "ewma"              # or "round-robin"
//! exit_packaging = "lazy"         # exits: or "eager" (C tor's); when DATA cells are made
//! ewma_half_life_ms = 30000
//! max_mem_in_queues = 268435456   # bytes
//! exit_connect_timeout_ms = 10000
//! exit_reject_private = true      # see crate::exit_targets
//! exit_allow_private = ["127.0.0.1:8000"] # private targets allowed anyway; default []
//! exit_max_concurrent_lookups = 64
//! exit_max_pending_connects = 1024
//! dos_max_conns_per_address = 50  # denial-of-service limits (docs/settings.md)
//! dos_conn_rate = 20              # per second, burst dos_conn_burst = 40
//! dos_max_conns_total = 8192
//! dos_max_handshakes = 256
//! dos_create_rate = 3             # CREATE2 per second, burst dos_create_burst = 90,
//! dos_create_min_conns = 3        # for addresses with at least 3 connections
//! dos_quic_retry_rate = 100       # QUIC handshakes per second before Retry
//! channel_idle_timeout_ms = 180000
//! log = "info"                    # tracing filter; absent: the program's default
//!
//! [listen]                        # where the endpoints listen, by the document's names:
//! tls = "127.0.0.1:9001"          # TCP: TLS, pctcp and torchestra (required)
//! quic = "127.0.0.1:9001"         # UDP: both QUIC transports; absent: no QUIC listener
//! utcp = "127.0.0.1:9004"         # UDP: dtls-utcp (not QUIC's port)
//!
//! [link]                          # how links are made: relays and clients alike,
//! transport = "auto"              # see onionlab_transport::settings for every key
//!
//! [link.quic]
//! congestion = "cubic"
//!
//! [torchestra]                    # the exit's classifier (docs/torchestra.md)
//! window_ms = 2000
//! alpha = 0.18
//! beta = 0.36
//! thresh_light = 0.7
//! thresh_heavy = 0.7
//! thresh_verylight = 0.9
//! ```
//!
//! A client (`client.toml`):
//!
//! ```toml
//! socks_listen = "127.0.0.1:9050"
//! network = "network.doc"
//! network_key = "<64 hex digits>"
//! path = ["relay0", "relay1", "relay2"] # pinned path, guard first, exit last
//! legs = 2                              # multi-path: circuits per set when the network
//!                                       # has cfx_enabled (1 to 8; default 1)
//! leg_scheduler = "mtor"                # this end's leg scheduler; default the network's
//! # paths = [["relay0", "relay2", "relay4"], ["relay1", "relay3", "relay4"]]
//!                                       # instead of path: pinned legs, one exit
//! path_seed = 7                         # experiments only: seed of the random path choice
//! circuit_build_timeout_ms = 10000
//! max_circuit_dirtiness_s = 600
//! build_retries = 3
//! stream_connect_timeout_ms = 60000
//! socks_handshake_timeout_ms = 30000
//! max_socks_connections = 4096
//! stream_retries = 1
//! relay_failure_avoidance_s = 30
//! network_refresh_s = 3600              # 0: load the document once
//! log = "info"
//!
//! [link]                                # as for a relay
//! transport = "auto"
//! ```
//!
//! Every setting, its default and its C tor counterpart are listed in
//! `docs/settings.md`.
//!
//! `link.transport` chooses the transport of the connections a node opens
//! (see [`TransportChoice`]): `"auto"` uses QUIC with one stream per
//! circuit when the peer advertises a `quic` address in the network
//! document and falls back to TLS when QUIC cannot connect (UDP blocked,
//! for example); the name of a transport (`"tls"`, `"quic"`,
//! `"quic-conn-per-circuit"`...: the list is
//! [`onionlab_transport::registry`]'s) uses that transport only, with no
//! fallback (for experiments). A client never listens, so it has no
//! `[listen]`.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokio::io::AsyncReadExt;
use tor_llcrypto::pk::ed25519::PublicKey;

use crate::directory::HttpUrl;
use crate::error::{toml_error, Error, Result};
use onionlab_netdoc::doc::{
    valid_nickname, NetworkDocument, CLOCK_SKEW_ALLOWANCE, MAX_DOCUMENT_LEN,
};
use onionlab_netdoc::keys::{parse_public_key, read_file_limited};

/// QUIC congestion control (`link.quic.congestion`).
pub use onionlab_transport::quic::Congestion;
/// Which transport a node uses for the connections it opens
/// (`link.transport`): `"auto"` or the name of a registered transport
/// ([`onionlab_transport::registry`]); any other name is an error listing
/// the valid ones.
pub use onionlab_transport::Choice as TransportChoice;
/// The `[link]` section relays and clients share.
pub use onionlab_transport::LinkSettings;

/// Largest configuration file read.
const MAX_CONFIG_LEN: u64 = 1024 * 1024;

/// Where to get the network document: a file or an `http://` URL.
///
/// In configuration files it is one string: a URL if it contains `://`
/// (only `http://` is supported, see [`HttpUrl`]), otherwise a file path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetworkSource {
    /// A file holding the signed document.
    File(PathBuf),
    /// A directory URL, such as `http://127.0.0.1:7000/network.doc`.
    Url(HttpUrl),
}

impl NetworkSource {
    /// Parse a file path or URL.
    ///
    /// # Errors
    ///
    /// [`Error::Url`] for an empty string, another scheme than `http`, or a
    /// malformed URL.
    pub fn parse(s: &str) -> Result<Self> {
        if s.is_empty() {
            return Err(Error::Url {
                url: s.into(),
                reason: "empty: expected a file path or an http:// URL".into(),
            });
        }
        if s.contains("://") {
            HttpUrl::parse(s).map(NetworkSource::Url)
        } else {
            Ok(NetworkSource::File(PathBuf::from(s)))
        }
    }

    /// Make a relative file path relative to `base` instead of the current
    /// directory.
    pub fn resolve_against(&mut self, base: &Path) {
        if let NetworkSource::File(p) = self {
            *p = resolve(base, p);
        }
    }

    /// Fetch or read the document, then verify and parse it; see
    /// [`load_network`].
    ///
    /// # Errors
    ///
    /// As [`load_network`].
    pub async fn load(&self, network_key: &PublicKey) -> Result<NetworkDocument> {
        load_network(self, network_key).await
    }
}

impl fmt::Display for NetworkSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetworkSource::File(p) => write!(f, "{}", p.display()),
            NetworkSource::Url(u) => write!(f, "{u}"),
        }
    }
}

impl std::str::FromStr for NetworkSource {
    type Err = Error;

    /// Same as [`NetworkSource::parse`].
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

impl Serialize for NetworkSource {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for NetworkSource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        NetworkSource::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Read (file) or fetch (URL, see [`crate::directory::fetch`]) the signed
/// network document, verify it with `network_key`, parse it, and check that
/// it is valid now ([`NetworkDocument::check_time`] with
/// [`CLOCK_SKEW_ALLOWANCE`]). Errors name the file or URL.
///
/// # Errors
///
/// [`Error::Io`] or [`Error::TooLarge`] for a file, the errors of
/// [`crate::directory::fetch`] for a URL, then those of
/// [`NetworkDocument::from_signed_text`], then [`onionlab_netdoc::Error::NotYetValid`] or
/// [`onionlab_netdoc::Error::Expired`], all within [`Error::Document`].
pub async fn load_network(
    source: &NetworkSource,
    network_key: &PublicKey,
) -> Result<NetworkDocument> {
    let (text, origin) = match source {
        NetworkSource::File(path) => (read_document_file(path).await?, path.display().to_string()),
        NetworkSource::Url(url) => {
            let url = url.to_string();
            (crate::directory::fetch(&url).await?, url)
        }
    };
    let doc = NetworkDocument::from_signed_text_at(&text, network_key, &origin)?;
    doc.check_time(unix_now(), CLOCK_SKEW_ALLOWANCE, &origin)?;
    Ok(doc)
}

/// Seconds since the Unix epoch now (0 if the clock is before it).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Read a document file of at most [`MAX_DOCUMENT_LEN`] bytes.
async fn read_document_file(path: &Path) -> Result<String> {
    let io_err = |op| {
        move |source| Error::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    };
    let file = tokio::fs::File::open(path).await.map_err(io_err("open"))?;
    let mut buf = Vec::new();
    file.take(MAX_DOCUMENT_LEN as u64 + 1)
        .read_to_end(&mut buf)
        .await
        .map_err(io_err("read"))?;
    if buf.len() > MAX_DOCUMENT_LEN {
        let size = tokio::fs::metadata(path)
            .await
            .map_or(buf.len() as u64, |m| m.len());
        return Err(Error::TooLarge {
            what: path.display().to_string(),
            size,
            max: MAX_DOCUMENT_LEN as u64,
        });
    }
    String::from_utf8(buf).map_err(|_| Error::Io {
        op: "read",
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"),
    })
}

/// Which circuit scheduler a relay uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheduler {
    /// `"ewma"`: the circuit with the least recent activity goes first (tor's default).
    #[default]
    Ewma,
    /// `"round-robin"`: circuits take turns.
    RoundRobin,
}

/// A circuit scheduler name that is neither `"ewma"` nor `"round-robin"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scheduler {0:?}: expected \"ewma\" or \"round-robin\"")]
pub struct UnknownScheduler(pub String);

impl std::str::FromStr for Scheduler {
    type Err = UnknownScheduler;

    /// `"ewma"` or `"round-robin"`.
    fn from_str(s: &str) -> std::result::Result<Self, UnknownScheduler> {
        [Scheduler::Ewma, Scheduler::RoundRobin]
            .into_iter()
            .find(|k| k.to_string() == s)
            .ok_or_else(|| UnknownScheduler(s.to_string()))
    }
}

impl fmt::Display for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scheduler::Ewma => "ewma",
            Scheduler::RoundRobin => "round-robin",
        })
    }
}

/// Keys of configuration files written before the `[link]`, `[listen]`
/// and `[torchestra]` sections, with where they went: named in the error a
/// file that still has one gets.
const MOVED_KEYS: &[(&str, &str)] = &[
    ("transport", "[link] transport"),
    ("link_handshake_timeout_ms", "[link] handshake_timeout_ms"),
    ("tcp_congestion", "[link.tcp] congestion"),
    ("channel_unsent_limit", "[link.tcp] unsent_limit"),
    ("tcp_pacing", "[link.tcp] pacing"),
    ("quic_congestion", "[link.quic] congestion"),
    ("quic_keep_alive_ms", "[link.quic] keep_alive_ms"),
    ("quic_idle_timeout_ms", "[link.quic] idle_timeout_ms"),
    ("quic_initial_mtu", "[link.quic] initial_mtu"),
    ("pctcp_max_lanes", "[link.pctcp] max_lanes"),
    ("utcp", "[link.utcp]"),
    ("quic_listen", "[listen] quic"),
    ("utcp_listen", "[listen] utcp"),
    ("torchestra_window_ms", "[torchestra] window_ms"),
    ("torchestra_alpha", "[torchestra] alpha"),
    ("torchestra_beta", "[torchestra] beta"),
    ("torchestra_thresh_light", "[torchestra] thresh_light"),
    ("torchestra_thresh_heavy", "[torchestra] thresh_heavy"),
    (
        "torchestra_thresh_verylight",
        "[torchestra] thresh_verylight",
    ),
];

/// A number above zero.
pub(crate) fn de_positive<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    let n = u64::deserialize(d)?;
    if n == 0 {
        return Err(serde::de::Error::custom("must be greater than 0"));
    }
    Ok(n)
}

/// `p` relative to `base` unless absolute.
pub(crate) fn resolve(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// The directory relative paths in the file at `path` are relative to.
pub(crate) fn base_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Read and deserialize a TOML file, with file and line in errors.
pub(crate) fn load_toml<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = read_file_limited(path, MAX_CONFIG_LEN)?;
    parse_toml(&text, &path.display().to_string())
}

/// Deserialize TOML text, naming `origin` in errors (and, for a key
/// that moved into a section, where it went: [`MOVED_KEYS`]).
pub(crate) fn parse_toml<T: DeserializeOwned>(text: &str, origin: &str) -> Result<T> {
    toml::from_str(text).map_err(|e| {
        let mut err = toml_error(origin, text, &e);
        if let Error::Parse { message, .. } = &mut err {
            let moved = MOVED_KEYS
                .iter()
                .find(|(old, _)| message.contains(&format!("unknown field `{old}`")));
            if let Some((old, new)) = moved {
                message.push_str(&format!(" (`{old}` is now {new})"));
            }
        }
        err
    })
}

/// An invalid combination of settings found after parsing.
pub(crate) fn invalid(origin: &str, message: impl Into<String>) -> Error {
    Error::Invalid {
        origin: origin.to_string(),
        message: message.into(),
    }
}

/// Serialise a value as its `Display` text (the names the deserialisers
/// take).
pub(crate) fn ser_display<T: fmt::Display, S: Serializer>(
    v: &T,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// Set `extra`'s keys over `base`, merging tables key by key (a value
/// replaces a value; a table is merged into a table).
pub fn merge_tables(base: &mut toml::Table, extra: &toml::Table) {
    for (key, value) in extra {
        match (base.get_mut(key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(e)) => merge_tables(b, e),
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

/// A configuration file's type ([`crate::RelayConfig`], [`crate::ClientConfig`]): how
/// it is read, checked, changed and written, declared once for both.
pub trait ConfigFile: Serialize + DeserializeOwned {
    /// The keys without a default.
    const REQUIRED: &'static [&'static str];

    /// Checks across settings, after parsing.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] naming `origin` and the settings.
    fn check(&self, origin: &str) -> Result<()>;

    /// Resolve relative paths against `base`.
    fn resolve_paths(&mut self, base: &Path);

    /// Load a configuration file, resolving relative paths against its
    /// directory.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] or [`Error::TooLarge`] if the file cannot be read;
    /// [`Error::Parse`] (file, line, column) for syntax errors, unknown or
    /// missing fields and bad values; [`Error::Invalid`] for values out of
    /// range together.
    fn load(path: &Path) -> Result<Self> {
        let mut cfg: Self = load_toml(path)?;
        cfg.check(&path.display().to_string())?;
        cfg.resolve_paths(&base_dir(path));
        Ok(cfg)
    }

    /// Parse a configuration from text; `origin` names it in errors, and
    /// relative paths are resolved against `base_dir`.
    ///
    /// # Errors
    ///
    /// As for [`load`](Self::load).
    fn from_toml_str(text: &str, origin: &str, base_dir: &Path) -> Result<Self> {
        let mut cfg: Self = parse_toml(text, origin)?;
        cfg.check(origin)?;
        cfg.resolve_paths(base_dir);
        Ok(cfg)
    }

    /// This configuration with `extra`'s keys set over it (tables merged
    /// key by key: `[link.quic]` in `extra` changes only the keys it
    /// names, see [`merge_tables`]), checked as a file is; `origin` names
    /// `extra` in errors. Paths are left as they are.
    ///
    /// # Errors
    ///
    /// As for [`from_toml_str`](Self::from_toml_str).
    fn with_overrides(&self, extra: &toml::Table, origin: &str) -> Result<Self> {
        let mut table = toml::Table::try_from(self).map_err(|e| invalid(origin, e.to_string()))?;
        merge_tables(&mut table, extra);
        let text = toml::to_string(&table).map_err(|e| invalid(origin, e.to_string()))?;
        let cfg: Self = parse_toml(&text, origin)?;
        cfg.check(origin)?;
        Ok(cfg)
    }

    /// The file's text: the required settings and the values that differ
    /// from the defaults (which a file written so follows when they
    /// change), as TOML that [`from_toml_str`](Self::from_toml_str) reads
    /// back equal.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] if a value cannot be written (a path that is not
    /// UTF-8).
    fn to_toml(&self) -> Result<String> {
        config_document(self).map(|d| d.to_string())
    }
}

/// A configuration made from `required` (its required keys) with every
/// other setting at its default.
pub(crate) fn config_from_required<T: ConfigFile>(
    required: &impl Serialize,
    what: &str,
) -> Result<T> {
    let text = toml::to_string(required).map_err(|e| invalid(what, e.to_string()))?;
    parse_toml(&text, what)
}

/// `value` as a TOML document holding its required keys and what differs
/// from the defaults ([`to_sparse_toml`]).
fn config_document<T: ConfigFile>(value: &T) -> Result<toml_edit::DocumentMut> {
    let what = "configuration";
    let mut required = toml::Table::try_from(value).map_err(|e| invalid(what, e.to_string()))?;
    required.retain(|k, _| T::REQUIRED.iter().any(|r| k[..] == **r));
    let defaults: T = config_from_required(&required, what)?;
    to_sparse_toml(value, &defaults, T::REQUIRED)
}

/// Serialise `value` as a TOML document in its fields' order, leaving out
/// every value but the `required` ones that equals its counterpart in
/// `defaults` (tables compared key by key), so a written file holds what
/// differs from the defaults and follows them when they change.
fn to_sparse_toml<T: Serialize>(
    value: &T,
    defaults: &T,
    required: &[&str],
) -> Result<toml_edit::DocumentMut> {
    let doc = |v: &T| {
        toml::to_string(v)
            .map_err(|e| e.to_string())
            .and_then(|text| {
                text.parse::<toml_edit::DocumentMut>()
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| invalid("configuration", format!("cannot be written as TOML: {e}")))
    };
    let mut out = doc(value)?;
    let mut defaults = doc(defaults)?;
    for key in required {
        defaults.remove(key);
    }
    drop_defaults(out.as_table_mut(), defaults.as_table());
    Ok(out)
}

/// Remove from `table` what equals `defaults`, recursing into tables (an
/// emptied table goes too).
fn drop_defaults(table: &mut toml_edit::Table, defaults: &toml_edit::Table) {
    let keys: Vec<String> = table.iter().map(|(k, _)| k.to_string()).collect();
    for key in keys {
        let same = match (table.get_mut(&key), defaults.get(&key)) {
            (Some(toml_edit::Item::Table(t)), Some(toml_edit::Item::Table(d))) => {
                drop_defaults(t, d);
                t.is_empty()
            }
            (Some(v), Some(d)) => v.to_string().trim() == d.to_string().trim(),
            _ => false,
        };
        if same {
            table.remove(&key);
        }
    }
}

/// A valid nickname.
pub(crate) fn de_nickname<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if !valid_nickname(&s) {
        return Err(serde::de::Error::custom(format!(
            "nickname {s:?} must be 1-19 ASCII letters and digits"
        )));
    }
    Ok(s)
}

/// A network public key in hex that parses.
pub(crate) fn de_network_key<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<String, D::Error> {
    let s = String::deserialize(d)?;
    parse_public_key(&s, "network_key").map_err(serde::de::Error::custom)?;
    Ok(s)
}

/// A valid network public key in hex, for the configuration tests.
#[cfg(test)]
pub(crate) fn test_key_hex() -> String {
    let kp = tor_llcrypto::pk::ed25519::Keypair::from_bytes(&[3; 32]);
    hex::encode(kp.verifying_key().as_bytes())
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn network_sources() {
        assert_eq!(
            NetworkSource::parse("net.doc").unwrap(),
            NetworkSource::File("net.doc".into())
        );
        assert!(matches!(
            NetworkSource::parse("http://localhost:7000/network.doc").unwrap(),
            NetworkSource::Url(_)
        ));
        assert!(NetworkSource::parse("").is_err());
        assert!(NetworkSource::parse("file:///x").is_err());
        let mut s = NetworkSource::parse("/abs/net.doc").unwrap();
        s.resolve_against(Path::new("/elsewhere"));
        assert_eq!(s, NetworkSource::File("/abs/net.doc".into()));
        assert_eq!(s.to_string(), "/abs/net.doc");
    }
}

//! Node configuration files (TOML).
//!
//! Unknown fields are refused, errors name the file, line and column, and
//! relative paths (`keys`, and `network` when it is a file) are relative to
//! the directory of the configuration file.
//!
//! A relay (`relay.toml`):
//!
//! ```toml
//! nickname = "relay0"
//! keys = "keys.secret"            # relay secret keys, see crate::keys
//! listen = "127.0.0.1:9001"       # TLS transport listener (TCP)
//! quic_listen = "127.0.0.1:9001"  # optional: QUIC endpoint (UDP); none = no QUIC
//! utcp_listen = "127.0.0.1:9004"  # optional: dtls-utcp endpoint (UDP, not QUIC's port)
//! transport = "auto"              # connections this relay opens: "auto" (default)
//!                                 # or a transport: `onionlab relay --help` lists them
//! quic_congestion = "cubic"       # or "newreno", "bbr"; default "cubic"
//! tcp_congestion = "cubic"        # kernel algorithm of every TCP socket, or "system";
//!                                 # default: quic_congestion's match (cubic, reno, bbr)
//! channel_unsent_limit = 16384    # optional: KIST-like limit on each TCP socket's unsent
//!                                 # bytes (TCP_NOTSENT_LOWAT); default: the kernel's
//! tcp_pacing = false              # Linux paces each channel TCP socket, as quinn paces
//!                                 # QUIC (SO_MAX_PACING_RATE); default false
//! network = "../../network.doc"   # file path, or http://HOST:PORT/network.doc
//! network_key = "<64 hex digits>" # network public key
//! scheduler = "ewma"              # or "round-robin"; default "ewma"
//! exit_packaging = "lazy"         # exits: or "eager" (C tor's); when DATA cells are made
//! ewma_half_life_ms = 30000       # default 30000
//! max_mem_in_queues = 268435456   # bytes, default 256 MiB
//! link_handshake_timeout_ms = 10000 # default 10000
//! quic_keep_alive_ms = 2000       # default 2000; below quic_idle_timeout_ms
//! quic_initial_mtu = 1200         # default 1200 (QUIC's minimum); at most 8972
//! pctcp_max_lanes = 512           # pctcp: per-circuit connections kept open at most
//! quic_idle_timeout_ms = 8000     # default 8000
//! utcp = { congestion = "cubic" } # dtls-utcp's user-space TCP (see UtcpConfig): congestion
//!                                 # ("cubic", "reno"), max_segment, rx_buffer, tx_buffer,
//!                                 # ack_delay_ms (0: none); defaults 1200, 262144, 65536, 10
//! exit_connect_timeout_ms = 10000 # exits: default 10000
//! exit_reject_private = true      # exits: default true (see crate::exit_targets)
//! exit_allow_private = ["127.0.0.1:8000"] # exits: private targets allowed anyway; default []
//! exit_max_concurrent_lookups = 64   # exits: default 64
//! exit_max_pending_connects = 1024   # exits: default 1024
//! dos_max_conns_per_address = 50     # denial-of-service limits (docs/settings.md)
//! dos_conn_rate = 20                 # per second, burst dos_conn_burst = 40
//! dos_max_conns_total = 8192
//! dos_max_handshakes = 256
//! dos_create_rate = 3                # CREATE2 per second, burst dos_create_burst = 90,
//! dos_create_min_conns = 3           # for addresses with at least 3 connections
//! dos_quic_retry_rate = 100          # QUIC handshakes per second before Retry
//! channel_idle_timeout_ms = 180000   # channels without circuits closed after this
//! torchestra_window_ms = 2000        # torchestra: the exit's classification window;
//! torchestra_alpha = 0.18            # EWMA multipliers (busy, idle circuits) and
//! torchestra_beta = 0.36             # thresholds, all in (0, 1] (docs/torchestra.md)
//! torchestra_thresh_light = 0.7
//! torchestra_thresh_heavy = 0.7
//! torchestra_thresh_verylight = 0.9
//! log = "info"                    # optional tracing filter
//! ```
//!
//! A client (`client.toml`):
//!
//! ```toml
//! socks_listen = "127.0.0.1:9050"
//! network = "network.doc"
//! network_key = "<64 hex digits>"
//! path = ["relay0", "relay1", "relay2"] # optional: pinned path, guard first, exit last
//! legs = 2                              # multi-path: circuits per set when the network
//!                                       # has cfx_enabled (1 to 8; default 1)
//! leg_scheduler = "mtor"                # this end's leg scheduler; default the network's
//! # paths = [["relay0", "relay2", "relay4"], ["relay1", "relay3", "relay4"]]
//!                                       # optional instead of path: pinned legs, one exit
//! path_seed = 7                         # experiments only: seed of the random path choice
//!                                       # (the same seed and document, the same paths)
//! circuit_build_timeout_ms = 10000      # default 10000
//! max_circuit_dirtiness_s = 600         # default 600
//! build_retries = 3                     # default 3
//! transport = "auto"                    # as for a relay; default "auto"
//! quic_congestion = "cubic"             # as for a relay; default "cubic"
//! tcp_congestion = "cubic"              # as for a relay
//! channel_unsent_limit = 16384          # as for a relay
//! tcp_pacing = false                    # as for a relay
//! stream_connect_timeout_ms = 60000     # default 60000
//! socks_handshake_timeout_ms = 30000    # default 30000
//! max_socks_connections = 4096          # default 4096
//! stream_retries = 1                    # default 1
//! relay_failure_avoidance_s = 30        # default 30
//! network_refresh_s = 3600              # default 3600; 0: load the document once
//! link_handshake_timeout_ms = 10000     # as for a relay
//! quic_keep_alive_ms = 2000             # as for a relay
//! quic_initial_mtu = 1200               # as for a relay
//! pctcp_max_lanes = 512                 # as for a relay
//! quic_idle_timeout_ms = 8000           # as for a relay
//! utcp = { congestion = "cubic" }       # as for a relay
//! log = "info"                          # optional tracing filter
//! ```
//!
//! Every setting, its default and its C tor counterpart are listed in
//! `docs/settings.md`.
//!
//! `transport` chooses the transport of the connections a node opens (see
//! [`TransportChoice`]): `"auto"` uses QUIC with one stream per circuit when
//! the peer advertises a `quic` address in the network document and falls
//! back to TLS when QUIC cannot connect (UDP blocked, for example); the name
//! of a transport (`"tls"`, `"quic"`, `"quic-conn-per-circuit"`...: the
//! list is [`onionlab_transport::registry`]'s) uses that transport only,
//! with no fallback (for experiments). A client never listens, so it has no
//! `quic_listen`.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use onionlab_circuit::conflux::sched::LegSchedulerKind;
use onionlab_circuit::relay::ExitPackaging;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use tokio::io::AsyncReadExt;
use tor_llcrypto::pk::ed25519::PublicKey;

use crate::directory::HttpUrl;
use crate::doc::{valid_nickname, NetworkDocument, CLOCK_SKEW_ALLOWANCE, MAX_DOCUMENT_LEN};
use crate::error::{toml_error, Error, Result};
use crate::exit_targets::PrivateTargets;
use crate::keys::{parse_public_key, read_file_limited};

/// Largest configuration file read.
const MAX_CONFIG_LEN: u64 = 1024 * 1024;

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
/// Default [`ClientConfig::circuit_build_timeout_ms`].
pub const DEFAULT_CIRCUIT_BUILD_TIMEOUT_MS: u64 = 10_000;
/// Default [`ClientConfig::max_circuit_dirtiness_s`].
pub const DEFAULT_MAX_CIRCUIT_DIRTINESS_S: u64 = 600;
/// Default [`ClientConfig::build_retries`].
pub const DEFAULT_BUILD_RETRIES: u32 = 3;

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
/// [`NetworkDocument::from_signed_text`], then [`Error::NotYetValid`] or
/// [`Error::Expired`].
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheduler {
    /// `"ewma"`: the circuit with the least recent activity goes first (tor's default).
    #[default]
    Ewma,
    /// `"round-robin"`: circuits take turns.
    RoundRobin,
}

impl fmt::Display for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scheduler::Ewma => "ewma",
            Scheduler::RoundRobin => "round-robin",
        })
    }
}

/// The congestion control of dtls-utcp's lanes (`utcp.congestion`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UtcpCongestion {
    /// `"cubic"` (RFC 9438), the default, as Linux's TCP.
    #[default]
    Cubic,
    /// `"reno"`.
    Reno,
}

/// The dtls-utcp transport's user-space TCP, per lane (`[utcp]` table of
/// relays and clients; `docs/dtls-utcp.md`, section 4). smoltcp fixes the
/// rest (initial window, minimum RTO, SACK), which the lab records.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UtcpConfig {
    /// Congestion control (default `"cubic"`).
    pub congestion: UtcpCongestion,
    /// Largest segment (TORTP header, options and data), 100 to 65000
    /// (default 1200: one segment per DTLS record in a 1280-byte datagram).
    pub max_segment: usize,
    /// Receive buffer per lane: the largest window it advertises (default
    /// 262144).
    pub rx_buffer: usize,
    /// Send buffer per lane (default 65536).
    pub tx_buffer: usize,
    /// Delayed ACK in milliseconds, 0 for none (default 10).
    pub ack_delay_ms: u64,
}

impl Default for UtcpConfig {
    fn default() -> Self {
        Self::from_settings(&onionlab_transport::utcp::LaneTcp::default())
    }
}

impl UtcpConfig {
    fn from_settings(s: &onionlab_transport::utcp::LaneTcp) -> Self {
        UtcpConfig {
            congestion: match s.congestion {
                onionlab_transport::utcp::LaneCongestion::Reno => UtcpCongestion::Reno,
                _ => UtcpCongestion::Cubic,
            },
            max_segment: s.max_segment,
            rx_buffer: s.rx_buffer,
            tx_buffer: s.tx_buffer,
            ack_delay_ms: s.ack_delay.map_or(0, |d| d.as_millis() as u64),
        }
    }

    /// The lane settings (the rest, such as the lane cap, at their
    /// defaults).
    ///
    /// # Errors
    ///
    /// A message naming the setting out of range.
    pub fn lane_tcp(&self) -> std::result::Result<onionlab_transport::utcp::LaneTcp, String> {
        use onionlab_transport::utcp::{LaneCongestion, LaneTcp};
        let s = LaneTcp {
            congestion: match self.congestion {
                UtcpCongestion::Cubic => LaneCongestion::Cubic,
                UtcpCongestion::Reno => LaneCongestion::Reno,
            },
            max_segment: self.max_segment,
            rx_buffer: self.rx_buffer,
            tx_buffer: self.tx_buffer,
            ack_delay: (self.ack_delay_ms > 0)
                .then(|| std::time::Duration::from_millis(self.ack_delay_ms.min(1000))),
            ..LaneTcp::default()
        };
        s.check().map_err(|e| format!("utcp: {e}"))?;
        if self.ack_delay_ms > 1000 {
            return Err(format!(
                "utcp: ack_delay_ms {} (at most 1000)",
                self.ack_delay_ms
            ));
        }
        Ok(s)
    }
}

/// Which transport a node uses for the connections it opens (TOML field
/// `transport`): `"auto"` or the name of a registered transport
/// ([`onionlab_transport::registry`]); any other name is an error listing
/// the valid ones.
pub use onionlab_transport::Choice as TransportChoice;

/// Deserialize a [`TransportChoice`] from its name.
fn de_transport<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<TransportChoice, D::Error> {
    let name = String::deserialize(d)?;
    name.parse().map_err(serde::de::Error::custom)
}

/// QUIC congestion control algorithm (TOML field `quic_congestion`).
/// Standard QUIC controls congestion per connection, not per stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Congestion {
    /// `"cubic"` (RFC 9438), the default.
    #[default]
    Cubic,
    /// `"newreno"` (RFC 9002's reference algorithm).
    NewReno,
    /// `"bbr"`.
    Bbr,
}

impl Congestion {
    /// Every algorithm, in the order of the documentation.
    pub const ALL: [Congestion; 3] = [Congestion::Cubic, Congestion::NewReno, Congestion::Bbr];

    /// The TOML string.
    pub fn as_str(self) -> &'static str {
        match self {
            Congestion::Cubic => "cubic",
            Congestion::NewReno => "newreno",
            Congestion::Bbr => "bbr",
        }
    }
}

impl Congestion {
    /// The Linux TCP congestion control that matches this QUIC one, so
    /// that a comparison of TCP and QUIC compares transports, not
    /// algorithms: `cubic`, `reno` (Linux's NewReno), `bbr` (which BBR
    /// version each side implements is in docs/settings.md).
    pub fn tcp_match(self) -> &'static str {
        match self {
            Congestion::Cubic => "cubic",
            Congestion::NewReno => "reno",
            Congestion::Bbr => "bbr",
        }
    }
}

impl fmt::Display for Congestion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<Congestion> for onionlab_transport::quic::Congestion {
    fn from(c: Congestion) -> Self {
        match c {
            Congestion::Cubic => onionlab_transport::quic::Congestion::Cubic,
            Congestion::NewReno => onionlab_transport::quic::Congestion::NewReno,
            Congestion::Bbr => onionlab_transport::quic::Congestion::Bbr,
        }
    }
}

impl std::str::FromStr for Congestion {
    type Err = String;

    /// The TOML string; the error lists the valid ones.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        parse_choice(s, &Self::ALL, Self::as_str, "congestion control")
    }
}

/// The element of `all` whose name is `s`, or an error listing the names.
fn parse_choice<T: Copy>(
    s: &str,
    all: &[T],
    name: fn(T) -> &'static str,
    what: &str,
) -> std::result::Result<T, String> {
    all.iter().copied().find(|&c| name(c) == s).ok_or_else(|| {
        let names: Vec<String> = all.iter().map(|&c| format!("{:?}", name(c))).collect();
        format!("unknown {what} {s:?}: expected one of {}", names.join(", "))
    })
}

/// A relay's configuration file.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    /// The relay's nickname, as in the network document.
    #[serde(deserialize_with = "de_nickname")]
    pub nickname: String,
    /// The relay secret keys file (see [`crate::keys::load_relay_keys`]).
    pub keys: PathBuf,
    /// Address the TLS transport listens on (TCP).
    pub listen: SocketAddr,
    /// UDP address the QUIC endpoint listens on; none means no QUIC
    /// listener (the relay may still open QUIC connections, as its
    /// `transport` says).
    #[serde(default)]
    pub quic_listen: Option<SocketAddr>,
    /// UDP address the dtls-utcp endpoint accepts sessions on; none means
    /// no dtls-utcp listener.
    #[serde(default)]
    pub utcp_listen: Option<SocketAddr>,
    /// Transport of the connections this relay opens; default
    /// [`TransportChoice::Auto`].
    #[serde(default, deserialize_with = "de_transport")]
    pub transport: TransportChoice,
    /// QUIC congestion control; default [`Congestion::Cubic`].
    #[serde(default)]
    pub quic_congestion: Congestion,
    /// The kernel's congestion control for every TCP socket (`"system"`:
    /// the kernel's default); default: the match of `quic_congestion`
    /// ([`Congestion::tcp_match`]). See [`tcp_congestion_name`](Self::tcp_congestion_name).
    #[serde(default, deserialize_with = "de_tcp_congestion")]
    pub tcp_congestion: Option<String>,
    /// KIST-like write limit: most bytes each TCP socket of a channel
    /// holds written and not yet sent (`TCP_NOTSENT_LOWAT`), 1 to
    /// 4294967295; absent: the kernel's `net.ipv4.tcp_notsent_lowat`
    /// (unlimited by default). 16384 is what `docs/results/seed003.md`
    /// found to behave like C tor's KIST.
    #[serde(default, deserialize_with = "de_unsent_limit")]
    pub channel_unsent_limit: Option<u32>,
    /// Make Linux pace every TCP socket of a channel (`SO_MAX_PACING_RATE`
    /// set, uncapped), as quinn paces every QUIC connection; default
    /// false: Linux paces a Cubic or Reno socket only when asked, BBR
    /// always.
    #[serde(default)]
    pub tcp_pacing: bool,
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
    #[serde(default, deserialize_with = "de_exit_packaging")]
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
    /// Bound on a link's handshake (TLS or QUIC, then VERSIONS/NETINFO),
    /// either direction, in milliseconds (default 10000); must be positive.
    #[serde(
        default = "default_link_handshake_timeout_ms",
        deserialize_with = "de_positive"
    )]
    pub link_handshake_timeout_ms: u64,
    /// UDP payload of a QUIC connection's first packets, before MTU
    /// discovery (default 1200, QUIC's safe minimum; at most 8972). The
    /// lab sets its links' MTU less 28 (IPv4 and UDP headers), so QUIC
    /// packets are as large as TCP's from the start; the initial
    /// congestion window is 10 such packets, as TCP's is 10 segments.
    #[serde(
        default = "default_quic_initial_mtu",
        deserialize_with = "de_quic_initial_mtu"
    )]
    pub quic_initial_mtu: u16,
    /// pctcp: lane connections (one per circuit) the node keeps open at
    /// most (default 512); above it new circuits share the main
    /// connection. At least 1.
    #[serde(
        default = "default_pctcp_max_lanes",
        deserialize_with = "de_pctcp_max_lanes"
    )]
    pub pctcp_max_lanes: u64,
    /// dtls-utcp: the lanes' user-space TCP (`[utcp]`; defaults as
    /// [`UtcpConfig::default`]).
    #[serde(default)]
    pub utcp: UtcpConfig,
    /// QUIC keep-alive: a PING after this many quiet milliseconds (default
    /// 2000); must be positive and below `quic_idle_timeout_ms`.
    #[serde(
        default = "default_quic_keep_alive_ms",
        deserialize_with = "de_positive"
    )]
    pub quic_keep_alive_ms: u64,
    /// A QUIC connection that received nothing for this many milliseconds
    /// is closed and its peer taken for dead (default 8000).
    #[serde(
        default = "default_quic_idle_timeout_ms",
        deserialize_with = "de_positive"
    )]
    pub quic_idle_timeout_ms: u64,
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
    /// [`crate::exit_targets`].
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
    /// Torchestra (`transport = "torchestra"`): the exit's classification
    /// window in milliseconds (default 2000, the thesis's).
    #[serde(
        default = "default_torchestra_window_ms",
        deserialize_with = "de_positive"
    )]
    pub torchestra_window_ms: u64,
    /// Torchestra: EWMA multiplier of circuits with cells in the window
    /// and of the connection (default 0.18; in (0, 1]).
    #[serde(default = "default_torchestra_alpha")]
    pub torchestra_alpha: Fraction,
    /// Torchestra: EWMA multiplier of idle circuits (default 0.36).
    #[serde(default = "default_torchestra_beta")]
    pub torchestra_beta: Fraction,
    /// Torchestra: a light circuit this far above its fair share turns
    /// heavy (default 0.7).
    #[serde(default = "default_torchestra_thresh")]
    pub torchestra_thresh_light: Fraction,
    /// Torchestra: a heavy circuit this far below its fair share turns
    /// light (default 0.7).
    #[serde(default = "default_torchestra_thresh")]
    pub torchestra_thresh_heavy: Fraction,
    /// Torchestra: a circuit this far below its fair share is not counted
    /// active (default 0.9).
    #[serde(default = "default_torchestra_verylight")]
    pub torchestra_thresh_verylight: Fraction,
    /// Log filter in `tracing_subscriber::EnvFilter` syntax (for example
    /// `"info"` or `"info,onionlab_node=debug"`); none means the program's
    /// default.
    #[serde(default)]
    pub log: Option<String>,
}

/// A client's configuration file.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
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
    #[serde(default, deserialize_with = "de_leg_scheduler")]
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
    /// Transport of the connections to guards; default
    /// [`TransportChoice::Auto`].
    #[serde(default, deserialize_with = "de_transport")]
    pub transport: TransportChoice,
    /// QUIC congestion control; default [`Congestion::Cubic`].
    #[serde(default)]
    pub quic_congestion: Congestion,
    /// The kernel's congestion control for every TCP socket (`"system"`:
    /// the kernel's default); default: the match of `quic_congestion`
    /// ([`Congestion::tcp_match`]). See [`tcp_congestion_name`](Self::tcp_congestion_name).
    #[serde(default, deserialize_with = "de_tcp_congestion")]
    pub tcp_congestion: Option<String>,
    /// KIST-like write limit: most bytes each TCP socket of a channel
    /// holds written and not yet sent (`TCP_NOTSENT_LOWAT`), 1 to
    /// 4294967295; absent: the kernel's `net.ipv4.tcp_notsent_lowat`
    /// (unlimited by default). 16384 is what `docs/results/seed003.md`
    /// found to behave like C tor's KIST.
    #[serde(default, deserialize_with = "de_unsent_limit")]
    pub channel_unsent_limit: Option<u32>,
    /// Make Linux pace every TCP socket of a channel (`SO_MAX_PACING_RATE`
    /// set, uncapped), as quinn paces every QUIC connection; default
    /// false: Linux paces a Cubic or Reno socket only when asked, BBR
    /// always.
    #[serde(default)]
    pub tcp_pacing: bool,
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
    /// As for a relay: bound on a link handshake with a guard (default
    /// 10000 ms).
    #[serde(
        default = "default_link_handshake_timeout_ms",
        deserialize_with = "de_positive"
    )]
    pub link_handshake_timeout_ms: u64,
    /// As for a relay (default 1200).
    #[serde(
        default = "default_quic_initial_mtu",
        deserialize_with = "de_quic_initial_mtu"
    )]
    pub quic_initial_mtu: u16,
    /// As for a relay (default 512).
    #[serde(
        default = "default_pctcp_max_lanes",
        deserialize_with = "de_pctcp_max_lanes"
    )]
    pub pctcp_max_lanes: u64,
    /// dtls-utcp: the lanes' user-space TCP (`[utcp]`; defaults as
    /// [`UtcpConfig::default`]).
    #[serde(default)]
    pub utcp: UtcpConfig,
    /// As for a relay (default 2000 ms).
    #[serde(
        default = "default_quic_keep_alive_ms",
        deserialize_with = "de_positive"
    )]
    pub quic_keep_alive_ms: u64,
    /// As for a relay (default 8000 ms).
    #[serde(
        default = "default_quic_idle_timeout_ms",
        deserialize_with = "de_positive"
    )]
    pub quic_idle_timeout_ms: u64,
    /// Log filter, as for a relay; none means the program's default.
    #[serde(default)]
    pub log: Option<String>,
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

/// Default [`ClientConfig::stream_connect_timeout_ms`].
pub const DEFAULT_STREAM_CONNECT_TIMEOUT_MS: u64 = 60_000;
/// Default [`ClientConfig::socks_handshake_timeout_ms`].
pub const DEFAULT_SOCKS_HANDSHAKE_TIMEOUT_MS: u64 = 30_000;
/// Default [`ClientConfig::max_socks_connections`].
pub const DEFAULT_MAX_SOCKS_CONNECTIONS: u64 = 4096;
/// Default [`ClientConfig::stream_retries`].
pub const DEFAULT_STREAM_RETRIES: u32 = 1;
/// Default [`ClientConfig::relay_failure_avoidance_s`].
pub const DEFAULT_RELAY_FAILURE_AVOIDANCE_S: u64 = 30;
/// Default [`ClientConfig::network_refresh_s`].
pub const DEFAULT_NETWORK_REFRESH_S: u64 = 3600;
/// Largest [`ClientConfig::network_refresh_s`] accepted (a year).
pub const MAX_NETWORK_REFRESH_S: u64 = 365 * 24 * 3600;

/// Default `link_handshake_timeout_ms` (relays and clients).
pub const DEFAULT_LINK_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// Default `quic_keep_alive_ms` (relays and clients).
pub const DEFAULT_QUIC_KEEP_ALIVE_MS: u64 = 2_000;
/// Default `quic_idle_timeout_ms` (relays and clients).
pub const DEFAULT_QUIC_IDLE_TIMEOUT_MS: u64 = 8_000;
/// Default [`RelayConfig::exit_connect_timeout_ms`].
pub const DEFAULT_EXIT_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// Largest `quic_idle_timeout_ms` accepted (one day).
pub const MAX_QUIC_IDLE_TIMEOUT_MS: u64 = 24 * 3600 * 1000;

fn default_link_handshake_timeout_ms() -> u64 {
    DEFAULT_LINK_HANDSHAKE_TIMEOUT_MS
}
/// `tcp_congestion`: `system` or a kernel algorithm name (lower-case
/// letters, digits, `_`, at most 15 characters, as Linux's
/// `TCP_CA_NAME_MAX` allows); whether the kernel has it is checked when
/// the node starts.
fn de_tcp_congestion<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<String>, D::Error> {
    let s = String::deserialize(d)?;
    let name_ok = !s.is_empty()
        && s.len() <= 15
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !name_ok {
        return Err(serde::de::Error::custom(format!(
            "{s:?} is not \"system\" or a kernel congestion control name such as \"cubic\", \"reno\", \"bbr\""
        )));
    }
    Ok(Some(s))
}

/// Default `quic_initial_mtu` (relays and clients): QUIC's minimum.
pub const DEFAULT_QUIC_INITIAL_MTU: u16 = 1200;
/// Largest `quic_initial_mtu`: a 9000-byte jumbo frame less IPv4 and UDP.
pub const MAX_QUIC_INITIAL_MTU: u16 = 8972;

fn default_quic_initial_mtu() -> u16 {
    DEFAULT_QUIC_INITIAL_MTU
}

fn de_quic_initial_mtu<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<u16, D::Error> {
    let v = u16::deserialize(d)?;
    if !(DEFAULT_QUIC_INITIAL_MTU..=MAX_QUIC_INITIAL_MTU).contains(&v) {
        return Err(serde::de::Error::custom(format!(
            "must be between {DEFAULT_QUIC_INITIAL_MTU} and {MAX_QUIC_INITIAL_MTU}"
        )));
    }
    Ok(v)
}

/// Default `pctcp_max_lanes` (relays and clients).
pub const DEFAULT_PCTCP_MAX_LANES: u64 = onionlab_transport::pctcp::DEFAULT_MAX_LANES as u64;

fn default_pctcp_max_lanes() -> u64 {
    DEFAULT_PCTCP_MAX_LANES
}

fn de_pctcp_max_lanes<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    let v = u64::deserialize(d)?;
    if v == 0 {
        return Err(serde::de::Error::custom("must be at least 1"));
    }
    Ok(v)
}

fn default_quic_keep_alive_ms() -> u64 {
    DEFAULT_QUIC_KEEP_ALIVE_MS
}
fn default_quic_idle_timeout_ms() -> u64 {
    DEFAULT_QUIC_IDLE_TIMEOUT_MS
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

/// A number in (0, 1] (Torchestra's multipliers and thresholds). `Eq`
/// holds because NaN is refused.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fraction(pub f64);

impl Eq for Fraction {}

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if !(v > 0.0 && v <= 1.0) {
            return Err(serde::de::Error::custom(format!("{v} is not in (0, 1]")));
        }
        Ok(Fraction(v))
    }
}

fn default_torchestra_window_ms() -> u64 {
    2000
}

fn default_torchestra_alpha() -> Fraction {
    Fraction(0.18)
}

fn default_torchestra_beta() -> Fraction {
    Fraction(0.36)
}

fn default_torchestra_thresh() -> Fraction {
    Fraction(0.7)
}

fn default_torchestra_verylight() -> Fraction {
    Fraction(0.9)
}

fn default_true() -> bool {
    true
}

fn default_exit_connect_timeout_ms() -> u64 {
    DEFAULT_EXIT_CONNECT_TIMEOUT_MS
}

/// The `utcp` table's values, in range (see [`UtcpConfig::lane_tcp`]).
fn check_utcp(origin: &str, utcp: &UtcpConfig) -> Result<()> {
    utcp.lane_tcp().map(drop).map_err(|message| Error::Invalid {
        origin: origin.to_string(),
        message,
    })
}

/// The QUIC timers of a config: the keep-alive must be shorter than the
/// idle timeout (or every quiet connection would die), which must be at
/// most [`MAX_QUIC_IDLE_TIMEOUT_MS`].
fn check_quic_timers(origin: &str, keep_alive_ms: u64, idle_timeout_ms: u64) -> Result<()> {
    let message = if keep_alive_ms >= idle_timeout_ms {
        format!(
            "quic_keep_alive_ms ({keep_alive_ms}) must be less than quic_idle_timeout_ms \
             ({idle_timeout_ms})"
        )
    } else if idle_timeout_ms > MAX_QUIC_IDLE_TIMEOUT_MS {
        format!(
            "quic_idle_timeout_ms ({idle_timeout_ms}) is above the limit of \
             {MAX_QUIC_IDLE_TIMEOUT_MS}"
        )
    } else {
        return Ok(());
    };
    Err(Error::Invalid {
        origin: origin.to_string(),
        message,
    })
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

/// See [`DEFAULT_EWMA_HALF_LIFE_MS`].
fn default_ewma_half_life_ms() -> u64 {
    DEFAULT_EWMA_HALF_LIFE_MS
}
/// See [`DEFAULT_MAX_MEM_IN_QUEUES`].
fn default_max_mem_in_queues() -> u64 {
    DEFAULT_MAX_MEM_IN_QUEUES
}
/// See [`DEFAULT_CIRCUIT_BUILD_TIMEOUT_MS`].
fn default_circuit_build_timeout_ms() -> u64 {
    DEFAULT_CIRCUIT_BUILD_TIMEOUT_MS
}
/// See [`DEFAULT_MAX_CIRCUIT_DIRTINESS_S`].
fn default_max_circuit_dirtiness_s() -> u64 {
    DEFAULT_MAX_CIRCUIT_DIRTINESS_S
}
/// See [`DEFAULT_BUILD_RETRIES`].
fn default_build_retries() -> u32 {
    DEFAULT_BUILD_RETRIES
}

/// A valid nickname.
fn de_nickname<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if !valid_nickname(&s) {
        return Err(serde::de::Error::custom(format!(
            "nickname {s:?} must be 1-19 ASCII letters and digits"
        )));
    }
    Ok(s)
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

/// A network public key in hex that parses.
fn de_network_key<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    let s = String::deserialize(d)?;
    parse_public_key(&s, "network_key").map_err(serde::de::Error::custom)?;
    Ok(s)
}

/// `channel_unsent_limit`: a byte count above zero.
fn de_unsent_limit<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<u32>, D::Error> {
    let n = u32::deserialize(d)?;
    if n == 0 {
        return Err(serde::de::Error::custom(
            "must be greater than 0 (leave it out for the kernel's setting)",
        ));
    }
    Ok(Some(n))
}

/// A number above zero.
fn de_positive<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    let n = u64::deserialize(d)?;
    if n == 0 {
        return Err(serde::de::Error::custom("must be greater than 0"));
    }
    Ok(n)
}

/// `p` relative to `base` unless absolute.
fn resolve(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// The directory relative paths in the file at `path` are relative to.
fn base_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Read and deserialize a TOML file, with file and line in errors.
fn load_toml<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = read_file_limited(path, MAX_CONFIG_LEN)?;
    parse_toml(&text, &path.display().to_string())
}

/// Deserialize TOML text, naming `origin` in errors.
fn parse_toml<T: DeserializeOwned>(text: &str, origin: &str) -> Result<T> {
    toml::from_str(text).map_err(|e| toml_error(origin, text, &e))
}

impl RelayConfig {
    /// The TCP congestion control to use: `tcp_congestion` if set, else
    /// the match of `quic_congestion`. Checked against the kernel when
    /// the node starts.
    pub fn tcp_congestion_name(&self) -> &str {
        self.tcp_congestion
            .as_deref()
            .unwrap_or(self.quic_congestion.tcp_match())
    }

    /// Load a relay configuration file, resolving relative paths against
    /// its directory.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] or [`Error::TooLarge`] if the file cannot be read;
    /// [`Error::Parse`] (file, line, column) for syntax errors, unknown or
    /// missing fields and bad values.
    pub fn load(path: &Path) -> Result<Self> {
        let mut cfg: Self = load_toml(path)?;
        cfg.check(&path.display().to_string())?;
        cfg.resolve_paths(&base_dir(path));
        Ok(cfg)
    }

    /// Parse a relay configuration from text; `origin` names it in errors,
    /// and relative paths are resolved against `base_dir`.
    ///
    /// # Errors
    ///
    /// [`Error::Parse`], as for [`load`](Self::load).
    pub fn from_toml_str(text: &str, origin: &str, base_dir: &Path) -> Result<Self> {
        let mut cfg: Self = parse_toml(text, origin)?;
        cfg.check(origin)?;
        cfg.resolve_paths(base_dir);
        Ok(cfg)
    }

    /// Checks across settings.
    fn check(&self, origin: &str) -> Result<()> {
        check_quic_timers(origin, self.quic_keep_alive_ms, self.quic_idle_timeout_ms)?;
        check_utcp(origin, &self.utcp)
    }

    /// Resolve relative paths against `base`.
    fn resolve_paths(&mut self, base: &Path) {
        self.keys = resolve(base, &self.keys);
        self.network.resolve_against(base);
    }

    /// The network public key.
    ///
    /// # Errors
    ///
    /// [`Error::Key`] if `network_key` was changed to something invalid
    /// after loading.
    pub fn network_public_key(&self) -> Result<PublicKey> {
        parse_public_key(&self.network_key, "relay configuration network_key")
    }
}

impl ClientConfig {
    /// The TCP congestion control to use: `tcp_congestion` if set, else
    /// the match of `quic_congestion`. Checked against the kernel when
    /// the node starts.
    pub fn tcp_congestion_name(&self) -> &str {
        self.tcp_congestion
            .as_deref()
            .unwrap_or(self.quic_congestion.tcp_match())
    }

    /// Load a client configuration file, resolving a relative `network`
    /// path against its directory.
    ///
    /// # Errors
    ///
    /// As [`RelayConfig::load`].
    pub fn load(path: &Path) -> Result<Self> {
        let mut cfg: Self = load_toml(path)?;
        cfg.check(&path.display().to_string())?;
        cfg.network.resolve_against(&base_dir(path));
        Ok(cfg)
    }

    /// Parse a client configuration from text; `origin` names it in errors,
    /// and a relative `network` path is resolved against `base_dir`.
    ///
    /// # Errors
    ///
    /// [`Error::Parse`], as for [`load`](Self::load).
    pub fn from_toml_str(text: &str, origin: &str, base_dir: &Path) -> Result<Self> {
        let mut cfg: Self = parse_toml(text, origin)?;
        cfg.check(origin)?;
        cfg.network.resolve_against(base_dir);
        Ok(cfg)
    }

    /// Checks across settings.
    fn check(&self, origin: &str) -> Result<()> {
        check_quic_timers(origin, self.quic_keep_alive_ms, self.quic_idle_timeout_ms)?;
        check_utcp(origin, &self.utcp)?;
        if self.path.is_some() && self.legs != 1 {
            return Err(Error::Invalid {
                origin: origin.to_string(),
                message: format!(
                    "legs = {} with one pinned path: pin the legs with paths, or leave path out \
                     for random legs",
                    self.legs
                ),
            });
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
                return Err(Error::Invalid {
                    origin: origin.to_string(),
                    message,
                });
            }
        }
        if self.network_refresh_s > MAX_NETWORK_REFRESH_S {
            return Err(Error::Invalid {
                origin: origin.to_string(),
                message: format!(
                    "network_refresh_s ({}) is above the limit of {MAX_NETWORK_REFRESH_S} \
                     (a year; 0 turns the refresh off)",
                    self.network_refresh_s
                ),
            });
        }
        Ok(())
    }

    /// The network public key.
    ///
    /// # Errors
    ///
    /// [`Error::Key`] if `network_key` was changed to something invalid
    /// after loading.
    pub fn network_public_key(&self) -> Result<PublicKey> {
        parse_public_key(&self.network_key, "client configuration network_key")
    }
}

#[cfg(test)]
mod test {
    use super::*;

    /// A valid network public key in hex.
    fn key_hex() -> String {
        let kp = tor_llcrypto::pk::ed25519::Keypair::from_bytes(&[3; 32]);
        hex::encode(kp.verifying_key().as_bytes())
    }

    fn relay_text(extra: &str) -> String {
        format!(
            "nickname = \"relay0\"\nkeys = \"keys.secret\"\nlisten = \"127.0.0.1:9001\"\n\
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
            &relay_text("quic_keep_alive_ms = 500\nquic_idle_timeout_ms = 3000\n"),
            "r.toml",
            base,
        )
        .unwrap();
        assert_eq!(
            (ok.quic_keep_alive_ms, ok.quic_idle_timeout_ms),
            (500, 3000)
        );
        for (extra, want) in [
            (
                "quic_keep_alive_ms = 9000\n",
                "must be less than quic_idle_timeout_ms",
            ),
            ("quic_idle_timeout_ms = 100000000\n", "above the limit"),
            ("quic_idle_timeout_ms = 0\n", "greater than 0"),
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
            &relay_text("").replace("listen = \"127.0.0.1:9001\"\n", ""),
            "r.toml",
            Path::new("."),
        )
        .unwrap_err();
        assert!(err.to_string().contains("missing field `listen`"), "{err}");
    }

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

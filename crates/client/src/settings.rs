//! The client's resolved settings: what [`crate::Client::bind`] needs, with
//! the network document already loaded and verified.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use onionlab_circuit::scheduler::SchedulerKind;
use onionlab_config::{ClientConfig, ConfigFile, NetworkSource};
use onionlab_netdoc::NetworkDocument;
use tor_llcrypto::pk::ed25519::PublicKey;

use crate::error::{Error, Result};

/// Default [`ClientSettings::stream_connect_timeout`].
pub const DEFAULT_STREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// Default [`ClientSettings::socks_handshake_timeout`].
pub const DEFAULT_SOCKS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default [`ClientSettings::max_socks_connections`].
pub const DEFAULT_MAX_SOCKS_CONNECTIONS: usize = 4096;
/// Default [`ClientSettings::stream_retries`] (tor retries a stream whose
/// circuit failed before CONNECTED on a new circuit, too).
pub const DEFAULT_STREAM_RETRIES: u32 = 1;
/// Default [`ClientSettings::relay_failure_avoidance`].
pub const DEFAULT_RELAY_FAILURE_AVOIDANCE: Duration = Duration::from_secs(30);

/// Where the network document came from and the network key that verified
/// it: what the client needs to load it again.
#[derive(Debug, Clone)]
pub struct NetworkOrigin {
    /// The file or directory URL.
    pub source: NetworkSource,
    /// The network public key every document must be signed with.
    pub key: PublicKey,
}

/// Everything the client needs to run.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// Address of the SOCKS listener (port 0: any free port, see
    /// [`crate::Client::local_addr`]).
    pub socks_listen: SocketAddr,
    /// The verified network document.
    pub network: Arc<NetworkDocument>,
    /// Where to load the document again from, with the key to verify it.
    /// `None` (settings built in code): the document is never reloaded.
    pub network_origin: Option<NetworkOrigin>,
    /// Load the document again from `network_origin` this often and keep
    /// the newest valid one (see [`onionlab_config::refresh`]). `None`:
    /// never. Nothing is reloaded without a `network_origin`.
    pub network_refresh: Option<Duration>,
    /// A pinned path of relay nicknames, guard first and exit last. Any
    /// length of at least one is accepted (shorter than 3 gives no
    /// anonymity; useful in labs and tests). `None`: a random 3-hop path
    /// per circuit (see [`crate::path`]).
    pub path: Option<Vec<String>>,
    /// Pinned legs of every multi-path set (instead of `path`), each as
    /// `path` is, all ending at the same exit. Used only when the
    /// document has `cfx_enabled`; otherwise the first is the pinned path.
    pub paths: Option<Vec<Vec<String>>>,
    /// Legs of each multi-path set when paths are random (at most
    /// [`onionlab_config::MAX_LEGS`]); 1: plain circuits. Used only
    /// when the document has `cfx_enabled`.
    pub legs: usize,
    /// This end's leg scheduler (`None`: the document's `cfx_scheduler`).
    pub leg_scheduler: Option<onionlab_circuit::conflux::sched::LegSchedulerKind>,
    /// Seed of the random path choice (experiments: the same paths for
    /// the same document and order of requests); `None`: the operating
    /// system's entropy.
    pub path_seed: Option<u64>,
    /// Give up on a circuit that is not built after this long.
    pub circuit_build_timeout: Duration,
    /// Stop attaching new streams to a circuit this long after its first
    /// stream; close it when its last stream is gone after that.
    pub max_circuit_dirtiness: Duration,
    /// Extra build attempts (fresh random paths; the same pinned path)
    /// after a failed one, before a stream fails.
    pub build_retries: u32,
    /// Fail a stream whose exit has not answered its BEGIN after this long
    /// (SOCKS reply 0x06).
    pub stream_connect_timeout: Duration,
    /// Drop a SOCKS connection that has not completed its handshake after
    /// this long.
    pub socks_handshake_timeout: Duration,
    /// Most SOCKS connections open at once; more are closed on accept.
    pub max_socks_connections: usize,
    /// How many times a stream whose circuit failed before the exit
    /// answered CONNECTED is retried on a fresh circuit. A stream that
    /// had connected is never retried: it fails (the application's socket
    /// is reset).
    pub stream_retries: u32,
    /// Random paths avoid a relay for this long after it failed (its
    /// channel closed, a hop reported it gone with TRUNCATED, its
    /// handshake failed or timed out), unless no path exists without it.
    /// Pinned paths are used as they are.
    pub relay_failure_avoidance: Duration,
    /// Circuit scheduler of each guard channel: which circuit's cell the
    /// client sends next when several have cells. Default EWMA with tor's
    /// 30 s half-life, as tor clients do.
    pub scheduler: SchedulerKind,
    /// How the client makes its links to guards: the transport (default
    /// TLS only), the handshake bound, and each transport's settings (the
    /// `[link]` section of its configuration file; the TCP congestion
    /// control the kernel's unless set, checked by
    /// [`crate::Client::bind`]).
    pub link: onionlab_transport::LinkSettings,
}

impl ClientSettings {
    /// Settings with the defaults of the configuration file (10 s build
    /// timeout, 600 s dirtiness, 3 retries, hourly refresh), a random path,
    /// and the client's own defaults for the rest. There is no
    /// [`network_origin`](Self::network_origin), so the document is never
    /// reloaded unless one is set.
    pub fn new(socks_listen: SocketAddr, network: NetworkDocument) -> Self {
        use onionlab_config::{
            DEFAULT_BUILD_RETRIES, DEFAULT_CIRCUIT_BUILD_TIMEOUT_MS,
            DEFAULT_MAX_CIRCUIT_DIRTINESS_S, DEFAULT_NETWORK_REFRESH_S,
        };
        ClientSettings {
            socks_listen,
            network: Arc::new(network),
            network_origin: None,
            network_refresh: refresh_interval(DEFAULT_NETWORK_REFRESH_S),
            path: None,
            paths: None,
            legs: 1,
            leg_scheduler: None,
            path_seed: None,
            circuit_build_timeout: Duration::from_millis(DEFAULT_CIRCUIT_BUILD_TIMEOUT_MS),
            max_circuit_dirtiness: Duration::from_secs(DEFAULT_MAX_CIRCUIT_DIRTINESS_S),
            build_retries: DEFAULT_BUILD_RETRIES,
            stream_connect_timeout: DEFAULT_STREAM_CONNECT_TIMEOUT,
            socks_handshake_timeout: DEFAULT_SOCKS_HANDSHAKE_TIMEOUT,
            max_socks_connections: DEFAULT_MAX_SOCKS_CONNECTIONS,
            stream_retries: DEFAULT_STREAM_RETRIES,
            relay_failure_avoidance: DEFAULT_RELAY_FAILURE_AVOIDANCE,
            scheduler: SchedulerKind::default(),
            link: onionlab_transport::LinkSettings::tls_only(),
        }
    }

    /// Settings from a parsed configuration file and its (verified)
    /// network document. The document is reloaded only if
    /// [`network_origin`](Self::network_origin) is set afterwards (as
    /// [`load`](Self::load) does).
    ///
    /// # Errors
    ///
    /// None today (the file's values were checked when it was read); kept
    /// fallible for settings checked against the machine.
    pub fn from_config(config: &ClientConfig, network: NetworkDocument) -> Result<Self> {
        let mut s = ClientSettings::new(config.socks_listen, network);
        s.network_refresh = refresh_interval(config.network_refresh_s);
        s.path = config.path.clone();
        s.paths = config.paths.clone();
        s.legs = config.legs;
        s.leg_scheduler = config.leg_scheduler;
        s.path_seed = config.path_seed;
        s.circuit_build_timeout = Duration::from_millis(config.circuit_build_timeout_ms);
        s.max_circuit_dirtiness = Duration::from_secs(config.max_circuit_dirtiness_s);
        s.build_retries = config.build_retries;
        s.stream_connect_timeout = Duration::from_millis(config.stream_connect_timeout_ms);
        s.socks_handshake_timeout = Duration::from_millis(config.socks_handshake_timeout_ms);
        s.max_socks_connections =
            usize::try_from(config.max_socks_connections).unwrap_or(usize::MAX);
        s.stream_retries = config.stream_retries;
        s.relay_failure_avoidance = Duration::from_secs(config.relay_failure_avoidance_s);
        s.link = config.link.clone();
        Ok(s)
    }

    /// Load a client configuration file, then read or fetch its network
    /// document and verify it with the configured network key. This is
    /// what `onionlab client --config FILE` starts with. The settings keep
    /// the source and key, so the client reloads the document every
    /// `network_refresh_s`.
    ///
    /// # Errors
    ///
    /// [`Error::Load`] naming the file or document source.
    pub async fn load(config_path: &Path) -> Result<Self> {
        let config = ClientConfig::load(config_path).map_err(|source| Error::Load {
            what: format!("client configuration {}", config_path.display()),
            source,
        })?;
        let what = || format!("network document from {}", config.network);
        let key = config.network_public_key().map_err(|source| Error::Load {
            what: what(),
            source,
        })?;
        let doc = config
            .network
            .load(&key)
            .await
            .map_err(|source| Error::Load {
                what: what(),
                source,
            })?;
        tracing::info!(
            source = %config.network,
            network = %doc.network_name,
            relays = doc.relays.len(),
            "network document verified"
        );
        let mut settings = ClientSettings::from_config(&config, doc)?;
        settings.network_origin = Some(NetworkOrigin {
            source: config.network.clone(),
            key,
        });
        Ok(settings)
    }
}

/// A refresh interval in seconds as the settings hold it (0: `None`).
fn refresh_interval(secs: u64) -> Option<Duration> {
    (secs > 0).then(|| Duration::from_secs(secs))
}

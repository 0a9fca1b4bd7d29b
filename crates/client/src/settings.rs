//! The client's resolved settings: what [`crate::Client::bind`] needs, with
//! the network document already loaded and verified.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use onionlab_client_core::PolicySettings;
use onionlab_config::{ClientConfig, ConfigFile, NetworkSource};
use onionlab_netdoc::NetworkDocument;
use tor_llcrypto::pk::ed25519::PublicKey;

use crate::error::{Error, Result};

/// Default [`ClientSettings::socks_handshake_timeout`].
pub const DEFAULT_SOCKS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default [`ClientSettings::max_socks_connections`].
pub const DEFAULT_MAX_SOCKS_CONNECTIONS: usize = 4096;

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
    /// The network document and the client's decisions over it: paths,
    /// dirtiness, retries, timeouts.
    pub policy: PolicySettings,
    /// Where to load the document again from, with the key to verify it.
    /// `None` (settings built in code): the document is never reloaded.
    pub network_origin: Option<NetworkOrigin>,
    /// Load the document again from `network_origin` this often and keep
    /// the newest valid one (see [`onionlab_config::refresh`]). `None`:
    /// never. Nothing is reloaded without a `network_origin`.
    pub network_refresh: Option<Duration>,
    /// Drop a SOCKS connection that has not completed its handshake after
    /// this long.
    pub socks_handshake_timeout: Duration,
    /// Most SOCKS connections open at once; more are closed on accept.
    pub max_socks_connections: usize,
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
        ClientSettings {
            socks_listen,
            policy: PolicySettings::new(Arc::new(network)),
            network_origin: None,
            network_refresh: refresh_interval(onionlab_config::DEFAULT_NETWORK_REFRESH_S),
            socks_handshake_timeout: DEFAULT_SOCKS_HANDSHAKE_TIMEOUT,
            max_socks_connections: DEFAULT_MAX_SOCKS_CONNECTIONS,
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
        let p = &mut s.policy;
        p.path = config.path.clone();
        p.paths = config.paths.clone();
        p.legs = config.legs;
        p.leg_scheduler = config.leg_scheduler;
        p.path_seed = config.path_seed;
        p.circuit_build_timeout = Duration::from_millis(config.circuit_build_timeout_ms);
        p.max_circuit_dirtiness = Duration::from_secs(config.max_circuit_dirtiness_s);
        p.build_retries = config.build_retries;
        p.stream_connect_timeout = Duration::from_millis(config.stream_connect_timeout_ms);
        p.stream_retries = config.stream_retries;
        p.relay_failure_avoidance = Duration::from_secs(config.relay_failure_avoidance_s);
        s.socks_handshake_timeout = Duration::from_millis(config.socks_handshake_timeout_ms);
        s.max_socks_connections =
            usize::try_from(config.max_socks_connections).unwrap_or(usize::MAX);
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

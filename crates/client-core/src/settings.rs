//! What the client's decisions depend on: the network document and the
//! policy settings ([`PolicySettings`]), and the same with the pinned
//! path resolved against the document ([`Config`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use onionlab_circuit::conflux::sched::LegSchedulerKind;
use onionlab_circuit::scheduler::SchedulerKind;
use onionlab_netdoc::{NetworkDocument, RelayEntry};

use crate::path::{resolve_pinned, PinnedPathError};

/// How long a circuit may take to build before it is abandoned.
pub const DEFAULT_CIRCUIT_BUILD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long after its first stream a circuit takes new streams (tor's
/// `MaxCircuitDirtiness`).
pub const DEFAULT_MAX_CIRCUIT_DIRTINESS: Duration = Duration::from_secs(600);
/// Failed circuit builds a stream survives before it fails.
pub const DEFAULT_BUILD_RETRIES: u32 = 3;
/// How long a stream waits for the exit's CONNECTED.
pub const DEFAULT_STREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// How many times a stream whose circuit closed before CONNECTED is tried
/// again on a fresh circuit.
pub const DEFAULT_STREAM_RETRIES: u32 = 1;
/// How long random paths avoid a relay that failed.
pub const DEFAULT_RELAY_FAILURE_AVOIDANCE: Duration = Duration::from_secs(30);

/// The settings of the client's decisions (the client configuration
/// file's keys of the same names, with durations as durations).
#[derive(Debug, Clone)]
pub struct PolicySettings {
    /// The verified network document paths are chosen from.
    pub network: Arc<NetworkDocument>,
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
    /// `MAX_LEGS_PER_SET`); 1: plain circuits. Used only when the
    /// document has `cfx_enabled`.
    pub legs: usize,
    /// This end's leg scheduler (`None`: the document's `cfx_scheduler`).
    pub leg_scheduler: Option<LegSchedulerKind>,
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
}

impl PolicySettings {
    /// The defaults, over `network`.
    pub fn new(network: Arc<NetworkDocument>) -> Self {
        PolicySettings {
            network,
            path: None,
            paths: None,
            legs: 1,
            leg_scheduler: None,
            path_seed: None,
            circuit_build_timeout: DEFAULT_CIRCUIT_BUILD_TIMEOUT,
            max_circuit_dirtiness: DEFAULT_MAX_CIRCUIT_DIRTINESS,
            build_retries: DEFAULT_BUILD_RETRIES,
            stream_connect_timeout: DEFAULT_STREAM_CONNECT_TIMEOUT,
            stream_retries: DEFAULT_STREAM_RETRIES,
            relay_failure_avoidance: DEFAULT_RELAY_FAILURE_AVOIDANCE,
            scheduler: SchedulerKind::default(),
        }
    }

    /// The pinned path's or legs' nicknames, one string per path, for
    /// messages.
    pub fn pinned_names(&self) -> Option<Vec<String>> {
        self.path.clone().or_else(|| {
            let legs = self.paths.as_ref()?;
            Some(legs.iter().map(|p| p.join(",")).collect())
        })
    }
}

/// A relay's Ed25519 identity: how state that outlives a network document
/// (channels, failed relays) names relays. Indexes into a document's relay
/// list are only meaningful with that document.
pub type RelayId = [u8; 32];

/// Settings with the pinned path (or legs) resolved against their network
/// document. A newer document makes a new `Config`
/// ([`ClientCore::replace_network`](crate::ClientCore::replace_network)).
#[derive(Debug)]
pub struct Config {
    /// The settings as given.
    pub settings: PolicySettings,
    /// Relay indexes of the pinned path (one) or pinned legs (`paths`),
    /// if the settings pin any.
    pub pinned: Option<Vec<Vec<usize>>>,
    /// Index of each relay of the document, by identity.
    by_identity: HashMap<RelayId, usize>,
}

/// Pinned legs resolved as [`resolve_pinned`] resolves a path: 1 to
/// `MAX_LEGS_PER_SET` of them, all ending at the same exit (the
/// configuration file checks the same; settings built in code are checked
/// here).
fn resolve_legs(
    relays: &[RelayEntry],
    legs: &[Vec<String>],
) -> Result<Vec<Vec<usize>>, PinnedPathError> {
    let max = onionlab_circuit::node::MAX_LEGS_PER_SET;
    if legs.is_empty() || legs.len() > max {
        return Err(PinnedPathError::BadLegs(format!(
            "1 to {max} paths, not {}",
            legs.len()
        )));
    }
    let resolved = legs
        .iter()
        .map(|names| resolve_pinned(relays, names))
        .collect::<Result<Vec<_>, _>>()?;
    if resolved.iter().any(|p| p.last() != resolved[0].last()) {
        return Err(PinnedPathError::BadLegs(
            "every leg must end at the same exit".into(),
        ));
    }
    Ok(resolved)
}

impl Config {
    /// `settings` with their pinned path (if any) resolved by nickname
    /// against their document.
    ///
    /// # Errors
    ///
    /// A pinned relay the document does not list (or lists without a `tls`
    /// address), a relay named twice, pinned legs that do not share their
    /// exit.
    pub fn new(settings: PolicySettings) -> Result<Self, PinnedPathError> {
        let relays = &settings.network.relays;
        let pinned = match (&settings.path, &settings.paths) {
            (Some(names), _) => Some(vec![resolve_pinned(relays, names)?]),
            (None, Some(legs)) => Some(resolve_legs(relays, legs)?),
            (None, None) => None,
        };
        let by_identity = settings
            .network
            .relays
            .iter()
            .enumerate()
            .map(|(i, r)| (r.ed_identity, i))
            .collect();
        Ok(Config {
            settings,
            pinned,
            by_identity,
        })
    }

    /// The relays of the document held.
    pub fn relays(&self) -> &[RelayEntry] {
        &self.settings.network.relays
    }

    /// Legs of each new circuit: the pinned legs or the `legs` setting
    /// when the network's exits link sets (`cfx_enabled`), else 1.
    pub fn legs(&self) -> usize {
        if !self.settings.network.params.cfx_enabled {
            return 1;
        }
        self.pinned
            .as_ref()
            .map_or(self.settings.legs, Vec::len)
            .max(1)
    }

    /// Whether the settings ask for more legs than the network links
    /// (`cfx_enabled` is off), and how many.
    pub fn sets_refused(&self) -> Option<usize> {
        let settings = &self.settings;
        let asked = settings.legs.max(self.pinned.as_ref().map_or(1, Vec::len));
        (asked > 1 && !settings.network.params.cfx_enabled).then_some(asked)
    }

    /// The leg scheduler of this end of a set: the setting, else the
    /// network's.
    pub(crate) fn leg_scheduler(&self) -> LegSchedulerKind {
        self.settings
            .leg_scheduler
            .unwrap_or(self.settings.network.params.cfx_scheduler)
    }

    /// The index in this document of the relay with identity `id`.
    pub(crate) fn index_of(&self, id: &RelayId) -> Option<usize> {
        self.by_identity.get(id).copied()
    }
}

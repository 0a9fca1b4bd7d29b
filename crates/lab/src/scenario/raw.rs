//! The scenario file as TOML reads it, before any check: the sections'
//! shapes and their spans for errors.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

use crate::labels::ReportSettings;

/// The whole scenario file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawScenario {
    pub(super) name: Spanned<String>,
    #[serde(default)]
    pub(super) description: String,
    pub(super) topology: Spanned<String>,
    #[serde(default = "default_repetitions")]
    pub(super) repetitions: Spanned<u32>,
    #[serde(default = "default_seed")]
    pub(super) seed: u64,
    #[serde(default)]
    pub(super) transfer_timeout: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) stall_threshold: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) relay: Vec<RawRelay>,
    #[serde(default)]
    pub(super) client: Vec<RawClient>,
    #[serde(default)]
    pub(super) server: Vec<RawServer>,
    #[serde(default)]
    pub(super) workload: Vec<RawWorkload>,
    #[serde(default)]
    pub(super) matrix: BTreeMap<String, Spanned<Vec<Spanned<toml::Value>>>>,
    #[serde(default)]
    pub(super) exclude: Vec<Spanned<BTreeMap<String, toml::Value>>>,
    #[serde(default)]
    // Not `Spanned`: toml cannot span a table that only `[report.labels]`
    // defines; errors point at the table's header line instead.
    pub(super) report: Option<ReportSettings>,
    #[serde(default)]
    pub(super) relay_settings: Option<toml::Table>,
    #[serde(default)]
    pub(super) ctor: Option<Spanned<RawCtor>>,
}

/// `[ctor]`: more torrc lines for a C tor variant's tors.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCtor {
    #[serde(default)]
    pub(super) relay_torrc: Vec<String>,
    #[serde(default)]
    pub(super) client_torrc: Vec<String>,
    #[serde(default)]
    pub(super) consensus_params: Vec<String>,
}

fn default_repetitions() -> Spanned<u32> {
    Spanned::new(0..0, 10)
}

fn default_seed() -> u64 {
    1
}

/// A `[[relay]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRelay {
    pub(super) host: Spanned<String>,
    #[serde(default)]
    pub(super) guard: bool,
    #[serde(default)]
    pub(super) exit: bool,
    #[serde(default)]
    pub(super) bandwidth: Option<Spanned<u64>>,
}

/// A `[[client]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClient {
    pub(super) name: Spanned<String>,
    pub(super) host: Spanned<String>,
    #[serde(default)]
    pub(super) path: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    pub(super) paths: Option<Vec<Vec<Spanned<String>>>>,
}

/// A `[[server]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    pub(super) name: Spanned<String>,
    pub(super) host: Spanned<String>,
}

/// A `[[workload]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWorkload {
    #[serde(default)]
    pub(super) name: Option<Spanned<String>>,
    pub(super) kind: Spanned<String>,
    pub(super) client: Spanned<String>,
    pub(super) server: Spanned<String>,
    #[serde(default)]
    pub(super) size: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) count: Option<Spanned<u32>>,
    #[serde(default)]
    pub(super) think: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) start: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) probes: Option<Spanned<u32>>,
    #[serde(default)]
    pub(super) interval: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) trace: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) duration: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) until: Option<Spanned<String>>,
}

//! The lab crate's one error type: reading a scenario, running it, and
//! reading or storing its results.

use std::path::PathBuf;

/// What can go wrong reading a scenario, running it, or reading, storing
/// and reporting a run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A scenario file could not be read.
    #[error("cannot read scenario {path}: {source}")]
    ReadScenario {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The scenario is invalid; the message names the file, line and column.
    #[error("{origin}:{line}:{column}: {message}")]
    Scenario {
        /// The file.
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// The scenario's topology is invalid.
    #[error(transparent)]
    Topology(onionlab_netem::Error),
    /// File system, while running: what the lab was doing.
    #[error("{what}: {source}")]
    Io {
        /// What we were doing.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The emulated network, while running.
    #[error("emulated network: {0}")]
    Netem(#[from] onionlab_netem::Error),
    /// Keys or the network document.
    #[error("network document: {0}")]
    Netdoc(#[from] onionlab_netdoc::Error),
    /// A node's configuration file.
    #[error("node configuration: {0}")]
    NodeConfig(#[from] onionlab_config::Error),
    /// A node did not start.
    #[error("{0}")]
    Start(String),
    /// A variant's node configuration could not be made (its values are
    /// checked when the scenario is read, so this is a lab bug).
    #[error("node configuration: {0}")]
    Config(String),
    /// A variant's `[link]` settings are refused by the transports.
    #[error("[link] settings: {0}")]
    Link(#[from] onionlab_transport::Error),
    /// The scenario's `[relay_settings.link]` does not fit the settings.
    #[error("[relay_settings.link]: {0}")]
    LinkTable(#[from] toml::de::Error),
    /// Shadow cannot run what was asked (a network property it has no
    /// model for, a variant it cannot run), or its files cannot be made.
    #[error("Shadow: {0}")]
    Shadow(String),
    /// A second signal ended the runs under way before their workloads
    /// finished; nothing of them is recorded.
    #[error("interrupted: the runs under way were ended and not recorded")]
    Interrupted,
    /// A file of a run could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line of a records file is not a record.
    #[error("{path}:{line}: {message}")]
    Record {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// Writing a report failed.
    #[error(transparent)]
    Report(#[from] onionlab_report::Error),
    /// Two runs cannot be compared.
    #[error("{0}")]
    Mismatch(String),
    /// A run (directory or stored) is missing, incomplete, changed since
    /// it was stored, or not fit to be stored.
    #[error("{path}: {message}")]
    Stored {
        /// The file or folder.
        path: String,
        /// What is wrong.
        message: String,
    },
}

/// Result alias of the crate.
pub type Result<T> = std::result::Result<T, Error>;

/// An [`Error::Io`] naming what the lab was doing.
pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

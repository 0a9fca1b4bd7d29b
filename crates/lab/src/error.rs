//! The lab crate's error type.

use std::path::PathBuf;

/// What can go wrong loading or running a scenario.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A scenario file could not be read.
    #[error("cannot read scenario {path}: {source}")]
    Read {
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
    Topology(#[from] onionlab_netem::Error),
}

/// Result alias of the crate.
pub type Result<T> = std::result::Result<T, Error>;

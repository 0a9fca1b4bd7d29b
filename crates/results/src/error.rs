//! The crate's error type.

/// Why a table or a results page could not be made or checked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The run could not be read (missing, truncated, changed since it was
    /// stored, from a dirty tree...): the message names the file.
    #[error(transparent)]
    Run(#[from] onionlab_lab::Error),
    /// The table asked for does not fit the run (unknown parameter,
    /// baseline, workload or variant).
    #[error("{run}: {message}")]
    Table {
        /// The run.
        run: String,
        /// What does not fit.
        message: String,
    },
    /// A statistic failed (it names why).
    #[error("{context}: {source}")]
    Stats {
        /// Which cell.
        context: String,
        /// Why.
        #[source]
        source: onionlab_stats::Error,
    },
    /// A results page's markers are malformed.
    #[error("{page}:{line}: {message}")]
    Marker {
        /// The page.
        page: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A page could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

//! The crate's error type.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong in `onionlab-config`.
///
/// Every variant names where the problem is: a file path, a URL, or the
/// `origin` of a text (a path, a URL, or a description such as
/// `"[relay_settings]"`), and a line where there is one. What the network
/// document or a key file says wrong is [`Error::Document`], as
/// `onionlab-netdoc` found it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The network document, a key file or an exit policy is wrong (bad
    /// signature, expired, malformed...), or one of them could not be read.
    #[error(transparent)]
    Document(#[from] onionlab_netdoc::Error),
    /// Reading, writing or creating a file or directory failed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// What was being done ("read", "write", "create directory", ...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A file or HTTP response is larger than allowed.
    #[error("{what} is too large: {size} bytes, at most {max} allowed")]
    TooLarge {
        /// What was too large (a path, a URL, or a description).
        what: String,
        /// Its size in bytes (or the size read so far when the limit was hit).
        size: u64,
        /// The limit in bytes.
        max: u64,
    },
    /// A configuration file is syntactically wrong, has an unknown key, or
    /// a value of the wrong type or form.
    #[error("{origin}:{line}:{column}: {message}")]
    Parse {
        /// Where the text came from (path or description).
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column (characters).
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A configuration's values are out of range, alone or together.
    #[error("{origin}: {message}")]
    Invalid {
        /// Where the configuration came from.
        origin: String,
        /// What is wrong.
        message: String,
    },
    /// A URL is malformed or not supported.
    #[error("URL {url:?}: {reason}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Fetching a document over HTTP failed.
    #[error("fetching {url}: {reason}")]
    Http {
        /// The URL.
        url: String,
        /// What went wrong (connection, HTTP status, protocol, encoding).
        reason: String,
    },
    /// Fetching a document over HTTP took too long.
    #[error("fetching {url}: no complete answer within {after:?}")]
    Timeout {
        /// The URL.
        url: String,
        /// The time limit.
        after: Duration,
    },
    /// The options given to [`init_network`](crate::init::init_network) are
    /// inconsistent.
    #[error("invalid network set-up options: {0}")]
    InitOptions(String),
    /// [`init_network`](crate::init::init_network) refuses to write into a
    /// directory that already has files in it.
    #[error(
        "output directory {path} exists and is not empty; choose a new directory or empty it first"
    )]
    OutputNotEmpty {
        /// The directory.
        path: PathBuf,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Turn a TOML deserialization error into [`Error::Parse`].
pub(crate) fn toml_error(origin: &str, text: &str, e: &toml::de::Error) -> Error {
    let (line, column) = e
        .span()
        .map_or((1, 1), |s| onionlab_netdoc::line_col(text, s.start));
    Error::Parse {
        origin: origin.to_string(),
        line,
        column,
        // toml leaves the message of some syntax errors (a control
        // character in a comment, for one) empty.
        message: match e.message().trim_end() {
            "" => "invalid TOML syntax".to_string(),
            m => m.to_string(),
        },
    }
}

//! The crate's error type.

use std::net::SocketAddr;

use crate::path::PinnedPathError;

/// What can stop the client from starting or running.
///
/// Failures of single streams are not errors of the client: they are
/// reported to the application in the SOCKS reply (see [`crate::socks`])
/// and logged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration file or the network document could not be loaded
    /// or verified (the inner error names the file or URL and line).
    #[error("loading {what}: {source}")]
    Load {
        /// What was being loaded ("client configuration FILE", "network
        /// document from SOURCE").
        what: String,
        /// The underlying error.
        #[source]
        source: onionlab_config::Error,
    },
    /// The pinned path in the settings is unusable.
    #[error("pinned path {path:?}: {source}")]
    PinnedPath {
        /// The nicknames as configured.
        path: Vec<String>,
        /// What is wrong.
        #[source]
        source: PinnedPathError,
    },
    /// The SOCKS listener could not be bound.
    #[error("binding the SOCKS listener on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A link setting the transports refuse, or the kernel or the platform
    /// cannot honour (named in the message).
    #[error("{what}: {source}")]
    Setting {
        /// What was being set up.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: onionlab_transport::Error,
    },
    /// Datagram sets cannot run with these settings.
    #[error("datagram transport: {0}")]
    Datagram(String),
    /// The async runtime could not be started.
    #[error("starting the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// A signal handler could not be installed.
    #[error("installing the {signal} handler: {source}")]
    Signal {
        /// The signal.
        signal: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

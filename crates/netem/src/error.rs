//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong in `onionlab-netem`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The topology file could not be read.
    #[error("cannot read topology {path}: {source}")]
    ReadTopology {
        /// File that was read.
        path: PathBuf,
        /// Underlying I/O error.
        source: std::io::Error,
    },
    /// The topology is syntactically or semantically invalid.
    #[error("{origin}:{line}:{column}: {message}")]
    Topology {
        /// File name (or `<string>`).
        origin: String,
        /// 1-based line number.
        line: usize,
        /// 1-based column number.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A value (rate, duration, size, probability) could not be parsed.
    #[error("invalid {what} {value:?}: {reason}")]
    Value {
        /// Kind of value.
        what: &'static str,
        /// The text given.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
    /// A host name does not exist in the topology.
    #[error("unknown host {0:?}")]
    UnknownHost(String),
    /// A system call failed.
    #[error("{op}: {source}")]
    Sys {
        /// What was being done.
        op: String,
        /// Underlying OS error.
        source: std::io::Error,
    },
    /// A route-netlink request (link, address, route) failed.
    #[error("{op}: {source}")]
    Netlink {
        /// What was being done.
        op: String,
        /// The error rtnetlink reported.
        source: rtnetlink::Error,
    },
    /// The environment lacks something needed (privileges, /dev/net/tun ...).
    #[error("unsupported environment: {0}")]
    Unsupported(String),
    /// A lab with this name is already running.
    #[error("lab {lab:?} is already running (pid {pid})")]
    AlreadyRunning {
        /// Lab name.
        lab: String,
        /// Process that runs it.
        pid: i32,
    },
    /// No running lab with this name was found.
    #[error("lab {0:?} is not running")]
    NotRunning(String),
    /// The state file or the control protocol carried something unexpected.
    #[error("control/state error: {0}")]
    Control(String),
    /// The forwarder thread has stopped.
    #[error("the forwarder thread has stopped")]
    ForwarderGone,
}

impl Error {
    /// Wraps the last OS error with a description of the operation.
    pub(crate) fn last_os(op: impl Into<String>) -> Self {
        Error::Sys {
            op: op.into(),
            source: std::io::Error::last_os_error(),
        }
    }

    /// Wraps an I/O error with a description of the operation.
    pub(crate) fn io(op: impl Into<String>, source: std::io::Error) -> Self {
        Error::Sys {
            op: op.into(),
            source,
        }
    }
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

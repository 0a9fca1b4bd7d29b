//! The error type of this crate and the reasons circuits close.

use onionlab_cell::chan::DestroyReason;

/// Why an operation requested by the local user of a circuit failed.
///
/// Protocol violations by the peer do not surface here: they close the
/// circuit, and are reported as a [`CloseReason`] through the circuit's events.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The circuit is closed (or closing).
    #[error("circuit is closed")]
    Closed,
    /// The operation needs an open circuit, and this one is still being built.
    #[error("circuit is not built yet")]
    NotBuilt,
    /// The operation does not fit the circuit's current state.
    #[error("not possible now: {0}")]
    BadState(&'static str),
    /// No open stream has this ID.
    #[error("no stream {0} on this circuit")]
    NoStream(u16),
    /// All stream IDs are in use.
    #[error("no free stream ID on this circuit")]
    StreamsExhausted,
    /// A stream target (host:port) cannot be encoded.
    #[error("invalid stream target: {0}")]
    BadTarget(String),
    /// Relay crypto or the handshake failed.
    #[error("crypto: {0}")]
    Crypto(#[from] onionlab_crypto::Error),
    /// A cell could not be encoded.
    #[error("encoding: {0}")]
    Cell(#[from] onionlab_cell::Error),
}

/// Why a circuit parameter (proposal 324's `cc_*` values, Torchestra's
/// classifier) cannot be set or is out of its range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ParamError {
    /// A count or percentage outside its allowed range.
    #[error("{name} = {value} is outside [{min}, {max}]")]
    OutOfRange {
        /// The parameter's name.
        name: &'static str,
        /// The value given.
        value: u32,
        /// The least allowed value.
        min: u32,
        /// The largest allowed value.
        max: u32,
    },
    /// A fraction outside (0, 1].
    #[error("{name} = {value}: must be in (0, 1]")]
    NotFraction {
        /// The parameter's name.
        name: &'static str,
        /// The value given.
        value: f64,
    },
    /// A duration that must be positive is zero.
    #[error("{name} must be positive")]
    Zero {
        /// The parameter's name.
        name: &'static str,
    },
    /// Two parameters in the wrong order (`low` above `high`).
    #[error("{low} must be at most {high}")]
    Order {
        /// The one that must be smaller or equal.
        low: &'static str,
        /// The one that must be larger or equal.
        high: &'static str,
    },
    /// A switch set to anything but 0 or 1.
    #[error("{name} = {value} is not 0 or 1")]
    NotSwitch {
        /// The parameter's name.
        name: String,
        /// The value given.
        value: u32,
    },
    /// No parameter has this name.
    #[error("unknown congestion-control parameter {name:?}; known: {known}")]
    Unknown {
        /// The name given.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// A congestion-control parameter under fixed windows.
    #[error("{name} is a congestion-control parameter, and circuit_cc is \"fixed\"")]
    FixedWindows {
        /// The parameter's name.
        name: String,
    },
}

impl ParamError {
    /// Check `(name, value, min, max)` rows: the first value outside its
    /// range is the error.
    pub(crate) fn check_ranges(rows: &[(&'static str, u32, u32, u32)]) -> Result<(), ParamError> {
        for &(name, value, min, max) in rows {
            if !(min..=max).contains(&value) {
                return Err(ParamError::OutOfRange {
                    name,
                    value,
                    min,
                    max,
                });
            }
        }
        Ok(())
    }
}

/// Why a circuit was closed: the DESTROY reason sent or received, and a
/// human-readable detail for logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseReason {
    /// The reason carried by DESTROY (or TRUNCATED).
    pub reason: DestroyReason,
    /// Who closed it and why, for logs.
    pub detail: String,
    /// Whether the peer closed it (a received DESTROY) rather than us.
    /// Same as `kind == CloseKind::Remote`.
    pub by_peer: bool,
    /// The broad cause, for metrics.
    pub kind: CloseKind,
}

/// The broad cause of a circuit's closing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CloseKind {
    /// A peer broke the protocol.
    Violation,
    /// We closed it for a local reason (timeout, failed extend, shutdown...).
    Local,
    /// The peer sent DESTROY.
    Remote,
    /// A hop of a client's circuit sent TRUNCATED: the client closed the
    /// circuit (DESTROY toward the guard).
    Truncated,
    /// The relay's out-of-memory handler killed it to bring the memory held
    /// by cell queues and stream buffers back under the configured limit
    /// (see `NodeConfig::max_mem_in_queues`). Sent as DESTROY with reason
    /// RESOURCELIMIT.
    OutOfMemory,
}

impl CloseReason {
    /// A protocol violation by a peer: we close with reason PROTOCOL.
    pub fn violation(detail: impl Into<String>) -> Self {
        CloseReason {
            reason: DestroyReason::PROTOCOL,
            detail: detail.into(),
            by_peer: false,
            kind: CloseKind::Violation,
        }
    }
    /// We close the circuit for a local reason.
    pub fn local(reason: DestroyReason, detail: impl Into<String>) -> Self {
        CloseReason {
            reason,
            detail: detail.into(),
            by_peer: false,
            kind: CloseKind::Local,
        }
    }
    /// The peer sent DESTROY.
    pub fn remote(reason: DestroyReason) -> Self {
        CloseReason {
            reason,
            detail: format!("peer sent DESTROY ({})", reason.human_str()),
            by_peer: true,
            kind: CloseKind::Remote,
        }
    }
    /// The out-of-memory handler kills the circuit: DESTROY with reason
    /// RESOURCELIMIT.
    pub fn out_of_memory(detail: impl Into<String>) -> Self {
        CloseReason {
            reason: DestroyReason::RESOURCELIMIT,
            detail: detail.into(),
            by_peer: false,
            kind: CloseKind::OutOfMemory,
        }
    }
    /// Was the circuit killed by the out-of-memory handler?
    pub fn is_out_of_memory(&self) -> bool {
        self.kind == CloseKind::OutOfMemory
    }
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} [{}]", self.detail, self.reason.human_str())
    }
}

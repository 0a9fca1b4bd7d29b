//! The error type of this crate.

/// Why a cell or message could not be encoded or decoded.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A channel cell on the wire was malformed.
    #[error("malformed channel cell: {0}")]
    BadChanCell(#[source] tor_cell::Error),
    /// A variable-length cell announced a body longer than we accept.
    #[error("variable-length cell of {len} bytes exceeds the limit of {limit}")]
    OversizedCell {
        /// Announced body length.
        len: usize,
        /// Our limit.
        limit: usize,
    },
    /// The opening VERSIONS cell was malformed.
    #[error("malformed VERSIONS cell: {0}")]
    BadVersions(&'static str),
    /// A relay cell body did not hold a valid relay message.
    #[error("malformed relay message: {0}")]
    BadRelayMsg(#[source] tor_bytes::Error),
    /// A relay message had a stream ID where tor-spec forbids one, or none
    /// (stream ID 0) where it requires one.
    #[error("relay command {cmd} does not allow stream ID {stream}")]
    BadStreamId {
        /// The relay command.
        cmd: tor_cell::relaycell::RelayCmd,
        /// The stream ID given (0 for none).
        stream: u16,
    },
    /// A message could not be encoded (too long for a cell, for instance).
    #[error("cannot encode {what}: {source}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: tor_cell::Error,
    },
}

//! The error type of this crate.

/// Everything that can go wrong in `onionlab-crypto`.
///
/// Each variant says which input was wrong and how, so that a caller can log
/// it (or map it to a circuit `DESTROY` reason) without guessing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An input had the wrong length.
    #[error("{what}: wrong length {got} bytes, expected {expected}")]
    BadLength {
        /// Which input (e.g. "ntor server reply").
        what: &'static str,
        /// The length we need.
        expected: usize,
        /// The length we were given.
        got: usize,
    },

    /// More output was asked of KDF-RFC5869 than HKDF-SHA256 can give.
    #[error("KDF-RFC5869: {requested} bytes of output requested, at most {max} possible")]
    KdfOutputTooLong {
        /// Bytes requested.
        requested: usize,
        /// The HKDF-SHA256 limit, 255 * 32.
        max: usize,
    },

    /// The node ID in an ntor CREATE2 handshake is not ours.
    #[error("ntor: client handshake is addressed to node ID {got}, we are {ours}")]
    NtorWrongNodeId {
        /// Upper-case hex of the ID in the message.
        got: String,
        /// Upper-case hex of our ID.
        ours: String,
    },

    /// The onion key (B) in an ntor CREATE2 handshake is not our current key.
    #[error("ntor: client handshake names an onion key that is not ours")]
    NtorWrongOnionKey,

    /// A Diffie-Hellman output was all zeros: the peer sent a small-order
    /// point (or the identity), which would let it force the shared secret.
    #[error("ntor ({side} side): peer sent a degenerate curve25519 point (all-zero DH output)")]
    NtorDegenerateKey {
        /// "client" or "server": which side detected it.
        side: &'static str,
    },

    /// The AUTH value in an ntor CREATED2 reply did not verify.
    #[error("ntor: server AUTH does not verify (wrong relay, wrong onion key, or tampered reply)")]
    NtorBadAuth,

    /// A hop index outside the circuit.
    #[error("relay crypto: hop {hop} requested, but the circuit has {n_layers} layer(s)")]
    NoSuchHop {
        /// The requested hop.
        hop: usize,
        /// How many layers the circuit has.
        n_layers: usize,
    },

    /// A datagram cell's counter that the receiving end already accepted,
    /// or that is too far below the highest it accepted: a duplicate or a
    /// replay, to be dropped.
    #[error("datagram cell crypto: counter {counter} replayed or too old")]
    DgramReplay {
        /// The cell's counter.
        counter: u64,
    },

    /// A datagram cell that reached the end of its path and that no
    /// hop's seal opens: a relay on the path changed it or made it up.
    #[error("datagram cell crypto: no hop's seal opens the cell")]
    DgramUnrecognised,

    /// A datagram circuit used every counter of a direction.
    #[error("datagram cell crypto: counters exhausted")]
    DgramCountersExhausted,

    /// AES-GCM refused to seal (it only does for inputs longer than GCM
    /// allows, which a cell never is).
    #[error("datagram cell crypto: sealing failed")]
    DgramSeal,
}

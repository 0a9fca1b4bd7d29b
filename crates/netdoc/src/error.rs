//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong in `onionlab-netdoc`.
///
/// Every variant names where the problem is: a file path, a URL, or the
/// `origin` of a text (a path, a URL, or a description such as
/// `"network document"`), and a line where there is one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
    /// A file, document or HTTP response is larger than allowed.
    #[error("{what} is too large: {size} bytes, at most {max} allowed")]
    TooLarge {
        /// What was too large (a path, a URL, or a description).
        what: String,
        /// Its size in bytes (or the size read so far when the limit was hit).
        size: u64,
        /// The limit in bytes.
        max: u64,
    },
    /// A TOML text (network document body or configuration file) is
    /// syntactically wrong, has a value of the wrong type or form, or breaks
    /// a rule at a known position.
    #[error("{origin}:{line}:{column}: {message}")]
    Parse {
        /// Where the text came from (path, URL or description).
        origin: String,
        /// 1-based line number.
        line: usize,
        /// 1-based column number.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A network document or configuration breaks a rule that has no
    /// single position (for example, it lists no relays, or two settings
    /// contradict each other), or a document built in code is invalid.
    #[error("{origin}: {message}")]
    Invalid {
        /// Where the document or file came from.
        origin: String,
        /// What is wrong.
        message: String,
    },
    /// A signed network document does not end with a signature line.
    #[error("{origin}: no signature: the last line must be `signature ed25519 <128 hex digits>` followed by a newline")]
    MissingSignature {
        /// Where the document came from.
        origin: String,
    },
    /// The signature line of a network document is malformed.
    #[error("{origin}:{line}: bad signature line: {reason}")]
    BadSignatureLine {
        /// Where the document came from.
        origin: String,
        /// 1-based line number of the signature line.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A signature line appears before the last line of a network document.
    #[error("{origin}:{line}: a signature line may appear only once, as the last line")]
    ExtraSignature {
        /// Where the document came from.
        origin: String,
        /// 1-based line number of the misplaced signature line.
        line: usize,
    },
    /// The signature of a network document does not verify with the network
    /// key: the document was altered, or signed with another key.
    #[error("{origin}: the signature does not verify with the network key (document altered, or signed by another key)")]
    BadSignature {
        /// Where the document came from.
        origin: String,
    },
    /// An exit-policy rule is malformed.
    #[error("exit policy rule {rule:?}: {reason}")]
    Policy {
        /// The rule's text.
        rule: String,
        /// What is wrong with it.
        reason: RuleError,
    },
    /// A key (in a key file, or given as hex) is malformed.
    #[error("{origin}: {reason}")]
    Key {
        /// The key file, or a description of where the key came from.
        origin: String,
        /// What is wrong.
        reason: String,
    },
    /// The document's validity period has not started (beyond the clock
    /// skew allowance): a clock is wrong, or the document is from the
    /// future.
    #[error("{origin}: not valid yet: valid from {valid_after} (Unix time), now is {now}; check this host's clock")]
    NotYetValid {
        /// File or URL.
        origin: String,
        /// The document's `valid_after_unix`.
        valid_after: u64,
        /// This host's time.
        now: u64,
    },
    /// The document's validity period is over (beyond the clock skew
    /// allowance): an old document replayed, or one that needs signing
    /// again.
    #[error("{origin}: expired: valid until {valid_until} (Unix time), now is {now}; sign it again (onionlab network resign --dir NETWORK_DIR) or check this host's clock")]
    Expired {
        /// File or URL.
        origin: String,
        /// The document's `valid_until_unix`.
        valid_until: u64,
        /// This host's time.
        now: u64,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// 1-based line and column of byte `offset` in `text` (columns count
/// characters), as errors give them.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    // Back off to a character boundary.
    let mut offset = offset;
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

/// Turn a TOML deserialization error into [`Error::Parse`].
pub(crate) fn toml_error(origin: &str, text: &str, e: &toml::de::Error) -> Error {
    let (line, column) = e.span().map_or((1, 1), |s| line_col(text, s.start));
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

/// What is wrong with an exit-policy rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// No space between the action and the pattern.
    #[error("expected `accept` or `reject`, a space, and ADDR:PORT")]
    NoPattern,
    /// The first word is not an action.
    #[error("the rule must start with `accept` or `reject`")]
    NoAction,
    /// The pattern has a space inside.
    #[error("unexpected space in ADDR:PORT")]
    SpaceInPattern,
    /// The pattern has no `:`.
    #[error("expected ADDR:PORT (a missing `:PORT`?)")]
    NoPort,
    /// A wildcard (`*`, `*4`, `*6`) with a mask.
    #[error("the wildcard {0} takes no /MASKBITS")]
    MaskOnWildcard(String),
    /// A mask that is not a number.
    #[error("mask {mask:?} is not a number of bits (0-{max})")]
    MaskNotBits {
        /// The mask's text.
        mask: String,
        /// The address family's bits.
        max: u8,
    },
    /// A mask above the address family's bits.
    #[error("mask /{mask} is out of range (0-{max})")]
    MaskOutOfRange {
        /// The mask's text.
        mask: String,
        /// The address family's bits.
        max: u8,
    },
    /// `[` without its `]`.
    #[error("{0:?}: missing `]` after an IPv6 address")]
    UnclosedBracket(String),
    /// Brackets around something else than an IPv6 address.
    #[error("{0:?} is not an IPv6 address")]
    NotIpv6(String),
    /// An IPv6 address without its brackets.
    #[error("{0:?}: an IPv6 address must be in brackets, as [{0}]")]
    UnbracketedIpv6(String),
    /// Nothing before the `:`.
    #[error("missing address (use * for any)")]
    NoAddress,
    /// Neither a wildcard nor an address.
    #[error("{0:?} is not *, *4, *6, an IPv4 address or a bracketed IPv6 address")]
    BadAddress(String),
    /// A port that is not a number.
    #[error("port {0:?} is not *, a number or a range LO-HI")]
    NotPort(String),
    /// A port of 0 or above 65535.
    #[error("port {0} is out of range (1-65535)")]
    PortOutOfRange(String),
    /// A range whose low end is above its high end.
    #[error("empty port range {0}-{1}")]
    EmptyPortRange(u16, u16),
}

#[cfg(test)]
mod test {
    use super::line_col;

    #[test]
    fn line_col_counts_from_one() {
        let t = "ab\ncdé\nf";
        assert_eq!(line_col(t, 0), (1, 1));
        assert_eq!(line_col(t, 2), (1, 3));
        assert_eq!(line_col(t, 3), (2, 1));
        assert_eq!(line_col(t, 8), (3, 1));
        // Inside the two-byte 'é': backs off to its start.
        assert_eq!(line_col(t, 6), (2, 3));
        assert_eq!(line_col(t, 1000), (3, 2));
    }
}

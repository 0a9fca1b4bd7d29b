//! The one list of transports onionlab knows.
//!
//! Each transport is described once, by a [`TransportInfo`] in its own
//! module: its name (as used in configuration files, network documents,
//! scenario matrices and on the command line), how it orders cells, which
//! kind of a node's endpoints it uses ([`EndpointKind`]: and so which
//! address a relay must advertise in the network document for it), its
//! settings, and how a link of it is opened. Everything that names a transport (config
//! parsing, relay and client start-up, path selection, the lab's matrix
//! validation, `--help` texts) reads [`TransportKind::all`] and
//! [`TransportKind::from_name`].
//!
//! Adding a transport is a module that defines its `INFO` and one line in
//! `REGISTRY` (this file).

use std::fmt;
use std::str::FromStr;

use crate::any::EndpointKind;
pub use crate::any::{OpenFuture, SettingInfo, TransportInfo, TransportKind};

/// Every transport, in the order documentation and `--help` list them.
/// The first is the baseline the others are compared with.
static REGISTRY: &[&TransportInfo] = &[
    &crate::tls::INFO,
    &crate::quic::STREAM_PER_CIRCUIT,
    &crate::quic::CONN_PER_CIRCUIT,
    &crate::pctcp::INFO,
    &crate::torchestra::INFO,
    &crate::utcp::INFO,
    &crate::datagram::INFO,
    &crate::datagram::MORE_INFO,
    #[cfg(feature = "test-transport")]
    &crate::plain::INFO,
];

/// The name of [`Choice::Auto`] in configuration files.
pub const AUTO: &str = "auto";

impl TransportKind {
    /// TLS over TCP, one connection per relay pair (vanilla Tor).
    pub const TLS: TransportKind = TransportKind::of(&crate::tls::INFO);
    /// QUIC, one connection per relay pair, one stream per circuit.
    pub const QUIC: TransportKind = TransportKind::of(&crate::quic::STREAM_PER_CIRCUIT);
    /// QUIC, one connection per circuit.
    pub const QUIC_CONN_PER_CIRCUIT: TransportKind =
        TransportKind::of(&crate::quic::CONN_PER_CIRCUIT);
    /// One TLS over TCP connection per circuit.
    pub const PCTCP: TransportKind = TransportKind::of(&crate::pctcp::INFO);
    /// Two TLS connections per relay pair, light and heavy.
    pub const TORCHESTRA: TransportKind = TransportKind::of(&crate::torchestra::INFO);
    /// A user-space TCP connection per circuit inside one DTLS session.
    pub const DTLS_UTCP: TransportKind = TransportKind::of(&crate::utcp::INFO);
    /// Datagram circuits (mUDP-OR): relays forward each cell at once, the
    /// client's TCP runs end to end.
    pub const DATAGRAM: TransportKind = TransportKind::of(&crate::datagram::INFO);
    /// MORE: a Sphinx packet per segment on its own route, no circuits.
    pub const MORE: TransportKind = TransportKind::of(&crate::datagram::MORE_INFO);

    /// Every registered transport.
    pub fn all() -> impl Iterator<Item = TransportKind> {
        REGISTRY.iter().map(|info| TransportKind::of(info))
    }

    /// Every registered transport's name.
    pub fn names() -> Vec<&'static str> {
        Self::all().map(TransportKind::name).collect()
    }

    /// The transport called `name`.
    ///
    /// # Errors
    ///
    /// [`UnknownTransport`], which lists the valid names.
    pub fn from_name(name: &str) -> Result<Self, UnknownTransport> {
        Self::all()
            .find(|k| k.name() == name)
            .ok_or_else(|| UnknownTransport::new(name, Self::names()))
    }
}

impl FromStr for TransportKind {
    type Err = UnknownTransport;

    fn from_str(s: &str) -> Result<Self, UnknownTransport> {
        Self::from_name(s)
    }
}

impl EndpointKind {
    /// The TCP listener: TLS and the transports built on TLS (pctcp,
    /// torchestra); the document's `tls` address.
    pub const TCP: EndpointKind = EndpointKind::new(&crate::tls::ENDPOINT);
    /// The QUIC endpoint (one UDP socket, both QUIC modes); the
    /// document's `quic` address.
    pub const QUIC: EndpointKind = EndpointKind::new(&crate::quic::ENDPOINT);
    /// The dtls-utcp endpoint (UDP, a port of its own); the document's
    /// `utcp` address.
    pub const UTCP: EndpointKind = EndpointKind::new(&crate::utcp::ENDPOINT);
    /// The datagram endpoint (UDP, a port of its own); the document's
    /// `dgram` address.
    pub const DGRAM: EndpointKind = crate::datagram::DGRAM;

    /// Every kind the registered transports use, in registry order.
    pub fn all() -> Vec<EndpointKind> {
        let mut kinds: Vec<EndpointKind> = Vec::new();
        for t in TransportKind::all() {
            if !kinds.contains(&t.endpoint()) {
                kinds.push(t.endpoint());
            }
        }
        kinds
    }
}

/// A transport name that names no transport.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown transport `{name}`: expected one of {}", quoted(.valid))]
pub struct UnknownTransport {
    /// The name given.
    pub name: String,
    /// The names that would have been accepted.
    pub valid: Vec<&'static str>,
}

impl UnknownTransport {
    fn new(name: &str, valid: Vec<&'static str>) -> Self {
        UnknownTransport {
            name: name.to_string(),
            valid,
        }
    }
}

fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which transport a node uses for the links it opens (the `transport`
/// setting of relays and clients).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Choice {
    /// `"auto"`: QUIC (stream per circuit) when the peer advertises a
    /// `quic` address and it connects within
    /// [`QUIC_FALLBACK_AFTER`](crate::connector::QUIC_FALLBACK_AFTER); TLS
    /// otherwise (seed 000's deployability rule).
    #[default]
    Auto,
    /// This transport only, no fallback (experiments).
    Only(TransportKind),
}

impl Choice {
    /// Every choice: `auto`, then each transport.
    pub fn all() -> impl Iterator<Item = Choice> {
        std::iter::once(Choice::Auto).chain(TransportKind::all().map(Choice::Only))
    }

    /// Every choice's name.
    pub fn names() -> Vec<&'static str> {
        Self::all().map(Choice::name).collect()
    }

    /// The choice called `name` (`"auto"` or a transport's name).
    ///
    /// # Errors
    ///
    /// [`UnknownTransport`], which lists the valid names.
    pub fn from_name(name: &str) -> Result<Self, UnknownTransport> {
        if name == AUTO {
            return Ok(Choice::Auto);
        }
        TransportKind::from_name(name)
            .map(Choice::Only)
            .map_err(|e| UnknownTransport::new(&e.name, Self::names()))
    }

    /// The name (`"auto"`, `"tls"`...).
    pub fn name(self) -> &'static str {
        match self {
            Choice::Auto => AUTO,
            Choice::Only(kind) => kind.name(),
        }
    }

    /// The endpoints links opened under this choice may use.
    pub fn endpoints(self) -> Vec<EndpointKind> {
        match self {
            Choice::Auto => vec![EndpointKind::QUIC, EndpointKind::TCP],
            Choice::Only(kind) => vec![kind.endpoint()],
        }
    }

    /// Whether links opened under this choice may use endpoint `kind`
    /// (so a node needs one).
    pub fn uses(self, kind: EndpointKind) -> bool {
        self.endpoints().contains(&kind)
    }
}

/// Compare with a name (`choice == "tls"`).
impl PartialEq<&str> for Choice {
    fn eq(&self, other: &&str) -> bool {
        self.name() == *other
    }
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Choice {
    type Err = UnknownTransport;

    fn from_str(s: &str) -> Result<Self, UnknownTransport> {
        Self::from_name(s)
    }
}

/// `--help` text listing every choice, its description and its settings.
pub fn help_text() -> String {
    let width = Choice::names().iter().map(|n| n.len()).max().unwrap_or(0);
    let mut text = String::from("Transports (`transport` in the `[link]` section of relays' and clients' configurations):\n");
    text.push_str(&format!(
        "  {AUTO:width$}  QUIC (stream per circuit) where the peer advertises it and it connects, else TLS\n"
    ));
    for kind in TransportKind::all() {
        let info = kind.info();
        text.push_str(&format!("  {:width$}  {}\n", info.name, info.about));
        for s in info.settings {
            text.push_str(&format!(
                "  {:width$}    {} (default {}): {}\n",
                "", s.key, s.default, s.about
            ));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_round_trip() {
        let names = Choice::names();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "{names:?}");
        for choice in Choice::all() {
            assert_eq!(Choice::from_name(choice.name()), Ok(choice));
            assert_eq!(choice.to_string().parse::<Choice>(), Ok(choice));
        }
        assert_eq!(TransportKind::all().next(), Some(TransportKind::TLS));
    }

    #[test]
    fn an_unknown_name_lists_the_valid_ones() {
        let err = Choice::from_name("QUIC").unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("unknown transport `QUIC`"), "{text}");
        for name in Choice::names() {
            assert!(text.contains(&format!("`{name}`")), "{text}");
        }
        let err = TransportKind::from_name("auto").unwrap_err();
        assert!(!err.valid.contains(&AUTO), "{err}");
    }
}

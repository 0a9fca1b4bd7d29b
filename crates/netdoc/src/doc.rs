//! The network document: the list of relays a network has, signed by the
//! network key. It plays the part of tor's consensus, for one lab network
//! with one authority.
//!
//! # Format
//!
//! A signed document is a TOML body followed by one signature line:
//!
//! ```text
//! # onionlab network document v1
//! network_name = "lab"
//! created_unix = 1700000000
//! valid_after_unix = 1700000000
//! valid_until_unix = 1702592000
//!
//! [params]
//! circuit_cc = "vegas"
//!
//! [[relays]]
//! nickname = "relay0"
//! ed_identity = "<64 hex digits: Ed25519 identity>"
//! ntor_onion_key = "<64 hex digits: x25519 ntor onion key>"
//! sphinx_key = "<64 hex digits: x25519 Sphinx key (MORE); optional>"
//! addresses = [{ transport = "tls", addr = "127.0.0.1:9001" }, { transport = "quic", addr = "127.0.0.1:9001" }]
//! flags = { guard = true, exit = false }
//! bandwidth = 1000
//! exit_policy = ["reject *:*"]
//! signature ed25519 <128 lowercase hex digits>
//! ```
//!
//! The body is every byte before the signature line, which is the last line
//! and ends with a newline. The signature is Ed25519 over
//! [`SIGNATURE_PREFIX`] followed by the body bytes, exactly as they are in
//! the text (a reader verifies before it parses, and parses what it
//! verified). Any other text in the body that TOML accepts and that the
//! fields below allow (comments, spacing, order) is fine; unknown fields are
//! refused.
//!
//! Fields of a relay: `nickname` (1-19 ASCII letters and digits, unique
//! regardless of case), `ed_identity` and `ntor_onion_key` (hex, unique
//! identity), `sphinx_key` (hex, optional: the relay's key for MORE's
//! per-packet onions), `addresses` (at least one; `transport` names such as `tls`
//! (TCP) or `quic` (UDP), 1-32 of `[a-z0-9-]`; names a reader does not know are kept and
//! ignored by callers), `flags` (`guard`, `exit`; both default to false),
//! `bandwidth` (weight for path selection in KB/s, default 0) and
//! `exit_policy` (rule strings, see [`crate::policy`]; default
//! `reject *:*`).
//!
//! The optional `[params]` table holds network-wide parameters (see
//! [`crate::params`]): the circuit congestion control all circuits run.
//!
//! The document is valid from `valid_after_unix` to `valid_until_unix`
//! (seconds since the Unix epoch, signed with the rest): nodes that load it
//! refuse it outside that window, with a [`CLOCK_SKEW_ALLOWANCE`] either
//! side ([`NetworkDocument::check_time`]), so an old signed document cannot
//! be replayed (it travels over plain HTTP) once it has expired. A node
//! that loads the document again keeps the newest valid one: a document
//! replaces the held one only if its `valid_after_unix` is strictly later
//! (an earlier one is refused as a rollback); see `onionlab_config::refresh`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use onionlab_crypto::identity::RelayPublicKeys;
use serde::{Deserialize, Deserializer};
use toml::Spanned;
use tor_llcrypto::pk::ed25519::{Ed25519Identity, Keypair, PublicKey, Signature};

use crate::error::{line_col, toml_error, Error, Result};
use crate::params::NetworkParams;
use crate::policy::ExitPolicy;

/// Domain separator signed before the body, so that a network key's
/// signature on a document cannot be taken for a signature on anything else.
pub const SIGNATURE_PREFIX: &[u8] = b"onionlab-network-document-v1\n";

/// How far a node's clock may be off from the document signer's: a
/// document is accepted from this long before `valid_after_unix` until
/// this long after `valid_until_unix` (C tor allows a consensus a day of
/// skew past its valid-until; our networks are small and their clocks
/// close, so 5 minutes).
pub const CLOCK_SKEW_ALLOWANCE: std::time::Duration = std::time::Duration::from_secs(300);

/// Default lifetime of a document made by `network init` or the lab: 30
/// days (a lab network has one authority, which signs a new document only
/// when asked; re-run `onionlab network init` or re-sign after that).
pub const DEFAULT_LIFETIME: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// Largest signed document accepted, in bytes (16 MiB).
pub const MAX_DOCUMENT_LEN: usize = 16 * 1024 * 1024;

/// Start of the signature line.
const SIGNATURE_KEYWORD: &str = "signature";

/// Origin used in errors for a document given as text.
const TEXT_ORIGIN: &str = "network document";

/// Address name of a relay's OR port: the TCP endpoint of TLS and the
/// transports built on it, which every relay has and EXTEND2 names (the
/// transport crate's `EndpointKind::TCP`). Other addresses are named by
/// the endpoint kinds of the transports (`quic`, `utcp`); the document
/// carries them as data.
pub const TRANSPORT_TLS: &str = "tls";

/// A network document: the relays of one network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkDocument {
    /// Name of the network (1-64 of `[A-Za-z0-9._-]`).
    pub network_name: String,
    /// When the document was made, in seconds since the Unix epoch.
    pub created_unix: u64,
    /// Start of the validity period (seconds since the Unix epoch).
    pub valid_after_unix: u64,
    /// End of the validity period (seconds since the Unix epoch).
    pub valid_until_unix: u64,
    /// Network-wide parameters (`[params]`).
    pub params: NetworkParams,
    /// The relays.
    pub relays: Vec<RelayEntry>,
}

/// One relay in the [`NetworkDocument`].
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayEntry {
    /// Nickname (1-19 ASCII letters and digits), unique in the document
    /// regardless of case.
    pub nickname: String,
    /// Ed25519 identity key; every transport authenticates the relay with it.
    #[serde(deserialize_with = "de_hex32")]
    pub ed_identity: [u8; 32],
    /// x25519 ntor onion key (`B`).
    #[serde(deserialize_with = "de_hex32")]
    pub ntor_onion_key: [u8; 32],
    /// x25519 key for MORE's Sphinx packets (derived from the onion key,
    /// `RelaySecretKeys::sphinx_public`); absent if the relay does not
    /// run MORE.
    #[serde(default, deserialize_with = "de_opt_hex32")]
    pub sphinx_key: Option<[u8; 32]>,
    /// Where the relay listens, per transport.
    pub addresses: Vec<TransportAddress>,
    /// Flags.
    #[serde(default)]
    pub flags: Flags,
    /// Bandwidth weight for path selection, in KB/s.
    #[serde(default)]
    pub bandwidth: u64,
    /// Where the relay connects as an exit.
    #[serde(default = "ExitPolicy::reject_all")]
    pub exit_policy: ExitPolicy,
}

/// A relay's address for one transport.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportAddress {
    /// The endpoint's name: `"tls"` ([`TRANSPORT_TLS`], TCP), or another
    /// endpoint kind's (`"quic"`, `"utcp"`: UDP). Callers ignore names
    /// they do not know.
    pub transport: String,
    /// IP address and port.
    pub addr: SocketAddr,
}

/// Relay flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Flags {
    /// Suitable as the first hop of a circuit.
    #[serde(default)]
    pub guard: bool,
    /// Suitable as the last hop of a circuit that leaves the network (its
    /// exit policy still decides which targets).
    #[serde(default)]
    pub exit: bool,
}

impl RelayEntry {
    /// The relay's first address for `transport`, if it has one.
    pub fn address(&self, transport: &str) -> Option<SocketAddr> {
        self.addresses
            .iter()
            .find(|a| a.transport == transport)
            .map(|a| a.addr)
    }

    /// The relay's keys in the form the circuit layer uses.
    pub fn public_keys(&self) -> RelayPublicKeys {
        RelayPublicKeys {
            ed_identity: Ed25519Identity::new(self.ed_identity),
            onion_key: tor_llcrypto::pk::curve25519::PublicKey::from(self.ntor_onion_key),
        }
    }

    /// An entry for a relay with these public keys and no addresses, no
    /// flags, bandwidth 0 and policy `reject *:*`.
    pub fn new(nickname: impl Into<String>, keys: &RelayPublicKeys) -> Self {
        let mut ed_identity = [0u8; 32];
        ed_identity.copy_from_slice(keys.ed_identity.as_bytes());
        RelayEntry {
            nickname: nickname.into(),
            ed_identity,
            ntor_onion_key: keys.onion_key.to_bytes(),
            sphinx_key: None,
            addresses: Vec::new(),
            flags: Flags::default(),
            bandwidth: 0,
            exit_policy: ExitPolicy::reject_all(),
        }
    }
}

/// Deserialize an optional field of 32 bytes from 64 hex digits.
fn de_opt_hex32<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<[u8; 32]>, D::Error> {
    de_hex32(d).map(Some)
}

/// Deserialize 32 bytes from 64 hex digits.
fn de_hex32<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<[u8; 32], D::Error> {
    let s = String::deserialize(d)?;
    let mut out = [0u8; 32];
    hex::decode_to_slice(&s, &mut out)
        .map_err(|e| serde::de::Error::custom(format!("expected 64 hex digits (32 bytes): {e}")))?;
    Ok(out)
}

/// The body as deserialized, with positions for error messages.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDocument {
    /// See [`NetworkDocument::network_name`].
    network_name: Spanned<String>,
    /// See [`NetworkDocument::created_unix`].
    created_unix: u64,
    /// See [`NetworkDocument::valid_after_unix`].
    valid_after_unix: u64,
    /// See [`NetworkDocument::valid_until_unix`].
    valid_until_unix: u64,
    /// See [`NetworkDocument::params`].
    #[serde(default)]
    params: Option<Spanned<std::collections::BTreeMap<String, toml::Value>>>,
    /// See [`NetworkDocument::relays`].
    relays: Vec<Spanned<RelayEntry>>,
}

/// A rule broken by a document: which relay (index), if any, and what.
struct Violation {
    /// Index of the relay concerned, if the rule is about one relay.
    relay: Option<usize>,
    /// Whether the violation is about the network name.
    name: bool,
    /// What is wrong.
    message: String,
}

impl NetworkDocument {
    /// The validity window for a document made at `now_unix` that lives
    /// `lifetime`: `(created, valid_after, valid_until)`, all `now_unix`
    /// but the last.
    pub fn window(now_unix: u64, lifetime: std::time::Duration) -> (u64, u64, u64) {
        (
            now_unix,
            now_unix,
            now_unix.saturating_add(lifetime.as_secs()),
        )
    }

    /// Is the document valid at `now_unix`, allowing `skew` either side?
    ///
    /// # Errors
    ///
    /// [`Error::NotYetValid`] or [`Error::Expired`], naming `origin` and
    /// the times.
    pub fn check_time(&self, now_unix: u64, skew: std::time::Duration, origin: &str) -> Result<()> {
        let skew = skew.as_secs();
        if now_unix.saturating_add(skew) < self.valid_after_unix {
            return Err(Error::NotYetValid {
                origin: origin.into(),
                valid_after: self.valid_after_unix,
                now: now_unix,
            });
        }
        if now_unix > self.valid_until_unix.saturating_add(skew) {
            return Err(Error::Expired {
                origin: origin.into(),
                valid_until: self.valid_until_unix,
                now: now_unix,
            });
        }
        Ok(())
    }

    /// Check the rules of the [format](self): valid name, at least one
    /// relay, valid and unique nicknames and identities, at least one
    /// address per relay with a valid transport name and a usable address,
    /// and numbers that TOML can hold (at most `i64::MAX`).
    /// [`from_signed_text`](Self::from_signed_text) checks this, so a
    /// document built in code should be checked before it is signed.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] describing the first broken rule.
    pub fn validate(&self) -> Result<()> {
        self.check().map_err(|v| Error::Invalid {
            origin: TEXT_ORIGIN.into(),
            message: match v.relay {
                Some(i) => format!("relay {i} ({:?}): {}", self.relays[i].nickname, v.message),
                None => v.message,
            },
        })
    }

    /// The rule checks behind [`validate`](Self::validate).
    fn check(&self) -> std::result::Result<(), Violation> {
        let fail = |relay, message: String| Violation {
            relay,
            name: false,
            message,
        };
        if !valid_network_name(&self.network_name) {
            return Err(Violation {
                relay: None,
                name: true,
                message: "network_name must be 1-64 characters of [A-Za-z0-9._-]".into(),
            });
        }
        for (what, t) in [
            ("created_unix", self.created_unix),
            ("valid_after_unix", self.valid_after_unix),
            ("valid_until_unix", self.valid_until_unix),
        ] {
            if i64::try_from(t).is_err() {
                return Err(fail(None, format!("{what} is above i64::MAX")));
            }
        }
        if self.valid_after_unix > self.valid_until_unix {
            return Err(fail(
                None,
                "valid_after_unix is after valid_until_unix".into(),
            ));
        }
        if self.relays.is_empty() {
            return Err(fail(None, "the document lists no relays".into()));
        }
        let mut nicknames: HashMap<String, usize> = HashMap::new();
        let mut identities: HashMap<[u8; 32], usize> = HashMap::new();
        for (i, relay) in self.relays.iter().enumerate() {
            if !valid_nickname(&relay.nickname) {
                return Err(fail(
                    Some(i),
                    "a nickname must be 1-19 ASCII letters and digits".into(),
                ));
            }
            if let Some(first) = nicknames.insert(relay.nickname.to_ascii_lowercase(), i) {
                return Err(fail(
                    Some(i),
                    format!("duplicate nickname (relay {first} has it too)"),
                ));
            }
            if let Some(first) = identities.insert(relay.ed_identity, i) {
                return Err(fail(
                    Some(i),
                    format!(
                        "duplicate ed_identity (relay {first}, {:?}, has it too)",
                        self.relays[first].nickname
                    ),
                ));
            }
            if relay.addresses.is_empty() {
                return Err(fail(Some(i), "a relay needs at least one address".into()));
            }
            for a in &relay.addresses {
                if !valid_transport_name(&a.transport) {
                    return Err(fail(
                        Some(i),
                        format!("transport name {:?} must be 1-32 of [a-z0-9-]", a.transport),
                    ));
                }
                if a.addr.port() == 0 || a.addr.ip().is_unspecified() || a.addr.ip().is_multicast()
                {
                    return Err(fail(
                        Some(i),
                        format!("address {} cannot be connected to", a.addr),
                    ));
                }
            }
            if i64::try_from(relay.bandwidth).is_err() {
                return Err(fail(Some(i), "bandwidth is above i64::MAX".into()));
            }
        }
        Ok(())
    }

    /// The relay with this nickname (compared regardless of case).
    pub fn relay_by_nickname(&self, nickname: &str) -> Option<&RelayEntry> {
        self.relays
            .iter()
            .find(|r| r.nickname.eq_ignore_ascii_case(nickname))
    }

    /// The relay with this Ed25519 identity.
    pub fn relay_by_identity(&self, ed_identity: &[u8; 32]) -> Option<&RelayEntry> {
        self.relays.iter().find(|r| &r.ed_identity == ed_identity)
    }

    /// The document as signed text (see the [format](self)), signed with
    /// `network_key`.
    ///
    /// This does not [`validate`](Self::validate) the document: an invalid
    /// one is signed as it is and then refused by
    /// [`from_signed_text`](Self::from_signed_text).
    pub fn to_signed_text(&self, network_key: &Keypair) -> String {
        sign_body(&self.to_body(), network_key)
    }

    /// The TOML body (without the signature line).
    fn to_body(&self) -> String {
        let mut out = String::new();
        // `write!` to a String cannot fail.
        let _ = writeln!(out, "# onionlab network document v1");
        let _ = writeln!(out, "network_name = {}", toml_string(&self.network_name));
        let _ = writeln!(out, "created_unix = {}", self.created_unix);
        let _ = writeln!(out, "valid_after_unix = {}", self.valid_after_unix);
        let _ = writeln!(out, "valid_until_unix = {}", self.valid_until_unix);
        if self.relays.is_empty() {
            let _ = writeln!(out, "relays = []");
        }
        out.push_str(&self.params.to_toml());
        for r in &self.relays {
            let _ = writeln!(out, "\n[[relays]]");
            let _ = writeln!(out, "nickname = {}", toml_string(&r.nickname));
            let _ = writeln!(out, "ed_identity = \"{}\"", hex::encode(r.ed_identity));
            let _ = writeln!(
                out,
                "ntor_onion_key = \"{}\"",
                hex::encode(r.ntor_onion_key)
            );
            if let Some(key) = r.sphinx_key {
                let _ = writeln!(out, "sphinx_key = \"{}\"", hex::encode(key));
            }
            let addresses: Vec<String> = r
                .addresses
                .iter()
                .map(|a| {
                    format!(
                        "{{ transport = {}, addr = \"{}\" }}",
                        toml_string(&a.transport),
                        a.addr
                    )
                })
                .collect();
            let _ = writeln!(out, "addresses = [{}]", addresses.join(", "));
            let _ = writeln!(
                out,
                "flags = {{ guard = {}, exit = {} }}",
                r.flags.guard, r.flags.exit
            );
            let _ = writeln!(out, "bandwidth = {}", r.bandwidth);
            let rules: Vec<String> = r
                .exit_policy
                .rules()
                .iter()
                .map(|rule| toml_string(&rule.to_string()))
                .collect();
            let _ = writeln!(out, "exit_policy = [{}]", rules.join(", "));
        }
        out
    }

    /// Verify and parse a signed document.
    ///
    /// The text must be at most [`MAX_DOCUMENT_LEN`] bytes, end with exactly
    /// one signature line made with the secret half of `network_key`, and
    /// its body must be a valid document (see [`validate`](Self::validate)).
    ///
    /// # Errors
    ///
    /// [`Error::TooLarge`], [`Error::MissingSignature`],
    /// [`Error::BadSignatureLine`], [`Error::ExtraSignature`],
    /// [`Error::BadSignature`], [`Error::Parse`] (TOML errors and broken
    /// rules, with the line) or [`Error::Invalid`] (no relays).
    pub fn from_signed_text(text: &str, network_key: &PublicKey) -> Result<Self> {
        Self::from_signed_text_at(text, network_key, TEXT_ORIGIN)
    }

    /// [`from_signed_text`](Self::from_signed_text), naming `origin` (a path
    /// or URL) in errors.
    ///
    /// # Errors
    ///
    /// As [`from_signed_text`](Self::from_signed_text).
    pub fn from_signed_text_at(text: &str, network_key: &PublicKey, origin: &str) -> Result<Self> {
        let body = verify_signed_text_at(text, network_key, origin)?;
        Self::parse_body(body, origin)
    }

    /// Read a signed document file (see [`read_signed_file`]), then verify
    /// and parse it as [`from_signed_text`](Self::from_signed_text) does,
    /// naming the file in errors.
    ///
    /// # Errors
    ///
    /// Those of [`read_signed_file`] and
    /// [`from_signed_text`](Self::from_signed_text).
    pub fn load_file(path: &Path, network_key: &PublicKey) -> Result<Self> {
        let text = read_signed_file(path)?;
        Self::from_signed_text_at(&text, network_key, &path.display().to_string())
    }

    /// Parse and check a verified body.
    fn parse_body(body: &str, origin: &str) -> Result<Self> {
        let raw: RawDocument = toml::from_str(body).map_err(|e| toml_error(origin, body, &e))?;
        let name_span = raw.network_name.span();
        let spans: Vec<_> = raw.relays.iter().map(|r| r.span()).collect();
        let params = match &raw.params {
            None => NetworkParams::default(),
            Some(table) => NetworkParams::from_table(table.get_ref()).map_err(|message| {
                let (line, column) = line_col(body, table.span().start);
                Error::Parse {
                    origin: origin.into(),
                    line,
                    column,
                    message: format!("[params]: {message}"),
                }
            })?,
        };
        let doc = NetworkDocument {
            params,
            network_name: raw.network_name.into_inner(),
            created_unix: raw.created_unix,
            valid_after_unix: raw.valid_after_unix,
            valid_until_unix: raw.valid_until_unix,
            relays: raw.relays.into_iter().map(Spanned::into_inner).collect(),
        };
        doc.check().map_err(|v| {
            let span = match (v.relay, v.name) {
                (Some(i), _) => spans.get(i).cloned(),
                (None, true) => Some(name_span),
                (None, false) => None,
            };
            match span {
                Some(span) => {
                    let (line, column) = line_col(body, span.start);
                    let message = match v.relay {
                        Some(i) => format!("relay {:?}: {}", doc.relays[i].nickname, v.message),
                        None => v.message,
                    };
                    Error::Parse {
                        origin: origin.into(),
                        line,
                        column,
                        message,
                    }
                }
                None => Error::Invalid {
                    origin: origin.into(),
                    message: v.message,
                },
            }
        })?;
        Ok(doc)
    }
}

/// Read a signed document file as text, refusing files larger than
/// [`MAX_DOCUMENT_LEN`], without checking it. A directory can verify the
/// text with [`NetworkDocument::from_signed_text_at`] and then serve it as
/// it is.
///
/// # Errors
///
/// [`Error::Io`] (including for text that is not UTF-8) or
/// [`Error::TooLarge`], naming the file.
pub fn read_signed_file(path: &Path) -> Result<String> {
    crate::keys::read_file_limited(path, MAX_DOCUMENT_LEN as u64)
}

/// Sign `body` with `network_key`: returns `body`, a newline if `body` does
/// not end with one, and the signature line. Any text can be signed this way;
/// [`NetworkDocument::to_signed_text`] signs a document's body.
pub fn sign_body(body: &str, network_key: &Keypair) -> String {
    let mut text = String::with_capacity(body.len() + 150);
    text.push_str(body);
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let sig = network_key.sign(&signed_message(&text));
    let _ = writeln!(
        text,
        "{SIGNATURE_KEYWORD} ed25519 {}",
        hex::encode(sig.to_bytes())
    );
    text
}

/// Check the signature of a signed text and return its body (everything
/// before the signature line), which is what was signed. `origin` names the
/// text in errors.
///
/// # Errors
///
/// [`Error::TooLarge`], [`Error::MissingSignature`],
/// [`Error::BadSignatureLine`], [`Error::ExtraSignature`] or
/// [`Error::BadSignature`].
pub fn verify_signed_text_at<'a>(
    text: &'a str,
    network_key: &PublicKey,
    origin: &str,
) -> Result<&'a str> {
    if text.len() > MAX_DOCUMENT_LEN {
        return Err(Error::TooLarge {
            what: origin.into(),
            size: text.len() as u64,
            max: MAX_DOCUMENT_LEN as u64,
        });
    }
    let missing = || Error::MissingSignature {
        origin: origin.into(),
    };
    let (body, sig_line, complete) = match text.strip_suffix('\n') {
        Some(rest) => {
            let start = rest.rfind('\n').map_or(0, |i| i + 1);
            (&text[..start], &rest[start..], true)
        }
        None => {
            let start = text.rfind('\n').map_or(0, |i| i + 1);
            (&text[..start], &text[start..], false)
        }
    };
    if !is_signature_line(sig_line) {
        // A signature line that is not last (trailing text or blank lines)?
        if let Some(n) = text.split('\n').position(is_signature_line) {
            return Err(Error::BadSignatureLine {
                origin: origin.into(),
                line: n + 1,
                reason: "the signature line must be the last line".into(),
            });
        }
        return Err(missing());
    }
    let sig_line_no = body.matches('\n').count() + 1;
    let bad_line = |reason: &str| Error::BadSignatureLine {
        origin: origin.into(),
        line: sig_line_no,
        reason: reason.into(),
    };
    if !complete {
        return Err(bad_line("the signature line must end with a newline"));
    }
    if let Some(n) = body.split('\n').position(is_signature_line) {
        return Err(Error::ExtraSignature {
            origin: origin.into(),
            line: n + 1,
        });
    }
    let mut fields = sig_line.split(' ');
    let (Some(_keyword), Some(alg), Some(sig_hex), None) =
        (fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return Err(bad_line(
            "expected `signature ed25519 <hex>`, separated by single spaces",
        ));
    };
    if alg != "ed25519" {
        return Err(bad_line(&format!(
            "unsupported signature algorithm {alg:?} (only ed25519)"
        )));
    }
    if sig_hex.len() != 128
        || !sig_hex
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(bad_line("the signature must be 128 lowercase hex digits"));
    }
    let mut sig = [0u8; 64];
    hex::decode_to_slice(sig_hex, &mut sig)
        .map_err(|_| bad_line("the signature must be 128 lowercase hex digits"))?;
    network_key
        .verify(&signed_message(body), &Signature::from_bytes(&sig))
        .map_err(|_| Error::BadSignature {
            origin: origin.into(),
        })?;
    Ok(body)
}

/// Whether a line is (meant to be) a signature line.
fn is_signature_line(line: &str) -> bool {
    line.strip_prefix(SIGNATURE_KEYWORD)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r']))
}

/// The bytes signed for `body`.
fn signed_message(body: &str) -> Vec<u8> {
    let mut m = Vec::with_capacity(SIGNATURE_PREFIX.len() + body.len());
    m.extend_from_slice(SIGNATURE_PREFIX);
    m.extend_from_slice(body.as_bytes());
    m
}

/// `s` as a TOML basic string.
pub fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Whether `name` is 1-64 of `[A-Za-z0-9._-]`.
pub fn valid_network_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Whether `nick` is 1-19 ASCII letters and digits (tor's rule).
pub fn valid_nickname(nick: &str) -> bool {
    (1..=19).contains(&nick.len()) && nick.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Whether `name` is 1-32 of `[a-z0-9-]`.
fn valid_transport_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn toml_strings_are_escaped() {
        let s = "a\"b\\c\nd\u{1}é";
        let v: toml::Value = toml::from_str(&format!("x = {}", toml_string(s))).unwrap();
        assert_eq!(v["x"].as_str(), Some(s));
    }

    #[test]
    fn signature_line_detection() {
        assert!(is_signature_line("signature ed25519 00"));
        assert!(is_signature_line("signature"));
        assert!(is_signature_line("signature\r"));
        assert!(!is_signature_line("signatures = 1"));
        assert!(!is_signature_line(" signature ed25519"));
    }
}

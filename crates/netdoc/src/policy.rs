//! Exit policies: which addresses and ports an exit relay connects to.
//!
//! The syntax is a subset of tor's (`ExitPolicy` in tor's manual): a list of
//! rules, separated by commas or newlines,
//!
//! ```text
//! accept|reject ADDR[/MASKBITS]:PORT[-PORT]
//! ```
//!
//! where `ADDR` is `*` (every IPv4 and IPv6 address), `*4` (every IPv4
//! address), `*6` (every IPv6 address), an IPv4 literal (`10.0.0.0`) or a
//! bracketed IPv6 literal (`[fc00::]`); `MASKBITS` (only after a literal) is
//! 0-32 for IPv4 and 0-128 for IPv6, and defaults to a single host; `PORT` is
//! `*` (1-65535), a port, or an inclusive range `LO-HI`, with ports 1-65535.
//!
//! Rules are tried in order and the first one that matches decides; an
//! address and port that no rule matches is rejected (an implicit final
//! `reject *:*`). Port 0 is never allowed.
//!
//! An IPv6 address that carries an IPv4 address (IPv4-mapped
//! `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d`) is judged as that IPv4
//! address ([`canonical_ip`]): `[::ffff:127.0.0.1]` is `127.0.0.1`.
//!
//! Not supported from tor's syntax: `accept6`/`reject6`, dotted-quad masks
//! (`/255.0.0.0`), the `private` keyword and comments.
//!
//! Host bits beyond the mask are cleared when parsing (`10.1.2.3/8` is read
//! as `10.0.0.0/8`), and a full-length mask is written without `/`, so
//! [`Display`](std::fmt::Display) writes a canonical form that parses back to
//! an equal policy.
//!
//! # Private addresses
//!
//! A policy is the relay's published rule set; private and local
//! addresses, the exit's own addresses and the relays' OR ports are
//! refused before it by default (as C tor's `ExitPolicyRejectPrivate`),
//! see [`crate::exit_targets`].

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result, RuleError};

/// The address a connection to `ip` actually reaches, for policy checks:
/// an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, RFC 4291 section
/// 2.5.5.2) and a deprecated IPv4-compatible one (`::a.b.c.d`, section
/// 2.5.5.1) become the IPv4 address they carry; everything else is
/// unchanged. `::` and `::1` stay IPv6 (they are the unspecified and
/// loopback addresses, not IPv4-compatible ones). A connection to
/// `::ffff:127.0.0.1` reaches 127.0.0.1 on a dual-stack host, so a
/// policy that judged it as IPv6 could be bypassed.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let bits = u128::from(v6);
            if bits >> 32 == 0 && bits > 1 {
                return IpAddr::V4(Ipv4Addr::from(bits as u32));
            }
            ip
        }
        IpAddr::V4(_) => ip,
    }
}

/// What a rule does with the connections it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Allow the connection.
    Accept,
    /// Refuse the connection.
    Reject,
}

/// The addresses a rule matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddrPattern {
    /// `*`: every IPv4 and IPv6 address.
    Any,
    /// `*4`: every IPv4 address.
    AnyV4,
    /// `*6`: every IPv6 address.
    AnyV6,
    /// An IPv4 prefix. Bits of `addr` beyond `bits` are ignored when
    /// matching ([`AddrPattern::v4`] clears them).
    V4 {
        /// Network address.
        addr: Ipv4Addr,
        /// Prefix length, 0-32.
        bits: u8,
    },
    /// An IPv6 prefix. Bits of `addr` beyond `bits` are ignored when
    /// matching ([`AddrPattern::v6`] clears them).
    V6 {
        /// Network address.
        addr: Ipv6Addr,
        /// Prefix length, 0-128.
        bits: u8,
    },
}

impl AddrPattern {
    /// The IPv4 prefix `addr/bits` with host bits cleared; `None` if
    /// `bits > 32`.
    pub fn v4(addr: Ipv4Addr, bits: u8) -> Option<Self> {
        (bits <= 32).then(|| AddrPattern::V4 {
            addr: Ipv4Addr::from(u32::from(addr) & mask32(bits)),
            bits,
        })
    }

    /// The IPv6 prefix `addr/bits` with host bits cleared; `None` if
    /// `bits > 128`.
    pub fn v6(addr: Ipv6Addr, bits: u8) -> Option<Self> {
        (bits <= 128).then(|| AddrPattern::V6 {
            addr: Ipv6Addr::from(u128::from(addr) & mask128(bits)),
            bits,
        })
    }

    /// Whether `ip` is in this pattern. An IPv6 address that carries an
    /// IPv4 address is matched as that IPv4 address (see
    /// [`canonical_ip`]), so `reject 127.0.0.0/8:*` also stops
    /// `[::ffff:127.0.0.1]` and `[::127.0.0.1]`.
    pub fn matches(&self, ip: IpAddr) -> bool {
        match (self, canonical_ip(ip)) {
            (AddrPattern::Any, _) => true,
            (AddrPattern::AnyV4, IpAddr::V4(_)) | (AddrPattern::AnyV6, IpAddr::V6(_)) => true,
            (AddrPattern::V4 { addr, bits }, IpAddr::V4(ip)) => {
                let m = mask32(*bits);
                u32::from(ip) & m == u32::from(*addr) & m
            }
            (AddrPattern::V6 { addr, bits }, IpAddr::V6(ip)) => {
                let m = mask128(*bits);
                u128::from(ip) & m == u128::from(*addr) & m
            }
            _ => false,
        }
    }

    /// The pattern as one or two prefixes (`*` is `0.0.0.0/0` and `::/0`).
    fn prefixes(&self) -> impl Iterator<Item = Prefix> {
        let (a, b) = match *self {
            AddrPattern::Any => (Some(Prefix::v4(0, 0)), Some(Prefix::v6(0, 0))),
            AddrPattern::AnyV4 => (Some(Prefix::v4(0, 0)), None),
            AddrPattern::AnyV6 => (Some(Prefix::v6(0, 0)), None),
            AddrPattern::V4 { addr, bits } => (Some(Prefix::v4(u32::from(addr), bits)), None),
            AddrPattern::V6 { addr, bits } => (Some(Prefix::v6(u128::from(addr), bits)), None),
        };
        a.into_iter().chain(b)
    }
}

impl fmt::Display for AddrPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddrPattern::Any => f.write_str("*"),
            AddrPattern::AnyV4 => f.write_str("*4"),
            AddrPattern::AnyV6 => f.write_str("*6"),
            AddrPattern::V4 { addr, bits: 32 } => write!(f, "{addr}"),
            AddrPattern::V4 { addr, bits } => write!(f, "{addr}/{bits}"),
            AddrPattern::V6 { addr, bits: 128 } => write!(f, "[{addr}]"),
            AddrPattern::V6 { addr, bits } => write!(f, "[{addr}]/{bits}"),
        }
    }
}

/// Netmask with the top `bits` bits set (`bits` is clamped to 32).
fn mask32(bits: u8) -> u32 {
    u32::MAX
        .checked_shl(32 - u32::from(bits.min(32)))
        .unwrap_or(0)
}

/// Netmask with the top `bits` bits set (`bits` is clamped to 128).
fn mask128(bits: u8) -> u128 {
    u128::MAX
        .checked_shl(128 - u32::from(bits.min(128)))
        .unwrap_or(0)
}

/// An inclusive range of ports, never containing 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PortRange {
    /// First port.
    lo: u16,
    /// Last port.
    hi: u16,
}

impl PortRange {
    /// Every port: 1-65535 (`*`).
    pub const ALL: PortRange = PortRange { lo: 1, hi: 65535 };

    /// The ports `lo..=hi`; `None` if `lo` is 0 or `lo > hi`.
    pub fn new(lo: u16, hi: u16) -> Option<Self> {
        (lo >= 1 && lo <= hi).then_some(PortRange { lo, hi })
    }

    /// The single port `port`; `None` for 0.
    pub fn single(port: u16) -> Option<Self> {
        Self::new(port, port)
    }

    /// First port of the range.
    pub fn lo(&self) -> u16 {
        self.lo
    }

    /// Last port of the range.
    pub fn hi(&self) -> u16 {
        self.hi
    }

    /// Whether `port` is in the range.
    pub fn contains(&self, port: u16) -> bool {
        self.lo <= port && port <= self.hi
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == PortRange::ALL {
            f.write_str("*")
        } else if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

/// One rule of an exit policy, such as `reject 10.0.0.0/8:*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PolicyRule {
    /// Accept or reject.
    pub action: Action,
    /// Addresses matched.
    pub addr: AddrPattern,
    /// Ports matched.
    pub ports: PortRange,
}

impl PolicyRule {
    /// Whether this rule applies to a connection to `ip`:`port`.
    pub fn matches(&self, ip: IpAddr, port: u16) -> bool {
        self.ports.contains(port) && self.addr.matches(ip)
    }
}

impl fmt::Display for PolicyRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let action = match self.action {
            Action::Accept => "accept",
            Action::Reject => "reject",
        };
        write!(f, "{action} {}:{}", self.addr, self.ports)
    }
}

impl FromStr for PolicyRule {
    type Err = Error;

    /// Parse one rule, `accept|reject ADDR[/MASKBITS]:PORT[-PORT]`
    /// (surrounding whitespace is ignored).
    fn from_str(s: &str) -> Result<Self> {
        let text = s.trim();
        let bad = |reason: RuleError| Error::Policy {
            rule: text.to_string(),
            reason,
        };
        let (keyword, pattern) = text
            .split_once(|c: char| c.is_ascii_whitespace())
            .ok_or_else(|| bad(RuleError::NoPattern))?;
        let action = match keyword {
            "accept" => Action::Accept,
            "reject" => Action::Reject,
            _ => return Err(bad(RuleError::NoAction)),
        };
        let pattern = pattern.trim_start();
        if pattern.contains(|c: char| c.is_whitespace()) {
            return Err(bad(RuleError::SpaceInPattern));
        }
        let (addr, ports) = pattern
            .rsplit_once(':')
            .ok_or_else(|| bad(RuleError::NoPort))?;
        let addr = parse_addr(addr).map_err(bad)?;
        let ports = parse_ports(ports).map_err(bad)?;
        Ok(PolicyRule {
            action,
            addr,
            ports,
        })
    }
}

/// Parse `ADDR[/MASKBITS]`.
fn parse_addr(s: &str) -> std::result::Result<AddrPattern, RuleError> {
    let (host, mask) = match s.split_once('/') {
        Some((h, m)) => (h, Some(m)),
        None => (s, None),
    };
    let wildcard = match host {
        "*" => Some(AddrPattern::Any),
        "*4" => Some(AddrPattern::AnyV4),
        "*6" => Some(AddrPattern::AnyV6),
        _ => None,
    };
    if let Some(w) = wildcard {
        return match mask {
            None => Ok(w),
            Some(_) => Err(RuleError::MaskOnWildcard(host.to_string())),
        };
    }
    let parse_bits = |m: &str, max: u8| -> std::result::Result<u8, RuleError> {
        if m.is_empty() || m.len() > 3 || !m.bytes().all(|b| b.is_ascii_digit()) {
            let mask = m.to_string();
            return Err(RuleError::MaskNotBits { mask, max });
        }
        match m.parse::<u8>() {
            Ok(b) if b <= max => Ok(b),
            _ => Err(RuleError::MaskOutOfRange {
                mask: m.to_string(),
                max,
            }),
        }
    };
    let out_of_range = |bits: u8, max: u8| RuleError::MaskOutOfRange {
        mask: bits.to_string(),
        max,
    };
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| RuleError::UnclosedBracket(host.to_string()))?;
        let ip: Ipv6Addr = inner
            .parse()
            .map_err(|_| RuleError::NotIpv6(inner.to_string()))?;
        let bits = mask.map_or(Ok(128), |m| parse_bits(m, 128))?;
        return AddrPattern::v6(ip, bits).ok_or_else(|| out_of_range(bits, 128));
    }
    let ip: Ipv4Addr = host.parse().map_err(|_| {
        if host.contains(':') {
            RuleError::UnbracketedIpv6(host.to_string())
        } else if host.is_empty() {
            RuleError::NoAddress
        } else {
            RuleError::BadAddress(host.to_string())
        }
    })?;
    let bits = mask.map_or(Ok(32), |m| parse_bits(m, 32))?;
    AddrPattern::v4(ip, bits).ok_or_else(|| out_of_range(bits, 32))
}

/// Parse `*`, `PORT` or `LO-HI`.
fn parse_ports(s: &str) -> std::result::Result<PortRange, RuleError> {
    if s == "*" {
        return Ok(PortRange::ALL);
    }
    let port = |p: &str| -> std::result::Result<u16, RuleError> {
        if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(RuleError::NotPort(p.to_string()));
        }
        match p.parse::<u16>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(RuleError::PortOutOfRange(p.to_string())),
        }
    };
    let (lo, hi) = match s.split_once('-') {
        Some((lo, hi)) => (port(lo)?, port(hi)?),
        None => {
            let p = port(s)?;
            (p, p)
        }
    };
    PortRange::new(lo, hi).ok_or(RuleError::EmptyPortRange(lo, hi))
}

/// An exit policy: rules tried in order, first match decides, implicit final
/// `reject *:*`. See the [module documentation](self) for the syntax.
///
/// With serde it is a list of rule strings, such as
/// `["reject 10.0.0.0/8:*", "accept *:80-443"]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ExitPolicy {
    /// The rules, in order.
    rules: Vec<PolicyRule>,
}

impl ExitPolicy {
    /// A policy with these rules.
    pub fn new(rules: Vec<PolicyRule>) -> Self {
        ExitPolicy { rules }
    }

    /// `accept *:*`: connect anywhere (on ports 1-65535).
    pub fn accept_all() -> Self {
        Self::new(vec![PolicyRule {
            action: Action::Accept,
            addr: AddrPattern::Any,
            ports: PortRange::ALL,
        }])
    }

    /// `reject *:*`: not an exit.
    pub fn reject_all() -> Self {
        Self::new(vec![PolicyRule {
            action: Action::Reject,
            addr: AddrPattern::Any,
            ports: PortRange::ALL,
        }])
    }

    /// Parse a list of rules separated by commas and/or newlines. Blank
    /// entries are skipped, so an empty text is an empty policy (which
    /// rejects everything).
    ///
    /// # Errors
    ///
    /// [`Error::Policy`] naming the first malformed rule.
    pub fn parse(text: &str) -> Result<Self> {
        let rules = text
            .split([',', '\n'])
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(PolicyRule::from_str)
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::new(rules))
    }

    /// The rules, in order (without the implicit final `reject *:*`).
    pub fn rules(&self) -> &[PolicyRule] {
        &self.rules
    }

    /// Whether a connection to `ip`:`port` is allowed: the first matching
    /// rule decides, and no match (or port 0) means rejected.
    pub fn allows(&self, ip: IpAddr, port: u16) -> bool {
        self.rules
            .iter()
            .find(|r| r.matches(ip, port))
            .is_some_and(|r| r.action == Action::Accept)
    }

    /// Whether at least one address, IPv4 or IPv6, is allowed on `port`.
    ///
    /// This is what a client can check when it picks an exit for a stream
    /// to a hostname (the exit resolves it, so the address is unknown): the
    /// answer is exact in that it is `true` if and only if some `ip` has
    /// `allows(ip, port)`. It says nothing about whether the hostname's
    /// address is one of them, so `true` means "may work". A rule that
    /// accepts only addresses already rejected by earlier rules does not
    /// count: `reject *4:80, accept 10.0.0.0/8:80` allows nothing on port 80.
    /// One imprecision remains: an IPv6 pattern inside `::ffff:0:0/96` or
    /// `::/96` matches no address (those are judged as IPv4, see
    /// [`canonical_ip`]) but still counts here.
    pub fn allows_port_somewhere(&self, port: u16) -> bool {
        // Prefixes rejected on `port` by the rules seen so far.
        let mut rejected: Vec<Prefix> = Vec::new();
        for rule in self.rules.iter().filter(|r| r.ports.contains(port)) {
            match rule.action {
                Action::Reject => rejected.extend(rule.addr.prefixes()),
                Action::Accept => {
                    if rule
                        .addr
                        .prefixes()
                        .any(|p| !p.is_covered_by(rejected.iter().copied()))
                    {
                        return true;
                    }
                }
            }
        }
        false
    }
}

impl fmt::Display for ExitPolicy {
    /// The rules separated by `", "`; parses back with [`ExitPolicy::parse`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, rule) in self.rules.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{rule}")?;
        }
        Ok(())
    }
}

impl FromStr for ExitPolicy {
    type Err = Error;

    /// Same as [`ExitPolicy::parse`].
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

impl Serialize for ExitPolicy {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.rules.len()))?;
        for rule in &self.rules {
            seq.serialize_element(&rule.to_string())?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for ExitPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        /// Visits a sequence of rule strings.
        struct RulesVisitor;
        impl<'de> Visitor<'de> for RulesVisitor {
            type Value = ExitPolicy;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of exit-policy rules such as [\"accept *:*\"]")
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<ExitPolicy, A::Error> {
                let mut rules = Vec::new();
                while let Some(text) = seq.next_element::<String>()? {
                    rules.push(text.parse::<PolicyRule>().map_err(de::Error::custom)?);
                }
                Ok(ExitPolicy::new(rules))
            }
        }
        d.deserialize_seq(RulesVisitor)
    }
}

/// An address prefix of either family, for the coverage computation in
/// [`ExitPolicy::allows_port_somewhere`]. IPv4 values sit in the low 32 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Prefix {
    /// Address length in bits: 32 or 128.
    family: u8,
    /// Network address, host bits cleared.
    value: u128,
    /// Prefix length.
    bits: u8,
}

impl Prefix {
    /// An IPv4 prefix.
    fn v4(value: u32, bits: u8) -> Self {
        let bits = bits.min(32);
        Prefix {
            family: 32,
            value: u128::from(value & mask32(bits)),
            bits,
        }
    }

    /// An IPv6 prefix.
    fn v6(value: u128, bits: u8) -> Self {
        let bits = bits.min(128);
        Prefix {
            family: 128,
            value: value & mask128(bits),
            bits,
        }
    }

    /// The mask of this prefix within its family.
    fn mask(&self) -> u128 {
        if self.family == 32 {
            u128::from(mask32(self.bits))
        } else {
            mask128(self.bits)
        }
    }

    /// Whether `other` lies within `self`.
    fn contains(&self, other: &Prefix) -> bool {
        self.family == other.family
            && other.bits >= self.bits
            && other.value & self.mask() == self.value
    }

    /// Number of addresses in the prefix; `None` for 2^128 (`::/0`).
    fn size(&self) -> Option<u128> {
        1u128.checked_shl(u32::from(self.family - self.bits))
    }

    /// Whether the union of `others` contains every address of `self`.
    fn is_covered_by(&self, others: impl Iterator<Item = Prefix>) -> bool {
        // Prefixes are either nested or disjoint. `self` is covered iff one
        // of them contains it, or the largest ones strictly inside it add
        // up to its size.
        let mut inside = Vec::new();
        for q in others {
            if q.contains(self) {
                return true;
            }
            if self.contains(&q) {
                inside.push(q);
            }
        }
        // Sorted by start address, larger prefixes first: a prefix nested
        // in an earlier one comes right after the one that contains it.
        inside.sort_unstable_by_key(|q| (q.value, q.bits));
        let mut total: Option<u128> = Some(0); // None: 2^128
        let mut last: Option<Prefix> = None;
        for q in inside {
            if last.is_some_and(|l| l.contains(&q)) {
                continue;
            }
            last = Some(q);
            // q is strictly inside self, so its size fits in u128; the sum
            // of disjoint parts of self can only reach 2^128 if self is ::/0.
            total = match (total, q.size()) {
                (Some(t), Some(s)) => t.checked_add(s),
                _ => None,
            };
        }
        total == self.size()
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn masks() {
        assert_eq!(mask32(0), 0);
        assert_eq!(mask32(8), 0xff00_0000);
        assert_eq!(mask32(32), u32::MAX);
        assert_eq!(mask128(0), 0);
        assert_eq!(mask128(1), 1 << 127);
        assert_eq!(mask128(128), u128::MAX);
    }

    #[test]
    fn prefix_coverage() {
        let p = Prefix::v4(0x0a00_0000, 8);
        let halves = [Prefix::v4(0x0a00_0000, 9), Prefix::v4(0x0a80_0000, 9)];
        assert!(p.is_covered_by(halves.iter().copied()));
        assert!(!p.is_covered_by(halves[..1].iter().copied()));
        // Nested duplicates are not counted twice.
        let nested = [halves[0], Prefix::v4(0x0a00_0000, 10), halves[0]];
        assert!(!p.is_covered_by(nested.iter().copied()));
        // The whole IPv6 space from its two halves.
        let all6 = Prefix::v6(0, 0);
        let h6 = [Prefix::v6(0, 1), Prefix::v6(1 << 127, 1)];
        assert!(all6.is_covered_by(h6.iter().copied()));
        assert!(!all6.is_covered_by(h6[1..].iter().copied()));
        // Other family does not count.
        assert!(!Prefix::v4(0, 0).is_covered_by(h6.iter().copied()));
    }
}

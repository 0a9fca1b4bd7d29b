//! What an exit refuses to connect to whatever its policy says: the
//! counterpart of C tor's `ExitPolicyRejectPrivate` and
//! `ExitPolicyRejectLocalInterfaces`, on by default.
//!
//! [`ExitTargets::check`] judges one resolved target address, in order:
//!
//! 1. the address and port of any relay in the network document (TLS or
//!    QUIC) is refused, always: an exit must not be a way into the relay
//!    network's own OR ports;
//! 2. an address matching the operator's opt-in list
//!    ([`ExitTargets::allow_private`], `ADDR[/BITS]:PORT[-PORT]` entries
//!    such as `127.0.0.1:8000`) goes on to the policy: the lab and local
//!    test networks list exactly the servers they start;
//! 3. with `reject_private` (the default), a private, loopback, link-local,
//!    unspecified, multicast or reserved address ([`is_private_or_local`])
//!    and any address of the exit itself (its listening and interface
//!    addresses) are refused;
//! 4. the exit policy decides.
//!
//! Addresses are reduced with [`canonical_ip`] before they are compared,
//! so an IPv4-mapped or IPv4-compatible IPv6 form is judged as the IPv4
//! address it carries; on top of that, [`is_private_or_local`] refuses
//! every IPv4-compatible form (deprecated, inside `[::]/8`).

use std::collections::HashSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::{Deserialize, Deserializer};

use crate::doc::NetworkDocument;
use crate::error::Result;
use crate::policy::{canonical_ip, ExitPolicy, PolicyRule};

/// Whether `ip` is an address an exit must not reach on a client's behalf:
/// C tor's list of private networks (`0.0.0.0/8`, `10.0.0.0/8`,
/// `127.0.0.0/8`, `169.254.0.0/16`, `172.16.0.0/12`, `192.168.0.0/16`,
/// `[::]/8`, `[fc00::]/7`, `[fe80::]/10`, `[fec0::]/10`, `[ff00::]/8`),
/// plus carrier-grade NAT space (`100.64.0.0/10`, RFC 6598), IPv4
/// multicast (`224.0.0.0/4`) and the reserved block with the broadcast
/// address (`240.0.0.0/4`). An IPv4-mapped address (`::ffff:a.b.c.d`) is
/// judged as the IPv4 address it carries; a deprecated IPv4-compatible one
/// (`::a.b.c.d`) is inside `[::]/8`, so refused whatever it carries.
pub fn is_private_or_local(ip: IpAddr) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    };
    match ip {
        IpAddr::V4(v4) => {
            const NETS: [(Ipv4Addr, u8); 10] = [
                (Ipv4Addr::new(0, 0, 0, 0), 8),
                (Ipv4Addr::new(10, 0, 0, 0), 8),
                (Ipv4Addr::new(100, 64, 0, 0), 10),
                (Ipv4Addr::new(127, 0, 0, 0), 8),
                (Ipv4Addr::new(169, 254, 0, 0), 16),
                (Ipv4Addr::new(172, 16, 0, 0), 12),
                (Ipv4Addr::new(192, 168, 0, 0), 16),
                (Ipv4Addr::new(224, 0, 0, 0), 4),
                (Ipv4Addr::new(240, 0, 0, 0), 4),
                // 255.255.255.255 is inside 240.0.0.0/4; listed for clarity.
                (Ipv4Addr::BROADCAST, 32),
            ];
            NETS.iter().any(|&(net, bits)| {
                in_prefix(u32::from(v4).into(), u32::from(net).into(), bits, 32)
            })
        }
        IpAddr::V6(v6) => {
            const NETS: [(Ipv6Addr, u8); 5] = [
                (Ipv6Addr::UNSPECIFIED, 8),
                (Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7),
                (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10),
                (Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10),
                (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8),
            ];
            NETS.iter()
                .any(|&(net, bits)| in_prefix(u128::from(v6), u128::from(net), bits, 128))
        }
    }
}

/// Whether the top `bits` of `addr` (a `width`-bit address) equal `net`'s.
fn in_prefix(addr: u128, net: u128, bits: u8, width: u32) -> bool {
    let shift = width - u32::from(bits);
    if shift >= 128 {
        return true;
    }
    addr >> shift == net >> shift
}

/// Private or local targets an exit may reach despite `reject_private`:
/// `ADDR[/BITS]:PORT[-PORT]` entries in exit-policy syntax without the
/// `accept` keyword (`127.0.0.1:8000`, `[::1]:8000`, `10.0.0.0/8:80-90`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrivateTargets {
    /// The entries as `accept` rules.
    rules: ExitPolicy,
}

impl PrivateTargets {
    /// Parse entries such as `"127.0.0.1:8000"`.
    ///
    /// # Errors
    ///
    /// [`crate::Error::Policy`] naming the first malformed entry.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self> {
        let rules = entries
            .iter()
            .map(|e| format!("accept {}", e.as_ref().trim()).parse::<PolicyRule>())
            .collect::<Result<Vec<_>>>()?;
        Ok(PrivateTargets {
            rules: ExitPolicy::new(rules),
        })
    }

    /// No entries: every private target is refused.
    pub fn none() -> Self {
        Self::default()
    }

    /// Whether `addr` is listed.
    pub fn contains(&self, addr: SocketAddr) -> bool {
        self.rules.allows(addr.ip(), addr.port())
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.rules.rules().is_empty()
    }
}

impl fmt::Display for PrivateTargets {
    /// The entries as a TOML array of strings (`["127.0.0.1:8000"]`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, r) in self.rules.rules().iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "\"{}:{}\"", r.addr, r.ports)?;
        }
        f.write_str("]")
    }
}

impl serde::Serialize for PrivateTargets {
    /// The entries as strings, as [`PrivateTargets::parse`] takes them.
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let rules = self.rules.rules();
        let mut seq = s.serialize_seq(Some(rules.len()))?;
        for r in rules {
            seq.serialize_element(&format!("{}:{}", r.addr, r.ports))?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for PrivateTargets {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let entries = Vec::<String>::deserialize(d)?;
        PrivateTargets::parse(&entries).map_err(serde::de::Error::custom)
    }
}

/// Why [`ExitTargets::check`] refused a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetRefusal {
    /// The address and port of a relay in the network document.
    RelayAddress,
    /// One of the exit's own addresses (`reject_private`).
    OwnAddress,
    /// A private, loopback, link-local or otherwise local address
    /// (`reject_private`).
    PrivateAddress,
    /// The exit policy rejects it.
    Policy,
}

impl fmt::Display for TargetRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TargetRefusal::RelayAddress => "a relay's address and port",
            TargetRefusal::OwnAddress => "one of the exit's own addresses",
            TargetRefusal::PrivateAddress => "a private or local address",
            TargetRefusal::Policy => "rejected by the exit policy",
        })
    }
}

/// The exit policy and the refusals that come before it (see the module
/// docs).
#[derive(Clone, Debug)]
pub struct ExitTargets {
    policy: ExitPolicy,
    reject_private: bool,
    allow_private: PrivateTargets,
    relay_addrs: HashSet<SocketAddr>,
    own_ips: HashSet<IpAddr>,
}

impl ExitTargets {
    /// The rules of an exit with `policy` in network `doc`, whose own
    /// addresses are `own_ips`.
    pub fn new(
        policy: ExitPolicy,
        reject_private: bool,
        allow_private: PrivateTargets,
        doc: &NetworkDocument,
        own_ips: impl IntoIterator<Item = IpAddr>,
    ) -> Self {
        let relay_addrs = doc
            .relays
            .iter()
            .flat_map(|r| r.addresses.iter())
            .map(|a| SocketAddr::new(canonical_ip(a.addr.ip()), a.addr.port()))
            .collect();
        let own_ips = own_ips
            .into_iter()
            .map(canonical_ip)
            .filter(|ip| !ip.is_unspecified())
            .collect();
        ExitTargets {
            policy,
            reject_private,
            allow_private,
            relay_addrs,
            own_ips,
        }
    }

    /// The exit policy.
    pub fn policy(&self) -> &ExitPolicy {
        &self.policy
    }

    /// The opt-in list of private targets.
    pub fn allow_private(&self) -> &PrivateTargets {
        &self.allow_private
    }

    /// Whether the exit may connect to `addr`, and if not, why.
    pub fn check(&self, addr: SocketAddr) -> std::result::Result<(), TargetRefusal> {
        let original = addr.ip();
        let ip = canonical_ip(original);
        let addr = SocketAddr::new(ip, addr.port());
        if self.relay_addrs.contains(&addr) {
            return Err(TargetRefusal::RelayAddress);
        }
        if self.reject_private && !self.allow_private.contains(addr) {
            if self.own_ips.contains(&ip) {
                return Err(TargetRefusal::OwnAddress);
            }
            if is_private_or_local(original) {
                return Err(TargetRefusal::PrivateAddress);
            }
        }
        if self.policy.allows(ip, addr.port()) {
            Ok(())
        } else {
            Err(TargetRefusal::Policy)
        }
    }
}

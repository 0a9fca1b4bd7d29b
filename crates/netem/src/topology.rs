//! Topology files: hosts, their access links, and per-path properties.
//!
//! The format is documented with examples in `docs/netem.md`. Parsing reports
//! errors with the file name, line and column.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use toml::Spanned;

use crate::error::{Error, Result};
use crate::units::{parse_probability, serde_impls, QueueLimit, Rate};

/// Index of a host in [`Topology::hosts`].
pub type HostId = usize;

/// A loss process applied to every packet of a path.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
#[serde(tag = "model", rename_all = "kebab-case")]
pub enum LossModel {
    /// No loss.
    #[default]
    None,
    /// Each packet is lost independently with probability `rate`.
    Bernoulli {
        /// Loss probability.
        rate: f64,
    },
    /// Two-state Markov chain (Gilbert-Elliott). Per packet: lose it with the
    /// current state's loss probability, then move Good->Bad with `p` or
    /// Bad->Good with `r`.
    GilbertElliott {
        /// Probability of moving from Good to Bad after a packet.
        p: f64,
        /// Probability of moving from Bad to Good after a packet.
        r: f64,
        /// Loss probability in the Good state.
        loss_good: f64,
        /// Loss probability in the Bad state.
        loss_bad: f64,
    },
}

impl LossModel {
    /// Long-run loss rate of the model.
    pub fn mean_loss(&self) -> f64 {
        match *self {
            LossModel::None => 0.0,
            LossModel::Bernoulli { rate } => rate,
            LossModel::GilbertElliott {
                p,
                r,
                loss_good,
                loss_bad,
            } => {
                if p + r == 0.0 {
                    loss_good
                } else {
                    let bad = p / (p + r);
                    (1.0 - bad) * loss_good + bad * loss_bad
                }
            }
        }
    }

    /// A Gilbert-Elliott model with total loss `rate` in bursts of mean length
    /// `burst` packets (loss 1 in Bad, 0 in Good).
    ///
    /// # Errors
    ///
    /// [`Error::Value`]: a rate outside [0, 1), a burst below 1 packet, or a
    /// rate too high for the burst length.
    pub fn bursty(rate: f64, burst: f64) -> Result<LossModel> {
        let refuse = |reason: &str| Error::Value {
            what: "bursty loss",
            value: format!("rate {rate}, burst {burst}"),
            reason: reason.to_string(),
        };
        if !(0.0..1.0).contains(&rate) {
            return Err(refuse("rate must be in [0, 1)"));
        }
        if !(burst >= 1.0 && burst.is_finite()) {
            return Err(refuse("burst must be at least 1 packet"));
        }
        let r = 1.0 / burst;
        let p = rate * r / (1.0 - rate);
        if p > 1.0 {
            return Err(refuse("rate too high for this burst length"));
        }
        Ok(LossModel::GilbertElliott {
            p,
            r,
            loss_good: 0.0,
            loss_bad: 1.0,
        })
    }

    /// Parses the command-line forms `0.01`, `1%`, `ge:RATE:BURST`
    /// (e.g. `ge:1%:4`) and `ge:p,r,loss_good,loss_bad`.
    pub fn parse(s: &str) -> Result<LossModel> {
        let err = |reason: String| Error::Value {
            what: "loss",
            value: s.to_string(),
            reason,
        };
        if let Some(rest) = s.strip_prefix("ge:") {
            if let Some((rate, burst)) = rest.split_once(':') {
                let rate = parse_probability(rate)?;
                let burst: f64 = burst
                    .trim()
                    .parse()
                    .map_err(|_| err("bad burst length".into()))?;
                return LossModel::bursty(rate, burst);
            }
            let v: Vec<f64> = rest
                .split(',')
                .map(parse_probability)
                .collect::<Result<Vec<f64>>>()?;
            if v.len() != 4 {
                return Err(err(
                    "expected ge:RATE:BURST or ge:p,r,loss_good,loss_bad".into()
                ));
            }
            return Ok(LossModel::GilbertElliott {
                p: v[0],
                r: v[1],
                loss_good: v[2],
                loss_bad: v[3],
            });
        }
        let rate = parse_probability(s)?;
        Ok(if rate == 0.0 {
            LossModel::None
        } else {
            LossModel::Bernoulli { rate }
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLossTable {
    model: String,
    #[serde(default, with = "serde_impls::opt_probability")]
    rate: Option<f64>,
    burst: Option<f64>,
    #[serde(default, with = "serde_impls::opt_probability")]
    p: Option<f64>,
    #[serde(default, with = "serde_impls::opt_probability")]
    r: Option<f64>,
    #[serde(default, with = "serde_impls::opt_probability")]
    loss_good: Option<f64>,
    #[serde(default, with = "serde_impls::opt_probability")]
    loss_bad: Option<f64>,
}

impl RawLossTable {
    fn resolve(self) -> std::result::Result<LossModel, String> {
        match self.model.as_str() {
            "none" => Ok(LossModel::None),
            "bernoulli" => Ok(LossModel::Bernoulli {
                rate: self.rate.ok_or("bernoulli loss needs `rate`")?,
            }),
            "gilbert-elliott" | "ge" => match (self.rate, self.burst, self.p, self.r) {
                (Some(rate), Some(burst), None, None) => {
                    LossModel::bursty(rate, burst).map_err(|e| e.to_string())
                }
                (None, None, Some(p), Some(r)) => Ok(LossModel::GilbertElliott {
                    p,
                    r,
                    loss_good: self.loss_good.unwrap_or(0.0),
                    loss_bad: self.loss_bad.unwrap_or(1.0),
                }),
                _ => Err("gilbert-elliott loss needs either `rate` and `burst`, or `p` and `r` (and optionally `loss_good`, `loss_bad`)".into()),
            },
            other => Err(format!("unknown loss model {other:?} (none, bernoulli, gilbert-elliott)")),
        }
    }
}

struct LossVisitor;

impl<'de> Visitor<'de> for LossVisitor {
    type Value = LossModel;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a loss rate (0.01 or \"1%\") or a table with `model = ...`")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<LossModel, E> {
        LossModel::parse(v).map_err(|e| E::custom(e.to_string()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<LossModel, E> {
        LossModel::parse(&v.to_string()).map_err(|e| E::custom(e.to_string()))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<LossModel, E> {
        self.visit_f64(v as f64)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<LossModel, E> {
        self.visit_f64(v as f64)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<LossModel, A::Error> {
        let raw = RawLossTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
        raw.resolve().map_err(de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for LossModel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(LossVisitor)
    }
}

/// IP protocols a path drops: the topology's `block = ["udp"]` (also
/// `"tcp"`, `"icmp"`; `[]` or `["none"]` blocks nothing). Packets of a
/// blocked protocol are dropped and counted as `blocked` drops, like a
/// firewall in the path; other packets pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Block {
    /// Drop UDP (IP protocol 17).
    pub udp: bool,
    /// Drop TCP (IP protocol 6).
    pub tcp: bool,
    /// Drop ICMP (IP protocol 1).
    pub icmp: bool,
}

impl Block {
    /// Nothing blocked.
    pub const NONE: Block = Block {
        udp: false,
        tcp: false,
        icmp: false,
    };
    /// UDP blocked.
    pub const UDP: Block = Block {
        udp: true,
        tcp: false,
        icmp: false,
    };

    /// IP protocol number of ICMP.
    pub const PROTO_ICMP: u8 = 1;
    /// IP protocol number of TCP.
    pub const PROTO_TCP: u8 = 6;
    /// IP protocol number of UDP.
    pub const PROTO_UDP: u8 = 17;

    /// Whether a packet of IP protocol `protocol` is dropped.
    pub fn blocks(&self, protocol: u8) -> bool {
        match protocol {
            Self::PROTO_UDP => self.udp,
            Self::PROTO_TCP => self.tcp,
            Self::PROTO_ICMP => self.icmp,
            _ => false,
        }
    }

    /// True when nothing is blocked.
    pub fn is_none(&self) -> bool {
        *self == Block::NONE
    }

    /// Adds one protocol by name (`udp`, `tcp`, `icmp`; `none` adds nothing).
    fn add(&mut self, name: &str) -> Result<()> {
        match name.trim() {
            "udp" => self.udp = true,
            "tcp" => self.tcp = true,
            "icmp" => self.icmp = true,
            "none" => {}
            other => {
                return Err(Error::Value {
                    what: "block",
                    value: other.to_string(),
                    reason: "expected udp, tcp, icmp or none".into(),
                })
            }
        }
        Ok(())
    }

    /// Parses the command-line and lab form: `none`, or protocol names
    /// separated by commas (`udp`, `udp,tcp`).
    pub fn parse(s: &str) -> Result<Block> {
        let mut b = Block::NONE;
        for name in s.split(',') {
            b.add(name)?;
        }
        Ok(b)
    }

    /// The protocol names, in a fixed order.
    pub fn names(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.udp {
            v.push("udp");
        }
        if self.tcp {
            v.push("tcp");
        }
        if self.icmp {
            v.push("icmp");
        }
        v
    }
}

impl fmt::Display for Block {
    /// `none` or the names separated by commas (the form [`Block::parse`] reads).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_none() {
            f.write_str("none")
        } else {
            f.write_str(&self.names().join(","))
        }
    }
}

impl Serialize for Block {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.names().serialize(s)
    }
}

struct BlockVisitor;

impl<'de> Visitor<'de> for BlockVisitor {
    type Value = Block;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of protocols such as [\"udp\"] (udp, tcp, icmp)")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Block, E> {
        Block::parse(v).map_err(|e| E::custom(e.to_string()))
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Block, A::Error> {
        let mut b = Block::NONE;
        while let Some(name) = seq.next_element::<String>()? {
            b.add(&name).map_err(|e| de::Error::custom(e.to_string()))?;
        }
        Ok(b)
    }
}

impl<'de> Deserialize<'de> for Block {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(BlockVisitor)
    }
}

/// An access link or bottleneck: a rate and a drop-tail queue.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct LinkSpec {
    /// Serialisation rate.
    pub rate: Rate,
    /// Queue limit in front of it.
    pub queue: QueueLimit,
}

/// Properties of one direction between two hosts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PathSpec {
    /// One-way propagation delay.
    #[serde(with = "serde_impls::duration")]
    pub latency: Duration,
    /// Jitter: each packet's delay varies uniformly within ±jitter. Packets are
    /// not reordered by jitter.
    #[serde(with = "serde_impls::duration")]
    pub jitter: Duration,
    /// Loss process.
    pub loss: LossModel,
    /// Probability that a packet is held back by `reorder_delay`, letting
    /// later packets overtake it.
    pub reorder: f64,
    /// Extra delay of reordered packets.
    #[serde(with = "serde_impls::duration")]
    pub reorder_delay: Duration,
    /// Optional bottleneck specific to this path (rate unlimited = none).
    pub bottleneck: LinkSpec,
    /// False when the path is cut: every packet is dropped.
    pub up: bool,
    /// IP protocols dropped on this path (nothing by default).
    #[serde(default)]
    pub block: Block,
}

impl Default for PathSpec {
    fn default() -> Self {
        PathSpec {
            latency: Duration::ZERO,
            jitter: Duration::ZERO,
            loss: LossModel::None,
            reorder: 0.0,
            reorder_delay: Duration::from_millis(1),
            bottleneck: LinkSpec::default(),
            up: true,
            block: Block::NONE,
        }
    }
}

/// A partial change of a [`PathSpec`], used by topology overrides and at run time.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathUpdate {
    /// New latency.
    #[serde(
        default,
        with = "serde_impls::opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub latency: Option<Duration>,
    /// New jitter.
    #[serde(
        default,
        with = "serde_impls::opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub jitter: Option<Duration>,
    /// New loss model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<LossModel>,
    /// New reordering probability.
    #[serde(
        default,
        with = "serde_impls::opt_probability",
        skip_serializing_if = "Option::is_none"
    )]
    pub reorder: Option<f64>,
    /// New reordering delay.
    #[serde(
        default,
        with = "serde_impls::opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub reorder_delay: Option<Duration>,
    /// New bottleneck rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    /// New bottleneck queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueLimit>,
    /// Cut (`false`) or restore (`true`) the path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up: Option<bool>,
    /// New set of blocked IP protocols (replaces the old one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<Block>,
}

impl PathUpdate {
    /// Applies the change to `spec`.
    pub fn apply(&self, spec: &mut PathSpec) {
        if let Some(v) = self.latency {
            spec.latency = v;
        }
        if let Some(v) = self.jitter {
            spec.jitter = v;
        }
        if let Some(v) = self.loss {
            spec.loss = v;
        }
        if let Some(v) = self.reorder {
            spec.reorder = v;
        }
        if let Some(v) = self.reorder_delay {
            spec.reorder_delay = v;
        }
        if let Some(v) = self.rate {
            spec.bottleneck.rate = v;
        }
        if let Some(v) = self.queue {
            spec.bottleneck.queue = v;
        }
        if let Some(v) = self.up {
            spec.up = v;
        }
        if let Some(v) = self.block {
            spec.block = v;
        }
    }
}

/// A partial change of a host's access links.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct HostUpdate {
    /// New uplink rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up: Option<Rate>,
    /// New downlink rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down: Option<Rate>,
    /// New uplink queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_queue: Option<QueueLimit>,
    /// New downlink queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down_queue: Option<QueueLimit>,
}

impl HostUpdate {
    /// Applies the change to a host.
    pub fn apply(&self, host: &mut HostSpec) {
        if let Some(v) = self.up {
            host.uplink.rate = v;
        }
        if let Some(v) = self.down {
            host.downlink.rate = v;
        }
        if let Some(v) = self.up_queue {
            host.uplink.queue = v;
        }
        if let Some(v) = self.down_queue {
            host.downlink.queue = v;
        }
    }
}

/// One emulated host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostSpec {
    /// Name (used in namespace names and on the command line).
    pub name: String,
    /// The host's IPv4 address.
    pub address: Ipv4Addr,
    /// Link from the host into the network.
    pub uplink: LinkSpec,
    /// Link from the network to the host.
    pub downlink: LinkSpec,
}

/// A validated topology.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    /// Lab name: namespaces are called `olab-<name>-<host>`.
    pub name: String,
    /// Seed of all random processes of the link model.
    pub seed: u64,
    /// MTU of the hosts' TUN interfaces.
    pub mtu: u32,
    /// Hosts; a [`HostId`] indexes this vector.
    pub hosts: Vec<HostSpec>,
    /// Path properties used where no override exists.
    pub default_path: PathSpec,
    /// Per directed pair `(src, dst)` overrides.
    #[serde(with = "override_list")]
    pub overrides: BTreeMap<(HostId, HostId), PathSpec>,
}

/// Serde of [`Topology::overrides`] as a list of `[src, dst, path]`:
/// JSON's and TOML's keys are strings, not pairs.
mod override_list {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{HostId, PathSpec};

    pub(super) fn serialize<S: Serializer>(
        map: &BTreeMap<(HostId, HostId), PathSpec>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let list: Vec<(HostId, HostId, &PathSpec)> =
            map.iter().map(|(&(a, b), p)| (a, b, p)).collect();
        list.serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<(HostId, HostId), PathSpec>, D::Error> {
        let list: Vec<(HostId, HostId, PathSpec)> = Vec::deserialize(d)?;
        Ok(list.into_iter().map(|(a, b, p)| ((a, b), p)).collect())
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    #[serde(default, with = "serde_impls::opt_duration")]
    latency: Option<Duration>,
    #[serde(default, with = "serde_impls::opt_duration")]
    jitter: Option<Duration>,
    #[serde(default)]
    loss: Option<LossModel>,
    #[serde(default, with = "serde_impls::opt_probability")]
    reorder: Option<f64>,
    #[serde(default, with = "serde_impls::opt_duration")]
    reorder_delay: Option<Duration>,
    #[serde(default)]
    block: Option<Block>,
    up: Option<Rate>,
    down: Option<Rate>,
    queue: Option<QueueLimit>,
    up_queue: Option<QueueLimit>,
    down_queue: Option<QueueLimit>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    name: Spanned<String>,
    address: Option<Spanned<String>>,
    up: Option<Rate>,
    down: Option<Rate>,
    queue: Option<QueueLimit>,
    up_queue: Option<QueueLimit>,
    down_queue: Option<QueueLimit>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLink {
    a: Spanned<String>,
    b: Spanned<String>,
    #[serde(default)]
    oneway: bool,
    #[serde(default, with = "serde_impls::opt_duration")]
    latency: Option<Duration>,
    #[serde(default, with = "serde_impls::opt_duration")]
    jitter: Option<Duration>,
    #[serde(default)]
    loss: Option<LossModel>,
    #[serde(default, with = "serde_impls::opt_probability")]
    reorder: Option<f64>,
    #[serde(default, with = "serde_impls::opt_duration")]
    reorder_delay: Option<Duration>,
    rate: Option<Rate>,
    queue: Option<QueueLimit>,
    up: Option<bool>,
    #[serde(default)]
    block: Option<Block>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTopology {
    name: Option<Spanned<String>>,
    subnet: Option<Spanned<String>>,
    seed: Option<u64>,
    mtu: Option<Spanned<u32>>,
    #[serde(default)]
    defaults: RawDefaults,
    #[serde(default)]
    host: Vec<RawHost>,
    #[serde(default)]
    link: Vec<RawLink>,
}

fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(src.len());
    let before = &src[..offset];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map_or(offset, |i| offset - i - 1) + 1;
    (line, col)
}

/// Checks that a name is usable in a namespace name.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn parse_subnet(s: &str) -> std::result::Result<(Ipv4Addr, u8), String> {
    let (a, l) = s.split_once('/').ok_or("expected a.b.c.d/len")?;
    let a: Ipv4Addr = a.parse().map_err(|_| "bad address")?;
    let l: u8 = l.parse().map_err(|_| "bad prefix length")?;
    if !(8..=30).contains(&l) {
        return Err("prefix length must be between 8 and 30".into());
    }
    let mask = u32::MAX << (32 - l);
    Ok((Ipv4Addr::from(u32::from(a) & mask), l))
}

fn usable_address(a: Ipv4Addr) -> bool {
    !(a.is_loopback() || a.is_multicast() || a.is_unspecified() || a.is_broadcast())
}

impl Topology {
    /// Default subnet for automatically assigned addresses.
    pub const DEFAULT_SUBNET: &'static str = "10.77.0.0/16";

    /// Reads and validates a topology file.
    pub fn from_file(path: &Path) -> Result<Topology> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ReadTopology {
            path: path.to_path_buf(),
            source,
        })?;
        Topology::from_toml_str(&text, &path.display().to_string())
    }

    /// Parses and validates a topology from TOML text; `origin` names it in errors.
    pub fn from_toml_str(src: &str, origin: &str) -> Result<Topology> {
        let err_at = |offset: usize, message: String| {
            let (line, column) = line_col(src, offset);
            Error::Topology {
                origin: origin.to_string(),
                line,
                column,
                message,
            }
        };
        let raw: RawTopology = toml::from_str(src).map_err(|e| {
            let offset = e.span().map_or(0, |s| s.start);
            err_at(offset, e.message().to_string())
        })?;

        let name = match &raw.name {
            Some(n) => {
                if !valid_name(n.get_ref()) {
                    return Err(err_at(
                        n.span().start,
                        "lab name must be 1-32 characters of [A-Za-z0-9_-]".into(),
                    ));
                }
                n.get_ref().clone()
            }
            None => "lab".to_string(),
        };
        let mtu = match &raw.mtu {
            Some(m) => {
                let v = *m.get_ref();
                if !(576..=9000).contains(&v) {
                    return Err(err_at(
                        m.span().start,
                        "mtu must be between 576 and 9000".into(),
                    ));
                }
                v
            }
            None => 1500,
        };
        let (subnet, prefix) = match &raw.subnet {
            Some(s) => parse_subnet(s.get_ref())
                .map_err(|m| err_at(s.span().start, format!("subnet: {m}")))?,
            None => parse_subnet(Self::DEFAULT_SUBNET).map_err(|m| err_at(0, m))?,
        };

        let d = &raw.defaults;
        let default_queue = d.queue.unwrap_or_default();
        let mut default_path = PathSpec::default();
        PathUpdate {
            latency: d.latency,
            jitter: d.jitter,
            loss: d.loss,
            reorder: d.reorder,
            reorder_delay: d.reorder_delay,
            block: d.block,
            ..PathUpdate::default()
        }
        .apply(&mut default_path);

        if raw.host.is_empty() {
            return Err(err_at(0, "the topology has no [[host]]".into()));
        }
        let mut hosts: Vec<HostSpec> = Vec::new();
        let mut names = HashSet::new();
        let mut used = HashSet::new();
        let mut pending_auto = Vec::new();
        for h in &raw.host {
            let n = h.name.get_ref();
            if !valid_name(n) {
                return Err(err_at(
                    h.name.span().start,
                    format!("host name {n:?} must be 1-32 characters of [A-Za-z0-9_-]"),
                ));
            }
            if !names.insert(n.clone()) {
                return Err(err_at(h.name.span().start, format!("duplicate host {n:?}")));
            }
            let address = match &h.address {
                Some(a) => {
                    let ip: Ipv4Addr = a.get_ref().parse().map_err(|_| {
                        err_at(
                            a.span().start,
                            format!("bad IPv4 address {:?}", a.get_ref()),
                        )
                    })?;
                    if !usable_address(ip) {
                        return Err(err_at(
                            a.span().start,
                            format!("address {ip} cannot be used for a host"),
                        ));
                    }
                    if !used.insert(ip) {
                        return Err(err_at(a.span().start, format!("address {ip} used twice")));
                    }
                    ip
                }
                None => {
                    pending_auto.push(hosts.len());
                    Ipv4Addr::UNSPECIFIED
                }
            };
            let queue = h.queue.unwrap_or(default_queue);
            hosts.push(HostSpec {
                name: n.clone(),
                address,
                uplink: LinkSpec {
                    rate: h.up.or(d.up).unwrap_or_default(),
                    queue: h.up_queue.or(d.up_queue).or(h.queue).unwrap_or(queue),
                },
                downlink: LinkSpec {
                    rate: h.down.or(d.down).unwrap_or_default(),
                    queue: h.down_queue.or(d.down_queue).or(h.queue).unwrap_or(queue),
                },
            });
        }
        let base = u32::from(subnet);
        let size = 1u64 << (32 - prefix);
        let mut next: u64 = 1;
        for idx in pending_auto {
            loop {
                if next >= size - 1 {
                    return Err(err_at(0, "subnet too small for all hosts".into()));
                }
                let ip = Ipv4Addr::from(base + next as u32);
                next += 1;
                if used.insert(ip) {
                    hosts[idx].address = ip;
                    break;
                }
            }
        }

        let mut overrides = BTreeMap::new();
        for l in &raw.link {
            let find = |s: &Spanned<String>| {
                hosts
                    .iter()
                    .position(|h| &h.name == s.get_ref())
                    .ok_or_else(|| {
                        err_at(s.span().start, format!("unknown host {:?}", s.get_ref()))
                    })
            };
            let a = find(&l.a)?;
            let b = find(&l.b)?;
            if a == b {
                return Err(err_at(
                    l.b.span().start,
                    "a link needs two different hosts".into(),
                ));
            }
            let upd = PathUpdate {
                latency: l.latency,
                jitter: l.jitter,
                loss: l.loss,
                reorder: l.reorder,
                reorder_delay: l.reorder_delay,
                rate: l.rate,
                queue: l.queue,
                up: l.up,
                block: l.block,
            };
            let mut dirs = vec![(a, b)];
            if !l.oneway {
                dirs.push((b, a));
            }
            for dir in dirs {
                let spec = overrides.entry(dir).or_insert(default_path);
                upd.apply(spec);
            }
        }

        Ok(Topology {
            name,
            seed: raw.seed.unwrap_or(1),
            mtu,
            hosts,
            default_path,
            overrides,
        })
    }

    /// Looks a host up by name.
    pub fn host_id(&self, name: &str) -> Result<HostId> {
        self.hosts
            .iter()
            .position(|h| h.name == name)
            .ok_or_else(|| Error::UnknownHost(name.to_string()))
    }

    /// Properties of the path `src -> dst`.
    pub fn path(&self, src: HostId, dst: HostId) -> &PathSpec {
        self.overrides
            .get(&(src, dst))
            .unwrap_or(&self.default_path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"
name = "t"
seed = 9
[defaults]
latency = "10ms"
loss = "1%"
up = "100Mbit"
queue = "100 packets"

[[host]]
name = "a"
up = "10Mbit"
queue = "64KiB"

[[host]]
name = "b"
address = "10.77.0.50"

[[host]]
name = "c"

[[link]]
a = "a"
b = "b"
latency = "20ms"
loss = { model = "gilbert-elliott", rate = "2%", burst = 4 }

[[link]]
a = "b"
b = "c"
oneway = true
rate = "5Mbit"
queue = "30ms"
"#;

    #[test]
    fn parses_sample() {
        let t = Topology::from_toml_str(SAMPLE, "sample").unwrap();
        assert_eq!(t.name, "t");
        assert_eq!(t.seed, 9);
        assert_eq!(t.hosts.len(), 3);
        assert_eq!(t.hosts[0].address, Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(t.hosts[1].address, Ipv4Addr::new(10, 77, 0, 50));
        assert_eq!(t.hosts[2].address, Ipv4Addr::new(10, 77, 0, 2));
        assert_eq!(t.hosts[0].uplink.rate, Rate(Some(10_000_000)));
        assert_eq!(t.hosts[0].uplink.queue, QueueLimit::Bytes(65536));
        assert_eq!(t.hosts[1].uplink.rate, Rate(Some(100_000_000)));
        assert_eq!(t.hosts[1].uplink.queue, QueueLimit::Packets(100));
        assert_eq!(t.path(0, 1).latency, Duration::from_millis(20));
        assert_eq!(t.path(1, 0).latency, Duration::from_millis(20));
        assert!((t.path(0, 1).loss.mean_loss() - 0.02).abs() < 1e-9);
        assert_eq!(t.path(0, 2).latency, Duration::from_millis(10));
        assert_eq!(t.path(1, 2).bottleneck.rate, Rate(Some(5_000_000)));
        assert_eq!(t.path(2, 1).bottleneck.rate, Rate(None));
        assert!((t.path(2, 1).loss.mean_loss() - 0.01).abs() < 1e-9);
    }

    fn err_line(src: &str) -> (usize, String) {
        match Topology::from_toml_str(src, "x") {
            Err(Error::Topology { line, message, .. }) => (line, message),
            other => panic!("expected a topology error, got {other:?}"),
        }
    }

    #[test]
    fn errors_have_lines() {
        let (line, msg) = err_line("[[host]]\nname = \"a\"\nup = \"10 parsecs\"\n");
        assert_eq!(line, 3, "{msg}");
        assert!(msg.contains("rate"), "{msg}");
        let (line, msg) = err_line(
            "[[host]]\nname = \"a\"\n[[host]]\nname = \"b\"\n[[link]]\na = \"a\"\nb = \"zz\"\n",
        );
        assert_eq!(line, 7, "{msg}");
        assert!(msg.contains("unknown host"), "{msg}");
        let (line, msg) = err_line("[[host]]\nname = \"a\"\n[[host]]\nname = \"a\"\n");
        assert_eq!(line, 4, "{msg}");
        let (line, msg) =
            err_line("[defaults]\nlatency = \"5ms\"\nbogus = 1\n[[host]]\nname = \"a\"\n");
        assert_eq!(line, 3, "{msg}");
        let (line, msg) = err_line("[[host]]\nname = \"a\"\n\n[[link]]\na = \"a\"\nb = \"a\"\nloss = { model = \"ge\", rate = 0.1 }\n");
        assert_eq!(line, 7, "{msg}");
    }

    #[test]
    fn block_udp() {
        let src = "[[host]]\nname = \"a\"\n[[host]]\nname = \"b\"\n[[host]]\nname = \"c\"\n\
                   [[link]]\na = \"a\"\nb = \"b\"\nblock = [\"udp\"]\n\
                   [[link]]\na = \"b\"\nb = \"c\"\noneway = true\nblock = [\"udp\", \"icmp\"]\n";
        let t = Topology::from_toml_str(src, "x").unwrap();
        assert_eq!(t.path(0, 1).block, Block::UDP);
        assert_eq!(t.path(1, 0).block, Block::UDP);
        assert!(t.path(0, 1).block.blocks(Block::PROTO_UDP));
        assert!(!t.path(0, 1).block.blocks(Block::PROTO_TCP));
        assert!(t.path(1, 2).block.icmp && t.path(1, 2).block.udp);
        assert_eq!(t.path(2, 1).block, Block::NONE);
        assert_eq!(t.path(0, 2).block, Block::NONE);
        assert_eq!(t.path(1, 2).block.to_string(), "udp,icmp");

        let t = Topology::from_toml_str(
            "[defaults]\nblock = [\"udp\"]\n[[host]]\nname = \"a\"\n[[host]]\nname = \"b\"\n\
             [[link]]\na = \"a\"\nb = \"b\"\nblock = []\n",
            "x",
        )
        .unwrap();
        assert_eq!(t.default_path.block, Block::UDP);
        assert_eq!(t.path(0, 1).block, Block::NONE);

        assert_eq!(Block::parse("none").unwrap(), Block::NONE);
        assert_eq!(Block::parse("udp").unwrap(), Block::UDP);
        assert_eq!(Block::parse("udp,tcp").unwrap().to_string(), "udp,tcp");
        assert!(Block::parse("sctp").is_err());
        assert_eq!(Block::NONE.to_string(), "none");

        // Errors point at the line.
        let (line, msg) = err_line(
            "[[host]]\nname = \"a\"\n[[host]]\nname = \"b\"\n[[link]]\na = \"a\"\nb = \"b\"\nblock = [\"sctp\"]\n",
        );
        assert_eq!(line, 8, "{msg}");
        assert!(msg.contains("expected udp, tcp, icmp or none"), "{msg}");
        let (line, msg) = err_line(
            "[[host]]\nname = \"a\"\n[[host]]\nname = \"b\"\n[[link]]\na = \"a\"\nb = \"b\"\nblock = 17\n",
        );
        assert_eq!(line, 8, "{msg}");
        assert!(msg.contains("list of protocols"), "{msg}");
    }

    #[test]
    fn loss_forms() {
        assert_eq!(LossModel::parse("0").unwrap(), LossModel::None);
        assert_eq!(
            LossModel::parse("5%").unwrap(),
            LossModel::Bernoulli { rate: 0.05 }
        );
        let ge = LossModel::parse("ge:1%:4").unwrap();
        assert!((ge.mean_loss() - 0.01).abs() < 1e-12);
        let ge2 = LossModel::parse("ge:0.01,0.3,0,1").unwrap();
        assert!(matches!(ge2, LossModel::GilbertElliott { .. }));
    }
}

#[cfg(test)]
mod sample_tests {
    #[test]
    fn shipped_sample_parses() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/topology.toml");
        let t = super::Topology::from_file(&path).unwrap();
        assert_eq!(t.hosts.len(), 5);
        let (g, m) = (t.host_id("guard").unwrap(), t.host_id("middle").unwrap());
        assert!((t.path(g, m).loss.mean_loss() - 0.01).abs() < 1e-9);
    }
}

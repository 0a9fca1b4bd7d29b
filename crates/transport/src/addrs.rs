//! A node's addresses by endpoint kind ([`EndpointAddrs`]): a peer's, as
//! its network document entry lists them, and a relay's own, where its
//! endpoints listen (the `[listen]` table of its configuration file,
//! keyed like the document: `tls = "ADDR:PORT"`, `quic = ...`).

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use crate::any::EndpointKind;

/// One address per endpoint kind, in registry order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointAddrs(Vec<(EndpointKind, SocketAddr)>);

impl EndpointAddrs {
    /// No address.
    pub fn new() -> Self {
        Self::default()
    }

    /// One address on `ip` for each of `kinds`: the first kind of each IP
    /// protocol at `port`, the second at `port + stride`, and so on (a TCP
    /// and a UDP endpoint share a port number, two UDP endpoints cannot).
    /// `None` if a port would pass 65535.
    pub fn on_ports(ip: IpAddr, port: u16, stride: u16, kinds: &[EndpointKind]) -> Option<Self> {
        let mut addrs = EndpointAddrs::new();
        for (i, &kind) in kinds.iter().enumerate() {
            let before = kinds[..i]
                .iter()
                .filter(|k| k.protocol() == kind.protocol())
                .count();
            let offset = stride.checked_mul(u16::try_from(before).ok()?)?;
            addrs.insert(kind, SocketAddr::new(ip, port.checked_add(offset)?));
        }
        Some(addrs)
    }

    /// The addresses `lookup` gives for each kind's name in the network
    /// document ([`EndpointKind::doc_name`]).
    pub fn from_document(lookup: impl Fn(&str) -> Option<SocketAddr>) -> Self {
        EndpointAddrs(
            EndpointKind::all()
                .into_iter()
                .filter_map(|kind| Some((kind, lookup(kind.doc_name())?)))
                .collect(),
        )
    }

    /// These addresses and `addr` for `kind` (replacing any).
    #[must_use]
    pub fn with(mut self, kind: EndpointKind, addr: SocketAddr) -> Self {
        self.insert(kind, addr);
        self
    }

    /// Set `kind`'s address to `addr` (replacing any).
    pub fn insert(&mut self, kind: EndpointKind, addr: SocketAddr) {
        match self.0.iter_mut().find(|(k, _)| *k == kind) {
            Some(entry) => entry.1 = addr,
            None => {
                self.0.push((kind, addr));
                self.sort();
            }
        }
    }

    /// The address of `kind`, if there is one.
    pub fn get(&self, kind: EndpointKind) -> Option<SocketAddr> {
        self.0.iter().find(|(k, _)| *k == kind).map(|(_, a)| *a)
    }

    /// Any address (the first kind in registry order), for logs and the
    /// decision whether a peer can be reached at all.
    pub fn any(&self) -> Option<SocketAddr> {
        self.0.first().map(|(_, a)| *a)
    }

    /// Every kind and its address, in registry order.
    pub fn iter(&self) -> impl Iterator<Item = (EndpointKind, SocketAddr)> + '_ {
        self.0.iter().copied()
    }

    fn sort(&mut self) {
        let all = EndpointKind::all();
        let rank = |k: &EndpointKind| all.iter().position(|a| a == k).unwrap_or(usize::MAX);
        self.0.sort_by_key(|(k, _)| rank(k));
    }
}

/// The names [`EndpointAddrs`] accepts, quoted, for error messages.
fn kind_names() -> String {
    EndpointKind::all()
        .iter()
        .map(|k| format!("`{}`", k.doc_name()))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Serialize for EndpointAddrs {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (kind, addr) in &self.0 {
            map.serialize_entry(kind.doc_name(), &addr.to_string())?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for EndpointAddrs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(AddrsVisitor)
    }
}

struct AddrsVisitor;

impl<'de> Visitor<'de> for AddrsVisitor {
    type Value = EndpointAddrs;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a table of addresses by endpoint ({}), e.g. {{ tls = \"127.0.0.1:9000\" }}",
            kind_names()
        )
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        // The file format before endpoints were a table: say what to write.
        Err(E::custom(format!(
            "expected a table of addresses by endpoint ({}): write `{{ tls = \"{v}\" }}`",
            kind_names()
        )))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen: BTreeMap<String, SocketAddr> = BTreeMap::new();
        while let Some(name) = map.next_key::<String>()? {
            let text: String = map.next_value()?;
            let addr: SocketAddr = text.parse().map_err(|e| {
                de::Error::custom(format!("`{name}` address `{text}`: {e} (expected IP:PORT)"))
            })?;
            seen.insert(name, addr);
        }
        let mut addrs = EndpointAddrs::new();
        for (name, addr) in seen {
            let kind = EndpointKind::all()
                .into_iter()
                .find(|k| k.doc_name() == name)
                .ok_or_else(|| {
                    de::Error::custom(format!(
                        "unknown endpoint `{name}`: expected one of {}",
                        kind_names()
                    ))
                })?;
            addrs.insert(kind, addr);
        }
        Ok(addrs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct File {
        listen: EndpointAddrs,
    }

    #[test]
    fn a_table_round_trips_in_registry_order() {
        let text = "[listen]\nquic = \"127.0.0.1:9001\"\ntls = \"127.0.0.1:9000\"\n";
        let file: File = toml::from_str(text).unwrap();
        assert_eq!(
            file.listen.get(EndpointKind::TCP),
            Some("127.0.0.1:9000".parse().unwrap())
        );
        assert_eq!(file.listen.any(), file.listen.get(EndpointKind::TCP));
        let written = toml::to_string(&file).unwrap();
        assert!(
            written.find("tls").unwrap() < written.find("quic").unwrap(),
            "{written}"
        );
        assert_eq!(toml::from_str::<File>(&written).unwrap(), file);
    }

    #[test]
    fn ports_are_shared_across_protocols_only() {
        let ip = IpAddr::from([10, 0, 0, 1]);
        let all = EndpointKind::all();
        let addrs = EndpointAddrs::on_ports(ip, 9001, 3, &all).unwrap();
        let port = |kind| addrs.get(kind).map(|a: SocketAddr| a.port());
        assert_eq!(port(EndpointKind::TCP), Some(9001));
        assert_eq!(port(EndpointKind::QUIC), Some(9001));
        assert_eq!(port(EndpointKind::UTCP), Some(9004));
        let two = EndpointAddrs::on_ports(ip, 9001, 3, &[EndpointKind::UTCP, EndpointKind::TCP]);
        assert_eq!(
            two.unwrap()
                .iter()
                .map(|(_, a)| a.port())
                .collect::<Vec<_>>(),
            [9001, 9001]
        );
        assert_eq!(EndpointAddrs::on_ports(ip, 65535, 1, &all), None);
    }

    #[test]
    fn bad_tables_say_what_is_wrong() {
        for (text, says) in [
            (
                "listen = \"127.0.0.1:9000\"",
                "write `{ tls = \"127.0.0.1:9000\" }`",
            ),
            (
                "listen = { tcp = \"127.0.0.1:9000\" }",
                "unknown endpoint `tcp`",
            ),
            (
                "listen = { tls = \"localhost:9000\" }",
                "`tls` address `localhost:9000`",
            ),
            ("listen = { tls = 9000 }", "expected a string"),
        ] {
            let err = toml::from_str::<File>(text).unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}

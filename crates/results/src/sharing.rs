//! What a web client's circuit shares with the bulk clients' circuits of
//! its repetition (seed 001's loaded toy): a relay pair, so a link
//! connection; only a relay; or nothing. From the clients' circuits the
//! lab records (`client_paths` of each repetition).

use std::collections::{BTreeMap, BTreeSet};

use onionlab_lab::labels::workloads_of_text;
use onionlab_lab::rundata::RunData;

/// A class of web clients by what their circuit shares with a bulk
/// client's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Sharing {
    /// A pair of adjacent relays: the same link connection (TLS or QUIC)
    /// between them.
    Connection,
    /// A relay (its links and CPU), but no pair of adjacent ones.
    Relay,
    /// No relay at all.
    Apart,
}

/// The class of `path` against the bulk circuits' `bulk` paths.
pub fn class_of(path: &[String], bulk: &[&Vec<String>]) -> Sharing {
    let pair = |p: &[String]| -> BTreeSet<(String, String)> {
        p.windows(2)
            .map(|w| {
                let (a, b) = (w[0].clone(), w[1].clone());
                if a <= b {
                    (a, b)
                } else {
                    (b, a)
                }
            })
            .collect()
    };
    let pairs: BTreeSet<(String, String)> = bulk.iter().flat_map(|b| pair(b)).collect();
    let relays: BTreeSet<&String> = bulk.iter().flat_map(|b| b.iter()).collect();
    if !pair(path).is_disjoint(&pairs) {
        Sharing::Connection
    } else if path.iter().any(|r| relays.contains(r)) {
        Sharing::Relay
    } else {
        Sharing::Apart
    }
}

/// Each web client's class, by (variant, repetition, workload).
pub type Classes = BTreeMap<(String, u32, String), Sharing>;

/// Per (variant, repetition, workload) of a web client with a recorded
/// path, its class; bulk clients are those of workloads of any kind but
/// `web`.
pub fn classes(data: &RunData) -> Classes {
    let workloads = workloads_of_text(&data.scenario_toml);
    let bulk_clients: BTreeSet<&str> = workloads
        .iter()
        .filter(|w| w.kind != "web")
        .map(|w| w.client.as_str())
        .collect();
    let mut out = BTreeMap::new();
    for r in &data.repetitions {
        let bulk: Vec<&Vec<String>> = r
            .client_paths
            .iter()
            .filter(|(c, _)| bulk_clients.contains(c.as_str()))
            .map(|(_, p)| p)
            .collect();
        for w in workloads.iter().filter(|w| w.kind == "web") {
            if let Some((_, path)) = r.client_paths.iter().find(|(c, _)| *c == w.client) {
                out.insert(
                    (r.variant.clone(), r.repetition, w.name.clone()),
                    class_of(path, &bulk),
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(hops: &str) -> Vec<String> {
        hops.split(',').map(str::to_string).collect()
    }

    #[test]
    fn a_shared_pair_is_a_connection_a_shared_relay_a_relay() {
        let bulk = [p("g1,m1,e1"), p("g2,m2,e2")];
        let bulk: Vec<&Vec<String>> = bulk.iter().collect();
        assert_eq!(class_of(&p("g3,m1,e1"), &bulk), Sharing::Connection);
        // The pair in the other order is the same connection.
        assert_eq!(class_of(&p("e1,m1,g3"), &bulk), Sharing::Connection);
        assert_eq!(class_of(&p("g1,m3,e3"), &bulk), Sharing::Relay);
        assert_eq!(class_of(&p("g3,m3,e3"), &bulk), Sharing::Apart);
    }
}

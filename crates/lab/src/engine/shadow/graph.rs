//! The lab's topology as Shadow's network graph (GML).
//!
//! One graph node per lab host, carrying the host's access links as
//! Shadow's host bandwidths, and a complete directed graph of edges, one
//! per ordered pair of hosts (self-loops included, as Shadow requires when
//! `network.use_shortest_path` is off), each carrying that path's latency
//! and loss. So every path between two hosts is exactly one edge, and what
//! the lab's emulator applies per path Shadow applies per edge.
//!
//! What Shadow has no model for is refused with an error naming the path
//! and the property, never approximated: per-path bottlenecks (Shadow
//! limits hosts only), jitter (its `jitter` attribute is reserved and does
//! nothing), reordering, bursty (Gilbert-Elliott) loss, cut or filtered
//! paths. What Shadow does its own way is returned as notes: latencies
//! under one round of its scheduler, and queue limits (Shadow's hosts
//! queue by their bandwidth, its routers with CoDel).
//!
//! Written by hand: GML is a few lines of `key value` pairs here, and no
//! maintained crate writes it.

use std::fmt::Write as _;
use std::time::Duration;

use onionlab_netem::{LinkSpec, LossModel, PathSpec, QueueLimit, Rate, Topology};

use crate::error::{Error, Result};

/// Shadow's bandwidth where the lab's link is unlimited: 10 Gbit/s, far
/// above anything the lab's emulator carries on one machine.
pub const UNLIMITED_BPS: u64 = 10_000_000_000;

/// The shortest edge latency written: Shadow's default runahead (the
/// length of one scheduling round, `experimental.runahead`). A packet
/// between two hosts is not delivered within the round it was sent in, so
/// a shorter latency would not be kept anyway, and a shorter runahead
/// makes every round, and so the whole simulation, slower.
pub const MIN_LATENCY: Duration = Duration::from_millis(1);

/// A network graph and what it does differently from the lab's emulator.
#[derive(Debug, Clone, PartialEq)]
pub struct Graph {
    /// The GML text.
    pub gml: String,
    /// What Shadow will do its own way (one line each).
    pub notes: Vec<String>,
}

/// The graph of `topology`: node `i` is host `i`, edge `(i, j)` the path
/// from host `i` to host `j`.
///
/// # Errors
///
/// [`Error::Shadow`] naming the first path with a property Shadow cannot
/// model.
pub fn graph(topology: &Topology) -> Result<Graph> {
    let mut gml = String::from("graph [\n  directed 1\n");
    let mut raised = 0usize;
    let mut queues = false;
    for (i, h) in topology.hosts.iter().enumerate() {
        queues |=
            h.uplink.queue != QueueLimit::default() || h.downlink.queue != QueueLimit::default();
        let _ = write!(
            gml,
            "  node [\n    id {i}\n    label \"{}\"\n    host_bandwidth_up \"{}\"\n    host_bandwidth_down \"{}\"\n  ]\n",
            h.name,
            bandwidth(h.uplink.rate),
            bandwidth(h.downlink.rate),
        );
    }
    for (i, src) in topology.hosts.iter().enumerate() {
        for (j, dst) in topology.hosts.iter().enumerate() {
            let path = topology.path(i, j);
            // A host's own traffic never crosses the emulator: its
            // self-loop, which Shadow requires, gets the shortest latency
            // and no loss.
            let (latency, loss) = if i == j {
                (MIN_LATENCY, 0.0)
            } else {
                check_path(path, &src.name, &dst.name)?;
                raised += usize::from(path.latency < MIN_LATENCY);
                (
                    path.latency.max(MIN_LATENCY),
                    loss_rate(path, &src.name, &dst.name)?,
                )
            };
            let _ = write!(
                gml,
                "  edge [\n    source {i}\n    target {j}\n    label \"{} to {}\"\n    latency \"{} ns\"\n    packet_loss {loss:.9}\n  ]\n",
                src.name,
                dst.name,
                latency.as_nanos(),
            );
        }
    }
    gml.push_str("]\n");
    let mut notes = Vec::new();
    if raised > 0 {
        notes.push(format!(
            "{raised} paths with less than {} ms of latency get {} ms (one round of Shadow's scheduler)",
            MIN_LATENCY.as_millis(),
            MIN_LATENCY.as_millis()
        ));
    }
    if queues
        || topology
            .overrides
            .values()
            .any(|p| p.bottleneck.queue != QueueLimit::default())
    {
        notes.push(
            "queue limits are not Shadow's to set: its hosts queue by their bandwidth, its routers with CoDel"
                .into(),
        );
    }
    if topology
        .hosts
        .iter()
        .any(|h| unlimited(h.uplink) || unlimited(h.downlink))
    {
        notes.push(format!(
            "unlimited access links get {} Gbit/s (Shadow needs a bandwidth)",
            UNLIMITED_BPS / 1_000_000_000
        ));
    }
    Ok(Graph { gml, notes })
}

fn unlimited(link: LinkSpec) -> bool {
    link.rate.0.is_none()
}

/// Shadow's bandwidth string of a rate.
fn bandwidth(rate: Rate) -> String {
    format!("{} bit", rate.0.unwrap_or(UNLIMITED_BPS))
}

/// Refuses what Shadow cannot model on the path from `src` to `dst`.
fn check_path(path: &PathSpec, src: &str, dst: &str) -> Result<()> {
    let refuse = |what: &str| {
        Err(Error::Shadow(format!(
            "the path from {src} to {dst} has {what}, which Shadow cannot model"
        )))
    };
    if path.bottleneck.rate.0.is_some() {
        return refuse("a bottleneck of its own (Shadow limits hosts' bandwidth only)");
    }
    if !path.jitter.is_zero() {
        return refuse("jitter (Shadow's jitter attribute is reserved and does nothing)");
    }
    if path.reorder > 0.0 {
        return refuse("reordering");
    }
    if !path.up {
        return refuse("no connection (cut)");
    }
    if path.block != onionlab_netem::Block::NONE {
        return refuse("protocols blocked");
    }
    Ok(())
}

/// The path's loss as Shadow's independent per-packet loss.
fn loss_rate(path: &PathSpec, src: &str, dst: &str) -> Result<f64> {
    match path.loss {
        LossModel::None => Ok(0.0),
        LossModel::Bernoulli { rate } => Ok(rate),
        LossModel::GilbertElliott { .. } => Err(Error::Shadow(format!(
            "the path from {src} to {dst} has bursty (Gilbert-Elliott) loss; Shadow's loss is \
             independent per packet"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topology(text: &str) -> Topology {
        Topology::from_toml_str(text, "test").expect("a valid topology")
    }

    const TWO: &str = r#"
        name = "two"
        [[host]]
        name = "a"
        up = "10Mbit"
        down = "20Mbit"
        [[host]]
        name = "b"
        [[link]]
        a = "a"
        b = "b"
        latency = "30ms"
        loss = "1%"
    "#;

    #[test]
    fn every_pair_is_one_edge_with_its_latency_and_loss() {
        let g = graph(&topology(TWO)).unwrap();
        assert_eq!(g.gml.matches("  node [").count(), 2);
        assert_eq!(
            g.gml.matches("  edge [").count(),
            4,
            "complete, self-loops included"
        );
        assert!(g.gml.contains("host_bandwidth_up \"10000000 bit\""));
        assert!(g.gml.contains("host_bandwidth_down \"20000000 bit\""));
        let ab = g.gml.split("label \"a to b\"").nth(1).unwrap();
        assert!(ab.starts_with("\n    latency \"30000000 ns\"\n    packet_loss 0.010000000"));
        let aa = g.gml.split("label \"a to a\"").nth(1).unwrap();
        assert!(aa.starts_with("\n    latency \"1000000 ns\"\n    packet_loss 0.000000000"));
        assert!(g.notes.iter().any(|n| n.contains("unlimited access links")));
    }

    #[test]
    fn what_shadow_cannot_model_is_refused_by_name() {
        let jitter = TWO.replace("loss = \"1%\"", "jitter = \"5ms\"");
        let e = graph(&topology(&jitter)).unwrap_err().to_string();
        assert!(e.contains("from a to b") && e.contains("jitter"), "{e}");
        let bursty = TWO.replace("loss = \"1%\"", "loss = \"ge:1%:4\"");
        let e = graph(&topology(&bursty)).unwrap_err().to_string();
        assert!(e.contains("Gilbert-Elliott"), "{e}");
    }
}

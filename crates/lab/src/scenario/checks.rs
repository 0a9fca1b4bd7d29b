//! Checks of a scenario as a whole: its matrix, `[[exclude]]` entries,
//! and what every variant must fit (legs, C tor's limits, link settings).

use std::collections::{BTreeMap, HashMap, HashSet};

use onionlab_circuit::relay::ExitPackaging;
use onionlab_transport::datagram::tunnel::EndToEnd;
use onionlab_transport::{Choice as TransportChoice, TransportKind};
use toml::Spanned;

use super::{Ctx, RelaySpec, Scenario};
use crate::error::{Error, Result};
use crate::labels::{combinations, value_text};
use crate::matrix;
use crate::variant::{Implementation, Variant};

/// The raw `[matrix]` table: each key with its values.
pub(super) type RawMatrix = BTreeMap<String, Spanned<Vec<Spanned<toml::Value>>>>;

/// The `[matrix]`: every key a parameter naming known hosts, every value
/// valid for it and listed once (`clients` at most the scenario's
/// `clients`), so a typo fails before any run.
pub(super) fn check_matrix(
    ctx: &Ctx<'_>,
    raw: &RawMatrix,
    hosts: &HashSet<&str>,
    clients: usize,
) -> Result<Vec<(String, Vec<String>)>> {
    let mut out = Vec::new();
    for (key, values) in raw {
        if values.get_ref().is_empty() {
            return Err(ctx.err(values.span(), format!("matrix {key:?} has no values")));
        }
        let texts: Vec<String> = values
            .get_ref()
            .iter()
            .map(|v| value_text(v.get_ref()))
            .collect();
        for (i, (v, text)) in values.get_ref().iter().zip(&texts).enumerate() {
            if texts[..i].contains(text) {
                return Err(ctx.err(v.span(), format!("matrix {key:?} lists {text:?} twice")));
            }
            if key == "clients" {
                check_client_count(text, clients).map_err(|m| ctx.err(v.span(), m))?;
            }
            matrix::check_value(key, text, hosts).map_err(|m| ctx.err(v.span(), m))?;
        }
        out.push((key.clone(), texts));
    }
    if let Some((key, values)) = raw
        .iter()
        .find(|(k, _)| matrix::check_key(k, hosts).is_err())
    {
        let why = matrix::check_key(key, hosts).err().unwrap_or_default();
        return Err(ctx.err(values.span(), why));
    }
    Ok(out)
}

/// A `clients` matrix value: how many of the scenario's `total` clients
/// (the first ones, in file order) run.
fn check_client_count(value: &str, total: usize) -> std::result::Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if (1..=total).contains(&n) => Ok(n),
        _ => Err(format!(
            "clients = {value:?}: a number of clients from 1 to {total} (the [[client]] entries, first ones first)"
        )),
    }
}

/// Whether `combo` matches every pair of one of `exclude`'s entries.
pub(super) fn excluded(combo: &[(String, String)], exclude: &[Vec<(String, String)>]) -> bool {
    exclude
        .iter()
        .any(|e| e.iter().all(|pair| combo.contains(pair)))
}

/// `[[exclude]]` entries as (key, value text) pairs: every key a matrix
/// parameter, every value one of its values, and some variant left.
pub(super) fn check_exclude(
    ctx: &Ctx<'_>,
    raw: &[Spanned<BTreeMap<String, toml::Value>>],
    matrix: &[(String, Vec<String>)],
) -> Result<Vec<Vec<(String, String)>>> {
    let mut out = Vec::new();
    for entry in raw {
        if entry.get_ref().is_empty() {
            return Err(ctx.err(
                entry.span(),
                "an empty [[exclude]] would exclude everything",
            ));
        }
        let mut pairs = Vec::new();
        for (key, value) in entry.get_ref() {
            let text = value_text(value);
            let Some((_, values)) = matrix.iter().find(|(k, _)| k == key) else {
                return Err(ctx.err(
                    entry.span(),
                    format!("[[exclude]] names {key:?}, which is not a matrix parameter"),
                ));
            };
            if !values.contains(&text) {
                return Err(ctx.err(
                    entry.span(),
                    format!("[[exclude]]: {text:?} is not one of the matrix's values of {key:?}"),
                ));
            }
            pairs.push((key.clone(), text));
        }
        out.push(pairs);
    }
    if !raw.is_empty() && combinations(matrix).iter().all(|c| excluded(c, &out)) {
        return Err(ctx.err(raw[0].span(), "[[exclude]] leaves no variant to run"));
    }
    Ok(out)
}

impl Scenario {
    /// `end_to_end = "kernel"` only with the `datagram` transport: the
    /// others ignore it (a duplicate run), and MORE runs the user-space
    /// TCP only.
    pub(super) fn check_end_to_end(&self) -> std::result::Result<(), String> {
        let datagram = TransportChoice::Only(TransportKind::DATAGRAM);
        for v in self.variants() {
            if v.end_to_end == EndToEnd::Kernel && v.transport != datagram {
                return Err(format!(
                    "variant {:?}: end_to_end = \"kernel\" is the datagram transport's \
                     (mUDP-OR); leave the combination out with [[exclude]]",
                    v.label
                ));
            }
        }
        Ok(())
    }

    /// Every variant's `legs` fits: a client with pinned legs has at least
    /// that many, and a C tor variant with several legs is one C tor's
    /// conflux can run.
    pub(super) fn check_legs(&self) -> std::result::Result<(), String> {
        for v in self.variants() {
            if v.legs > 1 && v.implementation == Implementation::Ctor {
                self.check_ctor_conflux(&v)?;
            }
            for c in v.active_clients(&self.clients) {
                if v.legs > 1 && c.path.is_some() {
                    return Err(format!(
                        "variant {:?} asks for {} legs, but client {:?} pins one path: pin its \
                         legs with paths, or leave path out for random legs",
                        v.label, v.legs, c.name
                    ));
                }
                if v.legs > 1 && c.paths.is_none() {
                    // Random legs: distinct guards, and distinct middles
                    // among the relays that are neither those nor an exit.
                    let guards = self.relays.iter().filter(|r| r.guard && !r.exit).count();
                    let others = self.relays.iter().filter(|r| !r.exit).count();
                    if guards < v.legs || others < 2 * v.legs {
                        return Err(format!(
                            "variant {:?} asks for {} random legs for client {:?}: that needs {} \
                             guard relays and {} non-exit relays in all, and the scenario has \
                             {guards} and {others}",
                            v.label,
                            v.legs,
                            c.name,
                            v.legs,
                            2 * v.legs
                        ));
                    }
                }
                let pinned = c.paths.as_ref().map_or(0, Vec::len);
                if pinned > 0 && pinned < v.legs {
                    return Err(format!(
                        "variant {:?} asks for {} legs, but client {:?} pins only {pinned} \
                         (its paths)",
                        v.label, v.legs, c.name
                    ));
                }
            }
        }
        Ok(())
    }

    /// A C tor variant with `legs` above 1 runs C tor's conflux: its leg
    /// scheduler and circuit congestion control must be ones C tor has
    /// ([`crate::ctor::CtorConflux::of`]), and pinned legs must have
    /// distinct guards and distinct middles (C tor never puts two legs of
    /// a set through one guard or one middle, so shared ones would leave a
    /// leg unbuildable).
    fn check_ctor_conflux(&self, v: &Variant) -> std::result::Result<(), String> {
        crate::ctor::CtorConflux::of(v.legs, v.leg_scheduler, &v.circuit_cc).map_err(|why| {
            format!(
                "variant {:?}: {why} (leave the combination out with [[exclude]])",
                v.label
            )
        })?;
        for c in v.active_clients(&self.clients) {
            let Some(paths) = &c.paths else { continue };
            let legs = &paths[..v.legs.min(paths.len())];
            for hop in [0, 1] {
                let mut seen = HashSet::new();
                if let Some(dup) = legs
                    .iter()
                    .filter_map(|p| p.get(hop))
                    .find(|h| !seen.insert(*h))
                {
                    return Err(format!(
                        "variant {:?}: client {:?}'s legs share the {} {dup:?}, and C tor's \
                         conflux never builds two legs of a set through one",
                        v.label,
                        c.name,
                        if hop == 0 { "guard" } else { "middle" }
                    ));
                }
            }
        }
        Ok(())
    }

    /// C tor builds three-hop circuits: a pinned path (or conflux leg) of
    /// a C tor variant must name three relays (guard, middle, exit).
    pub(super) fn check_ctor(&self) -> std::result::Result<(), String> {
        // onionlab variants ignore ctor_scheduler: two that differ only in
        // it would run the same thing twice.
        let mut onionlab: HashMap<Vec<(String, String)>, String> = HashMap::new();
        for v in self.variants() {
            if v.implementation != Implementation::Ctor {
                let rest: Vec<_> = v
                    .params
                    .iter()
                    .filter(|(k, _)| k != "ctor_scheduler")
                    .cloned()
                    .collect();
                if let Some(other) = onionlab.insert(rest, v.label.clone()) {
                    return Err(format!(
                        "variants {other:?} and {:?} differ only in ctor_scheduler, which \
                         onionlab's transports ignore: leave one out with [[exclude]]",
                        v.label
                    ));
                }
                continue;
            }
            let sets_packaging = v.params.iter().any(|(k, _)| k == "exit_packaging");
            if sets_packaging && v.exit_packaging != ExitPackaging::Eager {
                return Err(format!(
                    "variant {:?}: C tor's exits package eagerly (its exit_packaging is \
                     \"eager\"): leave the combination out with [[exclude]]",
                    v.label
                ));
            }
            if v.tcp_pacing {
                return Err(format!(
                    "variant {:?}: tcp_pacing is onionlab's setting (C tor's sockets are not \
                     paced unless the kernel's qdisc does it): leave the combination out with \
                     [[exclude]]",
                    v.label
                ));
            }
            if v.scheduler == "round-robin" {
                return Err(format!(
                    "variant {:?}: C tor cannot schedule circuits round robin (since 0.4.x it \
                     raises CircuitPriorityHalflife 0 to its 30 s default, EWMA): leave the \
                     combination out with [[exclude]]",
                    v.label
                ));
            }
            for c in v.active_clients(&self.clients) {
                // Its pinned path, or with conflux every pinned leg it uses.
                let paths: Vec<&Vec<String>> = match (&c.paths, v.legs > 1) {
                    (Some(legs), true) => legs.iter().take(v.legs).collect(),
                    _ => c.first_path().into_iter().collect(),
                };
                for path in paths {
                    if path.len() != 3 {
                        return Err(format!(
                        "client {:?} has a {}-hop path, and C tor (variant {:?}) builds three-hop \
                         circuits: give it three relays, or leave the combination out with \
                         [[exclude]]",
                        c.name,
                        path.len(),
                        v.label
                    ));
                    }
                    // C tor takes only Guard relays first and Exit relays last,
                    // and the lab's authority votes those flags by role.
                    let role = |host: &str, f: fn(&RelaySpec) -> bool| {
                        self.relays.iter().any(|r| r.host == host && f(r))
                    };
                    if !role(&path[0], |r| r.guard) || !role(&path[2], |r| r.exit) {
                        return Err(format!(
                        "client {:?}'s path must start at a `guard = true` relay and end at an \
                         `exit = true` relay for C tor (variant {:?}), which takes only Guard \
                         and Exit relays there",
                        c.name, v.label
                    ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The `[link]` section the lab writes for every variant and node
    /// ([`Variant::link_settings`]) must be valid: congestion control
    /// every transport in use has (dtls-utcp's smoltcp lanes have only
    /// Cubic and Reno), settings in range.
    pub(super) fn check_links(&self) -> std::result::Result<(), String> {
        let hosts: Vec<&str> = self
            .relays
            .iter()
            .map(|r| r.host.as_str())
            .chain(self.clients.iter().map(|c| c.host.as_str()))
            .collect();
        for v in self.variants() {
            for host in &hosts {
                v.link_settings(host).map_err(|e| {
                    // The transport's own error, without the run's prefix.
                    let why = match e {
                        Error::Link(e) => e.to_string(),
                        other => other.to_string(),
                    };
                    format!(
                        "the [link] settings of {host} in variant {:?}: {why}: leave the \
                         combination out with [[exclude]]",
                        v.label
                    )
                })?;
            }
        }
        Ok(())
    }
}

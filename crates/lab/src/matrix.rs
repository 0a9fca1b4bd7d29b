//! The matrix's parameters, in one table ([`PARAMS`]): each one's name,
//! what its key may name after a colon, how a value is checked, what a
//! value changes in a variant, and its short name in variant labels.
//!
//! The scenario reader checks keys and values here, variants are resolved
//! here, labels shorten names from here, and a test holds the table of
//! docs/lab.md to it.

use std::collections::HashSet;

use onionlab_circuit::conflux::sched::LegSchedulerKind;
use onionlab_circuit::relay::ExitPackaging;
use onionlab_netem::units::parse_duration;
use onionlab_netem::{Block, HostUpdate, LossModel, PathUpdate, QueueLimit, Rate, Topology};
use onionlab_transport::datagram::tunnel::EndToEnd;
use onionlab_transport::registry::UnknownTransport;
use onionlab_transport::{Choice as TransportChoice, TransportKind};

use crate::variant::{Implementation, Variant};
use crate::workload::{parse_size, WorkloadKind};

/// QUIC congestion controls of the matrix's `congestion`
/// ([`onionlab_config::Congestion`]).
pub const CONGESTIONS: &[&str] = &["cubic", "newreno", "bbr"];
/// TCP congestion controls of the matrix's `tcp_congestion` (`system`:
/// the kernel's default, left alone).
pub const TCP_CONGESTIONS: &[&str] = &["cubic", "reno", "bbr", "system"];
/// Circuit-level flow controls of the matrix's `circuit_cc` (the network
/// document's `[params] circuit_cc`).
pub const CIRCUIT_CCS: &[&str] = &["fixed", "vegas"];
/// Circuit schedulers.
pub const SCHEDULERS: &[&str] = &["ewma", "round-robin"];
/// C tor's channel schedulers (its `Schedulers` option), for the matrix's
/// `ctor_scheduler`: KIST (tor's default on Linux) writes to a socket only
/// what TCP can send soon, every 10 ms; Vanilla writes as soon as cells
/// are queued.
pub const CTOR_SCHEDULERS: &[&str] = &["kist", "kistlite", "vanilla"];
/// The matrix's `transport` value that runs C tor instead of onionlab.
pub const CTOR: &str = "ctor";
/// Values of the switches (`slow_start_after_idle`, `tcp_pacing`,
/// `cubic_hystart`).
const ON_OFF: &[&str] = &["on", "off"];
/// Most legs of a set ([`onionlab_config::MAX_LEGS`]).
pub const MAX_LEGS: usize = onionlab_config::MAX_LEGS;

/// What a parameter's key may name after a colon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Nothing: the parameter sets the whole variant.
    Whole,
    /// `NAME:HOST[,HOST...]`: these hosts only; `NAME` alone: every host.
    Hosts,
    /// `NAME:A-B[,C-D...]`: these pairs, both directions; `NAME` alone:
    /// every path.
    Pairs,
}

/// How a value changes a variant: the variant, the key's part after the
/// colon (hosts or pairs, if any) and the value, checked before.
type Apply = fn(&mut Variant, Option<&str>, &str) -> Result<(), String>;

/// One matrix parameter.
#[derive(Debug)]
pub struct Param {
    /// Its name: the key, before any colon.
    pub name: &'static str,
    /// What its key may name after a colon.
    pub scope: Scope,
    /// Its name in short variant labels (empty: the value alone says it,
    /// as `quic` does for a transport).
    pub short: &'static str,
    /// Checks one value; the error says which values are valid.
    check: fn(&str) -> Result<(), String>,
    /// Sets one value on a variant.
    apply: Apply,
}

/// One of `values`, or an error listing them.
fn one_of(what: &str, value: &str, values: &[&str]) -> Result<(), String> {
    if values.contains(&value) {
        Ok(())
    } else {
        Err(format!("unknown {what} {value:?} ({})", values.join(", ")))
    }
}

/// An `end_to_end` value: `user` or `kernel`.
fn parse_end_to_end(value: &str) -> Result<EndToEnd, String> {
    match value {
        "user" => Ok(EndToEnd::User),
        "kernel" => Ok(EndToEnd::Kernel),
        _ => Err(format!(
            "unknown end_to_end {value:?} (user, kernel: the TCP a datagram variant runs end to end)"
        )),
    }
}

/// A `legs` value: 1 to [`MAX_LEGS`].
fn parse_legs(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if (1..=MAX_LEGS).contains(&n) => Ok(n),
        _ => Err(format!(
            "legs = {value:?}: circuits per multi-path set, 1 to {MAX_LEGS}"
        )),
    }
}

/// A `tcp_notsent_lowat` value: `kernel` (leave it) or a size from one
/// byte to 4 GiB (the kernel's own default is 4 GiB less one: no limit).
fn parse_notsent_lowat(value: &str) -> Result<Option<u64>, String> {
    if value == "kernel" {
        return Ok(None);
    }
    match parse_size(value) {
        Ok(n) if n <= u64::from(u32::MAX) => Ok(Some(n)),
        _ => Err(format!(
            "tcp_notsent_lowat = {value:?}: \"kernel\" or a size from 1 byte to 4 GiB"
        )),
    }
}

fn check_transport(value: &str) -> Result<(), String> {
    if value == CTOR {
        return Ok(());
    }
    value
        .parse::<TransportChoice>()
        .map(|_| ())
        .map_err(|e| format!("{e}, or {CTOR} (C tor)"))
}

fn apply_transport(v: &mut Variant, _: Option<&str>, value: &str) -> Result<(), String> {
    if value == CTOR {
        v.implementation = Implementation::Ctor;
        v.transport = TransportChoice::Only(TransportKind::TLS);
    } else {
        v.implementation = Implementation::Onionlab;
        v.transport = value.parse().map_err(|e: UnknownTransport| e.to_string())?;
    }
    Ok(())
}

/// A switch's value: `on` or `off`.
fn on_off(name: &str, value: &str) -> Result<(), String> {
    if ON_OFF.contains(&value) {
        Ok(())
    } else {
        Err(format!("{name} = {value:?}: on or off"))
    }
}

fn check_leg_scheduler(value: &str) -> Result<(), String> {
    LegSchedulerKind::parse(value).map(|_| ()).ok_or_else(|| {
        format!(
            "unknown leg scheduler {value:?} ({})",
            LegSchedulerKind::names()
        )
    })
}

fn check_exit_packaging(value: &str) -> Result<(), String> {
    ExitPackaging::parse(value).map(|_| ()).ok_or_else(|| {
        format!(
            "exit_packaging {value:?} is not one of {}",
            ExitPackaging::NAMES.join(", ")
        )
    })
}

/// A `clients` value: a positive count (the scenario checks it against
/// its `[[client]]` entries).
fn parse_clients(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "clients = {value:?}: a number of clients, 1 or more"
        )),
    }
}

fn apply_tcp_congestion(v: &mut Variant, hosts: Option<&str>, value: &str) -> Result<(), String> {
    match hosts {
        None => v.tcp_congestion = Some(value.into()),
        Some(list) => {
            for h in list.split(',') {
                v.tcp_congestion_hosts
                    .insert(h.trim().to_string(), value.into());
            }
        }
    }
    Ok(())
}

fn apply_rate(v: &mut Variant, hosts: Option<&str>, value: &str) -> Result<(), String> {
    let rate = Rate::parse(value).map_err(|e| e.to_string())?;
    let update = HostUpdate {
        up: Some(rate),
        down: Some(rate),
        ..HostUpdate::default()
    };
    update_hosts(&mut v.topology, hosts, &update)
}

fn apply_queue(v: &mut Variant, hosts: Option<&str>, value: &str) -> Result<(), String> {
    let queue = QueueLimit::parse(value).map_err(|e| e.to_string())?;
    let update = HostUpdate {
        up_queue: Some(queue),
        down_queue: Some(queue),
        ..HostUpdate::default()
    };
    update_hosts(&mut v.topology, hosts, &update)
}

fn apply_size(v: &mut Variant, _: Option<&str>, value: &str) -> Result<(), String> {
    let size = parse_size(value)?;
    let sized = |kind: WorkloadKind| {
        !matches!(
            kind,
            WorkloadKind::Probe | WorkloadKind::Stream | WorkloadKind::Trace
        )
    };
    for w in v.workloads.iter_mut().filter(|w| sized(w.kind)) {
        w.size = size;
    }
    Ok(())
}

fn apply_latency(v: &mut Variant, pairs: Option<&str>, value: &str) -> Result<(), String> {
    let update = PathUpdate {
        latency: Some(parse_duration(value).map_err(|e| e.to_string())?),
        ..PathUpdate::default()
    };
    update_paths(&mut v.topology, pairs, &update)
}

fn apply_loss(v: &mut Variant, pairs: Option<&str>, value: &str) -> Result<(), String> {
    let update = PathUpdate {
        loss: Some(LossModel::parse(value).map_err(|e| e.to_string())?),
        ..PathUpdate::default()
    };
    update_paths(&mut v.topology, pairs, &update)
}

fn apply_block(v: &mut Variant, pairs: Option<&str>, value: &str) -> Result<(), String> {
    let update = PathUpdate {
        block: Some(Block::parse(value).map_err(|e| e.to_string())?),
        ..PathUpdate::default()
    };
    update_paths(&mut v.topology, pairs, &update)
}

/// Every matrix parameter, in the order docs/lab.md lists them.
pub const PARAMS: &[Param] = &[
    Param {
        name: "transport",
        scope: Scope::Whole,
        short: "",
        check: check_transport,
        apply: apply_transport,
    },
    Param {
        name: "congestion",
        scope: Scope::Whole,
        short: "cc",
        check: |x| one_of("congestion control", x, CONGESTIONS),
        apply: |v, _, x| {
            v.congestion = x.into();
            Ok(())
        },
    },
    Param {
        name: "tcp_congestion",
        scope: Scope::Hosts,
        short: "tcp",
        check: |x| one_of("TCP congestion control", x, TCP_CONGESTIONS),
        apply: apply_tcp_congestion,
    },
    Param {
        name: "slow_start_after_idle",
        scope: Scope::Whole,
        short: "slow_start_after_idle",
        check: |x| on_off("slow_start_after_idle", x),
        apply: |v, _, x| {
            v.kernel_tcp.slow_start_after_idle = Some(x == "on");
            Ok(())
        },
    },
    Param {
        name: "tcp_notsent_lowat",
        scope: Scope::Whole,
        short: "tcp_notsent_lowat",
        check: |x| parse_notsent_lowat(x).map(|_| ()),
        apply: |v, _, x| {
            v.kernel_tcp.notsent_lowat = parse_notsent_lowat(x)?;
            Ok(())
        },
    },
    Param {
        name: "tcp_pacing",
        scope: Scope::Whole,
        short: "tcp_pacing",
        check: |x| on_off("tcp_pacing", x),
        apply: |v, _, x| {
            v.tcp_pacing = x == "on";
            Ok(())
        },
    },
    Param {
        name: "cubic_hystart",
        scope: Scope::Whole,
        short: "cubic_hystart",
        check: |x| on_off("cubic_hystart", x),
        apply: |v, _, x| {
            v.cubic_hystart = Some(x == "on");
            Ok(())
        },
    },
    Param {
        name: "scheduler",
        scope: Scope::Whole,
        short: "",
        check: |x| one_of("scheduler", x, SCHEDULERS),
        apply: |v, _, x| {
            v.scheduler = x.into();
            Ok(())
        },
    },
    Param {
        name: "circuit_cc",
        scope: Scope::Whole,
        short: "circuit cc",
        check: |x| one_of("circuit congestion control", x, CIRCUIT_CCS),
        apply: |v, _, x| {
            v.circuit_cc = x.into();
            Ok(())
        },
    },
    Param {
        name: "ctor_scheduler",
        scope: Scope::Whole,
        short: "tor sched",
        check: |x| one_of("C tor scheduler", x, CTOR_SCHEDULERS),
        apply: |v, _, x| {
            v.ctor_scheduler = Some(x.into());
            Ok(())
        },
    },
    Param {
        name: "exit_packaging",
        scope: Scope::Whole,
        short: "packaging",
        check: check_exit_packaging,
        apply: |v, _, x| {
            v.exit_packaging =
                ExitPackaging::parse(x).ok_or_else(|| format!("unknown exit_packaging {x:?}"))?;
            Ok(())
        },
    },
    Param {
        name: "legs",
        scope: Scope::Whole,
        short: "legs",
        check: |x| parse_legs(x).map(|_| ()),
        apply: |v, _, x| {
            v.legs = parse_legs(x)?;
            Ok(())
        },
    },
    Param {
        name: "leg_scheduler",
        scope: Scope::Whole,
        short: "leg_scheduler",
        check: check_leg_scheduler,
        apply: |v, _, x| {
            v.leg_scheduler =
                LegSchedulerKind::parse(x).ok_or_else(|| format!("unknown leg scheduler {x:?}"))?;
            Ok(())
        },
    },
    Param {
        name: "end_to_end",
        scope: Scope::Whole,
        short: "e2e",
        check: |x| parse_end_to_end(x).map(|_| ()),
        apply: |v, _, x| {
            v.end_to_end = parse_end_to_end(x)?;
            Ok(())
        },
    },
    Param {
        name: "size",
        scope: Scope::Whole,
        short: "size",
        check: |x| parse_size(x).map(|_| ()),
        apply: apply_size,
    },
    Param {
        name: "latency",
        scope: Scope::Pairs,
        short: "latency",
        check: |x| parse_duration(x).map(|_| ()).map_err(|e| e.to_string()),
        apply: apply_latency,
    },
    Param {
        name: "loss",
        scope: Scope::Pairs,
        short: "loss",
        check: |x| LossModel::parse(x).map(|_| ()).map_err(|e| e.to_string()),
        apply: apply_loss,
    },
    Param {
        name: "clients",
        scope: Scope::Whole,
        short: "clients",
        check: |x| parse_clients(x).map(|_| ()),
        apply: |v, _, x| {
            v.clients = Some(parse_clients(x)?);
            Ok(())
        },
    },
    Param {
        name: "rate",
        scope: Scope::Hosts,
        short: "rate",
        check: |x| Rate::parse(x).map(|_| ()).map_err(|e| e.to_string()),
        apply: apply_rate,
    },
    Param {
        name: "queue",
        scope: Scope::Hosts,
        short: "queue",
        check: |x| QueueLimit::parse(x).map(|_| ()).map_err(|e| e.to_string()),
        apply: apply_queue,
    },
    Param {
        name: "block",
        scope: Scope::Pairs,
        short: "block",
        check: |x| Block::parse(x).map(|_| ()).map_err(|e| e.to_string()),
        apply: apply_block,
    },
];

/// The parameter of a key (`NAME` or `NAME:...`), if any.
pub fn param(key: &str) -> Option<&'static Param> {
    let name = key.split_once(':').map_or(key, |(name, _)| name);
    PARAMS.iter().find(|p| p.name == name)
}

/// Every key form, for the error on an unknown key.
fn key_forms() -> String {
    let mut forms: Vec<String> = PARAMS.iter().map(|p| p.name.to_string()).collect();
    for p in PARAMS {
        match p.scope {
            Scope::Whole => {}
            Scope::Hosts => forms.push(format!("{}:HOST", p.name)),
            Scope::Pairs => forms.push(format!("{}:A-B", p.name)),
        }
    }
    forms.join(", ")
}

/// Checks a matrix key: a parameter's name, and after a colon only what
/// its [`Scope`] allows, naming hosts of the topology.
pub fn check_key(key: &str, hosts: &HashSet<&str>) -> Result<&'static Param, String> {
    let Some(param) = param(key) else {
        return Err(format!(
            "unknown matrix parameter {key:?} ({})",
            key_forms()
        ));
    };
    let Some((_, list)) = key.split_once(':') else {
        return Ok(param);
    };
    let known = |h: &str| {
        if hosts.contains(h) {
            Ok(())
        } else {
            Err(format!("matrix key {key:?}: unknown host {h:?}"))
        }
    };
    match param.scope {
        Scope::Whole => Err(format!(
            "matrix key {key:?}: {} takes no hosts or pairs after a colon",
            param.name
        )),
        Scope::Hosts => {
            for h in list.split(',') {
                known(h.trim())?;
            }
            Ok(param)
        }
        Scope::Pairs => {
            for pair in list.split(',') {
                let (a, b) = pair.trim().split_once('-').ok_or_else(|| {
                    format!("matrix key {key:?}: write pairs as HOST-HOST[,HOST-HOST...]")
                })?;
                known(a)?;
                known(b)?;
            }
            Ok(param)
        }
    }
}

/// Checks a matrix key and one of its values.
pub fn check_value(key: &str, value: &str, hosts: &HashSet<&str>) -> Result<(), String> {
    let param = check_key(key, hosts)?;
    (param.check)(value)
}

/// Sets `key = value` on a variant (both checked before).
pub fn apply(v: &mut Variant, key: &str, value: &str) -> Result<(), String> {
    let param = param(key).ok_or_else(|| format!("unknown parameter {key}"))?;
    let list = key.split_once(':').map(|(_, list)| list);
    (param.apply)(v, list, value)
}

/// The short name of a parameter in labels (`cc` for `congestion`); a
/// key of no parameter keeps its name.
pub fn short_name(name: &str) -> &str {
    param(name).map_or(name, |p| p.short)
}

/// Applies `update` to the access links of the hosts named in `list`
/// (comma-separated), or of every host when there is no list.
fn update_hosts(
    topology: &mut Topology,
    list: Option<&str>,
    update: &HostUpdate,
) -> Result<(), String> {
    match list {
        None => topology.hosts.iter_mut().for_each(|h| update.apply(h)),
        Some(list) => {
            for name in list.split(',').map(str::trim) {
                let id = topology.host_id(name).map_err(|e| e.to_string())?;
                update.apply(&mut topology.hosts[id]);
            }
        }
    }
    Ok(())
}

/// Applies `update` to the paths between the pairs of `list` (`A-B`,
/// comma-separated; both directions), or to every path when there is no
/// list.
fn update_paths(
    topology: &mut Topology,
    list: Option<&str>,
    update: &PathUpdate,
) -> Result<(), String> {
    let Some(pairs) = list else {
        update.apply(&mut topology.default_path);
        for spec in topology.overrides.values_mut() {
            update.apply(spec);
        }
        return Ok(());
    };
    for pair in pairs.split(',') {
        let (a, b) = pair.trim().split_once('-').ok_or("bad pair")?;
        let (a, b) = (
            topology.host_id(a).map_err(|e| e.to_string())?,
            topology.host_id(b).map_err(|e| e.to_string())?,
        );
        for (x, y) in [(a, b), (b, a)] {
            let mut spec = *topology.path(x, y);
            update.apply(&mut spec);
            topology.overrides.insert((x, y), spec);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first column of docs/lab.md's table of matrix parameters: each
    /// row's key forms (`rate`, `rate:HOST[,HOST...]`).
    fn documented_keys() -> Vec<Vec<String>> {
        let doc = include_str!("../../../docs/lab.md");
        let table = doc
            .split("Matrix parameters:")
            .nth(1)
            .expect("docs/lab.md has its table of matrix parameters");
        table
            .lines()
            .skip_while(|l| !l.starts_with("| key |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|row| {
                let key = row.split('|').nth(1).unwrap_or("");
                key.split('`')
                    .skip(1)
                    .step_by(2)
                    .map(str::to_string)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_docs_table_lists_every_parameter_with_its_scope_and_nothing_else() {
        let rows = documented_keys();
        let names: Vec<&str> = rows.iter().map(|forms| forms[0].as_str()).collect();
        let table: Vec<&str> = PARAMS.iter().map(|p| p.name).collect();
        assert_eq!(names, table, "docs/lab.md's rows against PARAMS, in order");
        for (forms, p) in rows.iter().zip(PARAMS) {
            let scoped = match p.scope {
                Scope::Whole => None,
                Scope::Hosts => Some(format!("{}:HOST[,HOST...]", p.name)),
                Scope::Pairs => Some(format!("{}:A-B[,C-D...]", p.name)),
            };
            let documented = forms.get(1).cloned();
            assert_eq!(documented, scoped, "{}'s key forms in docs/lab.md", p.name);
        }
    }

    #[test]
    fn keys_name_only_what_their_scope_allows() {
        let hosts: HashSet<&str> = ["a", "b", "c"].into_iter().collect();
        assert!(check_key("transport", &hosts).is_ok());
        assert!(check_key("rate:a,b", &hosts).is_ok());
        assert!(check_key("loss:a-b,b-c", &hosts).is_ok());
        let e = check_key("transport:a", &hosts).unwrap_err();
        assert!(e.contains("takes no hosts"), "{e}");
        let e = check_key("loss:a", &hosts).unwrap_err();
        assert!(e.contains("HOST-HOST"), "{e}");
        let e = check_key("rate:x", &hosts).unwrap_err();
        assert!(e.contains("unknown host \"x\""), "{e}");
        let e = check_key("speed", &hosts).unwrap_err();
        assert!(
            e.contains("unknown matrix parameter") && e.contains("latency:A-B"),
            "{e}"
        );
    }

    #[test]
    fn values_are_checked_by_their_parameter() {
        let hosts: HashSet<&str> = ["a", "b"].into_iter().collect();
        assert!(check_value("transport", CTOR, &hosts).is_ok());
        assert!(check_value("transport", "tls", &hosts).is_ok());
        assert!(check_value("transport", "carrier-pigeon", &hosts).is_err());
        assert!(check_value("congestion", "vegas", &hosts).is_err());
        assert!(check_value("tcp_pacing", "maybe", &hosts).is_err());
        assert!(check_value("tcp_notsent_lowat", "kernel", &hosts).is_ok());
        assert!(check_value("legs", "0", &hosts).is_err());
        assert!(check_value("clients", "0", &hosts).is_err());
        assert!(check_value("loss:a-b", "1%", &hosts).is_ok());
    }

    #[test]
    fn short_names_come_from_the_table() {
        assert_eq!(short_name("congestion"), "cc");
        assert_eq!(short_name("transport"), "");
        assert_eq!(short_name("rate:a,b"), "rate");
        assert_eq!(short_name("not-a-parameter"), "not-a-parameter");
    }
}

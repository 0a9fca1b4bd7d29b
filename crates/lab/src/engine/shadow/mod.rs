//! Shadow, the discrete-event network simulator (3.x, with its own TCP),
//! as the lab's engine for networks larger than one machine's namespaces.
//!
//! This module turns a [`Plan`] into Shadow's files (`onionlab lab
//! export-shadow`): the topology as Shadow's graph ([`graph()`]), the hosts
//! and processes as its configuration ([`config()`]). A variant is first
//! made into what Shadow can run ([`adapt_variant`]); what it cannot run
//! is refused by name, and what it runs its own way is returned as notes
//! to show the user, never changed silently. [`Shadow`] is the engine
//! (`onionlab lab run --engine shadow`): it writes those files for each
//! run, runs Shadow on them and reads the records and logs back.
//!
//! What Shadow's TCP means for the lab: it is Shadow's own implementation
//! (the legacy stack; the experimental one fails with tokio), with Reno
//! as its only congestion control, no Nagle, no pacing and none of
//! Linux's sysctls. So every host's TCP congestion control is set to Reno
//! (dtls-utcp's lanes imitate it too), Linux's other TCP settings are not
//! applied, and a matrix that varies them makes variants that differ only
//! in name (each of these a note).

pub mod config;
pub mod graph;
pub mod install;
mod run;

use std::fs;
use std::path::{Path, PathBuf};

use onionlab_transport::datagram::tunnel::EndToEnd;
use onionlab_transport::{Choice as TransportChoice, TransportKind};

pub use self::config::{config, shadow_seed, Schedule, ShadowOptions, SIMULATION_START_UNIX};
pub use self::graph::{graph, Graph};
pub use self::run::Shadow;
use crate::error::{io_err, Error, Result};
use crate::hostnet::KernelTcp;
use crate::plan::Plan;
use crate::scenario::Scenario;
use crate::variant::{Implementation, Variant};

/// The graph's file name, beside the configuration.
pub const GRAPH_FILE: &str = "network.gml";
/// The configuration's file name, in the repetition's directory.
pub const CONFIG_FILE: &str = "shadow.yaml";

/// Matrix parameters that set Linux's TCP, which Shadow does not run: two
/// of their values are one variant under Shadow.
const LINUX_TCP_PARAMETERS: [&str; 5] = [
    "tcp_congestion",
    "tcp_pacing",
    "slow_start_after_idle",
    "tcp_notsent_lowat",
    "cubic_hystart",
];

/// `variant` as Shadow can run it: every host's TCP congestion control
/// Reno (Shadow's only one) and Linux's other TCP settings unset, and
/// notes of what that changes.
///
/// # Errors
///
/// [`Error::Shadow`] for a C tor variant, or a datagram variant with
/// kernel sets.
pub fn adapt_variant(scenario: &Scenario, variant: &Variant) -> Result<(Variant, Vec<String>)> {
    if variant.implementation == Implementation::Ctor {
        return Err(Error::Shadow(format!(
            "variant {}: C tor variants do not run on the Shadow engine yet",
            variant.label
        )));
    }
    if variant.end_to_end == EndToEnd::Kernel
        && variant.transport == TransportChoice::Only(TransportKind::DATAGRAM)
    {
        return Err(Error::Shadow(format!(
            "variant {}: end_to_end = \"kernel\" needs TUN devices, which Shadow does not have",
            variant.label
        )));
    }
    let mut notes = Vec::new();
    let unapplied = [
        (
            variant.tcp_pacing,
            "tcp_pacing (Linux's pacing of TCP sockets)",
        ),
        (
            variant.kernel_tcp != KernelTcp::default(),
            "slow_start_after_idle or tcp_notsent_lowat (Linux sysctls)",
        ),
        (
            variant.cubic_hystart.is_some(),
            "cubic_hystart (Linux Cubic's HyStart)",
        ),
    ];
    for (_, what) in unapplied.iter().filter(|(set, _)| *set) {
        notes.push(format!(
            "{what} is not applied: Shadow's TCP has no such setting"
        ));
    }
    for (name, values) in &scenario.matrix {
        let base = name.split(':').next().unwrap_or(name);
        if LINUX_TCP_PARAMETERS.contains(&base) && values.len() > 1 {
            notes.push(format!(
                "the matrix varies {name}, a setting of Linux's TCP: its variants differ \
                 only in name under Shadow"
            ));
        }
    }
    if variant
        .workloads
        .iter()
        .any(|w| w.kind == crate::workload::WorkloadKind::Stream)
    {
        notes.push(
            "stream workloads: Shadow's TCP has no TCP_NOTSENT_LOWAT, so the workload \
             server's unsent bytes are not limited and on a loaded path a stream's end \
             arrives late (seed004-datagram's load streams all missed their timeout)"
                .into(),
        );
    }
    let mut algorithms: Vec<&str> = variant
        .topology
        .hosts
        .iter()
        .map(|h| variant.tcp_congestion_of(&h.name))
        .filter(|a| *a != "reno")
        .collect();
    algorithms.sort_unstable();
    algorithms.dedup();
    if !algorithms.is_empty() {
        notes.push(format!(
            "TCP congestion control {} becomes Reno, Shadow's only one (dtls-utcp's lanes \
             imitate it too); QUIC's is unchanged",
            algorithms.join(", ")
        ));
    }
    if scenario
        .matrix
        .iter()
        .any(|(name, values)| name == "congestion" && values.len() > 1)
    {
        notes
            .push("the matrix varies congestion: under Shadow it changes QUIC's, not TCP's".into());
    }
    let mut adapted = variant.clone();
    // Named, not `system`: dtls-utcp's lanes imitate a named algorithm,
    // and Shadow accepts Reno on its sockets.
    adapted.tcp_congestion = Some("reno".into());
    adapted.tcp_congestion_hosts.clear();
    adapted.tcp_pacing = false;
    adapted.kernel_tcp = KernelTcp::default();
    adapted.cubic_hystart = None;
    // quinn's own UDP I/O needs socket options and system calls Shadow
    // lacks: QUIC endpoints send and receive one datagram per call.
    set_table_value(
        &mut adapted.relay_settings,
        &["link", "quic", "udp_io"],
        toml::Value::String("plain".into()),
    );
    Ok((adapted, notes))
}

/// Sets `value` at the key path `path` of `table`, making the tables on
/// the way.
fn set_table_value(table: &mut toml::Table, path: &[&str], value: toml::Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut at = table;
    for key in parents {
        let entry = at
            .entry(key.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        let toml::Value::Table(next) = entry else {
            return;
        };
        at = next;
    }
    at.insert(last.to_string(), value);
}

/// One repetition of one variant, written for Shadow.
#[derive(Debug, Clone, PartialEq)]
pub struct Exported {
    /// The repetition's directory: the plan's files, the graph, the
    /// configuration.
    pub dir: PathBuf,
    /// The plan as exported (its network document valid from Shadow's
    /// start).
    pub plan: Plan,
    /// When the agents start and the simulation stops.
    pub schedule: Schedule,
    /// What Shadow does differently from the namespace engine.
    pub notes: Vec<String>,
}

/// The plan of repetition `rep` (seed `seed`) of `variant` as Shadow runs
/// it: the variant adapted ([`adapt_variant`]) and the network document
/// valid from Shadow's start; with the notes of what that changes.
///
/// # Errors
///
/// What [`adapt_variant`] and [`Plan::of`] refuse.
pub fn plan(
    scenario: &Scenario,
    variant: &Variant,
    (rep, seed): (u32, u64),
) -> Result<(Plan, Vec<String>)> {
    let (variant, notes) = adapt_variant(scenario, variant)?;
    let plan = Plan::of(scenario, &variant, (rep, seed), SIMULATION_START_UNIX)?;
    Ok((plan, notes))
}

/// Writes `plan` (made by [`plan()`]) into `dir` (absolute, new or empty):
/// the plan's files, [`GRAPH_FILE`] and [`CONFIG_FILE`]; returns its
/// schedule and the graph's notes. `shadow CONFIG_FILE` run in `dir` runs
/// it.
///
/// # Errors
///
/// What [`graph()`] and [`config()`] refuse; [`Error::Shadow`] if `dir`
/// holds files; [`Error::Io`] naming a file that cannot be written.
pub fn write(plan: &Plan, dir: &Path, opts: &ShadowOptions) -> Result<(Schedule, Vec<String>)> {
    let Graph { gml, notes } = graph(&plan.topology)?;
    let text = config(plan, dir, GRAPH_FILE, opts)?;
    let occupied = fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some());
    if occupied {
        return Err(Error::Shadow(format!(
            "{} is not empty (the export writes keys, and never over old ones)",
            dir.display()
        )));
    }
    fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
    plan.write_files(dir)?;
    for (name, text) in [(GRAPH_FILE, gml), (CONFIG_FILE, text)] {
        let path = dir.join(name);
        fs::write(&path, text).map_err(io_err(format!("writing {}", path.display())))?;
    }
    Ok((Schedule::of(plan), notes))
}

/// Writes repetition `rep` (seed `seed`) of `variant` into `dir` (absolute,
/// new or empty) for Shadow ([`plan()`], [`write()`]).
///
/// # Errors
///
/// What [`plan()`] and [`write()`] refuse.
pub fn export(
    scenario: &Scenario,
    variant: &Variant,
    (rep, seed): (u32, u64),
    dir: &Path,
    opts: &ShadowOptions,
) -> Result<Exported> {
    let (plan, mut notes) = plan(scenario, variant, (rep, seed))?;
    let (schedule, more) = write(&plan, dir, opts)?;
    notes.extend(more);
    Ok(Exported {
        dir: dir.to_path_buf(),
        schedule,
        plan,
        notes,
    })
}

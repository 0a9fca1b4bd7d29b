//! Shadow's configuration file of a plan: one Shadow host per lab host at
//! the lab's address, on its own graph node, running the plan's processes.
//!
//! Shadow starts processes at simulated times, not when the previous one
//! is ready, so the plan's start order becomes a schedule: servers, then
//! relays, then the clients one a second apart (the namespace engine starts
//! them one by one), then the agents. Shadow's clock starts at
//! [`SIMULATION_START_UNIX`], so the plan's network document must be valid
//! from then.
//!
//! The file is written as JSON, which YAML 1.2 (Shadow's format) contains,
//! after a comment header: no YAML writer is needed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::plan::{Plan, Role};

/// The Unix time at which Shadow's simulated clock starts
/// (2000-01-01T00:00:00Z).
pub const SIMULATION_START_UNIX: u64 = 946_684_800;

/// When the servers start.
const SERVERS_AT: Duration = Duration::from_secs(1);
/// When the relays start.
const RELAYS_AT: Duration = Duration::from_secs(2);
/// When the first client starts.
const CLIENTS_AT: Duration = Duration::from_secs(5);
/// Between two clients' starts.
const CLIENT_GAP: Duration = Duration::from_secs(1);
/// Between the last client's start and the agents'.
const AGENTS_AFTER: Duration = Duration::from_secs(10);

/// How Shadow runs the plan's processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowOptions {
    /// The onionlab binary every process runs (absolute: Shadow does not
    /// look paths up relative to where it was started).
    pub bin: PathBuf,
    /// Shadow's worker threads (0: Shadow's choice, one per core).
    pub parallelism: u32,
    /// The processes' log filter (`ONIONLAB_LOG`), if any.
    pub log: Option<String>,
}

/// When each role's processes start, and when the simulation stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// Each of the plan's processes' start, in the plan's order.
    pub starts: Vec<Duration>,
    /// The agents' start.
    pub agents_at: Duration,
    /// The simulation's end: the agents' start and the plan's workload
    /// deadline.
    pub stop_at: Duration,
}

/// Between two processes of one host that would start at the same time:
/// each starts at its own time, so the order of their process ids (and of
/// their output files) is the plan's.
const SAME_HOST_GAP: Duration = Duration::from_millis(1);

impl Schedule {
    /// The schedule of `plan`.
    pub fn of(plan: &Plan) -> Schedule {
        let clients = plan.processes_of(Role::Client).count() as u32;
        let agents_at = CLIENTS_AT + CLIENT_GAP * clients.saturating_sub(1) + AGENTS_AFTER;
        let mut starts: Vec<Duration> = Vec::with_capacity(plan.processes.len());
        let mut client = 0u32;
        let mut same: HashMap<(&str, Role), u32> = HashMap::new();
        for p in &plan.processes {
            let mut start = match p.role {
                Role::Server => SERVERS_AT,
                Role::Relay => RELAYS_AT,
                Role::Client => {
                    client += 1;
                    CLIENTS_AT + CLIENT_GAP * (client - 1)
                }
                Role::Agent => agents_at,
            };
            let earlier_same = same.entry((p.host.as_str(), p.role)).or_default();
            if p.role != Role::Client {
                start += SAME_HOST_GAP * *earlier_same;
            }
            *earlier_same += 1;
            starts.push(start);
        }
        let last = starts.iter().copied().max().unwrap_or(agents_at);
        Schedule {
            stop_at: last.max(agents_at) + plan.workload_deadline,
            starts,
            agents_at,
        }
    }

    /// The plan's processes on `host` in the order Shadow starts them
    /// (their process ids rise in this order), as indices into the plan's
    /// processes.
    pub fn start_order(&self, plan: &Plan, host: &str) -> Vec<usize> {
        let mut order: Vec<usize> = (0..plan.processes.len())
            .filter(|&i| plan.processes[i].host == host)
            .collect();
        order.sort_by_key(|&i| (self.starts[i], i));
        order
    }
}

/// The seed Shadow runs a plan of seed `seed` with: Shadow's seed is 32
/// bits, so the low 32 bits of the repetition's.
pub fn shadow_seed(seed: u64) -> u64 {
    seed & u64::from(u32::MAX)
}

/// Shadow's configuration of `plan`, whose files are in `dir` (absolute)
/// and whose graph is in `graph_file` (relative to the configuration's
/// directory or absolute).
///
/// # Errors
///
/// [`Error::Shadow`] for a host name Shadow refuses, a relative `dir` or
/// binary, or a plan with a C tor network.
pub fn config(plan: &Plan, dir: &Path, graph_file: &str, opts: &ShadowOptions) -> Result<String> {
    if !dir.is_absolute() || !opts.bin.is_absolute() {
        return Err(Error::Shadow(format!(
            "the run directory ({}) and the binary ({}) must be absolute paths",
            dir.display(),
            opts.bin.display()
        )));
    }
    if plan.ctor.is_some() {
        return Err(Error::Shadow(
            "C tor variants do not run on the Shadow engine yet".into(),
        ));
    }
    let schedule = Schedule::of(plan);
    let mut hosts = Map::new();
    for (id, h) in plan.topology.hosts.iter().enumerate() {
        check_host_name(&h.name)?;
        hosts.insert(
            h.name.clone(),
            json!({
                "network_node_id": id,
                "ip_addr": h.address.to_string(),
                "processes": processes(plan, &h.name, dir, opts, &schedule),
            }),
        );
    }
    let config = json!({
        "general": {
            "stop_time": seconds(schedule.stop_at),
            "seed": shadow_seed(plan.seed),
            "parallelism": opts.parallelism,
            "data_directory": dir.join("shadow.data").to_string_lossy(),
            "model_unblocked_syscall_latency": true,
            "heartbeat_interval": "60 sec",
        },
        "network": {
            "graph": { "type": "gml", "file": { "path": graph_file } },
            "use_shortest_path": false,
        },
        "experimental": { "use_new_tcp": false },
        "hosts": hosts,
    });
    let body = serde_json::to_string_pretty(&config)
        .map_err(|e| Error::Shadow(format!("writing the configuration: {e}")))?;
    Ok(format!(
        "# Shadow configuration of {} ({}), repetition {}, written by `onionlab lab \
         export-shadow`.\n# JSON is YAML 1.2; run with `shadow shadow.yaml` from this \
         directory.\n{body}\n",
        plan.scenario, plan.variant, plan.repetition
    ))
}

/// The processes of `host`, each started at its time in `s`.
fn processes(
    plan: &Plan,
    host: &str,
    dir: &Path,
    opts: &ShadowOptions,
    s: &Schedule,
) -> Vec<Value> {
    let mut out = Vec::new();
    for (p, start) in plan.processes.iter().zip(&s.starts) {
        if p.host != host {
            continue;
        }
        let mut args = vec!["-C".to_string(), dir.to_string_lossy().into_owned()];
        args.extend(p.args.iter().cloned());
        let mut environment = Map::new();
        if let Some(log) = &opts.log {
            environment.insert("ONIONLAB_LOG".into(), Value::String(log.clone()));
        }
        // The agents end by themselves; the rest run until the end.
        let final_state = match p.role {
            Role::Agent => json!({ "exited": 0 }),
            _ => json!("running"),
        };
        out.push(json!({
            "path": opts.bin.to_string_lossy(),
            "args": args,
            "environment": environment,
            "start_time": seconds(*start),
            "expected_final_state": final_state,
        }));
    }
    out
}

/// A duration as Shadow's time string, in milliseconds.
fn seconds(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// Shadow's host names follow hostname(7): lowercase letters, digits,
/// hyphens and dots, not starting with a hyphen.
pub(super) fn check_host_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::Shadow(format!(
            "host {name:?}: Shadow's host names are lowercase letters, digits, hyphens and dots"
        )))
    }
}

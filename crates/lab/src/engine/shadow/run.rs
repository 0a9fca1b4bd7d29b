//! The Shadow engine: each run's plan written as a Shadow simulation
//! ([`super::write()`]) in the repetition's directory, Shadow run on it,
//! and the records and logs read back into the forms a namespace run
//! leaves.
//!
//! What it measures differs from the namespace engine's where Shadow has
//! nothing to read: no emulator or link counters (no wire overhead), no
//! Linux TCP counters or host drops, no relay CPU time or memory (Shadow
//! runs the processes natively but models no CPU time). The run's clock
//! is simulated, so the machine's load cannot skew its timings and a run
//! is never flagged as saturated.
//!
//! Shadow's logs: each process's standard error is
//! `shadow.data/hosts/HOST/EXE.PID.stderr` (EXE: the binary's file name),
//! with process ids rising
//! in start order on each host ([`Schedule::start_order`]); they are moved
//! to the plan's log names, where the namespace engine writes them.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use super::install::installed_shadow;
use super::{adapt_variant, graph, shadow_seed, write, Schedule, ShadowOptions};
use crate::engine::measure::{agent_records, client_paths, torchestra_moves, Observed};
use crate::engine::{measure, Engine, EngineId, Measured, RunHooks, SHADOW};
use crate::error::{io_err, Error, Result};
use crate::hostnet::HostTcp;
use crate::plan::{Plan, Role};
use crate::process::die_with_parent;
use crate::run::SimulationCost;
use crate::scenario::Scenario;
use crate::variant::Variant;

/// Shadow's output (its log on standard output, and standard error), in
/// the repetition's directory.
pub const SHADOW_LOG: &str = "shadow.log";

/// Wall time any simulation may take besides [`WALL_PER_SIMULATED`].
const WALL_BASE: Duration = Duration::from_secs(600);
/// Wall seconds a simulated second may take before the run is given up
/// (a process spinning without system calls stops Shadow's clock).
const WALL_PER_SIMULATED: u32 = 20;
/// Lines of a log quoted in an error.
const QUOTED_LINES: usize = 15;

/// Runs plans in the Shadow simulator (3.x, built from the vendored
/// source: `../shared/vendor/shadow/build.sh`).
#[derive(Debug, Clone)]
pub struct Shadow {
    /// The `shadow` binary.
    pub shadow: PathBuf,
    /// Its version (`shadow --version`'s first line).
    pub version: String,
    /// How Shadow runs the plan's processes.
    pub opts: ShadowOptions,
}

impl Shadow {
    /// The engine with the `shadow` binary `path`, or else the first of
    /// `shadow` on `PATH` and `~/.local/bin/shadow` (where the vendored
    /// build installs it); asks it its version.
    ///
    /// # Errors
    ///
    /// [`Error::Shadow`] if no binary is found or it does not run.
    pub fn new(path: Option<PathBuf>, opts: ShadowOptions) -> Result<Shadow> {
        let shadow = match path {
            Some(p) => p,
            None => installed_shadow().ok_or_else(|| {
                Error::Shadow(
                    "no `shadow` binary on PATH or in ~/.local/bin (build it with \
                     `bash ../shared/vendor/shadow/build.sh`, or give --shadow PATH)"
                        .into(),
                )
            })?,
        };
        let out = Command::new(&shadow)
            .arg("--version")
            .output()
            .map_err(|e| Error::Shadow(format!("running {} --version: {e}", shadow.display())))?;
        let version = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        if !out.status.success() || version.is_empty() {
            return Err(Error::Shadow(format!(
                "{} --version failed ({}): is it Shadow?",
                shadow.display(),
                out.status
            )));
        }
        Ok(Shadow {
            shadow,
            version,
            opts,
        })
    }

    /// The name Shadow gives the processes' executable in its file and
    /// process names: the file name of the binary's canonical path.
    fn exe_name(&self) -> String {
        let bin = fs::canonicalize(&self.opts.bin).unwrap_or_else(|_| self.opts.bin.clone());
        bin.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Runs Shadow on the configuration in `dir` until it exits, at most
    /// `wall_limit`; its output goes to [`SHADOW_LOG`].
    fn simulate(
        &self,
        dir: &Path,
        wall_limit: Duration,
        hooks: &RunHooks,
    ) -> Result<(ExitStatus, MemoryPeak)> {
        let log_path = dir.join(SHADOW_LOG);
        let log = fs::File::create(&log_path)
            .map_err(io_err(format!("creating {}", log_path.display())))?;
        let err = log
            .try_clone()
            .map_err(io_err(format!("opening {}", log_path.display())))?;
        let mut cmd = Command::new(&self.shadow);
        cmd.args(["--progress", "false", super::CONFIG_FILE])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            // Its own group, so that its processes go with it.
            .process_group(0);
        die_with_parent(&mut cmd, Signal::SIGKILL);
        let mut child = cmd
            .spawn()
            .map_err(|e| Error::Shadow(format!("starting {}: {e}", self.shadow.display())))?;
        let group = Pid::from_raw(child.id() as i32);
        let deadline = Instant::now() + wall_limit;
        let mut memory = MemoryPeak::start();
        loop {
            memory.sample();
            let waited = child.try_wait();
            if let Ok(Some(status)) = waited {
                return Ok((status, memory));
            }
            let give_up = if let Err(e) = waited {
                Some(io_err("waiting for Shadow")(e))
            } else if (hooks.interrupted)() {
                Some(Error::Interrupted)
            } else if Instant::now() > deadline {
                Some(Error::Shadow(format!(
                    "the simulation did not end within {} s of wall time (a process spinning \
                     without system calls stops Shadow's clock); its log: {}",
                    wall_limit.as_secs(),
                    log_path.display()
                )))
            } else {
                None
            };
            if let Some(e) = give_up {
                let _ = killpg(group, Signal::SIGKILL);
                let _ = child.wait();
                return Err(e);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Engine for Shadow {
    fn id(&self) -> EngineId {
        EngineId {
            name: SHADOW.into(),
            version: self.version.clone(),
        }
    }

    fn check(&self, scenario: &Scenario, variants: &[Variant]) -> Result<Vec<String>> {
        let mut notes = Vec::new();
        for v in variants {
            let (adapted, more) = adapt_variant(scenario, v)?;
            notes.extend(more);
            let g = graph(&adapted.topology).map_err(|e| match e {
                Error::Shadow(why) => Error::Shadow(format!("variant {}: {why}", v.label)),
                other => other,
            })?;
            notes.extend(g.notes);
            for h in &adapted.topology.hosts {
                super::config::check_host_name(&h.name)?;
            }
        }
        notes.sort();
        notes.dedup();
        Ok(notes)
    }

    fn plan(&self, scenario: &Scenario, variant: &Variant, rep_seed: (u32, u64)) -> Result<Plan> {
        super::plan(scenario, variant, rep_seed).map(|(plan, _)| plan)
    }

    fn run(&self, plan: &Plan, dir: &Path, hooks: &RunHooks) -> Result<Measured> {
        let started = Instant::now();
        // Shadow's configuration names the run's folder absolutely.
        let dir = &std::path::absolute(dir).map_err(io_err(format!("{}", dir.display())))?;
        let (schedule, _) = write(plan, dir, &self.opts)?;
        (hooks.status)(&format!("simulating {} s", schedule.stop_at.as_secs()));
        let wall_limit = WALL_BASE + schedule.stop_at * WALL_PER_SIMULATED;
        let cpu_start = crate::process::cpu_jiffies();
        let simulating = Instant::now();
        let (status, memory) = self.simulate(dir, wall_limit, hooks)?;
        let wall_s = simulating.elapsed().as_secs_f64();
        let busy = measure::busy_since(cpu_start);
        (hooks.status)("");
        let exe = self.exe_name();
        let ran = processes_ran(plan, &schedule, dir, &exe);
        // Shadow's own verdict first: a failed move must not hide it.
        let moved = move_logs(plan, dir, &ran, &exe);
        check_final_states(plan, dir, (&ran, &exe), status)?;
        moved?;
        let records = agent_records(&plan.agents, dir);
        let client_logs: Vec<PathBuf> = plan
            .processes_of(Role::Client)
            .map(|p| dir.join(&p.log))
            .collect();
        let relays = plan.processes_of(Role::Relay).map(|p| p.host.as_str());
        let seen = Observed {
            started,
            busy,
            relay_cpu_s: Vec::new(),
            relay_peak_rss: Vec::new(),
            tcp: plan
                .hosts
                .iter()
                .map(|h| HostTcp {
                    host: h.host.clone(),
                    congestion: h.tcp_congestion.clone(),
                    ..HostTcp::default()
                })
                .collect(),
            tcp_module_parameters: Default::default(),
            tcp_counters: Vec::new(),
            host_drops: Vec::new(),
            torchestra_moves: torchestra_moves(relays, dir),
            client_paths: client_paths(&client_logs),
            counters: None,
            client_logs,
            circuit_watches: Vec::new(),
            simulated: true,
        };
        let mut repetition = measure::repetition_record(plan, &records, seen);
        repetition.simulator_seed = Some(shadow_seed(plan.seed));
        repetition.simulation = Some(SimulationCost {
            simulated_s: schedule.stop_at.as_secs_f64(),
            wall_s,
            peak_memory_bytes: memory.peak_above_start(),
            processes: ran.len(),
        });
        Ok(Measured {
            records,
            repetition,
            sysctls: Default::default(),
        })
    }
}

/// The machine's memory in use at its highest since the start, sampled
/// at each pass of the wait for Shadow (every 50 ms).
struct MemoryPeak {
    /// In use at the start; `None` if it could not be read.
    at_start: Option<u64>,
    peak: u64,
}

impl MemoryPeak {
    /// Sampling begins now.
    fn start() -> MemoryPeak {
        let at_start = crate::process::machine_memory_in_use();
        MemoryPeak {
            at_start,
            peak: at_start.unwrap_or(0),
        }
    }

    /// Samples now.
    fn sample(&mut self) {
        if let Some(now) = crate::process::machine_memory_in_use() {
            self.peak = self.peak.max(now);
        }
    }

    /// The highest sample above the first, in bytes (`None` if the first
    /// could not be read).
    fn peak_above_start(&self) -> Option<u64> {
        self.at_start.map(|s| self.peak.saturating_sub(s))
    }
}

/// Shadow's folder of `host`'s output files.
fn host_dir(dir: &Path, host: &str) -> PathBuf {
    dir.join("shadow.data").join("hosts").join(host)
}

/// The process ids of Shadow's standard error files of executable `exe`
/// in `host_dir` (`EXE.PID.stderr`), in rising order.
fn stderr_pids(host_dir: &Path, exe: &str) -> Vec<u32> {
    let mut pids: Vec<u32> = fs::read_dir(host_dir)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_prefix(exe)?
                .strip_prefix('.')?
                .strip_suffix(".stderr")?
                .parse()
                .ok()
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// One process Shadow ran: its host, its process id there, and its index
/// among the plan's processes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ran {
    host: String,
    pid: u32,
    index: usize,
}

/// Which of the plan's processes each of Shadow's was, from its output
/// files: on each host, process ids rise in start order. A process Shadow
/// did not start has no file, and is not in the list.
fn processes_ran(plan: &Plan, schedule: &Schedule, dir: &Path, exe: &str) -> Vec<Ran> {
    let mut ran = Vec::new();
    for h in &plan.topology.hosts {
        let order = schedule.start_order(plan, &h.name);
        let pids = stderr_pids(&host_dir(dir, &h.name), exe);
        for (index, pid) in order.into_iter().zip(pids) {
            ran.push(Ran {
                host: h.name.clone(),
                pid,
                index,
            });
        }
    }
    ran
}

/// Moves each process's standard error to its log in `dir` (the plan's
/// name for it, where the namespace engine writes it).
fn move_logs(plan: &Plan, dir: &Path, ran: &[Ran], exe: &str) -> Result<()> {
    for r in ran {
        let src = host_dir(dir, &r.host).join(format!("{exe}.{}.stderr", r.pid));
        let dst = dir.join(&plan.processes[r.index].log);
        fs::rename(&src, &dst).map_err(io_err(format!(
            "moving {} to {}",
            src.display(),
            dst.display()
        )))?;
    }
    Ok(())
}

/// A process that did not end as its configuration expected, from
/// Shadow's log.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Unexpected {
    host: String,
    pid: u32,
    /// Shadow's words for the expected final state (`running`,
    /// `exited: 0`).
    expected: String,
    /// And for the actual one.
    actual: String,
}

/// The processes of executable `exe` Shadow's log says ended
/// unexpectedly: its lines `process 'HOST.EXE.PID' exited with status
/// ...; expected end state was A but was B`.
fn unexpected_final_states(log: &str, exe: &str) -> Vec<Unexpected> {
    log.lines()
        .filter_map(|line| {
            let name = line.split("process '").nth(1)?.split('\'').next()?;
            let (rest, pid) = name.rsplit_once('.')?;
            let pid = pid.parse().ok()?;
            let host = rest.strip_suffix(exe)?.strip_suffix('.')?.to_string();
            let states = line.split("expected end state was ").nth(1)?;
            let (expected, actual) = states.split_once(" but was ")?;
            Some(Unexpected {
                host,
                pid,
                expected: expected.trim().to_string(),
                actual: actual.trim().to_string(),
            })
        })
        .collect()
}

/// Checks how Shadow ended: every process as expected, or only agents
/// still running at the end (their unreported transfers are recorded as
/// failures, as the namespace engine records an agent stopped at the
/// deadline).
///
/// # Errors
///
/// [`Error::Shadow`] for Shadow's own failure (with its log's last lines),
/// or for a relay, client or server that exited, or an agent that failed
/// (with its log's last lines).
fn check_final_states(
    plan: &Plan,
    dir: &Path,
    (ran, exe): (&[Ran], &str),
    status: ExitStatus,
) -> Result<()> {
    let log = fs::read_to_string(dir.join(SHADOW_LOG)).unwrap_or_default();
    let unexpected = unexpected_final_states(&log, exe);
    let mut failures = Vec::new();
    for u in &unexpected {
        let Some(r) = ran.iter().find(|r| r.host == u.host && r.pid == u.pid) else {
            failures.push(format!(
                "process {} on {} ended {} (expected {})",
                u.pid, u.host, u.actual, u.expected
            ));
            continue;
        };
        let p = &plan.processes[r.index];
        if p.role == Role::Agent && u.actual == "running" {
            tracing::warn!(
                agent = %p.name,
                "still running when the simulation stopped: its unreported transfers are \
                 recorded as failures"
            );
            continue;
        }
        failures.push(format!(
            "{} on {} ended {} (expected {}); its log {} ends:\n{}",
            p.name,
            p.host,
            u.actual,
            u.expected,
            p.log,
            last_lines(&dir.join(&p.log))
        ));
    }
    if !failures.is_empty() {
        return Err(Error::Shadow(failures.join("\n")));
    }
    // Shadow exits with an error for tolerated agents too: past them, only
    // a simulation that finished is a success.
    let finished = log.contains("Finished simulation");
    if !status.success() && (unexpected.is_empty() || !finished) {
        return Err(Error::Shadow(format!(
            "shadow failed ({status}); {SHADOW_LOG} ends:\n{}",
            last_lines(&dir.join(SHADOW_LOG))
        )));
    }
    Ok(())
}

/// The last [`QUOTED_LINES`] lines of the file at `path` (empty if it
/// cannot be read).
fn last_lines(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(QUOTED_LINES)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shadows_lines_about_unexpected_final_states_are_read() {
        let log = "00:00:10.000000 [worker-0] 00:03:45.000000000 [ERROR] [agent-c1:10.0.0.5] \
                   [process.rs:1590] [shadow_rs::host::process] process 'agent-c1.onionlab.1003' \
                   exited with status StoppedByShadow; expected end state was exited: 0 but was \
                   running\n\
                   00:00:01 [INFO] something else\n\
                   x [ERROR] process 'relay.a.onionlab.1000' exited with status Normal(1); \
                   expected end state was running but was exited: 1\n\
                   x [ERROR] process 'other.tor.1000' exited with status Normal(1); \
                   expected end state was running but was exited: 1\n";
        let got = unexpected_final_states(log, "onionlab");
        assert_eq!(
            got,
            [
                Unexpected {
                    host: "agent-c1".into(),
                    pid: 1003,
                    expected: "exited: 0".into(),
                    actual: "running".into(),
                },
                Unexpected {
                    host: "relay.a".into(),
                    pid: 1000,
                    expected: "running".into(),
                    actual: "exited: 1".into(),
                },
            ]
        );
    }

    #[test]
    fn an_executable_with_dots_in_its_name_is_read_too() {
        let log = "x [ERROR] process 'relay.a.onionlab-0.1.1000' exited with status Normal(1); \
                   expected end state was running but was exited: 1\n";
        let got = unexpected_final_states(log, "onionlab-0.1");
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].host.as_str(), got[0].pid), ("relay.a", 1000));
        assert!(unexpected_final_states(log, "onionlab").is_empty());
    }

    #[test]
    fn output_files_are_read_by_process_id_in_numeric_order() {
        let dir = std::env::temp_dir().join(format!("onionlab-shadow-pids-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        for f in [
            "onionlab.1000.stderr",
            "onionlab.1012.stderr",
            "onionlab.999.stderr",
            "tor.1001.stderr",
            "onionlab-0.1.1003.stderr",
        ] {
            fs::write(dir.join(f), "").unwrap();
        }
        fs::write(dir.join("onionlab.1000.stdout"), "").unwrap();
        fs::write(dir.join("onionlab.1000.shimlog"), "").unwrap();
        assert_eq!(stderr_pids(&dir, "onionlab"), [999, 1000, 1012]);
        assert_eq!(stderr_pids(&dir, "onionlab-0.1"), [1003]);
        fs::remove_dir_all(&dir).unwrap();
    }
}

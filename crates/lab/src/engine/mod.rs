//! Engines: what runs a [`Plan`] and measures it. The runner
//! ([`crate::run`]) makes the plans, schedules them and keeps the journal;
//! an engine brings one plan up, runs its workloads, collects the records
//! and takes everything down again on every way out.
//!
//! Two engines: [`Namespaces`], a network namespace per host over the
//! user-space link emulator (real time, this machine's Linux TCP), and
//! [`shadow::Shadow`], the Shadow simulator (simulated time, Shadow's own
//! TCP), for networks larger than one machine's namespaces can hold.

mod measure;
mod netns;
pub mod shadow;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use self::netns::Namespaces;
use crate::agent::TransferRecord;
use crate::error::Result;
use crate::plan::Plan;
use crate::run::RepetitionRecord;
use crate::scenario::Scenario;
use crate::variant::Variant;

/// Sysctl names and values.
pub type Sysctls = BTreeMap<String, String>;

/// How a run under way shows what it does and learns it must end.
pub struct RunHooks<'a> {
    /// What the run is doing before its workload (shown after its label).
    pub status: &'a dyn Fn(&str),
    /// True once the run must end at once, unrecorded (a second signal).
    pub interrupted: &'a dyn Fn() -> bool,
}

/// What one run of a plan measured.
pub struct Measured {
    /// One record per transfer (a failure for each the agents did not
    /// report).
    pub records: Vec<TransferRecord>,
    /// The repetition's other measurements.
    pub repetition: RepetitionRecord,
    /// The hosts' kernel settings as recorded (for the run's environment).
    pub sysctls: Sysctls,
}

/// Which engine ran (part of) a run, as its segments record it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct EngineId {
    /// [`NAMESPACES`] or [`SHADOW`].
    pub name: String,
    /// The engine's version where it has one of its own (Shadow's
    /// `--version`); empty for the namespace engine, which is this build.
    pub version: String,
}

/// The namespace engine's name.
pub const NAMESPACES: &str = "namespaces";
/// The Shadow engine's name.
pub const SHADOW: &str = "shadow";

impl EngineId {
    /// The namespace engine (this build's own).
    pub fn namespaces() -> EngineId {
        EngineId {
            name: NAMESPACES.into(),
            version: String::new(),
        }
    }

    /// As a reader sees it: `namespaces`, `shadow (Shadow 3.3.0)`.
    pub fn describe(&self) -> String {
        if self.version.is_empty() {
            self.name.clone()
        } else {
            format!("{} ({})", self.name, self.version)
        }
    }
}

/// Runs plans.
pub trait Engine {
    /// Which engine this is.
    fn id(&self) -> EngineId;

    /// What this engine makes of `scenario`'s `variants` before any runs:
    /// notes of what it runs differently from the namespace engine, to
    /// show the user.
    ///
    /// # Errors
    ///
    /// A variant or network the engine cannot run, named.
    fn check(&self, scenario: &Scenario, variants: &[Variant]) -> Result<Vec<String>> {
        let _ = (scenario, variants);
        Ok(Vec::new())
    }

    /// The plan of repetition `rep` (seed `seed`) of `variant`: the
    /// namespace engine's is [`Plan::of`] valid from now.
    ///
    /// # Errors
    ///
    /// What [`Plan::of`] refuses, and what the engine cannot run.
    fn plan(
        &self,
        scenario: &Scenario,
        variant: &Variant,
        (rep, seed): (u32, u64),
    ) -> Result<Plan> {
        Plan::of(scenario, variant, (rep, seed), onionlab_config::unix_now())
    }

    /// Runs `plan` with `dir` as the repetition's directory (its files and
    /// logs go there) and returns what it measured. Whatever it brought up
    /// is gone when it returns, with an error too.
    ///
    /// # Errors
    ///
    /// Anything that keeps the run from finishing (a node that does not
    /// start, the emulated network, the file system), and
    /// [`crate::Error::Interrupted`] once `hooks.interrupted` says so.
    fn run(&self, plan: &Plan, dir: &Path, hooks: &RunHooks) -> Result<Measured>;
}

//! Engines: what runs a [`Plan`] and measures it. The runner
//! ([`crate::run`]) makes the plans, schedules them and keeps the journal;
//! an engine brings one plan up, runs its workloads, collects the records
//! and takes everything down again on every way out.
//!
//! One engine today: [`Namespaces`], a network namespace per host over
//! the user-space link emulator. [`shadow`] writes a plan as a Shadow
//! simulation, the second engine's first part.

mod measure;
mod netns;
pub mod shadow;

use std::collections::BTreeMap;
use std::path::Path;

pub use self::netns::Namespaces;
use crate::agent::TransferRecord;
use crate::error::Result;
use crate::plan::Plan;
use crate::run::RepetitionRecord;

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

/// Runs plans.
pub trait Engine {
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

//! The runner's jobs: the runs still to do, taken one at a time by up to
//! `--jobs` threads; each run is a plan run by an engine of its own.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;

use super::progress::Progress;
use super::{repetition_seed, RepetitionRecord, RunOptions};
use crate::agent::TransferRecord;
use crate::engine::{Engine, Namespaces, RunHooks, Sysctls};
use crate::error::Result;
use crate::journal::Journal;
use crate::scenario::Scenario;
use crate::variant::Variant;

/// A run still to do: repetition, index of the variant, raw directory.
pub(super) struct PendingRun {
    rep: u32,
    variant: usize,
    dir: PathBuf,
}

/// The runs `journal` lacks, in the order one job runs them: repetition
/// by repetition, each starting one variant further on (so that no
/// variant always runs first).
pub(super) fn pending_runs(
    journal: &Journal,
    reps: u32,
    variants: &[Variant],
) -> Result<Vec<PendingRun>> {
    let mut pending = Vec::new();
    for rep in 0..reps {
        for k in 0..variants.len() {
            let vi = (k + rep as usize) % variants.len();
            if !journal.is_done(rep, &variants[vi].label) {
                let dir = journal.fresh_raw_dir(rep, vi)?;
                pending.push(PendingRun {
                    rep,
                    variant: vi,
                    dir,
                });
            }
        }
    }
    Ok(pending)
}

/// What a run measured: its transfers, its repetition record and the
/// hosts' sysctls.
pub(super) type RunResult = Result<(Vec<TransferRecord>, RepetitionRecord, Sysctls)>;

/// A finished run, sent to the journal's writer.
pub(super) struct Finished<'a> {
    /// Its variant.
    pub(super) variant: &'a Variant,
    /// Its repetition.
    pub(super) rep: u32,
    /// The repetition's seed.
    pub(super) seed: u64,
    /// What it measured, or why it failed.
    pub(super) result: RunResult,
}

/// What the jobs of one `lab run` share.
pub(super) struct Jobs<'a> {
    pub(super) scenario: &'a Scenario,
    pub(super) opts: &'a RunOptions,
    pub(super) variants: &'a [Variant],
    short: &'a [String],
    pending: &'a [PendingRun],
    progress: &'a Progress,
    /// Set on the first failed run: the others finish the run under way
    /// and take no more.
    pub(super) failed: AtomicBool,
    /// The next pending run to take.
    next: AtomicUsize,
}

impl<'a> Jobs<'a> {
    /// The jobs of `pending` runs of `scenario`'s `variants`.
    pub(super) fn new(
        (scenario, opts): (&'a Scenario, &'a RunOptions),
        (variants, short): (&'a [Variant], &'a [String]),
        pending: &'a [PendingRun],
        progress: &'a Progress,
    ) -> Jobs<'a> {
        Jobs {
            scenario,
            opts,
            variants,
            short,
            pending,
            progress,
            failed: AtomicBool::new(false),
            next: AtomicUsize::new(0),
        }
    }

    /// True once no more runs may start: a run failed, or a first signal
    /// asked to stop.
    fn stopping(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
            || self
                .opts
                .stop
                .as_ref()
                .is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// True once the runs under way must end at once (a second signal).
    fn interrupted(&self) -> bool {
        self.opts
            .abort
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// One job, `slot`: runs pending runs one after another until none
    /// is left or the run stops, sending each as it finishes.
    pub(super) fn work(&self, slot: usize, tx: &Sender<Finished<'a>>) {
        let namespaces = Namespaces {
            bin: self.opts.bin.clone(),
            lab: format!("l{}-{slot}", std::process::id()),
        };
        let engine: &dyn Engine = match &self.opts.shadow {
            Some(shadow) => shadow,
            None => &namespaces,
        };
        while !self.stopping() {
            let Some(p) = self.pending.get(self.next.fetch_add(1, Ordering::Relaxed)) else {
                break;
            };
            let width = self.progress.width();
            let label = format!("rep {}: {:<width$}", p.rep, self.short[p.variant]);
            let status = |what: &str| self.progress.show_run(&label, what);
            status("");
            let seed = repetition_seed(self.scenario.seed, p.rep);
            let variant = &self.variants[p.variant];
            let interrupted = || self.interrupted();
            let hooks = RunHooks {
                status: &status,
                interrupted: &interrupted,
            };
            let result = engine
                .plan(self.scenario, variant, (p.rep, seed))
                .and_then(|plan| engine.run(&plan, &p.dir, &hooks))
                .map(|m| (m.records, m.repetition, m.sysctls));
            self.progress.finished_one();
            // A failed run stops every job before it takes another.
            if result.is_err() {
                self.failed.store(true, Ordering::Relaxed);
            }
            let finished = Finished {
                variant,
                rep: p.rep,
                seed,
                result,
            };
            if tx.send(finished).is_err() {
                break;
            }
        }
    }
}

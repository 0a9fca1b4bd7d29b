//! A run directory's journal: the scenario as run, what has run so far
//! (`records.jsonl`, `repetitions.jsonl`) and which builds ran it
//! (`segments.jsonl`).
//!
//! A run can be continued (`lab run --resume`): after an interruption, or to
//! add repetitions to one that had too few. Each repetition's seed depends
//! only on the scenario's seed and the repetition's number, so a continued
//! run is the run it would have been in one go, except for the builds and
//! kernels, which each segment records.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::agent::TransferRecord;
use crate::engine::EngineId;
use crate::error::{io_err, Error};
use crate::run::RepetitionRecord;
use crate::scenario::Scenario;

/// The commit onionlab was built from (12 hex digits, `-dirty` with
/// uncommitted changes to the sources), or `unknown` outside a git checkout.
pub const BUILD_COMMIT: &str = env!("ONIONLAB_COMMIT");

/// Where the segments are recorded, one JSON line each.
const SEGMENTS_FILE: &str = "segments.jsonl";
/// Where the digest of the scenario's traces is kept (trace scenarios only).
const TRACES_FILE: &str = "traces.sha256";

/// One invocation of `lab run` on a run directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(default)]
pub struct Segment {
    /// When it started (seconds since the Unix epoch).
    pub started_unix_s: u64,
    /// [`BUILD_COMMIT`] of the binary that ran it.
    pub commit: String,
    /// onionlab's version.
    pub version: String,
    /// Repetitions asked for (the run's total, not this segment's share).
    pub repetitions: u32,
    /// Whether it continued an earlier segment.
    pub resumed: bool,
    /// (repetition, variant) runs already done when it started.
    pub runs_done_before: usize,
    /// The kernel it ran on (`uname -r`).
    pub kernel: String,
    /// Runs it ran again because they had run on a saturated CPU
    /// (`lab run --resume --redo-saturated`).
    pub redone_saturated: usize,
    /// Runs it ran again because they had run beside others (`lab run
    /// --jobs`; `lab run --resume --redo-shared`), not already counted in
    /// `redone_saturated`.
    pub redone_shared: usize,
    /// The engine that ran it ([`crate::engine::NAMESPACES`] or
    /// [`crate::engine::SHADOW`]; empty in runs before the field: the
    /// namespace engine, the only one then).
    pub engine: String,
    /// The engine's version where it has one of its own (Shadow's).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub engine_version: String,
}

impl Segment {
    /// The engine that ran it.
    pub fn engine_id(&self) -> EngineId {
        let name = if self.engine.is_empty() {
            crate::engine::NAMESPACES
        } else {
            &self.engine
        };
        EngineId {
            name: name.to_string(),
            version: self.engine_version.clone(),
        }
    }
}

/// Which complete runs a resumed run runs again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Redo {
    /// Runs that ran on a saturated CPU (their results measured the
    /// machine).
    pub saturated: bool,
    /// Runs that ran beside others (`lab run --jobs N`, N > 1): to make
    /// a run whose every repetition ran alone.
    pub shared: bool,
}

impl Redo {
    /// Run nothing again.
    pub const NOTHING: Redo = Redo {
        saturated: false,
        shared: false,
    };

    /// Whether `r` runs again: `(saturated, shared)`, the reason that
    /// counts (saturation first).
    fn reasons(&self, r: &RepetitionRecord) -> (bool, bool) {
        let saturated = self.saturated && r.cpu_saturated;
        (saturated, !saturated && self.shared && r.jobs > 1)
    }
}

/// An open run directory, appending as runs complete.
pub struct Journal {
    out: PathBuf,
    /// Held for the journal's life: one `lab run` per directory.
    _lock: Flock<fs::File>,
    records_file: fs::File,
    reps_file: fs::File,
    done: BTreeSet<(u32, String)>,
    /// Every transfer record so far (earlier segments' too).
    pub records: Vec<TransferRecord>,
    /// Every repetition record so far (earlier segments' too).
    pub repetitions: Vec<RepetitionRecord>,
}

fn start_err(msg: String) -> Error {
    Error::Start(msg)
}

impl Journal {
    /// Start a run in `out`, which must not exist or be empty, on `engine`.
    pub fn create(
        out: &Path,
        scenario: &Scenario,
        repetitions: u32,
        engine: &EngineId,
    ) -> Result<Journal, Error> {
        if out.exists()
            && fs::read_dir(out)
                .map_err(io_err("reading the output directory"))?
                .next()
                .is_some()
        {
            return Err(start_err(format!(
                "output directory {} is not empty (use --resume to continue the run in it)",
                out.display()
            )));
        }
        fs::create_dir_all(out.join("raw")).map_err(io_err("creating the output directory"))?;
        let lock = lock_dir(out)?;
        fs::write(out.join("scenario.toml"), &scenario.text)
            .map_err(io_err("writing scenario.toml"))?;
        fs::copy(&scenario.topology_path, out.join("topology.toml"))
            .map_err(io_err("copying the topology"))?;
        if let Some(digest) = traces_digest(scenario) {
            fs::write(out.join(TRACES_FILE), digest)
                .map_err(io_err("writing the traces' digest"))?;
        }
        let journal = Journal {
            out: out.to_path_buf(),
            _lock: lock,
            records_file: create(&out.join("records.jsonl"))?,
            reps_file: create(&out.join("repetitions.jsonl"))?,
            done: BTreeSet::new(),
            records: Vec::new(),
            repetitions: Vec::new(),
        };
        journal.add_segment(repetitions, false, (0, 0), engine)?;
        Ok(journal)
    }

    /// Continue the run in `out`, started with the same scenario and
    /// topology (byte for byte: a changed file would silently mix two
    /// experiments). Runs whose repetition record is missing (interrupted)
    /// are forgotten, their transfer records and raw directory removed, and
    /// run again; so are the complete runs `redo` asks for. The run
    /// continues on the engine that started it (`engine` must be the
    /// same; another version of it is recorded, with a warning).
    pub fn resume(
        out: &Path,
        scenario: &Scenario,
        repetitions: u32,
        redo: Redo,
        engine: &EngineId,
    ) -> Result<Journal, Error> {
        same_file(
            &out.join("scenario.toml"),
            scenario.text.as_bytes(),
            "scenario",
        )?;
        let lock = lock_dir(out)?;
        let topology = fs::read(&scenario.topology_path).map_err(io_err(format!(
            "reading {}",
            scenario.topology_path.display()
        )))?;
        same_file(&out.join("topology.toml"), &topology, "topology")?;
        if let Some(digest) = traces_digest(scenario) {
            same_file(&out.join(TRACES_FILE), digest.as_bytes(), "traces' content")?;
        }
        check_engine(out, engine)?;

        let mut repetitions_done: Vec<RepetitionRecord> =
            read_complete_lines(&out.join("repetitions.jsonl"))?;
        // Checked before any run is dropped for `redo`, so that a `--reps`
        // below what the run has is refused even when the runs above it
        // were all to be redone (they would be lost, not run again).
        let mut done = check_done(&repetitions_done, scenario, repetitions)?;
        let (mut redone_saturated, mut redone_shared) = (0, 0);
        repetitions_done.retain(|r| {
            let (saturated, shared) = redo.reasons(r);
            redone_saturated += usize::from(saturated);
            redone_shared += usize::from(shared);
            !(saturated || shared)
        });
        if redone_saturated + redone_shared > 0 {
            done = repetitions_done
                .iter()
                .map(|r| (r.repetition, r.variant.clone()))
                .collect();
        }
        if redone_saturated > 0 {
            tracing::warn!(
                "resume: {redone_saturated} runs ran on a saturated CPU; they run again"
            );
        }
        if redone_shared > 0 {
            tracing::warn!(
                "resume: {redone_shared} runs ran beside others (--jobs); they run again"
            );
        }
        let mut by_run: BTreeMap<(u32, String), Vec<TransferRecord>> = BTreeMap::new();
        let mut forgotten = 0;
        for r in read_complete_lines::<TransferRecord>(&out.join("records.jsonl"))? {
            let key = (r.repetition, r.variant.clone());
            if done.contains(&key) {
                by_run.entry(key).or_default().push(r);
            } else {
                forgotten += 1;
            }
        }
        if forgotten > 0 {
            tracing::warn!(
                "resume: forgetting {forgotten} transfer records of runs that run again \
                 (interrupted, or redone)"
            );
        }
        // Rewrite both files with exactly the complete runs: into temporary
        // files, then renamed over the old ones, so that an interruption
        // now loses nothing.
        let mut records_text = String::new();
        let mut reps_text = String::new();
        for r in &repetitions_done {
            for rec in by_run
                .get(&(r.repetition, r.variant.clone()))
                .map_or(&[][..], Vec::as_slice)
            {
                records_text.push_str(&serde_json::to_string(rec).unwrap_or_default());
                records_text.push('\n');
            }
            reps_text.push_str(&serde_json::to_string(r).unwrap_or_default());
            reps_text.push('\n');
        }
        replace_file(&out.join("records.jsonl"), &records_text)?;
        replace_file(&out.join("repetitions.jsonl"), &reps_text)?;

        if !out.join(SEGMENTS_FILE).exists() && !repetitions_done.is_empty() {
            // A run started before segments were recorded: its build is
            // unknown, and the report must not credit this one with it.
            append_segment(
                out,
                &Segment {
                    commit: "unknown".into(),
                    ..Segment::default()
                },
            )?;
        }
        let journal = Journal {
            out: out.to_path_buf(),
            _lock: lock,
            records_file: open_append(&out.join("records.jsonl"))?,
            reps_file: open_append(&out.join("repetitions.jsonl"))?,
            done,
            records: by_run.into_values().flatten().collect(),
            repetitions: repetitions_done,
        };
        journal.add_segment(repetitions, true, (redone_saturated, redone_shared), engine)?;
        Ok(journal)
    }

    /// Whether `variant`'s repetition `rep` has run.
    pub fn is_done(&self, rep: u32, variant: &str) -> bool {
        self.done.contains(&(rep, variant.to_string()))
    }

    /// How many (repetition, variant) runs are done.
    pub fn runs_done(&self) -> usize {
        self.done.len()
    }

    /// The raw directory of a run, emptied if an interrupted attempt left
    /// it behind.
    pub fn fresh_raw_dir(&self, rep: u32, variant_index: usize) -> Result<PathBuf, Error> {
        let dir = self
            .out
            .join(format!("raw/rep{rep:03}-v{variant_index:02}"));
        if dir.exists() {
            fs::remove_dir_all(&dir).map_err(io_err(format!("removing {}", dir.display())))?;
        }
        Ok(dir)
    }

    /// Record a completed run: its transfers first, then the repetition
    /// record that marks it complete.
    pub fn append(
        &mut self,
        records: Vec<TransferRecord>,
        rep: RepetitionRecord,
    ) -> Result<(), Error> {
        for rec in &records {
            let line = serde_json::to_string(rec).unwrap_or_default();
            writeln!(self.records_file, "{line}").map_err(io_err("writing records.jsonl"))?;
        }
        // The transfers are on disk before the line that marks them complete.
        self.records_file
            .sync_data()
            .map_err(io_err("syncing records.jsonl"))?;
        let line = serde_json::to_string(&rep).unwrap_or_default();
        writeln!(self.reps_file, "{line}").map_err(io_err("writing repetitions.jsonl"))?;
        self.reps_file
            .sync_data()
            .map_err(io_err("syncing repetitions.jsonl"))?;
        self.done.insert((rep.repetition, rep.variant.clone()));
        self.records.extend(records);
        self.repetitions.push(rep);
        Ok(())
    }

    /// Record this invocation on `engine`; `redone` counts the complete
    /// runs it runs again, (saturated, shared).
    fn add_segment(
        &self,
        repetitions: u32,
        resumed: bool,
        (redone_saturated, redone_shared): (usize, usize),
        engine: &EngineId,
    ) -> Result<(), Error> {
        let segment = Segment {
            started_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            commit: BUILD_COMMIT.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            repetitions,
            resumed,
            runs_done_before: self.done.len(),
            kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|k| k.trim().to_string())
                .unwrap_or_default(),
            redone_saturated,
            redone_shared,
            engine: engine.name.clone(),
            engine_version: engine.version.clone(),
        };
        if let Some(last) = segments(&self.out).last() {
            if last.engine_id() != segment.engine_id() {
                tracing::warn!(
                    "resume: this part runs on {}, the previous one ran on {}; segments.jsonl \
                     records both",
                    segment.engine_id().describe(),
                    last.engine_id().describe()
                );
            }
            if last.commit != segment.commit || last.kernel != segment.kernel {
                tracing::warn!(
                    "resume: this part runs commit {} on kernel {}, the previous one ran {} on {}; \
                     segments.jsonl records both",
                    segment.commit,
                    segment.kernel,
                    last.commit,
                    last.kernel
                );
            }
        }
        append_segment(&self.out, &segment)
    }
}

/// Refuses to continue the run in `out` on another engine than the one
/// that made it (runs from before segments were recorded, or before
/// engines were, were made by the namespace engine).
fn check_engine(out: &Path, engine: &EngineId) -> Result<(), Error> {
    let before = segments(out)
        .last()
        .map_or_else(EngineId::namespaces, Segment::engine_id);
    if before.name == engine.name {
        return Ok(());
    }
    Err(start_err(format!(
        "resume: this run was made on the {} engine; continue it with --engine {} (one \
         run's repetitions come from one engine)",
        before.name, before.name
    )))
}

/// The segments of the run in `dir` (none for runs older than the file).
pub fn segments(dir: &Path) -> Vec<Segment> {
    read_complete_lines(&dir.join(SEGMENTS_FILE)).unwrap_or_default()
}

fn create(path: &Path) -> Result<fs::File, Error> {
    fs::File::create(path).map_err(io_err(format!("creating {}", path.display())))
}

fn open_append(path: &Path) -> Result<fs::File, Error> {
    fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(io_err(format!("opening {}", path.display())))
}

/// Write `text` to `path` through a temporary file renamed over it.
fn replace_file(path: &Path, text: &str) -> Result<(), Error> {
    let tmp = path.with_extension("jsonl.tmp");
    let mut f = create(&tmp)?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_data())
        .map_err(io_err(format!("writing {}", tmp.display())))?;
    fs::rename(&tmp, path).map_err(io_err(format!("replacing {}", path.display())))
}

fn append_segment(out: &Path, segment: &Segment) -> Result<(), Error> {
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out.join(SEGMENTS_FILE))
        .map_err(io_err("opening segments.jsonl"))?;
    let line = serde_json::to_string(segment).unwrap_or_default();
    writeln!(f, "{line}").map_err(io_err("writing segments.jsonl"))
}

/// An exclusive lock on the run directory, so that two `lab run`s cannot
/// write one directory at once.
fn lock_dir(out: &Path) -> Result<Flock<fs::File>, Error> {
    let path = out.join(".lock");
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_err(format!("opening {}", path.display())))?;
    Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|_| {
        start_err(format!(
            "another lab run is using {} (it holds {})",
            out.display(),
            path.display()
        ))
    })
}

/// The finished runs, checked against the scenario as it now expands: every
/// label must be one of its variants (else the code that expands it changed
/// and the old runs mean something else), no run twice, and none beyond
/// the repetitions asked for.
fn check_done(
    done: &[RepetitionRecord],
    scenario: &Scenario,
    repetitions: u32,
) -> Result<BTreeSet<(u32, String)>, Error> {
    let labels: BTreeSet<String> = scenario.variants().into_iter().map(|v| v.label).collect();
    let mut set = BTreeSet::new();
    for r in done {
        if !labels.contains(&r.variant) {
            return Err(start_err(format!(
                "cannot resume: the run has variant {:?}, which this scenario no longer \
                 expands to (the build's matrix handling changed?); start a new run",
                r.variant
            )));
        }
        if !set.insert((r.repetition, r.variant.clone())) {
            return Err(start_err(format!(
                "cannot resume: repetitions.jsonl has repetition {} of {:?} twice",
                r.repetition, r.variant
            )));
        }
    }
    if let Some(max) = done.iter().map(|r| r.repetition).max() {
        if max >= repetitions {
            return Err(start_err(format!(
                "cannot resume: the run already has {} repetitions; ask for at least that many \
                 with --reps",
                max + 1
            )));
        }
    }
    Ok(set)
}

/// A digest of the scenario's traces (as parsed), if it has any: the
/// scenario file names them, so an edited trace would not show in its text.
fn traces_digest(scenario: &Scenario) -> Option<String> {
    use sha2::{Digest, Sha256};
    let traced: Vec<_> = scenario
        .workloads
        .iter()
        .filter(|w| !w.trace.is_empty())
        .collect();
    if traced.is_empty() {
        return None;
    }
    let mut h = Sha256::new();
    for w in traced {
        h.update(format!("{}:{:?}\n", w.name, w.trace).as_bytes());
    }
    Some(hex::encode(h.finalize()) + "\n")
}

fn same_file(path: &Path, expected: &[u8], what: &str) -> Result<(), Error> {
    let old = fs::read(path).map_err(|e| {
        start_err(format!(
            "cannot resume: {} is not a run directory ({}: {e})",
            path.parent().unwrap_or(path).display(),
            path.display()
        ))
    })?;
    if old != expected {
        return Err(start_err(format!(
            "cannot resume: the {what} differs from the one the run started with ({}); \
             start a new run, or resume with the file as it was",
            path.display()
        )));
    }
    Ok(())
}

/// The records of a JSON-lines file, without a last line cut short by an
/// interruption. A bad line anywhere else is an error: the file is not
/// ours, or was edited.
fn read_complete_lines<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>, Error> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(format!("reading {}", path.display()))(e)),
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let cut_short = !text.ends_with('\n');
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(v) => out.push(v),
            Err(_) if cut_short && i + 1 == lines.len() => {}
            Err(e) => {
                return Err(start_err(format!(
                    "cannot resume: {} line {}: {e}",
                    path.display(),
                    i + 1
                )))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns() -> EngineId {
        EngineId::namespaces()
    }

    fn scenario() -> Scenario {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        Scenario::from_file(&root.join("scenarios/quick.toml")).expect("quick.toml")
    }

    fn rep(variant: &str, repetition: u32) -> RepetitionRecord {
        RepetitionRecord {
            variant: variant.into(),
            repetition,
            ..Default::default()
        }
    }

    fn transfer(variant: &str, repetition: u32, index: u32) -> TransferRecord {
        let json = format!(
            r#"{{"workload":"web","kind":"download","index":{index},"size":1,"start_unix_ms":0,
            "connect_ms":null,"ttfb_ms":null,"ttlb_ms":null,"goodput_mib_s":null,
            "longest_gap_ms":null,"stalled":false,"timed_out":false,"error":null,
            "variant":"{variant}","repetition":{repetition},"seed":1}}"#
        )
        .replace('\n', "");
        serde_json::from_str(&json).expect("a transfer record")
    }

    fn temp_dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("onionlab-journal-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    const A: &str = "scheduler=ewma";
    const B: &str = "scheduler=round-robin";
    const SATURATED: Redo = Redo {
        saturated: true,
        shared: false,
    };

    #[test]
    fn a_resumed_run_keeps_complete_runs_and_forgets_interrupted_ones() {
        let out = temp_dir("resume");
        let s = scenario();
        let mut j = Journal::create(&out, &s, 2, &ns()).expect("create");
        j.append(vec![transfer(A, 0, 0), transfer(A, 0, 1)], rep(A, 0))
            .expect("append");
        j.append(vec![transfer(B, 0, 0)], rep(B, 0))
            .expect("append");
        drop(j);
        // An interrupted run: its transfers were written, its repetition
        // record was not, and the last line was cut short.
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(out.join("records.jsonl"))
            .expect("records");
        let line = serde_json::to_string(&transfer(A, 1, 0)).expect("json");
        writeln!(f, "{line}").expect("write");
        write!(f, "{}", &line[..20]).expect("write");
        drop(f);
        let raw = out.join("raw/rep001-v00");
        fs::create_dir_all(&raw).expect("raw");
        fs::write(raw.join("guard.log"), "half a run").expect("log");

        let mut j = Journal::resume(&out, &s, 3, Redo::NOTHING, &ns()).expect("resume");
        assert!(j.is_done(0, A) && j.is_done(0, B));
        assert!(!j.is_done(1, A));
        assert_eq!(j.runs_done(), 2);
        assert_eq!(j.records.len(), 3);
        assert_eq!(j.repetitions.len(), 2);
        let fresh = j.fresh_raw_dir(1, 0).expect("raw dir");
        assert!(
            !fresh.exists(),
            "the interrupted run's raw directory is emptied"
        );
        j.append(vec![transfer(A, 1, 0)], rep(A, 1))
            .expect("append");
        drop(j);
        let text = fs::read_to_string(out.join("records.jsonl")).expect("records");
        assert_eq!(text.lines().count(), 4, "{text}");
        assert_eq!(text.matches("\"repetition\":1").count(), 1, "{text}");
        assert!(!out.join("records.jsonl.tmp").exists());
        let segs = segments(&out);
        assert_eq!(segs.len(), 2);
        assert_eq!((segs[0].resumed, segs[0].runs_done_before), (false, 0));
        assert_eq!((segs[1].resumed, segs[1].runs_done_before), (true, 2));
        assert_eq!(segs[1].repetitions, 3);
        assert!(!segs[1].commit.is_empty() && !segs[1].kernel.is_empty());
        let _ = fs::remove_dir_all(&out);
    }

    #[test]
    fn runs_on_a_saturated_cpu_run_again_only_when_asked() {
        let out = temp_dir("saturated");
        let s = scenario();
        let mut j = Journal::create(&out, &s, 2, &ns()).expect("create");
        let busy = RepetitionRecord {
            cpu_saturated: true,
            ..rep(B, 0)
        };
        j.append(vec![transfer(A, 0, 0)], rep(A, 0))
            .expect("append");
        j.append(vec![transfer(B, 0, 0), transfer(B, 0, 1)], busy)
            .expect("append");
        drop(j);
        let j = Journal::resume(&out, &s, 2, Redo::NOTHING, &ns()).expect("resume");
        assert!(j.is_done(0, B), "kept without --redo-saturated");
        assert_eq!(segments(&out).last().map(|g| g.redone_saturated), Some(0));
        drop(j);
        let j = Journal::resume(&out, &s, 2, SATURATED, &ns()).expect("resume");
        assert!(j.is_done(0, A) && !j.is_done(0, B));
        assert_eq!(j.records.len(), 1, "the saturated run's transfers are gone");
        assert_eq!(segments(&out).last().map(|g| g.redone_saturated), Some(1));
        drop(j);
        let text = fs::read_to_string(out.join("repetitions.jsonl")).expect("reps");
        assert_eq!(text.lines().count(), 1, "{text}");
        let _ = fs::remove_dir_all(&out);
    }

    #[test]
    fn runs_made_beside_others_run_again_only_when_asked() {
        let out = temp_dir("shared");
        let s = scenario();
        let mut j = Journal::create(&out, &s, 2, &ns()).expect("create");
        let beside = |r: RepetitionRecord, jobs, cpu_saturated| RepetitionRecord {
            jobs,
            cpu_saturated,
            ..r
        };
        j.append(vec![transfer(A, 0, 0)], beside(rep(A, 0), 1, false))
            .expect("append");
        j.append(vec![transfer(B, 0, 0)], beside(rep(B, 0), 4, false))
            .expect("append");
        j.append(vec![transfer(A, 1, 0)], beside(rep(A, 1), 4, true))
            .expect("append");
        j.append(vec![], beside(rep(B, 1), 1, true))
            .expect("append");
        drop(j);
        let j = Journal::resume(&out, &s, 2, SATURATED, &ns()).expect("resume");
        assert!(j.is_done(0, B), "kept without --redo-shared");
        assert!(!j.is_done(1, A) && !j.is_done(1, B));
        let last = segments(&out).last().cloned().expect("a segment");
        assert_eq!((last.redone_saturated, last.redone_shared), (2, 0));
        drop(j);
        let shared = Redo {
            saturated: false,
            shared: true,
        };
        let j = Journal::resume(&out, &s, 2, shared, &ns()).expect("resume");
        assert!(j.is_done(0, A) && !j.is_done(0, B));
        assert_eq!(j.records.len(), 1, "the shared run's transfers are gone");
        let last = segments(&out).last().cloned().expect("a segment");
        assert_eq!((last.redone_saturated, last.redone_shared), (0, 1));
        drop(j);
        let _ = fs::remove_dir_all(&out);
    }

    #[test]
    fn a_run_both_saturated_and_shared_counts_as_saturated() {
        let r = RepetitionRecord {
            jobs: 2,
            cpu_saturated: true,
            ..rep(A, 0)
        };
        let both = Redo {
            saturated: true,
            shared: true,
        };
        assert_eq!(both.reasons(&r), (true, false));
        assert_eq!(Redo::NOTHING.reasons(&r), (false, false));
        let alone = RepetitionRecord { jobs: 1, ..r };
        assert_eq!(both.reasons(&alone), (true, false));
    }

    #[test]
    fn redoing_saturated_runs_cannot_shrink_a_run() {
        let out = temp_dir("saturated-top");
        let s = scenario();
        let mut j = Journal::create(&out, &s, 2, &ns()).expect("create");
        j.append(vec![], rep(A, 0)).expect("append");
        let busy = RepetitionRecord {
            cpu_saturated: true,
            ..rep(A, 1)
        };
        j.append(vec![], busy).expect("append");
        drop(j);
        // Repetition 1 exists (saturated): --reps 1 would drop it unrun.
        let e = Journal::resume(&out, &s, 1, SATURATED, &ns())
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("already has 2 repetitions"), "{e}");
        let _ = fs::remove_dir_all(&out);
    }

    #[test]
    fn resuming_with_a_changed_scenario_or_elsewhere_is_refused() {
        let out = temp_dir("changed");
        let mut s = scenario();
        drop(Journal::create(&out, &s, 1, &ns()).expect("create"));
        s.text.push_str("\n# an edit\n");
        let e = Journal::resume(&out, &s, 1, Redo::NOTHING, &ns())
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("scenario differs"), "{e}");

        let nowhere = temp_dir("nowhere");
        let e = Journal::resume(&nowhere, &scenario(), 1, Redo::NOTHING, &ns())
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("not a run directory"), "{e}");
        let _ = fs::remove_dir_all(&out);
    }

    #[test]
    fn a_run_continues_on_the_engine_that_started_it() {
        let out = temp_dir("engine");
        let s = scenario();
        let shadow = |version: &str| EngineId {
            name: crate::engine::SHADOW.into(),
            version: version.into(),
        };
        drop(Journal::create(&out, &s, 2, &ns()).expect("create"));
        let e = Journal::resume(&out, &s, 2, Redo::NOTHING, &shadow("Shadow 3.3.0"))
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("--engine namespaces"), "{e}");
        let _ = fs::remove_dir_all(&out);

        drop(Journal::create(&out, &s, 2, &shadow("Shadow 3.3.0")).expect("create"));
        let e = Journal::resume(&out, &s, 2, Redo::NOTHING, &ns())
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("--engine shadow"), "{e}");
        // Another version of the same engine is recorded beside the first.
        drop(Journal::resume(&out, &s, 2, Redo::NOTHING, &shadow("Shadow 3.3.1")).expect("resume"));
        let engines: Vec<String> = segments(&out)
            .iter()
            .map(|g| g.engine_id().describe())
            .collect();
        assert_eq!(engines, ["shadow (Shadow 3.3.0)", "shadow (Shadow 3.3.1)"]);
        let _ = fs::remove_dir_all(&out);
    }

    #[test]
    fn runs_the_scenario_does_not_expand_to_or_beyond_the_repetitions_are_refused() {
        let out = temp_dir("beyond");
        let s = scenario();
        let mut j = Journal::create(&out, &s, 3, &ns()).expect("create");
        j.append(vec![], rep(A, 2)).expect("append");
        drop(j);
        let e = Journal::resume(&out, &s, 2, Redo::NOTHING, &ns())
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("already has 3 repetitions"), "{e}");

        let mut j = Journal::resume(&out, &s, 3, Redo::NOTHING, &ns()).expect("resume");
        j.append(vec![], rep(A, 2)).expect("append");
        drop(j);
        let e = Journal::resume(&out, &s, 3, Redo::NOTHING, &ns())
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("twice"), "{e}");

        fs::write(
            out.join("repetitions.jsonl"),
            serde_json::to_string(&rep("scheduler=fifo", 0)).expect("json") + "\n",
        )
        .expect("write");
        let e = Journal::resume(&out, &s, 3, Redo::NOTHING, &ns())
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("no longer"), "{e}");
        let _ = fs::remove_dir_all(&out);
    }

    #[test]
    fn one_run_directory_takes_one_lab_run_at_a_time() {
        let out = temp_dir("locked");
        let s = scenario();
        let first = Journal::create(&out, &s, 1, &ns()).expect("create");
        let e = Journal::resume(&out, &s, 1, Redo::NOTHING, &ns())
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("another lab run"), "{e}");
        drop(first);
        Journal::resume(&out, &s, 1, Redo::NOTHING, &ns()).expect("free again");
        let _ = fs::remove_dir_all(&out);
    }

    #[test]
    fn a_run_from_before_segments_is_not_credited_to_this_build() {
        let out = temp_dir("legacy");
        let s = scenario();
        let mut j = Journal::create(&out, &s, 2, &ns()).expect("create");
        j.append(vec![], rep(A, 0)).expect("append");
        drop(j);
        fs::remove_file(out.join(SEGMENTS_FILE)).expect("remove");
        drop(Journal::resume(&out, &s, 2, Redo::NOTHING, &ns()).expect("resume"));
        let segs = segments(&out);
        assert_eq!(segs.len(), 2);
        assert_eq!(segs[0].commit, "unknown");
        assert!(segs[1].resumed);
        let _ = fs::remove_dir_all(&out);
    }

    #[test]
    fn a_bad_line_before_the_last_is_an_error_not_a_silent_loss() {
        let out = temp_dir("bad");
        let s = scenario();
        drop(Journal::create(&out, &s, 1, &ns()).expect("create"));
        fs::write(out.join("repetitions.jsonl"), "not json\n{}\n").expect("write");
        let e = Journal::resume(&out, &s, 1, Redo::NOTHING, &ns())
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("repetitions.jsonl line 1"), "{e}");
        let _ = fs::remove_dir_all(&out);
    }

    #[test]
    fn a_new_run_needs_an_empty_directory() {
        let out = temp_dir("nonempty");
        fs::create_dir_all(&out).expect("dir");
        fs::write(out.join("x"), "x").expect("write");
        let e = Journal::create(&out, &scenario(), 1, &ns())
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("--resume"), "{e}");
        let _ = fs::remove_dir_all(&out);
    }
}

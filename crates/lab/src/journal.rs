//! A run directory's journal: the scenario as run, what has run so far
//! (`records.jsonl`, `repetitions.jsonl`) and which builds ran it
//! (`segments.jsonl`).
//!
//! A run can be continued (`lab run --resume`): after an interruption, or to
//! add repetitions to one that had too few. Each repetition's seed depends
//! only on the scenario's seed and the repetition's number, so a continued
//! run is the run it would have been in one go, except for the builds and
//! machine state, which each segment records.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::agent::TransferRecord;
use crate::run::{RepetitionRecord, RunError};
use crate::scenario::Scenario;

/// The commit onionlab was built from (`git describe`-like, `-dirty` with
/// uncommitted changes), or `unknown` outside a git checkout.
pub const BUILD_COMMIT: &str = env!("ONIONLAB_COMMIT");

/// One invocation of `lab run` on a run directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
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
}

/// An open run directory, appending as runs complete.
pub struct Journal {
    out: PathBuf,
    records_file: fs::File,
    reps_file: fs::File,
    done: BTreeSet<(u32, String)>,
    /// Every transfer record so far (earlier segments' too).
    pub records: Vec<TransferRecord>,
    /// Every repetition record so far (earlier segments' too).
    pub repetitions: Vec<RepetitionRecord>,
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunError {
    let what = what.into();
    move |source| RunError::Io { what, source }
}

fn start_err(msg: String) -> RunError {
    RunError::Start(msg)
}

impl Journal {
    /// Start a run in `out`, which must not exist or be empty.
    pub fn create(out: &Path, scenario: &Scenario, repetitions: u32) -> Result<Journal, RunError> {
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
        fs::write(out.join("scenario.toml"), &scenario.text)
            .map_err(io_err("writing scenario.toml"))?;
        fs::copy(&scenario.topology_path, out.join("topology.toml"))
            .map_err(io_err("copying the topology"))?;
        let journal = Journal {
            out: out.to_path_buf(),
            records_file: create(&out.join("records.jsonl"))?,
            reps_file: create(&out.join("repetitions.jsonl"))?,
            done: BTreeSet::new(),
            records: Vec::new(),
            repetitions: Vec::new(),
        };
        journal.add_segment(repetitions, false)?;
        Ok(journal)
    }

    /// Continue the run in `out`, started with the same scenario and
    /// topology (byte for byte: a changed file would silently mix two
    /// experiments). Runs whose repetition record is missing (interrupted)
    /// are forgotten, their transfer records and raw directory removed, and
    /// run again.
    pub fn resume(out: &Path, scenario: &Scenario, repetitions: u32) -> Result<Journal, RunError> {
        same_file(
            &out.join("scenario.toml"),
            scenario.text.as_bytes(),
            "scenario",
        )?;
        let topology = fs::read(&scenario.topology_path).map_err(io_err(format!(
            "reading {}",
            scenario.topology_path.display()
        )))?;
        same_file(&out.join("topology.toml"), &topology, "topology")?;

        let repetitions_done: Vec<RepetitionRecord> =
            read_complete_lines(&out.join("repetitions.jsonl"))?;
        let done: BTreeSet<(u32, String)> = repetitions_done
            .iter()
            .map(|r| (r.repetition, r.variant.clone()))
            .collect();
        let records: Vec<TransferRecord> = read_complete_lines(&out.join("records.jsonl"))?
            .into_iter()
            .filter(|r: &TransferRecord| done.contains(&(r.repetition, r.variant.clone())))
            .collect();
        // Rewrite both files with exactly the complete runs.
        let mut journal = Journal {
            out: out.to_path_buf(),
            records_file: create(&out.join("records.jsonl"))?,
            reps_file: create(&out.join("repetitions.jsonl"))?,
            done: BTreeSet::new(),
            records: Vec::new(),
            repetitions: Vec::new(),
        };
        let mut by_run: std::collections::BTreeMap<(u32, String), Vec<TransferRecord>> =
            Default::default();
        for r in records {
            by_run
                .entry((r.repetition, r.variant.clone()))
                .or_default()
                .push(r);
        }
        for r in repetitions_done {
            let recs = by_run
                .remove(&(r.repetition, r.variant.clone()))
                .unwrap_or_default();
            journal.append(recs, r)?;
        }
        journal.add_segment(repetitions, true)?;
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
    pub fn fresh_raw_dir(&self, rep: u32, variant_index: usize) -> Result<PathBuf, RunError> {
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
    ) -> Result<(), RunError> {
        for rec in &records {
            let line = serde_json::to_string(rec).unwrap_or_default();
            writeln!(self.records_file, "{line}").map_err(io_err("writing records.jsonl"))?;
        }
        let line = serde_json::to_string(&rep).unwrap_or_default();
        writeln!(self.reps_file, "{line}").map_err(io_err("writing repetitions.jsonl"))?;
        self.done.insert((rep.repetition, rep.variant.clone()));
        self.records.extend(records);
        self.repetitions.push(rep);
        Ok(())
    }

    fn add_segment(&self, repetitions: u32, resumed: bool) -> Result<(), RunError> {
        let segment = Segment {
            started_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            commit: BUILD_COMMIT.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            repetitions,
            resumed,
            runs_done_before: self.done.len(),
        };
        let path = self.out.join("segments.jsonl");
        let mut f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_err("opening segments.jsonl"))?;
        let line = serde_json::to_string(&segment).unwrap_or_default();
        writeln!(f, "{line}").map_err(io_err("writing segments.jsonl"))
    }
}

/// The segments of the run in `dir` (none for runs older than the file).
pub fn segments(dir: &Path) -> Vec<Segment> {
    read_complete_lines(&dir.join("segments.jsonl")).unwrap_or_default()
}

fn create(path: &Path) -> Result<fs::File, RunError> {
    fs::File::create(path).map_err(io_err(format!("creating {}", path.display())))
}

fn same_file(path: &Path, expected: &[u8], what: &str) -> Result<(), RunError> {
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
fn read_complete_lines<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>, RunError> {
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

    #[test]
    fn a_resumed_run_keeps_complete_runs_and_forgets_interrupted_ones() {
        let out = temp_dir("resume");
        let s = scenario();
        let mut j = Journal::create(&out, &s, 2).expect("create");
        j.append(vec![transfer("a", 0, 0), transfer("a", 0, 1)], rep("a", 0))
            .expect("append");
        j.append(vec![transfer("b", 0, 0)], rep("b", 0))
            .expect("append");
        drop(j);
        // An interrupted run: its transfers were written, its repetition
        // record was not, and the last line was cut short.
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(out.join("records.jsonl"))
            .expect("records");
        let line = serde_json::to_string(&transfer("a", 1, 0)).expect("json");
        writeln!(f, "{line}").expect("write");
        write!(f, "{}", &line[..20]).expect("write");
        drop(f);
        let raw = out.join("raw/rep001-v00");
        fs::create_dir_all(&raw).expect("raw");
        fs::write(raw.join("guard.log"), "half a run").expect("log");

        let j = Journal::resume(&out, &s, 3).expect("resume");
        assert!(j.is_done(0, "a") && j.is_done(0, "b"));
        assert!(!j.is_done(1, "a"));
        assert_eq!(j.runs_done(), 2);
        assert_eq!(j.records.len(), 3);
        assert_eq!(j.repetitions.len(), 2);
        let fresh = j.fresh_raw_dir(1, 0).expect("raw dir");
        assert!(
            !fresh.exists(),
            "the interrupted run's raw directory is emptied"
        );
        drop(j);
        let text = fs::read_to_string(out.join("records.jsonl")).expect("records");
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(!text.contains("\"repetition\":1"), "{text}");
        let segs = segments(&out);
        assert_eq!(segs.len(), 2);
        assert_eq!((segs[0].resumed, segs[0].runs_done_before), (false, 0));
        assert_eq!((segs[1].resumed, segs[1].runs_done_before), (true, 2));
        assert_eq!(segs[1].repetitions, 3);
        assert!(!segs[1].commit.is_empty());
        let _ = fs::remove_dir_all(&out);
    }

    #[test]
    fn resuming_with_a_changed_scenario_or_elsewhere_is_refused() {
        let out = temp_dir("changed");
        let mut s = scenario();
        drop(Journal::create(&out, &s, 1).expect("create"));
        s.text.push_str("\n# an edit\n");
        let e = Journal::resume(&out, &s, 1)
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("scenario differs"), "{e}");

        let nowhere = temp_dir("nowhere");
        let e = Journal::resume(&nowhere, &scenario(), 1)
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("not a run directory"), "{e}");
        let _ = fs::remove_dir_all(&out);
    }

    #[test]
    fn a_bad_line_before_the_last_is_an_error_not_a_silent_loss() {
        let out = temp_dir("bad");
        let s = scenario();
        drop(Journal::create(&out, &s, 1).expect("create"));
        fs::write(out.join("repetitions.jsonl"), "not json\n{}\n").expect("write");
        let e = Journal::resume(&out, &s, 1)
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
        let e = Journal::create(&out, &scenario(), 1)
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("--resume"), "{e}");
        let _ = fs::remove_dir_all(&out);
    }
}

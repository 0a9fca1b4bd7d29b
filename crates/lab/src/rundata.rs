//! A run's data, read alike from a run directory (`lab run --out DIR`) or
//! from a stored run (`lab store`): the compact, compressed copy kept in
//! the repository beside the results pages that cite it, so their tables
//! can be rebuilt on any machine.
//!
//! A stored run is one folder:
//!
//! - `stored.json`: the manifest ([`Manifest`]): format version, the run's
//!   id and scenario, and each file's SHA-256 (of its uncompressed bytes),
//!   so a changed, truncated or swapped file is an error naming it;
//! - `records.jsonl.zst`, `repetitions.jsonl.zst`, `environment.json.zst`:
//!   the run directory's files, zstd-compressed;
//! - `scenario.toml`, `topology.toml`, `segments.jsonl` and, for trace
//!   scenarios, `traces.sha256` (the digest of the traces it replayed,
//!   which are committed in `scenarios/traces/`), as they are.
//!
//! Left out: `records.csv` (the same records), `raw/` (logs and per-node
//! files of each repetition) and `report/` (made again by `lab report`).
//! Nothing is dropped from the records themselves (see `docs/results/README.md`
//! for the sizes).
//!
//! A run from a source tree with uncommitted changes (a segment's commit
//! ends in `-dirty`) is refused when stored and when a stored run is read:
//! its numbers cannot be traced to code.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::agent::TransferRecord;
use crate::error::Error;
use crate::journal::Segment;
use crate::run::RepetitionRecord;

/// The stored-run format this build writes and reads.
pub const STORED_FORMAT: u32 = 1;
/// The manifest's file name; its presence makes a folder a stored run.
pub const MANIFEST: &str = "stored.json";
/// zstd level of stored files (slow to write, fast to read, small).
const ZSTD_LEVEL: i32 = 19;

/// Files of a run directory that are stored compressed, as `NAME.zst`.
const COMPRESSED: [&str; 3] = ["records.jsonl", "repetitions.jsonl", "environment.json"];
/// Files of a run directory that are stored as they are.
const PLAIN: [&str; 4] = [
    "scenario.toml",
    "topology.toml",
    "segments.jsonl",
    "traces.sha256",
];
/// Files a run needs (the others are optional: older runs lack them).
const REQUIRED: [&str; 3] = ["records.jsonl", "repetitions.jsonl", "scenario.toml"];

/// A stored run's manifest (`stored.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`STORED_FORMAT`] when written.
    pub format: u32,
    /// The run's id: its folder's name.
    pub id: String,
    /// The scenario's name.
    pub scenario: String,
    /// Each stored file (by its name in the run directory) and the
    /// SHA-256 of its uncompressed bytes, hex.
    pub files: BTreeMap<String, String>,
}

/// A run's data, wherever it was read from.
#[derive(Debug, Clone)]
pub struct RunData {
    /// Where it was read from.
    pub source: PathBuf,
    /// The manifest, for a stored run.
    pub manifest: Option<Manifest>,
    /// The scenario file's text as run.
    pub scenario_toml: String,
    /// Every transfer record.
    pub records: Vec<TransferRecord>,
    /// Every repetition record.
    pub repetitions: Vec<RepetitionRecord>,
    /// Which builds ran it (none for runs older than the file).
    pub segments: Vec<Segment>,
    /// Runs joined into this one ([`RunData::join`]), this one first;
    /// empty for a single run.
    pub joined: Vec<JoinedRun>,
}

/// A run's part in joined data ([`RunData::join`]): what a caption names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinedRun {
    /// Its id ([`RunData::id`]).
    pub id: String,
    /// Its scenario's name.
    pub scenario: String,
    /// Repetitions it has done.
    pub done: usize,
    /// Repetitions its scenario plans.
    pub planned: u32,
    /// Commits that made it.
    pub commits: Vec<String>,
}

fn read_err(path: &Path, source: std::io::Error) -> Error {
    Error::Read {
        path: path.display().to_string(),
        source,
    }
}

fn stored_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Stored {
        path: path.display().to_string(),
        message: message.into(),
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Parses JSON lines; a line that is not a `T` is an error naming the file
/// and line (a cut-short last line too: a run directory's journal has
/// complete lines once a run is done).
fn parse_jsonl<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<Vec<T>, Error> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| Error::Record {
                path: path.display().to_string(),
                line: i + 1,
                message: e.to_string(),
            })
        })
        .collect()
}

/// Whether `dir` is a stored run (it has a manifest).
pub fn is_stored(dir: &Path) -> bool {
    dir.join(MANIFEST).is_file()
}

/// The text of `name` of the run at `dir`: `None` if an optional file is
/// absent. A stored run's files are decompressed and checked against the
/// manifest.
fn file_text(dir: &Path, manifest: Option<&Manifest>, name: &str) -> Result<Option<String>, Error> {
    let Some(manifest) = manifest else {
        let path = dir.join(name);
        return match fs::read_to_string(&path) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !REQUIRED.contains(&name) => {
                Ok(None)
            }
            Err(e) => Err(read_err(&path, e)),
        };
    };
    let Some(digest) = manifest.files.get(name) else {
        if REQUIRED.contains(&name) {
            return Err(stored_err(
                &dir.join(MANIFEST),
                format!("the manifest lists no {name}"),
            ));
        }
        return Ok(None);
    };
    let compressed = COMPRESSED.contains(&name);
    let path = if compressed {
        dir.join(format!("{name}.zst"))
    } else {
        dir.join(name)
    };
    let raw = fs::read(&path).map_err(|e| read_err(&path, e))?;
    let bytes = if compressed {
        let mut out = Vec::new();
        zstd::stream::read::Decoder::new(raw.as_slice())
            .and_then(|mut d| d.read_to_end(&mut out))
            .map_err(|e| stored_err(&path, format!("not a complete zstd stream: {e}")))?;
        out
    } else {
        raw
    };
    if sha256_hex(&bytes) != *digest {
        return Err(stored_err(
            &path,
            "its content differs from what was stored (SHA-256 mismatch with stored.json): \
             changed or truncated since `lab store`",
        ));
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| stored_err(&path, "not UTF-8"))
}

impl RunData {
    /// Reads the run at `path`: a stored run (with a manifest) or a run
    /// directory.
    ///
    /// # Errors
    ///
    /// A missing or unreadable file, a line that is not a record, a stored
    /// file that differs from its manifest, a stored run from a dirty tree,
    /// or records of variants its scenario does not have: each names the
    /// file.
    pub fn load(path: &Path) -> Result<RunData, Error> {
        if !path.is_dir() {
            return Err(stored_err(
                path,
                "no such run: neither a run directory nor a stored run",
            ));
        }
        let manifest = if is_stored(path) {
            let m_path = path.join(MANIFEST);
            let text = fs::read_to_string(&m_path).map_err(|e| read_err(&m_path, e))?;
            let m: Manifest = serde_json::from_str(&text)
                .map_err(|e| stored_err(&m_path, format!("not a manifest: {e}")))?;
            if m.format != STORED_FORMAT {
                return Err(stored_err(
                    &m_path,
                    format!(
                        "stored-run format {} (this build reads {STORED_FORMAT})",
                        m.format
                    ),
                ));
            }
            Some(m)
        } else {
            None
        };
        let m = manifest.as_ref();
        let text = |name: &str| file_text(path, m, name);
        let required = |name: &str| -> Result<String, Error> {
            text(name)?.ok_or_else(|| stored_err(&path.join(name), "missing"))
        };
        let scenario_toml = required("scenario.toml")?;
        let records = parse_jsonl(&path.join("records.jsonl"), &required("records.jsonl")?)?;
        let repetitions = parse_jsonl(
            &path.join("repetitions.jsonl"),
            &required("repetitions.jsonl")?,
        )?;
        let segments = match text("segments.jsonl")? {
            Some(t) => parse_jsonl(&path.join("segments.jsonl"), &t)?,
            None => Vec::new(),
        };
        let data = RunData {
            joined: Vec::new(),
            source: path.to_path_buf(),
            manifest,
            scenario_toml,
            records,
            repetitions,
            segments,
        };
        if data.manifest.is_some() {
            data.check_clean()?;
        }
        data.check_variants()?;
        Ok(data)
    }

    /// Refuses data from a source tree with uncommitted changes.
    fn check_clean(&self) -> Result<(), Error> {
        match self.segments.iter().find(|s| s.commit.ends_with("-dirty")) {
            Some(s) => Err(stored_err(
                &self.source.join("segments.jsonl"),
                format!(
                    "part of this run was made by a build with uncommitted changes ({}): \
                     its numbers cannot be traced to code; run it again from a clean commit",
                    s.commit
                ),
            )),
            None => Ok(()),
        }
    }

    /// Every record's variant must be one of the scenario's (a run of
    /// another version of the scenario is not this run).
    fn check_variants(&self) -> Result<(), Error> {
        let Some(known) = crate::labels::variants_of_text(&self.scenario_toml) else {
            return Err(stored_err(
                &self.source.join("scenario.toml"),
                "its matrix cannot be read",
            ));
        };
        let unknown = self
            .repetitions
            .iter()
            .map(|r| &r.variant)
            .chain(self.records.iter().map(|r| &r.variant))
            .find(|v| !known.contains(v));
        match unknown {
            Some(v) => Err(stored_err(
                &self.source,
                format!("records of variant {v:?}, which its scenario.toml does not have: a run of another version of the scenario"),
            )),
            None => Ok(()),
        }
    }

    /// The scenario's name (`name = ...` of its file).
    pub fn scenario_name(&self) -> String {
        crate::labels::name_of_text(&self.scenario_toml).unwrap_or_else(|| "unnamed".into())
    }

    /// The repetitions the scenario plans (its `repetitions`, default 10).
    pub fn planned_repetitions(&self) -> u32 {
        crate::labels::repetitions_of_text(&self.scenario_toml)
    }

    /// The variants that ran, in the scenario's order.
    pub fn variants(&self) -> Vec<String> {
        let mut variants: Vec<String> = Vec::new();
        for r in &self.repetitions {
            if !variants.contains(&r.variant) {
                variants.push(r.variant.clone());
            }
        }
        crate::labels::sort_as_scenario(&self.scenario_toml, &mut variants);
        variants
    }

    /// Repetitions done: the fewest any variant has.
    pub fn repetitions_done(&self) -> usize {
        let mut per: BTreeMap<&str, usize> = BTreeMap::new();
        for r in &self.repetitions {
            *per.entry(&r.variant).or_default() += 1;
        }
        per.values().copied().min().unwrap_or(0)
    }

    /// This run's part, for a caption.
    fn as_joined(&self) -> JoinedRun {
        JoinedRun {
            id: self.id(),
            scenario: self.scenario_name(),
            done: self.repetitions_done(),
            planned: self.planned_repetitions(),
            commits: self.commits(),
        }
    }

    /// Reads `other` as part of this run: its records, repetitions and
    /// segments join these (presets made to be read together, whose
    /// repetition r shares its seed: seed 001's loaded toy and its
    /// companions). The variants of `other` come after this run's.
    ///
    /// # Errors
    ///
    /// Both runs have a variant of the same label (which one's would a
    /// table mean?).
    pub fn join(&mut self, other: RunData) -> Result<(), Error> {
        let engine_names =
            |d: &RunData| -> Vec<String> { d.engines().into_iter().map(|e| e.name).collect() };
        if engine_names(self) != engine_names(&other) {
            return Err(stored_err(
                &other.source,
                format!(
                    "it ran on {}, {} on {}: runs read together come from one engine",
                    engine_names(&other).join(", "),
                    self.source.display(),
                    engine_names(self).join(", ")
                ),
            ));
        }
        let mine = self.variants();
        if let Some(v) = other.variants().iter().find(|v| mine.contains(v)) {
            return Err(stored_err(
                &other.source,
                format!(
                    "variant {v:?} is in {} too: runs read together need variants of their own",
                    self.source.display()
                ),
            ));
        }
        if self.joined.is_empty() {
            self.joined.push(self.as_joined());
        }
        self.joined.push(other.as_joined());
        self.records.extend(other.records);
        self.repetitions.extend(other.repetitions);
        self.segments.extend(other.segments);
        Ok(())
    }

    /// ", engine ..." for a run not made by the namespace engine alone
    /// (read together, runs share their engine: [`RunData::join`]).
    fn engine_clause(&self) -> String {
        let engines = self.engines();
        if engines.iter().all(|e| e.name == crate::engine::NAMESPACES) {
            return String::new();
        }
        let names: Vec<String> = engines.iter().map(|e| e.describe()).collect();
        format!(", engine {}", names.join(", "))
    }

    /// The run (or runs, when joined) and their commits and repetitions,
    /// as a caption's first sentence.
    pub fn caption_names(&self) -> String {
        let part = |id: &str, scenario: &str, done: usize, planned: u32| {
            format!("`{id}` (scenario `{scenario}`, {done} of {planned} planned repetitions)")
        };
        let on = self.engine_clause();
        if self.joined.is_empty() {
            return format!(
                "Run {}, commit {}{on}.",
                part(
                    &self.id(),
                    &self.scenario_name(),
                    self.repetitions_done(),
                    self.planned_repetitions()
                ),
                self.commits().join(", ")
            );
        }
        let parts: Vec<String> = self
            .joined
            .iter()
            .map(|j| {
                format!(
                    "{} at {}",
                    part(&j.id, &j.scenario, j.done, j.planned),
                    j.commits.join(", ")
                )
            })
            .collect();
        format!(
            "Runs {}{on}, read together (repetition r of each shares its seed).",
            parts.join(" and ")
        )
    }

    /// The engines that ran the run, in order, without repeats (the
    /// namespace engine for segments before engines were recorded).
    pub fn engines(&self) -> Vec<crate::engine::EngineId> {
        let mut out: Vec<crate::engine::EngineId> = Vec::new();
        for s in &self.segments {
            let e = s.engine_id();
            if !out.contains(&e) {
                out.push(e);
            }
        }
        out
    }

    /// The commits that made the run, in order, without repeats
    /// (`unknown` where a segment did not say).
    pub fn commits(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for s in &self.segments {
            if !out.contains(&s.commit) {
                out.push(s.commit.clone());
            }
        }
        if out.is_empty() {
            out.push("unknown".into());
        }
        out
    }

    /// The run's id: a stored run's id, else the directory's name.
    pub fn id(&self) -> String {
        match &self.manifest {
            Some(m) => m.id.clone(),
            None => self
                .source
                .file_name()
                .map_or_else(|| "run".into(), |n| n.to_string_lossy().into_owned()),
        }
    }
}

/// What [`store`] wrote.
#[derive(Debug)]
pub struct Stored {
    /// The stored run's folder.
    pub dir: PathBuf,
    /// Its bytes on disk, all files.
    pub bytes: u64,
    /// The run directory's bytes of the same files, uncompressed.
    pub source_bytes: u64,
}

/// Stores the run directory `run` as the stored run `out` (created, or
/// replaced if it is a stored run already, as when a resumed run grew).
/// Refuses a run with a part from a dirty tree, with no segments (its
/// build is unknown) or with an incomplete journal.
///
/// # Errors
///
/// As [`RunData::load`], and writing `out`.
pub fn store(run: &Path, out: &Path) -> Result<Stored, Error> {
    if is_stored(run) {
        return Err(stored_err(run, "already a stored run"));
    }
    let data = RunData::load(run)?;
    data.check_clean()?;
    if data.segments.is_empty() || data.commits().iter().any(|c| c == "unknown") {
        return Err(stored_err(
            &run.join("segments.jsonl"),
            "the run does not say which commit made it (no segments, or `unknown`): \
             it cannot be stored as research output",
        ));
    }
    if out.exists() && !is_stored(out) {
        return Err(stored_err(
            out,
            "exists and is not a stored run: not overwritten",
        ));
    }
    let id = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| stored_err(out, "needs a folder name (the run's id)"))?;
    // Written beside, then swapped in: a failure leaves the old copy whole.
    let tmp = out.with_file_name(format!(".{id}.storing"));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| read_err(&tmp, e))?;
    }
    fs::create_dir_all(&tmp).map_err(|e| read_err(&tmp, e))?;
    let mut files = BTreeMap::new();
    let (mut bytes, mut source_bytes) = (0u64, 0u64);
    for name in COMPRESSED.iter().chain(PLAIN.iter()) {
        let src = run.join(name);
        let content = match fs::read(&src) {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !REQUIRED.contains(name) => {
                continue
            }
            Err(e) => return Err(read_err(&src, e)),
        };
        source_bytes += content.len() as u64;
        files.insert((*name).to_string(), sha256_hex(&content));
        let (dst, written) = if COMPRESSED.contains(name) {
            let z = zstd::stream::encode_all(content.as_slice(), ZSTD_LEVEL)
                .map_err(|e| read_err(&src, e))?;
            (tmp.join(format!("{name}.zst")), z)
        } else {
            (tmp.join(name), content)
        };
        bytes += written.len() as u64;
        fs::write(&dst, written).map_err(|e| read_err(&dst, e))?;
    }
    let manifest = Manifest {
        format: STORED_FORMAT,
        id,
        scenario: data.scenario_name(),
        files,
    };
    let text = serde_json::to_string_pretty(&manifest).unwrap_or_default() + "\n";
    bytes += text.len() as u64;
    fs::write(tmp.join(MANIFEST), text).map_err(|e| read_err(&tmp.join(MANIFEST), e))?;
    // Read back as a reader will, before it replaces anything.
    RunData::load(&tmp)?;
    if out.exists() {
        fs::remove_dir_all(out).map_err(|e| read_err(out, e))?;
    }
    fs::rename(&tmp, out).map_err(|e| read_err(out, e))?;
    Ok(Stored {
        dir: out.to_path_buf(),
        bytes,
        source_bytes,
    })
}

/// Writes the stored run `stored` out as a run directory `out` (which
/// must not exist), so that `lab run --resume --out OUT` continues it on
/// any machine; store it again when the part is done.
///
/// # Errors
///
/// As [`RunData::load`], and writing `out`.
pub fn unpack(stored: &Path, out: &Path) -> Result<(), Error> {
    if !is_stored(stored) {
        return Err(stored_err(stored, "not a stored run (no stored.json)"));
    }
    let data = RunData::load(stored)?;
    if out.exists() {
        return Err(stored_err(out, "exists: unpack into a new directory"));
    }
    fs::create_dir_all(out).map_err(|e| read_err(out, e))?;
    let manifest = data.manifest.as_ref().map(|m| m.files.keys().cloned());
    for name in manifest.into_iter().flatten() {
        if let Some(text) = file_text(stored, data.manifest.as_ref(), &name)? {
            fs::write(out.join(&name), text).map_err(|e| read_err(&out.join(&name), e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;

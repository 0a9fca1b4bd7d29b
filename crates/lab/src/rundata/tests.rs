use super::*;

const SCENARIO: &str = r#"name = "tiny"
topology = "topologies/seed000-path.toml"
repetitions = 6
[matrix]
transport = ["tls", "quic"]
"#;

fn record(variant: &str, repetition: u32, ttlb: f64) -> TransferRecord {
    TransferRecord {
        workload: "web".into(),
        kind: "download".into(),
        index: 0,
        size: 1000,
        start_unix_ms: 0.0,
        connect_ms: Some(5.0),
        ttfb_ms: Some(ttlb / 2.0),
        ttlb_ms: Some(ttlb),
        goodput_mib_s: Some(1.0),
        longest_gap_ms: None,
        stalled: false,
        timed_out: false,
        probe_latency_ms: Vec::new(),
        error: None,
        variant: variant.into(),
        repetition,
        seed: u64::from(repetition),
    }
}

fn jsonl<T: Serialize>(items: &[T]) -> String {
    items
        .iter()
        .map(|i| serde_json::to_string(i).unwrap() + "\n")
        .collect()
}

/// A run directory of two variants, three repetitions, made by `commit`.
fn run_dir(commit: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut records = Vec::new();
    let mut reps = Vec::new();
    for rep in 0..3 {
        for (v, base) in [("transport=tls", 100.0), ("transport=quic", 80.0)] {
            records.push(record(v, rep, base + f64::from(rep)));
            reps.push(RepetitionRecord {
                variant: v.into(),
                repetition: rep,
                ..RepetitionRecord::default()
            });
        }
    }
    let seg = Segment {
        commit: commit.into(),
        ..Segment::default()
    };
    let p = dir.path();
    fs::write(p.join("scenario.toml"), SCENARIO).unwrap();
    fs::write(p.join("topology.toml"), "# topology\n").unwrap();
    fs::write(p.join("records.jsonl"), jsonl(&records)).unwrap();
    fs::write(p.join("records.csv"), "not stored\n").unwrap();
    fs::write(p.join("repetitions.jsonl"), jsonl(&reps)).unwrap();
    fs::write(p.join("segments.jsonl"), jsonl(&[seg])).unwrap();
    dir
}

#[test]
fn a_stored_run_reads_as_its_directory() {
    let run = run_dir("0123456789ab");
    let dest = tempfile::tempdir().unwrap();
    let out = dest.path().join("tiny-1");
    let stored = store(run.path(), &out).unwrap();
    assert!(stored.bytes > 0 && out.join("records.jsonl.zst").is_file());
    assert!(!out.join("records.csv").exists());
    let a = RunData::load(run.path()).unwrap();
    let b = RunData::load(&out).unwrap();
    assert_eq!(a.records, b.records);
    assert_eq!(
        serde_json::to_string(&a.repetitions).unwrap(),
        serde_json::to_string(&b.repetitions).unwrap()
    );
    assert_eq!(a.scenario_toml, b.scenario_toml);
    assert_eq!(b.id(), "tiny-1");
    assert_eq!(b.scenario_name(), "tiny");
    assert_eq!(b.planned_repetitions(), 6);
    assert_eq!(b.repetitions_done(), 3);
    assert_eq!(b.commits(), ["0123456789ab"]);
    assert_eq!(b.variants(), ["transport=tls", "transport=quic"]);
    // Stored again (a resumed run that grew): replaced whole.
    store(run.path(), &out).unwrap();
    // Unpacked, it is a run directory with the same data.
    let back = dest.path().join("back");
    unpack(&out, &back).unwrap();
    assert_eq!(RunData::load(&back).unwrap().records, a.records);
    assert!(unpack(&out, &back).is_err(), "unpack never overwrites");
}

#[test]
fn a_changed_or_truncated_stored_file_is_named() {
    let run = run_dir("0123456789ab");
    let dest = tempfile::tempdir().unwrap();
    let out = dest.path().join("tiny");
    store(run.path(), &out).unwrap();
    let z = out.join("records.jsonl.zst");
    let bytes = fs::read(&z).unwrap();
    fs::write(&z, &bytes[..bytes.len() / 2]).unwrap();
    let e = RunData::load(&out).unwrap_err().to_string();
    assert!(e.contains("records.jsonl.zst") && e.contains("zstd"), "{e}");

    // A record changed and compressed again: the digest catches it.
    let text = fs::read_to_string(run.path().join("records.jsonl")).unwrap();
    let changed = text.replacen("\"ttlb_ms\":100.0", "\"ttlb_ms\":101.0", 1);
    assert_ne!(text, changed);
    fs::write(&z, zstd::stream::encode_all(changed.as_bytes(), 3).unwrap()).unwrap();
    let e = RunData::load(&out).unwrap_err().to_string();
    assert!(
        e.contains("records.jsonl.zst") && e.contains("SHA-256"),
        "{e}"
    );

    fs::remove_file(&z).unwrap();
    let e = RunData::load(&out).unwrap_err().to_string();
    assert!(e.contains("records.jsonl.zst"), "{e}");
    let e = RunData::load(&dest.path().join("nowhere"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("nowhere") && e.contains("no such run"), "{e}");
}

#[test]
fn dirty_and_unknown_builds_are_refused() {
    let dest = tempfile::tempdir().unwrap();
    let dirty = run_dir("0123456789ab-dirty");
    let e = store(dirty.path(), &dest.path().join("d"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("uncommitted") && e.contains("segments.jsonl"),
        "{e}"
    );
    let unknown = run_dir("unknown");
    let e = store(unknown.path(), &dest.path().join("u"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("which commit"), "{e}");

    // A stored run whose segments were edited to a dirty build.
    let clean = run_dir("0123456789ab");
    let out = dest.path().join("c");
    store(clean.path(), &out).unwrap();
    let seg = jsonl(&[Segment {
        commit: "0123456789ab-dirty".into(),
        ..Segment::default()
    }]);
    fs::write(out.join("segments.jsonl"), &seg).unwrap();
    let mut m: Manifest =
        serde_json::from_str(&fs::read_to_string(out.join(MANIFEST)).unwrap()).unwrap();
    m.files
        .insert("segments.jsonl".into(), sha256_hex(seg.as_bytes()));
    fs::write(out.join(MANIFEST), serde_json::to_string(&m).unwrap()).unwrap();
    let e = RunData::load(&out).unwrap_err().to_string();
    assert!(e.contains("uncommitted"), "{e}");
}

#[test]
fn records_of_another_scenario_version_are_refused() {
    let run = run_dir("0123456789ab");
    fs::write(
        run.path().join("scenario.toml"),
        SCENARIO.replace("\"quic\"", "\"quic-conn-per-circuit\""),
    )
    .unwrap();
    let e = RunData::load(run.path()).unwrap_err().to_string();
    assert!(
        e.contains("transport=quic") && e.contains("another version"),
        "{e}"
    );
    let torn = run_dir("0123456789ab");
    fs::write(torn.path().join("records.jsonl"), "{\"workload\": 3}\n").unwrap();
    let e = RunData::load(torn.path()).unwrap_err().to_string();
    assert!(e.contains("records.jsonl:1"), "{e}");
}

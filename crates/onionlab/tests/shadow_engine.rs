//! `onionlab lab run --engine shadow` end to end: the bundled
//! `quic-quick` scenario (tls, quic and quic-conn-per-circuit, one
//! repetition) as Shadow simulations, with the records, logs and metadata
//! a namespace run leaves. Needs the `shadow` binary (built from
//! `../shared/vendor/shadow/`): without it the test says SKIPPED, unless
//! ONIONLAB_REQUIRE_SHADOW=1, where that is a failure.

use std::path::PathBuf;
use std::process::Command;

use onionlab_lab::agent::TransferRecord;
use onionlab_lab::engine::shadow::{Shadow, ShadowOptions};
use onionlab_lab::run::RepetitionRecord;

/// Whether Shadow is installed; see the module's documentation.
fn shadow_available() -> bool {
    let opts = ShadowOptions {
        bin: PathBuf::from(env!("CARGO_BIN_EXE_onionlab")),
        parallelism: 0,
        log: None,
    };
    match Shadow::new(None, opts) {
        Ok(_) => true,
        Err(e) if std::env::var("ONIONLAB_REQUIRE_SHADOW").as_deref() == Ok("1") => {
            panic!("ONIONLAB_REQUIRE_SHADOW=1 but Shadow is unavailable: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            false
        }
    }
}

/// The lines of a JSON-lines file.
fn lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn quic_quick_runs_on_the_shadow_engine() {
    if !shadow_available() {
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::env::temp_dir().join(format!("onionlab-shadow-engine-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let status = Command::new(env!("CARGO_BIN_EXE_onionlab"))
        .current_dir(&root)
        .args([
            "--log",
            "warn",
            "lab",
            "run",
            "quic-quick",
            "--engine",
            "shadow",
        ])
        .args(["--reps", "1", "--out"])
        .arg(&out)
        .status()
        .expect("onionlab runs");
    assert!(status.success(), "lab run --engine shadow failed: {status}");

    // Every transfer of the three variants arrives whole.
    let records: Vec<TransferRecord> = lines(&out.join("records.jsonl"))
        .iter()
        .map(|l| serde_json::from_str(l).expect("a transfer record"))
        .collect();
    assert_eq!(records.len(), 9, "three 320 KiB downloads per variant");
    for r in &records {
        assert_eq!(r.error, None, "{} {}", r.variant, r.index);
        assert!(r.ttlb_ms.is_some_and(|t| t > 0.0));
    }
    // Simulated time: the first byte after the circuit is up takes one
    // round trip of the circuit (three 20 ms hops and the exit's 1 ms to
    // its server, both ways), whatever the machine's load.
    let ttfb: Vec<f64> = records
        .iter()
        .filter(|r| r.index > 0 && r.variant.contains("transport=tls"))
        .filter_map(|r| r.ttfb_ms)
        .collect();
    assert!(!ttfb.is_empty());
    for t in ttfb {
        assert!((120.0..130.0).contains(&t), "TTFB {t} ms");
    }

    // The metadata says which engine ran it, with Shadow's version and seed.
    let segments = std::fs::read_to_string(out.join("segments.jsonl")).expect("segments");
    assert!(segments.contains("\"engine\":\"shadow\""), "{segments}");
    assert!(segments.contains("Shadow 3"), "{segments}");
    let reps: Vec<RepetitionRecord> = lines(&out.join("repetitions.jsonl"))
        .iter()
        .map(|l| serde_json::from_str(l).expect("a repetition record"))
        .collect();
    assert_eq!(reps.len(), 3);
    for r in &reps {
        assert_eq!(r.simulator_seed, Some(r.seed & u64::from(u32::MAX)));
        assert!(!r.cpu_saturated);
        assert_eq!(r.circuit_build_ms.len(), 1, "{}", r.variant);
        assert_eq!(r.client_paths.len(), 1, "{}", r.variant);
    }
    // The processes' logs are where a namespace run has them.
    let log = std::fs::read_to_string(out.join("raw/rep000-v00/client-op.log")).expect("log");
    assert!(log.contains("circuit built"), "{log}");

    // The report reads it as any run.
    let report = Command::new(env!("CARGO_BIN_EXE_onionlab"))
        .args(["lab", "report"])
        .arg(&out)
        .output()
        .expect("onionlab runs");
    assert!(report.status.success(), "{report:?}");
    let md = std::fs::read_to_string(out.join("report/report.md")).expect("report");
    assert!(md.contains("Shadow 3"), "the report names the engine");

    // A run continues only on its own engine.
    let resumed = Command::new(env!("CARGO_BIN_EXE_onionlab"))
        .current_dir(&root)
        .args([
            "lab",
            "run",
            "quic-quick",
            "--reps",
            "1",
            "--resume",
            "--out",
        ])
        .arg(&out)
        .output()
        .expect("onionlab runs");
    let err = String::from_utf8_lossy(&resumed.stderr);
    if onionlab_netem::check_privileges().is_ok() {
        assert!(!resumed.status.success());
        assert!(err.contains("--engine shadow"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// Every bundled scenario's Shadow export (each variant's first
/// repetition) is a configuration Shadow's own parser accepts
/// (`shadow --show-config`); a variant Shadow cannot run is refused for
/// a reason docs/shadow.md gives.
#[test]
fn every_preset_exports_a_configuration_shadow_accepts() {
    if !shadow_available() {
        return;
    }
    let shadow = onionlab_lab::engine::shadow::install::installed_shadow().expect("shadow");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::env::temp_dir().join(format!("onionlab-shadow-presets-{}", std::process::id()));
    let mut scenarios: Vec<PathBuf> = std::fs::read_dir(root.join("scenarios"))
        .expect("scenarios/")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    scenarios.sort();
    assert!(scenarios.len() > 10, "{scenarios:?}");
    let (mut accepted, mut refused) = (0, Vec::new());
    for s in &scenarios {
        let _ = std::fs::remove_dir_all(&out);
        let export = Command::new(env!("CARGO_BIN_EXE_onionlab"))
            .args(["lab", "export-shadow"])
            .arg(s)
            .arg(&out)
            .output()
            .expect("onionlab runs");
        let stdout = String::from_utf8_lossy(&export.stdout);
        let stderr = String::from_utf8_lossy(&export.stderr);
        if !export.status.success() {
            assert!(
                stderr.contains("Shadow can run none of the variants"),
                "{}: {stderr}",
                s.display()
            );
            assert_documented_refusals(s, &stdout);
            refused.push(s.clone());
            continue;
        }
        if stdout.contains("not written: ") {
            assert_documented_refusals(s, &stdout);
        }
        let dirs: Vec<PathBuf> = std::fs::read_dir(&out)
            .expect("the export")
            .map(|e| e.expect("an entry").path())
            .collect();
        assert!(!dirs.is_empty(), "{}", s.display());
        for dir in dirs {
            let parsed = Command::new(&shadow)
                .args(["--show-config", onionlab_lab::engine::shadow::CONFIG_FILE])
                .current_dir(&dir)
                .output()
                .expect("shadow runs");
            assert!(
                parsed.status.success(),
                "{}: Shadow refuses {}: {}",
                s.display(),
                dir.display(),
                String::from_utf8_lossy(&parsed.stderr)
            );
            accepted += 1;
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    eprintln!(
        "{accepted} configurations accepted; refused whole: {}",
        refused.len()
    );
    assert!(accepted > 100, "{accepted}");
}

/// The reasons docs/shadow.md gives for a variant Shadow cannot run.
const DOCUMENTED_REFUSALS: [&str; 4] = [
    "C tor variants do not run on the Shadow engine yet",
    "has a bottleneck of its own",
    "has protocols blocked",
    "needs TUN devices, which Shadow does not have",
];

/// Checks that every variant `lab export-shadow` did not write (its
/// `not written: LABEL: REASON` lines) was refused for a documented reason.
fn assert_documented_refusals(scenario: &std::path::Path, stdout: &str) {
    let reasons: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("not written: "))
        .collect();
    assert!(!reasons.is_empty(), "{}: {stdout}", scenario.display());
    for r in reasons {
        assert!(
            DOCUMENTED_REFUSALS.iter().any(|d| r.contains(d)),
            "{}: an undocumented refusal: {r}",
            scenario.display()
        );
    }
}

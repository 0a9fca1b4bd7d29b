//! Report findings: each transport against TLS of the same condition (times
//! per workload and wire overhead), and the stall rate per variant.

use onionlab_lab::agent::TransferRecord;
use onionlab_lab::labels::{combinations, full_label, ReportSettings};
use onionlab_lab::run::RepetitionRecord;
use onionlab_lab::summary::{report_input, stall_rate_notes, RunFacts};
use onionlab_report::VariantCounts;

fn rep(variant: &str, repetition: u32, wire_overhead: Option<f64>) -> RepetitionRecord {
    RepetitionRecord {
        variant: variant.into(),
        repetition,
        seed: u64::from(repetition),
        wall_s: 1.0,
        cpu_busy_fraction: 0.1,
        cpu_saturated: false,
        relay_cpu_s: Vec::new(),
        relay_peak_rss: Vec::new(),
        circuit_build_ms: Vec::new(),
        links: Vec::new(),
        payload_bytes: 1000,
        wire_overhead,
        ..RepetitionRecord::default()
    }
}

#[test]
fn stall_rates() {
    let c = |v: &str, transfers, stalls| VariantCounts {
        variant: v.into(),
        transfers,
        stalls,
        ..VariantCounts::default()
    };
    let short = ["tls".to_string(), "quic".to_string()];
    let notes = stall_rate_notes(
        &[c("transport=tls", 200, 0), c("transport=quic", 200, 50)],
        &short,
    );
    assert_eq!(
        notes,
        ["Stall rate (transfers with a stall, of all transfers) of the variants that stalled: quic: 25.0% (50/200); the others had none."]
    );
    let none = stall_rate_notes(&[c("transport=tls", 200, 0)], &short);
    assert_eq!(none, ["No transfer stalled (200 transfers)."]);
    assert!(stall_rate_notes(&[c("x", 0, 0)], &short).is_empty());
}

#[test]
fn findings_tables_compare_each_transport_with_tls_of_the_same_condition() {
    let matrix = vec![
        (
            "latency".to_string(),
            vec!["20ms".to_string(), "40ms".to_string()],
        ),
        (
            "transport".to_string(),
            vec!["tls".to_string(), "quic".to_string()],
        ),
    ];
    let combos = combinations(&matrix);
    let variants: Vec<String> = combos.iter().map(|c| full_label(c)).collect();
    let design = ReportSettings::default().design(&matrix, &combos);
    let record =
        |variant: &str, repetition: u32, workload: &str, ttlb: Option<f64>| TransferRecord {
            variant: variant.into(),
            repetition,
            workload: workload.into(),
            ttfb_ms: Some(10.0),
            ttlb_ms: ttlb,
            error: ttlb.is_none().then(|| "cut short".to_string()),
            ..TransferRecord::default()
        };
    let mut records = Vec::new();
    let mut reps = Vec::new();
    for i in 0..10 {
        let x = f64::from(i);
        for (v, base) in variants.iter().zip([200.0, 100.0, 400.0, 400.0]) {
            records.push(record(v, i as u32, "light", Some(base + x)));
            // A failed transfer has no last byte: left out, not counted as 0.
            let bulk = (i != 0 || base != 100.0).then_some(10.0 * base + x);
            records.push(record(v, i as u32, "bulk", bulk));
        }
        for (v, overhead) in variants.iter().zip([1.04, 1.10, 1.05, 1.12]) {
            reps.push(rep(v, i as u32, Some(overhead + x / 1000.0)));
        }
    }
    let facts = RunFacts {
        title: "t",
        scenario_toml: "",
        meta: Vec::new(),
        variants: &variants,
        design,
    };
    let input = report_input(facts, &records, &reps);
    let dir = tempfile::tempdir().unwrap();
    let files = onionlab_report::write_report(&input, dir.path()).unwrap();
    let text = &files.findings_text;
    // Per workload TTLB and TTFB (two workloads), and the wire overhead.
    assert!(text.contains("light: time to last byte"), "{text}");
    assert!(text.contains("bulk: time to first byte"), "{text}");
    assert!(text.contains("wire bytes per payload byte"), "{text}");
    // light at 20 ms: quic 104.5 against tls 204.5; at 40 ms equal.
    let light = text
        .split("\n\n")
        .find(|t| t.starts_with("light: time to last byte"))
        .unwrap();
    let row = |cond: &str| {
        light
            .lines()
            .find(|l| l.starts_with(cond))
            .unwrap()
            .to_string()
    };
    assert!(row("latency 20ms").contains("204.5"), "{light}");
    assert!(row("latency 20ms").contains("0.511 ["), "{light}");
    assert!(row("latency 20ms").contains("✱"), "{light}");
    assert!(row("latency 40ms").contains("1.000 ["), "{light}");
    assert!(!row("latency 40ms").contains("✱"), "{light}");
    let md = std::fs::read_to_string(&files.markdown).unwrap();
    // The stall note says none stalled; the labels are short.
    assert!(md.contains("No transfer stalled (80 transfers)."), "{md}");
    assert!(
        md.contains("| quic, latency 20ms | quic | 20ms | latency=20ms transport=quic |"),
        "{md}"
    );
}

/// A copy of the stored run `tests/data/demo-run` (the demo scenario, 3
/// repetitions, recorded at commit b4b6224) in a fresh directory.
fn stored_run() -> tempfile::TempDir {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/demo-run");
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "records.jsonl",
        "repetitions.jsonl",
        "scenario.toml",
        "segments.jsonl",
    ] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    dir
}

#[test]
fn a_stored_run_gives_findings_per_condition() {
    let run = stored_run();
    let files = onionlab_lab::summary::report_dir(run.path(), None).unwrap();
    let text = &files.findings_text;
    let light = text
        .split("\n\n")
        .find(|t| t.starts_with("light: time to first byte"))
        .unwrap_or_else(|| panic!("no light TTFB table: {text}"));
    // Under 1% loss the light client's first byte comes sooner over QUIC,
    // with a stream (0.325) or a connection (0.288) per circuit. Its four
    // echoes a repetition are compared by repetition: three repetitions
    // cannot decide (p = 0.1 at best, 0.4 once adjusted for the table's 4
    // comparisons), and the report says so.
    let row = light.lines().find(|l| l.starts_with("loss 1%")).unwrap();
    assert!(row.contains("428.7"), "{row}");
    assert!(row.contains("0.325 [0.265, 0.385], p adj. = 0.40"), "{row}");
    assert!(row.contains("0.288 [0.253, 0.294], p adj. = 0.40"), "{row}");
    assert!(!row.contains('✱'), "{row}");
    let md = std::fs::read_to_string(&files.markdown).unwrap();
    assert!(md.contains("over only 3 repetitions"), "{md}");
    assert!(md.contains("(exact, medians of 3 repetitions)"), "{md}");
    assert!(md.contains("| **commit** | b4b622448f50-dirty |"), "{md}");
    assert!(md.contains("| quic-conn-per-circuit, loss 1% |"), "{md}");
}

#[test]
fn stored_runs_are_compared_and_mismatches_refused() {
    let (a, b) = (stored_run(), stored_run());
    let same = onionlab_lab::summary::compare_dirs(a.path(), b.path()).unwrap();
    let rows: Vec<&str> = same
        .text
        .lines()
        .filter(|l| l.starts_with("quic") || l.starts_with("tls"))
        .collect();
    // 5 headline metrics x 6 variants, every one equal to itself (the
    // bootstrap resamples the two sides apart, so only the point is exact).
    assert_eq!(rows.len(), 30, "{}", same.text);
    for r in rows {
        assert!(
            r.contains("1.000 [") && r.contains("1.00") && !r.contains('✱'),
            "{r}"
        );
    }
    // A changed scenario file is compared, with a warning first.
    let scenario = b.path().join("scenario.toml");
    let text = std::fs::read_to_string(&scenario).unwrap();
    std::fs::write(&scenario, format!("{text}# changed\n")).unwrap();
    let changed = onionlab_lab::summary::compare_dirs(a.path(), b.path()).unwrap();
    assert!(changed
        .text
        .starts_with("WARNING: the two runs' scenario files differ"));
    // Runs of two scenarios are not compared.
    std::fs::write(
        &scenario,
        text.replace("name = \"demo\"", "name = \"other\""),
    )
    .unwrap();
    let e = onionlab_lab::summary::compare_dirs(a.path(), b.path()).unwrap_err();
    assert!(
        e.to_string().contains("compare runs of one scenario"),
        "{e}"
    );
}

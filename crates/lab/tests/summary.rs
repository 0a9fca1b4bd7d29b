//! Report findings: times and wire overhead relative to the TLS counterpart, and
//! the stall rate per variant.

use onionlab_lab::agent::TransferRecord;
use onionlab_lab::run::RepetitionRecord;
use onionlab_lab::summary::{
    overhead_vs_tls_notes, stall_rate_notes, times_vs_tls_notes, tls_counterpart,
};
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
fn counterparts() {
    assert_eq!(
        tls_counterpart("latency=20ms transport=quic").as_deref(),
        Some("latency=20ms transport=tls")
    );
    assert_eq!(
        tls_counterpart("transport=quic-conn-per-circuit size=5 MiB").as_deref(),
        Some("transport=tls size=5 MiB")
    );
    assert_eq!(tls_counterpart("latency=20ms transport=tls"), None);
    assert_eq!(tls_counterpart("default"), None);
    assert_eq!(tls_counterpart("scheduler=ewma"), None);
}

#[test]
fn overhead_relative_to_tls() {
    let variants: Vec<String> = [
        "latency=20ms transport=tls",
        "latency=20ms transport=quic",
        "latency=40ms transport=quic",
    ]
    .map(String::from)
    .to_vec();
    let mut reps = Vec::new();
    for (i, (t, q)) in [(1.04, 1.10), (1.05, 1.12), (1.06, 1.14)]
        .iter()
        .enumerate()
    {
        reps.push(rep(&variants[0], i as u32, Some(*t)));
        reps.push(rep(&variants[1], i as u32, Some(*q)));
        reps.push(rep(&variants[2], i as u32, Some(*q)));
    }
    reps.push(rep(&variants[1], 9, None));
    let notes = overhead_vs_tls_notes(&variants, &reps);
    // 40 ms has no TLS counterpart in this run.
    assert_eq!(notes.len(), 1, "{notes:?}");
    let n = &notes[0];
    assert!(
        n.starts_with("wire overhead relative to TLS: latency=20ms transport=quic: +6.7%"),
        "{n}"
    );
    assert!(n.contains("median 1.1200"), "{n}");
    assert!(
        n.contains("against 1.0500 for latency=20ms transport=tls over 3"),
        "{n}"
    );
    assert!(n.contains("ratio 1.0667"), "{n}");
}

#[test]
fn stall_rates() {
    let c = |v: &str, transfers, stalls| VariantCounts {
        variant: v.into(),
        transfers,
        stalls,
        ..VariantCounts::default()
    };
    let notes = stall_rate_notes(&[c("transport=tls", 200, 0), c("transport=quic", 200, 50)]);
    assert_eq!(
        notes,
        ["stall rate (transfers with a stall, of all transfers): transport=tls: 0.0% (0/200); transport=quic: 25.0% (50/200)"]
    );
    assert!(stall_rate_notes(&[c("x", 0, 0)]).is_empty());
}

#[test]
fn times_relative_to_tls_per_workload() {
    let variants: Vec<String> = ["transport=tls", "transport=quic", "transport=auto"]
        .map(String::from)
        .to_vec();
    let record = |variant: &str, workload: &str, ttfb: f64, ttlb: Option<f64>| TransferRecord {
        variant: variant.into(),
        workload: workload.into(),
        ttfb_ms: Some(ttfb),
        ttlb_ms: ttlb,
        ..TransferRecord::default()
    };
    let mut records = Vec::new();
    for i in 0..10 {
        let x = f64::from(i);
        records.push(record("transport=tls", "light", 100.0 + x, Some(200.0 + x)));
        records.push(record("transport=quic", "light", 50.0 + x, Some(400.0 + x)));
        records.push(record(
            "transport=tls",
            "bulk",
            1000.0 + x,
            Some(5000.0 + x),
        ));
        // A failed transfer has no last byte: left out, not counted as 0.
        let ttlb = (i != 0).then_some(5000.0 + x);
        records.push(record("transport=quic", "bulk", 1000.0 + x, ttlb));
    }
    let notes = times_vs_tls_notes(&variants, &records);
    // quic x {bulk, light} x {TTFB, TTLB}; auto has no records.
    assert_eq!(notes.len(), 4, "{notes:#?}");
    let light_ttfb = notes
        .iter()
        .find(|n| n.starts_with("TTFB vs TLS, workload light: transport=quic:"))
        .expect("light TTFB");
    assert!(
        light_ttfb.contains("median 54.5 ms vs 104.5 ms"),
        "{light_ttfb}"
    );
    assert!(light_ttfb.contains("ratio 0.522"), "{light_ttfb}");
    assert!(light_ttfb.contains("p < 0.0001"), "{light_ttfb}");
    let bulk_ttlb = notes
        .iter()
        .find(|n| n.starts_with("TTLB vs TLS, workload bulk: transport=quic:"))
        .expect("bulk TTLB");
    assert!(bulk_ttlb.contains("(n = 9 vs 10)"), "{bulk_ttlb}");
}

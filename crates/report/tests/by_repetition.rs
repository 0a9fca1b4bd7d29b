//! Metrics with several values to a repetition are compared by repetition:
//! the report's interval follows the repetitions, not the count of values.

use onionlab_report::*;

/// 100 transfers in each repetition, alike within it (repetition r from
/// `levels[r]` to 10 above).
fn transfers(levels: &[f64]) -> (Vec<f64>, Vec<u32>) {
    let mut values = Vec::new();
    let mut reps = Vec::new();
    for (rep, level) in levels.iter().enumerate() {
        for i in 0..100 {
            values.push(level + i as f64 * 0.1);
            reps.push(rep as u32);
        }
    }
    (values, reps)
}

/// tls and quic over ten repetitions, quic's median 10% lower; the
/// repetitions differ far more than that, and not in the same order for
/// both.
fn input(with_repetitions: bool) -> ReportInput {
    let tls_levels = [
        150.0, 60.0, 120.0, 80.0, 100.0, 140.0, 70.0, 110.0, 90.0, 130.0,
    ];
    let quic_levels = [
        60.0, 120.0, 90.0, 140.0, 100.0, 70.0, 130.0, 80.0, 150.0, 110.0,
    ];
    let (tls, tls_reps) = transfers(&tls_levels);
    let (quic, quic_reps) = transfers(&quic_levels.map(|l| l * 0.9));
    ReportInput {
        title: "by repetition".to_string(),
        variants: vec!["tls".to_string(), "quic".to_string()],
        metrics: vec![Metric {
            key: "ttlb_ms".to_string(),
            title: "time to last byte".to_string(),
            unit: "ms".to_string(),
            lower_is_better: true,
            headline: true,
            values: vec![("tls".to_string(), tls), ("quic".to_string(), quic)],
            repetitions: if with_repetitions {
                vec![
                    ("tls".to_string(), tls_reps),
                    ("quic".to_string(), quic_reps),
                ]
            } else {
                vec![]
            },
        }],
        ..ReportInput::default()
    }
}

fn markdown(input: &ReportInput) -> String {
    let dir = tempfile::tempdir().unwrap();
    let files = write_report(input, dir.path()).unwrap();
    std::fs::read_to_string(&files.markdown).unwrap()
}

/// The metric table's row of quic, with its `n` values.
fn quic_row(md: &str, n: usize) -> &str {
    let start = format!("| quic | {n} |");
    md.lines()
        .find(|l| l.starts_with(&start))
        .unwrap_or_else(|| panic!("no quic row in {md}"))
}

#[test]
fn repeated_values_of_a_repetition_are_compared_by_repetition() {
    let md = markdown(&input(true));
    let row = quic_row(&md, 1000);
    assert!(row.contains(", medians of 10 repetitions)"), "{row}");
    // Ten repetitions that differ far more than the variants: nothing is
    // decided.
    assert!(!row.contains("lower (better)"), "{row}");
    assert!(!row.contains('✱'), "{row}");
    assert!(md.contains("By repetition: time to last byte."), "{md}");
}

/// The width of the median's 95% interval in a metric table row (its
/// seventh column: variant, n, median, p10, p90, mean [CI], median CI).
fn median_ci_width(row: &str) -> f64 {
    // Markdown escapes the brackets.
    let cell = row.split('|').nth(7).unwrap().trim().replace('\\', "");
    let bounds: Vec<f64> = cell
        .trim_matches(|c| c == '[' || c == ']')
        .split(", ")
        .map(|x| x.parse().unwrap())
        .collect();
    bounds[1] - bounds[0]
}

#[test]
fn a_variant_of_repeated_values_has_its_intervals_by_repetition() {
    let by_rep = markdown(&input(true));
    let independent = markdown(&input(false));
    let (wide, narrow) = (
        median_ci_width(quic_row(&by_rep, 1000)),
        median_ci_width(quic_row(&independent, 1000)),
    );
    // Ten repetitions from 54 to 135 ms: the median of a resample of them
    // moves by tens of ms; 1000 independent values pin it to a few.
    assert!(wide > 20.0 && narrow < 10.0, "{wide} against {narrow}");
    assert!(
        by_rep.contains("resample its repetitions likewise"),
        "{by_rep}"
    );
}

#[test]
fn without_repetitions_the_same_values_count_as_independent() {
    let md = markdown(&input(false));
    let row = quic_row(&md, 1000);
    assert!(!row.contains("repetitions"), "{row}");
    // 1000 values a side make the independent interval sure of itself:
    // the reason the lab records repetitions.
    assert!(row.contains("lower (better)"), "{row}");
    assert!(md.contains("By repetition: none in this report."), "{md}");
}

#[test]
fn one_value_per_repetition_stays_an_independent_comparison() {
    let mut one_each = input(true);
    let m = &mut one_each.metrics[0];
    for (_, values) in &mut m.values {
        values.truncate(10);
    }
    for (_, reps) in &mut m.repetitions {
        *reps = (0..10).collect();
    }
    let md = markdown(&one_each);
    assert!(!quic_row(&md, 10).contains("repetitions"), "{md}");
}

#[test]
fn repetitions_that_do_not_fit_the_values_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut bad = input(true);
    bad.metrics[0].repetitions[1].1.pop();
    assert!(matches!(
        write_report(&bad, &out),
        Err(Error::RepetitionCount { ref variant, values: 1000, repetitions: 999, .. }) if variant == "quic"
    ));
    let mut bad = input(true);
    bad.metrics[0].repetitions.push(("tor".to_string(), vec![]));
    assert!(matches!(
        write_report(&bad, &out),
        Err(Error::UnknownVariant { .. })
    ));
    assert!(!out.exists());
}

#[test]
fn two_runs_are_compared_by_repetition_too() {
    // Run B's tls is run A's quic: repetition by repetition B is sometimes
    // faster and sometimes slower, so nothing is flagged.
    let a = input(true);
    let mut b = input(true);
    let quic = b.metrics[0].values[1].1.clone();
    b.metrics[0].values[0].1 = quic;
    let by_rep = compare_runs(&a, &b, ("a", "b")).unwrap();
    let tls_row = by_rep
        .text
        .lines()
        .find(|l| l.trim_start().starts_with("tls"))
        .unwrap();
    assert!(!tls_row.contains('✱'), "{}", by_rep.text);
    let (mut a_iid, mut b_iid) = (a.clone(), b.clone());
    a_iid.metrics[0].repetitions.clear();
    b_iid.metrics[0].repetitions.clear();
    let iid = compare_runs(&a_iid, &b_iid, ("a", "b")).unwrap();
    assert_ne!(iid.text, by_rep.text);
}

//! The ratio of medians for clustered values (the lab's transfers of one
//! repetition): its interval follows the clusters, not the count of values.

use onionlab_stats::*;

/// `per_cluster` values for each cluster level, from the level to 10 above,
/// with their cluster ids 0, 1, ...
fn clustered(levels: &[f64], per_cluster: usize) -> (Vec<f64>, Vec<u32>) {
    let mut values = Vec::new();
    let mut clusters = Vec::new();
    for (id, level) in levels.iter().enumerate() {
        for i in 0..per_cluster {
            values.push(level + i as f64 * 10.0 / per_cluster as f64);
            clusters.push(id as u32);
        }
    }
    (values, clusters)
}

#[test]
fn alike_values_in_a_cluster_widen_the_interval_to_what_the_clusters_allow() {
    // Ten repetitions of 100 transfers each; within one repetition the
    // transfers are alike, between repetitions they differ a lot, and b's
    // repetitions are not ordered like a's (no pairing to exploit). a is
    // b's levels, 10% lower.
    let b_levels = [
        150.0, 60.0, 120.0, 80.0, 100.0, 140.0, 70.0, 110.0, 90.0, 130.0,
    ];
    let a_levels = [
        60.0, 120.0, 90.0, 140.0, 100.0, 70.0, 130.0, 80.0, 150.0, 110.0,
    ];
    let (a, ca) = clustered(&a_levels.map(|l| l * 0.9), 100);
    let (b, cb) = clustered(&b_levels, 100);
    let iid = ratio_of_medians(&a, &b, 7).unwrap();
    let by_cluster = ratio_of_medians_clustered(&a, &ca, &b, &cb, 7).unwrap();
    assert_eq!(iid.ratio, by_cluster.ratio);
    assert!(
        iid.ci95.1 < 0.97,
        "independent resampling sees 1000 values and is sure: {iid:?}"
    );
    assert!(
        by_cluster.ci95.0 < 0.75 && by_cluster.ci95.1 > 1.25,
        "ten repetitions decide nothing: {by_cluster:?}"
    );
}

#[test]
fn pairing_by_cluster_keeps_a_consistent_difference_decided() {
    // b is a's repetition level plus 4 in every repetition: whichever
    // repetitions a resample draws, a is below b.
    let (a, ca) = clustered(&[80.0, 90.0, 100.0, 110.0, 120.0], 100);
    let (b, cb) = clustered(&[84.0, 94.0, 104.0, 114.0, 124.0], 100);
    let r = ratio_of_medians_clustered(&a, &ca, &b, &cb, 7).unwrap();
    assert!(r.ci95.1 < 1.0, "{r:?}");
    assert!(r.ci95.0 > 0.9, "{r:?}");
}

#[test]
fn one_value_per_cluster_gives_an_interval_like_the_independent_one() {
    let a: Vec<f64> = (0..40).map(|i| 100.0 + ((i * 37) % 23) as f64).collect();
    let b: Vec<f64> = (0..40).map(|i| 105.0 + ((i * 11) % 29) as f64).collect();
    let ids: Vec<u32> = (0..40).collect();
    let iid = ratio_of_medians(&a, &b, 3).unwrap();
    let by_cluster = ratio_of_medians_clustered(&a, &ids, &b, &ids, 3).unwrap();
    let (w_iid, w_cluster) = (
        iid.ci95.1 - iid.ci95.0,
        by_cluster.ci95.1 - by_cluster.ci95.0,
    );
    assert!(
        w_cluster > 0.5 * w_iid && w_cluster < 2.0 * w_iid,
        "{iid:?} {by_cluster:?}"
    );
}

#[test]
fn clusters_on_one_side_only_are_drawn_as_well() {
    // Repetition 2 has values of a but none of b (its b transfers failed):
    // resamples that draw only it are skipped, not an error.
    let r =
        ratio_of_medians_clustered(&[1.0, 2.0, 3.0], &[0, 1, 2], &[2.0, 2.0], &[0, 1], 5).unwrap();
    assert_eq!(r.ratio, 1.0);
    assert!(r.ci95.0 <= r.ci95.1 && r.ci95.0.is_finite());
}

#[test]
fn fewer_than_two_clusters_bound_nothing() {
    let r = ratio_of_medians_clustered(&[1.0, 2.0], &[3, 3], &[2.0, 2.0], &[3, 3], 1).unwrap();
    assert_eq!(r.ratio, 0.75);
    assert_eq!(r.ci95, (0.0, f64::INFINITY));
}

#[test]
fn bad_clustered_input_is_an_error() {
    assert_eq!(
        ratio_of_medians_clustered(&[1.0, 2.0], &[0], &[1.0], &[0], 1),
        Err(Error::ClusterLength {
            values: 2,
            clusters: 1
        })
    );
    assert_eq!(
        ratio_of_medians_clustered(&[], &[], &[1.0], &[0], 1),
        Err(Error::Empty)
    );
    assert_eq!(
        ratio_of_medians_clustered(&[1.0], &[0], &[0.0, 0.0], &[0, 1], 1),
        Err(Error::ZeroMedian)
    );
    assert!(matches!(
        ratio_of_medians_clustered(&[1.0, -1.0], &[0, 1], &[1.0], &[0], 1),
        Err(Error::Negative { index: 1, .. })
    ));
    assert_eq!(cluster_medians(&[], &[]), Err(Error::Empty));
    assert!(matches!(
        cluster_medians(&[f64::NAN], &[0]),
        Err(Error::NotFinite { index: 0, .. })
    ));
}

#[test]
fn clustered_results_are_deterministic_given_the_seed() {
    let (a, ca) = clustered(&[80.0, 90.0, 100.0], 4);
    let (b, cb) = clustered(&[95.0, 85.0, 105.0], 4);
    let x = ratio_of_medians_clustered(&a, &ca, &b, &cb, 11).unwrap();
    let y = ratio_of_medians_clustered(&a, &ca, &b, &cb, 11).unwrap();
    assert_eq!(x, y);
}

#[test]
fn cluster_medians_and_repeated_clusters() {
    assert_eq!(
        cluster_medians(&[5.0, 1.0, 3.0, 10.0, 2.0], &[7, 2, 7, 2, 7]).unwrap(),
        vec![5.5, 3.0]
    );
    assert!(has_repeated_cluster(&[0, 1, 0]));
    assert!(!has_repeated_cluster(&[0, 1, 2]));
    assert!(!has_repeated_cluster(&[]));
}

#[test]
fn a_summary_of_clusters_has_intervals_as_wide_as_its_clusters_allow() {
    // Ten repetitions of 100 alike transfers: 1000 values, ten draws.
    let levels = [
        150.0, 60.0, 120.0, 80.0, 100.0, 140.0, 70.0, 110.0, 90.0, 130.0,
    ];
    let (values, clusters) = clustered(&levels, 100);
    let iid = Summary::of(&values, 3).unwrap();
    let by_cluster = Summary::of_clustered(&values, &clusters, 3).unwrap();
    assert_eq!(iid.clusters, None);
    assert_eq!(by_cluster.clusters, Some(10));
    // The same quantiles, mean and extremes.
    for (x, y) in [
        (iid.median, by_cluster.median),
        (iid.p10, by_cluster.p10),
        (iid.p90, by_cluster.p90),
        (iid.mean, by_cluster.mean),
        (iid.min, by_cluster.min),
        (iid.max, by_cluster.max),
    ] {
        assert_eq!(x, y);
    }
    let width = |(lo, hi): (f64, f64)| hi - lo;
    assert!(
        width(by_cluster.median_ci95) > 3.0 * width(iid.median_ci95),
        "{by_cluster:?} against {iid:?}"
    );
    assert!(
        width(by_cluster.mean_ci95) > 3.0 * width(iid.mean_ci95),
        "{by_cluster:?} against {iid:?}"
    );
    for (lo, hi) in [by_cluster.median_ci95, by_cluster.mean_ci95] {
        assert!(lo < by_cluster.median && by_cluster.median < hi);
        assert!(lo >= 60.0 && hi <= 160.0, "within the data: {lo}, {hi}");
    }
    assert_eq!(
        Summary::of_clustered(&values, &clusters, 3).unwrap(),
        by_cluster,
        "seeded: the same every time"
    );
}

#[test]
fn a_summary_of_one_cluster_cannot_bound_its_intervals() {
    let (values, clusters) = clustered(&[100.0], 20);
    let s = Summary::of_clustered(&values, &clusters, 1).unwrap();
    assert_eq!(s.clusters, Some(1));
    assert_eq!(s.median_ci95, (f64::NEG_INFINITY, f64::INFINITY));
    assert_eq!(s.mean_ci95, (f64::NEG_INFINITY, f64::INFINITY));
}

#[test]
fn a_summary_of_clusters_needs_one_cluster_per_value() {
    assert!(matches!(
        Summary::of_clustered(&[1.0, 2.0, 3.0], &[0, 1], 1),
        Err(Error::ClusterLength {
            values: 3,
            clusters: 2
        })
    ));
    assert!(matches!(
        Summary::of_clustered(&[], &[], 1),
        Err(Error::Empty)
    ));
}

#[test]
fn ratio_of_means_by_cluster() {
    use onionlab_stats::{ratio_clustered, Center};
    // Skewed: one large value per cluster pulls the mean, not the median.
    let (mut b, clusters) = clustered(&[10.0, 12.0, 14.0, 16.0, 18.0, 20.0], 5);
    for v in b.iter_mut().step_by(5) {
        *v *= 10.0;
    }
    let a: Vec<f64> = b.iter().map(|v| v * 2.0).collect();
    let mean = ratio_clustered(&a, &clusters, &b, &clusters, 3, Center::Mean).unwrap();
    assert!((mean.ratio - 2.0).abs() < 1e-12);
    assert!((mean.ci95.0 - 2.0).abs() < 1e-9 && (mean.ci95.1 - 2.0).abs() < 1e-9);
    let median = ratio_clustered(&a, &clusters, &b, &clusters, 3, Center::Median).unwrap();
    assert_eq!(
        median,
        onionlab_stats::ratio_of_medians_clustered(&a, &clusters, &b, &clusters, 3).unwrap()
    );
    // A mean of b at 0 has no ratio.
    let zeros = vec![0.0; b.len()];
    assert!(ratio_clustered(&a, &clusters, &zeros, &clusters, 3, Center::Mean).is_err());
}

#[test]
fn a_centre_by_cluster_matches_the_summary_and_percentiles_order() {
    use onionlab_stats::{center_clustered, Summary};
    let values: Vec<f64> = (0..40)
        .map(|i| f64::from(i % 10) + f64::from(i / 10) * 3.0)
        .collect();
    let clusters: Vec<u32> = (0..40).map(|i| i / 10).collect();
    let s = Summary::of_clustered(&values, &clusters, 5).unwrap();
    let (mean, mean_ci) = center_clustered(&values, &clusters, 5, Center::Mean).unwrap();
    let (median, median_ci) = center_clustered(&values, &clusters, 5, Center::Median).unwrap();
    assert_eq!((mean, mean_ci), (s.mean, s.mean_ci95));
    assert_eq!((median, median_ci), (s.median, s.median_ci95));
    let (p75, _) = center_clustered(&values, &clusters, 5, Center::P75).unwrap();
    let (p95, (lo, hi)) = center_clustered(&values, &clusters, 5, Center::P95).unwrap();
    assert!(median < p75 && p75 < p95 && lo <= p95 && p95 <= hi);
    let (p99, _) = center_clustered(&values, &clusters, 5, Center::P99).unwrap();
    assert!(p95 < p99, "{p95} {p99}");
    // Type 7 on 1..=100: 99 + 0.01 (the 99th of 100 values and a step).
    let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
    let p = Center::P99.of_values(&hundred).unwrap();
    assert!((p - 99.01).abs() < 1e-9, "{p}");
    let (_, one) = center_clustered(&[1.0, 2.0], &[0, 0], 5, Center::P95).unwrap();
    assert_eq!(one, (f64::NEG_INFINITY, f64::INFINITY));
}

#[test]
fn an_unpaired_ratio_by_cluster_draws_each_side_apart() {
    // Side a: clusters 0-3 at 1.2x side b's clusters 4-7, each cluster
    // with its own level: unpaired, the levels' spread is in the interval.
    let level = |c: u32| 100.0 * (1.0 + 0.1 * f64::from(c % 4));
    let a: Vec<f64> = (0..4)
        .flat_map(|c| [1.2 * level(c), 1.2 * level(c) + 1.0])
        .collect();
    let ac: Vec<u32> = (0..4).flat_map(|c| [c, c]).collect();
    let b: Vec<f64> = (4..8).flat_map(|c| [level(c), level(c) + 1.0]).collect();
    let bc: Vec<u32> = (4..8).flat_map(|c| [c, c]).collect();
    let r = ratio_clustered_unpaired(&a, &ac, &b, &bc, 9, Center::Median).unwrap();
    assert!((r.ratio - 1.2).abs() < 0.01, "{r:?}");
    assert!(
        r.ci95.0 < 1.2 && r.ci95.1 > 1.2 && r.ci95.1 - r.ci95.0 > 0.1,
        "{r:?}"
    );
    let one = ratio_clustered_unpaired(&a[..2], &ac[..2], &b, &bc, 9, Center::Median).unwrap();
    assert_eq!(one.ci95, (0.0, f64::INFINITY));
}

//! Edge cases: empty input, one value, all-equal values, NaN and infinity.

use onionlab_stats::*;

#[test]
fn empty_input_is_an_error_everywhere() {
    assert_eq!(quantile(&[], 0.5), Err(Error::Empty));
    assert_eq!(median(&[]), Err(Error::Empty));
    assert_eq!(mean(&[]), Err(Error::Empty));
    assert_eq!(Summary::of(&[], 1), Err(Error::Empty));
    assert_eq!(quantile_ci(&[], 0.5, 0.95), Err(Error::Empty));
    assert_eq!(ecdf(&[]), Err(Error::Empty));
    assert_eq!(dkw_band(&[], 0.95), Err(Error::Empty));
    assert_eq!(order_interval(0, 0.5, 0.95), Err(Error::Empty));
    assert_eq!(ratio_of_medians(&[], &[1.0], 1), Err(Error::Empty));
    assert_eq!(ratio_of_medians(&[1.0], &[], 1), Err(Error::Empty));
    assert_eq!(mann_whitney_u(&[], &[1.0]), Err(Error::Empty));
    assert_eq!(mann_whitney_u(&[1.0], &[]), Err(Error::Empty));
    assert_eq!(mean_ci_bootstrap(&[], 0.95, 1), Err(Error::Empty));
}

#[test]
fn nan_and_infinity_are_rejected_with_their_position() {
    let bad = [1.0, 2.0, f64::NAN];
    assert!(matches!(
        median(&bad),
        Err(Error::NotFinite { index: 2, .. })
    ));
    assert!(matches!(mean(&bad), Err(Error::NotFinite { index: 2, .. })));
    assert!(matches!(
        Summary::of(&bad, 0),
        Err(Error::NotFinite { index: 2, .. })
    ));
    assert!(matches!(
        mann_whitney_u(&[1.0], &[f64::INFINITY]),
        Err(Error::NotFinite { index: 0, .. })
    ));
    assert!(matches!(
        ratio_of_medians(&[1.0, f64::NEG_INFINITY], &[1.0], 0),
        Err(Error::NotFinite { index: 1, .. })
    ));
    assert!(matches!(ecdf(&bad), Err(Error::NotFinite { .. })));
    assert!(matches!(
        quantile(&[f64::NAN], 0.5),
        Err(Error::NotFinite { .. })
    ));
}

#[test]
fn bad_arguments_are_rejected() {
    assert_eq!(
        quantile(&[2.0, 1.0], 0.5),
        Err(Error::NotSorted { index: 1 })
    );
    assert_eq!(quantile(&[1.0], 1.5), Err(Error::InvalidProbability(1.5)));
    assert!(matches!(
        quantile(&[1.0], f64::NAN),
        Err(Error::InvalidProbability(_))
    ));
    assert_eq!(
        quantile_ci(&[1.0], 0.5, 1.0),
        Err(Error::InvalidConfidence(1.0))
    );
    assert_eq!(dkw_epsilon(3, 0.0), Err(Error::InvalidConfidence(0.0)));
    assert!(matches!(
        ratio_of_medians(&[1.0, -1.0], &[1.0], 0),
        Err(Error::Negative { index: 1, .. })
    ));
    assert_eq!(
        ratio_of_medians(&[1.0], &[0.0, 0.0, 5.0], 0),
        Err(Error::ZeroMedian)
    );
}

#[test]
fn one_value() {
    let s = Summary::of(&[42.0], 7).unwrap();
    assert_eq!(s.n, 1);
    for v in [s.median, s.p10, s.p90, s.mean, s.min, s.max] {
        assert_eq!(v, 42.0);
    }
    // No information about spread: both intervals are unbounded.
    assert_eq!(s.mean_ci95, (f64::NEG_INFINITY, f64::INFINITY));
    assert_eq!(s.median_ci95, (f64::NEG_INFINITY, f64::INFINITY));
    let r = ratio_of_medians(&[2.0], &[4.0, 4.0], 1).unwrap();
    assert_eq!(r.ratio, 0.5);
    assert_eq!(r.ci95, (0.0, f64::INFINITY));
    let m = mann_whitney_u(&[1.0], &[2.0]).unwrap();
    assert_eq!(m.u, 0.0);
    assert_eq!(m.p_two_sided, 1.0);
    assert_eq!(ecdf(&[3.0]).unwrap(), vec![(3.0, 1.0)]);
}

#[test]
fn all_equal_values() {
    let v = [5.0; 30];
    let s = Summary::of(&v, 3).unwrap();
    assert_eq!((s.median, s.p10, s.p90, s.mean), (5.0, 5.0, 5.0, 5.0));
    assert_eq!(s.mean_ci95, (5.0, 5.0));
    assert_eq!(s.median_ci95, (5.0, 5.0));
    let m = mann_whitney_u(&v, &[5.0; 4]).unwrap();
    assert_eq!((m.u, m.z, m.p_two_sided), (60.0, 0.0, 1.0));
    assert_eq!(m.method, PMethod::Normal);
    assert_eq!(m.cles, 0.5);
    let r = ratio_of_medians(&v, &v, 9).unwrap();
    assert_eq!((r.ratio, r.ci95), (1.0, (1.0, 1.0)));
    assert_eq!(ecdf(&v).unwrap(), vec![(5.0, 1.0)]);
}

#[test]
fn zero_medians_in_resamples_give_an_unbounded_ratio_not_nan() {
    // b's median is positive, but many resamples of b have median 0.
    let a = [1.0, 2.0, 3.0, 4.0];
    let b = [0.0, 0.0, 1.0, 1.0, 1.0];
    let r = ratio_of_medians(&a, &b, 5).unwrap();
    assert_eq!(r.ratio, 2.5);
    assert!(!r.ci95.0.is_nan() && r.ci95.1 == f64::INFINITY, "{r:?}");
}

#[test]
fn results_are_deterministic_given_the_seed() {
    let v: Vec<f64> = (0..50).map(|i| ((i * 37) % 17) as f64 + 0.5).collect();
    let w: Vec<f64> = v.iter().map(|x| x * 1.1).collect();
    assert_eq!(Summary::of(&v, 11).unwrap(), Summary::of(&v, 11).unwrap());
    assert_eq!(
        ratio_of_medians(&v, &w, 11).unwrap(),
        ratio_of_medians(&v, &w, 11).unwrap()
    );
    assert_ne!(
        Summary::of(&v, 11).unwrap().mean_ci95,
        Summary::of(&v, 12).unwrap().mean_ci95
    );
}

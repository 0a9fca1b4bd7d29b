//! Checks against known values: SciPy/NumPy results (SciPy 1.17.1, NumPy
//! 2.4.6; the call that produced each number is in the comment next to it),
//! textbook order-statistic intervals, and hand computations.

use onionlab_stats::*;

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * b.abs().max(1.0)
}

macro_rules! assert_close {
    ($a:expr, $b:expr, $tol:expr) => {{
        let (a, b): (f64, f64) = ($a, $b);
        assert!(close(a, b, $tol), "{} = {a}, expected {b}", stringify!($a));
    }};
}

const X: [f64; 9] = [3.1, -2.0, 7.5, 0.0, 4.25, 10.0, 1.5, 1.5, 8.0];

#[test]
fn quantile_type7_matches_numpy() {
    let s = sorted(&X).unwrap();
    // np.quantile(X, q, method='linear')
    for (q, want) in [
        (0.0, -2.0),
        (0.1, -0.3999999999999999),
        (0.25, 1.5),
        (0.5, 3.1),
        (0.9, 8.4),
        (1.0, 10.0),
    ] {
        assert_close!(quantile(&s, q).unwrap(), want, 1e-12);
    }
    // np.median(X), np.mean(X)
    assert_close!(median(&X).unwrap(), 3.1, 1e-15);
    assert_close!(mean(&X).unwrap(), 3.761111111111111, 1e-15);
}

#[test]
fn quantile_by_hand() {
    // h = (4 - 1) * 0.5 = 1.5: halfway between 20 and 30.
    assert_eq!(quantile(&[10.0, 20.0, 30.0, 40.0], 0.5).unwrap(), 25.0);
    // h = 3 * 0.1 = 0.3: 10 + 0.3 * 10.
    assert_close!(
        quantile(&[10.0, 20.0, 30.0, 40.0], 0.1).unwrap(),
        13.0,
        1e-12
    );
    assert_eq!(median(&[4.0, 1.0, 3.0]).unwrap(), 3.0);
}

#[test]
fn binomial_cdf_matches_scipy() {
    // scipy.stats.binom.cdf(k, n, p)
    for (n, p, k, want) in [
        (1000, 0.3, 280, 0.08857952260595),
        (10, 0.5, 1, 0.0107421875),
        (50, 0.5, 17, 0.016419568782134242),
        (100_000, 0.5, 49_700, 0.029098676555095182),
        (20, 0.1, 0, 0.12157665459056925),
    ] {
        assert_close!(binomial_cdf(n, p, k).unwrap(), want, 1e-9);
    }
}

#[test]
fn median_ci_order_statistics_textbook_ranks() {
    // The classical 95% intervals for the median (e.g. Conover, Practical
    // Nonparametric Statistics; tables of the sign test): (X(2), X(9)) for
    // n = 10, (X(6), X(15)) for n = 20, (X(18), X(33)) for n = 50. The same
    // from scipy.stats.quantile_test(np.arange(1, n+1), p=0.5)
    // .confidence_interval(0.95). Coverage: 1 - 2 * binom.cdf(l-1, n, 0.5).
    for (n, lo, hi, coverage) in [
        (10, 2, 9, 0.978515625),
        (20, 6, 15, 0.9586105346679688),
        (50, 18, 33, 0.9671608624357315),
    ] {
        let iv = order_interval(n, 0.5, 0.95).unwrap();
        assert_eq!(iv.lower_rank, Some(lo), "n = {n}");
        assert_eq!(iv.upper_rank, Some(hi), "n = {n}");
        assert_close!(iv.coverage, coverage, 1e-12);
        let data: Vec<f64> = (1..=n).map(|i| i as f64).collect();
        assert_eq!(
            quantile_ci(&data, 0.5, 0.95).unwrap(),
            (lo as f64, hi as f64)
        );
    }
}

#[test]
fn quantile_ci_matches_scipy_quantile_test() {
    // scipy.stats.quantile_test(np.arange(1, n+1), p=p).confidence_interval(0.95);
    // SciPy's NaN (unbounded side) is ±∞ here.
    let inf = f64::INFINITY;
    for (n, p, lo, hi) in [
        (20, 0.1, -inf, 6.0),
        (50, 0.9, 41.0, 50.0),
        (100, 0.25, 17.0, 35.0),
        (7, 0.5, 1.0, 7.0),
        (6, 0.5, 1.0, 6.0),
        (5, 0.5, -inf, inf),
    ] {
        let data: Vec<f64> = (1..=n).map(|i| i as f64).collect();
        assert_eq!(
            quantile_ci(&data, p, 0.95).unwrap(),
            (lo, hi),
            "n={n} p={p}"
        );
    }
}

#[test]
fn order_interval_coverage_is_at_least_the_confidence() {
    for n in 1..120 {
        for q in [0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99] {
            let iv = order_interval(n, q, 0.95).unwrap();
            assert!(iv.coverage >= 0.95 - 1e-12, "n={n} q={q}: {iv:?}");
            if let (Some(l), Some(u)) = (iv.lower_rank, iv.upper_rank) {
                assert!(l < u && u <= n);
            }
        }
    }
}

#[test]
fn mann_whitney_textbook_example_matches_scipy() {
    // The example of SciPy's mannwhitneyu documentation (ages of male and
    // female students): U = 17, exact two-sided p = 14/126.
    let males = [19.0, 22.0, 16.0, 29.0, 24.0];
    let females = [20.0, 11.0, 17.0, 12.0];
    let r = mann_whitney_u(&males, &females).unwrap();
    assert_eq!(r.u, 17.0);
    assert_eq!(r.method, PMethod::Exact);
    // stats.mannwhitneyu(males, females, method='exact').pvalue
    assert_close!(r.p_two_sided, 0.1111111111111111, 1e-12);
    assert_close!(r.cles, 17.0 / 20.0, 1e-15);
    assert_close!(r.rank_biserial, 0.7, 1e-12);
    // Swapping the samples: U' = n_a n_b - U, same p, mirrored effect.
    let s = mann_whitney_u(&females, &males).unwrap();
    assert_eq!(s.u, 3.0);
    assert_close!(s.p_two_sided, r.p_two_sided, 1e-15);
    assert_close!(s.z, -r.z, 1e-15);
}

#[test]
fn mann_whitney_exact_matches_scipy() {
    // rng = np.random.default_rng(7); c = np.round(rng.normal(10, 2, 15), 3);
    // d = np.round(rng.normal(12, 2, 12), 3)
    let c = [
        10.002, 10.597, 9.452, 8.219, 9.091, 8.017, 10.12, 12.68, 9.016, 8.759, 10.98, 10.714,
        10.211, 8.139, 9.941,
    ];
    let d = [
        13.391, 9.312, 11.085, 8.198, 9.421, 8.317, 11.53, 9.465, 12.543, 12.314, 11.626, 6.966,
    ];
    let r = mann_whitney_u(&c, &d).unwrap();
    // stats.mannwhitneyu(c, d, method='exact') -> (71.0, 0.3728121372353436)
    assert_eq!(r.u, 71.0);
    assert_eq!(r.method, PMethod::Exact);
    assert_close!(r.p_two_sided, 0.3728121372353436, 1e-12);
}

#[test]
fn mann_whitney_normal_with_ties_matches_scipy() {
    let a = [1.1, 2.2, 2.2, 3.0, 4.5, 4.5, 4.5, 6.0, 7.0, 9.0];
    let b = [2.2, 3.0, 3.0, 5.0, 6.0, 8.0, 10.0, 11.0, 12.0, 12.0, 13.0];
    let r = mann_whitney_u(&a, &b).unwrap();
    // stats.mannwhitneyu(a, b, method='asymptotic', use_continuity=True)
    assert_eq!(r.method, PMethod::Normal);
    assert_eq!(r.u, 27.5);
    assert_close!(r.p_two_sided, 0.05613523456870151, 1e-10);
    assert!(r.z < 0.0);
}

#[test]
fn mann_whitney_large_samples_use_normal_and_match_scipy() {
    // rng continued from the exact test: e = np.round(rng.exponential(1.0, 60), 4),
    // f = np.round(rng.exponential(1.3, 70), 4) (no ties; 130 values > EXACT_MAX_TOTAL)
    let e = [
        2.196, 0.4752, 0.5213, 1.1808, 0.5265, 0.0222, 0.2933, 1.0143, 0.6347, 1.3966, 0.0083,
        0.9038, 0.2503, 0.3556, 3.0749, 1.4044, 3.7954, 1.7481, 2.243, 0.1449, 0.3026, 0.2388,
        1.1482, 1.2233, 0.1272, 0.3839, 1.0679, 0.0687, 0.0982, 0.8714, 1.874, 2.6964, 0.7061,
        1.3061, 0.7635, 0.9371, 0.1448, 2.495, 0.8843, 0.8752, 0.0264, 1.085, 1.0619, 1.0642,
        0.5688, 1.3636, 1.5737, 0.65, 0.3511, 1.6999, 0.6726, 0.7508, 0.1114, 0.2451, 2.0475,
        0.7279, 0.0248, 1.3267, 0.4916, 2.9519,
    ];
    let f = [
        1.0954, 1.2696, 0.5642, 0.0252, 6.9987, 0.6101, 2.6906, 0.1913, 3.5643, 0.0187, 1.116,
        0.1193, 0.2416, 2.0688, 3.4445, 0.8819, 1.8911, 1.4075, 0.6199, 2.9001, 2.3899, 0.4438,
        0.9425, 1.4929, 1.4921, 0.1074, 6.8759, 0.0057, 1.8266, 1.6692, 0.37, 0.8826, 0.4842,
        0.0212, 1.0494, 1.5593, 1.4934, 5.7977, 0.219, 0.2479, 0.7593, 0.2766, 0.7182, 3.6308,
        1.7449, 0.7779, 0.9724, 7.6043, 0.7104, 1.4701, 2.4456, 1.6222, 1.575, 2.1464, 0.3242,
        0.7873, 1.7811, 0.8805, 2.8722, 0.1437, 0.7118, 0.4493, 1.3992, 0.6224, 4.6946, 1.1687,
        3.4814, 2.2009, 1.4979, 1.5782,
    ];
    let r = mann_whitney_u(&e, &f).unwrap();
    // stats.mannwhitneyu(e, f, method='asymptotic') -> (1645.0, 0.03378900097296737)
    assert_eq!(r.method, PMethod::Normal);
    assert_eq!(r.u, 1645.0);
    assert_close!(r.p_two_sided, 0.03378900097296737, 1e-10);
}

#[test]
fn mann_whitney_normal_approximation_formula_on_textbook_example() {
    // The textbook example has no ties, so the crate reports the exact p;
    // its z is the normal score with continuity correction:
    // U = 17, mean 5*4/2 = 10, variance 5*4*(9+1)/12.
    let sd = (20.0f64 * 10.0 / 12.0).sqrt();
    let z = (17.0 - 10.0 - 0.5) / sd;
    let r = mann_whitney_u(&[19.0, 22.0, 16.0, 29.0, 24.0], &[20.0, 11.0, 17.0, 12.0]).unwrap();
    assert_close!(r.z, z, 1e-12);
    // The two-sided normal p for that z, by quadrature here, is SciPy's:
    // stats.mannwhitneyu(males, females, method='asymptotic').pvalue
    assert_close!(2.0 * normal_sf_by_quadrature(z), 0.11134688653314041, 1e-8);
}

/// Normal upper tail by numerical integration (independent of the crate's
/// erfc), accurate to ~1e-9 for moderate z.
fn normal_sf_by_quadrature(z: f64) -> f64 {
    let steps = 200_000;
    let (a, b) = (z, z + 12.0);
    let h = (b - a) / steps as f64;
    let pdf = |x: f64| (-x * x / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt();
    let mut s = pdf(a) + pdf(b);
    for i in 1..steps {
        let x = a + i as f64 * h;
        s += if i % 2 == 1 { 4.0 } else { 2.0 } * pdf(x);
    }
    s * h / 3.0
}

#[test]
fn dkw_epsilon_by_hand() {
    // sqrt(ln(2 / 0.05) / (2 * 100)) = 0.13581015157406195 (NumPy)
    assert_close!(dkw_epsilon(100, 0.95).unwrap(), 0.13581015157406195, 1e-14);
    let band = dkw_band(&[3.0, 1.0, 2.0, 2.0], 0.95).unwrap();
    let eps = dkw_epsilon(4, 0.95).unwrap();
    assert_eq!(band.len(), 3);
    assert_eq!((band[0].x, band[0].f), (1.0, 0.25));
    assert_eq!((band[1].x, band[1].f), (2.0, 0.75));
    assert_eq!(band[1].lo, 0.75 - eps);
    assert_eq!(band[2].hi, 1.0);
    assert_eq!(band[0].lo, 0.0);
}

#[test]
fn ecdf_with_ties() {
    assert_eq!(
        ecdf(&[2.0, 1.0, 2.0, 5.0]).unwrap(),
        vec![(1.0, 0.25), (2.0, 0.75), (5.0, 1.0)]
    );
}

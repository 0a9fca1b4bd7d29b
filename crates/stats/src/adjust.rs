//! Corrections for multiple comparisons: a table that tests many ratios at
//! once finds some "significant" by chance unless its p-values are adjusted
//! for how many it tests.

use crate::{Error, Result};

fn check_p(p: &[f64]) -> Result<()> {
    match p.iter().position(|x| !(0.0..=1.0).contains(x)) {
        Some(index) => Err(Error::InvalidProbability(p[index])),
        None => Ok(()),
    }
}

/// Indices of `p` in ascending order of their p-values (ties by index, so
/// the result does not depend on the sort's stability).
fn ascending(p: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]).then(a.cmp(&b)));
    order
}

/// Holm's step-down adjustment (Holm 1979), which controls the family-wise
/// error rate (the chance of any false rejection) under any dependence
/// between the tests: with the p-values sorted ascending, `p(i)` (1-based
/// `i` of `m`) becomes `max over j ≤ i of min(1, (m - j + 1) p(j))`. Reject
/// where the adjusted p-value is below α. Same order as `p` (R's
/// `p.adjust(p, "holm")`).
///
/// # Errors
///
/// [`Error::InvalidProbability`] for a value outside `[0, 1]` or NaN.
pub fn holm_adjust(p: &[f64]) -> Result<Vec<f64>> {
    check_p(p)?;
    let m = p.len();
    let mut adjusted = vec![0.0; m];
    let mut running = 0.0f64;
    for (rank, &i) in ascending(p).iter().enumerate() {
        running = running.max(((m - rank) as f64 * p[i]).min(1.0));
        adjusted[i] = running;
    }
    Ok(adjusted)
}

/// Benjamini and Hochberg's step-up adjustment (1995), which controls the
/// false discovery rate (the expected share of false rejections among the
/// rejections) for independent or positively dependent tests: with the
/// p-values sorted ascending, `p(i)` becomes `min over j ≥ i of min(1, m
/// p(j) / j)`. Same order as `p` (R's `p.adjust(p, "BH")`).
///
/// # Errors
///
/// [`Error::InvalidProbability`] for a value outside `[0, 1]` or NaN.
pub fn benjamini_hochberg_adjust(p: &[f64]) -> Result<Vec<f64>> {
    check_p(p)?;
    let m = p.len();
    let mut adjusted = vec![0.0; m];
    let mut running = 1.0f64;
    for (rank, &i) in ascending(p).iter().enumerate().rev() {
        running = running.min((m as f64 * p[i] / (rank + 1) as f64).min(1.0));
        adjusted[i] = running;
    }
    Ok(adjusted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-12, "{a:?} vs {b:?}");
        }
    }

    /// R 4.3: p.adjust(c(0.01, 0.04, 0.03, 0.005, 0.20), "holm")
    /// = 0.04 0.09 0.09 0.025 0.20.
    #[test]
    fn holm_matches_r() {
        let p = [0.01, 0.04, 0.03, 0.005, 0.20];
        close(&holm_adjust(&p).unwrap(), &[0.04, 0.09, 0.09, 0.025, 0.20]);
    }

    /// Holm's own example shape: the adjusted values never fall below the
    /// raw ones, never exceed 1, and keep the raw order.
    #[test]
    fn holm_is_monotone_and_capped() {
        let p = [0.9, 0.5, 0.001, 0.3, 0.02, 0.02];
        let a = holm_adjust(&p).unwrap();
        for (raw, adj) in p.iter().zip(&a) {
            assert!(adj >= raw && *adj <= 1.0);
        }
        let order = ascending(&p);
        for w in order.windows(2) {
            assert!(a[w[0]] <= a[w[1]]);
        }
        // The smallest of six is multiplied by six.
        assert!((a[2] - 0.006).abs() < 1e-12);
        // The two ties share the larger step's value: max(5 x 0.02, 4 x 0.02).
        assert!((a[4] - 0.1).abs() < 1e-12 && (a[5] - 0.1).abs() < 1e-12);
    }

    /// R 4.3: p.adjust(c(0.01, 0.04, 0.03, 0.005, 0.20), "BH")
    /// = 0.025 0.05 0.05 0.025 0.20.
    #[test]
    fn bh_matches_r() {
        let p = [0.01, 0.04, 0.03, 0.005, 0.20];
        close(
            &benjamini_hochberg_adjust(&p).unwrap(),
            &[0.025, 0.05, 0.05, 0.025, 0.20],
        );
    }

    #[test]
    fn one_test_is_unchanged_and_bad_input_refused() {
        close(&holm_adjust(&[0.03]).unwrap(), &[0.03]);
        assert!(holm_adjust(&[]).unwrap().is_empty());
        assert!(matches!(
            holm_adjust(&[0.1, f64::NAN]),
            Err(Error::InvalidProbability(_))
        ));
        assert!(benjamini_hochberg_adjust(&[1.5]).is_err());
    }
}

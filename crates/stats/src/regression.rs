//! Least-squares slope with a bootstrap interval over points (the lab's
//! "cost per lost packet": each repetition's mean time over its lost
//! packets).

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::bootstrap::{percentile_interval, BOOTSTRAP_RESAMPLES};
use crate::describe::check_finite;
use crate::{Error, Result};

/// The least-squares slope of `y` over `x` of `points`; `None` when `x`
/// does not vary (no slope to fit).
fn slope_unchecked(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    Some(points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum::<f64>() / sxx)
}

/// A slope with its 95% interval (see [`slope_bootstrap`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlopeCi {
    /// The least-squares slope of y over x.
    pub slope: f64,
    /// 95% percentile-bootstrap interval; `None` when fewer than half the
    /// resamples had an x that varies (too few distinct points).
    pub ci95: Option<(f64, f64)>,
}

/// The least-squares slope of `y` over `x` with a 95% percentile-bootstrap
/// interval: [`BOOTSTRAP_RESAMPLES`] times the points are resampled with
/// replacement (one `StdRng` seeded with `seed`) and the slope refitted;
/// resamples whose `x` does not vary are skipped. `None` when `x` of the
/// points themselves does not vary.
///
/// # Errors
///
/// [`Error::Empty`] without points, [`Error::NotFinite`] for a NaN or
/// infinite coordinate.
pub fn slope_bootstrap(points: &[(f64, f64)], seed: u64) -> Result<Option<SlopeCi>> {
    if points.is_empty() {
        return Err(Error::Empty);
    }
    let flat: Vec<f64> = points.iter().flat_map(|p| [p.0, p.1]).collect();
    check_finite(&flat)?;
    let Some(slope) = slope_unchecked(points) else {
        return Ok(None);
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut buf = Vec::with_capacity(points.len());
    let mut replicates = Vec::with_capacity(BOOTSTRAP_RESAMPLES);
    for _ in 0..BOOTSTRAP_RESAMPLES {
        buf.clear();
        buf.extend((0..points.len()).map(|_| points[rng.random_range(0..points.len())]));
        if let Some(s) = slope_unchecked(&buf) {
            replicates.push(s);
        }
    }
    let ci95 = (replicates.len() >= BOOTSTRAP_RESAMPLES / 2)
        .then(|| percentile_interval(replicates, 0.95));
    Ok(Some(SlopeCi { slope, ci95 }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exact_line_has_its_slope_and_a_point_interval() {
        let points: Vec<(f64, f64)> = (0..10)
            .map(|i| (f64::from(i), 3.0 * f64::from(i) + 2.0))
            .collect();
        let s = slope_bootstrap(&points, 1).unwrap().unwrap();
        assert!((s.slope - 3.0).abs() < 1e-12);
        let (lo, hi) = s.ci95.unwrap();
        assert!((lo - 3.0).abs() < 1e-9 && (hi - 3.0).abs() < 1e-9);
    }

    #[test]
    fn noise_widens_the_interval_around_the_slope() {
        let points: Vec<(f64, f64)> = (0..20)
            .map(|i| {
                let noise = if i % 2 == 0 { 5.0 } else { -5.0 };
                (f64::from(i), 2.0 * f64::from(i) + noise)
            })
            .collect();
        let s = slope_bootstrap(&points, 7).unwrap().unwrap();
        let (lo, hi) = s.ci95.unwrap();
        assert!(
            lo < s.slope && s.slope < hi && lo > 1.0 && hi < 3.0,
            "{s:?}"
        );
        assert_eq!(slope_bootstrap(&points, 7).unwrap(), Some(s));
    }

    #[test]
    fn no_slope_without_variation_in_x_and_errors_for_bad_input() {
        assert_eq!(slope_bootstrap(&[(1.0, 2.0), (1.0, 5.0)], 1).unwrap(), None);
        assert!(matches!(slope_bootstrap(&[], 1), Err(Error::Empty)));
        assert!(matches!(
            slope_bootstrap(&[(1.0, f64::NAN)], 1),
            Err(Error::NotFinite { .. })
        ));
    }
}

//! Bootstrap intervals and the per-variant summary.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::describe::{check_finite, median_in_place, quantile_unchecked, sorted, sum};
use crate::order::{check_confidence, quantile_ci};
use crate::{Error, Result};

/// Number of bootstrap resamples used by [`Summary::of`],
/// [`mean_ci_bootstrap`] and [`ratio_of_medians`].
pub const BOOTSTRAP_RESAMPLES: usize = 2000;

/// Percentile interval `(α/2, 1 - α/2)` of bootstrap replicates (type-7
/// quantiles of the sorted replicates).
fn percentile_interval(mut replicates: Vec<f64>, conf: f64) -> (f64, f64) {
    replicates.sort_by(f64::total_cmp);
    let a = (1.0 - conf) / 2.0;
    (
        quantile_unchecked(&replicates, a),
        quantile_unchecked(&replicates, 1.0 - a),
    )
}

/// Fills `buf` with a resample (with replacement) of `values`.
fn resample(rng: &mut StdRng, values: &[f64], buf: &mut Vec<f64>) {
    buf.clear();
    buf.extend((0..values.len()).map(|_| values[rng.random_range(0..values.len())]));
}

/// Percentile-bootstrap confidence interval for the population mean:
/// [`BOOTSTRAP_RESAMPLES`] resamples of `values` with replacement drawn from
/// a `StdRng` seeded with `seed`; the interval is the `α/2` and `1 - α/2`
/// type-7 quantiles of the resampled means (`α = 1 - conf`).
///
/// With a single value there is no information about spread: the interval
/// is `(-∞, +∞)`. With all values equal it is that value (the percentile
/// bootstrap never reaches beyond the sample's range, so it is optimistic
/// for small samples).
///
/// # Errors
///
/// [`Error::Empty`], [`Error::NotFinite`], [`Error::InvalidConfidence`].
pub fn mean_ci_bootstrap(values: &[f64], conf: f64, seed: u64) -> Result<(f64, f64)> {
    if values.is_empty() {
        return Err(Error::Empty);
    }
    check_finite(values)?;
    check_confidence(conf)?;
    if values.len() < 2 {
        return Ok((f64::NEG_INFINITY, f64::INFINITY));
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let n = values.len();
    let replicates = (0..BOOTSTRAP_RESAMPLES)
        .map(|_| (0..n).map(|_| values[rng.random_range(0..n)]).sum::<f64>() / n as f64)
        .collect();
    Ok(percentile_interval(replicates, conf))
}

/// Summary statistics of one sample (one variant's values of one metric).
///
/// Quantiles are type 7 (see [`crate::quantile`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Number of values.
    pub n: usize,
    /// Median.
    pub median: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// 95% percentile-bootstrap interval for the mean
    /// ([`mean_ci_bootstrap`]; `(-∞, +∞)` for one value).
    pub mean_ci95: (f64, f64),
    /// Distribution-free 95% interval for the median from order statistics
    /// ([`quantile_ci`]; a side is infinite when there are too few values to
    /// bound it, which at 95% means fewer than 6).
    pub median_ci95: (f64, f64),
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

impl Summary {
    /// Summarises `values` (any order); `seed` seeds the bootstrap, so the
    /// result is a pure function of its arguments.
    ///
    /// # Errors
    ///
    /// [`Error::Empty`] for no values, [`Error::NotFinite`] for NaN or
    /// infinity.
    pub fn of(values: &[f64], seed: u64) -> Result<Summary> {
        let s = sorted(values)?;
        Ok(Summary {
            n: s.len(),
            median: quantile_unchecked(&s, 0.5),
            p10: quantile_unchecked(&s, 0.1),
            p90: quantile_unchecked(&s, 0.9),
            mean: sum(s.iter().copied()) / s.len() as f64,
            mean_ci95: mean_ci_bootstrap(&s, 0.95, seed)?,
            median_ci95: quantile_ci(&s, 0.5, 0.95)?,
            min: s[0],
            max: s[s.len() - 1],
        })
    }
}

/// A ratio of medians with its confidence interval (see [`ratio_of_medians`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RatioCi {
    /// `median(a) / median(b)`.
    pub ratio: f64,
    /// 95% percentile-bootstrap interval for the ratio; `(0, +∞)` when a
    /// sample has a single value. The upper end is `+∞` when more than 2.5%
    /// of resamples of `b` have a zero median.
    pub ci95: (f64, f64),
}

fn check_non_negative(values: &[f64]) -> Result<()> {
    if values.is_empty() {
        return Err(Error::Empty);
    }
    check_finite(values)?;
    match values.iter().position(|&v| v < 0.0) {
        Some(index) => Err(Error::Negative {
            index,
            value: values[index],
        }),
        None => Ok(()),
    }
}

/// The ratio `median(a) / median(b)` with a 95% percentile-bootstrap
/// interval: [`BOOTSTRAP_RESAMPLES`] times, `a` and `b` are each resampled
/// with replacement, independently, from one `StdRng` seeded with `seed`,
/// and the ratio of the resamples' medians is recorded.
///
/// Meant for positive quantities (times, rates); values must be ≥ 0. A
/// resample whose `b` median is 0 gives `+∞` (or is dropped when the `a`
/// median is 0 too, the ratio being undefined).
///
/// # Errors
///
/// [`Error::Empty`] or [`Error::NotFinite`] for either sample,
/// [`Error::Negative`] for a negative value, [`Error::ZeroMedian`] when
/// `median(b) = 0`.
pub fn ratio_of_medians(a: &[f64], b: &[f64], seed: u64) -> Result<RatioCi> {
    check_non_negative(a)?;
    check_non_negative(b)?;
    let (mut sa, mut sb) = (a.to_vec(), b.to_vec());
    let (ma, mb) = (median_in_place(&mut sa), median_in_place(&mut sb));
    if mb == 0.0 {
        return Err(Error::ZeroMedian);
    }
    let ratio = ma / mb;
    if a.len() < 2 || b.len() < 2 {
        return Ok(RatioCi {
            ratio,
            ci95: (0.0, f64::INFINITY),
        });
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let mut replicates = Vec::with_capacity(BOOTSTRAP_RESAMPLES);
    for _ in 0..BOOTSTRAP_RESAMPLES {
        resample(&mut rng, a, &mut sa);
        resample(&mut rng, b, &mut sb);
        let (ra, rb) = (median_in_place(&mut sa), median_in_place(&mut sb));
        if rb > 0.0 {
            replicates.push(ra / rb);
        } else if ra > 0.0 {
            replicates.push(f64::INFINITY);
        }
    }
    let ci95 = if replicates.is_empty() {
        (0.0, f64::INFINITY)
    } else {
        percentile_interval(replicates, 0.95)
    };
    Ok(RatioCi { ratio, ci95 })
}

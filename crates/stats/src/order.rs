//! Distribution-free inference from order statistics: confidence intervals
//! for quantiles, the empirical CDF and its Dvoretzky–Kiefer–Wolfowitz band.

use crate::describe::{check_finite, check_probability, check_sorted, quantile_unchecked, sorted};
use crate::{Error, Result};

pub(crate) fn check_confidence(conf: f64) -> Result<()> {
    if conf > 0.0 && conf < 1.0 {
        Ok(())
    } else {
        Err(Error::InvalidConfidence(conf))
    }
}

/// Which order statistics bound a distribution-free confidence interval for
/// a quantile, and the interval's exact coverage.
///
/// Ranks are 1-based: rank 1 is the smallest value, rank `n` the largest.
/// `None` means the interval is unbounded on that side: the sample is too
/// small for any order statistic to bound the quantile at the requested
/// confidence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OrderInterval {
    /// Rank of the lower bound, or `None` for −∞.
    pub lower_rank: Option<usize>,
    /// Rank of the upper bound, or `None` for +∞.
    pub upper_rank: Option<usize>,
    /// The probability that `[X(lower), X(upper)]` contains the population
    /// quantile, for any continuous distribution (at least the requested
    /// confidence).
    pub coverage: f64,
}

/// Lower and upper tail probabilities of Binomial(n, p):
/// `cdf[k] = P(B <= k)` and `sf[k] = P(B >= k)` for `k` in `0..=n`.
fn binomial_tails(n: usize, p: f64) -> (Vec<f64>, Vec<f64>) {
    let mut pmf = vec![0.0; n + 1];
    if p <= 0.0 {
        pmf[0] = 1.0;
    } else if p >= 1.0 {
        pmf[n] = 1.0;
    } else {
        // log pmf(k) = ln C(n, k) + k ln p + (n - k) ln(1 - p), with ln C
        // built up term by term (no log-gamma needed).
        let (lp, lq) = (p.ln(), (-p).ln_1p());
        let mut ln_choose = 0.0f64;
        for (k, slot) in pmf.iter_mut().enumerate() {
            if k > 0 {
                ln_choose += ((n - k + 1) as f64).ln() - (k as f64).ln();
            }
            *slot = (ln_choose + k as f64 * lp + (n - k) as f64 * lq).exp();
        }
    }
    let mut cdf = vec![0.0; n + 1];
    let mut acc = 0.0;
    for (k, &m) in pmf.iter().enumerate() {
        acc += m;
        cdf[k] = acc.min(1.0);
    }
    let mut sf = vec![0.0; n + 1];
    acc = 0.0;
    for k in (0..=n).rev() {
        acc += pmf[k];
        sf[k] = acc.min(1.0);
    }
    (cdf, sf)
}

/// Probability that Binomial(`n`, `p`) is at most `k`.
///
/// Exposed for checking order-statistic intervals by hand.
///
/// # Errors
///
/// [`Error::InvalidProbability`] unless 0 ≤ `p` ≤ 1.
pub fn binomial_cdf(n: usize, p: f64, k: usize) -> Result<f64> {
    check_probability(p)?;
    if k >= n {
        return Ok(1.0);
    }
    Ok(binomial_tails(n, p).0[k])
}

/// The equal-tailed distribution-free confidence interval for the
/// population `q`-quantile from `n` values, as ranks of order statistics.
///
/// With `B ~ Binomial(n, q)` (the number of values below the quantile) and
/// `α = 1 - conf`, `P(X(l) <= ξ_q <= X(u)) >= P(l <= B <= u - 1)` for any
/// distribution (with equality for continuous ones). The lower rank `l` is
/// the largest with `P(B <= l - 1) <= α/2` and the upper rank `u` the
/// smallest with `P(B >= u) <= α/2`, so each side misses with probability at
/// most `α/2`. This is the classical interval (e.g. Conover, *Practical
/// Nonparametric Statistics*, §3.2; for the median, `(X(2), X(9))` at
/// n = 10, `(X(6), X(15))` at n = 20, `(X(18), X(33))` at n = 50).
///
/// # Errors
///
/// [`Error::Empty`] for `n = 0`, [`Error::InvalidProbability`],
/// [`Error::InvalidConfidence`].
pub fn order_interval(n: usize, q: f64, conf: f64) -> Result<OrderInterval> {
    if n == 0 {
        return Err(Error::Empty);
    }
    check_probability(q)?;
    check_confidence(conf)?;
    let half_alpha = (1.0 - conf) / 2.0;
    let (cdf, sf) = binomial_tails(n, q);
    // cdf is non-decreasing: the last rank l in 1..=n with cdf[l-1] <= α/2.
    let lower_rank = (1..=n).rev().find(|&l| cdf[l - 1] <= half_alpha);
    // sf is non-increasing: the first rank u in 1..=n with sf[u] <= α/2
    // (sf[u] = P(B >= u); for u = n that is P(B = n)).
    let upper_rank = (1..=n).find(|&u| sf[u] <= half_alpha);
    let below = lower_rank.map_or(0.0, |l| cdf[l - 1]);
    let above = upper_rank.map_or(0.0, |u| sf[u]);
    Ok(OrderInterval {
        lower_rank,
        upper_rank,
        coverage: (1.0 - below - above).clamp(0.0, 1.0),
    })
}

/// Distribution-free confidence interval `(lo, hi)` for the population
/// `q`-quantile, from data sorted in ascending order, with confidence at
/// least `conf` (see [`order_interval`] for the construction).
///
/// A side the sample is too small to bound is `-∞` or `+∞` (for example
/// both sides of a median interval from fewer than 6 values at 95%); the
/// result never contains NaN.
///
/// # Errors
///
/// [`Error::Empty`], [`Error::NotFinite`], [`Error::NotSorted`],
/// [`Error::InvalidProbability`], [`Error::InvalidConfidence`].
pub fn quantile_ci(sorted: &[f64], q: f64, conf: f64) -> Result<(f64, f64)> {
    check_sorted(sorted)?;
    let iv = order_interval(sorted.len(), q, conf)?;
    Ok(interval_values(sorted, &iv))
}

fn interval_values(sorted: &[f64], iv: &OrderInterval) -> (f64, f64) {
    (
        iv.lower_rank.map_or(f64::NEG_INFINITY, |r| sorted[r - 1]),
        iv.upper_rank.map_or(f64::INFINITY, |r| sorted[r - 1]),
    )
}

/// One point of a quantile confidence band (see [`quantile_band`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuantileBandPoint {
    /// Probability level.
    pub p: f64,
    /// The type-7 sample quantile at `p`.
    pub estimate: f64,
    /// Lower end of the distribution-free interval (may be −∞).
    pub lo: f64,
    /// Upper end of the distribution-free interval (may be +∞).
    pub hi: f64,
}

/// Pointwise distribution-free confidence intervals for the quantiles at
/// each level in `probs`, for shading a band around an empirical CDF.
///
/// The band is pointwise: each level's interval has the stated confidence
/// on its own, not all of them jointly (for a simultaneous band use
/// [`dkw_band`]).
///
/// # Errors
///
/// As [`quantile_ci`], for the data and for each level.
pub fn quantile_band(sorted: &[f64], probs: &[f64], conf: f64) -> Result<Vec<QuantileBandPoint>> {
    check_sorted(sorted)?;
    check_confidence(conf)?;
    probs
        .iter()
        .map(|&p| {
            let iv = order_interval(sorted.len(), p, conf)?;
            let (lo, hi) = interval_values(sorted, &iv);
            Ok(QuantileBandPoint {
                p,
                estimate: quantile_unchecked(sorted, p),
                lo,
                hi,
            })
        })
        .collect()
}

/// The empirical CDF of `values` (any order): one point `(x, F(x))` per
/// distinct value in ascending order, where `F(x)` is the fraction of values
/// `<= x`. The last point has `F = 1`.
///
/// # Errors
///
/// [`Error::Empty`], [`Error::NotFinite`].
pub fn ecdf(values: &[f64]) -> Result<Vec<(f64, f64)>> {
    let s = sorted(values)?;
    let n = s.len() as f64;
    let mut out: Vec<(f64, f64)> = Vec::new();
    for (i, &x) in s.iter().enumerate() {
        let f = (i + 1) as f64 / n;
        match out.last_mut() {
            Some(last) if last.0 == x => last.1 = f,
            _ => out.push((x, f)),
        }
    }
    Ok(out)
}

/// Half-width of the Dvoretzky–Kiefer–Wolfowitz simultaneous confidence band
/// for a CDF from `n` values: `ε = sqrt(ln(2 / α) / (2 n))`, `α = 1 - conf`
/// (Massart's tight constant), so that `P(sup |F_n - F| > ε) <= α`.
///
/// # Errors
///
/// [`Error::Empty`] for `n = 0`, [`Error::InvalidConfidence`].
pub fn dkw_epsilon(n: usize, conf: f64) -> Result<f64> {
    if n == 0 {
        return Err(Error::Empty);
    }
    check_confidence(conf)?;
    Ok(((2.0 / (1.0 - conf)).ln() / (2.0 * n as f64)).sqrt())
}

/// One point of an empirical CDF with its DKW band (see [`dkw_band`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EcdfBandPoint {
    /// A distinct sample value.
    pub x: f64,
    /// The empirical CDF at `x`.
    pub f: f64,
    /// `max(F(x) - ε, 0)`.
    pub lo: f64,
    /// `min(F(x) + ε, 1)`.
    pub hi: f64,
}

/// The empirical CDF of `values` with the DKW simultaneous band at
/// confidence `conf` (see [`dkw_epsilon`]), clipped to `[0, 1]`.
///
/// # Errors
///
/// [`Error::Empty`], [`Error::NotFinite`], [`Error::InvalidConfidence`].
pub fn dkw_band(values: &[f64], conf: f64) -> Result<Vec<EcdfBandPoint>> {
    check_finite(values)?;
    let eps = dkw_epsilon(values.len(), conf)?;
    Ok(ecdf(values)?
        .into_iter()
        .map(|(x, f)| EcdfBandPoint {
            x,
            f,
            lo: (f - eps).max(0.0),
            hi: (f + eps).min(1.0),
        })
        .collect())
}

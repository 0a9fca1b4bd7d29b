//! Descriptive statistics: validation, sorting, quantiles, median, mean.

use crate::{Error, Result};

/// Checks that every value is finite (not NaN, not infinite).
///
/// # Errors
///
/// [`Error::NotFinite`] naming the first offending value.
pub fn check_finite(values: &[f64]) -> Result<()> {
    match values.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(Error::NotFinite {
            index,
            value: values[index],
        }),
        None => Ok(()),
    }
}

/// Checks that `sorted` is non-empty, finite and in ascending order.
pub(crate) fn check_sorted(sorted: &[f64]) -> Result<()> {
    if sorted.is_empty() {
        return Err(Error::Empty);
    }
    check_finite(sorted)?;
    match sorted.windows(2).position(|w| w[1] < w[0]) {
        Some(i) => Err(Error::NotSorted { index: i + 1 }),
        None => Ok(()),
    }
}

/// Returns a sorted (ascending) copy of `values` after checking that every
/// value is finite.
///
/// # Errors
///
/// [`Error::Empty`] for no values, [`Error::NotFinite`] for NaN or infinity.
pub fn sorted(values: &[f64]) -> Result<Vec<f64>> {
    if values.is_empty() {
        return Err(Error::Empty);
    }
    check_finite(values)?;
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    Ok(v)
}

pub(crate) fn check_probability(q: f64) -> Result<()> {
    if (0.0..=1.0).contains(&q) {
        Ok(())
    } else {
        Err(Error::InvalidProbability(q))
    }
}

/// Type-7 quantile of already sorted, already checked data (no validation).
pub(crate) fn quantile_unchecked(sorted: &[f64], q: f64) -> f64 {
    let n = sorted.len();
    let h = (n - 1) as f64 * q;
    let lo = h.floor() as usize;
    if lo + 1 >= n {
        return sorted[n - 1];
    }
    let frac = h - lo as f64;
    let (a, b) = (sorted[lo], sorted[lo + 1]);
    if frac == 0.0 || a == b {
        a
    } else {
        a + frac * (b - a)
    }
}

/// The sample quantile at level `q` (0 ≤ `q` ≤ 1) of data sorted in
/// ascending order.
///
/// Definition: linear interpolation between order statistics, type 7 of
/// Hyndman and Fan (1996), the default of R's `quantile()` and of NumPy's
/// `np.quantile`: with `h = (n - 1) q`, the result is
/// `x[⌊h⌋] + (h - ⌊h⌋) (x[⌊h⌋ + 1] - x[⌊h⌋])` (0-based indices). `q = 0`
/// gives the minimum, `q = 1` the maximum; one value is its own quantile at
/// every level.
///
/// # Errors
///
/// [`Error::Empty`], [`Error::NotFinite`], [`Error::NotSorted`] (the check is
/// O(n)), [`Error::InvalidProbability`].
pub fn quantile(sorted: &[f64], q: f64) -> Result<f64> {
    check_probability(q)?;
    check_sorted(sorted)?;
    Ok(quantile_unchecked(sorted, q))
}

/// The sample median of `values` (any order): the type-7 quantile at 0.5,
/// that is the middle value, or the mean of the two middle values when the
/// count is even.
///
/// # Errors
///
/// [`Error::Empty`], [`Error::NotFinite`].
pub fn median(values: &[f64]) -> Result<f64> {
    let s = sorted(values)?;
    Ok(quantile_unchecked(&s, 0.5))
}

/// Median of a scratch buffer of finite values, reordering it (O(n) average).
pub(crate) fn median_in_place(buf: &mut [f64]) -> f64 {
    let n = buf.len();
    let (_, &mut upper, _) = buf.select_nth_unstable_by(n / 2, f64::total_cmp);
    if n % 2 == 1 {
        upper
    } else {
        // The lower middle value is the largest of the left part.
        let lower = buf[..n / 2]
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        if lower == upper {
            lower
        } else {
            lower + 0.5 * (upper - lower)
        }
    }
}

/// Compensated (Neumaier) sum, accurate for large counts of mixed magnitudes.
pub(crate) fn sum(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut s = 0.0f64;
    let mut c = 0.0f64;
    for x in values {
        let t = s + x;
        if s.abs() >= x.abs() {
            c += (s - t) + x;
        } else {
            c += (x - t) + s;
        }
        s = t;
    }
    s + c
}

/// The arithmetic mean of `values`, summed with Neumaier compensation.
///
/// # Errors
///
/// [`Error::Empty`], [`Error::NotFinite`].
pub fn mean(values: &[f64]) -> Result<f64> {
    if values.is_empty() {
        return Err(Error::Empty);
    }
    check_finite(values)?;
    Ok(sum(values.iter().copied()) / values.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_in_place_matches_sorted_median() {
        for n in 1..12 {
            let v: Vec<f64> = (0..n)
                .map(|i| ((i * 7) % 5) as f64 + i as f64 * 0.1)
                .collect();
            let mut b = v.clone();
            assert_eq!(median_in_place(&mut b), median(&v).unwrap(), "n = {n}");
        }
    }

    #[test]
    fn neumaier_sum_keeps_small_terms() {
        assert_eq!(sum([1e100, 1.0, -1e100]), 1.0);
    }
}

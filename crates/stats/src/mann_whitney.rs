//! The Mann–Whitney U test (Wilcoxon rank-sum test) for two independent
//! samples.

use crate::describe::check_finite;
use crate::{Error, Result};

/// Largest combined sample size for which the exact null distribution is
/// used (when there are no ties); counts of arrangements then stay below
/// `C(100, 50) ≈ 1.0e29` and fit an `i128`.
pub const EXACT_MAX_TOTAL: usize = 100;

/// How the p-value of a [`MannWhitney`] result was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PMethod {
    /// Exact permutation distribution of U (no ties, `n_a + n_b <=`
    /// [`EXACT_MAX_TOTAL`]).
    Exact,
    /// Normal approximation with tie correction and continuity correction.
    Normal,
}

/// Result of [`mann_whitney_u`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MannWhitney {
    /// U statistic of the first sample `a`: the number of pairs `(x in a,
    /// y in b)` with `x > y`, plus half the number of tied pairs (equal to
    /// SciPy's `mannwhitneyu(a, b).statistic`).
    pub u: f64,
    /// Normal score `(U - n_a n_b / 2 ∓ 0.5) / σ` with tie-corrected σ and
    /// continuity correction towards zero (0 when σ = 0 or |U - mean| ≤ 0.5).
    /// Positive when `a` tends to be larger.
    pub z: f64,
    /// Two-sided p-value for "the distributions of `a` and `b` are equal"
    /// against "one tends to be larger than the other", computed as
    /// [`MannWhitney::method`] says. 1 when every value is equal.
    pub p_two_sided: f64,
    /// How `p_two_sided` was computed.
    pub method: PMethod,
    /// Common-language effect size `U / (n_a n_b)`: the probability that a
    /// random value of `a` exceeds a random value of `b`, ties counted half.
    /// 0.5 means no tendency either way.
    pub cles: f64,
    /// Rank-biserial correlation `2 cles - 1`, in `[-1, 1]`; positive when
    /// `a` tends to be larger.
    pub rank_biserial: f64,
}

/// Standard normal upper tail `P(Z > z)`.
pub(crate) fn normal_sf(z: f64) -> f64 {
    0.5 * libm::erfc(z / std::f64::consts::SQRT_2)
}

/// Counts of arrangements of `m` values of one sample and `n` of the other
/// (no ties) by U statistic: entry `u` is the number with `U = u`. These are
/// the coefficients of the Gaussian binomial `[m+n choose m]_q =
/// Π_{i=1..m} (1 - q^(n+i)) / (1 - q^i)`, built factor by factor in exact
/// integer arithmetic.
fn exact_u_counts(m: usize, n: usize) -> Vec<i128> {
    let mut c = vec![0i128; m * n + m + 1];
    c[0] = 1;
    let mut deg = 0; // degree of the polynomial so far
    for i in 1..=m {
        // Multiply by (1 - q^(n+i)).
        let shift = n + i;
        for j in (shift..=deg + shift).rev() {
            c[j] -= c[j - shift];
        }
        // Divide by (1 - q^i): the quotient is exact, so the series stops.
        for j in i..=deg + shift {
            c[j] += c[j - i];
        }
        deg += n;
    }
    c.truncate(m * n + 1);
    c
}

/// The Mann–Whitney U test of `a` against `b`.
///
/// Values are ranked together, ties getting their average rank. The
/// p-value is exact (from the permutation distribution of U) when there are
/// no ties and `n_a + n_b <=` [`EXACT_MAX_TOTAL`]; otherwise it uses the
/// normal approximation with the tie correction
/// `σ² = n_a n_b / 12 · ((n + 1) - Σ(t³ - t) / (n (n - 1)))` and a
/// continuity correction of 0.5. These are the definitions of SciPy's
/// `scipy.stats.mannwhitneyu(a, b, method="exact")` and
/// `method="asymptotic", use_continuity=True`, against which the tests
/// check.
///
/// # Errors
///
/// [`Error::Empty`] if either sample is empty, [`Error::NotFinite`] for NaN
/// or infinity.
pub fn mann_whitney_u(a: &[f64], b: &[f64]) -> Result<MannWhitney> {
    if a.is_empty() || b.is_empty() {
        return Err(Error::Empty);
    }
    check_finite(a)?;
    check_finite(b)?;
    let (na, nb) = (a.len(), b.len());
    let n = na + nb;
    let mut all: Vec<(f64, bool)> = a
        .iter()
        .map(|&v| (v, true))
        .chain(b.iter().map(|&v| (v, false)))
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));

    // Rank sum of `a` with midranks, and the tie term Σ(t³ - t).
    let mut rank_sum_a = 0.0f64;
    let mut tie_term = 0.0f64;
    let mut i = 0;
    while i < n {
        let mut j = i + 1;
        while j < n && all[j].0 == all[i].0 {
            j += 1;
        }
        let t = (j - i) as f64;
        let midrank = (i + 1 + j) as f64 / 2.0; // mean of ranks i+1..=j
        let in_a = all[i..j].iter().filter(|e| e.1).count() as f64;
        rank_sum_a += midrank * in_a;
        tie_term += t * t * t - t;
        i = j;
    }
    let (naf, nbf, nf) = (na as f64, nb as f64, n as f64);
    let u = rank_sum_a - naf * (naf + 1.0) / 2.0;
    let mu = naf * nbf / 2.0;
    let var = if n > 1 {
        naf * nbf / 12.0 * ((nf + 1.0) - tie_term / (nf * (nf - 1.0)))
    } else {
        0.0
    };
    let d = u - mu;
    let corrected = (d.abs() - 0.5).max(0.0);
    let (z, p_normal) = if var > 0.0 {
        let sd = var.sqrt();
        (
            d.signum() * corrected / sd,
            (2.0 * normal_sf(corrected / sd)).min(1.0),
        )
    } else {
        (0.0, 1.0)
    };

    let (p_two_sided, method) = if tie_term == 0.0 && n <= EXACT_MAX_TOTAL {
        let counts = exact_u_counts(na.min(nb), na.max(nb));
        let total: i128 = counts.iter().sum();
        // Two-sided: twice the upper tail at the larger of U and n_a n_b - U.
        let u_max = u.max(naf * nbf - u) as usize;
        let upper: i128 = counts[u_max..].iter().sum();
        ((2.0 * upper as f64 / total as f64).min(1.0), PMethod::Exact)
    } else {
        (p_normal, PMethod::Normal)
    };
    let cles = u / (naf * nbf);
    Ok(MannWhitney {
        u,
        z,
        p_two_sided,
        method,
        cles,
        rank_biserial: 2.0 * cles - 1.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choose(n: u32, k: u32) -> i128 {
        (0..k).fold(1i128, |acc, i| acc * (n - i) as i128 / (i + 1) as i128)
    }

    #[test]
    fn exact_counts_sum_to_binomial_and_are_symmetric() {
        for m in 1..8 {
            for n in 1..8 {
                let c = exact_u_counts(m, n);
                assert_eq!(c.len(), m * n + 1);
                assert_eq!(c.iter().sum::<i128>(), choose((m + n) as u32, m as u32));
                assert!(c.iter().all(|&x| x > 0));
                let rev: Vec<i128> = c.iter().rev().copied().collect();
                assert_eq!(c, rev, "m={m} n={n}");
                assert_eq!(c, exact_u_counts(n, m));
            }
        }
    }

    #[test]
    fn exact_counts_at_the_largest_size_fit() {
        let c = exact_u_counts(50, 50);
        assert_eq!(c.iter().sum::<i128>(), choose(100, 50));
    }

    #[test]
    fn exact_counts_small_case_by_hand() {
        // m = 2, n = 2: arrangements of AABB by number of (A after B) pairs:
        // U = 0: AABB; 1: ABAB; 2: ABBA, BAAB; 3: BABA; 4: BBAA.
        assert_eq!(exact_u_counts(2, 2), vec![1, 1, 2, 1, 1]);
    }
}

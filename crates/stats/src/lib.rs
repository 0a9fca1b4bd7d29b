//! Statistics for onionlab's lab: the numbers behind every table and plot
//! of a report.
//!
//! All functions are pure; the bootstrap ones take a seed and are
//! deterministic given it (a `StdRng` seeded with `seed_from_u64`).
//!
//! * Descriptive: [`quantile`] (type 7, linear interpolation between order
//!   statistics, R's and NumPy's default), [`median`], [`mean`],
//!   [`Summary::of`] (n, median, p10, p90, mean, min, max and 95% intervals
//!   for the mean and the median), [`Summary::of_clustered`] (the same with
//!   the intervals from a bootstrap over clusters).
//! * Intervals: [`mean_ci_bootstrap`] (percentile bootstrap,
//!   [`BOOTSTRAP_RESAMPLES`] resamples), [`quantile_ci`] and
//!   [`order_interval`] (distribution-free, from order statistics and the
//!   binomial distribution), [`quantile_band`] (pointwise intervals for a
//!   CDF plot), [`ecdf`] and [`dkw_band`] (simultaneous
//!   Dvoretzky–Kiefer–Wolfowitz band).
//! * Two samples: [`ratio_of_medians`] (bootstrap interval, samples
//!   resampled independently), [`ratio_of_medians_clustered`] (values in
//!   clusters, such as the transfers of one repetition: a paired bootstrap
//!   over clusters, with [`cluster_medians`] and [`has_repeated_cluster`];
//!   [`ratio_clustered`] the same for means, [`Center`])
//!   and [`mann_whitney_u`] (exact or normal approximation with tie and
//!   continuity corrections, plus effect sizes).
//! * Regression: [`slope_bootstrap`] (least-squares slope with a bootstrap
//!   interval over points).
//! * Many comparisons: [`holm_adjust`] (family-wise error rate) and
//!   [`benjamini_hochberg_adjust`] (false discovery rate).
//!
//! Inputs are checked: an empty input is [`Error::Empty`], NaN or infinity
//! is [`Error::NotFinite`]. Results never contain NaN; an interval side that
//! the data cannot bound is reported as ±∞.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod adjust;
mod bootstrap;
mod describe;
mod error;
mod mann_whitney;
mod order;
mod regression;

pub use adjust::{benjamini_hochberg_adjust, holm_adjust};
pub use bootstrap::{
    center_clustered, cluster_medians, has_repeated_cluster, mean_ci_bootstrap, ratio_clustered,
    ratio_clustered_unpaired, ratio_of_medians, ratio_of_medians_clustered, Center, RatioCi,
    Summary, BOOTSTRAP_RESAMPLES,
};
pub use describe::{check_finite, mean, median, quantile, sorted};

/// A bootstrap seed named by text: FNV-1a (64-bit) over the parts joined
/// by a 0 byte. Reports and tables seed each interval with the names of
/// what it compares (metric, variant...), so the same data gives the same
/// numbers, byte for byte.
pub fn seed_of_names(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, part) in parts.iter().enumerate() {
        let separator = (i > 0).then_some(0u8);
        for b in separator.into_iter().chain(part.bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}
pub use error::{Error, Result};
pub use mann_whitney::{mann_whitney_u, MannWhitney, PMethod, EXACT_MAX_TOTAL};
pub use order::{
    binomial_cdf, dkw_band, dkw_epsilon, ecdf, order_interval, quantile_band, quantile_ci,
    EcdfBandPoint, OrderInterval, QuantileBandPoint,
};
pub use regression::{slope_bootstrap, SlopeCi};

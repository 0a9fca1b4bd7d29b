//! Bootstrap intervals and the per-variant summary.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use std::collections::BTreeMap;

use crate::describe::{check_finite, median_in_place, quantile_unchecked, sorted, sum};
use crate::order::{check_confidence, quantile_ci};
use crate::{Error, Result};

/// Number of bootstrap resamples used by [`Summary::of`],
/// [`Summary::of_clustered`],
/// [`mean_ci_bootstrap`], [`ratio_of_medians`] and
/// [`ratio_of_medians_clustered`].
pub const BOOTSTRAP_RESAMPLES: usize = 2000;

/// Percentile interval `(α/2, 1 - α/2)` of bootstrap replicates (type-7
/// quantiles of the sorted replicates).
pub(crate) fn percentile_interval(mut replicates: Vec<f64>, conf: f64) -> (f64, f64) {
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
    /// `Some(n)`: both intervals resampled the values' n clusters
    /// ([`Summary::of_clustered`]); `None`: they treat the values as
    /// independent ([`Summary::of`]).
    pub clusters: Option<usize>,
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
            clusters: None,
        })
    }

    /// Summarises values that come in clusters (in the lab: the transfers
    /// of one repetition, which share its network and are not independent
    /// draws); `clusters[i]` is the cluster of `values[i]`. The quantiles,
    /// mean and extremes are those of [`Summary::of`]; both intervals come
    /// from a cluster bootstrap instead: [`BOOTSTRAP_RESAMPLES`] times, as
    /// many cluster ids as there are are drawn with replacement (one
    /// `StdRng` seeded with `seed`), their values pooled (twice if drawn
    /// twice), and the pool's mean and median recorded; the intervals are
    /// the 95% percentile intervals of those. With fewer than two clusters
    /// both are `(-∞, +∞)`.
    ///
    /// # Errors
    ///
    /// Those of [`Summary::of`], and [`Error::ClusterLength`] when there is
    /// not one cluster id per value.
    pub fn of_clustered(values: &[f64], clusters: &[u32], seed: u64) -> Result<Summary> {
        let independent = Summary::of(values, seed)?;
        check_clusters(values, clusters)?;
        let groups = groups_of(values, clusters);
        let (mean_ci95, median_ci95) = if groups.len() < 2 {
            let unbounded = (f64::NEG_INFINITY, f64::INFINITY);
            (unbounded, unbounded)
        } else {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut pool = Vec::new();
            let (mut means, mut medians) = (Vec::new(), Vec::new());
            for _ in 0..BOOTSTRAP_RESAMPLES {
                pool.clear();
                for _ in 0..groups.len() {
                    pool.extend_from_slice(&groups[rng.random_range(0..groups.len())]);
                }
                means.push(sum(pool.iter().copied()) / pool.len() as f64);
                medians.push(median_in_place(&mut pool));
            }
            (
                percentile_interval(means, 0.95),
                percentile_interval(medians, 0.95),
            )
        };
        Ok(Summary {
            mean_ci95,
            median_ci95,
            clusters: Some(groups.len()),
            ..independent
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
    let ratio = point_ratio(a, b, Center::Median)?;
    if a.len() < 2 || b.len() < 2 {
        return Ok(RatioCi {
            ratio,
            ci95: (0.0, f64::INFINITY),
        });
    }
    Ok(bootstrap_ratio(
        ratio,
        seed,
        Center::Median,
        |rng, sa, sb| {
            resample(rng, a, sa);
            resample(rng, b, sb);
        },
    ))
}

/// What a ratio compares: each sample's median or its mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Center {
    /// The median (robust; what the lab compares by default).
    #[default]
    Median,
    /// The arithmetic mean (what papers that give "mean ± CI" compare).
    Mean,
    /// The 75th percentile (type 7): the slowest quarter's edge.
    P75,
    /// The 95th percentile (type 7): the slowest 5%'s edge.
    P95,
    /// The 99th percentile (type 7): the tail an interactive user meets
    /// (needs many values per repetition: probes, cells, messages).
    P99,
}

impl Center {
    /// The centre of `buf` (which it may reorder); `buf` is not empty.
    pub(crate) fn of(self, buf: &mut [f64]) -> f64 {
        match self {
            Center::Median => median_in_place(buf),
            Center::Mean => sum(buf.iter().copied()) / buf.len() as f64,
            Center::P75 | Center::P95 | Center::P99 => {
                buf.sort_by(f64::total_cmp);
                quantile_unchecked(buf, self.quantile().unwrap_or(0.5))
            }
        }
    }

    /// The quantile level of a percentile centre.
    fn quantile(self) -> Option<f64> {
        match self {
            Center::P75 => Some(0.75),
            Center::P95 => Some(0.95),
            Center::P99 => Some(0.99),
            Center::Median | Center::Mean => None,
        }
    }

    /// The centre of `values` (any order).
    ///
    /// # Errors
    ///
    /// [`Error::Empty`] or [`Error::NotFinite`].
    pub fn of_values(self, values: &[f64]) -> Result<f64> {
        let mut buf = sorted(values)?;
        Ok(self.of(&mut buf))
    }
}

/// `center(a) / center(b)` after checking both samples.
fn point_ratio(a: &[f64], b: &[f64], center: Center) -> Result<f64> {
    check_non_negative(a)?;
    check_non_negative(b)?;
    let (mut sa, mut sb) = (a.to_vec(), b.to_vec());
    let (ma, mb) = (center.of(&mut sa), center.of(&mut sb));
    if mb == 0.0 {
        return Err(Error::ZeroMedian);
    }
    Ok(ma / mb)
}

/// [`BOOTSTRAP_RESAMPLES`] times, `draw` fills the two resamples (from one
/// `StdRng` seeded with `seed`) and the ratio of their centres is recorded:
/// `+∞` where only the denominator's is 0, nothing where both are or a
/// resample is empty. The 95% percentile interval of the records, `(0,
/// +∞)` without any.
fn bootstrap_ratio(
    ratio: f64,
    seed: u64,
    center: Center,
    mut draw: impl FnMut(&mut StdRng, &mut Vec<f64>, &mut Vec<f64>),
) -> RatioCi {
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut sa, mut sb) = (Vec::new(), Vec::new());
    let mut replicates = Vec::with_capacity(BOOTSTRAP_RESAMPLES);
    for _ in 0..BOOTSTRAP_RESAMPLES {
        draw(&mut rng, &mut sa, &mut sb);
        if sa.is_empty() || sb.is_empty() {
            continue;
        }
        let (ra, rb) = (center.of(&mut sa), center.of(&mut sb));
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
    RatioCi { ratio, ci95 }
}

fn check_clusters(values: &[f64], clusters: &[u32]) -> Result<()> {
    if values.len() == clusters.len() {
        Ok(())
    } else {
        Err(Error::ClusterLength {
            values: values.len(),
            clusters: clusters.len(),
        })
    }
}

/// Each cluster's values, `a`'s and `b`'s, by cluster id.
fn by_cluster(
    a: &[f64],
    a_clusters: &[u32],
    b: &[f64],
    b_clusters: &[u32],
) -> BTreeMap<u32, (Vec<f64>, Vec<f64>)> {
    let mut groups: BTreeMap<u32, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for (&v, &c) in a.iter().zip(a_clusters) {
        groups.entry(c).or_default().0.push(v);
    }
    for (&v, &c) in b.iter().zip(b_clusters) {
        groups.entry(c).or_default().1.push(v);
    }
    groups
}

/// One sample's values by cluster, in ascending cluster id order.
fn groups_of(values: &[f64], clusters: &[u32]) -> Vec<Vec<f64>> {
    by_cluster(values, clusters, &[], &[])
        .into_values()
        .map(|(v, _)| v)
        .collect()
}

/// The ratio `median(a) / median(b)` with a 95% paired cluster-bootstrap
/// interval, for values that come in clusters (in the lab: the
/// transfers of one repetition, which share its network and are not
/// independent draws). `a_clusters[i]` is the cluster of `a[i]`, likewise
/// for `b`; a cluster id names the same cluster on both sides (the lab's
/// repetition r of every variant has the same seed).
///
/// [`BOOTSTRAP_RESAMPLES`] times, as many cluster ids as there are (the
/// union of both sides') are drawn with replacement from one `StdRng`
/// seeded with `seed`; every value of `a` and of `b` in a drawn cluster is
/// pooled (twice if drawn twice) and the ratio of the pools' medians is
/// recorded. A draw that leaves a side empty is skipped. With independent
/// values in clusters of one this is a paired bootstrap; where values of a
/// cluster are alike, the interval reflects the number of clusters, not
/// of values, as [`ratio_of_medians`] would.
///
/// The ratio and the handling of zeros are those of [`ratio_of_medians`];
/// with fewer than two clusters the interval is `(0, +∞)`.
///
/// # Errors
///
/// Those of [`ratio_of_medians`], and [`Error::ClusterLength`] when a
/// side's cluster ids are not one per value.
pub fn ratio_of_medians_clustered(
    a: &[f64],
    a_clusters: &[u32],
    b: &[f64],
    b_clusters: &[u32],
    seed: u64,
) -> Result<RatioCi> {
    ratio_clustered(a, a_clusters, b, b_clusters, seed, Center::Median)
}

/// [`ratio_of_medians_clustered`] with the ratio of `center`s: medians, or
/// means (the same paired bootstrap over clusters).
///
/// # Errors
///
/// As [`ratio_of_medians_clustered`] (a zero mean of `b` is
/// [`Error::ZeroMedian`] too).
pub fn ratio_clustered(
    a: &[f64],
    a_clusters: &[u32],
    b: &[f64],
    b_clusters: &[u32],
    seed: u64,
    center: Center,
) -> Result<RatioCi> {
    let ratio = point_ratio(a, b, center)?;
    check_clusters(a, a_clusters)?;
    check_clusters(b, b_clusters)?;
    let groups: Vec<(Vec<f64>, Vec<f64>)> = by_cluster(a, a_clusters, b, b_clusters)
        .into_values()
        .collect();
    if groups.len() < 2 {
        return Ok(RatioCi {
            ratio,
            ci95: (0.0, f64::INFINITY),
        });
    }
    Ok(bootstrap_ratio(ratio, seed, center, |rng, sa, sb| {
        sa.clear();
        sb.clear();
        for _ in 0..groups.len() {
            let (ga, gb) = &groups[rng.random_range(0..groups.len())];
            sa.extend_from_slice(ga);
            sb.extend_from_slice(gb);
        }
    }))
}

/// [`ratio_clustered`] for two samples whose clusters are not paired (in
/// the lab: the repetitions a variant made beside other runs against those
/// it made alone): each side's clusters are drawn apart, as many as it
/// has, with replacement, from one `StdRng` seeded with `seed`, and the
/// ratio of the pools' `center`s recorded. With fewer than two clusters on
/// a side the interval is `(0, +∞)`.
///
/// # Errors
///
/// As [`ratio_clustered`].
pub fn ratio_clustered_unpaired(
    a: &[f64],
    a_clusters: &[u32],
    b: &[f64],
    b_clusters: &[u32],
    seed: u64,
    center: Center,
) -> Result<RatioCi> {
    let ratio = point_ratio(a, b, center)?;
    check_clusters(a, a_clusters)?;
    check_clusters(b, b_clusters)?;
    let (ga, gb) = (groups_of(a, a_clusters), groups_of(b, b_clusters));
    if ga.len() < 2 || gb.len() < 2 {
        return Ok(RatioCi {
            ratio,
            ci95: (0.0, f64::INFINITY),
        });
    }
    Ok(bootstrap_ratio(ratio, seed, center, |rng, sa, sb| {
        sa.clear();
        sb.clear();
        for _ in 0..ga.len() {
            sa.extend_from_slice(&ga[rng.random_range(0..ga.len())]);
        }
        for _ in 0..gb.len() {
            sb.extend_from_slice(&gb[rng.random_range(0..gb.len())]);
        }
    }))
}

/// The `center` of `values` with a 95% cluster-bootstrap interval: as
/// [`Summary::of_clustered`] does for the mean and the median, for any
/// [`Center`] ([`BOOTSTRAP_RESAMPLES`] draws of as many clusters as there
/// are, with replacement, from one `StdRng` seeded with `seed`; the
/// pooled values' centre recorded). With fewer than two clusters the
/// interval is `(-∞, +∞)`.
///
/// # Errors
///
/// [`Error::Empty`], [`Error::NotFinite`], [`Error::ClusterLength`].
pub fn center_clustered(
    values: &[f64],
    clusters: &[u32],
    seed: u64,
    center: Center,
) -> Result<(f64, (f64, f64))> {
    let point = center.of_values(values)?;
    check_clusters(values, clusters)?;
    let groups = groups_of(values, clusters);
    if groups.len() < 2 {
        return Ok((point, (f64::NEG_INFINITY, f64::INFINITY)));
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let mut pool = Vec::new();
    let mut replicates = Vec::with_capacity(BOOTSTRAP_RESAMPLES);
    for _ in 0..BOOTSTRAP_RESAMPLES {
        pool.clear();
        for _ in 0..groups.len() {
            pool.extend_from_slice(&groups[rng.random_range(0..groups.len())]);
        }
        replicates.push(center.of(&mut pool));
    }
    Ok((point, percentile_interval(replicates, 0.95)))
}

/// The median of each cluster's values, in ascending cluster id order
/// (for tests that need independent values, such as [`crate::mann_whitney_u`]
/// on clustered data).
///
/// # Errors
///
/// [`Error::Empty`], [`Error::NotFinite`], [`Error::ClusterLength`].
pub fn cluster_medians(values: &[f64], clusters: &[u32]) -> Result<Vec<f64>> {
    if values.is_empty() {
        return Err(Error::Empty);
    }
    check_finite(values)?;
    check_clusters(values, clusters)?;
    Ok(groups_of(values, clusters)
        .into_iter()
        .map(|mut v| median_in_place(&mut v))
        .collect())
}

/// Whether any cluster holds more than one value (so the values are not
/// independent draws and need [`ratio_of_medians_clustered`]).
pub fn has_repeated_cluster(clusters: &[u32]) -> bool {
    let mut seen = std::collections::BTreeSet::new();
    clusters.iter().any(|c| !seen.insert(*c))
}

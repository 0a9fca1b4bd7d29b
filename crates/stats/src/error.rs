//! The crate's error type.

/// Why a statistic could not be computed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The input (or one of the two samples) has no values.
    #[error("no values: the statistic needs at least one")]
    Empty,
    /// A value is NaN or infinite; `index` is its position in the input.
    #[error("value at index {index} is not finite ({value})")]
    NotFinite {
        /// Position of the value in the input slice.
        index: usize,
        /// The offending value.
        value: f64,
    },
    /// A function that takes sorted input found `sorted[index] < sorted[index - 1]`.
    #[error("input is not sorted in ascending order at index {index}")]
    NotSorted {
        /// Position of the first value smaller than its predecessor.
        index: usize,
    },
    /// A probability (quantile level) outside `[0, 1]`, or NaN.
    #[error("probability {0} is outside [0, 1]")]
    InvalidProbability(f64),
    /// A confidence level outside the open interval `(0, 1)`, or NaN.
    #[error("confidence level {0} is outside (0, 1)")]
    InvalidConfidence(f64),
    /// A ratio of medians was asked for with a negative value in a sample.
    #[error("value at index {index} is negative ({value}); ratios of medians need values >= 0")]
    Negative {
        /// Position of the value in its sample.
        index: usize,
        /// The offending value.
        value: f64,
    },
    /// Cluster ids were given for a sample, but not one per value.
    #[error("{clusters} cluster ids for {values} values: every value needs one")]
    ClusterLength {
        /// Values in the sample.
        values: usize,
        /// Cluster ids given for it.
        clusters: usize,
    },
    /// A ratio of medians was asked for with a denominator sample whose median is 0.
    #[error("the denominator sample's median is 0: the ratio of medians is undefined")]
    ZeroMedian,
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

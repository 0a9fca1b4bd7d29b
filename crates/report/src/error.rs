//! The crate's error type.

use std::path::PathBuf;

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The input names no variants.
    #[error("the report input names no variants")]
    NoVariants,
    /// A variant label is empty or appears twice in `variants`.
    #[error("variant label {0:?} is empty or appears more than once")]
    BadVariant(String),
    /// A metric key is empty, has characters other than ASCII letters,
    /// digits, `_` and `-` (it names files), or appears twice.
    #[error("metric key {0:?} is empty, not [A-Za-z0-9_-], or appears more than once")]
    BadMetricKey(String),
    /// A metric or count row names a variant that is not in `variants`, or
    /// names the same variant twice.
    #[error(
        "{context} names variant {variant:?}, which is not in the variant list or is repeated"
    )]
    UnknownVariant {
        /// Which part of the input (metric key or "counts").
        context: String,
        /// The label.
        variant: String,
    },
    /// A metric value is NaN or infinite.
    #[error(
        "metric {metric:?}, variant {variant:?}: value at index {index} is not finite ({value})"
    )]
    NotFinite {
        /// Metric key.
        metric: String,
        /// Variant label.
        variant: String,
        /// Position of the value.
        index: usize,
        /// The value.
        value: f64,
    },
    /// A metric's repetitions of a variant are not one per value.
    #[error(
        "metric {metric:?}, variant {variant:?}: {repetitions} repetition numbers for {values} values"
    )]
    RepetitionCount {
        /// Metric key.
        metric: String,
        /// Variant label.
        variant: String,
        /// Values of the variant.
        values: usize,
        /// Repetition numbers given for them.
        repetitions: usize,
    },
    /// The design does not fit the variants (see [`crate::Design`]).
    #[error("the report's design does not fit its variants: {0}")]
    BadDesign(String),
    /// The embedded font could not be loaded by the text renderer.
    #[error("the embedded DejaVu Sans font could not be registered with plotters")]
    Font,
    /// Drawing a figure failed.
    #[error("drawing {path}: {message}")]
    Plot {
        /// The figure's file.
        path: PathBuf,
        /// What the plotting library said.
        message: String,
    },
    /// Creating the output directory or writing a file failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

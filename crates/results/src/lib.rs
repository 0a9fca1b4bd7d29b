//! onionlab's results: the tables of the results pages (`docs/results/`),
//! made from lab runs with one statistics implementation
//! (`onionlab-stats`), and the pages' generated tables checked against the
//! stored runs they come from.
//!
//! - [`mod@table`]: `onionlab lab table RUN ...`, one comparison table of a
//!   run (a run directory or a stored run, `onionlab_lab::rundata`), or
//!   with `--summary` each variant's centres with their intervals;
//! - [`pages`]: the generated blocks of the pages, `onionlab results
//!   check` and `onionlab results update`.

#![deny(missing_docs)]

mod error;
mod jobs;
pub mod pages;
pub mod select;
pub mod sharing;
mod slope;
mod summary;
pub mod table;

pub use error::{Error, Result};
pub use select::MetricKind;
pub use table::{table, table_of, Correction, TableArgs};

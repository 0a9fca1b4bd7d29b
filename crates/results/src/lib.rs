//! onionlab's results: the tables of the results pages (`docs/results/`),
//! made from lab runs with one statistics implementation
//! (`onionlab-stats`), and the pages' generated tables checked against the
//! stored runs they come from.
//!
//! - [`mod@table`]: `onionlab lab table RUN ...` ([`TableArgs`]), one
//!   comparison table of a run (a run directory or a stored run,
//!   `onionlab_lab::rundata`; several read together); the other kinds of
//!   table it makes: `--summary` (each variant's centres with their
//!   intervals), `--slope-over` (cost per unit of a quantity), `--by-jobs`
//!   (repetitions beside other runs against those alone);
//! - [`select`]: which records count and each metric's values;
//!   [`sharing`]: what a web client's circuit shares with the bulk
//!   clients';
//! - [`pages`]: the generated blocks of the pages, `onionlab results
//!   check` and `onionlab results update`.

#![deny(missing_docs)]

mod args;
mod common;
mod error;
mod jobs;
pub mod pages;
pub mod select;
pub mod sharing;
mod slope;
mod summary;
pub mod table;

pub use args::{CenterArg, Correction, TableArgs};
pub use error::{Error, Result};
pub use select::MetricKind;
pub use table::{table, table_of};

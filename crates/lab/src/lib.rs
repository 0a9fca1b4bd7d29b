//! onionlab's lab: scenario files describing an experiment once, expanded
//! into variants (transport, scheduler, latency, loss, size...) that run
//! over the emulated network.

#![warn(missing_docs)]

pub mod agent;
pub mod ctor;
pub mod engine;
mod error;
pub mod hostnet;
pub mod journal;
pub mod labels;
pub mod matrix;
pub mod plan;
pub mod process;
pub mod run;
pub mod rundata;
pub mod scenario;
pub mod stream;
pub mod summary;
pub mod traffic;
pub mod variant;
pub mod workload;

pub use error::{Error, Result};
pub use scenario::Scenario;
pub use variant::Variant;
pub use workload::{Workload, WorkloadKind};

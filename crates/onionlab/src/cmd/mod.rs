//! Subcommand groups. Each module exposes a clap `Subcommand` enum and a `run` function.

pub mod analyze;
pub mod bench;
pub mod client;
pub mod ctornet;
pub mod directory;
pub mod lab;
pub mod logging;
pub mod netem;
pub mod network;
pub mod relay;
pub mod results;
pub mod runtime;
pub mod schedulers;

//! Subcommand groups. Each module exposes a clap `Subcommand` enum and a `run` function.

pub mod analyze;
pub mod bench;
pub mod client;
pub mod ctornet;
pub mod demo;
pub mod directory;
pub mod lab;
pub mod logging;
pub mod net;
pub mod network;
pub mod relay;
pub mod results;
pub mod runtime;

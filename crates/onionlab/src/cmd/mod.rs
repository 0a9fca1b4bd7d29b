//! Subcommand groups. Each module exposes a clap `Subcommand` enum and a `run` function.

pub mod demo;
pub mod net;

//! `onionlab`: the project's command-line tool.
//!
//! Subcommand groups live in `cmd/`, one module each; `main` only parses the
//! command line, sets up logging and dispatches.

mod cmd;
mod error;

use clap::{Parser, Subcommand};

/// onion routing with pluggable transports, and a lab to compare them
#[derive(Parser, Debug)]
#[command(name = "onionlab", version, about)]
struct Cli {
    /// Log filter (tracing-subscriber EnvFilter syntax), e.g. `info` or `onionlab_netem=debug`.
    #[arg(long, global = true, env = "ONIONLAB_LOG", default_value = "info")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Emulated network: hosts in network namespaces joined by a link emulator.
    #[command(subcommand)]
    Net(Box<cmd::net::NetCommand>),
    /// The default experiment (until the lab lands): bulk and light circuits
    /// sharing a path on the in-memory network, per circuit scheduler.
    Demo(cmd::demo::DemoArgs),
    /// Create a network: keys, node configs and a signed network document.
    #[command(subcommand)]
    Network(cmd::network::NetworkCommand),
    /// Run a relay (an exit if the network document says so).
    Relay(cmd::relay::RelayArgs),
    /// Run a client: a SOCKS5 proxy that carries streams over circuits.
    Client(cmd::client::ClientArgs),
    /// Serve a signed network document over HTTP.
    Directory(cmd::directory::DirectoryArgs),
    /// The lab: run scenarios over the emulated network.
    #[command(subcommand)]
    Lab(cmd::lab::LabCommand),
    /// Benchmarks of real processes on loopback.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.command {
        Command::Net(c) => cmd::net::run(*c),
        Command::Demo(a) => cmd::demo::run(a),
        Command::Network(c) => cmd::network::run(c),
        Command::Relay(a) => cmd::relay::run(a),
        Command::Client(a) => cmd::client::run(a),
        Command::Directory(a) => cmd::directory::run(a),
        Command::Bench(c) => cmd::bench::run(c),
        Command::Lab(c) => cmd::lab::run_cmd(c),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("onionlab: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

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
    /// Log filter (tracing-subscriber EnvFilter syntax), e.g. `info` or
    /// `onionlab_netem=debug`. Default: the `log` setting of the relay or
    /// client config file, else `info`.
    #[arg(long, global = true, env = "ONIONLAB_LOG")]
    log: Option<String>,
    /// Run as if started in DIR (as `git -C DIR`): relative paths on the
    /// command line and in the files it reads are taken from there. The
    /// Shadow engine starts every process with it, since Shadow starts
    /// them in a folder of its own.
    #[arg(short = 'C', long = "directory", global = true, value_name = "DIR")]
    directory: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The default experiment: the lab's `demo` scenario (`lab run demo`),
    /// every transport over the same emulated network, with its report.
    #[command(after_long_help = onionlab_transport::registry::help_text())]
    Demo(cmd::lab::RunFlags),
    /// Emulated network: hosts in network namespaces joined by a link
    /// emulator (`net` is an older name).
    #[command(subcommand, alias = "net")]
    Netem(Box<cmd::netem::NetCommand>),
    /// Circuit schedulers compared on the deterministic in-memory network:
    /// a bulk and a light circuit share every channel of a 3-hop path
    /// (simulated time; no root, seconds).
    Schedulers(cmd::schedulers::SchedulersArgs),
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
    /// The results pages: their generated tables checked against the
    /// stored runs, or rewritten.
    #[command(subcommand)]
    Results(cmd::results::ResultsCommand),
    /// Benchmarks of real processes on loopback.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
    /// What multi-path clients cost in anonymity (seed 004): compromise
    /// probabilities and guard fingerprinting, analytic and by Monte Carlo
    /// over a network's bandwidth weights.
    Analyze(cmd::analyze::AnalyzeArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    cmd::logging::init(cli.log.as_deref());
    if let Some(dir) = &cli.directory {
        if let Err(e) = std::env::set_current_dir(dir) {
            eprintln!("onionlab: -C {}: {e}", dir.display());
            return std::process::ExitCode::FAILURE;
        }
    }
    let result = match cli.command {
        Command::Demo(flags) => cmd::lab::run_demo(flags),
        Command::Netem(c) => cmd::netem::run(*c),
        Command::Schedulers(a) => cmd::schedulers::run(a),
        Command::Network(c) => cmd::network::run(c),
        Command::Relay(a) => cmd::relay::run(a),
        Command::Client(a) => cmd::client::run(a),
        Command::Directory(a) => cmd::directory::run(a),
        Command::Bench(c) => cmd::bench::run(c),
        Command::Lab(c) => cmd::lab::run_cmd(c),
        Command::Results(c) => cmd::results::run(c),
        Command::Analyze(a) => cmd::analyze::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("onionlab: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

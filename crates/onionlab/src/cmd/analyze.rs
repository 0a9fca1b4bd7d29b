//! `onionlab analyze`: what multi-path clients cost in anonymity (seed
//! 004, De la Cadena et al. 2019, section 6; `onionlab_anonymity`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use onionlab_anonymity::{analytic, anonymity_set_estimate, simulate, Experiment, Relay};
use onionlab_netdoc::doc::NetworkDocument;
use onionlab_netdoc::keys::load_network_public_key;

use crate::error::{Error, Result};

/// Arguments of `onionlab analyze`.
#[derive(Args, Debug)]
pub struct AnalyzeArgs {
    /// The adversary's share of entry (guard) bandwidth.
    #[arg(long, default_value_t = 0.2)]
    fg: f64,
    /// The adversary's share of exit bandwidth.
    #[arg(long, default_value_t = 0.2)]
    fx: f64,
    /// Entries (paths) per client to report.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    paths: Vec<u32>,
    /// Clients of the analytic guard-fingerprinting estimate.
    #[arg(long, default_value_t = 2_000_000.0)]
    clients: f64,
    /// Guards of the analytic estimate.
    #[arg(long, default_value_t = 2000)]
    guards: u64,
    /// A C tor consensus to draw clients over (Monte Carlo), e.g. one from
    /// CollecTor or a lab run's `raw/.../ctor/auth/cached-consensus`.
    #[arg(long, conflicts_with = "network")]
    consensus: Option<PathBuf>,
    /// An onionlab network document to draw clients over (Monte Carlo).
    #[arg(long, requires = "network_key")]
    network: Option<PathBuf>,
    /// The network's public key file (with --network).
    #[arg(long)]
    network_key: Option<PathBuf>,
    /// Clients drawn per number of paths in the Monte Carlo.
    #[arg(long, default_value_t = 100_000)]
    sim_clients: u32,
    /// The adversary runs its share as this many relays each way.
    #[arg(long, default_value_t = 20)]
    adversary_relays: u32,
    /// Seed of the Monte Carlo.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Print the analytic table, and the Monte Carlo one given a network.
pub fn run(args: AnalyzeArgs) -> Result<ExitCode> {
    if !(0.0..1.0).contains(&args.fg) || !(0.0..1.0).contains(&args.fx) {
        return Err(Error::Usage(format!(
            "--fg and --fx are fractions in [0, 1): got {} and {}",
            args.fg, args.fx
        )));
    }
    if args.paths.iter().any(|&m| m == 0 || m > 8) {
        return Err(Error::Usage("--paths: numbers from 1 to 8".into()));
    }
    println!(
        "Analytic (seed 004, section 6): adversary with {:.1}% of entry and {:.1}% of exit \
         bandwidth; {} clients over {} guards",
        100.0 * args.fg,
        100.0 * args.fx,
        args.clients,
        args.guards
    );
    println!("paths  entry+exit  any entry  all entries  clients per guard set");
    for &m in &args.paths {
        let c = analytic(args.fg, args.fx, m);
        println!(
            "{m:>5}  {:>9.2}%  {:>8.2}%  {:>10.3}%  {:>21.4}",
            100.0 * c.correlation,
            100.0 * c.any_entry,
            100.0 * c.all_entries,
            anonymity_set_estimate(args.clients, args.guards, m)
        );
    }
    let Some((relays, origin)) = network(&args)? else {
        return Ok(ExitCode::SUCCESS);
    };
    println!(
        "\nMonte Carlo over {origin} ({} relays; bandwidth-weighted, no position weights): \
         {} clients per row, the adversary as {} relays each way, seed {}",
        relays.len(),
        args.sim_clients,
        args.adversary_relays,
        args.seed
    );
    println!(
        "paths  entry+exit  any entry  all entries  mean anonymity set  unique  largest set  guards"
    );
    for &m in &args.paths {
        let o = simulate(
            &relays,
            &Experiment {
                f_g: args.fg,
                f_x: args.fx,
                adversary_relays: args.adversary_relays,
                paths: m,
                clients: args.sim_clients,
                seed: args.seed,
            },
        )?;
        println!(
            "{m:>5}  {:>9.2}%  {:>8.2}%  {:>10.3}%  {:>18.2}  {:>5.1}%  {:>11}  {:>6}",
            100.0 * o.compromise.correlation,
            100.0 * o.compromise.any_entry,
            100.0 * o.compromise.all_entries,
            o.mean_anonymity_set,
            100.0 * o.unique_fraction,
            o.largest_set,
            o.guards
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The relays to draw over, and where they came from.
fn network(args: &AnalyzeArgs) -> Result<Option<(Vec<Relay>, String)>> {
    if let Some(path) = &args.consensus {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Usage(format!("reading {}: {e}", path.display())))?;
        let relays = onionlab_anonymity::consensus::parse(&text)
            .map_err(|e| Error::Usage(format!("{}: {e}", path.display())))?;
        return Ok(Some((relays, path.display().to_string())));
    }
    let (Some(path), Some(key)) = (&args.network, &args.network_key) else {
        return Ok(None);
    };
    let key = load_network_public_key(key)?;
    let doc = NetworkDocument::load_file(path, &key)?;
    Ok(Some((Relay::of_document(&doc), path.display().to_string())))
}

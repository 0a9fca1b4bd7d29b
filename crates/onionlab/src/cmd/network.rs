//! `onionlab network`: create a network (keys, configs, signed document).

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use onionlab_circuit::conflux::sched::LegSchedulerKind;
use onionlab_config::{init_network, InitOptions};
use onionlab_netdoc::exit_targets::PrivateTargets;

use crate::error::Result;

/// Network set-up commands.
#[derive(Subcommand, Debug)]
pub enum NetworkCommand {
    /// Create identity and onion keys for each relay, per-relay configs, a
    /// client config and a network document signed by a new network key.
    Init {
        /// Number of relays.
        #[arg(long, default_value_t = 3)]
        relays: usize,
        /// How many of them (the last ones) are exits.
        #[arg(long, default_value_t = 1)]
        exits: usize,
        /// Output directory (created; must be empty if it exists).
        #[arg(long)]
        out: PathBuf,
        /// Address every node listens on.
        #[arg(long, default_value = "127.0.0.1")]
        host: IpAddr,
        /// Port of relay 0; relay i listens on base-port + i.
        #[arg(long, default_value_t = 9001)]
        base_port: u16,
        /// Port of the client's SOCKS listener.
        #[arg(long, default_value_t = 9050)]
        socks_port: u16,
        /// A private or local target the exits may reach although they
        /// refuse private addresses, as ADDR[/BITS]:PORT[-PORT] (for
        /// example 127.0.0.1:8000 for a server run for this network);
        /// repeatable.
        #[arg(long = "allow-private-target", value_name = "ADDR:PORT")]
        allow_private_targets: Vec<String>,
        /// Days the signed network document is valid from now; nodes
        /// refuse it after (plus 5 minutes of clock skew).
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=3650))]
        valid_days: u32,
        /// Circuit-level flow control of every circuit, written in the
        /// document: "fixed" (tor-spec's 1000-cell circuit windows) or
        /// "vegas" (proposal 324's congestion control with XON/XOFF, with
        /// C tor's parameters).
        #[arg(long, default_value = "fixed", value_parser = ["fixed", "vegas"])]
        circuit_cc: String,
        /// Let the exits link multi-path sets (proposal 329's Conflux,
        /// docs/conflux.md): writes `cfx_enabled = 1` in the document.
        /// Clients then build sets of their `legs` setting.
        #[arg(long)]
        conflux: bool,
        /// The leg scheduler of both ends of every set (`cfx_scheduler`):
        /// round-robin, round-robin:N, random, conflux-2013, mtor, minrtt,
        /// lowrtt or cwndrtt.
        #[arg(long, default_value = "lowrtt", value_parser = parse_leg_scheduler)]
        leg_scheduler: LegSchedulerKind,
    },
    /// Sign the network document of a directory made by `init` again,
    /// valid from now for `--valid-days`, with its network key (same keys,
    /// same relays): renews a document before or after it expires.
    Resign {
        /// The network directory (`network.doc`, `network-key.secret`).
        #[arg(long)]
        dir: PathBuf,
        /// Days the renewed document is valid from now.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=3650))]
        valid_days: u32,
    },
}

/// Run a network command.
pub fn run(cmd: NetworkCommand) -> Result<ExitCode> {
    match cmd {
        NetworkCommand::Init {
            relays,
            exits,
            out,
            host,
            base_port,
            socks_port,
            allow_private_targets,
            valid_days,
            circuit_cc,
            conflux,
            leg_scheduler,
        } => {
            let mut params = onionlab_netdoc::NetworkParams::with_circuit_cc(&circuit_cc)
                .map_err(|e| crate::error::Error::Usage(e.to_string()))?;
            params.cfx_enabled = conflux;
            params.cfx_scheduler = leg_scheduler;
            let exit_allow_private = PrivateTargets::parse(&allow_private_targets)?;
            let opts = InitOptions {
                relays,
                exits,
                out,
                host,
                base_port,
                socks_port,
                exit_allow_private,
                lifetime: std::time::Duration::from_secs(u64::from(valid_days) * 24 * 3600),
                params,
                ..InitOptions::default()
            };
            let summary = init_network(&opts, &mut rand::rng())?;
            println!("{summary}");
            Ok(ExitCode::SUCCESS)
        }
        NetworkCommand::Resign { dir, valid_days } => resign(&dir, valid_days),
    }
}

/// A leg scheduler by name, for clap.
fn parse_leg_scheduler(name: &str) -> std::result::Result<LegSchedulerKind, String> {
    LegSchedulerKind::parse(name)
        .ok_or_else(|| format!("not a leg scheduler ({})", LegSchedulerKind::names()))
}

/// Verify `dir/network.doc` with `dir/network-key.secret` (an expired
/// document is fine: its signature still proves it), give it a window
/// from now, sign it and replace the file (written aside, then renamed).
fn resign(dir: &std::path::Path, valid_days: u32) -> Result<ExitCode> {
    let key = onionlab_netdoc::keys::load_network_key(&dir.join("network-key.secret"))?;
    let path = dir.join("network.doc");
    let old = onionlab_netdoc::NetworkDocument::load_file(&path, &key.verifying_key())?;
    let lifetime = std::time::Duration::from_secs(u64::from(valid_days) * 24 * 3600);
    let (created_unix, valid_after_unix, valid_until_unix) =
        onionlab_netdoc::NetworkDocument::window(onionlab_config::unix_now(), lifetime);
    let doc = onionlab_netdoc::NetworkDocument {
        created_unix,
        valid_after_unix,
        valid_until_unix,
        ..old
    };
    doc.validate()?;
    let tmp = dir.join("network.doc.new");
    let write_err = |source| crate::error::Error::Write {
        path: path.display().to_string(),
        source,
    };
    std::fs::write(&tmp, doc.to_signed_text(&key)).map_err(write_err)?;
    std::fs::rename(&tmp, &path).map_err(write_err)?;
    println!(
        "{}: signed again, valid from {valid_after_unix} to {valid_until_unix} (Unix time)",
        path.display()
    );
    Ok(ExitCode::SUCCESS)
}

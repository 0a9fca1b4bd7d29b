//! `onionlab client`: the SOCKS5 onion proxy.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::error::Result;

/// Arguments of `onionlab client`.
#[derive(Args, Debug)]
#[command(after_long_help = onionlab_transport::registry::help_text())]
pub struct ClientArgs {
    /// The client's config file (written by `onionlab network init`).
    #[arg(long)]
    config: PathBuf,
}

/// Run the client until SIGINT/SIGTERM.
pub fn run(args: ClientArgs) -> Result<ExitCode> {
    let cfg = <onionlab_config::ClientConfig as onionlab_config::ConfigFile>::load(&args.config)?;
    super::logging::apply_config_filter(&args.config, cfg.log.as_deref())?;
    onionlab_client::run_config_file(&args.config)?;
    Ok(ExitCode::SUCCESS)
}

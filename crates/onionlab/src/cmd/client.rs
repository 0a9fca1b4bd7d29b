//! `onionlab client`: the SOCKS5 onion proxy.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::error::Result;

/// Arguments of `onionlab client`.
#[derive(Args, Debug)]
pub struct ClientArgs {
    /// The client's config file (written by `onionlab network init`).
    #[arg(long)]
    config: PathBuf,
}

/// Run the client until SIGINT/SIGTERM.
pub fn run(args: ClientArgs) -> Result<ExitCode> {
    onionlab_client::run_config_file(&args.config)?;
    Ok(ExitCode::SUCCESS)
}

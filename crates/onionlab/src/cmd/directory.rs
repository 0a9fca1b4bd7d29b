//! `onionlab directory`: serve a signed network document over HTTP.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use onionlab_netdoc::doc::{read_signed_file, NetworkDocument};
use onionlab_netdoc::keys::load_network_public_key;

use crate::cmd::runtime;
use crate::error::{Error, Result};

/// Arguments of `onionlab directory`.
#[derive(Args, Debug)]
pub struct DirectoryArgs {
    /// The signed network document.
    #[arg(long)]
    doc: PathBuf,
    /// The network's public key file; the document is checked against it
    /// before it is served.
    #[arg(long)]
    network_key: PathBuf,
    /// Address to serve on (`GET /network.doc`).
    #[arg(long, default_value = "127.0.0.1:9030")]
    listen: SocketAddr,
}

/// Serve the document until SIGINT/SIGTERM.
pub fn run(args: DirectoryArgs) -> Result<ExitCode> {
    let key = load_network_public_key(&args.network_key)?;
    let text = read_signed_file(&args.doc)?;
    let origin = args.doc.display().to_string();
    let doc = NetworkDocument::from_signed_text_at(&text, &key, &origin)?;
    // Serving an expired document would only make every node refuse it.
    doc.check_time(
        onionlab_config::unix_now(),
        onionlab_netdoc::CLOCK_SKEW_ALLOWANCE,
        &origin,
    )?;
    runtime::current_thread()?.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|source| Error::Write {
                path: format!("listening on {}", args.listen),
                source,
            })?;
        tracing::info!(
            addr = %args.listen,
            relays = doc.relays.len(),
            "serving the network document at /network.doc"
        );
        onionlab_config::directory::serve(listener, Arc::from(text), runtime::shutdown_signal())
            .await;
        Ok(ExitCode::SUCCESS)
    })
}

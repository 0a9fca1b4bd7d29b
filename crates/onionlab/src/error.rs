//! Errors of the command-line tool.

/// Everything a subcommand can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error from the emulated network.
    #[error(transparent)]
    Netem(#[from] onionlab_netem::Error),
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// File.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// A network document or key file problem.
    #[error(transparent)]
    Netdoc(#[from] onionlab_netdoc::Error),
    /// A configuration file, network set-up or directory problem.
    #[error(transparent)]
    Config(#[from] onionlab_config::Error),
    /// A relay failed.
    #[error(transparent)]
    Node(#[from] onionlab_node::Error),
    /// A scenario problem.
    #[error(transparent)]
    Lab(#[from] onionlab_lab::Error),
    /// The anonymity analysis's input or parameters.
    #[error(transparent)]
    Anonymity(#[from] onionlab_anonymity::Error),
    /// The client failed.
    #[error(transparent)]
    Client(#[from] onionlab_client::Error),
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// Bad command-line usage that clap cannot catch.
    #[error("{0}")]
    Usage(String),
    /// Installing the signal handlers failed.
    #[error("cannot install signal handler: {0}")]
    Signal(std::io::Error),
}

/// Result alias of the tool.
pub type Result<T> = std::result::Result<T, Error>;

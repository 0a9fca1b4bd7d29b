//! The node crate's error type.

use std::net::SocketAddr;

/// Why a relay could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The transport could not listen.
    #[error("listening on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: onionlab_transport::Error,
    },
    /// The transport could not be set up.
    #[error("setting up the transport: {0}")]
    Transport(#[source] onionlab_transport::Error),
    /// A setting the relay cannot run with (a kernel's refusal of a link
    /// setting comes as [`Error::Transport`]).
    #[error("{0}")]
    Setting(String),
    /// The relay is not in the network document.
    #[error("relay {0} is not in the network document")]
    NotInDocument(String),
    /// The runtime could not be built.
    #[error("starting the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The thread of a [`RelayThread`](crate::RelayThread) ended without
    /// its answer (it panicked).
    #[error("the relay's thread {0}")]
    Thread(&'static str),
}

//! How onionlab's nodes are set up: their configuration files, a new
//! network's keys, document and files, and getting the network document
//! from a file or an HTTP directory.
//!
//! * [`files`]: relay and client configuration files ([`RelayConfig`],
//!   [`ClientConfig`], read, checked, changed and written through
//!   [`ConfigFile`]), and loading the network document they name;
//! * [`init`]: setting up a new network (`onionlab network init`);
//! * [`directory`]: serving and fetching the document over HTTP/1.1;
//! * [`refresh`]: whether a document loaded again replaces the one held
//!   (the newest valid one is kept).
//!
//! The document itself, its parameters, exit policies and key files are
//! `onionlab-netdoc`'s plain data; each transport's settings are its own
//! serde types, gathered in `onionlab_transport::LinkSettings`.
//!
//! Every fallible function returns this crate's [`Error`], which names the
//! file, URL or text and, where there is one, the line.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod client;
pub mod directory;
mod error;
pub mod files;
pub mod init;
pub mod refresh;
mod relay;

pub use client::*;
pub use error::{Error, Result};
pub use files::{
    load_network, merge_tables, unix_now, ConfigFile, Congestion, LinkSettings, NetworkSource,
    Scheduler, TransportChoice, UnknownScheduler,
};
pub use init::{init_network, InitOptions, InitSummary};
pub use refresh::{judge_replacement, Replacement};
pub use relay::*;

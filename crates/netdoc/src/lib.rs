//! onionlab's network document and the files around it.
//!
//! * [`doc`]: the network document, the list of relays signed by the
//!   network key (onionlab's small counterpart of tor's consensus);
//! * [`params`]: network-wide parameters (circuit congestion control);
//! * [`policy`]: exit policies in a subset of tor's syntax;
//! * [`exit_targets`]: what an exit refuses before its policy (private and
//!   local addresses, relays' OR ports);
//! * [`keys`]: relay and network key files;
//! * [`config`]: relay and client configuration files, and loading the
//!   network document from a file or a directory URL;
//! * [`init`]: setting up a new network (`onionlab network init`);
//! * [`directory`]: serving and fetching the document over HTTP/1.1;
//! * [`refresh`]: whether a document loaded again replaces the one held
//!   (the newest valid one is kept).
//!
//! Every fallible function returns this crate's [`Error`], which names the
//! file, URL or text and, where there is one, the line.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod config;
pub mod directory;
pub mod doc;
mod error;
pub mod exit_targets;
pub mod init;
pub mod keys;
pub mod params;
pub mod policy;
pub mod refresh;

pub use config::{
    load_network, unix_now, ClientConfig, ConfigFile, Congestion, NetworkSource, RelayConfig,
    Scheduler, TransportChoice,
};
pub use doc::{
    Flags, NetworkDocument, RelayEntry, TransportAddress, CLOCK_SKEW_ALLOWANCE, DEFAULT_LIFETIME,
};
pub use error::{Error, Result};
pub use init::{init_network, InitOptions, InitSummary};
pub use params::NetworkParams;
pub use policy::ExitPolicy;
pub use refresh::{judge_replacement, Replacement};

//! onionlab's network document and the files around it.
//!
//! * [`doc`]: the network document, the list of relays signed by the
//!   network key (onionlab's small counterpart of tor's consensus);
//! * [`params`]: network-wide parameters (circuit congestion control);
//! * [`policy`]: exit policies in a subset of tor's syntax;
//! * [`exit_targets`]: what an exit refuses before its policy (private and
//!   local addresses, relays' OR ports);
//! * [`keys`]: relay and network key files.
//!
//! Configuration files, setting up a network and getting the document
//! from a file or an HTTP directory are `onionlab-config`'s.
//!
//! Every fallible function returns this crate's [`Error`], which names the
//! file, URL or text and, where there is one, the line.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod doc;
mod error;
pub mod exit_targets;
pub mod keys;
pub mod params;
pub mod policy;

pub use doc::{
    Flags, NetworkDocument, RelayEntry, TransportAddress, CLOCK_SKEW_ALLOWANCE, DEFAULT_LIFETIME,
};
pub use error::{line_col, Error, Result, RuleError};
pub use params::{NetworkParams, ParamsError};
pub use policy::ExitPolicy;

//! Library side of the `onionlab` tool: pieces the binary, its end-to-end
//! tests and the benchmarks share.

#![warn(missing_docs)]

pub mod testnet;

//! Torchestra (seed 003; Gopal, "Torchestra: Reducing interactive traffic
//! delays over Tor", M.S. thesis, UC San Diego, 2012): two TLS
//! connections per relay pair, one for light circuits and one for heavy
//! ones, and an in-band protocol that moves a circuit between them.
//!
//! This module holds the switch protocol's state machine ([`switch`]); the
//! protocol is specified in `docs/torchestra.md`.

pub mod switch;

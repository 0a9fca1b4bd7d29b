//! A stream request while it has no stream: whether its target fits in
//! BEGIN, and where it is.

use std::time::Instant;

use onionlab_cell::relay::is_valid_begin_addr;

use crate::path::{Target, TargetHost};
use crate::types::{CircKey, IsolationKey, StreamRef};

/// Whether a BEGIN cell can carry `target`'s host (as the circuit checks
/// it: brackets around an IPv6 literal are stripped, other brackets and NUL
/// are refused).
pub fn begin_target_ok(target: &Target) -> bool {
    match &target.host {
        TargetHost::Ip(_) => true,
        TargetHost::Name(n) => {
            let h = n
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(n);
            !h.is_empty() && is_valid_begin_addr(h.as_bytes())
        }
    }
}

/// A stream request not connected yet.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) target: Target,
    pub(crate) iso: IsolationKey,
    /// Builds that failed since the request last chose a circuit afresh.
    pub(crate) builds_failed: u32,
    /// Circuits that closed under its stream before CONNECTED.
    pub(crate) retried: u32,
    pub(crate) state: RequestState,
}

/// Where a request is.
#[derive(Debug)]
pub(crate) enum RequestState {
    /// Choosing a circuit (only inside a call).
    Choosing,
    /// Waiting for this circuit to be built.
    Building(CircKey),
    /// BEGIN sent; CONNECTED is due by the deadline.
    Connecting {
        stream: StreamRef,
        deadline: Instant,
    },
}

impl Request {
    /// When its connect timeout falls, if it is connecting.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match &self.state {
            RequestState::Connecting { deadline, .. } => Some(*deadline),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn begin_targets() {
        assert!(begin_target_ok(&Target::name("example.com", 80)));
        assert!(begin_target_ok(&Target::name("[::1]", 80)));
        assert!(!begin_target_ok(&Target::name("[]", 80)));
        assert!(!begin_target_ok(&Target::name("a[b", 80)));
        assert!(begin_target_ok(&Target::ip("::1".parse().expect("ip"), 80)));
    }
}

//! Keeping the newest valid network document.
//!
//! A node that loads the document again (a client does every
//! `network_refresh_s`) decides with [`judge_replacement`] what to do with
//! what it loaded, given the document it holds. The rule, as C tor's
//! clients apply it to consensuses:
//!
//! * the loaded document must have been verified with the network key the
//!   held one was verified with ([`crate::load_network`] does that), be
//!   valid now ([`NetworkDocument::check_time`] with the clock-skew
//!   allowance), and name the same network;
//! * its network-wide parameters (`[params]`, see [`onionlab_netdoc::params`]) must
//!   be the held one's: both ends of every circuit must run the same
//!   circuit congestion control, relays read it once at start, and nothing
//!   negotiates it per circuit, so a change needs the network restarted;
//! * it replaces the held one only if its `valid_after_unix` is strictly
//!   later. The same `valid_after_unix` is the same document: nothing to
//!   do. An earlier one is refused: a document replayed from before (it
//!   travels over plain HTTP) must not roll a node back to relays that have
//!   since been removed.
//!
//! A held document that expires while nothing newer is available is kept:
//! the node goes on with it (and says so), as tor goes on with a stale
//! consensus for a while.

use std::time::Duration;

use onionlab_netdoc::doc::NetworkDocument;

/// What to do with a document loaded again, given the one held; see the
/// [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replacement {
    /// Strictly newer and valid: replace the held document with it.
    Newer,
    /// The same `valid_after_unix`: the same document; nothing to do.
    Same,
    /// Older than the held document: refused, a replay or rollback.
    Older {
        /// The held document's `valid_after_unix`.
        held_valid_after: u64,
        /// The loaded document's `valid_after_unix`.
        loaded_valid_after: u64,
    },
    /// Not valid now (expired, or not yet valid), with the allowance for
    /// clock skew: refused.
    NotValidNow {
        /// The loaded document's `valid_after_unix`.
        valid_after: u64,
        /// The loaded document's `valid_until_unix`.
        valid_until: u64,
        /// The time it was judged at.
        now: u64,
    },
    /// Newer, but with other network-wide parameters: refused (a running
    /// node cannot change them; see the [module docs](self)).
    ParamsChanged {
        /// The held document's parameters ([`NetworkParams::summary`](onionlab_netdoc::NetworkParams::summary)).
        held: String,
        /// The loaded document's.
        loaded: String,
    },
    /// Another network's document: refused.
    OtherNetwork {
        /// The held document's network name.
        held: String,
        /// The loaded document's network name.
        loaded: String,
    },
}

impl Replacement {
    /// Whether the loaded document replaces the held one.
    pub fn accepted(&self) -> bool {
        *self == Replacement::Newer
    }
}

/// Judge `loaded`, a document just loaded and verified with the network
/// key that verified `held`, at `now_unix` with `skew` allowed either side
/// of its validity window (nodes use [`onionlab_netdoc::CLOCK_SKEW_ALLOWANCE`]).
/// Pure: no I/O, no clock.
pub fn judge_replacement(
    held: &NetworkDocument,
    loaded: &NetworkDocument,
    now_unix: u64,
    skew: Duration,
) -> Replacement {
    if loaded.network_name != held.network_name {
        return Replacement::OtherNetwork {
            held: held.network_name.clone(),
            loaded: loaded.network_name.clone(),
        };
    }
    if loaded.check_time(now_unix, skew, "").is_err() {
        return Replacement::NotValidNow {
            valid_after: loaded.valid_after_unix,
            valid_until: loaded.valid_until_unix,
            now: now_unix,
        };
    }
    match loaded.valid_after_unix.cmp(&held.valid_after_unix) {
        std::cmp::Ordering::Greater if loaded.params != held.params => Replacement::ParamsChanged {
            held: held.params.summary(),
            loaded: loaded.params.summary(),
        },
        std::cmp::Ordering::Greater => Replacement::Newer,
        std::cmp::Ordering::Equal => Replacement::Same,
        std::cmp::Ordering::Less => Replacement::Older {
            held_valid_after: held.valid_after_unix,
            loaded_valid_after: loaded.valid_after_unix,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400;
    const NOW: u64 = 1_700_000_000;
    const SKEW: Duration = Duration::from_secs(300);

    /// A document of network `name` valid from `after` for 30 days (the
    /// relays play no part in the rule).
    fn doc(name: &str, after: u64) -> NetworkDocument {
        NetworkDocument {
            network_name: name.into(),
            created_unix: after,
            valid_after_unix: after,
            valid_until_unix: after + 30 * DAY,
            params: Default::default(),
            relays: Vec::new(),
        }
    }

    #[test]
    fn a_newer_valid_document_is_accepted() {
        let held = doc("lab", NOW - DAY);
        let r = judge_replacement(&held, &doc("lab", NOW - 60), NOW, SKEW);
        assert_eq!(r, Replacement::Newer);
        assert!(r.accepted());
        // One second newer is newer.
        let r = judge_replacement(&held, &doc("lab", NOW - DAY + 1), NOW, SKEW);
        assert_eq!(r, Replacement::Newer);
        // Signed by a host whose clock is a little ahead: within the skew.
        let r = judge_replacement(&held, &doc("lab", NOW + 200), NOW, SKEW);
        assert_eq!(r, Replacement::Newer);
    }

    #[test]
    fn a_newer_document_with_other_params_is_refused() {
        let held = doc("lab", NOW - DAY);
        let mut loaded = doc("lab", NOW - 60);
        loaded.params = onionlab_netdoc::NetworkParams::with_circuit_cc("vegas").expect("vegas");
        let r = judge_replacement(&held, &loaded, NOW, SKEW);
        assert_eq!(
            r,
            Replacement::ParamsChanged {
                held: "circuit_cc=fixed cfx_enabled=0 cfx_scheduler=lowrtt".into(),
                loaded: "circuit_cc=vegas cfx_enabled=0 cfx_scheduler=lowrtt".into()
            }
        );
        assert!(!r.accepted());
    }

    #[test]
    fn the_same_document_is_nothing_to_do() {
        let held = doc("lab", NOW - DAY);
        let r = judge_replacement(&held, &held.clone(), NOW, SKEW);
        assert_eq!(r, Replacement::Same);
        assert!(!r.accepted());
    }

    #[test]
    fn an_older_document_is_refused_as_a_rollback() {
        let held = doc("lab", NOW - DAY);
        let r = judge_replacement(&held, &doc("lab", NOW - 2 * DAY), NOW, SKEW);
        assert_eq!(
            r,
            Replacement::Older {
                held_valid_after: NOW - DAY,
                loaded_valid_after: NOW - 2 * DAY,
            }
        );
        assert!(!r.accepted());
    }

    #[test]
    fn a_document_outside_its_window_is_refused() {
        let held = doc("lab", NOW - 40 * DAY);
        // Newer than the held one, but expired (beyond the skew).
        let expired = doc("lab", NOW - 31 * DAY);
        let r = judge_replacement(&held, &expired, NOW, SKEW);
        assert_eq!(
            r,
            Replacement::NotValidNow {
                valid_after: NOW - 31 * DAY,
                valid_until: NOW - DAY,
                now: NOW,
            }
        );
        // Not yet valid (beyond the skew).
        let early = doc("lab", NOW + 301);
        assert!(matches!(
            judge_replacement(&held, &early, NOW, SKEW),
            Replacement::NotValidNow { .. }
        ));
    }

    #[test]
    fn another_networks_document_is_refused() {
        let held = doc("lab", NOW - DAY);
        let r = judge_replacement(&held, &doc("other", NOW), NOW, SKEW);
        assert_eq!(
            r,
            Replacement::OtherNetwork {
                held: "lab".into(),
                loaded: "other".into(),
            }
        );
    }
}

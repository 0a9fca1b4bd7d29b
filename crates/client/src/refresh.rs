//! Reloading the network document: every
//! [`ClientSettings::network_refresh`](crate::ClientSettings::network_refresh)
//! the client loads the document again from where it came from (file or
//! directory URL), verifies it with the network key, and swaps it in if it
//! is newer ([`onionlab_config::refresh`] has the rule; an older one is
//! refused as a rollback). The document is loaded without borrowing the
//! state; the swap itself is one borrow ([`State::replace_network`]).
//!
//! Logs: INFO when a newer document is in use; WARN when one is refused
//! (older, another network's, or its pinned path no longer resolves), when
//! loading fails (once per kind of failure until a load succeeds again),
//! and once when the held document expires with nothing newer to replace
//! it. The client goes on with an expired document (as tor goes on with a
//! stale consensus for a while) and keeps trying.

use std::mem::Discriminant;
use std::sync::Arc;
use std::time::Duration;

use onionlab_config::{judge_replacement, load_network, unix_now, Replacement};
use onionlab_netdoc::{NetworkDocument, CLOCK_SKEW_ALLOWANCE};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use crate::settings::NetworkOrigin;
use crate::state::Shared;

/// Longest interval used: a longer one (settings built in code) is
/// shortened to it, so that no deadline overflows.
const MAX_INTERVAL: Duration = Duration::from_secs(onionlab_config::MAX_NETWORK_REFRESH_S);

/// Start the refresh task if the settings ask for one (a non-zero interval
/// and a source to load from).
pub(crate) fn spawn(shared: &Shared) -> Option<JoinHandle<()>> {
    let (origin, every) = {
        let st = shared.borrow();
        let s = &st.settings;
        (s.network_origin.clone()?, s.network_refresh?)
    };
    if every.is_zero() {
        return None;
    }
    let every = every.min(MAX_INTERVAL);
    tracing::debug!(source = %origin.source, every_s = every.as_secs(), "network document refresh on");
    Some(tokio::task::spawn_local(run(shared.clone(), origin, every)))
}

/// Load the document every `every`, and keep the newest valid one.
async fn run(shared: Shared, origin: NetworkOrigin, every: Duration) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut log = RefreshLog::default();
    loop {
        tick.tick().await;
        // No borrow of the state across this await.
        let loaded = load_network(&origin.source, &origin.key).await;
        let now = unix_now();
        match loaded {
            Ok(doc) => {
                log.load_succeeded(&origin);
                consider(&shared, doc, now, &origin, &mut log);
            }
            Err(e) => log.load_failed(&origin, &e),
        }
        let held = shared.borrow().network();
        log.check_held(&held, now);
    }
}

/// Judge a document just loaded against the held one, and swap it in if it
/// is newer.
fn consider(
    shared: &Shared,
    doc: NetworkDocument,
    now: u64,
    origin: &NetworkOrigin,
    log: &mut RefreshLog,
) {
    let held = shared.borrow().network();
    let source = &origin.source;
    let verdict = judge_replacement(&held, &doc, now, CLOCK_SKEW_ALLOWANCE);
    let (kind, why) = match verdict {
        Replacement::Newer => return swap(shared, &held, doc, origin, log),
        Replacement::Same => {
            if *held != doc {
                tracing::debug!(%source, "a different document with the same valid_after_unix: keeping the one held");
            }
            return;
        }
        Replacement::Older {
            held_valid_after,
            loaded_valid_after,
        } => (
            "older",
            format!(
                "older than the one held (valid_after_unix {loaded_valid_after} < \
                 {held_valid_after}): a replay or rollback attempt"
            ),
        ),
        Replacement::NotValidNow {
            valid_after,
            valid_until,
            now,
        } => (
            "window",
            format!("not valid now ({now}): valid from {valid_after} to {valid_until}"),
        ),
        Replacement::ParamsChanged { held, loaded } => (
            "params",
            format!(
                "its [params] differ from the held one's ({loaded} vs {held}): \
                 circuits need both ends to agree, and relays read them only at start; \
                 restart the network's nodes to change them"
            ),
        ),
        Replacement::OtherNetwork { held, loaded } => (
            "network",
            format!("it is network {loaded:?}'s, not {held:?}'s"),
        ),
    };
    if log.first_refusal(doc.valid_after_unix, kind) {
        tracing::warn!(%source, "refused a network document: {why}; keeping the one held");
    } else {
        tracing::debug!(%source, "refused a network document again: {why}");
    }
}

/// Swap in `doc`, newer than `held`; if its pinned path no longer
/// resolves, keep `held`.
fn swap(
    shared: &Shared,
    held: &NetworkDocument,
    doc: NetworkDocument,
    origin: &NetworkOrigin,
    log: &mut RefreshLog,
) {
    let source = &origin.source;
    let (valid_after, valid_until, relays) =
        (doc.valid_after_unix, doc.valid_until_unix, doc.relays.len());
    let swapped = shared.borrow_mut().replace_network(Arc::new(doc));
    match swapped {
        Ok(s) => {
            log.replaced();
            tracing::info!(
                %source,
                old_valid_after = held.valid_after_unix,
                valid_after,
                valid_until,
                relays,
                vanished = s.vanished,
                retired_circuits = s.retired,
                "network document replaced by a newer one"
            );
        }
        Err(e) => {
            if log.first_refusal(valid_after, "pinned") {
                tracing::warn!(
                    %source,
                    valid_after,
                    "newer network document not used: the pinned path does not resolve in it \
                     ({e}); keeping the one held"
                );
            }
        }
    }
}

/// What the refresh task has already said, so that a condition that lasts
/// is logged at WARN once, not at every refresh.
/// A load failure's kind: the variant of the error, and of the document's
/// error inside it (an expired document and a bad signature are two
/// kinds).
type FailureKind = (
    Discriminant<onionlab_config::Error>,
    Option<Discriminant<onionlab_netdoc::Error>>,
);

fn failure_kind(e: &onionlab_config::Error) -> FailureKind {
    let inner = match e {
        onionlab_config::Error::Document(d) => Some(std::mem::discriminant(d)),
        _ => None,
    };
    (std::mem::discriminant(e), inner)
}

#[derive(Default)]
struct RefreshLog {
    /// The kind of the last load failure, until a load succeeds.
    failure: Option<FailureKind>,
    /// The last refused document (`valid_after_unix`) and the kind of
    /// reason.
    refused: Option<(u64, &'static str)>,
    /// The held document's expiry was reported.
    expired: bool,
}

impl RefreshLog {
    fn load_failed(&mut self, origin: &NetworkOrigin, e: &onionlab_config::Error) {
        let kind = failure_kind(e);
        if self.failure != Some(kind) {
            self.failure = Some(kind);
            tracing::warn!(source = %origin.source, "cannot load the network document again (keeping the one held): {e}");
        } else {
            tracing::debug!(source = %origin.source, "cannot load the network document again: {e}");
        }
    }

    fn load_succeeded(&mut self, origin: &NetworkOrigin) {
        if self.failure.take().is_some() {
            tracing::info!(source = %origin.source, "network document loaded again");
        }
    }

    /// A document was refused for a reason of `kind`: whether this is
    /// news (not the document and kind refused last).
    fn first_refusal(&mut self, valid_after: u64, kind: &'static str) -> bool {
        let news = self.refused != Some((valid_after, kind));
        self.refused = Some((valid_after, kind));
        news
    }

    fn replaced(&mut self) {
        self.refused = None;
        self.expired = false;
    }

    /// Say once that the held document expired (it is still used).
    fn check_held(&mut self, held: &NetworkDocument, now: u64) {
        let skew = CLOCK_SKEW_ALLOWANCE.as_secs();
        if now <= held.valid_until_unix.saturating_add(skew) {
            self.expired = false;
        } else if !self.expired {
            self.expired = true;
            tracing::warn!(
                valid_until = held.valid_until_unix,
                now,
                "the network document expired and no newer valid one could be loaded: \
                 still using it (circuits keep being built from it) and trying again \
                 at every refresh; sign a new one (onionlab network resign)"
            );
        }
    }
}

//! The links of a node that accept more connections on the shared TCP
//! endpoint, by the token each handed its peer, whatever their transport.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::wire::TOKEN_LEN;

/// A link token: what a link hands its peer so that the peer's further
/// connections find it.
pub type Token = [u8; TOKEN_LEN];

/// The links of a node that accept more connections, by the token each
/// handed its peer, whatever their transport; and the tokens of links
/// still in their handshake.
#[derive(Default)]
pub struct Tokens {
    links: Mutex<HashMap<Token, Weak<dyn Any + Send + Sync>>>,
    /// Tokens handed out by links still in their handshake: a connection
    /// for one of them waits for the link (the peer may open it the
    /// moment its own handshake ends, before ours does).
    reserved: Mutex<HashMap<Token, Arc<tokio::sync::Notify>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A token reserved by a link in its handshake ([`Tokens::reserve`]).
pub(crate) struct Reservation {
    tokens: Arc<Tokens>,
    token: Token,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.tokens.unreserve(&self.token);
    }
}

impl Tokens {
    /// Register `link` under `token` (ending the token's reservation).
    /// Entries of links gone since are dropped here: the table holds at
    /// most the live links and those that ended since the last call.
    pub(crate) fn register<T: Any + Send + Sync>(&self, token: Token, link: &Arc<T>) {
        let weak: Weak<dyn Any + Send + Sync> = Arc::downgrade(link) as Weak<_>;
        let mut links = lock(&self.links);
        links.retain(|_, l| l.strong_count() > 0);
        links.insert(token, weak);
        drop(links);
        self.unreserve(&token);
    }

    /// `token` will name a link once its handshake completes; the
    /// reservation ends when the guard is dropped (the link registered,
    /// or its handshake failed or was abandoned).
    pub(crate) fn reserve(self: &Arc<Self>, token: Token) -> Reservation {
        lock(&self.reserved).insert(token, Arc::new(tokio::sync::Notify::new()));
        Reservation {
            tokens: self.clone(),
            token,
        }
    }

    fn unreserve(&self, token: &Token) {
        if let Some(n) = lock(&self.reserved).remove(token) {
            n.notify_waiters();
        }
    }

    /// Wait (within the caller's handshake timeout) while `token` is
    /// reserved by a link still in its handshake.
    pub(crate) async fn settled(&self, token: &Token) {
        let waiting = lock(&self.reserved).get(token).cloned();
        if let Some(n) = waiting {
            let notified = n.notified();
            if lock(&self.reserved).contains_key(token) {
                notified.await;
            }
        }
    }

    /// The live link of type `T` registered under `token`.
    pub(crate) fn find<T: Any + Send + Sync>(&self, token: &Token) -> Option<Arc<T>> {
        let link = lock(&self.links).get(token)?.upgrade()?;
        link.downcast::<T>().ok()
    }

    /// Tokens of live links (tests).
    #[cfg(test)]
    pub(crate) fn live(&self) -> Vec<Token> {
        lock(&self.links)
            .iter()
            .filter(|(_, l)| l.strong_count() > 0)
            .map(|(t, _)| *t)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_finds_its_live_link_of_the_right_type_only() {
        let tokens = Arc::new(Tokens::default());
        let link = Arc::new(7u32);
        let reservation = tokens.reserve([1; TOKEN_LEN]);
        tokens.register([1; TOKEN_LEN], &link);
        drop(reservation);
        assert_eq!(tokens.find::<u32>(&[1; TOKEN_LEN]).as_deref(), Some(&7));
        assert!(tokens.find::<u64>(&[1; TOKEN_LEN]).is_none());
        assert!(tokens.find::<u32>(&[2; TOKEN_LEN]).is_none());
        drop(link);
        assert!(tokens.find::<u32>(&[1; TOKEN_LEN]).is_none());
        tokens.register([2; TOKEN_LEN], &Arc::new(1u32));
        assert!(tokens.live().is_empty(), "dead links are dropped");
    }
}

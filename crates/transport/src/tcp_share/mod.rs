//! The TCP endpoint's shared acceptor: one listener serves `tls` and every
//! transport that registers a [`TcpMode`] in its
//! [`TransportInfo`](crate::registry::TransportInfo) (pctcp, torchestra).
//!
//! After the TLS handshake the acceptor reads 4 bytes. A link preamble
//! (`OLT1`, [`wire`]) names its transport by a mode byte: the mode that
//! registered it takes the link. A magic a mode registered for the
//! connections that join one of its links (pctcp's lanes, torchestra's
//! heavy connections) goes to that mode. Anything else is a plain `tls`
//! link's VERSIONS cell. Links that accept more connections are found by
//! the token they handed the peer ([`Tokens`]), whatever their transport.

pub mod wire;

/// The pure parsing of what follows TLS on the shared TCP endpoint (its
/// link preamble, pctcp's lanes, torchestra's heavy connections) and the
/// acceptor's classification, for the fuzz targets (`fuzz/`); not a
/// stable API.
#[doc(hidden)]
pub mod fuzzing {
    pub use super::claims;
    pub use super::wire::*;
    pub use crate::pctcp::wire::*;
    pub use crate::torchestra::wire::*;
}

use std::any::Any;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsStream;
use tor_llcrypto::pk::ed25519::Ed25519Identity;

use crate::any::AnyLink;
use crate::endpoint::BoxFuture;
use crate::tls::TlsTransport;
use crate::{Error, TransportKind, WireError};
use wire::{LinkPreamble, FAMILY_OFFSET, LINK_MAGIC, TOKEN_LEN};

/// A link token: what a link hands its peer so that the peer's further
/// connections find it.
pub type Token = [u8; TOKEN_LEN];

/// A TLS connection on the shared TCP endpoint.
pub type Tls = TlsStream<TcpStream>;

/// An accepted TLS connection, its first 4 bytes read.
pub(crate) struct Accept {
    /// The node's TCP endpoint.
    pub(crate) transport: TlsTransport,
    /// The connection.
    pub(crate) tls: Tls,
    /// Its first 4 bytes after TLS.
    pub(crate) first: [u8; 4],
    /// What the peer proved (`None`: an anonymous client).
    pub(crate) identity: Option<Ed25519Identity>,
    /// The peer's address.
    pub(crate) addr: SocketAddr,
}

impl Accept {
    /// The whole preamble of a joining connection, `len` bytes with the
    /// 4 already read.
    pub(crate) async fn read_preamble(&mut self, len: usize) -> Result<Vec<u8>, Error> {
        let mut bytes = vec![0u8; len];
        bytes[..4].copy_from_slice(&self.first);
        self.tls
            .read_exact(&mut bytes[4..])
            .await
            .map_err(|source| Error::Tls {
                peer: self.addr,
                source,
            })?;
        Ok(bytes)
    }

    /// The link of type `T` that `token` names, once a link still in its
    /// handshake under it settled (the opener may open a joining
    /// connection the moment its own handshake ends, before ours has).
    ///
    /// # Errors
    ///
    /// [`Error::Protocol`] naming `what` if no such link is alive.
    pub(crate) async fn joined_link<T: Any + Send + Sync>(
        &self,
        token: &Token,
        what: &str,
    ) -> Result<Arc<T>, Error> {
        let tokens = self.transport.tokens();
        tokens.settled(token).await;
        tokens.find(token).ok_or_else(|| Error::Protocol {
            peer: self.addr,
            detail: format!("{what} for an unknown link"),
        })
    }

    /// A connection from another identity than `link_peer`, its link's.
    pub(crate) fn foreign(&self, link_peer: Option<Ed25519Identity>, what: &str) -> Option<Error> {
        (self.identity != link_peer).then(|| Error::Protocol {
            peer: self.addr,
            detail: format!("{what} from another identity than its link's"),
        })
    }
}

/// How a transport shares the TCP endpoint (see the module docs).
pub struct TcpMode {
    /// The mode byte of its links' preamble.
    pub(crate) link_mode: u8,
    /// Accept a link whose preamble was read.
    pub(crate) accept_link: fn(Accept, LinkPreamble) -> BoxFuture<'static, Result<AnyLink, Error>>,
    /// The magics of connections that join one of its links.
    pub(crate) join_magics: &'static [[u8; 4]],
    /// Hand a connection that began with one of `join_magics` to its link.
    pub(crate) accept_join: fn(Accept) -> BoxFuture<'static, Result<(), Error>>,
}

fn modes() -> impl Iterator<Item = &'static TcpMode> {
    TransportKind::all().filter_map(|k| k.info().tcp_mode)
}

/// Whether a connection starting with `first` belongs to a registered
/// mode (else it is a plain `tls` link).
pub fn claims(first: &[u8; 4]) -> bool {
    first == LINK_MAGIC || modes().any(|m| m.join_magics.contains(first))
}

/// Complete a connection that [`claims`] said belongs to a mode: its link,
/// or `None` for a connection that joined a link.
pub(crate) async fn accept(mut a: Accept) -> Result<Option<AnyLink>, Error> {
    if &a.first != LINK_MAGIC {
        let mode = modes().find(|m| m.join_magics.contains(&a.first));
        let mode = mode.ok_or(Error::Framing {
            peer: a.addr,
            source: WireError::BadMagic {
                what: "TCP connection preamble",
            },
        })?;
        return (mode.accept_join)(a).await.map(|()| None);
    }
    let addr = a.addr;
    let tls_err = |source| Error::Tls { peer: addr, source };
    let framing = |source| Error::Framing { peer: addr, source };
    let mut bytes = vec![0u8; FAMILY_OFFSET + 1];
    bytes[..4].copy_from_slice(&a.first);
    a.tls.read_exact(&mut bytes[4..]).await.map_err(tls_err)?;
    let family = bytes[FAMILY_OFFSET];
    let len = wire::link_preamble_len(family).ok_or(framing(WireError::UnknownFamily(family)))?;
    bytes.resize(len, 0);
    a.tls
        .read_exact(&mut bytes[FAMILY_OFFSET + 1..])
        .await
        .map_err(tls_err)?;
    let p = wire::parse_link_preamble(&bytes).map_err(framing)?;
    let mode = modes().find(|m| m.link_mode == p.mode);
    let mode = mode.ok_or(framing(WireError::UnknownMode {
        what: "TCP",
        mode: p.mode,
    }))?;
    (mode.accept_link)(a, p).await.map(Some)
}

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
    fn the_registered_magics_are_claimed_and_a_versions_cell_is_not() {
        for magic in [b"OLT1", b"OLTL", b"OLTH"] {
            assert!(claims(magic), "{magic:?}");
        }
        // VERSIONS: circuit ID 0, command 7: a plain tls link.
        assert!(!claims(&[0, 0, 7, 0]));
        assert!(!claims(b"OLTX"));
        let modes: Vec<u8> = modes().map(|m| m.link_mode).collect();
        assert_eq!(modes, [1, 2], "pctcp and torchestra, one mode byte each");
    }

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

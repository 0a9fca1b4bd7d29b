//! What a transport registers to share the TCP endpoint ([`TcpMode`]),
//! and what its accept functions get ([`Accept`]).

use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tor_llcrypto::pk::ed25519::Ed25519Identity;

use super::tokens::Token;
use super::wire::{encode_link_preamble, LinkPreamble};
use crate::any::AnyLink;
use crate::endpoint::BoxFuture;
use crate::sendbuf::Tls;
use crate::Error;

/// An accepted TLS connection on the shared endpoint, its first 4 bytes
/// read.
pub(crate) type Accept = crate::tls::Opened;

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
pub(crate) struct TcpMode {
    /// The mode byte of its links' preamble.
    pub(crate) link_mode: u8,
    /// Accept a link whose preamble was read.
    pub(crate) accept_link: fn(Accept, LinkPreamble) -> BoxFuture<'static, Result<AnyLink, Error>>,
    /// The magics of connections that join one of its links.
    pub(crate) join_magics: &'static [[u8; 4]],
    /// Hand a connection that began with one of `join_magics` to its link.
    pub(crate) accept_join: fn(Accept) -> BoxFuture<'static, Result<(), Error>>,
}

/// Open a TLS connection to `addr`, whose peer must prove `expected`, and
/// start a link of `mode` on it: the link preamble with a fresh token of
/// ours, then the peer's answer of `answer_len` bytes. Gives the
/// connection, our token and the answer, for the transport to parse.
pub(crate) async fn open_link(
    transport: &crate::tls::TlsTransport,
    addr: SocketAddr,
    expected: Ed25519Identity,
    mode: u8,
    answer_len: usize,
) -> Result<(Tls, Token, Vec<u8>), Error> {
    let mut tls = transport.connect_tls(addr, expected).await?;
    let tls_err = |source| Error::Tls { peer: addr, source };
    let our_token: Token = rand::random();
    let preamble = LinkPreamble {
        mode,
        token: our_token,
        lanes_at: transport.lane_address(),
    };
    tls.write_all(&encode_link_preamble(&preamble))
        .await
        .map_err(tls_err)?;
    let mut answer = vec![0u8; answer_len];
    tls.read_exact(&mut answer).await.map_err(tls_err)?;
    Ok((tls, our_token, answer))
}

//! The TCP endpoint's shared acceptor: one listener serves `tls` and every
//! transport that registers a mode on it (`MODES`: pctcp, torchestra).
//!
//! After the TLS handshake the acceptor reads 4 bytes. A link preamble
//! (`OLT1`, [`wire`]) names its transport by a mode byte: the mode that
//! registered it takes the link. A magic a mode registered for the
//! connections that join one of its links (pctcp's lanes, torchestra's
//! heavy connections) goes to that mode. Anything else is a plain `tls`
//! link's VERSIONS cell. Links that accept more connections are found by
//! the token they handed the peer (`tokens::Tokens`), whatever their
//! transport.

pub mod wire;

/// The pure parsing of what follows TLS on the shared TCP endpoint (its
/// link preamble, pctcp's lanes, torchestra's heavy connections) and the
/// acceptor's classification, for the fuzz targets (`fuzz/`); not a
/// stable API.
#[doc(hidden)]
pub mod fuzzing {
    pub use super::claims;
    pub use super::wire::*;
    pub use crate::lanes::wire::{
        encode_lane_preamble, parse_lane_preamble, LaneHeader, LANE_MAGIC, LANE_PREAMBLE_LEN,
    };
    pub use crate::torchestra::wire::*;
}

pub(crate) mod mode;
pub(crate) mod states;
pub(crate) mod tokens;

use std::net::SocketAddr;

use tokio::io::AsyncReadExt;

use crate::any::{AnyLink, AnyReader, AnyWriter};
use crate::endpoint::{Acceptor, BoxFuture, EndpointKind, PendingLink};
use crate::tls::{TlsIncoming, TlsListener};
use crate::{Error, WireError};
use mode::{Accept, TcpMode};
use wire::{FAMILY_OFFSET, LINK_MAGIC};

/// The transports that share the TCP endpoint with `tls`: one line each.
static MODES: &[&TcpMode] = &[&crate::pctcp::TCP_MODE, &crate::torchestra::TCP_MODE];

fn modes() -> impl Iterator<Item = &'static TcpMode> {
    MODES.iter().copied()
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

/// Run the TLS handshake of a connection the TCP listener accepted, then,
/// by what the peer sends first, the link handshake of a `tls` link, or
/// hand it to the mode that claims it: its link, or `None` for a
/// connection that joined one; bounded by the handshake timeout.
pub(crate) async fn accept_any(incoming: TlsIncoming) -> Result<Option<AnyLink>, Error> {
    let addr = incoming.addr();
    let timeout = incoming.handshake_timeout();
    let accept = async {
        let opened = incoming.open().await?;
        if claims(&opened.first) {
            accept(opened).await
        } else {
            crate::tls::plain_link(opened).await.map(Some)
        }
    };
    tokio::time::timeout(timeout, accept)
        .await
        .map_err(|_| Error::HandshakeTimeout { peer: addr })?
}

impl Acceptor for TlsListener {
    fn kind(&self) -> EndpointKind {
        crate::tls::TCP
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        Some(crate::Listener::local_addr(self))
    }

    fn accept(&mut self) -> BoxFuture<'_, Result<PendingLink, Error>> {
        Box::pin(async move {
            let incoming = crate::Listener::accept(self).await?;
            Ok(PendingLink::new(incoming.addr(), accept_any(incoming)))
        })
    }
}

impl crate::Incoming for TlsIncoming {
    type Reader = AnyReader;
    type Writer = AnyWriter;

    fn peer_addr(&self) -> SocketAddr {
        self.addr()
    }

    /// A link of `tls` or of a mode on the shared endpoint; a connection
    /// joining a link is an error here (use [`Acceptor`]).
    async fn handshake(self) -> Result<AnyLink, Error> {
        let addr = self.addr();
        accept_any(self).await?.ok_or(Error::Protocol {
            peer: addr,
            detail: "a connection joining a link where a link was expected".into(),
        })
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
}
